"""The engine stand-in: what a vLLM engine's pod serves once it runs on a lab node, and the model cache it reads.

The k3s stand-in runs no image. For a Deployment's pod that runs a vLLM image (vllm/vllm-openai, the project's
pin v0.11.0) and is Ready on this node, the node's k3s process (agent, or server for its own node) plays the
engine: it finds the model the container asks for (``vllm serve MODEL``, ``--model MODEL``, else vLLM's default
model), makes sure the model is in the Hugging Face cache the container sees, and serves vLLM's
OpenAI-compatible routes for it. What each behaviour is taken from, and its test, is listed in
library/labsim/UPSTREAM.md (## vLLM engine).

* Routes (vllm/entrypoints/openai/api_server.py at v0.11.0): ``GET /health`` answers 200 with an empty body;
  ``GET /v1/models`` lists the served model as a ModelList of one ModelCard (``id`` the served name,
  ``--served-model-name`` else the model, ``object: model``, ``owned_by: vllm``, ``root`` the model,
  ``parent: null``, ``max_model_len``, ``permission``); ``POST /v1/completions`` and ``POST
  /v1/chat/completions`` answer a CompletionResponse (``cmpl-...``, ``text_completion``) and a
  ChatCompletionResponse (``chatcmpl-...``, ``chat.completion``, one assistant message) with ``usage``; a request
  naming another model gets 404 with an ErrorResponse (``The model `X` does not exist.``, NotFoundError). The
  text is the stand-in's own, a few words, at most ``max_tokens`` of them.
* The model cache: the Hugging Face hub cache (``$HF_HOME/hub``, else ``/root/.cache/huggingface/hub``, the
  image runs as root) in the hub's layout (``models--ORG--NAME/refs/main``, ``snapshots/REVISION/``). Where a
  volume of the pod is mounted over that path, the cache is on the node: a hostPath volume's path, or a
  PersistentVolumeClaim's folder under k3s' local-path provisioner's ``/var/lib/rancher/k3s/storage``; else it is
  the container's own layer, which goes with the pod. A model the cache lacks is fetched (a small stand-in
  snapshot is written) and the fetch recorded in ``FETCHES`` on the node (pod, model, cache; whether a token was
  given, never the token), so a test sees that a restarted pod with a kept cache fetched nothing.
* The engine answers on the node's address at the port of each LoadBalancer Service that selects its pod (k3s'
  ServiceLB opens that port on the node, to the Service's target port). A Service of kube-vip's class names its
  address (``kube-vip.io/loadbalancerIPs``): the kube-vip leader holds it and forwards each connection to the
  pod's node at that port (module kube_vip, standing in for kube-proxy), where the engine answers too. Known
  differences: ServiceLB opens the port on every node, the stand-in on the engine's own node only; a kube-vip
  Service's port also answers on the engine's node address.

Standard library only.
"""

import contextlib
import json
import os
import secrets
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .common import send_answer

#: vLLM's default model when none is named (vllm/config/model.py at v0.11.0: ModelConfig.model)
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
#: where the vllm-openai image's Hugging Face cache is (root's home, HF_HOME unset)
HF_HOME = "/root/.cache/huggingface"
#: k3s' local-path provisioner's folder for the volumes it makes (k3s' packaged local-storage.yaml)
LOCAL_PATH = "/var/lib/rancher/k3s/storage"
#: the containers' own layers (a cache without a volume lives and dies with its pod)
POD_LAYERS = "/var/lib/rancher/k3s/gpulab-engines/pods"
#: every fetch of a model by an engine on this node, one JSON object a line
FETCHES = "/var/lib/rancher/k3s/gpulab-engines/fetches.jsonl"
MAX_MODEL_LEN = 40960
REVISION = "c1899de289a04d12100db370d81485cdf75e47ca"


def is_vllm(container):
    """Whether a container runs vLLM: its image's name (not registry or tag) contains vllm."""
    name = str(container.get("image") or "").split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return "vllm" in name.lower()


def _flag(words, flag):
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def served_model(container):
    """(served name, model) the container's vLLM serves: ``vllm serve MODEL`` or ``--model MODEL`` (else vLLM's
    default), named ``--served-model-name`` when given."""
    words = [str(w) for w in [*(container.get("command") or []), *(container.get("args") or [])]]
    model = _flag(words, "--model")
    if model is None and "serve" in words:
        rest = words[words.index("serve") + 1 :]
        model = rest[0] if rest and not rest[0].startswith("-") else None
    if model is None and words and not words[0].startswith("-") and "vllm" not in words[0]:
        model = words[0]  # the image's entrypoint is `vllm serve`: its first argument is the model
    model = model or DEFAULT_MODEL
    return _flag(words, "--served-model-name") or model, model


def _env(container, name):
    return next((str(e.get("value", "")) for e in container.get("env") or [] if e.get("name") == name), None)


def has_token(container):
    """Whether the container gets a Hugging Face token (HF_TOKEN, a value or a Secret's key)."""
    return any(e.get("name") in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") for e in container.get("env") or [])


def cache_folder(pod, container, root="/"):
    """The folder on the node that holds the container's Hugging Face hub cache (see the module's docstring)."""
    home = _env(container, "HF_HOME") or HF_HOME
    hub = home.rstrip("/") + "/hub"
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    best = None
    for mount in container.get("volumeMounts") or []:
        path = str(mount.get("mountPath") or "").rstrip("/") or "/"
        if (hub + "/").startswith(path + "/") and (best is None or len(path) > len(best[0])):
            best = (path, volumes.get(mount.get("name")) or {})
    if best is None:
        return os.path.join(root, POD_LAYERS.lstrip("/"), pod["name"], hub.lstrip("/"))
    path, volume = best
    inside = hub[len(path) :].lstrip("/")
    if volume.get("hostPath"):
        node = volume["hostPath"].get("path", "/")
    elif volume.get("persistentVolumeClaim"):
        claim = volume["persistentVolumeClaim"].get("claimName", "")
        node = f"{LOCAL_PATH}/{pod.get('namespace', 'default')}_{claim}"
    else:  # emptyDir and the like: the pod's own
        node = f"{POD_LAYERS}/{pod['name']}/volumes/{mount.get('name')}"
    return os.path.join(root, node.lstrip("/"), inside)


def model_folder(cache, model):
    """The hub cache's folder of a model: models--ORG--NAME."""
    return os.path.join(cache, "models--" + model.replace("/", "--"))


def ensure_model(cache, model, pod, token, root="/"):
    """The model in the cache, fetched (and the fetch recorded) only when the cache lacks it. True if fetched."""
    folder = model_folder(cache, model)
    ref = os.path.join(folder, "refs", "main")
    with contextlib.suppress(OSError), open(ref) as f:
        if os.path.isfile(os.path.join(folder, "snapshots", f.read().strip(), "config.json")):
            return False
    snapshot = os.path.join(folder, "snapshots", REVISION)
    os.makedirs(snapshot, exist_ok=True)
    with open(os.path.join(snapshot, "config.json"), "w") as f:
        json.dump({"_name_or_path": model, "max_position_embeddings": MAX_MODEL_LEN}, f)
    os.makedirs(os.path.dirname(ref), exist_ok=True)
    with open(ref, "w") as f:
        f.write(REVISION)
    fetches = os.path.join(root, FETCHES.lstrip("/"))
    os.makedirs(os.path.dirname(fetches), exist_ok=True)
    with open(fetches, "a") as f:
        record = {"time": time.time(), "pod": pod["name"], "model": model, "cache": cache, "token": token}
        f.write(json.dumps(record) + "\n")
    return True


def fetched(root="/"):
    """The fetches recorded on a node (ensure_model)."""
    try:
        with open(os.path.join(root, FETCHES.lstrip("/"))) as f:
            return [json.loads(line) for line in f if line.strip()]
    except OSError:
        return []


def _words(text):
    return len(str(text).split())


def model_card(name, model, created):
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": MAX_MODEL_LEN,
        "permission": [
            {
                "id": f"modelperm-{secrets.token_hex(16)}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


REPLY = "Hello from the gpulab lab's engine stand-in"


def _reply(max_tokens):
    words = REPLY.split()
    n = len(words) if max_tokens is None else max(0, min(len(words), int(max_tokens)))
    return " ".join(words[:n]), n, "length" if n < len(words) else "stop"


def _usage(prompt, completion):
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
    }


def answer(method, path, body, name, model, created):
    """(status, JSON body or None) of vLLM's OpenAI-compatible server for one request."""
    path = path.split("?", 1)[0]
    if method == "GET" and path == "/health":
        return 200, None
    if method == "GET" and path == "/v1/models":
        return 200, {"object": "list", "data": [model_card(name, model, created)]}
    if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
        return 404, {"detail": "Not Found"}  # FastAPI's answer for a route it does not have
    asked = (body or {}).get("model") or name
    if asked not in (name, model):
        error = {
            "message": f"The model `{asked}` does not exist.",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
        return 404, {"error": error}
    now = int(time.time())
    text, n, finish = _reply((body or {}).get("max_tokens"))
    if path == "/v1/completions":
        prompt = _words((body or {}).get("prompt", ""))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                  "prompt_logprobs": None}  # fmt: skip
        return 200, {"id": f"cmpl-{secrets.token_hex(16)}", "object": "text_completion", "created": now,
                     "model": name, "choices": [choice], "usage": _usage(prompt, n)}  # fmt: skip
    messages = (body or {}).get("messages") or []
    prompt = sum(_words(m.get("content", "")) for m in messages if isinstance(m, dict))
    message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "tool_calls": [], "reasoning_content": None}  # fmt: skip
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish, "stop_reason": None}
    return 200, {"id": f"chatcmpl-{secrets.token_hex(16)}", "object": "chat.completion", "created": now,
                 "model": name, "choices": [choice], "usage": _usage(prompt, n)}  # fmt: skip


def serve(address, port, name, model):
    """An engine's OpenAI-compatible server on address:port, in a thread; returns the server (shutdown())."""
    created = int(time.time())

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body):
            send_answer(self, code, b"" if body is None else json.dumps(body).encode())

        def do_GET(self):
            self._send(*answer("GET", self.path, None, name, model, created))

        def do_POST(self):
            length = int(self.headers.get("content-length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(400, {"error": {"message": "invalid JSON", "type": "BadRequestError",
                                                  "param": None, "code": 400}})  # fmt: skip
            return self._send(*answer("POST", self.path, body, name, model, created))

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def lan_ports(services, namespace, labels):
    """The LoadBalancer ports that reach a pod: (address or None, port, target port) for each port of each
    LoadBalancer Service of `services` (namespace/name -> object) in its namespace that selects its labels."""
    out = []
    for key, svc in services.items():
        spec = svc.get("spec") or {}
        if key.split("/", 1)[0] != namespace or spec.get("type") != "LoadBalancer":
            continue
        selector = spec.get("selector") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            continue
        annotations = (svc.get("metadata") or {}).get("annotations") or {}
        address = annotations.get("kube-vip.io/loadbalancerIPs") or spec.get("loadBalancerIP")
        for p in spec.get("ports") or []:
            out.append(
                {
                    "address": address,
                    "port": int(p.get("port", 0)),
                    "target": p.get("targetPort", p.get("port")),
                }
            )
    return out


class Engines:
    """The engines of the Ready vLLM pods on one node, kept serving as :meth:`step` finds them."""

    def __init__(self, node, address, root="/", local_addresses=None):
        self.node, self.address, self.root = node, address, root
        self.local_addresses = local_addresses or (lambda: {address})
        self.listeners = {}  # (address, port) -> (pod name, server)
        self.cached = set()  # pod names whose model is in their cache

    def wanted(self, pods):
        """(address, port) -> (pod, container) of every engine that should answer on this node now."""
        out = {}
        local = self.local_addresses()
        for pod in pods:
            if pod.get("node") != self.node or pod.get("ready") is None or pod.get("phase") == "Failed":
                continue
            for container in (pod.get("spec") or {}).get("containers") or []:
                if not is_vllm(container):
                    continue
                ports = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
                for lb in pod.get("lan_ports") or []:
                    target = lb["target"]
                    if target not in ports and target not in ports.values():
                        continue
                    address = lb["address"] or self.address
                    # an address kube-vip holds on another node reaches the pod through the node's address there
                    # (the stand-in's kube-proxy: module kube_vip forwards to it)
                    out[(address if address in local else self.address, lb["port"])] = (pod, container)
                if pod["name"] not in self.cached:
                    cache = cache_folder(pod, container, self.root)
                    ensure_model(cache, served_model(container)[1], pod, has_token(container), self.root)
                    self.cached.add(pod["name"])
        return out

    def step(self, pods):
        wanted = self.wanted(pods)
        serving = {key: pod["name"] for key, (pod, _) in wanted.items()}
        for key in [k for k, (pod_name, _) in self.listeners.items() if serving.get(k) != pod_name]:
            _, server = self.listeners.pop(key)  # its pod is gone, not Ready, or another pod's now
            server.shutdown()
            server.server_close()
        for key, (pod, container) in wanted.items():
            if key in self.listeners:
                continue
            name, model = served_model(container)
            with contextlib.suppress(OSError):  # the address is not here yet: the next step tries again
                self.listeners[key] = (pod["name"], serve(key[0], key[1], name, model))
        live = {p.get("name") for p in pods}
        for name in self.cached - live:
            self.cached.discard(name)  # the pod is gone: its own layer with it
            shutil.rmtree(os.path.join(self.root, POD_LAYERS.lstrip("/"), name), ignore_errors=True)

    def close(self):
        for _, server in self.listeners.values():
            server.shutdown()
            server.server_close()
        self.listeners.clear()
