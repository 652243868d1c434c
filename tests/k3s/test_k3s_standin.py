"""The lab's k3s stand-in behaves like k3s at the interfaces the roles use.

Each host gets its own root (GPULAB_K3S_ROOT); a fake `systemctl` starts the unit's ExecStart in the
background, as systemd would. The server listens on 127.0.0.1 only.
"""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from gpulab import hami
from gpulab.k8s import k3s_standin

# Each test starts real background processes (server, agents) and waits for them.
pytestmark = pytest.mark.slow

STANDIN = pathlib.Path(k3s_standin.__file__).resolve()
UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"

FAKE_SYSTEMCTL = textwrap.dedent(
    """\
    #!/usr/bin/env python3
    # Test systemctl: logs each call; start/restart runs the unit's ExecStart in the background.
    import os, re, signal, subprocess, sys
    root = os.environ["GPULAB_K3S_ROOT"]
    args = sys.argv[1:]
    with open(os.path.join(root, "systemctl.log"), "a") as f:
        f.write(" ".join(args) + "\\n")
    if args and args[0] in ("start", "restart", "stop"):
        name = args[1]
        pidfile = os.path.join(root, name + ".pid")
        if os.path.exists(pidfile):
            try:
                os.kill(int(open(pidfile).read()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
            os.remove(pidfile)
        if args[0] != "stop":
            unit = open(os.path.join(root, "etc/systemd/system", name + ".service")).read()
            m = re.search(r"ExecStart=(\\S+) \\\\\\n\\s+(\\w+)", unit)
            binary = os.path.join(root, m.group(1).lstrip("/"))
            log = open(os.path.join(root, name + ".out"), "a")
            p = subprocess.Popen([binary, m.group(2)], stdout=log, stderr=log, start_new_session=True)
            open(pidfile, "w").write(str(p.pid))
    """
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Host:
    """One lab host: its own root, PATH with the fake systemctl (and optionally a GPU), the stand-in."""

    def __init__(self, root, gpu=False):
        self.root = root
        fakebin = root / "fakebin"
        fakebin.mkdir(parents=True)
        systemctl = fakebin / "systemctl"
        systemctl.write_text(FAKE_SYSTEMCTL)
        systemctl.chmod(0o755)
        if gpu:
            smi = fakebin / "nvidia-smi"
            smi.write_text(f"#!/bin/sh\necho '{UUID0}, NVIDIA GeForce RTX 3090, 24576'\n")
            smi.chmod(0o755)
            runtime = root / "usr/bin/nvidia-container-runtime"
            runtime.parent.mkdir(parents=True)
            runtime.write_text("#!/bin/sh\n")
            runtime.chmod(0o755)
        self.env = {
            **os.environ,
            "GPULAB_K3S_ROOT": str(root),
            "GPULAB_K3S_SCRIPT": str(STANDIN),
            "GPULAB_K3S_HEARTBEAT": "0.5",
            "PATH": f"{fakebin}:{os.environ['PATH']}",
        }

    def config(self, conf):
        path = self.root / "etc/rancher/k3s/config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(conf))

    def install(self, **env):
        return subprocess.run(
            [sys.executable, str(STANDIN), "install"],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def k3s(self, *args):
        return subprocess.run(
            [str(self.root / "usr/local/bin/k3s"), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def systemctl_calls(self):
        log = self.root / "systemctl.log"
        return log.read_text().splitlines() if log.exists() else []

    def pid(self, name):
        path = self.root / f"{name}.pid"
        return int(path.read_text()) if path.exists() else None

    def stop_all(self):
        for pidfile in self.root.glob("*.pid"):
            with contextlib.suppress(OSError, ValueError):
                os.killpg(int(pidfile.read_text()), signal.SIGTERM)


def wait_for(predicate, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    return predicate()


@pytest.fixture
def hosts(tmp_path):
    made = []

    def make(name, gpu=False):
        host = Host(tmp_path / name, gpu=gpu)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop_all()


def nodes(server):
    out = server.k3s("kubectl", "get", "nodes", "-o", "json")
    return {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]} if out.returncode == 0 else {}


@pytest.fixture
def cluster(hosts):
    port = free_port()
    server = hosts("vm-1")
    server.config({"node-name": "vm-1", "bind-address": "127.0.0.1", "https-listen-port": port})
    result = server.install(INSTALL_K3S_VERSION="v1.33.5+k3s1", INSTALL_K3S_EXEC="server")
    assert result.returncode == 0, result.stderr
    token = (
        wait_for(lambda: (server.root / "var/lib/rancher/k3s/server/token").exists())
        and (server.root / "var/lib/rancher/k3s/server/token").read_text().strip()
    )
    assert wait_for(lambda: "vm-1" in nodes(server))
    return server, port, token


def join(hosts, name, port, token, gpu=False, labels=()):
    agent = hosts(name, gpu=gpu)
    (agent.root / "etc/rancher/k3s").mkdir(parents=True)
    (agent.root / "etc/rancher/k3s/agent-token").write_text(token + "\n")
    conf = {
        "server": f"https://127.0.0.1:{port}",
        "token-file": "/etc/rancher/k3s/agent-token",
        "node-name": name,
    }
    if labels:
        conf["node-label"] = list(labels)
    agent.config(conf)
    result = agent.install(INSTALL_K3S_VERSION="v1.33.5+k3s1", INSTALL_K3S_EXEC="agent")
    assert result.returncode == 0, result.stderr
    return agent


def test_install_writes_k3s_files_and_starts_only_on_change(cluster):
    server, _port, token = cluster
    root = server.root
    assert token.startswith("K10") and "::server:" in token and len(token.split("::server:")[0]) == 67
    assert (root / "var/lib/rancher/k3s/server/node-token").is_symlink()
    unit = (root / "etc/systemd/system/k3s.service").read_text()
    assert "ExecStart=/usr/local/bin/k3s \\\n    server" in unit
    env_file = root / "etc/systemd/system/k3s.service.env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert (root / "usr/local/bin/k3s-uninstall.sh").exists() and (
        root / "usr/local/bin/k3s-killall.sh"
    ).exists()
    # Like the real script: the link is made only when no kubectl is on the PATH already.
    assert (root / "usr/local/bin/kubectl").is_symlink() == (shutil.which("kubectl") is None)
    assert server.systemctl_calls() == ["daemon-reload", "enable k3s", "restart k3s"]
    assert server.k3s("--version").stdout.startswith("k3s version v1.33.5+k3s1 (")

    again = server.install(INSTALL_K3S_VERSION="v1.33.5+k3s1", INSTALL_K3S_EXEC="server")
    assert "No change detected so skipping service start" in again.stdout
    assert server.systemctl_calls()[-1] == "enable k3s"

    upgrade = server.install(INSTALL_K3S_VERSION="v1.34.1+k3s1", INSTALL_K3S_EXEC="server")
    assert "Using v1.34.1+k3s1 as release" in upgrade.stdout
    assert server.systemctl_calls()[-1] == "restart k3s"
    assert server.k3s("--version").stdout.split()[2] == "v1.34.1+k3s1"


def test_install_refusals_match_the_real_script(hosts):
    host = hosts("vm-x")
    skip = host.install(INSTALL_K3S_SKIP_DOWNLOAD="true")
    assert skip.returncode == 1 and "Executable k3s binary not found at /usr/local/bin/k3s" in skip.stderr
    url = host.install(K3S_URL="https://10.0.0.1:6443")
    assert url.returncode == 1 and "K3S_TOKEN or K3S_TOKEN_FILE is not defined" in url.stderr
    assert not (host.root / "etc/systemd/system").exists()


def test_air_gap_install_uses_the_pre_placed_binary(hosts):
    host = hosts("vm-air")
    host.config({"bind-address": "127.0.0.1", "https-listen-port": free_port()})
    binary = host.root / "usr/local/bin/k3s"
    binary.parent.mkdir(parents=True)
    binary.write_text(k3s_standin.binary_wrapper("v1.33.5+k3s1", sys.executable, str(STANDIN)))
    binary.chmod(0o755)
    before = binary.read_text()
    result = host.install(INSTALL_K3S_SKIP_DOWNLOAD="true", INSTALL_K3S_EXEC="server")
    assert result.returncode == 0 and "Skipping k3s download and verify" in result.stdout
    assert binary.read_text() == before


def test_agents_join_with_labels_and_hami_gives_vgpus(cluster, hosts):
    server, port, token = cluster
    join(hosts, "vm-2", port, token)
    join(hosts, "vm-gpu", port, token.split("::server:")[1], gpu=True, labels=["gpu=on"])  # bare password
    seen = wait_for(lambda: {"vm-1", "vm-2", "vm-gpu"} <= set(nodes(server)) and nodes(server))
    assert seen["vm-gpu"]["metadata"]["labels"]["gpu"] == "on"
    assert "gpu" not in seen["vm-2"]["metadata"]["labels"]
    assert seen["vm-1"]["metadata"]["labels"]["node-role.kubernetes.io/control-plane"] == "true"
    ready = [c for c in seen["vm-2"]["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    assert all("nvidia.com/gpu" not in n["status"]["allocatable"] for n in seen.values())

    _values, manifest = hami.render("2.10.0", device_split_count=7)
    (server.root / "var/lib/rancher/k3s/server/manifests/hami.yaml").write_text(manifest)
    after = nodes(server)
    assert after["vm-gpu"]["status"]["allocatable"]["nvidia.com/gpu"] == "7"
    assert "nvidia.com/gpu" not in after["vm-2"]["status"]["allocatable"]
    ds = json.loads(server.k3s("kubectl", "get", "daemonsets", "--all-namespaces", "-o", "json").stdout)
    assert [d["metadata"]["name"] for d in ds["items"]] == ["hami-device-plugin"]
    job = server.k3s(
        "kubectl", "-n", "kube-system", "wait", "--for=condition=complete", "job/helm-install-hami"
    )
    assert job.returncode == 0
    rollout = server.k3s("kubectl", "-n", "kube-system", "rollout", "status", "deployment/hami-scheduler")
    assert rollout.returncode == 0


def test_a_wrong_token_is_refused(cluster, hosts):
    server, port, _token = cluster
    agent = join(hosts, "vm-bad", port, "not-the-token")
    assert wait_for(lambda: "token rejected" in (agent.root / "k3s-agent.out").read_text())
    assert "vm-bad" not in nodes(server)


def test_kubectl_label_drain_runtimeclass_and_not_found(cluster):
    server, _port, _token = cluster
    assert (
        server.k3s("kubectl", "get", "runtimeclass", "nvidia", "-o", "jsonpath={.handler}").stdout == "nvidia"
    )
    assert server.k3s("kubectl", "get", "runtimeclass", "nvidia-cdi").returncode == 1
    assert server.k3s("kubectl", "label", "node", "vm-1", "gpu=on", "--overwrite").returncode == 0
    assert nodes(server)["vm-1"]["metadata"]["labels"]["gpu"] == "on"
    assert server.k3s("kubectl", "drain", "vm-1", "--ignore-daemonsets").returncode == 0
    assert nodes(server)["vm-1"]["spec"] == {"unschedulable": True}
    assert server.k3s("kubectl", "uncordon", "vm-1").returncode == 0
    assert nodes(server)["vm-1"]["spec"] == {}
    missing = server.k3s("kubectl", "-n", "default", "rollout", "status", "deployment/nope")
    assert missing.returncode == 1 and 'deployments.apps "nope" not found' in missing.stderr
    assert server.k3s("kubectl", "wait", "--for=condition=complete", "job/helm-install-hami").returncode == 1


def test_uninstall_stays_inside_the_hosts_root(cluster):
    server, _port, _token = cluster
    script = server.root / "usr/local/bin/k3s-uninstall.sh"
    text = script.read_text()
    for line in text.splitlines():
        if line.startswith("rm "):
            assert all(p.startswith(str(server.root)) for p in line.split()[2:]), line
    subprocess.run(["sh", str(script)], env=server.env, check=True, timeout=30)
    assert not (server.root / "etc/systemd/system/k3s.service").exists()
    assert not (server.root / "var/lib/rancher/k3s/server").exists()
    assert not script.exists()


def test_files_for_a_lab_host():
    files = k3s_standin.files("v1.33.5+k3s1")
    assert set(files) == {
        "/usr/local/lib/gpulab/k3s_standin.py",
        "/usr/local/bin/k3s",
        "/usr/local/bin/k3s-install.sh",
        "/usr/local/bin/systemctl",
    }
    assert "/usr/bin/python3 /usr/local/lib/gpulab/k3s_standin.py k3s" in files["/usr/local/bin/k3s"][1]
    assert all(mode == 0o755 for mode, _ in files.values())


def test_roles_drive_the_stand_in_cluster(cluster, hosts, tmp_path):
    """cluster check -> hami -> workloads, from the roles, against the stand-in server and its joined agents."""
    from .test_roles_local import CLUSTER, HAMI, WORKLOADS, Lab, engines

    server, port, token = cluster
    join(hosts, "vm-2", port, token)
    join(hosts, "vm-gpu", port, token, gpu=True)  # no node-label: the cluster check labels it
    assert wait_for(lambda: {"vm-1", "vm-2", "vm-gpu"} <= set(nodes(server)))
    (tmp_path / "controller").mkdir()
    lab = Lab(tmp_path / "controller")
    where = {
        "bin": str(server.root / "usr/local/bin"),
        "manifests": str(server.root / "var/lib/rancher/k3s/server/manifests"),
    }

    rc, out = lab.play([CLUSTER], extra_vars=where)
    assert rc == 0, lab.failures(out)
    assert nodes(server)["vm-gpu"]["metadata"]["labels"]["gpu"] == "on"

    rc, out = lab.play([HAMI], extra_vars=where)
    assert rc == 0, lab.failures(out)
    assert nodes(server)["vm-gpu"]["status"]["allocatable"]["nvidia.com/gpu"] == "10"

    pytest.importorskip(
        "kubernetes_validate", reason="manifest validation needs the kubernetes-validate package"
    )
    rc, out = lab.play([WORKLOADS], extra_vars={**where, "workloads_engines": engines(45, 45)})
    assert rc == 0, lab.failures(out)

    rc, out = lab.play([CLUSTER, HAMI, WORKLOADS], extra_vars={**where, "workloads_engines": engines(45, 45)})
    assert rc == 0 and out["stats"]["vm-1"]["changed"] == 0
