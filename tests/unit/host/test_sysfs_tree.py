"""labsim.sysfs_tree: the fixture format, the materialised trees per state and variant, boot_state."""

import os

import pytest

from labsim import sysfs_tree as st

GPU = "sys/bus/pci/devices/0000:02:00.0"
AUDIO = "sys/bus/pci/devices/0000:02:00.1"

# What the node's files hold on a fresh PVE 9 install and after the role (reference lab).
STOCK_CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs "
PVE_BLACKLIST = "# shipped by pve-manager\nblacklist nvidiafb\n"
ROLE_CMDLINE = (
    "root=ZFS=rpool/ROOT/pve-1 boot=zfs nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau"
)
ROLE_BLACKLIST = (
    PVE_BLACKLIST + "blacklist nouveau\nblacklist nova_core\nblacklist nova_drm\nblacklist nova\n"
)
ROLE_VFIO = (
    "options vfio-pci ids=10de:2204,10de:1aef\n"
    "softdep nvidiafb pre: vfio-pci\nsoftdep nouveau pre: vfio-pci\nsoftdep nova_core pre: vfio-pci\n"
    "softdep snd_hda_intel pre: vfio-pci\n"
)
ROLE_MODULES = "vfio\nvfio_iommu_type1\nvfio_pci\n"


def driver(root, dev):
    link = root / dev / "driver"
    return os.path.basename(os.readlink(link)) if link.is_symlink() else None


def test_parse_entry_kinds():
    assert st.parse_entry('/a/b = "x\\ny"') == ("/a/b", st.Entry("file", b"x\ny"))
    path, entry = st.parse_entry("/a/config = hex:de10")
    assert path == "/a/config" and entry.data[:2] == b"\xde\x10" and len(entry.data) == 256
    assert st.parse_entry("/a/l -> ../x") == ("/a/l", st.Entry("symlink", "../x"))
    assert st.parse_entry("/a/d/") == ("/a/d", st.Entry("dir"))
    with pytest.raises(st.FixtureError):
        st.parse_entry("/a/b == nonsense")


def test_delta_removes_and_changes():
    tree = {"/a": st.Entry("file", b"1"), "/d": st.Entry("dir"), "/d/x": st.Entry("file", b"2")}
    added, removed = st.parse_delta('+ /a = "9"\n- /d\n')
    out = st.apply_delta(tree, added, removed)
    assert out == {"/a": st.Entry("file", b"9")}
    with pytest.raises(st.FixtureError):
        st.parse_delta('/a = "9"\n')


@pytest.mark.parametrize(
    ("state", "gpu", "audio", "loaded", "absent"),
    [
        ("stock", "nouveau", "snd_hda_intel", "nouveau", "vfio_pci"),
        ("blacklisted", None, "snd_hda_intel", "snd_hda_intel", "nouveau"),
        ("vfio", "vfio-pci", "vfio-pci", "vfio_pci", "nouveau"),
    ],
)
def test_materialise_states(tmp_path, state, gpu, audio, loaded, absent):
    root = st.materialise(tmp_path / "node", state)
    assert driver(root, GPU) == gpu
    assert driver(root, AUDIO) == audio
    modules = [line.split()[0] for line in (root / "proc/modules").read_text().splitlines()]
    assert loaded in modules and absent not in modules
    assert (root / GPU / "boot_vga").read_text() == "1\n"
    assert not (root / AUDIO / "boot_vga").exists()
    assert (root / GPU / "vendor").read_text() == "0x10de\n"
    assert len((root / GPU / "config").read_bytes()) == 256
    groups = sorted(os.listdir(root / "sys/kernel/iommu_groups"), key=int)
    assert groups == [str(n) for n in range(16)]
    assert sorted(os.listdir(root / "sys/kernel/iommu_groups/13/devices")) == ["0000:02:00.0", "0000:02:00.1"]
    # Every symlink of the tree resolves inside the tree (relative targets exactly as on a real host).
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                assert os.path.realpath(path).startswith(str(root.resolve())), path
                assert os.path.exists(path), f"dangling {path}"
    # lspci's Kernel modules line comes from this alias file.
    aliases = (root / f"lib/modules/{st.KERNEL_RELEASE}/modules.alias").read_text()
    assert "alias pci:v000010DEd*sv*sd*bc03sc*i* nouveau\n" in aliases


def test_materialise_again_replaces_previous_state(tmp_path):
    root = tmp_path / "node"
    st.materialise(root, "stock")
    (root / "etc").mkdir()
    (root / "etc/keep").write_text("node file")
    st.materialise(root, "vfio", cmdline="root=x nomodeset")
    assert driver(root, GPU) == "vfio-pci"
    assert not (root / "sys/bus/pci/drivers/nouveau").exists()
    assert (root / "proc/cmdline").read_text() == "root=x nomodeset\n"
    assert (root / "etc/keep").read_text() == "node file"


def test_materialise_refuses_machine_root():
    with pytest.raises(ValueError, match="refuses"):
        st.materialise("/", "stock")


def test_unknown_state(tmp_path):
    with pytest.raises(ValueError, match="stock, blacklisted, vfio"):
        st.materialise(tmp_path, "broken")


def test_iommu_off(tmp_path):
    root = st.materialise(tmp_path / "n", "stock", iommu=False)
    assert os.listdir(root / "sys/kernel/iommu_groups") == []
    assert not (root / GPU / "iommu_group").exists()
    assert driver(root, GPU) == "nouveau"


def test_shared_group(tmp_path):
    root = st.materialise(tmp_path / "n", "stock", share_group_with="0000:03:00.0")
    members = sorted(os.listdir(root / "sys/kernel/iommu_groups/13/devices"))
    assert members == ["0000:02:00.0", "0000:02:00.1", "0000:03:00.0"]
    nic_group = root / "sys/bus/pci/devices/0000:03:00.0/iommu_group"
    assert os.path.basename(os.readlink(nic_group)) == "13"
    assert os.path.realpath(nic_group) == os.path.realpath(root / "sys/kernel/iommu_groups/13")
    assert not (root / "sys/kernel/iommu_groups/14").exists()
    with pytest.raises(ValueError, match="GPU's own"):
        st.build_tree("stock", share_group_with="0000:02:00.1")
    with pytest.raises(ValueError, match="no PCI device"):
        st.build_tree("stock", share_group_with="0000:09:00.0")


@pytest.mark.parametrize(
    ("cmdline", "modprobe_d", "modules", "expected"),
    [
        # Fresh install: PVE blacklists nvidiafb only, nouveau binds the GPU.
        (STOCK_CMDLINE, {"pve-blacklist.conf": PVE_BLACKLIST}, "", "stock"),
        # The reference lab after the role: vfio-pci owns both functions.
        (ROLE_CMDLINE, {"pve-blacklist.conf": ROLE_BLACKLIST, "vfio.conf": ROLE_VFIO}, ROLE_MODULES, "vfio"),
        # Blacklists alone: nothing binds the GPU, the audio stays on snd_hda_intel.
        (ROLE_CMDLINE, {"pve-blacklist.conf": ROLE_BLACKLIST}, "", "blacklisted"),
        (STOCK_CMDLINE, {"pve-blacklist.conf": ROLE_BLACKLIST}, "", "blacklisted"),
        (
            STOCK_CMDLINE + " modprobe.blacklist=nouveau,nova_core",
            {"pve-blacklist.conf": PVE_BLACKLIST},
            "",
            "blacklisted",
        ),
        (STOCK_CMDLINE + " module_blacklist=nouveau,nova_core nomodeset", {}, "", "blacklisted"),
        # nomodeset keeps nouveau and nvidiafb off, but nova_core is no DRM driver.
        (STOCK_CMDLINE + " nomodeset", {}, "", "stock"),
        (STOCK_CMDLINE + " nomodeset modprobe.blacklist=nova-core", {}, "", "blacklisted"),
        # vfio ids without a softdep: nouveau (not kept off) binds first.
        (
            STOCK_CMDLINE,
            {"pve-blacklist.conf": PVE_BLACKLIST, "v.conf": "options vfio_pci ids=10de:2204,10de:1aef\n"},
            ROLE_MODULES,
            "stock",
        ),
        # vfio ids with the GPU drivers kept off, but the audio not claimed (no softdep): not "vfio".
        (
            ROLE_CMDLINE,
            {"b.conf": ROLE_BLACKLIST, "v.conf": "options vfio-pci ids=10de:2204,10de:1aef\n"},
            ROLE_MODULES,
            "blacklisted",
        ),
        # Softdeps load vfio-pci even without /etc/modules (snd_hda_intel loads for the board's audio).
        (ROLE_CMDLINE, {"b.conf": ROLE_BLACKLIST, "vfio.conf": ROLE_VFIO}, "", "vfio"),
        # ids on the kernel command line count like options lines.
        (
            ROLE_CMDLINE + " vfio-pci.ids=10de:2204,10de:1aef",
            {"b.conf": ROLE_BLACKLIST, "s.conf": "softdep snd_hda_intel pre: vfio-pci\n"},
            "",
            "vfio",
        ),
        # Files not ending in .conf are ignored by kmod.
        (ROLE_CMDLINE, {"b.conf": ROLE_BLACKLIST, "vfio.conf.bak": ROLE_VFIO}, "", "blacklisted"),
        # vfio_pci itself blacklisted: never loads.
        (
            ROLE_CMDLINE + " module_blacklist=vfio_pci",
            {"b.conf": ROLE_BLACKLIST, "vfio.conf": ROLE_VFIO},
            ROLE_MODULES,
            "blacklisted",
        ),
    ],
)
def test_boot_state(cmdline, modprobe_d, modules, expected):
    assert st.boot_state(cmdline, modprobe_d, modules) == expected


def test_boot_state_feeds_materialise(tmp_path):
    state = st.boot_state(ROLE_CMDLINE, {"pve-blacklist.conf": ROLE_BLACKLIST, "vfio.conf": ROLE_VFIO})
    root = st.materialise(tmp_path / "n", state, cmdline=ROLE_CMDLINE)
    assert driver(root, GPU) == driver(root, AUDIO) == "vfio-pci"
    assert (root / "proc/cmdline").read_text() == ROLE_CMDLINE + "\n"


def test_split_cmdline_quotes():
    assert st.split_cmdline('a "b c" d="e f" g') == ["a", '"b c"', 'd="e f"', "g"]
