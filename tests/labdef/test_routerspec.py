"""gpulab.routerspec: the router and each VM's reservation resolved once from the lab definition."""

from __future__ import annotations

import json

import pytest

from gpulab import routerspec


def router(inv, **settings):
    lab, problems = inv.check()
    assert problems == [], [str(p) for p in problems]
    return routerspec.resolve(lab, settings.get)


def test_the_reference_router_is_resolved_whole_and_holds_no_secret(inv):
    spec = router(inv)
    assert {k: spec[k] for k in ("host", "kind", "address", "subnet", "url", "validate_certs", "user")} == {
        "host": "isp-router",
        "kind": "huawei_ont",
        "address": "192.168.100.1",
        "subnet": "192.168.100.0/24",
        "url": "http://192.168.100.1",  # the kind's default: these ONTs serve plain HTTP
        "validate_certs": True,  # the catalogue's default
        "user": "admin",
    }
    assert spec["pool"] == {"start": "192.168.100.2", "end": "192.168.100.254"}
    assert spec["options"] == {"profile": None} and spec["ssh"] is None
    assert spec["secrets"] == {"password": "router_password"}
    assert "s3cret-pass" not in json.dumps(spec)
    # keep mode (the role's default): each VM keeps what it holds, which must be its vm_address
    assert spec["mode"] == "keep"
    assert spec["reservations"][0] == {
        "host": "vm-1",
        "hostname": "vm-1",
        "mac": None,
        "address": None,
        "expect": "192.168.100.53",
    }
    assert [r["host"] for r in spec["reservations"]] == ["vm-1", "vm-2", "vm-gpu"]


def test_planned_mode_wants_the_vm_address_and_the_mac_is_normalised_once(inv):
    inv.hosts["vm-2"]["vm_mac"] = "BC:24:11:0A:0B:0C"
    spec = router(inv, router_dhcp_reservation_mode="planned", router_dhcp_set_hostname=False)
    vm2 = spec["reservations"][1]
    assert vm2 == {"host": "vm-2", "hostname": None, "mac": "bc:24:11:0a:0b:0c", "address": "192.168.100.54",
                   "expect": None}  # fmt: skip


def test_an_ssh_router_is_reached_as_its_host_says_and_the_options_merge(inv):
    inv.hosts["isp-router"] = {
        "router_kind": "dnsmasq",
        "router_address": "192.168.100.1",
        "router_subnet": "192.168.100.0/24",
        "router_dhcp_pool": {"start": "192.168.100.2", "end": "192.168.100.254"},
        "router_options": {"hostsfile": "/etc/lab-hosts"},
        "ansible_host": "10.9.9.1",
        "ansible_ssh_common_args": "-o UserKnownHostsFile=/tmp/kh",
        "ansible_ssh_private_key_file": "__omit_place_holder__0123",
        "ansible_password": "ssh-secret",
    }
    spec = router(inv, router_dhcp_options={"check_wiring": False})
    assert spec["url"] is None
    assert spec["options"] == {
        "hostsfile": "/etc/lab-hosts",
        "leasefile": "/var/lib/misc/dnsmasq.leases",
        "pidfile": "/run/dnsmasq/dnsmasq.pid",
        "reload_command": None,
        "check_wiring": False,
    }
    assert spec["ssh"] == {
        "host": "10.9.9.1",
        "port": 22,
        "user": "root",
        "key_file": None,  # omitted in the inventory
        "host_key_checking": True,
        "known_hosts": None,
        "ssh_args": "-o UserKnownHostsFile=/tmp/kh",
        "become": False,
        "local": False,
    }
    assert spec["secrets"] == {"password": "router_password", "ssh_password": "ansible_password"}
    assert "ssh-secret" not in json.dumps(spec)
    assert router(inv, router_dhcp_ssh_host_key_checking=False)["ssh"]["host_key_checking"] is False


def test_the_reservations_join_what_stage_vms_recorded(inv):
    inv.hosts["vm-1"]["vm_mac"] = "BC:24:11:00:00:01"
    spec = router(inv)
    facts = {
        "vm-1": {"mac": "bc:24:11:99:99:99", "address": "192.168.100.53"},  # vm_mac wins
        "vm-2": {"mac": "BC-24-11-00-00-02", "address": None},
    }
    rows = routerspec.reservations(spec, facts, new=["vm-gpu"])
    assert rows == [
        {"mac": "bc:24:11:00:00:01", "address": None, "expect": "192.168.100.53",
         "current_address": "192.168.100.53", "hostname": "vm-1", "name": "vm-1"},
        {"mac": "bc:24:11:00:00:02", "address": None, "expect": "192.168.100.54", "current_address": None,
         "hostname": "vm-2", "name": "vm-2"},
    ]  # fmt: skip
    with pytest.raises(routerspec.RouterSpecError, match=r"^no MAC known for vm-gpu: run stage vms first"):
        routerspec.reservations(spec, facts)
    assert [r["name"] for r in routerspec.reservations(spec, facts, known_only=True)] == ["vm-1", "vm-2"]


def test_no_router_is_refused_with_the_fix(inv):
    inv.groups["router"] = []
    lab, _ = inv.check()
    with pytest.raises(
        routerspec.RouterSpecError, match="no host in inventory group router: add the router's host"
    ):
        routerspec.resolve(lab, {}.get)
