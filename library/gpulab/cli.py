"""The `gpulab` command line: `gpulab plan INVENTORY` and `gpulab lab up|down|status`."""

from __future__ import annotations

import argparse
import getpass
import os
import sys


def _plan(args: argparse.Namespace) -> int:
    from ansible.errors import AnsibleError

    from gpulab import inventory, labdef

    password = getpass.getpass("Vault password: ") if args.ask_vault_pass else None
    try:
        groups, hostvar, names = inventory.load(args.inventory, args.vault_password_file, password)
    except Exception as exc:  # the inventory itself does not parse
        return _unreadable(args.inventory, exc)
    try:  # group_vars and host_vars (an encrypted vault among them) are read when first asked for
        definition, problems = labdef.check(groups, hostvar, names)
    except AnsibleError as exc:
        return _unreadable(args.inventory, exc)
    print(f"Plan for {args.inventory}\n")
    print(labdef.plan_text(definition))
    if problems:
        print(f"\nThe lab definition has {len(problems)} problem(s); nothing would be changed:")
        for p in problems:
            print(f"  - {p}")
        return 1
    print("\nThe lab definition is valid.")
    return 0


def _unreadable(inventory: str, exc: Exception) -> int:
    hint = ""
    if "vault" in str(exc).lower():
        hint = " (an encrypted vault.yml: add --ask-vault-pass or --vault-password-file FILE)"
    print(f"gpulab plan: cannot read inventory {inventory}: {exc}{hint}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lab"]:
        # The simulated lab is a package of its own (labsim), run as a program: the product imports none of it.
        os.execv(sys.executable, [sys.executable, "-m", "labsim", *argv[1:]])
    parser = argparse.ArgumentParser(prog="gpulab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="validate a lab definition and print what site.yml would build")
    plan.add_argument("inventory", help="inventory folder, e.g. inventory/homelab")
    vault = plan.add_mutually_exclusive_group()
    vault.add_argument(
        "--vault-password-file", help="to read an encrypted vault.yml: the file with its password"
    )
    vault.add_argument(
        "-J",
        "--ask-vault-pass",
        action="store_true",
        help="to read an encrypted vault.yml: ask for its password",
    )
    plan.set_defaults(func=_plan)
    sub.add_parser("lab", help="the simulated lab: gpulab lab up|down|status [--state DIR] [--fixture FILE]")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
