"""The GPU node upgrade's decisions (gpulab.k8s.gpu_upgrade): HAMi's device cordon value, the plan of one node
(cordon -> device cordon -> drain -> upgrade -> reboot -> proof -> uncordon, engines in start order) and the
proof that keeps a node cordoned."""

import json

from gpulab.k8s.gpu_upgrade import (
    cordoned_cards,
    device_cordon,
    driver_branch,
    gpu_pods,
    node_plan,
    plan_text,
    proof_problems,
    registered_cards,
    toolkit_running,
    toolkit_wanted,
)

A, B = "GPU-aaaa", "GPU-bbbb"
RUNNING = {"driver_branch": "570", "toolkit": "1.18.1-1", "k3s": "v1.33.5+k3s1"}
ENGINES = [
    {"name": "vllm", "node": "gpu-1"},
    {"name": "other", "node": "gpu-2"},
    {"name": "embed", "node": "gpu-1"},
]


def test_device_cordon_reads_and_writes_as_hami_does():
    assert cordoned_cards(" GPU-aaaa , ,GPU-bbbb,") == [A, B]
    assert device_cordon("", add=[A, B]) == "GPU-aaaa,GPU-bbbb"
    # a card already cordoned by hand stays, once; lifting ours leaves it
    assert device_cordon("GPU-cccc, GPU-aaaa", add=[A, B]) == "GPU-cccc,GPU-aaaa,GPU-bbbb"
    assert device_cordon("GPU-cccc,GPU-aaaa,GPU-bbbb", remove=[A, B]) == "GPU-cccc"
    assert device_cordon("GPU-aaaa", remove=[A]) == ""


def test_driver_branch():
    assert driver_branch("580.173.02") == "580" and driver_branch(None) == "" and driver_branch("n/a") == ""


def test_a_branch_change_plans_every_step_in_order_and_a_reboot():
    plan = node_plan("gpu-1", running=RUNNING, wanted={**RUNNING, "driver_branch": "580"}, cards=[A],
                     gpu_pods=["ai/vllm-1", "ai/embed-1"], engines=ENGINES)  # fmt: skip
    assert plan["upgrade"] == {"driver_branch": ["570", "580"]} and plan["reboot"]
    assert plan["engines"] == ["vllm", "embed"]
    kinds = [s.split()[0] for s in plan["steps"]]
    assert kinds == ["cordon", "put", "drain", "upgrade", "reboot", "prove", "take", "see"]
    assert "hami.io/device-cordon on gpu-1 for its cards GPU-aaaa" in plan["steps"][1]
    assert plan["steps"][2] == "drain gpu-1's GPU pods: ai/vllm-1, ai/embed-1"
    assert plan["steps"][-1].endswith("in their start order: vllm, embed")
    assert plan_text([plan]).splitlines()[0] == "1. cordon gpu-1"


def test_a_toolkit_only_change_needs_no_reboot_and_nothing_to_do_is_said():
    plan = node_plan(
        "gpu-2", running=RUNNING, wanted={**RUNNING, "toolkit": "1.18.2-1"}, cards=[B], gpu_pods=[]
    )
    assert plan["upgrade"] == {"toolkit": ["1.18.1-1", "1.18.2-1"]} and not plan["reboot"]
    assert not any(s.startswith("reboot") for s in plan["steps"])
    idle = node_plan("gpu-2", running=RUNNING, wanted=RUNNING, cards=[B], gpu_pods=[])
    assert idle["upgrade"] == {} and idle["steps"] == [
        "gpu-2: nothing to upgrade (driver 570, toolkit 1.18.1-1, k3s v1.33.5+k3s1)"
    ]
    # a version not known yet (nothing installed) counts as different
    fresh = node_plan("gpu-2", running={}, wanted=RUNNING, cards=[], gpu_pods=[])
    assert set(fresh["upgrade"]) == {"driver_branch", "toolkit", "k3s"}


def node(register):
    return {
        "metadata": {"name": "gpu-1", "annotations": {"hami.io/node-nvidia-register": json.dumps(register)}}
    }


def test_the_proof_passes_only_with_the_new_driver_and_every_card_registered():
    registered = node([{"id": A, "health": True}])
    ok = proof_problems("gpu-1", wanted_branch="580", smi_driver="580.173.02", smi_cards=[A], cards=[A],
                        node_object=registered)  # fmt: skip
    assert ok == []
    # the module did not change (no reboot): nvidia-smi still reports the old branch
    old = proof_problems("gpu-1", wanted_branch="580", smi_driver="570.195.03", smi_cards=[A], cards=[A],
                         node_object=registered)  # fmt: skip
    assert len(old) == 1 and "driver 570.195.03, not branch 580 (nvidia_driver_branch)" in old[0]
    failed = proof_problems("gpu-1", wanted_branch="580", smi_driver=None, smi_cards=[], cards=[A],
                            node_object=node([]))  # fmt: skip
    assert [p.split(":")[1].strip().split()[0] for p in failed] == ["nvidia-smi", "HAMi"]
    unhealthy = proof_problems("gpu-1", wanted_branch="580", smi_driver="580.173.02", smi_cards=[A], cards=[A],
                               node_object=node([{"id": A}]))  # fmt: skip
    assert unhealthy and "HAMi has not registered card(s) GPU-aaaa as healthy" in unhealthy[0]
    lost = proof_problems("gpu-1", wanted_branch="580", smi_driver="580.173.02", smi_cards=[], cards=[A],
                          node_object=registered)  # fmt: skip
    assert lost == ["gpu-1: nvidia-smi does not see card(s) GPU-aaaa it had before the upgrade"]


def pod(namespace, name, node, resources):
    return {"metadata": {"namespace": namespace, "name": name},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": resources}]}}  # fmt: skip


def test_the_reads_the_playbook_makes():
    pods = {"items": [
        pod("default", "vllm-1", "gpu-1", {"limits": {"nvidia.com/gpu": 1}}),
        pod("default", "web-1", "gpu-1", {"limits": {"cpu": "1"}}),
        pod("ai", "embed-1", "gpu-1", {"requests": {"nvidia.com/gpu": 1}}),
        pod("default", "vllm-2", "gpu-2", {"limits": {"nvidia.com/gpu": 1}}),
    ]}  # fmt: skip
    assert gpu_pods(pods, "gpu-1") == ["default/vllm-1", "ai/embed-1"] and gpu_pods(None, "gpu-1") == []
    assert toolkit_running("NVIDIA Container Toolkit CLI version 1.18.1") == "1.18.1"
    assert toolkit_running(None) == "" and toolkit_wanted("1.18.1-1") == "1.18.1" and toolkit_wanted("") == ""
    assert registered_cards(node([{"id": A, "health": True}, {"id": B}])) == [A, B]
    assert registered_cards({"metadata": {}}) == []
