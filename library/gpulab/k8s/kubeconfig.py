"""The cluster's admin kubeconfig on the controller: k3s' own, merged into the user's file under the lab's name.

k3s writes its admin kubeconfig on each server (``/etc/rancher/k3s/k3s.yaml``): one cluster, one user and one
context, all named ``default``, the server URL the loopback address. `merge()` takes that text, points its
cluster at the registration address and puts its three entries into the user's kubeconfig (``~/.kube/config``
or another) under the lab's name, replacing only the entries of that name: the user's other clusters, users and
contexts stay as they were, in their order. ``current-context`` is set to the lab's context only when the file
has none (a new file); a user who chose another context keeps it (``kubectl --context LAB`` reaches the lab).

The result is YAML in a fixed order (the same input gives the same text, so a second run changes nothing).
The text holds the cluster's credentials: callers never print it (no_log in Ansible).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

#: the keys of k3s' kubeconfig that carry its cluster and admin user
ENTRY_LISTS = ("clusters", "users", "contexts")


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be read or merged; the message names the file's part and how to fix it."""


def _load(text: str, what: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(text or "") or {}
    except yaml.YAMLError as exc:
        # the parser's position only: the text itself holds credentials
        where = getattr(exc, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise KubeconfigError(f"{what} is not YAML{at}: fix or move the file, then run again") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(
            f"{what} is not a kubeconfig (a mapping with kind: Config): fix or move the file"
        )
    for key in ENTRY_LISTS:
        if doc.get(key) is not None and not isinstance(doc[key], list):
            raise KubeconfigError(f"{what}: {key} is not a list: fix or move the file")
    return doc


def _only(doc: Mapping[str, Any], key: str, inner: str) -> dict[str, Any]:
    """The one entry of k3s' kubeconfig under `key` (its `inner` mapping)."""
    entries = doc.get(key) or []
    if len(entries) != 1 or not isinstance((entries[0] or {}).get(inner), dict):
        raise KubeconfigError(
            f"the server's k3s.yaml has {len(entries)} {key}, not one: is k3s running there?"
        )
    return dict(entries[0][inner])


def cluster_entries(k3s_yaml: str, name: str, server: str) -> dict[str, dict[str, Any]]:
    """The cluster, user and context of k3s' kubeconfig, named `name`, the cluster's URL `server`."""
    doc = _load(k3s_yaml, "the server's k3s.yaml")
    cluster = _only(doc, "clusters", "cluster")
    user = _only(doc, "users", "user")
    if not cluster.get("certificate-authority-data"):
        raise KubeconfigError(
            "the server's k3s.yaml has no certificate-authority-data: is k3s running there?"
        )
    cluster["server"] = server
    return {
        "clusters": {"name": name, "cluster": cluster},
        "users": {"name": name, "user": user},
        "contexts": {"name": name, "context": {"cluster": name, "user": name}},
    }


def merge(existing: str | None, k3s_yaml: str, name: str, server: str) -> str:
    """The user's kubeconfig `existing` ('' or None: none yet) with the lab's entries, named `name`, from k3s'
    kubeconfig `k3s_yaml`, its server URL `server`. Only the entries named `name` are replaced (in place) or
    added (at the end); everything else is kept."""
    if not name:
        raise KubeconfigError("gpulab_lab_name is empty: the kubeconfig's context needs a name")
    doc = _load(existing or "", "the kubeconfig on the controller")
    entries = cluster_entries(k3s_yaml, name, server)
    doc.setdefault("apiVersion", "v1")
    doc.setdefault("kind", "Config")
    for key in ENTRY_LISTS:
        items = [i for i in doc.get(key) or [] if isinstance(i, dict)]
        at = next((n for n, i in enumerate(items) if i.get("name") == name), None)
        if at is None:
            items.append(entries[key])
        else:
            items[at] = entries[key]
            items = items[: at + 1] + [i for i in items[at + 1 :] if i.get("name") != name]
        doc[key] = items
    if not doc.get("current-context"):
        doc["current-context"] = name
    doc.setdefault("preferences", {})
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def context_summary(text: str, name: str) -> dict[str, Any]:
    """What the kubeconfig `text` says of the lab's context `name`, without credentials: its server URL and
    whether it is the current context (for messages and the lab table)."""
    doc = _load(text, "the kubeconfig")
    cluster = next((c.get("cluster") or {} for c in doc.get("clusters") or [] if c.get("name") == name), {})
    return {"context": name, "server": cluster.get("server"), "current": doc.get("current-context") == name}
