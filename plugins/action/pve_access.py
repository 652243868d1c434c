"""Action plugin behind pve_access: the node's part runs over SSH as root (the module), the inventory's
part here on the controller.

Before anything runs on the node it refuses a login that cannot be root there (an account other than root
without become to root: an API token alone cannot make roles, users or tokens) and a run without a vault
password (the token's secret is written only encrypted). It gives the module gpulab's privileges
(gpulab.pve.privileges.PRIVILEGES, the one list) and whether the inventory's vault already holds the token's
secret. From the module's result it takes the new token's secret out, before Ansible shows or logs
anything, and writes it into the vault file (``vault_pve_api_token_secret``, encrypted with the run's own
vault password, the file's other keys kept), and writes the node's certificate fingerprint into the
group_vars file (``pve_api_fingerprint``). Check mode writes nothing; the diff names what would change,
never a secret.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import tempfile
from pathlib import Path

import yaml
from ansible.parsing.vault import VaultLib, VaultSecretsContext, is_encrypted
from ansible.plugins.action import ActionBase
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab.pve import privileges
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    privileges = MissingEngine(err)

VAULT_KEY = "vault_pve_api_token_secret"
FINGERPRINT_KEY = "pve_api_fingerprint"
PLACEHOLDER = "CHANGE-ME"


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def set_yaml_key(text: str, key: str, value: str) -> str:
    """`text` with `key: "value"` in place of its line for `key` (or its commented-out line), else appended."""
    line = f'{key}: "{value}"'
    pattern = re.compile(rf"^#?[ \t]*{re.escape(key)}:.*$", re.M)
    live = re.compile(rf"^{re.escape(key)}:.*$", re.M)
    found = live.search(text) or pattern.search(text)
    if found:
        return text[: found.start()] + line + text[found.end() :]
    return text + ("" if not text or text.endswith("\n") else "\n") + line + "\n"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(
        ("role", "token_id", "acl_path", "rotate", "comment", "vault_file", "vars_file", "preconditions_only")
    )

    def _fail(self, result, msg):
        result.update(failed=True, changed=False, msg=msg)
        return result

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        host = task_vars.get("inventory_hostname", "?")
        inventory_dir = task_vars.get("inventory_dir") or "."
        vault_file = Path(args.get("vault_file") or Path(inventory_dir) / "group_vars" / "all" / "vault.yml")
        vars_file = Path(args.get("vars_file") or Path(inventory_dir) / "group_vars" / "all" / "main.yml")
        login = task_vars.get("ansible_user") or self._play_context.remote_user or getpass.getuser()
        becomes_root = self._play_context.become and (self._play_context.become_user or "root") == "root"
        if login != "root" and not becomes_root:
            return self._fail(
                result,
                f"host {host}: access logs in as '{login}' (ansible_user), not root: pveum makes roles, users "
                "and tokens as root@pam, which an API token or another account cannot. Set ansible_user: root "
                f"for {host} (or become root), or make the access by hand as README's manual steps show. "
                "Nothing was changed.",
            )
        # the run's vault secrets (--ask-vault-pass, --vault-password-file, ...), as ansible-playbook set them up
        context = VaultSecretsContext.current(optional=True)
        secrets = list(context.secrets or []) if context else []
        if not secrets:
            return self._fail(
                result,
                f"no vault password for this run: access writes the token's secret into {vault_file} encrypted "
                "with ansible-vault. Add --ask-vault-pass (or --vault-password-file FILE, or set "
                "ANSIBLE_VAULT_PASSWORD_FILE). Nothing was changed.",
            )
        vault = VaultLib(secrets)
        try:
            plain, was_encrypted = self._read_vault(vault, vault_file)
        except Exception as exc:  # a vault this password cannot open
            return self._fail(
                result,
                f"{vault_file}: cannot read it with this run's vault password ({exc}); give the password it "
                "was encrypted with. Nothing was changed.",
            )
        try:
            current = (yaml.safe_load(plain) or {}).get(VAULT_KEY) if plain else None
        except yaml.YAMLError as exc:
            return self._fail(result, f"{vault_file} is not YAML ({exc}); fix it, nothing was changed")
        kept_in_vault = bool(current) and not str(current).startswith(PLACEHOLDER)
        if args.get("preconditions_only"):
            result.update(changed=False, msg=f"host {host}: the login and the vault are fit for the access")
            return result
        module_args = {
            "role": args.get("role") or privileges.ROLE,
            "privileges": list(privileges.PRIVILEGES),
            "token_id": args.get("token_id") or privileges.TOKEN_ID,
            "acl_path": args.get("acl_path") or privileges.ACL_PATH,
            "rotate": bool(args.get("rotate", False)),
            "kept_in_vault": kept_in_vault,
            **({"comment": args["comment"]} if args.get("comment") else {}),
        }
        # the connection prints a module's raw answer at -vvv unless the play context says no_log: the new
        # token's secret is in it, so it is censored for this call (the task's own result stays visible). The
        # connection keeps a play context of its own (made before the task's copy): both say no_log. Ansible has
        # no public way to censor a connection's -vvv output for one call; this is the one private read left
        # (tests/unit/test_ansible_interfaces.py names it).
        contexts = {id(c): c for c in (self._play_context, self._connection._play_context) if c}
        saved = {k: c.no_log for k, c in contexts.items()}
        try:
            for c in contexts.values():
                c.no_log = True
            node = self._execute_module(
                module_name="gpulab.homelab.pve_access", module_args=module_args, task_vars=task_vars
            )
        finally:
            for k, c in contexts.items():
                c.no_log = saved[k]
        secret = node.pop("secret", None)  # never shown, logged or registered
        result.update(node)
        writes = []
        diff_before, diff_after = (
            [result.get("diff", {}).get("before", "")],
            [result.get("diff", {}).get("after", "")],
        )
        if secret is not None or (result.get("changed") and "token" in " ".join(result.get("made", []))):
            new_plain = set_yaml_key(plain or "---\n", VAULT_KEY, secret or "(new token's secret)")
            diff_before.append(f"{vault_file}: {VAULT_KEY} {'set' if current else 'absent'}\n")
            diff_after.append(f"{vault_file}: {VAULT_KEY} set to the new token's secret (encrypted)\n")
            if secret is not None:
                data = vault.encrypt(new_plain.encode(), secret=secrets[0][1], vault_id=secrets[0][0])
                _write_atomic(vault_file, data, 0o600)
                writes.append(
                    str(vault_file) + ("" if was_encrypted or plain is None else " (now encrypted)")
                )
                if result.get("adopted"):  # the vault holds it now: the node's copy goes
                    removed = self._low_level_execute_command(f"rm -f {shlex.quote(result['adopted'])}")
                    if removed.get("rc") != 0:
                        result.setdefault("warnings", []).append(
                            f"could not remove {result['adopted']} on the node ({removed.get('stderr', '').strip()}); "
                            "remove it by hand: the vault holds the secret now"
                        )
        fingerprint = result.get("fingerprint")
        if fingerprint and not result.get("failed"):
            text = vars_file.read_text() if vars_file.exists() else "---\n"
            new_text = set_yaml_key(text, FINGERPRINT_KEY, fingerprint)
            if new_text != text:
                diff_before.append(
                    f"{vars_file}: "
                    + (self._line(text, FINGERPRINT_KEY) or "(no pve_api_fingerprint)")
                    + "\n"
                )
                diff_after.append(f'{vars_file}: {FINGERPRINT_KEY}: "{fingerprint}"\n')
                if not self._task.check_mode:
                    _write_atomic(
                        vars_file,
                        new_text.encode(),
                        0o644 if not vars_file.exists() else vars_file.stat().st_mode & 0o777,
                    )
                writes.append(str(vars_file))
        if writes:
            result["changed"] = True
        result["written"] = [] if self._task.check_mode else writes
        result["diff"] = {
            "before": "".join(diff_before),
            "after": "".join(diff_after),
            "before_header": f"{host}: API access and the inventory",
            "after_header": f"{host}: API access and the inventory",
        }
        return result

    @staticmethod
    def _line(text: str, key: str) -> str | None:
        found = re.search(rf"^#?[ \t]*{re.escape(key)}:.*$", text, re.M)
        return found.group(0) if found else None

    @staticmethod
    def _read_vault(vault: VaultLib, path: Path) -> tuple[str | None, bool]:
        """The vault file's text (decrypted), and whether it was encrypted; (None, False) when there is none."""
        if not path.exists():
            return None, False
        data = path.read_bytes()
        if is_encrypted(data):
            return vault.decrypt(data).decode(), True
        return data.decode(), False
