"""OPNsense (Kea reservations and Dnsmasq hosts) against the simulator built from the API docs."""

import pytest
import requests

from gpulab.routers import make_backend
from gpulab.routers.model import AuthError, ConflictError, PolicyError, RouterError
from labsim.routers.opnsense import OPNsenseSim

KEY, SECRET = "opn-key-1", "opn-Secret-77"
MAC, OTHER = "bc:24:11:00:07:01", "bc:24:11:00:07:02"


@pytest.fixture
def sim():
    with OPNsenseSim(key=KEY, secret=SECRET) as s:
        yield s


def router(sim, dhcp="kea", secret=SECRET, subnet="192.168.1.0/24"):
    return make_backend({"kind": "opnsense", "address": "127.0.0.1", "url": sim.url, "user": KEY, "password": secret,
                         "subnet": subnet, "options": {"dhcp": dhcp}})  # fmt: skip


def test_sim_answers_200_with_validations(sim):
    sub = next(iter(sim.subnets))
    body = {"reservation": {"subnet": sub, "hw_address": MAC, "ip_address": "10.0.0.5"}}
    r = requests.post(sim.url + "/api/kea/dhcpv4/add_reservation", json=body, auth=(KEY, SECRET), timeout=5)
    assert r.status_code == 200
    assert r.json() == {
        "result": "failed",
        "validations": {"reservation.ip_address": "Address not in specified subnet"},
    }
    assert requests.get(sim.url + "/api/kea/dhcpv4/search_subnet", timeout=5).status_code == 401


@pytest.mark.parametrize("dhcp", ["kea", "dnsmasq"])
def test_keep_update_remove_with_one_reconfigure_each(sim, dhcp):
    sim.add_lease(MAC, "192.168.1.120", "vm-1", service=dhcp)
    b = router(sim, dhcp)
    b.ensure(MAC, None, "vm-1")
    b.ensure(OTHER, "192.168.1.60", "vm-2")
    assert b.apply(check_mode=True).changed and sim.reconfigures[dhcp] == 0
    b.ensure(MAC, None, "vm-1")
    b.ensure(OTHER, "192.168.1.60", "vm-2")
    res = b.apply()
    assert sorted(str(r.ip) for r in res.after) == ["192.168.1.120", "192.168.1.60"]
    assert sim.reconfigures[dhcp] == 1  # one reconfigure for the whole batch
    table = sim.reservations if dhcp == "kea" else sim.hosts
    assert sim.running[dhcp] == sim.rendered(dhcp) and len(table) == 2
    assert {v.get("description", v.get("descr")) for v in table.values()} == {"gpulab"}  # applied, so final
    b.ensure(MAC, None, "vm-1")
    b.ensure(OTHER, "192.168.1.60", "vm-2")
    assert b.apply().changed is False and sim.reconfigures[dhcp] == 1
    b.ensure(OTHER, "192.168.1.61", "vm-2")
    assert [c.action for c in b.apply().changes] == ["update"]
    b.remove(MAC)
    b.apply()
    assert [(v.get("hw_address") or v.get("hwaddr")) for v in table.values()] == [OTHER]


def test_dnsmasq_duplicate_hwaddr_is_refused(sim):
    for ip in ("192.168.1.10", "192.168.1.11"):
        sim.hosts[ip] = {"host": "", "domain": "", "ip": ip, "hwaddr": MAC, "descr": ""}
    b = router(sim, "dnsmasq")
    b.ensure(MAC)
    with pytest.raises(ConflictError, match="2 reservations"):
        b.apply()


def test_router_validation_failure_maps_to_a_refusal(sim):
    b = router(sim, subnet="192.168.1.0/24")
    real = sim._kea_validate
    sim._kea_validate = lambda obj, me: {"reservation.hw_address": "Duplicate entry exists"}
    b.ensure(MAC, "192.168.1.10")
    with pytest.raises(ConflictError, match="Duplicate entry exists"):
        b.apply()
    sim._kea_validate = real
    assert sim.reservations == {} and sim.reconfigures["kea"] == 0


def test_unknown_subnet_and_bad_secret(sim):
    b = router(sim, subnet="10.20.0.0/24")
    with pytest.raises(RouterError, match=r"has no subnet 10\.20\.0\.0/24"):
        b.list_reservations()
    with pytest.raises(AuthError) as err:
        router(sim, secret="bad-Secret-00").list_reservations()
    assert "bad-Secret-00" not in str(err.value)
    b = router(sim)
    b.ensure(MAC, "10.0.0.9")
    with pytest.raises(PolicyError):
        b.apply()
