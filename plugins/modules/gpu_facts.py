#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Report the NVIDIA GPUs a guest's driver sees, parsed from nvidia-smi (standard library only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Report the NVIDIA GPUs that the guest's driver sees
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Runs C(nvidia-smi --query-gpu=uuid,name,memory.total,driver_version,pci.bus_id
    --format=csv,noheader,nounits) on the managed host and returns one entry per GPU, in GPU index order.
  - The UUIDs feed HAMi card pinning (C(nvidia.com/use-gpuuuid)) later on.
  - In the same call it reports what else a GPU guest's next steps decide on, so that they need no call of
    their own. That is the running kernel (RV(kernel), whose headers the driver's DKMS build needs), the
    Secure Boot state as C(mokutil --sb-state) reports it (RV(mokutil)), the signer of the installed nvidia
    module (RV(module_signer)), and the NVIDIA container toolkit
    (RV(container_toolkit), what k3s needs to add the nvidia runtime).
  - When fewer than O(min_gpus) cards are found, the module fails and lists the likely causes with what it
    found for each one, read from the guest itself. That is whether an NVIDIA display controller is on the
    guest's PCI bus (PCI passthrough) and which driver owns it, the Secure Boot state from the EFI
    variables, and whether C(nouveau) or C(nvidia) is loaded.
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes.facts
  - gpulab.homelab.reads
  - gpulab.homelab.attributes
options:
  nvidia_smi:
    description:
      - The C(nvidia-smi) program, as a name looked up on the PATH or as an absolute path.
    type: str
    default: nvidia-smi
  container_runtime:
    description: Where k3s looks for the NVIDIA container runtime (reported in RV(container_toolkit)).
    type: str
    default: /usr/bin/nvidia-container-runtime
  min_gpus:
    description:
      - Fail unless at least this many GPUs are reported.
      - With V(0) the module never fails on a missing driver or card; it reports RV(error) and
        RV(diagnosis) instead, which suits a probe taken before the driver is installed.
    type: int
    default: 1
  signed_modules:
    description:
      - The driver part of Canonical's signed module packages (C(580-server), C(580-server-open)); when set, the
        module looks up C(linux-modules-nvidia-<signed_modules>-<series>) for the series of the running kernel
        (RV(kernel_series)) in apt's cache and reports it in RV(signed_modules).
    type: str
    default: ""
  kernel_series:
    description:
      - The kernel series to use instead of the one read from the installed kernel packages (RV(kernel_series)).
    type: str
    default: ""
attributes:
  facts:
    support: full
notes:
  - The module never changes the host, so it always returns C(changed=false).
  - C(nvidia-smi) prints C(N/A) for values the card cannot report; such values come back as V(null).
"""

EXAMPLES = r"""
- name: Read the GPUs the driver sees
  gpulab.homelab.gpu_facts:
  register: gpu

- name: Show the card UUIDs
  ansible.builtin.debug:
    msg: "{{ gpu.uuids }}"

- name: Probe before the driver is installed (never fails)
  gpulab.homelab.gpu_facts:
    min_gpus: 0
  register: gpu_probe
"""

RETURN = r"""
gpus:
  description: One entry per GPU, in the order nvidia-smi lists them (GPU index order).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: Position in nvidia-smi's output (the GPU index).
      type: int
    uuid:
      description: GPU UUID, C(GPU-) followed by 8-4-4-4-12 hexadecimal digits.
      type: str
      sample: GPU-e1924eea-b9bb-d537-39f2-b345087fa145
    name:
      description: Product name as the driver reports it.
      type: str
      sample: NVIDIA GeForce RTX 3090
    memory_total_mib:
      description: Total memory in MiB, V(null) when nvidia-smi prints N/A.
      type: int
      sample: 24576
    driver_version:
      description: Kernel driver version.
      type: str
      sample: 580.173.02
    pci_bus_id:
      description: PCI address as nvidia-smi prints it (8-digit domain, upper-case hexadecimal).
      type: str
      sample: "00000000:01:00.0"
    pci_address:
      description: The same address in sysfs form (4-digit domain, lower-case).
      type: str
      sample: "0000:01:00.0"
gpu_count:
  description: Number of GPUs found.
  returned: always
  type: int
  sample: 1
uuids:
  description: The GPU UUIDs in index order.
  returned: always
  type: list
  elements: str
driver_version:
  description: Driver version of the first GPU, V(null) when none was found.
  returned: always
  type: str
kernel:
  description: The release of the running kernel (C(/proc/sys/kernel/osrelease), what C(uname -r) prints).
  returned: always
  type: str
  sample: 6.8.0-87-generic
kernel_series:
  description:
    - The series of the running kernel as Ubuntu names its metapackages, read from dpkg. It is the installed
      C(linux-image-<series>) metapackage whose C(Depends) names C(linux-image-<running release>) (or, after an
      upgrade not yet booted, a kernel of the same version and flavour). C(virtual) counts as C(generic) and
      C(virtual-hwe-24.04) as C(generic-hwe-24.04), as ubuntu-drivers does, because they boot the same kernel.
    - Ubuntu's signed NVIDIA modules (C(linux-modules-nvidia-<driver>-<series>)) and the headers metapackage
      (C(linux-headers-<series>)) are named after it.
  returned: always
  type: dict
  contains:
    series:
      description: C(generic), C(generic-hwe-24.04), ...; V(null) when no installed metapackage runs this kernel.
      type: str
    meta:
      description: The C(linux-image-*) metapackage it was read from (V(null) with O(kernel_series) or none found).
      type: str
    candidates:
      description: Every installed C(linux-image-*) metapackage with the kernel it depends on.
      type: dict
signed_modules:
  description:
    - With O(signed_modules), Canonical's signed modules package for the running kernel's series and what apt
      has of it; V(null) otherwise.
  returned: always
  type: dict
  contains:
    package:
      description: C(linux-modules-nvidia-<driver>-<series>), V(null) when the series is unknown.
      type: str
    candidate:
      description: The version apt would install (C(apt-cache policy)'s Candidate), V(null) when apt has none.
      type: str
mokutil:
  description:
    - What C(mokutil --sb-state) answered (its exit code and output), V(null) when mokutil is not installed.
    - mokutil exits 1 on a BIOS boot ("EFI variables are not supported") and 255 without a SecureBoot variable.
  returned: always
  type: dict
  contains:
    rc:
      description: Exit code.
      type: int
    stdout:
      description: Output, e.g. C(SecureBoot enabled).
      type: str
    stderr:
      description: Error output.
      type: str
module_signer:
  description:
    - Who signed the installed C(nvidia) kernel module, as C(modinfo -F signer nvidia) prints it
      (C(Canonical Ltd. Kernel Module Signing) for Ubuntu's precompiled modules); V(null) without modinfo or
      without the module.
  returned: always
  type: str
container_toolkit:
  description: The NVIDIA container toolkit as this guest has it.
  returned: always
  type: dict
  contains:
    runtime:
      description: O(container_runtime) when it is an executable file there, else V(null).
      type: str
    ctk_version:
      description: The first line of C(nvidia-ctk --version), V(null) when it is missing or fails.
      type: str
      sample: NVIDIA Container Toolkit CLI version 1.18.1
    ctk_error:
      description: Why RV(container_toolkit.ctk_version) is V(null) (not installed, or its exit code and error output).
      type: str
error:
  description:
    - Why no GPU could be read, V(null) when nvidia-smi answered.
    - One of V(not_installed), V(driver_not_loaded), V(no_devices), V(version_mismatch), V(nvml_missing),
      V(parse_error), V(unknown).
  returned: always
  type: str
diagnosis:
  description: What the guest shows about each likely cause; set when fewer than the wanted GPUs were found.
  returned: when fewer GPUs than O(min_gpus) were found, or when nvidia-smi failed
  type: dict
  contains:
    nvidia_smi:
      description: Exit code and output of nvidia-smi.
      type: dict
    pci_devices:
      description: NVIDIA (vendor 10de) functions on the guest's PCI bus, with class and bound driver.
      type: list
      elements: dict
    secure_boot:
      description: V(enabled), V(disabled), V(not_efi) (BIOS boot) or V(unknown).
      type: str
    modules:
      description: Whether the nouveau and nvidia kernel modules are loaded.
      type: dict
    causes:
      description: One line per likely cause, each with what was found.
      type: list
      elements: str
ansible_facts:
  description: Facts set on the host.
  returned: always
  type: dict
  contains:
    gpulab_gpus:
      description: Same as RV(gpus).
      type: list
      elements: dict
    gpulab_container_toolkit:
      description: Same as RV(container_toolkit).
      type: dict
"""

# Ansible modules keep their imports below the documentation blocks.
import glob  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

# The exact query the project relies on; the order of QUERY_FIELDS is the column order.
QUERY_FIELDS = ("uuid", "name", "memory.total", "driver_version", "pci.bus_id")
QUERY_ARGS = ("--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits")

# Fields whose value may itself contain ", " (a model name can); every other field is comma-free.
FREE_TEXT_FIELDS = frozenset({"name"})

UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
BUS_ID_RE = re.compile(r"^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
DRIVER_RE = re.compile(r"^\d+\.\d+(\.\d+)?$")
HEADER_UNIT_RE = re.compile(r"\s*\[[^\]]*\]$")
LIST_GPU_RE = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-fA-F-]+)\)$")
LIST_MIG_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9a-fA-F-]+)\)$")

# EFI global variable GUID; the SecureBoot variable holds 4 attribute bytes then one value byte.
EFI_SECURE_BOOT = "sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
NVIDIA_VENDOR = "0x10de"

# nvidia-smi exit codes (man page RETURN VALUE) and messages, most specific first.
FAILURES = (
    ("version_mismatch", 18, "Driver/library version mismatch"),
    ("driver_not_loaded", 9, "couldn't communicate with the NVIDIA driver"),
    ("no_devices", 6, "No devices were found"),
    ("nvml_missing", 12, "NVML Shared Library Not Found"),
)


class NvidiaSmiParseError(ValueError):
    """nvidia-smi's output does not have the shape the query asks for."""


def _split_row(line, fields):
    """Split one CSV row of `nvidia-smi --format=csv` into len(fields) values.

    nvidia-smi separates values with ", " and quotes nothing, so a free-text field (the model name) may
    contain the separator: the fields left of it are taken from the left, the ones right of it from the right.
    """
    parts = line.split(", ")
    if len(parts) == len(fields):
        return parts
    free = [i for i, f in enumerate(fields) if f in FREE_TEXT_FIELDS]
    if len(parts) < len(fields) or len(free) != 1:
        raise NvidiaSmiParseError(f"expected {len(fields)} values ({', '.join(fields)}), got {len(parts)}")
    i = free[0]
    right = len(fields) - i - 1
    return [*parts[:i], ", ".join(parts[i : len(parts) - right]), *parts[len(parts) - right :]]


def _is_header(line, fields):
    names = [HEADER_UNIT_RE.sub("", p).strip() for p in line.split(", ")]
    return names == list(fields)


def parse_query_csv(text, fields=QUERY_FIELDS):
    """Parse `nvidia-smi --query-gpu=<fields> --format=csv[,noheader][,nounits]` into one dict per line.

    Values are strings as printed (units included when `nounits` was not given); an optional header line is
    checked against `fields` and skipped. Raises NvidiaSmiParseError on any line that does not fit.
    """
    rows = []
    # nvidia-smi may print driver warnings ("WARNING: infoROM is corrupted at gpu ...") among the rows.
    lines = [ln.rstrip("\r") for ln in text.splitlines() if ln.strip() and not ln.startswith("WARNING:")]
    for number, line in enumerate(lines, start=1):
        if number == 1 and _is_header(line, fields):
            continue
        try:
            values = _split_row(line.strip(), fields)
        except NvidiaSmiParseError as exc:
            raise NvidiaSmiParseError(f"line {number} {line!r}: {exc}") from None
        rows.append(dict(zip(fields, (v.strip() for v in values), strict=True)))
    return rows


def _na(value):
    return None if value in ("N/A", "[N/A]", "[Not Supported]", "") else value


def _mib(value):
    value = _na(value)
    if value is None:
        return None
    number = value[:-4] if value.endswith(" MiB") else value
    if not number.isdigit():
        raise NvidiaSmiParseError(f"memory.total {value!r} is not a number of MiB")
    return int(number)


def pci_address(bus_id):
    """nvidia-smi's `00000000:01:00.0` as the sysfs address `0000:01:00.0`."""
    m = BUS_ID_RE.match(bus_id or "")
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{dev.lower()}.{fn}"


def parse_gpus(text):
    """Parse the output of the project's query (QUERY_ARGS) into GPU dicts; see RETURN `gpus`."""
    gpus = []
    for index, row in enumerate(parse_query_csv(text)):
        uuid = row["uuid"]
        if not UUID_RE.match(uuid):
            raise NvidiaSmiParseError(f"GPU {index}: {uuid!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-...)")
        driver = _na(row["driver_version"])
        if driver is not None and not DRIVER_RE.match(driver):
            raise NvidiaSmiParseError(f"GPU {index}: driver_version {driver!r} is not a version")
        bus_id = _na(row["pci.bus_id"])
        if bus_id is not None and not BUS_ID_RE.match(bus_id):
            raise NvidiaSmiParseError(f"GPU {index}: pci.bus_id {bus_id!r} is not a PCI address")
        gpus.append(
            {
                "index": index,
                "uuid": uuid,
                "name": row["name"],
                "memory_total_mib": _mib(row["memory.total"]),
                "driver_version": driver,
                "pci_bus_id": bus_id,
                "pci_address": pci_address(bus_id),
            }
        )
    return gpus


def parse_list(text):
    """Parse `nvidia-smi -L`: one dict per GPU (index, name, uuid) with its MIG devices, if any."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = LIST_GPU_RE.match(line.rstrip())
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "mig": []})
            continue
        m = LIST_MIG_RE.match(line.rstrip())
        if m and gpus:
            gpus[-1]["mig"].append({"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)})
            continue
        raise NvidiaSmiParseError(f"unexpected line in nvidia-smi -L output: {line!r}")
    return gpus


def classify_failure(rc, out, err):
    """Name why nvidia-smi gave no GPU list: one of the RETURN `error` values, or None when it answered."""
    text = f"{out}\n{err}"
    if rc == 127 or "command not found" in text or "No such file or directory" in text:
        return "not_installed"
    for code, _exit_code, message in FAILURES:
        if message.lower() in text.lower():
            return code
    for code, exit_code, _message in FAILURES:
        if rc == exit_code:
            return code
    return None if rc == 0 else "unknown"


def _read(path, default=None):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return default


def pci_nvidia_devices(root="/"):
    """NVIDIA functions on the PCI bus, from sysfs: address, device id, class, bound driver."""
    devices = []
    for dev in sorted(glob.glob(os.path.join(root, "sys/bus/pci/devices/*"))):
        vendor = (_read(os.path.join(dev, "vendor"), b"") or b"").decode().strip()
        if vendor.lower() != NVIDIA_VENDOR:
            continue
        cls = (_read(os.path.join(dev, "class"), b"") or b"").decode().strip().lower()
        link = os.path.join(dev, "driver")
        driver = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
        devices.append(
            {
                "address": os.path.basename(dev),
                "device": (_read(os.path.join(dev, "device"), b"") or b"").decode().strip(),
                "class": cls,
                "display": cls.startswith("0x03"),
                "driver": driver,
            }
        )
    return devices


def secure_boot_state(root="/"):
    """`enabled`/`disabled` from the EFI SecureBoot variable, `not_efi` on a BIOS boot, else `unknown`."""
    if not os.path.isdir(os.path.join(root, "sys/firmware/efi")):
        return "not_efi"
    data = _read(os.path.join(root, EFI_SECURE_BOOT))
    if data is None or len(data) < 5:
        return "unknown"
    return "enabled" if data[4] == 1 else "disabled"


def loaded_modules(root="/"):
    """Names of the loaded kernel modules, from /proc/modules."""
    data = _read(os.path.join(root, "proc/modules"), b"") or b""
    return {line.split(" ", 1)[0] for line in data.decode(errors="replace").splitlines() if line}


def diagnose(error, rc, out, err, root="/"):
    """What the guest shows for each likely cause of a missing GPU; see RETURN `diagnosis`."""
    devices = pci_nvidia_devices(root)
    displays = [d for d in devices if d["display"]]
    secure_boot = secure_boot_state(root)
    modules = loaded_modules(root)
    mods = {"nouveau": "nouveau" in modules, "nvidia": "nvidia" in modules}
    causes = []
    if not displays:
        causes.append(
            "PCI passthrough: no NVIDIA display controller (vendor 10de, class 03xx) is on this guest's PCI bus, "
            "so the card is not passed through: check the VM's hostpciN entry and stop/start the VM (a reboot "
            "from inside the guest does not attach new devices)."
        )
    else:
        found = ", ".join(f"{d['address']} [{d['device']}] driver={d['driver'] or 'none'}" for d in displays)
        causes.append(f"PCI passthrough: OK, the guest sees {found}.")
    if mods["nouveau"]:
        causes.append(
            "nouveau: LOADED in the guest; it holds the card so nvidia cannot bind: blacklist nouveau "
            "(/etc/modprobe.d/, then update-initramfs -u) and reboot."
        )
    else:
        causes.append("nouveau: not loaded.")
    if secure_boot == "enabled":
        causes.append(
            "Secure Boot: ENABLED; an unsigned DKMS-built nvidia module is refused ('Key was rejected by "
            "service'): disable Secure Boot (PVE: efidisk0 with pre-enrolled-keys=0) or enrol the DKMS MOK key."
        )
    else:
        causes.append(f"Secure Boot: {secure_boot}.")
    if error == "version_mismatch":
        causes.append("Driver/library mismatch: the driver was upgraded without a reboot; reboot the guest.")
    elif error == "not_installed":
        causes.append(
            "nvidia-smi: not installed (the nvidia-utils package of the driver branch provides it)."
        )
    driver_bound = any(d["driver"] == "nvidia" for d in displays)
    causes.append(
        f"nvidia module: {'loaded' if mods['nvidia'] else 'NOT loaded'}"
        f"{', bound to the card' if driver_bound else ''}."
    )
    return {
        "nvidia_smi": {"rc": rc, "stdout": out, "stderr": err},
        "pci_devices": devices,
        "secure_boot": secure_boot,
        "modules": mods,
        "causes": causes,
    }


ARGUMENT_SPEC = {
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "container_runtime": {"type": "str", "default": "/usr/bin/nvidia-container-runtime"},
    "min_gpus": {"type": "int", "default": 1},
    "signed_modules": {"type": "str", "default": ""},
    "kernel_series": {"type": "str", "default": ""},
}

# An Ubuntu kernel release: version, ABI number, flavour (6.8.0-90-generic, 6.17.0-14-generic, 6.8.0-1020-kvm).
RELEASE_RE = re.compile(r"^(\d+\.\d+)\.\d+-\d+-([a-z0-9-]+)$")
# Metapackages that boot another series' kernel (ubuntu-drivers maps linux-image-virtual to generic).
SERIES_ALIASES = {"virtual": "generic", "virtual-hwe-24.04": "generic-hwe-24.04"}


def running_kernel(root="/"):
    """The running kernel's release: /proc/sys/kernel/osrelease (uname -r's value), else uname()."""
    data = _read(os.path.join(root, "proc/sys/kernel/osrelease"), b"") or b""
    return data.decode(errors="replace").strip() or os.uname().release


def parse_kernel_metas(text):
    """`dpkg-query -W -f '${Package}\t${db:Status-Abbrev}\t${Depends}\n' 'linux-image-*'` as
    {installed metapackage: the kernel release it depends on}: a linux-image-<series> whose Depends names a
    linux-image-<release> (or linux-image-unsigned-<release>); the kernel packages themselves are left out."""
    metas = {}
    for line in text.splitlines():
        name, _tab, rest = line.partition("\t")
        status, _tab, depends = rest.partition("\t")
        # a kernel's own package (linux-image-<release>: the release starts with its version) is no metapackage
        if not status.startswith("ii") or name.removeprefix("linux-image-")[:1].isdigit():
            continue
        for dep in depends.split(","):
            dep_name = dep.strip().split(" ", 1)[0].split(":", 1)[0]
            release = dep_name.removeprefix("linux-image-unsigned-").removeprefix("linux-image-")
            if dep_name.startswith("linux-image-") and release[:1].isdigit():
                metas[name] = release
                break
    return metas


def kernel_series(release, metas):
    """The series (metapackage name less linux-image-) whose kernel runs: the meta that depends on this very
    release, else one of the same version and flavour (its kernel upgraded, not yet booted); else None."""
    exact = sorted(m for m, r in metas.items() if r == release)
    running = RELEASE_RE.match(release)
    same = sorted(
        m
        for m, r in metas.items()
        if running and (m2 := RELEASE_RE.match(r)) and m2.groups() == running.groups()
    )
    picked = (exact or same or [None])[0]
    if picked is None:
        return None, None
    series = picked.removeprefix("linux-image-")
    return SERIES_ALIASES.get(series, series), picked


def read_kernel_series(module, release, override):
    """RETURN kernel_series: the override, else what dpkg says of the installed linux-image-* metapackages."""
    dpkg_query = module.get_bin_path("dpkg-query", required=False)
    metas = {}
    if dpkg_query:
        fmt = "${Package}\t${db:Status-Abbrev}\t${Depends}\n"
        rc, out, _err = module.run_command([dpkg_query, "-W", "-f", fmt, "linux-image-*"])
        metas = parse_kernel_metas(out) if rc in (0, 1) else {}
    if override:
        return {"series": override, "meta": None, "candidates": metas}
    series, meta = kernel_series(release, metas)
    return {"series": series, "meta": meta, "candidates": metas}


def apt_candidate(module, package):
    """The version `apt-cache policy PACKAGE` names as Candidate, None when apt has none."""
    apt_cache = module.get_bin_path("apt-cache", required=False)
    if not apt_cache:
        return None
    rc, out, _err = module.run_command([apt_cache, "policy", package])
    for line in out.splitlines() if rc == 0 else []:
        key, _colon, value = line.strip().partition(":")
        if key == "Candidate":
            return None if value.strip() in ("", "(none)") else value.strip()
    return None


def signed_modules_package(module, driver, series):
    """RETURN signed_modules: linux-modules-nvidia-<driver>-<series> and apt's candidate for it."""
    if not driver:
        return None
    if not series:
        return {"package": None, "candidate": None}
    package = f"linux-modules-nvidia-{driver}-{series}"
    return {"package": package, "candidate": apt_candidate(module, package)}


def mokutil_state(module):
    """`mokutil --sb-state` as it answered, or None without mokutil."""
    mokutil = module.get_bin_path("mokutil", required=False)
    if not mokutil:
        return None
    rc, out, err = module.run_command([mokutil, "--sb-state"])
    return {"rc": rc, "stdout": out, "stderr": err}


def module_signer(module):
    """`modinfo -F signer nvidia` (the installed module's signer), or None without modinfo or the module."""
    modinfo = module.get_bin_path("modinfo", required=False, opt_dirs=["/usr/sbin", "/sbin"])
    if not modinfo:
        return None
    rc, out, _err = module.run_command([modinfo, "-F", "signer", "nvidia"])
    return (out.strip() or None) if rc == 0 else None


def container_toolkit(module, runtime):
    """The NVIDIA container toolkit: the runtime where k3s looks for it, and what nvidia-ctk says it is."""
    found = {"runtime": runtime if os.path.isfile(runtime) and os.access(runtime, os.X_OK) else None}
    ctk = module.get_bin_path("nvidia-ctk", required=False)
    if not ctk:
        return {**found, "ctk_version": None, "ctk_error": "nvidia-ctk: command not found"}
    rc, out, err = module.run_command([ctk, "--version"])
    first = (out.strip().splitlines() or [""])[0]
    if rc != 0 or not first:
        return {
            **found,
            "ctk_version": None,
            "ctk_error": f"nvidia-ctk --version: rc={rc} {err.strip()}".strip(),
        }
    return {**found, "ctk_version": first, "ctk_error": None}


def run_module():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    smi = module.params["nvidia_smi"]
    min_gpus = module.params["min_gpus"]
    if min_gpus < 0:
        module.fail_json(msg=f"min_gpus must be 0 or more, not {min_gpus}")

    binary = smi if os.path.isabs(smi) else module.get_bin_path(smi, required=False)
    if binary and os.access(binary, os.X_OK):
        rc, out, err = module.run_command([binary, *QUERY_ARGS])
    else:
        rc, out, err = 127, "", f"{smi}: command not found"

    gpus, error = [], classify_failure(rc, out, err)
    if error is None:
        try:
            gpus = parse_gpus(out)
        except NvidiaSmiParseError as exc:
            error, err = "parse_error", f"{err}{exc}"
        if not gpus and error is None:
            error = "no_devices"

    for line in out.splitlines():
        if line.startswith("WARNING:"):
            module.warn(f"nvidia-smi: {line}")

    toolkit = container_toolkit(module, module.params["container_runtime"])
    release = running_kernel()
    series = read_kernel_series(module, release, module.params["kernel_series"])
    result = {
        "changed": False,
        "gpus": gpus,
        "gpu_count": len(gpus),
        "uuids": [g["uuid"] for g in gpus],
        "driver_version": gpus[0]["driver_version"] if gpus else None,
        "error": error,
        "kernel": release,
        "kernel_series": series,
        "signed_modules": signed_modules_package(module, module.params["signed_modules"], series["series"]),
        "mokutil": mokutil_state(module),
        "module_signer": module_signer(module),
        "container_toolkit": toolkit,
        "ansible_facts": {"gpulab_gpus": gpus, "gpulab_container_toolkit": toolkit},
    }
    if error is not None or len(gpus) < min_gpus:
        result["diagnosis"] = diagnose(error, rc, out, err)
    if len(gpus) < min_gpus:
        found = f"{len(gpus)} GPU(s)" + (f" ({error})" if error else "")
        module.fail_json(
            msg=(
                f"Reading the GPUs with '{smi} {' '.join(QUERY_ARGS)}' found {found}, {min_gpus} wanted. "
                "Likely causes, with what this guest shows: " + " | ".join(result["diagnosis"]["causes"])
            ),
            **result,
        )
    module.exit_json(**result)


def main():
    run_module()


if __name__ == "__main__":
    main()
