"""The API access gpulab needs is listed once (gpulab.pve.privileges): README's pveum commands and the
simulated lab's token grant must be the same list. The product and the lab import nothing of each other;
this test reads both."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from gpulab.pve import privileges
from labsim import pve_auth

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The `# pveum ...` commands (root's prompt on the node) of README's console blocks, prompt removed and
    continued lines (a backslash before the line's end, as the shell reads it) joined."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b.replace("\\\n", "") for b in re.findall(r"```console\n(.*?)```", readme, re.S)]
    return [
        ln[2:].split("  #")[0].strip() for b in blocks for ln in b.splitlines() if ln.startswith("# pveum ")
    ]


def test_readme_role_command_grants_exactly_the_privileges_of_the_product():
    roles = [shlex.split(c) for c in readme_commands() if c.startswith("pveum role add ")]
    assert len(roles) == 1, f"README must show one `pveum role add`: {roles}"
    args = roles[0]
    assert args[3] == privileges.ROLE
    listed = re.split(r"[,;\s]+", args[args.index("--privs") + 1].strip())
    assert len(listed) == len(set(listed)), f"a privilege listed twice: {listed}"
    assert set(listed) == set(privileges.PRIVILEGES), (
        f"README's role and gpulab.pve.privileges differ: only in README {sorted(set(listed) - set(privileges.PRIVILEGES))}, "
        f"only in the product {sorted(set(privileges.PRIVILEGES) - set(listed))}"
    )


def test_readme_creates_the_user_the_separated_token_and_both_acls():
    commands = readme_commands()
    for command in privileges.pveum_commands()[1:]:  # the role: the test above
        assert command in commands, f"README lacks `{command}`"
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
