"""Stage monitoring's engine (gpulab.monitoring): the pinned charts' key facts, the values gpulab renders and their
checks, both HelmCharts, and the proof's problems from Prometheus's answers."""

import json

import pytest
import yaml

from gpulab import hami, monitoring
from gpulab.k8s.validate import validate_manifest

from .conftest import VERSION, run_ansible_module

PROM = monitoring.load_keys("prometheus", "29.27.0")
GRAF = monitoring.load_keys("grafana", "12.11.1")
ARGS = {
    "prometheus_version": "29.27.0",
    "grafana_version": "12.11.1",
    "hami_version": "2.10.0",
    "server": "192.168.100.53",
    "gpu_nodes": ["192.168.100.55"],
}
CARD = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"


def test_the_key_facts_name_their_source_tag_and_commit():
    assert PROM["chart"] == "prometheus" and PROM["version"] == "29.27.0"
    assert "tag prometheus-29.27.0 = commit ca06aaef8a20ca639f06523f467cb0ef8a114feb" in PROM["source"]
    assert GRAF["chart"] == "grafana" and "tag grafana-12.11.1 = commit 864f7794" in GRAF["source"]
    # the keys gpulab sets, and the template-only ones its templates read
    for key in (
        "server.service.type",
        "server.service.nodePort",
        "scrapeConfigs",
        "server.global.scrape_interval",
    ):
        assert key in PROM["keys"], key
    for key in ("service.nodePort", "adminPassword", "dashboards", "global.imageRegistry"):
        assert key in GRAF["keys"], key


def test_rendered_values_use_only_chart_keys_and_make_two_valid_helmcharts():
    out = monitoring.render(**ARGS)
    assert hami.check_values(out["values"]["prometheus"], PROM) == []
    assert hami.check_values(out["values"]["grafana"], GRAF) == []
    jobs = out["values"]["prometheus"]["scrapeConfigs"]
    assert jobs["hami-scheduler"]["static_configs"] == [{"targets": ["192.168.100.53:31993"]}]
    assert jobs["hami-device-plugin"]["static_configs"] == [{"targets": ["192.168.100.55:31992"]}]
    dashboards = out["values"]["grafana"]["dashboards"]["hami"]["hami-vgpu"]
    assert dashboards["url"].endswith("/Project-HAMi/HAMi/v2.10.0/dashboards/hami-vgpu-dashboard.json")
    source = out["values"]["grafana"]["datasources"]["datasources.yaml"]["datasources"][0]
    assert source["url"] == "http://prometheus-server.monitoring.svc" and source["isDefault"] is True
    assert "adminPassword" not in out["values"]["grafana"]  # the chart makes one; gpulab never sees it
    for chart, text in out["manifests"].items():
        docs = [d for d in yaml.safe_load_all(text) if d]
        assert len(docs) == 1 and docs[0]["spec"]["chart"] == chart
        validate_manifest(docs[0], VERSION)
    assert out["urls"] == {
        "prometheus": "http://192.168.100.53:30090",
        "grafana": "http://192.168.100.53:30300",
        "dashboard": "http://192.168.100.53:30300/d/hami-vgpu-metrics",
    }


def test_the_image_registry_goes_to_every_image_of_both_charts():
    out = monitoring.render(**ARGS, image_registry="mirror.lan:5000")
    server = out["values"]["prometheus"]["server"]["image"]["repository"]
    reloader = out["values"]["prometheus"]["configmapReload"]["prometheus"]["image"]["repository"]
    assert server == "mirror.lan:5000/prometheus/prometheus"
    assert reloader == "mirror.lan:5000/prometheus-operator/prometheus-config-reloader"
    assert out["values"]["grafana"]["global"] == {"imageRegistry": "mirror.lan:5000"}


def test_unknown_keys_and_bad_node_ports_are_refused_naming_each():
    with pytest.raises(monitoring.MonitoringError) as err:
        monitoring.render(
            **ARGS,
            prometheus_node_port=9090,
            prometheus_extra_values={"server": {"servce": {"type": "NodePort"}}},
            grafana_extra_values={"adminPasword": "x"},
        )
    text = str(err.value)
    assert "prometheus 29.27.0: server.servce: not a value" in text and "did you mean server.service?" in text
    assert "grafana 12.11.1: adminPasword: not a value" in text and "did you mean adminPassword?" in text
    assert "prometheus: NodePort 9090 is outside" in text


def test_a_missing_version_or_address_is_refused():
    with pytest.raises(
        monitoring.MonitoringError, match=r"No key facts for chart prometheus 1\.0\.0 \(known: 29\.27\.0\)"
    ):
        monitoring.render(**{**ARGS, "prometheus_version": "1.0.0"})
    with pytest.raises(monitoring.MonitoringError, match="no GPU node"):
        monitoring.render(**{**ARGS, "gpu_nodes": []})


def test_the_module_returns_both_manifests():
    result = run_ansible_module("monitoring_charts", ARGS)
    assert result.get("failed") is not True, result
    assert result["changed"] is False and set(result["manifests"]) == {"prometheus", "grafana"}
    bad = run_ansible_module("monitoring_charts", {**ARGS, "grafana_extra_values": {"nosuch": 1}})
    assert bad["failed"] is True and "nosuch: not a value of" in bad["msg"]


WEBUI = monitoring.load_keys("hami-webui", "1.2.0")


def test_the_webui_key_facts_name_the_chart_release_and_its_defaults_that_gpulab_changes():
    assert WEBUI["chart"] == "hami-webui" and WEBUI["version"] == "1.2.0"
    assert "tag hami-webui-1.2.0 = commit b02ace2849c52d505b8c2dcb0a90f706bc1db00d" in WEBUI["source"]
    assert "Apache-2.0" in WEBUI["source"]
    # the chart's defaults that do not work here: moving image tags, ServiceMonitors without the Operator's CRDs
    assert {i["tag"] for i in WEBUI["images"].values()} == {"main"}
    for key in ("serviceMonitor.enabled", "hamiServiceMonitor.enabled", "dcgm-exporter.enabled"):
        assert WEBUI["keys"][key] == {"kind": "bool"}, key
    assert "service.nodePort" not in WEBUI["keys"]  # no fixed NodePort: the stage reads the assigned one


def test_with_the_webui_its_values_are_checked_and_make_a_third_valid_helmchart():
    out = monitoring.render(**ARGS, webui=True, image_registry="mirror.lan:5000")
    values = out["values"]["hami-webui"]
    assert hami.check_values(values, WEBUI) == []
    assert values["serviceMonitor"] == {"enabled": False} and values["hamiServiceMonitor"] == {
        "enabled": False
    }
    assert values["dcgm-exporter"] == {"enabled": False}
    assert values["externalPrometheus"] == {
        "enabled": True,
        "address": "http://prometheus-server.monitoring.svc",
    }
    assert values["service"] == {"type": "NodePort"}
    assert values["image"] == {
        "frontend": {"tag": "v1.2.0", "repository": "mirror.lan:5000/projecthami/hami-webui-fe-oss"},
        "backend": {"tag": "v1.2.0", "repository": "mirror.lan:5000/projecthami/hami-webui-be-oss"},
    }
    # Prometheus scrapes the WebUI backend's own metrics in the ServiceMonitor's stead
    job = out["values"]["prometheus"]["scrapeConfigs"]["hami-webui"]
    assert job["static_configs"] == [{"targets": ["hami-webui.monitoring.svc:8000"]}]
    assert set(out["manifests"]) == {"prometheus", "grafana", "hami-webui"}
    doc = yaml.safe_load(out["manifests"]["hami-webui"].split("---", 1)[1])
    assert (
        doc["spec"]["repo"] == "https://project-hami.github.io/HAMi-WebUI"
        and doc["spec"]["version"] == "1.2.0"
    )
    assert yaml.safe_load(doc["spec"]["valuesContent"]) == values
    validate_manifest(doc, VERSION)
    assert out["webui"] == {"service": "hami-webui", "namespace": "monitoring"}
    # without the registry the images keep the chart's repository, at the release's tag
    plain = monitoring.render(**ARGS, webui=True)["values"]["hami-webui"]["image"]
    assert plain == {"frontend": {"tag": "v1.2.0"}, "backend": {"tag": "v1.2.0"}}
    assert "hami-webui" not in monitoring.render(**ARGS)["manifests"]


def test_a_webui_that_does_not_fit_the_hami_chart_or_an_unknown_key_is_refused():
    with pytest.raises(monitoring.MonitoringError) as err:
        monitoring.render(**{**ARGS, "hami_version": "2.8.1"}, webui=True)
    msg = str(err.value)
    assert "monitoring_webui_chart_version = 1.2.0" in msg and "hami_chart_version = 2.8.1" in msg
    assert "2.9.0 or later" in msg and "monitoring_webui: false" in msg
    assert monitoring.render(**{**ARGS, "hami_version": "2.9.0"}, webui=True)["values"]["hami-webui"]
    with pytest.raises(monitoring.MonitoringError, match=r"knows no HAMi-WebUI chart 1\.1\.0"):
        monitoring.render(**ARGS, webui=True, webui_version="1.1.0")
    with pytest.raises(monitoring.MonitoringError, match=r"hami-webui 1\.2\.0: serviceMonitr"):
        monitoring.render(**ARGS, webui=True, webui_extra_values={"serviceMonitr": {"enabled": True}})


def test_the_webui_address_is_the_nodeport_kubernetes_assigned_to_its_http_port():
    service = {"spec": {"type": "NodePort", "ports": [
        {"name": "http", "port": 3000, "nodePort": 31234}, {"name": "metrics", "port": 8000, "nodePort": 30555}]}}  # fmt: skip
    assert monitoring.webui_node_port(service) == 31234
    assert monitoring.webui_node_port(json.dumps(service)) == 31234
    assert monitoring.webui_node_port({"spec": {"ports": [{"name": "http", "port": 3000}]}}) is None
    assert monitoring.webui_node_port("") is None and monitoring.webui_node_port("not json") is None


def test_the_module_renders_the_webui_beside_grafana():
    result = run_ansible_module("monitoring_charts", {**ARGS, "webui": True})
    assert result.get("failed") is not True, result
    assert set(result["manifests"]) == {"prometheus", "grafana", "hami-webui"}
    bad = run_ansible_module("monitoring_charts", {**ARGS, "webui": True, "hami_version": "2.8.1"})
    assert bad["failed"] is True and "hami_chart_version = 2.8.1" in bad["msg"]


def nodes_doc(devmem=24576):
    register = json.dumps(
        [{"id": CARD, "count": 10, "devmem": devmem, "devcore": 100, "type": "NVIDIA", "health": True}]
    )
    return {
        "items": [{"metadata": {"name": "vm-gpu", "annotations": {"hami.io/node-nvidia-register": register}}}]
    }


def pods_doc(*mibs):
    return {
        "items": [
            {"metadata": {"namespace": "default", "name": f"p{i}",
                          "annotations": {"hami.io/vgpu-devices-allocated": f"{CARD},NVIDIA,{mib},0:;"}},
             "status": {"phase": "Running"}}
            for i, mib in enumerate(mibs)
        ]
    }  # fmt: skip


def targets_doc(**health):
    return {"data": {"activeTargets": [
        {"labels": {"job": job, "instance": f"{job}:1"}, "health": h, "lastError": "" if h == "up" else "connection refused"}
        for job, h in health.items()]}}  # fmt: skip


def query_doc(value):
    return {
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"device_uuid": CARD}, "value": [0, str(value)]}],
        }
    }


def look(targets, query, pods):
    return json.dumps({"targets": targets, "query": query, "nodes": nodes_doc(), "pods": pods})


def test_the_proof_passes_when_both_targets_are_up_and_the_allocation_agrees():
    up = targets_doc(**{"hami-scheduler": "up", "hami-device-plugin": "up"})
    want = (9830 + 11059) * monitoring.MIB
    assert monitoring.problems(look(up, query_doc(want), pods_doc(9830, 11059))) == []


def test_the_proof_names_a_target_that_is_down_and_an_allocation_that_differs():
    down = targets_doc(**{"hami-scheduler": "up", "hami-device-plugin": "down"})
    found = monitoring.problems(look(down, query_doc(0), pods_doc(9830)))
    text = monitoring.problems_text(found)
    assert (
        "job hami-device-plugin target hami-device-plugin:1 = down: Prometheus cannot scrape it: connection refused"
        in text
    )
    assert (
        f"reports 0 bytes allocated on card {CARD} of node vm-gpu, the scheduler holds {9830 * monitoring.MIB}"
        in text
    )
    assert all(p["wait"] for p in found)
    missing = monitoring.problems(look(targets_doc(), {"data": {"result": []}}, pods_doc()))
    assert {p["field"] for p in missing} == {
        "job hami-scheduler", "job hami-device-plugin", f"hami_gpu_memory_allocated_bytes{{device_uuid={CARD}}}"
    }  # fmt: skip


def test_the_proof_waits_for_prometheus_to_scrape_the_rendered_targets():
    up = targets_doc(**{"hami-scheduler": "up", "hami-device-plugin": "up"})
    wanted = {"hami-scheduler": ["hami-scheduler:1"], "hami-device-plugin": ["10.0.0.9:31992"]}
    found = monitoring.problems(look(up, query_doc(0), pods_doc()), wanted)
    assert [(p["field"], p["wait"]) for p in found] == [("job hami-device-plugin targets", True)]
    assert (
        "Prometheus scrapes hami-device-plugin:1, the chart's values say 10.0.0.9:31992" in found[0]["cause"]
    )


def test_the_dashboard_queries_are_kept_with_their_provenance_only():
    kept = monitoring.dashboard_queries("2.10.0")
    assert "tag v2.10.0 = commit 4707fb02c91c545bc7343ce26dba4c32919f9a3e (Apache-2.0)" in kept["source"]
    assert kept["uid"] == "hami-vgpu-metrics"
    assert [v["name"] for v in kept["variables"]] == ["datasource", "node", "namespace"]
    assert len(kept["queries"]) >= 10 and all(set(q) == {"panel", "expr"} for q in kept["queries"])
