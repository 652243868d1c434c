"""Kubernetes' version skew policy for a k3s upgrade: one minor release at a time, never down.

Kubernetes supports upgrading a cluster by one minor version at a time (kubernetes.io/releases/version-skew-policy:
the control plane moves from 1.N to 1.N+1, and kubelets may not be newer than it), and k3s applies it (docs.k3s.io,
Manual Upgrades: the skew policy applies, a plan must not skip intermediate minor versions, and nothing in k3s
guards against it). A downgrade is not supported at all (etcd's data and the API objects' storage versions only move forward).
So an upgrade from v1.33.x to v1.35.x must go through a v1.34.x release first. Pure functions: playbooks/upgrade.yml
hands in what `kubectl get nodes -o json` reported and k3s_version, before anything is changed.
"""

from __future__ import annotations

import re

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[-+]k3s(\d+))?")


def parse(version: str) -> tuple[int, int, int, int] | None:
    """`v1.34.9+k3s1` -> (1, 34, 9, 1); a kubelet's `v1.34.9+k3s1` the same; None for anything else."""
    m = _VERSION_RE.match(str(version or "").strip())
    if not m:
        return None
    return int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0)


def upgrade_problem(running: str, wanted: str) -> str | None:
    """Why k3s may not go from `running` to `wanted` in one upgrade, naming the releases to go through; None when
    it may (the same release, a newer patch of the same minor, or the next minor)."""
    have, want = parse(running), parse(wanted)
    if have is None or want is None or have == want:
        return None
    if want < have:
        return (
            f"{wanted} is older than the running {running}: Kubernetes and k3s do not support a downgrade (etcd's "
            f"data and the objects' storage versions only move forward); keep k3s_version at {running} or newer, "
            "or restore the cluster from an etcd snapshot taken on that release"
        )
    if want[0] != have[0] or want[1] <= have[1] + 1:
        return None
    steps = [f"v{have[0]}.{minor}.x" for minor in range(have[1] + 1, want[1] + 1)]
    return (
        f"{running} -> {wanted} skips {len(steps) - 1} minor release(s): Kubernetes' version skew policy allows one "
        f"minor at a time; upgrade through {' then '.join(steps)}: set k3s_version to a {steps[0]} release "
        "(https://github.com/k3s-io/k3s/releases), run playbooks/upgrade.yml, and repeat with the next"
    )


def cluster_problems(nodes: dict | None, wanted: str) -> list[str]:
    """For each node of `kubectl get nodes -o json` (`nodes`; None: not read, no cluster yet) whose kubelet cannot
    go to `wanted` in one upgrade, `NODE: why`."""
    out = []
    for item in (nodes or {}).get("items") or []:
        name = (item.get("metadata") or {}).get("name", "?")
        running = ((item.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
        problem = upgrade_problem(running, wanted)
        if problem is not None:
            out.append(f"{name}: {problem}")
    return out
