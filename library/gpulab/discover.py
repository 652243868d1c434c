"""`gpulab discover`: what a Proxmox VE node holds, read once, written as a new inventory folder.

Three parts, so that the middle one can be tested without a node:

- :func:`collect` runs the reads, one command at a time, through a ``run(command) -> (rc, stdout, stderr)``
  the caller gives (:mod:`gpulab.discover_ssh` gives one over SSH): a probe (is this Proxmox VE?), ``pvesh
  get PATH --output-format json`` for the node, its status, storages, network, VMs and their configs, the
  PCI devices and the PCI resource mappings, the guest agent's addresses of running VMs that have one, a
  walk of ``/sys/bus/pci/devices`` and ``/sys/kernel/iommu_groups`` (:data:`SYSFS_SCRIPT`) and
  ``ip -j route`` / ``ip -j -4 addr``. It returns :class:`Raw`: the outputs as read, nothing decided.
- :func:`analyse` turns :class:`Raw` into :class:`Found` (the node's facts, every NVIDIA GPU with all its
  functions, vendor:device, IOMMU group and boot_vga, the VMs in gpulab's own variables) or raises
  :class:`DiscoverError` with what it found and what to do: a host that is not Proxmox VE, one without an
  active IOMMU, one without an NVIDIA GPU.
- :func:`render` writes :class:`Found` as the files of an inventory folder in inventory/homelab's layout;
  :func:`write_new` creates the folder and refuses one that exists.

A value discover could not read, and one the user must decide (router kind and login, the addresses of VMs
that are off, the k3s roles of VMs it found, ...), is written as ``CHANGE-ME`` (:data:`PLACEHOLDER`) with a
comment above it saying what goes there. The lab definition refuses that value wherever it stands
(gpulab.labdef.checks.check_placeholders), so ``gpulab plan`` names each one until it is filled. Secrets go
to ``group_vars/all/vault.yml.example``, as in inventory/homelab.

A VM found is written so that a first run adopts it as it is: its id, cores, memory, balloon, disk size and
storage, machine, firmware, EFI keys, CPU type, start at boot, bridge, install kind, and its GPU when a
``hostpciN`` holds one of the node's NVIDIA cards (raw or through a PCI mapping). What gpulab's spec cannot
say about a VM (a second disk, a second socket, a device that is not a GPU) is named in a comment above it.
A node without VMs gets inventory/demo's three VMs as a proposal (cloud image, sized to fit the node).
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulab import cards as nvidia
from gpulab import vmspec
from gpulab.constants import PLACEHOLDER, PVE_FINGERPRINT_RE, ROUTER_KINDS, SSH_ROUTER_KINDS
from gpulab.pve import propstr, vmoptions

NVIDIA = "10de"
REFERENCE = Path(__file__).resolve().parents[2] / "inventory" / "homelab"
# The reference lab's choices that discover cannot read from a node: versions gpulab is tested with and
# the images it downloads. Taken from inventory/homelab, so there is one place that pins them.
REFERENCE_KEYS = (
    "gpulab_host_reserve_mib",
    "nvidia_driver_branch",
    "nvidia_driver_flavour",
    "k3s_version",
    "hami_chart_version",
    "hami_device_split_count",
    "hami_device_memory_scaling",
)
NET_MODELS = ("virtio", "e1000", "e1000e", "rtl8139", "vmxnet3")
DISK_SLOTS = re.compile(r"^(scsi|virtio|sata|ide)\d+$")
# Guest OS types gpulab manages (Linux); a VM of another type is listed in hosts.yml, left alone.
LINUX_OSTYPES = ("l26", "l24", "")
DNS_LABEL = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$")
MIB = 1 << 20
GIB = 1 << 30

# The probe: is pvesh there, is /etc/pve, which OS, which node is this, is there a python3.
PROBE_SCRIPT = (
    "printf 'pvesh=%s\\n' \"$(command -v pvesh)\"; "
    "if [ -d /etc/pve ]; then echo etc_pve=1; else echo etc_pve=0; fi; "
    'printf \'os=%s\\n\' "$( (. /etc/os-release && echo "$PRETTY_NAME") 2>/dev/null)"; '
    "printf 'hostname=%s\\n' \"$(hostname)\"; "
    "printf 'python3=%s\\n' \"$(command -v python3)\""
)
# Every PCI function with its ids, class, boot_vga and IOMMU group, then every IOMMU group's members
# (lines `dev ADDR VENDOR DEVICE CLASS BOOT_VGA GROUP`, `iommu_groups_dir`, `group N ADDR...`).
SYSFS_SCRIPT = r"""R="${GPULAB_SYSFS_ROOT:-}"
for d in "$R"/sys/bus/pci/devices/*; do
  [ -e "$d" ] || continue
  g=$(readlink "$d/iommu_group" 2>/dev/null); g=${g##*/}
  printf 'dev %s %s %s %s %s %s\n' "${d##*/}" "$(cat "$d/vendor" 2>/dev/null || echo -)" \
    "$(cat "$d/device" 2>/dev/null || echo -)" "$(cat "$d/class" 2>/dev/null || echo -)" \
    "$(cat "$d/boot_vga" 2>/dev/null || echo -)" "${g:--}"
done
[ -d "$R/sys/kernel/iommu_groups" ] && echo iommu_groups_dir
for g in "$R"/sys/kernel/iommu_groups/*; do
  [ -d "$g" ] || continue
  printf 'group %s' "${g##*/}"
  for x in "$g"/devices/*; do { [ -e "$x" ] || [ -L "$x" ]; } && printf ' %s' "${x##*/}"; done
  echo
done
exit 0
"""
ROUTE_COMMAND = "ip -j route show table main"
ADDR_COMMAND = "ip -j -4 addr show"

Runner = Callable[[str], tuple[int, str, str]]


class DiscoverError(Exception):
    """The host cannot be discovered: each problem says what was found and what to do."""

    def __init__(self, host: str, problems: list[str]):
        self.host = host
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass
class Raw:
    """What the reads returned, as read: command outputs and pvesh's JSON by API path."""

    host: str
    user: str
    probe: str
    api: dict[str, Any] = field(default_factory=dict)
    api_errors: dict[str, str] = field(default_factory=dict)
    sysfs: str = ""
    routes: str = ""
    addrs: str = ""
    public_key: str | None = None  # the login key's public half, for VMs discover proposes


# ================================================================================================ collect
def pvesh_command(path: str, **params: str) -> str:
    args = "".join(f" --{k} {shlex.quote(v)}" for k, v in params.items())
    return f"pvesh get {shlex.quote(path)} --output-format json{args}"


def parse_probe(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _get(run: Runner, raw: Raw, path: str, **params: str) -> Any:
    rc, out, err = run(pvesh_command(path, **params))
    if rc != 0:
        raw.api_errors[path] = (err or out).strip() or f"exit code {rc}"
        return None
    try:
        data = json.loads(out or "null")
    except ValueError as exc:
        raw.api_errors[path] = f"not JSON ({exc}): {out[:200]!r}"
        return None
    raw.api[path] = data
    return data


def collect(run: Runner, host: str, user: str, public_key: str | None = None) -> Raw:
    """Run every read through ``run``; stops after the probe when the host has no pvesh."""
    rc, out, err = run(PROBE_SCRIPT)
    raw = Raw(host=host, user=user, probe=out if rc == 0 else "", public_key=public_key)
    if rc != 0:
        raw.api_errors["probe"] = (err or out).strip() or f"exit code {rc}"
    probe = parse_probe(raw.probe)
    if not probe.get("pvesh"):
        return raw
    nodes = _get(run, raw, "/nodes")
    node = pick_node(nodes, probe.get("hostname", ""))
    if node:
        base = f"/nodes/{node}"
        for sub in ("status", "storage", "network"):
            _get(run, raw, f"{base}/{sub}")
        _get(run, raw, f"{base}/hardware/pci", **{"pci-class-blacklist": ""})
        _get(run, raw, "/cluster/mapping/pci")
        for vm in _get(run, raw, f"{base}/qemu") or []:
            vmid = vm.get("vmid")
            cfg = _get(run, raw, f"{base}/qemu/{vmid}/config")
            if vm.get("status") == "running" and _agent_on((cfg or {}).get("agent")):
                _get(run, raw, f"{base}/qemu/{vmid}/agent/network-get-interfaces")
    for attr, command in (("sysfs", SYSFS_SCRIPT), ("routes", ROUTE_COMMAND), ("addrs", ADDR_COMMAND)):
        rc, out, err = run(command)
        setattr(raw, attr, out if rc == 0 else "")
        if rc != 0:
            raw.api_errors[attr] = (err or out).strip() or f"exit code {rc}"
    return raw


def pick_node(nodes: Any, hostname: str) -> str | None:
    """The node this host is: the only one, or the one named like the host (a cluster lists them all)."""
    names = [str(n.get("node")) for n in nodes or [] if isinstance(n, dict) and n.get("node")]
    if len(names) == 1:
        return names[0]
    short = hostname.split(".")[0]
    return short if short in names else None


# ================================================================================================ parse
def _hex(value: Any) -> str:
    return str(value or "").strip().lower().removeprefix("0x")


@dataclass
class PciFunction:
    address: str
    vendor: str
    device: str
    pci_class: str
    boot_vga: bool | None
    group: int | None
    vendor_name: str = ""
    device_name: str = ""

    @property
    def slot(self) -> str:
        return self.address.rsplit(".", 1)[0]

    def describe(self) -> str:
        name = " ".join(x for x in (self.vendor_name, self.device_name) if x)
        return f"{self.address} ({self.vendor}:{self.device}{' ' + name if name else ''})"


def parse_sysfs(text: str) -> tuple[dict[str, PciFunction], dict[int, list[str]], bool]:
    """SYSFS_SCRIPT's output: the functions by address, the IOMMU groups' members, whether the groups'
    folder exists."""
    devices: dict[str, PciFunction] = {}
    groups: dict[int, list[str]] = {}
    has_dir = False
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "dev" and len(words) == 7:
            _, addr, vendor, device, cls, vga, group = words
            devices[addr] = PciFunction(
                addr.lower(),
                _hex(vendor),
                _hex(device),
                _hex(cls),
                None if vga == "-" else vga == "1",
                int(group) if group.isdigit() else None,
            )
        elif words[0] == "iommu_groups_dir":
            has_dir = True
        elif words[0] == "group" and len(words) >= 2 and words[1].isdigit():
            groups[int(words[1])] = sorted(w.lower() for w in words[2:])
    return devices, groups, has_dir


def parse_route(text: str) -> tuple[str | None, str | None]:
    """`ip -j route`: the default route's gateway and device."""
    try:
        routes = json.loads(text or "[]")
    except ValueError:
        return None, None
    for r in routes if isinstance(routes, list) else []:
        if r.get("dst") == "default" and r.get("gateway"):
            return str(r["gateway"]), r.get("dev")
    return None, None


def parse_addrs(text: str) -> dict[str, str]:
    """`ip -j -4 addr`: interface -> its first IPv4 address with prefix (`192.168.100.5/24`)."""
    try:
        links = json.loads(text or "[]")
    except ValueError:
        return {}
    out = {}
    for link in links if isinstance(links, list) else []:
        for a in link.get("addr_info") or []:
            if a.get("family") == "inet" and a.get("local") and link.get("ifname"):
                out.setdefault(link["ifname"], f"{a['local']}/{a.get('prefixlen', 32)}")
    return out


def _props(value: Any, default_key: str | None = None, **kw: Any) -> dict[str, str]:
    try:
        return propstr.parse(str(value or ""), default_key, **kw)
    except propstr.PropertyStringError:
        return {}


def _agent_on(value: Any) -> bool:
    return _props(value, "enabled").get("enabled") in ("1", "on", "yes", "true")


def _norm_pci(path: str) -> str:
    path = path.strip().lower()
    return path if re.match(r"^[0-9a-f]{4,}:[0-9a-f]{2}:", path) else "0000:" + path


def _slot_of(path: str) -> str:
    """A PCI path's slot (`02:00.1` -> `0000:02:00`)."""
    full = _norm_pci(path)
    return full.rsplit(".", 1)[0] if re.search(r"\.[0-7]$", full) else full


# ================================================================================================ analyse
@dataclass
class Gpu:
    id: str
    pci: str
    vendor_device: str
    functions: list[str]
    iommu_group: int | None
    boot_display: bool
    name: str
    others: list[PciFunction] = field(default_factory=list)  # the rest of its IOMMU group


@dataclass
class VmFound:
    host: str
    vmid: int
    status: str
    values: list[tuple[str, Any, str | None]]  # (variable, value, comment above it)
    notes: list[str] = field(default_factory=list)  # comments at the top of its host_vars

    def get(self, name: str) -> Any:
        return next((v for n, v, _ in self.values if n == name), None)


@dataclass
class Found:
    host: str
    user: str
    node: str
    os: str
    address: str
    python3: bool
    memory_bytes: int | None
    threads: int | None
    storages: dict[str, dict[str, Any]]
    storage_notes: list[str]
    fingerprint: str | None
    bridge: str | None
    cidr: str | None  # the node's address on the bridge, with prefix
    gateway: str | None
    network_source: str
    gpus: list[Gpu]
    vms: list[VmFound]
    skipped_vms: list[str]
    proposed: bool = False  # the VMs are discover's proposal (the node had none)
    public_key: str | None = None
    iso: dict[str, Any] | None = None  # {storage, filename} of the ISO the found VMs were installed from

    @property
    def subnet(self) -> str | None:
        return str(ipaddress.IPv4Interface(self.cidr).network) if self.cidr else None

    @property
    def memory_mib(self) -> int | None:
        return self.memory_bytes // MIB if self.memory_bytes else None


def _not_pve(raw: Raw, probe: dict[str, str]) -> str:
    found = [
        "pvesh: not found on its PATH",
        f"/etc/pve: {'present' if probe.get('etc_pve') == '1' else 'absent'}",
        f"operating system: {probe.get('os') or 'unknown'}",
    ]
    if "probe" in raw.api_errors:
        found = [f"the probe failed: {raw.api_errors['probe']}"]
    return (
        f"{raw.user}@{raw.host} is not a Proxmox VE node ({'; '.join(found)}). gpulab discover reads the node "
        "with pvesh and /sys. Fix: give the address of the Proxmox VE host itself (root@ADDRESS, the address of "
        "its web UI without :8006), or install Proxmox VE 9 on this machine first."
    )


def analyse(raw: Raw) -> Found:
    """The node's facts from what :func:`collect` read; :class:`DiscoverError` when it cannot be used."""
    where = f"{raw.user}@{raw.host}"
    probe = parse_probe(raw.probe)
    if not probe.get("pvesh"):
        raise DiscoverError(raw.host, [_not_pve(raw, probe)])
    nodes = raw.api.get("/nodes")
    node = pick_node(nodes, probe.get("hostname", ""))
    if node is None:
        names = ", ".join(str(n.get("node")) for n in nodes or [] if isinstance(n, dict)) or "none"
        why = raw.api_errors.get("/nodes", f"its hostname {probe.get('hostname')!r} is none of them")
        raise DiscoverError(
            raw.host,
            [
                f"{where}: pvesh get /nodes lists node(s) {names} and gpulab cannot tell which one this host is "
                f"({why}). Fix: run discover against the node itself, as root, with the hostname PVE knows it by."
            ],
        )
    base = f"/nodes/{node}"
    problems: list[str] = []
    for path in (f"{base}/status", f"{base}/storage", f"{base}/hardware/pci", f"{base}/qemu"):
        if path in raw.api_errors:
            problems.append(
                f"{where}: `{pvesh_command(path)}` failed: {raw.api_errors[path]}. Fix: run discover as root on "
                "the node (pvesh needs root), or check `systemctl status pve-cluster pvedaemon` there."
            )
    if problems:
        raise DiscoverError(raw.host, problems)

    devices, groups, has_groups_dir = parse_sysfs(raw.sysfs)
    names = {
        str(d.get("id", "")).lower(): d
        for d in raw.api.get(f"{base}/hardware/pci") or []
        if isinstance(d, dict)
    }
    for addr, fn in devices.items():
        d = names.get(addr) or {}
        fn.vendor_name, fn.device_name = str(d.get("vendor_name", "")), str(d.get("device_name", ""))
        if fn.group is None and isinstance(d.get("iommugroup"), int) and d["iommugroup"] >= 0 and groups:
            fn.group = d["iommugroup"]
    gpus = _gpus(devices, groups, raw.api.get("/cluster/mapping/pci") or [], node)
    if not devices:
        problems.append(
            f"{where}: /sys/bus/pci/devices lists no PCI device ({raw.api_errors.get('sysfs', 'empty')}). "
            "Fix: run discover against the node itself (not a container), as root."
        )
    elif not gpus:
        shown = [f.describe() for f in devices.values() if f.pci_class.startswith("03")] or ["none"]
        problems.append(
            f"{where}: no NVIDIA GPU (vendor 10de, display class 03xx) among its {len(devices)} PCI devices; "
            f"display adapters found: {', '.join(shown)}. gpulab passes an NVIDIA card through to a VM. Fix: fit "
            "the card (and check `lspci -nn | grep -i nvidia` shows it), or run discover against the node that has it."
        )
    if devices and not groups:
        problems.append(
            f"{where}: no IOMMU group in /sys/kernel/iommu_groups "
            f"({'the folder is empty' if has_groups_dir else 'no such folder'}): the IOMMU is off, and PCI "
            "passthrough needs it. Fix: turn on VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the firmware setup; with "
            "an Intel CPU and a kernel older than 6.8 also add intel_iommu=on to the kernel command line, "
            "reboot, and check `dmesg | grep -e DMAR -e IOMMU -e AMD-Vi`."
        )
    if problems:
        raise DiscoverError(raw.host, problems)

    status = raw.api.get(f"{base}/status") or {}
    memory = (status.get("memory") or {}).get("total")
    threads = (status.get("cpuinfo") or {}).get("cpus")
    storages, storage_notes = _storages(raw.api.get(f"{base}/storage") or [])
    fingerprint = next(
        (
            str(n.get("ssl_fingerprint"))
            for n in nodes
            if n.get("node") == node and PVE_FINGERPRINT_RE.match(str(n.get("ssl_fingerprint") or ""))
        ),
        None,
    )
    gateway, route_dev = parse_route(raw.routes)
    network = raw.api.get(f"{base}/network")
    bridge, cidr, source = _bridge(network, parse_addrs(raw.addrs), route_dev, raw.host)
    if (
        gateway is None
    ):  # no default route in the kernel: the gateway /etc/network/interfaces gives the bridge
        gateway = next(
            (
                str(n["gateway"])
                for n in network or []
                if isinstance(n, dict) and n.get("iface") == bridge and n.get("gateway")
            ),
            None,
        )
    found = Found(
        host=raw.host,
        user=raw.user,
        node=node,
        os=probe.get("os", ""),
        address=str(ipaddress.IPv4Interface(cidr).ip) if cidr else raw.host,
        python3=probe.get("python3") == "/usr/bin/python3",
        memory_bytes=int(memory) if isinstance(memory, int | float) else None,
        threads=int(threads) if isinstance(threads, int) else None,
        storages=storages,
        storage_notes=storage_notes,
        fingerprint=fingerprint,
        bridge=bridge,
        cidr=cidr,
        gateway=gateway,
        network_source=source,
        gpus=gpus,
        vms=[],
        skipped_vms=[],
        public_key=raw.public_key,
    )
    _vms(found, raw, base)
    return found


def gpu_name_id(device_name: str, taken: set[str]) -> str:
    """A GPU id from PCI's name of the card (`GA102 [GeForce RTX 3090]` -> `rtx3090`), unique on the node."""
    m = re.search(r"\[([^\]]+)\]", device_name or "")
    words = re.split(r"[^A-Za-z0-9]+", m.group(1) if m else device_name or "")
    ident = "".join(w for w in words if w.lower() not in ("", "nvidia", "geforce", "tesla", "quadro")).lower()
    ident = ident[:24] if ident and ident[0].isalpha() else "gpu" + ident[:21]
    out, n = ident, 2
    while out in taken:
        out, n = f"{ident}-{n}", n + 1
    return out


def _gpus(
    devices: dict[str, PciFunction], groups: dict[int, list[str]], mappings: list, node: str
) -> list[Gpu]:
    # A PCI mapping of this node that names the card's slot gives the GPU its id (stage vms keeps it).
    mapped: dict[str, str] = {}
    for m in mappings if isinstance(mappings, list) else []:
        for entry in m.get("map") or []:
            props = _props(entry)
            if props.get("node") == node and props.get("path"):
                mapped.setdefault(_slot_of(props["path"]), str(m.get("id")))
    out: list[Gpu] = []
    taken: set[str] = set()
    for fn in sorted(devices.values(), key=lambda f: f.address):
        if fn.vendor != NVIDIA or not fn.pci_class.startswith("03") or any(g.pci == fn.slot for g in out):
            continue
        functions = sorted(a for a, f in devices.items() if f.slot == fn.slot)
        members = groups.get(fn.group, []) if fn.group is not None else []
        others = [devices[a] for a in members if a not in functions and a in devices]
        ident = mapped.get(fn.slot) or gpu_name_id(fn.device_name, taken)
        taken.add(ident)
        out.append(
            Gpu(
                id=ident,
                pci=fn.slot,
                vendor_device=f"{fn.vendor}:{fn.device}",
                functions=functions,
                iommu_group=fn.group,
                boot_display=bool(fn.boot_vga),
                name=fn.device_name or f"{fn.vendor}:{fn.device}",
                others=others,
            )
        )
    return out


def _storages(entries: list) -> tuple[dict[str, dict[str, Any]], list[str]]:
    out: dict[str, dict[str, Any]] = {}
    notes = []
    for s in entries:
        if not isinstance(s, dict) or not s.get("storage"):
            continue
        name = str(s["storage"])
        if not s.get("active", 1) or not s.get("enabled", 1):
            notes.append(
                f"storage {name} ({s.get('type')}) is not active or not enabled on the node: left out"
            )
            continue
        content = [c for c in str(s.get("content") or "").split(",") if c]
        total = s.get("total")
        entry: dict[str, Any] = {"type": str(s.get("type") or "dir"), "content": content}
        if isinstance(total, int | float) and total > 0:
            entry["size_gb"] = int(total) // GIB
        out[name] = entry
    return out, notes


def _bridge(
    network: Any, addrs: dict[str, str], route_dev: str | None, host: str
) -> tuple[str | None, str | None, str]:
    """The node's LAN bridge and its address: pvesh's network list (a bridge with an address, the one the
    default route leaves by first), else the kernel's addresses (`ip -j -4 addr`)."""
    bridges = [
        n
        for n in network or []
        if isinstance(n, dict)
        and n.get("type") in ("bridge", "OVSBridge")
        and (n.get("cidr") or n.get("address"))
    ]
    bridges.sort(key=lambda n: (n.get("iface") != route_dev, str(n.get("iface"))))
    if bridges:
        b = bridges[0]
        cidr = (
            b.get("cidr")
            or f"{b['address']}/{ipaddress.IPv4Network('0.0.0.0/' + b.get('netmask', '32')).prefixlen}"
        )
        return str(b["iface"]), str(ipaddress.IPv4Interface(cidr)), "pvesh"
    candidates = sorted(addrs, key=lambda i: (i != route_dev, not i.startswith("vmbr"), i))
    candidates = [i for i in candidates if i != "lo"]
    if candidates:
        return candidates[0], addrs[candidates[0]], "ip"
    return None, None, "none"


def _boot_first(cfg: dict, disks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The VM's disks (vmoptions.read) with the boot disk first: scsi0, else the first disk in the boot
    order, else the first by slot."""
    slots = [d["slot"] for d in disks]
    order = _props(cfg.get("boot"), "legacy").get("order", "")
    first = next((d for d in order.split(";") if d in slots), None)
    slot = "scsi0" if "scsi0" in slots else first or (slots[0] if slots else None)
    return sorted(disks, key=lambda d: d["slot"] != slot)


def _vms(found: Found, raw: Raw, base: str) -> None:
    listed = sorted(raw.api.get(f"{base}/qemu") or [], key=lambda v: int(v.get("vmid", 0)))
    by_slot = {g.pci: g for g in found.gpus}
    mapping_ids = {g.id: g for g in found.gpus}
    hosts: set[str] = {"pve", "lan-router", found.node}
    isos: Counter = Counter()
    for item in listed:
        vmid = int(item.get("vmid", 0))
        cfg = raw.api.get(f"{base}/qemu/{vmid}/config")
        name = str((cfg or {}).get("name") or item.get("name") or f"vm-{vmid}")
        if not isinstance(cfg, dict):
            why = raw.api_errors.get(f"{base}/qemu/{vmid}/config", "no config")
            found.skipped_vms.append(f"VM {vmid} ({name}): its config could not be read ({why})")
            continue
        if str(cfg.get("template", "0")) == "1" or item.get("template"):
            found.skipped_vms.append(f"VM {vmid} ({name}): a template, not a VM gpulab runs")
            continue
        if str(cfg.get("ostype", "")) not in LINUX_OSTYPES:
            found.skipped_vms.append(
                f"VM {vmid} ({name}): ostype {cfg.get('ostype')}, not Linux: gpulab leaves it alone "
                "(its pinned memory still counts: raise gpulab_host_reserve_mib by its memory)"
            )
            continue
        host = name if DNS_LABEL.match(name) and name.lower() not in hosts else f"vm-{vmid}"
        while host.lower() in hosts:
            host += "-x"
        hosts.add(host.lower())
        vm = _vm(found, raw, base, vmid, host, name, cfg, item, by_slot, mapping_ids)
        found.vms.append(vm)
        if vm.get("vm_os_install") == "iso" and vm.iso:
            isos[vm.iso] += 1
    if isos:
        storage, filename = isos.most_common(1)[0][0]
        found.iso = {"storage": storage, "filename": filename}
    if not found.vms:
        _propose(found, {int(v.get("vmid", 0)) for v in listed})


@dataclass
class _Vm(VmFound):
    iso: tuple[str, str] | None = None


def _vm(
    found: Found,
    raw: Raw,
    base: str,
    vmid: int,
    host: str,
    name: str,
    cfg: dict,
    item: dict,
    by_slot: dict[str, Gpu],
    mapping_ids: dict[str, Gpu],
) -> _Vm:
    values: list[tuple[str, Any, str | None]] = []
    notes: list[str] = []

    def put(var: str, value: Any, comment: str | None = None) -> None:
        values.append((var, value, comment))

    put("vm_id", vmid)
    if host != name:
        put("vm_name", name, f"its name in PVE ({name!r} is not a host name gpulab can use)")
    options = vmoptions.read(cfg)
    options["disks"] = _boot_first(cfg, options["disks"])
    wanted = vmspec.variables(options)  # the inventory variables that give these options
    sockets, cores = options["sockets"], wanted["vm_cores"]
    if sockets != 1:
        notes.append(
            f"it has {sockets} sockets of {cores} cores: gpulab's VMs have one socket (vm_cores each)"
        )
    put("vm_cores", cores)
    put("vm_memory_mib", wanted["vm_memory_mib"])
    if "vm_balloon" in wanted:
        put("vm_balloon", False)
    elif "vm_balloon_min_mib" in wanted:
        put("vm_balloon_min_mib", wanted["vm_balloon_min_mib"], "its balloon floor (PVE balloon)")
    disks = options["disks"]
    if not disks:
        notes.append("it has no disk: stage vms would give it a scsi0 disk of vm_disk_gb")
        put("vm_disk_gb", PLACEHOLDER, "CHANGE-ME: the size in GB of the disk stage vms would give it")
    else:
        slot = disks[0]["slot"]
        if slot != "scsi0":
            notes.append(
                f"its disk is {slot}, and gpulab's spec manages scsi0: check what "
                "`ansible-playbook site.yml --check --diff --tags vms` would do before a run"
            )
        size = wanted.get("vm_disk_gb")
        put("vm_disk_gb", size or PLACEHOLDER, None if size else f"CHANGE-ME: {slot}'s size")
        put("vm_storage", wanted.get("vm_storage") or "")
    for d in disks[1:]:
        notes.append(
            f"it has another disk, {d['slot']} ({cfg.get(d['slot'])}): gpulab keeps it and does not manage it"
        )
    machine = options["machine"]
    put("vm_machine", wanted["vm_machine"])
    if machine not in ("q35", "i440fx"):
        notes.append(f"its machine is {machine}: vm_machine names the kind only ({values[-1][1]})")
    firmware = "ovmf" if wanted["vm_firmware"] == "ovmf" else "seabios"
    put("vm_firmware", firmware)
    if firmware == "ovmf":
        keys = bool(wanted.get("vm_efi_pre_enrolled_keys"))
        comment = (
            None if keys else "Off: the unsigned NVIDIA kernel module must load (Secure Boot stays off)."
        )
        put("vm_efi_pre_enrolled_keys", keys, comment)
    if wanted["vm_cpu"] != "x86-64-v2-AES":
        put("vm_cpu", wanted["vm_cpu"])
    if len(_props(cfg.get("cpu"), "cputype")) > 1:
        notes.append(f"its cpu has options ({cfg.get('cpu')}): vm_cpu names the type only")
    cards: list[Any] = []  # the node's cards in hostpci order (hostpci0, hostpci1, ...)
    for key in sorted((k for k in cfg if re.fullmatch(r"hostpci\d+", k)), key=lambda k: int(k[7:])):
        props = _props(cfg[key], "host")
        if props.get("mapping") in mapping_ids:
            gpu = mapping_ids[props["mapping"]]
        else:
            paths = [_norm_pci(p) for p in props.get("host", "").split(";") if p]
            hit = next((by_slot[_slot_of(p)] for p in paths if _slot_of(p) in by_slot), None)
            if hit is None:
                notes.append(
                    f"{key} ({cfg[key]}) is not one of the node's NVIDIA GPUs: gpulab's spec holds only the GPU, "
                    "check `--check --diff --tags vms` before a run"
                )
                continue
            gpu = hit
            if any(_slot_of(p) != p for p in paths):
                notes.append(f"{key} ({cfg[key]}) attaches one function; gpulab attaches all of {gpu.pci}")
        if gpu not in cards:
            cards.append(gpu)
        if props.get("pcie") != "1" and "q35" in machine:
            notes.append(f"{key} ({cfg[key]}) is not PCI-Express: gpulab sets pcie=1 on a q35 VM")
    if cards:
        put("vm_gpu", cards[0].id if len(cards) == 1 else [g.id for g in cards])
    if cfg.get("onboot") is not None:
        put("vm_onboot", wanted["vm_onboot"])
    elif any(g.boot_display for g in cards):
        put("vm_onboot", False, "Off: the GPU is the host's only screen.")
    bridge = wanted.get("vm_bridge")
    if bridge and bridge != "vmbr0":
        put("vm_bridge", bridge)
    cloud = any("cloudinit" in str(v) for k, v in cfg.items() if DISK_SLOTS.match(k))
    put("vm_os_install", "cloud_image" if cloud else "iso")
    iso = None
    for k, v in sorted(cfg.items()):
        file = _props(v, "file").get("file", "") if DISK_SLOTS.match(k) and "media=cdrom" in str(v) else ""
        m = re.fullmatch(r"([^:]+):iso/(.+)", file)
        if m:
            iso = (m.group(1), m.group(2))
    if cloud:
        ipconfig = str(cfg.get("ipconfig0", ""))
        if ipconfig != "ip=dhcp":
            notes.append(
                f"its cloud-init network is {ipconfig or 'unset'} (ipconfig0), and gpulab's spec sets ip=dhcp: "
                "check `--check --diff --tags vms` before a run"
            )
        if cfg.get("ciuser"):
            put("vm_ssh_user", str(cfg["ciuser"]))
        keys = [k for k in _sshkeys(cfg.get("sshkeys")) if k]
        put(
            "vm_ssh_public_key",
            keys[0] if keys else PLACEHOLDER,
            None if keys else "CHANGE-ME: the public key cloud-init lets in (its config has none)",
        )
    mac = (options["nets"][0].get("macaddr") if options["nets"] else None) or None
    address, how = _address(raw, base, vmid, mac, found)
    if address:
        put("vm_address", address, how)
    else:
        put("vm_address", PLACEHOLDER, f"CHANGE-ME: {how}")
    vm = _Vm(host, vmid, str(item.get("status") or ""), values, notes, iso=iso)
    return vm


def _sshkeys(value: Any) -> list[str]:
    from urllib.parse import unquote

    return [line.strip() for line in unquote(str(value or "")).splitlines()]


def _address(raw: Raw, base: str, vmid: int, mac: str | None, found: Found) -> tuple[str | None, str]:
    """The VM's LAN address from its guest agent (a running VM with one), else why it is not known."""
    net = ipaddress.IPv4Network(found.subnet) if found.subnet else None
    mac_note = f"net0's MAC is {mac}" if mac else "net0 has no MAC"
    answer = raw.api.get(f"{base}/qemu/{vmid}/agent/network-get-interfaces")
    if isinstance(answer, dict):
        for iface in answer.get("result") or []:
            if mac and str(iface.get("hardware-address", "")).lower() != mac.lower():
                continue
            for a in iface.get("ip-addresses") or []:
                ip = a.get("ip-address")
                if (
                    a.get("ip-address-type") == "ipv4"
                    and ip
                    and (net is None or ipaddress.IPv4Address(ip) in net)
                ):
                    return str(ip), f"the address its guest agent reports ({mac_note})"
    where = f" in {net}" if net else ""
    return None, (
        f"its address{where}: the one it holds now (its DHCP lease on the router; {mac_note}), or a free one "
        "the router reserves for it (discover could not ask its guest agent)"
    )


# What inventory/demo gives a bare node: a k3s server, an agent and a GPU agent.
PROPOSAL = (
    ("vm-1", "k3s server.", 4, 4096, 60, False),
    ("vm-2", "k3s agent.", 4, 4096, 60, False),
    ("vm-gpu", "k3s agent with the GPU.", 8, 16384, 200, True),
)


def _propose(found: Found, taken_ids: set[int]) -> None:
    """The node has no VM gpulab could adopt: propose inventory/demo's three, sized to fit it."""
    found.proposed = True
    reserve = int(reference().get("gpulab_host_reserve_mib") or 4096)
    total = found.memory_mib or 0
    gpu = next((g for g in found.gpus if not g.others), found.gpus[0])
    vmid = 100
    for host, role, cores, memory, disk, with_gpu in PROPOSAL:
        while vmid in taken_ids:
            vmid += 1
        taken_ids.add(vmid)
        if with_gpu and total:
            # what the two others and the host keep, the rest (at most 16 GiB) for the GPU VM, in whole GiB
            memory = max(4096, min(memory, (total - reserve - 2 * 4096) // 1024 * 1024))
        if found.threads:
            cores = min(cores, found.threads)
        values: list[tuple[str, Any, str | None]] = [
            ("vm_id", vmid, None),
            ("vm_cores", cores, None),
            ("vm_memory_mib", memory, None),
        ]
        if with_gpu:
            values += [
                ("vm_balloon", False, None),
                ("vm_disk_gb", disk, None),
                ("vm_machine", "q35", None),
                ("vm_firmware", "ovmf", None),
                ("vm_efi_pre_enrolled_keys", False, "Off: the unsigned NVIDIA kernel module must load."),
                ("vm_cpu", "host", None),
                ("vm_gpu", gpu.id, None),
            ]
            if gpu.boot_display:
                values.append(("vm_onboot", False, "Off: the GPU is the host's only screen."))
        else:
            values += [
                ("vm_disk_gb", disk, None),
                ("vm_machine", "i440fx", None),
                ("vm_firmware", "seabios", None),
            ]
        where = f" in {found.subnet}" if found.subnet else ""
        values.append(
            (
                "vm_address",
                PLACEHOLDER,
                f"CHANGE-ME: a free address{where} for this VM; the router reserves it for the VM's MAC",
            )
        )
        found.vms.append(
            _Vm(host, vmid, "", values, [f"{role} Proposed by gpulab discover: the node had no VM."])
        )


# ================================================================================================ render
def reference() -> dict[str, Any]:
    """inventory/homelab's group_vars/all: the versions and images gpulab is tested with."""
    path = REFERENCE / "group_vars" / "all" / "main.yml"
    return yaml.safe_load(path.read_text()) if path.is_file() else {}


def scalar(value: Any) -> str:
    """One YAML value on one line (flow style), quoted where YAML would read it as something else; a string
    with a colon always (a PCI address, vendor:device, a fingerprint), as inventory/homelab writes them."""
    if isinstance(value, str) and ":" in value and "{{" not in value:
        return json.dumps(value)
    return (
        yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False)
        .removesuffix("\n...\n")
        .strip()
    )


def _block(name: str, value: dict[str, Any], indent: int = 0) -> list[str]:
    pad = " " * indent
    lines = [f"{pad}{name}:"]
    for k, v in value.items():
        if isinstance(v, dict):
            lines += _block(str(k), v, indent + 2)
        else:
            lines.append(f"{pad}  {k}: {scalar(v)}")
    return lines


def _comment(text: str | None, indent: int = 0) -> list[str]:
    if not text:
        return []
    pad = " " * indent
    out, line = [], ""
    for word in text.split():
        if line and len(line) + len(word) + 1 > 104:
            out.append(f"{pad}# {line}")
            line = word
        else:
            line = f"{line} {word}".strip()
    return [*out, f"{pad}# {line}"] if line else out


def _file(lines: list[str]) -> str:
    return "---\n" + "\n".join(lines) + "\n"


def _image(ref: dict[str, Any], key: str, storage: str | None, filename: str | None = None) -> dict[str, Any]:
    image = dict(ref.get(key) or {})
    if filename and image.get("filename") != filename:
        image = {
            "url": PLACEHOLDER,
            "filename": filename,
            "checksum": PLACEHOLDER,
            "checksum_algorithm": "sha256",
        }
    if storage:
        image["storage"] = storage
    return image


def _storage_with(found: Found, content: str, prefer: str | None = None) -> str | None:
    have = [s for s, st in found.storages.items() if content in st.get("content", [])]
    if prefer in have:
        return prefer
    return max(have, key=lambda s: found.storages[s].get("size_gb", 0)) if have else None


def _snippet_lines(found: Found, image_storage: str) -> list[str]:
    """gpulab_snippet_storage when the node's `local` (the default) keeps no snippets: another storage that
    does, else a CHANGE-ME saying how to add them (pvesm set) or to go without the snippet."""
    if "snippets" in (found.storages.get("local") or {}).get("content", []):
        return []
    other = _storage_with(found, "snippets")
    if other is not None:
        return [
            *_comment(
                f"The guest-agent snippet of cloud-image VMs: `local` keeps no snippets here, {other} does (give "
                f"pve_vms_snippets_dir too: {other}'s path on the node followed by /snippets)."
            ),
            f"gpulab_snippet_storage: {scalar(other)}",
        ]
    store = image_storage if image_storage != PLACEHOLDER else "local"
    have = ",".join((found.storages.get(store) or {}).get("content", [])) or "..."
    return [
        *_comment(
            f"CHANGE-ME: no enabled storage of the node keeps snippets (the guest-agent snippet of cloud-image VMs "
            f"goes there): run `pvesm set {store} --content {have},snippets` on the node and name it here, or set "
            "gpulab_guest_agent_snippet: false."
        ),
        f"gpulab_snippet_storage: {PLACEHOLDER}",
    ]


def _flavour_lines(found: Found) -> list[str]:
    """nvidia_driver_flavour as gpulab picks it for the node's cards (gpulab.cards), with a comment saying why;
    left unset (gpulab then picks per GPU VM) when the cards need different kernel modules."""
    cards = [(g.id, nvidia.card(g.vendor_device)) for g in found.gpus]
    if nvidia.flavour_problems(cards, None):
        text = (
            "nvidia_driver_flavour is left unset: "
            + ", ".join(f"{gid} is {c.describe()} (open kernel modules {c.open})" for gid, c in cards)
            + "; these cards need different kernel modules, so gpulab picks per GPU VM (give them to two VMs)."
        )
        return [*_comment(text), "# nvidia_driver_flavour:"]
    drv = nvidia.driver_for([c for _, c in cards], None, 0)
    adopted = [v.host for v in found.vms if v.get("vm_gpu") is not None] if not found.proposed else []
    if adopted and drv.open and not any(c.needs() for _, c in cards):
        # an existing GPU VM most likely runs the proprietary driver (gpulab's earlier default, and Ubuntu's
        # server branch): adopt it as it is rather than switch its kernel module
        text = (
            f"{', '.join(adopted)} already has a card ({', '.join(f'{gid}: {c.describe()}' for gid, c in cards)}): "
            "kept on the proprietary kernel module (nvidia-driver-<branch>-server) it most likely runs, which the "
            "card can use. server-open is NVIDIA's recommendation for it; switching installs it at the next run "
            "and loads it after the VM's reboot. Unset, gpulab picks server-open."
        )
        return [*_comment(text), "nvidia_driver_flavour: server"]
    text = (
        f"Picked by gpulab discover for {', '.join(f'{gid}: {c.describe()}' for gid, c in cards) or 'no card'} "
        f"(NVIDIA open kernel modules {', '.join(sorted({c.open for _, c in cards})) or '-'}; "
        "library/gpulab/data/nvidia-gpus.json): "
        + ("the open kernel module." if drv.open else "the proprietary kernel module.")
        + " Unset, gpulab picks the same per GPU VM. A GPU VM that already runs the proprietary driver "
        "(nvidia-driver-<branch>-server) would switch at the next run: write `server` to keep it where the card "
        "allows it (not on Blackwell)."
    )
    return [*_comment(text), f"nvidia_driver_flavour: {drv.flavour}"]


def render(found: Found) -> dict[str, str]:
    """The inventory folder's files, path -> text."""
    ref = reference()
    files: dict[str, str] = {}
    kinds = Counter(v.get("vm_os_install") or "cloud_image" for v in found.vms)
    install = kinds.most_common(1)[0][0] if kinds else "cloud_image"
    storages = Counter(v.get("vm_storage") for v in found.vms if v.get("vm_storage"))
    vm_storage = storages.most_common(1)[0][0] if storages else _storage_with(found, "images")
    any_iso = any(v.get("vm_os_install") == "iso" for v in found.vms)

    # --- hosts.yml ---
    lines = [
        f"# Proxmox VE node {found.node}, its router and its VMs, as `gpulab discover {found.user}@{found.host}` read them.",
        "# Each CHANGE-ME (here and in group_vars/, host_vars/) is yours to fill: `gpulab plan` names those left.",
        "all:",
        "  children:",
        "    proxmox:",
        "      hosts:",
        f"        {found.node}:",
        "    router:",
        "      hosts:",
        "        lan-router:",
        "    vms:",
        "      hosts:",
    ]
    lines += [f"        {vm.host}:" for vm in found.vms]
    for note in found.skipped_vms:
        lines += _comment(f"not in the lab: {note}", 8)
    lines += ["    k3s_cluster:", "      children:", "        k3s_server:", "          hosts:"]
    plain = [v.host for v in found.vms if v.get("vm_gpu") is None]
    server = (plain or [v.host for v in found.vms])[:1]
    if found.proposed:
        lines += [f"            {h}:" for h in server]
        lines += ["        k3s_agent:", "          hosts:"]
        lines += [f"            {v.host}:" for v in found.vms if v.host not in server]
    else:
        lines += _comment(
            "CHANGE-ME: which VMs run k3s is yours to say. Uncomment the one VM that is the k3s server "
            "(one, or three) and the agents below; a VM in neither stays out of the cluster.",
            12,
        )
        lines += [f"            # {h}:" for h in server]
        lines += ["        k3s_agent:", "          hosts:"]
        lines += [f"            # {v.host}:" for v in found.vms if v.host not in server]
    files["hosts.yml"] = _file(lines)

    # --- group_vars/all/main.yml ---
    url_host = found.address
    lines = [
        "# The lab definition shared by every host. Each variable is described in docs/variables.md.",
        "",
        "# --- Proxmox VE API ---------------------------------------------------------------------------",
        f"pve_api_url: https://{url_host}:8006",
        "# An API token with privilege separation; docs/getting-started.md step 3 lists the privileges it needs.",
        "pve_api_token_id: gpulab@pve!ansible",
        "pve_api_token_secret: \"{{ vault_pve_api_token_secret | default(lookup('ansible.builtin.env', "
        "'GPULAB_PVE_API_TOKEN_SECRET')) }}\"",
        "pve_api_validate_certs: true",
    ]
    if found.fingerprint:
        lines += [
            "# The SHA-256 fingerprint of the certificate the node's API serves, as pvesh get /nodes reports it.",
            f"pve_api_fingerprint: {scalar(found.fingerprint)}",
        ]
    else:
        lines += [
            "# PVE's certificate is self-signed: pin its SHA-256 fingerprint (`pvenode cert info` on the node).",
            '# pve_api_fingerprint: "AA:BB:...:FF"',
        ]
    lines += [
        "",
        "# --- OS images, downloaded by Proxmox itself and checked against their SHA-256 -----------------",
    ]
    iso_storage = (found.iso or {}).get("storage") or _storage_with(found, "iso", "local")
    iso = _image(ref, "gpulab_os_iso", iso_storage, (found.iso or {}).get("filename"))
    if any_iso:
        if PLACEHOLDER in iso.values():
            lines += _comment(
                f"CHANGE-ME: the VMs were installed from {iso['filename']} on {iso_storage}; give the URL it "
                "was downloaded from and its SHA-256 (the distribution's SHA256SUMS), so stage vms finds it as is."
            )
        else:
            lines += _comment(
                f"The VMs were installed from {iso['filename']} on {iso_storage}: the reference lab's ISO of that "
                f"name (check that `sha256sum` of the file on the node gives {iso.get('checksum')})."
            )
        lines += _block("gpulab_os_iso", iso)
    image = _image(ref, "gpulab_os_image", _storage_with(found, "import", "local"))
    if install == "cloud_image" or any(v.get("vm_os_install") == "cloud_image" for v in found.vms):
        lines += _comment(
            "Unattended install (vm_os_install: cloud_image): the reference lab's cloud image, from a dated "
            "release folder that never changes (noble/current/ is rebuilt every few days). To move on, copy url "
            "and checksum together from a newer folder's SHA256SUMS and give filename a new name; preflight "
            "checks both online (gpulab_download_check)."
        )
        if image.get("storage") is None:
            lines += _comment(
                "CHANGE-ME: no storage of the node holds content `import`: add it to a directory storage "
                "(Datacenter > Storage) and name it here."
            )
            image["storage"] = PLACEHOLDER
        lines += _block("gpulab_os_image", image)
        lines += _snippet_lines(found, image["storage"])
    lines += [
        "",
        "# Memory kept for Proxmox itself and the ZFS ARC when summing the VMs' pinned memory.",
        f"gpulab_host_reserve_mib: {scalar(ref.get('gpulab_host_reserve_mib', 4096))}",
        "",
        "# --- guests, k3s, HAMi (the versions the reference lab is tested with) ------------------------",
    ]
    for key in REFERENCE_KEYS[1:]:
        if key == "nvidia_driver_flavour":
            lines += _flavour_lines(found)
        elif key in ref:
            lines.append(f"{key}: {scalar(ref[key])}")
            if key == "k3s_version":
                lines += [
                    "# Empty: generated once on the server and read back (never printed).",
                    "k3s_token: \"{{ vault_k3s_token | default(lookup('ansible.builtin.env', 'GPULAB_K3S_TOKEN')) }}\"",
                ]
    lines += ["", "# GPU engines of stage workloads (opt-in): see inventory/homelab's workloads_engines."]
    files["group_vars/all/main.yml"] = _file(lines)
    files["group_vars/all/vault.yml.example"] = _vault_example()

    # --- group_vars/vms.yml ---
    lines = [
        "# Shared by every lab VM; each VM's own shape is in host_vars/<vm>.yml.",
        f"vm_node: {scalar(found.node)}",
        f"vm_storage: {scalar(vm_storage or PLACEHOLDER)}",
        f"vm_os_install: {install}",
    ]
    if any_iso:
        lines += _comment(
            "CHANGE-ME: the account you made in the Ubuntu installer on the VMs (gpulab logs in as it, with your "
            "SSH key, and uses sudo)."
        )
        lines.append(f"vm_ssh_user: {PLACEHOLDER}")
    else:
        lines += ["# The account cloud-init makes on the VMs.", "vm_ssh_user: ubuntu"]
        if found.proposed:
            if found.public_key:
                lines += [
                    "# The public key of the SSH key discover logged in with.",
                    f"vm_ssh_public_key: {scalar(found.public_key)}",
                ]
            else:
                lines += _comment(
                    "CHANGE-ME: your SSH public key (e.g. the contents of ~/.ssh/id_ed25519.pub)."
                )
                lines.append(f"vm_ssh_public_key: {PLACEHOLDER}")
    lines += [
        'ansible_host: "{{ vm_address }}"',
        'ansible_user: "{{ vm_ssh_user }}"',
        "# Ubuntu 24.04's Python, named: no interpreter discovery.",
        "ansible_python_interpreter: /usr/bin/python3",
    ]
    if any_iso:
        lines += [
            "# sudo on the VMs: the installer's account asks for its password. Type it at each run with -K, or keep",
            '# it in the vault as vault_vm_become_password (docs/getting-started.md, "sudo on the VMs").',
            'ansible_sudo_pass: "{{ vault_vm_become_password | default(omit) }}"',
        ]
    files["group_vars/vms.yml"] = _file(lines)

    # --- host_vars ---
    files[f"host_vars/{found.node}.yml"] = _node_file(found)
    files["host_vars/lan-router.yml"] = _router_file(found)
    for vm in found.vms:
        files[f"host_vars/{vm.host}.yml"] = _vm_file(vm, vm_storage, install)
    return files


def _vault_example() -> str:
    return _file(
        [
            "# Secrets of the lab. Copy to vault.yml in this folder, put the real values in, then encrypt it:",
            "#   cp vault.yml.example vault.yml && $EDITOR vault.yml && ansible-vault encrypt --ask-vault-pass vault.yml",
            "# Each can instead come from the environment (GPULAB_PVE_API_TOKEN_SECRET, GPULAB_ROUTER_PASSWORD,",
            "# GPULAB_K3S_TOKEN). Never commit a real secret.",
            f"vault_pve_api_token_secret: {PLACEHOLDER}-token-uuid",
            "# The router's password (for a router reached over HTTP; one reached over SSH uses your key).",
            f"vault_router_password: {PLACEHOLDER}-router-admin-password",
            "# Optional: leave out and the k3s server generates one.",
            f"# vault_k3s_token: {PLACEHOLDER}-long-random-string",
            "# Optional: the sudo password of the VMs' account (the Ubuntu installer's asks for one).",
            f"# vault_vm_become_password: {PLACEHOLDER}-ubuntu-sudo-password",
        ]
    )


def _node_file(found: Found) -> str:
    lines = [
        f"# Proxmox VE node {found.node} ({found.os or 'OS unknown'}), read over SSH from {found.user}@{found.host}."
    ]
    lines += [f"ansible_host: {scalar(found.host)}", f"ansible_user: {scalar(found.user)}"]
    if found.python3:
        lines += [
            "# The node's Python, named: no interpreter discovery.",
            "ansible_python_interpreter: /usr/bin/python3",
        ]
    lines.append(f"pve_node: {scalar(found.node)}")
    if found.memory_bytes:
        lines += [
            f"# memory.total of /nodes/{found.node}/status: {found.memory_bytes} bytes",
            f"pve_memory_mib: {found.memory_mib}",
        ]
    else:
        lines += [
            *_comment("CHANGE-ME: the node's usable memory in MiB (pvesh could not say)."),
            f"pve_memory_mib: {PLACEHOLDER}",
        ]
    if found.threads:
        lines.append(f"pve_threads: {found.threads}")
    lines += _comment(f"Storages and their sizes in GiB, from /nodes/{found.node}/storage.")
    for note in found.storage_notes:
        lines += _comment(note)
    lines.append("pve_storages:")
    for name, st in found.storages.items():
        lines.append(f"  {scalar(name)}:")
        lines += [f"    {k}: {scalar(v)}" for k, v in st.items()]
    lines.append("pve_gpus:")
    for gpu in found.gpus:
        others = "" if gpu.others else f"; IOMMU group {gpu.iommu_group} holds only these"
        lines += _comment(
            f"{gpu.name} ({gpu.vendor_device}), functions {', '.join(gpu.functions)}{others}.", 2
        )
        if gpu.others:
            bridges = [o for o in gpu.others if o.pci_class.startswith("0604")]
            lines += _comment(
                f"IOMMU group {gpu.iommu_group} also holds {', '.join(o.describe() for o in gpu.others)}: "
                "passthrough would take them too (a VM gets the whole group, and the node loses those devices)"
                + (
                    "; a PCI bridge in the group is fine, PVE's documentation says"
                    if bridges and len(bridges) == len(gpu.others)
                    else ". Move the card to another slot, or see docs/operations.md on IOMMU groups"
                )
                + ".",
                2,
            )
        if gpu.boot_display:
            lines += _comment(
                "It is the host's boot display (boot_vga 1), so its VM must not start at boot.", 2
            )
        lines += [
            f"  - id: {scalar(gpu.id)}",
            f"    pci: {scalar(gpu.pci)}",
            f"    vendor_device: {scalar(gpu.vendor_device)}",
            f"    functions: {scalar(gpu.functions)}",
            f"    iommu_group: {scalar(gpu.iommu_group)}",
            f"    boot_display: {scalar(gpu.boot_display)}",
        ]
    return _file(lines)


def _router_file(found: Found) -> str:
    kinds = ", ".join(ROUTER_KINDS)
    lines = ["# The router of the node's LAN: the default gateway of the node is its likely address."]
    gw = found.gateway
    if gw:
        lines += [f"# the default gateway of node {found.node} is {gw}", f"ansible_host: {scalar(gw)}"]
    else:
        lines.append('ansible_host: "{{ router_address }}"')
    lines += _comment(
        f"CHANGE-ME: the kind of router that serves the LAN's DHCP: one of {kinds} (docs/variables.md, router_kind)."
    )
    lines.append(f"router_kind: {PLACEHOLDER}")
    if not gw:
        lines += _comment(
            "CHANGE-ME: the router's address on the LAN (the node has no default route, nor a gateway on its bridge)."
        )
    lines.append(f"router_address: {scalar(gw) if gw else PLACEHOLDER}")
    if found.subnet:
        src = "pvesh" if found.network_source == "pvesh" else "ip addr"
        lines += [
            f"# the subnet of {found.bridge} ({found.cidr}, from {src})",
            f"router_subnet: {scalar(found.subnet)}",
        ]
    else:
        lines += [
            *_comment("CHANGE-ME: the LAN's subnet, e.g. 192.168.100.0/24."),
            f"router_subnet: {PLACEHOLDER}",
        ]
    lines += _comment("CHANGE-ME: the router's DHCP pool (its DHCP settings page shows it).")
    lines += ["router_dhcp_pool:", f"  start: {PLACEHOLDER}", f"  end: {PLACEHOLDER}"]
    ssh = "/".join(SSH_ROUTER_KINDS)
    lines += _comment(
        f"CHANGE-ME: the router's login user (its web/API admin; root for {ssh} reached over SSH)."
    )
    lines.append(f"router_user: {PLACEHOLDER}")
    lines += _comment(
        "A router reached over HTTP logs in with a password, from the vault (vault_router_password)."
    )
    lines.append(
        "router_password: \"{{ vault_router_password | default(lookup('ansible.builtin.env', 'GPULAB_ROUTER_PASSWORD')) }}\""
    )
    return _file(lines)


def _vm_file(vm: VmFound, group_storage: str | None, group_install: str) -> str:
    lines: list[str] = []
    state = f", {vm.status}" if vm.status else ""
    head = (
        vm.notes[0] if vm.notes and vm.notes[0].startswith("k3s") else f"VM {vm.vmid} as PVE has it{state}."
    )
    lines += _comment(head)
    for note in vm.notes:
        if note != head:
            lines += _comment(f"Note: {note}.")
    for name, value, comment in vm.values:
        if (name == "vm_storage" and value == group_storage) or (
            name == "vm_os_install" and value == group_install
        ):
            continue
        lines += _comment(comment)
        lines.append(f"{name}: {scalar(value)}")
    return _file(lines)


PLACEHOLDER_LINE = re.compile(rf"^\s*(?P<key>[A-Za-z_][\w.]*): {PLACEHOLDER}$")


def to_fill(files: dict[str, str]) -> dict[str, list[str]]:
    """The `key: CHANGE-ME` lines of the written files by file (the vault example aside: its secrets are
    step 6 of docs/getting-started.md)."""
    out: dict[str, list[str]] = {}
    for rel, text in files.items():
        keys = [m["key"] for line in text.splitlines() if (m := PLACEHOLDER_LINE.match(line))]
        if keys:
            out[rel] = keys
    return out


# ================================================================================================ write
def write_new(target: Path, files: dict[str, str]) -> list[Path]:
    """Create ``target`` (it must not exist) holding ``files``; on any failure nothing is left behind."""
    target = Path(target)
    target.mkdir(parents=False, exist_ok=False)  # refuses a folder (or file) that is there, atomically
    written: list[Path] = []
    try:
        for rel, text in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    except BaseException:
        import shutil

        shutil.rmtree(target, ignore_errors=True)
        raise
    return written
