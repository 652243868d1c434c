"""Filters of stage hami: the GPU nodes' problems, parsed in Python from the one kubectl look of each wait.

`hami_look | hami_problems(gpus_by_host, split=..., ...)` takes the text that roles/hami/tasks/verify.yml
prints (`{"nodes": <kubectl get nodes -o json>, "scheduler": <kubectl get deployment ... -o json>}`) and the
guests' GPU facts (and `values=`, the chart values the role rendered: the kube-scheduler tag the HelmChart asks); it
returns the problems of gpulab.k8s.hami_checks (host, field, value, cause, fix, wait).
`problems | hami_problems_text` makes them one message.

The sharing proof (roles/hami/tasks/proof.yml) words its outcome through `hami_proof_card_refusal` (why the
picked card cannot hold the proof, "" when it can), `hami_proof_start_refusal` (why its two pods do not both run
under HAMi's scheduler, "" when they do) and `hami_proof_outcome` (the problems of the shares and of the third
pod's refusal, and the report). `hami_look | hami_conflicts(release)` names the DaemonSets of NVIDIA's device
plugin that would fight HAMi's (roles/hami/tasks/conflicts.yml).

Stage workloads: `results | hami_webhook_refusal(scheduler_name, timeout)` says why HAMi's webhook is taken not to
answer, from the registered loop of server dry runs (one per namespace: `workloads_namespace`, `rc`, `stdout` the
schedulerName the dry-run pod got, `stderr`), "" when each got `scheduler_name`; `cards | hami_card_shares_text`
is the plan's card shares (UUID -> percent) in one line; `found | hami_unread_token_namespaces(engines)` the
namespaces of the token Secrets' files (ansible.builtin.find's `files`) that no planned engine reads.
"""

from __future__ import annotations

import json
import re

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


def _names(card):
    return ", ".join(str(p.get("pod")) for p in card.get("pods") or [])


def hami_proof_card_refusal(card, share_percent, hosts=()):
    """Why `card` (an item of hami_card_usage) cannot hold the proof's two pods of `share_percent` % each, and
    a third that asks for the rest; "" when it can. `hosts` are the GPU hosts the card was looked for on."""
    share = int(share_percent)
    if not card or card.get("uuid") is None:
        where = "".join(list(hosts or [])[:1]) or "any GPU host"
        return (
            f"The sharing proof found no card HAMi registered for {where}: run stage hami first (and stage guests "
            "for the GPU facts)."
        )
    if card["free_percent"] < 2 * share + 1:
        return (
            f"Card {card['uuid']} on {card['node']} has {card['free_percent']} % free (held: {_names(card)}), the "
            f"proof needs {2 * share + 1} %: lower hami_proof_share_percent or stop engines first."
        )
    if card["used_cores"] >= card["devcore"]:
        return (
            f"Card {card['uuid']} on {card['node']} has all its {card['devcore']} cores held ({_names(card)}), and "
            "HAMi does not place a pod asking no cores, as the proof's do, on a card whose cores are all taken "
            "(CardComputeUnitsExhausted): stop an engine holding cores (gpu_cores) first."
        )
    return ""


def _items(stdout):
    try:
        return (json.loads(stdout or "{}") or {}).get("items") or []
    except ValueError as exc:
        raise AnsibleFilterError(f"the pods are not JSON ({exc}): {stdout!r}") from exc


def hami_proof_start_refusal(look, timeout, namespace="kube-system", release="hami"):
    """Why the proof's two pods do not both run under HAMi's scheduler, from `look` (the registered
    `get pods -l ... -o json` command), "" when they do; the fix names HAMi's `namespace` and `release`."""
    if look.get("rc") != 0:
        return f"The sharing proof could not read its pods: {look.get('stderr', '')}."
    items = _items(look.get("stdout"))
    around = hami_checks.around_hami(items)
    if around["pods"]:
        return (
            "The sharing proof's pods went around HAMi: they were created while HAMi's webhook did not answer, and "
            f"its failurePolicy Ignore let them through unchanged, for default-scheduler: {around['text']}. Fix: get "
            f"the webhook answering (k3s kubectl -n {namespace} rollout status deployment/{release}-scheduler; "
            f"k3s kubectl -n {namespace} get endpointslices -l kubernetes.io/service-name={release}-scheduler must "
            "show a ready endpoint), then run the proof again (its pods are deleted now)."
        )
    if sum(1 for pod in items if (pod.get("status") or {}).get("phase") == "Running") != 2:
        states = "; ".join(hami_checks.pod_state(pod) for pod in items)
        return f"The sharing proof's two pods did not both run within {timeout} s: {states}."
    return ""


def _first_line(stdout):
    return (stdout or "").strip().split("\n")[0]


def hami_proof_outcome(look, seen, card, share_percent, third_percent, third="gpulab-hami-proof-c"):
    """What the proof saw: `look` is the last `get pods -o json` text of its pods, `seen` the results of the
    `kubectl logs` loop (each with `stdout` and `item.name`), `card` the card it shares. Returns `problems`
    (pods that went around HAMi, nvidia-smi not reporting a pod's share within 1 %, the third pod placed or
    Pending for another reason than the card's memory) and `report`, the sentence shown when there are none."""
    share, extra = int(share_percent), int(third_percent)
    items = _items(look)
    want = int(card["devmem"]) * share // 100
    pod = next((p for p in items if (p.get("metadata") or {}).get("name") == third), {})
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    why = next(
        (c.get("message", "") for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), ""
    )
    refused = (hami_checks.scheduling_reasons(why) or {}).get("hami", [])
    problems = []
    around = hami_checks.around_hami(items)
    if around["pods"]:
        problems.append(f"pods went around HAMi, created while its webhook did not answer: {around['text']}")
    for result in seen or []:
        got = _first_line(result.get("stdout")).strip()
        if not re.fullmatch("[0-9]+", got) or abs(int(got) - want) > want // 100 + 1:
            problems.append(
                f"nvidia-smi in {result['item']['name']} reports {got or 'nothing'} MiB, not its {share} % share "
                f"({want} MiB)"
            )
    if status.get("phase") != "Pending" or spec.get("nodeName"):
        problems.append(
            f"pod {third} asking {extra} % is {status.get('phase') or 'gone'} on {spec.get('nodeName', '?')}: the "
            f"card is past 100 % ({share} + {share} + {extra} %)"
        )
    elif "CardInsufficientMemory" not in refused:
        problems.append(
            f"pod {third} is Pending, but HAMi's scheduler did not refuse it for the card's memory "
            f"(CardInsufficientMemory): {why or 'no reason given'}"
        )
    shares = "".join(
        f"{r['item']['name']} sees {_first_line(r.get('stdout'))} MiB ({share} %); " for r in seen or []
    )
    report = (
        f"HAMi shares card {card['uuid']} on {card['node']} ({card['devmem']} MiB): {shares}{third} asking {extra} % "
        f"stays Pending, HAMi's scheduler refusing {', '.join(dict.fromkeys(refused)) or 'it'}: "
        f"{why or 'no reason given'}"
    )
    return {"problems": problems, "report": report}


def hami_webhook_refusal(results, scheduler_name="hami-scheduler", timeout=""):
    bad = next((r for r in results or [] if r.get("stdout") != scheduler_name), None)
    if bad is None:
        return ""
    got = (
        f"schedulerName {bad.get('stdout')}"
        if bad.get("rc") == 0
        else f"an error: {str(bad.get('stderr') or '').strip()}"
    )
    return (
        f"HAMi's webhook did not send a GPU pod to {scheduler_name} within {timeout} s: a server dry run of a one-vGPU "
        f"pod in namespace {bad.get('workloads_namespace')} got {got}, so no engine was placed (an engine's pod "
        "created now would go unchanged to default-scheduler, and HAMi's device plugin gives cards only to pods "
        "HAMi's scheduler bound: the kubelet would reject it, UnexpectedAdmissionError, and its Deployment would "
        "make new pods again and again, or, asking a share of a card, it would stay Pending)"
    )


def hami_card_shares_text(cards):
    return "; ".join(f"{card}: {share} %" for card, share in (cards or {}).items())


def hami_conflicts(look, release="hami"):
    """The DaemonSets (namespace/name) of a `get daemonsets -A -o json` text that run NVIDIA's k8s-device-plugin
    image or are named like NVIDIA's device plugin, other than HAMi's own (`release`-device-plugin)."""
    found = []
    for ds in _items(look):
        meta = ds.get("metadata") or {}
        containers = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
        images = " ".join(str(c.get("image", "")) for c in containers)
        name = meta.get("name", "")
        if name != f"{release}-device-plugin" and (
            "nvidia-device-plugin" in name or "k8s-device-plugin" in images
        ):
            found.append(f"{meta.get('namespace')}/{name}")
    return found


TOKEN_FILE = re.compile(r"gpulab-hf-token-(?P<namespace>.+)\.yaml")


def hami_unread_token_namespaces(found, engines):
    """The namespaces of the Hugging Face token Secrets' files `found` (gpulab-hf-token-NAMESPACE.yaml, as
    ansible.builtin.find lists them) where no planned engine (`engines`: module hami_workloads' `engines`) has
    hf_token, sorted."""
    wanted = {str(e.get("namespace")) for e in engines or [] if e.get("hf_token")}
    names = (TOKEN_FILE.fullmatch(str(f.get("path", "")).rsplit("/", 1)[-1]) for f in found or [])
    return sorted({m["namespace"] for m in names if m and m["namespace"] not in wanted})


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
            "hami_proof_card_refusal": hami_proof_card_refusal,
            "hami_proof_start_refusal": hami_proof_start_refusal,
            "hami_proof_outcome": hami_proof_outcome,
            "hami_conflicts": hami_conflicts,
            "hami_webhook_refusal": hami_webhook_refusal,
            "hami_card_shares_text": hami_card_shares_text,
            "hami_unread_token_namespaces": hami_unread_token_namespaces,
        }
