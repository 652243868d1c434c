"""playbooks/access.yml on a bare lab node (no gpulab user yet: fixture access.bootstrap false): what it makes
over SSH with the node's pveum works against the HTTPS API, a rerun changes nothing, rotation revokes the
old token, a role without a privilege gives PVE's 403 at the first call that needs it, and the bad inputs
(a login that is not root, a role with other privileges) stop it with nothing written. The secret is never
in the output, even at -vvvv. One lab for the module (about 90 s)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import requests
import urllib3
import yaml

from gpulab.pve import privileges

from .helpers import RunningLab, access, on_node, token_call, user_inventory, vault_values


@pytest.fixture(scope="module")
def inv(bare: RunningLab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inventory/demo made like a user's: token id named, its secret from the vault, no fingerprint yet."""
    return user_inventory(tmp_path_factory.mktemp("inv") / "mylab")


def refused(lab: RunningLab, inv: Path, *extra: str) -> str:
    """Run access, which must fail having written nothing (no API write, no inventory file); its output on
    one line, with "Nothing was changed." checked."""
    before, since = snapshot(inv), len(lab.requests())
    proc = access(lab, inv, *extra)
    assert proc.returncode != 0, proc.stdout
    out = " ".join(proc.stdout.split())
    assert "Nothing was changed." in out
    assert lab.writes(since) == [] and snapshot(inv) == before
    return out


def recap(proc: subprocess.CompletedProcess[str]) -> dict[str, int]:
    m = re.search(r"^pve\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", proc.stdout, re.M)
    assert m, proc.stdout + proc.stderr
    return dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()), strict=True))


def snapshot(inv: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(inv)): p.read_bytes()
        for p in sorted((inv / "group_vars").rglob("*"))
        if p.is_file()
    }


def test_the_node_s_pvesh_prints_what_the_https_api_returns_for_root(bare: RunningLab) -> None:
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    assert bare.info["token_secret"] is None and "bare node" in bare.info["access_note"]
    login = requests.post(
        f"{bare.info['pve_url']}/api2/json/access/ticket",
        data={"username": "root@pam", "password": bare.info["password"]},
        verify=False,
        timeout=30,
    ).json()["data"]
    for path in (f"/nodes/{bare.info['node']}/hardware/pci", "/access/users", "/version"):
        printed = on_node(bare, f"pvesh get {path} --output-format json")
        assert printed.returncode == 0, printed.stderr
        served = requests.get(
            f"{bare.info['pve_url']}/api2/json{path}",
            cookies={"PVEAuthCookie": login["ticket"]},
            verify=False,
            timeout=30,
        ).json()["data"]
        assert json.loads(printed.stdout) == served
    # the node's calls are in the lab's request log, marked as the node's own
    assert any(r.get("via") == "node" and r["path"].endswith("/hardware/pci") for r in bare.requests())


def test_check_mode_on_the_bare_node_writes_nothing(bare: RunningLab, inv: Path) -> None:
    before, since = snapshot(inv), len(bare.requests())
    proc = access(bare, inv, "--check", "--diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "+role gpulab" in proc.stdout and "+token gpulab@pve!ansible" in proc.stdout
    assert recap(proc)["changed"] == 1
    assert bare.writes(since) == [] and snapshot(inv) == before
    assert not (inv / "group_vars" / "all" / "vault.yml").exists()


def test_first_run_makes_the_access_and_the_vault_and_never_prints_the_secret(
    bare: RunningLab, inv: Path
) -> None:
    proc = access(bare, inv, "-vvvv")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert recap(proc)["changed"] == 1
    secret = vault_values(inv)["vault_pve_api_token_secret"]
    assert re.fullmatch(r"[0-9a-f-]{36}", secret)
    assert secret not in proc.stdout + proc.stderr
    main = yaml.safe_load((inv / "group_vars" / "all" / "main.yml").read_text())
    assert main["pve_api_fingerprint"] == bare.info["fingerprint"]
    # the token works over HTTPS, with exactly gpulab's role on / for both the user and the token
    assert token_call(bare, secret).status_code == 200
    state = bare.pve_state()["access"]
    assert set(state["roles"]["gpulab"]) == set(privileges.PRIVILEGES)
    assert state["users"]["gpulab@pve"]["tokens"]["ansible"]["privsep"] == 1
    assert {(a["type"], a["ugid"], a["roleid"], a["path"]) for a in state["acl"]} == {
        ("user", "gpulab@pve", "gpulab", "/"),
        ("token", "gpulab@pve!ansible", "gpulab", "/"),
    }


def test_a_rerun_changes_nothing_and_keeps_the_token(bare: RunningLab, inv: Path) -> None:
    before, since = snapshot(inv), len(bare.requests())
    proc = access(bare, inv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert recap(proc)["changed"] == 0
    assert bare.writes(since) == [] and snapshot(inv) == before


def test_a_login_that_is_not_root_is_refused_before_the_node_is_touched(bare: RunningLab, inv: Path) -> None:
    out = refused(bare, inv, "-e", "ansible_user=admin")
    assert "host pve: access logs in as 'admin' (ansible_user), not root" in out


def test_a_role_without_a_privilege_gives_pve_s_403_and_access_refuses_it_naming_the_difference(
    bare: RunningLab, inv: Path
) -> None:
    secret = vault_values(inv)["vault_pve_api_token_secret"]
    other = sorted((set(privileges.PRIVILEGES) - {"VM.Allocate"}) | {"Sys.Modify"})
    changed = on_node(bare, f"pveum role modify gpulab --privs {','.join(other)}")
    assert changed.returncode == 0, changed.stderr
    denied = token_call(bare, secret, "POST", f"/nodes/{bare.info['node']}/qemu", vmid=990, name="scratch")
    assert denied.status_code == 403
    assert denied.json()["message"].startswith("Permission check failed (/vms/990, VM.Allocate)")
    out = refused(bare, inv)
    assert (
        "role 'gpulab' exists on the node with other privileges than gpulab's: missing VM.Allocate; extra Sys.Modify"
        in out
    )
    restored = on_node(bare, f"pveum role modify gpulab --privs {','.join(privileges.PRIVILEGES)}")
    assert restored.returncode == 0, restored.stderr


def test_rotation_revokes_the_old_token_and_writes_the_new_secret(bare: RunningLab, inv: Path) -> None:
    old = vault_values(inv)["vault_pve_api_token_secret"]
    proc = access(bare, inv, "-e", "gpulab_access_rotate=true")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    new = vault_values(inv)["vault_pve_api_token_secret"]
    assert new != old and new not in proc.stdout + proc.stderr
    assert token_call(bare, old).status_code == 401
    assert token_call(bare, new).status_code == 200
    again = access(bare, inv)
    assert again.returncode == 0 and recap(again)["changed"] == 0


def test_a_token_the_vault_has_no_secret_for_is_refused_until_rotated(bare: RunningLab, inv: Path) -> None:
    vault = inv / "group_vars" / "all" / "vault.yml"
    kept = vault.read_bytes()
    vault.unlink()  # as a user who lost the vault, or runs access on a node set up by hand
    try:
        out = refused(bare, inv)
        assert (
            "token gpulab@pve!ansible exists on the node, but the inventory's vault holds no secret for it"
            in out
        )
        assert "-e gpulab_access_rotate=true" in out and not vault.exists()
    finally:
        vault.write_bytes(kept)
    secret = vault_values(inv)["vault_pve_api_token_secret"]
    assert token_call(bare, secret).status_code == 200
