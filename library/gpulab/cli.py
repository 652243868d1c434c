"""The `gpulab` command line: `gpulab discover USER@HOST INVENTORY`, `gpulab plan INVENTORY`,
`gpulab doctor [USER@]HOST`, `gpulab install-media INVENTORY OUTDIR` (and `--check FILE`) and
`gpulab lab up|down|status`."""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from typing import Any


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
    if getattr(args, "online", False):
        return _plan_online(definition)
    print("\nThe lab definition is valid.")
    return 0


def _plan_online(definition: Any) -> int:
    """`gpulab plan --online`: preflight's download check (gpulab.reach.download_problems) of the image every
    VM's install uses. Preflight checks only files a node does not hold yet; plan cannot ask the nodes."""
    from gpulab import reach, vmspec

    images = [
        (reach.IMAGE_VARS[p["image"]["content"]], p["image"]) for p in vmspec.resolve(definition).values()
    ]
    problems = reach.download_problems(definition.globals, images)
    if problems:
        print(
            f"\nThe lab definition is valid, but {len(problems)} download(s) would fail; nothing would be changed:"
        )
        for p in problems:
            print(f"  - {p}")
        return 1
    if not reach.download_check_on(definition.globals):
        print("\nThe lab definition is valid (gpulab_download_check: false, so no download was checked).")
        return 0
    checked = sorted({img["url"] for _, img in images})
    print(f"\nThe lab definition is valid; checked online: {', '.join(checked) or 'no download'}.")
    return 0


def _discover(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpulab import discover, discover_ssh

    target = Path(args.inventory)
    if target.exists() or target.is_symlink():
        print(
            f"gpulab discover: {target} exists; discover writes a new inventory folder and never overwrites one. "
            "Fix: name a folder that does not exist yet (e.g. inventory/mylab), or move the old one away.",
            file=sys.stderr,
        )
        return 1
    session = _session(args, "discover")
    if session is None:
        return 1
    try:
        raw = discover.collect(
            session.run, session.host, session.user, discover_ssh.public_key_of(args.identity)
        )
    finally:
        session.close()
    try:
        found = discover.analyse(raw)
    except discover.DiscoverError as exc:
        print(f"gpulab discover: {args.target} cannot be used; nothing was written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    files = discover.render(found)
    try:
        written = discover.write_new(target, files)
    except FileExistsError:
        print(f"gpulab discover: {target} appeared meanwhile; nothing was written.", file=sys.stderr)
        return 1
    gpus = ", ".join(f"{g.id} at {g.pci} (IOMMU group {g.iommu_group})" for g in found.gpus)
    vms = ", ".join(f"{v.host} ({v.vmid})" for v in found.vms) or "none"
    print(f"Wrote {target} ({len(written)} files) from node {found.node} of {session.user}@{session.host}:")
    print(f"  GPUs: {gpus}")
    print(f"  VMs{' (proposed: the node has none)' if found.proposed else ''}: {vms}")
    print("Yours to fill (CHANGE-ME, each with a comment above it saying what goes there):")
    for rel, keys in discover.to_fill(files).items():
        print(f"  {rel}: {', '.join(keys)}")
    if not found.proposed and found.vms:
        print("  hosts.yml: the k3s server and agents (commented lines under k3s_server and k3s_agent)")
    print(
        f"and the secrets ({target}/group_vars/all/vault.yml.example; docs/getting-started.md step 6). Then check it with "
        f"`gpulab plan {target}`."
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from gpulab import doctor

    session = _session(args, "doctor")
    if session is None:
        return 1
    try:
        rc, out, err = session.run(doctor.SCRIPT)
    finally:
        session.close()
    if rc != 0 and not out:
        print(f"gpulab doctor: the read on {args.target} failed ({err.strip() or rc}).", file=sys.stderr)
        return 1
    report = doctor.analyse(out)
    print(f"gpulab doctor {session.user}@{session.host} (read-only):")
    print(report.text())
    return 1 if report.blocked else 0


def _session(args: argparse.Namespace, command: str):
    """The SSH session to the node of `args.target`, or None after saying why it could not be opened."""
    from gpulab import discover_ssh

    try:
        return discover_ssh.Session(args.target, args.port, args.identity, args.known_hosts)
    except discover_ssh.SshError as exc:
        print(f"gpulab {command}: {exc}.", file=sys.stderr)
        return None


def _install_media(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from gpulab.install import answer, media

    if args.listen:
        from gpulab.install import listener

        known = Path(args.known_hosts or Path.home() / ".ssh" / "known_hosts")
        try:
            material = listener.load_material(Path(args.listen))
        except OSError:
            print(
                f"gpulab install-media --listen: {args.listen} has no webhook material: write it first with "
                "`gpulab install-media INVENTORY OUTDIR --webhook https://<this machine>:8443/`",
                file=sys.stderr,
            )
            return 1
        print(f"Waiting for the installer's POST on {material.url} (certificate {material.fingerprint}) ...")
        got = listener.serve(Path(args.listen), args.bind, known, timeout=args.timeout)
        if got is None:
            print(
                f"gpulab install-media --listen: no POST with the right token within {args.timeout} s",
                file=sys.stderr,
            )
            return 1
        print(f"{got} into {known}")
        return 0
    if args.check:
        path = Path(args.check)
        try:
            text = path.read_text()
        except OSError as exc:
            print(f"gpulab install-media --check: cannot read {path}: {exc}", file=sys.stderr)
            return 1
        run_env = json.loads(Path(args.run_env).read_text()) if args.run_env else None
        udev = json.loads(Path(args.udev).read_text()) if args.udev else None
        problems = answer.check_text(text, run_env, udev)
        if problems:
            print(f"{path}: the Proxmox VE installer would refuse it ({len(problems)} problem(s)):")
            for p in problems:
                print(f"  - {p}")
            return 1
        checked = (
            "with the machine's runtime description"
            if run_env or udev
            else "(rules that need the machine: at install)"
        )
        print(f"{path}: accepted by the answer format of {answer.PINNED['pve-installer']} {checked}.")
        return 0
    if not args.inventory or not args.outdir:
        print("gpulab install-media: give INVENTORY and OUTDIR, or --check FILE", file=sys.stderr)
        return 2
    from ansible.errors import AnsibleError

    from gpulab import inventory
    from gpulab.labdef.problems import LabDefinitionError

    password = getpass.getpass("Vault password: ") if args.ask_vault_pass else None
    try:
        groups, hostvar, _names = inventory.load(args.inventory, args.vault_password_file, password)
        found = media.settings(groups, hostvar, args.inventory, args.node)
    except LabDefinitionError as exc:
        print(
            f"gpulab install-media: {args.inventory} cannot make an install ({len(exc.problems)} problem(s)):"
        )
        for p in exc.problems:
            print(f"  - {p}")
        return 1
    except (AnsibleError, Exception) as exc:  # the inventory itself does not parse
        return _unreadable(args.inventory, exc, "install-media")
    outdir = Path(args.outdir)
    if args.webhook:
        from gpulab.install import listener

        material = listener.make_material(outdir, args.webhook, found.address)
        found.webhook = {
            "url": args.webhook,
            "cert-fingerprint": material.fingerprint,
            "auth-token": material.token,
        }
    for path in media.write(found, outdir):
        print(f"wrote {path}")
    problems = answer.check_text((outdir / "answer.toml").read_text())
    if problems:
        print(
            "\nThe answer file still has values to fill in (CHANGE-ME lines), or the installer would refuse it:"
        )
        for p in problems:
            print(f"  - {p}")
        return 1
    print(f"\nanswer.toml is accepted by the answer format of {answer.PINNED['pve-installer']}.")
    print(f"Next: {outdir / 'README-install.md'} (prepare the ISO, boot it, then access.yml and site.yml).")
    return 0


def _unreadable(inventory: str, exc: Exception, command: str = "plan") -> int:
    hint = ""
    if "vault" in str(exc).lower():
        hint = " (an encrypted vault.yml: add --ask-vault-pass or --vault-password-file FILE)"
    print(f"gpulab {command}: cannot read inventory {inventory}: {exc}{hint}", file=sys.stderr)
    return 1


def _node_command(
    sub: argparse._SubParsersAction, name: str, func: Any, target: tuple[str, str], **texts: str
) -> argparse.ArgumentParser:
    """A command that reads a node over SSH (discover, doctor): its login argument (`target`: metavar and
    help), the SSH login options, and `func` to run; `texts` are its help and description."""
    parser = sub.add_parser(name, **texts)
    parser.add_argument("target", metavar=target[0], help=target[1])
    parser.set_defaults(func=func)
    parser.add_argument("-i", "--identity", metavar="KEY", help="the SSH private key to log in with")
    parser.add_argument("-p", "--port", type=int, default=22, help="the node's SSH port (default 22)")
    parser.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="a known_hosts file to trust besides ~/.ssh/known_hosts (host keys are always checked)",
    )
    return parser


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
    plan.add_argument(
        "--online",
        action="store_true",
        help="also check, from here, each OS image's URL and its pinned checksum against the folder's "
        "SHA256SUMS (preflight's check; gpulab_download_check: false skips it)",
    )
    plan.set_defaults(func=_plan)
    disc = _node_command(
        sub,
        "discover",
        _discover,
        ("USER@HOST", "the node's SSH login, e.g. root@192.168.100.5"),
        help="read a Proxmox VE node over SSH and write a new inventory folder for it",
        description="Read the node (pvesh, /sys, ip route) over SSH and write INVENTORY, a new folder in "
        "inventory/homelab's layout. Values it cannot read and those you must decide are CHANGE-ME, which "
        "`gpulab plan` refuses until they are filled. It never overwrites: INVENTORY must not exist.",
    )
    disc.add_argument("inventory", metavar="INVENTORY", help="the folder to write, e.g. inventory/mylab")
    _node_command(
        sub,
        "doctor",
        _doctor,
        ("[USER@]HOST", "the node's SSH login (root when no user is given)"),
        help="read a Proxmox VE node over SSH and say, per NVIDIA card, what passthrough needs (read-only)",
        description="Read the node's /sys, /proc and package versions over SSH (nothing is written) and report per "
        "NVIDIA card: IOMMU and interrupt remapping, the IOMMU group's other devices, the driver bound now, the "
        "boot display's framebuffer, reset methods, BAR sizes against the guest's address width, the PVE version; "
        "each finding with its fix. Exit 0 when nothing blocks passthrough, 1 otherwise.",
    )
    media = sub.add_parser(
        "install-media",
        help="write the Proxmox VE automated install of the node (answer.toml, first-boot hook), or check one",
        description="From the inventory site.yml reads, write OUTDIR/answer.toml (the Proxmox VE automated "
        "installer's answers: the node's address, the router as gateway and DNS, the root password hashed, your "
        "SSH keys, ZFS by default), OUTDIR/first-boot.sh (repositories, the kernel command line and blacklist of "
        "stage host, gpulab's API role, user and token) and OUTDIR/README-install.md (the exact commands). "
        "With --check FILE, check any answer file against the installer's rules instead.",
    )
    media.add_argument(
        "inventory", nargs="?", metavar="INVENTORY", help="inventory folder, e.g. inventory/mylab"
    )
    media.add_argument("outdir", nargs="?", metavar="OUTDIR", help="the folder to write the files into")
    media.add_argument(
        "--node", metavar="HOST", help="the node's inventory host, when group proxmox has several"
    )
    media.add_argument(
        "--check", metavar="FILE", help="check an answer file (any, not only gpulab's) and exit"
    )
    media.add_argument(
        "--run-env",
        metavar="JSON",
        help="with --check: the installer's runtime description (run-env-info.json) for the rules that need it",
    )
    media.add_argument(
        "--udev",
        metavar="JSON",
        help="with --check: the machine's udev properties (run-env-udev.json), for the NIC and disk filters",
    )
    media.add_argument(
        "--webhook",
        metavar="URL",
        help="with INVENTORY OUTDIR: the installer posts the new node's host keys to this URL of this machine "
        "(https://ADDRESS:PORT/), where `--listen OUTDIR` waits; the answer pins its certificate",
    )
    media.add_argument(
        "--listen",
        metavar="OUTDIR",
        help="wait for the installer's POST (OUTDIR written with --webhook) and write the node's host keys; "
        "meanwhile serve answer.toml at /answer to an ISO prepared with --fetch-from http",
    )
    media.add_argument("--bind", default="0.0.0.0", help="with --listen: the address to listen on")
    media.add_argument("--known-hosts", metavar="FILE", help="with --listen: default ~/.ssh/known_hosts")
    media.add_argument("--timeout", type=float, default=3600, help="with --listen: seconds to wait (3600)")
    mvault = media.add_mutually_exclusive_group()
    mvault.add_argument("--vault-password-file", help="the file with the vault's password")
    mvault.add_argument("-J", "--ask-vault-pass", action="store_true", help="ask for the vault's password")
    media.set_defaults(func=_install_media)
    sub.add_parser("lab", help="the simulated lab: gpulab lab up|down|status [--state DIR] [--fixture FILE]")
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
