"""gpu_facts: nvidia-smi parsing on real and constructed output, failure classification, diagnosis."""

import json
import os
import stat
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from .conftest import FIXTURES, run_ansible_module

SMI = FIXTURES / "nvidia-smi"


def sample(name):
    return (SMI / name).read_text()


def uuids_from_list(name, gpu_facts):
    return [g["uuid"] for g in gpu_facts.parse_list(sample(name))]


# --- the project's own query ------------------------------------------------------------------------------


def in_every_format(stem: str) -> list[str]:
    """The sample files of one query as nvidia-smi prints it: without units, with units, and with the header."""
    return [f"{stem}-{form}.csv" for form in ("nounits", "units", "header-units")]


def test_query_command_line_is_the_documented_one(gpu_facts):
    assert [*gpu_facts.QUERY_ARGS] == [
        "--query-gpu=uuid,name,memory.total,driver_version,pci.bus_id",
        "--format=csv,noheader,nounits",
    ]


@pytest.mark.parametrize("name", in_every_format("constructed-nvidia-smi-query-1gpu"))
def test_one_gpu_in_every_format_gives_the_same_card(gpu_facts, name):
    gpus = gpu_facts.parse_gpus(sample(name))
    assert len(gpus) == 1
    gpu = gpus[0]
    # The same card as `nvidia-smi -L` shows on that machine.
    assert [gpu["uuid"]] == uuids_from_list("constructed-nvidia-smi-L-1gpu-rtx3090.txt", gpu_facts)
    assert gpu["name"] == "NVIDIA GeForce RTX 3090"
    assert gpu["memory_total_mib"] == 24576
    assert gpu["driver_version"] == "580.173.02"
    assert gpu["pci_bus_id"] == "00000000:01:00.0"
    assert gpu["pci_address"] == "0000:01:00.0"
    assert gpu["index"] == 0


@pytest.mark.parametrize(
    "name", ["constructed-nvidia-smi-query-2gpu-nounits.csv", "constructed-nvidia-smi-query-2gpu-units.csv"]
)
def test_two_gpus_keep_index_order(gpu_facts, name):
    gpus = gpu_facts.parse_gpus(sample(name))
    assert [g["index"] for g in gpus] == [0, 1]
    assert len({g["uuid"] for g in gpus}) == 2
    assert [g["pci_address"] for g in gpus] == ["0000:01:00.0", "0000:02:00.0"]
    # Both UUIDs appear among the 4-GPU machine's `nvidia-smi -L` (the fixture borrowed them).
    assert {g["uuid"] for g in gpus} <= set(uuids_from_list("nvidia-smi-L-4gpu.txt", gpu_facts))


def test_header_with_other_fields_and_units_verbatim(gpu_facts):
    """Windows 591.86 transcript: header with ' [MiB]', values with ' MiB'."""
    fields = ("index", "name", "driver_version", "memory.total", "pci.bus_id")
    rows = gpu_facts.parse_query_csv(sample("nvidia-smi-query-header-units-1gpu.csv"), fields)
    assert len(rows) == 1
    assert rows[0]["name"] == "NVIDIA GeForce RTX 5060 Ti"
    assert gpu_facts._mib(rows[0]["memory.total"]) == 16311
    assert gpu_facts.pci_address(rows[0]["pci.bus_id"]) == "0000:06:00.0"


def test_five_gpus_with_header_verbatim(gpu_facts):
    fields = ("name", "pci.bus", "index", "uuid")
    rows = gpu_facts.parse_query_csv(sample("nvidia-smi-query-header-5gpu.csv"), fields)
    assert [r["index"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert all(gpu_facts.UUID_RE.match(r["uuid"]) for r in rows)
    # Old drivers print the name without the "NVIDIA " prefix.
    assert rows[1]["name"] == "GeForce GTX 1080 Ti"


def test_name_only_query_verbatim(gpu_facts):
    rows = gpu_facts.parse_query_csv(sample("nvidia-smi-query-name-header.csv"), ("name",))
    assert rows == [{"name": "NVIDIA GeForce GTX 1080 Ti"}]


def test_old_driver_nineteen_fields_and_na(gpu_facts):
    """Driver 440.64, noheader,nounits, 19 fields: N/A values and a name without the NVIDIA prefix."""
    text = sample("nvidia-smi-query-noheader-nounits-rtx2080.csv")
    fields = tuple(f"f{i}" for i in range(19))
    fields = (*fields[:6], "name", "uuid", *fields[8:])
    rows = gpu_facts.parse_query_csv(text, fields)
    assert rows[0]["name"] == "GeForce RTX 2080"
    assert gpu_facts.UUID_RE.match(rows[0]["uuid"])
    assert gpu_facts._na(rows[0]["f10"]) is None
    # ... and it is not the project's query: refused, not misread.
    with pytest.raises(gpu_facts.NvidiaSmiParseError):
        gpu_facts.parse_gpus(text)


@pytest.mark.parametrize(
    "name", ["nvidia-smi-table-v100-partial.txt", "nvidia-smi-L-1gpu.txt", "nvidia-smi-no-driver.txt"]
)
def test_other_outputs_are_refused_by_the_query_parser(gpu_facts, name):
    with pytest.raises(gpu_facts.NvidiaSmiParseError):
        gpu_facts.parse_gpus(sample(name))


def test_empty_output_is_no_gpu(gpu_facts):
    assert gpu_facts.parse_gpus("") == []
    assert gpu_facts.parse_gpus("\n") == []


def test_bad_uuid_and_memory_are_refused(gpu_facts):
    good = sample("constructed-nvidia-smi-query-1gpu-nounits.csv")
    with pytest.raises(gpu_facts.NvidiaSmiParseError, match="UUID"):
        gpu_facts.parse_gpus(good.replace("GPU-e1924eea", "MIG-e1924eea"))
    with pytest.raises(gpu_facts.NvidiaSmiParseError, match="memory"):
        gpu_facts.parse_gpus(good.replace(", 24576,", ", 24 GiB,"))
    na = gpu_facts.parse_gpus(good.replace(", 24576,", ", N/A,"))
    assert na[0]["memory_total_mib"] is None


_name_chars = st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="\n")


@given(
    name=st.text(_name_chars, min_size=1, max_size=40).map(str.strip).filter(bool),
    hexes=st.lists(st.text("0123456789abcdef", min_size=32, max_size=32), min_size=1, max_size=8),
    mem=st.integers(min_value=0, max_value=10**6),
)
def test_names_with_commas_round_trip(gpu_facts, name, hexes, mem):
    """Model names may contain ', ': uuid is taken from the left, the numeric fields from the right."""
    lines = []
    for i, h in enumerate(hexes):
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        lines.append(f"{uuid}, {name}, {mem}, 580.173.02, 00000000:{i + 1:02X}:00.0")
    gpus = gpu_facts.parse_gpus("\n".join(lines) + "\n")
    assert [g["name"] for g in gpus] == [name] * len(hexes)
    assert all(g["memory_total_mib"] == mem for g in gpus)
    assert [g["pci_address"] for g in gpus] == [f"0000:{i + 1:02x}:00.0" for i in range(len(hexes))]


# --- nvidia-smi -L -----------------------------------------------------------------------------------------


def test_list_one_four_and_mig(gpu_facts):
    assert len(gpu_facts.parse_list(sample("nvidia-smi-L-1gpu.txt"))) == 1
    four = gpu_facts.parse_list(sample("nvidia-smi-L-4gpu.txt"))
    assert [g["index"] for g in four] == [0, 1, 2, 3]
    mig = gpu_facts.parse_list(sample("nvidia-smi-L-a100-mig.txt"))
    assert [len(g["mig"]) for g in mig] == [4, 0, 0, 0]
    assert all(m["uuid"].startswith("MIG-") and m["profile"] == "1g.20gb" for m in mig[0]["mig"])
    with pytest.raises(gpu_facts.NvidiaSmiParseError):
        gpu_facts.parse_list(sample("nvidia-smi-no-driver.txt"))


# --- failures ----------------------------------------------------------------------------------------------


def _transcript(name):
    """Split a `# cmd` / output / `# echo $?` / code transcript into (output, exit code)."""
    lines = sample(name).splitlines()
    out = [ln for ln in lines if not ln.startswith("# ")]
    return "\n".join(out[:-1]) + "\n", int(out[-1])


@pytest.mark.parametrize(
    ("name", "rc", "error"),
    [
        ("nvidia-smi-no-driver.txt", 9, "driver_not_loaded"),
        ("nvidia-smi-no-devices.txt", 6, "no_devices"),
    ],
)
def test_failure_samples_are_classified_by_text_and_by_code(gpu_facts, name, rc, error):
    text = sample(name)
    assert gpu_facts.classify_failure(rc, text, "") == error
    assert gpu_facts.classify_failure(rc, "", text) == error  # whichever stream it uses
    assert gpu_facts.classify_failure(255, text, "") == error  # the text wins over an unexpected code
    assert gpu_facts.classify_failure(rc, "", "") == error  # and the code alone suffices


def test_version_mismatch_transcript(gpu_facts):
    out, rc = _transcript("nvidia-smi-driver-mismatch-exit18.txt")
    assert rc == 18
    assert gpu_facts.classify_failure(rc, out, "") == "version_mismatch"


def test_success_and_unknown(gpu_facts):
    assert gpu_facts.classify_failure(0, sample("constructed-nvidia-smi-query-1gpu-nounits.csv"), "") is None
    assert gpu_facts.classify_failure(127, "", "") == "not_installed"
    assert gpu_facts.classify_failure(255, "", "something else") == "unknown"


# --- diagnosis from a fake guest root ----------------------------------------------------------------------


def make_guest(root, *, gpu=True, driver=None, nouveau=False, nvidia=False, efi=None):
    dev = root / "sys/bus/pci/devices"
    dev.mkdir(parents=True)
    functions = [("0000:00:01.0", "0x8086", "0x060000", "0x29c0")]
    if gpu:
        functions += [
            ("0000:01:00.0", "0x10de", "0x030000", "0x2204"),
            ("0000:01:00.1", "0x10de", "0x040300", "0x1aef"),
        ]
    for addr, vendor, cls, device in functions:
        d = dev / addr
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
        (d / "device").write_text(device + "\n")
        if driver and vendor == "0x10de" and cls.startswith("0x03"):
            drv = root / "sys/bus/pci/drivers" / driver
            drv.mkdir(parents=True, exist_ok=True)
            (d / "driver").symlink_to(drv)
    (root / "proc").mkdir()
    mods = ["snd_hda_intel 61440 0 - Live 0x0"]
    if nouveau:
        mods.append("nouveau 3096576 0 - Live 0x0")
    if nvidia:
        mods.append("nvidia 14376960 0 - Live 0x0")
    (root / "proc/modules").write_text("\n".join(mods) + "\n")
    if efi is not None:
        var = root / "sys/firmware/efi/efivars"
        var.mkdir(parents=True)
        (var / "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c").write_bytes(
            b"\x06\x00\x00\x00" + bytes([efi])
        )
    return str(root)


def test_diagnosis_no_passthrough(gpu_facts, tmp_path):
    d = gpu_facts.diagnose("driver_not_loaded", 9, "", "", make_guest(tmp_path, gpu=False))
    assert d["pci_devices"] == []
    assert d["secure_boot"] == "not_efi"
    assert "not passed through" in d["causes"][0]


def test_diagnosis_nouveau_and_secure_boot(gpu_facts, tmp_path):
    root = make_guest(tmp_path, driver="nouveau", nouveau=True, efi=1)
    d = gpu_facts.diagnose("driver_not_loaded", 9, "", "", root)
    assert [p["address"] for p in d["pci_devices"]] == ["0000:01:00.0", "0000:01:00.1"]
    assert d["pci_devices"][0]["driver"] == "nouveau" and d["pci_devices"][0]["display"]
    assert not d["pci_devices"][1]["display"]
    assert d["modules"] == {"nouveau": True, "nvidia": False}
    assert d["secure_boot"] == "enabled"
    text = " ".join(d["causes"])
    assert "nouveau: LOADED" in text and "Secure Boot: ENABLED" in text and "driver=nouveau" in text


def test_diagnosis_all_clear_secure_boot_off(gpu_facts, tmp_path):
    root = make_guest(tmp_path, driver="nvidia", nvidia=True, efi=0)
    d = gpu_facts.diagnose("version_mismatch", 18, "", "", root)
    assert d["secure_boot"] == "disabled"
    text = " ".join(d["causes"])
    assert "PCI passthrough: OK" in text and "nouveau: not loaded" in text and "reboot the guest" in text


# --- recorded on a real H100 (README: recorded-h100-*) ------------------------------------------------------

H100_UUID = "GPU-01485eb9-bbd8-6499-de5a-36a7a2d3bc1e"


@pytest.mark.parametrize("name", in_every_format("recorded-h100-query"))
def test_real_h100_in_every_format_gives_the_same_card(gpu_facts, name):
    gpus = gpu_facts.parse_gpus(sample(name))
    assert uuids_from_list("recorded-h100-L.txt", gpu_facts) == [H100_UUID]
    assert gpus == [
        {
            "index": 0,
            "uuid": H100_UUID,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_mib": 81559,
            "driver_version": "580.159.04",
            "pci_bus_id": "00000000:00:06.0",
            "pci_address": "0000:00:06.0",
        }
    ]


def test_real_h100_parsed_here_as_the_module_reported_it_there(gpu_facts):
    """The module's result on the H100 itself equals what this checkout's parser makes of the recorded output."""
    there = json.loads(sample("recorded-h100-gpu-facts-result.json"))
    here = gpu_facts.parse_gpus(sample("recorded-h100-query-nounits.csv"))
    assert there["gpus"] == here
    assert there["uuids"] == [H100_UUID] and there["error"] is None
    assert there["container_toolkit"]["runtime"] is None  # no toolkit on that machine


def real_h100_guest(root):
    """A guest root with the H100's sysfs attributes and /proc/modules as recorded."""
    attrs = dict(line.split("=", 1) for line in sample("recorded-h100-sysfs.txt").splitlines())
    dev = root / "sys/bus/pci/devices" / attrs["dev"]
    dev.mkdir(parents=True)
    for key in ("vendor", "device", "class"):
        (dev / key).write_text(attrs[key] + "\n")
    drv = root / "sys/bus/pci/drivers" / attrs["driver"]
    drv.mkdir(parents=True)
    (dev / "driver").symlink_to(drv)
    (root / "proc").mkdir()
    (root / "proc/modules").write_text(sample("recorded-h100-proc-modules.txt"))
    return str(root)


def test_diagnosis_of_a_real_3d_controller(gpu_facts, tmp_path):
    """A data-centre card is PCI class 0x0302 (3D controller): it counts as the passed-through card."""
    d = gpu_facts.diagnose(None, 0, "", "", real_h100_guest(tmp_path))
    assert d["pci_devices"] == [
        {
            "address": "0000:00:06.0",
            "device": "0x2330",
            "class": "0x030200",
            "display": True,
            "driver": "nvidia",
        }
    ]
    assert d["modules"] == {"nouveau": False, "nvidia": True}
    text = " ".join(d["causes"])
    assert "PCI passthrough: OK, the guest sees 0000:00:06.0 [0x2330] driver=nvidia" in text
    assert "nvidia module: loaded, bound to the card." in text


# --- the module as Ansible runs it -------------------------------------------------------------------------


def fake_smi(tmp_path, output, rc=0):
    out = tmp_path / "out.txt"
    out.write_text(output)
    script = tmp_path / "nvidia-smi"
    args_log = tmp_path / "args.txt"
    script.write_text(f'#!/bin/sh\necho "$@" > {args_log}\ncat {out}\nexit {rc}\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script), args_log


def test_module_reports_the_card_and_sets_facts(tmp_path):
    smi, args_log = fake_smi(tmp_path, sample("constructed-nvidia-smi-query-2gpu-nounits.csv"))
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi, "min_gpus": 2})
    assert not result.get("failed"), result
    assert result["changed"] is False
    assert result["gpu_count"] == 2
    assert result["uuids"] == [g["uuid"] for g in result["gpus"]]
    assert result["ansible_facts"]["gpulab_gpus"] == result["gpus"]
    assert result["driver_version"] == "580.173.02"
    assert args_log.read_text().split() == [
        "--query-gpu=uuid,name,memory.total,driver_version,pci.bus_id",
        "--format=csv,noheader,nounits",
    ]


def test_module_runs_in_check_mode(tmp_path):
    smi, _ = fake_smi(tmp_path, sample("constructed-nvidia-smi-query-1gpu-nounits.csv"))
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi}, check_mode=True)
    assert result["gpu_count"] == 1 and not result.get("failed")


def test_module_fails_with_causes_when_driver_missing(tmp_path):
    smi, _ = fake_smi(tmp_path, sample("nvidia-smi-no-driver.txt"), rc=9)
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi})
    assert result["failed"] is True
    assert result["error"] == "driver_not_loaded"
    for cause in ("PCI passthrough", "nouveau", "Secure Boot"):
        assert cause in result["msg"]
    assert result["diagnosis"]["nvidia_smi"]["rc"] == 9


def test_module_fails_when_too_few_cards(tmp_path):
    smi, _ = fake_smi(tmp_path, sample("constructed-nvidia-smi-query-1gpu-nounits.csv"))
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi, "min_gpus": 2})
    assert result["failed"] is True and result["gpu_count"] == 1
    assert "found 1 GPU(s), 2 wanted" in result["msg"]


def test_module_probe_mode_never_fails(tmp_path):
    missing = str(tmp_path / "no-such-nvidia-smi")
    result = run_ansible_module("gpu_facts", {"nvidia_smi": missing, "min_gpus": 0})
    assert not result.get("failed")
    assert result["error"] == "not_installed" and result["gpus"] == []
    assert "diagnosis" in result


def test_module_reports_unparseable_output(tmp_path):
    smi, _ = fake_smi(tmp_path, sample("nvidia-smi-table-v100-partial.txt"))
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi})
    assert result["failed"] is True and result["error"] == "parse_error"


def test_module_finds_nvidia_smi_on_path(tmp_path):
    _smi, _ = fake_smi(tmp_path, sample("constructed-nvidia-smi-query-1gpu-units.csv"))
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    result = run_ansible_module("gpu_facts", {}, env=env)
    assert result["gpu_count"] == 1, result


def test_module_reads_the_labs_nvidia_smi_stand_in(tmp_path):
    """The lab's nvidia-smi stand-in (labsim.net.package_archive) answers the module's query in a form it parses."""
    repo = pytest.importorskip(
        "labsim.net.package_archive", reason="the lab's package archive is not in this tree"
    )
    loaded, gpus_json = tmp_path / "nvidia-loaded", tmp_path / "gpus.json"
    script = repo.NVIDIA_SMI.replace(repo.NVIDIA_LOADED, str(loaded)).replace(
        "/etc/gpulab-sim/gpus.json", str(gpus_json)
    )
    script = script.replace("/var/log/gpulab-standins.log", str(tmp_path / "standins.log"))
    script = script.replace('os.makedirs("/var/log", exist_ok=True)', "pass")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(script.replace("#!/usr/bin/python3", f"#!{sys.executable}", 1))
    smi.chmod(0o755)

    before = run_ansible_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert before["failed"] and before["error"] == "driver_not_loaded"

    loaded.write_text("")
    card = {
        "uuid": "GPU-e1924eea-b9bb-d537-39f2-b345087fa145",
        "name": "NVIDIA GeForce RTX 3090",
        "memory_mib": 24576,
        "pci_bus_id": "00000000:01:00.0",
    }
    gpus_json.write_text(json.dumps([card]))
    after = run_ansible_module("gpu_facts", {"nvidia_smi": str(smi)})
    assert not after.get("failed"), after
    assert after["uuids"] == [card["uuid"]] and after["gpus"][0]["memory_total_mib"] == 24576
    assert after["driver_version"] == repo.DRIVER_VERSION


def test_driver_warnings_among_the_rows_are_skipped(gpu_facts, tmp_path):
    rows = sample("constructed-nvidia-smi-query-2gpu-nounits.csv").splitlines()
    text = "\n".join([rows[0], "WARNING: infoROM is corrupted at gpu 0000:02:00.0", rows[1]]) + "\n"
    assert [g["index"] for g in gpu_facts.parse_gpus(text)] == [0, 1]
    smi, _ = fake_smi(tmp_path, text)
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi})
    assert result["gpu_count"] == 2 and "infoROM" in json.dumps(result.get("warnings", []))


def test_module_reports_the_kernel_and_the_container_toolkit_in_the_same_call(tmp_path):
    """What the driver's headers, its Secure Boot gate and k3s's nvidia runtime depend on comes with the GPUs
    (one call per guest)."""
    smi, _ = fake_smi(tmp_path, sample("constructed-nvidia-smi-query-1gpu-nounits.csv"))
    runtime = tmp_path / "nvidia-container-runtime"
    bare = {**os.environ, "PATH": "/usr/bin:/bin"}
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi, "container_runtime": str(runtime)}, env=bare)
    assert result["kernel"] == os.uname().release
    assert result["mokutil"] is None
    assert result["container_toolkit"] == {
        "runtime": None,
        "ctk_version": None,
        "ctk_error": "nvidia-ctk: command not found",
    }
    assert result["ansible_facts"]["gpulab_container_toolkit"] == result["container_toolkit"]

    runtime.write_text("#!/bin/sh\n")
    runtime.chmod(0o755)
    ctk = tmp_path / "bin" / "nvidia-ctk"
    ctk.parent.mkdir()
    ctk.write_text(
        '#!/bin/sh\n[ "$1" = --version ] || exit 3\necho "NVIDIA Container Toolkit CLI version 1.18.1"\necho "commit: x"\n'
    )
    ctk.chmod(0o755)
    mokutil = ctk.parent / "mokutil"
    mokutil.write_text('#!/bin/sh\n[ "$1" = --sb-state ] || exit 3\necho "SecureBoot disabled"\n')
    mokutil.chmod(0o755)
    env = {**bare, "PATH": f"{ctk.parent}:/usr/bin:/bin"}
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi, "container_runtime": str(runtime)}, env=env)
    assert result["mokutil"] == {"rc": 0, "stdout": "SecureBoot disabled\n", "stderr": ""}
    assert result["container_toolkit"] == {
        "runtime": str(runtime),
        "ctk_version": "NVIDIA Container Toolkit CLI version 1.18.1",
        "ctk_error": None,
    }

    ctk.write_text("#!/bin/sh\necho 'libnvidia-container.so.1: cannot open' >&2\nexit 1\n")
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi, "container_runtime": str(runtime)}, env=env)
    assert result["container_toolkit"]["ctk_version"] is None
    assert (
        result["container_toolkit"]["ctk_error"]
        == "nvidia-ctk --version: rc=1 libnvidia-container.so.1: cannot open"
    )


# --- the running kernel's series (issue 43: HWE guests) ----------------------------------------------------

# dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\t${Depends}\n' 'linux-image-*' on a noble guest that runs the
# HWE kernel and still has the GA one (constructed from the packages' Depends as Ubuntu's metapackages have them)
DPKG_HWE = (
    "linux-image-6.8.0-90-generic\tii \tlinux-base (>= 4.5ubuntu1~16.04.1), linux-modules-6.8.0-90-generic\n"
    "linux-image-6.17.0-14-generic\tii \tlinux-base (>= 4.5ubuntu1~16.04.1), linux-modules-6.17.0-14-generic\n"
    "linux-image-generic\tii \tlinux-image-6.8.0-90-generic, linux-firmware, intel-microcode, amd64-microcode\n"
    "linux-image-generic-hwe-24.04\tii \tlinux-image-6.17.0-14-generic, linux-firmware, intel-microcode\n"
    "linux-image-virtual\tun \t\n"
)


def test_the_running_kernels_series_is_its_installed_metapackages(gpu_facts):
    metas = gpu_facts.parse_kernel_metas(DPKG_HWE)
    assert metas == {
        "linux-image-generic": "6.8.0-90-generic",
        "linux-image-generic-hwe-24.04": "6.17.0-14-generic",
    }
    assert gpu_facts.kernel_series("6.17.0-14-generic", metas) == (
        "generic-hwe-24.04",
        "linux-image-generic-hwe-24.04",
    )
    assert gpu_facts.kernel_series("6.8.0-90-generic", metas) == ("generic", "linux-image-generic")
    # the HWE meta upgraded to the next ABI, the guest not rebooted yet: the same version and flavour
    assert gpu_facts.kernel_series("6.17.0-12-generic", metas)[0] == "generic-hwe-24.04"
    # linux-image-virtual boots the generic kernel (ubuntu-drivers maps it so)
    assert (
        gpu_facts.kernel_series("6.8.0-90-generic", {"linux-image-virtual": "6.8.0-90-generic"})[0]
        == "generic"
    )
    # a kernel no metapackage depends on (built by hand, or another flavour): unknown
    assert gpu_facts.kernel_series("6.18.1-custom", metas) == (None, None)
    assert (
        gpu_facts.kernel_series("6.8.0-1020-kvm", {**metas, "linux-image-kvm": "6.8.0-1020-kvm"})[0] == "kvm"
    )


def test_module_reports_the_series_and_apts_signed_modules_for_it(tmp_path):
    """The series from dpkg-query, and apt-cache policy's Candidate of linux-modules-nvidia-<driver>-<series>."""
    smi, _ = fake_smi(tmp_path, sample("constructed-nvidia-smi-query-1gpu-nounits.csv"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    release = os.uname().release
    (bin_dir / "dpkg-query").write_text(
        f"#!/bin/sh\nprintf 'linux-image-generic-hwe-24.04\\tii \\tlinux-image-{release}, linux-firmware\\n'\n"
    )
    (bin_dir / "apt-cache").write_text(
        '#!/bin/sh\n[ "$1" = policy ] || exit 3\necho "$2:"\necho "  Installed: (none)"\n'
        'case "$2" in *-generic-hwe-24.04) echo "  Candidate: 580.173.02-0ubuntu0.24.04.1";; '
        '*) echo "  Candidate: (none)";; esac\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    result = run_ansible_module("gpu_facts", {"nvidia_smi": smi, "signed_modules": "580-server"}, env=env)
    assert result["kernel_series"]["series"] == "generic-hwe-24.04"
    assert result["signed_modules"] == {
        "package": "linux-modules-nvidia-580-server-generic-hwe-24.04",
        "candidate": "580.173.02-0ubuntu0.24.04.1",
    }
    result = run_ansible_module(
        "gpu_facts",
        {"nvidia_smi": smi, "signed_modules": "580-server", "kernel_series": "kvm"},
        env=env,
    )
    assert result["signed_modules"] == {"package": "linux-modules-nvidia-580-server-kvm", "candidate": None}
    assert run_ansible_module("gpu_facts", {"nvidia_smi": smi}, env=env)["signed_modules"] is None
