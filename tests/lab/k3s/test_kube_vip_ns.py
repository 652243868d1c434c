"""kube-vip's VIP on three k3s servers, each a mount namespace host in a network namespace of its own on one LAN
(veths on a bridge in a LAN namespace that stands for the router's side): role k3s_server places kube-vip's
manifest, the servers join through the VIP, the etcd leader holds it and announces it with gratuitous ARP, and
when it stops another server takes it within seconds and the API answers there. About 30 s, root."""

import contextlib
import json
import os
import shutil
import subprocess

import pytest
import yaml
from unit.k3s.conftest import VERSION, recap

from gpulab.k8s import workloads

from .test_k3s_roles_ns import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

VIP = "10.77.0.100"
NAMES = ("vm-1", "vm-2", "vm-3")


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@pytest.fixture
def lan():
    """A LAN namespace with a bridge (10.77.0.1/24) and one namespace per server, its ens18 (10.77.0.11, .12,
    .13) on that bridge, default route via 10.77.0.1; all deleted at the end."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2 (network namespaces)")
    tag = f"kv{os.getpid() % 100000}"
    made = []
    lan_ns = f"{tag}-lan"
    try:
        ip("netns", "add", lan_ns)
        made.append(lan_ns)
        ip("-n", lan_ns, "link", "add", "br0", "type", "bridge")
        ip("-n", lan_ns, "addr", "add", "10.77.0.1/24", "dev", "br0")
        ip("-n", lan_ns, "link", "set", "br0", "up")
        ip("-n", lan_ns, "link", "set", "lo", "up")
        hosts = {}
        for i, name in enumerate(NAMES):
            ns = f"{tag}-{i}"
            ip("netns", "add", ns)
            made.append(ns)
            ip(
                "-n",
                lan_ns,
                "link",
                "add",
                f"{tag}v{i}",
                "type",
                "veth",
                "peer",
                "name",
                "ens18",
                "netns",
                ns,
            )
            ip("-n", lan_ns, "link", "set", f"{tag}v{i}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"10.77.0.{11 + i}/24", "dev", "ens18")
            ip("-n", ns, "link", "set", "ens18", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "route", "add", "default", "via", "10.77.0.1")
            mac = json.loads(ip("-n", ns, "-j", "link", "show", "dev", "ens18").stdout)[0]["address"]
            hosts[name] = {"ns": ns, "address": f"10.77.0.{11 + i}", "mac": mac}
        yield {"ns": lan_ns, "hosts": hosts}
    finally:
        for ns in reversed(made):
            ip("netns", "del", ns, check=False)


def on_lan(lan, *argv):
    return subprocess.run(
        ["ip", "netns", "exec", lan["ns"], *argv], capture_output=True, text=True, timeout=30
    )


def vip_status(lan):
    """The etcd view of the server that answers on the VIP (each server answers that itself), or None."""
    out = on_lan(lan, "curl", "-s", "--max-time", "2", f"http://{VIP}:6443/gpulab/etcd/status")
    try:
        return json.loads(out.stdout) if out.returncode == 0 else None
    except ValueError:
        return None


def vip_mac(lan):
    """The MAC the LAN's neighbour cache holds for the VIP (what the router's side would send to)."""
    entries = json.loads(on_lan(lan, "ip", "-j", "neigh", "show", VIP).stdout or "[]")
    return entries[0].get("lladdr") if entries else None


def holds_vip(lan, name):
    addrs = json.loads(ip("-n", lan["hosts"][name]["ns"], "-j", "addr", "show", "dev", "ens18").stdout)
    return any(a["local"] == VIP for link in addrs for a in link["addr_info"])


def test_kube_vip_holds_the_vip_on_the_leader_and_moves_it_when_that_server_stops(nshosts, lan):
    servers, token = {}, ""
    url = f"https://{VIP}:6443"
    for name in NAMES:
        first = name == "vm-1"
        host = servers[name] = nshosts(name, airgap=True, netns=lan["hosts"][name]["ns"])
        server_vars = {
            "k3s_server_version": VERSION,
            "k3s_server_airgap": True,
            "k3s_server_node_name": name,
            "k3s_server_address": lan["hosts"][name]["address"],
            "k3s_server_tls_san": [VIP],
            "k3s_server_cluster_init": first,
            "k3s_server_join_url": "" if first else url,
            "k3s_server_token": token,
            "k3s_server_kube_vip_address": VIP,  # the interface: the default route's (ens18)
            "k3s_server_poll_interval": 1,
            "k3s_server_ready_timeout": 60,
        }
        result = host.play("k3s_server", server_vars)
        assert recap(result)["failed"] == 0, result.stdout[-4000:]
        manifest = list(
            yaml.safe_load_all(host.upper("/var/lib/rancher/k3s/server/manifests/kube-vip.yaml").read_text())
        )
        env = {
            e["name"]: e.get("value") for e in manifest[3]["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        assert (env["address"], env["vip_interface"]) == (VIP, "ens18")
        if first:
            token = host.upper("/var/lib/rancher/k3s/server/token").read_text().strip()
            # the role waited for the VIP: the first server answers on it, and the LAN knows it at its MAC
            assert vip_status(lan)["name"] == "vm-1" and holds_vip(lan, "vm-1")
            assert vip_mac(lan) == lan["hosts"]["vm-1"]["mac"]
        else:
            config = yaml.safe_load(host.upper("/etc/rancher/k3s/config.yaml").read_text())
            assert config["server"] == url and VIP in config["tls-san"]
    assert wait_until(lambda: (s := vip_status(lan)) and s["members"] == list(NAMES))
    again = servers["vm-2"].play("k3s_server", {**server_vars, "k3s_server_node_name": "vm-2",
                                                "k3s_server_address": lan["hosts"]["vm-2"]["address"]})  # fmt: skip
    assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again.stdout[-4000:]
    daemonsets = json.loads(servers["vm-3"].k3s("kubectl", "get", "daemonsets", "-A", "-o", "json").stdout)
    assert "kube-vip-ds" in {d["metadata"]["name"] for d in daemonsets["items"]}

    # One server holds the VIP: the etcd leader.
    holder = vip_status(lan)["leader"]
    assert [n for n in NAMES if holds_vip(lan, n)] == [holder]

    # The holder stops: another server takes the VIP within seconds and the API answers on it. (Its gratuitous ARP
    # is not checked here: the LAN's neighbour cache did not move before the next request in this set-up.)
    assert servers[holder].run("systemctl", "stop", "k3s").returncode == 0
    rest = [n for n in NAMES if n != holder]
    new = wait_until(lambda: next((n for n in rest if holds_vip(lan, n)), None), tries=75)
    assert new, "no other server took the VIP within 15 s"
    assert not holds_vip(lan, holder)
    status = wait_until(lambda: (s := vip_status(lan)) and s["name"] == new and s)
    assert status and status["leader"] == new
    assert vip_mac(lan) == lan["hosts"][new]["mac"]
    nodes = servers[rest[0]].k3s("kubectl", "get", "nodes", "-o", "json")
    assert nodes.returncode == 0, nodes.stderr

    # Started again, the old holder joins as a follower and leaves the VIP where it is.
    assert servers[holder].run("systemctl", "start", "k3s").returncode == 0
    assert wait_until(lambda: (s := vip_status(lan)) and s["name"] == new and len(s["members"]) == 3)
    assert [n for n in NAMES if holds_vip(lan, n)] == [new]


LAN_ADDRESS = "10.77.0.61"


def test_kube_vip_announces_a_lan_engines_address_and_the_lan_reaches_the_engine_there(nshosts, lan):
    """An engine with a lan_address on a cluster that runs kube-vip (issue 46): role k3s_server with the VIP and
    k3s_server_kube_vip_services (what stage k3s sets when an engine has a lan_address), then the engine's
    Service as the workloads plan writes it (kube-vip's class at kube-vip.io/loadbalancerIPs, lan_port) beside a
    vLLM Deployment (no GPU here: its pod runs on the server's own node). The server that holds the VIP takes
    the engine's address too; from the LAN's side that address answers /v1/models with the engine's model and
    a completion."""
    host = nshosts("vm-1", airgap=True, netns=lan["hosts"]["vm-1"]["ns"])
    server_vars = {
        "k3s_server_version": VERSION,
        "k3s_server_airgap": True,
        "k3s_server_node_name": "vm-1",
        "k3s_server_address": lan["hosts"]["vm-1"]["address"],
        "k3s_server_tls_san": [VIP],
        "k3s_server_kube_vip_address": VIP,
        "k3s_server_kube_vip_services": True,
        "k3s_server_poll_interval": 1,
        "k3s_server_ready_timeout": 60,
    }
    result = host.play("k3s_server", server_vars)
    assert recap(result)["failed"] == 0, result.stdout[-4000:]
    assert wait_until(lambda: holds_vip(lan, "vm-1"))

    engine = {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "node": "vm-1", "port": 8000,
              "lan": True, "lan_address": LAN_ADDRESS, "lan_port": 8001}  # fmt: skip
    # the Service as the plan lays it out (the role's template), from the engine's objects on a card of its own
    objects = workloads.engine_objects(engine, ["GPU-00000000-0000-0000-0000-000000000000"], None, None)
    (service,) = [
        d for d in workloads.manifest_documents(workloads.render_manifest(objects)) if d["kind"] == "Service"
    ]
    assert service["spec"]["loadBalancerClass"] == "kube-vip.io/kube-vip-class"
    labels = {"app.kubernetes.io/name": "vllm"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm", "namespace": "default", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "engine",
                            "image": engine["image"],
                            "args": ["Qwen/Qwen3-0.6B"],
                            "ports": [{"name": "http", "containerPort": 8000}],
                        }
                    ]
                },
            },
        },
    }
    host.put(
        "/var/lib/rancher/k3s/server/manifests/gpulab-workload-default-vllm.yaml",
        yaml.safe_dump_all([deployment, service]),
    )

    def models():
        out = on_lan(lan, "curl", "-s", "--max-time", "2", f"http://{LAN_ADDRESS}:8001/v1/models")
        with contextlib.suppress(ValueError):
            return json.loads(out.stdout)["data"][0]["id"] if out.returncode == 0 else None
        return None

    assert wait_until(models, tries=300) == "Qwen/Qwen3-0.6B"
    addrs = json.loads(ip("-n", lan["hosts"]["vm-1"]["ns"], "-j", "addr", "show", "dev", "ens18").stdout)
    assert LAN_ADDRESS in {a["local"] for link in addrs for a in link["addr_info"]}
    body = json.dumps({"model": "Qwen/Qwen3-0.6B", "prompt": "Say hello", "max_tokens": 5})
    done = on_lan(lan, "curl", "-s", "--max-time", "5", "-H", "Content-Type: application/json", "-d", body,
                  f"http://{LAN_ADDRESS}:8001/v1/completions")  # fmt: skip
    assert done.returncode == 0 and json.loads(done.stdout)["choices"][0]["text"].strip(), done.stdout
