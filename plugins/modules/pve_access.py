#!/usr/bin/python
"""Ansible module pve_access: gpulab's API role, user, token and ACLs on a Proxmox VE node, with pveum.

Started by its action plugin (plugins/action/pve_access.py), which gives it the privileges and
keeps the token's secret out of every output."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pve_access
short_description: Create gpulab's least-privilege API role, user and token on a Proxmox VE node
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Runs on the node, as root, with the node's own tools (C(pvesh), C(pveum), C(pvenode)), the way README's
    manual steps do. Makes what is missing of, in this order, the role O(role) with exactly O(privileges),
    the user of O(token_id), its API token with privilege separation, and the role on O(acl_path) for both
    the user and the token (with privilege separation a token holds only what both hold).
  - Reads everything first and refuses before any write when the role exists with other privileges (naming
    the missing and the extra ones), when the token exists with privilege separation off, or when the token
    exists and O(kept_in_vault) is false (PVE shows a secret only once; O(rotate) replaces the token).
  - A token that exists while the vault holds no secret for it is adopted when the node holds the secret
    in O(first_boot_file), where the first-boot hook of C(gpulab install-media) wrote it when it made
    the token. The secret is then returned in RV(secret) as for a new token, and the action plugin removes
    the file once the vault holds it.
  - A kept token keeps its secret. With O(rotate) the old token is removed (PVE drops its ACL entries with
    it, and its secret stops working) and a new one is made; its secret is returned in RV(secret), which the
    action plugin writes into the inventory's vault and removes from the result.
  - Check mode reads only and reports what would be made. Returns the node's certificate fingerprint
    (RV(fingerprint)), the one the API on port 8006 presents.
  - Runs on the managed host with the Python standard library only.
options:
  role:
    description: The role to make (or find with exactly O(privileges)).
    type: str
    required: true
  privileges:
    description:
      - The privileges the role holds. Set by the action plugin from gpulab.pve.privileges (one list for
        README, the lab and this module); a task gives no value.
    type: list
    elements: str
    default: []
  token_id:
    description: The API token, C(USER@REALM!NAME) (the inventory's C(pve_api_token_id)).
    type: str
    required: true
  acl_path:
    description: Where the role is granted to the user and the token.
    type: str
    default: /
  rotate:
    description: Replace an existing token with a new one (the old one is revoked).
    type: bool
    default: false
  kept_in_vault:
    description:
      - Whether the inventory's vault holds a secret for the token (a token that exists is kept only then).
        Set by the action plugin from O(vault_file); a task gives no value.
    type: bool
    default: false
  first_boot_file:
    description:
      - Where the first-boot hook of C(gpulab install-media) wrote the secret of the token it made (JSON
        C({"token_id", "secret"}), readable by root only).
    type: path
    default: /root/.gpulab/pve-api-token.json
  vault_file:
    description: The vault the new token's secret goes into (controller), key C(vault_pve_api_token_secret).
    type: path
    default: "{{ inventory_dir }}/group_vars/all/vault.yml"
  vars_file:
    description: The group_vars file C(pve_api_fingerprint) goes into (controller).
    type: path
    default: "{{ inventory_dir }}/group_vars/all/main.yml"
  comment:
    description: The user's comment, when it is made.
    type: str
    default: gpulab automation (API token only)
  preconditions_only:
    description:
      - Only check, on the controller, what the access needs before it touches the node (a root login, this
        run's vault password opening O(vault_file)), and end there; nothing connects to the node.
      - playbooks/access.yml checks so before it takes the run lock on the node.
    type: bool
    default: false
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Role, user, token and ACLs of gpulab on the node
  gpulab.homelab.pve_access:
    role: gpulab
    token_id: gpulab@pve!ansible
"""

RETURN = r"""
made:
  description: What this run made (or, in check mode, would make), in order.
  type: list
  elements: str
  returned: always
  sample: ["role gpulab", "user gpulab@pve", "token gpulab@pve!ansible", "ACL / gpulab user gpulab@pve"]
removed:
  description: The token removed by O(rotate), if any.
  type: list
  elements: str
  returned: always
secret:
  description: The new token's secret (only when a token was made or adopted, not in check mode); the action plugin removes it from the result.
  type: str
  returned: when a token was made or adopted
adopted:
  description: The node's first-boot secret file whose secret was adopted (the action plugin removes the file).
  type: str
  returned: when the first-boot hook's token was adopted
fingerprint:
  description: SHA-256 fingerprint of the certificate the node's API presents (pveproxy-ssl.pem, else pve-ssl.pem).
  type: str
  returned: always
"""

import json  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


class Refused(Exception):
    pass


class Node:
    def __init__(self, module: AnsibleModule):
        self.module = module

    def run(self, *argv: str) -> str:
        rc, out, err = self.module.run_command(list(argv))
        if rc != 0:
            raise Refused(
                f"`{' '.join(argv[:4])} ...` failed on the node (exit {rc}): {(err or out).strip()}"
            )
        return out

    def json(self, *argv: str):
        return json.loads(self.run(*argv, "--output-format", "json") or "null")

    def get(self, path: str):
        return self.json("pvesh", "get", path)

    def exists(self, path: str) -> bool:
        rc, _out, _err = self.module.run_command(["pvesh", "get", path, "--output-format", "json"])
        return rc == 0


def first_boot_secret(path: str, token_id: str) -> str | None:
    """The secret the first-boot hook wrote for ``token_id``, when its file is there and names that token."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and data.get("token_id") == token_id and data.get("secret"):
        return str(data["secret"])
    return None


ARGUMENT_SPEC = {
    "role": {"type": "str", "required": True},
    "privileges": {"type": "list", "elements": "str", "default": []},
    "token_id": {"type": "str", "required": True},
    "acl_path": {"type": "str", "default": "/"},
    "rotate": {"type": "bool", "default": False},
    "kept_in_vault": {"type": "bool", "default": False},
    "first_boot_file": {"type": "path", "default": "/root/.gpulab/pve-api-token.json"},
    "comment": {"type": "str", "default": "gpulab automation (API token only)"},
    # the controller's part (the action plugin): not used on the node
    "vault_file": {"type": "path", "default": "{{ inventory_dir }}/group_vars/all/vault.yml"},
    "vars_file": {"type": "path", "default": "{{ inventory_dir }}/group_vars/all/main.yml"},
    "preconditions_only": {"type": "bool", "default": False},
}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    result = {"changed": False, "made": [], "removed": []}
    if not p["privileges"]:
        module.fail_json(
            msg="privileges is empty: run this module through its action plugin (it sets them)", **result
        )
    if os.geteuid() != 0:
        who = pwd.getpwuid(os.geteuid()).pw_name
        module.fail_json(
            msg=f"access needs root on the node: pveum and pvesh act as root@pam, and this login is '{who}' "
            f"(uid {os.geteuid()}). Log in as root (ansible_user: root for the node's host) or become root; "
            "an API token cannot make roles, users or tokens. Nothing was changed.",
            **result,
        )
    user, name = p["token_id"].partition("!")[::2]
    if not user or "@" not in user or not name:
        module.fail_json(
            msg=f"pve_api_token_id is {p['token_id']!r}: it must be USER@REALM!TOKEN, e.g. gpulab@pve!ansible",
            **result,
        )
    node = Node(module)
    wanted = set(p["privileges"])
    try:
        certs = node.json("pvenode", "cert", "info")
        by_name = {c.get("filename"): c for c in certs or []}
        cert = by_name.get("pveproxy-ssl.pem") or by_name.get("pve-ssl.pem")
        if cert is None:
            raise Refused(f"pvenode cert info lists no pveproxy-ssl.pem or pve-ssl.pem: {sorted(by_name)}")
        result["fingerprint"] = cert["fingerprint"]
        roles = {r["roleid"]: r for r in node.get("/access/roles")}
        role = roles.get(p["role"])
        if role is not None:
            have = {x for x in str(role.get("privs") or "").split(",") if x}
            if have != wanted:
                missing, extra = sorted(wanted - have), sorted(have - wanted)
                raise Refused(
                    f"role '{p['role']}' exists on the node with other privileges than gpulab's: "
                    f"missing {', '.join(missing) or 'none'}; extra {', '.join(extra) or 'none'}. "
                    "gpulab does not change a role it finds: name another role (-e gpulab_access_role=NAME), "
                    f"or give this one exactly gpulab's privileges (pveum role modify {p['role']} --privs "
                    f'"{",".join(sorted(wanted))}"). Nothing was changed.'
                )
        users = {u["userid"]: u for u in node.get("/access/users")}
        tokens = {t["tokenid"]: t for t in node.get(f"/access/users/{user}/token")} if user in users else {}
        token = tokens.get(name)
        if token is not None and not p["rotate"]:
            if not int(token.get("privsep", 1)):
                raise Refused(
                    f"token {p['token_id']} exists with privilege separation off (it holds all of "
                    f"{user}'s privileges): rerun with -e gpulab_access_rotate=true to replace it by a separated "
                    "one. Nothing was changed."
                )
            adopted = first_boot_secret(p["first_boot_file"], p["token_id"])
            if not p["kept_in_vault"] and adopted is not None:
                result["adopted"] = p["first_boot_file"]
                result["made"].append(
                    f"token {p['token_id']}: its secret from the first boot moved into the vault"
                )
                if not module.check_mode:
                    result["secret"] = adopted
            elif not p["kept_in_vault"]:
                raise Refused(
                    f"token {p['token_id']} exists on the node, but the inventory's vault holds no secret for it, "
                    "and PVE shows a secret only when the token is made: rerun with -e gpulab_access_rotate=true "
                    "to replace it (the old one stops working). Nothing was changed."
                )
        acl = {
            (a["path"], a["type"], a["ugid"], a["roleid"])
            for a in node.get("/access/acl")
            if a.get("propagate", 1)
        }
    except Refused as exc:
        module.fail_json(msg=str(exc), **result)
    steps = []
    if role is None:
        steps.append(
            (f"role {p['role']}", ["pveum", "role", "add", p["role"], "--privs", ",".join(sorted(wanted))])
        )
    if user not in users:
        steps.append((f"user {user}", ["pveum", "user", "add", user, "--comment", p["comment"]]))
    new_token = token is None or p["rotate"]
    if token is not None and p["rotate"]:
        result["removed"].append(f"token {p['token_id']}")
        steps.append((None, ["pveum", "user", "token", "remove", user, name]))
    if new_token:
        steps.append(
            (f"token {p['token_id']}", ["pveum", "user", "token", "add", user, name, "--privsep", "1"])
        )
    path = p["acl_path"]
    if (path, "user", user, p["role"]) not in acl:
        steps.append(
            (
                f"ACL {path} {p['role']} user {user}",
                ["pveum", "acl", "modify", path, "--roles", p["role"], "--users", user],
            )
        )
    if new_token or (path, "token", p["token_id"], p["role"]) not in acl:
        steps.append(
            (
                f"ACL {path} {p['role']} token {p['token_id']}",
                ["pveum", "acl", "modify", path, "--roles", p["role"], "--tokens", p["token_id"]],
            )
        )
    result["made"] = result["made"] + [step[0] for step in steps if step[0]]
    result["changed"] = bool(result["made"] or steps)
    result["diff"] = {
        "before": "".join(f"{x}\n" for x in result["removed"]),
        "after": "".join(f"{x}\n" for x in result["made"]),
        "before_header": f"API access on the node ({p['token_id']})",
        "after_header": f"API access on the node ({p['token_id']})",
    }
    if module.check_mode:
        module.exit_json(**result)
    done = []
    try:
        for what, argv in steps:
            if argv[:4] == ["pveum", "user", "token", "add"]:
                # the action plugin takes the secret out of the result (and writes it into the vault),
                # also when a later step fails
                result["secret"] = node.json(*argv)["value"]
            else:
                node.run(*argv)
            done.append(what or " ".join(argv[1:4]))
    except Refused as exc:
        module.fail_json(msg=f"{exc} (done before it: {', '.join(done) or 'nothing'})", **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
