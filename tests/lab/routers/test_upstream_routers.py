"""The router simulators against their upstream sources: one test per behaviour listed in
library/labsim/UPSTREAM.md (## routers), named after its id (OpenWrt's uci command line, OPNsense's Kea model)."""

import subprocess
import sys

import pytest
import requests

from labsim.routers.opnsense import OPNsenseSim

DHCP = """config dnsmasq
\toption domainneeded '1'

config host
\toption name 'printer'
\toption mac '02:00:00:00:00:99'
\toption ip '192.168.1.20'

config host 'vm1'
\toption name 'vm-1'
\toption mac 'bc:24:11:00:09:01'
\tlist tag 'lab'
"""
KEY, SECRET = "opn-key-1", "opn-Secret-77"


@pytest.fixture
def uci(tmp_path):
    (tmp_path / "dhcp").write_text(DHCP)

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "labsim.routers.openwrt_uci", "-c", str(tmp_path), *args],
            capture_output=True,
            text=True,
        )

    return run


def test_uci_entry_not_found(uci):
    for args in (("get", "dhcp.nosuch.ip"), ("get", "dhcp.vm1.ip"), ("delete", "dhcp.@host[5]")):
        out = uci(*args)
        assert (out.returncode, out.stdout, out.stderr) == (1, "", "uci: Entry not found\n"), args
    quiet = uci("-q", "get", "dhcp.nosuch.ip")
    assert (quiet.returncode, quiet.stderr) == (1, "")


def test_uci_show_format(uci):
    out = uci("show", "dhcp")
    assert out.returncode == 0, out.stderr
    # config.section=type, config.section.option='value'; anonymous sections as @type[index]
    assert out.stdout.splitlines() == [
        "dhcp.@dnsmasq[0]=dnsmasq",
        "dhcp.@dnsmasq[0].domainneeded='1'",
        "dhcp.@host[0]=host",
        "dhcp.@host[0].name='printer'",
        "dhcp.@host[0].mac='02:00:00:00:00:99'",
        "dhcp.@host[0].ip='192.168.1.20'",
        "dhcp.vm1=host",
        "dhcp.vm1.name='vm-1'",
        "dhcp.vm1.mac='bc:24:11:00:09:01'",
        "dhcp.vm1.tag='lab'",
    ]
    # get prints the bare value
    assert uci("get", "dhcp.@host[0].ip").stdout == "192.168.1.20\n"


@pytest.fixture
def opnsense():
    with OPNsenseSim(key=KEY, secret=SECRET) as sim:
        yield sim


def add_reservation(sim, **fields):
    body = {"reservation": {"subnet": next(iter(sim.subnets)), **fields}}
    r = requests.post(sim.url + "/api/kea/dhcpv4/add_reservation", json=body, auth=(KEY, SECRET), timeout=5)
    assert r.status_code == 200  # OPNsense answers a refused object with 200 and its validations
    return r.json()


def test_opnsense_kea_address_in_subnet(opnsense):
    answer = add_reservation(opnsense, hw_address="bc:24:11:00:07:01", ip_address="10.0.0.5")
    assert answer == {
        "result": "failed",
        "validations": {"reservation.ip_address": "Address not in specified subnet"},
    }


def test_opnsense_kea_hw_address_unique(opnsense):
    first = add_reservation(opnsense, hw_address="bc:24:11:00:07:01", ip_address="192.168.1.50")
    assert first["result"] == "saved" and first["uuid"]
    # the same MAC in the same subnet, in any case, is refused on hw_address
    again = add_reservation(opnsense, hw_address="BC:24:11:00:07:01", ip_address="192.168.1.51")
    assert again["result"] == "failed" and list(again["validations"]) == ["reservation.hw_address"]
    assert again["validations"]["reservation.hw_address"].startswith("Duplicate entry exists")
