"""HAMi's metrics on the k3s stand-in (labsim.net.k3s.hami_metrics) and the Prometheus chart's config as the
stand-in renders it (labsim.net.k3s.monitoring_charts), then a real Prometheus (the distribution's package)
scraping the stand-in's two endpoints: the proof of stage monitoring and every query of HAMi's dashboard answered."""

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

from gpulab import monitoring
from labsim.net.k3s import hami, hami_metrics, monitoring_charts

from .conftest import free_port

CARD = {
    "uuid": "GPU-e1924eea-b9bb-d537-39f2-b345087fa145",
    "name": "NVIDIA GeForce RTX 3090",
    "memory_mib": 24576,
}
MIB = 1024 * 1024


def pod(name, mib, cores=0, hami_core=True, node="vm-gpu", started=1.0):
    env = [] if hami_core else [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    return {"name": name, "namespace": "default", "node": node, "phase": None, "started": started,
            "annotations": {"hami.io/vgpu-node": node,
                            "hami.io/vgpu-devices-allocated": f"{CARD['uuid']},NVIDIA,{mib},{cores}:;"},
            "spec": {"containers": [{"name": "engine", "env": env}]}}  # fmt: skip


NODES = {
    "vm-gpu": {"hami_register": hami.register_annotation([CARD], 10), "gpu_cards": [CARD]},
    "vm-1": {},
}
PODS = [pod("vllm", 9830, hami_core=False), pod("ollama", 11059, cores=30)]


def series(text):
    """name -> [(labels, value text)] of an exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = dict(p.split("=", 1) for p in labels.rstrip("}").split(",")) if labels else {}
        out.setdefault(name, []).append(({k: v.strip('"') for k, v in pairs.items()}, value))
    return out


def test_hami_metrics_values_as_go_formats_them():
    cases = {25769803776: "2.5769803776e+10", 100: "100", 0: "0", 1e6: "1e+06", 123456: "123456",
             0.4: "0.4", 0.85: "0.85", 1.5e-05: "1.5e-05", 0.0001: "0.0001", float("nan"): "NaN"}  # fmt: skip
    assert {v: hami_metrics.go_float(v) for v in cases} == cases


def test_hami_metrics_scheduler_names_labels_and_values():
    text = hami_metrics.exposition(hami_metrics.scheduler_families(NODES, PODS))
    found = series(text)
    base = {"node": "vm-gpu", "device_uuid": CARD["uuid"], "device_index": "0", "device_type": "NVIDIA GeForce RTX 3090",
            "zone": "vGPU"}  # fmt: skip
    assert found["hami_gpu_memory_limit_bytes"] == [(base, "2.5769803776e+10")]
    assert found["hami_gpu_memory_allocated_bytes"] == [
        ({**base, "device_cores": "100"}, hami_metrics.go_float(20889 * MIB))
    ]
    assert found["hami_gpu_shared_count"] == [(base, "2")]
    assert found["hami_gpu_core_allocated_ratio"] == [(base, "30")]
    assert {lab["pod"] for lab, _ in found["hami_vgpu_memory_allocated_bytes"]} == {"vllm", "ollama"}
    assert set(found["hami_vgpu_memory_allocated_bytes"][0][0]) == {
        "namespace", "node", "pod", "container_index", "device_uuid", "zone"}  # fmt: skip
    assert "GPUDeviceMemoryAllocated" not in found and "hami_build_info" in found
    # families sorted by name, each with HELP and TYPE gauge
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert names == sorted(names) and all(
        line.endswith(" gauge") for line in text.splitlines() if "# TYPE" in line
    )


def test_hami_metrics_legacy_names_with_legacy_metrics():
    found = series(hami_metrics.exposition(hami_metrics.scheduler_families(NODES, PODS, legacy=True)))
    assert found["GPUDeviceMemoryAllocated"][0][0]["nodeid"] == "vm-gpu"
    assert {"hami_gpu_memory_allocated_bytes", "vGPUMemoryAllocated", "GPUDeviceSharedNum"} <= set(found)
    monitor = series(
        hami_metrics.exposition(hami_metrics.monitor_families("vm-gpu", [CARD], PODS, legacy=True))
    )
    assert {"HostGPUMemoryUsage", "vGPU_device_memory_limit_in_bytes", "hami_vgpu_memory_limit_bytes"} <= set(
        monitor
    )


def test_hami_metrics_monitor_only_containers_hami_core_limits():
    found = series(hami_metrics.exposition(hami_metrics.monitor_families("vm-gpu", [CARD], PODS)))
    assert found["hami_host_gpu_memory_used_bytes"][0][0]["device_type"] == "NVIDIA-NVIDIA GeForce RTX 3090"
    assert "node" not in found["hami_host_gpu_memory_controller_utilization_ratio"][0][0]
    limits = found["hami_vgpu_memory_limit_bytes"]
    assert [(lab["pod"], lab["container"], value) for lab, value in limits] == [
        ("ollama", "engine", hami_metrics.go_float(11059 * MIB))
    ]
    elsewhere = hami_metrics.monitor_families("vm-2", [], PODS)
    assert all(not s for name, _h, s in elsewhere if name != "hami_build_info")


def test_monitoring_charts_prometheus_config_from_the_values():
    values = monitoring.prometheus_values(targets={"hami-scheduler": ["a:31993"]}, node_port=30090)
    values["extraScrapeConfigs"] = "- job_name: extra\n  static_configs: [{targets: ['b:1']}]\n"
    config = monitoring_charts.prometheus_config(values)
    assert config["global"] == {
        "scrape_interval": "15s",
        "scrape_timeout": "10s",
        "evaluation_interval": "1m",
    }
    short = monitoring.prometheus_values(targets={}, node_port=30090, scrape_interval="2s")
    assert short["server"]["global"] == {"scrape_interval": "2s", "scrape_timeout": "2s"}
    assert [j["job_name"] for j in config["scrape_configs"]] == ["prometheus", "hami-scheduler", "extra"]
    assert monitoring_charts.node_port(values, "prometheus") == 30090
    off = monitoring_charts.prometheus_config({"scrapeConfigs": {"prometheus": {"enabled": False}}})
    assert off["scrape_configs"] == []


def webui_chart(**extra):
    """The HelmChart spec gpulab renders for HAMi-WebUI (with `extra` values merged)."""
    out = monitoring.render(
        prometheus_version="29.27.0", grafana_version="12.11.1", hami_version="2.10.0", server="10.0.0.1",
        gpu_nodes=["10.0.0.3"], webui=True, webui_extra_values=extra,
    )  # fmt: skip
    return yaml.safe_load(out["manifests"]["hami-webui"].split("---", 1)[1])["spec"]


def test_monitoring_charts_webui_objects_as_the_chart_renders_them_with_gpulabs_values():
    ports = {}
    rollouts, objects, services = monitoring_charts.install_chart(
        "hami-webui", "monitoring", webui_chart(), ports
    )
    assert rollouts == {"monitoring/hami-webui": {"ready": True}}
    assert objects["monitoring/hami-webui"]["kind"] == "Deployment"
    service = services["monitoring/hami-webui"]
    assert service["spec"]["type"] == "NodePort"
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert (by_name["http"]["port"], by_name["metrics"]["port"]) == (3000, 8000)
    # no nodePort in the chart's template: the API server assigns one per port, kept while the Service exists
    assert all(30000 <= p["nodePort"] <= 32767 for p in by_name.values())
    assert by_name["http"]["nodePort"] != by_name["metrics"]["nodePort"]
    assert monitoring.webui_node_port(service) == by_name["http"]["nodePort"]
    again = monitoring_charts.install_chart("hami-webui", "monitoring", webui_chart(), ports)[2]
    assert again == services
    assert monitoring_charts.webui_http_ports(services) == [by_name["http"]["nodePort"]]
    # another release name: the chart's fullname <release>-hami-webui
    other = monitoring_charts.install_chart("ui", "monitoring", webui_chart(), ports)[2]
    assert list(other) == ["monitoring/ui-hami-webui"]


def test_monitoring_charts_webui_with_a_servicemonitor_does_not_install():
    """The chart's defaults make ServiceMonitors, whose kind needs Prometheus Operator's CRDs: Helm fails."""
    for extra in ({"serviceMonitor": {"enabled": True}}, {"hamiServiceMonitor": {"enabled": True}},
                  {"dcgm-exporter": {"enabled": True}}):  # fmt: skip
        assert (
            monitoring_charts.install_chart("hami-webui", "monitoring", webui_chart(**extra), {}) is None
        ), extra
    defaults = {"chart": "hami-webui", "valuesContent": ""}
    assert monitoring_charts.install_chart("hami-webui", "monitoring", defaults, {}) is None


def test_monitoring_charts_webui_page_answers_on_its_port():
    port = free_port()
    server = monitoring_charts.serve_page("127.0.0.1", port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            assert resp.status == 200 and "HAMi-WebUI" in resp.read().decode()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nosuch", timeout=5)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def get(url, **params):
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(url + query, timeout=5) as resp:
        return json.loads(resp.read())


def test_a_real_prometheus_scrapes_the_standin_and_answers_the_proof_and_the_dashboard(tmp_path):
    binary = shutil.which("prometheus")
    if not binary:
        pytest.skip("prometheus is not installed (system-packages.txt: make deps)")
    nodes, pods = json.loads(json.dumps(NODES)), json.loads(json.dumps(PODS))
    s_port, m_port, p_port = free_port(), free_port(), free_port()
    servers = [
        hami_metrics.serve("127.0.0.1", s_port, lambda: hami_metrics.scheduler_families(nodes, pods)),
        hami_metrics.serve(
            "127.0.0.1", m_port, lambda: hami_metrics.monitor_families("vm-gpu", [CARD], pods)
        ),
    ]
    targets = {"hami-scheduler": [f"127.0.0.1:{s_port}"], "hami-device-plugin": [f"127.0.0.1:{m_port}"]}
    values = monitoring.prometheus_values(targets=targets, node_port=30090, scrape_interval="1s")
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(monitoring_charts.prometheus_config(values)))
    base = f"http://127.0.0.1:{p_port}"
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{p_port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )  # fmt: skip
    try:
        # as the stage looks: targets, the allocation query, the nodes and pods as kubectl shows them
        nodes_doc = {"items": [{"metadata": {"name": n, "annotations": {"hami.io/node-nvidia-register": v["hami_register"]}}}
                               for n, v in nodes.items() if v.get("hami_register")]}  # fmt: skip
        pods_doc = {"items": [{"metadata": {"namespace": p["namespace"], "name": p["name"], "annotations": p["annotations"]},
                               "status": {"phase": "Running"}} for p in pods]}  # fmt: skip

        def look():
            try:
                return {"targets": get(f"{base}/api/v1/targets"),
                        "query": get(f"{base}/api/v1/query", query=monitoring.ALLOCATED_QUERY),
                        "nodes": nodes_doc, "pods": pods_doc}  # fmt: skip
            except OSError:
                return {}

        deadline = time.monotonic() + 60
        while (
            (found := monitoring.problems(look(), targets))
            and time.monotonic() < deadline
            and proc.poll() is None
        ):
            time.sleep(0.5)
        assert found == [], (found, (tmp_path / "prometheus.log").read_text()[-2000:])
        # a share ends: Prometheus follows what the scheduler holds, and the proof names the difference meanwhile
        before = look()
        pods.pop(0)  # vLLM's share (HAMi-core off) ends; ollama's, which the monitor sees, stays
        assert monitoring.problems({**before, "pods": {"items": pods_doc["items"][1:]}})
        deadline = time.monotonic() + 30
        while get(f"{base}/api/v1/query", query=monitoring.ALLOCATED_QUERY)["data"]["result"][0]["value"][
            1
        ] != str(11059 * MIB):
            assert time.monotonic() < deadline, "Prometheus did not follow the scheduler"
            time.sleep(0.5)
        # every query of HAMi's dashboard (its variables at All) answers with data
        for query in monitoring.dashboard_queries("2.10.0")["queries"]:
            expr = query["expr"].replace("$node", ".*").replace("$namespace", ".*")
            answer = get(f"{base}/api/v1/query", query=expr)
            assert answer["status"] == "success" and answer["data"]["result"], (query, answer)
        for var in monitoring.dashboard_queries("2.10.0")["variables"]:
            if var["type"] == "query":
                metric, label = var["query"].removeprefix("label_values(").rstrip(")").split(", ")
                assert get(f"{base}/api/v1/label/{label}/values", **{"match[]": metric})["data"], var
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for server in servers:
            server.shutdown()
