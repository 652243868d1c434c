"""A lab host as a mount namespace of its own: copy-on-write /etc, /var, /usr and /run, no sshd, no init.

The light host for the k3s stand-in and the k3s roles: every command runs inside with ``nsenter``, the
host shares the machine's network (servers bind 127.0.0.1 on a free port), or lives in the network namespace
``netns`` names (a LAN of veths and a bridge the caller made, for kube-vip's VIP), and one ``sleep`` process
holds the namespace open. Its /etc, /var, /usr and /run are overlays whose upper folders lie in
``BASE/NAME/``; nothing outside them changes (the overlays exist only inside the namespace). It runs no
systemd: :mod:`labsim.net.systemctl_standin` answers ``systemctl`` and runs the units itself.

The k3s release it installs is the lab's own (:func:`k3s_release`: the k3s stand-in as the binary and
the install script stand-in), from a ``file://`` folder, the way lab VMs download them from the router.
A GPU host gets the lab's nvidia-smi stand-in with one RTX 3090 passed through, a toolkit host an
``nvidia-container-runtime``. Needs root (mount namespaces, overlayfs), ``unshare`` and ``nsenter``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import yaml

from labsim.net import command_standins, package_archive, systemctl_standin
from labsim.net.k3s import build_zipapp

LAYERS = ("etc", "var", "usr", "run")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEMCTL = "/usr/local/lib/gpulab/systemctl_standin.py"
GPU = {
    "uuid": "GPU-e1924eea-b9bb-d537-39f2-b345087fa145",
    "name": "NVIDIA GeForce RTX 3090",
    "memory_mib": 24576,
    "pci_bus_id": "00000000:01:00.0",
}


def k3s_release(folder: Path) -> Path:
    """The lab's k3s release folder (what the router serves at http://ROUTER/k3s/), for a file:// URL."""
    folder.mkdir(parents=True, exist_ok=True)
    build_zipapp(folder / "k3s")
    (folder / "install.sh").write_text(package_archive.K3S_INSTALL.replace("@FILES@", f"file://{folder}"))
    (folder / "install.sh").chmod(0o755)
    return folder


class MountNsHost:
    """One host ``name`` in ``base``; ``files`` is a :func:`k3s_release` folder.

    ``env`` is added to every command's environment (over a plain PATH, HOME and LANG). ``airgap``
    pre-places the release's binary and script, as the k3s roles' air-gap mode expects.
    """

    def __init__(
        self,
        base: Path,
        name: str,
        files: Path,
        *,
        gpu: bool = False,
        toolkit: bool = False,
        airgap: bool = False,
        env: dict[str, str] | None = None,
        netns: str | None = None,
    ):
        self.base, self.name, self.files = Path(base) / name, name, files
        self.netns = netns
        self.env = {"PATH": PATH, "HOME": str(self.base / "tmp"), "LANG": "C.UTF-8", **(env or {})}
        for d in LAYERS:
            (self.base / d / "upper").mkdir(parents=True)
            (self.base / d / "work").mkdir()
        (self.base / "tmp").mkdir()
        self.put(SYSTEMCTL, Path(systemctl_standin.__file__).read_text())
        self.put("/usr/local/bin/systemctl", f'#!/bin/sh\nexec /usr/bin/python3 {SYSTEMCTL} "$@"\n', 0o755)
        if airgap:
            self.put("/usr/local/bin/k3s", (files / "k3s").read_bytes(), 0o755)  # a zipapp
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
        # in a network namespace of its own (`ip netns exec`, which also mounts that namespace's /sys) when given
        inside = ["ip", "netns", "exec", netns] if netns else []
        self.holder = subprocess.Popen(
            [*inside, "unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
             f"{mounts} && echo ready && exec sleep infinity"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.holder.stdout.readline() if self.holder.stdout else ""
        if line.strip() != "ready":
            self.holder.kill()
            err = self.holder.stderr.read() if self.holder.stderr else ""
            raise RuntimeError(f"{name}: the overlays did not mount: {err}")

    # --- the host's files, as this machine sees them ----------------------------------------------
    def upper(self, path: str) -> Path:
        top, _, rest = path.strip("/").partition("/")
        return self.base / top / "upper" / rest

    def put(self, path: str, data: str | bytes, mode: int = 0o644) -> None:
        target = self.upper(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            target.write_bytes(data)
        else:
            target.write_text(data)
        target.chmod(mode)

    def gone(self, path: str) -> bool:
        """Removed on the host: absent from its upper folder, or a whiteout (a 0/0 character device) there."""
        target = self.upper(path)
        return not target.exists() or target.is_char_device()

    # --- commands inside --------------------------------------------------------------------------
    def run(self, *argv: Any, env: dict[str, str] | None = None, timeout: float = 120):
        cmd = [
            "nsenter",
            "-t",
            str(self.holder.pid),
            "-m",
            *(["-n"] if self.netns else []),
            "--",
            *map(str, argv),
        ]
        return subprocess.run(
            cmd, env={**self.env, **(env or {})}, capture_output=True, text=True, timeout=timeout, check=False
        )

    def install(self, **env: str):
        """The lab's install.sh for k3s, run on the host with these variables."""
        return self.run("sh", self.files / "install.sh", env=env)

    def k3s(self, *args: str, timeout: float = 60):
        return self.run("/usr/local/bin/k3s", *args, timeout=timeout)

    def nodes(self) -> dict[str, dict]:
        out = self.k3s("kubectl", "get", "nodes", "-o", "json")
        return (
            {n["metadata"]["name"]: n for n in json.loads(out.stdout)["items"]} if out.returncode == 0 else {}
        )

    def config(self, conf: dict) -> None:
        self.put("/etc/rancher/k3s/config.yaml", yaml.safe_dump(conf), 0o600)

    # --- what happened inside ---------------------------------------------------------------------
    def standin_calls(self, command: str = "k3s") -> list[dict]:
        log = self.upper(command_standins.LOG)
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        return [c for c in calls if c["command"] == command]

    def systemctl_calls(self) -> list[list[str]]:
        return [c["argv"] for c in self.standin_calls("systemctl")]

    def unit_pid(self, unit: str) -> int | None:
        st = self.upper(f"{systemctl_standin.STATE_DIR}/{unit}.service.json")
        return json.loads(st.read_text()).get("pid") if st.exists() else None

    def log(self, unit: str) -> str:
        path = self.upper(f"/var/log/{unit}.service.log")
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        """End the units' processes and the namespace (its overlays go with it)."""
        folder = self.upper(systemctl_standin.STATE_DIR)
        for st in folder.glob("*.json") if folder.is_dir() else []:
            with contextlib.suppress(OSError, ValueError, TypeError):
                os.killpg(json.loads(st.read_text())["pid"], signal.SIGTERM)
        self.holder.kill()
        self.holder.wait(timeout=10)
        for stream in (self.holder.stdout, self.holder.stderr):
            if stream:
                stream.close()
