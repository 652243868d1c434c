"""dnsmasq backend without root: file formats, and the wiring check against a stand-in process."""

import ipaddress
import subprocess

import pytest
from polling import wait_until

from gpulab.routers.dnsmasq import DnsmasqBackend, parse_host_line, parse_leases
from gpulab.routers.model import ApplyError
from gpulab.routers.shell import LocalShell


def test_lease_file_lines():
    text = (
        "1796024065 02:00:00:aa:bb:01 192.168.100.189 * 01:02:00:00:aa:bb:01\n"
        "0 02:00:00:AA:BB:02 192.168.100.190 vm-2 *\n"
        "duid 00:01:00:01:2c:aa\n"
        "1796024065 1234 fd00::5 * 00:01\n"
        "garbage\n"
    )
    leases = parse_leases(text)
    assert [(le.mac, str(le.ip), le.hostname, le.expires) for le in leases] == [
        ("02:00:00:aa:bb:01", "192.168.100.189", None, 1796024065),
        ("02:00:00:aa:bb:02", "192.168.100.190", "vm-2", None),
    ]


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("02:00:00:aa:bb:01,192.168.100.189,vm101", ("02:00:00:aa:bb:01", "192.168.100.189", "vm101")),
        ("02:00:00:AA:BB:01,192.168.100.189", ("02:00:00:aa:bb:01", "192.168.100.189", None)),
        (
            "02:00:00:aa:bb:01,192.168.100.189,vm101,infinite",
            ("02:00:00:aa:bb:01", "192.168.100.189", "vm101"),
        ),
        ("02:00:00:aa:bb:01,192.168.100.189,12h", ("02:00:00:aa:bb:01", "192.168.100.189", None)),
        ("# comment", None),
        ("id:01:02,192.168.100.5", None),
        ("02:00:00:aa:bb:01,ignore", None),
    ],
)
def test_hostsfile_lines(line, want):
    r = parse_host_line(line)
    assert (None if r is None else (r.mac, str(r.ip), r.hostname)) == want


@pytest.fixture
def standin(tmp_path):
    """A process named dnsmasq (a shell script ignoring SIGHUP) started with --conf-file."""
    conf, hosts = tmp_path / "dnsmasq.conf", tmp_path / "hosts"
    conf.write_text(f"port=0\n  dhcp-hostsfile={hosts}\n")
    script = tmp_path / "dnsmasq"
    script.write_text(
        f"#!/bin/sh\ntrap 'echo hup >> {tmp_path}/hups' HUP\ntouch {tmp_path}/ready\nwhile :; do sleep 0.05; done\n"
    )
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), f"--conf-file={conf}"])
    (tmp_path / "pid").write_text(f"{proc.pid}\n")
    # its trap set before any SIGHUP (one sent sooner ends the shell): a loaded machine may take seconds
    assert wait_until(lambda: (tmp_path / "ready").exists(), every=0.05)
    yield tmp_path
    proc.kill()
    proc.wait()


def backend(d, hostsfile):
    return DnsmasqBackend(LocalShell(), hostsfile=str(hostsfile), leasefile=str(d / "leases"), pidfile=str(d / "pid"),
                          subnet="192.168.100.0/24")  # fmt: skip


def test_wiring_found_in_the_conf_file_and_sighup_sent(standin):
    b = backend(standin, standin / "hosts")
    b.ensure("bc:24:11:00:0c:01", "192.168.100.9", "vm-1")
    b.apply()
    assert (standin / "hosts").read_text().splitlines()[-1] == "bc:24:11:00:0c:01,192.168.100.9,vm-1"
    assert wait_until(lambda: (standin / "hups").exists(), every=0.05)
    assert (standin / "hups").read_text() == "hup\n"
    assert [r.ip for r in b.list_reservations()] == [ipaddress.IPv4Address("192.168.100.9")]


def test_a_file_the_conf_does_not_name_is_refused(standin):
    b = backend(standin, standin / "hosts.other")
    b.ensure("bc:24:11:00:0c:01", "192.168.100.9")
    with pytest.raises(ApplyError, match="does not read"):
        b.apply()
    assert not (standin / "hosts.other").exists()
