"""``k3s kubectl`` on the stand-in (a small part of kubectl), one function per verb and kind.

``k3s kubectl`` reaches the server named in the kubeconfig (``KUBECONFIG`` or ``/etc/rancher/k3s/k3s.yaml``):
``get nodes|node|runtimeclass|daemonsets`` (``-o json``, ``-o name``, ``-o jsonpath={.a.b}``, table; several
kinds at once, ``get nodes,runtimeclass -o json``, as one List), ``get pods [NAME] [-n NS|-A] [-l KEY=VALUE]``
(``READY``, ``STATUS`` such as ``Init:0/1``, ``Running`` or a Failed pod's reason, ``RESTARTS``; ``-o json``),
``get endpointslices -l kubernetes.io/service-name=NAME`` (HAMi's webhook Service), ``label node``,
``cordon|uncordon|drain NODE``, ``wait --for=condition=Ready node/NAME``, ``wait --for=condition=complete
job/NAME`` (a HelmChart's install job exists once the server has seen the chart; waiting on one that does not
exist is an immediate NotFound, as with kubectl), ``rollout status deployment|daemonset/NAME`` (waiting up to
``--timeout`` like kubectl); anything else says it is not stood in. Also ``create|apply -f FILE|-`` (Pods,
through HAMi's webhook; also ``--dry-run=server``), ``delete pod(s) NAME|-l SEL``, ``scale deployment/NAME
--replicas=N``, ``get deployment``, ``get service`` (the Services of the monitoring charts), ``get mutatingwebhookconfigurations``, and ``kubectl logs`` of a container
whose command runs ``nvidia-smi --query-gpu=memory.total``, which prints the memory it sees (module ``hami``).
"""

import contextlib
import io
import json
import os
import sys
import time
import urllib.error
import urllib.request

from .cluster import pod_object
from .common import KUBECONFIG, PORT
from .etcd import NO_QUORUM


def api_server():
    """``host:port`` of the server the kubeconfig names (``KUBECONFIG``, else k3s' own kubeconfig)."""
    path = (os.environ.get("KUBECONFIG") or KUBECONFIG).split(":")[0]
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            key, _, value = line.strip().partition(":")
            if key == "server" and "://" in value:
                return value.strip().split("://", 1)[1].rstrip("/")
    return f"127.0.0.1:{PORT}"


def api_get(path):
    server = api_server()
    try:
        with urllib.request.urlopen(f"http://{server}{path}", timeout=5) as resp:
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        if exc.code == 504:  # etcd without a quorum: the API server answers nothing but this
            print(f"Error from server: {NO_QUORUM}", file=sys.stderr)
            sys.exit(1)
        print(
            f"The connection to the server {server} was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        sys.exit(1)
    except OSError:
        print(
            f"The connection to the server {server} was refused - did you specify the right host or port?",
            file=sys.stderr,
        )
        sys.exit(1)


def jsonpath(obj, expr):
    expr = expr.strip()
    if expr.startswith("{") and expr.endswith("}"):
        expr = expr[1:-1]
    for part in [p for p in expr.lstrip(".").split(".") if p]:
        obj = obj.get(part, "") if isinstance(obj, dict) else ""
    return obj if isinstance(obj, str) else json.dumps(obj)


def output(items, kind, fmt, single):
    if fmt == "json":
        print(
            json.dumps(items[0] if single else {"apiVersion": "v1", "items": items, "kind": "List"}, indent=4)
        )
    elif fmt and fmt.startswith("jsonpath="):
        print(" ".join(jsonpath(i, fmt.split("=", 1)[1]) for i in items), end="")
    elif fmt == "name":
        for i in items:
            print(f"{kind}/{i['metadata']['name']}")
    elif kind == "node":
        print(f"{'NAME':<16} {'STATUS':<10} {'ROLES':<22} {'AGE':<5} VERSION")
        for i in items:
            ready = i["status"]["conditions"][0]["status"] == "True"
            roles = ",".join(
                sorted(k.split("/", 1)[1] for k in i["metadata"]["labels"] if k.startswith("node-role"))
            )
            print(
                f"{i['metadata']['name']:<16} {'Ready' if ready else 'NotReady':<10} {roles or '<none>':<22} "
                f"{'1m':<5} {i['status']['nodeInfo']['kubeletVersion']}"
            )
    else:
        print("NAME")
        for i in items:
            print(i["metadata"]["name"])


def duration_s(text):
    """kubectl's --timeout: 30s, 5m, 1h, 1m30s; 0 or no unit means seconds."""
    total, num = 0.0, ""
    for ch in text:
        if ch.isdigit() or ch == ".":
            num += ch
        else:
            total += float(num or 0) * {"s": 1, "m": 60, "h": 3600}.get(ch, 1)
            num = ""
    return total + float(num or 0)


def post(path, body):
    """POST to the server; (reply, None) or (None, the error kubectl prints)."""
    req = urllib.request.Request(
        f"http://{api_server()}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return json.load(resp), None
    except urllib.error.HTTPError as exc:
        if exc.code == 504:
            return None, f"Error from server: {NO_QUORUM}"
        return None, f"Error from server (NotFound): {json.load(exc).get('error')}"
    except OSError:
        return api_get("/none"), "unreachable"


def until(check, timeout_s, interval_s=0.5):
    """Poll check() until it returns true or timeout_s passed (kubectl's waits); its last answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result or time.monotonic() >= deadline:
            return result
        time.sleep(interval_s)


def get_pods(rest, namespace, all_namespaces, selector, fmt):
    """kubectl get pods: the Deployments' pods, a table like kubectl's or -o json / -o name."""
    names = rest[2:] or ([rest[1].split("/", 1)[1]] if "/" in rest[1] else [])
    wanted = dict(p.partition("=")[::2] for p in selector.split(",") if p)
    pods = [
        p
        for p in api_get("/gpulab/pods")
        if (all_namespaces or p["namespace"] == namespace)
        and all(p["labels"].get(k) == v for k, v in wanted.items())
    ]
    by_name = {p["name"]: p for p in pods}
    for n in names:
        if n not in by_name:
            print(f'Error from server (NotFound): pods "{n}" not found', file=sys.stderr)
            return 1
    pods = [by_name[n] for n in names] if names else pods
    if fmt == "json":
        objects = [pod_object(p) for p in pods]
        single = len(names) == 1
        print(
            json.dumps(
                objects[0] if single else {"apiVersion": "v1", "items": objects, "kind": "List"}, indent=4
            )
        )
    elif fmt == "name":
        for p in pods:
            print(f"pod/{p['name']}")
    elif not pods:
        where = "any namespace" if all_namespaces else f"{namespace} namespace"
        print(f"No resources found in {where}.", file=sys.stderr)
    else:
        print(f"{'NAME':<40} {'READY':<7} {'STATUS':<16} {'RESTARTS':<9} AGE")
        for p in pods:
            ready = f"{int(p['ready'] is not None)}/{len(p['containers'])}"
            age = f"{max(0, int(time.time() - p['created']))}s"
            print(f"{p['name']:<40} {ready:<7} {p['status']:<16} {p['restarts']:<9} {age}")
    return 0


def create_pods(filename, namespace, dry_run, fmt):
    """kubectl create|apply -f FILE (or -): Pods, through HAMi's webhook; --dry-run=server keeps nothing."""
    import yaml

    try:
        if filename == "-":
            text = sys.stdin.read()
        else:
            with open(filename) as f:
                text = f.read()
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    docs = [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    for d in docs:
        d.setdefault("metadata", {}).setdefault("namespace", namespace)
    req = urllib.request.Request(
        f"http://{api_server()}/gpulab/pods/create",
        json.dumps({"docs": docs, "dry_run": dry_run}).encode(),
        {"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            pods = json.load(resp)["pods"]
    except urllib.error.HTTPError as exc:
        name = (docs[0].get("metadata") or {}).get("name") if docs else "?"
        print(f'Error from server (InternalError): error when creating "{filename}": {json.load(exc)["error"]}'
              f" (pod {name})", file=sys.stderr)  # fmt: skip
        return 1
    except OSError:
        return api_get("/none") or 1
    if fmt == "json":
        print(json.dumps(pods[0] if len(pods) == 1 else {"kind": "List", "items": pods}, indent=4))
    elif fmt and fmt.startswith("jsonpath="):
        print(" ".join(jsonpath(p, fmt.split("=", 1)[1]) for p in pods), end="")
    else:
        for p in pods:
            print(f"pod/{p['metadata']['name']} created{' (server dry run)' if dry_run else ''}")
    return 0


def pod_logs(name, namespace):
    """kubectl logs: the stand-in runs no image, but a container whose command calls nvidia-smi for
    memory.total prints the memory it sees: its share when HAMi-core is on (HAMi's allocation), else the card."""
    pod = next(
        (p for p in api_get("/gpulab/pods") if p["name"] == name and p["namespace"] == namespace), None
    )
    if pod is None:
        print(f'Error from server (NotFound): pods "{name}" not found', file=sys.stderr)
        return 1
    if pod.get("started") is None:
        container = (pod.get("containers") or ["?"])[0]
        print(f'Error from server (BadRequest): container "{container}" in pod "{name}" is waiting to start: '
              "ContainerCreating", file=sys.stderr)  # fmt: skip
        return 1
    for c in (pod.get("spec") or {}).get("containers") or []:
        words = " ".join([*(c.get("command") or []), *(c.get("args") or [])])
        if "nvidia-smi" in words and "memory.total" in words:
            for mib in pod.get("visible_mib") or []:
                print(mib if "nounits" in words else f"{mib} MiB")
    return 0


class Flags:
    """The flags of one kubectl command line, kubectl's defaults where none is given."""

    def __init__(self):
        self.fmt, self.overwrite, self.namespace = "", False, "default"
        self.timeout_s, self.condition, self.selector, self.all_namespaces = 30.0, "", "", False
        self.filename, self.replicas, self.dry_run, self.ignore_not_found = None, None, False, False


def parse_args(args):
    """(the flags, the other words) of a kubectl command line."""
    flags, rest = Flags(), []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-o", "--output"):
            flags.fmt, i = args[i + 1], i + 2
            continue
        if a.startswith(("-o=", "--output=")):
            flags.fmt = a.split("=", 1)[1]
        elif a.startswith("-o") and len(a) > 2:
            flags.fmt = a[2:]
        elif a in ("-n", "--namespace"):
            flags.namespace = args[i + 1]
            i += 1
        elif a.startswith("--namespace="):
            flags.namespace = a.split("=", 1)[1]
        elif a.startswith("--for="):
            flags.condition = a.split("=", 1)[1]
        elif a.startswith("--timeout="):
            flags.timeout_s = duration_s(a.split("=", 1)[1])
        elif a in ("-f", "--filename"):
            flags.filename = args[i + 1]
            i += 1
        elif a.startswith(("--filename=", "--replicas=", "--dry-run=")):
            key, _, value = a.partition("=")
            if key == "--filename":
                flags.filename = value
            elif key == "--replicas":
                flags.replicas = int(value)
            else:
                flags.dry_run = value == "server"
        elif a.startswith(("--wait=", "--ignore-not-found", "--now")):
            flags.ignore_not_found = flags.ignore_not_found or a.startswith("--ignore-not-found")
        elif a in ("--ignore-daemonsets", "--delete-emptydir-data", "--force") or a.startswith(
            ("--ignore-daemonsets=", "--delete-emptydir-data=", "--force=", "--grace-period=")
        ):
            pass
        elif a == "--overwrite":
            flags.overwrite = True
        elif a in ("-A", "--all-namespaces"):
            flags.all_namespaces = True
        elif a in ("-l", "--selector"):
            flags.selector = args[i + 1]
            i += 1
        elif a.startswith("--selector="):
            flags.selector = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return flags, rest


def named(rest):
    """The names a command gives after its kind: `get pods a b` or `get pod/a`."""
    return rest[2:] or ([rest[1].split("/", 1)[1]] if "/" in rest[1] else [])


def delete_pods(args, rest, flags):
    """kubectl delete pod(s) NAME... | -l SELECTOR (the pods created with kubectl)."""
    names = named(rest)
    wanted = dict(p.partition("=")[::2] for p in flags.selector.split(",") if p)
    reply, err = post(
        "/gpulab/pods/delete", {"namespace": flags.namespace, "names": names, "selector": wanted}
    )
    if err:
        print(err, file=sys.stderr)
        return 1
    if not names and not reply["deleted"]:
        print("No resources found", file=sys.stderr)
    return said_deleted("pod", names, reply["deleted"], flags)


def delete_secrets(args, rest, flags):
    """kubectl delete secret(s) NAME... [--ignore-not-found] (the Secrets the manifests folder made)."""
    names = named(rest)
    reply, err = post("/gpulab/secrets/delete", {"namespace": flags.namespace, "names": names})
    if err:
        print(err, file=sys.stderr)
        return 1
    return said_deleted("secret", names, reply["deleted"], flags)


def said_deleted(kind, names, deleted, flags):
    """kubectl's lines for what a delete removed, and its NotFound for the first name that was not there (exit
    status 1, unless --ignore-not-found)."""
    for n in deleted:
        print(f'{kind} "{n}" deleted')
    missing = [n for n in names if n not in deleted]
    if missing and not flags.ignore_not_found:
        print(f'Error from server (NotFound): {kind}s "{missing[0]}" not found', file=sys.stderr)
        return 1
    return 0


def scale(args, rest, flags):
    """kubectl scale deployment/NAME --replicas=N."""
    kind, _, name = rest[1].partition("/")
    if f"{flags.namespace}/{name}" not in api_get("/gpulab/deployments") or kind not in (
        "deployment",
        "deploy",
    ):
        print(f'Error from server (NotFound): deployments.apps "{name}" not found', file=sys.stderr)
        return 1
    post("/gpulab/scale", {"deployment": f"{flags.namespace}/{name}", "replicas": flags.replicas})
    print(f"deployment.apps/{name} scaled")
    return 0


def logs(args, rest, flags):
    """kubectl logs [pod/]NAME."""
    return pod_logs(rest[1].removeprefix("pod/"), flags.namespace)


def get_list(args, rest, flags):
    """`get nodes,runtimeclass -o json`: one List of every kind named, each item with its own kind."""
    items = []
    for one in rest[1].split(","):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = kubectl([one if a == rest[1] else a for a in args])
        if rc != 0:
            return rc
        items.extend(json.loads(out.getvalue())["items"])
    print(json.dumps({"apiVersion": "v1", "items": items, "kind": "List"}, indent=4))
    return 0


# --- get KIND: each kind's objects by name, its kind for -o name and its resource for NotFound -------------


def nodes(flags):
    return api_get("/gpulab/nodes"), "node", "nodes"


def runtimeclasses(flags):
    return api_get("/gpulab/runtimeclasses"), "runtimeclass.node.k8s.io", "runtimeclasses.node.k8s.io"


def namespaced(path, flags):
    """The objects at the API's `path` ("namespace/name" -> object) in -n's namespace, or all with -A, by name."""
    return {
        key.split("/", 1)[1]: obj
        for key, obj in api_get(path).items()
        if flags.all_namespaces or key.split("/", 1)[0] == flags.namespace
    }


def deployments(flags):
    return namespaced("/gpulab/deployments", flags), "deployment.apps", "deployments.apps"


def services(flags):
    """The Services the stand-in models as objects (HAMi-WebUI's, module monitoring_charts), in -n or -A."""
    return namespaced("/gpulab/services", flags), "service", "services"


def secrets(flags):
    """The Secrets the manifests folder made (names, types and keys, never values), in -n or -A."""
    return namespaced("/gpulab/secrets", flags), "secret", "secrets"


def webhooks(flags):
    return (
        api_get("/gpulab/webhooks"),
        "mutatingwebhookconfiguration.admissionregistration.k8s.io",
        "mutatingwebhookconfigurations.admissionregistration.k8s.io",
    )


def endpointslices(flags):
    """The EndpointSlices of the Services the stand-in models (HAMi's webhook Service, module hami), by -l."""
    wanted = dict(p.partition("=")[::2] for p in flags.selector.split(",") if p)
    items = {
        s["metadata"]["name"]: s
        for s in api_get("/gpulab/endpointslices")
        if (flags.all_namespaces or s["metadata"]["namespace"] == flags.namespace)
        and all(s["metadata"]["labels"].get(k) == v for k, v in wanted.items())
    }
    return items, "endpointslice.discovery.k8s.io", "endpointslices.discovery.k8s.io"


def daemonsets(flags):
    items = {d["metadata"]["name"]: d for d in api_get("/gpulab/daemonsets")}
    return items, "daemonset.apps", "daemonsets.apps"


KINDS = {
    **dict.fromkeys(("node", "nodes", "no"), nodes),
    **dict.fromkeys(("runtimeclass", "runtimeclasses"), runtimeclasses),
    **dict.fromkeys(("deployment", "deployments", "deploy"), deployments),
    **dict.fromkeys(("service", "services", "svc"), services),
    **dict.fromkeys(("secret", "secrets"), secrets),
    **dict.fromkeys(("mutatingwebhookconfiguration", "mutatingwebhookconfigurations"), webhooks),
    **dict.fromkeys(("daemonset", "daemonsets", "ds"), daemonsets),
    **dict.fromkeys(("endpointslice", "endpointslices"), endpointslices),
}


def get(args, rest, flags):
    """kubectl get KIND [NAME...] (a kind of ``KINDS``)."""
    kind = rest[1].split("/", 1)[0].lower()
    names = named(rest)
    objects = KINDS.get(kind)
    if objects is None:
        print(f'error: the server doesn\'t have a resource type "{rest[1]}"', file=sys.stderr)
        return 1
    all_items, kind, resource = objects(flags)
    for n in names:
        if n not in all_items:
            print(f'Error from server (NotFound): {resource} "{n}" not found', file=sys.stderr)
            return 1
    items = [all_items[n] for n in names] if names else list(all_items.values())
    output(items, kind, flags.fmt, single=len(names) == 1)
    return 0


def label_node(args, rest, flags):
    """kubectl label node NAME KEY=VALUE... KEY-... [--overwrite]."""
    node, pairs = rest[2], rest[3:]
    labels = {p.split("=", 1)[0]: p.split("=", 1)[1] if "=" in p else "" for p in pairs}
    body = json.dumps({"node": node, "labels": labels, "overwrite": flags.overwrite}).encode()
    req = urllib.request.Request(
        f"http://{api_server()}/gpulab/label", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            changed = json.load(resp)["changed"]
    except urllib.error.HTTPError as exc:
        print(f"error: {json.load(exc).get('error')}", file=sys.stderr)
        return 1
    except OSError:
        return api_get("/none") or 1
    print(f"node/{node} {'labeled' if changed else 'not labeled'}")
    return 0


def annotate_node(args, rest, flags):
    """kubectl annotate node NAME KEY=VALUE... KEY-... [--overwrite]: `node/NAME annotated`."""
    node, pairs = rest[2], rest[3:]
    annotations = {p.split("=", 1)[0]: p.split("=", 1)[1] if "=" in p else "" for p in pairs}
    _reply, err = post(
        "/gpulab/annotate", {"node": node, "annotations": annotations, "overwrite": flags.overwrite}
    )
    if err:
        print(err.replace("Error from server (NotFound): --overwrite", "error: --overwrite"), file=sys.stderr)
        return 1
    print(f"node/{node} annotated")
    return 0


def cordon(args, rest, flags):
    """kubectl cordon|uncordon|drain NODE."""
    verb, node = rest
    reply, err = post(
        "/gpulab/cordon", {"node": node, "unschedulable": verb != "uncordon", "drain": verb == "drain"}
    )
    if err:
        print(err, file=sys.stderr)
        return 1
    done = {"cordon": "cordoned", "drain": "cordoned", "uncordon": "uncordoned"}[verb]
    print(f"node/{node} {done if reply['changed'] else 'already ' + done}")
    if verb == "drain":
        print(f"node/{node} drained")
    return 0


def wait_node(args, rest, flags):
    """kubectl wait --for=condition=Ready node/NAME."""
    name = rest[1].split("/", 1)[1]
    if flags.condition.lower() != "condition=ready":
        print(f"error: `--for={flags.condition}` on nodes is not stood in", file=sys.stderr)
        return 1
    if name not in api_get("/gpulab/nodes"):
        print(f'Error from server (NotFound): nodes "{name}" not found', file=sys.stderr)
        return 1

    def node_ready():
        node = api_get("/gpulab/nodes").get(name)
        return bool(node) and node["status"]["conditions"][0]["status"] == "True"

    if until(node_ready, flags.timeout_s):
        print(f"node/{name} condition met")
        return 0
    print(f"error: timed out waiting for the condition on nodes/{name}", file=sys.stderr)
    return 1


def wait_job(args, rest, flags):
    """kubectl wait --for=condition=complete job/NAME."""
    name = rest[1].split("/", 1)[1]
    key = f"{flags.namespace}/{name}"

    def job():
        workloads = api_get("/gpulab/workloads")
        return workloads["jobs"].get(key) or ({} if key in workloads.get("jobs_started", []) else None)

    if job() is None:  # like kubectl: a job that does not exist (yet) is an error at once
        print(f'Error from server (NotFound): jobs.batch "{name}" not found', file=sys.stderr)
        return 1
    if until(lambda: (job() or {}).get("complete"), flags.timeout_s):
        print(f"job.batch/{name} condition met")
        return 0
    print(f"error: timed out waiting for the condition on jobs/{name}", file=sys.stderr)
    return 1


def rollout_status(args, rest, flags):
    """kubectl rollout status deployment|daemonset/NAME."""
    kind, _, name = rest[2].partition("/")
    namespace = flags.namespace
    ready = True
    if kind in ("daemonset", "ds"):
        found = any(
            d["metadata"]["name"] == name and d["metadata"]["namespace"] == namespace
            for d in api_get("/gpulab/daemonsets")
        )
        what = "daemon set"
    else:
        # like kubectl, wait up to --timeout for a Deployment that exists to become available
        def deployment():
            return api_get("/gpulab/workloads")["deployments"].get(f"{namespace}/{name}")

        entry = deployment()
        if entry is not None and not entry.get("ready"):
            until(lambda: (deployment() or {}).get("ready"), flags.timeout_s)
            entry = deployment()
        found, ready = entry is not None, bool(entry and entry.get("ready"))
        what = "deployment"
    if found and not ready:
        print(f'Waiting for deployment "{name}" rollout to finish: 0 of 1 updated replicas are available...')
        print("error: timed out waiting for the condition", file=sys.stderr)
        return 1
    if found:
        print(f'{what} "{name}" successfully rolled out')
        return 0
    print(f'Error from server (NotFound): {kind}s.apps "{name}" not found', file=sys.stderr)
    return 1


def _pods_kind(rest):
    return len(rest) >= 2 and rest[1].split("/", 1)[0].lower() in ("pod", "pods", "po")


# (does the command line name it, what runs it), the first that matches runs
COMMANDS = (
    (lambda rest, flags: rest[:1] == ["get"] and _pods_kind(rest),
     lambda args, rest, flags: get_pods(rest, flags.namespace, flags.all_namespaces, flags.selector, flags.fmt)),
    (lambda rest, flags: rest[:1] in (["create"], ["apply"]) and flags.filename,
     lambda args, rest, flags: create_pods(flags.filename, flags.namespace, flags.dry_run, flags.fmt)),
    (lambda rest, flags: rest[:1] == ["delete"] and len(rest) >= 2
     and rest[1].split("/", 1)[0] in ("pod", "pods", "po"), delete_pods),
    (lambda rest, flags: rest[:1] == ["delete"] and len(rest) >= 2
     and rest[1].split("/", 1)[0] in ("secret", "secrets"), delete_secrets),
    (lambda rest, flags: rest[:1] == ["scale"] and len(rest) == 2 and flags.replicas is not None, scale),
    (lambda rest, flags: rest[:1] == ["logs"] and len(rest) == 2, logs),
    (lambda rest, flags: rest[:1] == ["get"] and len(rest) == 2 and "," in rest[1] and flags.fmt == "json",
     get_list),
    (lambda rest, flags: rest[:1] == ["get"] and len(rest) >= 2, get),
    (lambda rest, flags: rest[:2] in (["label", "node"], ["label", "nodes"]) and len(rest) >= 4, label_node),
    (lambda rest, flags: rest[:2] in (["annotate", "node"], ["annotate", "nodes"]) and len(rest) >= 4,
     annotate_node),
    (lambda rest, flags: rest[:1] in (["cordon"], ["uncordon"], ["drain"]) and len(rest) == 2, cordon),
    (lambda rest, flags: rest[:1] == ["wait"] and len(rest) == 2 and rest[1].startswith(("node/", "nodes/")),
     wait_node),
    (lambda rest, flags: rest[:1] == ["wait"] and len(rest) == 2 and rest[1].startswith("job/"), wait_job),
    (lambda rest, flags: rest[:2] == ["rollout", "status"] and len(rest) == 3, rollout_status),
)  # fmt: skip


def kubectl(args):
    flags, rest = parse_args(args)
    for matches, run in COMMANDS:
        if matches(rest, flags):
            return run(args, rest, flags)
    print(f"error: `kubectl {' '.join(args)}` is not stood in by the gpulab lab's k3s", file=sys.stderr)
    return 1
