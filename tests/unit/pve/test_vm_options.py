"""gpulab.pve.vmoptions: one table gives pve_vm its argument spec, its documentation and its config."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from gpulab import docs
from gpulab.pve import connection, vmconfig, vmoptions

ROOT = Path(__file__).resolve().parents[3]
MODULE = ROOT / "plugins" / "modules" / "pve_vm.py"

# A value for every option that writes config keys: a new option without one here fails the test below.
SAMPLES = {
    "cores": 4,
    "sockets": 1,
    "memory": 4096,
    "balloon": 0,
    "machine": "q35",
    "bios": "ovmf",
    "cpu": "host",
    "ostype": "l26",
    "scsihw": "virtio-scsi-single",
    "agent": True,
    "onboot": False,
    "numa": False,
    "efidisk": {"storage": "local-zfs"},
    "disks": [
        {"slot": "scsi0", "storage": "local-zfs", "size_gb": 60},
        {"slot": "virtio1", "storage": "s", "size_gb": 1},
    ],
    "nets": [{"bridge": "vmbr0"}, {"bridge": "vmbr1", "tag": 5}],
    "hostpci": [{"mapping": "rtx3090", "pcie": True}],
    "cdrom": "local:iso/x.iso",
    "cloudinit": {
        "storage": "local-zfs",
        "slot": "ide0",
        "user": "u",
        "ssh_keys": ["k"],
        "upgrade": False,
        "password": "p",
    },
    "serial_console": True,
    "boot_order": ["scsi0"],
    "description": "notes",
    "tags": ["gpu"],
    "extra_config": {"cicustom": "vendor=local:snippets/x.yaml"},
}


def load_module():
    spec = importlib.util.spec_from_file_location("gpulab_pve_vm_under_test", MODULE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_argument_spec_is_the_table_and_the_connection():
    from ansible.module_utils.basic import env_fallback

    expected = {**connection.argument_spec(env_fallback), **{o.name: o.spec() for o in vmoptions.CONTROL}}
    assert expected == load_module().ARGUMENT_SPEC


def test_the_documented_options_are_the_table():
    documented = yaml.safe_load(mod_doc())["options"]
    assert documented == vmoptions.documentation(), (
        "plugins/modules/pve_vm.py is out of date: run `make docs`"
    )
    assert docs.vm_options_block(MODULE.read_text()) == docs.render_vm_options()


def mod_doc() -> str:
    return load_module().DOCUMENTATION


def test_every_config_option_has_a_sample_here():
    writers = {o.name for o in vmoptions.OPTIONS if o.build is not None}
    assert writers == set(SAMPLES)


def test_each_row_names_keys_the_key_table_has():
    for option in vmoptions.OPTIONS:
        for pattern in option.keys:
            if pattern == "*":
                assert option.name == "extra_config"
            elif pattern.endswith("*"):
                assert pattern[:-1] in vmconfig.INDEXED, (option.name, pattern)
            else:
                assert pattern in vmconfig.KEYS, (option.name, pattern)
        if option.owns:
            assert f"{option.owns}*" in option.keys


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_each_option_writes_only_the_keys_of_its_row(name):
    params = {"name": "vm-x", name: SAMPLES[name]}
    if name == "cloudinit":
        params["cdrom"] = None
    config, families = vmoptions.build(params)
    written = set(config) - {"name"}
    assert written, f"{name} wrote nothing"
    option = vmoptions.BY_NAME[name]
    assert all(option.writes(key) for key in written), (name, written, option.keys)
    assert families == ((option.owns,) if option.owns else ())
    for key, value in config.items():  # what is written reads back as it was meant
        if value is not None and not vmconfig.key_info(key).write_only:
            assert vmconfig.normalize_value(
                key, vmconfig.normalize_value(key, value)
            ) == vmconfig.normalize_value(key, value)


def test_unset_options_write_nothing():
    assert vmoptions.build({"name": "vm-x", **dict.fromkeys(SAMPLES)}) == ({"name": "vm-x"}, ())


def test_a_cloud_init_drive_and_a_cdrom_on_one_slot_are_refused():
    with pytest.raises(vmoptions.OptionError, match="both want ide2"):
        vmoptions.build({"name": "x", "cdrom": "local:iso/a.iso", "cloudinit": {"storage": "s"}})
