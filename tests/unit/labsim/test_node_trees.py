"""A second node's own hardware in the network lab: the sysfs tree built from its fixture devices, the boot
state decided on its own card, one node host per node at its own address."""

import ipaddress
import json
import os
import posixpath
from pathlib import Path

import pytest

from labsim import network_lab, sysfs_tree
from labsim.fixture import load_fixture, resolve_fixture
from labsim.net import node_host

CLUSTER = load_fixture(str(resolve_fixture("cluster")))
PVE, PVE2 = CLUSTER["nodes"]
BLACKLIST = "".join(f"blacklist {m}\n" for m in ("nouveau", "nova_core", "nova_drm", "nova", "nvidiafb"))
SOFTDEPS = "softdep nouveau pre: vfio-pci\nsoftdep snd_hda_intel pre: vfio-pci\n"


def _resolve(tree, path):
    """Follow a tree symlink the way the kernel's sysfs resolves it (relative to the link's folder)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), str(tree[path].data)))


def test_the_second_node_shows_its_own_devices_groups_and_boot_display():
    tree = sysfs_tree.build_tree("stock", pci=PVE2["pci"])
    listed = {p.rsplit("/", 1)[1] for p in tree if p.startswith("/sys/bus/pci/devices/")}
    assert listed == {d["id"] for d in PVE2["pci"]}
    assert "0000:02:00.0" in listed and tree["/sys/bus/pci/devices/0000:02:00.0"].kind == "symlink"
    nvme = _resolve(tree, "/sys/bus/pci/devices/0000:02:00.0")
    assert tree[f"{nvme}/vendor"].data == b"0x15b7\n"  # pve2's NVMe, not the reference's RTX 3090
    gpu = _resolve(tree, "/sys/bus/pci/devices/0000:01:00.0")
    assert (tree[f"{gpu}/vendor"].data, tree[f"{gpu}/device"].data) == (b"0x10de\n", b"0x2684\n")
    assert tree[f"{gpu}/modalias"].data == b"pci:v000010DEd00002684sv00001043sd000088E2bc03sc00i00\n"
    assert tree[f"{gpu}/config"].data[:4] == bytes.fromhex("de108426")
    # the iGPU drives the screen; the RTX 4090 does not
    igpu = _resolve(tree, "/sys/bus/pci/devices/0000:00:02.0")
    assert (tree[f"{igpu}/boot_vga"].data, tree[f"{gpu}/boot_vga"].data) == (b"1\n", b"0\n")
    group9 = sorted(p.rsplit("/", 1)[1] for p in tree if p.startswith("/sys/kernel/iommu_groups/9/devices/"))
    assert group9 == ["0000:01:00.0", "0000:01:00.1"]
    assert _resolve(tree, f"{gpu}/iommu_group") == "/sys/kernel/iommu_groups/9"
    # no device of the reference PC is left behind
    assert not any("0000:00:1b.0" in p for p in tree)


@pytest.mark.parametrize(
    ("state", "display", "audio"),
    [
        ("stock", "nouveau", "snd_hda_intel"),
        ("blacklisted", None, "snd_hda_intel"),
        ("vfio", "vfio-pci", "vfio-pci"),
    ],
)
def test_the_second_nodes_card_binds_the_drivers_of_the_boot_state(state, display, audio):
    tree = sysfs_tree.build_tree(state, pci=PVE2["pci"])
    for addr, want in (("0000:01:00.0", display), ("0000:01:00.1", audio)):
        link = f"/sys/devices/pci0000:00/{addr}/driver"
        got = posixpath.basename(str(tree[link].data)) if link in tree else None
        assert got == want, (addr, state)
        if want:
            assert _resolve(tree, link) + "/" + addr in tree  # the driver lists the device too
            assert _resolve(tree, f"{_resolve(tree, link)}/{addr}") == f"/sys/devices/pci0000:00/{addr}"


def test_the_boot_state_is_decided_on_the_nodes_own_card():
    (functions,) = sysfs_tree.gpu_cards_of(PVE2["pci"])
    assert functions == {"0000:01:00.0": "10de:2684", "0000:01:00.1": "10de:22ba"}
    mine = {"gpulab.conf": BLACKLIST + SOFTDEPS + "options vfio-pci ids=10de:2684,10de:22ba\n"}
    other = {"gpulab.conf": BLACKLIST + SOFTDEPS + "options vfio-pci ids=10de:2204,10de:1aef\n"}
    assert sysfs_tree.boot_state("quiet", mine, "vfio_pci\n", functions) == "vfio"
    assert sysfs_tree.boot_state("quiet", other, "vfio_pci\n", functions) == "blacklisted"
    assert sysfs_tree.boot_state("quiet", {}, "", functions) == "stock"
    # the reference node still decides on its RTX 3090
    assert sysfs_tree.boot_state("quiet", other, "vfio_pci\n") == "vfio"


def test_only_a_node_that_is_not_the_reference_pc_gets_a_tree_of_its_own(tmp_path):
    ref = node_host.node_host_spec(PVE, tmp_path / "node0")
    second = node_host.node_host_spec(PVE2, tmp_path / "node1")
    ref_conf = json.loads(ref["tools"]["/etc/gpulab-sim/node.json"])
    conf = json.loads(second["tools"]["/etc/gpulab-sim/node.json"])
    assert "pci" not in ref_conf and "gpu_cards" not in ref_conf
    assert conf["pci"] == PVE2["pci"] and conf["loader"] == "grub"
    assert conf["gpu_cards"] == [{"0000:01:00.0": "10de:2684", "0000:01:00.1": "10de:22ba"}]


def test_a_booted_second_node_writes_its_own_view(tmp_path):
    spec = node_host.node_host_spec(PVE2, tmp_path / "node1")
    root = tmp_path / "root"
    for path, text in {**spec["files"], **spec["tools"]}.items():
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    (root / "etc/modprobe.d/gpulab-vfio.conf").write_text(
        BLACKLIST + SOFTDEPS + "options vfio-pci ids=10de:2684,10de:22ba\n"
    )
    (root / "etc/modules").write_text("vfio_pci\n")
    view = tmp_path / "view"
    # its first boot's initramfs is built from these files: vfio-pci claims the RTX 4090's two functions
    assert node_host.boot(root, view, {"iommu": True})["state"] == "vfio"
    assert os.readlink(view / "sys/devices/pci0000:00/0000:01:00.0/driver").endswith("/vfio-pci")


@pytest.mark.parametrize(
    ("subnet", "count", "want"),
    [("10.1.2.0/24", 1, [".5"]), ("10.1.2.0/24", 2, [".5", ".6"]), ("10.1.2.0/29", 2, [".3", ".4"])],
)
def test_node_hosts_get_the_fifth_address_and_the_next_ones(subnet, count, want):
    net = ipaddress.ip_network(subnet)
    hosts = list(net.hosts())
    got = network_lab._node_addresses(hosts, count, taken=(hosts[0], hosts[-1]))
    assert [f".{str(a).rsplit('.', 1)[1]}" for a in got] == want


def test_a_range_without_room_for_every_node_is_refused():
    hosts = list(ipaddress.ip_network("10.1.2.0/29").hosts())
    with pytest.raises(network_lab.LabNetError, match="no room for 5 node hosts"):
        network_lab._node_addresses(hosts, 5, taken=(hosts[0], hosts[-1]))


def test_each_vm_is_listed_on_its_own_nodes_host(tmp_path):
    lab = network_lab.NetworkLab(tmp_path)
    assert network_lab.node_host_dir(lab, CLUSTER, "pve2") == lab.hosts_dir / "node1"
    assert network_lab.node_host_dir(lab, CLUSTER, "pve") == lab.hosts_dir / "node0"
    assert isinstance(network_lab.node_host_dir(lab, CLUSTER, "elsewhere"), Path)


TWO = load_fixture(str(resolve_fixture("two-gpus")))["nodes"][0]


def _drivers(tree, *addresses):
    out = []
    for addr in addresses:
        link = f"/sys/devices/pci0000:00/{addr}/driver"
        out.append(posixpath.basename(str(tree[link].data)) if link in tree else None)
    return out


def test_each_card_of_a_two_card_node_boots_to_its_own_state():
    cards = sysfs_tree.gpu_cards_of(TWO["pci"])
    assert [sorted(c) for c in cards] == [["0000:02:00.0", "0000:02:00.1"], ["0000:05:00.0", "0000:05:00.1"]]
    both = BLACKLIST + SOFTDEPS + "options vfio-pci ids=10de:2204,10de:1aef,10de:2504,10de:228e\n"
    first = BLACKLIST + SOFTDEPS + "options vfio-pci ids=10de:2204,10de:1aef\n"
    for conf, want in ((both, ["vfio", "vfio"]), (first, ["vfio", "blacklisted"])):
        states = [sysfs_tree.boot_state("quiet", {"gpulab.conf": conf}, "vfio_pci\n", c) for c in cards]
        assert states == want
    # the tree of a boot where only the RTX 3090's ids were given: the RTX 3060 is on no driver, its audio
    # on snd_hda_intel; with both cards' ids vfio-pci holds all four functions
    card_states = {"0000:02:00.0": "vfio", "0000:05:00.0": "blacklisted"}
    tree = sysfs_tree.build_tree("vfio", pci=TWO["pci"], card_states=card_states)
    funcs = ("0000:02:00.0", "0000:02:00.1", "0000:05:00.0", "0000:05:00.1")
    assert _drivers(tree, *funcs) == ["vfio-pci", "vfio-pci", None, "snd_hda_intel"]
    tree = sysfs_tree.build_tree("vfio", pci=TWO["pci"], card_states=dict.fromkeys(card_states, "vfio"))
    assert _drivers(tree, *funcs) == ["vfio-pci"] * 4
    # a stock second card beside a vfio first one still finds its driver's folder
    tree = sysfs_tree.build_tree("vfio", pci=TWO["pci"], card_states={"0000:05:00.0": "stock"})
    assert _drivers(tree, "0000:05:00.0") == ["nouveau"] and "/sys/bus/pci/drivers/nouveau/bind" in tree
