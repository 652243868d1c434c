"""Kea 2.2 for real: reservations through the control agent reach a real DHCP client."""

import functools
import json
from pathlib import Path

import pytest
import requests

from gpulab.routers.kea import KeaBackend
from gpulab.routers.model import ApplyError, AuthError, ConflictError, PolicyError

pytestmark = pytest.mark.root

MAC = "bc:24:11:00:04:11"
OTHER = "bc:24:11:00:04:12"


def backend(lan, kea, **kw):
    kw.setdefault("user", kea["user"])
    kw.setdefault("password", kea["password"])
    return KeaBackend(kea["url"], subnet=lan.subnet, pool=lan.pool, name="test kea", **kw)


def saved_reservations(kea):
    conf = json.loads(Path(kea["config"]).read_text())
    return [(r["hw-address"], r["ip-address"]) for r in conf["Dhcp4"]["subnet4"][0].get("reservations", [])]


def test_keep_then_move_with_a_real_client(lan, kea_router):
    lan.add_client(MAC)
    first = lan.dhcp(MAC)
    assert first is not None
    b = backend(lan, kea_router)
    assert [(lease.mac, str(lease.ip)) for lease in b.list_leases()] == [(MAC, first)]

    b.ensure(MAC, None, "vm-1")
    res = b.apply()
    assert res.changed
    assert saved_reservations(kea_router) == [(MAC, first)]  # config-write saved it
    assert lan.dhcp(MAC) == first

    b.ensure(MAC, None, "vm-1")
    assert b.apply().changed is False

    b.ensure(MAC, "192.168.100.61", "vm-1")
    assert b.apply(check_mode=True).changed
    assert saved_reservations(kea_router) == [(MAC, first)]

    b.ensure(MAC, "192.168.100.61", "vm-1")
    assert [c.action for c in b.apply().changes] == ["update"]
    assert saved_reservations(kea_router) == [(MAC, "192.168.100.61")]
    assert lan.dhcp(MAC) == "192.168.100.61"

    b.remove(MAC)
    assert b.apply().changed
    assert saved_reservations(kea_router) == []


def test_refusals_change_nothing_and_kea_keeps_serving(lan, kea_router):
    lan.add_client(MAC)
    lan.add_client(OTHER)
    theirs = lan.dhcp(OTHER)
    b = backend(lan, kea_router)
    b.ensure(MAC, theirs)
    with pytest.raises(ConflictError, match="leased to"):
        b.apply()
    b.ensure(MAC, "10.0.0.5")
    with pytest.raises(PolicyError, match="outside"):
        b.apply()
    assert saved_reservations(kea_router) == []
    assert lan.dhcp(MAC) is not None  # still serving


def spy_commands(monkeypatch, b, tamper):
    """Record the commands `b` sends to Kea; each goes through `tamper(send, command, arguments)`."""
    sent = []
    send = b.command

    def spy(command, arguments=None, **kw):
        sent.append(command)
        return tamper(functools.partial(send, **kw), command, arguments)

    monkeypatch.setattr(b, "command", spy)
    return sent


def test_config_test_guards_config_set(lan, kea_router, monkeypatch):
    """A config Kea refuses is never config-set: the server keeps serving DHCP afterwards."""
    lan.add_client(MAC)
    b = backend(lan, kea_router)

    def unknown_parameter(send, command, arguments):
        if command == "config-test" and arguments:
            # what a refusal looks like: Kea rejects an unknown top-level parameter
            arguments = json.loads(json.dumps(arguments))
            arguments["Dhcp4"]["no-such-parameter"] = True
        return send(command, arguments)

    sent = spy_commands(monkeypatch, b, unknown_parameter)
    b.ensure(MAC, "192.168.100.62")
    with pytest.raises(ApplyError, match=r"config-test refused .* nothing was changed"):
        b.apply()
    assert "config-set" not in sent
    assert lan.dhcp(MAC) is not None


def test_wrong_password_is_an_auth_error_that_hides_it(lan, kea_router):
    b = backend(lan, kea_router, password="wrong-Pa55word")
    with pytest.raises(AuthError) as err:
        b.list_reservations()
    assert "HTTP 401" in str(err.value) and "wrong-Pa55word" not in str(err.value)
    r = requests.post(kea_router["url"], data="not json", headers={"Content-Type": "text/plain"}, timeout=5)
    assert r.status_code in (400, 401)


def test_failed_config_set_reloads_the_saved_configuration(lan, kea_router, monkeypatch):
    lan.add_client(MAC)
    b = backend(lan, kea_router)

    def refuse_config_set(send, command, arguments):
        if command == "config-set":  # as if Kea had refused it after all
            return {"result": 1, "text": "simulated refusal"}
        return send(command, arguments)

    sent = spy_commands(monkeypatch, b, refuse_config_set)
    b.ensure(MAC, "192.168.100.63")
    with pytest.raises(ApplyError, match="simulated refusal; its configuration file was reloaded"):
        b.apply()
    assert sent[-2:] == ["config-set", "config-reload"]
    assert lan.dhcp(MAC) is not None
