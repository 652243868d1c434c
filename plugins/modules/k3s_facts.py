#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Ansible module k3s_facts: what a host has of k3s, read in one call."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: k3s_facts
short_description: Read the installed k3s release, its systemd unit and (on a server) the join token
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Reads, in one call, what roles k3s_server and k3s_agent decide on. That is the release the installed
    C(k3s) binary reports (C(k3s --version)), whether the install script's systemd unit exists and whether
    it runs and is enabled (C(systemctl is-active), C(is-enabled)), and, when O(server_dir) is given, the
    server's join token.
  - Changes nothing. Register the result with C(no_log) when O(server_dir) is given, since RV(token) is a
    secret.
extends_documentation_fragment:
  - gpulab.homelab.reads
  - gpulab.homelab.attributes
options:
  bin_dir:
    description: Where the install script put C(k3s) (its C(INSTALL_K3S_BIN_DIR)).
    type: str
    default: /usr/local/bin
  unit:
    description: The systemd unit the install script writes, V(k3s) (server) or V(k3s-agent).
    type: str
    choices: [k3s, k3s-agent]
    default: k3s
  unit_dir:
    description: Where the install script writes the unit file.
    type: str
    default: /etc/systemd/system
  server_dir:
    description:
      - The server's data folder. When given, its C(token) file (which k3s writes at its first start) is read
        into RV(token).
    type: str
"""

EXAMPLES = r"""
- name: Read the installed k3s, its unit and the join token
  gpulab.homelab.k3s_facts:
    unit: k3s
    server_dir: /var/lib/rancher/k3s/server
  register: k3s_found
  no_log: true
"""

RETURN = r"""
version:
  description: The release C(k3s --version) reports, empty when k3s is not installed or does not answer.
  returned: always
  type: str
  sample: v1.33.5+k3s1
unit_exists:
  description: Whether the unit file O(unit_dir)/O(unit).service exists.
  returned: always
  type: bool
active:
  description: Whether C(systemctl is-active) says the unit runs (V(false) without the unit).
  returned: always
  type: bool
enabled:
  description: Whether C(systemctl is-enabled) says the unit starts at boot (V(false) without the unit).
  returned: always
  type: bool
token:
  description: The server's join token (O(server_dir)/token without surrounding white space); V(null) when it is missing or not asked for.
  returned: always
  type: str
"""

# Ansible modules keep their imports below the documentation blocks.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

ARGUMENT_SPEC = {
    "bin_dir": {"type": "str", "default": "/usr/local/bin"},
    "unit": {"type": "str", "choices": ["k3s", "k3s-agent"], "default": "k3s"},
    "unit_dir": {"type": "str", "default": "/etc/systemd/system"},
    "server_dir": {"type": "str"},
}


def parse_version(stdout):
    """`k3s version v1.33.5+k3s1 (a1b2c3d4)` (the first line of k3s --version) -> `v1.33.5+k3s1`."""
    first = (stdout.splitlines() or [""])[0].split()
    return first[2] if len(first) > 2 and first[:2] == ["k3s", "version"] else ""


def run_module():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    binary = os.path.join(p["bin_dir"], "k3s")
    version = ""
    if os.access(binary, os.X_OK):
        rc, out, _err = module.run_command([binary, "--version"])
        version = parse_version(out) if rc == 0 else ""
    token = None
    if p["server_dir"]:
        path = os.path.join(p["server_dir"], "token")
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip() or None
        except FileNotFoundError:
            token = None
        except OSError as exc:
            module.fail_json(msg=f"cannot read {path}: {exc.strerror}")
    unit_exists = os.path.exists(os.path.join(p["unit_dir"], f"{p['unit']}.service"))
    active = enabled = False
    if unit_exists:
        systemctl = module.get_bin_path("systemctl", required=True)
        active = module.run_command([systemctl, "is-active", "--quiet", p["unit"]])[0] == 0
        enabled = module.run_command([systemctl, "is-enabled", "--quiet", p["unit"]])[0] == 0
    module.exit_json(
        changed=False, version=version, unit_exists=unit_exists, active=active, enabled=enabled, token=token
    )


def main():
    run_module()


if __name__ == "__main__":
    main()
