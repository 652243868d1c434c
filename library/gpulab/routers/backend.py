"""The one interface every router backend implements, and the run that drives it.

A run is: list leases and reservations, stage wishes with `ensure`/`remove`, then `apply` once:
plan (all refusals happen here, before any write), write the whole batch, apply it on the router
once (SIGHUP, config-set + config-write, reconfigure, commit + reload), and verify by re-reading
the router's table. In check mode `apply` stops after planning (plus a backend's own dry run where
it has one, e.g. Kea's config-test).
"""

from __future__ import annotations

import abc
import dataclasses
import ipaddress
import time

from .model import (
    Change,
    Desired,
    Free,
    Lease,
    Plan,
    Reservation,
    RouterError,
    VerifyError,
    make_plan,
    norm_mac,
)


@dataclasses.dataclass
class Result:
    changed: bool
    changes: list[Change]
    before: list[Reservation]
    after: list[Reservation]
    reservations: dict[str, Reservation]  # mac -> reservation the lab holds after the run
    # inventory name -> the address reserved for it after the run, for each staged MAC that has a name
    addresses: dict[str, str] = dataclasses.field(default_factory=dict)
    # what the run did besides its changes (e.g. finished what a cut-off run left half done)
    notes: list[str] = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "changed": self.changed,
            "changes": [
                {
                    "action": c.action,
                    "mac": (c.after or c.before).mac,
                    "before": c.before.as_dict() if c.before else None,
                    "after": c.after.as_dict() if c.after else None,
                    "summary": c.describe(),
                }
                for c in self.changes
            ],
            "reservations": {mac: r.as_dict() for mac, r in sorted(self.reservations.items())},
            "addresses": dict(self.addresses),
            "notes": list(self.notes),
        }

    def diff(self) -> dict:
        def text(rs):
            return "".join(r.line() + "\n" for r in sorted(rs, key=lambda r: (r.mac, int(r.ip))))

        return {"before": text(self.before), "after": text(self.after)}


class Backend(abc.ABC):
    """Base class of router backends.

    Subclasses implement `list_leases`, `list_reservations` and either `write` (batch routers:
    edit a whole document, apply it once) or `_create`/`_update`/`_delete` plus `_apply`
    (routers with one call per entry). Refusals shared by all routers live in `make_plan`;
    router-specific limits are the class attributes below.
    """

    kind = "abstract"
    in_pool_allowed = True
    supports_hostname = True
    max_reservations: int | None = None

    def __init__(self, *, subnet=None, pool=None, name: str | None = None, address=None):
        self.address = ipaddress.IPv4Address(str(address)) if address else None  # the router's own
        self.subnet = ipaddress.IPv4Network(subnet, strict=False) if subnet else None
        self.pool = None
        if pool:
            start, end = (ipaddress.IPv4Address(str(pool[k])) for k in ("start", "end"))
            self.pool = (start, end)
        self.name = name or self.kind
        self._present: list[Desired] = []
        self._absent: list[str] = []
        self._free: list[Free] = []

    # --- what the router holds ---------------------------------------------------------------
    @abc.abstractmethod
    def list_leases(self) -> list[Lease]: ...

    @abc.abstractmethod
    def list_reservations(self) -> list[Reservation]: ...

    # --- staging --------------------------------------------------------------------------------
    def ensure(
        self, mac: str, ip=None, hostname: str | None = None, *, current_address=None, name=None, expect=None
    ) -> None:
        """Stage a reservation for `mac`: `ip` None keeps the address it holds, which must then be `expect`
        when given (see Desired)."""
        self._present.append(Desired.make(mac, ip, hostname, current_address, name, expect))

    def keep_free(
        self, ip, host: str | None = None, field: str | None = None, what: str | None = None
    ) -> None:
        """Stage an address no device may lease or have reserved (a VIP the lab holds): the plan refuses
        when the router gives it to a MAC (see Free)."""
        self._free.append(Free.make(ip, host, field, what))

    def remove(self, mac: str) -> None:
        """Stage the removal of every reservation of `mac`."""
        self._absent.append(norm_mac(mac))

    # --- one batch per run --------------------------------------------------------------------
    def plan(self) -> Plan:
        return make_plan(
            self._present,
            self.list_reservations(),
            self.list_leases(),
            absent=self._absent,
            subnet=self.subnet,
            pool=self.pool,
            in_pool_allowed=self.in_pool_allowed,
            max_reservations=self.max_reservations,
            supports_hostname=self.supports_hostname,
            router=self.name,
            own_address=self.address,
            now=time.time(),
            free=self._free,
        )

    def apply(self, check_mode: bool = False) -> Result:
        """Plan, refuse or write the whole batch once, verify by re-reading. Returns the Result."""
        try:
            plan = self.plan()
            unapplied = False
            notes = []
            if plan.changes and check_mode:
                self.dry_run(plan)
            elif plan.changes:
                self.write(plan)
                self.verify(plan)
            elif self.unapplied():
                # an earlier run saved the whole table and was cut off before its apply step: the router
                # holds what the lab wants but does not serve it yet
                unapplied = True
                notes.append(
                    f"{self.name} {self.unapplied_check_note if check_mode else self.unapplied_note}"
                )
                if not check_mode:
                    self._apply()
            addresses = {
                d.name: str(plan.resolved[d.mac].ip)
                for d in self._present
                if d.name and d.mac in plan.resolved
            }
        finally:
            self._present, self._absent, self._free = [], [], []
        return Result(
            bool(plan.changes) or unapplied,
            plan.changes,
            plan.before,
            plan.after,
            plan.resolved,
            addresses,
            notes,
        )

    # Result.notes when unapplied() was true: what the run did about it, or would do in check mode
    unapplied_note = "applied the changes a cut-off run had saved but not applied"
    unapplied_check_note = (
        "would apply the changes a cut-off run saved but did not apply; they are not served yet"
    )

    def unapplied(self) -> bool:
        """Whether the router holds saved changes its apply step has not put into service yet (routers with
        an apply step that can tell; an interrupted run leaves them). A run whose plan is empty then applies
        them once."""
        return False

    def dry_run(self, plan: Plan) -> None:
        """Check mode: validate the plan on the router without changing it, where possible."""
        return None

    def write(self, plan: Plan) -> None:
        """Write all changes, then apply them on the router once.

        Routers written one entry at a time can fail half way (a lost connection, a refusal the
        plan could not foresee); the changes already made are then undone, so a failed run leaves
        the router as it found it.
        """
        done: list[Change] = []
        try:
            for change in plan.changes:
                self._one(change)
                done.append(change)
            self._apply()
        except RouterError as e:
            if not done:
                raise
            note = self._rollback(done)
            raise type(e)(f"{e} ({note})") from None

    def _one(self, change: Change) -> None:
        if change.action == "create":
            self._create(change.after)
        elif change.action == "update":
            self._update(change.before, change.after)
        else:
            self._delete(change.before)

    def _rollback(self, done: list[Change]) -> str:
        try:
            for change in reversed(done):
                now = {r.mac: r for r in self.list_reservations()}
                cur = now.get((change.after or change.before).mac)
                if change.action == "create" and cur is not None:
                    self._delete(cur)
                elif change.action == "update" and cur is not None:
                    self._update(cur, change.before)
                elif change.action == "delete" and cur is None:
                    self._create(change.before)
            self._apply()
        except RouterError as e:
            return (
                f"undoing the {len(done)} change(s) already made failed too: {e}; check the router's "
                "reservations by hand"
            )
        return f"the {len(done)} change(s) already made were undone"

    def _create(self, r: Reservation) -> None:
        raise NotImplementedError

    def _update(self, old: Reservation, new: Reservation) -> None:
        raise NotImplementedError

    def _delete(self, old: Reservation) -> None:
        raise NotImplementedError

    def _apply(self) -> None:
        """Make written changes take effect (no-op on routers that apply each call at once)."""
        return None

    def verify(self, plan: Plan) -> None:
        """Re-read the router's table and check every planned change is there."""
        now = self.list_reservations()
        problems = []
        gone = {c.before.mac for c in plan.changes if c.action == "delete"}
        for mac in gone:
            left = [r for r in now if r.mac == mac]
            if left:
                problems.append(f"{mac} is still reserved ({left[0].ip})")
        for mac, want in plan.resolved.items():
            mine = [r for r in now if r.mac == mac]
            if len(mine) != 1 or mine[0].ip != want.ip:
                held = ", ".join(str(r.ip) for r in mine) or "nothing"
                problems.append(f"{mac} should be reserved at {want.ip} but the router shows {held}")
        if problems:
            raise VerifyError(
                f"{self.name} accepted the changes but re-reading its reservations shows: "
                + "; ".join(problems)
                + ". The router may have refused them silently; check it by hand and run again"
            )

    def close(self) -> None:
        """Release connections (SSH, HTTP sessions, router logins)."""
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
