"""gpulab.k8s.hami_checks: the register annotation read in both of HAMi's formats, the problems it finds, and
the lab's k3s stand-in writing the annotation the way HAMi's device plugin does (constructed samples)."""

import json

from gpulab.k8s import hami_checks
from labsim.net.k3s import hami as k3s_hami

from .conftest import CONSTRUCTED, need_shared

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
         "health": True}
    ]  # fmt: skip
    assert hami_checks.parse_register("") is None and hami_checks.parse_register("[not json") is None


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
    assert (p["value"], "'v1.33.5'" in p["fix"]) == ("v1.33.5+k3s1", True)
    (p,) = hami_checks.scheduler_problems(doc, None)
    assert p["wait"] and "hami-scheduler is missing" in p["cause"]
    assert "[1] k3s server: deployment" in hami_checks.problems_text([p])
