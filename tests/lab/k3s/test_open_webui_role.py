"""Role workloads' opt-in Open WebUI run for real by ansible-playbook against the fake k3s of test_roles_local:
the HelmChart placed with values for the LAN engine, the chart's rollout waited for, a second run changes
nothing, --check writes nothing, and turning it off takes the HelmChart out. The LAN engine's proof (its
/v1/models and one completion from the controller) is answered by a small OpenAI-compatible server here, Open
WebUI's (GET /health at the URL the run prints) by the lab's Open WebUI stand-in (labsim.net.k3s.open_webui_chart)
on this machine's loopback, standing in for the first server's address."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from .test_kube_vip import run_k3s_vip_task
from .test_roles_local import ON_THE_FAKE, FakeK3sFolder, engines, include_role, stats

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow

CHART_FILE = "gpulab-open-webui.yaml"


class _Engine(BaseHTTPRequestHandler):
    def _json(self, doc):
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._json({"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B-Instruct", "object": "model"}]})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._json({"object": "text_completion", "choices": [{"index": 0, "text": " hello"}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def engine_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def webui_port():
    from labsim.net.k3s import open_webui_chart

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = open_webui_chart.serve("127.0.0.1", port)
    yield port
    server.shutdown()
    server.server_close()


@pytest.fixture
def lab(tmp_path):
    folder = FakeK3sFolder(tmp_path)
    # the LAN engine answers at its node's address (ServiceLB): here, this machine's loopback
    inventory = yaml.safe_load((tmp_path / "hosts.yml").read_text())
    agents = inventory["all"]["children"]["k3s_cluster"]["children"]["k3s_agent"]["hosts"]
    agents["vm-gpu"]["vm_address"] = "127.0.0.1"
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return folder


def settings(port, **more):
    (engine,) = engines(100)
    engine.update(lan=True, lan_port=port)
    # the first server's address, as playbooks/workloads.yml passes it
    return {"workloads_engines": [engine], "workloads_lan_timeout": 5,
            "workloads_open_webui_server_address": "192.168.100.53", **more}  # fmt: skip


WORKLOADS = include_role("workloads", **ON_THE_FAKE, k3s_version="", ready_timeout=5, poll_interval=1)


def test_open_webui_is_placed_once_for_the_lan_engine_and_taken_out_when_off(lab, engine_port, webui_port):
    on = settings(engine_port, workloads_open_webui=True, workloads_open_webui_lan_port=webui_port,
                  workloads_open_webui_server_address="127.0.0.1")  # fmt: skip
    rc, out = lab.play([WORKLOADS], extra_vars=on)
    assert rc == 0, lab.failures(out)
    chart = yaml.safe_load_all((lab.root / "manifests" / CHART_FILE).read_text())
    (chart,) = [d for d in chart if d]
    values = yaml.safe_load(chart["spec"]["valuesContent"])
    assert chart["spec"]["chart"] == "open-webui" and chart["spec"]["version"] == "16.0.0"
    assert values["openaiBaseApiUrls"] == [f"http://e0.default.svc:{engine_port}/v1"]
    waited = [c["args"] for c in lab.calls() if "rollout" in c["args"]]
    assert [
        "kubectl",
        "-n",
        "open-webui",
        "rollout",
        "status",
        "statefulset/open-webui",
        "--timeout=1s",
    ] in waited
    said = [
        t["hosts"]["vm-1"].get("msg") for t in out["plays"][0]["tasks"] if "Say where Open WebUI" in t["task"]
    ]
    assert (
        said
        and f"Open WebUI: http://127.0.0.1:{webui_port} (it answered /health from the controller)" in said[0]
    )
    first = stats(out)["changed"]
    assert first >= 2  # the engine and Open WebUI's HelmChart

    rc, out = lab.play([WORKLOADS], extra_vars=on)
    assert rc == 0 and stats(out)["changed"] == 0, lab.failures(out)

    rc, out = lab.play([WORKLOADS], extra_vars=settings(engine_port))
    assert rc == 0, lab.failures(out)
    assert not (lab.root / "manifests" / CHART_FILE).exists() and stats(out)["changed"] == 1


def test_open_webui_that_does_not_answer_fails_naming_its_url_and_what_answered(lab, engine_port):
    """Ready in the cluster but its URL answered by something that is not Open WebUI (here the engine, which has
    no /health of Open WebUI's kind), or by nothing: the run fails naming the URL and what answered."""
    on = settings(engine_port, workloads_open_webui=True, workloads_open_webui_lan_port=engine_port,
                  workloads_open_webui_server_address="127.0.0.1", workloads_lan_timeout=0)  # fmt: skip
    rc, out = lab.play([WORKLOADS], extra_vars=on)
    failures = " ".join(lab.failures(out))
    assert rc != 0 and f"http://127.0.0.1:{engine_port}/health did not answer as Open WebUI" in failures
    assert "it answered HTTP 200: " in failures and "Qwen/Qwen2.5-0.5B-Instruct" in failures
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    on.update(workloads_open_webui_lan_port=closed)
    rc, out = lab.play([WORKLOADS], extra_vars=on)
    failures = " ".join(lab.failures(out))
    assert rc != 0 and f"http://127.0.0.1:{closed}/health did not answer as Open WebUI" in failures
    assert "it answered nothing (" in failures


def test_open_webui_check_mode_writes_nothing(lab, engine_port):
    rc, out = lab.play([WORKLOADS], check=True, extra_vars=settings(engine_port, workloads_open_webui=True))
    assert rc == 0, lab.failures(out)
    assert list((lab.root / "manifests").iterdir()) == []


def test_an_unknown_chart_key_places_nothing_of_open_webui(lab, engine_port):
    bad = settings(engine_port, workloads_open_webui=True, workloads_open_webui_extra_values={"servce": {}})
    rc, out = lab.play([WORKLOADS], extra_vars=bad)
    assert rc != 0 and "servce: not a value of open-webui chart 16.0.0" in " ".join(lab.failures(out))
    assert not (lab.root / "manifests" / CHART_FILE).exists()


def test_stage_network_keeps_open_webuis_lan_address_free_and_kube_vip_announces_it(tmp_path):
    """playbooks/vars/k3s_vip.yml and k3s.yml: Open WebUI's lan_address (kube-vip announces it) is kept free on the
    router, as an engine's is, and turns on kube-vip's Service announcements; off, or without one, it is not."""
    task = {"name": "free", "ansible.builtin.debug": {"msg": "{{ [gpulab_network_keep_free, k3s_server_kube_vip_services] }}"},
            "vars": {"workloads_open_webui": "{{ item[0] }}", "workloads_open_webui_lan_address": "{{ item[1] }}"},
            "loop": [[True, "192.168.100.61"], [False, "192.168.100.61"], [True, ""]]}  # fmt: skip
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {}}}))
    results = run_k3s_vip_task(tmp_path, task, ("k3s_vip.yml", "k3s.yml"))["results"]
    on, off, no_address = (r["msg"] for r in results)
    assert on == [
        [{"address": "192.168.100.61", "host": "all", "field": "workloads_open_webui_lan_address",
          "what": "the LAN address kube-vip announces for Open WebUI"}],
        True,
    ]  # fmt: skip
    assert off == [[], False] and no_address == [[], False]
