"""Image pulls on the k3s stand-in: where containerd pulls an image from (registries.yaml), and registries that
answer like Docker Hub, 429 ``toomanyrequests`` once a source address used up its anonymous pulls.

* k3s reads ``/etc/rancher/k3s/registries.yaml`` when it starts (server and agent) and generates containerd's
  registry hosts from it (docs.k3s.io/installation/private-registry; rancher/wharfie pkg/registries types). The
  node sends what it read with its registration; a change is seen at the next start only.
* An image reference is normalised as containerd's reference.ParseDockerRef does: a first component with a ``.``
  or ``:`` (or ``localhost``, or capitals) is the registry (``index.docker.io`` is docker.io), else ``docker.io``;
  a single name under docker.io gets ``library/``; no tag is ``latest`` (distribution/reference normalize.go,
  splitDockerDomain).
* The registry's endpoints, in order: the ``endpoint`` list of its mirror (the registry host, else ``*``), with the
  mirror's ``rewrite`` applied to the repository, then the registry's default endpoint
  (``https://registry-1.docker.io`` for docker.io, ``https://<registry>`` for the others) without rewrites
  (k3s' docs, "Default Endpoint Fallback"). containerd tries the next endpoint when one answers with an error and,
  when all fail, reports the first error of the highest kind, an error status over a 404 (containerd
  core/remotes/docker/resolver.go, Resolve: firstErr, firstErrPriority).
* A registry's answer: every endpoint serves every image, except a registry that the lab's knob file
  (``KNOB``, JSON ``{"<endpoint host>": {"limit": N}}``) limits: from the N+1st anonymous pull of the lab (all
  nodes share the router's one address), it answers the manifest GET ``429 Too Many Requests`` with Docker Hub's
  body ``toomanyrequests: You have reached your unauthenticated pull rate limit.
  https://www.docker.com/increase-rate-limit`` (docs.docker.com/docker-hub/usage: limits per IPv4 address for
  unauthenticated pulls; a pull is a manifest GET). A pull with credentials for that host (registries.yaml
  ``configs.<host>.auth``) is not limited. ``"missing": [repository, ...]`` in the knob makes a repository
  answer 404 (``not found``).
* The kubelet shows a failed pull as the container's waiting reason ``ErrImagePull`` with the runtime's error, then
  ``ImagePullBackOff`` with ``Back-off pulling image "IMAGE": ErrImagePull: <that error>`` until the back-off
  (10 s, doubled each time, at most 300 s) lets it try again (kubernetes pkg/kubelet/images/image_manager.go:
  EnsureImageExists, evalCRIPullErr, prevPullErrMsg; pkg/kubelet/kubelet.go backOffPeriod/MaxContainerBackOff).
  An image a node pulled once stays on it and is not pulled again. The back-off lives in the kubelet's memory: a
  restart of the node's k3s forgets it and the next step pulls again (with the registries.yaml read at that start).
"""

import hashlib
import json
import re
import time

from .common import read_text

REGISTRIES = "/etc/rancher/k3s/registries.yaml"
KNOB = "/var/lib/gpulab-sim/registry.json"
DEFAULT_REGISTRY = "docker.io"
DEFAULT_ENDPOINTS = {"docker.io": "https://registry-1.docker.io"}
BACKOFF_S, MAX_BACKOFF_S = 10, 300
PULLS_KEPT = 500
TOO_MANY = "toomanyrequests: You have reached your unauthenticated pull rate limit. https://www.docker.com/increase-rate-limit"


def load_registries(path=REGISTRIES):
    """registries.yaml as k3s reads it at start ({} when absent or unreadable)."""
    text = read_text(path)
    if text is None:
        return {}
    try:
        import yaml

        doc = yaml.safe_load(text)
    except Exception:
        return {}
    return doc if isinstance(doc, dict) else {}


def load_knob(path=None):
    try:
        with open(path or KNOB) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def normalize(image):
    """(registry, repository, reference, full name) of an image as containerd names it."""
    name, _, digest = image.partition("@")
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost" or first.lower() != first):
        registry, remainder = ("docker.io" if first == "index.docker.io" else first), rest
    else:
        registry, remainder = DEFAULT_REGISTRY, name
    tag = ""
    if ":" in remainder.rsplit("/", 1)[-1]:
        remainder, tag = remainder.rsplit(":", 1)
    if registry == DEFAULT_REGISTRY and "/" not in remainder:
        remainder = f"library/{remainder}"
    reference = digest or tag or "latest"
    full = f"{registry}/{remainder}" + (f"@{digest}" if digest else f":{reference}")
    return registry, remainder, reference, full


def endpoints(registries, registry):
    """[(endpoint URL, rewrites)] containerd tries for `registry`: its mirror's (or "*"'s), then the default."""
    mirrors = registries.get("mirrors") or {}
    mirror = mirrors.get(registry) or mirrors.get("*") or {}
    rewrites = mirror.get("rewrite") or {}
    out = [(str(url).rstrip("/"), rewrites) for url in mirror.get("endpoint") or []]
    default = DEFAULT_ENDPOINTS.get(registry, f"https://{registry}")
    if default not in [u for u, _ in out]:
        out.append((default, {}))
    return out


def rewrite(repository, rewrites):
    """The repository after the first rewrite that changes it (patterns in sorted order)."""
    for pattern in sorted(rewrites):
        try:
            new = re.sub(pattern, re.sub(r"\$(\d+)", r"\\\1", str(rewrites[pattern])), repository)
        except re.error:
            continue  # k3s warns and skips a pattern that does not compile
        if new != repository:
            return new
    return repository


def _host(url):
    return url.split("://", 1)[-1].split("/", 1)[0]


def _authenticated(registries, host):
    auth = ((registries.get("configs") or {}).get(host) or {}).get("auth") or {}
    return bool(auth.get("password") or auth.get("auth") or auth.get("identity_token"))


def pull(state, node, image, registries, knob=None):
    """Pull `image` on `node` through `registries`: None when pulled, else containerd's error (as the kubelet's
    ErrImagePull message shows it). Counts each registry's anonymous pulls and records every try in
    state["pulls"]."""
    knob = load_knob() if knob is None else knob
    registry, repository, reference, full = normalize(image)
    counts = state.setdefault("registry_pulls", {})
    record = state.setdefault("pulls", [])
    first_error, priority = None, 0
    for url, rewrites in endpoints(registries, registry):
        host = _host(url)
        repo = rewrite(repository, rewrites)
        limits = knob.get(host) or {}
        anonymous = not _authenticated(registries, host)
        digest = "sha256:" + hashlib.sha256(f"{repo}:{reference}".encode()).hexdigest()
        entry = {"node": node, "image": image, "endpoint": url, "repository": repo, "at": time.time()}
        if repo in (limits.get("missing") or []):
            error, rank = f'failed to resolve reference "{full}": {full}: not found', 2
            entry["status"] = 404
        elif anonymous and "limit" in limits and counts.get(host, 0) >= int(limits["limit"]):
            error = (
                f"failed to copy: httpReadSeeker: failed open: unexpected status code {url}/v2/{repo}/manifests/"
                f"{digest}: 429 Too Many Requests - Server message: {TOO_MANY}"
            )
            rank = 3
            entry["status"] = 429
        else:
            entry["status"] = 200
            if anonymous:
                counts[host] = counts.get(host, 0) + 1
            record.append(entry)
            del record[:-PULLS_KEPT]
            return None
        record.append(entry)
        del record[:-PULLS_KEPT]
        if rank > priority:  # containerd keeps the first error of the highest kind: a status > 399 over a 404
            first_error, priority = error, rank
    code = "NotFound" if first_error and first_error.endswith(": not found") else "Unknown"
    return f'rpc error: code = {code} desc = failed to pull and unpack image "{full}": {first_error}'


def ensure(state, node_name, pod, container, image, now, knob=None):
    """Whether `container`'s `image` is on the node (pulled now if not, with the kubelet's back-off): True, or
    False with pod["pull"] set to what the kubelet shows (waiting reason and message)."""
    node = state["nodes"].get(node_name) or {}
    present = node.setdefault("images", [])
    if not image or image in present:
        pod.pop("pull", None)
        return True
    held = pod.get("pull")
    if held and held.get("start") != node.get("start"):
        held = None  # the node's k3s (its kubelet) restarted since: its back-off is forgotten, the pull is tried now
    if held and held.get("image") == image and now < held["next"]:
        held.update(
            reason="ImagePullBackOff",
            message=f'Back-off pulling image "{image}": ErrImagePull: {held["error"]}',
        )
        return False
    error = pull(state, node_name, image, node.get("registries") or {}, knob)
    if error is None:
        present.append(image)
        pod.pop("pull", None)
        return True
    backoff = min(held["backoff"] * 2, MAX_BACKOFF_S) if held and held.get("image") == image else BACKOFF_S
    pod["pull"] = {"container": container, "image": image, "reason": "ErrImagePull", "message": error,
                   "error": error, "next": now + backoff, "backoff": backoff, "start": node.get("start")}  # fmt: skip
    return False
