"""gpulab.routerspec: the router and each VM's reservation resolved once from the lab definition."""

from __future__ import annotations

import json

import pytest

from gpulab import labdef, routerspec


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
        "machine": "vm",
        "hostname": "vm-1",
        "mac": None,
        "address": None,
        "expect": "192.168.100.53",
    }
    # and the node: its own static address for its LAN bridge port's MAC (read from the node at run time)
    assert [r["host"] for r in spec["reservations"]] == ["vm-1", "vm-2", "vm-gpu", "pve"]
    assert spec["reservations"][3] == {"host": "pve", "machine": "node", "hostname": "pve", "mac": None,
                                       "address": "192.168.100.5", "expect": None}  # fmt: skip
    assert spec["skipped"] == []


def test_planned_mode_wants_the_vm_address_and_the_mac_is_normalised_once(inv):
    inv.hosts["vm-2"]["vm_mac"] = "BC:24:11:0A:0B:0C"
    spec = router(inv, router_dhcp_reservation_mode="planned", router_dhcp_set_hostname=False)
    vm2 = spec["reservations"][1]
    assert vm2 == {"host": "vm-2", "machine": "vm", "hostname": None, "mac": "bc:24:11:0a:0b:0c",
                   "address": "192.168.100.54", "expect": None}  # fmt: skip
    # the node wants its own address in either mode
    assert spec["reservations"][3]["address"] == "192.168.100.5"


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
        "pve": {"mac": "02:00:00:AA:00:05", "address": None},  # gpulab_node_lan_mac, read from the node
    }
    rows = routerspec.reservations(spec, facts, new=["vm-gpu"])
    assert rows == [
        {"mac": "bc:24:11:00:00:01", "address": None, "expect": "192.168.100.53",
         "current_address": "192.168.100.53", "hostname": "vm-1", "name": "vm-1"},
        {"mac": "bc:24:11:00:00:02", "address": None, "expect": "192.168.100.54", "current_address": None,
         "hostname": "vm-2", "name": "vm-2"},
        # a node holds its static address, and its reservation is that address
        {"mac": "02:00:00:aa:00:05", "address": "192.168.100.5", "expect": None,
         "current_address": "192.168.100.5", "hostname": "pve", "name": "pve"},
    ]  # fmt: skip
    with pytest.raises(routerspec.RouterSpecError, match=r"^no MAC known for vm-gpu: run stage vms first"):
        routerspec.reservations(spec, facts)
    assert [r["name"] for r in routerspec.reservations(spec, facts, known_only=True)] == [
        "vm-1",
        "vm-2",
        "pve",
    ]
    del facts["pve"]
    with pytest.raises(routerspec.RouterSpecError, match=r"^no MAC known for node pve: stage network reads"):
        routerspec.reservations(spec, facts, new=["vm-gpu"])
    assert [r["name"] for r in routerspec.reservations(spec, facts, known_only=True)] == ["vm-1", "vm-2"]


@pytest.mark.parametrize(
    ("kind", "node", "why"),
    [
        ("huawei_ont", "192.168.100.5", None),  # the reference: inside the pool, which the ONT accepts
        (
            "pfsense",
            "192.168.100.5",
            "inside the DHCP pool 192.168.100.2-192.168.100.254 and this router takes",
        ),
        ("pfsense", "192.168.100.5", None),  # a pool from .100 on: outside it, pfSense takes it
        ("dnsmasq", "10.0.0.5", "10.0.0.5 is outside the router's subnet 192.168.100.0/24"),
        ("dnsmasq", "pve.lan", "its address (ansible_host 'pve.lan') is not an IPv4 address"),
    ],
)
def test_a_node_is_reserved_only_where_the_router_takes_its_static_address(inv, kind, node, why):
    inv.hosts["isp-router"]["router_kind"] = kind
    if kind == "pfsense" and why is None:
        inv.hosts["isp-router"]["router_dhcp_pool"]["start"] = "192.168.100.100"
    inv.hosts["pve"]["ansible_host"] = node
    lab, _ = inv.check()
    spec = routerspec.resolve(lab, {}.get)
    nodes = [r for r in spec["reservations"] if r["machine"] == "node"]
    if why is None:
        assert nodes == [{"host": "pve", "machine": "node", "hostname": "pve", "mac": None, "address": node,
                          "expect": None}] and spec["skipped"] == []  # fmt: skip
    else:
        assert nodes == [] and len(spec["skipped"]) == 1
        assert spec["skipped"][0]["host"] == "pve" and why in spec["skipped"][0]["why"]
        assert f"no reservation for node pve ({node}): " in labdef.plan_text(lab)


def test_no_router_is_refused_with_the_fix(inv):
    inv.groups["router"] = []
    lab, _ = inv.check()
    with pytest.raises(
        routerspec.RouterSpecError, match="no host in inventory group router: add the router's host"
    ):
        routerspec.resolve(lab, {}.get)
