"""Planning and refusals shared by every router backend."""

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulab.routers.model import (
    ConflictError,
    Desired,
    Free,
    Lease,
    LimitError,
    PolicyError,
    Reservation,
    RouterError,
    make_plan,
    norm_mac,
)

IP = ipaddress.IPv4Address
NET = ipaddress.IPv4Network("192.168.100.0/24")
POOL = (IP("192.168.100.2"), IP("192.168.100.254"))
A, B, C = "bc:24:11:00:00:0a", "bc:24:11:00:00:0b", "bc:24:11:00:00:0c"


@pytest.mark.parametrize(
    "text",
    ["BC:24:11:AA:BB:01", "bc-24-11-aa-bb-01", "bc24.11aa.bb01", "bc2411aabb01", " Bc:24:11:aA:bb:01 "],
)
def test_norm_mac_accepts_common_spellings(text):
    assert norm_mac(text) == "bc:24:11:aa:bb:01"


@pytest.mark.parametrize(
    "text", ["", "bc:24:11:aa:bb", "bc:24:11:aa:bb:01:02", "zz:24:11:aa:bb:01", "192.168.100.100"]
)
def test_norm_mac_rejects_garbage(text):
    with pytest.raises(ValueError):
        norm_mac(text)


@given(st.binary(min_size=6, max_size=6), st.sampled_from([":", "-", ""]), st.booleans())
def test_norm_mac_round_trip(raw, sep, upper):
    text = sep.join(f"{b:02x}" for b in raw)
    text = text.upper() if upper else text
    out = norm_mac(text)
    assert bytes.fromhex(out.replace(":", "")) == raw
    assert norm_mac(out) == out


def plan(present, res=(), leases=(), **kw):
    kw.setdefault("subnet", NET)
    kw.setdefault("pool", POOL)
    return make_plan(present, res, leases, **kw)


def test_keep_mode_refuses_a_held_address_that_is_not_the_vms_vm_address():
    lease = [Lease(A, IP("192.168.100.77"))]
    with pytest.raises(ConflictError) as err:
        plan([Desired.make(A, name="vm-1", expect="192.168.100.53")], leases=lease)
    msg = str(err.value)
    assert "vm-1 (bc:24:11:00:00:0a) holds 192.168.100.77 (its DHCP lease" in msg
    assert "its vm_address is 192.168.100.53" in msg
    assert "vm_address: 192.168.100.77" in msg and "router_dhcp_reservation_mode: planned" in msg
    # the same address, an existing reservation that agrees, or a planned address: no refusal
    assert plan([Desired.make(A, expect="192.168.100.77")], leases=lease).changes
    held = [Reservation(A, IP("192.168.100.53"))]
    assert plan([Desired.make(A, expect="192.168.100.53")], held, lease).changes == []
    with pytest.raises(ConflictError, match="its reservation"):
        plan([Desired.make(A, expect="192.168.100.60")], held, lease)
    assert plan([Desired.make(A, "192.168.100.60", expect=None)], leases=lease).changes


def test_keep_mode_names_every_vm_whose_held_address_is_not_its_vm_address():
    leases = [Lease(A, IP("192.168.100.77")), Lease(B, IP("192.168.100.78")), Lease(C, IP("192.168.100.55"))]
    desired = [
        Desired.make(B, name="vm-2", expect="192.168.100.54"),
        Desired.make(C, name="vm-3", expect="192.168.100.55"),
        Desired.make(A, name="vm-1", expect="192.168.100.53"),
    ]
    with pytest.raises(ConflictError) as err:
        plan(desired, leases=leases)
    msg = str(err.value)
    # both, in the order given, and not the VM whose lease agrees
    assert msg.index("vm-2 (bc:24:11:00:00:0b) holds 192.168.100.78") < msg.index(
        "vm-1 (bc:24:11:00:00:0a) holds"
    )
    assert "vm_address: 192.168.100.78 for vm-2" in msg and "vm_address: 192.168.100.77 for vm-1" in msg
    assert "vm-3" not in msg


def test_keep_reserves_the_leased_address():
    p = plan([Desired.make(A, name="vm-1")], leases=[Lease(A, IP("192.168.100.53"))])
    assert [c.action for c in p.changes] == ["create"]
    assert p.changes[0].after.ip == IP("192.168.100.53")


def test_keep_uses_the_current_address_without_lease_and_fails_without_either():
    p = plan([Desired.make(A, current_address="192.168.100.60")])
    assert p.resolved[A].ip == IP("192.168.100.60")
    with pytest.raises(RouterError, match="no lease"):
        plan([Desired.make(A, name="vm-1")])


def test_keep_leaves_an_existing_reservation_alone():
    res = [Reservation(A, IP("192.168.100.53"), "vm-1")]
    p = plan([Desired.make(A, hostname="vm-1")], res, [Lease(A, IP("192.168.100.99"))])
    assert p.changes == []
    assert p.resolved[A].ip == IP("192.168.100.53")


def test_planned_address_updates_and_second_plan_is_empty():
    res = [Reservation(A, IP("192.168.100.53"), "vm-1", ref="0")]
    p = plan([Desired.make(A, "192.168.100.70", "vm-1")], res)
    assert [(c.action, str(c.after.ip)) for c in p.changes] == [("update", "192.168.100.70")]
    assert p.changes[0].after.ref == "0"
    again = plan([Desired.make(A, "192.168.100.70", "vm-1")], p.after)
    assert again.changes == []


def test_outside_subnet_is_refused():
    with pytest.raises(PolicyError, match="outside the router's subnet"):
        plan([Desired.make(A, "10.0.0.5")])
    with pytest.raises(PolicyError, match="broadcast"):
        plan([Desired.make(A, "192.168.100.255")])


def test_address_reserved_for_another_mac_is_refused():
    res = [Reservation(B, IP("192.168.100.53"))]
    with pytest.raises(ConflictError, match=f"already reserves it for {B}"):
        plan([Desired.make(A, "192.168.100.53")], res)


def test_address_leased_to_another_mac_is_refused():
    with pytest.raises(ConflictError, match=f"leased to {B}"):
        plan([Desired.make(A, "192.168.100.53")], leases=[Lease(B, IP("192.168.100.53"))])


def test_expired_lease_of_another_mac_does_not_block():
    p = plan(
        [Desired.make(A, "192.168.100.53")], leases=[Lease(B, IP("192.168.100.53"), expires=100)], now=200
    )
    assert len(p.changes) == 1


def test_two_vms_asking_for_one_address_are_refused():
    with pytest.raises(ConflictError):
        plan([Desired.make(A, "192.168.100.53"), Desired.make(B, "192.168.100.53")])


def test_duplicate_mac_in_request_and_on_router():
    with pytest.raises(ConflictError, match="duplicate MAC"):
        plan([Desired.make(A, "192.168.100.53"), Desired.make(A.upper(), "192.168.100.54")])
    res = [Reservation(A, IP("192.168.100.53")), Reservation(A, IP("192.168.100.54"))]
    with pytest.raises(ConflictError, match="2 reservations"):
        plan([Desired.make(A)], res)


def test_in_pool_refusal_only_where_the_router_refuses():
    with pytest.raises(PolicyError, match="inside its DHCP pool"):
        plan([Desired.make(A, "192.168.100.53")], in_pool_allowed=False)
    p = plan(
        [Desired.make(A, "192.168.100.53")],
        in_pool_allowed=False,
        pool=(IP("192.168.100.100"), IP("192.168.100.200")),
    )
    assert len(p.changes) == 1


def test_limit_counts_the_final_table():
    res = [Reservation(f"02:00:00:00:00:{n:02x}", IP(f"192.168.100.{100 + n}")) for n in range(15)]
    assert len(plan([Desired.make(A, "192.168.100.53")], res, max_reservations=16).changes) == 1
    with pytest.raises(LimitError, match="at most 16"):
        plan([Desired.make(A, "192.168.100.53"), Desired.make(B, "192.168.100.54")], res, max_reservations=16)
    # a run that adds and removes as many stays within the limit
    p = plan(
        [Desired.make(A, "192.168.100.53")],
        [*res, Reservation(C, IP("192.168.100.9"))],
        absent=[res[0].mac],
        max_reservations=16,
    )
    assert sorted(c.action for c in p.changes) == ["create", "delete"]


def test_absent_removes_every_reservation_of_the_mac():
    res = [Reservation(A, IP("192.168.100.53")), Reservation(B, IP("192.168.100.54"))]
    p = plan([], res, absent=[A.upper()])
    assert [(c.action, c.before.mac) for c in p.changes] == [("delete", A)]
    assert p.after == [res[1]]
    assert plan([], p.after, absent=[A]).changes == []


@given(st.lists(st.integers(min_value=2, max_value=254), min_size=1, max_size=10, unique=True))
def test_plan_then_replan_is_idempotent(hosts):
    want = [Desired.make(f"02:00:00:00:01:{n:02x}", f"192.168.100.{h}") for n, h in enumerate(hosts)]
    first = plan(want)
    assert len(first.changes) == len(hosts)
    assert plan(want, first.after).changes == []


def test_the_routers_own_address_is_refused():
    with pytest.raises(PolicyError, match="router's own address"):
        plan([Desired.make(A, "192.168.100.1")], own_address=IP("192.168.100.1"))


VIP = Free.make("192.168.100.60", "all", "k3s_registration_address", "the kube-vip VIP of the k3s servers")


def test_a_vip_reserved_for_another_mac_is_refused_with_host_field_value_and_fix():
    res = [Reservation(A, IP("192.168.100.53")), Reservation(B, IP("192.168.100.60"), "printer")]
    with pytest.raises(ConflictError) as err:
        plan([Desired.make(A, "192.168.100.53")], res, free=[VIP])
    text = str(err.value)
    assert text.startswith("all: k3s_registration_address = 192.168.100.60 (the kube-vip VIP")
    assert f"is reserved for {B} (printer)" in text
    assert "Fix: remove that reservation" in text and "another free address" in text


def test_a_vip_leased_right_now_is_refused_and_an_expired_lease_is_not():
    lease = Lease(B, IP("192.168.100.60"), expires=300)
    with pytest.raises(ConflictError, match=f"is leased to {B}"):
        plan([Desired.make(A, "192.168.100.53")], leases=[lease], free=[VIP], now=200)
    p = plan([Desired.make(A, "192.168.100.53")], leases=[lease], free=[VIP], now=400)
    assert [c.action for c in p.changes] == ["create"]


def test_a_vm_planned_or_kept_on_the_vip_is_refused():
    with pytest.raises(ConflictError, match="would be reserved for vm-1"):
        plan([Desired.make(A, "192.168.100.60", name="vm-1")], free=[VIP])
    held = [Lease(A, IP("192.168.100.60"))]
    with pytest.raises(ConflictError, match=f"is leased to vm-1 \\({A}\\)"):
        plan([Desired.make(A, "192.168.100.53", name="vm-1")], leases=held, free=[VIP])


def test_a_free_vip_changes_nothing_in_the_plan():
    res = [Reservation(A, IP("192.168.100.53"), "vm-1")]
    p = plan([Desired.make(A, None, "vm-1")], res, free=[VIP])
    assert p.changes == [] and p.resolved[A].ip == IP("192.168.100.53")
