"""The driver per card (gpulab.cards, issue 31): the generated device table, the flavour gpulab picks for each
card fixture, the flavours preflight refuses before any write, Secure Boot's signed modules, what `gpulab plan`
and `gpulab discover` write, and the role's package names against the engine's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from builders import FIXTURE_CARDS, RTX3090

from gpulab import cards, discover, labdef, vmspec

ROOT = Path(__file__).resolve().parents[3]

# (fixture, the flavour gpulab picks when nvidia_driver_flavour is unset, the flavour refused, its message)
CASES = [
    ("gtx1080", "server", "server-open", "works only with the proprietary kernel modules"),
    ("rtx2080", "server-open", None, None),
    ("rtx5090", "server-open", "server", "works only with the open kernel modules"),
    ("rtx-a4000", "server-open", None, None),
    ("shared-group", "server-open", None, None),
]


def _with_card(inv, gpu, **vm):
    inv.hosts["pve"]["pve_gpus"] = [RTX3090, gpu]
    inv.hosts["vm-gpu"]["vm_gpu"] = gpu["id"]
    inv.hosts["vm-gpu"].update(vm)
    return inv


def test_the_table_is_generated_with_its_sources_and_covers_maxwell_to_blackwell():
    prov = cards.provenance()
    assert prov["made_by"] == "scripts/nvidia_gpu_table.py"
    assert prov["open_kernel_modules"]["tag"].startswith("580.")
    assert len(prov["open_kernel_modules"]["commit"]) == 40 and len(prov["pci_ids"]["commit"]) == 40
    table = json.loads((ROOT / "library/gpulab/data/nvidia-gpus.json").read_text())["devices"]
    archs = {row["architecture"] for row in table.values()}
    assert {"maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"} <= archs
    # consumer and data-centre cards of each end
    assert cards.card("10de:13c2").architecture == "maxwell"  # GTX 970
    assert cards.card("10de:1db4").open == "unsupported"  # Tesla V100
    assert cards.card("10de:2331").open == "recommended"  # H100 PCIe
    assert cards.card("10de:2342").open == "required"  # GH200
    assert cards.card("10de:2bb1").open == "required"  # RTX PRO 6000 Blackwell
    assert cards.card("10de:9999").architecture == "unknown"


def test_the_generator_gives_the_same_table_from_its_inputs(tmp_path):
    # the script's rules on a two-line pci.ids and README: same shape as the committed table
    (tmp_path / "pci.ids").write_text(
        "10de  NVIDIA Corporation\n\t1b80  GP104 [GeForce GTX 1080]\n\t10f0  GP104 High Definition Audio Controller\n"
        "\t2b85  GB202 [GeForce RTX 5090]\n\t2204  GA102 [GeForce RTX 3090]\n\t2488  GA104 [GeForce RTX 3070 LHR]\n"
        "10df  Emulex Corporation\n\t2204  not NVIDIA\n"
    )
    (tmp_path / "README.md").write_text(
        "## Compatible GPUs\n\n| Product Name | PCI ID |\n| --- | --- |\n"
        "| NVIDIA GeForce RTX 3090 | 2204 |\n| NVIDIA GeForce RTX 5090 | 2B85 |\n"
    )
    out = tmp_path / "table.json"
    cmd = [sys.executable, str(ROOT / "scripts/nvidia_gpu_table.py"), "--pci-ids", str(tmp_path / "pci.ids")]
    cmd += [
        "--open-readme",
        str(tmp_path / "README.md"),
        "--pci-ids-commit",
        "c" * 40,
        "--open-tag",
        "580.142",
    ]
    subprocess.run([*cmd, "--open-commit", "a" * 40, "--out", str(out)], check=True, capture_output=True)
    devices = json.loads(out.read_text())["devices"]
    assert {k: v["open"] for k, v in devices.items()} == {
        "1b80": "unsupported",
        "2b85": "required",
        "2204": "recommended",
        "2488": "unlisted",
    }


@pytest.mark.parametrize(("fixture", "picked", "refused", "why"), CASES, ids=[c[0] for c in CASES])
def test_each_card_fixture_gets_its_flavour_and_refuses_the_wrong_one(inv, fixture, picked, refused, why):
    gpu = FIXTURE_CARDS[fixture]
    definition, problems = _with_card(inv, gpu).check()
    assert problems == []
    plan = labdef.plan_text(definition)
    assert f"Driver vm-gpu: nvidia-driver-580-{picked} (" in plan
    assert "picked by gpulab" in plan
    if refused:
        inv.globals["nvidia_driver_flavour"] = refused
        msgs = inv.messages()
        assert len(msgs) == 1, msgs
        assert msgs[0].startswith(f"vm-gpu: nvidia_driver_flavour='{refused}': card {gpu['id']} is ")
        assert why in msgs[0] and f"Fix: set nvidia_driver_flavour: {picked}" in msgs[0]


def test_the_reference_card_keeps_the_flavour_the_homelab_sets(inv):
    # inventory/homelab sets server: the RTX 3090 (Ampere) may run it, so nothing changes for the user's lab
    inv.globals["nvidia_driver_flavour"] = "server"
    definition, problems = inv.check()
    assert problems == []
    assert (
        "Driver vm-gpu: nvidia-driver-580-server (proprietary kernel module, DKMS build; flavour server,"
        in (labdef.plan_text(definition))
    )
    # unset, gpulab would pick the open module for it
    inv.globals.pop("nvidia_driver_flavour")
    assert "nvidia-driver-580-server-open" in labdef.plan_text(inv.check()[0])


def test_branch_595_is_refused_for_a_pascal_card_before_any_change(inv):
    # 580 is NVIDIA's last branch for Maxwell, Pascal and Volta: 595 on the GTX 1080 is refused, naming the
    # card and the fix; the same card on 580 passes
    _with_card(inv, FIXTURE_CARDS["gtx1080"])
    inv.globals["nvidia_driver_branch"] = 595
    [msg] = inv.messages()
    assert msg.startswith(
        "vm-gpu: nvidia_driver_branch=595: card gtx1080 is GP104 [GeForce GTX 1080] (10de:1b80, Pascal)"
    )
    assert "branch 580 is the last that drives Pascal cards" in msg
    assert "Fix: set nvidia_driver_branch: 580, or pass the VM a Turing or newer card" in msg
    inv.globals["nvidia_driver_branch"] = 580
    assert inv.messages() == []


@pytest.mark.parametrize(
    ("device", "refused"), [("10de:13c2", True), ("10de:1db4", True), ("10de:1e82", False)]
)
def test_595_drives_turing_and_newer_only(device, refused):
    # GTX 970 (Maxwell), Tesla V100 (Volta): refused; RTX 2080 (Turing): not
    card_ = cards.card(device)
    assert bool(cards.branch_problems([("g", card_)], "595")) is refused
    assert cards.branch_problems([("g", card_)], "580") == []


@pytest.mark.parametrize("fixture", ["rtx2080", "rtx5090"])
def test_branch_595_is_offered_for_turing_and_newer(inv, fixture):
    _with_card(inv, FIXTURE_CARDS[fixture])
    inv.globals["nvidia_driver_branch"] = 595
    definition, problems = inv.check()
    assert problems == []
    assert "Driver vm-gpu: nvidia-driver-595-server-open (" in labdef.plan_text(definition)
    # the reference RTX 3090 keeps 580 unless the inventory says otherwise
    assert "nvidia-driver-580-" in labdef.plan_text(inv.__class__().check()[0])


def test_cards_that_need_different_modules_cannot_share_a_vm(inv):
    inv.hosts["pve"]["pve_gpus"] = [
        RTX3090,
        FIXTURE_CARDS["gtx1080"],
        {**FIXTURE_CARDS["rtx5090"], "pci": "0000:06:00"},
    ]
    inv.hosts["vm-gpu"]["vm_gpu"] = ["rtx5090", "gtx1080"]
    msgs = inv.messages()
    assert any(
        m.startswith("vm-gpu: vm_gpu='gtx1080': ")
        and "only with the open kernel modules" in m
        and "two VMs" in m
        for m in msgs
    ), msgs


def test_secure_boot_gets_the_signed_modules_and_a_kernel_without_them_is_refused(inv):
    _with_card(inv, FIXTURE_CARDS["rtx5090"], vm_efi_pre_enrolled_keys=True)
    definition, problems = inv.check()
    assert problems == []
    plan = labdef.plan_text(definition)
    assert (
        "Driver vm-gpu: linux-modules-nvidia-580-server-open-<series of the running kernel> "
        "nvidia-headless-no-dkms-580-server-open "
        "nvidia-utils-580-server (open kernel module, Canonical-signed precompiled modules (Secure Boot on)"
    ) in plan
    assert vmspec.resolve(definition)["vm-gpu"]["driver"]["modules"] == "signed"
    inv.globals["nvidia_driver_kernel_flavour"] = "kvm"
    [msg] = inv.messages()
    assert msg.startswith("vm-gpu: vm_efi_pre_enrolled_keys=True: Secure Boot is on")
    assert "(1) set vm_efi_pre_enrolled_keys: false" in msg and "(2) run a kernel flavour with signed" in msg


def test_discover_writes_the_flavour_it_picked_with_why():
    def gpus(*ids, vms=()):
        return SimpleNamespace(
            gpus=[SimpleNamespace(id=f"g{i}", vendor_device=v) for i, v in enumerate(ids)],
            proposed=False,
            vms=list(vms),
        )

    lines = discover._flavour_lines(gpus("10de:2b85"))
    assert lines[-1] == "nvidia_driver_flavour: server-open"
    assert "GB202 [GeForce RTX 5090] (10de:2b85, Blackwell)" in " ".join(lines[:-1])
    assert discover._flavour_lines(gpus("10de:1b80"))[-1] == "nvidia_driver_flavour: server"
    mixed = discover._flavour_lines(gpus("10de:1b80", "10de:2b85"))
    assert mixed[-1] == "# nvidia_driver_flavour:" and "need different kernel modules" in " ".join(mixed)
    # a GPU VM that exists already keeps the proprietary module where the card can run it (adoption)
    vm = SimpleNamespace(host="vm-gpu", get=lambda name: "g0" if name == "vm_gpu" else None)
    adopted = discover._flavour_lines(gpus("10de:2204", vms=[vm]))
    assert adopted[-1] == "nvidia_driver_flavour: server" and "vm-gpu already has a card" in " ".join(adopted)
    assert discover._flavour_lines(gpus("10de:2b85", vms=[vm]))[-1] == "nvidia_driver_flavour: server-open"


def _role_install(**values) -> list[str]:
    """roles/nvidia_driver's nvidia_driver_install, templated with these values over the role's vars."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role_vars = yaml.safe_load((ROOT / "roles/nvidia_driver/vars/main.yml").read_text())
    names = ("nvidia_driver_suffix", "nvidia_driver_package", "nvidia_driver_kernel_series")
    values = {"nvidia_driver_branch": "580", **values, **{k: trust_as_template(role_vars[k]) for k in names}}
    templar = Templar(loader=DataLoader(), variables=values)
    return list(templar.template(trust_as_template(role_vars["nvidia_driver_install"])))


@pytest.mark.parametrize("branch", ["580", "595"])
@pytest.mark.parametrize(
    ("flavour", "signed"), [("server", False), ("server-open", True), ("open", True), ("", False)]
)
@pytest.mark.parametrize("series", ["generic", "generic-hwe-24.04"])
def test_the_role_installs_the_packages_the_plan_shows(flavour, signed, series, branch):
    """The plan's names with the series the guest's running kernel has (read on the guest, or the inventory's)."""
    found = {"kernel": "6.17.0-14-generic", "kernel_series": {"series": series}}
    installed = _role_install(
        nvidia_driver_branch=branch,
        nvidia_driver_flavour=flavour,
        nvidia_driver_signed_modules=signed,
        nvidia_driver_kernel_flavour="",
        nvidia_driver_prerequisites=[],
        nvidia_driver_series_headers=False,
        nvidia_driver_running_kernel_headers=False,
        nvidia_driver_found=found,
    )
    assert installed == list(cards.packages(branch, flavour, signed, series))
    # the names Ubuntu noble packages for 595 (packages.ubuntu.com: nvidia-graphics-drivers-595-server and
    # linux-restricted-modules' linux-modules-nvidia-595-server-open-generic)
    if (branch, flavour, signed) == ("595", "server", False):
        assert installed == ["nvidia-driver-595-server"]
    if (branch, flavour, signed, series) == ("595", "server-open", True, "generic"):
        assert installed == [
            "linux-modules-nvidia-595-server-open-generic",
            "nvidia-headless-no-dkms-595-server-open",
            "nvidia-utils-595-server",
        ]


def test_an_hwe_guests_dkms_build_gets_the_hwe_headers_not_the_ga_ones():
    """issue 43: on the HWE kernel the headers metapackage is linux-headers-generic-hwe-24.04 (the GA
    linux-headers-generic would bring the 6.8 headers for nothing); on the GA kernel it stays linux-headers-generic."""

    def dkms(series, kernel):
        return _role_install(
            nvidia_driver_flavour="server",
            nvidia_driver_signed_modules=False,
            nvidia_driver_kernel_flavour="",
            nvidia_driver_prerequisites=["dkms"],
            nvidia_driver_series_headers=True,
            nvidia_driver_running_kernel_headers=True,
            nvidia_driver_found={"kernel": kernel, "kernel_series": {"series": series}},
        )

    assert dkms("generic-hwe-24.04", "6.17.0-14-generic") == [
        "dkms", "linux-headers-generic-hwe-24.04", "linux-headers-6.17.0-14-generic", "nvidia-driver-580-server",
    ]  # fmt: skip
    assert dkms("generic", "6.8.0-90-generic") == [
        "dkms", "linux-headers-generic", "linux-headers-6.8.0-90-generic", "nvidia-driver-580-server",
    ]  # fmt: skip
    # no metapackage runs the kernel (a kernel of its own): its headers only
    assert dkms(None, "6.18.1-custom") == ["dkms", "linux-headers-6.18.1-custom", "nvidia-driver-580-server"]


def test_a_large_bar_cards_guest_address_width_goes_into_the_cpu_option(inv):
    _with_card(inv, FIXTURE_CARDS["rtx5090"], vm_guest_phys_bits=39)
    definition, problems = inv.check()
    assert problems == []
    assert vmspec.resolve(definition)["vm-gpu"]["spec"]["cpu"] == "host,guest-phys-bits=39"
    inv.hosts["vm-gpu"]["vm_guest_phys_bits"] = 20
    [msg] = inv.messages()
    assert msg.startswith("vm-gpu: vm_guest_phys_bits=20: PVE's guest-phys-bits is 32-64")
