"""The Kubernetes API of the k3s stand-in, as a real kubectl reads it: discovery, list and get of the cluster
state's objects in Kubernetes' JSON shapes, node events and pod logs.

What each behaviour is taken from, and its test, is in library/labsim/UPSTREAM.md (## Kubernetes API for a
real kubectl). :func:`answer` is pure: (method, path with query, Accept header, cluster state) to (HTTP status,
JSON body, or text for a log). The discovery is the legacy one (``/api``, ``/apis``, one resource list per
group version); a client that asks for aggregated discovery gets it too, as Kubernetes answers such a client
that also accepts ``application/json``. Lists and gets answer a ``Table`` (meta.k8s.io/v1) for nodes and pods
when the client asks for one (kubectl get), else the objects; other kinds are the objects only (kubectl then
prints them itself). Only reads: writes stay the stand-in's own (``k3s kubectl``).
"""

import hashlib
import time
import urllib.parse

from .cluster import node_object, pod_object, pod_status
from .common import version

CORE = [
    # (name, kind, namespaced, verbs, short names)
    ("nodes", "Node", False, ["get", "list"], ["no"]),
    ("pods", "Pod", True, ["get", "list"], ["po"]),
    ("pods/log", "Pod", True, ["get"], []),
    ("events", "Event", True, ["list"], ["ev"]),
    ("namespaces", "Namespace", False, ["get", "list"], ["ns"]),
]
GROUPS = {
    "apps/v1": [
        ("deployments", "Deployment", True, ["get", "list"], ["deploy"]),
        ("daemonsets", "DaemonSet", True, ["get", "list"], ["ds"]),
    ],
    "node.k8s.io/v1": [("runtimeclasses", "RuntimeClass", False, ["get", "list"], [])],
    "coordination.k8s.io/v1": [("leases", "Lease", True, ["get", "list"], [])],
}
NODE_LEASE_NAMESPACE = "kube-node-lease"


def _iso(ts):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def uid(*parts):
    """A stable uid for an object of the model (Kubernetes' are random UUIDs, kept for the object's life)."""
    h = hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def status(code, reason, message, details=None):
    """A meta/v1 Status, as the API server answers an error."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code, **({"details": details} if details else {})}  # fmt: skip


def not_found(resource, name, group=""):
    what = f"{resource}.{group}" if group else resource
    return 404, status(404, "NotFound", f'{what} "{name}" not found', {"name": name, "kind": resource})


def resource_list(group_version, resources):
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {"name": name, "singularName": "" if "/" in name else kind.lower(), "namespaced": namespaced,
             "kind": kind, "verbs": verbs, **({"shortNames": short} if short else {})}
            for name, kind, namespaced, verbs, short in resources
        ],
    }  # fmt: skip


def group_list():
    groups = []
    for gv in GROUPS:
        group, ver = gv.split("/")
        entry = {"groupVersion": gv, "version": ver}
        groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def version_info():
    v = version()
    major, minor = v.lstrip("v").split(".")[:2]
    return {"major": major, "minor": minor, "gitVersion": v, "gitCommit": "0000000a", "gitTreeState": "clean",
            "buildDate": "2025-09-10T00:00:00Z", "goVersion": "go1.24.6", "compiler": "gc",
            "platform": "linux/amd64"}  # fmt: skip


def age(created, now):
    """kubectl's AGE: the largest unit and, below ten of it, the next (5m12s, 3h4m, 2d)."""
    s = max(0, int(now - created))
    if s < 120:
        return f"{s}s"
    m, h, d = s // 60, s // 3600, s // 86400
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if d < 2:
        return f"{h}h"
    return f"{d}d"


def _created(ts_text):
    try:
        return time.mktime(time.strptime(ts_text, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    except (TypeError, ValueError):
        return time.time()


# --- the objects of the cluster state ----------------------------------------------------------------------


def nodes(state):
    out = {}
    for name, node in sorted(state.get("nodes", {}).items()):
        obj = node_object(name, node)
        obj["metadata"]["uid"] = uid("node", name)
        obj["metadata"]["resourceVersion"] = str(int(node.get("heartbeat", 0)))
        out[name] = obj
    return out


def _pod_model(state):
    return [*state.get("pods", []), *state.get("direct_pods", {}).values()]


def pods(state):
    """namespace/name -> Pod, with what kubectl's printers and describe read beside the model's parts."""
    addresses = {n: v.get("address") for n, v in state.get("nodes", {}).items()}
    out = {}
    for p in _pod_model(state):
        obj = pod_object({**p, "status": pod_status(p)})
        meta = obj["metadata"]
        meta["uid"] = uid("pod", p["namespace"], p["name"], p.get("created"))
        meta["creationTimestamp"] = _iso(p.get("created") or time.time())
        if p.get("node"):
            obj["status"]["hostIP"] = addresses.get(p["node"])
        if p.get("started") is not None:
            obj["status"]["startTime"] = _iso(p["started"])
        out[f"{p['namespace']}/{p['name']}"] = obj
    return out


def events(state):
    """The node events describe lists: the kubelet's Starting and NodeReady for each node's start."""
    out = []
    for name, node in sorted(state.get("nodes", {}).items()):
        when = _iso(node.get("started_at") or _created(node.get("created")))
        for reason, message in (("Starting", "Starting kubelet."),
                                ("NodeReady", f"Node {name} status is now: NodeReady")):  # fmt: skip
            out.append({
                "apiVersion": "v1", "kind": "Event", "type": "Normal", "reason": reason, "message": message,
                "metadata": {"name": f"{name}.{reason.lower()}", "namespace": "default", "uid": uid("ev", name, reason)},
                "involvedObject": {"kind": "Node", "name": name, "uid": name, "apiVersion": "v1"},
                "source": {"component": "kubelet", "host": name}, "reportingComponent": "kubelet",
                "reportingInstance": name, "firstTimestamp": when, "lastTimestamp": when, "count": 1,
            })  # fmt: skip
    return out


def leases(state):
    """Each node's heartbeat Lease in kube-node-lease, held by the node and renewed with its heartbeat."""
    return {
        f"{NODE_LEASE_NAMESPACE}/{name}": {
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": NODE_LEASE_NAMESPACE, "uid": uid("lease", name)},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40,
                     "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(node.get("heartbeat", 0)))},
        }
        for name, node in sorted(state.get("nodes", {}).items())
    }  # fmt: skip


def namespaces(state):
    names = {"default", "kube-system", "kube-public", "kube-node-lease"}
    names |= {p["namespace"] for p in _pod_model(state)}
    return {
        n: {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n, "uid": uid("ns", n)},
            "status": {"phase": "Active"}}
        for n in sorted(names)
    }  # fmt: skip


# --- selectors ---------------------------------------------------------------------------------------------


def _get(obj, dotted):
    for part in dotted.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return "" if obj is None else str(obj)


def selected(obj, label_selector, field_selector):
    """Whether `obj` matches `key=value`, `key!=value` and `key` terms (labels) and `a.b=value` (fields)."""
    for term in [t for t in (label_selector or "").split(",") if t]:
        labels = obj.get("metadata", {}).get("labels") or {}
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    for term in [t for t in (field_selector or "").split(",") if t]:
        if "!=" in term:
            k, v = term.split("!=", 1)
            if _get(obj, k) == v:
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if _get(obj, k) != v:
                return False
    return True


# --- tables (kubectl get asks for them) ----------------------------------------------------------------------

COLUMN_DOC = {"Name": "Name must be unique within a namespace.", "Age": "CreationTimestamp of the object."}


def _columns(specs):
    return [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": COLUMN_DOC.get(n, ""),
             "priority": p} for n, t, p in specs]  # fmt: skip


def node_row(obj, now):
    labels = obj["metadata"]["labels"]
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    ready = next((c for c in obj["status"]["conditions"] if c["type"] == "Ready"), {})
    state = "Ready" if ready.get("status") == "True" else "NotReady"
    if obj["spec"].get("unschedulable"):
        state += ",SchedulingDisabled"
    info = obj["status"]["nodeInfo"]
    ip = next((a["address"] for a in obj["status"]["addresses"] if a["type"] == "InternalIP"), "<none>")
    return [obj["metadata"]["name"], state, ",".join(roles) or "<none>",
            age(_created(obj["metadata"]["creationTimestamp"]), now), info["kubeletVersion"], ip, "<none>",
            info["osImage"], "6.8.0-generic", info["containerRuntimeVersion"]]  # fmt: skip


NODE_COLUMNS = _columns([("Name", "string", 0), ("Status", "string", 0), ("Roles", "string", 0),
                         ("Age", "string", 0), ("Version", "string", 0), ("Internal-IP", "string", 1),
                         ("External-IP", "string", 1), ("OS-Image", "string", 1), ("Kernel-Version", "string", 1),
                         ("Container-Runtime", "string", 1)])  # fmt: skip


def pod_row(obj, now):
    statuses = obj["status"].get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(s.get("restartCount", 0) for s in statuses)
    phase_text = _pod_status_text(obj)
    return [obj["metadata"]["name"], f"{ready}/{len(statuses)}", phase_text, restarts,
            age(_created(obj["metadata"]["creationTimestamp"]), now), obj["status"].get("podIP", "<none>"),
            obj["spec"].get("nodeName") or "<none>", "<none>", "<none>"]  # fmt: skip


def _pod_status_text(obj):
    st = obj["status"]
    if st.get("phase") == "Failed":
        return st.get("reason") or "Error"
    if not obj["spec"].get("nodeName"):
        return "Pending"
    inits = st.get("initContainerStatuses") or []
    done = sum(1 for s in inits if "terminated" in (s.get("state") or {}))
    if done < len(inits):
        return f"Init:{done}/{len(inits)}"
    return "Running" if st.get("phase") == "Running" else "PodInitializing"


POD_COLUMNS = _columns([("Name", "string", 0), ("Ready", "string", 0), ("Status", "string", 0),
                        ("Restarts", "string", 0), ("Age", "string", 0), ("IP", "string", 1),
                        ("Node", "string", 1), ("Nominated Node", "string", 1), ("Readiness Gates", "string", 1)])  # fmt: skip
TABLES = {"nodes": (NODE_COLUMNS, node_row), "pods": (POD_COLUMNS, pod_row)}


def table(resource, items, now):
    columns, row = TABLES[resource]
    rows = [{"cells": row(o, now), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                               "metadata": o["metadata"]}} for o in items]  # fmt: skip
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": "1"},
            "columnDefinitions": columns, "rows": rows}  # fmt: skip


def wants_table(accept):
    return "as=Table" in (accept or "")


# --- pod logs ------------------------------------------------------------------------------------------------


def pod_log(state, namespace, name, container):
    """(status, text or a Status) of ``GET .../pods/NAME/log``: the stand-in runs no image, so a container logs
    nothing but what nvidia-smi prints for a ``--query-gpu=memory.total`` command (module hami)."""
    pod = next((p for p in _pod_model(state) if p["name"] == name and p["namespace"] == namespace), None)
    if pod is None:
        return not_found("pods", name)
    names = pod.get("containers") or []
    container = container or (names[0] if names else "")
    if container not in names:
        message = f"container {container} is not valid for pod {name}"
        return 400, status(400, "BadRequest", message)
    if pod.get("started") is None:
        message = f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
        return 400, status(400, "BadRequest", message)
    lines = []
    for c in (pod.get("spec") or {}).get("containers") or []:
        if c.get("name") != container:
            continue
        words = " ".join([*(c.get("command") or []), *(c.get("args") or [])])
        if "nvidia-smi" in words and "memory.total" in words:
            lines += [str(m) if "nounits" in words else f"{m} MiB" for m in pod.get("visible_mib") or []]
    return 200, "".join(f"{line}\n" for line in lines)


# --- the routes --------------------------------------------------------------------------------------------


def _listing(list_kind, api_version, items, resource, accept, now, query):
    items = [o for o in items if selected(o, query.get("labelSelector"), query.get("fieldSelector"))]
    if wants_table(accept) and resource in TABLES:
        return 200, table(resource, items, now)
    return 200, {
        "kind": list_kind,
        "apiVersion": api_version,
        "metadata": {"resourceVersion": "1"},
        "items": items,
    }


def _one(obj, resource, accept, now):
    if wants_table(accept) and resource in TABLES:
        return 200, table(resource, [obj], now)
    return 200, obj


def collections(state):
    """(group/version, resource) -> (namespaced, key -> object, list kind)."""
    return {
        ("v1", "nodes"): (False, nodes(state), "NodeList"),
        ("v1", "pods"): (True, pods(state), "PodList"),
        ("v1", "namespaces"): (False, namespaces(state), "NamespaceList"),
        ("v1", "events"): (True, {f"{e['metadata']['namespace']}/{e['metadata']['name']}": e for e in events(state)},
                           "EventList"),
        ("apps/v1", "deployments"): (True, dict(state.get("deployment_objects") or {}), "DeploymentList"),
        ("apps/v1", "daemonsets"): (True, {f"{d['metadata'].get('namespace', 'default')}/{d['metadata']['name']}": d
                                           for d in state.get("daemonsets") or []}, "DaemonSetList"),
        ("node.k8s.io/v1", "runtimeclasses"): (False, dict(state.get("runtimeclasses") or {}), "RuntimeClassList"),
        ("coordination.k8s.io/v1", "leases"): (True, leases(state), "LeaseList"),
    }  # fmt: skip


def answer(method, target, accept, state, now=None):
    """(HTTP status, body) of one request of the Kubernetes API: a dict (JSON) or a str (a log's text)."""
    now = time.time() if now is None else now
    url = urllib.parse.urlsplit(target)
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
    parts = [p for p in url.path.split("/") if p]
    if method != "GET":
        return 405, status(405, "MethodNotAllowed", "the gpulab lab's k3s answers reads only on this API")
    if parts == ["version"]:
        return 200, version_info()
    if parts == ["api"]:
        return 200, {"kind": "APIVersions", "versions": ["v1"],
                     "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}  # fmt: skip
    if parts == ["apis"]:
        return 200, group_list()
    if parts == ["api", "v1"]:
        return 200, resource_list("v1", CORE)
    if len(parts) == 3 and parts[0] == "apis" and "/".join(parts[1:]) in GROUPS:
        return 200, resource_list("/".join(parts[1:]), GROUPS["/".join(parts[1:])])
    if parts[:1] == ["api"] and parts[1:2] == ["v1"]:
        gv, rest = "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        gv, rest = "/".join(parts[1:3]), parts[3:]
    else:
        return 404, status(404, "NotFound", "the server could not find the requested resource")
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return 404, status(404, "NotFound", "the server could not find the requested resource")
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), (rest[2] if len(rest) > 2 else None)
    group = gv.split("/")[0] if "/" in gv else ""
    if (gv, resource) == ("v1", "pods") and sub == "log" and namespace:
        return pod_log(state, namespace, name, query.get("container"))
    found = collections(state).get((gv, resource))
    if found is None or sub is not None:
        if name:
            return not_found(resource, name, group)
        return 404, status(404, "NotFound", "the server could not find the requested resource")
    namespaced, objects, list_kind = found
    if name is None:
        items = [o for key, o in objects.items()
                 if not namespaced or namespace is None or key.split("/", 1)[0] == namespace]  # fmt: skip
        return _listing(list_kind, gv, items, resource, accept, now, query)
    key = f"{namespace or 'default'}/{name}" if namespaced else name
    if key not in objects:
        return not_found(resource, name, group)
    return _one(objects[key], resource, accept, now)
