"""`gpulab install-media`'s first-boot hook on a bare lab node (no gpulab user yet: fixture access.bootstrap
false), run as root as the installer runs it: it sets the repositories, the kernel command line and the
blacklist, and makes gpulab's role, user and token with the secret in a file only root reads; a second run
changes nothing; playbooks/access.yml then moves that secret into the vault (and removes the node's copy),
and site.yml converges on the node. One lab for the module (about 4 minutes)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from unit.install import install_media

from gpulab.pve import privileges

from .helpers import (
    GPULAB,
    RunningLab,
    access,
    on_node,
    run_playbook,
    token_call,
    user_inventory,
    vault_values,
)

pytestmark = [pytest.mark.root]
ROOT_PASSWORD = "a root password"
SECRET_FILE = "/root/.gpulab/pve-api-token.json"


@pytest.fixture(scope="module")
def inv(bare: RunningLab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """inventory/demo made like a user's after a bare-metal install: token secret from the vault (none yet),
    no fingerprint, the install settings of the node."""
    dest = user_inventory(tmp_path_factory.mktemp("inv") / "mylab")
    node = dest / "host_vars" / "pve.yml"
    node.write_text(node.read_text() + "pve_install_country: at\npve_install_disks: [sda]\n")
    return dest


@pytest.fixture(scope="module")
def media(bare: RunningLab, inv: Path) -> Path:
    out = inv.parent / "media"
    proc = install_media(inv, out, GPULAB_LAB_STATE=str(bare.state), GPULAB_PVE_ROOT_PASSWORD=ROOT_PASSWORD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def run_hook(lab: RunningLab, media: Path) -> subprocess.CompletedProcess[str]:
    """The media's first-boot hook, run on the node as root as the installer runs it."""
    return on_node(lab, "bash -s", stdin=(media / "first-boot.sh").read_text(), timeout=180)


def access_state(lab: RunningLab, settled: Callable[[dict], bool]) -> dict:
    """The simulator's access data once `settled` holds (its state file is written within a second)."""
    deadline = time.monotonic() + 10
    while True:
        state = lab.pve_state()["access"]
        if settled(state) or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def changed(proc: subprocess.CompletedProcess[str], host: str = "pve") -> int:
    m = re.search(rf"^{host}\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M)
    assert m, proc.stdout[-3000:] + proc.stderr
    return int(m.group(1))


def test_the_hook_makes_the_node_ready_and_keeps_the_secret_for_root(bare: RunningLab, media: Path) -> None:
    assert "gpulab@pve" not in bare.pve_state()["access"]["users"]
    proc = run_hook(bare, media)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "made token gpulab@pve!ansible" in proc.stdout
    state = access_state(bare, lambda s: len(s["acl"]) >= 2)
    assert set(state["roles"]["gpulab"]) == set(privileges.PRIVILEGES)
    assert state["users"]["gpulab@pve"]["tokens"]["ansible"]["privsep"] == 1
    assert {(a["type"], a["ugid"], a["roleid"], a["path"]) for a in state["acl"]} == {
        ("user", "gpulab@pve", "gpulab", "/"),
        ("token", "gpulab@pve!ansible", "gpulab", "/"),
    }
    kept = on_node(bare, f"stat -c %a {SECRET_FILE} && cat {SECRET_FILE}")
    mode, data = kept.stdout.split("\n", 1)
    assert mode == "600"
    secret = json.loads(data)
    assert secret["token_id"] == privileges.TOKEN_ID and token_call(bare, secret["secret"]).status_code == 200
    assert secret["secret"] not in proc.stdout + proc.stderr
    # the seed's kernel parameters and the blacklist, as stage host writes them
    files = on_node(
        bare,
        "head -n1 /etc/kernel/cmdline; grep -c '^blacklist' /etc/modprobe.d/pve-blacklist.conf; "
        "cat /etc/apt/sources.list.d/proxmox.sources",
    ).stdout
    assert "nomodeset modprobe.blacklist=nova_core,nova_drm,nova,nouveau" in files.splitlines()[0]
    assert "Components: pve-no-subscription" in files


def test_a_second_run_changes_nothing(bare: RunningLab, media: Path) -> None:
    before = on_node(
        bare, f"md5sum /etc/kernel/cmdline /etc/modprobe.d/pve-blacklist.conf {SECRET_FILE}"
    ).stdout
    since = len(bare.requests())
    proc = run_hook(bare, media)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "made " not in proc.stdout and "kernel command line:" not in proc.stdout
    assert (
        on_node(bare, f"md5sum /etc/kernel/cmdline /etc/modprobe.d/pve-blacklist.conf {SECRET_FILE}").stdout
        == before
    )
    # only the ACL grants are sent again, and they change nothing
    writes = [r for r in bare.writes(since) if not r["path"].endswith("/access/acl")]
    assert writes == []


def test_gpulab_discover_reads_the_node(bare: RunningLab, tmp_path: Path) -> None:
    # what the user does after comparing the fingerprint with the node's console (README-install.md, step 3)
    address = bare.info["node_host"]["address"]
    scan = subprocess.run(
        ["ssh-keyscan", "-t", "ed25519", address], capture_output=True, text=True, timeout=30, check=True
    )
    known = tmp_path / "known_hosts"
    known.write_text(scan.stdout)
    proc = subprocess.run(
        [
            GPULAB,
            "discover",
            "-i",
            bare.info["ssh_private_key"],
            "--known-hosts",
            str(known),
            f"root@{address}",
            str(tmp_path / "found"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = yaml.safe_load((tmp_path / "found" / "host_vars" / "pve.yml").read_text())
    assert found["pve_node"] == bare.info["node"] and found["pve_gpus"][0]["pci"] == "0000:02:00"


def test_access_moves_the_secret_into_the_vault_and_removes_the_node_s_copy(
    bare: RunningLab, inv: Path
) -> None:
    secret = json.loads(on_node(bare, f"cat {SECRET_FILE}").stdout)["secret"]
    proc = access(bare, inv)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert changed(proc) == 1
    assert secret not in proc.stdout + proc.stderr
    assert vault_values(inv)["vault_pve_api_token_secret"] == secret
    assert on_node(bare, f"test -e {SECRET_FILE}").returncode == 1
    again = access(bare, inv)
    assert again.returncode == 0 and changed(again) == 0


@pytest.mark.slow
def test_site_yml_converges_on_the_node(bare: RunningLab, inv: Path) -> None:
    proc = run_playbook(bare, inv, "--vault-password-file", str(inv.parent / "vault-pass"), timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"^pve\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", proc.stdout, re.M)
