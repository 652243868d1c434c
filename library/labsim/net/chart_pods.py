"""The lab's kubelet for the pods of the monitoring charts: the Prometheus server a k3s stand-in's chart asks for.

The k3s stand-in runs no image. When the prometheus chart is installed it writes the server pod's rendered
``prometheus.yml`` and port (``pod.json``) under ``/var/lib/rancher/k3s/gpulab-pods/<namespace>/<release>-server/``
on the server (module k3s.monitoring_charts), and the chart's Deployment is Ready once a Prometheus answers on that
port. This module plays the kubelet for that pod on this machine: for each such folder in a VM host's disk it runs
the distribution's real ``prometheus`` (system-packages.txt) in the host's network namespace, with that config, on
that port; a changed config makes it read the config again (SIGHUP, as the chart's config reloader asks); a pod
folder that is gone (the chart taken out: the stand-in removes it) stops it, and a Prometheus that exited is
started again. Its data and log stay on this machine, in ``STATE/net/chart-pods/``.

The PVE API server of a lab with real hosts runs :func:`run` in a thread for the lab's life
(labsim.pve_api_server), so ``site.yml --tags monitoring`` works on the demo lab as on a real cluster.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

POD_DIR = "var/lib/rancher/k3s/gpulab-pods"
WORK_DIR = "net/chart-pods"
STEP_S = 1.0


@dataclass
class Pod:
    """One running Prometheus: its process and the config's modification time it was last told about."""

    proc: subprocess.Popen
    config: Path
    seen: float
    log: object = field(repr=False)


def netns_of(lab_id: str, host: str) -> str:
    """The network namespace of a lab host's folder name (labsim.network_lab: vm100 -> <id>-v100)."""
    from labsim.network_lab import _tag_of

    return f"{lab_id}-{_tag_of(host)}"


class ChartPods:
    """The Prometheus servers the k3s stand-ins of the lab's hosts ask for, kept running as :func:`step` finds them."""

    #: where `ip netns` keeps the namespaces (a host that is down has none)
    netns_dir = Path("/run/netns")

    def __init__(self, state_dir: Path, lab_id: str, binary: str | None = None):
        self.state_dir, self.lab_id = Path(state_dir), lab_id
        self.binary = binary or shutil.which("prometheus")
        self.pods: dict[str, Pod] = {}

    def wanted(self) -> dict[str, tuple[str, Path, dict]]:
        """key (host/namespace/name) -> (host, pod folder, pod.json) of every pod folder in the hosts' disks."""
        out = {}
        for pod_json in sorted((self.state_dir / "net" / "hosts").glob(f"*/upper/{POD_DIR}/*/*/pod.json")):
            folder = pod_json.parent
            host = folder.parents[len(Path(POD_DIR).parts) + 2].name
            try:
                pod = json.loads(pod_json.read_text())
            except (OSError, ValueError):
                continue  # being written: the next step reads it
            out[f"{host}/{folder.parent.name}/{folder.name}"] = (host, folder, pod)
        return out

    def step(self) -> None:
        wanted = self.wanted() if self.binary else {}
        for key in [k for k, p in self.pods.items() if k not in wanted or p.proc.poll() is not None]:
            self.stop(key, forget_data=key not in wanted)
        for key, (host, folder, pod) in wanted.items():
            config = folder / "prometheus.yml"
            if key not in self.pods:
                self.start(key, host, config, int(pod.get("port") or 9090))
                continue
            with_pod = self.pods[key]
            try:
                mtime = config.stat().st_mtime
            except OSError:
                continue
            if mtime != with_pod.seen:
                with_pod.seen = mtime
                with_pod.proc.send_signal(signal.SIGHUP)  # the chart's config reloader: read the config again

    def start(self, key: str, host: str, config: Path, port: int) -> None:
        netns = netns_of(self.lab_id, host)
        if not (self.netns_dir / netns).exists() or not config.exists():
            return  # the host is down, or the config not written yet: the next step looks again
        work = self.state_dir / WORK_DIR / key.replace("/", "_")
        work.mkdir(parents=True, exist_ok=True)
        log = (work / "prometheus.log").open("a")
        cmd = [*self.enter(netns), str(self.binary), f"--config.file={config}",
               f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=0.0.0.0:{port}"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pods[key] = Pod(proc, config, config.stat().st_mtime, log)

    def enter(self, netns: str) -> list[str]:
        """The command prefix that runs a program in the host's network namespace."""
        return ["ip", "netns", "exec", netns]

    def stop(self, key: str, forget_data: bool = False) -> None:
        pod = self.pods.pop(key)
        if pod.proc.poll() is None:
            pod.proc.terminate()
            try:
                pod.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pod.proc.kill()
                pod.proc.wait(timeout=10)
        pod.log.close()
        if forget_data:  # the chart was taken out: its pod's volume goes with it
            shutil.rmtree(self.state_dir / WORK_DIR / key.replace("/", "_"), ignore_errors=True)

    def stop_all(self) -> None:
        for key in list(self.pods):
            self.stop(key)

    def pids(self) -> dict[str, int]:
        return {k: p.proc.pid for k, p in self.pods.items() if p.proc.poll() is None}


def run(state_dir: Path, stop: threading.Event) -> None:
    """Keep the chart pods of the lab in `state_dir` running until `stop` is set, then stop them."""
    from labsim.network_lab import lab_id

    pods = ChartPods(state_dir, lab_id(state_dir))
    try:
        while not stop.wait(STEP_S):
            try:
                pods.step()
            except OSError as exc:  # one bad step (a host going down) is looked at again at the next
                print(f"labsim chart pods: {exc}", flush=True)
    finally:
        pods.stop_all()
