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
