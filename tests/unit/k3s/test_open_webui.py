"""Open WebUI, stage workloads' opt-in front end (gpulab.k8s.open_webui, filter open_webui_chart): its values for
the LAN engines, checked against the pinned open-webui chart's keys, and its HelmChart."""

import json

import plugin_files
import pytest
import yaml
from ansible.errors import AnsibleFilterError

from gpulab.k8s import open_webui, workloads
from unit.k3s.engines import VLLM

UUID = "GPU-6f2a1c3e-0d4b-4c6a-9e1f-2b3c4d5e6f70"
GPUS = {"vm-gpu": [{"uuid": UUID}]}
OLLAMA = {"name": "ollama", "image": "ollama/ollama:0.12.6", "node": "vm-gpu", "gpu_memory_percent": 40}


def planned(*engines):
    return workloads.plan(list(engines), GPUS, addresses={"vm-gpu": "192.168.100.55"})["engines"]


def test_the_generator_command_writes_the_facts_of_its_values(tmp_path):
    values, out = tmp_path / "values.yaml", tmp_path / "keys.json"
    values.write_text("image:\n  repository: ghcr.io/open-webui/open-webui\n  tag: ''\nextraEnvVars: []\n")
    assert open_webui.main([str(values), "16.0.0", "--source", "test", "-o", str(out)]) == 0
    facts = json.loads(out.read_text())
    assert (facts["chart"], facts["version"], facts["source"]) == ("open-webui", "16.0.0", "test")
    assert set(facts["keys"]) == {"image", "image.repository", "image.tag", "extraEnvVars"}


def test_the_key_facts_are_the_pinned_charts():
    facts = open_webui.load_keys(open_webui.VERSION)
    assert facts["chart"] == "open-webui" and facts["version"] == "16.0.0"
    assert "tag open-webui-16.0.0 = commit a6305e705ee18571c772687e1ffc3db6415a9226" in facts["source"]
    assert facts["images"] == {
        "image": {"registry": "", "repository": "ghcr.io/open-webui/open-webui", "tag": ""}
    }


def test_values_point_at_the_lan_engines_through_their_services():
    engines = planned({**VLLM, "lan": True, "lan_port": 8001}, {**OLLAMA, "port": 11434})
    out = open_webui.render(engines=engines, server="192.168.100.53")
    values = out["values"]
    # only the LAN engine, at its Service's in-cluster name and its LAN port
    assert values["openaiBaseApiUrls"] == ["http://vllm.default.svc:8001/v1"]
    assert values["ollama"] == {"enabled": False} and values["pipelines"] == {"enabled": False}
    assert values["persistence"] == {"enabled": True, "size": "2Gi", "storageClass": "local-path"}
    assert values["service"] == {"type": "LoadBalancer", "port": 8080}
    assert out["url"] == "http://192.168.100.53:8080" and not out["kube_vip"]
    assert out["workload"] == "statefulset/open-webui"
    (chart,) = [d for d in yaml.safe_load_all(out["manifest"]) if d]
    assert chart["kind"] == "HelmChart" and chart["metadata"]["name"] == "open-webui"
    assert chart["spec"]["chart"] == "open-webui" and chart["spec"]["version"] == "16.0.0"
    assert chart["spec"]["repo"] == "https://helm.openwebui.com/"
    assert chart["spec"]["targetNamespace"] == "open-webui"
    assert yaml.safe_load(chart["spec"]["valuesContent"]) == values


def test_a_lan_address_is_announced_by_kube_vip():
    out = open_webui.render(
        engines=planned({**VLLM, "lan": True}), lan_address_value="192.168.100.61", lan_port=80, server="x"
    )
    service = out["values"]["service"]
    assert service["annotations"] == {"kube-vip.io/loadbalancerIPs": "192.168.100.61"}
    assert service["loadBalancerClass"] == "kube-vip.io/kube-vip-class"
    assert out["url"] == "http://192.168.100.61:80" and out["kube_vip"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"extra_values": {"servce": {"type": "NodePort"}}},
            "servce: not a value of open-webui chart 16.0.0",
        ),
        ({"extra_values": {"persistence": {"sise": "5Gi"}}}, "did you mean persistence.size?"),
        ({"lan_address_value": "webui.lan"}, "not an IPv4 address"),
        ({"lan_port": 70000}, "must be a TCP port number"),
        ({"version": "99.0.0"}, "No key facts for chart open-webui 99.0.0 (known: 16.0.0)"),
    ],
)
def test_render_refuses_naming_the_problem(kwargs, message):
    with pytest.raises(open_webui.OpenWebUIError) as err:
        open_webui.render(engines=planned({**VLLM, "lan": True}), server="x", **kwargs)
    assert message in str(err.value)


def test_render_refuses_without_a_lan_engine():
    with pytest.raises(open_webui.OpenWebUIError, match="no engine of workloads_engines is on the LAN"):
        open_webui.render(engines=planned(VLLM), server="x")


def test_extra_values_of_the_chart_are_merged():
    out = open_webui.render(
        engines=planned({**VLLM, "lan": True}), server="x",
        extra_values={"extraEnvVars": [{"name": "WEBUI_NAME", "value": "lab"}], "persistence": {"size": "5Gi"}},
    )  # fmt: skip
    assert out["values"]["extraEnvVars"] == [{"name": "WEBUI_NAME", "value": "lab"}]
    assert out["values"]["persistence"]["size"] == "5Gi"


def test_the_filter_renders_from_ansible_values_and_fails_naming_the_key():
    chart = plugin_files.filters("open_webui")["open_webui_chart"]
    engines = json.loads(json.dumps(planned({**VLLM, "lan": True})))
    out = chart(engines, "16.0.0", open_webui.REPO, "open-webui", "8080", "", "192.168.100.53", "2Gi", {})
    assert out["url"] == "http://192.168.100.53:8080"
    with pytest.raises(AnsibleFilterError, match="servce"):
        chart(engines, "16.0.0", open_webui.REPO, "open-webui", 8080, "", "x", "2Gi", {"servce": {}})


def test_a_silent_open_webui_is_told_with_its_url_and_what_answered():
    silent = plugin_files.filters("open_webui")["open_webui_silent_text"]
    url = "http://192.168.100.53:8080"
    refused = silent({"status": -1, "msg": "Status code was -1: Connection refused"}, url, 300, 8080)
    assert refused.startswith(f"Open WebUI is Ready but {url}/health did not answer as Open WebUI")
    assert "within 300 s: it answered nothing (Status code was -1: Connection refused)." in refused
    assert "nothing else holds port 8080 there" in refused
    other = silent({"status": 404, "content": "x" * 250}, url, 300, 8080)
    assert f"it answered HTTP 404: {'x' * 200}...." in other
    assert "it answered nothing (no reply)" in silent(None, url, 300, 8080)
