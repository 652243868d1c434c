"""The lab's Huawei ONT (labsim.routers.lab_ont): its web form writes the reservations a real dnsmasq serves.

A DHCP client in its own namespace holds a lease from dnsmasq; gpulab's huawei_ont backend reserves another
address for its MAC through the form (the LAN clients page lists dnsmasq's lease on the way), and the client's
next lease is that reservation. The form's table survives a restart of the ONT.
"""

import json
from pathlib import Path

import pytest

from gpulab.routers import make_backend
from labsim.routers.lab_ont import LabOnt, hosts_lines, read_leases

PW = "Lab-Ont-Pw-27"
MAC = "bc:24:11:00:27:01"
POOL = ("192.168.100.100", "192.168.100.200")  # tests/unit/routers/conftest.py's


def ont(paths, state):
    return LabOnt(password=PW, lan="192.168.100.1/24", hosts_file=paths["hostsfile"],
                  leases_file=paths["leasefile"], pid_file=paths["pidfile"], state_file=state)  # fmt: skip


def backend(url):
    return make_backend({"kind": "huawei_ont", "address": "192.168.100.1", "url": url, "user": "admin",
                         "password": PW, "subnet": "192.168.100.0/24",
                         "pool": {"start": POOL[0], "end": POOL[1]}, "options": {}})  # fmt: skip


@pytest.mark.root
def test_ont_form_writes_dnsmasq_hostsfile(lan, dnsmasq_router, tmp_path):
    """A reservation made on the form is the client's next lease (UPSTREAM.md row of the same name)."""
    lan.add_client(MAC.upper())
    first = lan.dhcp(MAC.upper())
    assert first is not None
    state = tmp_path / "static.json"
    with ont(dnsmasq_router, state) as sim:
        with backend(sim.url) as b:
            assert [(lease.mac, str(lease.ip)) for lease in b.list_leases()] == [(MAC, first)]
            b.ensure(MAC, "192.168.100.60", name="vm-1")
            assert b.apply().changed
        assert Path(dnsmasq_router["hostsfile"]).read_text() == f"{MAC},192.168.100.60\n"
    # dnsmasq re-read its hostsfile on the ONT's SIGHUP: the renewing client gets the reservation
    assert lan.dhcp(MAC.upper()) == "192.168.100.60"
    with ont(dnsmasq_router, state) as sim, backend(sim.url) as b:
        b.ensure(MAC, "192.168.100.60", name="vm-1")
        assert b.apply().changed is False  # the table the form kept
    assert json.loads(state.read_text())["1"]["ip"] == "192.168.100.60"


def test_the_hostsfile_has_the_enabled_entries_and_the_clients_are_the_live_leases(tmp_path):
    entries = {2: {"enable": "1", "ip": "192.168.100.54", "mac": "bc:24:11:00:27:02"},
               1: {"enable": "1", "ip": "192.168.100.53", "mac": "bc:24:11:00:27:01"},
               3: {"enable": "0", "ip": "192.168.100.55", "mac": "bc:24:11:00:27:03"}}  # fmt: skip
    assert hosts_lines(entries) == "bc:24:11:00:27:01,192.168.100.53\nbc:24:11:00:27:02,192.168.100.54\n"
    leases = tmp_path / "leases"
    leases.write_text(
        "1000 BC:24:11:00:27:01 192.168.100.53 vm-1 01:bc:24:11:00:27:01\n"
        "0 bc:24:11:00:27:02 192.168.100.54 * *\n"
        "10 bc:24:11:00:27:03 192.168.100.55 vm-gpu *\n"  # expired
        "duid 00:01:00:01\n"
    )
    assert read_leases(leases, now=100) == [
        {"name": "vm-1", "ip": "192.168.100.53", "mac": "bc:24:11:00:27:01", "remain": 900},
        {"name": "", "ip": "192.168.100.54", "mac": "bc:24:11:00:27:02", "remain": 86400},
    ]
