#!/usr/bin/python3
"""Stand-ins for commands a lab host cannot really run: reboot, shutdown, boot-loader and initramfs tools.

Installed into a lab host as ``/usr/local/lib/gpulab/standin.py`` with one small wrapper per command
name (``/usr/sbin/reboot`` runs ``standin.py reboot "$@"``). Standard library only (it runs with the
host's ``/usr/bin/python3``). Every call is appended to ``/var/log/gpulab-standins.log`` as a JSON
line (time, command, arguments, exit code), so tests and the lab can see what a playbook asked for.

Boot-loader state (what the next boot uses) lives in ``/var/lib/gpulab-sim/``:

* ``boot/cmdline``: the command line the boot loader passes, written by ``proxmox-boot-tool refresh``
  (systemd-boot: ``initrd=\\EFI\\proxmox\\<kver>\\initrd.img-<kver>`` + the first line of
  ``/etc/kernel/cmdline``) or by ``update-grub`` on a plain GRUB host (``BOOT_IMAGE=... root=... ro``
  + ``GRUB_CMDLINE_LINUX`` + ``GRUB_CMDLINE_LINUX_DEFAULT`` as ``/etc/default/grub`` and its ``.d``
  snippets set them);
* ``initramfs/``: the ``/etc/modprobe.d`` and ``/etc/modules`` copies ``update-initramfs`` packed.

The lab's node host reads these at each (simulated) boot. Messages follow the real tools' wording and
streams (library/labsim/UPSTREAM.md names the upstream file of each). ``GPULAB_STANDIN_ROOT`` puts every
path the stand-ins read or write under another folder (tests run them on this machine that way).
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time

LOG = "/var/log/gpulab-standins.log"
SIM = "/var/lib/gpulab-sim"
NODE_CONF = "/etc/gpulab-sim/node.json"
RUN = "/run/gpulab"


def host(path):
    """`path` of the lab host, under ``GPULAB_STANDIN_ROOT`` when that is set."""
    return os.environ.get("GPULAB_STANDIN_ROOT", "") + path


def node_conf():
    try:
        with open(host(NODE_CONF)) as f:
            return json.load(f)
    except OSError:
        return {"loader": "none", "kernel": os.uname().release}


def log_call(cmd, argv, rc):
    os.makedirs(os.path.dirname(host(LOG)), exist_ok=True)
    with open(host(LOG), "a") as f:
        f.write(json.dumps({"time": time.time(), "command": cmd, "argv": argv, "rc": rc}) + "\n")


def err(msg):
    print(msg, file=sys.stderr)


def request(what):
    os.makedirs(host(RUN), exist_ok=True)
    with open(os.path.join(host(RUN), what), "w") as f:
        f.write(f"{time.time()}\n")


# --- power ------------------------------------------------------------------------------------------------


def cmd_reboot(argv):
    request("poweroff" if ("-p" in argv or "--poweroff" in argv) else "reboot")
    return 0


def cmd_poweroff(argv):
    request("poweroff")
    return 0


def shutdown_time(when, now=None):
    """The time ``shutdown`` is asked for (systemd's shutdown: ``now``, ``+MINUTES``, ``HH:MM`` today or, when that
    has passed, tomorrow), as seconds since the epoch; None for now."""
    now = time.time() if now is None else now
    if when in ("now", "0", "+0"):
        return None
    if when.startswith("+") and when[1:].isdigit():
        return now + 60 * int(when[1:])
    hour, sep, minute = when.partition(":")
    if sep and hour.isdigit() and minute.isdigit():
        day = time.localtime(now)
        at = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, int(hour), int(minute), 0, 0, 0, -1))
        return at if at > now else at + 86400
    return None


def cmd_shutdown(argv):
    if "-c" in argv:
        return 0
    words = [a for a in argv if not a.startswith("-")]
    when = shutdown_time(words[0] if words else "+1")
    if "-r" in argv or "--reboot" in argv:
        request("reboot")
        what = "Reboot"
    else:
        request("poweroff")
        what = "Shutdown"
    if when is not None:
        # systemd's logind_schedule_shutdown: the action and the time, on stderr (log_info)
        stamp = time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(when))
        err(f"{what} scheduled for {stamp}, use 'shutdown -c' to cancel.")
    return 0


# --- boot loader ------------------------------------------------------------------------------------------
# proxmox-boot-tool, its hooks and its GRUB snippet are proxmox-kernel-helper's: the hooks' warnings go to
# stderr, proxmox-boot-tool's own lines ("Running hook script ...", the namespace re-exec) to stdout.

ESP_LIST = "/etc/kernel/proxmox-boot-uuids"
HOOKS = ("proxmox-auto-removal", "zz-proxmox-boot")


def kernel_cmdline_line():
    try:
        with open(host("/etc/kernel/cmdline")) as f:
            return f.readline().strip()
    except OSError:
        return None


def grub_cmdline(conf):
    etc = host("/etc/default")
    script = (
        f"GRUB_CMDLINE_LINUX=; GRUB_CMDLINE_LINUX_DEFAULT=; . {shlex.quote(etc)}/grub; "
        f'for f in {shlex.quote(etc)}/grub.d/*.cfg; do [ -e "$f" ] && . "$f"; done; '
        'printf "%s\\n%s\\n" "$GRUB_CMDLINE_LINUX" "$GRUB_CMDLINE_LINUX_DEFAULT"'
    )
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    linux, default = [*out, "", ""][:2]
    root = conf.get("grub_root", "root=/dev/mapper/pve-root ro")
    return " ".join(f"BOOT_IMAGE=/boot/vmlinuz-{conf['kernel']} {root} {linux} {default}".split())


def write_boot_cmdline(line):
    os.makedirs(host(f"{SIM}/boot"), exist_ok=True)
    with open(host(f"{SIM}/boot/cmdline"), "w") as f:
        f.write(line + "\n")


def pbt_refresh(conf, hooks=HOOKS, out=print):
    """``proxmox-boot-tool refresh``: run the kernel hooks (`hooks`); zz-proxmox-boot copies the kernels to
    every ESP of the list and writes the boot loader's command line. `out` prints proxmox-boot-tool's own
    stdout lines (update-grub's snippet sends them to /dev/null)."""
    for hook in hooks:
        out(f"Running hook script '{hook}'..")
    if "zz-proxmox-boot" not in hooks:
        return 0
    out("Re-executing '/etc/kernel/postinst.d/zz-proxmox-boot' in new private mount namespace..")
    if not os.path.exists(host(ESP_LIST)):
        err(f"No {ESP_LIST} found, skipping ESP sync.")
        return 0
    line = kernel_cmdline_line()
    if line is not None and "root=" not in line:
        err("No root= parameter in /etc/kernel/cmdline found!")
        return 1
    kver = conf["kernel"]
    err(f"Copying and configuring kernels on /dev/disk/by-uuid/{conf.get('esp_uuid', '1A2B-3C4D')}")
    if conf["loader"] == "systemd-boot":
        err(f"\tCopying kernel and creating boot-entry for {kver}")
        write_boot_cmdline(f"initrd=\\EFI\\proxmox\\{kver}\\initrd.img-{kver} {line or ''}".rstrip())
    else:
        err(f"\tCopying kernel {kver}")
        write_boot_cmdline(grub_cmdline(conf))
    return 0


def cmd_proxmox_boot_tool(argv):
    conf = node_conf()
    sub = argv[0] if argv else ""
    if sub == "refresh":
        hook = argv[argv.index("--hook") + 1] if "--hook" in argv[:-1] else None
        if hook is not None and hook not in HOOKS:
            err(f"E: '{hook}' is not a valid hook script name.")
            return 1
        return pbt_refresh(conf, (hook,) if hook else HOOKS)
    if sub == "status":
        if not os.path.exists(host(ESP_LIST)):
            if "--quiet" not in argv:
                err(f"E: {ESP_LIST} does not exist.")
            return 2
        if "--quiet" in argv:
            return 0
        print("Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace..")
        print("System currently booted with uefi")
        kind = "uefi" if conf["loader"] == "systemd-boot" else "grub"
        print(f"{conf.get('esp_uuid', '1A2B-3C4D')} is configured with: {kind} (versions: {conf['kernel']})")
        return 0
    if sub in ("kernel", "init", "format", "clean", "reinit"):
        return 0
    err("USAGE: /usr/sbin/proxmox-boot-tool <commands> [ARGS]")
    return 1


def cmd_update_grub(argv):
    """``update-grub`` (grub-mkconfig): on a proxmox-boot-tool host its 000_proxmox_boot_header snippet warns and
    runs ``proxmox-boot-tool refresh > /dev/null`` before the rest of the configuration is made."""
    conf = node_conf()
    err("Generating grub configuration file ...")
    if os.path.exists(host(ESP_LIST)):
        err("W: This system is booted via proxmox-boot-tool:")
        err("W: Executing 'update-grub' directly does not update the correct configs!")
        err("W: Running: 'proxmox-boot-tool refresh'")
        err("")
        rc = pbt_refresh(conf, out=lambda _line: None)
        if rc:
            return rc
    else:
        write_boot_cmdline(grub_cmdline(conf))
    err(f"Found linux image: /boot/vmlinuz-{conf['kernel']}")
    err(f"Found initrd image: /boot/initrd.img-{conf['kernel']}")
    err("done")
    return 0


def cmd_update_initramfs(argv):
    """``update-initramfs``: packs /etc/modprobe.d and /etc/modules; then, on a PVE node (proxmox-kernel-helper is
    installed there, not on a guest), its post-update hook proxmox-boot-sync runs ``proxmox-boot-tool refresh
    --hook zz-proxmox-boot``, unless a kernel's installation called it (INITRAMFS_TOOLS_KERNEL_HOOK), whose own
    hooks sync the ESPs."""
    conf = node_conf()
    if not any(a in argv for a in ("-u", "-c", "-d")):
        err("Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]")
        return 1
    if "-d" in argv:
        return 0
    dest = host(f"{SIM}/initramfs")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(f"{dest}/modprobe.d")
    modprobe_d = host("/etc/modprobe.d")
    if os.path.isdir(modprobe_d):
        for name in sorted(os.listdir(modprobe_d)):
            src = os.path.join(modprobe_d, name)
            if name.endswith(".conf") and os.path.isfile(src):
                shutil.copyfile(src, os.path.join(dest, "modprobe.d", name))
    if os.path.isfile(host("/etc/modules")):
        shutil.copyfile(host("/etc/modules"), f"{dest}/modules")
    print(f"update-initramfs: Generating /boot/initrd.img-{conf['kernel']}")
    on_node = conf.get("loader", "none") != "none"  # a guest has no node.json (node_conf's default)
    if on_node and not os.environ.get("INITRAMFS_TOOLS_KERNEL_HOOK"):
        return pbt_refresh(conf, ("zz-proxmox-boot",))
    return 0


def cmd_qm(argv):
    """``qm list`` from the VMs the lab's hooks saw start and stop (the only qm subcommand stood in)."""
    if argv[:1] != ["list"]:
        err(f"qm {' '.join(argv)}: not available in the gpulab lab (its stand-in answers 'qm list' only)")
        return 255
    try:
        with open(host(f"{SIM}/pve/vms.json")) as f:
            vms = json.load(f)
    except (OSError, ValueError):
        vms = {}
    if not vms:
        return 0
    print(f"{'VMID':>10} {'NAME':<20} {'STATUS':<10} {'MEM(MB)':<10} {'BOOTDISK(GB)':>12} {'PID':<10}")
    for vmid in sorted(vms, key=int):
        vm = vms[vmid]
        pid = vm.get("pid", 0) if vm.get("status") == "running" else 0
        disk = f"{float(vm.get('bootdisk_gb', 0)):.2f}"
        print(
            f"{vmid:>10} {vm.get('name', ''):<20} {vm.get('status', ''):<10} {vm.get('mem_mb', 0):<10} {disk:>12} {pid:<10}"
        )
    return 0


def cmd_mokutil(argv):
    """``mokutil --sb-state`` from the VM's firmware settings (OVMF, pre-enrolled keys) the lab wrote."""
    try:
        with open(host("/etc/gpulab-sim/firmware.json")) as f:
            fw = json.load(f)
    except (OSError, ValueError):
        fw = {"efi": False}
    if "--sb-state" not in argv:
        err("gpulab lab stand-in: mokutil answers --sb-state only")
        return 255
    if not fw.get("efi"):
        err("EFI variables are not supported on this system")
        return 1
    print("SecureBoot enabled" if fw.get("secure_boot") else "SecureBoot disabled")
    return 0


#: The signer `modinfo -F signer` prints for the kernel module of each kind: Canonical's key for the precompiled
#: linux-modules-nvidia-* (the "Canonical Ltd. Kernel Module Signing" certificate Ubuntu kernels load); the
#: machine-owner key that Ubuntu's update-secureboot-policy makes for DKMS (its subject, unverified). A signed
#: module package names its own signer in the marker (``signer:``, labsim.net.guest_kernel.SIGNERS).
MODULE_SIGNERS = {
    "signed": "Canonical Ltd. Kernel Module Signing",
    "dkms": "ubuntu Secure Boot Module Signature key",
}


def cmd_modinfo(argv):
    """``modinfo [-F FIELD] nvidia``: the NVIDIA module the lab's package installed (kmod tools/modinfo.c: an
    unknown module is `modinfo: ERROR: Module NAME not found.`, exit 1); other modules are not modelled."""
    field = argv[argv.index("-F") + 1] if "-F" in argv and argv.index("-F") + 1 < len(argv) else None
    names = [a for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] != "-F")]
    name = names[-1] if names else ""
    try:
        with open(host("/usr/lib/gpulab-sim/nvidia-module-installed")) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    kind = lines[0].split() if lines else []
    signers = [ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.startswith("signer:")]
    try:
        with open(host("/etc/gpulab-sim/kernel")) as f:
            running = f.read().strip()
    except OSError:
        running = ""
    # modinfo looks in /lib/modules/$(uname -r): signed modules built for another kernel are not found
    other_kernel = len(kind) > 3 and kind[3] != running
    if name != "nvidia" or len(kind) < 2 or other_kernel:
        err(f"modinfo: ERROR: Module {name} not found.")
        return 1
    signer = signers[0] if signers else MODULE_SIGNERS[kind[1]]
    fields = {"license": "Dual MIT/GPL" if kind[0] == "open" else "NVIDIA", "signer": signer}
    if field:
        print(fields.get(field, ""))
    else:
        for key, value in fields.items():
            print(f"{key + ':':<16}{value}")
    return 0


COMMANDS = {
    "qm": cmd_qm,
    "mokutil": cmd_mokutil,
    "modinfo": cmd_modinfo,
    "reboot": cmd_reboot,
    "poweroff": cmd_poweroff,
    "halt": cmd_poweroff,
    "shutdown": cmd_shutdown,
    "proxmox-boot-tool": cmd_proxmox_boot_tool,
    "update-grub": cmd_update_grub,
    "update-initramfs": cmd_update_initramfs,
}


def main(argv):
    cmd, args = argv[1], argv[2:]
    rc = COMMANDS[cmd](args)
    log_call(cmd, args, rc)
    return rc


def wrapper(cmd, script="/usr/local/lib/gpulab/standin.py"):
    """The /usr/sbin/<cmd> script that runs `cmd` of the stand-ins installed at `script` (this file, by
    default; the disk stand-ins of labsim.net.disk_standins use it too)."""
    return f'#!/bin/sh\nexec /usr/bin/python3 {script} {shlex.quote(cmd)} "$@"\n'


if __name__ == "__main__":
    sys.exit(main(sys.argv))
