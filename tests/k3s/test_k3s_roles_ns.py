"""k3s_server and k3s_agent run unchanged against the k3s stand-in, each "host" in its own mount namespace.

Each host sees its own copy-on-write /etc, /var and /usr (overlays whose upper folders are in the test's
temporary folder), with the stand-in's k3s binary and install script pre-placed (air-gap install) and its
systemctl first on the PATH, since no systemd runs here. The server listens on 127.0.0.1 only. Nothing
outside the temporary folder changes: the overlays exist only inside the namespaces.
"""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

from gpulab.k8s import k3s_standin

pytestmark = [pytest.mark.root, pytest.mark.slow]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STANDIN = os.path.abspath(k3s_standin.__file__)
PLAYBOOK = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
VERSION = "v1.33.5+k3s1"
UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NsHost:
    """A host: overlays on /etc, /var and /usr inside a private mount namespace, per command."""

    def __init__(self, base, name, gpu=False, toolkit=False):
        self.base = base / name
        self.name = name
        for d in ("etc", "var", "usr"):
            (self.base / d / "upper").mkdir(parents=True)
            (self.base / d / "work").mkdir()
        bin_dir = self.base / "usr/upper/local/bin"
        bin_dir.mkdir(parents=True)
        py = sys.executable
        scripts = {
            "k3s": k3s_standin.binary_wrapper(VERSION, py, STANDIN),
            "k3s-install.sh": f'#!/bin/sh\nexec {py} {STANDIN} install "$@"\n',
            "systemctl": f'#!/bin/sh\nexec {py} {STANDIN} systemctl "$@"\n',
        }
        if gpu:
            scripts["nvidia-smi"] = (
                f"#!/bin/sh\necho '{UUID0}, NVIDIA GeForce RTX 3090, 24576, 580.173.02, 00000000:01:00.0'\n"
            )
        if toolkit:
            (self.base / "usr/upper/bin").mkdir(parents=True)
            runtime = self.base / "usr/upper/bin/nvidia-container-runtime"
            runtime.write_text("#!/bin/sh\nexit 0\n")
            runtime.chmod(0o755)
        for fname, text in scripts.items():
            (bin_dir / fname).write_text(text)
            (bin_dir / fname).chmod(0o755)
        (self.base / "tmp").mkdir()

    def upper(self, p):
        top, _, rest = p.strip("/").partition("/")
        return self.base / top / "upper" / rest

    def run(self, argv, timeout=600):
        mounts = " && ".join(
            f"mount -t overlay overlay -o lowerdir=/{d},upperdir={self.base}/{d}/upper,workdir={self.base}/{d}/work /{d}"
            for d in ("etc", "var", "usr")
        )
        env = {
            "PATH": f"/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin:{os.path.dirname(sys.executable)}",
            "HOME": str(self.base / "tmp"),
            "ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
            "ANSIBLE_LIBRARY": os.path.join(ROOT, "plugins", "modules"),
            "ANSIBLE_ROLES_PATH": os.path.join(ROOT, "roles"),
            "ANSIBLE_LOCAL_TEMP": str(self.base / "tmp" / "local"),
            "ANSIBLE_REMOTE_TEMP": str(self.base / "tmp" / "remote"),
            "ANSIBLE_HOME": str(self.base / "tmp" / "home"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "GPULAB_K3S_HEARTBEAT": "1",
        }
        cmd = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            f'{mounts} && exec "$@"',
            "sh",
            *argv,
        ]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)

    def play(self, role, role_vars, *args):
        book = [
            {
                "name": "test",
                "hosts": "localhost",
                "connection": "local",
                "gather_facts": False,
                "vars": {"ansible_python_interpreter": sys.executable},
                "roles": [{"role": role, "vars": role_vars}],
            }
        ]
        path = self.base / "tmp" / "play.yml"
        path.write_text(yaml.safe_dump(book, sort_keys=False))
        return self.run([PLAYBOOK, "-i", "localhost,", str(path), "-v", *args])

    def unit_pid(self, unit):
        st = self.upper(f"/var/lib/gpulab-sim/systemd/{unit}.service.json")
        return json.loads(st.read_text()).get("pid") if st.exists() else None

    def calls(self, command):
        log = self.upper("/var/log/gpulab-standins.log")
        lines = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return [c["argv"] for c in lines if c["argv"][:1] == [command]]

    def stop(self):
        for unit in ("k3s", "k3s-agent"):
            pid = self.unit_pid(unit)
            if pid:
                with contextlib.suppress(OSError):
                    os.killpg(pid, 15)


def recap(result):
    m = re.search(
        r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", result.stdout
    )
    assert m, result.stdout[-3000:] + result.stderr[-2000:]
    return {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}


def server_nodes(server):
    pid = server.unit_pid("k3s")
    out = subprocess.run(
        [
            "nsenter",
            "-t",
            str(pid),
            "-m",
            "--",
            "/usr/local/bin/k3s",
            "kubectl",
            "get",
            "nodes",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    return {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]}


@pytest.fixture
def hosts(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root (mount namespaces and overlays)")
    for tool in ("unshare", "nsenter"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} (util-linux) is missing")
    made = []

    def make(name, **kw):
        host = NsHost(tmp_path, name, **kw)
        made.append(host)
        return host

    yield make
    for host in made:
        host.stop()


def test_k3s_server_and_gpu_agent_roles(hosts):
    outside = [os.path.exists(p) for p in ("/etc/rancher", "/var/lib/rancher", "/usr/local/bin/k3s")]
    port = free_port()
    server = hosts("vm-1")
    server_vars = {
        "k3s_server_version": VERSION,
        "k3s_server_airgap": True,
        "k3s_server_node_name": "vm-1",
        "k3s_server_address": "127.0.0.1",
        "k3s_server_config": {"bind-address": "127.0.0.1", "https-listen-port": port},
        "k3s_server_poll_interval": 1,
        "k3s_server_ready_timeout": 60,
    }

    # First run: config, install (air-gap), k3s started, token generated and read back, node Ready.
    first = server.play("k3s_server", server_vars)
    assert recap(first)["failed"] == 0, first.stdout[-4000:]
    assert recap(first)["changed"] > 0
    token = server.upper("/var/lib/rancher/k3s/server/token").read_text().strip()
    assert token.startswith("K10") and token not in first.stdout and token.split(":")[-1] not in first.stdout
    config = yaml.safe_load(server.upper("/etc/rancher/k3s/config.yaml").read_text())
    assert config["node-name"] == "vm-1" and config["tls-san"] == ["127.0.0.1"] and "token" not in config
    assert ["install"] in server.calls("install")
    assert "vm-1" in server_nodes(server)

    # Second run: nothing changes, nothing restarts.
    restarts = server.calls("systemctl").count(["systemctl", "restart", "k3s"])
    second = server.play("k3s_server", server_vars)
    assert recap(second) == {**recap(second), "changed": 0, "failed": 0}, second.stdout[-4000:]
    assert server.calls("systemctl").count(["systemctl", "restart", "k3s"]) == restarts

    # --check with a new setting: reported, not written.
    changed_vars = {
        **server_vars,
        "k3s_server_config": {**server_vars["k3s_server_config"], "disable": ["traefik"]},
    }
    before = server.upper("/etc/rancher/k3s/config.yaml").read_text()
    check = server.play("k3s_server", changed_vars, "--check")
    assert recap(check)["failed"] == 0 and recap(check)["changed"] > 0, check.stdout[-4000:]
    assert server.upper("/etc/rancher/k3s/config.yaml").read_text() == before

    # The change for real: config written, k3s restarted once through the handler.
    apply = server.play("k3s_server", changed_vars)
    assert recap(apply)["failed"] == 0, apply.stdout[-4000:]
    assert "traefik" in server.upper("/etc/rancher/k3s/config.yaml").read_text()
    assert server.calls("systemctl").count(["systemctl", "restart", "k3s"]) == restarts + 1

    agent_vars = {
        "k3s_agent_version": VERSION,
        "k3s_agent_token": token,
        "k3s_agent_server_url": f"https://127.0.0.1:{port}",
        "k3s_agent_node_name": "vm-gpu",
        "k3s_agent_gpu": True,
        "k3s_agent_airgap": True,
    }

    # A GPU agent without its container toolkit is refused before anything is installed.
    bare = hosts("vm-gpu-bare", gpu=True)
    refused = bare.play("k3s_agent", agent_vars)
    assert recap(refused)["failed"] == 1
    assert "NVIDIA container toolkit is missing" in refused.stdout
    assert not bare.upper("/etc/systemd/system/k3s-agent.service").exists()

    # With driver and toolkit it joins, labelled, and the token stays out of the output and the config.
    gpu = hosts("vm-gpu", gpu=True, toolkit=True)
    joined = gpu.play("k3s_agent", agent_vars)
    assert recap(joined)["failed"] == 0, joined.stdout[-4000:]
    assert token not in joined.stdout
    agent_config = gpu.upper("/etc/rancher/k3s/config.yaml").read_text()
    assert token not in agent_config and "gpu=on" in agent_config
    assert oct(gpu.upper("/etc/rancher/k3s/agent-token").stat().st_mode & 0o777) == "0o600"
    nodes = {}
    for _ in range(100):
        nodes = server_nodes(server)
        if "vm-gpu" in nodes:
            break
        subprocess.run(["sleep", "0.2"], check=False)
    assert nodes["vm-gpu"]["metadata"]["labels"]["gpu"] == "on"

    again = gpu.play("k3s_agent", agent_vars)
    assert recap(again)["changed"] == 0 and recap(again)["failed"] == 0, again.stdout[-4000:]

    # This machine's own files were never touched: the overlays existed only in the namespaces.
    assert [os.path.exists(p) for p in ("/etc/rancher", "/var/lib/rancher", "/usr/local/bin/k3s")] == outside
