"""Unknown variables are refused: a name with a prefix of the lab definition or a role must be in the
catalogue or in a role's argument_specs. The inventory's own names are what counts (gpulab.inventory)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab import inventory, labdef
from gpulab.labdef import catalogue

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SECRETS = {"GPULAB_PVE_API_TOKEN_SECRET": "0b1f8a3e-5a43-4c2e-9d8e", "GPULAB_ROUTER_PASSWORD": "pw-for-test"}


def test_a_group_variable_is_reported_once_for_its_hosts(inv):
    for vm in ("vm-1", "vm-2"):
        inv.hosts[vm]["vm_cors"] = 4
    assert inv.messages() == [
        "vm-1, vm-2: vm_cors=4: unknown variable: neither the lab definition nor a role reads it "
        "(did you mean vm_cores?). Fix: rename it to vm_cores, or remove it."
    ]


def test_a_variable_without_a_close_name_says_where_the_names_are(inv):
    inv.hosts["vm-1"]["gpulab_favourite_editor"] = "vi"
    [msg] = inv.messages()
    assert msg == (
        "vm-1: gpulab_favourite_editor='vi': unknown variable: neither the lab definition nor a role reads it. "
        "Fix: remove it, or use a name from docs/variables.md."
    )


def test_a_variable_set_to_nothing_is_refused_too(inv):
    inv.hosts["pve"]["pve_gpu"] = None  # `pve_gpu:` in host_vars
    [msg] = inv.messages()
    assert msg.startswith("pve: pve_gpu=(not set): unknown variable") and "did you mean pve_gpus?" in msg


def test_the_value_of_a_misspelt_secret_is_not_shown(inv):
    inv.globals["pve_api_token_secert"] = "0b1f8a3e-5a43-4c2e-9d8e-000000000000"
    [msg] = inv.messages()
    assert msg.startswith("all: pve_api_token_secert='<hidden>': unknown variable")
    assert "did you mean pve_api_token_secret?" in msg and "0b1f8a3e" not in msg


def test_role_options_and_names_outside_the_prefixes_pass(inv):
    inv.hosts["pve"].update(pve_host_reboot_allowed=True, pve_host_sysfs_root="/")
    inv.hosts["vm-gpu"].update(nvidia_container_toolkit_version="1.18.1-1", k3s_agent_node_labels={"a": "b"})
    inv.globals.update(
        vault_pve_api_token_secret="x",
        my_own_setting=1,
        ansible_user="ubuntu",
        router_dhcp_reservation_mode="planned",
    )
    assert inv.messages() == []


def test_a_role_option_keeps_its_roles_choices(inv):
    inv.globals["router_dhcp_reservation_mode"] = "later"
    [msg] = inv.messages()
    choices = catalogue.role_options()["router_dhcp_reservation_mode"]["choices"]
    assert (
        msg
        == f"all: router_dhcp_reservation_mode='later': unknown value. Fix: use one of {', '.join(choices)}."
    )


def test_every_prefix_is_owned_by_the_definition_or_a_role():
    roles = sorted(p.parent.parent.name for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))
    prefixes = catalogue.owned_prefixes()
    assert all(f"{role}_".startswith(prefixes) for role in roles)
    assert "guest_base_" in prefixes  # the one role whose name no fixed prefix covers
    assert all(v.name.startswith(prefixes) for v in labdef.CATALOGUE)


@pytest.mark.parametrize("inventory_dir", ["inventory/demo", "inventory/homelab"])
def test_the_repositorys_inventories_use_known_names_only(inventory_dir):
    groups, hostvar, names = inventory.load(ROOT / inventory_dir)
    _, problems = labdef.check(groups, hostvar, names)
    assert [str(p) for p in problems if "unknown variable" in p.why] == []
    # and the names were read: a host's own, its groups' and group_vars/all's, not another host's
    assert {"vm_id", "vm_ssh_user", "pve_api_url"} <= names("vm-1")
    assert "pve_node" in names("pve") and "pve_node" not in names("vm-1")


def test_defined_names_are_the_inventorys_own(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text(
        "all:\n  vars:\n    inline_all: 1\n  children:\n    vms:\n      hosts:\n        vm-1:\n          inline_host: 2\n"
    )
    (inv / "group_vars/vms.yml").write_text("from_group_vars: 3\n")
    (inv / "host_vars/vm-1.yml").write_text("from_host_vars: 4\n")
    _, _, names = inventory.load(inv)
    # Ansible itself sets inventory_dir and inventory_file for a host an inventory file names
    own = {"inline_all", "inline_host", "from_group_vars", "from_host_vars"}
    assert names("vm-1") == own | {"inventory_dir", "inventory_file"}
    assert names("nobody") == set()


def _run(cmd, env_extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    env.update(env_extra or {}, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def misspelt_inventory(tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventory/homelab", inv)
    with (inv / "host_vars/vm-2.yml").open("a") as f:
        f.write("vm_memroy_mib: 8192\n")
    with (inv / "host_vars/pve.yml").open("a") as f:
        f.write("pve_gpu:\n")
    return inv


EXPECTED = [
    "pve: pve_gpu=(not set): unknown variable: neither the lab definition nor a role reads it (did you mean "
    "pve_gpus?). Fix: rename it to pve_gpus, or remove it.",
    "vm-2: vm_memroy_mib=8192: unknown variable: neither the lab definition nor a role reads it (did you mean "
    "vm_memory_mib?). Fix: rename it to vm_memory_mib, or remove it.",
]


def test_gpulab_plan_refuses_a_misspelt_variable(misspelt_inventory):
    r = _run([BIN / "gpulab", "plan", str(misspelt_inventory)], SECRETS)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "The lab definition has 2 problem(s)" in r.stdout
    for line in EXPECTED:
        assert f"  - {line}" in r.stdout


def test_preflight_refuses_it_and_a_misspelt_extra_var(misspelt_inventory):
    """site.yml stops in preflight with the same messages; a variable given with -e is checked by name too,
    as an extra var (a name gpulab does not own, vault_*, is not)."""
    r = _run(
        [
            BIN / "ansible-playbook",
            "-i",
            str(misspelt_inventory),
            "site.yml",
            "-e",
            "vm_memroy_mib_extra=1",
            "-e",
            "vault_vm_become_password=sudo-pw",
        ],
        {**SECRETS, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "The lab definition has 3 problem(s); nothing was changed" in r.stdout
    for line in EXPECTED:
        assert line in r.stdout
    assert "extra vars (-e): vm_memroy_mib_extra='1': unknown variable given with -e" in r.stdout
    assert "vault_vm_become_password" not in r.stdout.split("PLAY RECAP")[0].split("fatal:", 1)[1]
