"""The demo from the installed collection, one stage at a time: `ansible-galaxy collection build`, installed into an
empty collections path, and run from outside the checkout with a user's own ansible.cfg (no plugin or role paths
into the checkout). Each stage playbook of the installed copy (gpulab.homelab.host, .vms, .network, .guests,
.k3s, .hami, .verify), run alone in site.yml's order, brings a fresh demo lab one stage further: each validates the
lab itself (its preflight, once) and takes the run lock and gives it back once (verify, which writes nothing, takes
none). Then the installed gpulab.homelab.site finds nothing to change, and so does the checkout's
playbooks/vms.yml run alone (issue 45: every stage playbook runs alone, from a checkout and installed). One
converge for both proofs; a few minutes, most of it the converge."""

from __future__ import annotations

import configparser
import json
import subprocess
from pathlib import Path

import ansible_runs

from .helpers import DEMO, REPO, VENV_BIN, RunningLab, on_node, run_playbook

# The checkout's own ways to the plugins and roles, which a user of the installed collection does not have.
CHECKOUT_PATHS = (
    "library",
    "module_utils",
    "action_plugins",
    "filter_plugins",
    "lookup_plugins",
    "doc_fragment_plugins",
    "roles_path",
    "collections_path",
)


# site.yml's order; workloads and monitoring are opt-in (their plays run with --tags only)
STAGES = ["host", "vms", "network", "guests", "k3s", "hami", "verify"]
LOCK_PATH = "/var/lib/gpulab/run-lock.json"  # gpulab.runlock's, on the lab's first node


def installed(tmp: Path) -> tuple[Path, Path]:
    """The tarball built from the checkout and installed into tmp/collections; a user's ansible.cfg for it
    (the checkout's settings without its plugin, role and collection paths)."""
    collections = tmp / "collections"
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "ansible.cfg")
    for key in CHECKOUT_PATHS:
        config.remove_option("defaults", key)
    config.set("defaults", "collections_path", str(collections))
    cfg = tmp / "ansible.cfg"
    with cfg.open("w") as f:
        config.write(f)
    env = ansible_runs.playbook_env(ANSIBLE_CONFIG=str(cfg))
    collections.mkdir()
    ansible_runs.install_collection(ansible_runs.build_collection(tmp, env), collections, env)
    return cfg, collections / "ansible_collections" / "gpulab" / "homelab"


def site(
    lab: RunningLab, cfg: Path, cwd: Path, playbook: str = "gpulab.homelab.site"
) -> subprocess.CompletedProcess[str]:
    env = ansible_runs.playbook_env(ANSIBLE_CONFIG=str(cfg), GPULAB_LAB_STATE=str(lab.state))
    return subprocess.run(
        [VENV_BIN / "ansible-playbook", "-i", DEMO, playbook],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip


def changes_nothing(run: subprocess.CompletedProcess[str]) -> None:
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr
    counts = ansible_runs.recaps(run)
    assert counts and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts


def preflight_and_the_lock_once(run: subprocess.CompletedProcess[str], *, locks: int = 1) -> None:
    """Preflight validated the lab in one task of the run; the lock was taken and given back `locks` times."""
    out = run.stdout
    assert out.count("TASK [Validate the lab definition") == 1, out[-6000:]
    assert out.count("TASK [Take the run lock") == locks, out[-6000:]
    assert out.count("TASK [Release the run lock") == locks, out[-6000:]


def no_lock_left(lab: RunningLab) -> None:
    left = on_node(lab, f"test ! -e {LOCK_PATH}")
    assert left.returncode == 0, f"{LOCK_PATH} is still on the node: {left.stdout}{left.stderr}"


def test_each_installed_stage_alone_converges_the_demo_and_site_then_changes_nothing(
    lab: RunningLab, tmp_path: Path
):
    cfg, copy = installed(tmp_path)
    assert (copy / "playbooks" / "site.yml").is_file() and not (copy / "library").exists()
    where = tmp_path / "elsewhere"  # no ansible.cfg and no checkout here
    where.mkdir()
    # with this config gpulab.homelab is the installed copy and nothing else (not the checkout's .collections)
    listed = subprocess.run(
        [VENV_BIN / "ansible-galaxy", "collection", "list", "gpulab.homelab", "--format", "json"],
        cwd=where, env=ansible_runs.playbook_env(ANSIBLE_CONFIG=str(cfg)), capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert list(json.loads(listed.stdout)) == [str(copy.parents[1])], listed.stdout + listed.stderr
    for stage in STAGES:
        run = site(lab, cfg, where, f"gpulab.homelab.{stage}")
        assert run.returncode == 0, f"gpulab.homelab.{stage} alone:\n{run.stdout[-6000:]}{run.stderr}"
        preflight_and_the_lock_once(run, locks=0 if stage == "verify" else 1)
        no_lock_left(lab)
    # the stages' runs brought the lab where a whole run would: the installed site changes nothing
    whole = site(lab, cfg, where)
    changes_nothing(whole)
    preflight_and_the_lock_once(whole)
    no_lock_left(lab)
    # ...and the checkout's stage playbook alone, on the converged lab, changes nothing either
    vms = run_playbook(lab, playbook="playbooks/vms.yml")
    changes_nothing(vms)
    preflight_and_the_lock_once(vms)
    assert "PLAY [Stage 2, vms | images, GPU mappings, VMs, addresses]" in vms.stdout
    no_lock_left(lab)
