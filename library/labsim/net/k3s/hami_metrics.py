"""HAMi's two Prometheus endpoints on the k3s stand-in: the scheduler's (container port 9395, NodePort 31993 of
Service hami-scheduler) and the device plugin's vGPU monitor (container port 9394, NodePort 31992 of Service
hami-device-plugin-monitor), in Prometheus's text exposition format with HAMi's metric and label names at v2.10.0.
What each is taken from, and its test, is listed in library/labsim/UPSTREAM.md (## HAMi).

* Scheduler (cmd/scheduler/metrics.go@v2.10.0): per card HAMi registered on a node, ``hami_gpu_memory_limit_bytes``,
  ``hami_gpu_core_limit_ratio``, ``hami_gpu_memory_allocated_bytes``, ``hami_gpu_shared_count``,
  ``hami_gpu_core_allocated_ratio``, ``hami_node_gpu_overview`` and ``hami_node_gpu_memory_allocated_ratio``
  (labels node, device_uuid, device_index, device_type, plus device_cores / device_memory_limit where HAMi adds
  them), and per container holding a share ``hami_vgpu_memory_allocated_bytes`` and
  ``hami_vgpu_core_allocated_ratio`` (namespace, node, pod, container_index, device_uuid). Memory is HAMi's MiB
  times 1048576. With the chart's ``legacyMetrics`` the names before 2.9 come too (GPUDeviceMemoryAllocated, ...,
  labels nodeid, deviceuuid, ...).
* vGPU monitor (cmd/vGPUmonitor/metrics.go@v2.10.0): per card of the node ``hami_host_gpu_memory_used_bytes``,
  ``hami_host_gpu_utilization_ratio`` (node, device_index, device_uuid, device_type ``NVIDIA-<name>``) and
  ``hami_host_gpu_memory_controller_utilization_ratio`` (no node label), and per container that HAMi-core
  limits (its shared region exists; a container with ``CUDA_DISABLE_CONTROL=true`` has none)
  ``hami_vgpu_memory_used_bytes``, ``hami_vgpu_memory_limit_bytes``, ``hami_container_device_memory_bytes``,
  ``hami_container_device_utilization_ratio`` and the context/module/buffer sizes (namespace, pod, container,
  vdevice_index, device_uuid). The lab runs no CUDA process, so memory used and utilization are 0; the limit is
  the container's share.
* Both registries wrap HAMi's collector with the constant label ``zone="vGPU"`` and add ``hami_build_info``
  (pkg/metrics/metrics.go@v2.10.0, without zone); families come sorted by name, labels sorted, values as Go's
  ``strconv.FormatFloat(v, 'g', -1, 64)`` writes them (``2.5769803776e+10``), as client_golang's text encoder does.

Standard library only (part of the k3s stand-in's zipapp).
"""

import decimal
import http.server
import json
import math

from .common import serve_in_thread

MIB = 1024 * 1024
ZONE = {"zone": "vGPU"}
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: NodePorts of the two Services (charts/hami/values.yaml@v2.10.0 scheduler.service.monitorPort, devicePlugin.service.httpPort)
SCHEDULER_NODE_PORT = 31993
MONITOR_NODE_PORT = 31992
ALLOCATED = "hami.io/vgpu-devices-allocated"


def go_float(value):
    """`value` as Go's strconv.FormatFloat(value, 'g', -1, 64): the shortest digits, in exponent form when the
    decimal exponent is below -4 or at least 6 (the precision 'g' decides with for the shortest form)."""
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1, value) < 0 else "0"
    sign, digits, exponent = decimal.Decimal(repr(value)).normalize().as_tuple()
    text = "".join(map(str, digits))
    exp = len(digits) + exponent - 1  # the decimal exponent of the first digit
    minus = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{minus}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{minus}0.{'0' * (-exp - 1)}{text}"
    whole = text[: exp + 1].ljust(exp + 1, "0")
    frac = text[exp + 1 :]
    return f"{minus}{whole}{'.' + frac if frac else ''}"


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def exposition(families):
    """Prometheus's text format 0.0.4 of `families` [(name, help, [(labels, value)])]: families by name, each one's
    HELP and TYPE gauge lines, each series' labels sorted by name (client_golang's Gather and text encoder)."""
    lines = []
    for name, help_text, series in sorted(families, key=lambda f: f[0]):
        if not series:
            continue  # a family without a metric is not written
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in series:
            pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
            lines.append(f"{name}{{{pairs}}} {go_float(value)}" if pairs else f"{name} {go_float(value)}")
    return "\n".join(lines) + "\n"


def build_info(version):
    labels = {"version": version, "revision": "unknown", "build_date": "unknown", "go_version": "unknown",
              "compiler": "gc", "platform": "linux/amd64"}  # fmt: skip
    return (
        "hami_build_info",
        "hami build metadata exposed as labels with a constant value of 1.",
        [(labels, 1)],
    )


def decode_allocated(text):
    """`UUID,TYPE,MiB,cores:` per device, `;` after each container: [[device, ...] per container]."""
    containers = []
    parts = (text or "").split(";")
    for part in parts[:-1] if parts[-1] == "" else parts:
        devices = []
        for item in part.split(":"):
            fields = item.split(",")
            if len(fields) == 4 and fields[0]:
                devices.append(
                    {"uuid": fields[0], "type": fields[1], "mem": int(fields[2]), "cores": int(fields[3])}
                )
        containers.append(devices)
    return containers


def holding_pods(pods):
    """The pods HAMi's scheduler counts: bound with an allocation, not ended."""
    return [
        p
        for p in pods
        if p.get("node")
        and p.get("phase") not in ("Failed", "Succeeded")
        and (p.get("annotations") or {}).get(ALLOCATED)
    ]


#: the scheduler's per-card label names, and those of its legacy metrics (before 2.9)
CARD_LABELS = {"node": "node", "uuid": "device_uuid", "index": "device_index", "type": "device_type",
               "cores": "device_cores", "limit": "device_memory_limit"}  # fmt: skip
LEGACY_CARD_LABELS = {"node": "nodeid", "uuid": "deviceuuid", "index": "deviceidx", "type": "devicetype",
                      "cores": "devicecores", "limit": "devicememorylimit"}  # fmt: skip


def _card_series(families, names, node_name, card, used):
    """One card's series of the scheduler's per-card families, labelled with `names` (new or legacy): the
    legacy memory percentage has no device type label."""
    total, cores = int(card.get("devmem", 0)), int(card.get("devcore", 0))
    base = {names["node"]: node_name, names["uuid"]: card["id"], names["index"]: str(card.get("index", 0)),
            names["type"]: card.get("type", "")}  # fmt: skip
    families["limit"][2].append((base, total * MIB))
    families["core_limit"][2].append((base, cores))
    families["allocated"][2].append(({**base, names["cores"]: str(cores)}, used["mem"] * MIB))
    families["shared"][2].append((base, used["count"]))
    families["core_allocated"][2].append((base, used["cores"]))
    families["overview"][2].append(
        ({**base, names["cores"]: str(cores), names["limit"]: str(total)}, used["mem"] * MIB)
    )
    if total > 0:
        ratio = base if names is CARD_LABELS else {k: v for k, v in base.items() if k != names["type"]}
        families["ratio"][2].append((ratio, used["mem"] / total))


#: the scheduler's families: key -> (name, name before 2.9, help) (cmd/scheduler/metrics.go@v2.10.0)
SCHEDULER_FAMILIES = {
    "limit": ("hami_gpu_memory_limit_bytes", "GPUDeviceMemoryLimit", "Device memory limit for a certain GPU"),
    "core_limit": ("hami_gpu_core_limit_ratio", "GPUDeviceCoreLimit", "Device core limit for a certain GPU"),
    "allocated": ("hami_gpu_memory_allocated_bytes", "GPUDeviceMemoryAllocated", "Device memory allocated for a certain GPU"),
    "shared": ("hami_gpu_shared_count", "GPUDeviceSharedNum", "Number of containers sharing this GPU"),
    "core_allocated": ("hami_gpu_core_allocated_ratio", "GPUDeviceCoreAllocated", "Device core allocated for a certain GPU"),
    "overview": ("hami_node_gpu_overview", "nodeGPUOverview", "GPU overview on a certain node"),
    "ratio": ("hami_node_gpu_memory_allocated_ratio", "nodeGPUMemoryPercentage", "GPU Memory Allocated Percentage on a certain GPU"),
    "ctr_mem": ("hami_vgpu_memory_allocated_bytes", "vGPUMemoryAllocated", "vGPU memory allocated from a container"),
    "ctr_core": ("hami_vgpu_core_allocated_ratio", "vGPUCoreAllocated", "vGPU core allocated from a container"),
}  # fmt: skip
#: the vGPU monitor's families (cmd/vGPUmonitor/metrics.go@v2.10.0); None: no legacy name
MONITOR_FAMILIES = {
    "host_mem": ("hami_host_gpu_memory_used_bytes", "HostGPUMemoryUsage", "GPU device memory usage in bytes"),
    "host_util": ("hami_host_gpu_utilization_ratio", "HostCoreUtilization", "GPU core utilization ratio (0-100)"),
    "host_mc": ("hami_host_gpu_memory_controller_utilization_ratio", None, "GPU memory controller utilization ratio (0-100)"),
    "used": ("hami_vgpu_memory_used_bytes", "vGPU_device_memory_usage_in_bytes", "vGPU device memory usage in bytes"),
    "limit": ("hami_vgpu_memory_limit_bytes", "vGPU_device_memory_limit_in_bytes", "vGPU device memory limit in bytes"),
    "ctr_mem": ("hami_container_device_memory_bytes", None, "Container device memory usage in bytes"),
    "ctr_util": ("hami_container_device_utilization_ratio", "Device_utilization_desc_of_container", "Container device SM utilization ratio"),
    "context": ("hami_vgpu_memory_context_bytes", None, "Container device memory context size in bytes"),
    "module": ("hami_vgpu_memory_module_bytes", None, "Container device memory module size in bytes"),
    "buffer": ("hami_vgpu_memory_buffer_bytes", None, "Container device memory buffer size in bytes"),
}  # fmt: skip


def _families(table):
    """Empty families of `table`: (key -> (name, help, series)) with the new names, and with the legacy ones."""
    new = {key: (name, help_text, []) for key, (name, _old, help_text) in table.items()}
    old = {key: (name, help_text, []) for key, (_new, name, help_text) in table.items() if name}
    return new, old


def scheduler_families(nodes, pods, legacy=False, version="v2.10.0"):
    """The scheduler's families from the nodes (name -> node with `hami_register`, the register annotation's JSON)
    and the pods (the stand-in's model: name, namespace, node, phase, annotations)."""
    held = holding_pods(pods)
    used = {}
    for pod in held:
        for devices in decode_allocated(pod["annotations"][ALLOCATED]):
            for d in devices:
                u = used.setdefault(d["uuid"], {"mem": 0, "cores": 0, "count": 0})
                u["mem"] += d["mem"]
                u["cores"] += d["cores"]
                u["count"] += 1
    f, legacy_f = _families(SCHEDULER_FAMILIES)
    for node_name, node in sorted(nodes.items()):
        try:
            cards = json.loads(node.get("hami_register") or "[]")
        except ValueError:
            cards = []
        for card in cards:
            u = used.get(card["id"], {"mem": 0, "cores": 0, "count": 0})
            _card_series(f, CARD_LABELS, node_name, card, u)
            if legacy:
                _card_series(legacy_f, LEGACY_CARD_LABELS, node_name, card, u)
    for pod in held:
        for index, devices in enumerate(decode_allocated(pod["annotations"][ALLOCATED])):
            for d in devices:
                labels = {"namespace": pod.get("namespace", "default"), "node": pod["node"], "pod": pod["name"],
                          "container_index": str(index), "device_uuid": d["uuid"]}  # fmt: skip
                f["ctr_mem"][2].append((labels, d["mem"] * MIB))
                f["ctr_core"][2].append((labels, d["cores"]))
                if legacy:
                    # HAMi passes the new label values to the legacy descriptors, in their order
                    old = {"podnamespace": labels["namespace"], "nodename": labels["node"], "podname": labels["pod"],
                           "containeridx": labels["container_index"], "deviceuuid": labels["device_uuid"]}  # fmt: skip
                    legacy_f["ctr_mem"][2].append((old, d["mem"] * MIB))
                    legacy_f["ctr_core"][2].append((old, d["cores"]))
    out = [(n, h, [({**labels, **ZONE}, v) for labels, v in s]) for n, h, s in f.values()]
    if legacy:
        out += [(n, h, [({**labels, **ZONE}, v) for labels, v in s]) for n, h, s in legacy_f.values()]
    return [*out, build_info(version)]


def hami_core_on(spec):
    """HAMi-core limits a container unless its env sets CUDA_DISABLE_CONTROL=true."""
    return not any(
        e.get("name") == "CUDA_DISABLE_CONTROL" and str(e.get("value")).lower() == "true"
        for c in (spec or {}).get("containers") or []
        for e in c.get("env") or []
    )


#: the vGPU monitor's per-card label names, and those of its legacy metrics
HOST_LABELS = ("node", "device_index", "device_uuid", "device_type")
LEGACY_HOST_LABELS = ("nodeid", "deviceidx", "deviceuuid", "devicetype")


def monitor_families(node_name, cards, pods, legacy=False, version="v2.10.0"):
    """The vGPU monitor's families on node `node_name`: its cards (nvidia-smi's: uuid, name) and the containers
    of its pods that HAMi-core limits."""
    f, legacy_f = _families(MONITOR_FAMILIES)
    for index, card in enumerate(cards):
        values = (node_name, str(index), card["uuid"], "NVIDIA-" + str(card.get("name", "")))
        labels = dict(zip(HOST_LABELS, values, strict=True))
        f["host_mem"][2].append((labels, 0))
        f["host_util"][2].append((labels, 0))
        f["host_mc"][2].append(({k: labels[k] for k in HOST_LABELS[1:]}, 0))
        if legacy:
            old = dict(zip(LEGACY_HOST_LABELS, values, strict=True))
            legacy_f["host_mem"][2].append((old, 0))
            legacy_f["host_util"][2].append((old, 0))
    for pod in holding_pods(pods):
        ann = pod.get("annotations") or {}
        if pod.get("node") != node_name or ann.get("hami.io/vgpu-node", node_name) != node_name:
            continue
        if pod.get("started") is None or not hami_core_on(pod.get("spec")):
            continue  # no process yet, or HAMi-core off: no shared region for the monitor to read
        containers = ((pod.get("spec") or {}).get("containers")) or [{}]
        for index, devices in enumerate(decode_allocated(ann[ALLOCATED])):
            name = (containers[index] if index < len(containers) else {}).get("name", f"c{index}")
            for i, d in enumerate(devices):
                labels = {"namespace": pod.get("namespace", "default"), "pod": pod["name"], "container": name,
                          "vdevice_index": str(i), "device_uuid": d["uuid"]}  # fmt: skip
                for key in ("used", "ctr_mem", "ctr_util", "context", "module", "buffer"):
                    f[key][2].append((labels, 0))
                f["limit"][2].append((labels, d["mem"] * MIB))
                if legacy:
                    old = {"podnamespace": labels["namespace"], "podname": labels["pod"], "ctrname": name,
                           "vdeviceid": str(i), "deviceuuid": d["uuid"]}  # fmt: skip
                    legacy_f["used"][2].append((old, 0))
                    legacy_f["limit"][2].append((old, d["mem"] * MIB))
                    legacy_f["ctr_util"][2].append((old, 0))
    out = [(n, h, [({**labels, **ZONE}, v) for labels, v in s]) for n, h, s in f.values()]
    if legacy:
        out += [(n, h, [({**labels, **ZONE}, v) for labels, v in s]) for n, h, s in legacy_f.values()]
    return [*out, build_info(version)]


def serve(host, port, families):
    """Serve ``GET /metrics`` on host:port from `families()` in a thread (None when the port is taken)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = exposition(families()).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return serve_in_thread(host, port, Handler, "HAMi metrics")
