"""`gpulab plan` and the preflight play share one validation: same input, same messages."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SECRETS = {"GPULAB_PVE_API_TOKEN_SECRET": "0b1f8a3e-5a43-4c2e-9d8e", "GPULAB_ROUTER_PASSWORD": "pw-for-test"}


def run(cmd, env_extra=None, cwd=ROOT):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    env.update(env_extra or {})
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["PATH"] = f"{BIN}:{env['PATH']}"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_plan_of_the_reference_lab():
    r = run([BIN / "gpulab", "plan", "inventory/homelab"], SECRETS)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "102   vm-gpu  8     16384 MiB fixed  200 GB local-zfs  q35/ovmf          rtx3090  no      192.168.100.55  agent"
        in r.stdout
    )
    assert "Router isp-router: huawei_ont at 192.168.100.1" in r.stdout
    assert r.stdout.rstrip().endswith("The lab definition is valid.")


def test_plan_without_secrets_names_them_and_fails():
    r = run([BIN / "gpulab", "plan", "inventory/homelab"])
    assert r.returncode == 1
    assert "pve_api_token_secret=(not set): missing secret" in r.stdout
    assert "router_password=(not set): missing secret" in r.stdout


@pytest.fixture
def broken_inventory(tmp_path):
    inv = tmp_path / "inv"
    shutil.copytree(ROOT / "inventory/homelab", inv)
    vm2 = inv / "host_vars/vm-2.yml"
    vm2.write_text(vm2.read_text().replace("vm_id: 101", "vm_id: 100").replace("100.54", "100.1"))
    return inv


def test_plan_and_preflight_give_the_same_messages(broken_inventory):
    plan = run([BIN / "gpulab", "plan", str(broken_inventory)], SECRETS)
    assert plan.returncode == 1
    expected = [
        "vm-2: vm_id=100: already used by vm-1. Fix: give every VM its own vm_id.",
        "vm-2: vm_address='192.168.100.1': that is the router's own address. Fix: pick another free address.",
    ]
    for line in expected:
        assert f"  - {line}" in plan.stdout

    play = run(
        site_yml(broken_inventory),
        {**SECRETS, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json"},
    )
    assert play.returncode == 2
    result = play.stdout[play.stdout.index("fatal: [localhost]: FAILED! => ") + 31 :]
    problems = json.loads(result[: result.index("\n\n")])["problems"]
    assert problems == expected
    assert SECRETS["GPULAB_PVE_API_TOKEN_SECRET"] not in play.stdout


def site_yml(inventory):
    """site.yml on `inventory`, the ISO guests' sudo password given as the vault would."""
    return [BIN / "ansible-playbook", "-i", str(inventory), "site.yml", "-e", "vault_vm_become_password=pw"]


def test_preflight_writes_nothing(broken_inventory, tmp_path):
    before = sorted(p for p in broken_inventory.rglob("*"))
    run(
        site_yml(broken_inventory),
        SECRETS,
    )
    assert sorted(p for p in broken_inventory.rglob("*")) == before
