"""The k3s stand-in's open-webui chart (labsim.net.k3s.open_webui_chart), one test per row of
library/labsim/UPSTREAM.md (## Open WebUI chart), and what the stand-in's cluster leaves of gpulab's HelmChart."""

import yaml

from gpulab.k8s import open_webui, workloads
from labsim.net.k3s import open_webui_chart
from unit.k3s.engines import VLLM


def spec(values):
    return {"chart": "open-webui", "version": "16.0.0", "valuesContent": yaml.safe_dump(values)}


def test_open_webui_chart_workload_named_and_kind_from_the_values():
    rollouts, objects = open_webui_chart.install_chart("open-webui", "open-webui", spec({}))
    assert rollouts == {"open-webui/open-webui": {"ready": True}}
    assert objects["open-webui/open-webui"]["kind"] == "StatefulSet"  # persistence on, provider local
    _, objects = open_webui_chart.install_chart("chat", "web", spec({"persistence": {"enabled": False}}))
    assert objects["web/chat-open-webui"]["kind"] == "Deployment"
    _, objects = open_webui_chart.install_chart("chat", "web", spec({"persistence": {"provider": "s3"}}))
    assert objects["web/chat-open-webui"]["kind"] == "Deployment"
    _, objects = open_webui_chart.install_chart("chat", "web", spec({"workload": {"kind": "Deployment"}}))
    assert objects["web/chat-open-webui"]["kind"] == "Deployment"


def test_gpulabs_helmchart_leaves_the_workload_the_role_waits_for():
    engines = workloads.plan([{**VLLM, "lan": True}], {"vm-gpu": [{"uuid": "GPU-1"}]}, any_uuid=True)[
        "engines"
    ]
    out = open_webui.render(engines=engines, server="192.168.100.53")
    (chart,) = [d for d in yaml.safe_load_all(out["manifest"]) if d]
    rollouts, objects = open_webui_chart.install_chart(
        chart["metadata"]["name"], chart["spec"]["targetNamespace"], chart["spec"]
    )
    kind, _, name = out["workload"].partition("/")
    assert objects[f"{out['namespace']}/{name}"]["kind"].lower() == kind
    assert rollouts[f"{out['namespace']}/{name}"]["ready"]


def test_the_standins_cluster_installs_gpulabs_open_webui_chart_as_not_hamis(tmp_path, monkeypatch):
    """The stand-in's helm controller (labsim.net.k3s.cluster) takes gpulab's open-webui HelmChart for what it is:
    its install job completes and its StatefulSet is Ready (the role's rollout status answers); HAMi's release is
    not touched, and taking the file out uninstalls it."""
    from labsim.net.k3s import cluster as k3s

    monkeypatch.setattr(k3s, "STATE", str(tmp_path / "state.json"))
    monkeypatch.setattr(k3s, "MANIFESTS", str(tmp_path / "manifests"))
    (tmp_path / "manifests").mkdir()
    engines = workloads.plan([{**VLLM, "lan": True}], {"vm-gpu": [{"uuid": "GPU-1"}]}, any_uuid=True)[
        "engines"
    ]
    placed = tmp_path / "manifests" / "gpulab-open-webui.yaml"
    placed.write_text(open_webui.render(engines=engines, server="192.168.100.53")["manifest"])
    cluster = k3s.Cluster()
    cluster.apply_manifests()
    cluster.state["charts_seen"]["kube-system/open-webui"] -= 5  # the install job has run
    cluster.apply_manifests()
    assert cluster.state["jobs"]["kube-system/helm-install-open-webui"] == {"complete": True}
    assert cluster.state["deployments"]["open-webui/open-webui"]["ready"]
    assert cluster.state["hami"] is None
    placed.unlink()
    cluster.apply_manifests()
    assert "open-webui/open-webui" not in cluster.state["deployments"]
