"""The lab node's pvesh, pveum and pvenode (labsim.net.pve_tools) act on the API simulator's own state.

They run here as the node runs them (``python3 pve_tools.py pvesh ...``), against an in-process lab's
node socket (``STATE/node-api``, what the node host has bound at /var/lib/gpulab-sim/api)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from labsim.net import pve_tools
from labsim.pve_api_server import NODE_API_DIR, serve_node_api

TOOLS = Path(pve_tools.__file__)


@pytest.fixture(scope="module")
def node_api(lab):
    thread = serve_node_api(lab.server)
    yield lab.state_dir / NODE_API_DIR
    lab.server.node_api.shutdown()
    thread.join(5)


def tool(node_api: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, pve_tools.NODE_API_ENV: str(node_api)}
    return subprocess.run(
        [sys.executable, str(TOOLS), *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_the_node_api_folder_is_roots_only(lab, node_api):
    assert (node_api.stat().st_mode & 0o777) == 0o700
    assert ((node_api / "root.json").stat().st_mode & 0o777) == 0o600
    assert json.loads((node_api / "root.json").read_text())["username"] == "root@pam"


@pytest.mark.parametrize(
    "path", ["/nodes", "/version", "/cluster/resources", "/nodes/{node}/status", "/nodes/{node}/hardware/pci"]
)
def test_pvesh_get_json_prints_the_data_the_https_api_returns_for_root(lab, root, node_api, path):
    path = path.format(node=lab.desc["node"])
    proc = tool(node_api, "pvesh", "get", path, "--output-format", "json")
    assert proc.returncode == 0, proc.stderr
    printed = json.loads(proc.stdout)
    served = root.data("GET", path)
    if path in ("/nodes", "/nodes/{node}/status".format(node=lab.desc["node"]), "/cluster/resources"):
        # uptime, load and memory use move between two calls: the same keys and the same identities
        assert [sorted(x) for x in (printed if isinstance(printed, list) else [printed])] == [
            sorted(x) for x in (served if isinstance(served, list) else [served])
        ]
    else:
        assert printed == served
    pretty = tool(node_api, "pvesh", "get", path, "--output-format", "json-pretty")
    assert pretty.returncode == 0 and "\n    " in pretty.stdout


def test_pvesh_writes_act_on_the_api_state_and_errors_read_as_pve_s(lab, root, node_api):
    node = lab.desc["node"]
    made = tool(node_api, "pvesh", "create", f"/nodes/{node}/qemu", "-vmid", "901", "-name", "from-pvesh")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("UPID:"), made.stdout
    root.wait(made.stdout.strip(), node=node)
    assert root.data("GET", f"/nodes/{node}/qemu/901/config")["name"] == "from-pvesh"
    gone = tool(node_api, "pvesh", "delete", f"/nodes/{node}/qemu/901")
    assert gone.returncode == 0, gone.stderr
    root.wait(gone.stdout.strip(), node=node)
    assert 901 not in [vm["vmid"] for vm in root.data("GET", f"/nodes/{node}/qemu")]
    bad = tool(node_api, "pvesh", "get", f"/nodes/{node}/qemu/abc/config")
    assert bad.returncode == 255
    assert "Parameter verification failed." in bad.stderr and "vmid:" in bad.stderr
    fmt = tool(node_api, "pvesh", "get", "/version", "--output-format", "yaml")
    assert fmt.returncode == 255 and "output-format" in fmt.stderr


def test_pvesh_without_the_lab_socket_fails_as_a_node_without_its_daemon(tmp_path):
    proc = tool(tmp_path, "pvesh", "get", "/version")
    assert proc.returncode == 255 and "ipcc_send_rec" in proc.stderr
