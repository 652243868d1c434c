"""k3s_server, k3s_agent, then the cluster check, hami and workloads roles, unchanged, against the lab's k3s.

Each host is a mount namespace of its own (labsim.net.mount_ns_host) with the lab's k3s release pre-placed
(air-gap install): the roles install and run the lab's k3s stand-in with the lab's install script stand-in.
The server listens on 127.0.0.1 only, on a free port. Nothing outside the temporary folder changes.
"""

import json
import os
import time
import urllib.request

import pytest
import yaml
from unit.k3s.conftest import PLAYBOOK, VERSION, free_port, recap

from gpulab.k8s.speaker import etcd_settled

from .test_roles_local import CLUSTER, HAMI, WORKLOADS, FakeK3sFolder, engines

pytestmark = [pytest.mark.root, pytest.mark.slow]

OUTSIDE = ("/etc/rancher", "/var/lib/rancher", "/usr/local/bin/k3s", "/var/lib/gpulab-sim/k3s-version")


def wait_nodes(server, names, tries=100):
    nodes = {}
    for _ in range(tries):
        nodes = server.nodes()
        if set(names) <= set(nodes):
            break
        time.sleep(0.2)
    return nodes


def play_on(server, lab, tasks, extra_vars):
    """test_roles_local's play (its inventory, GPU facts and JSON callback), run inside the server's host."""
    path = lab.write_play(tasks)
    env = {
        "ANSIBLE_STDOUT_CALLBACK": "gpulab_test_json",
        "ANSIBLE_CALLBACK_PLUGINS": str(lab.root / "callbacks"),
    }
    return lab.result(
        server.run(
            PLAYBOOK, "-i", lab.root / "hosts.yml", path, "-e", json.dumps(extra_vars), env=env, timeout=600
        )
    )


def lab_server_vars(name: str, port: int, **more) -> dict:
    """k3s_server's variables for the lab server `name` (air-gapped, its API on 127.0.0.1:`port`, quick
    polls), with `more` added."""
    return {
        "k3s_server_version": VERSION,
        "k3s_server_airgap": True,
        "k3s_server_node_name": name,
        "k3s_server_address": "127.0.0.1",
        "k3s_server_config": {"bind-address": "127.0.0.1", "https-listen-port": port},
        "k3s_server_poll_interval": 1,
        "k3s_server_ready_timeout": 60,
        **more,
    }


def lab_agent_vars(token: str, server_url: str, name: str = "vm-gpu", **more) -> dict:
    """k3s_agent's variables for the lab agent `name` (air-gapped, a GPU node unless `more` says otherwise),
    joining `server_url` with `token`."""
    return {
        "k3s_agent_version": VERSION,
        "k3s_agent_token": token,
        "k3s_agent_server_url": server_url,
        "k3s_agent_node_name": name,
        "k3s_agent_gpu": True,
        "k3s_agent_airgap": True,
        **more,
    }


def test_k3s_roles_install_join_and_drive_the_lab_cluster(nshosts, tmp_path):
    outside = [os.path.exists(p) for p in OUTSIDE]
    port = free_port()
    server = nshosts("vm-1", airgap=True)
    server_vars = lab_server_vars("vm-1", port)

    # First run: config, install (air-gap), k3s started, token generated and read back, node Ready.
    first = server.play("k3s_server", server_vars)
    assert recap(first)["failed"] == 0, first.stdout[-4000:]
    assert recap(first)["changed"] > 0
    token = server.upper("/var/lib/rancher/k3s/server/token").read_text().strip()
    assert token.startswith("K10") and token not in first.stdout and token.split(":")[-1] not in first.stdout
    config = yaml.safe_load(server.upper("/etc/rancher/k3s/config.yaml").read_text())
    assert config["node-name"] == "vm-1" and config["tls-san"] == ["127.0.0.1"] and "token" not in config
    assert "Skipping k3s download and verify" in first.stdout
    assert server.systemctl_calls().count(["restart", "k3s"]) == 1
    assert "vm-1" in server.nodes()

    # Second run: nothing changes, nothing restarts.
    pid = server.unit_pid("k3s")
    second = server.play("k3s_server", server_vars)
    assert recap(second) == {**recap(second), "changed": 0, "failed": 0}, second.stdout[-4000:]
    assert server.systemctl_calls().count(["restart", "k3s"]) == 1 and server.unit_pid("k3s") == pid
    # The first run installed and waited for its node; the second neither includes the install steps nor
    # waits for a node it did not restart (the cluster check of stage k3s looks at every node).
    assert "gpulab.homelab.k3s_install : Run the install script" in first.stdout
    assert "Wait until every node is registered and Ready" in first.stdout
    assert "k3s_install :" not in second.stdout and "Wait until every node" not in second.stdout
    # k3s found running and enabled is left alone; found stopped, it is started again.
    assert ["start", "k3s"] not in server.systemctl_calls()
    assert server.run("systemctl", "stop", "k3s").returncode == 0 and server.unit_pid("k3s") is None
    restarted = server.play("k3s_server", server_vars)
    assert recap(restarted)["changed"] == 1 and recap(restarted)["failed"] == 0, restarted.stdout[-4000:]
    assert server.systemctl_calls()[-1] == ["start", "k3s"] and server.unit_pid("k3s") is not None
    pid = server.unit_pid("k3s")

    # --check with a new setting: reported, not written, not restarted.
    changed_vars = {
        **server_vars,
        "k3s_server_config": {**server_vars["k3s_server_config"], "disable": ["traefik"]},
    }
    before = server.upper("/etc/rancher/k3s/config.yaml").read_text()
    check = server.play("k3s_server", changed_vars, "--check")
    assert recap(check)["failed"] == 0 and recap(check)["changed"] > 0, check.stdout[-4000:]
    assert server.upper("/etc/rancher/k3s/config.yaml").read_text() == before
    assert server.systemctl_calls().count(["restart", "k3s"]) == 1

    # The change for real: config written, k3s restarted once through the handler.
    apply = server.play("k3s_server", changed_vars)
    assert recap(apply)["failed"] == 0, apply.stdout[-4000:]
    assert "traefik" in server.upper("/etc/rancher/k3s/config.yaml").read_text()
    assert server.systemctl_calls().count(["restart", "k3s"]) == 2
    assert server.unit_pid("k3s") != pid

    agent_vars = lab_agent_vars(token, f"https://127.0.0.1:{port}")

    # A GPU agent without its container toolkit is refused before anything is installed.
    bare = nshosts("vm-gpu-bare", gpu=True, airgap=True)
    refused = bare.play("k3s_agent", agent_vars)
    assert recap(refused)["failed"] == 1
    assert "NVIDIA container toolkit is missing" in refused.stdout
    assert not bare.upper("/etc/systemd/system/k3s-agent.service").exists()
    assert bare.systemctl_calls() == []

    # With driver and toolkit it joins, labelled, and the token stays out of the output and the config.
    gpu = nshosts("vm-gpu", gpu=True, toolkit=True, airgap=True)
    joined = gpu.play("k3s_agent", agent_vars)
    assert recap(joined)["failed"] == 0, joined.stdout[-4000:]
    assert token not in joined.stdout and token.split(":")[-1] not in joined.stdout
    agent_config = gpu.upper("/etc/rancher/k3s/config.yaml").read_text()
    assert token not in agent_config and "gpu=on" in agent_config
    assert oct(gpu.upper("/etc/rancher/k3s/agent-token").stat().st_mode & 0o777) == "0o600"
    assert gpu.systemctl_calls().count(["restart", "k3s-agent"]) == 1

    plain = nshosts("vm-2", airgap=True)
    plain_vars = {**agent_vars, "k3s_agent_node_name": "vm-2", "k3s_agent_gpu": False}
    assert recap(plain.play("k3s_agent", plain_vars))["failed"] == 0

    nodes = wait_nodes(server, ["vm-1", "vm-2", "vm-gpu"])
    assert nodes["vm-gpu"]["metadata"]["labels"]["gpu"] == "on"
    assert "gpu" not in nodes["vm-2"]["metadata"]["labels"]

    again = gpu.play("k3s_agent", agent_vars)
    assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again.stdout[-4000:]
    assert gpu.systemctl_calls().count(["restart", "k3s-agent"]) == 1
    assert (
        "gpulab.homelab.k3s_install : Run the install script" in joined.stdout
        and "k3s_install :" not in again.stdout
    )

    # The GPU label lives in the agent's config.yaml, which k3s applies at each start of k3s-agent: taken off
    # with kubectl, it is back once the agent restarts.
    assert yaml.safe_load(agent_config)["node-label"] == ["gpu=on"]
    assert server.k3s("kubectl", "label", "node", "vm-gpu", "gpu-").returncode == 0
    assert "gpu" not in server.nodes()["vm-gpu"]["metadata"]["labels"]
    assert gpu.run("systemctl", "restart", "k3s-agent").returncode == 0
    assert wait_until(lambda: server.nodes()["vm-gpu"]["metadata"]["labels"].get("gpu") == "on")

    # The cluster check, hami and workloads roles, run on the server against the joined cluster.
    (tmp_path / "controller").mkdir()
    lab = FakeK3sFolder(tmp_path / "controller")
    where = {"bin": "/usr/local/bin", "manifests": "/var/lib/rancher/k3s/server/manifests"}
    cluster = {**CLUSTER, "vars": {**CLUSTER["vars"], "k3s_server_ready_timeout": 30}}
    hami = {**HAMI, "vars": {**HAMI["vars"], "hami_ready_timeout": 120, "hami_poll_interval": 2}}

    rc, out = play_on(server, lab, [cluster], where)
    assert rc == 0, lab.failures(out)
    assert server.nodes()["vm-gpu"]["metadata"]["labels"]["gpu"] == "on"

    rc, out = play_on(server, lab, [hami], where)
    assert rc == 0, lab.failures(out)
    assert server.nodes()["vm-gpu"]["status"]["allocatable"]["nvidia.com/gpu"] == "10"
    assert "nvidia.com/gpu" not in server.nodes()["vm-2"]["status"]["allocatable"]

    pytest.importorskip(
        "kubernetes_validate", reason="manifest validation needs the kubernetes-validate package"
    )
    plan = {**where, "workloads_engines": engines(45, 45)}
    rc, out = play_on(server, lab, [WORKLOADS], plan)
    assert rc == 0, lab.failures(out)
    state = json.loads(server.upper("/var/lib/rancher/k3s/server/db/gpulab-state.json").read_text())
    assert state["deployments"]["default/e0"]["ready"] is True

    rc, out = play_on(server, lab, [cluster, hami, WORKLOADS], plan)
    assert rc == 0 and out["stats"]["vm-1"]["changed"] == 0, out["stats"]

    # This machine's own files were never touched: the overlays existed only in the namespaces.
    assert [os.path.exists(p) for p in OUTSIDE] == outside


def etcd_status(port):
    """A server's view of etcd (the stand-in's); a stopped or starting server has none."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gpulab/etcd/status", timeout=5) as resp:
            return json.load(resp)
    except OSError:
        return {"leader": None, "members": []}


def heartbeat(server, node):
    nodes = server.nodes()
    return nodes.get(node, {}).get("status", {}).get("conditions", [{}])[0].get("lastHeartbeatTime")


def wait_until(predicate, tries=150):
    for _ in range(tries):
        if value := predicate():
            return value
        time.sleep(0.2)
    return predicate()


def test_three_servers_form_one_etcd_cluster_that_keeps_answering_without_one(nshosts):
    """k3s_server with cluster-init on the first server, the others joining through its address with the token
    the first generated, an agent through the same address; re-runs change nothing. Two of three servers down:
    the API stops answering; the leader down: another leads and the agent reaches a server that answers."""
    ports = {name: free_port() for name in ("vm-1", "vm-2", "vm-3")}
    url = f"https://127.0.0.1:{ports['vm-1']}"
    servers, results = {}, {}
    token = ""
    for name, port in ports.items():
        first = name == "vm-1"
        host = servers[name] = nshosts(name, airgap=True)
        server_vars = lab_server_vars(
            name,
            port,
            k3s_server_tls_san=["k3s.lab.example"],
            k3s_server_cluster_init=first,
            k3s_server_join_url="" if first else url,
            k3s_server_token=token,
        )
        results[name] = (host.play("k3s_server", server_vars), server_vars)
        assert recap(results[name][0])["failed"] == 0, results[name][0].stdout[-4000:]
        if first:
            token = host.upper("/var/lib/rancher/k3s/server/token").read_text().strip()
        config = yaml.safe_load(host.upper("/etc/rancher/k3s/config.yaml").read_text())
        assert config["tls-san"] == ["127.0.0.1", "k3s.lab.example"]
        if first:
            assert config["cluster-init"] is True and "server" not in config and "token-file" not in config
        else:
            assert "cluster-init" not in config and config["server"] == url
            assert config["token-file"] == "/etc/rancher/k3s/server-token"
            # a joined server holds the cluster's token; it never shows in the output
            assert host.upper("/var/lib/rancher/k3s/server/token").read_text().strip() == token
            assert token.split(":")[-1] not in results[name][0].stdout
    members = ["vm-1", "vm-2", "vm-3"]
    assert wait_until(lambda: all(etcd_status(p)["members"] == members for p in ports.values()))
    assert {etcd_status(p)["leader"] for p in ports.values()} == {"vm-1"}

    agent = nshosts("vm-a", airgap=True)
    agent_vars = {"k3s_agent_version": VERSION, "k3s_agent_token": token, "k3s_agent_server_url": url,
                  "k3s_agent_node_name": "vm-a", "k3s_agent_airgap": True}  # fmt: skip
    assert recap(agent.play("k3s_agent", agent_vars))["failed"] == 0
    nodes = wait_nodes(servers["vm-3"], [*members, "vm-a"])
    assert set(nodes) == {*members, "vm-a"}
    assert all(nodes[n]["metadata"]["labels"]["node-role.kubernetes.io/etcd"] == "true" for n in members)
    assert "node-role.kubernetes.io/etcd" not in nodes["vm-a"]["metadata"]["labels"]

    # Again: nothing changes, nothing restarts.
    for name in ("vm-1", "vm-2"):
        again = servers[name].play("k3s_server", results[name][1])
        assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again.stdout[-4000:]
        assert servers[name].systemctl_calls().count(["restart", "k3s"]) == 1
    again = agent.play("k3s_agent", agent_vars)
    assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again.stdout[-4000:]

    # k3s' etcd member controller marks each server's node EtcdIsVoter; stage host's wait after a node's reboot
    # (gpulab.k8s.speaker.etcd_settled) reads it through kubectl on a server: all three voters, then vm-3
    # stopped is no voter (at once, before its node goes NotReady), then back, a voter again.
    def settled(via):
        got = servers[via].k3s("kubectl", "get", "nodes", "-o", "json")
        return etcd_settled(members, json.loads(got.stdout) if got.returncode == 0 else None)

    assert wait_until(lambda: settled("vm-2")["done"]), settled("vm-2")
    assert servers["vm-3"].run("systemctl", "stop", "k3s").returncode == 0
    gone = wait_until(lambda: (s := settled("vm-1"))["waiting"] == ["vm-3"] and s)
    assert gone and "vm-3 not a voting etcd member" in gone["why"], settled("vm-1")
    assert servers["vm-3"].run("systemctl", "start", "k3s").returncode == 0
    assert wait_until(lambda: settled("vm-1")["done"]), settled("vm-1")

    # Two of three servers down: no quorum, kubectl on the last one fails as k3s' does.
    for name in ("vm-2", "vm-3"):
        assert servers[name].run("systemctl", "stop", "k3s").returncode == 0
    lost = wait_until(lambda: (r := servers["vm-1"].k3s("kubectl", "get", "nodes")).returncode != 0 and r)
    assert lost and "etcdserver: request timed out" in lost.stderr, lost and lost.stdout
    assert servers["vm-3"].k3s("kubectl", "get", "nodes").returncode == 1  # stopped: refused
    assert servers["vm-3"].run("systemctl", "start", "k3s").returncode == 0
    assert wait_until(lambda: servers["vm-1"].k3s("kubectl", "get", "nodes").returncode == 0)

    # The leader down: another member leads and the agent, registered through vm-1's address, moves on.
    assert servers["vm-2"].run("systemctl", "start", "k3s").returncode == 0
    assert wait_until(
        lambda: (
            len(leaders := {etcd_status(p)["leader"] for p in ports.values()}) == 1 and None not in leaders
        )
    )
    leader = etcd_status(ports["vm-1"])["leader"]
    assert servers[leader].run("systemctl", "stop", "k3s").returncode == 0
    rest = [n for n in members if n != leader]
    new = wait_until(lambda: (s := etcd_status(ports[rest[0]]))["leader"] in rest and s["leader"])
    assert new and etcd_status(ports[rest[1]])["leader"] == new
    before = heartbeat(servers[new], "vm-a")
    assert wait_until(lambda: heartbeat(servers[new], "vm-a") != before), "the agent found no server"
    ready = servers[rest[1]].k3s("kubectl", "wait", "--for=condition=Ready", "node/vm-a", "--timeout=10s")
    assert ready.returncode == 0, ready.stderr
