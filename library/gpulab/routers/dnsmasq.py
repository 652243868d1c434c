"""dnsmasq over SSH: one dhcp-hostsfile owned by gpulab, re-read on SIGHUP; the lease file for
current addresses. Serves the lab's router host, a Raspberry Pi or any Debian router.

dnsmasq must be started with `--dhcp-hostsfile=<hostsfile>` (or `dhcp-hostsfile=` in its config):
`dhcp-host=` lines in dnsmasq.conf are NOT re-read on SIGHUP, a hostsfile is (dnsmasq 2.90, verified).
The file is rewritten in one rename, so dnsmasq never reads half of it. Lines gpulab cannot parse are
kept as they are.
"""

from __future__ import annotations

import shlex

from .backend import Backend
from .model import ApplyError, Lease, Plan, Reservation, ip4, norm_mac
from .shell import Shell


def parse_leases(text: str) -> list[Lease]:
    """dnsmasq lease file: `<expiry-epoch> <mac> <ip> <hostname|*> <client-id|*>` (IPv6 after `duid`)."""
    leases = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[0] == "duid" or ":" in parts[2]:
            continue
        try:
            expiry = int(parts[0])
            mac = norm_mac(parts[1])
            ip = ip4(parts[2])
        except ValueError:
            continue
        host = parts[3] if len(parts) > 3 and parts[3] != "*" else None
        leases.append(Lease(mac, ip, host, None if expiry == 0 else expiry))
    return leases


def parse_host_line(line: str) -> Reservation | None:
    """One dhcp-hostsfile line (`mac,ip[,hostname][,lease-time]`), or None when it is not one of those."""
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    mac = ip = host = None
    for field in (f.strip() for f in text.split(",")):
        if not field:
            continue
        if mac is None and ip is None:
            try:
                mac = norm_mac(field)
                continue
            except ValueError:
                pass
        if ip is None:
            try:
                ip = ip4(field)
                continue
            except ValueError:
                pass
        if (
            host is None
            and ip is not None
            and ":" not in field
            and not field[:1].isdigit()
            and field not in ("infinite", "ignore")
        ):
            host = field
    if mac is None or ip is None:
        return None
    return Reservation(mac, ip, host)


def format_host_line(r: Reservation) -> str:
    return f"{r.mac},{r.ip}" + (f",{r.hostname}" if r.hostname else "")


class DnsmasqOverShell(Backend):
    """A dnsmasq that gpulab reaches through a shell on its router (this module's backend and OpenWrt's): the
    shell, the lease file its current addresses come from and the command that makes it re-read its hosts."""

    def __init__(self, shell: Shell, *, leasefile: str | None, reload_command: str | None, **kw):
        super().__init__(**kw)
        self.shell = shell
        self.leasefile = leasefile
        self.reload_command = reload_command

    def _leasefile(self) -> str:
        return self.leasefile or ""

    def list_leases(self) -> list[Lease]:
        return parse_leases(self.shell.read(self._leasefile()) or "")

    def close(self) -> None:
        self.shell.close()


class DnsmasqBackend(DnsmasqOverShell):
    kind = "dnsmasq"

    def __init__(
        self,
        shell: Shell,
        *,
        hostsfile: str = "/etc/dnsmasq.gpulab-hosts",
        leasefile: str = "/var/lib/misc/dnsmasq.leases",
        pidfile: str = "/run/dnsmasq/dnsmasq.pid",
        reload_command: str | None = None,
        check_wiring: bool = True,
        **kw,
    ):
        super().__init__(shell, leasefile=leasefile, reload_command=reload_command, **kw)
        self.hostsfile = hostsfile
        self.pidfile = pidfile
        self.wiring_check = check_wiring
        self._lines: list[str] | None = None

    def _read_hosts(self) -> list[str]:
        text = self.shell.read(self.hostsfile)
        self._lines = (text or "").splitlines()
        return self._lines

    def list_reservations(self) -> list[Reservation]:
        out = []
        for n, line in enumerate(self._read_hosts()):
            r = parse_host_line(line)
            if r is not None:
                out.append(Reservation(r.mac, r.ip, r.hostname, ref=str(n)))
        return out

    def render(self, plan: Plan) -> str:
        """The new hostsfile: untouched lines stay in place, changed ones are replaced, new ones appended."""
        lines = list(self._lines if self._lines is not None else self._read_hosts())
        drop = set()
        for c in plan.changes:
            if c.action == "update":
                lines[int(c.before.ref)] = format_host_line(c.after)
            elif c.action == "delete":
                drop.add(int(c.before.ref))
        lines = [ln for n, ln in enumerate(lines) if n not in drop]
        if not any(ln.startswith("# managed by gpulab") for ln in lines):
            lines.insert(
                0, "# managed by gpulab: one line per MAC (mac,address[,hostname]); re-read on SIGHUP"
            )
        lines.extend(format_host_line(c.after) for c in plan.changes if c.action == "create")
        return "\n".join(lines) + "\n"

    def check_wiring(self) -> None:
        """Refuse to write a hostsfile that the running dnsmasq does not read (it would change nothing).

        Looks for `dhcp-hostsfile=<hostsfile>` in dnsmasq's command line, then in the config files it
        names (--conf-file, --conf-dir) and the Debian defaults (/etc/dnsmasq.conf, /etc/dnsmasq.d).
        """
        pf, hf = shlex.quote(self.pidfile), shlex.quote(self.hostsfile)
        script = (
            f'p=$(cat {pf} 2>/dev/null); [ -n "$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = dnsmasq ] || exit 3; '
            f"args=$(tr '\\0' '\\n' < /proc/$p/cmdline); "
            f'printf "%s\\n" "$args" | grep -qxF -- "--dhcp-hostsfile="{hf} && exit 0; '
            "files=$(printf '%s\\n' \"$args\" | sed -n 's/^--conf-file=//p; s/^--conf-dir=\\([^,]*\\).*/\\1/p'); "
            f'grep -rsqxE -- "[[:space:]]*dhcp-hostsfile="{hf}"[[:space:]]*" $files /etc/dnsmasq.conf /etc/dnsmasq.d '
            "&& exit 0; exit 4"
        )
        res = self.shell.run(script)
        if res.rc == 3:
            raise ApplyError(
                f"no running dnsmasq behind {self.pidfile} on {self.shell.where}: start dnsmasq (with "
                f"--pid-file={self.pidfile}) or set router_options.pidfile, then run again"
            )
        if res.rc != 0:
            raise ApplyError(
                f"the dnsmasq on {self.shell.where} does not read {self.hostsfile}, so reservations written "
                f"there would never be handed out: add the line `dhcp-hostsfile={self.hostsfile}` to "
                "/etc/dnsmasq.d/gpulab.conf and restart dnsmasq once (or set router_options.hostsfile to the "
                "file it reads), then run again"
            )

    def dry_run(self, plan: Plan) -> None:
        if self.wiring_check:
            self.check_wiring()

    def write(self, plan: Plan) -> None:
        if self.wiring_check:
            self.check_wiring()
        self.shell.write_atomic(self.hostsfile, self.render(plan))
        self._apply()

    def _apply(self) -> None:
        if self.reload_command:
            cmd = self.reload_command
        else:
            pf = shlex.quote(self.pidfile)
            cmd = (
                f'p=$(cat {pf} 2>/dev/null) && [ -n "$p" ] && '
                f'[ "$(cat /proc/$p/comm 2>/dev/null)" = dnsmasq ] && kill -HUP "$p"'
            )
        res = self.shell.run(cmd)
        if res.rc != 0:
            raise ApplyError(
                f"wrote {self.hostsfile} on {self.shell.where} but could not make dnsmasq re-read it: "
                f"no running dnsmasq behind {self.pidfile}. Start dnsmasq with "
                f"--dhcp-hostsfile={self.hostsfile} --pid-file={self.pidfile} (or set router_dnsmasq_pidfile), "
                "then run again"
            )
