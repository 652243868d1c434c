"""A stand-in Proxmox node for the role tests: a real sshd on 127.0.0.1 in its own mount namespace.

Inside the namespace /etc and /usr/sbin are overlays (writes land in the test's directory, never in the
machine's files), /run is a private tmpfs and /proc/sys/kernel/random/boot_id a file of the test. The
node's boot tools are stand-ins that behave like PVE's at the interfaces the role uses:

- `proxmox-boot-tool status|refresh`: `refresh` copies the first line of /etc/kernel/cmdline to the
  simulated ESP entry (systemd-boot), as zz-proxmox-boot does;
- `update-initramfs -u -k all`: snapshots /etc/modprobe.d and /etc/modules into the simulated initramfs
  (and refreshes the ESP on proxmox-boot-tool hosts, as its post-update hook does);
- `update-grub`: evaluates /etc/default/grub with the shell into the simulated grub.cfg command line;
- `qm list`: prints the test's VM table;
- `shutdown`/`reboot`: "boots": the command line comes from the ESP entry or grub.cfg, the module
  configuration from the initramfs snapshot, the state from `sysfs_tree.boot_state`, and the stand-in
  sysfs tree is materialised again; the boot id changes.
So a reboot only shows the new settings when the role ran the refresh handlers. Every call is logged.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLER_CMDLINE = "root=ZFS=rpool/ROOT/pve-1 boot=zfs \n"
PVE_BLACKLIST = (
    "# This file contains a list of modules which are not supported by Proxmox VE \n\n"
    "# nvidiafb see bugreport https://bugzilla.proxmox.com/show_bug.cgi?id=701\nblacklist nvidiafb\n"
)
DEBIAN_MODULES = (
    "# /etc/modules: kernel modules to load at boot time.\n#\n"
    "# This file contains the names of kernel modules that should be loaded\n"
    '# at boot time, one per line. Lines beginning with "#" are ignored.\n'
    "# Parameters can be specified after the module name.\n\n"
)
DEBIAN_GRUB = (
    "# If you change this file, run 'update-grub' afterwards to update\n# /boot/grub/grub.cfg.\n\n"
    "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
    "GRUB_DISTRIBUTOR=`( . /etc/os-release; echo ${NAME:-Debian} ) 2>/dev/null || echo Debian`\n"
    'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\nGRUB_CMDLINE_LINUX=""\n'
)
QM_HEADER = "      VMID NAME                 STATUS     MEM(MB)    BOOTDISK(GB) PID       \n"

BOOT_PY = """
import json, pathlib, sys, uuid
from labsim.sysfs_tree import boot_state, materialise
lab = pathlib.Path(sys.argv[1])
cfg = json.loads((lab / "node.json").read_text())
if cfg["loader"] == "systemd-boot":
    entry = (lab / "esp-cmdline").read_text().strip()
    running = "initrd=\\\\EFI\\\\proxmox\\\\6.17.2-1-pve\\\\initrd.img-6.17.2-1-pve " + entry
else:
    running = (lab / "grub-cmdline").read_text().strip()
initramfs = lab / "initramfs"
modprobe_d = {p.name: p.read_text() for p in (initramfs / "modprobe.d").iterdir()}
modules = (initramfs / "modules").read_text() if (initramfs / "modules").exists() else ""
state = boot_state(running, modprobe_d, modules)
materialise(pathlib.Path(cfg["sysroot"]), state, cmdline=running, **cfg["variant"])
with open(lab / "boot_id", "w") as handle:  # in place: the file is bind-mounted over the boot id
    handle.write(str(uuid.uuid4()) + "\\n")
with open(lab / "calls.log", "a") as handle:
    handle.write(f"boot {state}\\n")
"""


def _script(body: str) -> str:
    return "#!/bin/bash\nset -e\n" + textwrap.dedent(body).lstrip()


class NodeHost:
    """One stand-in node; `start()` brings up its sshd, `stop()` ends it (the namespace goes with it)."""

    def __init__(self, base: Path, *, loader: str = "systemd-boot", variant: dict | None = None):
        self.base = Path(base)
        self.loader = loader
        self.variant = variant or {}
        self.lab = self.base / "lab"
        self.sysroot = self.base / "sysroot"
        self.etc = self.base / "etc-upper"
        self.sbin = self.base / "sbin-upper"
        self.ssh = self.base / "ssh"
        self.port = 0
        self.proc: subprocess.Popen | None = None

    # --- the node's files as the test sees them (the overlay's upper layer) ---
    def etc_file(self, rel: str) -> str:
        return (self.etc / rel).read_text()

    def calls(self) -> list[str]:
        path = self.lab / "calls.log"
        return path.read_text().splitlines() if path.exists() else []

    def set_vms(self, rows: list[tuple[int, str, str]]) -> None:
        lines = [
            f"{vmid:>10} {name:<20} {status:<10} {4096:<10} {60.00:>12.2f} {0 if status != 'running' else 4242:<10}"
            for vmid, name, status in rows
        ]
        (self.lab / "qm-list.txt").write_text(QM_HEADER + "".join(f"{line}\n" for line in lines))

    def _prepare(self) -> None:
        for d in (
            self.lab / "initramfs/modprobe.d",
            self.sysroot,
            self.etc / "kernel",
            self.etc / "default",
            self.etc / "modprobe.d",
            self.base / "etc-work",
            self.sbin,
            self.base / "sbin-work",
            self.ssh,
        ):
            d.mkdir(parents=True, exist_ok=True)
        if self.loader == "systemd-boot":
            (self.etc / "kernel/cmdline").write_text(INSTALLER_CMDLINE)
            (self.etc / "kernel/proxmox-boot-uuids").write_text("9A3B-1C2D\n")
        (self.etc / "default/grub").write_text(DEBIAN_GRUB)
        (self.etc / "modprobe.d/pve-blacklist.conf").write_text(PVE_BLACKLIST)
        (self.etc / "modules").write_text(DEBIAN_MODULES)
        (self.lab / "node.json").write_text(
            json.dumps({"loader": self.loader, "sysroot": str(self.sysroot), "variant": self.variant})
        )
        (self.lab / "boot_id").write_text(str(uuid.uuid4()) + "\n")
        (self.lab / "boot.py").write_text(BOOT_PY)
        self.set_vms([])
        lab, py = self.lab, sys.executable
        esp_sync = f"head -n1 /etc/kernel/cmdline > {lab}/esp-cmdline"
        grub_eval = (
            f"bash -c '. /etc/default/grub; echo BOOT_IMAGE=/boot/vmlinuz-6.17.2-1-pve root=/dev/mapper/pve-root ro"
            f' $GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT\' | tr -s " " > {lab}/grub-cmdline'
        )
        snapshot = (
            f"rm -f {lab}/initramfs/modprobe.d/*; cp /etc/modprobe.d/*.conf {lab}/initramfs/modprobe.d/ 2>/dev/null || true\n"
            f"cp /etc/modules {lab}/initramfs/modules 2>/dev/null || true"
        )
        pbt_host = self.loader == "systemd-boot"
        tools = {
            "proxmox-boot-tool": f"""
                echo "proxmox-boot-tool $*" >> {lab}/calls.log
                case "$1" in
                  status)
                    echo "Re-executing '/usr/sbin/proxmox-boot-tool' in new private mount namespace.."
                    if [ ! -e /etc/kernel/proxmox-boot-uuids ]; then
                      echo "E: /etc/kernel/proxmox-boot-uuids does not exist." >&2; exit 2; fi
                    echo "System currently booted with uefi"
                    echo "9A3B-1C2D is configured with: uefi (versions: 6.17.2-1-pve)" ;;
                  refresh)
                    grep -q 'root=' /etc/kernel/cmdline || {{ echo "No root= parameter in /etc/kernel/cmdline found!" >&2; exit 1; }}
                    {esp_sync} ;;
                  *) exit 1 ;;
                esac
            """,
            "update-initramfs": f"""
                echo "update-initramfs $*" >> {lab}/calls.log
                [ "$*" = "-u -k all" ] || exit 1
                {snapshot}
                {esp_sync if pbt_host else ":"}
                echo "update-initramfs: Generating /boot/initrd.img-6.17.2-1-pve" >&2
            """,
            "update-grub": f"""
                echo "update-grub $*" >> {lab}/calls.log
                {grub_eval}
                echo "Generating grub configuration file ..." >&2; echo done >&2
            """,
            "qm": f"""
                echo "qm $*" >> {lab}/calls.log
                [ "$1" = list ] && cat {lab}/qm-list.txt
            """,
            "shutdown": f"""
                echo "shutdown $*" >> {lab}/calls.log
                {py} {lab}/boot.py {lab}
            """,
        }
        tools["reboot"] = tools["shutdown"].replace('"shutdown $*"', '"reboot $*"')
        for name, body in tools.items():
            path = self.sbin / name
            path.write_text(_script(body))
            path.chmod(0o755)
        # The node as installed: boot once from its initial files.
        if pbt_host:
            (self.lab / "esp-cmdline").write_text(INSTALLER_CMDLINE)
        else:
            subprocess.run(
                ["bash", "-c", grub_eval.replace("/etc/default/grub", str(self.etc / "default/grub"))],
                check=True,
            )
        subprocess.run(["bash", "-c", snapshot.replace("/etc/", f"{self.etc}/")], check=True)
        subprocess.run([py, str(self.lab / "boot.py"), str(self.lab)], check=True, env=os.environ)
        # ssh keys and sshd config
        for key in ("host", "client"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.ssh / key)], check=True
            )
        (self.ssh / "authorized_keys").write_text((self.ssh / "client.pub").read_text())
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        (self.ssh / "sshd_config").write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.ssh / 'host'}\n"
            f"AuthorizedKeysFile {self.ssh / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            f"PidFile {self.ssh / 'sshd.pid'}\nSubsystem sftp internal-sftp\nMaxStartups 50\n"
        )
        os.chmod(self.ssh / "client", 0o600)

    def start(self) -> NodeHost:
        self._prepare()
        b = self.base
        setup = (
            f"set -e\nmount -t overlay overlay -o lowerdir=/etc,upperdir={b}/etc-upper,workdir={b}/etc-work /etc\n"
            f"mount -t overlay overlay -o lowerdir=/usr/sbin,upperdir={b}/sbin-upper,workdir={b}/sbin-work /usr/sbin\n"
            "mount -t tmpfs -o mode=0755 tmpfs /run\nmkdir -p /run/sshd\n"
            f"mount --bind {self.lab}/boot_id /proc/sys/kernel/random/boot_id\n"
            f"exec /usr/sbin/sshd -D -e -f {self.ssh}/sshd_config\n"
        )
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "bash", "-c", setup],
            stdout=open(self.base / "sshd.log", "w"),  # noqa: SIM115 (lives as long as sshd)
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.base / 'sshd.log').read_text()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 10 s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    # --- running the playbook against it ---
    def inventory(self) -> Path:
        inv = {
            "all": {
                "children": {
                    "proxmox": {
                        "hosts": {
                            "pve": {
                                "ansible_host": "127.0.0.1",
                                "ansible_port": self.port,
                                "ansible_user": "root",
                                "ansible_ssh_private_key_file": str(self.ssh / "client"),
                                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
                                "ansible_python_interpreter": "/usr/bin/python3",
                                "pve_node": "pve",
                                "pve_gpus": [
                                    {
                                        "id": "rtx3090",
                                        "pci": "0000:02:00",
                                        "vendor_device": "10de:2204",
                                        "functions": ["0000:02:00.0", "0000:02:00.1"],
                                        "iommu_group": 13,
                                        "boot_display": True,
                                    }
                                ],
                                "pve_host_sysfs_root": str(self.sysroot),
                            }
                        }
                    }
                }
            }
        }
        path = self.base / "inventory.json"
        path.write_text(json.dumps(inv))
        return path

    def play(self, *args: str, extra: dict | None = None) -> tuple[int, str, dict]:
        """Run playbooks/host.yml; returns (rc, output, recap counts for host pve)."""
        cmd = [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(self.inventory()),
            str(ROOT / "playbooks/host.yml"),
            *args,
        ]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=30s",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.base / "cp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_LOCAL_TEMP": str(self.base / "tmp"),
        }
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False
        )
        out = proc.stdout + proc.stderr
        m = re.search(r"^pve\s*:\s*(.*)$", out, re.MULTILINE)
        recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}
        # Long messages come back folded over several lines: callers compare whitespace-normalised text.
        return proc.returncode, " ".join(out.split()), recap
