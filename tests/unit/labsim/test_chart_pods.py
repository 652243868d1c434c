"""labsim.net.chart_pods, the lab's kubelet for the Prometheus pod of the monitoring chart: started when the k3s
stand-in writes the pod's folder in a host's disk, told to read a changed config, started again when it exits,
stopped (its data removed) when the folder goes. Here with a stand-in for prometheus and no namespace; the lab
test tests/k3s/test_lab_kubectl.py runs the real one on a demo lab."""

import json
import os

from polling import wait_until

from labsim.net import chart_pods

FAKE = """#!/bin/sh
trap 'echo hup >> "$(dirname "$0")/events"' HUP
trap 'echo term >> "$(dirname "$0")/events"; exit 0' TERM
echo "start $*" >> "$(dirname "$0")/events"
while true; do sleep 0.1; done
"""


class LocalPods(chart_pods.ChartPods):
    def enter(self, netns):
        return []


def test_the_prometheus_pod_follows_its_folder(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "prometheus"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    events = bindir / "events"
    state = tmp_path / "state"
    folder = state / "net/hosts/vm100/upper" / chart_pods.POD_DIR / "monitoring/prometheus-server"
    (tmp_path / "netns").mkdir()
    (tmp_path / "netns" / "gl123-v100").touch()
    pods = LocalPods(state, "gl123", binary=str(fake))
    pods.netns_dir = tmp_path / "netns"
    try:
        pods.step()
        assert pods.pids() == {}  # nothing asked for yet
        folder.mkdir(parents=True)
        (folder / "prometheus.yml").write_text("global: {}\n")
        (folder / "pod.json").write_text(json.dumps({"port": 30090}))
        pods.step()
        assert list(pods.pids()) == ["vm100/monitoring/prometheus-server"]
        assert wait_until(lambda: events.exists() and "start" in events.read_text())
        started = events.read_text()
        assert f"--config.file={folder / 'prometheus.yml'}" in started
        assert "--web.listen-address=0.0.0.0:30090" in started and str(state / chart_pods.WORK_DIR) in started
        # a changed config: read again (SIGHUP), not restarted. Its new mtime set one second on: two writes within
        # one tick of the kernel's coarse clock (a loaded machine) can keep the same mtime
        before = (folder / "prometheus.yml").stat().st_mtime_ns
        (folder / "prometheus.yml").write_text("global: {scrape_interval: 5s}\n")
        os.utime(folder / "prometheus.yml", ns=(before + 10**9, before + 10**9))
        pid = pods.pids()["vm100/monitoring/prometheus-server"]
        pods.step()
        assert (
            wait_until(lambda: "hup" in events.read_text())
            and pods.pids()["vm100/monitoring/prometheus-server"] == pid
        )
        # the chart taken out: the folder goes, the process stops and its data with it
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
        pods.step()
        assert pods.pids() == {} and wait_until(lambda: "term" in events.read_text())
        assert not (state / chart_pods.WORK_DIR / "vm100_monitoring_prometheus-server").exists()
    finally:
        pods.stop_all()


def test_a_host_that_is_down_gets_no_pod(tmp_path):
    state = tmp_path / "state"
    folder = state / "net/hosts/vm100/upper" / chart_pods.POD_DIR / "monitoring/prometheus-server"
    folder.mkdir(parents=True)
    (folder / "prometheus.yml").write_text("{}\n")
    (folder / "pod.json").write_text(json.dumps({"port": 30090}))
    pods = LocalPods(state, "gl123", binary="/bin/true")
    pods.netns_dir = tmp_path / "no-netns"
    pods.step()
    assert pods.pids() == {}


def test_the_standin_removes_the_pod_folder_of_an_uninstalled_chart(tmp_path, monkeypatch):
    from labsim.net.k3s import monitoring_charts

    monkeypatch.setattr(monitoring_charts, "POD_DIR", str(tmp_path))
    for key in ("monitoring/prometheus-server", "other/prom-server"):
        (tmp_path / key).mkdir(parents=True)
        (tmp_path / key / "pod.json").write_text("{}")
    monitoring_charts.remove_pods({"monitoring/prometheus-server", "monitoring/grafana"})
    assert (tmp_path / "monitoring/prometheus-server/pod.json").exists()
    assert not (tmp_path / "other/prom-server").exists()
