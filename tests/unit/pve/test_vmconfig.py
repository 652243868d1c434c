"""The VM config table, its normalisers and the pure diff."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.pve import propstr, vmconfig
from gpulab.pve.vmconfig import diff, normalize_value

# ------------------------------------------------------------------------------------- spellings


SAME_MEANING = [
    # (key, spellings that all mean the same)
    ("memory", ["16384", "current=16384", 16384]),
    ("cpu", ["host", "cputype=host", "host,hidden=0", "cputype=host,hidden=off"]),
    ("cpu", ["x86-64-v2-AES,flags=+aes;+pcid", "cputype=x86-64-v2-AES,flags=+pcid;+aes"]),
    ("machine", ["q35", "type=q35"]),
    ("machine", ["pc", "type=pc", "i440fx", ""]),
    (
        "net0",
        ["virtio=BC:24:11:AA:BB:CC,bridge=vmbr0", "model=virtio,macaddr=bc:24:11:aa:bb:cc,bridge=vmbr0"],
    ),
    ("net0", ["virtio,bridge=vmbr0,firewall=0", "model=virtio,bridge=vmbr0", "bridge=vmbr0,model=virtio"]),
    (
        "net3",
        [
            "e1000=BC:24:11:00:00:01,bridge=vmbr1,tag=010",
            "model=e1000,bridge=vmbr1,macaddr=BC:24:11:00:00:01,tag=10",
        ],
    ),
    (
        "hostpci0",
        ["02:00,pcie=1", "0000:02:00,pcie=1", "host=0000:02:00,pcie=on", "host=02:00,pcie=yes,rombar=1"],
    ),
    (
        "hostpci0",
        ["mapping=rtx3090,pcie=1", "pcie=true,mapping=rtx3090,x-vga=0", "mapping=rtx3090,pcie=1,driver=vfio"],
    ),
    ("hostpci15", ["0000:0A:00.0", "0a:00.0", "host=0000:0a:00.0,legacy-igd=0"]),
    (
        "efidisk0",
        [
            "local-zfs:vm-102-disk-0,efitype=4m,pre-enrolled-keys=0,size=1M",
            "file=local-zfs:vm-102-disk-0,efitype=4m",
        ],
    ),
    (
        "efidisk0",
        ["local-zfs:vm-1-disk-0,efitype=4m,ms-cert=2023k", "volume=local-zfs:vm-1-disk-0,efitype=4m"],
    ),
    (
        "scsi0",
        [
            "local-zfs:vm-100-disk-0,iothread=1,size=60G",
            "file=local-zfs:vm-100-disk-0,iothread=on,size=64424509440",
        ],
    ),
    ("scsi0", ["local-zfs:vm-100-disk-0,backup=1,media=disk", "local-zfs:vm-100-disk-0"]),
    ("agent", ["1", "enabled=1", "enabled=yes,freeze-fs=1", "1,guest-fsfreeze=1"]),
    ("agent", ["0", "", "enabled=0"]),
    ("boot", ["order=scsi0;ide2;net0", "order=scsi0;ide2;net0"]),
    ("boot", ["cdn", "legacy=cdn", ""]),
    ("vga", ["std", "type=std", ""]),
    ("vga", ["serial0", "type=serial0"]),
    ("onboot", ["0", 0, False, "off", "no", "false"]),
    ("onboot", ["1", 1, True, "on", "yes", "true"]),
    ("cores", ["8", 8, "+8", "08"]),
    ("tags", ["k3s;gpu", "gpu,k3s", "gpu k3s", "k3s;gpu;"]),
    ("description", ["hello\n", "hello"]),
    ("sshkeys", ["ssh-ed25519%20AAAA%20me%0A", "ssh-ed25519%20AAAA%20me", "ssh-ed25519 AAAA me\n"]),
    ("ipconfig0", ["ip=dhcp", "ip=dhcp"]),
    ("startup", ["order=2,up=30", "2,up=30"]),
]


@pytest.mark.parametrize(
    ("key", "spellings"), SAME_MEANING, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SAME_MEANING)]
)
def test_spellings_normalise_to_one_value(key, spellings):
    canon = {normalize_value(key, s) for s in spellings}
    assert len(canon) == 1, canon


@pytest.mark.parametrize(
    ("key", "spellings"), SAME_MEANING, ids=[f"{k}-{i}" for i, (k, _) in enumerate(SAME_MEANING)]
)
def test_spellings_give_no_diff(key, spellings):
    for cur in spellings:
        for want in spellings:
            if vmconfig.key_info(key).disk:
                continue  # disks compare by volume/size, covered below
            change = diff({key: cur}, {key: want})
            assert not change.changed, (cur, want, change)


DIFFERENT = [
    ("cpu", "host", "x86-64-v2-AES"),
    ("machine", "q35", "pc"),
    ("memory", "4096", "current=8192"),
    ("net0", "virtio,bridge=vmbr0", "virtio,bridge=vmbr1"),
    ("net0", "virtio,bridge=vmbr0", "e1000,bridge=vmbr0"),
    ("net0", "virtio,bridge=vmbr0,firewall=1", "virtio,bridge=vmbr0"),
    ("hostpci0", "0000:02:00,pcie=1", "0000:02:00.0,pcie=1"),
    ("hostpci0", "mapping=rtx3090,pcie=1", "mapping=rtx3090"),
    ("hostpci0", "mapping=rtx3090", "0000:02:00"),
    ("boot", "order=scsi0;net0", "order=net0;scsi0"),
    ("agent", "1", "0"),
    ("onboot", "1", "0"),
    ("bios", "ovmf", "seabios"),
]


@pytest.mark.parametrize(("key", "want", "have"), DIFFERENT)
def test_different_meanings_are_written(key, want, have):
    change = diff({key: have}, {key: want})
    assert key in change.set
    assert normalize_value(key, change.after[key]) == normalize_value(key, want)
    assert normalize_value(key, change.before[key]) == normalize_value(key, have)
    assert change.after[key] != change.before[key]


# -------------------------------------------------------------------------------------- defaults


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("onboot", "0"),
        ("bios", "seabios"),
        ("cores", "1"),
        ("sockets", "1"),
        ("numa", 0),
        ("machine", "pc"),
        ("machine", "i440fx"),
        ("cpu", "kvm64"),
        ("agent", "enabled=0"),
        ("vga", "std"),
        ("scsihw", "lsi"),
        ("kvm", "1"),
        ("memory", "512"),
        ("ciupgrade", "1"),
    ],
)
def test_default_value_equals_absent_key(key, value):
    assert not diff({}, {key: value}).changed
    assert diff({}, {key: value}).set == {}


@pytest.mark.parametrize(
    ("key", "value"), [("onboot", "1"), ("bios", "ovmf"), ("cores", "4"), ("machine", "q35")]
)
def test_non_default_value_against_absent_key_is_set(key, value):
    change = diff({}, {key: value})
    assert change.set == {key: value}


def test_balloon_defaults_to_memory():
    assert not diff({"memory": "4096"}, {"balloon": "4096"}).changed
    assert diff({"memory": "4096"}, {"balloon": "0"}).set == {"balloon": "0"}
    assert not diff({"memory": "4096", "balloon": "0"}, {"balloon": 0}).changed
    # no memory key at all: PVE's default of 512 MiB
    assert not diff({}, {"balloon": "512"}).changed


def test_write_only_key_is_set_once_and_never_compared():
    assert diff({}, {"cipassword": "s3cret"}).set == {"cipassword": "s3cret"}
    change = diff({"cipassword": "**********"}, {"cipassword": "other"})
    assert not change.changed
    assert change.before["cipassword"] == "(secret)"


def test_read_only_key_is_refused_in_desired_and_hidden_in_views():
    with pytest.raises(ValueError, match="read-only"):
        diff({}, {"digest": "abc"})
    change = diff({"digest": "abc", "lock": "backup", "unused0": "local-zfs:vm-1-disk-9", "cores": 2}, {})
    assert change.before == {"cores": "2"}


def test_unknown_keys_compare_as_strings():
    assert not diff({"future-key": "x=1"}, {"future-key": "x=1"}).changed
    assert diff({"future-key": "x=1"}, {"future-key": "x=2"}).set == {"future-key": "x=2"}


# --------------------------------------------------------------------------------------- deletes


def test_none_deletes_a_present_key_only():
    change = diff({"hostpci0": "mapping=gpu", "cores": 2}, {"hostpci0": None, "serial0": None})
    assert change.delete == ["hostpci0"]
    assert change.set == {}
    assert "hostpci0" not in change.after
    assert change.changed


def test_unmanaged_keys_are_left_alone():
    change = diff({"cores": 2, "description": "mine", "net1": "virtio,bridge=vmbr9"}, {"cores": 2})
    assert not change.changed
    assert change.after == change.before


def test_cdrom_alias_is_ide2():
    change = diff({"ide2": "local:iso/u.iso,media=cdrom"}, {"cdrom": "local:iso/u.iso,media=cdrom"})
    assert not change.changed


# ----------------------------------------------------------------------------------------- no change


REFERENCE_GPU_CURRENT = {
    "digest": "0123456789abcdef0123456789abcdef01234567",
    "name": "vm-gpu",
    "machine": "q35",
    "bios": "ovmf",
    "efidisk0": "local-zfs:vm-102-disk-0,efitype=4m,pre-enrolled-keys=0,size=1M",
    "cpu": "host",
    "cores": 8,
    "memory": "16384",
    "balloon": 0,
    "scsihw": "virtio-scsi-single",
    "scsi0": "local-zfs:vm-102-disk-1,iothread=1,size=200G",
    "ide2": "local-zfs:vm-102-cloudinit,media=cdrom",
    "net0": "virtio=BC:24:11:12:34:56,bridge=vmbr0",
    "hostpci0": "mapping=rtx3090,pcie=1",
    "onboot": 0,
    "agent": "1",
    "boot": "order=scsi0",
    "ciuser": "ubuntu",
    "sshkeys": "ssh-ed25519%20AAAAC3Nza%20me%40lab%0A",
    "ipconfig0": "ip=dhcp",
    "serial0": "socket",
    "vga": "serial0",
    "vmgenid": "d4b4b0b6-0000-4000-8000-000000000000",
    "smbios1": "uuid=2c1b7a4e-0000-4000-8000-000000000000",
    "meta": "creation-qemu=9.2.0,ctime=1764400000",
}

REFERENCE_GPU_DESIRED = {
    "name": "vm-gpu",
    "machine": "q35",
    "bios": "ovmf",
    "efidisk0": "local-zfs:1,efitype=4m,pre-enrolled-keys=0",
    "cpu": "host",
    "cores": "8",
    "memory": "16384",
    "balloon": "0",
    "scsihw": "virtio-scsi-single",
    "scsi0": "local-zfs:200,iothread=1,import-from=local:import/noble-server-cloudimg-amd64.qcow2",
    "ide2": "local-zfs:cloudinit",
    "net0": "virtio,bridge=vmbr0",
    "hostpci0": "mapping=rtx3090,pcie=1",
    "onboot": "0",
    "agent": "1",
    "boot": "order=scsi0",
    "ciuser": "ubuntu",
    "sshkeys": vmconfig.encode_sshkeys(["ssh-ed25519 AAAAC3Nza me@lab"]),
    "ipconfig0": "ip=dhcp",
    "serial0": "socket",
    "vga": "serial0",
}


def test_reference_vm_in_place_means_no_change():
    change = diff(REFERENCE_GPU_CURRENT, REFERENCE_GPU_DESIRED)
    assert not change.changed, (change.set, change.delete, change.resize, change.refused)
    assert change.refused == []
    assert change.before == change.after
    assert "digest" not in change.before and "meta" not in change.before


def test_one_change_writes_only_that_key_and_keeps_the_mac():
    desired = dict(REFERENCE_GPU_DESIRED, cores="12", net0="virtio,bridge=vmbr1")
    change = diff(REFERENCE_GPU_CURRENT, desired)
    assert set(change.set) == {"cores", "net0"}
    assert change.set["cores"] == "12"
    assert "macaddr=BC:24:11:12:34:56" in change.set["net0"]
    assert "bridge=vmbr1" in change.set["net0"]
    assert change.delete == [] and change.resize == {}


def test_fixed_mac_in_spec_is_compared():
    desired = dict(REFERENCE_GPU_DESIRED, net0="virtio=BC:24:11:00:00:01,bridge=vmbr0")
    change = diff(REFERENCE_GPU_CURRENT, desired)
    assert set(change.set) == {"net0"}
    assert "BC:24:11:00:00:01" in change.set["net0"]


# ------------------------------------------------------------------------------------------ disks


def test_disk_grows_with_resize_and_keeps_its_volume():
    change = diff(REFERENCE_GPU_CURRENT, dict(REFERENCE_GPU_DESIRED, scsi0="local-zfs:250,iothread=1"))
    assert change.resize == {"scsi0": "250G"}
    assert change.set == {}
    assert "size=250G" in change.after["scsi0"]
    assert change.after["scsi0"].startswith("local-zfs:vm-102-disk-1")


def test_disk_never_shrinks():
    change = diff(REFERENCE_GPU_CURRENT, dict(REFERENCE_GPU_DESIRED, scsi0="local-zfs:100,iothread=1"))
    assert not change.changed
    assert len(change.refused) == 1
    assert "never shrink" in change.refused[0] and "200G" in change.refused[0] and "100G" in change.refused[0]


def test_disk_option_change_rewrites_options_on_the_same_volume():
    change = diff(
        REFERENCE_GPU_CURRENT, dict(REFERENCE_GPU_DESIRED, scsi0="local-zfs:200,iothread=1,discard=on")
    )
    assert change.set == {"scsi0": "local-zfs:vm-102-disk-1,discard=on,iothread=1"}
    assert change.resize == {}


def test_disk_on_another_storage_is_refused():
    change = diff(REFERENCE_GPU_CURRENT, dict(REFERENCE_GPU_DESIRED, scsi0="local-lvm:200,iothread=1"))
    assert change.refused and "local-lvm" in change.refused[0]
    assert not change.changed


def test_efidisk_options_are_fixed_at_creation():
    change = diff(
        REFERENCE_GPU_CURRENT,
        dict(REFERENCE_GPU_DESIRED, efidisk0="local-zfs:1,efitype=4m,pre-enrolled-keys=1"),
    )
    assert change.refused and "efidisk0" in change.refused[0]
    assert not diff(
        REFERENCE_GPU_CURRENT, dict(REFERENCE_GPU_DESIRED, efidisk0="local-zfs:1,efitype=4m")
    ).changed


def test_new_disk_slot_is_added():
    change = diff(REFERENCE_GPU_CURRENT, {"scsi1": "local-zfs:32"})
    assert change.set == {"scsi1": "local-zfs:32"}
    assert change.after["scsi1"] == "local-zfs:new,size=32G"


def test_iso_swap_and_eject():
    cur = {"ide2": "local:iso/ubuntu-24.04.iso,media=cdrom,size=2G"}
    assert not diff(cur, {"ide2": "local:iso/ubuntu-24.04.iso,media=cdrom"}).changed
    assert diff(cur, {"ide2": "none,media=cdrom"}).set == {"ide2": "none,media=cdrom"}
    assert diff(cur, {"ide2": "local:iso/other.iso,media=cdrom"}).set == {
        "ide2": "local:iso/other.iso,media=cdrom"
    }


def test_disk_where_a_cdrom_is_refused():
    change = diff({"ide2": "none,media=cdrom"}, {"ide2": "local-zfs:10"})
    assert change.refused and "not a disk" in change.refused[0]


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("200G", 200 << 30),
        ("1M", 1 << 20),
        ("4M", 4 << 20),
        ("1.5T", int(1.5 * (1 << 40))),
        ("512", 512),
        ("3584MiB", 3584 << 20),
    ],
)
def test_parse_size(text, size):
    assert vmconfig.parse_size(text) == size
    assert vmconfig.parse_size(vmconfig.format_size(size)) == size


# --------------------------------------------------------------------------------------- create


def test_create_params_leave_defaults_out_and_import_with_size_zero():
    params, resizes = vmconfig.create_params(
        {
            "name": "vm-1",
            "cores": "4",
            "sockets": "1",
            "memory": "4096",
            "balloon": "4096",
            "machine": "pc",
            "bios": "seabios",
            "onboot": "0",
            "scsi0": "local-zfs:60,iothread=1,import-from=local:import/noble.qcow2",
            "efidisk0": "local-zfs:1,efitype=4m,pre-enrolled-keys=0",
            "cipassword": "x",
        }
    )
    assert params == {
        "name": "vm-1",
        "cores": "4",
        "memory": "4096",
        "scsi0": "local-zfs:0,import-from=local:import/noble.qcow2,iothread=1",
        "efidisk0": "local-zfs:1,efitype=4m,pre-enrolled-keys=0",
        "cipassword": "x",
    }
    assert resizes == {"scsi0": "60G"}


def test_create_params_keep_a_balloon_of_zero():
    params, _ = vmconfig.create_params({"memory": "16384", "balloon": "0"})
    assert params == {"memory": "16384", "balloon": "0"}


# ------------------------------------------------------------------------------------ invariants


def test_table_rejects_contradictions():
    with pytest.raises(ValueError):
        vmconfig.KeyInfo(read_only=True, write_only=True)
    with pytest.raises(ValueError):
        vmconfig.KeyInfo(default="1", default_from="memory")
    with pytest.raises(ValueError):
        vmconfig.KeyInfo(normalize=vmconfig.norm_bool, default="true")
    with pytest.raises(ValueError):
        vmconfig.PropFormat(booleans=frozenset({"x"}), defaults={"x": "yes"})


def test_every_default_is_canonical_and_indexed_ranges_are_real():
    for name, info in vmconfig.KEYS.items():
        if info.default is not None:
            assert info.normalize(info.default) == info.default, name
    assert vmconfig.key_info("hostpci15") is vmconfig.INDEXED["hostpci"]
    assert vmconfig.key_info("hostpci16") is not vmconfig.INDEXED["hostpci"]
    assert vmconfig.key_info("scsi30").disk and not vmconfig.key_info("scsi31").disk
    assert vmconfig.key_info("net31") is vmconfig.INDEXED["net"]


def test_unreadable_values_pass_through():
    assert normalize_value("net0", "a=1,a=2") == "a=1,a=2"
    assert normalize_value("cores", "many") == "many"
    assert normalize_value("onboot", "maybe") == "maybe"


def test_propstr_round_trip_and_errors():
    props = propstr.parse(
        "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0", "model", None, ("virtio",), ("model", "macaddr")
    )
    assert props == {"model": "virtio", "macaddr": "AA:BB:CC:DD:EE:FF", "bridge": "vmbr0"}
    assert propstr.render(props, "model") == "virtio,bridge=vmbr0,macaddr=AA:BB:CC:DD:EE:FF"
    with pytest.raises(propstr.PropertyStringError):
        propstr.parse("a=1,a=2")
    with pytest.raises(propstr.PropertyStringError):
        propstr.parse("bare")


KEYS_UNDER_TEST = [
    "net0",
    "hostpci0",
    "cpu",
    "machine",
    "memory",
    "agent",
    "boot",
    "vga",
    "efidisk0",
    "scsi0",
    "onboot",
    "cores",
    "tags",
    "sshkeys",
    "startup",
    "ipconfig0",
]
_sub = st.sampled_from(
    [
        "model",
        "bridge",
        "host",
        "pcie",
        "type",
        "cputype",
        "flags",
        "current",
        "enabled",
        "order",
        "file",
        "size",
        "macaddr",
        "ip",
    ]
)
_val = st.text(alphabet="abcdef0123456789:;.-_ =%+", min_size=0, max_size=12)
_part = st.one_of(st.tuples(_sub, _val).map(lambda kv: f"{kv[0]}={kv[1]}"), _val)
_value = st.lists(_part, max_size=5).map(",".join)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(KEYS_UNDER_TEST), value=_value)
def test_normalisers_are_idempotent(key, value):
    once = normalize_value(key, value)
    assert normalize_value(key, once) == once


def test_a_nics_hand_set_firewall_stays_unless_the_spec_names_it():
    have = {"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1"}
    assert not vmconfig.diff(have, {"net0": "virtio,bridge=vmbr0"}).changed
    off = vmconfig.diff(have, {"net0": "virtio,bridge=vmbr0,firewall=0"})
    assert off.set == {"net0": "virtio,bridge=vmbr0,macaddr=BC:24:11:00:00:01"}  # off: PVE's default
    moved = vmconfig.diff(have, {"net0": "virtio,bridge=vmbr1"})
    assert moved.set == {"net0": "virtio,bridge=vmbr1,firewall=1,macaddr=BC:24:11:00:00:01"}
