"""Data model shared by every router backend: MACs, leases, reservations, errors and the plan.

Everything here is pure: no I/O. A backend lists what the router holds; `make_plan` compares it
with what the lab wants and either returns the changes or refuses with a `RouterError` before a
single write is made, so a refusal never leaves a half-applied router behind.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Sequence

_HEX = re.compile(r"[0-9a-f]")


def norm_mac(mac: str) -> str:
    """Return `mac` as lower-case colon-separated hex ("BC-24-11-AA-BB-01" -> "bc:24:11:aa:bb:01").

    Accepts colons, dashes, dots (Cisco style) or no separator. Raises ValueError otherwise.
    """
    if not isinstance(mac, str):
        raise ValueError(f"MAC address must be a string, got {type(mac).__name__}")
    text = mac.strip().lower()
    if not re.fullmatch(r"[0-9a-f:\-. ]+", text):
        raise ValueError(f"bad MAC address {mac!r}: only hex digits and : - . separators are allowed")
    digits = "".join(_HEX.findall(text))
    if len(digits) != 12:
        raise ValueError(f"bad MAC address {mac!r}: expected 12 hex digits, found {len(digits)}")
    groups = re.split(r"[:\-. ]", text)
    if len(groups) > 1 and {len(g) for g in groups} not in ({2}, {4}, {1, 2}):
        raise ValueError(f"bad MAC address {mac!r}: unusual grouping of hex digits")
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def ip4(value: str | ipaddress.IPv4Address) -> ipaddress.IPv4Address:
    """Parse an IPv4 address, with a message that names the value."""
    try:
        return ipaddress.IPv4Address(str(value).strip())
    except ValueError:
        raise ValueError(f"bad IPv4 address {value!r}") from None


@dataclasses.dataclass(frozen=True)
class Lease:
    """A dynamic lease the router currently holds."""

    mac: str
    ip: ipaddress.IPv4Address
    hostname: str | None = None
    expires: int | None = None  # epoch seconds; None: infinite or unknown


@dataclasses.dataclass(frozen=True)
class Reservation:
    """A static MAC -> address reservation on the router.

    `ref` is the backend's handle (uci section, RouterOS .id, OPNsense uuid, pfSense id, TR-098
    path); it is only valid until the next write, so backends re-list before using it.
    """

    mac: str
    ip: ipaddress.IPv4Address
    hostname: str | None = None
    ref: str | None = None

    def line(self) -> str:
        return f"{self.mac} {self.ip}" + (f" {self.hostname}" if self.hostname else "")

    def as_dict(self) -> dict:
        return {"mac": self.mac, "address": str(self.ip), "hostname": self.hostname}


@dataclasses.dataclass(frozen=True)
class Desired:
    """What the lab wants for one MAC.

    `ip` None means "keep": an existing reservation stays as it is, otherwise the address the MAC
    holds now (the router's lease, else `current_address`, the address the VM reports) is reserved.
    """

    mac: str
    ip: ipaddress.IPv4Address | None = None
    hostname: str | None = None
    current_address: ipaddress.IPv4Address | None = None
    name: str | None = None  # inventory name, for messages only
    # In keep mode: the address the rest of the run uses for this VM (its vm_address); a kept address that
    # differs is refused before any write.
    expect: ipaddress.IPv4Address | None = None

    @classmethod
    def make(cls, mac, ip=None, hostname=None, current_address=None, name=None, expect=None) -> Desired:
        return cls(
            mac=norm_mac(mac),
            ip=ip4(ip) if ip not in (None, "", "keep") else None,
            hostname=hostname or None,
            current_address=ip4(current_address) if current_address not in (None, "") else None,
            name=name,
            expect=ip4(expect) if expect not in (None, "", "keep") else None,
        )

    def label(self) -> str:
        return f"{self.name} ({self.mac})" if self.name else self.mac


@dataclasses.dataclass(frozen=True)
class Free:
    """An address no device may lease or have reserved, because the lab holds it another way (a VIP).

    `host` and `field` name where the inventory sets it (for messages), `what` says what holds it.
    """

    ip: ipaddress.IPv4Address
    host: str = "all"
    field: str = "address"
    what: str = "an address the lab holds without DHCP"

    @classmethod
    def make(cls, ip, host=None, field=None, what=None) -> Free:
        defaults = cls.__dataclass_fields__
        return cls(
            ip=ip4(ip),
            host=host or defaults["host"].default,
            field=field or defaults["field"].default,
            what=what or defaults["what"].default,
        )

    def refuse(self, router: str, holder: str) -> ConflictError:
        return ConflictError(
            f"{self.host}: {self.field} = {self.ip} ({self.what}) {holder} on {router}, so the router may hand "
            f"it to that device while the lab holds it. Fix: remove that reservation or release that lease on "
            f"the router, or choose another free address outside the DHCP pool for {self.field}"
        )


@dataclasses.dataclass(frozen=True)
class Change:
    action: str  # "create" | "update" | "delete"
    before: Reservation | None
    after: Reservation | None

    def describe(self) -> str:
        if self.action == "create":
            return f"add {self.after.line()}"
        if self.action == "delete":
            return f"remove {self.before.line()}"
        return f"change {self.before.line()} -> {self.after.line()}"


@dataclasses.dataclass
class Plan:
    changes: list[Change]
    before: list[Reservation]
    after: list[Reservation]
    resolved: dict[str, Reservation]  # mac -> the reservation the lab ends up with (present only)


class RouterError(Exception):
    """A refusal or failure, with what was being done, to what, why, and how to fix it.

    `code` is the kind the module reports as error_code; each subclass names its own.
    """

    code = "router_error"

    def __init_subclass__(cls, *, code: str, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.code = code


class AuthError(RouterError, code="auth_failed"): ...


class ConflictError(RouterError, code="conflict"): ...


class PolicyError(RouterError, code="policy"): ...


class LimitError(RouterError, code="limit"): ...


class ApplyError(RouterError, code="apply_failed"): ...


class VerifyError(RouterError, code="verify_failed"): ...


class ConnectError(RouterError, code="unreachable"): ...


def _in_pool(ip, pool) -> bool:
    return pool is not None and pool[0] <= ip <= pool[1]


def make_plan(
    present: Sequence[Desired],
    reservations: Iterable[Reservation],
    leases: Iterable[Lease],
    *,
    absent: Sequence[str] = (),
    subnet: ipaddress.IPv4Network | None = None,
    pool: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] | None = None,
    in_pool_allowed: bool = True,
    max_reservations: int | None = None,
    supports_hostname: bool = True,
    router: str = "router",
    own_address: ipaddress.IPv4Address | None = None,
    now: float | None = None,
    free: Sequence[Free] = (),
) -> Plan:
    """Compare the lab's wishes with the router's tables; return the changes or raise a RouterError.

    `present` are the reservations to ensure, `absent` the MACs whose reservations go. All refusals
    happen here, before any write: address outside the subnet, address reserved for or leased to
    another MAC, duplicate MAC (in the request or on the router), in-pool address on a router that
    refuses it, reservation limit, and an address of `free` (a VIP the lab holds without DHCP) that a
    reservation or a live lease gives to a device.
    """
    current = list(reservations)
    leases = list(leases)
    desired = list(present)
    seen: dict[str, Desired] = {}
    for d in desired:
        if d.mac in seen:
            raise ConflictError(
                f"duplicate MAC {d.mac} in the request ({seen[d.mac].label()} and {d.label()}); "
                "every VM needs its own MAC: fix vm_mac in the inventory"
            )
        seen[d.mac] = d
    gone_macs = {norm_mac(m) for m in absent}
    both = gone_macs & set(seen)
    if both:
        raise ConflictError(f"MAC {sorted(both)[0]} is asked to be both present and absent")
    by_mac: dict[str, list[Reservation]] = {}
    for r in current:
        by_mac.setdefault(r.mac, []).append(r)
    for d in desired:
        mine = by_mac.get(d.mac, [])
        if len(mine) > 1:
            refs = ", ".join(r.line() for r in mine)
            raise ConflictError(
                f"{router} holds {len(mine)} reservations for {d.label()} ({refs}); which one applies is "
                "undefined: delete all but one on the router, then run again"
            )

    changes: list[Change] = []
    resolved: dict[str, Reservation] = {}
    for mac in sorted(gone_macs):
        changes.extend(Change("delete", r, None) for r in by_mac.get(mac, []))
    current_kept = [r for r in current if r.mac not in gone_macs]

    lease_by_mac: dict[str, Lease] = {}
    for lease in leases:
        if now is None or lease.expires in (None, 0) or lease.expires > now:
            lease_by_mac.setdefault(lease.mac, lease)

    targets: dict[str, ipaddress.IPv4Address] = {}
    moved: list[str] = []  # every VM whose held address is not its vm_address, in the order given
    for d in desired:
        mine = by_mac.get(d.mac, [])
        held = None
        if d.ip is not None:
            targets[d.mac] = d.ip
        elif mine:
            targets[d.mac], held = mine[0].ip, "its reservation"
        elif d.mac in lease_by_mac:
            targets[d.mac], held = lease_by_mac[d.mac].ip, "its DHCP lease"
        elif d.current_address is not None:
            targets[d.mac], held = d.current_address, "the address the VM reports"
        else:
            raise RouterError(
                f"cannot keep the address of {d.label()}: {router} has no lease for it and the VM reported "
                "no address; start the VM and let it get a DHCP lease (stage vms), or plan an address "
                "with vm_address and router_dhcp_reservation_mode: planned"
            )
        if held and d.expect is not None and targets[d.mac] != d.expect:
            moved.append(
                f"{d.label()} holds {targets[d.mac]} ({held} on {router}), but its vm_address is {d.expect}, "
                f"the address Ansible and the k3s agents use for it. Either keep the address it has: set "
                f"vm_address: {targets[d.mac]} for {d.name or d.mac}; or move it to {d.expect}: set "
                "router_dhcp_reservation_mode: planned (stage network reserves it and restarts the VM to take it)"
            )
    if moved:
        raise ConflictError(" ".join(moved))

    for d in desired:
        ip = targets[d.mac]
        if subnet is not None and ip not in subnet:
            raise PolicyError(
                f"cannot reserve {ip} for {d.label()}: it is outside the router's subnet {subnet}; "
                f"choose an address inside {subnet}"
            )
        if subnet is not None and ip in (subnet.network_address, subnet.broadcast_address):
            raise PolicyError(
                f"cannot reserve {ip} for {d.label()}: it is the network or broadcast address of {subnet}"
            )
        if own_address is not None and ip == own_address:
            raise PolicyError(f"cannot reserve {ip} for {d.label()}: it is the router's own address")
        if not in_pool_allowed and _in_pool(ip, pool):
            raise PolicyError(
                f"cannot reserve {ip} for {d.label()}: {router} refuses static mappings inside its DHCP "
                f"pool {pool[0]}-{pool[1]}; plan an address outside the pool (vm_address with "
                "router_dhcp_reservation_mode: planned) or shrink the pool on the router"
            )
    # Address clashes with other MACs: reservations not being changed by this run, other targets,
    # and live leases of MACs this run does not move.
    final_owner: dict[ipaddress.IPv4Address, str] = {}
    for r in current_kept:
        if r.mac not in seen:
            final_owner.setdefault(r.ip, r.mac)
    for d in desired:
        ip = targets[d.mac]
        owner = final_owner.get(ip)
        if owner is not None and owner != d.mac:
            raise ConflictError(
                f"cannot reserve {ip} for {d.label()}: {router} already reserves it for {owner}; "
                "remove that reservation or choose another address"
            )
        final_owner[ip] = d.mac
    for lease in lease_by_mac.values():
        owner = final_owner.get(lease.ip)
        if owner is not None and owner != lease.mac and lease.mac not in seen:
            who = seen[owner].label() if owner in seen else owner
            raise ConflictError(
                f"cannot reserve {lease.ip} for {who}: it is leased to {lease.mac} right now, so "
                f"{router} would not hand it out; release that lease (or wait until it expires) or "
                "choose another address"
            )

    # Addresses the lab holds without DHCP (a VIP): no reservation, planned or on the router, and no live lease.
    for f in free:
        for d in desired:
            if targets[d.mac] == f.ip:
                raise f.refuse(router, f"would be reserved for {d.label()} by this run")
        for r in current_kept:
            if r.ip == f.ip and r.mac not in seen:
                raise f.refuse(
                    router, f"is reserved for {r.mac}" + (f" ({r.hostname})" if r.hostname else "")
                )
        for lease in lease_by_mac.values():
            if lease.ip == f.ip:
                who = seen[lease.mac].label() if lease.mac in seen else lease.mac
                raise f.refuse(
                    router, f"is leased to {who}" + (f" ({lease.hostname})" if lease.hostname else "")
                )

    after = list(current_kept)
    for d in desired:
        ip = targets[d.mac]
        mine = by_mac.get(d.mac, [])
        hostname = d.hostname if supports_hostname else None
        if mine:
            cur = mine[0]
            want_host = hostname if hostname is not None else cur.hostname
            want = Reservation(d.mac, ip, want_host, cur.ref)
            if cur.ip != ip or (hostname is not None and cur.hostname != hostname):
                changes.append(Change("update", cur, want))
                after[after.index(cur)] = want
            resolved[d.mac] = want
        else:
            want = Reservation(d.mac, ip, hostname)
            changes.append(Change("create", None, want))
            after.append(want)
            resolved[d.mac] = want
    if max_reservations is not None and len(after) > max_reservations and len(after) > len(current):
        raise LimitError(
            f"{router} holds at most {max_reservations} reservations; it has {len(current)} and this run "
            f"would add {len(after) - len(current)}: delete unused reservations on the router first"
        )
    return Plan(changes, current, after, resolved)


@dataclasses.dataclass(frozen=True)
class Move:
    """A VM that may have to restart to take its reservation: the address it holds now (None: not running,
    or no lease yet) and the address reserved for it (None: nothing reserved this run)."""

    name: str
    holds: str | None
    reserved: str | None


def move_order(vms: Sequence[Move]) -> dict[str, list[str]]:
    """The order in which stage network restarts the VMs that hold another address than their reservation.

    The router hands a VM its reservation only once no other VM holds that address (its lease from before
    the reservations), so a VM can land only after the VM holding its address has moved. Returns
    `{"first": [...], "cycle": [...]}`, names in the order given otherwise:

    - `first`: each VM whose reservation is free, then each whose reservation is held by a VM already in
      `first` (a chain: A holds B's reservation, B holds C's...); each lands at its first restart.
    - `cycle`: the rest, whose reservation is held by a VM of a cycle (two VMs holding each other's
      reservations) or by a VM that does not move. Each restarts once in order (the first of a cycle gets a
      free address, which lets the next one land) and then once more: only that second try must land.

    A VM that holds no address takes its reservation when it starts, and one that holds its reservation
    stays: neither is in the result.
    """
    holder = {v.holds: v.name for v in vms if v.holds is not None}
    movers = [v for v in vms if v.holds is not None and v.reserved is not None and v.holds != v.reserved]
    first: list[str] = []
    placed: set[str] = set()
    left = list(movers)
    while True:
        ready = [v for v in left if holder.get(v.reserved, v.name) in placed | {v.name}]
        if not ready:
            break
        for v in ready:
            first.append(v.name)
            placed.add(v.name)
        left = [v for v in left if v.name not in placed]
    return {"first": first, "cycle": [v.name for v in left]}
