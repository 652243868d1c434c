"""gpulab.k8s.hami_checks: the register annotation read in both of HAMi's formats, the problems it finds, and
the lab's k3s stand-in writing the annotation the way HAMi's device plugin does (constructed samples)."""

import json
import pathlib

import pytest

from gpulab.k8s import hami_checks
from labsim.net.k3s import hami as k3s_hami

from .conftest import CONSTRUCTED, need_shared

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hami"
TAGS = ("v2.9.0", "v2.10.0")


def hami_samples(tag, annotation):
    """HAMi's own test values of one annotation at a tag (tests/unit/k3s/fixtures/hami, provenance inside)."""
    doc = json.loads((FIXTURES / f"annotations-{tag}.json").read_text())
    assert doc["repository"] == "Project-HAMi/HAMi" and doc["tag"] == tag
    return [s for s in doc["samples"] if s["annotation"].startswith(annotation)]


UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
UUID1 = "GPU-899c71bf-27be-b6a0-ae8f-d8afe5ba0f85"
CARDS = [
    {"uuid": UUID0, "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576},
    {"uuid": UUID1, "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576},
]
FACTS = [{"index": i, "uuid": c["uuid"], "name": c["name"], "memory_total_mib": c["memory_mib"]} for i, c in
         enumerate(CARDS)]  # fmt: skip


def test_the_stand_in_writes_the_annotation_as_hamis_device_plugin():
    for n, sample in ((1, "hami-node-nvidia-register-1gpu.json"), (2, "hami-node-nvidia-register-2gpu.json")):
        want = need_shared(CONSTRUCTED / sample).read_text().strip()
        assert k3s_hami.register_annotation(CARDS[:n], 10) == want
    # a name without the NVIDIA prefix gets it, memory scales with deviceMemoryScaling
    (card,) = json.loads(k3s_hami.register_annotation([dict(CARDS[0], name="Tesla T4")], 4, 1.5))
    assert (card["type"], card["devmem"], card["count"]) == ("NVIDIA-Tesla T4", 36864, 4)


def test_register_is_read_in_the_json_and_the_old_colon_format():
    text = k3s_hami.register_annotation(CARDS, 10)
    assert [(c["id"], c["devmem"]) for c in hami_checks.parse_register(text)] == [
        (UUID0, 24576),
        (UUID1, 24576),
    ]
    old = f"{UUID0},10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    assert hami_checks.parse_register(old) == [
        {"id": UUID0, "count": 10, "devmem": 32768, "devcore": 100, "type": "NVIDIA-Tesla V100-PCIE-32GB",
         "numa": 0, "health": True, "index": 0, "mode": "hami-core"}
    ]  # fmt: skip
    assert hami_checks.parse_register("") is None and hami_checks.parse_register("[not json") is None


@pytest.mark.parametrize("tag", TAGS)
def test_hamis_own_register_samples_are_read_as_hami_reads_them(tag):
    for sample in hami_samples(tag, "hami.io/node-nvidia-register"):
        text = sample["value"].replace("%t", "true")  # register_race_test's template, healthy
        cards = hami_checks.parse_register(text)
        where = f"{sample['file']}:{sample['line']} ({sample['test']})"
        if sample.get("hami_decodes") is False:
            assert cards is None, where
            continue
        assert cards, where
        if text.startswith("["):
            raw = json.loads(text)
            assert [c["id"] for c in cards] == [c["id"] for c in raw], where
            for card, entry in zip(cards, raw, strict=True):
                assert card["health"] is entry.get("health", False)
                assert {k: card[k] for k in entry} == {**entry, "health": card["health"]}
        else:
            fields = [item.split(",") for item in text.split(":") if item]
            assert [
                (c["id"], c["count"], c["devmem"], c["devcore"], c["type"], c["health"]) for c in cards
            ] == [(f[0], int(f[1]), int(f[2]), int(f[3]), f[4], f[6] == "true") for f in fields], where
            # the 9-field form carries index and mode after health
            assert all(
                c["index"] == (int(f[7]) if len(f) == 9 else 0) for c, f in zip(cards, fields, strict=True)
            ), where


def test_a_register_sample_of_each_shape_is_at_hand():
    # the fixtures hold what the checks rely on: the JSON form, MIG profiles (2.10.0), the colon form in its 7 and 9
    # field lengths and one HAMi refuses
    values = [s["value"] for tag in TAGS for s in hami_samples(tag, "hami.io/node-nvidia-register")]
    assert any('"mode":"hami-core"' in v for v in values) and any("migProfiles" in v for v in values)
    assert {len(v.split(":")[0].split(",")) for v in values if not v.startswith("[")} >= {7, 9}
    assert any(
        s.get("hami_decodes") is False for s in hami_samples("v2.10.0", "hami.io/node-nvidia-register")
    )


@pytest.mark.parametrize("tag", TAGS)
def test_hamis_own_allocation_samples_are_decoded(tag):
    (sample,) = hami_samples(tag, "hami.io/vgpu-devices-allocated")
    got = hami_checks.decode_allocated(sample["value"])
    assert [(a["uuid"], a["type"], a["mem"], a["cores"]) for a in got] == [
        ("GPU-8dcd427f-483b-b48f-d7e5-75fb19a52b76", "NVIDIA", 500, 3),
        ("GPU-ebe7c3f7-303d-558d-435e-99a160631fe4", "NVIDIA", 500, 3),
    ]


def test_card_usage_reads_a_node_and_a_pod_as_hami_tests_write_them():
    register = hami_samples("v2.10.0", "hami.io/node-nvidia-register")[0]["value"]  # one Tesla P4, 8192 MiB
    (card,) = json.loads(register)
    pod = {"metadata": {"namespace": "default", "name": "p",
                        "annotations": {"hami.io/vgpu-devices-allocated": f"{card['id']},NVIDIA,2048,30:;"}},
           "status": {"phase": "Running"}}  # fmt: skip
    node = {"metadata": {"name": "n", "annotations": {hami_checks.REGISTER_ANNOTATION: register}}}
    (usage,) = hami_checks.card_usage({"items": [node]}, {"items": [pod]})
    assert (usage["uuid"], usage["devmem"], usage["used_mib"], usage["free_percent"]) == (
        "GPU-0",
        8192,
        2048,
        75,
    )
    assert usage["pods"] == [{"pod": "default/p", "mem_mib": 2048, "percent": 25, "cores": 30}]
    assert (usage["devcore"], usage["used_cores"]) == (100, 30)


def nodes_doc(register, labels=None, allocatable="20", version="v1.33.5+k3s1"):
    gpu = {
        "metadata": {"name": "vm-gpu", "labels": {"gpu": "on"} if labels is None else labels,
                     "annotations": {hami_checks.REGISTER_ANNOTATION: register} if register else {}},
        "status": {"allocatable": {"nvidia.com/gpu": allocatable}},
    }  # fmt: skip
    server = {
        "metadata": {"name": "vm-1", "labels": {hami_checks.CONTROL_PLANE_LABEL: "true"}},
        "status": {"nodeInfo": {"kubeletVersion": version}},
    }
    return {"items": [server, gpu]}


def fields(problems):
    return [(p["host"], p["field"], p["wait"]) for p in problems]


def test_a_node_as_hami_leaves_it_has_no_problem():
    doc = nodes_doc(k3s_hami.register_annotation(CARDS, 10))
    assert hami_checks.node_problems(doc, {"vm-gpu": FACTS}, split=10) == []


def test_each_mismatch_is_named_and_only_the_curable_ones_are_waited_for():
    register = k3s_hami.register_annotation([CARDS[0], dict(CARDS[1], uuid="GPU-0-1-2-3-4")], 10)
    got = hami_checks.node_problems(
        nodes_doc(register, labels={}, allocatable="10"), {"vm-gpu": FACTS}, split=10
    )
    assert fields(got) == [
        ("vm-gpu", "label gpu", False),
        ("vm-gpu", hami_checks.REGISTER_ANNOTATION, False),  # the guest's second card is not registered
        ("vm-gpu", hami_checks.REGISTER_ANNOTATION, False),  # a registered card the guest does not have
        ("vm-gpu", "allocatable nvidia.com/gpu", True),
    ]
    assert UUID1 in got[1]["cause"] and "GPU-0-1-2-3-4" in got[2]["cause"]
    # not yet registered: waited for
    assert fields(hami_checks.node_problems(nodes_doc(None), {"vm-gpu": FACTS}, split=10)) == [
        ("vm-gpu", hami_checks.REGISTER_ANNOTATION, True)
    ]
    # memory: registered total x deviceMemoryScaling must be the guest's total
    scaled = k3s_hami.register_annotation(CARDS, 10, 2)
    assert hami_checks.node_problems(nodes_doc(scaled), {"vm-gpu": FACTS}, split=10, memory_scaling=2) == []
    wrong = hami_checks.node_problems(nodes_doc(scaled), {"vm-gpu": FACTS}, split=10)
    assert [p["value"] for p in wrong] == [49152, 49152]


def test_the_kube_scheduler_tag_must_be_the_servers_version():
    def deployment(image):
        return {"spec": {"template": {"spec": {"containers": [{"name": "kube-scheduler", "image": image}]}}}}

    doc = nodes_doc(None)
    assert hami_checks.scheduler_problems(doc, deployment("registry.k8s.io/kube-scheduler:v1.33.5")) == []
    (p,) = hami_checks.scheduler_problems(doc, deployment("localhost:5000/kube-scheduler:v1.33.5+k3s1"))
    assert (p["value"], "'v1.33.5'" in p["fix"], p["wait"]) == ("v1.33.5+k3s1", True, False)
    # after a k3s upgrade the HelmChart asks the new tag: until the chart's rollout replaces the scheduler, the
    # old tag is a problem that waiting cures; a HelmChart that asks another tag than the server's is not
    older = deployment("registry.k8s.io/kube-scheduler:v1.32.9")
    (p,) = hami_checks.scheduler_problems(doc, older, asked_tag="v1.33.5")
    assert p["wait"] and p["value"] == "v1.32.9"
    (p,) = hami_checks.scheduler_problems(doc, older, asked_tag="v1.32.9")
    assert not p["wait"]
    (p,) = hami_checks.scheduler_problems(doc, None)
    assert p["wait"] and "hami-scheduler is missing" in p["cause"]
    assert "[1] k3s server: deployment" in hami_checks.problems_text([p])


def test_the_pending_reason_is_read_as_kube_scheduler_writes_hamis_filter_result():
    message = (
        "0/3 nodes are available: 1 1/2 CardInsufficientMemory, 1/2 CardUuidMismatch, 2 node unregistered. "
        "preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.."
    )
    got = hami_checks.scheduling_reasons(message)
    assert got["nodes"] == 3
    assert got["reasons"] == [
        {"nodes": 1, "reason": "1/2 CardInsufficientMemory, 1/2 CardUuidMismatch",
         "hami": [[1, 2, "CardInsufficientMemory"], [1, 2, "CardUuidMismatch"]]},
        {"nodes": 2, "reason": "node unregistered", "hami": []},
    ]  # fmt: skip
    assert got["hami"] == ["CardInsufficientMemory", "CardUuidMismatch"]
    assert got["preemption"].startswith("0/3 nodes are available: 3 No preemption victims")
    # the default scheduler's own reasons carry no HAMi card counts; HAMi's Event text is no PodScheduled message
    plain = hami_checks.scheduling_reasons(
        "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem-percentage."
    )
    assert plain["reasons"] == [
        {"nodes": 3, "reason": "Insufficient nvidia.com/gpumem-percentage", "hami": []}
    ]
    assert hami_checks.scheduling_reasons("no available node, 3 nodes do not meet") is None


def test_pods_around_hami_say_what_the_kubelet_and_the_scheduler_made_of_them():
    rejected = {
        "metadata": {"namespace": "default", "name": "e0-1"},
        "spec": {"schedulerName": "default-scheduler", "nodeName": "vm-gpu"},
        "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError",
                   "message": "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = no binding pod "
                              "found on node vm-gpu, which is unexpected"},
    }  # fmt: skip
    pending = {
        "metadata": {"namespace": "default", "name": "e0-2"},
        "spec": {},  # no schedulerName: default-scheduler
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                   "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpumem-percentage."}]},
    }  # fmt: skip
    placed = {
        "metadata": {"namespace": "default", "name": "e0-3"},
        "spec": {"schedulerName": "hami-scheduler"},
    }
    got = hami_checks.around_hami([rejected, pending, placed])
    assert (got["pods"], got["rejected"], got["pending"]) == (["e0-1", "e0-2"], 1, 1)
    assert (
        "rejected by the kubelet (UnexpectedAdmissionError" in got["text"]
        and "again and again" in got["text"]
    )
    assert (
        "e0-2 (schedulerName default-scheduler) Pending: 0/3 nodes are available: 3 Insufficient"
        in got["text"]
    )
    assert hami_checks.around_hami([placed]) == {"pods": [], "rejected": 0, "pending": 0, "text": ""}


def test_the_webhook_state_counts_the_ready_endpoints_of_its_service():
    hooks = {"items": [{"metadata": {"name": "hami-webhook"}, "webhooks": [{"name": "vgpu.hami.io",
             "failurePolicy": "Ignore", "clientConfig": {"service": {"name": "hami-scheduler",
                                                                     "namespace": "kube-system"}}}]}]}  # fmt: skip
    deployment = {
        "metadata": {"name": "hami-scheduler"},
        "spec": {"replicas": 1},
        "status": {"readyReplicas": 1},
    }
    slices = {"items": [{"endpoints": [{"conditions": {"ready": False}}, {"conditions": {}}]}]}
    text = hami_checks.webhook_state(hooks, deployment, slices)
    assert "failurePolicy Ignore" in text and "has 1 of 1 replica(s) ready" in text
    assert "its Service kube-system/hami-scheduler has 1 ready endpoint(s)" in text
    none = hami_checks.webhook_state(hooks, deployment, {"items": [{"endpoints": None}]})
    assert "has 0 ready endpoint(s) (the API server cannot reach the webhook" in none
    assert "endpoint" not in hami_checks.webhook_state(hooks, deployment)
