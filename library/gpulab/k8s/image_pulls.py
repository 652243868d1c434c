"""Pods whose images cannot be pulled, named with the kubelet's reason and what fixes it.

The kubelet puts a container that waits for its image in state ``waiting`` with reason ``ErrImagePull`` (the pull
failed; the message is the container runtime's error) and, while it backs off before the next try,
``ImagePullBackOff`` (``Back-off pulling image "IMAGE"``, since Kubernetes 1.33 followed by the last error)
(kubernetes/kubernetes pkg/kubelet/images/image_manager.go: EnsureImageExists, evalCRIPullErr). containerd's
error carries the registry's answer: ``429 Too Many Requests - Server message: toomanyrequests: ...`` (Docker
Hub's pull rate limit), ``not found``, ``401 Unauthorized`` / ``pull access denied``.

A stage that waits for pods (hami, workloads, monitoring) reads them at each look and stops at the first such
container instead of waiting out its timeout: none of these causes goes away within the wait.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# The kubelet's waiting reasons of a container whose image is not there (pkg/kubelet/images/types.go).
PULL_REASONS = (
    "ErrImagePull",
    "ImagePullBackOff",
    "RegistryUnavailable",
    "InvalidImageName",
    "ErrImageNeverPull",
)

RATE_LIMIT = "rate limit"
NOT_FOUND = "not found"
UNAUTHORIZED = "unauthorized"
OTHER = "pull failed"

_CAUSES = {
    RATE_LIMIT: (
        "the registry refuses more pulls (429 Too Many Requests, toomanyrequests: Docker Hub allows anonymous "
        "pulls only a few times an hour per address, and every node behind one router shares it)"
    ),
    NOT_FOUND: "the registry has no such image or tag (not found)",
    UNAUTHORIZED: "the registry refuses the pull without credentials or with these ones (unauthorized)",
    OTHER: "the image could not be pulled",
}

_FIXES = {
    RATE_LIMIT: (
        "give the nodes a registry mirror or Docker Hub credentials in k3s_registries (k3s' registries.yaml, "
        "written on every node by stage k3s; docs/getting-started.md 'Registries and pull limits'), or take HAMi's images from "
        "a registry you choose with hami_image_registry; then run the stage again (the limit also lifts within "
        "an hour)"
    ),
    NOT_FOUND: (
        "check the image's name and tag (the role variable that names it), and a mirror's rewrite in "
        "k3s_registries if one applies to this registry"
    ),
    UNAUTHORIZED: (
        "give the registry's credentials in k3s_registries (configs.<registry>.auth, the secrets from the vault), "
        "or use a registry that serves the image without login (hami_image_registry for HAMi's images)"
    ),
    OTHER: (
        "read the message; a mirror or credentials go in k3s_registries, another registry for HAMi's images in "
        "hami_image_registry"
    ),
}


def cause_of(message: str) -> str:
    """The kind of failure a kubelet/containerd pull message tells (RATE_LIMIT, NOT_FOUND, UNAUTHORIZED, OTHER)."""
    text = message.lower()
    if "toomanyrequests" in text or "429 too many requests" in text or "rate limit" in text:
        return RATE_LIMIT
    if (
        "401 unauthorized" in text
        or "unauthorized" in text
        or "pull access denied" in text
        or "denied" in text
    ):
        return UNAUTHORIZED
    if "not found" in text or "manifest unknown" in text:
        return NOT_FOUND
    return OTHER


def _containers(pod: Mapping[str, Any]) -> Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """(status, spec) of each init container and container of a pod."""
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    for specs_key, status_key in (
        ("initContainers", "initContainerStatuses"),
        ("containers", "containerStatuses"),
    ):
        by_name = {c.get("name"): c for c in spec.get(specs_key) or [] if isinstance(c, Mapping)}
        for st in status.get(status_key) or []:
            if isinstance(st, Mapping):
                yield st, by_name.get(st.get("name"), {})


def pull_failures(pods_doc: Mapping[str, Any] | Sequence[Any] | None) -> list[dict[str, Any]]:
    """Every container that waits for an image it cannot pull: namespace, pod, container, node, image, the
    kubelet's reason and message, and the cause (RATE_LIMIT, NOT_FOUND, UNAUTHORIZED, OTHER)."""
    items = pods_doc.get("items") or [] if isinstance(pods_doc, Mapping) else list(pods_doc or [])
    found = []
    for pod in items:
        if not isinstance(pod, Mapping):
            continue
        meta = pod.get("metadata") or {}
        for st, spec in _containers(pod):
            waiting = (st.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in PULL_REASONS:
                continue
            message = str(waiting.get("message") or "")
            found.append(
                {
                    "namespace": meta.get("namespace") or "default",
                    "pod": meta.get("name"),
                    "container": st.get("name"),
                    "node": (pod.get("spec") or {}).get("nodeName"),
                    "image": spec.get("image") or st.get("image") or "",
                    "reason": reason,
                    "message": message,
                    "cause": cause_of(message),
                }
            )
    return found


def problems(
    pods_doc: Mapping[str, Any] | Sequence[Any] | None, namespaces: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The pull failures (of the pods in `namespaces`, or all) as the stages' problems (host, field, value,
    cause, fix; waiting cannot cure them)."""
    wanted = None if namespaces is None else set(namespaces)
    out = []
    for f in pull_failures(pods_doc):
        if wanted is not None and f["namespace"] not in wanted:
            continue
        said = f"{f['reason']}: {f['message']}" if f["message"] else f["reason"]
        out.append(
            {
                "host": f["node"] or "(not placed)",
                "field": f"pod {f['namespace']}/{f['pod']} container {f['container']} image",
                "value": f["image"],
                "cause": f"{_CAUSES[f['cause']]}; the kubelet says {said}",
                "fix": _FIXES[f["cause"]],
                "wait": False,
            }
        )
    return out


def problems_text(found: Sequence[Mapping[str, Any]]) -> str:
    """One line per problem: where, the image, the kubelet's reason and message, and the fix."""
    return " ".join(
        f"[{i}] {p['host']}: {p['field']} = {p['value']}: {p['cause']}. Fix: {p['fix']}."
        for i, p in enumerate(found, 1)
    )


def _split(look: str) -> tuple[Mapping[str, Any] | None, str]:
    """(the pulls document, the rest of the look): the look starts with `{"pulls": <kubectl get pods -o json>}`,
    which kubectl prints over many lines; (None, the look) when it does not."""
    text = (look or "").lstrip()
    if not text.startswith('{"pulls"'):
        return None, look or ""
    try:
        doc, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None, look or ""
    return (doc if isinstance(doc, Mapping) else None), text[end:].lstrip()


def from_look(look: str, namespaces: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The problems of a stage's look: the document it starts with, `{"pulls": <kubectl get pods -o json>}` (what
    follows is the stage's own document), of the pods in `namespaces` (or all); none when the look has no such
    document."""
    doc, _ = _split(look)
    return [] if doc is None else problems(doc.get("pulls"), namespaces)


def rest_of_look(look: str) -> str:
    """The look without its pulls document: the stage's own document, as its checks read it."""
    return _split(look)[1]
