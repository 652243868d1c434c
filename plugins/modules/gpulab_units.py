#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Ansible module gpulab_units: several systemd units running (and enabled) in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpulab_units
short_description: Keep several systemd units running, and enabled where asked, in one call
description:
  - For each unit of O(units), in order, starts it when C(systemctl is-active) says it is not active, and
    enables it when O(units[].enabled) is true and C(systemctl is-enabled) says it is not. One module call
    (one SSH round trip) where a C(systemd_service) task per unit takes one each.
  - Fails with systemctl's message when a unit cannot be started or enabled (for example, it does not exist).
  - Runs on the managed host with the Python standard library only.
version_added: "0.1.0"
author: gpulab contributors
options:
  units:
    description: The units.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Unit name; C(.service) is implied when no suffix is given.
        type: str
        required: true
      enabled:
        description: Also enable the unit (started at boot). V(false) leaves its boot setting as it is.
        type: bool
        default: false
attributes:
  check_mode:
    support: full
    description: Reports what it would start or enable, and does neither.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Keep the guest agent and the time daemon running
  gpulab_units:
    units:
      - name: qemu-guest-agent
      - name: systemd-timesyncd
        enabled: true
"""

RETURN = r"""
started:
  description: The units started (or that would be, in check mode).
  returned: always
  type: list
  elements: str
enabled:
  description: The units enabled (or that would be, in check mode).
  returned: always
  type: list
  elements: str
"""

# Ansible modules keep their imports below the documentation blocks.
from ansible.module_utils.basic import AnsibleModule  # noqa: E402

ARGUMENT_SPEC = {
    "units": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "name": {"type": "str", "required": True},
            "enabled": {"type": "bool", "default": False},
        },
    }
}


def run_module():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    systemctl = module.get_bin_path("systemctl", required=True)
    started, enabled = [], []

    def run(*args):
        return module.run_command([systemctl, *args])

    def act(verb, unit, done):
        if not module.check_mode:
            rc, out, err = run(verb, unit)
            if rc != 0:
                module.fail_json(
                    msg=f"systemctl {verb} {unit} failed (rc={rc}): {(err or out).strip()}",
                    changed=bool(started or enabled),
                    started=started,
                    enabled=enabled,
                )
        done.append(unit)

    for entry in module.params["units"]:
        unit = entry["name"]
        if run("is-active", "--quiet", unit)[0] != 0:
            act("start", unit, started)
        if entry["enabled"] and run("is-enabled", "--quiet", unit)[0] != 0:
            act("enable", unit, enabled)
    module.exit_json(changed=bool(started or enabled), started=started, enabled=enabled)


def main():
    run_module()


if __name__ == "__main__":
    main()
