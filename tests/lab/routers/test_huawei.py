"""Huawei EchoLife ONT (the reference lab's router) through the http_form engine, against its simulator."""

import pytest
import requests

from gpulab.routers import make_backend
from gpulab.routers.httpform import js_unescape
from gpulab.routers.model import AuthError, ConflictError, LimitError, RouterError
from labsim.routers.huawei import MAX_ENTRIES, HuaweiOntSim, js_escape

PW = "Ont-Pa55!word"
VMS = {"vm-1": ("bc:24:11:00:08:01", "192.168.100.53"), "vm-2": ("bc:24:11:00:08:02", "192.168.100.54"),
       "vm-gpu": ("bc:24:11:00:08:03", "192.168.100.55")}  # fmt: skip


@pytest.fixture
def sim():
    with HuaweiOntSim(password=PW) as s:
        yield s


def router(sim, password=PW, **options):
    return make_backend({"kind": "huawei_ont", "address": "127.0.0.1", "url": sim.url, "user": "admin",
                         "password": password, "subnet": "192.168.100.0/24",
                         "pool": {"start": "192.168.100.2", "end": "192.168.100.254"}, "options": options})  # fmt: skip


def test_js_escaping_round_trip():
    for text in ["192.168.100.53", "bc:24:11:00:08:01", "vm-gpu", 'a\\b"c']:
        assert js_unescape(js_escape(text)) == text
    assert js_escape("192.168") == "192\\x2e168"


def test_pages_need_a_session(sim):
    r = requests.get(sim.url + "/html/bbsp/dhcpstatic/dhcpstatic.asp", timeout=5)
    assert r.status_code == 200 and 'id="txt_Username"' in r.text  # 200 + login page, not 401


def test_reference_lab_keep_three_vms_then_idempotent(sim):
    for name, (mac, ip) in VMS.items():
        sim.add_client(mac, ip, name)
    with router(sim) as b:
        for name, (mac, _) in VMS.items():
            b.ensure(mac.upper(), None, name, name=name)
        res = b.apply()
    assert res.changed and sorted(sim.table()) == sorted(VMS.values())
    assert sim.sessions == {}  # logged out: the ONT allows one admin session
    with router(sim) as b:
        for name, (mac, _) in VMS.items():
            b.ensure(mac, None, name)
        assert b.apply().changed is False
    assert sim.count("POST", "/html/bbsp/dhcpstatic/add.cgi") == 3


def test_check_mode_writes_nothing(sim):
    mac, ip = VMS["vm-1"]
    with router(sim) as b:
        b.ensure(mac, ip)
        assert b.apply(check_mode=True).changed
    assert sim.table() == [] and sim.count("POST", "/html/bbsp/dhcpstatic/") == 0


def test_update_and_delete_by_tr098_path(sim):
    with router(sim) as b:
        for name, (mac, ip) in VMS.items():
            b.ensure(mac, ip, name)
        b.apply()
        b.remove(VMS["vm-1"][0])
        b.apply()
        b.ensure(VMS["vm-gpu"][0], "192.168.100.99")
        assert [c.action for c in b.apply().changes] == ["update"]
    assert sim.table() == [VMS["vm-2"], (VMS["vm-gpu"][0], "192.168.100.99")]
    assert sorted(sim.entries) == [2, 3]  # instance numbers stay put


def test_sixteen_entry_limit_is_refused_before_writing(sim):
    for n in range(MAX_ENTRIES - 1):
        sim.entries[n + 1] = {"enable": "1", "ip": f"192.168.100.{150 + n}", "mac": f"02:00:00:00:00:{n:02x}"}
    with router(sim) as b:
        b.ensure(VMS["vm-1"][0], "192.168.100.53")
        b.ensure(VMS["vm-2"][0], "192.168.100.54")
        with pytest.raises(LimitError, match="at most 16"):
            b.apply()
    assert len(sim.entries) == MAX_ENTRIES - 1


def test_firmware_refusal_found_by_rereading_and_earlier_writes_undone(sim):
    with router(sim) as b:
        b.ensure(VMS["vm-1"][0], "192.168.100.53")
        b.ensure(VMS["vm-2"][0], "192.168.100.54")
        # another admin fills the table between gpulab's plan and its second write
        real = sim._write

        def crowded(req, op):
            if op == "add" and len(sim.entries) == 1:
                for n in range(2, MAX_ENTRIES + 1):
                    sim.entries[n] = {
                        "enable": "1",
                        "ip": f"192.168.100.{180 + n}",
                        "mac": f"02:00:00:00:01:{n:02x}",
                    }
            return real(req, op)

        sim._write = crowded
        with pytest.raises(LimitError, match=r"did not take it.*at most 16 static entries.*undone"):
            b.apply()
    assert VMS["vm-1"][0] not in [m for m, _ in sim.table()]


def test_expired_session_logs_in_again(sim):
    with router(sim) as b:
        assert b.list_reservations() == []
        sim.expire_sessions()
        b.ensure(VMS["vm-1"][0], VMS["vm-1"][1])
        assert b.apply().changed
    assert sim.table() == [VMS["vm-1"]]


def test_wrong_password_and_busy_session(sim):
    with pytest.raises(AuthError) as err, router(sim, password="Wrong-pw-1") as b:
        b.list_reservations()
    assert "Wrong-pw-1" not in str(err.value) and "refused the login" in str(err.value)
    other = router(sim)
    other.list_reservations()  # someone is logged in and never logs out
    with pytest.raises(AuthError, match="another admin session"), router(sim) as b:
        b.list_reservations()
    other.close()


def test_duplicate_mac_on_the_router(sim):
    sim.entries[1] = {"enable": "1", "ip": "192.168.100.20", "mac": VMS["vm-1"][0]}
    sim.entries[2] = {"enable": "1", "ip": "192.168.100.21", "mac": VMS["vm-1"][0]}
    with pytest.raises(ConflictError), router(sim) as b:
        b.ensure(VMS["vm-1"][0])
        b.apply()


def test_profile_override_for_other_firmware(sim):
    with (
        pytest.raises(RouterError, match="did not show token"),
        router(
            sim,
            profile={
                "login": [{"method": "GET", "url": "/asp/GetRandCount.asp", "extract": {"token": "NOPE(x)"}}]
            },
        ) as b,
    ):
        b.list_reservations()


def test_probe_and_profile_override_from_a_yaml_file(sim, tmp_path):
    from gpulab.routers import probe

    sim.add_client(*VMS["vm-1"])
    cfg = {"kind": "huawei_ont", "address": "127.0.0.1", "url": sim.url, "user": "admin", "password": PW,
           "subnet": "192.168.100.0/24"}  # fmt: skip
    assert probe(cfg) == {"kind": "huawei_ont", "reservations": 0, "leases": 1}
    assert sim.sessions == {}
    f = tmp_path / "isp.yml"
    f.write_text(
        "leases:\n  request: {method: GET, url: /no/such/page.asp}\n  rows: 'x(y)'\n  fields: [ref]\n"
    )
    with pytest.raises(RouterError, match="HTTP 404"):
        probe({**cfg, "options": {"profile": str(f)}})
