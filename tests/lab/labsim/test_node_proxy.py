"""The node's own address answers the HTTPS API on port 8006, as a real node's pveproxy does.

In process: the API server's HTTPS socket for the node (``STATE/node-api/pveproxy.sock``) and the node's
forwarder (:mod:`labsim.net.pveproxy`) run here, the forwarder on a free port of 127.0.0.1 instead of the
node's address in its namespace (tests/lab/labsim/test_homelab_hosts.py proves that one on the real node host).
"""

from __future__ import annotations

import hashlib
import json
import socket
import ssl
import threading
from pathlib import Path

import pytest
import requests

from lab.labsim.test_node_tools import tool
from labsim import pve_faults
from labsim.net import node_host, pveproxy
from labsim.pve_api_server import NODE_API_DIR, NODE_PROXY_SOCKET, serve_node_api, serve_node_proxy


@pytest.fixture(scope="module")
def proxy_url(lab):
    threads = [serve_node_proxy(lab.server), serve_node_api(lab.server)]
    sock = pveproxy.listen("127.0.0.1", 0)
    forwarder = threading.Thread(
        target=pveproxy.serve, args=(sock, str(lab.state_dir / NODE_API_DIR / NODE_PROXY_SOCKET)), daemon=True
    )
    forwarder.start()
    yield f"https://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    for side in (lab.server.node_proxy, lab.server.node_api):
        side.shutdown()
    for thread in threads:
        thread.join(5)


def presented_fingerprint(url: str) -> str:
    host, port = url.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the fingerprint is what is compared
    with socket.create_connection((host, int(port)), timeout=10) as raw, ctx.wrap_socket(raw) as tls:
        digest = hashlib.sha256(tls.getpeercert(binary_form=True)).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def token_get(lab, url: str, path: str = "/version") -> requests.Response:
    auth = f"PVEAPIToken={lab.desc['token_id']}={lab.desc['token_secret']}"
    return requests.get(f"{url}/api2/json{path}", headers={"Authorization": auth}, verify=False, timeout=30)


def test_the_node_port_presents_the_certificate_pvenode_shows(lab, proxy_url):
    node_api = lab.state_dir / NODE_API_DIR
    assert node_host.PVEPROXY_SOCKET == NODE_PROXY_SOCKET  # where the node's pveproxy forwards to
    assert ((node_api / NODE_PROXY_SOCKET).stat().st_mode & 0o777) == 0o600
    shown = tool(node_api, "pvenode", "cert", "info", "--output-format", "json")
    assert shown.returncode == 0, shown.stderr
    fingerprint = presented_fingerprint(proxy_url)
    assert fingerprint == json.loads(shown.stdout)[0]["fingerprint"] == lab.desc["fingerprint"]
    assert presented_fingerprint(lab.url) == fingerprint  # the 127.0.0.1 URL is the same server


def test_the_node_port_is_the_same_api_with_the_same_access_log_and_faults(lab, proxy_url):
    node = lab.desc["node"]
    mine = token_get(lab, proxy_url, f"/nodes/{node}/status")
    assert mine.status_code == 200, mine.text
    assert token_get(lab, lab.url, "/version").json()["data"] == token_get(lab, proxy_url).json()["data"]
    bad = requests.get(
        f"{proxy_url}/api2/json/version",
        headers={"Authorization": f"PVEAPIToken={lab.desc['token_id']}=not-the-secret"},
        verify=False,
        timeout=30,
    )
    assert bad.status_code == 401
    logged = [r for r in lab.requests_log() if r.get("listener") == "node:8006"]
    assert [(r["path"], r["status"]) for r in logged[-2:]] == [
        ("/api2/json/version", 200),
        ("/api2/json/version", 401),
    ]
    assert any(r["path"] == f"/api2/json/nodes/{node}/status" for r in logged)
    # a fault injected for the proxy hits requests through the node's port as well
    pve_faults.inject(lab.state_dir, fail_next=1, fail_status=503, fail_match="/version$")
    try:
        assert token_get(lab, proxy_url).status_code == 503
        assert token_get(lab, proxy_url).status_code == 200
    finally:
        pve_faults.inject(lab.state_dir, fail_next=None, fail_status=None, fail_match=None)


def test_the_forwarder_closes_a_connection_when_the_api_is_gone(tmp_path):
    sock = pveproxy.listen("127.0.0.1", 0)
    threading.Thread(target=pveproxy.serve, args=(sock, str(tmp_path / "absent.sock")), daemon=True).start()
    with socket.create_connection(sock.getsockname(), timeout=5) as client:
        assert client.recv(10) == b""
    sock.close()


def test_the_node_host_runs_pveproxy_on_its_own_address_with_the_api_folder(tmp_path):
    from labsim.fixture import load_fixture

    node = load_fixture()["nodes"][0]
    spec = node_host.node_host_spec(node, tmp_path / "h", api_dir=tmp_path / "api", address="10.1.2.5")
    [service] = spec["init"]["services"]
    assert service["name"] == "pveproxy"
    assert service["argv"][1:] == [
        node_host.PVEPROXY_SCRIPT, "10.1.2.5", "8006", f"/var/lib/gpulab-sim/api/{NODE_PROXY_SOCKET}"
    ]  # fmt: skip
    assert spec["tools"][node_host.PVEPROXY_SCRIPT] == Path(pveproxy.__file__).read_text()
    # no API folder to forward to (a node host without the API server): no pveproxy
    bare = node_host.node_host_spec(node, tmp_path / "b", address="10.1.2.5")
    assert "services" not in bare["init"] and node_host.PVEPROXY_SCRIPT not in bare["tools"]
