"""pci_facts against the fixture trees, checked line by line against real lspci/lsmod output."""

import re

import pytest

from labsim import sysfs_tree

from .conftest import DATA, run_module

SECTION = re.compile(r"^===== state=(\w+): (lspci -nnk -s 02:00|lspci -nn) ")


def lspci_sample():
    """{(state, command): [lines]} from the real lspci output over the same fixture trees."""
    sections, key = {}, None
    for line in (DATA / "pve-lspci.txt").read_text().splitlines():
        if line.startswith("====="):
            m = SECTION.match(line)
            key = (m.group(1), m.group(2)) if m else None
            if key:
                sections[key] = []
        elif key and line.strip():
            sections[key].append(line)
    return sections


def lspci_kernel_lines(lines):
    """{address: (driver or None, [modules])} from `lspci -nnk` lines."""
    out, current = {}, None
    for line in lines:
        if not line.startswith("\t"):
            current = "0000:" + line.split()[0]
            out[current] = [None, []]
        elif line.startswith("\tKernel driver in use: "):
            out[current][0] = line.split(": ", 1)[1]
        elif line.startswith("\tKernel modules: "):
            out[current][1] = line.split(": ", 1)[1].split(", ")
    return {k: tuple(v) for k, v in out.items()}


@pytest.fixture(scope="module", params=sysfs_tree.STATES)
def state_root(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    sysfs_tree.materialise(root, request.param)
    return request.param, root


def test_drivers_and_modules_match_lspci(state_root, facts_mod):
    state, root = state_root
    facts = facts_mod.gather(str(root), ["0000:02:00"])
    expected = lspci_kernel_lines(lspci_sample()[(state, "lspci -nnk -s 02:00")])
    assert set(expected) == {"0000:02:00.0", "0000:02:00.1"}
    for address, (drv, modules) in expected.items():
        assert facts["devices"][address]["driver"] == drv
        assert facts["devices"][address]["modules"] == modules
    slot = facts["slots"]["0000:02:00"]
    assert slot["drivers"] == {a: d for a, (d, _m) in expected.items()}
    assert slot["other_devices"] == [] and slot["iommu_groups"] == [13] and slot["boot_vga"] is True
    assert facts["warnings"] == []


def test_every_device_matches_lspci_nn(facts_mod, tmp_path):
    root = sysfs_tree.materialise(tmp_path, "vfio")
    facts = facts_mod.gather(str(root))
    lines = lspci_sample()[("vfio", "lspci -nn")]
    assert len(lines) == len(facts["devices"]) == 23
    for line in lines:
        address = "0000:" + line.split()[0]
        dev = facts["devices"][address]
        class_code = re.search(r" \[([0-9a-f]{4})\]: ", line).group(1)
        ids = re.findall(r"\[([0-9a-f]{4}:[0-9a-f]{4})\]", line)[-1]
        rev = re.search(r"\(rev ([0-9a-f]{2})\)$", line)
        assert dev["class_code"] == class_code
        assert dev["vendor_device"] == ids
        if rev:
            assert dev["revision"] == rev.group(1)


@pytest.mark.parametrize("state", sysfs_tree.STATES)
def test_loaded_modules_match_lsmod_sample(facts_mod, tmp_path, state):
    root = sysfs_tree.materialise(tmp_path, state)
    facts = facts_mod.gather(str(root))
    sample = sysfs_tree.resources.files("labsim") / "data/pve-sysfs" / f"pve-modules-state-{state}.txt"
    text = sample.read_text()
    if "lsmod output" in text:
        block = text.split("lsmod output", 1)[1].split("=====\n", 1)[1].split("\n\n", 1)[0]
        lsmod = [line.split()[0] for line in block.splitlines()[1:] if line.strip()]
        assert facts["modules_loaded"] == lsmod
    assert ("nouveau" in facts["modules_loaded"]) == (state == "stock")
    assert ("vfio_pci" in facts["modules_loaded"]) == (state == "vfio")


def test_iommu_groups(facts_mod, tmp_path):
    root = sysfs_tree.materialise(tmp_path, "vfio")
    facts = facts_mod.gather(str(root))
    groups = facts["iommu"]["groups"]
    assert facts["iommu"]["enabled"] is True
    assert list(groups) == [str(n) for n in range(16)]
    assert groups["13"] == ["0000:02:00.0", "0000:02:00.1"]
    assert groups["12"] == ["0000:00:1f.0", "0000:00:1f.3", "0000:00:1f.4", "0000:00:1f.5", "0000:00:1f.6"]
    assert all(dev["iommu_group"] is not None for dev in facts["devices"].values())
    assert facts["cmdline"].endswith("intel_iommu=on iommu=pt")
    assert facts["kernel_release"] == sysfs_tree.KERNEL_RELEASE and facts["efi"] is True


def test_iommu_off(facts_mod, tmp_path):
    root = sysfs_tree.materialise(tmp_path, "stock", iommu=False)
    facts = facts_mod.gather(str(root), ["0000:02:00"])
    assert facts["iommu"] == {"enabled": False, "groups": {}}
    assert facts["slots"]["0000:02:00"]["iommu_groups"] == []
    assert facts["devices"]["0000:02:00.0"]["iommu_group"] is None


def test_shared_group_names_the_other_device(facts_mod, tmp_path):
    root = sysfs_tree.materialise(tmp_path, "stock", share_group_with="0000:03:00.0")
    slot = facts_mod.gather(str(root), ["02:00"])["slots"]["02:00"]
    assert slot["slot"] == "0000:02:00"
    assert slot["other_devices"] == [
        {
            "address": "0000:03:00.0",
            "class": "0x020000",
            "vendor_device": "8086:15f3",
            "driver": "igc",
            "bridge": False,
        }
    ]


def test_single_function_and_missing_slot(facts_mod, tmp_path):
    root = sysfs_tree.materialise(tmp_path, "vfio")
    slots = facts_mod.gather(str(root), ["0000:02:00.1", "0000:09:00"])["slots"]
    assert slots["0000:02:00.1"]["functions"] == ["0000:02:00.1"]
    assert slots["0000:02:00.1"]["boot_vga"] is False
    # The audio function alone shares group 13 with the VGA function.
    assert [d["address"] for d in slots["0000:02:00.1"]["other_devices"]] == ["0000:02:00.0"]
    assert slots["0000:09:00"]["found"] is False and slots["0000:09:00"]["functions"] == []


def test_missing_modules_alias_is_a_warning(facts_mod, tmp_path):
    root = sysfs_tree.materialise(tmp_path, "vfio")
    (root / f"lib/modules/{sysfs_tree.KERNEL_RELEASE}/modules.alias").unlink()
    facts = facts_mod.gather(str(root), ["0000:02:00"])
    assert facts["devices"]["0000:02:00.0"]["modules"] == []
    assert "modules.alias" in facts["warnings"][0]


def test_module_run_returns_facts_and_never_changes(tmp_path):
    root = sysfs_tree.materialise(tmp_path, "vfio")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    result = run_module("pci_facts", {"root": str(root), "slots": ["0000:02:00"]}, check_mode=True)
    assert result["changed"] is False
    pci = result["ansible_facts"]["gpulab_pci"]
    assert pci["slots"]["0000:02:00"]["drivers"] == {"0000:02:00.0": "vfio-pci", "0000:02:00.1": "vfio-pci"}
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_module_run_fails_without_sys(tmp_path):
    result = run_module("pci_facts", {"root": str(tmp_path)})
    assert result["failed"] is True and "is not a directory" in result["msg"]


@pytest.mark.parametrize(
    ("state", "binding", "modules"),
    [
        (
            "stock",
            [
                "0000:02:00.0 (slot 0000:02:00) is bound to nouveau, not vfio-pci",
                "0000:02:00.1 (slot 0000:02:00) is bound to snd_hda_intel, not vfio-pci",
            ],
            ["nouveau is loaded"],
        ),
        ("blacklisted", ["0000:02:00.1 (slot 0000:02:00) is bound to snd_hda_intel, not vfio-pci"], []),
        ("vfio", [], []),
    ],
)
def test_binding_and_module_checks(tmp_path, state, binding, modules):
    root = sysfs_tree.materialise(tmp_path, state)
    args = {
        "root": str(root),
        "slots": ["0000:02:00", "0000:0a:00"],
        "allowed_drivers": ["vfio-pci"],
        "forbidden_modules": ["nouveau", "nova-core", "nvidia", "nvidiafb"],
    }
    pci = run_module("pci_facts", args)["ansible_facts"]["gpulab_pci"]
    assert sorted(pci["binding_problems"]) == sorted([*binding, "0000:0a:00 is not on this node"])
    assert pci["module_problems"] == modules


@pytest.mark.parametrize("state", sysfs_tree.STATES)
def test_loaded_modules_without_proc_modules(facts_mod, tmp_path, state):
    root = sysfs_tree.materialise(tmp_path, state)
    expected = sorted(facts_mod.gather(str(root))["modules_loaded"])
    (root / "proc/modules").unlink()
    facts = facts_mod.gather(str(root))
    assert facts["modules_source"] == "/sys/module"
    assert facts["modules_loaded"] == expected
    assert "loaded modules read from" in facts["warnings"][0]


# --- functions held by a driver built into the kernel (issue 43, fixture turing-usbc) ---------------------------


def _turing_tree(tmp_path, builtin, drivers):
    from labsim import sysfs_tree
    from labsim.fixture import load_fixture

    pci = load_fixture("turing-usbc")["nodes"][0]["pci"]
    return sysfs_tree.materialise(tmp_path / "t", "vfio", pci=pci, bindings=drivers, builtin=builtin)


AFTER_BOOT = {
    "0000:05:00.0": "vfio-pci",
    "0000:05:00.1": "vfio-pci",
    "0000:05:00.2": "xhci_hcd",
    "0000:05:00.3": "vfio-pci",
}


def test_a_builtin_driver_on_a_usb_function_is_accepted_and_named(facts_mod, tmp_path):
    root = _turing_tree(tmp_path, ["xhci_hcd", "xhci_pci"], AFTER_BOOT)
    facts = facts_mod.gather(str(root), ["0000:05:00"])
    assert facts["builtin_modules"] == ["xhci_hcd", "xhci_pci"]
    assert facts["devices"]["0000:05:00.2"]["driver_module"] == "xhci_pci"
    binding, modules, rebind = facts_mod.check(facts, ["vfio-pci"], ["nouveau"], True)
    assert binding == [] and modules == []
    assert rebind == [
        "0000:05:00.2 (slot 0000:05:00) is held by xhci_hcd, built into the kernel (xhci_pci in modules.builtin), "
        "so no softdep can load vfio-pci before it: accepted, as Proxmox VE unbinds it and binds vfio-pci when the "
        "VM starts (qemu-server prepare_pci_device)"
    ]
    # without the option, the strict check of before
    assert facts_mod.check(facts, ["vfio-pci"], [], False)[0] == [
        "0000:05:00.2 (slot 0000:05:00) is bound to xhci_hcd, not vfio-pci"
    ]


def test_a_module_driver_and_the_display_function_stay_strict(facts_mod, tmp_path):
    # xhci_pci as a module: a softdep could have put vfio-pci first, so the binding is a problem
    facts = facts_mod.gather(str(_turing_tree(tmp_path, [], AFTER_BOOT)), ["0000:05:00"])
    binding, _modules, rebind = facts_mod.check(facts, ["vfio-pci"], [], True)
    assert binding == ["0000:05:00.2 (slot 0000:05:00) is bound to xhci_hcd, not vfio-pci"] and rebind == []
    # a display function is never accepted, even on a built-in driver
    held = {**AFTER_BOOT, "0000:05:00.0": "nouveau"}
    facts = facts_mod.gather(str(_turing_tree(tmp_path / "d", ["nouveau", "xhci_pci"], held)), ["0000:05:00"])
    binding, _modules, rebind = facts_mod.check(facts, ["vfio-pci"], [], True)
    assert binding == ["0000:05:00.0 (slot 0000:05:00) is bound to nouveau, not vfio-pci"]
    assert [r.split(" ")[0] for r in rebind] == ["0000:05:00.2"]
