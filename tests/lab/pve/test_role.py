"""Role pve_vms through playbooks/vms.yml on inventory/demo, against the strict simulated PVE."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
import yaml
from unit.pve.conftest import ROOT, playbook_lab

ROLE = ROOT / "roles" / "pve_vms"
DEMO_GPU = yaml.safe_load((ROOT / "inventory" / "demo" / "host_vars" / "pve.yml").read_text())["pve_gpus"][0]


def play(
    lab_state: pathlib.Path,
    *extra: str,
    playbooks=("playbooks/preflight.yml", "playbooks/vms.yml"),
    inventory: str = "inventory/demo",
) -> dict:
    """Run playbooks on an inventory against the lab; return {rc, stats, results: [task records]}."""
    record = lab_state.parent / f"record-{len(list(lab_state.parent.glob('record-*')))}.jsonl"
    env = dict(
        os.environ,
        GPULAB_LAB_STATE=str(lab_state),
        GPULAB_RECORD=str(record),
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_CALLBACK_PLUGINS=str(
            ROOT / "tests" / "unit" / "pve" / "callbacks"
        ),  # the record callback, kept there
        ANSIBLE_CALLBACKS_ENABLED="gpulab_record",
        ANSIBLE_NOCOLOR="1",
    )
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), *playbooks, "-i", inventory]
    # the API-only lab has no node to log in to: no snippet to place there, no vfio proof or card read there, no
    # run lock file to keep there
    cmd += ["-e", "gpulab_guest_agent_snippet=false", "-e", "pve_vms_vfio_proof=false"]
    cmd += ["-e", "pve_vms_card_read=false", "-e", "gpulab_run_lock_enabled=false"]
    cmd += ["-e", "pve_vms_download_poll_s=1", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    lines = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
    stats = next((x["stats"] for x in lines if "stats" in x), None)
    if stats is None:
        pytest.fail(
            f"ansible-playbook ended without stats: rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        )
    return {
        "rc": proc.returncode,
        "stats": stats,
        "results": [x for x in lines if "task" in x],
        "stdout": proc.stdout,
    }


def converge(lab, **play_kw) -> dict:
    """play() against `lab` that succeeds and makes no request the simulator refuses; its result."""
    out = play(lab.state, **play_kw)
    assert out["rc"] == 0, out["stdout"]
    assert lab.rejected() == []
    return out


def converge_again(lab, **play_kw) -> tuple[dict, int]:
    """play() once more: it succeeds, changes nothing on any host and writes nothing to the lab; its result and
    the lab's mark from before it (for the requests it made)."""
    mark = lab.mark()
    out = play(lab.state, **play_kw)
    assert out["rc"] == 0, out["stdout"]
    assert all(s["changed"] == 0 and s["failures"] == 0 for s in out["stats"].values()), out["stats"]
    assert lab.writes(mark) == []
    return out, mark


def results(out: dict, module: str) -> dict:
    """VM name -> the result of the `module` task for it."""
    found = {}
    for rec in out["results"]:
        if rec["action"] == f"gpulab.homelab.{module}":  # the roles call it by its full name
            found[rec["task"].rsplit(" ", 1)[-1]] = rec["result"]  # "Create, update and start <vm>"
    return found


@pytest.fixture
def demo_lab(tmp_path):
    # a key comment that cloud-init's sshkeys must carry URL-encoded (test@lab%2B1)
    with playbook_lab(tmp_path, key_comment="test@lab+1") as lab:
        yield lab


@pytest.mark.slow
def test_check_diff_then_apply_then_nothing_to_do(demo_lab, tmp_path):
    lab = demo_lab
    # --check --diff on a fresh lab: every VM shown with its config, no write
    out = play(lab.state, "--check", "--diff")
    assert out["rc"] == 0, out["stdout"]
    assert lab.writes() == [] and lab.rejected() == []
    vms = results(out, "pve_vm")
    assert set(vms) == {"vm-1", "vm-2", "vm-gpu"}
    assert all(v["created"] and v["changed"] for v in vms.values())
    gpu = vms["vm-gpu"]["diff"]["after"]
    assert gpu["machine"] == "q35" and gpu["bios"] == "ovmf" and gpu["hostpci0"] == "mapping=rtx3090,pcie=1"

    # apply
    out = play(lab.state)
    assert out["rc"] == 0, out["stdout"]
    assert lab.rejected() == []
    client = lab.client()
    cfg = {
        vm["name"]: client.get(f"nodes/pve/qemu/{vm['vmid']}/config")
        for vm in client.get("cluster/resources", type="vm")
    }
    g = cfg["vm-gpu"]
    assert g["machine"] == "q35" and g["bios"] == "ovmf" and g["cpu"] == "host"
    assert "efitype=4m" in g["efidisk0"] and "pre-enrolled-keys=0" in g["efidisk0"]
    assert int(g["cores"]) == 8 and int(str(g["memory"]).split("=")[-1]) == 16384 and int(g["balloon"]) == 0
    assert g["scsi0"].startswith("local-zfs:") and "size=200G" in g["scsi0"]
    assert g["hostpci0"] == "mapping=rtx3090,pcie=1"
    assert int(g.get("onboot", 0)) == 0
    for name in ("vm-1", "vm-2"):
        c = cfg[name]
        assert c.get("machine", "pc") in ("pc", "i440fx") and c.get("bios", "seabios") == "seabios"
        assert int(c["cores"]) == 4 and int(str(c["memory"]).split("=")[-1]) == 4096
        assert "size=60G" in c["scsi0"] and "efidisk0" not in c
        assert c["sshkeys"].startswith("ssh-ed25519%20AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly%20test%40lab%2B1")
    mapping = client.get("cluster/mapping/pci")
    assert mapping[0]["map"] == ["node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"]
    assert {vm["status"] for vm in client.get("cluster/resources", type="vm")} == {"running"}

    # the next stages find each VM's MAC and address as host facts
    check = tmp_path / "facts.yml"
    check.write_text(
        yaml.safe_dump(
            [
                {
                    "name": "facts",
                    "hosts": "vms",
                    "gather_facts": False,
                    "tasks": [
                        {
                            "name": "Facts recorded",
                            "ansible.builtin.assert": {
                                "that": [
                                    "gpulab_vm_mac | length == 17",
                                    "gpulab_vm_address is match('^[0-9.]+$')",
                                ]
                            },
                        }
                    ],
                }
            ]
        )
    )
    # second run: nothing changes, no write, and the number of reads per VM
    mark = lab.mark()
    out = play(lab.state, playbooks=("playbooks/preflight.yml", "playbooks/vms.yml", str(check)))
    assert out["rc"] == 0, out["stdout"]
    assert all(s["changed"] == 0 and s["failures"] == 0 for s in out["stats"].values()), out["stats"]
    assert lab.writes(mark) == []
    reads = [r["path"].split("/api2/json")[1] for r in lab.requests(mark)]
    for vmid in (100, 101, 102):
        mine = [p for p in reads if f"/qemu/{vmid}/" in p]
        # its address; its SSH host keys are in known_hosts since the first run, so they are not read again
        assert mine == [
            f"/nodes/pve/qemu/{vmid}/pending",
            f"/nodes/pve/qemu/{vmid}/agent/network-get-interfaces",
        ]
    # preflight's look at the guests that exist, then one per VM module
    assert reads.count("/cluster/resources") == 4

    # vm_onboot everywhere: preflight refuses start at boot for the VM whose GPU is the boot display, and
    # names the way out; nothing is written (stage vms has no rule of its own that could differ)
    out = play(lab.state, "--check", "-e", "vm_onboot=true")
    assert out["rc"] != 0
    assert "vm-gpu: vm_onboot=True" in out["stdout"] and "vm_onboot_override_boot_display" in out["stdout"]
    assert results(out, "pve_vm") == {}
    assert lab.writes(mark) == []
    assert lab.rejected() == []


def edited_demo(tmp_path: pathlib.Path, edits: dict[str, dict]) -> str:
    """A copy of inventory/demo with host_vars files changed: {host: {var: value, or None to remove}}."""
    inv = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "demo", inv)
    for host, changes in edits.items():
        path = inv / "host_vars" / f"{host}.yml"
        data = yaml.safe_load(path.read_text())
        for name, value in changes.items():
            if value is None:
                data.pop(name, None)
            else:
                data[name] = value
        path.write_text(yaml.safe_dump(data))
    return str(inv)


@pytest.mark.slow
def test_the_vms_are_made_as_the_plan_says(demo_lab, tmp_path):
    """The places where stage vms once went its own way: the balloon floor, vm_name, the catalogue's
    defaults, and start at boot decided from the node's boot_vga instead of the checked definition."""
    lab = demo_lab
    inventory = edited_demo(
        tmp_path,
        {
            "vm-1": {"vm_balloon_min_mib": 1024, "vm_name": "web-1"},
            "vm-2": {"vm_cores": None, "vm_memory_mib": None, "vm_disk_gb": None},
            # the inventory calls the card no boot display (the checks then allow start at boot) ...
            "pve": {"pve_gpus": [{**DEMO_GPU, "boot_display": False}]},
            "vm-gpu": {"vm_onboot": True},
        },
    )
    # ... while stage host's fact says it is: stage vms goes by the plan, stage host refuses the mismatch
    state = json.dumps({"pve_host_gpu_state": {"rtx3090": {"boot_vga": True}}})
    out = play(lab.state, "-e", state, inventory=inventory)
    assert out["rc"] == 0, out["stdout"]
    client = lab.client()
    cfg = {
        vm["name"]: client.get(f"nodes/pve/qemu/{vm['vmid']}/config")
        for vm in client.get("cluster/resources", type="vm")
    }
    assert set(cfg) == {"web-1", "vm-2", "vm-gpu"}
    assert int(cfg["web-1"]["balloon"]) == 1024 and int(str(cfg["web-1"]["memory"]).split("=")[-1]) == 4096
    assert int(cfg["vm-2"]["cores"]) == 2 and int(str(cfg["vm-2"]["memory"]).split("=")[-1]) == 2048
    assert "size=32G" in cfg["vm-2"]["scsi0"]
    assert int(cfg["vm-gpu"]["onboot"]) == 1


def test_defaults_and_argument_specs_agree():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]
    # the one required option is what preflight publishes; every other has its default here
    assert {n for n, o in spec.items() if o.get("required")} == {"gpulab_vms"}
    assert set(defaults) == set(spec) - {"gpulab_vms"}
    for name, value in defaults.items():
        assert spec[name]["default"] == value, name
        assert spec[name].get("description"), name
        assert name.startswith("pve_vms_")


@pytest.mark.slow
def test_the_vms_host_keys_go_to_gpulab_known_hosts_file_hashed_as_it_is(demo_lab, tmp_path):
    """Stage vms writes each new VM's host key, read through the guest agent, to gpulab_known_hosts_file: one
    line per VM and key type for the address Ansible connects to, hashed when the file already is."""
    plain = tmp_path / "new" / "known_hosts"  # its folder is made too
    out = play(demo_lab.state, "-e", f"gpulab_known_hosts_file={plain}")
    assert out["rc"] == 0, out["stdout"]
    lines = [line.split() for line in plain.read_text().splitlines()]
    assert sorted(line[0].rsplit(".", 1)[1] for line in lines) == ["53", "54", "55"], lines
    assert {line[1] for line in lines} == {"ssh-ed25519"}
    # a file ssh hashes (HashKnownHosts): the VMs' lines are hashed too, and found by their address
    hashed = tmp_path / "hashed"
    hashed.write_text(f"192.0.2.1 {lines[0][1]} {lines[0][2]}\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    out = play(demo_lab.state, "-e", f"gpulab_known_hosts_file={hashed}")
    assert out["rc"] == 0, out["stdout"]
    text = hashed.read_text()
    assert len(text.splitlines()) == 4 and all(line.startswith("|1|") for line in text.splitlines()), text
    for address, keytype, key in lines:
        found = subprocess.run(
            ["ssh-keygen", "-F", address, "-f", str(hashed)], capture_output=True, text=True
        )
        assert f"{keytype} {key}" in found.stdout, (address, text)
    again = play(demo_lab.state, "-e", f"gpulab_known_hosts_file={hashed}")
    assert again["stats"]["localhost"]["changed"] == 0 and hashed.read_text() == text
