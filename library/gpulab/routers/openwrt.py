"""OpenWrt over SSH: `config host` sections of /etc/config/dhcp through uci, then commit and reload.

OpenWrt has no Python, so the controller drives it over SSH with plain uci commands. gpulab's own
entries are named sections `gpulab_<mac without colons>` (stable, survive re-ordering); hand-made
host sections (anonymous or named otherwise) are read, and changed or removed only when they hold a
MAC of the lab. The whole batch is staged with uci and committed once (`uci commit dhcp`, then
`/etc/init.d/dnsmasq reload`: a commit from the CLI alone reloads nothing); should a command fail
before the commit, `uci revert dhcp` drops the staged half. Someone else's uncommitted dhcp changes
are never committed or reverted along with gpulab's: the run refuses instead. A run whose connection dropped
between staging and commit leaves only its own staged half (every change on a `gpulab_<mac>` section, in uci's
change list): /etc/config/dhcp was not touched, so dnsmasq serves the previous reservations, and the next run
reverts that half before it reads the table (a check run refuses instead: it writes nothing). Check mode stages the batch, reads
`uci changes dhcp` and reverts it, so uci itself validates the plan. Current addresses come from
the dnsmasq lease file (/tmp/dhcp.leases unless uci says otherwise).
"""

from __future__ import annotations

import re
import shlex

from .dnsmasq import DnsmasqOverShell
from .model import ApplyError, Plan, Reservation, RouterError, ip4, norm_mac
from .shell import Shell

_LINE = re.compile(r"^dhcp\.([A-Za-z0-9_]+)(?:\.([A-Za-z0-9_]+))?=(.*)$")
# one line of `uci changes dhcp` that touches a section gpulab names (section_name): set, option or delete
_OWN_CHANGE = re.compile(r"^-?dhcp\.gpulab_[0-9a-f]{12}(?:[.=+]|$)")


def own_changes_only(changes: str) -> bool:
    """Whether `uci changes dhcp` lists changes, and all of them on gpulab's own sections (an interrupted run's
    staged half)."""
    lines = [line.strip() for line in changes.splitlines() if line.strip()]
    return bool(lines) and all(_OWN_CHANGE.match(line) for line in lines)


def parse_show(text: str) -> dict[str, dict]:
    """`uci -X show dhcp` -> {section: {".type": type, option: value or [values]}}."""
    sections: dict[str, dict] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        sec, opt, raw = m.groups()
        if opt is None:
            sections.setdefault(sec, {})[".type"] = raw
            continue
        values = shlex.split(raw)
        sections.setdefault(sec, {})[opt] = values if len(values) != 1 else values[0]
    return sections


def section_name(mac: str) -> str:
    return "gpulab_" + mac.replace(":", "")


class OpenWrtBackend(DnsmasqOverShell):
    kind = "openwrt"

    def __init__(
        self, shell: Shell, *, leasefile=None, reload_command="/etc/init.d/dnsmasq reload", uci="uci", **kw
    ):
        super().__init__(shell, leasefile=leasefile, reload_command=reload_command, **kw)
        self.uci = uci
        self.check_mode = False
        self._leftovers_checked = False
        # the `uci changes` lines of an interrupted run that this run reverted
        self.dropped_leftovers: list[str] = []

    def _leasefile(self) -> str:
        if not self.leasefile:
            res = self.shell.run(f"{self.uci} -q get 'dhcp.@dnsmasq[0].leasefile'")
            self.leasefile = res.out.strip() if res.rc == 0 and res.out.strip() else "/tmp/dhcp.leases"
        return self.leasefile

    def _drop_own_leftovers(self) -> None:
        """Revert an interrupted run's staged half (only gpulab's sections), before the table is read: uci's
        show would count it as current."""
        if self._leftovers_checked or self.check_mode:
            return
        self._leftovers_checked = True
        pending = self.shell.run(f"{self.uci} changes dhcp")
        if pending.rc == 0 and own_changes_only(pending.out):
            self.shell.check(f"{self.uci} revert dhcp", doing="dropping an interrupted run's staged changes")
            self.dropped_leftovers = pending.out.strip().splitlines()

    def list_reservations(self) -> list[Reservation]:
        self._drop_own_leftovers()
        out = self.shell.check(
            f"{self.uci} -q -X show dhcp", doing="reading /etc/config/dhcp (uci show dhcp)"
        )
        found = []
        for sec, opts in parse_show(out).items():
            if opts.get(".type") != "host" or "ip" not in opts or "mac" not in opts:
                continue
            macs = opts["mac"] if isinstance(opts["mac"], list) else opts["mac"].split()
            for mac in macs:
                try:
                    found.append(Reservation(norm_mac(mac), ip4(opts["ip"]), opts.get("name") or None, sec))
                except ValueError:
                    continue
        return found

    def _commands(self, plan: Plan) -> list[str]:
        q = shlex.quote
        cmds = []
        for c in plan.changes:
            if c.action == "create":
                s = f"dhcp.{section_name(c.after.mac)}"
                cmds += [f"{self.uci} set {s}=host", f"{self.uci} set {q(s + '.mac=' + c.after.mac)}",
                         f"{self.uci} set {q(s + '.ip=' + str(c.after.ip))}"]  # fmt: skip
                if c.after.hostname:
                    cmds.append(f"{self.uci} set {q(s + '.name=' + c.after.hostname)}")
            elif c.action == "update":
                s = f"dhcp.{c.before.ref}"
                cmds.append(f"{self.uci} set {q(s + '.ip=' + str(c.after.ip))}")
                if c.after.hostname:
                    cmds.append(f"{self.uci} set {q(s + '.name=' + c.after.hostname)}")
            else:
                cmds.append(self._delete_cmd(c.before))
        return cmds

    def _delete_cmd(self, r: Reservation) -> str:
        return f"{self.uci} delete dhcp.{r.ref}"

    def _stage(self, plan: Plan) -> None:
        # a section shared by several MACs would change all of them: refuse rather than guess
        shared = self._shared_sections(plan)
        if shared:
            raise RouterError(
                f"the OpenWrt host section(s) {', '.join(shared)} hold several MACs; split them into one "
                "section per MAC in /etc/config/dhcp, then run again"
            )
        pending = self.shell.run(f"{self.uci} changes dhcp")
        if pending.rc == 0 and own_changes_only(pending.out):
            raise RouterError(
                f"/etc/config/dhcp on {self.shell.where} holds staged changes of an interrupted gpulab run (uci "
                "changes dhcp; never committed, so the previous reservations still serve); a run without "
                "--check drops them first. Run without --check, or drop them by hand (uci revert dhcp)"
            )
        if pending.rc == 0 and pending.out.strip():
            raise RouterError(
                f"/etc/config/dhcp on {self.shell.where} has uncommitted changes (uci changes dhcp) that are not "
                "gpulab's; commit or revert them (uci commit dhcp / uci revert dhcp), then run again"
            )
        script = " && ".join(self._commands(plan))
        res = self.shell.run(script)
        if res.rc != 0:
            self.shell.run(f"{self.uci} revert dhcp")
            raise ApplyError(
                f"uci refused the changes on {self.shell.where}, nothing was committed: "
                + ((res.err or res.out).strip() or f"exit {res.rc}")
            )

    def _shared_sections(self, plan: Plan) -> list[str]:
        refs = {c.before.ref for c in plan.changes if c.before is not None}
        counts: dict[str, int] = {}
        for r in plan.before:
            counts[r.ref] = counts.get(r.ref, 0) + 1
        return sorted(ref for ref in refs if counts.get(ref, 0) > 1)

    def apply(self, check_mode: bool = False):
        self.check_mode = check_mode
        return super().apply(check_mode)

    def dry_run(self, plan: Plan) -> None:
        self._stage(plan)
        self.shell.run(f"{self.uci} changes dhcp; {self.uci} revert dhcp")

    def write(self, plan: Plan) -> None:
        self._stage(plan)
        res = self.shell.run(f"{self.uci} commit dhcp")
        if res.rc != 0:
            self.shell.run(f"{self.uci} revert dhcp")
            raise ApplyError(f"uci commit dhcp failed on {self.shell.where}: {(res.err or res.out).strip()}")
        res = self.shell.run(self.reload_command)
        if res.rc != 0:
            raise ApplyError(
                f"the reservations are saved in /etc/config/dhcp on {self.shell.where} but `{self.reload_command}` "
                f"failed ({(res.err or res.out).strip() or res.rc}); reload dnsmasq by hand"
            )
