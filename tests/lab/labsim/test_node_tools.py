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

from gpulab.pve import privileges
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
    env = {**os.environ, pve_tools.NODE_API_ENV: str(node_api), "GPULAB_NODE_NAME": "pve"}
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


def pveum(node_api: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return tool(node_api, "pveum", *argv)


def test_the_lab_s_own_access_is_an_ordinary_role_user_token_and_acls(lab, node_api):
    roles = json.loads(pveum(node_api, "role", "list", "--output-format", "json").stdout)
    gpulab = next(r for r in roles if r["roleid"] == "gpulab")
    assert set(gpulab["privs"].split(",")) == set(privileges.PRIVILEGES) and gpulab["special"] == 0
    tokens = json.loads(
        pveum(node_api, "user", "token", "list", "gpulab@pve", "--output-format", "json").stdout
    )
    assert [(t["tokenid"], t["privsep"]) for t in tokens] == [("ansible", 1)]
    acl = json.loads(pveum(node_api, "acl", "list", "--output-format", "json").stdout)
    assert {(a["path"], a["type"], a["ugid"], a["roleid"]) for a in acl} == {
        ("/", "user", "gpulab@pve", "gpulab"),
        ("/", "token", "gpulab@pve!ansible", "gpulab"),
    }


def test_a_token_made_with_pveum_works_over_https_until_removed_and_needs_both_acls(lab, node_api):
    node = lab.desc["node"]
    assert pveum(node_api, "role", "add", "Reader", "--privs", "Sys.Audit,VM.Audit").returncode == 0
    again = pveum(node_api, "role", "add", "Reader", "--privs", "Sys.Audit")
    assert again.returncode == 255 and again.stderr.strip() == "role 'Reader' already exists"
    bad = pveum(node_api, "role", "add", "Odd", "--privs", "Sys.Audit,Sys.Fly")
    assert bad.returncode == 255 and "privs: invalid privilege 'Sys.Fly'" in bad.stderr
    assert pveum(node_api, "user", "add", "reader@pve", "--comment", "test").returncode == 0
    made = pveum(
        node_api, "user", "token", "add", "reader@pve", "t1", "--privsep", "1", "--output-format", "json"
    )
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)
    assert token["full-tokenid"] == "reader@pve!t1" and token["info"] == {"privsep": "1"}
    api = lab.token_api(token["full-tokenid"], token["value"])
    # privilege separation: no ACL yet, nothing allowed; the user's ACL alone is not enough either
    assert api.get(f"/nodes/{node}/status").status_code == 403
    assert pveum(node_api, "acl", "modify", "/", "--roles", "Reader", "--users", "reader@pve").returncode == 0
    denied = api.get(f"/nodes/{node}/status")
    assert denied.status_code == 403 and "Permission check failed (/nodes/" in denied.json()["message"]
    assert (
        pveum(node_api, "acl", "modify", "/", "--roles", "Reader", "--tokens", "reader@pve!t1").returncode
        == 0
    )
    assert api.get(f"/nodes/{node}/status").status_code == 200
    # a privilege the role lacks: PVE's 403 at the first call that checks it
    write = api.post(f"/nodes/{node}/qemu", vmid=950, name="x")
    assert write.status_code == 403
    assert write.json()["message"].startswith("Permission check failed (/vms/950, VM.Allocate)")
    # the role changed on the node takes effect at the next call
    assert (
        pveum(node_api, "role", "modify", "Reader", "--privs", "VM.Allocate", "--append", "1").returncode == 0
    )
    again = api.post(f"/nodes/{node}/qemu", vmid=950, name="x")
    assert again.json()["message"].startswith("Permission check failed (/vms/950, VM.Config.Options)")
    text = pveum(node_api, "user", "token", "add", "reader@pve", "t2")
    assert "│ full-tokenid │ reader@pve!t2" in text.stdout and "│ value " in text.stdout
    assert pveum(node_api, "user", "token", "remove", "reader@pve", "t1").returncode == 0
    assert api.get(f"/nodes/{node}/status").status_code == 401
    gone = pveum(node_api, "user", "token", "remove", "reader@pve", "t1")
    assert gone.returncode == 255 and "no such token 't1' for user 'reader@pve'" in gone.stderr


def test_a_token_cannot_manage_access_without_the_privileges(lab, node_api):
    # the project's token: no Sys.Modify on /access, no User.Modify
    api = lab.token_api()
    denied = api.post("/access/roles", roleid="Mine", privs="Sys.Audit")
    assert denied.status_code == 403 and "(/access, Sys.Modify)" in denied.json()["message"]
    assert api.post("/access/users/gpulab@pve/token/other").status_code == 200  # its own user: "self"
    assert api.post("/access/users/root@pam/token/other").status_code == 403


def test_pvenode_cert_info_shows_the_fingerprint_the_https_api_presents(lab, node_api):
    info = json.loads(tool(node_api, "pvenode", "cert", "info", "--output-format", "json").stdout)
    assert [c["filename"] for c in info] == ["pve-ssl.pem"]
    assert info[0]["fingerprint"] == lab.desc["fingerprint"]
    text = tool(node_api, "pvenode", "cert", "info")
    assert text.returncode == 0 and f"│ fingerprint     │ {lab.desc['fingerprint']}" in text.stdout
