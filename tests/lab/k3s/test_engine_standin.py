"""The lab's vLLM engine stand-in (labsim.net.k3s.engine): vLLM's OpenAI-compatible routes at v0.11.0, the model
read from the Hugging Face cache the pod mounts, fetched only when the cache lacks it, and served on the
LoadBalancer ports that reach the pod. The rows of library/labsim/UPSTREAM.md (## vLLM engine) name these tests."""

import json
import socket
import urllib.error
import urllib.request

import pytest
from unit.k3s.engines import VLLM as VLLM_ENGINE

from labsim.net.k3s import engine
from labsim.net.k3s.cluster import Cluster

IMAGE = "vllm/vllm-openai:v0.11.0"


def container(args=None, mounts=None, env=None, port=8000):
    c = {
        "name": "engine",
        "image": IMAGE,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
    }
    if args is not None:
        c["args"] = args
    if mounts:
        c["volumeMounts"] = mounts
    if env:
        c["env"] = env
    return c


def pod(name, c, volumes=None, lan=None, node="vm-gpu", ready=1.0):
    return {
        "name": name,
        "namespace": "default",
        "node": node,
        "ready": ready,
        "labels": {"app.kubernetes.io/name": "vllm"},
        "spec": {"containers": [c], **({"volumes": volumes} if volumes else {})},
        "lan_ports": lan or [],
    }


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def served():
    port = free_port()
    server = engine.serve("127.0.0.1", port, "qwen", "Qwen/Qwen3-0.6B")
    yield f"http://127.0.0.1:{port}"
    server.shutdown()
    server.server_close()


def test_vllm_health(served):
    assert call(served + "/health") == (200, b"")


def test_vllm_models(served):
    code, body = call(served + "/v1/models")
    listed = json.loads(body)
    assert code == 200 and listed["object"] == "list" and len(listed["data"]) == 1
    card = listed["data"][0]
    assert (card["id"], card["object"], card["owned_by"], card["root"]) == (
        "qwen",
        "model",
        "vllm",
        "Qwen/Qwen3-0.6B",
    )
    assert (
        card["parent"] is None
        and card["max_model_len"] > 0
        and card["permission"][0]["object"] == "model_permission"
    )


def test_vllm_completions(served):
    code, body = call(served + "/v1/completions", {"model": "qwen", "prompt": "Say hello", "max_tokens": 3})
    answer = json.loads(body)
    assert code == 200 and answer["object"] == "text_completion" and answer["id"].startswith("cmpl-")
    assert answer["model"] == "qwen" and len(answer["choices"][0]["text"].split()) == 3
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": 2,
        "completion_tokens": 3,
        "total_tokens": 5,
        "prompt_tokens_details": None,
    }


def test_vllm_chat_completions(served):
    messages = [{"role": "user", "content": "Hello there"}]
    code, body = call(served + "/v1/chat/completions", {"model": "qwen", "messages": messages})
    answer = json.loads(body)
    assert code == 200 and answer["object"] == "chat.completion" and answer["id"].startswith("chatcmpl-")
    message = answer["choices"][0]["message"]
    assert (
        message["role"] == "assistant"
        and message["content"]
        and answer["choices"][0]["finish_reason"] == "stop"
    )


def test_vllm_model_not_found(served):
    code, body = call(served + "/v1/completions", {"model": "other/model", "prompt": "x"})
    assert code == 404
    assert json.loads(body)["error"] == {
        "message": "The model `other/model` does not exist.",
        "type": "NotFoundError",
        "param": None,
        "code": 404,
    }


def test_vllm_served_model():
    assert engine.served_model(container()) == ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B")  # vLLM's default
    assert engine.served_model(container(["--model", "org/m"])) == ("org/m", "org/m")
    assert engine.served_model(container(["org/m", "--served-model-name", "m"])) == ("m", "org/m")
    c = {**container(["serve", "org/m"]), "command": ["vllm"]}
    assert engine.served_model(c) == ("org/m", "org/m")


def test_vllm_hf_cache(tmp_path):
    """A restarted pod whose Hugging Face cache is a volume on the node reads the model from it and fetches
    nothing; a pod without one fetches again, since its cache went with the old pod."""
    kept = container(["org/m"], mounts=[{"name": "cache", "mountPath": engine.HF_HOME}])
    claim = [{"name": "cache", "persistentVolumeClaim": {"claimName": "vllm-model-cache"}}]
    engines = engine.Engines("vm-gpu", "127.0.0.1", root=str(tmp_path))
    engines.step([pod("vllm-a", kept, claim)])
    assert [f["pod"] for f in engine.fetched(str(tmp_path))] == ["vllm-a"]
    cache = tmp_path / "var/lib/rancher/k3s/storage/default_vllm-model-cache/hub/models--org--m"
    assert (cache / "refs/main").is_file()
    engines.step([pod("vllm-b", kept, claim)])  # deleted; the Deployment's new pod
    assert [f["pod"] for f in engine.fetched(str(tmp_path))] == ["vllm-a"]
    # a hostPath volume is the node's folder
    host = [{"name": "cache", "hostPath": {"path": "/srv/models"}}]
    engines.step([pod("vllm-c", kept, host)])
    assert (tmp_path / "srv/models/hub/models--org--m/refs/main").is_file()
    # no volume: the container's own layer, gone with the pod
    bare = container(
        ["org/m"], env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "t", "key": "token"}}}]
    )
    engines.step([pod("vllm-d", bare)])
    engines.step([pod("vllm-e", bare)])
    records = engine.fetched(str(tmp_path))
    assert [f["pod"] for f in records] == ["vllm-a", "vllm-c", "vllm-d", "vllm-e"]
    assert records[-1]["token"] is True and "valueFrom" not in json.dumps(records)
    assert not (tmp_path / engine.POD_LAYERS.lstrip("/") / "vllm-d").exists()


def test_vllm_served_on_the_loadbalancer_port(tmp_path):
    """The engine answers on the node's address at each LoadBalancer port that reaches its pod (ServiceLB), only
    while the pod is Ready on this node, and stops with it."""
    port = free_port()
    lan = [{"address": None, "port": port, "target": "http"}]
    engines = engine.Engines("vm-gpu", "127.0.0.1", root=str(tmp_path))
    try:
        engines.step([pod("vllm-a", container(["org/m"]), lan=lan, ready=None)])
        assert engines.listeners == {}  # not Ready yet
        engines.step([pod("vllm-a", container(["org/m"]), lan=lan, node="other")])
        assert engines.listeners == {}  # another node's pod
        engines.step([pod("vllm-a", container(["org/m"]), lan=lan)])
        code, body = call(f"http://127.0.0.1:{port}/v1/models")
        assert code == 200 and json.loads(body)["data"][0]["id"] == "org/m"
        engines.step([])
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        engines.close()


def test_loadbalancer_services_reach_their_pods(tmp_path):
    """The cluster gives each Deployment pod the LoadBalancer ports of the Services that select it, and a pod
    deleted by name is made again by its Deployment."""
    cluster = Cluster(str(tmp_path / "state.json"))
    cluster.state["nodes"]["vm-1"] = {"heartbeat": 9e12, "boot_id": "b", "address": "10.0.0.5"}
    labels = {"app.kubernetes.io/name": "vllm"}
    docs = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "vllm", "namespace": "default"},
         "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels},
                  "spec": {"containers": [container(["org/m"])]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "vllm", "namespace": "default"},
         "spec": {"type": "LoadBalancer", "selector": labels,
                  "ports": [{"name": "http", "port": 8001, "targetPort": "http"}]}},
    ]  # fmt: skip
    with cluster.lock:
        cluster.run_pods(docs)
    first = cluster.state["pods"][0]
    assert first["lan_ports"] == [{"address": None, "port": 8001, "target": "http"}]
    assert cluster.delete_pods("default", [first["name"]], {}) == [first["name"]]
    with cluster.lock:
        cluster.run_pods(docs)
    assert cluster.state["pods"][0]["name"] != first["name"]


def test_a_lan_engine_of_the_plan_answers_and_a_new_pod_fetches_nothing(tmp_path, monkeypatch):
    """The workloads plan's own manifests for a LAN vLLM engine with a model cache volume, through the k3s
    stand-in (HAMi places the pod) and the node's engine stand-in: the LoadBalancer port answers /v1/models
    and a completion with the engine's model; the pod deleted by name is made again, reads the model from
    the kept volume and fetches nothing."""
    from unit.k3s.test_k3s_standin_pods import FACTS, Lab

    from gpulab.k8s import workloads

    lab = Lab(tmp_path, monkeypatch)
    port = free_port()
    vllm = {**VLLM_ENGINE, "args": ["Qwen/Qwen2.5-0.5B-Instruct"], "lan": True, "lan_port": port}
    plan = workloads.plan([{**vllm, "model_cache_size": "20Gi"}], FACTS, addresses={"vm-gpu": "127.0.0.1"})
    assert plan["engines"][0]["lan"]["url"] == f"http://127.0.0.1:{port}/v1"
    lab.place(plan)
    lab.step(0)
    assert lab.step() == {"vllm": ("Running", True)}
    node = tmp_path / "node"
    engines = engine.Engines("vm-gpu", "127.0.0.1", root=str(node))
    try:
        engines.step(lab.cluster.state["pods"])
        code, body = call(f"http://127.0.0.1:{port}/v1/models")
        assert code == 200 and json.loads(body)["data"][0]["id"] == "Qwen/Qwen2.5-0.5B-Instruct"
        body = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "prompt": "Say hello", "max_tokens": 5}
        assert call(f"http://127.0.0.1:{port}/v1/completions", body)[0] == 200
        first = lab.pods()["vllm"]["name"]
        assert [f["pod"] for f in engine.fetched(str(node))] == [first]

        assert lab.cluster.delete_pods("default", [first], {}) == [first]
        lab.step(0)
        assert lab.step() == {"vllm": ("Running", True)}
        assert lab.pods()["vllm"]["name"] != first
        engines.step(lab.cluster.state["pods"])
        assert call(f"http://127.0.0.1:{port}/health")[0] == 200
        assert [f["pod"] for f in engine.fetched(str(node))] == [first]  # the new pod fetched nothing
    finally:
        engines.close()


def test_the_run_ends_by_calling_each_lan_engine_and_saying_its_url_and_model(tmp_path):
    """Role workloads' last step (lan_proof.yml), from the controller as a user would: the engine's models, one
    short completion, the URL and the model said, and the endpoint kept for the lab table."""
    import os
    import subprocess

    from unit.k3s.conftest import LOCAL_HOST, PLAYBOOK, ROOT

    port = free_port()
    server = engine.serve("127.0.0.1", port, "Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B")
    planned = {"name": "vllm", "namespace": "default", "node": "vm-gpu", "cards": ["GPU-6f2a1c3e-0d4b"],
               "gpu_memory_percent": 45, "lan": {"url": f"http://127.0.0.1:{port}/v1"}}  # fmt: skip
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars": {"workloads_engine": planned, "workloads_lan_timeout": 10},
            "tasks": [
                {
                    "ansible.builtin.include_role": {
                        "name": "gpulab.homelab.workloads",
                        "tasks_from": "lan_proof.yml",
                    }
                },
                {"ansible.builtin.debug": {"msg": "ENDPOINTS {{ workloads_endpoints | to_json }}"}},
            ],
        }
    ]
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"speaker": LOCAL_HOST}}}))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    try:
        proc = subprocess.run(
            [str(PLAYBOOK), "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "play.yml")],
            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False,
        )  # fmt: skip
    finally:
        server.shutdown()
        server.server_close()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert f"serves Qwen/Qwen3-0.6B on the LAN at http://127.0.0.1:{port}/v1" in out
    assert '\\"model\\": \\"Qwen/Qwen3-0.6B\\"' in out or '"model": "Qwen/Qwen3-0.6B"' in out


def test_kube_vip_service_address_forwards_to_the_engine(tmp_path):
    """With svc_enable, kube-vip's leader announces the address a Service of its class names
    (kube-vip.io/loadbalancerIPs) and the stand-in carries each connection to the pod's node at the Service's
    port, where the engine answers (its node serves that port on its own address)."""
    from labsim.net.k3s import kube_vip

    port = free_port()
    lan = [{"address": "192.168.100.61", "port": port, "target": "http"}]
    state = {
        "nodes": {"vm-gpu": {"address": "127.0.0.1"}},
        "pods": [pod("vllm-a", container(["org/m"]), lan=lan)],
    }
    assert kube_vip.service_addresses(state) == {("192.168.100.61", port): ("127.0.0.1", port)}
    assert (
        kube_vip.service_addresses({**state, "pods": [pod("vllm-a", container(), lan=lan, ready=None)]}) == {}
    )
    docs = [{"kind": "DaemonSet", "spec": {"template": {"spec": {"hostNetwork": True, "containers": [{
        "image": "ghcr.io/kube-vip/kube-vip:v1.2.2",
        "env": [{"name": n, "value": v} for n, v in (("vip_arp", "true"), ("cp_enable", "true"),
                ("svc_enable", "true"), ("address", "192.168.100.50"))]}]}}}}]  # fmt: skip
    assert kube_vip.kube_vip_spec(docs)["services"] is True

    engines = engine.Engines("vm-gpu", "127.0.0.1", root=str(tmp_path))
    front = free_port()
    forwarder = None
    try:
        engines.step(state["pods"])  # the engine node: the kube-vip address is not here, its own address is
        assert set(engines.listeners) == {("127.0.0.1", port)}
        forwarder = kube_vip.forward("127.0.0.1", front, ("127.0.0.1", port))  # the leader's side
        code, body = call(f"http://127.0.0.1:{front}/v1/models")
        assert code == 200 and json.loads(body)["data"][0]["id"] == "org/m"
    finally:
        engines.close()
        if forwarder is not None:
            forwarder.shutdown()
            forwarder.server_close()
