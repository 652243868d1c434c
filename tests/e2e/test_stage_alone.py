"""Every stage playbook runs alone on the demo lab (issue 45): playbooks/host.yml, vms.yml, network.yml,
guests.yml, k3s.yml, hami.yml and verify.yml, each its own ansible-playbook run from the checkout in site.yml's
order, converge a fresh demo lab. Each validated the lab itself (its preflight, once) and took the run lock and gave
it back once (verify.yml, which writes nothing, takes none). Then site.yml, which imports preflight with every stage,
finds nothing to change and shows preflight and the lock once. A few minutes, most of it the converge."""

from __future__ import annotations

import subprocess

import ansible_runs

from .helpers import RunningLab, on_node, run_playbook

# site.yml's order; workloads and monitoring are opt-in (their plays run with --tags only)
STAGES = ["host", "vms", "network", "guests", "k3s", "hami", "verify"]
LOCK_PATH = "/var/lib/gpulab/run-lock.json"  # gpulab.runlock's, on the lab's first node


def assert_preflight_and_the_lock_once(run: subprocess.CompletedProcess[str], *, locks: int = 1) -> None:
    """Preflight validated the lab in one task of the run; the lock was taken and given back `locks` times."""
    out = run.stdout
    assert out.count("TASK [Validate the lab definition") == 1, out[-6000:]
    assert out.count("TASK [Take the run lock") == locks, out[-6000:]
    assert out.count("TASK [Release the run lock") == locks, out[-6000:]


def assert_no_lock_left(lab: RunningLab) -> None:
    left = on_node(lab, f"test ! -e {LOCK_PATH}")
    assert left.returncode == 0, f"{LOCK_PATH} is still on the node: {left.stdout}{left.stderr}"


def test_each_stage_playbook_alone_converges_the_demo_and_site_then_changes_nothing(lab: RunningLab) -> None:
    for stage in STAGES:
        run = run_playbook(lab, playbook=f"playbooks/{stage}.yml")
        assert run.returncode == 0, f"playbooks/{stage}.yml alone:\n{run.stdout[-6000:]}{run.stderr}"
        assert_preflight_and_the_lock_once(run, locks=0 if stage == "verify" else 1)
        assert_no_lock_left(lab)
    # the stages' runs brought the lab where site.yml would: a whole run changes nothing
    site = run_playbook(lab)
    assert site.returncode == 0, site.stdout[-6000:] + site.stderr
    counts = ansible_runs.recaps(site)
    assert counts and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts
    assert_preflight_and_the_lock_once(site)
    assert_no_lock_left(lab)
    # ...and a stage alone again, on the converged lab, changes nothing either
    again = run_playbook(lab, playbook="playbooks/vms.yml")
    assert again.returncode == 0, again.stdout[-6000:] + again.stderr
    assert all(c["changed"] == 0 for c in ansible_runs.recaps(again).values()), ansible_runs.recaps(again)
    assert_preflight_and_the_lock_once(again)
