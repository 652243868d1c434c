"""The k3s stand-in's embedded etcd, kube-vip, token and packaged RuntimeClasses against k3s v1.35.6+k3s1, its etcd
and kube-vip v1.2.2: one test per behaviour listed in library/labsim/UPSTREAM.md (## k3s), named after its id.

etcd and kube-vip are stepped by hand (a fake clock and network, no root); the token files and RuntimeClasses are
read from a server installed in a mount namespace host (root)."""

from __future__ import annotations

import importlib
import os
import re

import pytest
from unit.k3s.conftest import VERSION, free_port, wait_for
from unit.k3s.etcd_net import Net, three_members


def part(name):
    """The stand-in's module `name` (labsim.net.k3s.<name>), or the one-file stand-in it is split from."""
    try:
        return importlib.import_module(f"labsim.net.k3s.{name}")
    except ModuleNotFoundError:
        return importlib.import_module("labsim.net.k3s_standin")


etcd_mod, cluster_mod, server_mod, api_mod, vip_mod = (
    part(n) for n in ("etcd", "cluster", "server", "apiserver", "kube_vip")
)

#: k3s' manifests/runtimes.yaml: one RuntimeClass per containerd handler k3s can find
UPSTREAM_RUNTIME_CLASSES = {
    "nvidia", "nvidia-experimental", "crun", "lunatic", "slight", "spin", "wws", "wasmedge", "wasmer", "wasmtime",
}  # fmt: skip


@pytest.fixture
def three(tmp_path):
    return three_members(tmp_path)


def test_etcd_cluster_init(tmp_path):
    net = Net(tmp_path)
    first = net.server("vm-1")
    first.initialize()
    # --cluster-init: a new cluster of one member, which leads it at once (a quorum of one)
    assert first.status() | {"revision": 0} == {
        "name": "vm-1", "leader": "vm-1", "term": 1, "revision": 0, "members": ["vm-1"], "quorum": True,
    }  # fmt: skip
    second = net.join(first, "vm-2")
    assert second.leader == "vm-1" and second.status()["members"] == ["vm-1", "vm-2"]


def test_etcd_quorum(three):
    net = three
    net.down = {"vm-1", "vm-2"}
    net.rounds(etcd_mod.ELECTION_S + 1)
    # one of three is no majority: no leader, and the API's requests time out
    assert net.leaders() == {"vm-3": None} and net.members["vm-3"].status()["quorum"] is False
    assert etcd_mod.NO_QUORUM == "etcdserver: request timed out"
    net.down = {"vm-1"}
    net.rounds(2 * (etcd_mod.ELECTION_S + 1))
    assert set(net.leaders().values()) <= {"vm-2", "vm-3"} and None not in net.leaders().values()


def test_etcd_leader_election(three):
    net = three
    leader = net.members["vm-1"]
    with leader.cluster.lock:
        leader.cluster.state["marker"] = "x"
        leader.cluster.save()
    net.down.add("vm-2")
    net.rounds()  # vm-3 has the last write, vm-2 does not
    net.down = {"vm-1"}
    net.rounds(etcd_mod.ELECTION_S + 1)
    # the leader is gone: a member whose log is the most up to date wins the next term
    assert net.leaders() == {"vm-2": "vm-3", "vm-3": "vm-3"} and net.members["vm-3"].term == 2
    # the old leader, back, follows the newer term
    net.down = set()
    net.rounds(2)
    assert net.leaders()["vm-1"] == "vm-3" and net.members["vm-1"].term == 2


def test_k3s_token(tmp_path, monkeypatch):
    monkeypatch.setattr(server_mod, "TOKEN", str(tmp_path / "token"))
    token = server_mod.server_token({})
    # K10, the sha256 of the cluster CA (64 lower-case hex), '::server:', a generated 32-hex password
    assert re.fullmatch(r"K10[0-9a-f]{64}::server:[0-9a-f]{32}", token), token
    given = server_mod.server_token({"token": "my-secret"})
    assert given.startswith("K10") and given.endswith("::server:my-secret")
    assert server_mod.server_token({"token": given}) == given  # a full token is kept as it is
    # an agent may give the full token or the bare password
    assert api_mod.token_ok(given, given) and api_mod.token_ok("my-secret", given)
    assert not api_mod.token_ok("other", given) and not api_mod.token_ok("", given)


def kube_vip_daemonset(**env):
    values = {
        "vip_arp": "true",
        "cp_enable": "true",
        "address": "10.77.0.100",
        "vip_interface": "ens18",
        **env,
    }
    container = {
        "image": "ghcr.io/kube-vip/kube-vip:v1.2.2",
        "env": [{"name": k, "value": v} for k, v in values.items()],
    }
    return {"kind": "DaemonSet", "metadata": {"name": "kube-vip-ds", "namespace": "kube-system"},
            "spec": {"template": {"spec": {"hostNetwork": True, "containers": [container]}}}}  # fmt: skip


def test_kube_vip_arp_control_plane():
    spec = vip_mod.kube_vip_spec([kube_vip_daemonset(vip_leaderelection="true")])
    assert spec == {
        "address": "10.77.0.100",
        "interface": "ens18",
        "leader_election": True,
        "services": False,
    }
    # a VIP only in ARP mode for the control plane, from a host-network pod
    assert vip_mod.kube_vip_spec([kube_vip_daemonset(vip_arp="false")]) is None
    assert vip_mod.kube_vip_spec([kube_vip_daemonset(cp_enable="false")]) is None
    no_host = kube_vip_daemonset()
    no_host["spec"]["template"]["spec"]["hostNetwork"] = False
    assert vip_mod.kube_vip_spec([no_host]) is None


def test_kube_vip_leader_holds_vip(tmp_path):
    class Etcd:
        members = ({"name": "vm-1"}, {"name": "vm-2"})
        leading = True

        def is_leader(self):
            return self.leading

    cluster = cluster_mod.Cluster(str(tmp_path / "state.json"))
    cluster.etcd = Etcd()
    cluster.state["addons"] = {"vm-1": [kube_vip_daemonset()], "vm-2": []}
    vip = vip_mod.KubeVip(cluster, 6443, None, log=lambda msg: None)
    # the holder of the lease holds the VIP on the DaemonSet's interface; any other server lets it be
    assert vip.wanted() == ("10.77.0.100", "ens18")
    Etcd.leading = False
    assert vip.wanted() is None


@pytest.fixture
def server(nshosts):
    host = nshosts("vm-1")
    host.config({"node-name": "vm-1", "bind-address": "127.0.0.1", "https-listen-port": free_port()})
    result = host.install(INSTALL_K3S_VERSION=VERSION, INSTALL_K3S_EXEC="server")
    assert result.returncode == 0, result.stdout + result.stderr
    assert wait_for(host.upper("/var/lib/rancher/k3s/server/token").exists), host.log("k3s")
    return host


@pytest.mark.root
@pytest.mark.slow
def test_k3s_node_token(server):
    token = server.upper("/var/lib/rancher/k3s/server/token")
    node_token = server.upper("/var/lib/rancher/k3s/server/node-token")
    assert os.readlink(node_token) == "/var/lib/rancher/k3s/server/token"
    assert re.fullmatch(r"K10[0-9a-f]{64}::server:\S+\n", token.read_text())
    assert token.stat().st_mode & 0o077 == 0


@pytest.mark.root
@pytest.mark.slow
def test_k3s_runtimeclasses(server):
    def names():
        out = server.k3s("kubectl", "get", "runtimeclass", "-o", "name").stdout.split()
        return {n.split("/", 1)[1] for n in out}

    assert wait_for(lambda: names() == UPSTREAM_RUNTIME_CLASSES), names()
    handler = server.k3s("kubectl", "get", "runtimeclass", "nvidia", "-o", "jsonpath={.handler}").stdout
    assert handler == "nvidia"


def test_k3s_etcd_is_voter(three):
    """The etcd leader gives each node with the etcd role its EtcdIsVoter condition: True while the member
    answers, False (Unhealthy) while it is down, False (NotAMember) for a node etcd does not list."""
    net = three
    leader = net.members["vm-1"]
    nodes = {
        name: {"labels": {"node-role.kubernetes.io/etcd": "true"}, "heartbeat": 0, "address": "10.0.0.1"}
        for name in ("vm-1", "vm-2", "vm-3", "vm-4")
    }
    nodes["agent"] = {"labels": {}, "heartbeat": 0, "address": "10.0.0.9"}
    net.write(leader, "nodes", nodes)

    def voter(etcd, name):
        node = cluster_mod.node_object(name, etcd.cluster.state["nodes"][name])
        found = [c for c in node["status"]["conditions"] if c["type"] == "EtcdIsVoter"]
        return (found[0]["status"], found[0]["reason"]) if found else None

    net.rounds()
    assert {n: voter(leader, n) for n in nodes} == {
        "vm-1": ("True", "MemberNotLearner"), "vm-2": ("True", "MemberNotLearner"),
        "vm-3": ("True", "MemberNotLearner"), "vm-4": ("False", "NotAMember"), "agent": None,
    }  # fmt: skip
    # replicated with the leader's next round: a follower's copy says the same
    net.rounds()
    assert voter(net.members["vm-2"], "vm-3") == ("True", "MemberNotLearner")

    net.down.add("vm-3")
    net.rounds()
    assert voter(leader, "vm-3") == ("False", "Unhealthy")
    assert voter(leader, "vm-2") == ("True", "MemberNotLearner")
    net.down.discard("vm-3")
    net.rounds(2)
    assert voter(leader, "vm-3") == ("True", "MemberNotLearner")
    assert voter(net.members["vm-3"], "vm-3") == ("True", "MemberNotLearner")


def test_k3s_nvidia_runtime_found_at_start(tmp_path, capsys):
    """k3s' agent (a server runs one too) looks for the NVIDIA runtimes once, at start, the GPU Operator's folder
    before the packages' (a directory there is skipped), and writes one containerd runtime entry each; a toolkit
    installed afterwards is not in containerd's config until k3s starts again (issue 43)."""
    common = part("common")
    config = tmp_path / common.CONTAINERD_CONFIG.lstrip("/")
    assert common.setup_containerd(str(tmp_path)) == []
    assert "runtimes.'runc']" in config.read_text() and "nvidia" not in config.read_text()
    usr_bin = tmp_path / "usr/bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "nvidia-container-runtime").write_text("#!/bin/sh\n")
    assert "nvidia" not in config.read_text()  # the running k3s does not look again
    assert common.setup_containerd(str(tmp_path)) == ["nvidia"]  # the next start finds it
    text = config.read_text()
    assert (
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia']\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia'.options]\n"
        '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
        "  SystemdCgroup = true\n"
    ) in text
    assert (
        'msg="Found nvidia container runtime at /usr/bin/nvidia-container-runtime"' in capsys.readouterr().err
    )
    operator = tmp_path / "usr/local/nvidia/toolkit"
    (operator / "nvidia-container-runtime").mkdir(parents=True)  # a directory: skipped
    assert common.find_nvidia_runtimes(str(tmp_path)) == {"nvidia": "/usr/bin/nvidia-container-runtime"}
    (operator / "nvidia-container-runtime").rmdir()
    (operator / "nvidia-container-runtime").write_text("#!/bin/sh\n")
    (usr_bin / "nvidia-container-runtime-experimental").write_text("#!/bin/sh\n")
    assert common.find_nvidia_runtimes(str(tmp_path)) == {
        "nvidia": "/usr/local/nvidia/toolkit/nvidia-container-runtime",
        "nvidia-experimental": "/usr/bin/nvidia-container-runtime-experimental",
    }
