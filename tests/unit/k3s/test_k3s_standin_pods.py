"""The k3s stand-in's pods, stepped by hand (no root, no processes): init containers before the container, a
pod held Init:0/1 until the URL its init container polls answers, restarts after a reboot (a new boot id).

The manifests are the workloads plan's own, so a plan without the wait would start both engines at once.
"""

import json
import time

import pytest
import yaml

from gpulab.k8s import workloads
from labsim.net.k3s import cluster as k3s

from . import engines

UUID = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
FACTS = {"vm-gpu": [{"index": 0, "uuid": UUID, "name": "NVIDIA GeForce RTX 3090", "memory_total_mib": 24576}]}
ENGINES = engines.SHARED_CARD
CHART = (
    "apiVersion: helm.cattle.io/v1\nkind: HelmChart\nmetadata: {name: hami, namespace: kube-system}\n"
    "spec:\n  chart: hami\n  valuesContent: |-\n    devicePlugin:\n      runtimeClassName: nvidia\n"
)


class Lab:
    def __init__(self, tmp_path, monkeypatch):
        monkeypatch.setattr(k3s, "STATE", str(tmp_path / "state.json"))
        monkeypatch.setattr(k3s, "MANIFESTS", str(tmp_path / "manifests"))
        self.manifests = tmp_path / "manifests"
        self.manifests.mkdir()
        (self.manifests / "hami.yaml").write_text(CHART)
        self.cluster = k3s.Cluster()
        self.boot("boot-1")
        self.cluster.apply_manifests()
        self.cluster.state["charts_seen"]["kube-system/hami"] = time.time() - 5  # the install job is done

    def boot(self, boot_id):
        info = {"name": "vm-gpu", "address": "10.0.0.3", "runtimes": ["nvidia"], "labels": {"gpu": "on"}}
        card = {"uuid": UUID, "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576}  # what the agent sends
        self.cluster.register(
            {**info, "gpus": 1, "gpu_uuids": [UUID], "gpu_cards": [card], "boot_id": boot_id}
        )

    def place(self, plan):
        for item in plan["engines"]:
            (self.manifests / f"gpulab-workload-default-{item['name']}.yaml").write_text(item["manifest"])

    def pods(self):
        return {p["name"].rsplit("-", 2)[0]: p for p in self.cluster.state["pods"]}

    def status(self):
        return {n: (k3s.pod_status(p), p["ready"] is not None) for n, p in self.pods().items()}

    def step(self, seconds=k3s.DEPLOY_READY_S):
        """One pass of the server loop, after the running containers have run for `seconds`."""
        for pod in self.cluster.state.get("pods", []):
            if pod["started"] is not None:
                pod["started"] -= seconds
        self.cluster.apply_manifests()
        return self.status()


@pytest.fixture
def lab(tmp_path, monkeypatch):
    return Lab(tmp_path, monkeypatch)


def test_the_second_engine_waits_in_its_init_container_at_apply_and_after_a_reboot(lab):
    lab.place(workloads.plan(ENGINES, FACTS))
    assert lab.step(0) == {"vllm": ("Running", False), "ollama": ("Init:0/1", False)}
    # however long ollama waits, it starts only once vllm is Ready
    assert lab.step(0) == {"vllm": ("Running", False), "ollama": ("Init:0/1", False)}
    assert lab.step() == {"vllm": ("Running", True), "ollama": ("Init:0/1", False)}
    assert lab.step(0) == {"vllm": ("Running", True), "ollama": ("Running", False)}
    assert lab.step() == {"vllm": ("Running", True), "ollama": ("Running", True)}
    pod = k3s.pod_object(lab.pods()["ollama"])
    assert pod["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"

    # the node reboots: both start again from their init containers, in the same order
    lab.boot("boot-2")
    assert lab.step(0) == {"vllm": ("Running", False), "ollama": ("Init:0/1", False)}
    assert {p["restarts"] for p in lab.pods().values()} == {1}
    assert lab.step() == {"vllm": ("Running", True), "ollama": ("Init:0/1", False)}
    assert lab.step(0) == {"vllm": ("Running", True), "ollama": ("Running", False)}
    history = lab.cluster.state["deployment_history"]
    vllm, ollama = history["default/vllm"]["runs"], history["default/ollama"]["runs"]
    assert [r["boot"] for r in vllm] == ["boot-1", "boot-2"] and len(ollama) == 1
    assert not k3s.pod_object(lab.pods()["ollama"])["status"]["containerStatuses"][0]["ready"]

    # a k3s-agent restart alone (same boot) leaves running pods alone
    lab.step()
    lab.boot("boot-2")
    assert lab.step(0) == {"vllm": ("Running", True), "ollama": ("Running", True)}


def test_without_the_wait_both_engines_start_at_once(lab):
    plan = workloads.plan(ENGINES, FACTS)
    for item in plan["engines"]:
        item["manifest"] = item["manifest"].replace("initContainers:", "ignoredInitContainers:")
    lab.place(plan)
    assert lab.step(0) == {"vllm": ("Running", False), "ollama": ("Running", False)}


def test_a_url_answers_only_at_a_ready_pods_service_port_and_readiness_path(lab):
    lab.place(workloads.plan(ENGINES, FACTS))
    lab.step(0)
    lab.step()
    state = lab.cluster.state
    found, services = {}, {}
    for path in sorted(lab.manifests.glob("gpulab-workload-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            meta = doc["metadata"]
            if doc["kind"] == "Deployment":
                found[f"{meta['namespace']}/{meta['name']}"] = doc
            else:
                services[(meta["namespace"], meta["name"])] = doc
    answers = lab.cluster.answers
    assert answers("http://vllm.default.svc:8000/health", found, services)
    assert answers("http://vllm.default.svc.cluster.local:8000/health", found, services)
    assert not answers("http://vllm.default.svc:8000/metrics", found, services)  # not its readiness path
    assert not answers("http://vllm.default.svc:8001/health", found, services)  # not a Service port
    assert not answers("http://vllm.other.svc:8000/health", found, services)  # no such Service
    assert not answers("http://ollama.default.svc:11434/", found, services)  # not Ready yet
    # a node that stopped calling runs nothing, whatever the API last showed
    state["nodes"]["vm-gpu"]["heartbeat"] -= k3s.ALIVE_S
    assert not answers("http://vllm.default.svc:8000/health", found, services)


def test_a_deployment_with_no_replicas_is_rolled_out_without_a_pod(lab):
    plan = workloads.plan([{**ENGINES[1], "replicas": 0}], FACTS)
    lab.place(plan)
    assert lab.step(0) == {}
    assert lab.cluster.state["deployments"]["default/ollama"]["ready"] is True


def test_k3s_deploy_file_removed_keeps_objects(lab):
    """k3s' deploy controller applies a manifest file's Secret when the file is new or changed; taking the file
    out deletes nothing, only a delete does; an unchanged file does not bring a deleted Secret back, a changed
    one does. The stand-in keeps the Secret's keys, never their values."""
    text = (
        "apiVersion: v1\nkind: Secret\nmetadata: {name: gpulab-hf-token, namespace: default}\n"
        "stringData: {token: %s}\n"
    )
    path = lab.manifests / "gpulab-hf-token-default.yaml"
    path.write_text(text % "hf_aaaa")
    lab.step()
    secrets = lab.cluster.state["secrets"]
    assert secrets["default/gpulab-hf-token"]["data"] == {"token": ""}
    assert "hf_aaaa" not in json.dumps(lab.cluster.state)

    assert lab.cluster.delete_secrets("default", ["gpulab-hf-token"]) == ["gpulab-hf-token"]
    lab.step()
    assert "default/gpulab-hf-token" not in lab.cluster.state["secrets"]  # the same file is not applied again
    path.write_text(text % "hf_bbbb")
    lab.step()
    assert "default/gpulab-hf-token" in lab.cluster.state["secrets"]  # a changed one is

    path.unlink()
    lab.step()
    assert "default/gpulab-hf-token" in lab.cluster.state["secrets"]  # its file gone, the Secret stays
    assert lab.cluster.delete_secrets("default", ["gpulab-hf-token"]) == ["gpulab-hf-token"]
    assert lab.cluster.delete_secrets("default", ["gpulab-hf-token"]) == []


def test_the_standin_kubectl_deletes_a_secret_by_name(monkeypatch, capsys):
    """`kubectl -n NS delete secret NAME [--ignore-not-found]`, as stage workloads types it: deleted, or NotFound
    (rc 1) unless --ignore-not-found."""
    from labsim.net.k3s import kubectl

    asked = []

    def post(path, body):
        asked.append((path, body))
        return {"deleted": [n for n in body["names"] if n == "gpulab-hf-token"]}, None

    monkeypatch.setattr(kubectl, "post", post)
    assert kubectl.kubectl(["-n", "ai", "delete", "secret", "gpulab-hf-token", "--ignore-not-found"]) == 0
    assert capsys.readouterr().out == 'secret "gpulab-hf-token" deleted\n'
    assert asked == [("/gpulab/secrets/delete", {"namespace": "ai", "names": ["gpulab-hf-token"]})]
    assert kubectl.kubectl(["-n", "ai", "delete", "secret", "other", "--ignore-not-found"]) == 0
    assert kubectl.kubectl(["-n", "ai", "delete", "secret", "other"]) == 1
    assert 'secrets "other" not found' in capsys.readouterr().err
