"""The node's simulated sysfs tree and boot outcome (labsim.sysfs_tree) against the kernel and kmod: one test per
behaviour listed in library/labsim/UPSTREAM.md (## sysfs), named after its id."""

from __future__ import annotations

import stat

from labsim import sysfs_tree as st

#: What the node's host stage leaves: vfio-pci claims the card's ids and loads first
VFIO_CONF = {"vfio.conf": "options vfio-pci ids=10de:2204,10de:1aef\nsoftdep nouveau pre: vfio-pci\n"}
MODULES = "vfio\nvfio_iommu_type1\nvfio_pci\n"
KEPT_OFF = "blacklist nouveau\nblacklist nova_core\nblacklist nova_drm\nblacklist nvidiafb\n"


def test_sysfs_modprobe_blacklist(tmp_path):
    # `blacklist` keeps a module from loading through the device's alias, as at boot
    assert st.boot_state("root=ZFS=rpool/ROOT/pve-1", {}) == "stock"
    assert st.boot_state("root=ZFS=rpool/ROOT/pve-1", {"pve-blacklist.conf": KEPT_OFF}) == "blacklisted"
    # kmod reads only *.conf files of /etc/modprobe.d
    assert st.boot_state("root=ZFS=rpool/ROOT/pve-1", {"pve-blacklist.conf.bak": KEPT_OFF}) == "stock"


def test_sysfs_cmdline_blacklist():
    # modprobe.blacklist= (kmod reads /proc/cmdline) and module_blacklist= (the kernel) keep modules off too
    line = "root=ZFS=rpool/ROOT/pve-1 modprobe.blacklist=nova_core,nouveau module_blacklist=nvidiafb,nova_drm"
    assert st.boot_state(line, {}) == "blacklisted"
    assert st.boot_state("root=/dev/sda1 modprobe.blacklist=nouveau", {}) == "stock"  # nova_core still binds


def test_sysfs_nomodeset():
    # nomodeset keeps the DRM and fbdev drivers that would take over the firmware's display (nouveau, nvidiafb)
    # off; nova_core is neither and still binds
    assert st.boot_state("root=/dev/sda1 nomodeset", {}) == "stock"
    assert st.boot_state("root=/dev/sda1 nomodeset modprobe.blacklist=nova_core", {}) == "blacklisted"
    # the kernel takes nomodeset whatever follows the name (its __setup() matches a prefix): nomodeset=0 too
    assert st.boot_state("root=/dev/sda1 nomodeset=0 modprobe.blacklist=nova_core", {}) == "blacklisted"


def test_sysfs_install_false():
    conf = {
        "x.conf": "install nouveau /bin/false\ninstall nova_core /bin/true\ninstall nvidiafb /bin/false\n"
    }
    assert st.boot_state("root=/dev/sda1", conf) == "blacklisted"


def test_sysfs_module_name_dashes():
    # kmod treats '-' and '_' in module names alike
    conf = {"x.conf": "blacklist nova-core\nblacklist nouveau\nblacklist nvidiafb\n"}
    assert st.boot_state("root=/dev/sda1", conf) == "blacklisted"
    assert st.boot_state("root=/dev/sda1 modprobe.blacklist=nova-core nomodeset", {}) == "blacklisted"


def test_sysfs_vfio_pci_ids():
    # vfio-pci claims the functions its ids= name once it loads at boot; the host driver kept off
    both = {
        "vfio.conf": "options vfio-pci ids=10de:2204,10de:1aef\n",
        "b.conf": KEPT_OFF + "blacklist snd_hda_intel\n",
    }
    assert st.boot_state("root=/dev/sda1", both, MODULES) == "vfio"
    assert st.boot_state("root=/dev/sda1", both, "") == "blacklisted"  # vfio-pci never loaded
    # the ids on the kernel command line count as the modprobe.d option
    line = "root=/dev/sda1 vfio-pci.ids=10de:2204,10de:1aef"
    assert st.boot_state(line, {"b.conf": KEPT_OFF + "blacklist snd_hda_intel\n"}, MODULES) == "vfio"


def test_sysfs_vfio_pci_softdep():
    # without a softdep the audio function's snd_hda_intel (from the initramfs) binds before vfio-pci
    ids = {"vfio.conf": "options vfio-pci ids=10de:2204,10de:1aef\n", "b.conf": KEPT_OFF}
    assert st.boot_state("root=/dev/sda1", ids, MODULES) == "blacklisted"
    soft = {**ids, "vfio.conf": ids["vfio.conf"] + "softdep snd_hda_intel pre: vfio-pci\n"}
    assert st.boot_state("root=/dev/sda1", soft, MODULES) == "vfio"
    # a softdep of a module that loads makes vfio-pci load too, /etc/modules or not
    assert st.boot_state("root=/dev/sda1", soft, "") == "vfio"


def test_sysfs_cmdline_quotes():
    # the kernel's next_arg: double quotes keep blanks inside one parameter, an unclosed quote runs to the end
    assert st.split_cmdline('root=/dev/sda1  quiet  opt="a b"  x') == [
        "root=/dev/sda1",
        "quiet",
        'opt="a b"',
        "x",
    ]
    assert st.split_cmdline('a "b c') == ["a", '"b c']


def test_sysfs_write_only_attributes(tmp_path):
    st.materialise(tmp_path, "vfio")
    drivers = tmp_path / "sys" / "bus" / "pci" / "drivers" / "vfio-pci"
    for name in ("bind", "unbind", "new_id", "remove_id"):
        assert stat.S_IMODE((drivers / name).stat().st_mode) == 0o200, name


def test_sysfs_modalias():
    tree = st.build_tree("vfio")
    assert tree["/sys/devices/pci0000:00/0000:00:1b.0/0000:02:00.0/modalias"].data == (
        b"pci:v000010DEd00002204sv00001462sd00003881bc03sc00i00\n"
    )
    # another node's device gets the same format from its ids and class
    pci = [{"id": "0000:05:00.0", "class": "0x030000", "vendor": "0x10de", "device": "0x2504",
            "subsystem_vendor": "0x1458", "subsystem_device": "0x4074", "iommugroup": 16}]  # fmt: skip
    other = st.build_tree("vfio", pci=pci)
    assert other["/sys/devices/pci0000:00/0000:05:00.0/modalias"].data == (
        b"pci:v000010DEd00002504sv00001458sd00004074bc03sc00i00\n"
    )


def test_sysfs_iommu_groups():
    tree = st.build_tree("vfio")
    group = "/sys/kernel/iommu_groups/13/devices/"
    assert sorted(k.removeprefix(group) for k in tree if k.startswith(group)) == [
        "0000:02:00.0",
        "0000:02:00.1",
    ]
    link = tree["/sys/devices/pci0000:00/0000:00:1b.0/0000:02:00.0/iommu_group"]
    assert (link.kind, link.data) == ("symlink", "../../../../kernel/iommu_groups/13")
    # IOMMU off in the firmware: no groups at all, no device links
    off = st.build_tree("vfio", iommu=False)
    assert not [
        k for k in off if k.startswith("/sys/kernel/iommu_groups/") and k != "/sys/kernel/iommu_groups/"
    ]
    assert not [k for k in off if k.endswith("/iommu_group")]


#: The RTX 2080 of fixture turing-usbc: VGA, HD audio, USB 3.1 xHCI, USB Type-C UCSI
TURING = {
    "0000:05:00.0": "10de:1e82",
    "0000:05:00.1": "10de:10f8",
    "0000:05:00.2": "10de:1ad8",
    "0000:05:00.3": "10de:1ad9",
}
TURING_CLASSES = {
    "0000:05:00.0": "0x030000",
    "0000:05:00.1": "0x040300",
    "0000:05:00.2": "0x0c0330",
    "0000:05:00.3": "0x0c8000",
}
TURING_VFIO = {
    "vfio.conf": "options vfio-pci ids=10de:1e82,10de:10f8,10de:1ad8,10de:1ad9\nsoftdep nouveau pre: vfio-pci\n"
    "softdep snd_hda_intel pre: vfio-pci\nsoftdep xhci_pci pre: vfio-pci\nsoftdep i2c_nvidia_gpu pre: vfio-pci\n"
}


def test_sysfs_builtin_driver():
    # a driver built into the kernel binds its function at its initcall, before the initramfs loads any module:
    # the softdep and vfio-pci's ids change nothing for it; the same driver as a module loses to vfio-pci
    line = "root=ZFS=rpool/ROOT/pve-1 nomodeset modprobe.blacklist=nova_core"
    args = (line, TURING_VFIO, MODULES, TURING, TURING_CLASSES)
    assert st.boot_drivers(*args, ["xhci_pci"]) == {
        "0000:05:00.0": "vfio-pci",
        "0000:05:00.1": "vfio-pci",
        "0000:05:00.2": "xhci_hcd",
        "0000:05:00.3": "vfio-pci",
    }
    assert set(st.boot_drivers(*args, []).values()) == {"vfio-pci"}
    # a blacklist does not apply to a built-in driver either (kmod reads it for modules only)
    line += " modprobe.blacklist=xhci_pci"
    assert st.boot_drivers(line, TURING_VFIO, MODULES, TURING, TURING_CLASSES, ["xhci_pci"])[
        "0000:05:00.2"
    ] == ("xhci_hcd")
    # without vfio-pci the UCSI function is i2c_nvidia_gpu's ("nvidia-gpu")
    assert st.boot_drivers("root=/dev/sda1", {}, "", TURING, TURING_CLASSES, ["xhci_pci"])[
        "0000:05:00.3"
    ] == ("nvidia-gpu")


def test_sysfs_nomodeset_igpu(tmp_path):
    # nomodeset keeps every DRM driver off, another vendor's too: the Intel iGPU loses i915 (i915_check_nomodeset)
    from labsim.fixture import load_fixture

    pci = load_fixture("igpu-boot-vga")["nodes"][0]["pci"]
    for line, driver in (
        ("root=/dev/sda1", "../../../bus/pci/drivers/i915"),
        ("root=/dev/sda1 nomodeset", None),
    ):
        root = st.materialise(tmp_path / str(bool(driver)), "stock", cmdline=line, pci=pci)
        link = root / "sys/devices/pci0000:00/0000:00:02.0/driver"
        assert (str(link.readlink()) if link.is_symlink() else None) == driver
        assert ("i915 " in (root / "proc/modules").read_text()) is bool(driver)
        assert (root / "sys/devices/pci0000:00/0000:00:02.0/boot_vga").read_text() == "1\n"
