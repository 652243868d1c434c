"""OpenWrt over SSH (uci) against the uci stand-in, run through a real shell."""

import os
import sys
from pathlib import Path

import pytest

from gpulab.routers.model import ApplyError, ConflictError, RouterError
from gpulab.routers.openwrt import OpenWrtBackend, parse_show
from gpulab.routers.shell import LocalShell
from labsim.routers import openwrt_uci
from labsim.routers.openwrt_uci import parse

MAC, OTHER = "bc:24:11:00:09:01", "bc:24:11:00:09:02"
DHCP = """config dnsmasq
\toption domainneeded '1'
\toption leasefile '{leases}'

config dhcp 'lan'
\toption interface 'lan'
\toption start '100'
\toption limit '150'

config host
\toption name 'printer'
\toption mac '02:00:00:00:00:99'
\toption ip '192.168.1.20'
"""


@pytest.fixture
def router(tmp_path):
    conf = tmp_path / "config"
    conf.mkdir()
    leases = tmp_path / "dhcp.leases"
    leases.write_text("")
    (conf / "dhcp").write_text(DHCP.format(leases=leases))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    uci = bindir / "uci"
    # -S and a direct path: a Python start per uci call, as cheap as it gets
    lib = Path(openwrt_uci.__file__).parents[2]
    uci.write_text(
        f'#!/bin/sh\nexec {sys.executable} -S -c \'import sys; sys.path.insert(0, "{lib}"); '
        'from labsim.routers.openwrt_uci import main; sys.exit(main(sys.argv[1:]))\' "$@"\n'
    )
    uci.chmod(0o755)
    reload_log = tmp_path / "reloads"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", GPULAB_UCI_DIR=str(conf))
    b = OpenWrtBackend(LocalShell(env=env), reload_command=f"echo reload >> {reload_log}",
                       subnet="192.168.1.0/24", pool={"start": "192.168.1.100", "end": "192.168.1.249"})  # fmt: skip
    b.paths = {"conf": conf / "dhcp", "leases": leases, "reloads": reload_log, "stage": conf / ".uci"}
    return b


def reloads(b):
    p = b.paths["reloads"]
    return len(p.read_text().splitlines()) if p.exists() else 0


def test_parse_show_handles_lists_and_quotes():
    text = "dhcp.cfg01=host\ndhcp.cfg01.mac='aa:bb:cc:dd:ee:01' 'aa:bb:cc:dd:ee:02'\ndhcp.cfg01.name='it'\\''s'\n"
    assert parse_show(text) == {
        "cfg01": {".type": "host", "mac": ["aa:bb:cc:dd:ee:01", "aa:bb:cc:dd:ee:02"], "name": "it's"}
    }


def test_reads_hand_made_hosts_and_lease_file_from_uci(router):
    router.paths["leases"].write_text(f"1900000000 {MAC.upper()} 192.168.1.150 vm-1 *\n")
    assert [(r.mac, str(r.ip), r.hostname) for r in router.list_reservations()] == [
        ("02:00:00:00:00:99", "192.168.1.20", "printer")
    ]
    assert [(lease.mac, str(lease.ip)) for lease in router.list_leases()] == [(MAC, "192.168.1.150")]


def test_keep_commit_reload_once_then_idempotent(router):
    router.paths["leases"].write_text(f"1900000000 {MAC} 192.168.1.150 vm-1 *\n")
    router.ensure(MAC, None, "vm-1")
    router.ensure(OTHER, "192.168.1.60", "vm-2")
    res = router.apply()
    assert res.changed and reloads(router) == 1
    committed = {s[".name"]: s for s in parse(router.paths["conf"].read_text())}
    assert committed["gpulab_bc2411000901"]["opts"] == {"mac": MAC, "ip": "192.168.1.150", "name": "vm-1"}
    assert committed["gpulab_bc2411000902"]["opts"]["ip"] == "192.168.1.60"
    router.ensure(MAC, None, "vm-1")
    router.ensure(OTHER, "192.168.1.60", "vm-2")
    assert router.apply().changed is False and reloads(router) == 1


def test_check_mode_stages_and_reverts(router):
    before = router.paths["conf"].read_text()
    router.ensure(MAC, "192.168.1.61", "vm-1")
    assert router.apply(check_mode=True).changed
    assert router.paths["conf"].read_text() == before
    assert not (router.paths["stage"] / "dhcp").exists() and reloads(router) == 0


def test_update_and_remove_hand_made_entry(router):
    router.ensure("02:00:00:00:00:99", "192.168.1.21")
    assert [c.action for c in router.apply().changes] == ["update"]
    assert "option ip '192.168.1.21'" in router.paths["conf"].read_text()
    router.remove("02:00:00:00:00:99")
    router.apply()
    assert "02:00:00:00:00:99" not in router.paths["conf"].read_text()


def test_refusal_leaves_no_staged_half(router):
    router.ensure(MAC, "192.168.1.20")  # the printer's address
    with pytest.raises(ConflictError, match="already reserves it for 02:00:00:00:00:99"):
        router.apply()
    assert not (router.paths["stage"] / "dhcp").exists() and reloads(router) == 0


def test_uci_failure_reverts(router):
    # make uci fail on the second command of the batch: a section name uci refuses
    from gpulab.routers import openwrt

    real = openwrt.section_name
    openwrt.section_name = lambda mac: "bad-name!"
    try:
        router.ensure(MAC, "192.168.1.70")
        with pytest.raises(ApplyError, match="uci refused the changes"):
            router.apply()
    finally:
        openwrt.section_name = real
    assert not (router.paths["stage"] / "dhcp").exists()
    assert Path(router.paths["conf"]).read_text().count("config host") == 1


def test_someone_elses_uncommitted_changes_are_left_alone(router):
    shell = router.shell
    assert shell.run("uci set dhcp.lan.limit=200").rc == 0  # an admin's pending edit
    router.ensure(MAC, "192.168.1.70")
    with pytest.raises(RouterError, match="uncommitted changes"):
        router.apply()
    router.ensure(MAC, "192.168.1.70")
    with pytest.raises(RouterError, match="uncommitted changes"):
        router.apply(check_mode=True)
    assert "dhcp.lan.limit='200'" in shell.run("uci changes dhcp").out
    assert "option limit '150'" in router.paths["conf"].read_text()


def test_an_interrupted_runs_staged_half_is_dropped_and_never_served(router):
    """The connection dropped after `uci set` of a new host section and before `uci commit`: the committed
    file (what dnsmasq serves) is untouched, a check run refuses and names it, the next run reverts the half and
    writes the whole batch once."""
    before = router.paths["conf"].read_text()
    shell = router.shell
    section = "dhcp.gpulab_bc2411000901"
    assert shell.run(f"uci set {section}=host && uci set {section}.mac={MAC}").rc == 0  # the half staged
    assert router.paths["conf"].read_text() == before
    router.ensure(MAC, "192.168.1.70", "vm-1")
    with pytest.raises(RouterError, match="staged changes of an interrupted gpulab run"):
        router.apply(check_mode=True)
    assert shell.run("uci changes dhcp").out.strip()  # the check run wrote nothing
    router.ensure(MAC, "192.168.1.70", "vm-1")
    res = router.apply()
    assert [c.action for c in res.changes] == ["create"] and reloads(router) == 1
    assert router.dropped_leftovers and not shell.run("uci changes dhcp").out.strip()
    hosts = [s for s in parse(router.paths["conf"].read_text()) if s[".type"] == "host"]
    assert [h["opts"].get("ip") for h in hosts] == ["192.168.1.20", "192.168.1.70"]


def test_own_changes_only_tells_gpulab_sections_from_an_admins():
    from gpulab.routers.openwrt import own_changes_only

    assert own_changes_only(
        "dhcp.gpulab_bc2411000901='host'\ndhcp.gpulab_bc2411000901.mac='bc:24:11:00:09:01'\n"
    )
    assert own_changes_only("-dhcp.gpulab_bc2411000901\n")
    assert not own_changes_only("dhcp.gpulab_bc2411000901='host'\ndhcp.lan.limit='200'\n")
    assert not own_changes_only("") and not own_changes_only("dhcp.cfg0a1b2c.ip='192.168.1.9'\n")
