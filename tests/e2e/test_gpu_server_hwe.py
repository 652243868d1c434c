"""Hardware as users have it (issue 43): a one-VM lab whose GPU VM is the only k3s server and runs Ubuntu's HWE
kernel (linux-generic-hwe-24.04, as newer point-release media install it) with Secure Boot on.

Stage guests installs Canonical's signed modules of the kernel series the guest runs
(linux-modules-nvidia-580-server-generic-hwe-24.04; the GA -generic ones would bring a module of another kernel,
and the guest would boot without nvidia), the proof accepts the HWE modules' signer (Canonical's 2025 key), and
nvidia-smi sees the card. Stage k3s starts the server only with its driver and toolkit in place and labels it in
config.yaml; HAMi's proof runs on it. When the toolkit comes back after k3s runs, its handler restarts `k3s` (the
unit this VM runs, not `k3s-agent`), and the nvidia runtime is in the k3s stand-in's containerd config again.
One converge (CI time)."""

from __future__ import annotations

import json
import re
import time

import pytest
import yaml

from .helpers import inventory_copy, lab_down, lab_up, need_root, run_playbook, set_vars

pytestmark = [pytest.mark.root, pytest.mark.slow]

UPPER = "net/hosts/vm102/upper"
CONTAINERD = "var/lib/rancher/k3s/agent/etc/containerd/config.toml"
NVIDIA_ENTRY = "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia']"


def _inventory(dest):
    """inventory/demo with vm-gpu alone: the only VM and the only k3s server, Secure Boot on."""
    inv = inventory_copy(dest)
    hosts = {
        "all": {
            "children": {
                "proxmox": {"hosts": {"pve": None}},
                "router": {"hosts": {"lab-router": None}},
                "vms": {"hosts": {"vm-gpu": None}},
                "k3s_cluster": {
                    "children": {"k3s_server": {"hosts": {"vm-gpu": None}}, "k3s_agent": {"hosts": {}}}
                },
            }
        }
    }
    (inv / "hosts.yml").write_text("---\n" + yaml.safe_dump(hosts, sort_keys=False))
    for gone in ("vm-1", "vm-2"):
        (inv / "host_vars" / f"{gone}.yml").unlink()
    set_vars(inv, "vm-gpu", {"vm_efi_pre_enrolled_keys": True})
    return inv


def _play(lab, inv, tmp, name, commands):
    """Shell commands as root on vm-gpu (a playbook of its own), as a user changing the guest would."""
    book = tmp / f"{name}.yml"
    tasks = [{"name": c, "ansible.builtin.shell": c, "changed_when": True} for c in commands]
    book.write_text(yaml.safe_dump([{"name": name, "hosts": "vm-gpu", "gather_facts": False, "become": True,
                                     "tasks": tasks}]))  # fmt: skip
    return run_playbook(lab, inv, playbook=str(book), timeout=300)


@pytest.fixture(scope="module")
def hwe_server(tmp_path_factory):
    need_root()
    root = tmp_path_factory.mktemp("hwe-server")
    inv = _inventory(root / "inventory")
    lab = lab_up(root / "lab", "hwe-guest")  # by name, as `gpulab lab up --fixture hwe-guest`
    try:
        yield lab, inv, root, run_playbook(lab, inv, timeout=1200)
    finally:
        lab_down(lab.state)


def _kubectl_node(lab, inv, tmp):
    """vm-gpu's node as the server's kubectl shows it (written on the guest, read from its disk)."""
    out = _play(lab, inv, tmp, "node", ["k3s kubectl get node vm-gpu -o json > /root/gpulab-node.json"])
    assert out.returncode == 0, out.stdout[-3000:]
    return json.loads((lab.state / UPPER / "root/gpulab-node.json").read_text())


def test_an_hwe_guest_with_secure_boot_gets_the_hwe_signed_modules_and_nvidia_smi_works(hwe_server):
    lab, _, _, run = hwe_server
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    status = (lab.state / UPPER / "var/lib/dpkg/status").read_text()
    installed = set(re.findall(r"^Package: (\S+)\nStatus: install ok installed", status, re.M))
    assert {
        "linux-modules-nvidia-580-server-generic-hwe-24.04",
        "nvidia-headless-no-dkms-580-server",
        "nvidia-utils-580-server",
    } <= installed
    assert not {"linux-modules-nvidia-580-server-generic", "linux-headers-generic", "dkms"} & installed
    proof = run.stdout.split(
        "TASK [gpulab.homelab.nvidia_driver : Prove the signed NVIDIA module loads with Secure Boot on]", 1
    )
    assert len(proof) == 2 and "ok: [vm-gpu]" in proof[1].split("TASK [", 1)[0], run.stdout[-3000:]
    # the proof held with the module the HWE package brought: built for the HWE kernel, signed with the 2025 key
    marker = (lab.state / UPPER / "usr/lib/gpulab-sim/nvidia-module-installed").read_text().splitlines()
    assert marker[:2] == [
        "proprietary signed 580.173.02 6.17.0-14-generic",
        "signer: Canonical Ltd. Kernel Module Signing 2025 Kmod",
    ]
    rows = {r["vm"]: r for r in json.loads((lab.state / "lab-table.json").read_text())}
    assert "NVIDIA GeForce RTX 3090" in rows["vm-gpu"]["driver"], rows["vm-gpu"]


def test_the_gpu_server_is_labelled_in_its_config_and_hami_offers_its_card(hwe_server, tmp_path):
    lab, inv, _, run = hwe_server
    assert run.returncode == 0, run.stdout[-6000:]
    config = yaml.safe_load((lab.state / UPPER / "etc/rancher/k3s/config.yaml").read_text())
    assert config["node-label"] == ["gpu=on"]
    assert NVIDIA_ENTRY in (lab.state / UPPER / CONTAINERD).read_text()
    node = _kubectl_node(lab, inv, tmp_path)
    assert node["metadata"]["labels"]["gpu"] == "on"
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) == 10  # hami_device_split_count x 1 card
    assert "HAMi 2.10.0: 1 card(s) x 10 = 10 nvidia.com/gpu on vm-gpu" in run.stdout
    # HAMi's proof (opt-in) shares the server's card
    proof = run_playbook(lab, inv, "--tags", "hami-proof", timeout=600)
    assert proof.returncode == 0, proof.stdout[-6000:]
    assert re.search(r"HAMi shares card GPU-[0-9a-f-]+ on vm-gpu", " ".join(proof.stdout.split())), (
        proof.stdout[-3000:]
    )


def test_a_toolkit_that_comes_after_k3s_restarts_the_server_unit(hwe_server, tmp_path):
    """The toolkit taken away and k3s restarted (it runs without the nvidia runtime), then stage guests puts the
    toolkit back: its handler restarts `k3s`, which finds the runtime again at its start."""
    lab, inv, _, run = hwe_server
    assert run.returncode == 0
    config = lab.state / UPPER / CONTAINERD
    gone = _play(
        lab, inv, tmp_path, "toolkit-gone",
        ["apt-get remove -y -q nvidia-container-toolkit nvidia-container-toolkit-base", "systemctl restart k3s"],
    )  # fmt: skip
    assert gone.returncode == 0, gone.stdout[-3000:]
    deadline = time.time() + 60
    while NVIDIA_ENTRY in config.read_text() and time.time() < deadline:
        time.sleep(1)
    assert NVIDIA_ENTRY not in config.read_text()
    guests = run_playbook(lab, inv, "--tags", "guests", timeout=900)
    assert guests.returncode == 0, guests.stdout[-6000:] + guests.stderr[-2000:]
    handler = guests.stdout.split(
        "[gpulab.homelab.nvidia_container_toolkit : Restart k3s so that it finds the NVIDIA runtime]", 1
    )
    assert len(handler) == 2, guests.stdout[-4000:]
    assert (
        "changed: [vm-gpu] => (item=k3s)" in handler[1].split("TASK [", 1)[0].split("RUNNING HANDLER", 1)[0]
    )
    deadline = time.time() + 60
    while NVIDIA_ENTRY not in config.read_text() and time.time() < deadline:
        time.sleep(1)
    assert NVIDIA_ENTRY in config.read_text()
    node = _kubectl_node(lab, inv, tmp_path)
    assert "nvidia" in node["metadata"]["annotations"]["gpulab.lab/runtimes"].split(",")
