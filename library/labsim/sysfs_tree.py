"""Stand-in `/sys`, `/proc` and `/lib/modules` trees of the reference Proxmox node, and its boot outcome.

The fixture data in `data/pve-sysfs/` describe the reference PC (RTX 3090 at 0000:02:00.0 and its HDMI
audio at 0000:02:00.1, IOMMU group 13 of 16) in three states:

- ``stock``: a fresh install, nouveau bound to 02:00.0 and snd_hda_intel to 02:00.1;
- ``blacklisted``: the GPU's host drivers kept off, 02:00.0 bound to no driver, the audio still on
  snd_hda_intel;
- ``vfio``: both functions bound to vfio-pci.

`materialise(root, state)` writes a real directory tree (files, symlinks, directories) under `root` that
reads like the node's own: `root/sys/bus/pci/devices/...`, `root/sys/kernel/iommu_groups/...`,
`root/proc/cmdline`, `root/proc/modules`, `root/sys/module/...`,
`root/lib/modules/<release>/modules.alias` and `root/proc/sys/kernel/osrelease`. Variants for tests:
IOMMU off (no groups, no `iommu_group` links), the GPU sharing its IOMMU group with another device, and
another `/proc/cmdline`.

`boot_state(cmdline, modprobe_d)` is the pure decision the lab's node host makes at each simulated boot:
which of the three states the node reaches with that kernel command line and those `/etc/modprobe.d`
files (kmod and kernel rules: see its docstring).

The fixture text format (header of `pve-fixture-vfio.txt`): one entry per line, sorted by path::

    <path> = "<content>"     regular file, content in Python string escapes
    <path> = hex:<bytes>     binary file (PCI config space; trailing zero bytes elided, padded to 256)
    <path> -> <target>       symlink (relative target as readlink prints it)
    <path>/                  directory

Delta files prefix entries with ``+ `` (added or changed) or name removed paths with ``- ``.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
import shutil
import struct
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

STATES = ("stock", "blacklisted", "vfio")

#: Kernel release of the reference node (the initrd path in the fixtures' /proc/cmdline).
KERNEL_RELEASE = "6.17.2-1-pve"

#: The reference GPU's functions, their vendor:device ids and IOMMU group.
GPU_FUNCTIONS = {"0000:02:00.0": "10de:2204", "0000:02:00.1": "10de:1aef"}
GPU_IOMMU_GROUP = 13

#: Write-only sysfs attributes (mode 0200 on a real host).
_WRITE_ONLY = {"bind", "unbind", "new_id", "remove_id"}

_DATA = "pve-sysfs"
_ENTRY_FILE = re.compile(r'^(?P<path>/\S*) = (?P<value>".*"|hex:[0-9a-fA-F]*)$')
_ENTRY_LINK = re.compile(r"^(?P<path>/\S*) -> (?P<target>\S+)$")
_ENTRY_DIR = re.compile(r"^(?P<path>/\S*)/$")
_SECTION = re.compile(r"^=====\s*state=(?P<state>\w+):\s*(?P<what>.*?)\s*=====$")


@dataclass(frozen=True)
class Entry:
    """One node of a fixture tree: ``kind`` is "file" (bytes), "symlink" (target str) or "dir" (None)."""

    kind: str
    data: bytes | str | None = None


Tree = dict[str, Entry]


class FixtureError(ValueError):
    """A fixture line that does not follow the format."""


def parse_entry(line: str) -> tuple[str, Entry]:
    """Parse one fixture line (without a delta prefix) into its path and entry."""
    m = _ENTRY_FILE.match(line)
    if m:
        value = m.group("value")
        if value.startswith("hex:"):
            raw = bytes.fromhex(value[4:])
            data = raw + b"\0" * max(0, 256 - len(raw))
        else:
            text = ast.literal_eval(value)
            if not isinstance(text, str):
                raise FixtureError(f"not a string value: {line!r}")
            data = text.encode()
        return m.group("path"), Entry("file", data)
    m = _ENTRY_LINK.match(line)
    if m:
        return m.group("path"), Entry("symlink", m.group("target"))
    m = _ENTRY_DIR.match(line)
    if m:
        return m.group("path"), Entry("dir")
    raise FixtureError(f"unrecognised fixture line: {line!r}")


def _content_lines(text: str):
    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        yield line


def parse_tree(text: str) -> Tree:
    """Parse a full fixture tree (the `pve-fixture-vfio.txt` format) into {path: Entry}."""
    tree: Tree = {}
    for line in _content_lines(text):
        path, entry = parse_entry(line)
        tree[path] = entry
    return tree


def parse_delta(text: str) -> tuple[Tree, list[str]]:
    """Parse a delta file: returns (entries added or changed, paths removed)."""
    added: Tree = {}
    removed: list[str] = []
    for line in _content_lines(text):
        if line.startswith("+ "):
            path, entry = parse_entry(line[2:])
            added[path] = entry
        elif line.startswith("- "):
            removed.append(line[2:].strip())
        else:
            raise FixtureError(f"delta line without '+ ' or '- ': {line!r}")
    return added, removed


def apply_delta(tree: Tree, added: Tree, removed: list[str]) -> Tree:
    """Return a copy of `tree` with a delta applied (a removed directory takes its children with it)."""
    out = dict(tree)
    for path in removed:
        prefix = path.rstrip("/") + "/"
        for key in [k for k in out if k == path or k.startswith(prefix)]:
            del out[key]
    out.update(added)
    return out


def parse_modules_state(text: str) -> tuple[str, Tree]:
    """Parse a `pve-modules-state-*.txt` file: returns (/proc/modules text, /sys/module entries)."""
    proc_lines: list[str] = []
    tree: Tree = {}
    section = ""
    for raw in text.splitlines():
        m = _SECTION.match(raw.strip())
        if m:
            section = m.group("what")
            continue
        if not raw.strip() or raw.startswith("#"):
            continue
        if section.startswith("/proc/modules"):
            proc_lines.append(raw.strip())
        elif section.startswith("/sys/module"):
            path, entry = parse_entry(raw.strip())
            tree[path] = entry
    return "".join(line + "\n" for line in proc_lines), tree


def parse_modules_alias(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """Parse `pve-modules-alias.txt`: returns ([(pattern, module)], [modules.order lines])."""
    aliases: list[tuple[str, str]] = []
    order: list[str] = []
    for line in _content_lines(text):
        words = line.split()
        if words[0] == "alias" and len(words) == 3:
            aliases.append((words[1], words[2]))
        elif line.startswith("kernel/") and line.endswith(".ko"):
            order.append(line.strip())
    return aliases, order


def _data(name: str) -> str:
    return resources.files("labsim").joinpath("data", _DATA, name).read_text(encoding="utf-8")


def _base_tree(state: str) -> Tree:
    if state not in STATES:
        raise ValueError(f"unknown state {state!r}: expected one of {', '.join(STATES)}")
    tree = parse_tree(_data("pve-fixture-vfio.txt"))
    if state != "vfio":
        tree = apply_delta(tree, *parse_delta(_data(f"pve-fixture-{state}.delta.txt")))
    proc_modules, sys_module = parse_modules_state(_data(f"pve-modules-state-{state}.txt"))
    tree["/proc/modules"] = Entry("file", proc_modules.encode())
    tree.update(sys_module)
    # Drivers' `module` links point into /sys/module, which has a directory for every module a driver
    # comes from (built-in ones included) even where the state files list no attributes for it.
    for path, entry in list(tree.items()):
        if path.startswith("/sys/bus/pci/drivers/") and path.endswith("/module") and entry.kind == "symlink":
            target = posixpath.normpath(posixpath.join(posixpath.dirname(path), str(entry.data)))
            if not any(k == target or k.startswith(target + "/") for k in tree):
                tree[target] = Entry("dir")
    aliases, order = parse_modules_alias(_data("pve-modules-alias.txt"))
    moddir = f"/lib/modules/{KERNEL_RELEASE}"
    alias_text = "# Aliases extracted from modules themselves.\n" + "".join(
        f"alias {pattern} {module}\n" for pattern, module in aliases
    )
    tree[f"{moddir}/modules.alias"] = Entry("file", alias_text.encode())
    tree[f"{moddir}/modules.order"] = Entry("file", "".join(f"{o}\n" for o in order).encode())
    tree["/proc/sys/kernel/osrelease"] = Entry("file", f"{KERNEL_RELEASE}\n".encode())
    return tree


def _device_dir(tree: Tree, address: str) -> str:
    link = tree.get(f"/sys/bus/pci/devices/{address}")
    if link is None or link.kind != "symlink":
        raise ValueError(f"no PCI device {address} in the fixture")
    return posixpath.normpath(f"/sys/bus/pci/devices/{link.data}")


def _iommu_off(tree: Tree) -> Tree:
    out = {k: v for k, v in tree.items() if not k.startswith("/sys/kernel/iommu_groups/")}
    out = {k: v for k, v in out.items() if not k.endswith("/iommu_group")}
    out["/sys/kernel/iommu_groups/"] = Entry("dir")
    return out


def _share_group(tree: Tree, address: str) -> Tree:
    if address in GPU_FUNCTIONS:
        raise ValueError(f"{address} is one of the GPU's own functions")
    devdir = _device_dir(tree, address)
    link = tree.get(f"{devdir}/iommu_group")
    if link is None:
        raise ValueError(f"{address} has no IOMMU group in this tree (IOMMU off?)")
    old_group = PurePosixPath(str(link.data)).name
    depth = devdir.count("/") - 1  # from the device dir up to /sys
    out = dict(tree)
    out[f"{devdir}/iommu_group"] = Entry("symlink", "../" * depth + f"kernel/iommu_groups/{GPU_IOMMU_GROUP}")
    member = f"/sys/kernel/iommu_groups/{old_group}/devices/{address}"
    target = out.pop(member)
    out[f"/sys/kernel/iommu_groups/{GPU_IOMMU_GROUP}/devices/{address}"] = target
    prefix = f"/sys/kernel/iommu_groups/{old_group}/devices/"
    if not any(k.startswith(prefix) for k in out):
        for key in [k for k in out if k.startswith(f"/sys/kernel/iommu_groups/{old_group}/")]:
            del out[key]
    return out


def build_tree(
    state: str,
    *,
    iommu: bool = True,
    share_group_with: str | None = None,
    cmdline: str | None = None,
    pci: list[dict] | None = None,
    card_states: dict[str, str] | None = None,
    hardware: dict | None = None,
    bindings: dict[str, str | None] | None = None,
    builtin: list[str] | None = None,
) -> Tree:
    """The tree for `state`, with the test variants applied.

    `pci`: another node's PCI functions (a fixture node's ``pci`` list): its devices replace the reference
    PC's (:func:`node_pci_tree`); the modules, the command line and the rest stay the reference's.
    `iommu=False`: no IOMMU groups and no `iommu_group` links (firmware VT-d/AMD-Vi off).
    `share_group_with`: a PCI address moved into the GPU's IOMMU group (e.g. "0000:03:00.0").
    `cmdline`: the running kernel command line for /proc/cmdline (a newline is added when missing).
    `hardware`: a fixture node's ``hardware`` (:func:`hardware_files`: interrupt remapping, address widths, the
    boot framebuffer), always applied with its defaults.
    `bindings`: with `pci`, the driver each card function reached at boot (:func:`boot_drivers`), over its
    card state's default. `builtin`: modules built into the kernel (``modules.builtin``; a fixture node's
    ``kernel_builtin``).
    """
    tree = _base_tree(state)
    if pci:
        tree = node_pci_tree(tree, state, pci, card_states, bindings, builtin, cmdline)
    else:
        tree.update(REFERENCE_RESET)
    tree.update(hardware_files(hardware or {}, iommu))
    if share_group_with:
        tree = _share_group(tree, share_group_with)
    if not iommu:
        tree = _iommu_off(tree)
    if cmdline is not None:
        tree["/proc/cmdline"] = Entry("file", (cmdline.rstrip("\n") + "\n").encode())
    return tree


def materialise(root: Path, state: str, **variants: Any) -> Path:
    """Write the tree for `state` under `root` (replacing an earlier one there) and return `root`;
    `variants` are build_tree's keywords (iommu, share_group_with, cmdline, pci, card_states, hardware,
    bindings, builtin).

    `root/sys`, `root/proc` and `root/lib/modules` are removed first, so calling it again at each
    simulated boot leaves exactly the new state. `root` must not be the machine's own root.
    """
    root = Path(root)
    if root.resolve() == Path("/"):
        raise ValueError("materialise() refuses to write into / (give a separate directory)")
    tree = build_tree(state, **variants)
    for top in ("sys", "proc", "lib/modules"):
        target = root / top
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
    root.mkdir(parents=True, exist_ok=True)
    for path in sorted(tree):
        entry = tree[path]
        dest = root / path.strip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if entry.kind == "dir":
            dest.mkdir(parents=True, exist_ok=True)
        elif entry.kind == "symlink":
            os.symlink(str(entry.data), dest)
        else:
            assert isinstance(entry.data, bytes)
            dest.write_bytes(entry.data)
            if dest.name in _WRITE_ONLY:
                dest.chmod(0o200)
    return root


# --- another node's devices ---------------------------------------------------------------------------

#: The driver a device of another node binds, by PCI class (base class and subclass), where the reference
#: tree has that driver; other devices bind none. The NVIDIA card's functions follow the boot state.
CLASS_DRIVERS = {
    "0x0604": "pcieport",
    "0x0108": "nvme",
    "0x0106": "ahci",
    "0x0c03": "xhci_hcd",
    "0x0403": "snd_hda_intel",
    "0x0200": "igc",
    "0x0780": "mei_me",
    "0x0c05": "i801_smbus",
}
#: The drivers of the card's display function and of its other functions in each state.
GPU_STATE_DRIVERS = {
    "stock": ("nouveau", "snd_hda_intel"),
    "blacklisted": (None, "snd_hda_intel"),
    "vfio": ("vfio-pci", "vfio-pci"),
}
#: The DRM driver of another vendor's display controller (an iGPU beside the card): Intel's i915 (its xe only
#: from Lunar Lake on), AMD's amdgpu.
DISPLAY_DRIVERS = {"8086": "i915", "1002": "amdgpu"}
#: The module a driver's name comes from where they differ (drivers/usb/host/xhci-pci.c registers "xhci_hcd",
#: drivers/i2c/busses/i2c-nvidia-gpu.c "nvidia-gpu", drivers/vfio/pci/vfio_pci.c "vfio-pci").
DRIVER_MODULES = {"xhci_hcd": "xhci_pci", "nvidia-gpu": "i2c_nvidia_gpu", "vfio-pci": "vfio_pci"}
MODULE_DRIVERS = {module: driver for driver, module in DRIVER_MODULES.items()}
#: Where these modules sit under /lib/modules/<release> (modules.builtin lists the paths of built-in ones).
MODULE_PATHS = {
    "xhci_pci": "kernel/drivers/usb/host/xhci-pci.ko",
    "xhci_hcd": "kernel/drivers/usb/host/xhci-hcd.ko",
    "i2c_nvidia_gpu": "kernel/drivers/i2c/busses/i2c-nvidia-gpu.ko",
    "i915": "kernel/drivers/gpu/drm/i915/i915.ko",
    "amdgpu": "kernel/drivers/gpu/drm/amd/amdgpu/amdgpu.ko",
}
#: Aliases the recorded modules.alias lacks, from each driver's id table at v6.17 (constructed):
#: xhci-pci.c PCI_DEVICE_CLASS(PCI_CLASS_SERIAL_USB_XHCI, ~0); i2c-nvidia-gpu.c NVIDIA with class
#: PCI_CLASS_SERIAL_UNKNOWN (the Turing cards' UCSI function); i915_pciids.h INTEL_VGA_DEVICE for the Comet Lake
#: UHD 630 (0x9bc5, class mask on the base class only).
MORE_ALIASES = (
    ("pci:v*d*sv*sd*bc0Csc03i30*", "xhci_pci"),
    ("pci:v000010DEd*sv*sd*bc0Csc80i*", "i2c_nvidia_gpu"),
    ("pci:v00008086d00009BC5sv*sd*bc03sc*i*", "i915"),
)
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_PCI_PREFIXES = ("/sys/devices/pci0000:00/", "/sys/bus/pci/devices/", "/sys/kernel/iommu_groups/")


def reference_addresses() -> set[str]:
    """The PCI addresses of the reference PC's recorded tree."""
    tree = parse_tree(_data("pve-fixture-vfio.txt"))
    prefix = "/sys/bus/pci/devices/"
    return {k[len(prefix) :] for k in tree if k.startswith(prefix)}


def gpu_cards_of(pci: list[dict]) -> list[dict[str, str]]:
    """A node's NVIDIA cards, in address order: for each NVIDIA display controller, every function of its slot
    as {address: vendor:device}."""

    def hex4(value: str) -> str:
        return f"{int(str(value), 16):04x}"

    slots = sorted(
        {
            str(d["id"]).lower().rsplit(".", 1)[0]
            for d in pci
            if hex4(d["vendor"]) == "10de" and str(d.get("class", "")).startswith("0x03")
        }
    )
    return [
        {
            str(d["id"]).lower(): f"{hex4(d['vendor'])}:{hex4(d['device'])}"
            for d in pci
            if str(d["id"]).lower().rsplit(".", 1)[0] == slot
        }
        for slot in slots
    ]


def _config_space(vendor: int, device: int, cls: int, sub_vendor: int, sub_device: int) -> bytes:
    """A type-0 header (vendor, device, command, status, revision, class, header type, subsystem ids)."""
    head = struct.pack("<HHHHB", vendor, device, 0x0406, 0x0010, 0xA1) + cls.to_bytes(3, "little")
    head += bytes([0, 0, 0x80 if cls >> 16 == 0x03 else 0, 0])
    head += b"\0" * (0x2C - len(head)) + struct.pack("<HH", sub_vendor, sub_device)
    return head + b"\0" * (256 - len(head))


def node_pci_tree(
    tree: Tree,
    state: str,
    pci: list[dict],
    card_states: dict[str, str] | None = None,
    bindings: dict[str, str | None] | None = None,
    builtin: list[str] | None = None,
    cmdline: str | None = None,
) -> Tree:
    """`tree` with its PCI devices, IOMMU groups and driver bindings replaced by those of ``pci`` (a fixture
    node's list: ``id``, ``class``, ``vendor``, ``device``, ``subsystem_vendor``, ``subsystem_device``,
    ``iommugroup``, ``boot_vga``), every device directly on the root bus. Each NVIDIA card
    (:func:`gpu_cards_of`) binds the drivers of its own state (``card_states``, by the card's first
    address; ``state`` for a card it does not name); other devices their class's driver
    (:data:`CLASS_DRIVERS`) where the reference tree has it, a display controller of another vendor its DRM
    driver (:data:`DISPLAY_DRIVERS`) unless ``nomodeset`` is on ``cmdline``. ``bindings`` (a function's driver
    after the boot, :func:`boot_drivers`) overrides a card function's; ``builtin`` lists the modules built into
    the kernel (``modules.builtin``, their aliases in ``modules.builtin.alias``); a loaded module's driver is
    in ``/proc/modules``."""
    builtin_set = {_norm(m) for m in builtin or []}
    kms_off = nomodeset_on(cmdline or "")
    group_type = tree.get("/sys/kernel/iommu_groups/0/type", Entry("file", b"DMA-FQ\n"))
    out: Tree = {}
    for path, entry in tree.items():
        if path.startswith(_PCI_PREFIXES):
            continue
        parts = path.split("/")
        if path.startswith("/sys/bus/pci/drivers/") and len(parts) == 7 and _PCI_ADDRESS.match(parts[6]):
            continue
        out[path] = entry
    drivers = {
        p.split("/")[5] for p in out if p.startswith("/sys/bus/pci/drivers/") and len(p.split("/")) > 5
    }
    card_of: dict[str, tuple[str, bool]] = {}  # function -> (its card's state, is the display function)
    for card in gpu_cards_of(pci):
        display = min(card)
        for addr in card:
            card_of[addr] = ((card_states or {}).get(display, state), addr == display)
    for dev in pci:
        addr = str(dev["id"]).lower()
        cls = int(str(dev["class"]), 16)
        vendor, device = int(str(dev["vendor"]), 16), int(str(dev["device"]), 16)
        sv = int(str(dev.get("subsystem_vendor") or "0"), 16)
        sd = int(str(dev.get("subsystem_device") or "0"), 16)
        if addr in card_of:
            card_state, is_display = card_of[addr]
            driver = GPU_STATE_DRIVERS[card_state][0 if is_display else 1]
            if bindings and addr in bindings:
                driver = bindings[addr]
            if driver and driver not in drivers:  # a card in another state than the node's first one
                _add_driver(out, driver)
                drivers.add(driver)
        elif cls >> 16 == 0x03 and f"{vendor:04x}" in DISPLAY_DRIVERS:
            # drivers/video/nomodeset.c: every DRM driver refuses to load under nomodeset (i915_check_nomodeset)
            driver = None if kms_off else DISPLAY_DRIVERS[f"{vendor:04x}"]
            if driver and driver not in drivers:
                _add_driver(out, driver)
                drivers.add(driver)
        else:
            driver = CLASS_DRIVERS.get(f"0x{cls >> 8:04x}")
        if driver not in drivers:
            driver = None
        d = f"/sys/devices/pci0000:00/{addr}"
        files = {
            "vendor": f"0x{vendor:04x}\n",
            "device": f"0x{device:04x}\n",
            "subsystem_vendor": f"0x{sv:04x}\n",
            "subsystem_device": f"0x{sd:04x}\n",
            "class": f"0x{cls:06x}\n",
            "revision": "0xa1\n",
            "irq": "16\n",
            "driver_override": "(null)\n",
            "enable": "1\n" if driver not in (None, "vfio-pci") else "0\n",
            "modalias": f"pci:v{vendor:08X}d{device:08X}sv{sv:08X}sd{sd:08X}"
            f"bc{cls >> 16:02X}sc{(cls >> 8) & 0xFF:02X}i{cls & 0xFF:02X}\n",
        }
        if cls >> 16 == 0x03:
            files["boot_vga"] = "1\n" if dev.get("boot_vga") else "0\n"
        methods = dev.get("reset_method", "flr bus" if vendor == 0x10DE else None)
        if (
            methods is not None
        ):  # drivers/pci/pci-sysfs.c: reset_method lists the methods; reset only with one
            files["reset_method"] = f"{methods}\n"
            if str(methods).strip():
                out[f"{d}/reset"] = Entry("file", b"")
        if dev.get("bars"):
            files["resource"] = resource_text(dev["bars"])
        for name, text in files.items():
            out[f"{d}/{name}"] = Entry("file", text.encode())
        out[f"{d}/config"] = Entry("file", _config_space(vendor, device, cls, sv, sd))
        out[f"/sys/bus/pci/devices/{addr}"] = Entry("symlink", f"../../../devices/pci0000:00/{addr}")
        if driver:
            out[f"{d}/driver"] = Entry("symlink", f"../../../bus/pci/drivers/{driver}")
            out[f"/sys/bus/pci/drivers/{driver}/{addr}"] = Entry(
                "symlink", f"../../../../devices/pci0000:00/{addr}"
            )
        if dev.get("iommugroup") is not None:
            group = int(dev["iommugroup"])
            out[f"{d}/iommu_group"] = Entry("symlink", f"../../../kernel/iommu_groups/{group}")
            out[f"/sys/kernel/iommu_groups/{group}/devices/{addr}"] = Entry(
                "symlink", f"../../../../devices/pci0000:00/{addr}"
            )
            out[f"/sys/kernel/iommu_groups/{group}/type"] = group_type
    _module_files(out, builtin_set)
    return out


def _add_driver(out: Tree, driver: str) -> None:
    """A PCI driver's directory: its write-only files and its `module` link into /sys/module."""
    for name in sorted(_WRITE_ONLY):
        out[f"/sys/bus/pci/drivers/{driver}/{name}"] = Entry("file", b"")
    module = DRIVER_MODULES.get(driver, driver.replace("-", "_"))
    out[f"/sys/bus/pci/drivers/{driver}/module"] = Entry("symlink", f"../../../../module/{module}")
    out.setdefault(f"/sys/module/{module}/", Entry("dir"))


def _module_files(out: Tree, builtin: set[str]) -> None:
    """modules.builtin and the aliases of the modules :data:`MORE_ALIASES` adds (built-in ones in
    modules.builtin.alias, as depmod splits them), and a /proc/modules line for each loaded module a PCI driver
    of the tree comes from."""
    moddir = f"/lib/modules/{KERNEL_RELEASE}"
    paths = [MODULE_PATHS.get(m, f"kernel/{m}.ko") for m in sorted(builtin)]
    out[f"{moddir}/modules.builtin"] = Entry("file", "".join(f"{p}\n" for p in paths).encode())
    alias = out[f"{moddir}/modules.alias"].data
    assert isinstance(alias, bytes)
    extra = "".join(f"alias {pat} {mod}\n" for pat, mod in MORE_ALIASES if mod not in builtin)
    out[f"{moddir}/modules.alias"] = Entry("file", alias + extra.encode())
    inside = "".join(f"alias {pat} {mod}\n" for pat, mod in MORE_ALIASES if mod in builtin)
    out[f"{moddir}/modules.builtin.alias"] = Entry("file", inside.encode())
    proc = out["/proc/modules"].data
    assert isinstance(proc, bytes)
    loaded = {line.split()[0] for line in proc.decode().splitlines() if line.split()}
    bound = {
        str(e.data).rsplit("/", 1)[-1]
        for p, e in out.items()
        if p.startswith("/sys/devices/pci0000:00/") and p.endswith("/driver") and e.kind == "symlink"
    }
    for driver in sorted(bound):
        module = DRIVER_MODULES.get(driver, driver.replace("-", "_"))
        if module in MODULE_PATHS and module not in builtin and module not in loaded:
            proc += f"{module} 16384 0 - Live 0x0000000000000000\n".encode()
    out["/proc/modules"] = Entry("file", proc)


_SIZE = re.compile(r"^(\d+)([KMGT]?)$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# resource flags (include/linux/ioport.h): IORESOURCE_MEM 0x200, _IO 0x100, _PREFETCH 0x2000, _MEM_64 0x100000,
# _SIZEALIGN 0x40000; the values the recorded 3090 tree shows for its BARs
_BAR_FLAGS = {"mem32": 0x40200, "mem64pref": 0x14220C, "io": 0x40101}


def resource_text(bars: list) -> str:
    """A `resource` file (pci-sysfs.c `resource_show`: one `start end flags` line per resource, 13 lines on
    x86) for BAR sizes in lspci's notation (``16M``, ``32G``; ``128`` for the I/O BAR; None for an unused or
    the upper half of a 64-bit BAR), in BAR order. BAR 0 is 32-bit memory, the last sized one I/O when it is
    below 1 KiB, the others 64-bit prefetchable memory, placed one after another as firmware would."""
    lines = []
    mem32, mem64, io = 0xDE000000, 0x6000000000, 0xE000
    for i, size in enumerate(list(bars) + [None] * (13 - len(bars))):
        m = _SIZE.match(str(size)) if size is not None else None
        if not m:
            lines.append((0, 0, 0))
            continue
        n = int(m.group(1)) * _UNITS[m.group(2)]
        if n < 1024:
            start, kind, io = io, "io", io + max(n, 0x80)
        elif i == 0:
            start, kind, mem32 = mem32, "mem32", mem32 + n
        else:
            mem64 = (mem64 + n - 1) // n * n
            start, kind, mem64 = mem64, "mem64pref", mem64 + n
        lines.append((start, start + n - 1, _BAR_FLAGS[kind]))
    return "".join(f"0x{a:016x} 0x{b:016x} 0x{c:016x}\n" for a, b, c in lines)


#: The reference card's reset methods, which the recorded tree lacks (constructed: "flr bus", what the kernel
#: lists for an endpoint with FLReset+ alone on its bus; RTX 4090 and RTX A-series captures show FLReset+).
REFERENCE_RESET = {
    f"/sys/devices/pci0000:00/0000:00:1b.0/{addr}/{name}": Entry("file", text)
    for addr in GPU_FUNCTIONS
    for name, text in (("reset_method", b"flr bus\n"), ("reset", b""))
}


def hardware_files(hardware: dict, iommu: bool = True) -> Tree:
    """The node's /proc and /sys files that `gpulab doctor` reads besides the PCI devices, from a fixture node's
    ``hardware``: ``interrupt_remapping`` (default true: /proc/interrupts shows IR- chips, Linux
    arch/x86/kernel/apic/msi.c "IR-PCI-MSI"; false: plain PCI-MSI), ``cpu_address_bits`` (39; /proc/cpuinfo
    "address sizes"), ``iommu_address_bits`` (39; the Intel IOMMU's cap register, MGAW bits 21:16 + 1) and
    ``framebuffer`` (none, simpledrm, efifb or simplefb: /proc/fb)."""
    ir = hardware.get("interrupt_remapping", True)
    chip = "IR-PCI-MSI" if ir else "PCI-MSI"
    apic = "IR-IO-APIC" if ir else "IO-APIC"
    interrupts = (
        "            CPU0       CPU1\n"
        f"   1:          0          9  {apic}    1-edge      i8042\n"
        f" 122:          0     118213  {chip}-0000:00:17.0    0-edge      ahci[0000:00:17.0]\n"
        f" 125:          0      53118  {chip}-0000:03:00.0    0-edge      enp3s0\n"
    )
    cpu_bits = int(hardware.get("cpu_address_bits", 39))
    out: Tree = {
        "/proc/interrupts": Entry("file", interrupts.encode()),
        "/proc/cpuinfo": Entry(
            "file", f"processor\t: 0\naddress sizes\t: {cpu_bits} bits physical, 48 bits virtual\n".encode()
        ),
    }
    fb = {"simpledrm": "0 simpledrmdrmfb\n", "efifb": "0 EFI VGA\n", "simplefb": "0 simple\n"}
    holder = str(hardware.get("framebuffer", "none"))
    out["/proc/fb"] = Entry("file", fb.get(holder, "").encode())
    # the firmware's framebuffer shows as BOOTFB inside the boot GPU's BAR 1 while a framebuffer holds it
    iomem = "00000000-00000fff : Reserved\n00100000-7fffffff : System RAM\n6000000000-600fffffff : PCI Bus 0000:02\n"
    if holder in fb:
        iomem += "  6000000000-60007e8fff : BOOTFB\n"
    out["/proc/iomem"] = Entry("file", iomem.encode())
    if iommu:
        mgaw = int(hardware.get("iommu_address_bits", 39)) - 1
        cap = (0x00D2008C40660462 & ~(0x3F << 16)) | (mgaw << 16)
        out["/sys/class/iommu/dmar0/intel-iommu/cap"] = Entry("file", f"{cap:x}\n".encode())
    return out


# --- boot outcome -------------------------------------------------------------------------------------


def _norm(module: str) -> str:
    """kmod treats '-' and '_' in module names as the same character."""
    return module.strip().replace("-", "_")


# A word: runs of non-blanks and double-quoted stretches (an unclosed quote runs to the end of the line).
_CMDLINE_WORD = re.compile(r'(?:"[^"]*"?|[^\s"])+')


def split_cmdline(cmdline: str) -> list[str]:
    """Split a kernel command line into words; double quotes protect spaces (kernel `next_arg` rules)."""
    return _CMDLINE_WORD.findall(cmdline.strip())


@dataclass
class _ModprobeConfig:
    blacklist: set[str]
    blocked: set[str]  # install <mod> /bin/false|true
    options: dict[str, list[str]]
    softdep_pre: dict[str, list[str]]


def _parse_modprobe_d(files: dict[str, str]) -> _ModprobeConfig:
    cfg = _ModprobeConfig(set(), set(), {}, {})
    # kmod reads *.conf files in name order; a later file of the same name elsewhere would shadow, n/a here.
    for name in sorted(files):
        if not name.endswith(".conf"):
            continue
        text = files[name].replace("\\\n", " ")
        for raw in text.splitlines():
            words = raw.split("#", 1)[0].split()
            if len(words) < 2:
                continue
            cmd, module = words[0], _norm(words[1])
            if cmd == "blacklist":
                cfg.blacklist.add(module)
            elif cmd == "install" and len(words) >= 3 and words[2] in ("/bin/false", "/bin/true"):
                cfg.blocked.add(module)
            elif cmd == "options":
                cfg.options.setdefault(module, []).extend(words[2:])
            elif cmd == "softdep":
                mode = ""
                for word in words[2:]:
                    if word in ("pre:", "post:"):
                        mode = word
                    elif mode == "pre:":
                        cfg.softdep_pre.setdefault(module, []).append(_norm(word))
    return cfg


def _vfio_ids(options: list[str]) -> set[str]:
    ids: set[str] = set()
    for opt in options:
        if opt.startswith("ids="):
            for item in opt[4:].strip('"').split(","):
                parts = item.strip().lower().split(":")
                if len(parts) >= 2:
                    ids.add(f"{parts[0]}:{parts[1]}")
    return ids


def nomodeset_on(cmdline: str) -> bool:
    """Whether the kernel reads ``nomodeset`` from this command line: the kernel matches a __setup() name as a
    prefix of the word and ignores the rest, so nomodeset=0 is nomodeset too (init/main.c obsolete_checksetup,
    drivers/video/nomodeset.c)."""
    return any(_norm(word.partition("=")[0]).startswith("nomodeset") for word in split_cmdline(cmdline))


def _function_modules(cls: str | None, display: bool) -> list[str]:
    """The modules that could bind a card function at boot, in modules.order: by its class where the node's
    list gives it (xHCI 0x0c03, the UCSI function 0x0c80), else the display's or the HD audio's."""
    if display:
        return ["nvidiafb", "nouveau", "nova_core"]
    code = str(cls or "").lower()
    if code.startswith("0x0c03"):
        return ["xhci_pci"]
    if code.startswith("0x0c80"):
        return ["i2c_nvidia_gpu"]
    return ["snd_hda_intel"]


def boot_drivers(
    cmdline: str,
    modprobe_d: dict[str, str],
    modules_load: str = "",
    gpu_functions: dict[str, str] | None = None,
    classes: dict[str, str] | None = None,
    builtin: list[str] | None = None,
) -> dict[str, str | None]:
    """The driver each function of the card holds after a boot (None: no driver); see :func:`boot_state`.

    `classes` ({address: "0x0c0330"}) picks each non-display function's candidate modules
    (:func:`_function_modules`); `builtin` lists the modules built into the kernel: a built-in driver registers
    at its initcall, before the initramfs loads any module, so it binds its function whatever modprobe.d,
    ``modprobe.blacklist=`` or a softdep say (kmod applies them to loadable modules only), and vfio-pci, a
    module, cannot take the function from it at boot.
    """
    functions = gpu_functions or GPU_FUNCTIONS
    display, *others = sorted(functions)
    inside = {_norm(m) for m in builtin or []}
    cfg = _parse_modprobe_d(modprobe_d)
    kernel_blacklist: set[str] = set()
    nomodeset = nomodeset_on(cmdline)
    for word in split_cmdline(cmdline):
        name, _sep, value = word.partition("=")
        value = value.strip('"')
        if name in ("modprobe.blacklist", "module_blacklist"):
            kernel_blacklist.update(_norm(m) for m in value.split(",") if m.strip())
        elif name in ("vfio-pci.ids", "vfio_pci.ids"):
            cfg.options.setdefault("vfio_pci", []).append(f"ids={value}")

    def kept_off(module: str) -> bool:
        module = _norm(module)
        if nomodeset and module in ("nouveau", "nvidiafb"):
            return True
        if module in inside:
            return False
        return module in cfg.blacklist or module in kernel_blacklist or module in cfg.blocked

    candidates = {
        address: _function_modules((classes or {}).get(address), address == display) for address in functions
    }
    # Modules that load at boot through some device's alias (snd_hda_intel also drives the board audio).
    loading = {m for mods in candidates.values() for m in mods if not kept_off(m) and m not in inside}
    listed = {_norm(line.split()[0]) for line in modules_load.splitlines() if line.split() and line[0] != "#"}
    vfio_loads = not kept_off("vfio_pci") and (
        "vfio_pci" in listed or any("vfio_pci" in cfg.softdep_pre.get(m, []) for m in loading)
    )
    ids = _vfio_ids(cfg.options.get("vfio_pci", []))

    def driver_of(address: str) -> str | None:
        native = [m for m in candidates[address] if not kept_off(m)]
        held = [m for m in native if m in inside]
        if held:
            return MODULE_DRIVERS.get(held[0], held[0])
        wins = not native or any("vfio_pci" in cfg.softdep_pre.get(m, []) for m in native)
        if vfio_loads and functions[address] in ids and wins:
            return "vfio-pci"
        return MODULE_DRIVERS.get(native[0], native[0]) if native else None

    return {address: driver_of(address) for address in [display, *others]}


def boot_state(
    cmdline: str,
    modprobe_d: dict[str, str],
    modules_load: str = "",
    gpu_functions: dict[str, str] | None = None,
    classes: dict[str, str] | None = None,
    builtin: list[str] | None = None,
) -> str:
    """Which state ("stock", "blacklisted" or "vfio") the node reaches when it boots.

    `cmdline`: the kernel command line the boot loader passes (the first line of /etc/kernel/cmdline, or
    what GRUB builds); `modprobe_d`: {file name: content} of /etc/modprobe.d; `modules_load`: the text of
    /etc/modules (and /etc/modules-load.d files) naming modules loaded at boot.

    Rules (kmod and kernel behaviour, see shared/reference/pve-host.md sections 2 and 4):
    - a host driver is kept off a device by `blacklist <mod>` in modprobe.d, `modprobe.blacklist=` or
      `module_blacklist=` on the command line, or `install <mod> /bin/false`; `nomodeset` (with any value, as
      the kernel reads it) also keeps the DRM/fbdev drivers nouveau and nvidiafb off (nova_core is neither);
    - 02:00.0 may bind nvidiafb, nouveau, nova_core (modules.order), 02:00.1 snd_hda_intel;
    - vfio-pci claims a function when vfio_pci loads at boot (listed in /etc/modules, or a `softdep
      <mod> pre: vfio-pci` of a module that does load) and its `ids=` (modprobe.d `options vfio-pci` or
      `vfio-pci.ids=` on the command line) name the function's vendor:device; it wins over a host driver
      that is not kept off only through that driver's own softdep (otherwise the host driver, loaded
      from the initramfs, binds first);
    - a driver built into the kernel (`builtin`) keeps its function (:func:`boot_drivers`).
    The result is "vfio" when vfio-pci holds the display function and every other function is on vfio-pci or
    on a built-in driver (Proxmox VE rebinds those when the VM starts); "stock" when a host driver holds the
    display function; otherwise "blacklisted" (the display function on no driver).
    `gpu_functions` ({address: vendor:device}, one of :func:`gpu_cards_of`): another node's card instead of
    the reference's 02:00 (its first function is the display controller, the others its audio, or by
    `classes` its USB functions).
    """
    drivers = boot_drivers(cmdline, modprobe_d, modules_load, gpu_functions, classes, builtin)
    return state_of(drivers, builtin)


def state_of(drivers: dict[str, str | None], builtin: list[str] | None = None) -> str:
    """The boot state (:func:`boot_state`) of the drivers :func:`boot_drivers` gave, its display function first."""
    display, *others = drivers
    inside = {MODULE_DRIVERS.get(_norm(m), _norm(m)) for m in builtin or []}
    gpu = drivers[display]
    if gpu == "vfio-pci" and all(drivers[a] == "vfio-pci" or drivers[a] in inside for a in others):
        return "vfio"
    if gpu is not None and gpu != "vfio-pci":
        return "stock"
    return "blacklisted"
