"""The network lab's Proxmox node host on its own: no lab network, its sshd on 127.0.0.1:PORT.

The host is the one :func:`labsim.network_lab.up` boots as ``node0`` (the same PID 1,
:mod:`labsim.net.hostinit`; the same first-boot files, stand-ins and simulated boots,
:mod:`labsim.net.node_host`), but it shares the machine's network instead of living in a network
namespace on the lab's bridge, so it starts in about a second and needs no lab range, bridge or router.
Its root is a copy-on-write overlay of ``lower`` (the machine's ``/`` by default); every write lands in
``BASE/node/upper``. Needs root (mount and pid namespaces, overlayfs) and sshd.

    node = LoopbackNodeHost(tmp_path, {"boot": {"loader": "grub"}}).start()
    ssh -p {node.port} -i {node.client_key} root@127.0.0.1 ...
    node.calls(), node.boots(), node.set_vms([...]); node.stop()
"""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Any

from labsim import network_lab
from labsim.net import command_standins, node_host

ADDRESS = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDRESS, 0))
        return s.getsockname()[1]


class LoopbackNodeHost:
    """One node host in ``base``; ``node`` is a fixture node entry (``boot.loader``, ``kernel``, ``lab``)."""

    def __init__(self, base: Path, node: dict[str, Any] | None = None, *, lower: str = "/"):
        self.base = Path(base)
        self.node = {"name": "pve", **(node or {})}
        self.lower = lower
        self.hdir = self.base / "node"
        self.upper = self.hdir / "upper"
        self.state = self.hdir / "state"
        #: the node's simulated hardware (sys/, proc/, lib/modules/) as this machine sees it; inside the
        #: node it is bound over /sys and /proc, and all of it at node_host.HW_ROOT
        self.hardware_view = self.state / "view"
        self.client_key = self.base / "ssh" / "id_ed25519"
        self.port = 0
        self.proc: subprocess.Popen | None = None

    def start(self) -> LoopbackNodeHost:
        spec = node_host.node_host_spec(self.node, self.hdir)
        network_lab.prepare_host_dir(
            self.hdir, self.node["name"], ADDRESS, "loopback", spec["files"], spec["tools"]
        )
        host_key = self.upper / network_lab.HOST_KEY.lstrip("/")
        for key in (host_key, self.client_key):
            key.parent.mkdir(parents=True, exist_ok=True)
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        self.port = free_port()
        cfg = {
            "name": self.node["name"],
            "root": str(self.hdir / "root"),
            "upper": str(self.upper),
            "work": str(self.hdir / "work"),
            "lower": self.lower,
            "state": str(self.state),
            "iface": "lo",
            "address": ADDRESS,
            "port": self.port,
            "users": [{"name": "root", "keys": [self.client_key.with_suffix(".pub").read_text()]}],
            "host_key": network_lab.HOST_KEY,
            "sshd_config": network_lab.SSHD_CONFIG,
            **spec["init"],
        }
        cfg_file = self.state / "init.json"
        cfg_file.write_text(json.dumps(cfg, indent=1))
        self.proc = network_lab.start_host_init(cfg_file, [])
        try:
            network_lab.wait_until_booted(self.proc, self.state, self.node["name"])
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End the host: its PID 1 goes, and with it every process, mount and the sshd."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # unshare --kill-child: PID 1 and so the whole pid namespace follow
            self.proc.wait(timeout=10)

    # --- what happened inside ---------------------------------------------------------------------
    def _lines(self, inner: str) -> list[dict[str, Any]]:
        path = self.upper / inner.lstrip("/")
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []

    def calls(self) -> list[dict[str, Any]]:
        """Every stand-in call in the node (time, command, argv, rc), oldest first."""
        return self._lines(command_standins.LOG)

    def boots(self) -> list[dict[str, Any]]:
        """Every boot of the node (time, boot, state, cmdline), the first one included."""
        return self._lines(f"{command_standins.SIM}/boot/boots.jsonl")

    def set_vms(self, rows: list[tuple[int, str, str]]) -> None:
        """The VMs `qm list` shows: (vmid, name, status) rows, as the lab's VM hooks would record them."""
        vms = {
            str(vmid): {"name": name, "status": status, "mem_mb": 4096, "bootdisk_gb": 60, "pid": 4242}
            for vmid, name, status in rows
        }
        (self.state / "pve" / "vms.json").write_text(json.dumps(vms))
