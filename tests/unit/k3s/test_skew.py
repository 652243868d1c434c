"""A k3s upgrade follows Kubernetes' version skew policy (gpulab.k8s.skew): one minor at a time, never down;
playbooks/upgrade.yml refuses anything else before any change, naming the releases to go through."""

import json
from pathlib import Path

import plugin_files
import pytest
import yaml

from gpulab.k8s.skew import cluster_problems, parse, upgrade_problem

ROOT = Path(__file__).resolve().parents[3]


def nodes(**kubelets):
    items = [
        {"metadata": {"name": n}, "status": {"nodeInfo": {"kubeletVersion": v}}} for n, v in kubelets.items()
    ]
    return {"items": items}


def test_parse():
    assert (
        parse("v1.34.9+k3s1") == (1, 34, 9, 1) and parse("1.36.2") == (1, 36, 2, 0) and parse("n/a") is None
    )


@pytest.mark.parametrize(
    "running, wanted",
    [
        ("v1.33.5+k3s1", "v1.33.5+k3s1"),
        ("v1.33.5+k3s1", "v1.33.7+k3s3"),
        ("v1.33.5+k3s1", "v1.34.9+k3s1"),
        ("v1.35.6+k3s1", "v1.36.2+k3s1"),
        ("v1.36.2+k3s1", "v1.36.2+k3s2"),
    ],
)
def test_a_patch_or_the_next_minor_is_allowed(running, wanted):
    assert upgrade_problem(running, wanted) is None


def test_a_skipped_minor_is_refused_naming_the_releases_to_go_through():
    why = upgrade_problem("v1.33.5+k3s1", "v1.35.6+k3s1")
    assert why.startswith("v1.33.5+k3s1 -> v1.35.6+k3s1 skips 1 minor release(s)")
    assert "upgrade through v1.34.x then v1.35.x: set k3s_version to a v1.34.x release" in why
    assert "v1.34.x then v1.35.x then v1.36.x" in upgrade_problem("v1.33.5+k3s1", "v1.36.2+k3s1")


@pytest.mark.parametrize("wanted", ["v1.33.5+k3s1", "v1.34.1+k3s1", "v1.34.9+k3s1"])
def test_a_downgrade_is_refused(wanted):
    why = upgrade_problem("v1.34.9+k3s2", wanted)
    assert why.startswith(
        f"{wanted} is older than the running v1.34.9+k3s2: Kubernetes and k3s do not support"
    )


def test_each_node_that_cannot_take_the_step_is_named():
    doc = nodes(**{"vm-1": "v1.34.9+k3s1", "vm-2": "v1.33.5+k3s1", "vm-gpu": "v1.35.6+k3s1"})
    problems = cluster_problems(doc, "v1.35.6+k3s1")
    assert [p.split(":", 1)[0] for p in problems] == ["vm-2"]
    assert (
        cluster_problems(None, "v1.36.2+k3s1") == [] and cluster_problems({"items": []}, "v1.36.2+k3s1") == []
    )


def test_upgrade_yml_checks_the_path_before_the_first_change():
    """The check is the first play after the speaker's pick (reads only), before the servers' play."""
    plays = yaml.safe_load((ROOT / "playbooks/upgrade.yml").read_text())
    names = [p["name"] for p in plays]
    check = names.index(
        "Preflight | k3s_version is one step from what every node runs (no skipped minor, no downgrade)"
    )
    assert check < names.index("Upgrade | servers, one at a time")
    assert all(any(k.endswith("import_playbook") for k in p) for p in plays[:check])
    text = json.dumps(plays[check])
    assert "gpulab.homelab.k3s_upgrade_skew(k3s_version)" in text and '"check_mode": false' in text


def test_the_filter_reads_kubectls_text():
    skew = plugin_files.filters("k3s")["k3s_upgrade_skew"]
    text = json.dumps(nodes(**{"vm-1": "v1.33.5+k3s1"}))
    (problem,) = skew(text, "v1.35.6+k3s1")
    assert problem.startswith("vm-1: v1.33.5+k3s1 -> v1.35.6+k3s1 skips 1 minor release(s)")
    assert skew(text, "v1.34.9+k3s1") == [] and skew("", "v1.35.6+k3s1") == [] and skew("error", "v1") == []
