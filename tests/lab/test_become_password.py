"""The VMs' sudo password (inventory/homelab/group_vars/vms.yml): the vault's vault_vm_become_password when
it is given, else what -K (--ask-become-pass) gives, else none.

Each case runs Ansible's own sudo become plugin and reads the sudo command line it builds (`-vvv`): with a
password sudo is told to prompt for it (`-S -p`), without one not to prompt at all (`-n`). The sudo it
calls is a stand-in that does nothing, so nothing runs as another user. A value of ansible_become_password
in the inventory would pass only the first case: even an omitted one replaces what -K gives.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_runs import ansible_playbook, playbook_env

from gpulab import inventory, labdef

ROOT = Path(__file__).resolve().parents[2]
HOMELAB_VMS = ROOT / "inventory" / "homelab" / "group_vars" / "vms.yml"


@pytest.fixture
def lab(tmp_path):
    """One VM of group vms, reached locally, with the homelab's sudo-password wiring; a play that uses sudo."""
    wiring = {k: v for k, v in yaml.safe_load(HOMELAB_VMS.read_text()).items() if "pass" in k}
    assert wiring == {"ansible_sudo_pass": "{{ vault_vm_become_password | default(omit) }}"}
    (tmp_path / "inv" / "group_vars").mkdir(parents=True)
    (tmp_path / "inv" / "group_vars" / "vms.yml").write_text(yaml.safe_dump(wiring))
    hosts = {
        "vms": {"hosts": {"vm-1": {"ansible_connection": "local", "ansible_python_interpreter": "python3"}}}
    }
    (tmp_path / "inv" / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": hosts}}))
    stand_in = tmp_path / "sudo"
    stand_in.write_text("#!/bin/sh\nexit 1\n")
    stand_in.chmod(0o755)
    play = [
        {
            "hosts": "vms",
            "gather_facts": False,
            "become": True,
            "become_user": "nobody",
            "vars": {"ansible_become_exe": str(stand_in)},
            "tasks": [{"ansible.builtin.command": "true", "changed_when": False}],
        }
    ]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "cli-password").write_text("typed-at-K\n")
    return tmp_path


def sudo_line(lab: Path, *args: str) -> str:
    proc = ansible_playbook("-vvv", "-i", lab / "inv", lab / "play.yml", *args)
    lines = [ln for ln in proc.stdout.splitlines() if f"{lab}/sudo -H -S" in ln]
    assert lines, proc.stdout + proc.stderr
    return lines[0]


def test_no_password_given_sudo_does_not_prompt(lab):
    line = sudo_line(lab)
    assert " -n " in line and " -p " not in line


def test_the_password_typed_at_K_is_used(lab):
    line = sudo_line(lab, "--become-password-file", str(lab / "cli-password"))
    assert " -p " in line and " -n " not in line


def test_the_vaulted_password_is_used(lab):
    line = sudo_line(lab, "-e", "vault_vm_become_password=from-the-vault")
    assert " -p " in line and " -n " not in line


def test_the_lab_definition_accepts_the_wiring_and_the_vaulted_password(tmp_path):
    """ansible_* and vault_* are Ansible's and the vault's names, no prefix of gpulab's: plan refuses neither."""
    inv = tmp_path / "mylab"
    subprocess.run(["cp", "-r", ROOT / "inventory" / "homelab", inv], check=True)
    vault = yaml.safe_load((inv / "group_vars" / "all" / "vault.yml.example").read_text())
    vault["vault_vm_become_password"] = "sudo-pw"
    (inv / "group_vars" / "all" / "vault.yml").write_text(yaml.safe_dump(vault))
    groups, hostvar, names = inventory.load(inv)
    assert "ansible_sudo_pass" in names("vm-1")
    _, problems = labdef.check(groups, hostvar, names)
    assert not [p for p in problems if "pass" in str(p) or "become" in str(p)], problems


@pytest.mark.parametrize(
    ("given", "refused"),
    [
        ([], True),  # no -K, no vault value: the ISO guests' sudo would ask and nobody answers
        (["--become-password-file", "PWFILE"], False),  # what -K gives, from a file
        (["-e", "vault_vm_become_password=from-the-vault"], False),
        (["-e", "vm_sudo_nopasswd=true"], False),
        (["--tags", "host"], False),  # no stage that uses sudo on the VMs
    ],
    ids=["nothing", "become-password", "vault", "nopasswd", "no-sudo-stage"],
)
def test_preflight_wants_a_sudo_password_for_the_iso_guests(tmp_path, given, refused):
    password = tmp_path / "become-password"
    password.write_text("typed-at-K\n")
    args = [str(password) if a == "PWFILE" else a for a in given]
    tags = [] if "--tags" in args else ["--tags", "guests"]
    env = playbook_env(
        GPULAB_PVE_API_TOKEN_SECRET="11111111-2222-4333-8444-555555555555", GPULAB_ROUTER_PASSWORD="pw"
    )
    proc = ansible_playbook("-i", "inventory/homelab", "playbooks/preflight.yml", *tags, *args, env=env)
    out = proc.stdout + proc.stderr
    message = "vm-1: ansible_become_password=(not set): vm-1 was installed by hand from the ISO"
    assert (message in out) == refused, out[-3000:]
    assert (proc.returncode != 0) == refused, out[-3000:]
    if refused:
        assert "-K (--ask-become-pass)" in out and "vm_sudo_nopasswd: true" in out
