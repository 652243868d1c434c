"""Several GPUs on one node: vm_gpu names one card id or a list of them; each card goes to one VM of its own
node, a VM with two cards gets one hostpci entry per card, and pinned memory is budgeted per node."""

from __future__ import annotations

import pytest
from builders import card, gpu_vm

from gpulab import labdef, vmspec

# A second card in the reference host: an RTX 3060 12 GB (GA106, LHR) with its HDMI audio in a group of its own.
RTX3060 = card("rtx3060", "0000:03:00", "10de:2504", 14)
# A second GPU VM on pve for it, smaller than vm-gpu, that may start at boot (the 3060 is not the screen).
VM_GPU_B = gpu_vm(
    103, "rtx3060", cores=4, memory_mib=8192, disk_gb=100, onboot=True, address="192.168.100.56"
)


@pytest.fixture
def cards(inv):
    """The reference lab with an RTX 3060 next to the RTX 3090 on node pve."""
    inv.hosts["pve"]["pve_gpus"].append(dict(RTX3060))
    return inv


@pytest.fixture
def two_vms(cards):
    """vm-gpu keeps the 3090 (now 8 GiB), vm-gpu-b gets the 3060: 4 + 4 + 8 + 8 GiB pinned of 31 GiB."""
    cards.hosts["vm-gpu"]["vm_memory_mib"] = 8192
    cards.add_vm("vm-gpu-b", VM_GPU_B)
    return cards


def found(inv) -> list[tuple[str, str, object]]:
    return [(p.host, p.field, p.value) for p in inv.check()[1]]


def test_two_cards_to_one_vm_are_two_hostpci_entries_in_list_order(cards):
    cards.hosts["vm-gpu"]["vm_gpu"] = ["rtx3090", "rtx3060"]
    definition, problems = cards.check()
    assert problems == [], [str(p) for p in problems]
    plan = vmspec.resolve(definition)["vm-gpu"]
    assert plan["gpus"] == ["rtx3090", "rtx3060"]
    assert plan["spec"]["hostpci"] == [
        {"mapping": "rtx3090", "host": "0000:02:00", "pcie": True},
        {"mapping": "rtx3060", "host": "0000:03:00", "pcie": True},
    ]
    text = labdef.plan_text(definition)
    assert "rtx3090+rtx3060" in text
    assert "GPU rtx3090 0000:02:00 (10de:2204, IOMMU group 13, boot display) -> vm-gpu" in text
    assert "GPU rtx3060 0000:03:00 (10de:2504, IOMMU group 14) -> vm-gpu" in text


def test_each_card_follows_the_same_mapping_and_raw_rules(cards):
    cards.hosts["vm-gpu"]["vm_gpu"] = ["rtx3060", "rtx3090"]
    cards.hosts["vm-gpu"]["vm_gpu_passthrough"] = "mapping"
    hostpci = vmspec.resolve(cards.check()[0])["vm-gpu"]["spec"]["hostpci"]
    assert hostpci == [{"mapping": "rtx3060", "pcie": True}, {"mapping": "rtx3090", "pcie": True}]
    del cards.hosts["vm-gpu"]["vm_gpu_passthrough"]
    del cards.globals["pve_api_token_id"], cards.globals["pve_api_token_secret"]
    cards.globals.update({"pve_api_user": "root@pam", "pve_api_password": "pw"})
    hostpci = vmspec.resolve(cards.check()[0])["vm-gpu"]["spec"]["hostpci"]
    assert hostpci == [{"host": "0000:03:00", "pcie": True}, {"host": "0000:02:00", "pcie": True}]


def test_a_list_of_one_id_is_the_same_vm_as_the_id(inv):
    single = vmspec.resolve(inv.check()[0])["vm-gpu"]
    inv.hosts["vm-gpu"]["vm_gpu"] = ["rtx3090"]
    definition, problems = inv.check()
    assert problems == []
    assert vmspec.resolve(definition)["vm-gpu"] == single


def test_two_vms_on_one_node_each_with_its_own_card(two_vms):
    definition, problems = two_vms.check()
    assert problems == [], [str(p) for p in problems]
    plans = vmspec.resolve(definition)
    assert list(plans)[-2:] == ["vm-gpu", "vm-gpu-b"]  # GPU VMs last
    assert plans["vm-gpu"]["spec"]["hostpci"] == [{"mapping": "rtx3090", "host": "0000:02:00", "pcie": True}]
    assert plans["vm-gpu-b"]["spec"]["hostpci"] == [
        {"mapping": "rtx3060", "host": "0000:03:00", "pcie": True}
    ]
    text = labdef.plan_text(definition)
    assert "(10de:2204, IOMMU group 13, boot display) -> vm-gpu\n" in text
    assert "(10de:2504, IOMMU group 14) -> vm-gpu-b" in text


def test_the_pinned_memory_of_gpu_vms_is_budgeted_on_their_node(two_vms):
    # 4096 + 4096 + 8192 + 12288 pinned + 4096 host reserve = 32768 > 31744
    two_vms.hosts["vm-gpu-b"]["vm_memory_mib"] = 12288
    problems = two_vms.check()[1]
    assert [(p.host, p.field, p.value) for p in problems] == [("pve", "pve_memory_mib", 31744)]
    assert "vm-gpu 8192, vm-gpu-b 12288" in problems[0].why


def test_the_same_card_in_two_vms_is_refused(two_vms):
    two_vms.hosts["vm-gpu-b"]["vm_gpu"] = ["rtx3060", "rtx3090"]
    two_vms.hosts["vm-gpu-b"]["vm_onboot"] = False  # the 3090 is the boot display: a problem of its own
    assert two_vms.messages() == [
        "vm-gpu-b: vm_gpu[1]='rtx3090': already given to vm-gpu. Fix: a card can be passed through to one VM "
        "only; share it inside k3s with HAMi."
    ]
    two_vms.hosts["vm-gpu-b"]["vm_gpu"] = "rtx3090"
    assert found(two_vms) == [("vm-gpu-b", "vm_gpu", "rtx3090")]


def test_a_card_id_missing_on_the_vms_node_is_refused(cards):
    cards.hosts["vm-gpu"]["vm_gpu"] = ["rtx3090", "rtx4090"]
    assert cards.messages() == [
        "vm-gpu: vm_gpu[1]='rtx4090': node pve has no GPU with that id. Fix: use an id from its pve_gpus "
        "(rtx3090, rtx3060)."
    ]


def test_a_card_of_another_node_is_refused(two_vms):
    # node pve2 with an RTX 4090; vm-gpu-b moves there and asks for its card and pve's 3090
    pve2 = {
        **two_vms.hosts["pve"],
        "ansible_host": "192.168.100.6",
        "pve_node": "pve2",
        "pve_gpus": [{**RTX3060, "id": "rtx4090", "pci": "0000:01:00", "vendor_device": "10de:2684"}],
    }
    pve2["pve_gpus"][0]["functions"] = ["0000:01:00.0", "0000:01:00.1"]
    two_vms.groups["proxmox"].append("pve2")
    two_vms.hosts["pve2"] = pve2
    two_vms.hosts["vm-gpu-b"].update(vm_node="pve2", vm_gpu=["rtx4090", "rtx3090"])
    problems = two_vms.check()[1]
    assert [(p.host, p.field, p.value, p.why) for p in problems] == [
        ("vm-gpu-b", "vm_gpu[1]", "rtx3090", "node pve2 has no GPU with that id")
    ]
    assert problems[0].fix == "use an id from its pve_gpus (rtx4090)"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([], [("vm-gpu", "vm_gpu", [])]),
        (["rtx3090", "rtx3090"], [("vm-gpu", "vm_gpu[1]", "rtx3090")]),
        (["rtx3090", {"id": "rtx3060"}], [("vm-gpu", "vm_gpu[1]", {"id": "rtx3060"})]),
        ({"id": "rtx3090"}, [("vm-gpu", "vm_gpu", {"id": "rtx3090"})]),
    ],
)
def test_a_list_that_names_no_card_or_a_card_twice_is_refused(cards, value, expected):
    cards.hosts["vm-gpu"]["vm_gpu"] = value
    assert found(cards) == expected


def test_list_problems_say_why_and_how_to_fix(cards):
    cards.hosts["vm-gpu"]["vm_gpu"] = []
    assert cards.messages() == [
        "vm-gpu: vm_gpu=[]: an empty list passes no card through. Fix: name at least one id from the node's "
        "pve_gpus, or remove vm_gpu for a VM without a GPU."
    ]
    cards.hosts["vm-gpu"]["vm_gpu"] = ["rtx3090", "rtx3090"]
    assert cards.messages() == [
        "vm-gpu: vm_gpu[1]='rtx3090': the same card as vm_gpu[0]. Fix: list each card once."
    ]
    cards.hosts["vm-gpu"]["vm_gpu"] = {"id": "rtx3090"}
    (message,) = cards.messages()
    assert message.startswith(
        "vm-gpu: vm_gpu={'id': 'rtx3090'}: expected a str or a list, got dict. Fix: write it"
    )


def test_a_gpu_vm_with_a_list_still_needs_what_a_gpu_vm_needs(cards):
    cards.hosts["vm-gpu"]["vm_gpu"] = ["rtx3090", "rtx3060"]
    cards.hosts["vm-gpu"]["vm_machine"] = "i440fx"
    assert found(cards) == [("vm-gpu", "vm_machine", "i440fx")]


def test_an_engine_picks_a_card_of_its_vm_by_index(cards):
    cards.hosts["vm-gpu"]["vm_gpu"] = ["rtx3090", "rtx3060"]
    engine = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "node": "vm-gpu", "gpus": [0, 1]}
    engine["gpu_memory_percent"] = 45
    cards.globals["workloads_engines"] = [engine]
    assert cards.messages() == []
    engine["gpus"] = [2]
    assert cards.messages() == [
        "all: workloads_engines='vllm': workloads_engines item 'vllm': card index 2 does not exist on vm-gpu, "
        "which has 2 card(s): indexes 0-1 in the order of its GPUs (vm_gpu). Fix: change workloads_engines as the "
        "message says (its keys: docs/variables.md, role workloads)."
    ]
