"""The Huawei ONT's web form in front of the lab router's real dnsmasq (fixture ``network.router: huawei_ont``).

The reference lab's router is a Huawei EchoLife ONT: its "DHCP Static IP Configuration" page is the only way
to reserve an address, and its DHCP server hands the reservations out at once. In a lab of that kind the router
host runs this service next to dnsmasq: the simulator of :mod:`labsim.routers.huawei` (the same pages, login,
tokens and refusals) bound to the router's lab address, whose static table is

* kept in a state file (an ONT keeps its table across restarts), and
* after each add, set or del the firmware accepts, written to dnsmasq's ``--dhcp-hostsfile`` (one
  ``mac,address`` line per enabled entry; temp file + rename), then dnsmasq gets SIGHUP. dnsmasq re-reads a
  dhcp-hostsfile on SIGHUP (dnsmasq(8), ``--dhcp-hostsfile``; shared/reference/routers-evidence T2/T3: a
  renewing client then gets its reservation), so the next lease a MAC gets is the reservation the form made.

The page of LAN DHCP clients (``GetLanUserDhcpInfo.asp``) lists dnsmasq's own lease file (expiry, MAC,
address, host name per line), the leases the VMs really hold.

    python -m labsim.routers.lab_ont CONFIG.json

CONFIG holds ``address``, ``port``, ``lan`` (the router's address/prefix), ``user``, ``password``,
``hosts_file``, ``leases_file``, ``pid_file`` and ``state_file``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .base import Reply, Request
from .huawei import HuaweiOntSim


def hosts_lines(entries: dict[int, dict[str, Any]]) -> str:
    """dnsmasq's dhcp-hostsfile for the ONT's table: ``mac,address`` per enabled entry, in table order."""
    return "".join(f"{e['mac']},{e['ip']}\n" for _, e in sorted(entries.items()) if str(e["enable"]) == "1")


def read_leases(path: Path, now: float | None = None) -> list[dict[str, Any]]:
    """dnsmasq's lease file as the ONT's client list: name, ip, mac, seconds left (86400 for an infinite one)."""
    now = time.time() if now is None else now
    out = []
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[0].isdigit():
            continue  # dnsmasq's `duid` line and anything else
        expiry = int(parts[0])
        remain = 86400 if expiry == 0 else int(expiry - now)
        if remain <= 0:
            continue
        out.append({"name": "" if parts[3] == "*" else parts[3], "ip": parts[2], "mac": parts[1].lower(),
                    "remain": remain})  # fmt: skip
    return out


class LabOnt(HuaweiOntSim):
    """The simulator whose static table is dnsmasq's reservations (see the module docstring)."""

    def __init__(self, *, hosts_file, leases_file, pid_file, state_file, **kw):
        super().__init__(**kw)
        self.hosts_file, self.leases_file = Path(hosts_file), Path(leases_file)
        self.pid_file, self.state_file = Path(pid_file), Path(state_file)
        with contextlib.suppress(OSError, ValueError):
            saved = json.loads(self.state_file.read_text())
            self.entries = {int(n): e for n, e in saved.items()}

    def _hosts_page(self) -> str:
        self.hosts = read_leases(self.leases_file)
        return super()._hosts_page()

    def _write(self, req: Request, op: str) -> Reply:
        before = json.dumps(self.entries, sort_keys=True)
        reply = super()._write(req, op)
        if json.dumps(self.entries, sort_keys=True) != before:
            self._commit()
        return reply

    def _commit(self) -> None:
        for path, text in (
            (self.state_file, json.dumps({str(n): e for n, e in self.entries.items()}, indent=1) + "\n"),
            (self.hosts_file, hosts_lines(self.entries)),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".ont-tmp")
            tmp.write_text(text)
            os.replace(tmp, path)
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(self.pid_file.read_text().split()[0]), signal.SIGHUP)


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[1]).read_text())
    ont = LabOnt(
        user=cfg["user"],
        password=cfg["password"],
        lan=cfg["lan"],
        bind=cfg["address"],
        port=int(cfg["port"]),
        hosts_file=cfg["hosts_file"],
        leases_file=cfg["leases_file"],
        pid_file=cfg["pid_file"],
        state_file=cfg["state_file"],
    ).start()
    print(ont.url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    ont.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
