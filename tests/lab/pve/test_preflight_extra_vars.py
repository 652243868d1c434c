"""Preflight checks the names given with -e as it checks the inventory's: a misspelt one with a prefix gpulab
owns is refused with the nearest known name, before anything changes (playbooks/preflight.yml on
inventory/demo against the API-only simulated PVE)."""

from __future__ import annotations

import pytest
from unit.pve.conftest import playbook_lab

from .test_role import play


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with playbook_lab(tmp_path_factory.mktemp("pve")) as lab:
        yield lab


def test_a_misspelt_extra_var_is_refused_in_preflight_with_the_nearest_name(lab):
    """`-e pve_host_reboot_alowed=true` used to pass silently, and stage host then did not reboot the node."""
    mark = lab.mark()
    out = play(lab.state, "-e", "pve_host_reboot_alowed=true", playbooks=("playbooks/preflight.yml",))
    assert out["rc"] == 2, out["stdout"][-3000:]
    assert (
        "extra vars (-e): pve_host_reboot_alowed='true': unknown variable given with -e: neither the lab "
        "definition nor a role reads it (did you mean pve_host_reboot_allowed?). Fix: rename it to "
        "pve_host_reboot_allowed, or remove it." in out["stdout"]
    )
    assert "nothing was changed" in out["stdout"]
    assert lab.writes(mark) == []


def test_known_extra_vars_and_run_switches_pass(lab):
    """The spelt name, a run switch only a playbook reads (gpulab_run_lock_break) and a name gpulab does not own
    are accepted."""
    extra = ["-e", "pve_host_reboot_allowed=true", "-e", "gpulab_run_lock_break=false", "-e", "my_own=1"]
    out = play(lab.state, *extra, playbooks=("playbooks/preflight.yml",))
    assert out["rc"] == 0, out["stdout"][-3000:]
