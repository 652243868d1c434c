"""The demo from the installed collection: `ansible-galaxy collection build`, installed into an empty collections
path, and `ansible-playbook gpulab.homelab.site` run from outside the checkout with a user's own ansible.cfg
(no plugin or role paths into the checkout). It converges a fresh demo lab, and a second run changes nothing; then
`ansible-playbook gpulab.homelab.vms` runs that stage alone (its own preflight, once, and the run lock taken and
given back once) and changes nothing. About two minutes, most of it the first converge."""

from __future__ import annotations

import configparser
import json
import subprocess
from pathlib import Path

import ansible_runs

from .helpers import DEMO, REPO, VENV_BIN, RunningLab

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


def test_the_demo_converges_from_the_installed_collection_and_a_second_run_changes_nothing(
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
    first = site(lab, cfg, where)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr
    second = site(lab, cfg, where)
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr
    counts = ansible_runs.recaps(second)
    assert counts and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts
    # one stage of the installed copy alone: it validates the lab and takes the lock itself, once each
    vms = site(lab, cfg, where, "gpulab.homelab.vms")
    assert vms.returncode == 0, vms.stdout[-6000:] + vms.stderr
    counts = ansible_runs.recaps(vms)
    assert counts and all(c["changed"] == 0 and c["failed"] == 0 for c in counts.values()), counts
    for task in ("Validate the lab definition", "Take the run lock", "Release the run lock"):
        assert vms.stdout.count(f"TASK [{task}") == 1, (task, vms.stdout[-6000:])
    assert "PLAY [Stage 2, vms | images, GPU mappings, VMs, addresses]" in vms.stdout
