"""Lab-like hosts for the k3s tests: each in its own mount namespace, with the lab's k3s stand-in.

A host sees copy-on-write /etc, /var, /usr and /run (overlays whose upper folders lie in the test's temporary
folder), held by one `sleep` process per host; every command runs inside with `nsenter`. The k3s release the
hosts install is the lab's own: the k3s stand-in (labsim.net.k3s_standin) as the binary and the lab's
install script stand-in (package_archive.K3S_INSTALL), downloaded from a file:// folder the way lab VMs download them
from the router's file server. A GPU host gets the lab's nvidia-smi stand-in and one RTX 3090, a toolkit host
the lab's /usr/bin/nvidia-container-runtime. No systemd runs here: tests/k3s/fake_systemctl.py stands in for
systemctl. Hosts share the machine's network namespace, so servers bind 127.0.0.1 on a free port. Nothing
outside the temporary folder changes: the overlays exist only inside the namespaces.
"""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from labsim.net import k3s_standin, package_archive

ROOT = Path(__file__).resolve().parents[2]
STANDIN = Path(k3s_standin.__file__).resolve()
FAKE_SYSTEMCTL = Path(__file__).resolve().with_name("fake_systemctl.py")
PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
VERSION = "v1.33.5+k3s1"
UUID0 = "GPU-e1924eea-b9bb-d537-39f2-b345087fa145"
GPU = {
    "uuid": UUID0,
    "name": "NVIDIA GeForce RTX 3090",
    "memory_mib": 24576,
    "pci_bus_id": "00000000:01:00.0",
}
LAYERS = ("etc", "var", "usr", "run")
PATH = f"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:{Path(sys.executable).parent}"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def release(folder: Path) -> Path:
    """The lab's k3s release folder (what package_archive.build serves at http://ROUTER/k3s/), here as a file:// URL."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(STANDIN, folder / "k3s")
    (folder / "k3s").chmod(0o755)
    (folder / "install.sh").write_text(package_archive.K3S_INSTALL.replace("@FILES@", f"file://{folder}"))
    (folder / "install.sh").chmod(0o755)
    return folder


def recap(result):
    m = re.search(
        r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", result.stdout
    )
    assert m, result.stdout[-3000:] + result.stderr[-2000:]
    return {"ok": int(m[1]), "changed": int(m[2]), "failed": int(m[4])}


class NsHost:
    """One host: overlays on /etc, /var, /usr and /run in a private mount namespace held open."""

    def __init__(self, base: Path, name: str, files: Path, *, gpu=False, toolkit=False, airgap=False):
        self.base, self.name, self.files = base / name, name, files
        for d in LAYERS:
            (self.base / d / "upper").mkdir(parents=True)
            (self.base / d / "work").mkdir()
        (self.base / "tmp").mkdir()
        self.put(
            "/usr/local/bin/systemctl", f'#!/bin/sh\nexec /usr/bin/python3 {FAKE_SYSTEMCTL} "$@"\n', 0o755
        )
        if airgap:  # the release's binary and script pre-placed, as the roles' air-gap mode expects
            self.put("/usr/local/bin/k3s", (files / "k3s").read_text(), 0o755)
            self.put("/usr/local/bin/k3s-install.sh", (files / "install.sh").read_text(), 0o755)
        if gpu:  # the lab's nvidia-smi stand-in, the driver loaded, one card passed through
            self.put("/usr/bin/nvidia-smi", package_archive.NVIDIA_SMI, 0o755)
            self.put("/etc/gpulab-sim/gpus.json", json.dumps([GPU]) + "\n")
            self.put(package_archive.NVIDIA_LOADED, "")
        if toolkit:
            self.put("/usr/bin/nvidia-container-runtime", "#!/bin/sh\nexit 0\n", 0o755)
        mounts = " && ".join(
            f"mount -t overlay overlay -o lowerdir=/{d},upperdir={self.base}/{d}/upper,"
            f"workdir={self.base}/{d}/work /{d}"
            for d in LAYERS
        )
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             f"{mounts} && echo ready && exec sleep infinity"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.holder.stdout.readline()
        if line.strip() != "ready":
            self.holder.kill()
            raise RuntimeError(f"{name}: the overlays did not mount: {self.holder.stderr.read()}")

    def upper(self, path: str) -> Path:
        top, _, rest = path.strip("/").partition("/")
        return self.base / top / "upper" / rest

    def put(self, path: str, text: str, mode: int = 0o644):
        target = self.upper(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        target.chmod(mode)

    def gone(self, path: str) -> bool:
        """Removed on the host: absent from its upper folder, or a whiteout (a 0/0 character device) there."""
        target = self.upper(path)
        return not target.exists() or target.is_char_device()

    def run(self, *argv, env=None, timeout=120):
        base_env = {
            "PATH": PATH,
            "HOME": str(self.base / "tmp"),
            "LANG": "C.UTF-8",
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_LIBRARY": str(ROOT / "plugins" / "modules"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_LOCAL_TEMP": str(self.base / "tmp" / "local"),
            "ANSIBLE_REMOTE_TEMP": str(self.base / "tmp" / "remote"),
            "ANSIBLE_HOME": str(self.base / "tmp" / "home"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
        }
        cmd = ["nsenter", "-t", str(self.holder.pid), "-m", "--", *map(str, argv)]
        return subprocess.run(
            cmd, env={**base_env, **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False
        )

    def install(self, **env):
        """The lab's install.sh for k3s, run on the host with these variables."""
        return self.run("sh", self.files / "install.sh", env=env)

    def k3s(self, *args, timeout=60):
        return self.run("/usr/local/bin/k3s", *args, timeout=timeout)

    def nodes(self):
        out = self.k3s("kubectl", "get", "nodes", "-o", "json")
        return (
            {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]} if out.returncode == 0 else {}
        )

    def config(self, conf: dict):
        self.put("/etc/rancher/k3s/config.yaml", yaml.safe_dump(conf), 0o600)

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
        return self.run(PLAYBOOK, "-i", "localhost,", path, "-v", *args, timeout=600)

    def systemctl_calls(self):
        log = self.upper("/var/log/gpulab-test-systemctl.log")
        return [json.loads(x)["argv"] for x in log.read_text().splitlines()] if log.exists() else []

    def standin_calls(self, command="k3s"):
        log = self.upper("/var/log/gpulab-standins.log")
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return [c for c in calls if c["command"] == command]

    def unit_pid(self, unit):
        st = self.upper(f"/var/lib/gpulab-test/systemd/{unit}.service.json")
        return json.loads(st.read_text()).get("pid") if st.exists() else None

    def log(self, unit):
        path = self.upper(f"/var/log/{unit}.service.log")
        return path.read_text() if path.exists() else ""

    def stop(self):
        folder = self.upper("/var/lib/gpulab-test/systemd")
        for st in folder.glob("*.json") if folder.is_dir() else []:
            with contextlib.suppress(OSError, ValueError, TypeError):
                os.killpg(json.loads(st.read_text())["pid"], signal.SIGTERM)
        self.holder.kill()
        self.holder.wait(timeout=10)
        for stream in (self.holder.stdout, self.holder.stderr):
            stream.close()
