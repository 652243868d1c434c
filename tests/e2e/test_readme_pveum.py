"""The docs' manual way to the API access (docs/getting-started.md step 3, the `# pveum ...` and `# pvenode`
commands), typed as they stand on a bare lab node (no gpulab user yet): the token they make works against the
HTTPS API, and only with both ACLs. With privilege separation a token holds a privilege only where its user
holds it too, so the token is refused (PVE's 403) until the user's ACL is there. `pvenode cert info` prints
the fingerprint the API presents. One bare lab (about 20 s)."""

from __future__ import annotations

import json
import re

import doc_commands
import pytest

from gpulab.pve import privileges

from .helpers import RunningLab
from .test_access import on_node, token_call

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _run(lab: RunningLab, command: str) -> str:
    done = on_node(lab, command)
    assert done.returncode == 0, f"`{command}` on the node: rc={done.returncode}\n{done.stdout}{done.stderr}"
    return done.stdout


def test_readme_s_pveum_commands_make_a_token_that_works_only_with_both_acls(bare: RunningLab) -> None:
    commands = doc_commands.root_commands("pveum")
    user_acl = next(c for c in commands if c.startswith("pveum acl modify") and "--users" in c)
    secret = None
    for command in commands:
        if command == user_acl:
            continue  # typed last, below: without it the separated token may do nothing
        out = _run(bare, command)
        if command.startswith("pveum user token add"):
            found = re.search(r"^│ value\s*│ (\S+)\s*│$", out, re.M)
            assert found, f"`{command}` printed no value row:\n{out}"
            secret = found.group(1)
    assert secret

    refused = token_call(bare, secret)  # the node's status: Sys.Audit on /nodes/<node>
    assert refused.status_code == 403, (refused.status_code, refused.text)
    assert token_call(bare, secret, path="/version").status_code == 200  # the token itself is valid

    _run(bare, user_acl)
    allowed = token_call(bare, secret)
    assert allowed.status_code == 200, (allowed.status_code, allowed.text)

    # the role README's command made holds exactly the product's privileges
    roles = {r["roleid"]: r for r in json.loads(_run(bare, "pveum role list --output-format json"))}
    assert set(roles[privileges.ROLE]["privs"].split(",")) == set(privileges.PRIVILEGES)


def test_readme_s_pvenode_command_prints_the_fingerprint_the_api_presents(bare: RunningLab) -> None:
    assert "pvenode cert info" in doc_commands.root_commands("pvenode")
    out = _run(bare, "pvenode cert info")
    fingerprints = re.findall(r"\b((?:[0-9A-F]{2}:){31}[0-9A-F]{2})\b", out)
    assert bare.info["fingerprint"] in fingerprints, out
