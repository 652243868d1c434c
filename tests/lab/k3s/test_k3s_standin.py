"""The lab's k3s stand-in and install script behave like k3s and get.k3s.io at the interfaces the roles use.

Each host is a mount namespace of its own (labsim.net.mount_ns_host) that installs the lab's k3s release the way
a lab VM does; the server listens on 127.0.0.1 and a free port.
"""

import json
import shutil
import uuid

import pytest
import yaml
from unit.k3s import engines
from unit.k3s.conftest import HOST_PATH, VERSION, free_port, wait_for

from gpulab import hami
from gpulab.k8s import workloads
from labsim.net.k3s import common as k3s_common
from labsim.net.mount_ns_host import GPU

# Each test starts real background processes (server, agents) in mount namespaces and waits for them.
pytestmark = [pytest.mark.root, pytest.mark.slow]

NEW_VERSION = "v1.36.2+k3s1"
# k3s' packaged RuntimeClasses (manifests/runtimes.yaml; shared/reference/guest-stack.md 4.6)
RUNTIME_CLASSES = {
    "nvidia", "nvidia-experimental", "crun", "lunatic", "slight", "spin", "wws", "wasmedge", "wasmer", "wasmtime",
}  # fmt: skip


@pytest.fixture
def cluster(nshosts):
    port = free_port()
    server = nshosts("vm-1")
    server.config({"node-name": "vm-1", "bind-address": "127.0.0.1", "https-listen-port": port})
    result = server.install(INSTALL_K3S_VERSION=VERSION, INSTALL_K3S_EXEC="server")
    assert result.returncode == 0, result.stdout + result.stderr
    token_file = server.upper("/var/lib/rancher/k3s/server/token")
    assert wait_for(token_file.exists)
    assert wait_for(lambda: "vm-1" in server.nodes()), server.log("k3s")
    return server, port, token_file.read_text().strip()


def join(nshosts, name, port, token, *, labels=(), env_token=False, **kw):
    """An agent installed like a lab VM: token in a 0600 file named by config.yaml, or K3S_URL/K3S_TOKEN."""
    agent = nshosts(name, **kw)
    conf = {"node-name": name}
    env = {"INSTALL_K3S_VERSION": VERSION, "INSTALL_K3S_EXEC": "agent"}
    if env_token:
        env.update(K3S_URL=f"https://127.0.0.1:{port}", K3S_TOKEN=token)
    else:
        agent.put("/etc/rancher/k3s/agent-token", token + "\n", 0o600)
        conf.update({"server": f"https://127.0.0.1:{port}", "token-file": "/etc/rancher/k3s/agent-token"})
    if labels:
        conf["node-label"] = list(labels)
    agent.config(conf)
    result = agent.install(**env)
    assert result.returncode == 0, result.stdout + result.stderr
    return agent


def test_install_writes_k3s_files_and_starts_only_on_change(cluster):
    server, _port, token = cluster
    secret = token.split("::server:")[1]
    assert token.startswith("K10") and len(token.split("::server:")[0]) == 67 and secret
    node_token = server.upper("/var/lib/rancher/k3s/server/node-token")
    assert node_token.is_symlink() and str(node_token.readlink()) == "/var/lib/rancher/k3s/server/token"
    assert oct(server.upper("/var/lib/rancher/k3s/server/token").stat().st_mode & 0o777) == "0o600"
    unit = server.upper("/etc/systemd/system/k3s.service").read_text()
    assert "ExecStart=/usr/local/bin/k3s \\\n    server \\\n" in unit
    assert "EnvironmentFile=-/etc/systemd/system/k3s.service.env" in unit
    assert oct(server.upper("/etc/systemd/system/k3s.service.env").stat().st_mode & 0o777) == "0o600"
    for script in ("k3s-uninstall.sh", "k3s-killall.sh"):
        assert server.upper(f"/usr/local/bin/{script}").stat().st_mode & 0o111, script
    assert not server.upper("/usr/local/bin/k3s-agent-uninstall.sh").exists()
    # Like the real script: a link only for a command that is on the PATH nowhere yet.
    for cmd in ("kubectl", "crictl", "ctr"):
        link = server.upper(f"/usr/local/bin/{cmd}")
        assert link.is_symlink() == (shutil.which(cmd, path=HOST_PATH) is None), cmd
        assert not link.is_symlink() or str(link.readlink()) == "k3s"
    assert server.systemctl_calls() == [["daemon-reload"], ["enable", "k3s"], ["restart", "k3s"]]
    assert server.k3s("--version").stdout.startswith(f"k3s version {VERSION} (")
    pid = server.unit_pid("k3s")

    again = server.install(INSTALL_K3S_VERSION=VERSION, INSTALL_K3S_EXEC="server")
    assert again.returncode == 0, again.stderr
    assert "Skipping binary downloaded, installed k3s matches hash" in again.stdout
    assert "No change detected so skipping service start" in again.stdout
    assert server.systemctl_calls()[-1] == ["enable", "k3s"]
    assert server.unit_pid("k3s") == pid

    upgrade = server.install(INSTALL_K3S_VERSION=NEW_VERSION, INSTALL_K3S_EXEC="server")
    assert f"Using {NEW_VERSION} as release" in upgrade.stdout and "systemd: Starting k3s" in upgrade.stdout
    assert server.systemctl_calls()[-1] == ["restart", "k3s"]
    assert server.systemctl_calls().count(["restart", "k3s"]) == 2
    assert server.unit_pid("k3s") != pid
    assert server.k3s("--version").stdout.split()[2] == NEW_VERSION

    # while the restarted server comes up, kubectl fails and the node list is empty: keep looking
    def kubelet():
        return server.nodes().get("vm-1", {}).get("status", {}).get("nodeInfo", {}).get("kubeletVersion")

    assert wait_for(lambda: kubelet() == NEW_VERSION), kubelet()
    # the restarted server kept its token
    assert server.upper("/var/lib/rancher/k3s/server/token").read_text().strip() == token


def test_install_refusals_match_the_real_script(nshosts):
    host = nshosts("vm-x")
    skip = host.install(INSTALL_K3S_SKIP_DOWNLOAD="true")
    assert skip.returncode == 1
    assert "[ERROR]  Executable k3s binary not found at /usr/local/bin/k3s" in skip.stderr
    url = host.install(K3S_URL="https://10.0.0.1:6443")
    assert url.returncode == 1 and "K3S_TOKEN or K3S_TOKEN_FILE is not defined" in url.stderr
    plain = host.install(K3S_URL="http://10.0.0.1:6443", K3S_TOKEN="x")
    assert plain.returncode == 1 and "Only https:// URLs are supported for K3S_URL" in plain.stderr
    # refused before anything was written or started
    assert not host.upper("/etc/systemd/system").exists()
    assert not host.upper("/usr/local/bin/k3s").exists()
    assert not host.upper("/var/lib/gpulab-sim/k3s-version").exists()
    assert host.systemctl_calls() == []


def test_air_gap_install_uses_the_pre_placed_binary(nshosts):
    host = nshosts("vm-air", airgap=True)
    host.config({"node-name": "vm-air", "bind-address": "127.0.0.1", "https-listen-port": free_port()})
    binary = host.upper("/usr/local/bin/k3s")
    before = binary.read_bytes()
    result = host.run(
        "/usr/local/bin/k3s-install.sh",
        env={"INSTALL_K3S_SKIP_DOWNLOAD": "true", "INSTALL_K3S_VERSION": VERSION},
    )
    assert result.returncode == 0, result.stderr
    assert "Skipping k3s download and verify" in result.stdout and "Using" not in result.stdout
    assert binary.read_bytes() == before
    assert host.systemctl_calls()[-1] == ["restart", "k3s"]
    assert wait_for(lambda: "vm-air" in host.nodes()), host.log("k3s")


def test_agents_join_with_labels_and_hami_gives_vgpus(cluster, nshosts):
    server, port, token = cluster
    plain = join(nshosts, "vm-2", port, token, env_token=True)  # K3S_URL/K3S_TOKEN through the env file
    env_file = plain.upper("/etc/systemd/system/k3s-agent.service.env").read_text()
    assert f"K3S_URL='https://127.0.0.1:{port}'" in env_file.splitlines()
    assert plain.upper("/usr/local/bin/k3s-agent-uninstall.sh").exists()
    # the bare password is enough, as with k3s
    join(nshosts, "vm-gpu", port, token.split("::server:")[1], labels=["gpu=on"], gpu=True, toolkit=True)
    seen = wait_for(lambda: {"vm-1", "vm-2", "vm-gpu"} <= set(server.nodes()) and server.nodes())
    assert seen, server.nodes()
    assert seen["vm-gpu"]["metadata"]["labels"]["gpu"] == "on"
    assert "gpu" not in seen["vm-2"]["metadata"]["labels"]
    assert seen["vm-1"]["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == "true"
    assert "node-role.kubernetes.io/control-plane" not in seen["vm-2"]["metadata"]["labels"]
    ready = [c for c in seen["vm-2"]["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert all("nvidia.com/gpu" not in n["status"]["allocatable"] for n in seen.values())

    _values, manifest = hami.render("2.10.0", device_split_count=7)
    server.put("/var/lib/rancher/k3s/server/manifests/hami.yaml", manifest, 0o600)
    wait = ("kubectl", "-n", "kube-system", "wait", "--for=condition=complete", "job/helm-install-hami")

    # NotFound until the helm controller has picked the chart up (the hami role retries the same way)
    def created():
        result = server.k3s(*wait, "--timeout=30s")
        return None if "NotFound" in result.stderr else result

    job = wait_for(created)
    assert job is not None and job.returncode == 0, job and job.stderr
    after = server.nodes()
    assert after["vm-gpu"]["status"]["allocatable"]["nvidia.com/gpu"] == "7"
    assert "nvidia.com/gpu" not in after["vm-2"]["status"]["allocatable"]
    ds = json.loads(server.k3s("kubectl", "get", "daemonsets", "--all-namespaces", "-o", "json").stdout)
    assert [d["metadata"]["name"] for d in ds["items"]] == ["hami-device-plugin"]
    for what in ("daemonset/hami-device-plugin", "deployment/hami-scheduler"):
        rollout = server.k3s("kubectl", "-n", "kube-system", "rollout", "status", what)
        assert rollout.returncode == 0 and "successfully rolled out" in rollout.stdout, what
    # HAMi's device plugin registered the guest's card (nvidia-smi's UUID and memory) on the GPU node only
    (card,) = json.loads(after["vm-gpu"]["metadata"]["annotations"]["hami.io/node-nvidia-register"])
    assert (card["id"], card["devmem"], card["count"]) == (GPU["uuid"], GPU["memory_mib"], 7)
    assert "hami.io/node-nvidia-register" not in after["vm-2"]["metadata"]["annotations"]
    # the scheduler's kube-scheduler image: the chart's registry, the server's version without +k3s1
    dep = json.loads(
        server.k3s("kubectl", "-n", "kube-system", "get", "deployment", "hami-scheduler", "-o", "json").stdout
    )
    images = {c["name"]: c["image"] for c in dep["spec"]["template"]["spec"]["containers"]}
    assert (
        images["kube-scheduler"]
        == "registry.cn-hangzhou.aliyuncs.com/google_containers/kube-scheduler:" + VERSION.split("+")[0]
    )
    missing = server.k3s("kubectl", "-n", "default", "get", "deployment", "hami-scheduler")
    assert missing.returncode == 1 and 'deployments.apps "hami-scheduler" not found' in missing.stderr


def test_a_wrong_token_is_refused(cluster, nshosts):
    server, port, _token = cluster
    agent = join(nshosts, "vm-bad", port, "not-the-token")
    assert wait_for(lambda: "401 Unauthorized" in agent.log("k3s-agent")), agent.log("k3s-agent")
    assert "vm-bad" not in server.nodes()


def heartbeat(server, name):
    state = json.loads(server.upper("/var/lib/rancher/k3s/server/db/gpulab-state.json").read_text())
    return state["nodes"][name]["heartbeat"]


def test_k3s_node_label_reapplied(cluster, nshosts):
    """config.yaml's node-label is set again at each start of the agent, not only when the node registers: a
    label taken off with kubectl is back after a restart of k3s-agent (not before), a value changed with kubectl
    is config.yaml's again, a label kubectl added stays, and an entry taken out of config.yaml leaves its label."""
    server, port, token = cluster
    agent = join(nshosts, "vm-gpu", port, token, labels=["gpu=on", "zone=a", "rack=1"])
    assert wait_for(lambda: server.nodes().get("vm-gpu", {}).get("metadata", {}).get("labels", {}).get("gpu"))
    for change in (["gpu-"], ["zone=b", "--overwrite"], ["extra=x"], ["rack=2", "--overwrite"]):
        assert server.k3s("kubectl", "label", "node", "vm-gpu", *change).returncode == 0, change
    # the agent's heartbeats (it registers again every few seconds) put nothing back
    seen = heartbeat(server, "vm-gpu")
    assert wait_for(lambda: heartbeat(server, "vm-gpu") > seen)
    labels = server.nodes()["vm-gpu"]["metadata"]["labels"]
    assert "gpu" not in labels and (labels["zone"], labels["rack"], labels["extra"]) == ("b", "2", "x")

    conf = yaml.safe_load(agent.upper("/etc/rancher/k3s/config.yaml").read_text())
    agent.config({**conf, "node-label": ["gpu=on", "zone=a"]})  # rack=1 taken out
    assert agent.run("systemctl", "restart", "k3s-agent").returncode == 0
    assert wait_for(lambda: server.nodes()["vm-gpu"]["metadata"]["labels"].get("gpu") == "on"), agent.log(
        "k3s-agent"
    )
    labels = server.nodes()["vm-gpu"]["metadata"]["labels"]
    assert (labels["zone"], labels["rack"], labels["extra"]) == ("a", "2", "x")


def test_k3s_token_file_first_server(nshosts):
    """The server that starts the cluster takes its token from config.yaml's token-file (over token), in k3s'
    full form, and keeps it across restarts; an agent joins with the bare secret."""
    server = nshosts("vm-1")
    server.put("/etc/rancher/k3s/server-token", "  lab-secret-1234\n", 0o600)
    port = free_port()
    server.config({"node-name": "vm-1", "bind-address": "127.0.0.1", "https-listen-port": port,
                   "token": "not-this-one", "token-file": "/etc/rancher/k3s/server-token"})  # fmt: skip
    result = server.install(INSTALL_K3S_VERSION=VERSION, INSTALL_K3S_EXEC="server")
    assert result.returncode == 0, result.stdout + result.stderr
    token_file = server.upper("/var/lib/rancher/k3s/server/token")
    assert wait_for(token_file.exists), server.log("k3s")
    token = token_file.read_text().strip()
    assert token.startswith("K10") and token.endswith("::server:lab-secret-1234"), token
    assert server.run("systemctl", "restart", "k3s").returncode == 0
    assert wait_for(lambda: "vm-1" in server.nodes()), server.log("k3s")
    assert token_file.read_text().strip() == token
    join(nshosts, "vm-2", port, "lab-secret-1234")
    assert wait_for(lambda: "vm-2" in server.nodes()), server.nodes()
    refused = join(nshosts, "vm-bad", port, "not-this-one")
    assert wait_for(lambda: "401 Unauthorized" in refused.log("k3s-agent")), refused.log("k3s-agent")


def test_kubectl_label_drain_runtimeclass_and_not_found(cluster):
    server, _port, _token = cluster
    handler = wait_for(
        lambda: server.k3s("kubectl", "get", "runtimeclass", "nvidia", "-o", "jsonpath={.handler}").stdout
    )
    assert handler == "nvidia"
    names = server.k3s("kubectl", "get", "runtimeclass", "-o", "name").stdout.split()
    assert {n.split("/", 1)[1] for n in names} == RUNTIME_CLASSES
    cdi = server.k3s("kubectl", "get", "runtimeclass", "nvidia-cdi")
    assert cdi.returncode == 1
    assert 'Error from server (NotFound): runtimeclasses.node.k8s.io "nvidia-cdi" not found' in cdi.stderr
    both = json.loads(server.k3s("kubectl", "get", "nodes,runtimeclass", "-o", "json").stdout)
    assert both["kind"] == "List"
    assert {i["metadata"]["name"] for i in both["items"] if i["kind"] == "RuntimeClass"} == RUNTIME_CLASSES
    assert {i["metadata"]["name"] for i in both["items"] if i["kind"] == "Node"} == set(server.nodes())

    assert server.k3s("kubectl", "label", "node", "vm-1", "gpu=on").returncode == 0
    clash = server.k3s("kubectl", "label", "node", "vm-1", "gpu=off")
    assert clash.returncode == 1 and "--overwrite is false" in clash.stderr
    assert server.k3s("kubectl", "label", "node", "vm-1", "gpu=off", "--overwrite").returncode == 0
    assert server.nodes()["vm-1"]["metadata"]["labels"]["gpu"] == "off"
    assert server.k3s("kubectl", "label", "node", "nope", "gpu=on").returncode == 1

    drain = server.k3s("kubectl", "drain", "vm-1", "--ignore-daemonsets", "--delete-emptydir-data")
    assert drain.returncode == 0 and "node/vm-1 drained" in drain.stdout
    spec = server.nodes()["vm-1"]["spec"]
    assert spec["unschedulable"] is True and spec["taints"][0]["key"] == "node.kubernetes.io/unschedulable"
    assert server.k3s("kubectl", "uncordon", "vm-1").returncode == 0
    assert "unschedulable" not in server.nodes()["vm-1"]["spec"]
    assert server.k3s("kubectl", "drain", "nope").returncode == 1

    ready = server.k3s("kubectl", "wait", "--for=condition=Ready", "node/vm-1", "--timeout=10s")
    assert ready.returncode == 0 and "condition met" in ready.stdout
    missing = server.k3s("kubectl", "-n", "default", "rollout", "status", "deployment/nope")
    assert missing.returncode == 1 and 'deployments.apps "nope" not found' in missing.stderr
    # kubectl does not wait for a job that does not exist: NotFound at once, not a timeout
    job = server.k3s(
        "kubectl", "-n", "kube-system", "wait", "--for=condition=complete", "job/helm-install-hami"
    )
    assert job.returncode == 1 and 'jobs.batch "helm-install-hami" not found' in job.stderr
    # a kind the stand-in does not keep is refused by name (Secrets it keeps: stage workloads deletes its token's)
    unknown = server.k3s("kubectl", "get", "configmaps")
    assert unknown.returncode == 1 and 'resource type "configmaps"' in unknown.stderr
    assert [c["argv"][:2] for c in server.standin_calls()].count(["kubectl", "label"]) == 4


def test_uninstall_stops_k3s_and_removes_what_the_install_made(cluster):
    server, _port, _token = cluster
    pid = server.unit_pid("k3s")
    result = server.run("/usr/local/bin/k3s-uninstall.sh")
    assert result.returncode == 0, result.stderr
    assert pid and wait_for(lambda: not _alive(pid), 10)
    for path in (
        "/etc/systemd/system/k3s.service",
        "/etc/systemd/system/k3s.service.env",
        "/var/lib/rancher/k3s",
        "/etc/rancher/k3s",
        "/usr/local/bin/k3s",
        "/usr/local/bin/k3s-killall.sh",
        "/usr/local/bin/k3s-uninstall.sh",
        "/var/lib/gpulab-sim/k3s-version",
    ):
        assert server.gone(path), path
    assert ["disable", "k3s"] in server.systemctl_calls()
    assert len(server.standin_calls("k3s-uninstall.sh")) == 1
    assert server.k3s("--version").returncode != 0


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


ENGINES = engines.SHARED_CARD


def pods(server):
    out = server.k3s("kubectl", "get", "pods", "-o", "json")
    assert out.returncode == 0, out.stderr
    return {p["metadata"]["labels"]["app.kubernetes.io/name"]: p for p in json.loads(out.stdout)["items"]}


def runs(server):
    state = json.loads(server.upper("/var/lib/rancher/k3s/server/db/gpulab-state.json").read_text())
    return {k.split("/", 1)[1]: v["runs"] for k, v in state.get("deployment_history", {}).items()}


def ready(pod):
    return next(c["status"] for c in pod["status"]["conditions"] if c["type"] == "Ready") == "True"


def reboot(host):
    """A node reboot as the k3s stand-in sees it: a new boot id, the agent started again."""
    fresh = f"echo {uuid.uuid4()} > /run/boot_id && mount --bind /run/boot_id {k3s_common.BOOT_ID}"
    assert host.run("sh", "-c", fresh).returncode == 0
    assert host.run("systemctl", "restart", "k3s-agent").returncode == 0


def test_engines_sharing_a_card_start_in_order_on_every_start_of_their_pods(cluster, nshosts):
    """Both manifests placed at once: the init container alone keeps the order, at apply, after a node reboot
    and after a drain (eviction and reschedule)."""
    server, port, token = cluster
    gpu = join(nshosts, "vm-gpu", port, token, labels=["gpu=on"], gpu=True, toolkit=True)
    _values, chart = hami.render("2.10.0")
    server.put("/var/lib/rancher/k3s/server/manifests/hami.yaml", chart, 0o600)
    assert wait_for(lambda: server.nodes().get("vm-gpu", {}).get("status", {}).get("allocatable", {}).get(
        "nvidia.com/gpu") == "10"), server.nodes()  # fmt: skip
    facts = {"vm-gpu": [{"index": 0, "uuid": GPU["uuid"], "name": GPU["name"], "memory_total_mib": 24576}]}
    plan = workloads.plan(ENGINES, facts)
    for item in plan["engines"]:
        path = f"/var/lib/rancher/k3s/server/manifests/gpulab-workload-default-{item['name']}.yaml"
        server.put(path, item["manifest"], 0o600)

    # ollama is placed beside vllm but stays in its init container, not Ready, until vllm is Ready
    first = wait_for(lambda: (p := pods(server)).keys() == {"vllm", "ollama"} and p)
    assert first["ollama"]["spec"]["nodeName"] == "vm-gpu"
    table = server.k3s("kubectl", "get", "pods").stdout
    assert wait_for(lambda: runs(server).get("ollama")), runs(server)
    (vllm_run,), (ollama_run,) = runs(server)["vllm"], runs(server)["ollama"]
    assert vllm_run["ready"] <= ollama_run["started"], runs(server)
    assert "NAME" in table.splitlines()[0] and "STATUS" in table.splitlines()[0]
    rollout = server.k3s("kubectl", "rollout", "status", "deployment/ollama", "--timeout=30s")
    assert rollout.returncode == 0, rollout.stderr

    # a node reboot: both pods start again from their init containers, one after the other
    boot = vllm_run["boot"]
    reboot(gpu)

    def restarted():
        r = runs(server)
        return len(r["vllm"]) == 2 and len(r["ollama"]) == 2 and r

    seen_init = []

    def watch():
        p = pods(server)
        if p["ollama"]["status"]["initContainerStatuses"][0]["ready"] is False:
            seen_init.append((ready(p["vllm"]), ready(p["ollama"])))
        return restarted()

    after = wait_for(watch, 60)
    assert after, runs(server)
    vllm_run, ollama_run = after["vllm"][1], after["ollama"][1]
    assert vllm_run["boot"] == ollama_run["boot"] != boot
    assert vllm_run["started"] < vllm_run["ready"] <= ollama_run["started"], after
    # while ollama waited it was never Ready
    assert seen_init and all(not o for _v, o in seen_init), seen_init
    assert {p["status"]["containerStatuses"][0]["restartCount"] for p in pods(server).values()} == {1}

    # a drain evicts both; they are placed again only on uncordon, and start in order again
    assert server.k3s("kubectl", "drain", "vm-gpu", "--ignore-daemonsets").returncode == 0
    assert wait_for(lambda: all(p["spec"]["nodeName"] is None for p in pods(server).values())), pods(server)
    assert server.k3s("kubectl", "get", "pods").stdout.count("Pending") == 2
    assert server.k3s("kubectl", "uncordon", "vm-gpu").returncode == 0
    again = wait_for(lambda: len((r := runs(server))["ollama"]) == 3 and len(r["vllm"]) == 3 and r, 60)
    assert again, runs(server)
    assert again["vllm"][2]["ready"] <= again["ollama"][2]["started"], again
    assert again["vllm"][2]["pod"] != again["vllm"][1]["pod"]  # a new pod, not a restart


def test_an_init_container_waits_for_what_its_urls_name(cluster):
    """Nothing answers at an unknown Service, port or path: the pod stays Init:0/1 and its rollout times out."""
    server, _port, _token = cluster
    base = {"apiVersion": "apps/v1", "kind": "Deployment"}
    labels = {"app.kubernetes.io/name": "w"}
    init = {
        "name": "wait",
        "image": "busybox",
        "env": [{"name": "U", "value": "http://nope.default.svc:80/"}],
    }
    doc = {
        **base,
        "metadata": {"name": "w", "namespace": "default"},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "initContainers": [init], "containers": [{"name": "main", "image": "x"}]}}},
    }  # fmt: skip
    server.put("/var/lib/rancher/k3s/server/manifests/w.yaml", json.dumps(doc), 0o600)
    assert wait_for(lambda: "Init:0/1" in server.k3s("kubectl", "get", "pods").stdout)
    rollout = server.k3s("kubectl", "rollout", "status", "deployment/w", "--timeout=4s")
    assert rollout.returncode == 1 and "timed out" in rollout.stderr
    listed = server.k3s(
        "kubectl", "get", "pods", "-l", "app.kubernetes.io/name=w", "-o", "name"
    ).stdout.split()
    assert len(listed) == 1 and listed[0].startswith("pod/w-")
    assert server.k3s("kubectl", "get", "pods", "-n", "other").stdout == ""


def gpu_pod(name, percent, *, command=None, env=None):
    container = {
        "name": "c",
        "image": "ubuntu:24.04",
        "command": command
        or ["sh", "-c", "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits"],
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": percent}},
        **({"env": env} if env else {}),
    }
    meta = {"name": name, "namespace": "default", "labels": {"proof": "x"},
            "annotations": {"nvidia.com/use-gpuuuid": GPU["uuid"]}}  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container]}}


def test_hami_webhook_and_card_shares_as_hamis_components_would_keep_them(cluster, nshosts):
    """GPU pods go through HAMi's webhook (hami-scheduler, or default-scheduler while it does not answer:
    failurePolicy Ignore), HAMi's scheduler accounts each card's memory from the register annotation and the
    pods' requests (a pod past 100 % stays Pending with HAMi's reason), and nvidia-smi in a pod sees its share
    with HAMi-core on, the whole card with CUDA_DISABLE_CONTROL=true."""
    server, port, token = cluster
    join(nshosts, "vm-gpu", port, token, labels=["gpu=on"], gpu=True, toolkit=True)
    assert wait_for(lambda: "vm-gpu" in server.nodes())
    server.put("/var/lib/rancher/k3s/server/manifests/hami.yaml", hami.render("2.10.0")[1], 0o600)
    assert wait_for(lambda: server.nodes()["vm-gpu"]["status"]["allocatable"].get("nvidia.com/gpu") == "10")

    def create(*docs, dry=False):
        server.put("/var/tmp/pods.yaml", "".join(f"---\n{json.dumps(d)}\n" for d in docs))
        return server.k3s("kubectl", "create", "-f", "/var/tmp/pods.yaml", "-o", "json",
                          *(["--dry-run=server"] if dry else []))  # fmt: skip

    def pods():
        out = server.k3s("kubectl", "get", "pods", "-n", "default", "-l", "proof=x", "-o", "json")
        return {p["metadata"]["name"]: p for p in json.loads(out.stdout)["items"]}

    probe = json.loads(create(gpu_pod("probe", 10), dry=True).stdout)
    assert (probe["spec"]["schedulerName"], probe["spec"]["runtimeClassName"]) == ("hami-scheduler", "nvidia")
    assert pods() == {}, "a server dry run keeps no pod"
    hooks = json.loads(server.k3s("kubectl", "get", "mutatingwebhookconfigurations", "-o", "json").stdout)
    assert [h["failurePolicy"] for i in hooks["items"] for h in i["webhooks"]] == ["Ignore"]

    env_off = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    assert create(gpu_pod("a", 40), gpu_pod("b", 40, env=env_off)).returncode == 0
    assert create(gpu_pod("c", 30)).returncode == 0
    seen = wait_for(lambda: (p := pods()) and p["a"]["status"]["phase"] == "Running" and p)
    assert seen["b"]["status"]["phase"] == "Running" and seen["c"]["status"]["phase"] == "Pending"
    allocated = seen["a"]["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"]
    assert allocated == f"{GPU['uuid']},NVIDIA,{GPU['memory_mib'] * 40 // 100},0:;"
    (scheduled,) = [c for c in seen["c"]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["reason"] == "Unschedulable" and "1/1 CardInsufficientMemory" in scheduled["message"]
    share = GPU["memory_mib"] * 40 // 100
    assert server.k3s("kubectl", "logs", "a", "-n", "default").stdout.split() == [str(share)]
    assert server.k3s("kubectl", "logs", "b", "-n", "default").stdout.split() == [str(GPU["memory_mib"])]
    assert server.k3s("kubectl", "logs", "c", "-n", "default").returncode == 1

    # b goes: c fits now (40 + 30 %)
    assert server.k3s("kubectl", "delete", "pod", "b", "-n", "default").returncode == 0
    assert wait_for(lambda: pods()["c"]["status"]["phase"] == "Running")
    deleted = server.k3s("kubectl", "delete", "pods", "-n", "default", "-l", "proof=x")
    assert deleted.returncode == 0 and pods() == {}

    # the webhook's service without a replica: GPU pods are created as they are, for default-scheduler
    scaled = server.k3s("kubectl", "-n", "kube-system", "scale", "deployment/hami-scheduler", "--replicas=0")
    assert scaled.returncode == 0, scaled.stderr
    probe = json.loads(create(gpu_pod("probe", 10), dry=True).stdout)
    assert probe["spec"]["schedulerName"] == "default-scheduler"
    # its Service has no ready endpoint now; a pod asking nvidia.com/gpu alone is bound by default-scheduler
    # and rejected by the kubelet (HAMi's device plugin finds no pod bound by HAMi)
    slices = server.k3s("kubectl", "-n", "kube-system", "get", "endpointslices", "-l",
                        "kubernetes.io/service-name=hami-scheduler", "-o", "json")  # fmt: skip
    assert [s["endpoints"] for s in json.loads(slices.stdout)["items"]] == [None], slices.stderr
    whole = gpu_pod("whole", 10)
    del whole["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"]
    assert create(whole).returncode == 0
    rejected = wait_for(lambda: (p := pods().get("whole")) and p["status"]["phase"] == "Failed" and p)
    assert rejected["status"]["reason"] == "UnexpectedAdmissionError"
    assert "no binding pod found on node vm-gpu" in rejected["status"]["message"]
