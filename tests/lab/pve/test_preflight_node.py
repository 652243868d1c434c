"""Preflight against the world as it is (issue 42): downloads that move or vanish under their URLs, nodes
whose storages are not the ones gpulab assumed, and a rule a later stage applies (the engines' cores). Each
refusal comes in preflight, before stage host or any write, naming what to copy into the inventory; with the
fix in place preflight passes.

The lab is API-only (tests/unit/pve/conftest.py): the PVE simulator with its internet (labsim.internet), which
preflight reaches through the lab's proxy (inventory/demo's gpulab_download_check_proxy).
"""

from __future__ import annotations

import json

import pytest
from unit.k3s.engines import VLLM  # the reference vLLM engine, as the k3s tests run it
from unit.pve.conftest import playbook_lab

from labsim.fixture import load_fixture
from labsim.internet import publish

from .test_role import play

pytestmark = pytest.mark.slow

CURRENT = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"
CURRENT_SUMS = "https://cloud-images.ubuntu.com/noble/current/SHA256SUMS"
PINNED = "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac"  # the folder's before the rebuild
REBUILT = "7c1e5d9b1f0a4e3c8b2d6f5a9e0c4b7d1a3f8e6c2b5d9a0f4e7c1b3d6a8f2e5c"
SITE = ("site.yml",)
PREFLIGHT = ("playbooks/preflight.yml",)


def image(url: str, checksum: str, storage: str = "local") -> str:
    value = {
        "url": url,
        "filename": "noble-server-cloudimg-amd64.qcow2",
        "checksum": checksum,
        "checksum_algorithm": "sha256",
        "storage": storage,
    }
    return json.dumps({"gpulab_os_image": value})


def fixture(name: str) -> dict:
    data = load_fixture(name)
    data.pop("_path")
    return data


def failure(out: dict) -> dict:
    """The one failed task's record: it must be preflight's."""
    failed = [r for r in out["results"] if r["status"] == "failed"]
    assert out["rc"] == 2 and len(failed) == 1, out["stdout"][-3000:]
    assert failed[0]["action"] == "gpulab.homelab.preflight", failed[0]["task"]
    return failed[0]["result"]


def nothing_past_preflight(out: dict, lab) -> None:
    """No task of a later stage ran (stage host's run on the node first of all) and PVE got no write."""
    later = [r["task"] for r in out["results"] if r["action"] != "gpulab.homelab.preflight"]
    assert later == [], later
    assert lab.writes() == []


def test_a_rebuilt_current_folder_stops_the_run_in_preflight(tmp_path):
    with playbook_lab(tmp_path) as lab:
        pinned = image(CURRENT, PINNED)
        # as pinned: the folder lists this checksum, preflight passes
        out = play(lab.state, "-e", pinned, playbooks=PREFLIGHT)
        assert out["rc"] == 0, out["stdout"][-3000:]
        # Canonical rebuilds current/: the same URL now serves another file, and its SHA256SUMS says so
        publish(
            lab.state,
            CURRENT,
            {"size": 614465536, "virtual_size": 3758096384, "format": "qcow2", "sha256": REBUILT},
        )
        out = play(lab.state, "-e", pinned, playbooks=SITE)
        result = failure(out)
        nothing_past_preflight(out, lab)
        (problem,) = result["problems"]
        assert problem.startswith(f"all: gpulab_os_image.checksum='{PINNED}': ")
        assert f"{CURRENT_SUMS} lists {REBUILT} for noble-server-cloudimg-amd64.img now" in problem
        assert f"the file at {CURRENT} was rebuilt" in problem
        assert f"Fix: set gpulab_os_image.checksum: {REBUILT}" in problem

        # what the run met before: the node downloads the rebuilt file and PVE refuses it after the transfer
        out = play(lab.state, "-e", pinned, "-e", "gpulab_download_check=false")
        assert out["rc"] == 2
        assert f"checksum mismatch: got '{REBUILT}' != expect '{PINNED}'" in out["stdout"]


def test_a_point_release_gone_from_releases_stops_the_run_in_preflight(tmp_path):
    gone = "https://releases.ubuntu.com/24.04.3/ubuntu-24.04.3-live-server-amd64.iso"
    iso = {
        "url": gone,
        "filename": "ubuntu-24.04.3-live-server-amd64.iso",
        "checksum": "c3514bf0056180d09376462a7a1b4f213c1d6e8ea67fae5c25099c6fd3d8274b",
        "checksum_algorithm": "sha256",
        "storage": "local",
    }
    with playbook_lab(tmp_path) as lab:
        args = [
            "-e",
            json.dumps({"gpulab_os_iso": iso}),
            "-e",
            "vm_os_install=iso",
            "-e",
            "vm_sudo_nopasswd=true",
        ]
        out = play(lab.state, *args, playbooks=SITE)
        result = failure(out)
        nothing_past_preflight(out, lab)
        (problem,) = result["problems"]
        assert problem.startswith(f"all: gpulab_os_iso.url='{gone}': the URL answers HTTP 404")
        old = "https://old-releases.ubuntu.com/releases/24.04.3/ubuntu-24.04.3-live-server-amd64.iso"
        assert f"set gpulab_os_iso.url: {old}" in problem

        # the file already on the node's storage is not downloaded again: nothing to check, preflight passes
        client = lab.client()
        upid = client.post(
            "nodes/pve/storage/local/download-url",
            url="https://releases.ubuntu.com/24.04/ubuntu-24.04.3-live-server-amd64.iso",
            content="iso",
            filename="ubuntu-24.04.3-live-server-amd64.iso",
        )
        client.wait_task("pve", upid, 30)
        out = play(lab.state, *args, playbooks=PREFLIGHT)
        assert out["rc"] == 0, out["stdout"][-3000:]


def test_a_pve8_local_without_import_or_snippets_is_refused_in_preflight(tmp_path):
    with playbook_lab(tmp_path, fixture=fixture("pve8-storage")) as lab:
        out = play(lab.state, "-e", "gpulab_guest_agent_snippet=true", playbooks=SITE)
        result = failure(out)
        nothing_past_preflight(out, lab)
        assert result["problems"] == [
            "all: gpulab_os_image.storage='local': storage 'local' of node pve holds content iso,vztmpl,backup "
            "but not import, and PVE refuses it (storage 'local' is not configured for content-type 'import'). "
            "Fix: run on the node `pvesm set local --content iso,vztmpl,backup,import`, or set "
            "gpulab_os_image.storage to a storage of node pve that holds content import.",
            "all: gpulab_snippet_storage='local': storage 'local' of node pve holds content iso,vztmpl,backup but "
            "not snippets, and PVE refuses it (storage 'local' is not configured for content-type 'snippets'). "
            "Fix: run on the node `pvesm set local --content iso,vztmpl,backup,snippets`, or set "
            "gpulab_snippet_storage to a storage of node pve that holds content snippets.",
        ]


def test_a_btrfs_node_is_refused_in_preflight_and_passes_with_local_btrfs(tmp_path):
    with playbook_lab(tmp_path, fixture=fixture("btrfs")) as lab:
        out = play(lab.state, playbooks=SITE)
        result = failure(out)
        nothing_past_preflight(out, lab)
        problems = result["problems"]
        assert problems[0] == (
            "vm-1: vm_storage='local-zfs': node pve has no storage 'local-zfs' (it has local, local-btrfs; a "
            "storage the API token may not audit is not listed either). Fix: set vm_storage to local-btrfs "
            "(what node pve has with content images)."
        )
        assert problems[1] == (
            "all: gpulab_os_image.storage='local': storage 'local' of node pve is disabled, and PVE refuses it "
            "(storage 'local' is disabled). Fix: set gpulab_os_image.storage to local-btrfs (what node pve has "
            "with content import), or enable it on the node: `pvesm set local --disable 0`."
        )

        # the variables pointed at local-btrfs (and the inventory's description of the node with it)
        fixed = [
            "-e", image("https://cloud-images.ubuntu.com/releases/noble/release-20260926/"
                        "ubuntu-24.04-server-cloudimg-amd64.img",
                        "6a81c37564db9b1ee84e141922625e1d7c5b389b99bb3c572e0243607d5bb4d2", "local-btrfs"),
            "-e", "vm_storage=local-btrfs",
            "-e", json.dumps({"pve_storages": {"local-btrfs": {"type": "btrfs", "content": ["images", "import", "iso"],
                                                             "size_gb": 1700}}}),
        ]  # fmt: skip
        out = play(lab.state, *fixed, playbooks=PREFLIGHT)
        assert out["rc"] == 0, out["stdout"][-3000:]
        assert lab.writes() == []
        # the guest-agent snippet wants `snippets` there too, which the BTRFS installer does not give
        out = play(lab.state, *fixed, "-e", "gpulab_guest_agent_snippet=true", "-e", "gpulab_snippet_storage=local-btrfs",
                   playbooks=PREFLIGHT)  # fmt: skip
        (problem,) = failure(out)["problems"]
        assert "`pvesm set local-btrfs --content iso,vztmpl,backup,images,rootdir,import,snippets`" in problem


def test_an_engine_asking_all_cores_of_a_shared_card_stops_site_yml_in_preflight(tmp_path):
    """Stage workloads' core rule (HAMi's ExclusiveDeviceAllocateConflict) used to be met only after the VMs, the
    router, the guests and k3s had changed: preflight refuses it first, through the stage's own plan."""
    ollama = {"name": "ollama", "image": "ollama/ollama:0.12.6", "node": "vm-gpu", "gpus": [0]}
    ollama.update(gpu_memory_percent=40, gpu_cores=100)
    with playbook_lab(tmp_path) as lab:
        out = play(lab.state, "-e", json.dumps({"workloads_engines": [VLLM, ollama]}), playbooks=SITE)
        result = failure(out)
        nothing_past_preflight(out, lab)
        (problem,) = result["problems"]
        assert problem.startswith("all: workloads_engines=['vm-gpu card 0']: "), problem
        assert "ollama ask(s) all 100 cores" in problem and "ExclusiveDeviceAllocateConflict" in problem
        assert "an engine asking all 100 cores needs a card of its own" in problem
        # cores the two can share: preflight passes
        shared = {**ollama, "gpu_cores": 60}
        out = play(lab.state, "-e", json.dumps({"workloads_engines": [VLLM, shared]}), playbooks=PREFLIGHT)
        assert out["rc"] == 0, out["stdout"][-3000:]


@pytest.mark.root
def test_in_the_network_lab_a_pve8_node_stops_site_yml_before_stage_host():
    """The whole lab (`gpulab lab up --fixture pve8-storage`, the node a real host): site.yml on inventory/demo
    stops in preflight, so stage host never logs in to the node and PVE gets no write."""
    import ansible_runs
    from simlab import running_lab

    with running_lab("gtpve8", ("sshd",), lambda d: bool(d.get("node_host")), "with its node host",
                     fixture="pve8-storage") as (state, _desc):  # fmt: skip
        requests = state / "pve-requests.jsonl"
        before = len(requests.read_text().splitlines())  # `lab up` made the lab's own token with pveum
        env = ansible_runs.playbook_env(GPULAB_LAB_STATE=str(state))
        proc = ansible_runs.ansible_playbook("-i", "inventory/demo", "site.yml", env=env, timeout=300)
        assert proc.returncode == 2, proc.stdout[-3000:]
        assert (
            "gpulab_os_image.storage='local': storage 'local' of node pve holds content iso,vztmpl,backup"
            in (proc.stdout)
        )
        assert set(ansible_runs.recaps(proc)) == {"localhost"}, "no play past preflight reached a host"
        log = [json.loads(x) for x in requests.read_text().splitlines()[before:] if x.strip()]
        assert any(r["path"].endswith("/nodes/pve/storage") for r in log)
        assert [r for r in log if r["method"] != "GET"] == []
