"""The lab's own API access is made the way a user makes it: `gpulab lab up` runs README's pveum steps
(labsim.pve_access.bootstrap_commands) as root on the node host. Here the script runs with the node's tools
beside an in-process bare lab (fixture access.bootstrap false), as the node host runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from unit.labsim.conftest import InProcessPveSim, start_lab, stop_lab
from unit.labsim.pve_sim_client import write_fast_fixture

from gpulab.pve import privileges
from labsim.net import pve_tools
from labsim.pve_access import bootstrap_commands
from labsim.pve_api_server import NODE_API_DIR, serve_node_api


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    root = tmp_path_factory.mktemp("bare")
    fixture = write_fast_fixture(root / "fixture.yml", access={"bootstrap": False})
    server, desc, thread = start_lab(root / "state", fixture)
    api_thread = serve_node_api(server)
    yield InProcessPveSim(server, desc, root / "state")
    server.node_api.shutdown()
    api_thread.join(5)
    stop_lab(server, thread)


def run_on_node(lab: InProcessPveSim, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for cmd in ("pvesh", "pveum", "pvenode"):
        wrapper = bin_dir / cmd
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {pve_tools.__file__} {cmd} "$@"\n')
        wrapper.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        pve_tools.NODE_API_ENV: str(lab.state_dir / NODE_API_DIR),
    }
    return subprocess.run(
        ["sh", "-s"],
        input=bootstrap_commands(),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_a_bare_lab_has_no_project_token(bare):
    assert bare.desc["token_secret"] is None and "bare node" in bare.desc["access_note"]
    assert bare.token_api(privileges.TOKEN_ID, "x").get("/version").status_code == 401


def test_the_bootstrap_script_makes_readme_s_access_and_can_be_run_again(bare, tmp_path):
    node = bare.desc["node"]
    first = run_on_node(bare, tmp_path)
    assert first.returncode == 0, first.stderr
    token = json.loads(first.stdout.strip().splitlines()[-1])
    assert token["full-tokenid"] == privileges.TOKEN_ID and token["info"] == {"privsep": "1"}
    assert bare.token_api(privileges.TOKEN_ID, token["value"]).get(f"/nodes/{node}/status").status_code == 200
    access = bare.server.lab.state.data["access"]
    assert set(access["roles"][privileges.ROLE]) == set(privileges.PRIVILEGES)
    assert {(a["type"], a["ugid"]) for a in access["acl"]} == {
        ("user", privileges.USER),
        ("token", privileges.TOKEN_ID),
    }
    # a bootstrap cut short, or run again: finished, the token made anew (the old secret stops working)
    again = run_on_node(bare, tmp_path)
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout.strip().splitlines()[-1])["value"]
    assert second != token["value"]
    assert bare.token_api(privileges.TOKEN_ID, token["value"]).get("/version").status_code == 401
    assert bare.token_api(privileges.TOKEN_ID, second).get(f"/nodes/{node}/status").status_code == 200
