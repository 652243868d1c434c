"""RouterOS v7 REST backend against the simulator built from the REST API docs."""

import pytest
import requests

from gpulab.routers import make_backend
from gpulab.routers.model import AuthError, ConflictError, ConnectError, PolicyError, RouterError
from labsim.routers.base import Reply
from labsim.routers.mikrotik import MikroTikSim

PW = "Rtr-pa55-word"
MAC, OTHER = "bc:24:11:00:05:01", "bc:24:11:00:05:02"


@pytest.fixture
def sim():
    with MikroTikSim(password=PW) as s:
        yield s


def router(sim, password=PW, **options):
    return make_backend({
        "kind": "mikrotik", "address": "127.0.0.1", "url": sim.url, "user": "admin", "password": password,
        "subnet": "192.168.88.0/24", "pool": {"start": "192.168.88.10", "end": "192.168.88.254"}, "options": options,
    })  # fmt: skip


def test_sim_speaks_routeros_errors(sim):
    r = requests.get(sim.url + "/rest/ip/dhcp-server/lease", timeout=5)
    assert r.status_code == 401 and r.json() == {"error": 401, "message": "Unauthorized"}
    auth = ("admin", PW)
    r = requests.patch(sim.url + "/rest/ip/dhcp-server/lease/*99", json={}, auth=auth, timeout=5)
    assert r.status_code == 404 and r.json()["message"] == "Not Found"
    body = {"mac-address": MAC, "address": "192.168.88.5", "server": "nope"}
    r = requests.put(sim.url + "/rest/ip/dhcp-server/lease", json=body, auth=auth, timeout=5)
    assert r.status_code == 400 and r.json()["detail"] == "input does not match any value of server"


def test_keep_pins_the_current_lease_with_make_static(sim):
    dyn = sim.add_dynamic(MAC, "192.168.88.77", "vm-1")
    b = router(sim)
    b.ensure(MAC, None, "vm-1")
    res = b.apply()
    assert [(c.action, str(c.after.ip)) for c in res.changes] == [("create", "192.168.88.77")]
    assert sim.count("POST", "/rest/ip/dhcp-server/lease/make-static") == 1
    assert sim.count("PUT") == 0
    assert dyn["dynamic"] == "false" and dyn["comment"] == "gpulab:vm-1"
    b.ensure(MAC.upper(), None, "vm-1")
    assert b.apply().changed is False


def test_planned_address_put_update_remove(sim):
    b = router(sim)
    b.ensure(MAC, "192.168.88.5", "vm-1")
    assert b.apply(check_mode=True).changed and sim.leases == []
    b.ensure(MAC, "192.168.88.5", "vm-1")
    b.apply()
    (lease,) = sim.leases
    assert (lease["address"], lease["mac-address"], lease["server"]) == (
        "192.168.88.5",
        MAC.upper(),
        "defconf",
    )
    b.ensure(MAC, "192.168.88.6", "vm-1")
    assert [c.action for c in b.apply().changes] == ["update"]
    assert sim.leases[0]["address"] == "192.168.88.6"
    b.remove(MAC)
    b.apply()
    assert sim.leases == []


def test_refusals_before_any_write(sim):
    sim.add_dynamic(OTHER, "192.168.88.50")
    b = router(sim)
    writes = sim.count("PUT") + sim.count("PATCH")
    b.ensure(MAC, "192.168.88.50")
    with pytest.raises(ConflictError, match=f"leased to {OTHER}"):
        b.apply()
    b.ensure(MAC, "10.9.9.9")
    with pytest.raises(PolicyError):
        b.apply()
    assert sim.count("PUT") + sim.count("PATCH") == writes


def test_router_refusal_is_reported_and_earlier_changes_undone(sim):
    b = router(sim)
    # the router refuses the second PUT (as if another admin had just taken the address)
    real = sim.handle
    calls = {"put": 0}

    def flaky(req):
        if req.method == "PUT":
            calls["put"] += 1
            if calls["put"] == 2:
                detail = "failure: already have static lease with this IP address"
                return Reply(400, {"error": 400, "message": "Bad Request", "detail": detail})
        return real(req)

    sim.handle = flaky
    b.ensure(MAC, "192.168.88.5")
    b.ensure(OTHER, "192.168.88.6")
    with pytest.raises(ConflictError, match=r"already have static lease with this IP address.*undone"):
        b.apply()
    assert sim.leases == []


def test_wrong_password_is_an_auth_error_and_masked(sim):
    b = router(sim, password="not-the-Pa55")
    b.ensure(MAC, "192.168.88.5")
    with pytest.raises(AuthError) as err:
        b.apply()
    assert "not-the-Pa55" not in str(err.value) and "HTTP 401" in str(err.value)


def test_planned_address_for_a_client_with_a_dynamic_lease(sim):
    sim.add_dynamic(MAC, "192.168.88.77", "vm-1")
    b = router(sim)
    b.ensure(MAC, "192.168.88.5", "vm-1")
    b.apply()
    assert [(x["address"], x["dynamic"]) for x in sim.leases] == [("192.168.88.5", "false")]


def test_https_certificate_is_checked_unless_told_otherwise(tmp_path):
    with MikroTikSim(password=PW, tls_dir=tmp_path) as tls:
        assert tls.url.startswith("https://")
        with pytest.raises(ConnectError, match="router_validate_certs: false"):
            router(tls).list_reservations()
        cfg = {"kind": "mikrotik", "address": "127.0.0.1", "url": tls.url, "user": "admin", "password": PW,
               "subnet": "192.168.88.0/24", "validate_certs": False}  # fmt: skip
        assert make_backend(cfg).list_reservations() == []


def test_injected_server_error_mid_batch_is_undone(sim):
    sim.add_dynamic(OTHER, "192.168.88.40")
    b = router(sim)
    b.ensure(MAC, "192.168.88.5", "vm-1")
    b.ensure(OTHER, None, "vm-2")
    real = sim.handle

    def fail_on_make_static(req):
        if req.path.endswith("/make-static"):
            return Reply(500, {"error": 500, "message": "Internal Server Error"})
        return real(req)

    sim.handle = fail_on_make_static
    # the first write (PUT) succeeds; make-static answers 500: the PUT is undone
    with pytest.raises(RouterError, match=r"HTTP 500.*1 change\(s\) already made were undone"):
        b.apply()
    assert [(x["mac-address"], x["dynamic"]) for x in sim.leases] == [(OTHER.upper(), "true")]


def test_fault_injection_answers_the_next_requests(sim):
    sim.fail_next(2, 503, {"error": 503, "message": "Service Unavailable"})
    b = router(sim)
    for _ in range(2):
        with pytest.raises(RouterError, match="HTTP 503"):
            b.list_reservations()
    assert b.list_reservations() == []
