"""The lab's nvidia-smi stand-in (labsim.net.package_archive.NVIDIA_SMI) against nvidia-smi's own output: one test
per behaviour listed in library/labsim/UPSTREAM.md (## nvidia-smi), named after its id. The samples are the
verbatim and constructed outputs of tests/unit/guests/fixtures/nvidia-smi (provenance in its README)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labsim.net import package_archive

SAMPLES = Path(__file__).resolve().parents[1] / "guests" / "fixtures" / "nvidia-smi"
CARDS = [
    {"uuid": "GPU-e1924eea-b9bb-d537-39f2-b345087fa145", "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576,
     "pci_bus_id": "00000000:01:00.0"},
    {"uuid": "GPU-899c71bf-27be-b6a0-ae8f-d8afe5ba0f85", "name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576,
     "pci_bus_id": "00000000:02:00.0"},
]  # fmt: skip
QUERY = "--query-gpu=uuid,name,memory.total,driver_version,pci.bus_id"


def sample(name):
    return (SAMPLES / name).read_text()


@pytest.fixture
def smi(tmp_path):
    """run(*args, cards=..., loaded=True): the stand-in's (rc, stdout) with those cards passed through."""
    loaded, gpus = tmp_path / "nvidia-loaded", tmp_path / "gpus.json"
    script = package_archive.NVIDIA_SMI.replace(package_archive.NVIDIA_LOADED, str(loaded))
    script = script.replace("/etc/gpulab-sim/gpus.json", str(gpus))
    script = script.replace("/var/log/gpulab-standins.log", str(tmp_path / "standins.log"))
    script = script.replace('os.makedirs("/var/log", exist_ok=True)', "pass")
    path = tmp_path / "nvidia-smi"
    path.write_text(script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
    path.chmod(0o755)

    def run(*args, cards=CARDS[:1], is_loaded=True, module=""):
        gpus.write_text(json.dumps(cards))
        if is_loaded:
            loaded.write_text(module)
        else:
            loaded.unlink(missing_ok=True)
        out = subprocess.run([str(path), *args], capture_output=True, text=True)
        return out.returncode, out.stdout

    return run


def test_nvidia_smi_query_gpu_csv(smi):
    # the header names each field, a unit in brackets after the ones that have one, fields joined by ", "
    rc, out = smi("--query-gpu=index,name,driver_version,memory.total,pci.bus_id", "--format=csv")
    verbatim_header = sample("nvidia-smi-query-header-units-1gpu.csv").splitlines()[0]
    assert rc == 0 and out.splitlines()[0] == verbatim_header
    assert out.splitlines()[
        1
    ] == f"0, NVIDIA GeForce RTX 3090, {package_archive.DRIVER_VERSION}, 24576 MiB, " + ("00000000:01:00.0")
    rc, out = smi(QUERY, "--format=csv")
    assert out == sample("constructed-nvidia-smi-query-1gpu-header-units.csv")


def test_nvidia_smi_query_gpu_noheader(smi):
    rc, out = smi(QUERY, "--format=csv,noheader", cards=CARDS)
    assert rc == 0 and out == sample("constructed-nvidia-smi-query-2gpu-units.csv")


def test_nvidia_smi_query_gpu_nounits(smi):
    # nounits drops the unit from the values only; the separator stays ", " (the verbatim 19-field sample)
    rc, out = smi(QUERY, "--format=csv,noheader,nounits", cards=CARDS)
    assert rc == 0 and out == sample("constructed-nvidia-smi-query-2gpu-nounits.csv")
    verbatim = sample("nvidia-smi-query-noheader-nounits-rtx2080.csv").strip().split(", ")
    assert len(verbatim) == 19 and "7979" in verbatim  # memory without " MiB", the same separator
    assert ", " in out and " MiB" not in out


def test_nvidia_smi_list_gpus(smi):
    rc, out = smi("-L", cards=CARDS)
    assert rc == 0 and out.splitlines()[0] == sample("constructed-nvidia-smi-L-1gpu-rtx3090.txt").strip()
    # one line a card in index order, the shape of the verbatim four-card listing
    shape = [line.split(" (UUID: ")[0].split(":")[0] for line in sample("nvidia-smi-L-4gpu.txt").splitlines()]
    assert [line.split(" (UUID: ")[0].split(":")[0] for line in out.splitlines()] == shape[:2]
    assert smi("--list-gpus", cards=CARDS) == (rc, out)


def test_nvidia_smi_no_driver(smi):
    rc, out = smi(QUERY, "--format=csv", is_loaded=False)
    assert (rc, out) == (9, sample("nvidia-smi-no-driver.txt"))


def test_nvidia_smi_no_devices(smi):
    rc, out = smi("-L", cards=[])
    assert (rc, out) == (6, sample("nvidia-smi-no-devices.txt"))


def test_nvidia_smi_driver_mismatch(smi):
    """The module that loaded at boot is another driver's (the packages changed branch, no reboot since)."""
    rc, out = smi("-L", module="proprietary signed 570.195.03\ninstalled by the lab's stand-in\n")
    sample_lines = sample("nvidia-smi-driver-mismatch-exit18.txt").splitlines()
    assert rc == int(sample_lines[-1]) == 18
    ours = package_archive.DRIVER_VERSION.rsplit(".", 1)[0]
    assert out.splitlines() == [sample_lines[1], sample_lines[2].replace("535.161", ours)]
    # the same driver loaded: no complaint
    assert smi("-L", module=f"proprietary signed {package_archive.DRIVER_VERSION}\n")[0] == 0
