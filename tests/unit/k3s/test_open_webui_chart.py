"""The k3s stand-in's open-webui chart (labsim.net.k3s.open_webui_chart), one test per row of
library/labsim/UPSTREAM.md (## Open WebUI chart), and what the stand-in's cluster leaves of gpulab's HelmChart."""

import yaml

from gpulab.k8s import open_webui, workloads
from labsim.net.k3s import open_webui_chart
from unit.k3s.engines import VLLM


def spec(values):
    return {"chart": "open-webui", "version": "16.0.0", "valuesContent": yaml.safe_dump(values)}


def test_open_webui_chart_workload_named_and_kind_from_the_values():
    rollouts, objects, _ = open_webui_chart.install_chart("open-webui", "open-webui", spec({}))
    assert rollouts == {"open-webui/open-webui": {"ready": True}}
    assert objects["open-webui/open-webui"]["kind"] == "StatefulSet"  # persistence on, provider local
    _, objects, _ = open_webui_chart.install_chart("chat", "web", spec({"persistence": {"enabled": False}}))
    assert objects["web/chat-open-webui"]["kind"] == "Deployment"
    _, objects, _ = open_webui_chart.install_chart("chat", "web", spec({"persistence": {"provider": "s3"}}))
    assert objects["web/chat-open-webui"]["kind"] == "Deployment"
    _, objects, _ = open_webui_chart.install_chart("chat", "web", spec({"workload": {"kind": "Deployment"}}))
    assert objects["web/chat-open-webui"]["kind"] == "Deployment"


def test_gpulabs_helmchart_leaves_the_workload_the_role_waits_for():
    engines = workloads.plan([{**VLLM, "lan": True}], {"vm-gpu": [{"uuid": "GPU-1"}]}, any_uuid=True)[
        "engines"
    ]
    out = open_webui.render(engines=engines, server="192.168.100.53")
    (chart,) = [d for d in yaml.safe_load_all(out["manifest"]) if d]
    rollouts, objects, _ = open_webui_chart.install_chart(
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
    # its LoadBalancer Service, which the servers answer on (ServiceLB at lan_port)
    assert open_webui_chart.lan_ports(cluster.state["services"]) == [(None, open_webui.LAN_PORT)]
    assert cluster.state["hami"] is None
    placed.unlink()
    cluster.apply_manifests()
    assert "open-webui/open-webui" not in cluster.state["deployments"]
    assert "open-webui/open-webui" not in cluster.state["services"]


def test_open_webui_chart_service_as_the_chart_renders_it():
    _, _, services = open_webui_chart.install_chart("open-webui", "open-webui", spec({}))
    svc = services["open-webui/open-webui"]
    assert svc["spec"]["type"] == "ClusterIP"  # the chart's default: nothing on the LAN
    assert svc["spec"]["ports"] == [{"protocol": "TCP", "name": "http", "port": 80, "targetPort": "http"}]
    assert svc["spec"]["selector"] == {
        "app.kubernetes.io/instance": "open-webui",
        "app.kubernetes.io/component": "open-webui",
    }
    assert open_webui_chart.lan_ports(services) == []
    values = {
        "service": {
            "type": "LoadBalancer",
            "port": 8081,
            "annotations": {workloads.KUBE_VIP_ADDRESS: "192.168.100.62"},
            "loadBalancerClass": workloads.KUBE_VIP_CLASS,
        }
    }
    _, _, services = open_webui_chart.install_chart("chat", "web", spec(values))
    svc = services["web/chat-open-webui"]
    assert svc["spec"]["loadBalancerClass"] == workloads.KUBE_VIP_CLASS
    assert open_webui_chart.lan_ports(services) == [("192.168.100.62", 8081)]


def test_open_webui_chart_health_answers_as_open_webui():
    """GET /health answers 200 {"status": true} as the image's backend/open_webui/main.py does, on a real socket."""
    import json
    import socket
    import urllib.error
    import urllib.request

    assert open_webui_chart.answer("GET", "/health?x=1")[:2] == (200, "application/json")
    assert json.loads(open_webui_chart.answer("GET", "/health")[2]) == {"status": True}
    assert open_webui_chart.answer("GET", "/nope")[0] == 404
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = open_webui_chart.serve("127.0.0.1", port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            assert reply.status == 200 and json.loads(reply.read()) == {"status": True}
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5)
            raise AssertionError("Open WebUI has no /v1/models route")
        except urllib.error.HTTPError as err:
            assert err.code == 404 and json.loads(err.read()) == {"detail": "Not Found"}
    finally:
        server.shutdown()
        server.server_close()


def test_kube_vip_forwards_open_webuis_address_to_a_server():
    """A kube-vip address of Open WebUI's Service is held by kube-vip's leader and carried to the first server's
    address at the Service's port, where the server answers as Open WebUI (server.serve_open_webui)."""
    from labsim.net.k3s import kube_vip

    values = {
        "service": {
            "type": "LoadBalancer",
            "port": 8080,
            "annotations": {workloads.KUBE_VIP_ADDRESS: "10.0.0.9"},
        }
    }
    _, _, services = open_webui_chart.install_chart("open-webui", "open-webui", spec(values))
    control = {"node-role.kubernetes.io/control-plane": "true"}
    state = {
        "services": services,
        "nodes": {
            "vm-gpu": {"address": "10.0.0.3", "role_labels": {}},
            "vm-k3s-2": {"address": "10.0.0.2", "role_labels": control},
            "vm-k3s-1": {"address": "10.0.0.1", "role_labels": control},
        },
    }
    assert kube_vip.service_addresses(state) == {("10.0.0.9", 8080): ("10.0.0.1", 8080)}


def test_each_open_webui_row_of_the_record_names_its_test():
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[3]
    section = (root / "library" / "labsim" / "UPSTREAM.md").read_text().split("## Open WebUI chart", 1)[1]
    rows = [r for r in section.split("\n## ", 1)[0].splitlines() if r.startswith("| open-webui-chart.")]
    assert len(rows) == 3
    for row in rows:
        ident, _what, source, test = [c.strip() for c in row.strip("|").split(" | ")]
        assert "open-webui-16.0.0" in source, ident
        path, name = test.split("::")
        assert name == "test_" + re.sub(r"[.-]", "_", ident)
        assert f"def {name}(" in (root / path).read_text(), ident


def test_a_server_answers_as_open_webui_while_its_service_exists_and_kube_vip_carries_its_address_there():
    """server.serve_open_webui: the k3s server answers at its own address on the port of Open WebUI's LoadBalancer
    Service (ServiceLB), and kube-vip's leader carries a connection to the Service's own address there (here a
    forwarder on another loopback port stands in for the address the leader holds); the Service gone, the port
    closes."""
    import json
    import socket
    import threading
    import urllib.request

    from labsim.net.k3s import kube_vip, server

    def free_port():
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    port = free_port()
    values = {
        "service": {
            "type": "LoadBalancer",
            "port": port,
            "annotations": {workloads.KUBE_VIP_ADDRESS: "10.0.0.9"},
        }
    }
    _, _, services = open_webui_chart.install_chart("open-webui", "open-webui", spec(values))
    control = {"node-role.kubernetes.io/control-plane": "true"}

    class Cluster:  # what serve_open_webui reads of labsim.net.k3s.cluster.Cluster
        def __init__(self, state):
            self.lock, self.state = threading.Lock(), state

    cluster = Cluster(
        {"services": services, "nodes": {"vm-1": {"address": "127.0.0.1", "role_labels": control}}}
    )

    listeners = {}
    forwarder = None
    try:
        server.serve_open_webui(cluster, "127.0.0.1", listeners)
        assert set(listeners) == {port}
        ((_, target),) = kube_vip.service_addresses(cluster.state).items()
        assert target == ("127.0.0.1", port)
        front = free_port()
        forwarder = kube_vip.forward("127.0.0.1", front, target)
        with urllib.request.urlopen(f"http://127.0.0.1:{front}/health", timeout=5) as reply:
            assert reply.status == 200 and json.loads(reply.read()) == {"status": True}
        cluster.state = {**cluster.state, "services": {}}
        server.serve_open_webui(cluster, "127.0.0.1", listeners)
        assert listeners == {}
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0
    finally:
        for listener in listeners.values():
            listener.shutdown()
            listener.server_close()
        if forwarder is not None:
            forwarder.shutdown()
            forwarder.server_close()
