"""GPU engines from the inventory as Kubernetes objects for HAMi, and the order to start them in.

An engine (one item of the inventory's `workloads_engines`) names its GPU node and the cards it wants, by
index in that node's GPU facts or by UUID. The plan pins those cards by UUID (`nvidia.com/use-gpuuuid`),
asks HAMi for that many cards (`nvidia.com/gpu`) and a share of each (`nvidia.com/gpumem-percentage`), runs
under the `nvidia` RuntimeClass, and sets `CUDA_DISABLE_CONTROL=true` for engines that size their own memory
(vLLM measures free GPU memory at start and would be confused by HAMi-core's limits).

Engines that share a card must start one at a time, each after the previous is Ready, since each measures the
memory left free when it starts. The order is kept by the cluster itself, on every start of a pod (after a
node reboot, an eviction, a reschedule), not only when the manifests are applied: an engine that shares a
card with earlier ones gets an init container (`wait-for-earlier-engines`) that polls each earlier engine's
readiness path through its Service (`http://NAME.NAMESPACE.svc:PORT/PATH`, the check its readiness probe
makes) and ends only when every one answers. The pod stays `Init:0/1`, not Ready, until then. Polling the
engine itself, not the Kubernetes API, needs no ServiceAccount, token or kubectl image, and cannot be fooled
by a pod status the API still shows as Ready right after a reboot: only a running engine answers. An engine
that a later one waits for therefore needs `port` and `readiness_path`. The plan also orders the engines and
marks which ones to wait for at apply time. A plan that puts a card above 100 % of its memory, or shares a
card's cores in a way HAMi's scheduler would leave an engine Pending (an engine asking all 100 cores beside
another, more than 100 in all, or all 100 taken beside an engine asking none), is refused before anything is
applied.

HAMi's share (`nvidia.com/gpumem-percentage`) is enforced by HAMi-core inside the container; with
`cuda_disable_control` it is bookkeeping only, and a vLLM engine would size itself from the whole card
(0.9 of it by default). So a vLLM engine (`kind: vllm`, the default for an image named `*vllm*`) with
HAMi-core off and a share below 100 % gets `--gpu-memory-utilization` equal to its share (45 % -> 0.45). An
explicit `--gpu-memory-utilization` in its `args` (or `command`) is kept when it lies in (0, share]; above its
share it is refused, since vLLM would then take memory HAMi has booked for another engine. With HAMi-core on,
vLLM sees only its share as the card, and its own default applies.

The plan makes every decision as plain data (engine_objects: the claim, the wait, the container, the volume, the
Service); the layout of the objects is the workloads role's template alone (ENGINE_TEMPLATE,
roles/workloads/templates/engine.yaml.j2), which the plan renders (gpulab.k8s.template, as Ansible's template
lookup would) and validates as rendered: the text checked is the text the stage places.
"""

from __future__ import annotations

import ipaddress
import json
import re

import yaml

from gpulab.k8s.template import ROLES_DIR, render
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
    "gpu_cores": "share of each card's compute, 1-100 (default: none for a share of the memory; a whole card "
    "gets all 100 from HAMi's webhook)",
    "cuda_disable_control": "true for engines that size their own GPU memory, such as vLLM: HAMi-core off "
    "(default true for vLLM, false otherwise)",
    "kind": "vllm or other (default vllm for an image whose name contains vllm); a vLLM engine with "
    "cuda_disable_control gets --gpu-memory-utilization from its share",
    "namespace": "namespace (default default)",
    "replicas": "copies, each taking the share again (default 1)",
    "command": "container command (list)",
    "args": "container arguments (list)",
    "env": "extra environment (map)",
    "port": "TCP port served; adds a ClusterIP Service and a readiness probe",
    "readiness_path": "HTTP path for the readiness probe (default: a TCP check on port); needed with port when "
    "a later engine shares a card with this one (it waits until this path answers)",
    "resources": "CPU/memory requests and limits (Kubernetes resources map without the GPU keys)",
    "lan": "true: reachable from the LAN (needs port): a LoadBalancer Service, served by k3s' ServiceLB on the "
    "engine's node address, or at lan_address when given (default false)",
    "lan_address": "fixed LAN address kube-vip announces for the engine (with lan; on the router's subnet, outside "
    "its DHCP pool, used by nothing else); default: the engine's node address (ServiceLB)",
    "lan_port": "TCP port on the LAN (with lan; default port)",
    "model_cache_size": "keep the model cache on a volume of that size on the engine's node (k3s' local-path "
    "provisioner), e.g. 50Gi, mounted at the image's Hugging Face cache: a restart downloads nothing",
    "model_cache_path": "keep the model cache in this folder of the node instead (hostPath), mounted at the "
    "image's Hugging Face cache",
    "hf_token": "true: the engine gets HF_TOKEN from the Secret the stage makes from workloads_hf_token (vault), "
    "for gated models (default false)",
}


KINDS = ("vllm", "other")
#: the one layout of an engine's objects: the role's template, which the plan renders (render_manifest)
ENGINE_TEMPLATE = ROLES_DIR / "workloads" / "templates" / "engine.yaml.j2"
#: where the engine's image keeps its Hugging Face cache (vllm/vllm-openai runs as root, HF_HOME unset)
HF_CACHE = "/root/.cache/huggingface"
#: the Secret holding the Hugging Face token (key HF_TOKEN_KEY), made by the stage from workloads_hf_token
HF_TOKEN_SECRET = "gpulab-hf-token"
HF_TOKEN_KEY = "token"
#: k3s' packaged local-path provisioner's StorageClass
LOCAL_PATH_CLASS = "local-path"
#: kube-vip's LoadBalancer class and the annotation that names the address it announces for a Service
KUBE_VIP_CLASS = "kube-vip.io/kube-vip-class"
KUBE_VIP_ADDRESS = "kube-vip.io/loadbalancerIPs"
QUANTITY_RE = re.compile(r"^(?P<n>[0-9]+(?:\.[0-9]+)?)(?:Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
#: vLLM's flag for the fraction of the whole card's memory it takes (its default is 0.9)
VLLM_MEMORY_FLAG = "--gpu-memory-utilization"
#: the image of the init container that waits for the earlier engines on a card (busybox: sh, sleep, wget)
WAIT_IMAGE = "busybox:1.37.0"
WAIT_CONTAINER = "wait-for-earlier-engines"
# Each URL in GPULAB_WAIT_FOR in turn, until it answers 2xx (busybox wget exits non-zero otherwise).
WAIT_SCRIPT = """\
for url in $GPULAB_WAIT_FOR; do
  echo "waiting until $url answers: an earlier engine on the same card must be Ready first"
  until wget -q -T 5 -O /dev/null "$url"; do sleep 5; done
  echo "$url answers"
done
"""


class PlanError(ValueError):
    """The engines cannot be planned as given; the message says which engine, what and how to fix it.

    `why` is what is wrong, `fix` how to mend it when that is not already said in `why` (None), and `value`
    the engine or cards concerned: preflight (gpulab.labdef) shows the three as one problem of the lab
    definition, the stage as one message."""

    def __init__(self, why, fix=None, value=None):
        self.why, self.fix, self.value = why, fix, value
        super().__init__(why if fix is None else f"{why}. Fix: {fix}")


def _engine_error(engine, what):
    name = engine.get("name", "?")
    return PlanError(f"workloads_engines item {name!r}: {what}", value=name)


def _percent(engine, key, default):
    value = engine.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100:
        raise _engine_error(engine, f"{key} must be a whole number from 1 to 100, not {value!r}")
    return value


def _cards(engine, node_gpus, any_uuid=False):
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
                    f"card index {ref} does not exist on {engine['node']}, which has {len(known)} card(s): "
                    f"indexes 0-{len(known) - 1} in the order of its GPUs (vm_gpu)",
                )
            uuid = known[ref]
        elif isinstance(ref, str) and UUID_RE.match(ref):
            if ref not in known and not any_uuid:
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


def _kind(engine):
    """`vllm` or `other`: the engine's own `kind`, else vllm for an image whose name (not its registry or tag)
    contains vllm, such as vllm/vllm-openai:v0.11.0."""
    kind = engine.get("kind")
    if kind is None:
        name = engine["image"].split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
        return "vllm" if "vllm" in name.lower() else "other"
    if kind not in KINDS:
        raise _engine_error(engine, f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return kind


def _hami_core_off(engine, kind):
    """Whether HAMi-core is off in the engine (CUDA_DISABLE_CONTROL): its own setting, by default on for vLLM."""
    value = engine.get("cuda_disable_control", kind == "vllm")
    if not isinstance(value, bool):
        raise _engine_error(engine, f"cuda_disable_control must be true or false, not {value!r}")
    return value


def _given_utilization(engine):
    """The --gpu-memory-utilization value the engine's command or args already give, else None."""
    words = [
        str(w)
        for key in ("command", "args")
        for w in (engine.get(key) or [])
        if isinstance(w, (str, int, float))
    ]
    for i, word in enumerate(words):
        if word == VLLM_MEMORY_FLAG:
            if i + 1 == len(words):
                raise _engine_error(engine, f"{VLLM_MEMORY_FLAG} in args has no value")
            return words[i + 1]
        if word.startswith(VLLM_MEMORY_FLAG + "="):
            return word.split("=", 1)[1]
    return None


def _memory_utilization(engine, kind, percent, core_off):
    """The --gpu-memory-utilization to add to a vLLM engine's args, or None.

    With HAMi-core off the share is bookkeeping only and vLLM sizes itself from the whole card, so it is told
    its share (45 % -> "0.45"); a whole card (100 %) keeps vLLM's own default. With HAMi-core on, vLLM sees
    only its share as the card and nothing is added. A value the engine gives itself is kept, but must lie in
    (0, 1] and, with HAMi-core off, not above the share.
    """
    if kind != "vllm":
        return None
    limit = percent / 100 if core_off else 1.0
    given = _given_utilization(engine)
    if given is not None:
        try:
            value = float(given)
        except ValueError:
            value = None
        if value is None or not 0 < value <= 1:
            raise _engine_error(
                engine, f"{VLLM_MEMORY_FLAG} must be a fraction above 0 and at most 1, not {given!r}"
            )
        if value > limit + 1e-9:
            raise _engine_error(
                engine,
                f"{VLLM_MEMORY_FLAG} {given} is above the engine's share ({percent} % of the card, at most "
                f"{limit:.2f}): with HAMi-core off (cuda_disable_control) vLLM would take memory booked for "
                f"other engines; lower it, or leave it out and it is set from gpu_memory_percent",
            )
        return None
    if not core_off or percent >= 100:
        return None
    return f"{percent / 100:.2f}"


def hami_cores(percent, cores):
    """The cores one copy of an engine holds on each of its cards, as HAMi's scheduler counts them.

    gpu_cores when set; otherwise HAMi's webhook gives a container that asks for a whole card (no
    nvidia.com/gpumem or gpumem-percentage, or 100 %) nvidia.com/gpucores 100, the card to itself, and a share
    of the memory asks for no cores (defaultExclusiveCoreIfNeeded, pkg/device/nvidia/device.go@v2.10.0, the
    same at v2.9.0).
    """
    if cores is not None:
        return cores
    return 100 if percent >= 100 else 0


#: how to mend a card whose engines ask for more than its memory (memory_problem)
MEMORY_FIX = "lower gpu_memory_percent so the engines on a card add up to 100 or less, or move an engine to another card"
#: how to mend a card whose cores HAMi cannot share as asked (core_problem)
CORES_FIX = (
    "give the engines on such a card gpu_cores shares that add up to at most 100 (below 100 when an engine without "
    "gpu_cores shares the card, or give it a share too), or move an engine to another card; an engine asking all "
    "100 cores needs a card of its own"
)


def memory_problem(card, users):
    """Why the engines `users` (engine name, percent of the card's memory, counted once per copy) do not fit on
    `card`, or None. HAMi books each share of a card's memory (nvidia.com/gpumem-percentage) and places a pod only
    where the rest is free, so the shares on one card add up to 100 at most. The one statement of this rule: the
    stage's plan and preflight (gpulab.labdef) both ask it."""
    total = sum(p for _, p in users)
    if total <= 100:
        return None
    return f"{card}: {' + '.join(f'{n} {p}%' for n, p in users)} = {total}% of its memory, more than the card has"


def core_problem(uuid, users):
    """Why HAMi's Fit (pkg/device/nvidia/device.go@v2.10.0) would leave one of `users` (engine name, cores per
    copy) Pending on card `uuid` in some start order, or None. A card has 100 cores. An engine asking all 100
    gets only a card nobody else holds (ExclusiveDeviceAllocateConflict), one asking none is not placed on a
    card whose cores are all taken (CardComputeUnitsExhausted), and the cores asked must fit
    (CardInsufficientCore). Engines start one at a time, but after a reschedule in any order, so every order
    must fit."""
    if len(users) < 2:
        return None
    total = sum(c for _, c in users)
    shares = " + ".join(f"{n} {c}" for n, c in users)
    whole = sorted({n for n, c in users if c >= 100})
    if whole:
        return (
            f"{uuid}: {', '.join(whole)} ask(s) all 100 cores, which HAMi gives only on a card no other pod "
            f"holds, but the card is shared ({shares} cores): ExclusiveDeviceAllocateConflict"
        )
    if total > 100:
        return f"{uuid}: {shares} = {total} cores, more than the card's 100: CardInsufficientCore"
    none = sorted({n for n, c in users if c == 0})
    if total == 100 and none:
        return (
            f"{uuid}: {shares} = all 100 cores, and {', '.join(none)} (no gpu_cores) cannot be placed on a card "
            "whose cores are all taken: CardComputeUnitsExhausted"
        )
    return None


def _bool(engine, key):
    value = engine.get(key, False)
    if not isinstance(value, bool):
        raise _engine_error(engine, f"{key} must be true or false, not {value!r}")
    return value


def lan_settings(engine):
    """Where the engine answers on the LAN: {"address": lan_address or None (its node's address, ServiceLB),
    "port": lan_port or port}, or None when it is not on the LAN. Raises PlanError."""
    if not _bool(engine, "lan"):
        extra = [k for k in ("lan_address", "lan_port") if engine.get(k) is not None]
        if extra:
            raise _engine_error(engine, f"{', '.join(extra)} without lan: true; add lan: true or remove them")
        return None
    if engine.get("port") is None:
        raise _engine_error(engine, "lan: true needs port, the engine's own TCP port (vLLM: 8000)")
    port = engine.get("lan_port", engine["port"])
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise _engine_error(engine, f"lan_port must be a TCP port number, not {port!r}")
    address = engine.get("lan_address")
    if address is not None:
        try:
            address = str(ipaddress.IPv4Address(str(address)))
        except ValueError:
            raise _engine_error(engine, f"lan_address must be an IPv4 address, not {address!r}") from None
    return {"address": address, "port": port}


def cache_settings(engine):
    """The engine's model cache volume: {"size": ...} (a local-path claim), {"path": ...} (a node folder) or None."""
    size, path = engine.get("model_cache_size"), engine.get("model_cache_path")
    if size is not None and path is not None:
        raise _engine_error(engine, "model_cache_size and model_cache_path both set; keep one")
    if size is not None:
        m = QUANTITY_RE.match(str(size))
        if isinstance(size, bool) or not m or float(m["n"]) <= 0:
            raise _engine_error(engine, f"model_cache_size must be a size such as 50Gi, not {size!r}")
        return {"size": str(size)}
    if path is not None:
        if not isinstance(path, str) or not path.startswith("/") or path.rstrip("/") == "":
            raise _engine_error(
                engine, f"model_cache_path must be an absolute folder of the node, not {path!r}"
            )
        return {"path": path}
    return None


def readiness_url(engine):
    """Where a later engine on the same card polls this one: its Service, at its readiness path."""
    ns = engine.get("namespace", "default")
    path = engine["readiness_path"]
    lan = lan_settings(engine)
    port = engine["port"] if lan is None else lan["port"]  # the Service's port (lan_port on the LAN)
    return f"http://{engine['name']}.{ns}.svc:{port}{path if path.startswith('/') else '/' + path}"


def _resources(engine, cards, percent, cores):
    """The container's resources: the engine's own (requests, limits: maps of quantities) and the GPU limits."""
    limits = {"nvidia.com/gpu": len(cards)}
    if percent is not None and percent < 100:
        limits["nvidia.com/gpumem-percentage"] = percent
    if cores is not None:
        limits["nvidia.com/gpucores"] = cores
    given = engine.get("resources") or {}
    if not isinstance(given, dict):
        raise _engine_error(engine, f"resources must be a map of requests and limits, not {given!r}")
    resources = {}
    for key, values in given.items():
        if key not in ("limits", "requests") or not isinstance(values or {}, dict):
            raise _engine_error(
                engine, f"resources.{key}: only requests and limits, each a map of quantities, are supported"
            )
        for res, quantity in (values or {}).items():
            if str(res).startswith("nvidia.com/"):
                raise _engine_error(
                    engine, f"resources.{key}.{res}: set GPUs with gpus/gpu_memory_percent instead"
                )
            if isinstance(quantity, (dict, list)):
                raise _engine_error(engine, f"resources.{key}.{res} must be a quantity, not {quantity!r}")
        resources[key] = dict(values or {})
    resources["limits"] = {**resources.get("limits", {}), **limits}
    return resources


def _env(engine, core_off):
    """The container's environment, in order: CUDA_DISABLE_CONTROL, the engine's own, HF_TOKEN from the Secret."""
    env = []
    if core_off:
        env.append({"name": "CUDA_DISABLE_CONTROL", "value": "true"})
    for key, value in (engine.get("env") or {}).items():
        if not ENV_NAME_RE.match(str(key)):
            raise _engine_error(engine, f"env {key!r} is not a valid environment variable name")
        env.append({"name": str(key), "value": str(value)})
    if _bool(engine, "hf_token"):
        env.append({"name": "HF_TOKEN", "secret": {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY}})
    return env


def _container(engine, cards, percent, cores, core_off=False, utilization=None):
    """The engine container's data: image, command and args (with the --gpu-memory-utilization added), env, the
    model cache's mount, port and readiness probe, resources."""
    words = {}
    for key in ("command", "args"):
        if engine.get(key) is not None:
            if not isinstance(engine[key], list):
                raise _engine_error(engine, f"{key} must be a list of strings")
            words[key] = [str(a) for a in engine[key]]
    if utilization is not None:
        words["args"] = [*words.get("args", []), VLLM_MEMORY_FLAG, utilization]
    port = engine.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535):
        raise _engine_error(engine, f"port must be a TCP port number, not {port!r}")
    return {
        "image": engine["image"],
        "command": words.get("command"),
        "args": words.get("args"),
        "env": _env(engine, core_off),
        "cache_mount": HF_CACHE if cache_settings(engine) is not None else None,
        "port": port,
        "readiness_path": (engine.get("readiness_path") or None) if port is not None else None,
        "resources": _resources(engine, cards, percent, cores),
    }


def _service(engine):
    """The engine's Service: ClusterIP, or with lan a LoadBalancer (k3s' ServiceLB on the node's address, or
    kube-vip's class at lan_address), whose port (lan_port on the LAN) goes to the engine's port."""
    lan = lan_settings(engine)
    if lan is None:
        return {"type": "ClusterIP", "port": engine["port"], "kube_vip": None}
    kube_vip = None
    if lan["address"] is not None:  # ServiceLB leaves a Service with a class to kube-vip
        kube_vip = {"annotation": KUBE_VIP_ADDRESS, "address": lan["address"], "class": KUBE_VIP_CLASS}
    return {"type": "LoadBalancer", "port": lan["port"], "kube_vip": kube_vip}


def engine_objects(
    engine, cards, percent, cores, *, core_off=False, utilization=None, waits=(), wait_image=WAIT_IMAGE
):
    """What the engine's objects hold, as plain data for the template (ENGINE_TEMPLATE) to lay out: its
    Deployment (the init container when it waits, the cache volume), its model cache claim when sized, its
    Service when it serves a port. Every decision is made here; raises PlanError.

    `waits` are the readiness URLs of the earlier engines on its cards: the pod's init container polls them
    on every start. `utilization` is the --gpu-memory-utilization added to its args.
    """
    name = engine["name"]
    cache = cache_settings(engine)
    volume = None
    if cache is not None:
        volume = {"claim": f"{name}-model-cache"} if "size" in cache else {"host_path": cache["path"]}
    return {
        "name": name,
        "namespace": engine.get("namespace", "default"),
        "replicas": engine.get("replicas", 1),
        "cards": ",".join(cards),
        "claim": (
            {"name": volume["claim"], "size": cache["size"], "storage_class": LOCAL_PATH_CLASS}
            if volume is not None and "claim" in volume
            else None
        ),
        "wait": (
            {"name": WAIT_CONTAINER, "image": wait_image, "script": WAIT_SCRIPT, "urls": " ".join(waits)}
            if waits
            else None
        ),
        "container": _container(engine, cards, percent, cores, core_off, utilization),
        "volume": volume,
        "service": _service(engine) if engine.get("port") is not None else None,
    }


def render_manifest(objects, template=None):
    """The engine's manifest text: ENGINE_TEMPLATE (or the `template` file) rendered from `objects`
    (engine_objects), as the role's template lookup would render it."""
    return render(
        ENGINE_TEMPLATE if template is None else template, {"workloads_engine": {"objects": objects}}
    )


def manifest_documents(text):
    """The objects of a manifest text, as the schema validation reads them."""
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def lan_endpoint(item, addresses):
    """A LAN engine's endpoint: address (lan_address, else its node's address from `addresses`), port and the
    OpenAI-compatible base URL; None for an engine not on the LAN."""
    lan = item["lan"]
    if lan is None:
        return None
    address = lan["address"] or (addresses or {}).get(item["node"])
    url = f"http://{address}:{lan['port']}/v1" if address else None
    return {"address": address, "port": lan["port"], "url": url, "kube_vip": lan["address"] is not None}


def plan(
    engines, gpus_by_node, k3s_version=None, wait_image=None, *, any_uuid=False, addresses=None, template=None
):
    """Check the engines against the nodes' GPU facts and return the plan.

    `gpus_by_node` maps an inventory host to its GPU facts (the `gpus` list of gpu_facts). The result has
    `engines` in start order (each with `name`, `namespace`, `node`, `cards`, `objects`, the plain data of its
    objects (engine_objects), `manifest`, the text the template (`template`, default ENGINE_TEMPLATE) lays out
    from them and the stage places, `wait_ready`, `after`, the earlier engines it shares a card with,
    `waits_for`, the readiness URLs its init container polls, and `gpu_memory_utilization`, the value added to
    a vLLM engine's args or None) and `cards`, each card's total share in percent. With `k3s_version` every
    object of that very text is validated against that release's schema; `wait_image` is the init container's
    image (default WAIT_IMAGE). With `any_uuid` a card named by a UUID the facts do not list is taken as a
    card of its own (the lab definition, before the guests stage, knows how many cards a node has but not
    their UUIDs). `addresses` maps a node to its LAN address: a LAN engine's `lan` gives its address, port and
    URL (None for the others). Raises PlanError.
    """
    if not isinstance(engines, list):
        raise PlanError(f"workloads_engines must be a list, not {type(engines).__name__}")
    wait_image = WAIT_IMAGE if wait_image is None else wait_image
    if not isinstance(wait_image, str) or not wait_image.strip():
        raise PlanError(f"the wait container's image must be an image name, not {wait_image!r}")
    seen, planned, usage, compute = set(), [], {}, {}
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
        if engine.get("readiness_path") is not None and not isinstance(engine["readiness_path"], str):
            raise _engine_error(
                engine, f"readiness_path must be an HTTP path, not {engine['readiness_path']!r}"
            )
        cards = _cards(engine, gpus_by_node[engine["node"]], any_uuid)
        percent = _percent(engine, "gpu_memory_percent", 100)
        cores = _percent(engine, "gpu_cores", None)
        kind = _kind(engine)
        core_off = _hami_core_off(engine, kind)
        if core_off and replicas > 1:
            raise _engine_error(
                engine,
                f"replicas {replicas} with HAMi-core off (cuda_disable_control): the copies would start at once "
                "on the same card and each count the others' memory as free; list each copy as an engine of "
                "its own (each then waits for the one before)",
            )
        utilization = _memory_utilization(engine, kind, percent, core_off)
        lan = lan_settings(engine)
        cache_settings(engine)
        _bool(engine, "hf_token")
        for uuid in cards:
            usage.setdefault(uuid, []).append((engine["name"], percent * replicas))
            compute.setdefault(uuid, []).extend([(engine["name"], hami_cores(percent, cores))] * replicas)
        planned.append(
            {
                "engine": engine,
                "name": engine["name"],
                "namespace": key[0],
                "node": engine["node"],
                "cards": cards,
                "gpu_memory_percent": percent,
                "gpu_cores": cores,
                "core_off": core_off,
                "gpu_memory_utilization": utilization,
                "lan": lan,
            }
        )

    over = {uuid: p for uuid, users in usage.items() if (p := memory_problem(uuid, users))}
    if over:
        raise PlanError(
            "cards above 100 % of their memory: " + "; ".join(over.values()), MEMORY_FIX, sorted(over)
        )

    cores = {uuid: p for uuid, users in compute.items() if (p := core_problem(uuid, users))}
    if cores:
        raise PlanError(
            "cards whose compute HAMi's scheduler cannot share this way (it would leave an engine Pending): "
            + "; ".join(cores.values()),
            CORES_FIX,
            sorted(cores),
        )

    # Inventory order is the start order; an engine waits for the earlier ones that share a card with it (at
    # apply, and on every start through its init container), and an engine is waited for (Ready before the
    # next starts) when a later one shares a card with it. An engine with no copies is never Ready: nobody
    # waits for it.
    result = []
    for i, item in enumerate(planned):
        earlier = [p for p in planned[:i] if set(p["cards"]) & set(item["cards"])]
        waited = [p for p in earlier if p["engine"].get("replicas", 1) > 0]
        for p in waited:
            if p["engine"].get("port") is None or not p["engine"].get("readiness_path"):
                raise _engine_error(
                    p["engine"],
                    f"shares a card with the later engine {item['name']!r}, which waits on every start until "
                    f"this one answers its readiness path: give it port and readiness_path (vLLM: /health)",
                )
        waits = [readiness_url(p["engine"]) for p in waited]
        objects = engine_objects(
            item["engine"],
            item["cards"],
            item["gpu_memory_percent"],
            item["gpu_cores"],
            core_off=item["core_off"],
            utilization=item["gpu_memory_utilization"],
            waits=waits,
            wait_image=wait_image,
        )
        manifest = render_manifest(objects, template)
        if k3s_version is not None:
            for doc in manifest_documents(manifest):
                validate_manifest(doc, k3s_version)
        result.append(
            {
                "name": item["name"],
                "namespace": item["namespace"],
                "node": item["node"],
                "cards": item["cards"],
                "gpu_memory_percent": item["gpu_memory_percent"],
                "gpu_memory_utilization": item["gpu_memory_utilization"],
                "objects": objects,
                "manifest": manifest,
                "after": [p["name"] for p in earlier],
                "waits_for": waits,
                "wait_ready": any(set(p["cards"]) & set(item["cards"]) for p in planned[i + 1 :]),
                "lan": lan_endpoint(item, addresses),
                "hf_token": bool(item["engine"].get("hf_token")),
            }
        )
    return {"engines": result, "cards": {u: sum(p for _, p in users) for u, users in usage.items()}}


def definition_gpus(cards_by_node):
    """GPU facts as the lab definition knows them before any guest runs: each node's cards (vm_gpu, in order),
    named `<node> card <index>` where the stage has the UUIDs nvidia-smi reports."""
    return {
        node: [{"uuid": f"{node} card {i}"} for i in range(count)] for node, count in cards_by_node.items()
    }


def check_engines(engines, cards_by_node, k3s_version=None, wait_image=None):
    """Every rule of the stage's plan on the engines as the lab definition gives them, before anything changes:
    the same function (`plan`) on the cards each GPU VM has (`cards_by_node`: node -> how many). Returns the
    PlanError the stage would raise, or None. The engines are copied as plain data first (an inventory's
    strings are subclasses of str that YAML's safe dumper refuses; the stage gets them as module arguments)."""
    engines = json.loads(json.dumps(engines, default=str))
    try:
        plan(engines, definition_gpus(cards_by_node), k3s_version, wait_image, any_uuid=True)
    except PlanError as err:
        return err
    except ValueError as err:  # ManifestError, or a k3s_version that names no Kubernetes release
        return PlanError(f"the engines' manifests are not valid Kubernetes objects: {err}")
    return None
