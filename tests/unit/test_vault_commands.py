"""The vault steps of docs/getting-started.md (step 6), run as written on a copy of inventory/homelab:
the vault made from vault.yml.example and encrypted with ansible-vault, then read by `gpulab plan` (password
file or typed) and by preflight (ansible-playbook --vault-password-file). Nothing is reached: preflight runs
with --tags host alone, which uses no API."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gpulab import cli

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
TOKEN_SECRET = "5f0c2b4e-8a4e-4d6b-9c1e-2a7e3b9d1f00"


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "GPULAB_"))}
    out.update(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PATH=f"{BIN}:{out['PATH']}")
    return out


@pytest.fixture
def mylab(tmp_path):
    """cp -r inventory/homelab inventory/mylab, the vault filled in and encrypted (the password in a file)."""
    inv = tmp_path / "mylab"
    subprocess.run(["cp", "-r", ROOT / "inventory" / "homelab", inv], check=True)
    example = inv / "group_vars" / "all" / "vault.yml.example"
    vault = inv / "group_vars" / "all" / "vault.yml"
    values = yaml.safe_load(example.read_text())
    values.update(vault_pve_api_token_secret=TOKEN_SECRET, vault_router_password="router-admin-pw")
    vault.write_text(yaml.safe_dump(values))
    password = tmp_path / "vault-pass"
    password.write_text("correct horse\n")
    password.chmod(0o600)
    run = subprocess.run(
        [BIN / "ansible-vault", "encrypt", "--vault-password-file", password, vault],
        env=env(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert vault.read_text().startswith("$ANSIBLE_VAULT;")
    return inv, password


def test_gpulab_plan_reads_the_vault_with_the_password_file(mylab, capsys):
    inv, password = mylab
    assert cli.main(["plan", str(inv), "--vault-password-file", str(password)]) == 0
    assert "The lab definition is valid." in capsys.readouterr().out


def test_gpulab_plan_asks_for_the_vault_password(mylab, capsys, monkeypatch):
    inv, _ = mylab
    asked = []
    monkeypatch.setattr(cli.getpass, "getpass", lambda prompt: asked.append(prompt) or "correct horse")
    assert cli.main(["plan", str(inv), "--ask-vault-pass"]) == 0
    assert asked == ["Vault password: "]
    assert "The lab definition is valid." in capsys.readouterr().out


def test_gpulab_plan_without_the_vault_password_says_it_cannot_read(mylab, capsys):
    inv, _ = mylab
    assert cli.main(["plan", str(inv)]) == 1
    err = capsys.readouterr().err
    assert "cannot read inventory" in err and "vault" in err.lower(), err


def test_preflight_reads_the_vault_with_the_password_file(mylab):
    inv, password = mylab
    command = [BIN / "ansible-playbook", "-i", inv, "--vault-password-file", password]
    proc = subprocess.run(
        [*command, "playbooks/preflight.yml", "--tags", "host"],
        cwd=ROOT,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"localhost\s+: ok=\d+\s+changed=0\s+unreachable=0\s+failed=0", proc.stdout), proc.stdout
    assert "TASK [Show the plan]" in proc.stdout, proc.stdout  # the vault read, the definition valid
    assert TOKEN_SECRET not in proc.stdout + proc.stderr
