"""Filters of playbooks/upgrade.yml's GPU nodes (gpulab.k8s.gpu_upgrade), one node at a time.

`node | gpu_upgrade_plan(facts, k3s_version, node_json, pods_json, wanted, engines)` is the node's
plan (gpulab.k8s.gpu_upgrade.node_plan) from what the play read: `facts` is gpu_facts' result (the driver
nvidia-smi reports, the cards, nvidia-ctk's version), `k3s_version` the installed release (k3s_facts),
`node_json`/`pods_json` the texts of `kubectl get node NAME -o json` and `kubectl get pods -A -o json`, `wanted`
{driver_branch, toolkit (a Debian version or ""), k3s (a release or "": not this play's to upgrade)} and `engines`
workloads_engines. The plan also holds `text` (its numbered steps), `gpu_pods`, `cards` (nvidia-smi's UUIDs, or HAMi's
registered ones when nvidia-smi does not answer), `device_cordon_before` and `device_cordon` (the annotation's
value as read and with those cards added) and `deployments` (the node's engines, namespace/name, in start order).
`node_json | gpu_upgrade_lift(cards)` is the annotation's value with the cards taken out ("" : remove it).
`node | gpu_upgrade_proof(facts, node_json, wanted_branch, cards)` is the list of what keeps the node
cordoned (gpulab.k8s.gpu_upgrade.proof_problems; [] passes).
"""

from __future__ import annotations

import json

from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.k8s import gpu_upgrade
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    gpu_upgrade = MissingEngine(err)


def _json(text):
    try:
        return json.loads(text) if text else None
    except ValueError:  # an error text, not an object: nothing read
        return None


def _cordon_value(node_object):
    return (((node_object or {}).get("metadata") or {}).get("annotations") or {}).get(
        gpu_upgrade.DEVICE_CORDON_ANNOTATION
    )


def gpu_upgrade_plan(node, facts, k3s_version, node_json, pods_json, wanted, engines=()):
    facts, wanted, obj = dict(facts or {}), dict(wanted or {}), _json(node_json)
    running = {
        "driver_branch": gpu_upgrade.driver_branch(facts.get("driver_version")),
        "toolkit": gpu_upgrade.toolkit_running((facts.get("container_toolkit") or {}).get("ctk_version")),
        "k3s": str(k3s_version or ""),
    }
    wants = {
        "driver_branch": str(wanted.get("driver_branch") or ""),
        "toolkit": gpu_upgrade.toolkit_wanted(str(wanted.get("toolkit") or "")),
        "k3s": str(wanted.get("k3s") or ""),
    }
    cards = list(facts.get("uuids") or []) or gpu_upgrade.registered_cards(obj)
    pods = gpu_upgrade.gpu_pods(_json(pods_json), str(node))
    plan = gpu_upgrade.node_plan(
        str(node),
        running=running,
        wanted=wants,
        cards=cards,
        gpu_pods=pods,
        engines=list(engines or []),
    )
    before = _cordon_value(obj) or ""
    return {
        **plan,
        "text": gpu_upgrade.plan_text([plan]).splitlines(),
        "cards": cards,
        "gpu_pods": pods,
        "device_cordon_before": before,
        "device_cordon": gpu_upgrade.device_cordon(before, add=cards),
        # the engines' Deployments (namespace/name) in their start order
        "deployments": [
            f"{e.get('namespace') or 'default'}/{e.get('name')}"
            for e in engines or ()
            if e.get("node") == node
        ],
    }


def gpu_upgrade_lift(node_json, cards):
    return gpu_upgrade.device_cordon(_cordon_value(_json(node_json)), remove=list(cards or []))


def gpu_upgrade_proof(node, facts, node_json, wanted_branch, cards):
    facts = dict(facts or {})
    answered = facts.get("error") is None and facts.get("driver_version")
    return gpu_upgrade.proof_problems(
        str(node),
        wanted_branch=str(wanted_branch),
        smi_driver=facts.get("driver_version") if answered else None,
        smi_cards=list(facts.get("uuids") or []),
        cards=list(cards or []),
        node_object=_json(node_json),
        smi_error=facts.get("error"),
    )


class FilterModule:
    def filters(self):
        return {
            "gpu_upgrade_plan": gpu_upgrade_plan,
            "gpu_upgrade_lift": gpu_upgrade_lift,
            "gpu_upgrade_proof": gpu_upgrade_proof,
        }
