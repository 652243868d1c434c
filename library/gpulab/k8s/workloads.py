"""GPU engines from the inventory as Kubernetes objects for HAMi, and the order to start them in.

An engine (one item of the inventory's `workloads_engines`) names its GPU node and the cards it wants, by
index in that node's GPU facts or by UUID. The plan pins those cards by UUID (`nvidia.com/use-gpuuuid`),
asks HAMi for that many cards (`nvidia.com/gpu`) and a share of each (`nvidia.com/gpumem-percentage`), runs
under the `nvidia` RuntimeClass, and sets `CUDA_DISABLE_CONTROL=true` for engines that size their own memory
(vLLM measures free GPU memory at start and would be confused by HAMi-core's limits).

Engines that share a card must start one at a time, each after the previous is Ready, since each measures the
memory left free when it starts; the plan orders them and marks which ones to wait for. A plan that puts a card
above 100 % is refused before anything is applied.
"""

from __future__ import annotations

import re

import yaml

from gpulab.k8s.validate import validate_manifest

UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

ENGINE_KEYS = {
    "name": "DNS label, also the Deployment and Service name (required)",
    "image": "container image (required)",
    "node": "inventory host whose GPU facts hold the cards (required)",
    "gpus": "cards, each an index into the node's GPUs or a GPU UUID (default [0])",
    "gpu_memory_percent": "share of each card's memory, 1-100 (default 100: the whole card)",
    "gpu_cores": "share of each card's compute, 1-100 (default: no limit)",
    "cuda_disable_control": "true for engines that size their own GPU memory, such as vLLM (default false)",
    "namespace": "namespace (default default)",
    "replicas": "copies, each taking the share again (default 1)",
    "command": "container command (list)",
    "args": "container arguments (list)",
    "env": "extra environment (map)",
    "port": "TCP port served; adds a ClusterIP Service and a readiness probe",
    "readiness_path": "HTTP path for the readiness probe (default: a TCP check on port)",
    "resources": "CPU/memory requests and limits (Kubernetes resources map without the GPU keys)",
}


class PlanError(ValueError):
    """The engines cannot be planned as given; the message says which engine, what and how to fix it."""


def _engine_error(engine, what):
    return PlanError(f"workloads_engines item {engine.get('name', '?')!r}: {what}")


def _percent(engine, key, default):
    value = engine.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise _engine_error(engine, f"{key} must be a whole number from 1 to 100, not {value!r}")
    return value


def _cards(engine, node_gpus):
    refs = engine.get("gpus", [0])
    if not isinstance(refs, list) or not refs:
        raise _engine_error(engine, f"gpus must be a non-empty list of card indexes or UUIDs, not {refs!r}")
    known = [g["uuid"] for g in node_gpus]
    uuids = []
    for ref in refs:
        if isinstance(ref, int) and not isinstance(ref, bool):
            if not 0 <= ref < len(known):
                raise _engine_error(
                    engine,
                    f"card index {ref} does not exist on {engine['node']} ({len(known)} GPU(s) reported)",
                )
            uuid = known[ref]
        elif isinstance(ref, str) and UUID_RE.match(ref):
            if ref not in known:
                raise _engine_error(
                    engine, f"card {ref} is not among {engine['node']}'s GPUs ({', '.join(known) or 'none'})"
                )
            uuid = ref
        else:
            raise _engine_error(engine, f"{ref!r} is neither a card index nor a GPU UUID (GPU-xxxxxxxx-...)")
        if uuid in uuids:
            raise _engine_error(engine, f"card {uuid} is listed twice")
        uuids.append(uuid)
    return uuids


def _labels(name):
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "gpulab"}


def _container(engine, cards, percent, cores):
    limits = {"nvidia.com/gpu": len(cards)}
    if percent is not None and percent < 100:
        limits["nvidia.com/gpumem-percentage"] = percent
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    resources = dict(engine.get("resources") or {})
    for key in ("limits", "requests"):
        for res in resources.get(key) or {}:
            if res.startswith("nvidia.com/"):
                raise _engine_error(
                    engine, f"resources.{key}.{res}: set GPUs with gpus/gpu_memory_percent instead"
                )
    resources["limits"] = {**(resources.get("limits") or {}), **limits}
    env = []
    if engine.get("cuda_disable_control"):
        env.append({"name": "CUDA_DISABLE_CONTROL", "value": "true"})
    for key, value in (engine.get("env") or {}).items():
        if not ENV_NAME_RE.match(str(key)):
            raise _engine_error(engine, f"env {key!r} is not a valid environment variable name")
        env.append({"name": str(key), "value": str(value)})
    container = {"name": "engine", "image": engine["image"]}
    for key in ("command", "args"):
        if engine.get(key) is not None:
            if not isinstance(engine[key], list):
                raise _engine_error(engine, f"{key} must be a list of strings")
            container[key] = [str(a) for a in engine[key]]
    if env:
        container["env"] = env
    port = engine.get("port")
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise _engine_error(engine, f"port must be a TCP port number, not {port!r}")
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        if engine.get("readiness_path"):
            probe = {"httpGet": {"path": engine["readiness_path"], "port": "http"}}
        else:
            probe = {"tcpSocket": {"port": "http"}}
        container["readinessProbe"] = {**probe, "periodSeconds": 10, "failureThreshold": 3}
    container["resources"] = resources
    return container


def engine_manifests(engine, cards, percent, cores):
    """The Deployment (and Service when a port is served) for one engine."""
    name, ns = engine["name"], engine.get("namespace", "default")
    replicas = engine.get("replicas", 1)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": _labels(name)},
        "spec": {
            "replicas": replicas,
            # A rolling update would start the new pod beside the old one and ask for the card share twice.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
            "template": {
                "metadata": {
                    "labels": _labels(name),
                    "annotations": {"nvidia.com/use-gpuuuid": ",".join(cards)},
                },
                "spec": {
                    "runtimeClassName": "nvidia",
                    "containers": [_container(engine, cards, percent, cores)],
                },
            },
        },
    }
    docs = [deployment]
    if engine.get("port") is not None:
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": ns, "labels": _labels(name)},
                "spec": {
                    "type": "ClusterIP",
                    "selector": {"app.kubernetes.io/name": name},
                    "ports": [
                        {"name": "http", "port": engine["port"], "targetPort": "http", "protocol": "TCP"}
                    ],
                },
            }
        )
    return docs


def dump_documents(docs, header):
    body = yaml.safe_dump_all(docs, default_flow_style=False, sort_keys=False, explicit_start=True)
    return f"# {header}\n{body}"


def plan(engines, gpus_by_node, k3s_version=None):
    """Check the engines against the nodes' GPU facts and return the plan.

    `gpus_by_node` maps an inventory host to its GPU facts (the `gpus` list of gpulab_gpu_facts). The result
    has `engines` in start order (each with `name`, `namespace`, `node`, `cards`, `manifest` text, `wait_ready`
    and `after`, the earlier engines it shares a card with) and `cards`, each card's total share in percent.
    With `k3s_version` every object is validated against that release's schema. Raises PlanError.
    """
    if not isinstance(engines, list):
        raise PlanError(f"workloads_engines must be a list, not {type(engines).__name__}")
    seen, planned, usage = set(), [], {}
    for engine in engines:
        if not isinstance(engine, dict):
            raise PlanError(f"workloads_engines items must be maps, not {engine!r}")
        unknown = sorted(set(engine) - set(ENGINE_KEYS))
        if unknown:
            raise _engine_error(
                engine, f"unknown key(s) {', '.join(unknown)}; known: {', '.join(ENGINE_KEYS)}"
            )
        for key in ("name", "image", "node"):
            if not engine.get(key) or not isinstance(engine[key], str):
                raise _engine_error(engine, f"{key} is required ({ENGINE_KEYS[key]})")
        if not NAME_RE.match(engine["name"]):
            raise _engine_error(engine, "name must be a DNS label (lower case, digits, '-', at most 63)")
        key = (engine.get("namespace", "default"), engine["name"])
        if key in seen:
            raise _engine_error(engine, "the same name appears twice in one namespace")
        seen.add(key)
        if engine["node"] not in gpus_by_node:
            raise _engine_error(
                engine,
                f"node {engine['node']!r} has no GPU facts; GPU nodes: {', '.join(sorted(gpus_by_node)) or 'none'} "
                "(run the guests stage on it first)",
            )
        replicas = engine.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise _engine_error(engine, f"replicas must be 0 or more, not {replicas!r}")
        cards = _cards(engine, gpus_by_node[engine["node"]])
        percent = _percent(engine, "gpu_memory_percent", 100)
        cores = _percent(engine, "gpu_cores", None)
        for uuid in cards:
            usage.setdefault(uuid, []).append((engine["name"], percent * replicas))
        docs = engine_manifests(engine, cards, percent, cores)
        if k3s_version is not None:
            for doc in docs:
                validate_manifest(doc, k3s_version)
        planned.append(
            {
                "name": engine["name"],
                "namespace": key[0],
                "node": engine["node"],
                "cards": cards,
                "gpu_memory_percent": percent,
                "manifest": dump_documents(
                    docs, f"Managed by gpulab (role workloads): engine {engine['name']}"
                ),
            }
        )

    over = {uuid: users for uuid, users in usage.items() if sum(p for _, p in users) > 100}
    if over:
        lines = [
            f"{uuid}: {' + '.join(f'{n} {p}%' for n, p in users)} = {sum(p for _, p in users)}%"
            for uuid, users in over.items()
        ]
        raise PlanError(
            "cards above 100 % of their memory (lower gpu_memory_percent or move an engine): "
            + "; ".join(lines)
        )

    # Inventory order is the start order; an engine waits for the earlier ones that share a card with it, and
    # an engine is waited for (Ready before the next starts) when a later one shares a card with it.
    for i, item in enumerate(planned):
        item["after"] = [p["name"] for p in planned[:i] if set(p["cards"]) & set(item["cards"])]
        item["wait_ready"] = any(set(p["cards"]) & set(item["cards"]) for p in planned[i + 1 :])
    return {"engines": planned, "cards": {u: sum(p for _, p in users) for u, users in usage.items()}}
