"""The order stage network restarts VMs in to move them to their reservations (gpulab.routers.model.move_order).

The router stand-in here behaves as dnsmasq and Kea do with a reservation: a restarted VM gets its reserved
address when no other VM holds it, otherwise a free pool address (never another MAC's reservation).
"""

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gpulab.routers.model import Move, move_order


def run_plan(vms):
    """Follow move_order as roles/router_dhcp does; return (where each VM ends, VMs of `first` that missed)."""
    holds = {v.name: v.holds for v in vms}
    reserved = {v.name: v.reserved for v in vms}
    pool = (f"10.0.9.{i}" for i in itertools.count(1))

    def restart(name):
        others = {a for n, a in holds.items() if n != name}
        holds[name] = reserved[name] if reserved[name] not in others else next(pool)
        return holds[name] == reserved[name]

    order = move_order(vms)
    missed = [name for name in order["first"] if not restart(name)]
    arrived = [name for name in order["cycle"] if restart(name)]
    for name in order["cycle"]:
        if name not in arrived:
            restart(name)
    return holds, missed, order


def test_a_free_reservation_goes_first_and_a_vm_on_its_reservation_stays():
    vms = [Move("a", "10.0.0.31", "10.0.0.51"), Move("b", "10.0.0.52", "10.0.0.52")]
    assert move_order(vms) == {"first": ["a"], "cycle": []}


def test_a_chain_follows_the_vm_that_frees_each_address():
    # a's reservation is b's address, b's is c's, c's is free: c, then b, then a, each landing at once
    vms = [
        Move("a", "10.0.0.31", "10.0.0.32"),
        Move("b", "10.0.0.32", "10.0.0.33"),
        Move("c", "10.0.0.33", "10.0.0.50"),
    ]
    assert move_order(vms) == {"first": ["c", "b", "a"], "cycle": []}
    holds, missed, _ = run_plan(vms)
    assert missed == [] and holds == {"a": "10.0.0.32", "b": "10.0.0.33", "c": "10.0.0.50"}


def test_two_vms_holding_each_others_reservations_are_a_cycle():
    vms = [
        Move("a", "10.0.0.31", "10.0.0.32"),
        Move("b", "10.0.0.32", "10.0.0.31"),
        Move("c", None, "10.0.0.40"),
    ]
    assert move_order(vms) == {"first": [], "cycle": ["a", "b"]}
    holds, _, _ = run_plan(vms)
    assert holds == {"a": "10.0.0.32", "b": "10.0.0.31", "c": None}  # c takes its reservation when it starts


def test_a_vm_that_holds_no_address_or_has_no_reservation_does_not_move():
    vms = [Move("gpu", None, "10.0.0.53"), Move("old", "10.0.0.60", None)]
    assert move_order(vms) == {"first": [], "cycle": []}


def test_a_reservation_held_by_a_vm_that_does_not_move_stays_in_the_cycle_group():
    # the holder has no reservation this run: the second try fails, and the role's check says so
    vms = [Move("a", "10.0.0.31", "10.0.0.60"), Move("other", "10.0.0.60", None)]
    assert move_order(vms) == {"first": [], "cycle": ["a"]}
    holds, _, _ = run_plan(vms)
    assert holds["a"] != "10.0.0.60"


@st.composite
def labs(draw):
    """VMs with distinct reservations; each holds nothing, its reservation, another VM's or a free address."""
    n = draw(st.integers(1, 7))
    reserved = [f"10.0.0.{50 + i}" for i in range(n)]
    spots = reserved + [f"10.0.0.{100 + i}" for i in range(n)] + [None] * n
    held = draw(st.permutations(spots))[:n]
    names = [f"vm{i}" for i in range(n)]
    return [Move(names[i], held[i], reserved[i]) for i in range(n)]


@given(labs())
def test_every_vm_ends_on_its_reservation_and_the_first_group_lands_at_once(vms):
    holds, missed, order = run_plan(vms)
    movers = {v.name for v in vms if v.holds is not None and v.holds != v.reserved}
    assert missed == []
    assert sorted(order["first"] + order["cycle"]) == sorted(movers)
    assert all(holds[v.name] == v.reserved for v in vms if v.holds is not None)
