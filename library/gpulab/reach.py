"""Preflight's second half: reach the APIs the selected stages will use, read-only, before any change.

A wrong token, a pinned fingerprint that no longer matches or a node that is down then stops the run
before stage host has touched the node, with the same kind of message as a lab definition problem.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpulab.labdef import Problem
from gpulab.pve import connection
from gpulab.pve.client import PveAuthError, PveConnectionError, PveError

# The stages of site.yml (its play tags) and the ones that talk to the PVE API.
STAGES = ("host", "vms", "network", "guests", "k3s", "hami", "workloads", "verify")
PVE_STAGES = frozenset({"vms", "network", "verify"})
# A reachability check, not a run: fail fast rather than retry for minutes.
TIMEOUT_S = 10
RETRIES = 1


def selected_stages(run_tags: Iterable[str] | None, skip_tags: Iterable[str] | None) -> set[str]:
    """The stages an ansible-playbook run with these --tags / --skip-tags runs ("workloads" is opt-in)."""
    run = set(run_tags or ["all"])
    skip = set(skip_tags or [])
    chosen = set(STAGES) - {"workloads"} if "all" in run else run & set(STAGES)
    return chosen - skip


def reach_pve(settings: Mapping[str, Any]) -> tuple[str | None, Problem | None]:
    """GET /version with the inventory's API settings: (what answered, None) or (None, the problem)."""
    params = connection.params_from_inventory(settings) | {"api_timeout": TIMEOUT_S, "api_retries": RETRIES}
    url = params.get("api_url")
    try:
        version = connection.connect(params).get("version") or {}
    except PveAuthError as exc:
        return None, Problem(
            "all",
            "pve_api_token_id" if params.get("api_token_id") else "pve_api_user",
            params.get("api_token_id") or params.get("api_user"),
            f"the Proxmox VE API at {url} refused these credentials ({exc.message})",
            "correct the token ID and secret (or the user and password) in the inventory or the vault",
        )
    except PveConnectionError as exc:
        return None, Problem(
            "all",
            "pve_api_url",
            url,
            f"the Proxmox VE API did not answer ({exc.message})",
            "start the node or correct the address and port; a self-signed certificate needs "
            "pve_api_fingerprint or pve_api_ca_file",
        )
    except (PveError, ValueError) as exc:
        return None, Problem(
            "all",
            "pve_api_url",
            url,
            f"the Proxmox VE API could not be asked GET /version ({exc})",
            "check that the URL points at the node's API (https://ADDRESS:8006)",
        )
    return f"Proxmox VE API at {url}: version {version.get('version', '?')}", None
