#!/usr/bin/python
"""Ansible module pci_facts: PCI passthrough facts of a Proxmox node from sysfs and /proc."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: pci_facts
short_description: PCI passthrough facts of a Linux host (IOMMU groups, drivers, modules) from sysfs
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Reads C(/sys) and C(/proc) the way C(lspci -nnk) and C(lsmod) see them and returns them as the fact
    C(gpulab_pci).
  - IOMMU state and groups from C(/sys/kernel/iommu_groups); every PCI function with its class,
    vendor:device, subsystem, revision, the driver in use (C(driver) link), the kernel modules that could
    drive it (its C(modalias) matched against C(/lib/modules/<release>/modules.alias), as lspci's
    "Kernel modules" line, blacklists not applied), C(boot_vga) and its IOMMU group; the loaded modules
    (C(/proc/modules)); the running kernel command line (C(/proc/cmdline)).
  - For each slot named in O(slots) it also summarises the device's functions, their IOMMU groups and
    any other device sharing those groups.
  - Runs on the managed host with the Python standard library only. Never changes anything.
options:
  root:
    description:
      - Directory that holds the C(sys), C(proc) and C(lib/modules) trees to read.
      - V(/) on a real host; a fixture tree (see C(labsim.sysfs_tree)) in tests and in the lab.
    type: path
    default: /
  slots:
    description:
      - PCI slots (C(dddd:bb:dd), all functions) or single functions (C(dddd:bb:dd.f)) to summarise
        under RV(ansible_facts.gpulab_pci.slots).
      - A slot given without its domain (C(02:00)) gets domain C(0000); results are keyed by the slot as given.
    type: list
    elements: str
    default: []
  allowed_drivers:
    description:
      - Drivers the functions of O(slots) may be bound to; a function on any other driver is listed in
        RV(ansible_facts.gpulab_pci.binding_problems). A function on no driver is always accepted.
      - Empty (the default) checks nothing.
      - With O(builtin_rebind) a function that is not a display controller and whose driver is built into
        the kernel is listed in RV(ansible_facts.gpulab_pci.rebind_at_start) instead.
    type: list
    elements: str
    default: []
  builtin_rebind:
    description:
      - Accept a function of O(slots) held by a driver built into the kernel (its module in
        C(/lib/modules/<release>/modules.builtin)), when O(allowed_drivers) names C(vfio-pci) and the function
        is not the card's display controller (class C(0x03xx)). A built-in driver binds before any module
        loads, so no softdep can put vfio-pci first; Proxmox VE unbinds every function of the card's IOMMU
        group and binds it to vfio-pci when the VM starts (qemu-server C(PVE::QemuServer::PCI)
        C(prepare_pci_device), pve-common C(PVE::SysFSTools::pci_dev_group_bind_to_vfio)).
      - The display function stays strict, because its host driver also holds the console and the framebuffer.
    type: bool
    default: true
  forbidden_modules:
    description:
      - Modules that must not be loaded; those loaded are listed in
        RV(ansible_facts.gpulab_pci.module_problems). C(-) and C(_) count as the same character.
    type: list
    elements: str
    default: []
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes.facts
  - gpulab.homelab.attributes
attributes:
  facts:
    support: full
notes:
  - The C(Kernel modules) list depends on the running kernel's C(modules.alias); when that file is missing
    the lists are empty and RV(ansible_facts.gpulab_pci.warnings) says so.
"""

EXAMPLES = r"""
- name: Read PCI passthrough facts for the GPU
  gpulab.homelab.pci_facts:
    slots:
      - "0000:02:00"

- name: Fail when the GPU shares its IOMMU group
  ansible.builtin.assert:
    that: ansible_facts.gpulab_pci.slots['0000:02:00'].other_devices | length == 0
"""

RETURN = r"""
ansible_facts:
  description: Facts under the key C(gpulab_pci).
  returned: always
  type: dict
  contains:
    gpulab_pci:
      description: PCI passthrough facts.
      type: dict
      contains:
        root:
          description: The root that was read.
          type: str
          sample: /
        kernel_release:
          description: Running kernel release (C(/proc/sys/kernel/osrelease)).
          type: str
          sample: 6.17.2-1-pve
        cmdline:
          description: The running kernel command line, without the trailing newline.
          type: str
          sample: initrd=\EFI\proxmox\6.17.2-1-pve\initrd.img-6.17.2-1-pve root=ZFS=rpool/ROOT/pve-1 boot=zfs
        efi:
          description: Whether the system booted with UEFI (C(/sys/firmware/efi) exists).
          type: bool
        iommu:
          description: IOMMU state.
          type: dict
          contains:
            enabled:
              description: True when the kernel created IOMMU groups.
              type: bool
            groups:
              description: Group number (as a string) to the sorted addresses in it.
              type: dict
              sample: {"13": ["0000:02:00.0", "0000:02:00.1"]}
        devices:
          description: Every PCI function by full address.
          type: dict
          sample:
            "0000:02:00.0":
              address: "0000:02:00.0"
              slot: "0000:02:00"
              class: "0x030000"
              class_code: "0300"
              vendor_device: "10de:2204"
              subsystem: "1462:3881"
              revision: "a1"
              driver: vfio-pci
              modules: [nvidiafb, nouveau, nova_core]
              iommu_group: 13
              boot_vga: true
              driver_module: vfio_pci
              driver_builtin: false
        builtin_modules:
          description: The modules built into the running kernel (C(modules.builtin)), C(-) as C(_).
          type: list
          elements: str
          sample: [xhci_hcd, xhci_pci]
        display_adapters:
          description: >-
            Every display controller (class C(0x03xx)), whichever vendor: address, vendor_device, class,
            boot_vga, driver and modules (as under RV(ansible_facts.gpulab_pci.devices)).
          type: list
          elements: dict
        modules_loaded:
          description: >-
            Names of the loaded modules, in C(/proc/modules) order; without C(/proc/modules) (a kernel or
            container without it), the modules whose C(/sys/module/<name>/initstate) is C(live), sorted.
          type: list
          elements: str
        modules_source:
          description: Where RV(ansible_facts.gpulab_pci.modules_loaded) came from (C(/sys/module) when C(/proc/modules) is missing).
          type: str
          sample: /proc/modules
        slots:
          description: >-
            Per requested slot, its functions and what shares their IOMMU groups; C(builtin_drivers) names the
            functions on a built-in driver (with its module), C(display_functions) the display controllers.
          type: dict
          sample:
            "0000:02:00":
              slot: "0000:02:00"
              found: true
              functions: ["0000:02:00.0", "0000:02:00.1"]
              vendor_devices: ["10de:2204", "10de:1aef"]
              drivers: {"0000:02:00.0": vfio-pci, "0000:02:00.1": vfio-pci}
              builtin_drivers: {}
              display_functions: ["0000:02:00.0"]
              modules: [nvidiafb, nouveau, nova_core, snd_hda_intel]
              iommu_groups: [13]
              other_devices: []
              boot_vga: true
        binding_problems:
          description: Functions of O(slots) bound to a driver outside O(allowed_drivers), one line each.
          type: list
          elements: str
          sample: ["0000:02:00.0 (slot 0000:02:00) is bound to nouveau, not vfio-pci"]
        rebind_at_start:
          description: >-
            Functions of O(slots) on a built-in driver that Proxmox VE rebinds to vfio-pci when the VM starts
            (O(builtin_rebind)), one line each.
          type: list
          elements: str
          sample: ["0000:05:00.2 (slot 0000:05:00) is held by xhci_hcd, built into the kernel (xhci_pci in
            modules.builtin): ..."]
        module_problems:
          description: Loaded modules out of O(forbidden_modules), one line each.
          type: list
          elements: str
          sample: ["nouveau is loaded"]
        warnings:
          description: What could not be read and why.
          type: list
          elements: str
"""

import fnmatch  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def _read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return default


def _hex_attr(devdir, name):
    """A sysfs "0x%04x" style attribute as bare lower-case hex (no 0x), or None."""
    text = _read(os.path.join(devdir, name))
    if text is None:
        return None
    value = text.strip().lower()
    return value[2:] if value.startswith("0x") else value


def _link_name(path):
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def load_aliases(root, release, warnings):
    """The `alias pci:...` patterns of modules.alias (and modules.builtin.alias), in file order."""
    patterns = []
    moddir = os.path.join(root, "lib", "modules", release)
    found = False
    for name in ("modules.alias", "modules.builtin.alias"):
        text = _read(os.path.join(moddir, name))
        if text is None:
            continue
        found = True
        for line in text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0] == "alias" and words[1].startswith("pci:"):
                patterns.append((words[1], words[2]))
    if not found:
        warnings.append(
            f"no modules.alias under {moddir}: the possible kernel modules of each device are not known"
        )
    compiled = []
    for pattern, module in patterns:
        vendor = pattern[5:13] if len(pattern) >= 13 and pattern.startswith("pci:v") else ""
        vendor = "" if any(c in vendor for c in "*?[") else vendor.upper()
        compiled.append((vendor, re.compile(fnmatch.translate(pattern)), module))
    return compiled


def modules_for(modalias, aliases):
    """Modules whose alias matches `modalias`, in alias order without duplicates (libkmod lookup)."""
    if not modalias:
        return []
    vendor = modalias[5:13].upper() if modalias.startswith("pci:v") else ""
    out = []
    for pvendor, regex, module in aliases:
        if pvendor and pvendor != vendor:
            continue
        if regex.match(modalias) and module not in out:
            out.append(module)
    return out


def driver_module(root, driver):
    """The module a PCI driver comes from (its `module` link in sysfs), `-` as `_`; the driver's name without one."""
    if not driver:
        return None
    name = _link_name(os.path.join(root, "sys", "bus", "pci", "drivers", driver, "module"))
    return (name or driver).replace("-", "_")


def load_builtin(root, release):
    """The modules built into the kernel: the names of modules.builtin's paths (kernel/.../xhci-pci.ko)."""
    text = _read(os.path.join(root, "lib", "modules", release, "modules.builtin")) or ""
    names = []
    for line in text.splitlines():
        name = os.path.basename(line.strip())
        if name.endswith(".ko"):
            names.append(name[:-3].replace("-", "_"))
    return sorted(set(names))


def read_device(root, address, aliases, builtin=()):
    devdir = os.path.join(root, "sys", "bus", "pci", "devices", address)
    cls = _hex_attr(devdir, "class") or ""
    vendor, device = _hex_attr(devdir, "vendor"), _hex_attr(devdir, "device")
    sub_vendor, sub_device = _hex_attr(devdir, "subsystem_vendor"), _hex_attr(devdir, "subsystem_device")
    group = _link_name(os.path.join(devdir, "iommu_group"))
    boot_vga = _read(os.path.join(devdir, "boot_vga"))
    modalias = (_read(os.path.join(devdir, "modalias")) or "").strip()
    driver = _link_name(os.path.join(devdir, "driver"))
    module = driver_module(root, driver)
    return {
        "address": address,
        "slot": address.rsplit(".", 1)[0],
        "function": int(address.rsplit(".", 1)[1]),
        "class": f"0x{cls}" if cls else None,
        "class_code": cls[:4] if cls else None,
        "vendor_device": f"{vendor}:{device}" if vendor and device else None,
        "subsystem": f"{sub_vendor}:{sub_device}" if sub_vendor and sub_device else None,
        "revision": _hex_attr(devdir, "revision"),
        "driver": driver,
        "driver_module": module,
        "driver_builtin": bool(module) and module in builtin,
        "modules": modules_for(modalias, aliases),
        "iommu_group": int(group) if group and group.isdigit() else None,
        "boot_vga": None if boot_vga is None else boot_vga.strip() == "1",
    }


def normalise_slot(slot):
    slot = slot.strip().lower()
    if re.match(r"^[0-9a-f]{2}:[0-9a-f]{2}(\.[0-7])?$", slot):
        slot = "0000:" + slot
    return slot


def summarise_slot(given, devices, groups):
    """(the slot as given, its summary); the summary's `slot` is the normalised full address."""
    slot = normalise_slot(given)
    if "." in slot:
        functions = [slot] if slot in devices else []
    else:
        functions = sorted(a for a in devices if a.rsplit(".", 1)[0] == slot)
    group_ids = sorted(
        {devices[a]["iommu_group"] for a in functions if devices[a]["iommu_group"] is not None}
    )
    members = sorted({m for g in group_ids for m in groups.get(str(g), [])})
    others = []
    for address in members:
        if address in functions:
            continue
        dev = devices.get(address, {})
        others.append(
            {
                "address": address,
                "class": dev.get("class"),
                "vendor_device": dev.get("vendor_device"),
                "driver": dev.get("driver"),
                "bridge": bool(dev.get("class") and dev["class"].startswith("0x0604")),
            }
        )
    boot = [devices[a]["boot_vga"] for a in functions if devices[a]["boot_vga"] is not None]
    modules = []
    for address in functions:
        modules.extend(m for m in devices[address]["modules"] if m not in modules)
    return given, {
        "slot": slot,
        "found": bool(functions),
        "functions": functions,
        "vendor_devices": [devices[a]["vendor_device"] for a in functions],
        "drivers": {a: devices[a]["driver"] for a in functions},
        "builtin_drivers": {
            a: devices[a]["driver_module"] for a in functions if devices[a]["driver_builtin"]
        },
        "display_functions": [a for a in functions if (devices[a]["class_code"] or "").startswith("03")],
        "modules": modules,
        "iommu_groups": group_ids,
        "other_devices": others,
        "boot_vga": any(boot),
    }


def check(facts, allowed_drivers=(), forbidden_modules=(), builtin_rebind=False):
    """Binding and module problems against the wanted state: (binding_problems, module_problems,
    rebind_at_start)."""
    binding, rebind = [], []
    if allowed_drivers:
        wanted = " or ".join(allowed_drivers)
        for slot, summary in facts["slots"].items():
            if not summary["found"]:
                binding.append(f"{slot} is not on this node")
            for address, drv in summary["drivers"].items():
                if drv is None or drv in allowed_drivers:
                    continue
                module = summary["builtin_drivers"].get(address)
                display = address in summary["display_functions"]
                if builtin_rebind and module and not display and "vfio-pci" in allowed_drivers:
                    rebind.append(
                        f"{address} (slot {slot}) is held by {drv}, built into the kernel ({module} in "
                        "modules.builtin), so no softdep can load vfio-pci before it: accepted, as Proxmox VE "
                        "unbinds it and binds vfio-pci when the VM starts (qemu-server prepare_pci_device)"
                    )
                    continue
                binding.append(f"{address} (slot {slot}) is bound to {drv}, not {wanted}")
    loaded = {m.replace("-", "_") for m in facts["modules_loaded"]}
    modules = [f"{m} is loaded" for m in forbidden_modules if m.replace("-", "_") in loaded]
    return binding, modules, rebind


def gather(root="/", slots=()):
    """Everything the module returns under `gpulab_pci`, read from `root`."""
    warnings = []
    release = (_read(os.path.join(root, "proc", "sys", "kernel", "osrelease")) or "").strip()
    release = release or os.uname().release
    aliases = load_aliases(root, release, warnings)
    builtin = load_builtin(root, release)
    devroot = os.path.join(root, "sys", "bus", "pci", "devices")
    try:
        addresses = sorted(a for a in os.listdir(devroot) if _ADDRESS.match(a))
    except OSError as exc:
        addresses = []
        warnings.append(f"cannot list PCI devices in {devroot}: {exc.strerror}")
    devices = {a: read_device(root, a, aliases, builtin) for a in addresses}

    groups = {}
    groot = os.path.join(root, "sys", "kernel", "iommu_groups")
    try:
        names = os.listdir(groot)
    except OSError:
        names = []
    for name in sorted((n for n in names if n.isdigit()), key=int):
        try:
            members = sorted(os.listdir(os.path.join(groot, name, "devices")))
        except OSError:
            members = []
        groups[name] = members

    cmdline = (_read(os.path.join(root, "proc", "cmdline")) or "").rstrip("\n")
    proc_modules = _read(os.path.join(root, "proc", "modules"))
    if proc_modules is not None:
        loaded = [line.split()[0] for line in proc_modules.splitlines() if line.split()]
        modules_source = "/proc/modules"
    else:
        # A loaded loadable module has /sys/module/<name>/initstate ("live" once its init finished).
        sysmod = os.path.join(root, "sys", "module")
        try:
            names = sorted(os.listdir(sysmod))
        except OSError:
            names = []
        loaded = [n for n in names if (_read(os.path.join(sysmod, n, "initstate")) or "").strip() == "live"]
        modules_source = "/sys/module"
        warnings.append(
            f"cannot read {os.path.join(root, 'proc', 'modules')}; loaded modules read from {sysmod}"
        )
    facts = {
        "root": root,
        "kernel_release": release,
        "cmdline": cmdline,
        "efi": os.path.isdir(os.path.join(root, "sys", "firmware", "efi")),
        "iommu": {"enabled": bool(groups), "groups": groups},
        "devices": devices,
        "builtin_modules": builtin,
        "display_adapters": [
            {k: d[k] for k in ("address", "vendor_device", "class", "boot_vga", "driver", "modules")}
            for d in devices.values()
            if (d["class_code"] or "").startswith("03")
        ],
        "modules_loaded": loaded,
        "modules_source": modules_source,
        "slots": dict(summarise_slot(s, devices, groups) for s in slots),
        "warnings": warnings,
    }
    return facts


ARGUMENT_SPEC = {
    "root": {"type": "path", "default": "/"},
    "slots": {"type": "list", "elements": "str", "default": []},
    "allowed_drivers": {"type": "list", "elements": "str", "default": []},
    "builtin_rebind": {"type": "bool", "default": True},
    "forbidden_modules": {"type": "list", "elements": "str", "default": []},
}


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    root = module.params["root"]
    if not os.path.isdir(os.path.join(root, "sys")):
        module.fail_json(
            msg=f"Reading PCI facts: {os.path.join(root, 'sys')} is not a directory; "
            "give the root that holds the sys and proc trees (option root)"
        )
    facts = gather(root, module.params["slots"])
    facts["binding_problems"], facts["module_problems"], facts["rebind_at_start"] = check(
        facts,
        module.params["allowed_drivers"],
        module.params["forbidden_modules"],
        module.params["builtin_rebind"],
    )
    module.exit_json(changed=False, ansible_facts={"gpulab_pci": facts})


if __name__ == "__main__":
    main()
