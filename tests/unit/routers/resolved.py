"""The router as preflight resolves it (fact gpulab_router), for the tests that run stage network on an
inventory of a router and VMs only (no Proxmox node, so playbooks/preflight.yml cannot validate it): the same
function preflight calls, gpulab.routerspec.resolve, its result given to the run as an extra variable, with
ansible_runs.STAGE_ON_ITS_HOSTS's gpulab_preflight_done (the test stands in for preflight)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpulab import inventory, labdef, routerspec


def router_extra_vars(
    inv: Path | list[Path], where: Path, env: dict | None = None, **settings: Any
) -> list[str]:
    """`-e @FILE` for ansible-playbook: gpulab_router resolved from inventory `inv` (one or more sources, read
    with `env` added to the environment) with the run's router_dhcp `settings` (those the inventory sets for
    localhost otherwise), the file written in folder `where`."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        groups, hostvar, names = inventory.load(inv)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    definition = labdef.load(groups, hostvar, names)
    spec = routerspec.resolve(definition, lambda name: settings.get(name, hostvar("localhost", name)))
    path = where / "gpulab_router.json"
    path.write_text(json.dumps({"gpulab_router": spec, "gpulab_preflight_done": True}))
    return ["-e", f"@{path}"]
