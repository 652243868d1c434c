"""The k3s stand-in's HAMi (labsim.net.k3s.hami) against HAMi's source at v2.10.0 (and v2.9.0), stepped by hand
(no root, no processes): its webhook and scheduler from the chart's own rendering, HAMi's Fit on cores, the
Pending reason as kube-scheduler writes HAMi's answer, the register annotation against HAMi's test fixtures, and
what becomes of a GPU pod created while the webhook does not answer (conformance record library/labsim/UPSTREAM.md).
"""

import json
import pathlib
import time

import pytest

from labsim.net.k3s import cluster as k3s
from labsim.net.k3s import hami, hami_chart

UUID = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
CARD = {"uuid": UUID, "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576}
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hami"


def chart(version="2.10.0", values=""):
    return (
        "apiVersion: helm.cattle.io/v1\nkind: HelmChart\nmetadata: {name: hami, namespace: kube-system}\n"
        f"spec:\n  chart: hami\n  version: {version}\n  valuesContent: |-\n    devicePlugin:\n"
        f"      runtimeClassName: nvidia\n{values}"
    )


class Lab:
    """A server vm-1, an agent vm-2 and the GPU agent vm-gpu (one RTX 3090, split 10) with HAMi installed."""

    def __init__(self, tmp_path, monkeypatch, version="2.10.0", values=""):
        monkeypatch.setattr(k3s, "STATE", str(tmp_path / "state.json"))
        monkeypatch.setattr(k3s, "MANIFESTS", str(tmp_path / "manifests"))
        self.manifests = tmp_path / "manifests"
        self.manifests.mkdir()
        (self.manifests / "hami.yaml").write_text(chart(version, values))
        self.cluster = k3s.Cluster()
        for name, gpu in (("vm-1", False), ("vm-2", False), ("vm-gpu", True)):
            info = {"name": name, "address": "10.0.0.3", "runtimes": ["nvidia"] if gpu else [],
                    "labels": {"gpu": "on"} if gpu else {}, "boot_id": "b1"}  # fmt: skip
            if gpu:
                info.update(gpus=1, gpu_uuids=[UUID], gpu_cards=[CARD])
            self.cluster.register(info)
        self.cluster.apply_manifests()
        self.cluster.state["charts_seen"]["kube-system/hami"] = time.time() - 5  # the install job is done
        self.cluster.apply_manifests()

    def webhook(self, answers):
        self.cluster.state.setdefault("scaled", {})["kube-system/hami-scheduler"] = 1 if answers else 0
        self.cluster.apply_manifests()

    def create(self, *pods):
        made, refused = self.cluster.create_pods(list(pods), dry_run=False)
        assert refused is None, refused
        return {p["name"]: k3s.pod_object(p) for p in made}

    def pod(self, name):
        return k3s.pod_object(self.cluster.state["direct_pods"][f"default/{name}"])


@pytest.fixture
def lab(tmp_path, monkeypatch):
    return Lab(tmp_path, monkeypatch)


def gpu_pod(name, percent=None, cores=None, gpus=1):
    limits = {"nvidia.com/gpu": gpus}
    if percent is not None:
        limits["nvidia.com/gpumem-percentage"] = percent
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
            "annotations": {"nvidia.com/use-gpuuuid": UUID}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": limits}}]}}  # fmt: skip


def phase(pod):
    return pod["status"]["phase"], pod["spec"]["nodeName"]


def scheduled_message(pod):
    (cond,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    return cond.get("message")


# --- the webhook, its Service, the scheduler and the device plugin from the chart's rendering ---------------


@pytest.mark.parametrize("version", ["2.10.0", "2.9.0"])
def test_hami_chart_rendered_webhook_scheduler_and_device_plugin(tmp_path, monkeypatch, version):
    lab = Lab(tmp_path, monkeypatch, version)
    rendered = hami_chart.CHARTS[version]["manifests"]
    (webhook,) = rendered["hami/templates/scheduler/webhook.yaml"]
    release = lab.cluster.state["hami"]
    assert hami.webhook_configuration(release) == webhook  # the chart's own object, for this release
    assert webhook["webhooks"][0]["failurePolicy"] == "Ignore"
    assert webhook["webhooks"][0]["clientConfig"]["service"] == {
        "name": "hami-scheduler", "namespace": "kube-system", "path": "/webhook", "port": 443}  # fmt: skip
    (service,) = rendered["hami/templates/scheduler/service.yaml"]
    assert hami.webhook_service(release)["spec"]["selector"]["hami.io/scheduler-role"] == "leader"
    assert hami.webhook_service(release) == service
    (plugin,) = [d for d in lab.cluster.state["daemonsets"] if d["metadata"]["name"] == "hami-device-plugin"]
    images = [c["image"] for c in plugin["spec"]["template"]["spec"]["containers"]]
    assert images == [f"docker.io/projecthami/hami:v{version}"] * 2
    scheduler = lab.cluster.state["deployment_objects"]["kube-system/hami-scheduler"]
    containers = scheduler["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["kube-scheduler", "vgpu-scheduler-extender"]
    assert containers[1]["image"] == f"docker.io/projecthami/hami:v{version}"


def test_hami_chart_failure_policy_from_the_helmcharts_values(tmp_path, monkeypatch):
    values = "    scheduler:\n      admissionWebhook:\n        failurePolicy: Fail\n"
    lab = Lab(tmp_path, monkeypatch, values=values)
    hook = hami.webhook_configuration(lab.cluster.state["hami"])["webhooks"][0]
    assert hook["failurePolicy"] == "Fail"
    lab.webhook(answers=False)
    made, refused = lab.cluster.create_pods([gpu_pod("p", 10)], dry_run=False)
    assert made is None and 'failed calling webhook "vgpu.hami.io"' in refused


# --- HAMi's Fit on cores ---------------------------------------------------------------------------------------


def test_hami_fit_exclusive_conflict(lab):
    # a pod asking all 100 cores is refused on a card another pod holds; a whole-card pod without gpucores is
    # given gpucores 100 by HAMi's webhook
    lab.create(gpu_pod("small", percent=10))
    got = lab.create(gpu_pod("all-cores", percent=10, cores=100), gpu_pod("whole"))
    assert got["whole"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] == 100
    pod = lab.pod("all-cores")
    assert phase(pod) == ("Pending", None)
    assert "1 1/1 ExclusiveDeviceAllocateConflict," in scheduled_message(pod)
    # the whole card's memory is checked first (HAMi's order): memory, cores, then exclusivity
    assert "1 1/1 CardInsufficientMemory," in scheduled_message(lab.pod("whole"))
    # alone on a card, the exclusive pod is placed holding all 100 cores
    lab.cluster.delete_pods("default", ["small", "whole"], None)
    lab.cluster.step_direct_pods()
    assert lab.pod("all-cores")["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"].endswith(
        ",100:;"
    )


def test_hami_fit_compute_units_exhausted(lab):
    # the card's 100 cores are taken: a pod asking none is refused, one asking some is short of cores
    lab.create(gpu_pod("a", percent=20, cores=60), gpu_pod("b", percent=20, cores=40))
    assert phase(lab.pod("b"))[0] == "Running"
    lab.create(gpu_pod("none", percent=10), gpu_pod("some", percent=10, cores=5))
    assert "1 1/1 CardComputeUnitsExhausted," in scheduled_message(lab.pod("none"))
    assert "1 1/1 CardInsufficientCore," in scheduled_message(lab.pod("some"))
    # a share of the memory without cores beside pods that leave cores free is placed, holding no cores
    lab.cluster.delete_pods("default", ["b"], None)
    lab.create(gpu_pod("later", percent=10))
    later = lab.pod("later")
    assert phase(later)[0] == "Running"
    assert later["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] == f"{UUID},NVIDIA,2457,0:;"


# --- the Pending reason --------------------------------------------------------------------------------------


def test_hami_pending_reason_kube_scheduler_text(lab):
    lab.create(gpu_pod("a", percent=80))
    lab.create(gpu_pod("b", percent=30))
    assert scheduled_message(lab.pod("b")) == (
        "0/3 nodes are available: 1 1/1 CardInsufficientMemory, 2 node unregistered. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.."
    )
    # a cordoned node is refused by kube-scheduler before HAMi's extender sees it
    lab.cluster.state["nodes"]["vm-2"]["unschedulable"] = True
    lab.create(gpu_pod("c", percent=30, gpus=2))
    assert scheduled_message(lab.pod("c")) == (
        "0/3 nodes are available: 1 NodeInsufficientDevice, 1 node unregistered, 1 node(s) were unschedulable. "
        "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption "
        "victims found for incoming pod.."
    )


def test_hami_pending_reason_sorted_per_node_as_genreason():
    assert hami.gen_reason({"CardUuidMismatch": 1, "CardInsufficientMemory": 1}, 2) == (
        "1/2 CardInsufficientMemory, 1/2 CardUuidMismatch"
    )


# --- the register annotation ------------------------------------------------------------------------------------


def hami_register_samples(tag):
    doc = json.loads((FIXTURES / f"annotations-{tag}.json").read_text())
    return [s for s in doc["samples"] if s["annotation"] == "hami.io/node-nvidia-register"]


def go_omitempty(entry):
    return {k: v for k, v in entry.items() if v not in (0, "", False, None, [], {})}


@pytest.mark.parametrize("tag", ["v2.9.0", "v2.10.0"])
def test_hami_register_writer_matches_hamis_test_annotations(tag):
    version = tag.removeprefix("v")
    for sample in hami_register_samples(tag):
        for entry in json.loads(sample["value"].replace("%t", "true")):
            if entry.get("mode", "hami-core") != "hami-core" or not entry["type"].startswith("NVIDIA"):
                continue  # MIG cards, and types written without the prefix the plugin adds
            card = {"uuid": entry["id"], "name": entry["type"], "memory_mib": entry["devmem"]}
            index = entry.get("index", 0)  # the card's place among the node's cards
            written = hami.register_annotation([CARD] * index + [card], entry["count"], chart_version=version)
            got = json.loads(written)[index]
            want = go_omitempty({"mode": "hami-core", **entry})
            want.pop("devicevendor", None)  # not a member MarshalNodeDevices copies
            if tag == "v2.9.0":
                assert got.pop("devicepairscore") == {}, "v2.9.0 writes the empty struct"
            assert got == want, f"{sample['file']}:{sample['line']}"
            # the members in the order pkg/device/devices.go declares them
            order = ["id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health"]
            assert list(got) == [k for k in order if k in got]


def test_hami_register_pair_score_member_by_version():
    assert '"devicepairscore":{}' in hami.register_annotation([CARD], 10, chart_version="2.9.0")
    assert "devicepairscore" not in hami.register_annotation([CARD], 10, chart_version="2.10.0")


# --- a GPU pod while the webhook does not answer ---------------------------------------------------------------


def test_hami_fail_open_unexpected_admission_error(lab):
    lab.webhook(answers=False)
    lab.create(gpu_pod("whole"))  # nvidia.com/gpu alone: default-scheduler binds it, the kubelet rejects it
    pod = lab.pod("whole")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert phase(pod) == ("Failed", "vm-gpu")
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    assert pod["status"]["message"] == (
        "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = no binding pod found on node "
        "vm-gpu, which is unexpected"
    )
    assert k3s.pod_status(lab.cluster.state["direct_pods"]["default/whole"]) == "UnexpectedAdmissionError"
    # once the webhook answers, a new pod goes to HAMi's scheduler and runs
    lab.webhook(answers=True)
    lab.create(gpu_pod("again"))
    assert phase(lab.pod("again")) == ("Running", "vm-gpu")


def test_hami_fail_open_share_pending_insufficient(lab):
    # a share of the card: resources that only HAMi's scheduler knows, so default-scheduler finds no node
    lab.webhook(answers=False)
    lab.create(gpu_pod("share", percent=40))
    assert scheduled_message(lab.pod("share")) == (
        "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, 3 Insufficient nvidia.com/gpumem-percentage. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.."
    )
    assert lab.pod("share")["spec"]["schedulerName"] == "default-scheduler"


def test_hami_fail_open_replicaset_recreates(lab):
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "engine", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "engine"}}, "template": {
            "metadata": {"labels": {"app": "engine"}, "annotations": {"nvidia.com/use-gpuuuid": UUID}},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}},
    }  # fmt: skip
    lab.webhook(answers=False)
    (lab.manifests / "engine.yaml").write_text(json.dumps(deployment))
    for _ in range(3):
        lab.cluster.apply_manifests()
    pods = [k3s.pod_object(p) for p in lab.cluster.state["pods"] if p["name"].startswith("engine-")]
    failed = [p for p in pods if p["status"]["phase"] == "Failed"]
    assert len(failed) >= 3 and len({p["metadata"]["name"] for p in pods}) == len(pods)
    assert {p["status"]["reason"] for p in failed} == {"UnexpectedAdmissionError"}
    # the webhook answers again: the next pod the ReplicaSet makes goes through it and runs; the Failed stay
    lab.webhook(answers=True)
    lab.cluster.apply_manifests()
    pods = [k3s.pod_object(p) for p in lab.cluster.state["pods"] if p["name"].startswith("engine-")]
    running = [p for p in pods if p["status"]["phase"] == "Running"]
    assert [p["spec"]["schedulerName"] for p in running] == ["hami-scheduler"]
    assert len([p for p in pods if p["status"]["phase"] == "Failed"]) >= 3


def test_the_conformance_records_hami_rows_name_their_tests():
    import re

    record = (pathlib.Path(__file__).resolve().parents[3] / "library" / "labsim" / "UPSTREAM.md").read_text()
    section = record.split("## HAMi", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| hami.")]
    assert len(rows) >= 10
    for row in rows:
        ident, _what, source, test = [c.strip() for c in row.strip("|").split(" | ")]
        assert "@v2." in source, ident
        path, name = test.split("::")
        assert name == "test_" + re.sub(r"[.-]", "_", ident)
        assert f"def {name}(" in (pathlib.Path(__file__).resolve().parents[3] / path).read_text(), ident


def test_hami_webhook_service_endpoints_follow_the_scheduler(lab):
    slice_ = hami.webhook_endpoints(lab.cluster.state)
    assert slice_["metadata"]["labels"] == {"kubernetes.io/service-name": "hami-scheduler"}
    assert [e["conditions"]["ready"] for e in slice_["endpoints"]] == [True]
    lab.webhook(answers=False)
    assert hami.webhook_endpoints(lab.cluster.state)["endpoints"] is None


# --- HAMi 2.10's per-card cordon (hami.io/device-cordon) -------------------------------------------------------


def annotate(lab, node, overwrite=False, **pairs):
    from labsim.net.k3s.apiserver import NODE_EDITS

    info = {
        "node": node,
        "annotations": {k.replace("__", "/").replace("_", "-"): v for k, v in pairs.items()},
    }
    return NODE_EDITS["/gpulab/annotate"](lab.cluster.state["nodes"][node], info | {"overwrite": overwrite})


def test_hami_device_cordon_card_cordoned(lab):
    # a pod on the card keeps running when the card is cordoned; a new one is refused with CardCordoned (after
    # the health check, before the others), the entry trimmed as HAMi trims it
    lab.create(gpu_pod("running", percent=10))
    assert annotate(lab, "vm-gpu", **{"hami.io__device_cordon": f" {UUID}, "}) == (200, {"changed": True})
    node = k3s.node_object("vm-gpu", lab.cluster.state["nodes"]["vm-gpu"])
    assert node["metadata"]["annotations"]["hami.io/device-cordon"] == f" {UUID}, "
    lab.create(gpu_pod("new", percent=10))
    assert phase(lab.pod("running"))[0] == "Running"
    assert phase(lab.pod("new")) == ("Pending", None)
    assert "1 1/1 CardCordoned," in scheduled_message(lab.pod("new"))
    # taken off (kubectl annotate node vm-gpu hami.io/device-cordon-), the card takes the pod
    annotate(lab, "vm-gpu", **{"hami.io__device_cordon-": ""})
    lab.cluster.step_direct_pods()
    assert phase(lab.pod("new")) == ("Running", "vm-gpu")


def test_hami_device_cordon_absent_before_2_10(tmp_path, monkeypatch):
    # HAMi 2.9.0 has no per-card cordon: the annotation is only an annotation
    lab = Lab(tmp_path, monkeypatch, "2.9.0")
    annotate(lab, "vm-gpu", **{"hami.io__device_cordon": UUID})
    lab.create(gpu_pod("p", percent=10))
    assert phase(lab.pod("p")) == ("Running", "vm-gpu")
    assert hami.cordoned_cards({"hami.io/device-cordon": f"{UUID},, GPU-b "}) == {UUID, "GPU-b"}
    assert hami.cordoned_cards({"hami.io/device-cordon": " "}) == set() and hami.cordoned_cards(None) == set()


def test_kubectl_annotate_overwrite(lab):
    # another value for an annotation the node has needs --overwrite (nothing is changed without it); the same
    # value again, or KEY- (also of a key the node lacks), does not
    annotate(lab, "vm-gpu", **{"gpulab.test__a": "1"})
    code, answer = annotate(lab, "vm-gpu", **{"gpulab.test__a": "2", "gpulab.test__b": "x"})
    assert code == 409
    assert answer["error"] == (
        "--overwrite is false but found the following declared annotation(s): 'gpulab.test/a' already has a value (1)"
    )
    assert "gpulab.test/b" not in lab.cluster.state["nodes"]["vm-gpu"]["annotations"]
    assert annotate(lab, "vm-gpu", **{"gpulab.test__a": "1", "gpulab.test__none-": ""})[0] == 200
    assert annotate(lab, "vm-gpu", overwrite=True, **{"gpulab.test__a": "2"})[0] == 200
    assert lab.cluster.state["nodes"]["vm-gpu"]["annotations"] == {"gpulab.test/a": "2"}
