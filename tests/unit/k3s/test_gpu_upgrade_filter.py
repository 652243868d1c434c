"""plugins/filter/gpu_upgrade.py: what role k3s_upgrade (tasks/gpu_node.yml) plans from what it read."""

import json
from importlib import util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[3] / "plugins" / "filter" / "gpu_upgrade.py"
_SPEC = util.spec_from_file_location("gpulab_gpu_upgrade_filter", _PATH)
_MOD = util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_MOD)
filters = _MOD.FilterModule().filters()

A = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
REGISTER = json.dumps([{"id": A, "health": True}])


def node_json(**annotations):
    return json.dumps({"metadata": {"name": "vm-gpu", "annotations": annotations}})


PODS = json.dumps({"items": [
    {"metadata": {"namespace": "default", "name": "vllm-abc"},
     "spec": {"nodeName": "vm-gpu", "containers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
]})  # fmt: skip
FACTS = {"driver_version": "580.173.02", "uuids": [A], "error": None,
         "container_toolkit": {"ctk_version": "NVIDIA Container Toolkit CLI version 1.18.1"}}  # fmt: skip
K3S = "v1.33.5+k3s1"  # k3s_facts' version
ENGINES = [{"name": "vllm", "node": "vm-gpu"}, {"name": "ollama", "node": "vm-gpu", "namespace": "ai"},
           {"name": "web", "node": "vm-2"}]  # fmt: skip


def test_a_branch_change_is_planned_with_the_cards_pods_and_engines():
    plan = filters["gpu_upgrade_plan"](
        "vm-gpu", FACTS, K3S, node_json(**{"hami.io/device-cordon": "GPU-other"}), PODS,
        {"driver_branch": 570, "toolkit": "1.18.1-1", "k3s": "v1.33.5+k3s1"}, ENGINES,
    )  # fmt: skip
    assert plan["upgrade"] == {"driver_branch": ["580", "570"]} and plan["reboot"]
    assert plan["gpu_pods"] == ["default/vllm-abc"] and plan["cards"] == [A]
    assert plan["device_cordon_before"] == "GPU-other" and plan["device_cordon"] == f"GPU-other,{A}"
    assert plan["deployments"] == ["default/vllm", "ai/ollama"]
    assert plan["text"][0] == "1. cordon vm-gpu" and plan["text"][-1].startswith("8. see vm-gpu's engines")


def test_nothing_differs_and_a_silent_nvidia_smi_takes_hamis_cards():
    same = filters["gpu_upgrade_plan"](
        "vm-gpu", FACTS, K3S, node_json(), PODS, {"driver_branch": "580", "toolkit": "", "k3s": ""}, []
    )
    assert same["upgrade"] == {} and same["text"] == [
        "1. vm-gpu: nothing to upgrade (driver 580, toolkit 1.18.1, k3s v1.33.5+k3s1)"
    ]
    mismatch = {"driver_version": None, "uuids": [], "error": "version_mismatch", "container_toolkit": {}}
    plan = filters["gpu_upgrade_plan"](
        "vm-gpu", mismatch, K3S, node_json(**{"hami.io/node-nvidia-register": REGISTER}), "",
        {"driver_branch": "580"}, [],
    )  # fmt: skip
    assert plan["upgrade"] == {"driver_branch": ["", "580"]} and plan["cards"] == [A]


def test_lift_and_proof():
    assert filters["gpu_upgrade_lift"](node_json(**{"hami.io/device-cordon": f"GPU-other,{A}"}), [A]) == (
        "GPU-other"
    )
    assert filters["gpu_upgrade_lift"](node_json(**{"hami.io/device-cordon": A}), [A]) == ""
    proof = filters["gpu_upgrade_proof"]
    registered = node_json(**{"hami.io/node-nvidia-register": REGISTER})
    assert proof("vm-gpu", FACTS, registered, "580", [A]) == []
    assert "not branch 570" in proof("vm-gpu", FACTS, registered, "570", [A])[0]
    failed = proof("vm-gpu", {"error": "version_mismatch", "uuids": []}, node_json(), "580", [A])
    assert (
        "version mismatch" in failed[0]
        and "reboot vm-gpu" in failed[0]
        and "HAMi has not registered" in failed[1]
    )
    other = proof("vm-gpu", {"error": "no_devices", "uuids": []}, registered, "580", [A])
    assert other[0].startswith(
        "vm-gpu: nvidia-smi fails after the upgrade (no_devices): the driver did not load"
    )
