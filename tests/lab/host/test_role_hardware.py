"""Stage host (playbooks/host.yml) on the lab's node host started from the hardware fixtures of issue 43: an Intel
iGPU as the boot display (igpu-boot-vga), a Turing card whose xHCI driver is built into the kernel (turing-usbc),
and a GRUB node with a leftover /etc/kernel/cmdline (grub-stray-cmdline).

Needs root (mount namespaces and overlays), as tests/lab/host/test_role.py.
"""

import pytest
from builders import FIXTURE_CARDS
from unit.host.conftest import NODE_HOST, PVE_BLACKLIST, REFERENCE_GPU, PlaybookNode, load_module

pytestmark = NODE_HOST
ALLOW = {"pve_host_reboot_allowed": True}


@pytest.fixture
def node(tmp_path, request):
    host = PlaybookNode(tmp_path, **request.param).start()
    yield host
    host.stop()


def facts(node, slots):
    return load_module("pci_facts").gather(str(node.sysroot), slots)


@pytest.mark.parametrize(
    "node", [{"fixture": "igpu-boot-vga", "gpus": [{**REFERENCE_GPU, "boot_display": False}]}], indirect=True
)
def test_an_igpu_as_the_boot_display_keeps_i915(node):
    """The RTX 3090 is passed through, the UHD 630 drives the screen: no nomodeset, the run says why, and after
    gpulab's reboot the iGPU is still on i915 while the card is on vfio-pci."""
    rc, out, _recap = node.play(extra=ALLOW)
    assert rc == 0, out[-4000:]
    assert "nomodeset off for pve: no passed-through card is the boot display (0000:00:02.0 is)" in out
    line = node.etc_file("kernel/cmdline")
    assert "nomodeset" not in line and "modprobe.blacklist=nova_core,nova_drm,nova,nouveau" in line
    assert "boot vfio" in node.calls()
    after = facts(node, ["0000:02:00"])
    assert after["devices"]["0000:00:02.0"]["driver"] == "i915"
    assert set(after["slots"]["0000:02:00"]["drivers"].values()) == {"vfio-pci"}
    rc, out, recap = node.play(extra=ALLOW)
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


@pytest.mark.parametrize(
    "node", [{"fixture": "igpu-boot-vga", "gpus": [{**REFERENCE_GPU, "boot_display": False}]}], indirect=True
)
def test_the_owners_nomodeset_stays_and_the_run_names_the_igpu_it_costs(node):
    """pve_host_nomodeset: true on the same node: the owner's choice is kept (nomodeset goes on), the run names the
    iGPU that loses its driver, and after the reboot i915 no longer holds it."""
    rc, out, _recap = node.play(extra={**ALLOW, "pve_host_nomodeset": True})
    assert rc == 0, out[-4000:]
    assert (
        "nomodeset on for pve: pve_host_nomodeset is true (the owner's choice); 0000:00:02.0 (8086:9bc5, i915 holds "
        "it) would lose its DRM driver under it (/dev/dri goes)"
    ).replace("owner's", "owner''s") in out
    assert "nomodeset" in node.etc_file("kernel/cmdline").split()
    assert facts(node, ["0000:02:00"])["devices"]["0000:00:02.0"]["driver"] is None


@pytest.mark.parametrize(
    "node", [{"fixture": "turing-usbc", "gpus": [REFERENCE_GPU, FIXTURE_CARDS["rtx2080"]]}], indirect=True
)
def test_a_builtin_xhci_function_is_accepted_and_named(node):
    """The RTX 2080's xHCI function stays on xhci_hcd (xhci_pci is built in): the run names it and goes on, the
    other three functions are on vfio-pci after the reboot."""
    rc, out, _recap = node.play(extra=ALLOW)
    assert rc == 0, out[-4000:]
    assert (
        "0000:05:00.2 (slot 0000:05:00) is held by xhci_hcd, built into the kernel (xhci_pci in modules.builtin), "
        "so no softdep can load vfio-pci before it: accepted, as Proxmox VE unbinds it and binds vfio-pci when "
        "the VM starts" in out
    )
    assert "softdep i2c_nvidia_gpu pre: vfio-pci" in node.etc_file("modprobe.d/vfio.conf")
    drivers = facts(node, ["0000:05:00"])["slots"]["0000:05:00"]["drivers"]
    assert drivers == {
        "0000:05:00.0": "vfio-pci",
        "0000:05:00.1": "vfio-pci",
        "0000:05:00.2": "xhci_hcd",
        "0000:05:00.3": "vfio-pci",
    }
    rc, out, recap = node.play(extra=ALLOW)
    assert rc == 0 and recap["changed"] == 0, out[-4000:]


@pytest.mark.parametrize("node", [{"fixture": "grub-stray-cmdline"}], indirect=True)
def test_a_stray_kernel_cmdline_on_a_grub_node_stops_before_any_write(node):
    stray = node.etc_file("kernel/cmdline")
    rc, out, _recap = node.play(extra=ALLOW)
    assert rc != 0
    assert "the boot loader signals disagree: /etc/kernel/cmdline exists" in out
    assert (
        "/etc/kernel/proxmox-boot-uuids does not exist" in out
        and "remove the stray /etc/kernel/cmdline" in out
    )
    assert node.etc_file("kernel/cmdline") == stray
    assert node.etc_file("modprobe.d/pve-blacklist.conf") == PVE_BLACKLIST
    assert not (node.etc / "modprobe.d/vfio.conf").exists()
    assert not any(
        c.startswith(("update-initramfs", "update-grub", "proxmox-boot-tool", "shutdown"))
        for c in node.calls()
    )
