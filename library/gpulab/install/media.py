"""`gpulab install-media`: the Proxmox VE automated install of a lab's node, from the inventory site.yml reads.

:func:`settings` reads the node's install settings (the ``pve_install_*`` variables of its host_vars, with
the defaults the catalogue documents) and what the rest of the inventory already says about the node: its
name and address, the router as gateway and DNS, the LAN's prefix, the GPUs that decide the kernel
command line. :func:`answer_toml` writes the installer's answer file from them, :func:`first_boot_script`
the hook the installer runs on the node's first boot (``first-boot.sh.j2``), and :func:`instructions` the
commands that prepare the ISO or serve the answer. :func:`write` puts the three into a folder.

The root password is written hashed (SHA-512 crypt); a value gpulab does not know is left as a commented
``CHANGE-ME`` line that says what goes there, and `install-media --check` then names it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from gpulab.install import answer as fmt
from gpulab.install.sha512crypt import sha512_crypt
from gpulab.labdef.problems import LabDefinitionError, Problems
from gpulab.pve import privileges

ROOT_PASSWORD_ENV = "GPULAB_PVE_ROOT_PASSWORD"
SECRET_FILE = "/root/.gpulab/pve-api-token.json"
SUITE = "trixie"  # Proxmox VE 9
REPOSITORIES = {"no-subscription": "pve-no-subscription", "enterprise": "pve-enterprise", "test": "pve-test"}
DEFAULT_BLACKLIST = ["nova_core", "nova_drm", "nova", "nouveau"]
DEFAULT_BLACKLIST_MODULES = ["nouveau", "nova_core", "nova_drm", "nova", "nvidiafb"]
MAC = re.compile(r"[0-9A-Fa-f]{2}([:-]?)[0-9A-Fa-f]{2}(\1[0-9A-Fa-f]{2}){4}")
#: the answer's keys that come from the inventory, and the variable each comes from
ANSWER_VARIABLES = {
    "global.keyboard": "pve_install_keyboard",
    "global.country": "pve_install_country",
    "global.timezone": "pve_install_timezone",
    "global.fqdn": "pve_install_fqdn (or pve_node and pve_install_domain)",
    "global.mailto": "pve_install_mailto",
    "global.root-ssh-keys": "pve_install_root_ssh_keys",
    "network.cidr": "ansible_host (and the router's router_subnet or pve_install_prefix)",
    "network.gateway": "pve_install_gateway (or the router's router_address)",
    "network.dns": "pve_install_dns",
    "disk-setup.disk-list": "pve_install_disks",
    "disk-setup.zfs.raid": "pve_install_raid",
    "disk-setup.btrfs.raid": "pve_install_raid",
}


@dataclass
class Settings:
    """What the answer file and the hook are made of, each value resolved once."""

    inventory: str
    host: str
    node: str
    fqdn: str
    address: str
    prefix: int
    gateway: str
    dns: str
    keyboard: str
    country: str | None
    timezone: str
    mailto: str
    root_password_hash: str | None
    root_ssh_keys: list[str]
    nic_mac: str | None
    filesystem: str
    raid: str | None
    disks: list[str]
    repository: str
    cmdline: list[str]
    blacklist_modules: list[str]
    webhook: dict[str, str] | None = None
    notes: list[str] = field(default_factory=list)


def _default_ssh_keys() -> list[str]:
    ssh = Path.home() / ".ssh"
    return [p.read_text().strip() for p in sorted(ssh.glob("*.pub")) if p.is_file()] if ssh.is_dir() else []


def settings(
    groups: dict[str, list[str]], hostvar: Any, inventory: str, node_host: str | None = None
) -> Settings:
    """The node's install settings from the inventory; problems (field, value, why, fix) raise LabDefinitionError."""
    problems = Problems()
    nodes = groups.get("proxmox", [])
    host = node_host or (nodes[0] if len(nodes) == 1 else None)
    if host is None or host not in nodes:
        problems.add(
            "proxmox",
            "--node" if node_host else "hosts",
            node_host or nodes,
            f"install-media writes the install of one node, and {'none' if not nodes else len(nodes)} "
            "node(s) are in group proxmox" + (f" ({node_host} is not one)" if node_host else ""),
            f"name one of {', '.join(nodes)} with --node HOST" if nodes else "add the node to group proxmox",
        )
        raise LabDefinitionError(problems)

    def var(name: str, default: Any = None) -> Any:
        value = hostvar(host, name)
        return default if value in (None, "") else value

    node = var("pve_node", host)
    address = var("ansible_host")
    routers = groups.get("router", [])
    router = routers[0] if routers else None
    gateway = var("pve_install_gateway") or (hostvar(router, "router_address") if router else None)
    subnet = hostvar(router, "router_subnet") if router else None
    prefix = (
        int(str(subnet).rsplit("/", 1)[1]) if subnet and "/" in str(subnet) else var("pve_install_prefix")
    )
    for name, value, fix in (
        ("ansible_host", address, "set the node's address in its host_vars"),
        (
            "router_address",
            gateway,
            "set router_address on the router host (or pve_install_gateway on the node)",
        ),
        ("router_subnet", prefix, "set router_subnet (e.g. 192.168.100.0/24) or pve_install_prefix"),
    ):
        if value is None:
            problems.add(host, name, None, "the answer file's network needs it", fix)
    domain = var("pve_install_domain", "home.arpa")
    fqdn = var("pve_install_fqdn") or f"{node}.{domain}"
    password = var("pve_install_root_password") or os.environ.get(ROOT_PASSWORD_ENV) or None
    if password is not None and len(str(password).encode()) < fmt.ROOT_PASSWORD_MIN_LENGTH:
        problems.add(
            host,
            "pve_install_root_password",
            "(hidden)",
            f"shorter than {fmt.ROOT_PASSWORD_MIN_LENGTH} characters, which the installer refuses",
            "use a longer password (vault_pve_root_password, or the environment variable "
            + ROOT_PASSWORD_ENV
            + ")",
        )
    filesystem = var("pve_install_filesystem", "zfs")
    disks = list(var("pve_install_disks", []))
    raid = var("pve_install_raid")
    if raid is None and filesystem in ("zfs", "btrfs"):
        raid = {1: "raid0", 2: "raid1"}.get(len(disks))
    repository = var("pve_install_repository", "no-subscription")
    if repository not in REPOSITORIES:
        problems.add(
            host,
            "pve_install_repository",
            repository,
            "not a Proxmox VE repository gpulab knows",
            f"use one of {', '.join(REPOSITORIES)}",
        )
    if filesystem not in ("ext4", "xfs", "zfs", "btrfs"):
        problems.add(
            host, "pve_install_filesystem", filesystem, "not ext4, xfs, zfs or btrfs", "use zfs (default)"
        )
    gpus = var("pve_gpus", [])
    nomodeset = var("pve_host_nomodeset")
    if nomodeset in (None, "auto"):
        nomodeset = any(bool(g.get("boot_display")) for g in gpus if isinstance(g, dict))
    cmdline = (["nomodeset"] if nomodeset is True else []) + [
        "modprobe.blacklist=" + ",".join(var("pve_host_cmdline_blacklist", DEFAULT_BLACKLIST))
    ]
    cmdline += list(var("pve_host_cmdline_extra", []))
    for param in cmdline:
        if not re.fullmatch(r"[A-Za-z0-9_.,=:/+-]+", str(param)):
            problems.add(
                host,
                "pve_host_cmdline_extra",
                param,
                "not a kernel parameter the first-boot hook can write (letters, digits and _.,=:/+- only)",
                "correct the parameter",
            )
    nic_mac = var("pve_install_nic_mac")
    if nic_mac is not None and not MAC.fullmatch(str(nic_mac)):
        problems.add(
            host,
            "pve_install_nic_mac",
            nic_mac,
            "not a MAC address (six pairs of hex digits)",
            "give the management NIC's MAC as `ip link` shows it, e.g. aa:bb:cc:dd:ee:ff",
        )
    webhook = None
    if problems:
        raise LabDefinitionError(problems)
    s = Settings(
        inventory=inventory,
        host=host,
        node=node,
        fqdn=fqdn,
        address=str(address),
        prefix=int(prefix),
        gateway=str(gateway),
        dns=str(var("pve_install_dns", gateway)),
        keyboard=var("pve_install_keyboard", "en-us"),
        country=var("pve_install_country"),
        timezone=var("pve_install_timezone", "UTC"),
        mailto=var("pve_install_mailto", f"root@{fqdn}"),
        root_password_hash=sha512_crypt(str(password)) if password else None,
        root_ssh_keys=list(var("pve_install_root_ssh_keys", [])) or _default_ssh_keys(),
        nic_mac=nic_mac,
        filesystem=filesystem,
        raid=raid,
        disks=disks,
        repository=repository,
        cmdline=cmdline,
        blacklist_modules=list(var("pve_host_blacklist_modules", DEFAULT_BLACKLIST_MODULES)),
        webhook=webhook,
    )
    _refuse_values_the_installer_refuses(s)
    return s


def _refuse_values_the_installer_refuses(s: Settings) -> None:
    """The answer's own check on the values the inventory gave, each problem named by its inventory variable
    (a value gpulab leaves to fill in, a CHANGE-ME line, is not one: the command lists those after writing)."""
    problems = Problems()
    for p in fmt.check_text(answer_toml(s)):
        name = ANSWER_VARIABLES.get(p.key)
        if name is not None and p.value is not None:
            problems.add(s.host, name, p.value, p.why + f" (answer.toml's {p.key})", p.fix)
    if problems:
        raise LabDefinitionError(problems)


def _line(key: str, value: Any) -> str:
    return f"{fmt.toml_key(key)} = {fmt.toml_value(value)}"


def answer_toml(s: Settings) -> str:
    """The answer file; unknown values as commented CHANGE-ME lines."""
    out = [
        f"# Proxmox VE automated install of node {s.node}, written by `gpulab install-media` from {s.inventory}.",
        "# Check it with `gpulab install-media --check answer.toml`; README-install.md says how to use it.",
        "",
        "[global]",
        _line("keyboard", s.keyboard),
    ]
    if s.country:
        out.append(_line("country", s.country))
    else:
        out.append('# country = "CHANGE-ME"  # two-letter country code for the mirrors (pve_install_country)')
    out += [_line("fqdn", s.fqdn), _line("mailto", s.mailto), _line("timezone", s.timezone)]
    if s.root_password_hash:
        out.append(_line("root-password-hashed", s.root_password_hash))
    else:
        out.append(
            '# root-password-hashed = "CHANGE-ME"  # give the password as vault_pve_root_password or '
            f"{ROOT_PASSWORD_ENV} and write the file again"
        )
    if s.root_ssh_keys:
        out.append(_line("root-ssh-keys", s.root_ssh_keys))
    else:
        out.append(
            '# root-ssh-keys = ["CHANGE-ME"]  # your public key (pve_install_root_ssh_keys, or ~/.ssh/*.pub)'
        )
    out += [
        'reboot-mode = "reboot"',
        "",
        "[network]",
        'source = "from-answer"',
        _line("cidr", f"{s.address}/{s.prefix}"),
        _line("gateway", s.gateway),
        _line("dns", s.dns),
    ]
    if s.nic_mac:
        out.append(_line("filter.ID_NET_NAME_MAC", "*" + s.nic_mac.lower().replace(":", "").replace("-", "")))
    else:
        out += [
            "# CHANGE-ME on a PC with more than one NIC: the management NIC's MAC (pve_install_nic_mac), as",
            '# filter.ID_NET_NAME_MAC = "*<mac without colons>". As it is, the installer takes the first NIC.',
            _line("filter.ID_NET_NAME_MAC", "*"),
        ]
    out += ["", "[disk-setup]", _line("filesystem", s.filesystem)]
    if s.disks:
        out.append(_line("disk-list", s.disks))
    else:
        out.append(
            '# disk-list = ["CHANGE-ME"]  # the disk(s) to install on, as the installer names them (pve_install_disks)'
        )
    if s.filesystem in ("zfs", "btrfs"):
        if s.raid:
            out.append(_line(f"{s.filesystem}.raid", s.raid))
        else:
            out.append(
                f'# {s.filesystem}.raid = "CHANGE-ME"  # raid0 for one disk, raid1 for two (pve_install_raid)'
            )
    out += ["", "[first-boot]", 'source = "from-iso"', 'ordering = "fully-up"']
    if s.webhook:
        out += ["", "[post-installation-webhook]"]
        out += [_line(k, v) for k, v in s.webhook.items()]
    return "\n".join(out) + "\n"


def first_boot_script(s: Settings) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # a shell script, not HTML
    )
    return env.get_template("first-boot.sh.j2").render(
        node=s.node,
        fqdn=s.fqdn,
        inventory=s.inventory,
        repository=s.repository,
        component=REPOSITORIES[s.repository],
        suite=SUITE,
        blacklist=s.blacklist_modules,
        blacklist_modules=s.blacklist_modules,
        blacklist_file="/etc/modprobe.d/pve-blacklist.conf",
        nomodeset="nomodeset" in s.cmdline,
        params=s.cmdline,
        role=privileges.ROLE,
        user=privileges.USER,
        token_name=privileges.TOKEN_NAME,
        privileges=",".join(privileges.PRIVILEGES),
        secret_file=SECRET_FILE,
    )


def instructions(s: Settings, outdir: Path) -> str:
    params = " ".join(s.cmdline)
    if s.webhook:
        trust = (
            "The node's SSH host keys are new. Before you boot the ISO, start the listener on this machine; the\n"
            f"installer posts the keys to {s.webhook['url']} once it is done (it pins the listener's certificate,\n"
            "the listener checks the answer's token) and the listener writes them into known_hosts:\n\n"
            f"    .venv/bin/gpulab install-media --listen {outdir}\n\nThen:"
        )
    else:
        trust = (
            "The node's SSH host keys are new. Compare the fingerprints the installer shows on the node's console\n"
            f"with `ssh-keyscan {s.address} | ssh-keygen -lf -` before you trust them (or write the files again with\n"
            "`--webhook https://<this machine>:8443/` and let `--listen` receive them), then:"
        )
    if s.webhook:
        base = s.webhook["url"].split("://", 1)[-1].split("/", 1)[0]
        http = (
            "\n    proxmox-auto-install-assistant prepare-iso proxmox-ve_9.*.iso \\\n"
            f"        --fetch-from http --url https://{base}/answer \\\n"
            f"        --cert-fingerprint {s.webhook['cert-fingerprint']} \\\n"
            f'        --answer-auth-token "$(cat webhook/token)" --on-first-boot first-boot.sh\n\n'
            "and keep `gpulab install-media --listen` (step 3) running while the node installs: it serves the\n"
            "answer to the installer (only with the ISO's token, over the certificate the ISO pins) until the\n"
            "installer posts the node's host keys.\n"
        )
    else:
        http = (
            "\n    proxmox-auto-install-assistant prepare-iso proxmox-ve_9.*.iso \\\n"
            "        --fetch-from http --url https://<server>/answer --cert-fingerprint <its SHA-256> \\\n"
            "        --on-first-boot first-boot.sh\n\n"
            "with a server of yours that answers the installer's POST with answer.toml; or write the files with\n"
            "`--webhook https://<this machine>:8443/` and gpulab's `--listen` serves it (the command is then here).\n"
        )
    return f"""# Installing Proxmox VE on {s.node} ({s.address}) without typing

Written by `gpulab install-media {s.inventory} {outdir}`. The three files here:

- `answer.toml`: the installer's answers (check it again with `gpulab install-media --check answer.toml`);
- `first-boot.sh`: runs once on the node's first boot: repositories ({s.repository}), the kernel command line
  and blacklist of stage host, gpulab's API role, user and token (secret in `{SECRET_FILE}`, root only);
- this page.

## 1. Prepare the ISO (on any Debian or Proxmox machine)

    apt install proxmox-auto-install-assistant xorriso
    proxmox-auto-install-assistant prepare-iso proxmox-ve_9.*.iso \\
        --fetch-from iso --answer-file answer.toml --on-first-boot first-boot.sh

Or serve the answer over HTTPS instead of baking it in (the first-boot hook is still baked in):
{http}
## 2. Boot it, with the seed's kernel parameters

Write the prepared ISO to a USB stick and boot the PC from it. If the NVIDIA card is the only display and
the installer's screen stays black or freezes (nouveau or nova on a new card), press `e` at the boot menu's
"Automated Installation" entry and add to its `linux` line:

    {params}

The installer carries every boot parameter it does not use itself into the installed system
(pve-installer 9.2.7, `Proxmox/Install/Config.pm` parse_kernel_cmdline: all but BOOT_IMAGE, root, ramdisk_size,
splash, vga, ro/rw/quiet, proxmox-* and the hdsize-style disk options become `target_cmdline`;
`Proxmox/Install.pm` writes it to `/etc/default/grub.d/installer.cfg` and, on ZFS or btrfs, to
`/etc/kernel/cmdline`). The prepared ISO's entry has no option for extra parameters (prepare-iso only adds
`proxmox-start-auto-installer`), so typed at the menu is the way; first-boot.sh adds them anyway when they
are missing (from the next boot on: stage host reboots the node when `pve_host_reboot_allowed` is true).

## 3. After the install

{trust}

    ansible-playbook playbooks/access.yml -i {s.inventory} --ask-vault-pass   # moves the token's secret into the vault
    .venv/bin/gpulab plan {s.inventory}
    ansible-playbook site.yml -i {s.inventory} --ask-vault-pass
"""


def write(s: Settings, outdir: Path) -> list[Path]:
    """answer.toml, first-boot.sh (mode 0755) and README-install.md in ``outdir`` (made when missing)."""
    outdir.mkdir(parents=True, exist_ok=True)
    files = {
        "answer.toml": answer_toml(s),
        "first-boot.sh": first_boot_script(s),
        "README-install.md": instructions(s, outdir),
    }
    written = []
    for name, text in files.items():
        path = outdir / name
        path.write_text(text)
        path.chmod(0o755 if name.endswith(".sh") else 0o600 if name == "answer.toml" else 0o644)
        written.append(path)
    return written
