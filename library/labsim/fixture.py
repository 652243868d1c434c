"""The YAML fixture that describes the simulated machine.

Keys (see fixtures/reference.yml, the default):

- ``pve``: ``version``, ``release``, ``repoid`` answered by GET /version (``version`` is the node's pve-manager
  package too), and ``qemu_server``, the node's qemu-server package version: both are in the node host's
  /var/lib/dpkg/status, where `gpulab doctor` reads them.
- ``nodes``: list of ``name``, ``address`` (optional: the node's address in /cluster/status; the lab
  subnet's .5, .6, ... in list order when not given), ``cpu`` (``model``, ``sockets``, ``cores``,
  ``threads``), ``memory`` (``total``, ``host_used`` bytes), ``rootfs_total``, ``boot`` (``mode``
  efi|legacy-bios, ``secureboot``, ``loader``), ``kernel``, ``storages`` (``name``, ``type``
  dir|btrfs|zfspool|lvmthin, ``content`` list, ``total`` bytes, ``path`` for dir and btrfs, ``disable``: true
  for a storage storage.cfg marks disabled; local to the node, as no storage is shared), ``bridges``, ``pci`` (items shaped like PVE's hardware/pci answer, plus
  ``boot_vga``, and for the node's own /sys (labsim.sysfs_tree.node_pci_tree): ``reset_method`` (the kernel's
  list, e.g. ``flr bus``; empty: no reset; default ``flr bus`` on an NVIDIA function), ``bars`` (BAR sizes in
  lspci's notation, BAR order, null for unused), ``memory_mib`` (what the guest's nvidia-smi reports) and
  ``kernel_modules`` (``open`` or ``proprietary``: the only NVIDIA kernel modules that find the card; unset:
  either)), ``hardware`` (``interrupt_remapping``, ``cpu_address_bits``, ``iommu_address_bits``,
  ``framebuffer``: labsim.sysfs_tree.hardware_files).
- ``timings``: seconds per task type (``qmcreate``, ``qmconfig``, ``qmstart``, ``qmshutdown``, ``qmstop``,
  ``qmdestroy``, ``resize``), ``download_rate`` (bytes/s), ``download_max_s``, ``download_progress_s``,
  ``agent_delay`` (seconds after start before the guest agent answers).
- ``downloads``: what download-url can fetch: ``url``, ``size``, optional ``virtual_size``, ``format``,
  and hex digests per algorithm (``sha256``, ``sha512``, ...); the lab's internet (labsim.internet) serves the
  same table to the controller, each folder with its SHA256SUMS.
- ``network`` (optional; used by the network lab and by the API-only hooks): ``router`` (dnsmasq|kea|huawei_ont),
  ``subnet`` (CIDR or ``auto``), ``router_address``, ``pool`` (``FIRST-LAST`` or ``auto``); the network lab also
  reads ``dhcp_renew_s``, ``vm_init`` and ``guest_apt_hold_s`` (labsim/net/README.md).
- ``guest_kernels`` (optional): the Ubuntu kernel series a VM runs, by VM name (or id): ``generic`` (the GA
  kernel, the default), ``generic-hwe-24.04`` (the HWE kernel of newer point-release media) or ``kvm`` (a flavour
  without Canonical-signed NVIDIA modules); :mod:`labsim.net.guest_kernel` lays it over the VM. Fixture
  ``hwe-guest`` is the reference machine with vm-gpu on the HWE kernel (issue 43).
- ``extends`` (optional): a fixture this one builds on (a name such as ``reference``, or a path relative to
  this file); its keys are merged under this file's (mappings key by key, anything else replaced). A node
  of ``nodes`` may name ``extends: NODE`` too: that node of the fixture it builds on, with the entry's keys
  merged over it (fixtures/cluster.yml keeps the reference node so). Such an entry may add PCI devices
  to that node's ``pci`` with ``pci_add`` (same items; the list is kept in address order) instead of
  repeating the whole list (fixtures/two-gpus.yml adds a second card so), and change keys of its devices with
  ``pci_set`` (a mapping of a device's ``id`` to the keys laid over it; fixtures/igpu-boot-vga.yml moves
  ``boot_vga`` so). A node's ``kernel_builtin`` lists the modules built into its kernel (its
  ``modules.builtin``, e.g. ``[xhci_pci]``: fixtures/turing-usbc.yml): their drivers bind at boot before any
  module loads (labsim.sysfs_tree.boot_drivers). These two and ``grub-stray-cmdline`` (a GRUB node with a leftover
  /etc/kernel/cmdline in ``seed.node.files``) are the hardware as users have it (issue 43).
- ``cluster`` (optional): ``name`` of the PVE cluster the nodes form (GET /cluster/status); a fixture with
  several nodes is a cluster (named ``lab`` when no name is given), one node with no name is a lone node.
- ``seed`` (optional): the lab as its user built it before gpulab ran (fixtures/homelab.yml;
  :mod:`labsim.seed` documents the keys and makes the lab, :func:`normalise_seed` here checks them): VMs that
  already exist, ISO volumes on storage, the guests' installation, DHCP leases the router already holds, the
  node's kernel command line.

``--fixture`` takes a path or the name of a fixture in ``fixtures/`` (``reference``, ``homelab``,
``homelab-blacklisted``, ``homelab-running``, ``cluster``, ``two-gpus``, and one per card case: ``gtx1080``,
``rtx2080``, ``rtx5090``, ``rtx5090-narrow-iommu``, ``rtx-a4000``, ``shared-group``, ``irq-remap-off``, one per
storage.cfg as installed: ``pve8-storage``, ``btrfs``, and the hardware as users have it (issue 43):
``igpu-boot-vga``, ``turing-usbc``, ``grub-stray-cmdline``, ``hwe-guest``): :func:`resolve_fixture`.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

#: The reference lab's PVE: pve-manager 9.2.11 (repoid: pve-manager @14a22df3) with qemu-server 9.2.6
#: (proxmox/qemu-server debian/changelog @e6352be6), for a fixture that names none of them.
DEFAULT_PVE = {"version": "9.2.11", "release": "9.2", "repoid": "14a22df3e1c0b2a7", "qemu_server": "9.2.6"}
DEFAULT_TIMINGS = {
    "qmcreate": 0.5,
    "qmconfig": 0.2,
    "qmstart": 0.6,
    "qmshutdown": 0.5,
    "qmstop": 0.3,
    "qmdestroy": 0.3,
    "resize": 0.2,
    "download_rate": 2_000_000_000,
    "download_max_s": 3.0,
    "download_progress_s": 0.5,
    "agent_delay": 1.0,
}

# Where the API-only hooks place guests when the fixture leaves the lab subnet to the network lab ("auto").
AUTO_SUBNET = "10.213.0.0/24"


class FixtureError(ValueError):
    """The fixture file is missing something the simulator needs."""


def fixtures_dir() -> Path:
    return Path(str(resources.files("labsim").joinpath("fixtures")))


def reference_fixture_path() -> Path:
    return fixtures_dir() / "reference.yml"


def named_fixtures() -> list[str]:
    """The fixtures that ``--fixture NAME`` finds (the files of ``fixtures/``)."""
    return sorted(p.stem for p in fixtures_dir().glob("*.yml"))


def resolve_fixture(name_or_path: str | Path | None, base: Path | None = None) -> Path:
    """The fixture file a ``--fixture`` value names: an existing path, else a name of ``fixtures/``."""
    if not name_or_path:
        return reference_fixture_path()
    text = str(name_or_path)
    path = Path(text)
    if not path.is_absolute() and base is not None and (base / path).exists():
        return (base / path).resolve()
    if path.exists():
        return path.resolve()
    if "/" not in text and (fixtures_dir() / f"{text.removesuffix('.yml')}.yml").exists():
        return fixtures_dir() / f"{text.removesuffix('.yml')}.yml"
    raise FixtureError(
        f"lab fixture {text!r} is neither a file nor a fixture name; the names are: {', '.join(named_fixtures())}"
    )


def _merge(base: Any, over: Any) -> Any:
    """``over`` laid over ``base``: mappings merged key by key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


def _read_fixture(src: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    if src in seen:
        raise FixtureError(f"lab fixture {src} extends itself (through {' -> '.join(map(str, seen))})")
    try:
        data = yaml.safe_load(src.read_text())
    except OSError as exc:
        raise FixtureError(f"cannot read lab fixture {src}: {exc.strerror}") from exc
    if not isinstance(data, dict):
        raise FixtureError(f"lab fixture {src} is not a mapping of keys")
    parent = data.pop("extends", None)
    base: dict[str, Any] = {}
    if parent:
        base = _read_fixture(resolve_fixture(parent, src.parent), (*seen, src))
        data = _merge(base, data)
    base_nodes = {n.get("name"): n for n in base.get("nodes") or [] if isinstance(n, dict)}
    nodes = []
    for node in data.get("nodes") or []:
        if isinstance(node, dict) and "extends" in node:
            node = dict(node)
            name = node.pop("extends")
            if name not in base_nodes:
                known = ", ".join(map(str, base_nodes)) or "none (the fixture extends no other)"
                raise FixtureError(
                    f"lab fixture {src}: a node extends node {name!r}, which is not one of {known}"
                )
            node = _merge(base_nodes[name], node)
        if isinstance(node, dict) and "pci_set" in node:
            node = dict(node)
            changes = {str(k).lower(): v for k, v in (node.pop("pci_set") or {}).items()}
            known = {str(d.get("id", "")).lower() for d in node.get("pci") or []}
            if set(changes) - known:
                raise FixtureError(
                    f"lab fixture {src}: pci_set names {', '.join(sorted(set(changes) - known))}, not a device of "
                    f"node {node.get('name')!r}"
                )
            node["pci"] = [
                {**d, **(changes.get(str(d.get("id", "")).lower()) or {})} for d in node.get("pci") or []
            ]
        if isinstance(node, dict) and "pci_add" in node:
            node = dict(node)
            added = node.pop("pci_add") or []
            node["pci"] = sorted([*(node.get("pci") or []), *added], key=lambda d: str(d.get("id", "")))
        nodes.append(node)
    if nodes:
        data["nodes"] = nodes
    return data


def load_fixture(path: str | Path | None = None) -> dict[str, Any]:
    """Read a fixture (a path or a name; default: the reference machine) and fill in defaults."""
    src = resolve_fixture(path)
    data = _read_fixture(src)
    if not data.get("nodes"):
        raise FixtureError(f"lab fixture {src} defines no nodes: add a 'nodes:' list")
    data = copy.deepcopy(data)
    data["_path"] = str(src.resolve())
    data["pve"] = {**DEFAULT_PVE, **(data.get("pve") or {})}
    data["timings"] = {**DEFAULT_TIMINGS, **(data.get("timings") or {})}
    data.setdefault("downloads", [])
    for node in data["nodes"]:
        if not node.get("name"):
            raise FixtureError(f"lab fixture {src}: a node has no 'name'")
        node.setdefault("storages", [])
        node.setdefault("pci", [])
        node.setdefault("bridges", ["vmbr0"])
        node.setdefault("boot", {"mode": "efi", "secureboot": 0})
        node.setdefault("kernel", "6.17.2-1-pve")
        node.setdefault("cpu", {"model": "QEMU Virtual CPU", "sockets": 1, "cores": 4, "threads": 4})
        node.setdefault("memory", {"total": 16 * 2**30, "host_used": 2 * 2**30})
        node.setdefault("rootfs_total", 100 * 2**30)
    if data.get("seed"):
        data["seed"] = normalise_seed(data["seed"], data, src)
    return data


def download_digest(entry: dict[str, Any], algorithm: str) -> str:
    """The digest of a known download: the fixture's value, or one derived from the URL (lab content)."""
    if entry.get(algorithm):
        return str(entry[algorithm]).lower()
    return hashlib.new(algorithm, f"gpulab-lab-content:{entry['url']}".encode()).hexdigest()


def node_address(fixture: dict[str, Any], name: str) -> str:
    """A node's address: its ``address``, else the lab subnet's .5, .6, ... in the order of ``nodes``
    (the reference node is .5)."""
    for i, node in enumerate(fixture["nodes"]):
        if node["name"] == name:
            if node.get("address"):
                return str(node["address"])
            net = ipaddress.ip_network(network_settings(fixture)["subnet"])
            return str(net.network_address + 5 + i)
    raise KeyError(name)


def network_settings(fixture: dict[str, Any]) -> dict[str, Any]:
    """The lab network with ``auto`` resolved: subnet, router address, DHCP pool first/last, router kind."""
    net = fixture.get("network") or {}
    subnet_text = net.get("subnet", "auto")
    subnet = ipaddress.ip_network(AUTO_SUBNET if subnet_text in (None, "auto") else subnet_text, strict=False)
    hosts = list(subnet.hosts())
    router = net.get("router_address", "auto")
    router_ip = hosts[0] if router in (None, "auto") else ipaddress.ip_address(router)
    pool = net.get("pool", "auto")
    if pool in (None, "auto"):
        # as the reference router (and the network lab): every address after the router's
        first, last = hosts[1], hosts[-1]
    else:
        a, b = (p.strip() for p in str(pool).split("-", 1))
        first, last = ipaddress.ip_address(a), ipaddress.ip_address(b)
    return {
        "router": net.get("router", "dnsmasq"),
        "subnet": str(subnet),
        "prefix": subnet.prefixlen,
        "router_address": str(router_ip),
        "pool_first": str(first),
        "pool_last": str(last),
    }


# ------------------------------------------------------------------------------------------ the seed
class SeedError(FixtureError):
    """The fixture's ``seed`` is incomplete or contradicts the rest of the fixture."""


def normalise_seed(seed: dict[str, Any], fixture: dict[str, Any], src: Path) -> dict[str, Any]:
    """Check a fixture's ``seed`` and fill in defaults; the node's command line and files go to ``nodes[0].lab``."""
    seed = copy.deepcopy(seed)
    if not isinstance(seed, dict):
        raise SeedError(f"lab fixture {src}: 'seed' must be a mapping")
    urls = {d["url"]: d for d in fixture.get("downloads", [])}
    for iso in seed.setdefault("isos", []):
        if iso.get("url") not in urls:
            raise SeedError(f"lab fixture {src}: seed iso {iso.get('url')!r} is not in 'downloads'")
        iso.setdefault("storage", "local")
        iso.setdefault("filename", iso["url"].rsplit("/", 1)[-1])
        iso["volid"] = f"{iso['storage']}:iso/{iso['filename']}"
    guest = seed.setdefault("guest", {})
    guest.setdefault("os", "ubuntu-24.04")
    guest.setdefault("install", "iso")
    guest.setdefault("user", "ubuntu")
    guest.setdefault("sudo", "password")
    if guest["sudo"] not in ("password", "nopasswd"):
        raise SeedError(f"lab fixture {src}: seed.guest.sudo must be 'password' or 'nopasswd'")
    seen: set[int] = set()
    for vm in seed.setdefault("vms", []):
        vmid = int(vm.get("vmid", 0))
        if vmid < 100 or vmid in seen:
            raise SeedError(f"lab fixture {src}: seed VM ids must be unique numbers from 100 ({vmid})")
        seen.add(vmid)
        vm["vmid"] = vmid
        vm.setdefault("status", seed.get("status") or "stopped")
        if vm["status"] not in ("stopped", "running"):
            raise SeedError(f"lab fixture {src}: seed VM {vmid} status must be 'stopped' or 'running'")
        create = vm.get("create") or {}
        if not create.get("name") or "net0" not in create:
            raise SeedError(
                f"lab fixture {src}: seed VM {vmid} needs create.name and create.net0 (with its MAC)"
            )
        vm["create"] = {k: _param(v) for k, v in create.items()}
        vm["root_config"] = {k: _param(v) for k, v in (vm.get("root_config") or {}).items()}
        vm["mac"] = _mac_of(vm["create"]["net0"], src, vmid)
    node = seed.setdefault("node", {})
    first = fixture["nodes"][0]
    if node.get("kernel_cmdline"):
        first["lab"] = {**(first.get("lab") or {}), "kernel_cmdline": str(node["kernel_cmdline"]).strip()}
    files = node.get("files") or {}
    if not isinstance(files, dict) or not all(
        isinstance(path, str) and path.startswith("/etc/") and ".." not in path and isinstance(text, str)
        for path, text in files.items()
    ):
        raise SeedError(
            f"lab fixture {src}: seed.node.files must map paths under /etc/ to each file's text ({files!r})"
        )
    if files:
        first["lab"] = {**(first.get("lab") or {}), "files": dict(files)}
    return seed


def _param(value: Any) -> str:
    """A fixture value as the API form-encodes it (booleans as 1/0)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _mac_of(net0: str, src: Path, vmid: int) -> str:
    mac = net0_mac({"net0": net0})
    if not mac:
        raise SeedError(f"lab fixture {src}: seed VM {vmid} net0 names no MAC ({net0!r})")
    return mac


_MAC_RE = re.compile(r"([0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5})")


def net0_mac(config: dict[str, Any]) -> str | None:
    """The MAC address of a VM's net0 (``virtio=BC:24:11:..,bridge=vmbr0``), lower case, or None."""
    net0 = config.get("net0")
    if not net0:
        return None
    m = _MAC_RE.search(str(net0))
    return m.group(1).lower() if m else None
