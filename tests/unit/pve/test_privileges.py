"""The API access gpulab needs is listed once (gpulab.pve.privileges): the docs' pveum commands
(library/gpulab/data/commands.yml) and the simulated lab's token grant must be the same list, and it is the list the engine's own API calls need (read
from its source and the PVE schema's permission entries). The product and the lab import nothing of each other;
this test reads both."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import doc_commands

from gpulab.pve import privileges
from labsim import pve_auth

ROOT = Path(__file__).resolve().parents[3]


def test_readme_role_command_grants_exactly_the_privileges_of_the_product():
    roles = [shlex.split(c) for c in doc_commands.root_commands("pveum") if c.startswith("pveum role add ")]
    assert len(roles) == 1, f"the docs must show one `pveum role add`: {roles}"
    args = roles[0]
    assert args[3] == privileges.ROLE
    listed = re.split(r"[,;\s]+", args[args.index("--privs") + 1].strip())
    assert len(listed) == len(set(listed)), f"a privilege listed twice: {listed}"
    assert set(listed) == set(privileges.PRIVILEGES), (
        f"the docs' role and gpulab.pve.privileges differ: only in the docs {sorted(set(listed) - set(privileges.PRIVILEGES))}, "
        f"only in the product {sorted(set(privileges.PRIVILEGES) - set(listed))}"
    )


def test_readme_creates_the_user_the_separated_token_and_both_acls():
    commands = doc_commands.root_commands("pveum")
    for command in privileges.pveum_commands()[1:]:  # the role: the test above
        assert command in commands, f"the docs lack `{command}`"
    acls = [shlex.split(c) for c in commands if c.startswith("pveum acl modify ")]
    granted = {(a[3], a[a.index("--roles") + 1], a[-2], a[-1]) for a in acls}
    # privilege separation: the token holds only what both it and its user hold, so both get the role
    assert ("/", privileges.ROLE, "--users", privileges.USER) in granted
    assert ("/", privileges.ROLE, "--tokens", privileges.TOKEN_ID) in granted


def test_the_simulated_lab_grants_its_token_exactly_the_privileges_of_the_product():
    lab = set(pve_auth.PROJECT_PRIVS)
    product = set(privileges.PRIVILEGES)
    assert lab == product, f"only in labsim: {sorted(lab - product)}; only in gpulab: {sorted(product - lab)}"
    assert product <= set(pve_auth.ALL_PRIVS)


def test_the_simulated_lab_token_is_the_products():
    creds = pve_auth.new_credentials()
    assert f"{creds['token_user']}!{creds['token_name']}" == privileges.TOKEN_ID


# ---------------------------------------------------------------------------------------------------------
# The list derived from the code: the API calls the engine makes (every client.get/post/put/delete whose path
# is a literal, found by reading library/gpulab's source) and what the PVE schema's permission entries of
# those calls check. It cannot rot: a call added without its privilege, or a privilege no call checks, fails.

ENGINE = ROOT / "library" / "gpulab"
# run as root over SSH (gpulab discover): not the token's calls
NOT_TOKEN_CALLS = {"discover.py", "discover_ssh.py"}
PRIV_RE = re.compile(
    r"\b(?:VM|Datastore|Sys|SDN|Mapping|Pool|Realm|Group|User|Permissions)\.[A-Za-z.]*[A-Za-z]"
)


def _path_of(node, assigned: dict[str, str]) -> str | None:
    """An API path argument as a schema template (`nodes/{node}/qemu/{vmid}/config`), or None."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return assigned.get(node.attr)
    if not isinstance(node, ast.JoinedStr):
        return None
    out = ""
    for part in node.values:
        if isinstance(part, ast.Constant):
            out += str(part.value)
            continue
        inner = part.value
        name = (
            inner.attr
            if isinstance(inner, ast.Attribute)
            else inner.id
            if isinstance(inner, ast.Name)
            else None
        )
        if (
            isinstance(inner, ast.Attribute)
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "self"
            and inner.attr in assigned
        ):
            out += assigned[inner.attr]
            continue
        if name is None:
            return None
        out += "{" + name + "}"
    return out


def _literal_arguments(tree, function: str, param: str) -> set[str]:
    """The string literals the module passes as `param` of its function `function` (``self._power("start")``)."""
    import ast

    positions = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            names = [a.arg for a in node.args.args]
            positions[function] = names.index(param) - (1 if names and names[0] == "self" else 0)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            pos = positions.get(name)
            if pos is not None and len(node.args) > pos and isinstance(node.args[pos], ast.Constant):
                found.add(str(node.args[pos].value))
    return found


def engine_calls() -> set[tuple[str, str]]:
    """(METHOD, /schema/template) of every API call of the engine with a literal path."""
    import ast

    calls = set()
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name in NOT_TOKEN_CALLS:
            continue
        tree = ast.parse(path.read_text())
        assigned = {}
        for node in ast.walk(tree):  # self.base = f"nodes/{spec.node}/qemu/{spec.vmid}"
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    found = _path_of(node.value, {})
                    if found:
                        assigned[t.attr] = found
        for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:  # every call is in one
            params = [a.arg for a in func.args.args]
            for node in ast.walk(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                    continue
                method = node.func.attr
                if method not in ("get", "post", "put", "delete"):
                    continue
                owner = node.func.value
                if not (isinstance(owner, ast.Name) and owner.id == "client") and not (
                    isinstance(owner, ast.Attribute) and owner.attr == "client"
                ):
                    continue
                found = _path_of(node.args[0], assigned)
                if not found or not re.match(r"^(nodes|cluster|version|access)\b", found):
                    continue
                # a path segment that is an argument of the function: each literal the module passes for it
                variants = [found]
                for param in params:
                    if "{" + param + "}" in found:
                        values = _literal_arguments(tree, func.name, param)
                        if values:  # else a real path parameter (node, vmid, ...)
                            variants = [
                                v.replace("{" + param + "}", x) for v in variants for x in sorted(values)
                            ]
                calls.update((method.upper(), "/" + v) for v in variants)
    return calls


def schema_entries() -> dict[tuple[str, str], dict]:
    """(METHOD, path) -> the PVE schema's method info, from the committed subset (every endpoint the lab
    serves: each call of the engine must be one, or its tests could not run)."""
    from labsim.pve_schema import load_schema

    return {
        (method, path): info
        for path, by_method in load_schema().endpoints.items()
        for method, info in by_method.items()
    }


def _match(template: str, entries: dict) -> str | None:
    """The schema path a call's template is (the engine's placeholder names may differ)."""
    shape = re.sub(r"\{[^}]+\}", "{}", template)
    for _method, path in entries:
        if re.sub(r"\{[^}]+\}", "{}", path) == shape:
            return path
    return None


def _checks(check, needed: set, alternatives: list, named: set) -> None:
    """Collect from a schema `check`: privileges needed outright, lists of which one suffices, all named."""
    if not check:
        return
    op = check[0]
    if op == "perm":
        privs = list(check[2])
        named.update(privs)
        if len(check) > 3 and check[3] == "any":
            alternatives.append(set(privs))
        else:
            needed.update(privs)
    elif op == "and":
        for sub in check[1:]:
            _checks(sub, needed, alternatives, named)
    elif op == "or":
        branches = []
        for sub in check[1:]:
            n, a = set(), []
            _checks(sub, n, a, named)
            branches.append(n | set().union(*a) if a else n)
        alternatives.append(set().union(*branches))


def test_the_engine_s_calls_are_found_in_the_schema():
    calls = engine_calls()
    entries = schema_entries()
    assert {m for m, _ in calls} == {"GET", "POST", "PUT", "DELETE"}, calls
    assert ("POST", "/nodes/{node}/qemu") in calls and ("GET", "/nodes/{node}/hardware/pci") in calls
    assert ("POST", "/nodes/{node}/qemu/{vmid}/status/start") in calls
    missing = [
        c for c in calls if _match(c[1], entries) is None or (c[0], _match(c[1], entries)) not in entries
    ]
    assert missing == [], f"calls of the engine the PVE schema does not have: {missing}"


def test_the_privileges_are_exactly_what_the_engine_s_calls_check():
    entries = schema_entries()
    needed, alternatives, named = set(), [], set()
    for method, template in sorted(engine_calls()):
        info = entries[(method, _match(template, entries))]
        perms = info.get("permissions") or {}
        _checks(perms.get("check"), needed, alternatives, named)
        named.update(PRIV_RE.findall(perms.get("description") or ""))  # checked in the call's code
    product = set(privileges.PRIVILEGES)
    assert needed <= product, (
        f"privileges the engine's calls need that the role lacks: {sorted(needed - product)}"
    )
    for choice in alternatives:
        assert choice & product, (
            f"the role holds none of {sorted(choice)}, one of which a call of the engine needs"
        )
    assert product <= named, (
        f"privileges of the role that no call of the engine checks: {sorted(product - named)}"
    )
