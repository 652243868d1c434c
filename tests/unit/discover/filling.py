"""Filling in what `gpulab discover` left to the user, as the user edits the files: each `key: CHANGE-ME`
line replaced, the k3s roles uncommented in hosts.yml; then `gpulab plan` with the secrets given.

Used by the unit tests beside it and by the lab test (tests/e2e/test_discover_lab.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

# ------------------------------------------------------------------------------------- filling it in
PLACEHOLDER_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.]*): CHANGE-ME$")


def set_placeholder(path: Path, key: str, value: str) -> None:
    """Replace the one `key: CHANGE-ME` line of a written file with `key: value`, as a user edits it."""
    lines = path.read_text().splitlines()
    hits = [i for i, line in enumerate(lines) if (m := PLACEHOLDER_LINE.match(line)) and m["key"] == key]
    assert len(hits) == 1, f"{path}: {len(hits)} placeholder lines for {key}"
    indent = PLACEHOLDER_LINE.match(lines[hits[0]])["indent"]
    lines[hits[0]] = f"{indent}{key}: {value}"
    path.write_text("\n".join(lines) + "\n")


def placeholders(inventory: Path) -> dict[str, list[str]]:
    """Every `key: CHANGE-ME` line left in the written inventory (the vault example aside), by file."""
    out: dict[str, list[str]] = {}
    for path in sorted(inventory.rglob("*.yml")):
        keys = [m["key"] for line in path.read_text().splitlines() if (m := PLACEHOLDER_LINE.match(line))]
        if keys:
            out[str(path.relative_to(inventory))] = keys
    return out


def fill(inventory: Path, addresses: dict[str, str], router: dict[str, str], ssh_user: str | None = None,
         server: str | None = None, agents: tuple[str, ...] = (), complete: bool = True) -> None:  # fmt: skip
    """Fill what discover left to the user: each VM's address, the router's kind, pool and user, the VMs'
    login and (for VMs it found) which run k3s; then nothing is left (unless `complete` is false)."""
    for host, address in addresses.items():
        set_placeholder(inventory / "host_vars" / f"{host}.yml", "vm_address", address)
    rfile = inventory / "host_vars" / "lan-router.yml"
    for key, value in router.items():
        set_placeholder(rfile, key, value)
    if ssh_user is not None:
        set_placeholder(inventory / "group_vars" / "vms.yml", "vm_ssh_user", ssh_user)
    hosts = inventory / "hosts.yml"
    text = hosts.read_text()
    for host in [server, *agents] if server else []:
        line = f"            # {host}:"
        assert text.count(line) == 1, (host, text)
        text = text.replace(line, f"            {host}:")
    hosts.write_text(text)
    assert not complete or placeholders(inventory) == {}


def plan(inventory: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[int, str]:
    """`gpulab plan INVENTORY` with the secrets given as a user may give them (the environment)."""
    from gpulab import cli

    monkeypatch.setenv("GPULAB_PVE_API_TOKEN_SECRET", "0e4c6a5d-7b1f-4a53-9d2e-5f8a1c3b7e90")
    monkeypatch.setenv("GPULAB_ROUTER_PASSWORD", "router-admin-secret")
    rc = cli.main(["plan", str(inventory)])
    return rc, capsys.readouterr().out
