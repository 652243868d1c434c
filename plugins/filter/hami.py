"""Filters of stage hami: the GPU nodes' problems, parsed in Python from the one kubectl look of each wait.

`hami_look | hami_problems(gpus_by_host, split=..., ...)` takes the text that roles/hami/tasks/verify.yml
prints (`{"nodes": <kubectl get nodes -o json>, "scheduler": <kubectl get deployment ... -o json>}`) and the
guests' GPU facts (and `values=`, the chart values the role rendered: the kube-scheduler tag the HelmChart asks); it
returns the problems of gpulab.k8s.hami_checks (host, field, value, cause, fix, wait).
`problems | hami_problems_text` makes them one message.
"""

from __future__ import annotations

import json

from ansible.errors import AnsibleFilterError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.k8s import hami_checks
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    hami_checks = MissingEngine(err)


def _asked_tag(values):
    """The kube-scheduler tag the rendered chart values set ("" : left to the chart)."""
    image = (((values or {}).get("scheduler") or {}).get("kubeScheduler") or {}).get("image") or {}
    return str(image.get("tag") or "")


def hami_problems(
    look,
    gpus_by_host,
    split=10,
    memory_scaling=1,
    node_selector=None,
    namespace="kube-system",
    release="hami",
    values=None,
):
    if not look:
        return []
    try:
        doc = json.loads(look)
    except ValueError as exc:
        raise AnsibleFilterError(f"hami_problems: the kubectl look is not JSON ({exc})") from exc
    nodes = doc.get("nodes") or {}
    problems = hami_checks.node_problems(
        nodes,
        gpus_by_host or {},
        split=int(split),
        memory_scaling=float(memory_scaling),
        node_selector=node_selector,
        namespace=namespace,
        release=release,
    )
    return problems + hami_checks.scheduler_problems(
        nodes, doc.get("scheduler"), namespace=namespace, release=release, asked_tag=_asked_tag(values)
    )


def hami_problems_text(problems):
    return hami_checks.problems_text(problems or [])


def hami_webhook_state(look):
    """`{"webhooks": <get mutatingwebhookconfigurations -o json>, "scheduler": <its Deployment or null>,
    "endpoints": <get endpointslices of its Service -o json>}` as a sentence (roles/workloads/tasks/
    webhook_state.yml)."""
    try:
        doc = json.loads(look or "{}")
    except ValueError:
        return f"unreadable ({look!r})"
    return hami_checks.webhook_state(doc.get("webhooks"), doc.get("scheduler"), doc.get("endpoints"))


def hami_around(pods, scheduler_name="hami-scheduler"):
    """Pods (a `get pods -o json` text, its document or its items) that went around HAMi's scheduler: their
    names, how many the kubelet rejected and how many are Pending, and a sentence (hami_checks.around_hami)."""
    if isinstance(pods, str):
        try:
            pods = json.loads(pods or "{}")
        except ValueError as exc:
            raise AnsibleFilterError(f"hami_around: the pods are not JSON ({exc})") from exc
    items = pods.get("items") or [] if isinstance(pods, dict) else list(pods or [])
    return hami_checks.around_hami(items, scheduler_name)


def hami_pod_state(pod):
    """One pod (its `get pods -o json` item) in words: scheduler, phase and why it does not run."""
    return hami_checks.pod_state(pod or {})


def hami_scheduling_reasons(message):
    """A PodScheduled message parsed as kube-scheduler writes it (hami_checks.scheduling_reasons), or None."""
    return hami_checks.scheduling_reasons(message)


def hami_card_usage(look):
    """`{"nodes": <get nodes -o json>, "pods": <get pods -A -o json>}` -> hami_checks.card_usage."""
    doc = json.loads(look or "{}")
    return hami_checks.card_usage(doc.get("nodes") or {}, doc.get("pods") or {})


class FilterModule:
    def filters(self):
        return {
            "hami_problems": hami_problems,
            "hami_problems_text": hami_problems_text,
            "hami_webhook_state": hami_webhook_state,
            "hami_card_usage": hami_card_usage,
            "hami_around": hami_around,
            "hami_scheduling_reasons": hami_scheduling_reasons,
            "hami_pod_state": hami_pod_state,
        }
