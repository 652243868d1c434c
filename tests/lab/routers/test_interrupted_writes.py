"""The router write path under a connection that drops at any call (a property of gpulab.routers.backend).

A router written one entry at a time, in its two kinds: with an apply step (OPNsense's reconfigure, pfSense's
apply: entries are saved, the service serves the saved table only once applied) and without one (RouterOS,
the ONT's form: each call serves at once). The connection drops at the N-th call and never comes back for that
run (the undo fails too). Then:
- with an apply step, the router serves exactly the reservations it served before, or all the new ones (the
  apply came before the drop); saved changes it does not serve yet are applied by the next run even when that
  run has nothing left to write (Backend.unapplied);
- without one, every MAC has at most one reservation, each its old or its new one (never half an entry or two);
- the next run, on a fresh connection, ends with exactly the reservations an uninterrupted run makes, one per
  machine, and the run after it changes nothing.
Then the same for two real write paths, the connection dropping at each write call, before the router gets it
or after (its answer lost): a real Kea (gpulab.routers.kea: its config file, what a restart reads, ends equal
to what it serves) and OPNsense on the lab's simulator (gpulab.routers.opnsense: nothing saved stays
unserved).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.routers.backend import Backend
from gpulab.routers.model import ConnectError, Lease, Reservation

SUBNET = "192.168.100.0/24"
MACS = [f"bc:24:11:00:00:0{n}" for n in range(1, 6)]


class Router:
    """The router's own state: the saved table, and the table its DHCP service serves."""

    def __init__(self, saved: dict[str, tuple[str, str]], apply_step: bool):
        self.saved = dict(saved)  # ref -> (mac, ip)
        self.serving = dict(saved)
        self.apply_step = apply_step
        self.refs = itertools.count(100)


class Fake(Backend):
    kind = "fake"

    def __init__(self, router: Router, drop_at: int | None = None):
        super().__init__(subnet=SUBNET, name="the fake router")
        self.router = router
        self.calls = 0
        self.drop_at = drop_at

    def _call(self) -> None:
        self.calls += 1
        if self.drop_at is not None and self.calls >= self.drop_at:
            raise ConnectError("the connection to the fake router dropped")

    def list_leases(self) -> list[Lease]:
        self._call()
        return []

    def list_reservations(self) -> list[Reservation]:
        self._call()
        return [
            Reservation(mac, ipaddress.IPv4Address(ip), None, ref)
            for ref, (mac, ip) in self.router.saved.items()
        ]

    def _save(self) -> None:
        if not self.router.apply_step:
            self.router.serving = dict(self.router.saved)

    def _create(self, r: Reservation) -> None:
        self._call()
        self.router.saved[str(next(self.router.refs))] = (r.mac, str(r.ip))
        self._save()

    def _update(self, old: Reservation, new: Reservation) -> None:
        self._call()
        self.router.saved[old.ref] = (new.mac, str(new.ip))
        self._save()

    def _delete(self, old: Reservation) -> None:
        self._call()
        del self.router.saved[old.ref]
        self._save()

    def _apply(self) -> None:
        self._call()
        self.router.serving = dict(self.router.saved)

    def unapplied(self) -> bool:
        return self.router.apply_step and self.router.serving != self.router.saved


def table(entries: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted(entries.values())


def run(router: Router, wanted: dict[str, str], drop_at: int | None = None):
    backend = Fake(router, drop_at)
    for mac, ip in wanted.items():
        backend.ensure(mac, ip)
    return backend.apply(), backend.calls


# the router's table before the run (some MACs of the lab, at some addresses) and the lab's wish
tables = st.dictionaries(st.sampled_from(MACS), st.integers(50, 60), max_size=4)
wishes = st.dictionaries(st.sampled_from(MACS), st.integers(50, 60), min_size=1, max_size=5)


def addresses(d: dict[str, int]) -> dict[str, str]:
    return {mac: f"192.168.100.{n}" for mac, n in d.items()}


@settings(max_examples=150, deadline=None, derandomize=True)
@given(before=tables, wish=wishes, apply_step=st.booleans(), data=st.data())
def test_a_write_cut_at_any_call_serves_old_or_new_and_the_next_run_completes_it(
    before, wish, apply_step, data
):
    wanted = addresses(dict(zip(wish, sorted(set(wish.values())), strict=False)))  # distinct addresses
    saved = {str(i): (mac, ip) for i, (mac, ip) in enumerate(addresses(before).items())}
    # an address the wish does not move stays with one MAC only: drop table entries that would clash
    saved = {r: (m, ip) for r, (m, ip) in saved.items() if ip not in wanted.values() or wanted.get(m) == ip}
    reference = Router(saved, apply_step)
    _res, calls = run(reference, wanted)
    assert {m: ip for m, ip in table(reference.serving) if m in wanted} == wanted

    router = Router(saved, apply_step)
    served_before = table(router.serving)
    drop_at = data.draw(st.integers(1, calls), label="dropped at call")
    with contextlib.suppress(ConnectError):
        run(router, wanted, drop_at)
    if apply_step:  # all or nothing: the apply step came, or the router serves what it did before
        assert table(router.serving) in (served_before, table(reference.serving))
    macs = [m for m, _ in table(router.serving)]
    assert len(macs) == len(set(macs)), router.serving  # one reservation per MAC
    old = dict(table(saved))
    for mac, ip in table(router.serving):
        assert ip in (old.get(mac), wanted.get(mac)), (mac, ip)

    run(router, wanted)
    assert table(router.serving) == table(reference.serving)
    again, _ = run(router, wanted)
    assert again.changed is False and table(router.serving) == table(router.saved)


# --- Kea for real: the connection drops at any command of the write, before Kea gets it or after (its answer
# lost); the next run must leave the configuration file Kea restarts from equal to the one it serves.
KEA_WRITE = ["config-test", "config-set", "config-write", "config-set", "config-write"]
KEA_MAC, KEA_OTHER = "bc:24:11:00:05:01", "bc:24:11:00:05:02"


def kea_backend(lan, kea):
    from gpulab.routers.kea import KeaBackend

    return KeaBackend(
        kea["url"],
        subnet=lan.subnet,
        pool=lan.pool,
        name="test kea",
        user=kea["user"],
        password=kea["password"],
    )


def kea_served(kea) -> dict:
    return kea_backend_for_read(kea).load_config()["Dhcp4"]


def kea_backend_for_read(kea):
    from gpulab.routers.kea import KeaBackend

    return KeaBackend(kea["url"], user=kea["user"], password=kea["password"], name="reader")


def kea_saved(kea) -> dict:
    import json
    from pathlib import Path

    return json.loads(Path(kea["config"]).read_text())["Dhcp4"]


def kea_table(dhcp4: dict) -> list[tuple[str, str]]:
    return sorted((r["hw-address"], r["ip-address"]) for r in dhcp4["subnet4"][0].get("reservations") or [])


def kea_run(lan, kea, wanted, drop=None, absent=()):
    """One run; `drop` = (n, when): the connection drops at the n-th write command (KEA_WRITE), before it
    reaches Kea or after Kea did it, and every later command fails too."""
    b = kea_backend(lan, kea)
    send, sent = b.command, []

    def cut(command, arguments=None, **kw):
        if command in KEA_WRITE:
            sent.append(command)
        if drop and len(sent) >= drop[0] and command in KEA_WRITE:
            if len(sent) == drop[0] and drop[1] == "after":
                send(command, arguments, **kw)
            raise ConnectError("the connection to Kea dropped")
        if drop and len(sent) > drop[0]:
            raise ConnectError("the connection to Kea dropped")
        return send(command, arguments, **kw)

    b.command = cut
    with b:
        for mac, ip in wanted.items():
            b.ensure(mac, ip)
        for mac in absent:
            b.remove(mac)
        return b.apply(), sent


@pytest.mark.root
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("n", range(1, len(KEA_WRITE) + 1))
def test_kea_write_cut_at_any_command_is_saved_by_the_next_run(lan, kea_router, n, when):
    kea = kea_router
    kea_run(lan, kea, {KEA_MAC: "192.168.100.70"})  # what Kea held before: one reservation, saved
    old = kea_table(kea_saved(kea))
    wanted = {KEA_MAC: "192.168.100.71", KEA_OTHER: "192.168.100.72"}
    new = sorted(wanted.items())
    _, sent = kea_run(lan, kea, wanted)  # a reference run first shows the write's five commands
    assert sent == KEA_WRITE
    kea_run(lan, kea, {KEA_MAC: "192.168.100.70"}, absent=[KEA_OTHER])  # back to the old table
    assert kea_table(kea_served(kea)) == old == kea_table(kea_saved(kea))

    with pytest.raises(ConnectError):
        kea_run(lan, kea, wanted, (n, when))
    assert kea_table(kea_served(kea)) in (old, new)  # config-set is all or nothing
    assert kea_table(kea_saved(kea)) in (old, new)
    left_marked = "gpulab-unsaved" in kea_served(kea).get("user-context", {})

    res, _ = kea_run(lan, kea, wanted)
    served, saved = kea_served(kea), kea_saved(kea)
    assert kea_table(served) == new == kea_table(saved)  # what a restart reads is what Kea serves
    assert "user-context" not in served
    if left_marked:  # the run found the cut run's configuration served but not saved, and saved it
        assert (
            res.changed and res.changes == [] and "cut-off run had left served but not saved" in res.notes[0]
        )
    if "user-context" in saved:  # cut before the last config-write: the marker returns with a restart
        kea_backend_for_read(kea).command("config-reload", doing="restarting Kea's configuration")
        assert kea_table(kea_served(kea)) == new
        res, _ = kea_run(lan, kea, wanted)
        assert res.changed and res.notes
        assert kea_served(kea) == kea_saved(kea)
    assert kea_served(kea) == kea_saved(kea)
    again, sent = kea_run(lan, kea, wanted)
    assert again.changed is False and sent == [] and again.notes == []


@pytest.mark.root
def test_kea_check_mode_reports_the_unsaved_configuration_and_writes_nothing(lan, kea_router):
    kea = kea_router
    wanted = {KEA_MAC: "192.168.100.73"}
    with pytest.raises(ConnectError):
        kea_run(lan, kea, wanted, (3, "before"))  # served with the marker, never config-written
    served, saved = kea_served(kea), kea_saved(kea)
    b = kea_backend(lan, kea)
    with b:
        b.ensure(KEA_MAC, "192.168.100.73")
        res = b.apply(check_mode=True)
    assert res.changed and res.changes == [] and "would save Kea's configuration" in res.notes[0]
    assert kea_served(kea) == served and kea_saved(kea) == saved
    assert kea_table(saved) == []


# --- OPNsense, on the lab's simulator (saved model vs what reconfigure rendered, as OPNsense keeps them): the
# connection drops at any write call (add/set/del/reconfigure), before OPNsense gets it or after.
OPN_KEY, OPN_SECRET = "opn-key-1", "opn-Secret-77"
OPN_WRITES = ("/add_", "/set_", "/del_", "/reconfigure")


def opn_run(sim, dhcp, wanted, absent=(), drop=None, check_mode=False):
    from gpulab.routers import make_backend

    b = make_backend({"kind": "opnsense", "address": "127.0.0.1", "url": sim.url, "user": OPN_KEY,
                      "password": OPN_SECRET, "subnet": "192.168.1.0/24", "options": {"dhcp": dhcp}})  # fmt: skip
    send, sent = b.http.json, []

    def cut(method, path, **kw):
        if any(w in path for w in OPN_WRITES):
            sent.append(path)
            if drop and len(sent) >= drop[0]:
                if len(sent) == drop[0] and drop[1] == "after":
                    send(method, path, **kw)
                raise ConnectError("the connection to OPNsense dropped")
        elif drop and len(sent) >= drop[0]:
            raise ConnectError("the connection to OPNsense dropped")
        return send(method, path, **kw)

    b.http.json = cut
    with b:
        for mac, ip in wanted.items():
            b.ensure(mac, ip)
        for mac in absent:
            b.remove(mac)
        return b.apply(check_mode=check_mode), sent


def opn_table(entries: dict) -> list[tuple[str, str]]:
    return sorted(
        (e.get("hw_address") or e.get("hwaddr"), e.get("ip_address") or e.get("ip")) for e in entries.values()
    )


OPN_MACS = ["bc:24:11:00:06:01", "bc:24:11:00:06:02", "bc:24:11:00:06:03"]
OPN_CASES = {  # the table before, and the run's wish: (wanted, absent)
    "create and update": ({OPN_MACS[0]: "192.168.1.70"}, ({OPN_MACS[0]: "192.168.1.71", OPN_MACS[1]: "192.168.1.72"}, [])),
    "removals alone": ({OPN_MACS[0]: "192.168.1.70", OPN_MACS[1]: "192.168.1.72", OPN_MACS[2]: "192.168.1.73"},
                       ({}, [OPN_MACS[1], OPN_MACS[2]])),
}  # fmt: skip


@pytest.mark.parametrize("dhcp", ["kea", "dnsmasq"])
@pytest.mark.parametrize("case", sorted(OPN_CASES))
def test_opnsense_write_cut_at_any_call_is_applied_by_the_next_run(dhcp, case):
    from labsim.routers.opnsense import OPNsenseSim

    before, (wanted, absent) = OPN_CASES[case]
    with OPNsenseSim(key=OPN_KEY, secret=OPN_SECRET) as ref:
        opn_run(ref, dhcp, before)
        _, sent = opn_run(ref, dhcp, wanted, absent)
        calls = len(sent)
        new = opn_table(ref.running[dhcp])
    for n, when in itertools.product(range(1, calls + 1), ("before", "after")):
        with OPNsenseSim(key=OPN_KEY, secret=OPN_SECRET) as sim:
            opn_run(sim, dhcp, before)
            old = opn_table(sim.running[dhcp])
            with pytest.raises(ConnectError):
                opn_run(sim, dhcp, wanted, absent, (n, when))
            assert opn_table(sim.running[dhcp]) in (old, new), (n, when)  # served: the old table or the new
            store = sim.reservations if dhcp == "kea" else sim.hosts
            unserved = sim.running[dhcp] != sim.rendered(dhcp)

            res, _ = opn_run(
                sim, dhcp, wanted, absent, check_mode=True
            )  # a check run says so, changes nothing
            assert (sim.running[dhcp] != sim.rendered(dhcp)) == unserved, (n, when)
            if unserved and not res.changes:
                assert res.changed and "would reconfigure" in res.notes[0], (n, when)

            res, _ = opn_run(sim, dhcp, wanted, absent)
            assert opn_table(sim.running[dhcp]) == new == opn_table(store), (n, when)
            assert sim.running[dhcp] == sim.rendered(dhcp), (n, when)  # nothing saved is left unserved
            if unserved and not res.changes:
                assert res.changed and "a cut-off run had saved" in res.notes[0], (n, when)
            again, sent = opn_run(sim, dhcp, wanted, absent)
            assert again.changed is False and sent == [] and again.notes == [], (n, when)
            descr = "description" if dhcp == "kea" else "descr"
            assert {e[descr] for e in store.values()} <= {"gpulab"}, (n, when)
