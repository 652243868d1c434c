#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Ansible module units: several systemd units running (and enabled) in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: units
short_description: Keep several systemd units running, and enabled where asked, in one call
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - For each unit of O(units), in order, starts it when C(systemctl is-active) says it is not active, and
    enables it when O(units[].enabled) is true and C(systemctl is-enabled) says it is not. One module call
    (one SSH round trip) where a C(systemd_service) task per unit takes one each.
  - Fails with systemctl's message when a unit cannot be started or enabled (for example, it does not exist).
  - Runs on the managed host with the Python standard library only.
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
      requires_path:
        description:
          - A path that must exist for the unit to run, such as the device the unit binds to (the QEMU guest
            agent's C(/dev/virtio-ports/org.qemu.guest_agent.0), there only when the VM has the agent channel).
          - While it is missing, a unit that is not active is neither started nor enabled and is listed in
            RV(waiting); this is no change (systemd would refuse or skip the start every run).
        type: path
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    description: Reports what it would start or enable, and does neither.
"""

EXAMPLES = r"""
- name: Keep the guest agent and the time daemon running
  gpulab.homelab.units:
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
waiting:
  description: The units not started because their O(units[].requires_path) is missing.
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
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

ARGUMENT_SPEC = {
    "units": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "name": {"type": "str", "required": True},
            "enabled": {"type": "bool", "default": False},
            "requires_path": {"type": "path"},
        },
    }
}


def run_module():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    systemctl = module.get_bin_path("systemctl", required=True)
    started, enabled, waiting = [], [], []

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
            if entry["requires_path"] and not os.path.exists(entry["requires_path"]):
                waiting.append(unit)
                continue
            act("start", unit, started)
        if entry["enabled"] and run("is-enabled", "--quiet", unit)[0] != 0:
            act("enable", unit, enabled)
    module.exit_json(changed=bool(started or enabled), started=started, enabled=enabled, waiting=waiting)


def main():
    run_module()


if __name__ == "__main__":
    main()
