"""A whole demo converge at -vvv shows no secret: not the API token secret, not root@pam's password, not the
k3s cluster token, neither in the output nor in any file of the lab's state dir except where they must be."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from .helpers import RunningLab

# The converge is the one tests/e2e/test_lab_stack.py goes on from (simlab.ConvergedDemo, SHARED_LABS): this file
# runs first.
pytestmark = [pytest.mark.root, pytest.mark.slow]

# Where the secrets have to be, relative to the state dir, and why:
#   lab.json        the lab's own credential file (mode 0600) that the demo inventory reads them from;
#   pve-state.json  the simulator's persisted state: like PVE's own user/token store, it checks them;
#   the k3s files   k3s keeps the cluster token on the server, and each agent keeps the one it joined with;
#   node-api/root.json  root@pam's credential (mode 0600, in a 0700 folder) with which the node's pvesh,
#                   pveum and pvenode reach the simulator, as real ones run as root@pam on the node.
ALLOWED = [
    re.compile(r"lab\.json"),
    re.compile(r"pve-state\.json"),
    re.compile(r"node-api/root\.json"),
    re.compile(r"net/hosts/[^/]+/upper/var/lib/rancher/k3s/server/(node-)?token"),
    re.compile(r"net/hosts/[^/]+/upper/etc/rancher/k3s/agent-token"),
]


def _k3s_token(lab: RunningLab) -> str:
    [path] = list((lab.state / "net" / "hosts").glob("*/upper/var/lib/rancher/k3s/server/token"))
    return path.read_text().strip()


def _holders(state: Path, secret: bytes) -> set[str]:
    found = set()
    for root, _dirs, files in os.walk(state):
        for name in files:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                if secret in path.read_bytes():
                    found.add(str(path.relative_to(state)))
            except OSError:
                continue
    return found


def test_verbose_converge_leaks_no_secret(converged_demo) -> None:
    assert not converged_demo.handed_on, "a test went on from the converge before this one read it"
    lab = RunningLab(converged_demo.state, converged_demo.desc)
    proc = converged_demo.converge
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    # -vvv really shows module arguments and connection details (the token id is not secret).
    assert lab.info["token_id"] in output
    # and the whole run uses module facts as facts (ansible_facts[...]): no deprecation noise for the user
    assert "INJECT_FACTS_AS_VARS" not in output, output[output.find("INJECT_FACTS_AS_VARS") - 2000 :][:4000]
    token = _k3s_token(lab)
    secrets = {
        "token_secret": lab.info["token_secret"],
        "root@pam password": lab.info["password"],
        "k3s token": token,
        "k3s token's secret part": token.rsplit(":", 1)[-1],
    }
    assert all(len(s) >= 8 for s in secrets.values())
    leaks = []
    for what, secret in secrets.items():
        if secret in output:
            i = output.index(secret)
            leaks.append(f"{what} in the playbook output: ...{output[max(0, i - 600) : i]}")
        for rel in sorted(_holders(lab.state, secret.encode())):
            if not any(p.fullmatch(rel) for p in ALLOWED):
                leaks.append(f"{what} in {rel}")
    assert not leaks, "\n".join(leaks)
    # The request log and the server log exist and were checked above.
    assert (lab.state / "pve-requests.jsonl").stat().st_size > 0
    assert (lab.state / "server.log").exists()
    assert "server/token" in " ".join(_holders(lab.state, token.encode()))
