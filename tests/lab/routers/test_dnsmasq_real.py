"""dnsmasq for real: a DHCP client in its own namespace gets the reservation gpulab writes."""

import ipaddress
from pathlib import Path

import pytest

from gpulab.routers.dnsmasq import DnsmasqBackend
from gpulab.routers.model import ApplyError, ConflictError
from gpulab.routers.shell import LocalShell

pytestmark = pytest.mark.root

MAC = "bc:24:11:00:04:01"
OTHER = "bc:24:11:00:04:02"


def backend(lan, paths, shell=None):
    return DnsmasqBackend(
        shell or LocalShell(),
        hostsfile=paths["hostsfile"],
        leasefile=paths["leasefile"],
        pidfile=paths["pidfile"],
        subnet=lan.subnet,
        pool=lan.pool,
        name="test dnsmasq",
    )


def test_keep_then_move_with_a_real_client(lan, dnsmasq_router):
    lan.add_client(MAC.upper())
    first = lan.dhcp(MAC.upper())
    assert first is not None and ipaddress.ip_address(first) in ipaddress.ip_network(lan.subnet)

    b = backend(lan, dnsmasq_router)
    assert [lease.mac for lease in b.list_leases()] == [MAC]
    b.ensure(MAC.upper(), None, "vm-1")  # keep what it holds
    res = b.apply()
    assert res.changed and [str(r.ip) for r in res.after] == [first]
    assert f"{MAC},{first},vm-1" in Path(dnsmasq_router["hostsfile"]).read_text()

    # renew: same address, and the lease now carries the reserved hostname (dnsmasq read the file)
    assert lan.dhcp(MAC.upper()) == first
    assert any(lease.hostname == "vm-1" for lease in b.list_leases())

    b.ensure(MAC, None, "vm-1")
    assert b.apply().changed is False

    # check mode changes nothing on disk
    before = Path(dnsmasq_router["hostsfile"]).read_text()
    b.ensure(MAC, "192.168.100.60", "vm-1")
    assert b.apply(check_mode=True).changed is True
    assert Path(dnsmasq_router["hostsfile"]).read_text() == before

    # planned address: the client moves there on its next renew
    b.ensure(MAC, "192.168.100.60", "vm-1")
    res = b.apply()
    assert [c.action for c in res.changes] == ["update"]
    assert lan.dhcp(MAC.upper()) == "192.168.100.60"

    b.remove(MAC)
    assert b.apply().changed
    assert MAC not in Path(dnsmasq_router["hostsfile"]).read_text()


def test_refuses_an_address_another_client_holds(lan, dnsmasq_router):
    lan.add_client(MAC)
    lan.add_client(OTHER)
    theirs = lan.dhcp(OTHER)
    lan.dhcp(MAC)
    b = backend(lan, dnsmasq_router)
    b.ensure(MAC, theirs)
    with pytest.raises(ConflictError, match=f"leased to {OTHER}"):
        b.apply()
    assert Path(dnsmasq_router["hostsfile"]).read_text() == ""


def test_hand_written_lines_survive(lan, dnsmasq_router):
    hosts = Path(dnsmasq_router["hostsfile"])
    hosts.write_text(
        "# my printer\n02:00:00:00:00:99,192.168.100.20,printer,infinite\nid:foo,192.168.100.21\n"
    )
    b = backend(lan, dnsmasq_router)
    assert [(r.mac, str(r.ip), r.hostname) for r in b.list_reservations()] == [
        ("02:00:00:00:00:99", "192.168.100.20", "printer")
    ]
    b.ensure(MAC, "192.168.100.30", "vm-1")
    b.apply()
    text = hosts.read_text()
    assert "02:00:00:00:00:99,192.168.100.20,printer,infinite\n" in text
    assert "id:foo,192.168.100.21\n" in text
    assert f"{MAC},192.168.100.30,vm-1\n" in text
    log = (lan.dir / "dnsmasq.log").read_text()
    assert "read " + str(hosts) in log  # dnsmasq re-read the file on SIGHUP


def test_refuses_a_hostsfile_dnsmasq_does_not_read(lan, dnsmasq_router, tmp_path):
    other = tmp_path / "not-read-by-dnsmasq"
    b = backend(lan, {**dnsmasq_router, "hostsfile": str(other)})
    b.ensure(MAC, "192.168.100.30")
    with pytest.raises(ApplyError, match=f"does not read {other}.*dhcp-hostsfile={other}"):
        b.apply()
    assert not other.exists()
    b = backend(lan, {**dnsmasq_router, "pidfile": str(tmp_path / "no.pid")})
    b.ensure(MAC, "192.168.100.30")
    with pytest.raises(ApplyError, match="no running dnsmasq"):
        b.apply(check_mode=True)
