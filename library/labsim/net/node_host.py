"""What the lab's Proxmox node host carries, and what it does at each simulated boot.

:func:`node_host_spec` gives the node's first-boot files (``/etc/kernel/cmdline`` with the reference
content, ``/etc/default/grub``, ``/etc/modprobe.d/pve-blacklist.conf``, ``/etc/modules``, the
stand-ins of :mod:`labsim.net.command_standins`) and the boot hook and views of its PID 1
(:mod:`labsim.net.hostinit`).

At each boot, :func:`boot` (run by PID 1 as ``python -m labsim.net.node_host ...``) takes the
command line the boot loader holds and the modprobe configuration the initramfs holds, asks
:func:`labsim.sysfs_tree.boot_state` which state the node reaches (stock, blacklisted or
vfio) and materialises that ``/sys`` + ``/proc`` view, which PID 1 then binds over the host's own.
Each boot is recorded in ``/var/lib/gpulab-sim/boot/``: ``last-boot.json`` and, one JSON line per boot,
``boots.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from labsim import fixture, sysfs_tree
from labsim.net import command_standins, pve_tools, pveproxy

STANDINS_LOG = command_standins.LOG
NODE_COMMANDS = (
    "reboot",
    "poweroff",
    "halt",
    "shutdown",
    "proxmox-boot-tool",
    "update-grub",
    "update-initramfs",
    "qm",
)
#: real PVE's command-line tools, answered by the lab's API (labsim.net.pve_tools)
PVE_TOOLS = ("pvesh", "pveum", "pvenode")
PVE_TOOLS_SCRIPT = "/usr/local/lib/gpulab/pve_tools.py"
#: the node's HTTPS API port (pveproxy's), and the forwarder that serves it (labsim.net.pveproxy)
API_PORT = 8006
PVEPROXY_SCRIPT = "/usr/local/lib/gpulab/pveproxy.py"
#: in the node tools' folder (STATE/node-api): the API server's HTTPS socket for port 8006
#: (labsim.pve_api_server.NODE_PROXY_SOCKET, not imported: PID 1 runs this module at every boot)
PVEPROXY_SOCKET = "pveproxy.sock"
HW_ROOT = "/var/lib/gpulab-sim/hw"
GUEST_COMMANDS = ("reboot", "poweroff", "halt", "shutdown")

CLOUD_INIT_STANDIN = """#!/bin/sh
# gpulab lab stand-in for cloud-init: the lab's VM hooks applied the user, keys and network already.
case "$1" in
  status) echo "status: done"; exit 0 ;;
  --version|-v) echo "/usr/bin/cloud-init 25.1.4-0ubuntu0~24.04.1"; exit 0 ;;
  *) exit 0 ;;
esac
"""
REFERENCE_KERNEL_CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs"
DEBIAN_DEFAULT_GRUB = """# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
# For full documentation of the options in this file, see:
#   info -f grub -n 'Simple configuration'

GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR=`( . /etc/os-release && echo ${NAME} )`
GRUB_CMDLINE_LINUX_DEFAULT="quiet"
GRUB_CMDLINE_LINUX=""
"""
PVE_BLACKLIST = """# This file contains a list of modules which are not supported by Proxmox VE

# nvidiafb see bugreport https://bugzilla.proxmox.com/show_bug.cgi?id=701
blacklist nvidiafb
"""
DEBIAN_MODULES = """# /etc/modules: kernel modules to load at boot time.
#
# This file contains the names of kernel modules that should be loaded
# at boot time, one per line. Lines beginning with "#" are ignored.
# Parameters can be specified after the module name.

"""


def _standin_files(commands) -> dict[str, str]:
    files = {"/usr/local/lib/gpulab/standin.py": Path(command_standins.__file__).read_text()}
    for cmd in commands:
        files[f"/usr/sbin/{cmd}"] = command_standins.wrapper(cmd)
    return files


#: stand-ins every VM has, with or without systemd (firmware and initramfs tools of a real guest)
GUEST_TOOLS = ("mokutil", "update-initramfs", "modinfo")


def guest_standins(power: bool = True) -> dict[str, str]:
    """The lab's tools in a VM host: firmware/initramfs stand-ins, and power commands without systemd."""
    return _standin_files((GUEST_COMMANDS if power else ()) + GUEST_TOOLS)


def loader_of(node: dict[str, Any]) -> str:
    """``systemd-boot`` (ZFS on UEFI, proxmox-boot-tool) or ``grub`` (a plain GRUB host)."""
    return "grub" if str((node.get("boot") or {}).get("loader", "systemd-boot")) == "grub" else "systemd-boot"


def dpkg_status(pve: dict[str, Any]) -> str:
    """The node's /var/lib/dpkg/status as far as the lab knows its packages: pve-manager (the fixture's PVE
    version) and qemu-server (``pve.qemu_server``), in dpkg's status format (deb-status(5)); the node never
    shows this machine's own package database."""
    packages = (
        ("pve-manager", str(pve["version"]), "admin"),
        ("qemu-server", str(pve["qemu_server"]), "admin"),
    )
    return "\n".join(
        f"Package: {name}\nStatus: install ok installed\nPriority: optional\nSection: {section}\n"
        f"Maintainer: Proxmox Support Team <support@proxmox.com>\nArchitecture: amd64\nVersion: {version}\n"
        for name, version, section in packages
    )


def node_host_spec(
    node: dict[str, Any],
    hdir: Path,
    api_dir: Path | None = None,
    address: str | None = None,
    pve: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """First-boot files, lab tools and PID-1 settings of the node host kept in ``hdir``.

    ``api_dir`` is the API server's folder for the node's own tools (its socket and root@pam's credential,
    ``STATE/node-api``): bound at ``/var/lib/gpulab-sim/api``, where ``pvesh``, ``pveum`` and ``pvenode``
    find the API. With ``address`` (the node's own), the node also runs ``pveproxy``
    (:mod:`labsim.net.pveproxy`): ``https://ADDRESS:8006`` is the API, as on a real node. ``pve`` (the
    fixture's) gives the PVE packages' versions in the node's dpkg status."""
    loader = loader_of(node)
    kernel = str(node.get("kernel") or sysfs_tree.KERNEL_RELEASE)
    conf: dict[str, Any] = {"loader": loader, "kernel": kernel, "esp_uuid": "1A2B-3C4D"}
    pci = node.get("pci") or []
    if pci and {str(d["id"]).lower() for d in pci} != sysfs_tree.reference_addresses():
        # another PC than the reference (a second cluster node): its hardware view is made from its own
        # devices, and its boot decides on its own card
        conf.update(pci=pci, gpu_cards=sysfs_tree.gpu_cards_of(pci))
    if node.get("hardware"):
        conf["hardware"] = node["hardware"]
    files = {
        "/etc/default/grub": DEBIAN_DEFAULT_GRUB,
        "/etc/modprobe.d/pve-blacklist.conf": PVE_BLACKLIST,
        "/etc/modules": DEBIAN_MODULES,
        # the node's own package database (what `gpulab doctor` reads the PVE version from)
        "/var/lib/dpkg/status": dpkg_status(pve or fixture.DEFAULT_PVE),
    }
    # the lab's own tools in the host: rewritten at every start, so a newer lab brings newer ones
    tools = {"/etc/gpulab-sim/node.json": json.dumps(conf, indent=1) + "\n", **_standin_files(NODE_COMMANDS)}
    tools[PVE_TOOLS_SCRIPT] = Path(pve_tools.__file__).read_text()
    for cmd in PVE_TOOLS:
        tools[f"/usr/bin/{cmd}"] = command_standins.wrapper(cmd, PVE_TOOLS_SCRIPT)
    if loader == "systemd-boot":
        # the installer's line has a trailing space when it got no extra arguments; a fixture may give
        # the line the user left there (node.lab.kernel_cmdline, e.g. a seeded lab's GPU blacklist)
        line = str((node.get("lab") or {}).get("kernel_cmdline") or "").strip()
        files["/etc/kernel/cmdline"] = (
            f"{line}\n" if line and line != REFERENCE_KERNEL_CMDLINE else REFERENCE_KERNEL_CMDLINE + " \n"
        )
        files["/etc/kernel/proxmox-boot-uuids"] = conf["esp_uuid"] + "\n"
        files["/etc/default/grub.d/zfs.cfg"] = (
            'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX root=ZFS=rpool/ROOT/pve-1 boot=zfs"\n'
        )
    # node files as their owner or an earlier run left them (fixture seed.node.files)
    files.update((node.get("lab") or {}).get("files") or {})
    state = hdir / "state"
    view, real_sys, pve = state / "view", state / "realsys", state / "pve"
    real_sys.mkdir(parents=True, exist_ok=True)
    pve.mkdir(parents=True, exist_ok=True)
    views = [
        (str(view / "sys"), "/sys"),
        (str(real_sys / "class" / "net"), "/sys/class/net"),
        (str(real_sys / "devices" / "virtual"), "/sys/devices/virtual"),
        (str(view / "proc" / "cmdline"), "/proc/cmdline"),
        (str(view / "proc" / "modules"), "/proc/modules"),
        (str(view / "proc" / "sys" / "kernel" / "osrelease"), "/proc/sys/kernel/osrelease"),
        # what `gpulab doctor` reads besides /sys (sysfs_tree.hardware_files): interrupt chips, address widths,
        # framebuffers and the firmware's reserved ranges, the node's own and not this machine's
        *((str(view / "proc" / name), f"/proc/{name}") for name in ("interrupts", "cpuinfo", "fb", "iomem")),
        (str(view / "lib" / "modules"), "/lib/modules"),
        # the VMs the lab runs on this node, kept up to date by the VM hooks (read by the qm stand-in)
        (str(pve), f"{command_standins.SIM}/pve"),
        # the API server's socket and root credential for pvesh, pveum and pvenode (as real PVE's tools
        # run as root on the node and reach the same cluster state as the API)
        *([(str(api_dir), pve_tools.NODE_API)] if api_dir is not None else []),
        # the whole hardware view in one tree (sys, proc, lib/modules), for readers that take a root
        # directory: a kernel without module support has no /proc/modules to lay the view over
        (str(view), HW_ROOT),
    ]
    hook = [sys.executable, "-m", "labsim.net.node_host", str(view), json.dumps(_sysfs_options(node))]
    init: dict[str, Any] = {"boot_hook": hook, "views": views, "real_sys": str(real_sys)}
    if api_dir is not None and address:
        # bound to the node's lab address (the lab's listeners never take 0.0.0.0); started at each boot
        tools[PVEPROXY_SCRIPT] = Path(pveproxy.__file__).read_text()
        socket_path = f"{pve_tools.NODE_API}/{PVEPROXY_SOCKET}"
        init["services"] = [
            {
                "name": "pveproxy",
                "argv": ["/usr/bin/python3", PVEPROXY_SCRIPT, address, str(API_PORT), socket_path],
            }
        ]
    return {"files": files, "tools": tools, "init": init}


def _sysfs_options(node: dict[str, Any]) -> dict[str, Any]:
    lab = node.get("lab") or {}
    return {"iommu": bool(lab.get("iommu", True)), "share_group_with": lab.get("share_group_with")}


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _modprobe_d(directory: Path) -> dict[str, str]:
    if not directory.is_dir():
        return {}
    return {
        p.name: p.read_text() for p in sorted(directory.iterdir()) if p.name.endswith(".conf") and p.is_file()
    }


def boot(root: Path, view: Path, options: dict[str, Any]) -> dict[str, Any]:
    """One simulated boot of the node whose merged root is ``root``: decide its state, write ``view``."""
    sim = root / command_standins.SIM.lstrip("/")
    conf = json.loads(_read(root / command_standins.NODE_CONF.lstrip("/")) or "{}")
    kernel = conf.get("kernel", sysfs_tree.KERNEL_RELEASE)
    cmdline = (_read(sim / "boot" / "cmdline") or "").strip()
    if not cmdline:
        # first boot: what the installer left in the boot loader
        line = (_read(root / "etc/kernel/cmdline") or REFERENCE_KERNEL_CMDLINE).splitlines()[0].strip()
        if conf.get("loader") == "grub":
            cmdline = f"BOOT_IMAGE=/boot/vmlinuz-{kernel} root=/dev/mapper/pve-root ro quiet"
        else:
            cmdline = f"initrd=\\EFI\\proxmox\\{kernel}\\initrd.img-{kernel} {line}"
        (sim / "boot").mkdir(parents=True, exist_ok=True)
        (sim / "boot" / "cmdline").write_text(cmdline + "\n")
    initramfs = sim / "initramfs"
    if not initramfs.is_dir():
        # first boot: the initramfs the installer built from the files it installed
        (initramfs / "modprobe.d").mkdir(parents=True)
        for name, text in _modprobe_d(root / "etc/modprobe.d").items():
            (initramfs / "modprobe.d" / name).write_text(text)
    modprobe_d = _modprobe_d(initramfs / "modprobe.d")
    modules_load = _read(root / "etc/modules") or ""
    mld = root / "etc/modules-load.d"
    if mld.is_dir():
        modules_load += "".join(p.read_text() for p in sorted(mld.glob("*.conf")) if p.is_file())
    # each card reaches its own state; the node's is its first card's (the reference card on the reference PC)
    cards = conf.get("gpu_cards") or [None]
    states = {
        min(card or sysfs_tree.GPU_FUNCTIONS): sysfs_tree.boot_state(cmdline, modprobe_d, modules_load, card)
        for card in cards
    }
    state = next(iter(states.values()))
    sysfs_tree.materialise(
        view,
        state,
        iommu=options.get("iommu", True),
        share_group_with=options.get("share_group_with"),
        cmdline=cmdline,
        pci=conf.get("pci"),
        card_states=states,
        hardware=conf.get("hardware"),
    )
    result = {"boot": int(os.environ.get("GPULAB_BOOT", "0")), "state": state, "cmdline": cmdline}
    if len(states) > 1:
        result["cards"] = states
    (sim / "boot" / "last-boot.json").write_text(json.dumps(result) + "\n")
    with open(sim / "boot" / "boots.jsonl", "a") as history:  # every boot, for readers that count them
        history.write(json.dumps({"time": time.time(), **result}) + "\n")
    return result


def main(argv: list[str]) -> int:
    root = Path(os.environ["GPULAB_HOST_ROOT"])
    boot(root, Path(argv[1]), json.loads(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
