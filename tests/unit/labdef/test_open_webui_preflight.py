"""What preflight refuses of Open WebUI (role workloads, workloads_open_webui) before any change: a chart key the
pinned version lacks, no engine on the LAN, and an address in use, outside the LAN, given twice or without
kube-vip (gpulab.labdef.open_webui_values, gpulab.labdef.checks.check_open_webui_lan)."""

import pytest

from unit.k3s.engines import VLLM

from .test_engine_lan import BAD_LAN_ADDRESSES, LAN, with_kube_vip


def with_webui(inv, **settings):
    inv.globals["workloads_engines"] = inv.globals.get("workloads_engines") or [LAN]
    inv.globals["workloads_open_webui"] = True
    inv.globals.update({f"workloads_open_webui_{k}": v for k, v in settings.items()})
    return inv


def test_preflight_takes_open_webui_on_the_nodes_and_at_a_free_address(inv):
    assert with_webui(inv).messages() == []
    assert with_webui(with_kube_vip(inv), lan_address="192.168.100.61").messages() == []


def test_off_open_webui_settings_are_not_checked(inv):
    inv.globals["workloads_open_webui_extra_values"] = {"servce": {}}
    assert inv.messages() == []


def test_preflight_refuses_an_unknown_chart_key_naming_it(inv):
    with_webui(inv, extra_values={"persistence": {"sise": "5Gi"}})
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_open_webui_extra_values" and problem.value == "persistence.sise"
    assert "not a value of open-webui chart 16.0.0" in problem.why and "persistence.size" in problem.why


def test_preflight_refuses_a_chart_version_gpulab_does_not_know(inv):
    with_webui(inv, chart_version="9.9.9")
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_open_webui_chart_version" and "no key facts" in problem.why


def test_preflight_refuses_open_webui_without_a_lan_engine(inv):
    inv.globals["workloads_engines"] = [VLLM]
    with_webui(inv)
    (problem,) = inv.check()[1]
    assert (
        problem.field == "workloads_open_webui"
        and "no engine of workloads_engines is on the LAN" in problem.why
    )


@pytest.mark.parametrize("address, why", [*BAD_LAN_ADDRESSES, ("webui.lan", "not an IPv4 address")])
def test_preflight_refuses_a_bad_open_webui_address(inv, address, why):
    with_webui(with_kube_vip(inv), lan_address=address)
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_open_webui_lan_address" and problem.value == address
    assert why in problem.why


def test_preflight_refuses_an_engines_address_for_open_webui_naming_both(inv):
    inv.globals["workloads_engines"] = [{**LAN, "lan_address": "192.168.100.61"}]
    with_webui(with_kube_vip(inv), lan_address="192.168.100.61")
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_open_webui_lan_address"
    assert "given twice, to engine vllm and to Open WebUI" in problem.why


def test_preflight_refuses_an_open_webui_address_without_kube_vip(inv):
    inv.hosts["isp-router"]["router_dhcp_pool"] = {"start": "192.168.100.100", "end": "192.168.100.200"}
    with_webui(inv, lan_address="192.168.100.61")
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_open_webui_lan_address" and "no kube-vip runs" in problem.why


def test_preflight_refuses_an_engines_servicelb_port_for_open_webui_naming_both(inv):
    inv.globals["workloads_engines"] = [{**LAN, "lan_port": 8080}]
    with_webui(inv)
    (problem,) = inv.check()[1]
    assert problem.field == "workloads_open_webui_lan_port" and problem.value == 8080
    assert "Open WebUI and engine vllm both take port 8080" in problem.why
