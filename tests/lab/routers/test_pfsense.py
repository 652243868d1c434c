"""pfSense (pfrest REST API v2) backend against the simulator built from the package's docs."""

import pytest
import requests

from gpulab.routers import make_backend
from gpulab.routers.model import AuthError, ConflictError, PolicyError, RouterError
from labsim.routers.pfsense import PfSenseSim

PW = "pf-Secret-99"
MAC, OTHER = "bc:24:11:00:06:01", "bc:24:11:00:06:02"
POOL = {"start": "192.168.1.100", "end": "192.168.1.199"}


@pytest.fixture
def sim():
    with PfSenseSim(password=PW, api_key="KEY-abcdef-123") as s:
        yield s


def router(sim, pool=POOL, **cfg):
    return make_backend({"kind": "pfsense", "address": "127.0.0.1", "url": sim.url, "user": "admin", "password": PW,
                         "subnet": "192.168.1.0/24", "pool": pool, **cfg})  # fmt: skip


def test_sim_envelope_and_in_pool_409(sim):
    r = requests.get(sim.url + "/api/v2/services/dhcp_server/static_mappings?parent_id=lan", timeout=5)
    assert r.status_code == 401 and r.json()["response_id"] == "AUTH_AUTHENTICATION_FAILED"
    body = {"parent_id": "lan", "mac": MAC, "ipaddr": "192.168.1.150"}
    r = requests.post(
        sim.url + "/api/v2/services/dhcp_server/static_mapping", json=body, auth=("admin", PW), timeout=5
    )
    assert r.status_code == 409
    assert r.json()["response_id"] == "DHCP_SERVER_STATIC_MAPPING_IPADDR_OVERLAPS_EXISTING_OBJECT"


def test_keep_of_a_pool_address_is_refused_with_the_fix(sim):
    sim.add_lease(MAC, "192.168.1.150", "vm-1")
    b = router(sim)
    b.ensure(MAC, None, "vm-1")
    with pytest.raises(PolicyError, match=r"inside its DHCP pool .* plan an address outside the pool"):
        b.apply()
    assert sim.mappings["lan"] == []


def test_router_409_is_explained_when_the_inventory_pool_is_wrong(sim):
    b = router(sim, pool={"start": "192.168.1.2", "end": "192.168.1.50"})  # inventory disagrees with pfSense
    b.ensure(MAC, "192.168.1.150", "vm-1")
    with pytest.raises(PolicyError, match="outside the DHCP range"):
        b.apply()
    b.ensure(MAC, "192.168.1.150", "vm-1")
    with pytest.raises(PolicyError, match="outside the DHCP range"):
        b.apply(check_mode=True)  # dry_run=true asks pfSense itself
    assert sim.mappings["lan"] == []


def test_create_update_delete_with_shifting_ids_and_one_apply(sim):
    b = router(sim)
    for n, mac in enumerate([MAC, OTHER, "bc:24:11:00:06:03"]):
        b.ensure(mac, f"192.168.1.{10 + n}", f"vm-{n}")
    assert b.apply().changed
    assert sim.count("POST", "/api/v2/services/dhcp_server/apply") == 1 and not sim.pending
    assert [m["ipaddr"] for m in sim.applied["lan"]] == ["192.168.1.10", "192.168.1.11", "192.168.1.12"]
    # deleting the first shifts the others' ids; the update of the third must still hit the right one
    b.remove(MAC)
    b.apply()
    b.ensure("bc:24:11:00:06:03", "192.168.1.20", "vm-2")
    b.ensure(OTHER, "192.168.1.11", "vm-1")
    res = b.apply()
    assert [c.action for c in res.changes] == ["update"]
    assert [(m["mac"], m["ipaddr"]) for m in sim.mappings["lan"]] == [
        (OTHER, "192.168.1.11"),
        ("bc:24:11:00:06:03", "192.168.1.20"),
    ]
    b.ensure(OTHER, "192.168.1.11", "vm-1")
    assert b.apply().changed is False


def test_api_key_auth_and_wrong_key(sim):
    b = router(sim, password="KEY-abcdef-123", options={"auth": "api_key"})
    b.ensure(MAC, "192.168.1.10")
    assert b.apply().changed
    b = router(sim, password="KEY-wrong-456", options={"auth": "api_key"})
    with pytest.raises(AuthError) as err:
        b.list_reservations()
    assert "KEY-wrong-456" not in str(err.value)


def test_duplicate_mac_on_the_router_is_refused(sim):
    sim.mappings["lan"] += [{"mac": MAC, "ipaddr": "192.168.1.10", "hostname": "", "descr": ""},
                            {"mac": MAC.upper(), "ipaddr": "192.168.1.11", "hostname": "", "descr": ""}]  # fmt: skip
    b = router(sim)
    b.ensure(MAC)
    with pytest.raises(ConflictError, match="2 reservations"):
        b.apply()


def test_someone_elses_unapplied_changes_are_not_applied_along(sim):
    sim.mappings["lan"].append({"mac": OTHER, "ipaddr": "192.168.1.30", "hostname": "", "descr": ""})
    sim.pending = True  # saved by an admin, not applied
    b = router(sim)
    b.ensure(MAC, "192.168.1.10")
    with pytest.raises(RouterError, match="not applied"):
        b.apply()
    assert sim.pending and [m["mac"] for m in sim.mappings["lan"]] == [OTHER]


def test_a_run_cut_off_before_its_apply_is_applied_by_the_next_run(sim):
    """The connection dropped after the reservation was saved and before the apply: pfSense holds it but does
    not serve it. The next run has nothing to write, sees `applied: false`, applies once; the run after that
    changes nothing."""
    sim.mappings["lan"].append({"mac": MAC, "ipaddr": "192.168.1.10", "hostname": "vm-1", "descr": ""})
    sim.pending = True
    b = router(sim)
    b.ensure(MAC, "192.168.1.10", "vm-1")
    res = b.apply(check_mode=True)
    assert res.changed and res.changes == [] and sim.pending  # check mode says so and applies nothing
    b.ensure(MAC, "192.168.1.10", "vm-1")
    res = b.apply()
    assert res.changed and res.changes == [] and not sim.pending
    assert [m["ipaddr"] for m in sim.applied["lan"]] == ["192.168.1.10"]
    b.ensure(MAC, "192.168.1.10", "vm-1")
    assert b.apply().changed is False
    assert sim.count("POST", "/api/v2/services/dhcp_server/apply") == 1
