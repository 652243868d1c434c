"""Shared helpers for the host-stage tests: the host-side modules loaded from plugins/modules, run like Ansible,
and the lab's node host (labsim.net.loopback_node) driven with playbooks/host.yml."""

import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import ansible_runs
import pytest
import yaml
from ansible_modules import run_json

from labsim.fixture import load_fixture
from labsim.net import node_host
from labsim.net.loopback_node import LoopbackNodeHost

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODULES = ROOT / "plugins" / "modules"
DATA = pathlib.Path(__file__).resolve().parent / "data"


def load_module(name):
    spec = importlib.util.spec_from_file_location(f"host_{name}", MODULES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_module(name, args, *, check_mode=False, diff=False, env=None):
    """Run a module as Ansible runs it on a host (JSON arguments on argv) and return its JSON result."""
    return run_json(MODULES / f"{name}.py", args, check_mode=check_mode, diff=diff, env=env)


@pytest.fixture(scope="session")
def cmdline_mod():
    return load_module("kernel_cmdline")


@pytest.fixture(scope="session")
def facts_mod():
    return load_module("pci_facts")


# The node's first-boot files, as the lab writes them (the installer's kernel line ends in a space).
INSTALLER_CMDLINE = node_host.REFERENCE_KERNEL_CMDLINE + " \n"
DEBIAN_GRUB = node_host.DEBIAN_DEFAULT_GRUB
DEBIAN_MODULES = node_host.DEBIAN_MODULES
PVE_BLACKLIST = node_host.PVE_BLACKLIST
# The reference lab's card, as inventory/demo describes it (the lab's node shows the same one).
REFERENCE_GPU = yaml.safe_load((ROOT / "inventory" / "demo" / "host_vars" / "pve.yml").read_text())[
    "pve_gpus"
][0]

# pytestmark of the tests that run playbooks against PlaybookNode (the node host needs root and sshd)
NODE_HOST = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: mount namespaces and overlays for the stand-in node"
    ),
    pytest.mark.skipif(
        not shutil.which("sshd") and not os.path.exists("/usr/sbin/sshd"), reason="needs sshd"
    ),
]


class PlaybookNode:
    """The lab's node host on the loopback (its own sshd, stand-ins and boots), run with playbooks/host.yml.

    ``loader`` is systemd-boot (proxmox-boot-tool) or grub; ``variant`` the node's simulated hardware
    (``iommu``, ``share_group_with``). `calls()` lists the stand-in calls and the boots in order, as
    "COMMAND ARGS" and "boot STATE" lines.
    """

    def __init__(
        self,
        base: pathlib.Path,
        *,
        loader: str = "systemd-boot",
        variant: dict | None = None,
        fixture: str | None = None,
        gpus: list[dict] | None = None,
    ):
        self.base = pathlib.Path(base)
        node = {"boot": {"loader": loader}, "lab": variant or {}}
        if fixture:  # a lab fixture's first node (its PCI devices, kernel, boot loader and seeded files)
            node = load_fixture(fixture)["nodes"][0]
        self.gpus = gpus or [REFERENCE_GPU]
        self.host = LoopbackNodeHost(self.base, node)
        self.etc = self.host.upper / "etc"  # the node's own files (what the role wrote)
        self.sysroot = self.host.hardware_view

    def start(self) -> "PlaybookNode":
        self.host.start()
        return self

    def stop(self) -> None:
        self.host.stop()

    def etc_file(self, rel: str) -> str:
        return (self.etc / rel).read_text()

    def set_vms(self, rows: list[tuple[int, str, str]]) -> None:
        self.host.set_vms(rows)

    def calls(self) -> list[str]:
        calls = [(c["time"], f"{c['command']} {' '.join(c['argv'])}") for c in self.host.calls()]
        boots = [(b["time"], f"boot {b['state']}") for b in self.host.boots()]
        return [line for _t, line in sorted(calls + boots, key=lambda event: event[0])]

    def inventory(self) -> pathlib.Path:
        pve = {
            "ansible_host": "127.0.0.1",
            "ansible_port": self.host.port,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(self.host.client_key),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": "/usr/bin/python3",
            "pve_node": "pve",
            "pve_gpus": self.gpus,
            "pve_host_sysfs_root": node_host.HW_ROOT,
        }
        path = self.base / "inventory.json"
        path.write_text(json.dumps({"all": {"children": {"proxmox": {"hosts": {"pve": pve}}}}}))
        return path

    def play(self, *args: str, extra: dict | None = None) -> tuple[int, str, dict]:
        """Run playbooks/host.yml; returns (rc, output, recap counts for host pve)."""
        cmd = [str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", str(self.inventory())]
        cmd += [str(ROOT / "playbooks/host.yml"), *ansible_runs.STAGE_ON_ITS_HOSTS, *args]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=auto -o ControlPersist=30s",
            "ANSIBLE_SSH_CONTROL_PATH_DIR": str(self.base / "cp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_LOCAL_TEMP": str(self.base / "tmp"),
        }
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False
        )
        out = proc.stdout + proc.stderr
        m = re.search(r"^pve\s*:\s*(.*)$", out, re.MULTILINE)
        recap = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))} if m else {}
        # Long messages come back folded over several lines: callers compare whitespace-normalised text.
        return proc.returncode, " ".join(out.split()), recap
