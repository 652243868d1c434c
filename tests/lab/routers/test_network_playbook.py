"""Stage network end to end: playbooks/network.yml against a real dnsmasq and real DHCP clients."""

import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from unit.routers.resolved import router_extra_vars

ROOT = Path(__file__).resolve().parents[3]
MACS = {"vm-1": "BC:24:11:00:04:21", "vm-2": "BC:24:11:00:04:22"}


def inventory(tmp: Path, lan, paths, mode="keep", addresses=None) -> Path:
    addresses = addresses or {}
    router = {
        "ansible_connection": "local",
        "router_kind": "dnsmasq",
        "router_address": "192.168.100.1",
        "router_subnet": lan.subnet,
        "router_dhcp_pool": lan.pool,
        "router_options": paths,
    }
    vms = {
        name: {"vm_mac": mac, "vm_address": addresses.get(name, "192.168.100.5" + name[-1])}
        for name, mac in MACS.items()
    }
    inv = {
        "all": {
            "children": {"router": {"hosts": {"lab-router": router}}, "vms": {"hosts": vms}},
            "vars": {"router_dhcp_reservation_mode": mode},
        }
    }
    p = tmp / "hosts.yml"
    p.write_text(yaml.safe_dump(inv))
    return p


def play(inv: Path, *extra):
    """Run the stage; return (rc, changed count on localhost, output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    env["ANSIBLE_NOCOLOR"] = "1"
    cmd = [
        str(ROOT / ".venv/bin/ansible-playbook"),
        "-i",
        str(inv),
        str(ROOT / "playbooks/network.yml"),
        *router_extra_vars(inv, inv.parent),
        *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300, check=False)
    recap = re.search(r"localhost\s*:\s*ok=\d+\s+changed=(\d+)", proc.stdout)
    assert recap, proc.stdout + proc.stderr
    return proc.returncode, int(recap.group(1)), proc.stdout + proc.stderr


@pytest.mark.root
@pytest.mark.slow
def test_network_stage_keep_idempotent_check_and_planned(lan, dnsmasq_router, tmp_path):
    for mac in MACS.values():
        lan.add_client(mac)
    held = {name: lan.dhcp(mac) for name, mac in MACS.items()}
    hosts = Path(dnsmasq_router["hostsfile"])
    untouched = hosts.read_text()

    # keep mode keeps the address each VM holds, which must be the vm_address the rest of the run uses
    rc, changed, out = play(inventory(tmp_path, lan, dnsmasq_router))
    assert rc != 0 and changed == 0, out
    for name in MACS:  # each VM is named, whichever comes first
        assert f"{name} ({MACS[name].lower()}) holds {held[name]} (its DHCP lease" in out, out
    assert "its vm_address is 192.168.100.51" in out and "its vm_address is 192.168.100.52" in out, out
    assert hosts.read_text() == untouched

    rc, changed, out = play(inventory(tmp_path, lan, dnsmasq_router, addresses=held))
    assert (rc, changed) == (0, 1), out
    for name, mac in MACS.items():
        assert f"{mac.lower()},{held[name]},{name}" in hosts.read_text()
        assert lan.dhcp(mac) == held[name]  # each VM holds its reserved address after a renew

    rc, changed, out = play(inventory(tmp_path, lan, dnsmasq_router, addresses=held))
    assert (rc, changed) == (0, 0), out

    before = hosts.read_text()
    planned = inventory(tmp_path, lan, dnsmasq_router, "planned", {"vm-1": "192.168.100.71"})
    rc, changed, out = play(planned, "--check", "--diff")
    assert (rc, changed) == (0, 1), out
    assert f"+{MACS['vm-1'].lower()} 192.168.100.71 vm-1" in out
    assert f"-{MACS['vm-1'].lower()} {held['vm-1']} vm-1" in out
    assert hosts.read_text() == before

    # (a planned apply moving the client is proven at engine level in test_dnsmasq_real)


@pytest.mark.slow
def test_network_stage_refusal_names_the_vm_and_changes_nothing(tmp_path):
    """Refusals come from the plan, before dnsmasq is touched: plain files are enough here."""
    paths = {
        "hostsfile": str(tmp_path / "hosts"),
        "leasefile": str(tmp_path / "leases"),
        "pidfile": str(tmp_path / "pid"),
    }
    Path(paths["hostsfile"]).write_text("")

    lan = SimpleNamespace(
        subnet="192.168.100.0/24", pool={"start": "192.168.100.100", "end": "192.168.100.200"}
    )
    rc, changed, out = play(inventory(tmp_path, lan, paths, "planned", {"vm-1": "10.1.2.3"}))
    assert rc != 0 and changed == 0
    assert "cannot reserve 10.1.2.3 for vm-1" in out and "outside the router's subnet" in out
    assert '"error_code": "policy"' in out
    assert Path(paths["hostsfile"]).read_text() == ""


@pytest.mark.slow
def test_network_stage_refuses_a_kube_vip_vip_another_mac_holds_or_has_reserved(tmp_path):
    """k3s_registration_address, an IPv4 address that is no VM's vm_address, is the kube-vip VIP of the k3s servers:
    a reservation or a live lease of it for any MAC stops the stage before any write, in check mode too, naming
    the host, the field, the value and the fix. A server's vm_address is no VIP and is reserved as usual."""
    paths = {
        "hostsfile": str(tmp_path / "hosts"),
        "leasefile": str(tmp_path / "leases"),
        "pidfile": str(tmp_path / "pid"),
        # no dnsmasq here: the plan refuses before any write, and the free case is a dry run
        "reload_command": "true",
        "check_wiring": False,
    }
    hosts, leases = Path(paths["hostsfile"]), Path(paths["leasefile"])
    lan = SimpleNamespace(
        subnet="192.168.100.0/24", pool={"start": "192.168.100.100", "end": "192.168.100.200"}
    )
    inv = inventory(tmp_path, lan, paths, "planned")
    vip = ("-e", "k3s_registration_address=192.168.100.60")

    hosts.write_text("")
    rc, changed, out = play(inv, "--check", *vip)
    assert (rc, changed) == (0, 1), out  # free: both VMs would be reserved

    printer = "bc:24:11:00:09:99"
    for reserved, leased in (
        (f"{printer},192.168.100.60,printer\n", ""),
        ("", f"0 {printer} 192.168.100.60 tv *\n"),
    ):
        hosts.write_text(reserved)
        leases.write_text(leased)
        for check in (["--check"], []):
            rc, changed, out = play(inv, *check, *vip)
            assert rc != 0 and changed == 0, out
            assert (
                "all: k3s_registration_address = 192.168.100.60 (the kube-vip VIP the k3s servers hold)"
                in out
            )
            assert ("is reserved for " if reserved else "is leased to ") + printer in out, out
            assert (
                "Fix: remove that reservation or release that lease" in out
                and '"error_code": "conflict"' in out
            )
            assert hosts.read_text() == reserved

    # a server's vm_address is what agents register through, reserved for its MAC: nothing to keep free
    rc, changed, out = play(inv, "--check", "-e", "k3s_registration_address=192.168.100.51")
    assert (rc, changed) == (0, 1) and "kube-vip" not in out, out
