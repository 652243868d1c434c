"""The input options of pve_vm, one row each, with the PVE config keys each one writes.

This one table drives the module's argument spec (`argument_spec()`) and its DOCUMENTATION options
(`documentation()`), both written into plugins/modules/pve_vm.py by `make docs` (tests keep them in step),
the config the module sends (`build()`) and, the other way, the option values a VM's config holds
(`read()`, which gpulab.discover reads an existing VM with). Each row of `OPTIONS` names the keys of
`vmconfig`'s key table (or the indexed families, `net*`) it writes; a test fails when a row writes a key
it does not name or names a key that table lacks. `CONTROL` holds the options that say which VM and what
to do with it (no config key).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpulab.pve import propstr, vmconfig


class OptionError(ValueError):
    """An option value that cannot become a config (the message names the option)."""


@dataclass(frozen=True)
class Sub:
    """A sub-option of a dict option (or of each element of a list of dicts)."""

    name: str
    type: str = "str"
    doc: str | tuple[str, ...] = ""
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] | None = None
    elements: str | None = None
    no_log: bool | None = None


@dataclass(frozen=True)
class Option:
    """One module option: its argument spec, its documentation and the config keys it writes."""

    name: str
    type: str
    doc: str | tuple[str, ...]
    keys: tuple[str, ...] = ()  # config keys; `net*` stands for a family
    build: Callable[[Any, Mapping[str, Any]], dict[str, Any]] | None = None
    required: bool = False
    default: Any = None
    choices: tuple[str, ...] | None = None
    elements: str | None = None
    subs: tuple[Sub, ...] = ()
    owns: str | None = None  # the family this option owns whole: members it leaves out are removed
    # the option's value in a PVE config (build's other way), None when the config has none
    read: Callable[[Mapping[str, Any]], Any] | None = None

    def spec(self) -> dict[str, Any]:
        return _spec(self)

    def writes(self, key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, pattern) for pattern in self.keys)


def _spec(row: Option | Sub) -> dict[str, Any]:
    out: dict[str, Any] = {"type": row.type}
    if row.required:
        out["required"] = True
    for attr in ("default", "choices", "elements", "no_log"):
        value = getattr(row, attr, None)
        if value is not None:
            out[attr] = list(value) if attr == "choices" else value
    subs = getattr(row, "subs", ())
    if subs:
        out["options"] = {s.name: _spec(s) for s in subs}
    return out


def _doc(row: Option | Sub) -> dict[str, Any]:
    out: dict[str, Any] = {"description": list(row.doc) if isinstance(row.doc, tuple) else row.doc}
    spec = _spec(row)
    for attr in ("type", "required", "default", "choices", "elements"):
        if attr in spec:
            out[attr] = spec[attr]
    subs = getattr(row, "subs", ())
    if subs:
        out["suboptions"] = {s.name: _doc(s) for s in subs}
    return out


def _b(value: Any) -> str:
    return "1" if value in (True, 1, "1", "true", "yes", "on") else "0"


def _as_str(key: str) -> Callable[[Any, Mapping[str, Any]], dict[str, Any]]:
    return lambda value, _p: {key: str(value)}


def _as_bool(key: str) -> Callable[[Any, Mapping[str, Any]], dict[str, Any]]:
    return lambda value, _p: {key: _b(value)}


def _machine(value: Any, _p: Mapping[str, Any]) -> dict[str, Any]:
    return {"machine": "pc" if value in ("i440fx", "pc") else value}


def _tags(value: Any, _p: Mapping[str, Any]) -> dict[str, Any]:
    return {"tags": ";".join(value) if value else None}


def _efidisk(value: Mapping[str, Any], _p: Mapping[str, Any]) -> dict[str, Any]:
    props = {
        "file": f"{value['storage']}:1",
        "efitype": value.get("efitype") or "4m",
        "pre-enrolled-keys": _b(value.get("pre_enrolled_keys", False)),
    }
    return {"efidisk0": propstr.render(props, "file")}


def _disks(value: list[Mapping[str, Any]], _p: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for disk in value:
        props = {"file": f"{disk['storage']}:{disk['size_gb']}"}
        for opt in ("iothread", "ssd"):
            if disk.get(opt) is not None:
                props[opt] = _b(disk[opt])
        if disk.get("discard") is not None:
            props["discard"] = "on" if disk["discard"] in (True, "on") else "ignore"
        if disk.get("import_from"):
            props["import-from"] = disk["import_from"]
        out[disk.get("slot") or "scsi0"] = propstr.render(props, "file")
    return out


def _nets(value: list[Mapping[str, Any]], _p: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for index, nic in enumerate(value):
        props = {"model": nic.get("model") or "virtio", "bridge": nic.get("bridge") or "vmbr0"}
        if nic.get("macaddr"):
            props["macaddr"] = str(nic["macaddr"]).upper()
        if nic.get("firewall") is not None:
            props["firewall"] = _b(nic["firewall"])
        if nic.get("tag") is not None:
            props["tag"] = str(nic["tag"])
        out[f"net{index}"] = propstr.render(props, "model")
    return out


def _hostpci_props(dev: Mapping[str, Any], device: dict[str, str]) -> str:
    props = dict(device)
    for opt, sub in (("pcie", "pcie"), ("x_vga", "x-vga"), ("rombar", "rombar")):
        if dev.get(opt) is not None:
            props[sub] = _b(dev[opt])
    return propstr.render(props, "host")


def _hostpci(value: list[Mapping[str, Any]], _p: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for index, dev in enumerate(value):
        if not dev.get("mapping") and not dev.get("host"):
            raise OptionError(f"hostpci[{index}]: give mapping, host, or both")
        device = {"mapping": dev["mapping"]} if dev.get("mapping") else {"host": str(dev["host"]).lower()}
        out[f"hostpci{index}"] = _hostpci_props(dev, device)
    return out


def equivalents(params: Mapping[str, Any]) -> dict[str, str]:
    """Config values that count as the desired one although they are spelt otherwise: a hostpci entry
    with both a mapping and the host address it maps is met by that address attached raw (the same
    passthrough; PVE lets only root@pam touch a raw one, so it is left as it is)."""
    out = {}
    for index, dev in enumerate(params.get("hostpci") or ()):
        if dev.get("mapping") and dev.get("host"):
            out[f"hostpci{index}"] = _hostpci_props(dev, {"host": str(dev["host"]).lower()})
    return out


def _cdrom(value: Any, p: Mapping[str, Any]) -> dict[str, Any]:
    slot = p.get("cdrom_slot") or "ide2"
    return {slot: "none,media=cdrom" if value in ("", "none") else f"{value},media=cdrom"}


def _cloudinit(value: Mapping[str, Any], p: Mapping[str, Any]) -> dict[str, Any]:
    slot = value.get("slot") or "ide2"
    if p.get("cdrom") is not None and slot == (p.get("cdrom_slot") or "ide2"):
        raise OptionError(f"the cloud-init drive and the CD-ROM both want {slot}; give them different slots")
    out: dict[str, Any] = {slot: f"{value['storage']}:cloudinit"}
    if value.get("user"):
        out["ciuser"] = value["user"]
    if value.get("ssh_keys"):
        out["sshkeys"] = vmconfig.encode_sshkeys(list(value["ssh_keys"]))
    if value.get("ipconfig"):
        out["ipconfig0"] = value["ipconfig"]
    if value.get("upgrade") is not None:
        out["ciupgrade"] = _b(value["upgrade"])
    if value.get("password"):
        out["cipassword"] = value["password"]
    return out


def _serial(value: Any, _p: Mapping[str, Any]) -> dict[str, Any]:
    return {"serial0": "socket" if value else None, "vga": "serial0" if value else None}


def _boot(value: list[str], _p: Mapping[str, Any]) -> dict[str, Any]:
    return {"boot": "order=" + ";".join(value)} if value else {}


def _extra(value: Mapping[str, Any], _p: Mapping[str, Any]) -> dict[str, Any]:
    return dict(value)


# ------------------------------------------------------------------ read: a config's values as options


def _sub(fmt: vmconfig.PropFormat, value: Any) -> dict[str, str]:
    """A property string read apart as the key's format names its parts (defaults not filled in)."""
    try:
        return propstr.parse(
            str(value), fmt.default_key, fmt.aliases, fmt.key_alias_values, fmt.key_alias_target
        )
    except propstr.PropertyStringError:
        return {}


def _read_as(key: str, type_: str) -> Callable[[Mapping[str, Any]], Any]:
    """A plain key's value as the option's type; PVE's own default when the config leaves the key out."""
    info = vmconfig.key_info(key)

    def read(cfg: Mapping[str, Any]) -> Any:
        value = cfg.get(key)
        if value is not None and info.fmt is not None:
            value = _sub(info.fmt, value).get(info.fmt.default_key)
        if value in (None, "") and info.fmt is not None:
            value = info.fmt.defaults.get(info.fmt.default_key)
        if value in (None, ""):
            value = info.default
        if value is None:
            return None
        if type_ == "int":
            return int(value)
        if type_ == "bool":
            return str(value) in ("1", "on", "yes", "true")
        return str(value)

    return read


def _read_machine(cfg: Mapping[str, Any]) -> str:
    value = _read_as("machine", "str")(cfg) or "pc"
    return "i440fx" if value == "pc" else value


def _read_efidisk(cfg: Mapping[str, Any]) -> dict[str, Any] | None:
    if not cfg.get("efidisk0"):
        return None
    props = _sub(vmconfig.EFIDISK_FORMAT, cfg["efidisk0"])
    return {
        "storage": props.get("file", "").split(":", 1)[0],
        "efitype": props.get("efitype"),
        "pre_enrolled_keys": props.get("pre-enrolled-keys", "0") == "1",
    }


def _read_disks(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every disk the VM has (not a CD-ROM or cloud-init drive), by slot; size_gb None when unknown."""
    out = []
    for slot in sorted(k for k in cfg if any(fnmatch.fnmatchcase(k, d) for d in _DRIVES)):
        disk = vmconfig.read_disk(vmconfig.DRIVE_FORMAT, cfg[slot])
        if disk.kind in ("cloudinit", "iso", "none") or disk.options.get("media") == "cdrom":
            continue
        gib = -(-disk.size // (1 << 30)) if disk.size else None
        out.append({"slot": slot, "storage": disk.storage, "size_gb": gib, "file": disk.file})
    return out


def _read_nets(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The NICs, net0 first (up to the first index the config lacks)."""
    out = []
    while f"net{len(out)}" in cfg:
        props = _sub(vmconfig.NET_FORMAT, cfg[f"net{len(out)}"])
        out.append({k: props.get(k) for k in ("model", "bridge", "macaddr")})
    return out


_DRIVES = ("ide*", "sata*", "scsi*", "virtio*")


def _plain(name: str, type_: str, doc: str | tuple[str, ...], **kw: Any) -> Option:
    """An option that is a config key of the same name, written as it is (a bool as 0 or 1)."""
    builder = _as_bool(name) if type_ == "bool" else _as_str(name)
    return Option(name, type_, doc, (name,), builder, read=_read_as(name, type_), **kw)


def _flags(**docs: str) -> tuple[Sub, ...]:
    """Boolean sub-options, unset unless given."""
    return tuple(Sub(name, "bool", doc) for name, doc in docs.items())


BALLOON_DOC = (
    "Balloon target in MiB: the least memory the VM keeps when the host reclaims memory. V(0) removes the "
    "balloon device (needed with a passed-through GPU, whose memory is pinned). Equal to O(memory) is "
    "PVE's default."
)

# The options that become config keys, in the order of the module's documentation.
OPTIONS: tuple[Option, ...] = (
    _plain("cores", "int", "Cores per socket."),
    _plain("sockets", "int", "CPU sockets."),
    _plain("memory", "int", "Memory in MiB."),
    _plain("balloon", "int", BALLOON_DOC),
    Option(
        "machine",
        "str",
        "Machine type, V(i440fx) (QEMU's C(pc)) or V(q35), or a pinned version such as V(pc-q35-9.2).",
        ("machine",),
        _machine,
        read=_read_machine,
    ),
    _plain("bios", "str", "Firmware.", choices=("seabios", "ovmf")),
    _plain(
        "cpu",
        "str",
        "CPU type, such as V(host) or V(x86-64-v2-AES) (a full C(cpu) property string is accepted).",
    ),
    _plain("ostype", "str", "Guest OS type, such as V(l26)."),
    _plain("scsihw", "str", "SCSI controller, such as V(virtio-scsi-single)."),
    _plain("agent", "bool", "Enable the QEMU guest agent channel."),
    _plain("onboot", "bool", "Start the VM when the node boots."),
    _plain("numa", "bool", "Enable NUMA."),
    Option(
        "efidisk",
        "dict",
        "The EFI vars disk (with O(bios=ovmf)). Its options are fixed when it is created.",
        ("efidisk0",),
        _efidisk,
        read=_read_efidisk,
        subs=(
            Sub("storage", doc="Storage for the EFI disk.", required=True),
            Sub("efitype", doc="Size and type of the EFI vars.", choices=("2m", "4m"), default="4m"),
            Sub(
                "pre_enrolled_keys",
                "bool",
                "Enrol distribution and Microsoft keys (turns Secure Boot on; unsigned modules then fail to load).",
                default=False,
            ),
        ),
    ),
    Option(
        "disks",
        "list",
        "Disks. A disk that exists is compared by storage, options and size.",
        _DRIVES,
        _disks,
        read=_read_disks,
        elements="dict",
        subs=(
            Sub("slot", doc="Config key, such as V(scsi0) or V(virtio1).", default="scsi0"),
            Sub("storage", doc="Storage for the disk.", required=True),
            Sub(
                "size_gb",
                "int",
                "Size in GiB. A larger size than the current one grows the disk; a smaller one is refused.",
                required=True,
            ),
            Sub(
                "import_from",
                doc=(
                    "Volume to import the disk from when the VM is created, such as "
                    "V(local:import/noble-server-cloudimg-amd64.qcow2). Ignored for an existing disk.",
                ),
            ),
            *_flags(
                iothread="Own I/O thread.",
                discard="Pass discard/trim through.",
                ssd="Present the disk as an SSD.",
            ),
        ),
    ),
    Option(
        "nets",
        "list",
        "Network devices, C(net0) first. Without a MAC, PVE picks one and it is kept afterwards.",
        ("net*",),
        _nets,
        read=_read_nets,
        elements="dict",
        owns="net",
        subs=(
            Sub("model", doc="NIC model.", default="virtio"),
            Sub("bridge", doc="Bridge.", default="vmbr0"),
            Sub("macaddr", doc="Fixed MAC address."),
            Sub("firewall", "bool", "PVE firewall on this NIC."),
            Sub("tag", "int", "VLAN tag."),
        ),
    ),
    Option(
        "hostpci",
        "list",
        (
            "PCI devices, C(hostpci0) first. Each entry names a resource O(hostpci[].mapping), a raw "
            "O(hostpci[].host) address, or both: the mapping, and the address it maps on this node. With both, "
            "a VM that has that address attached raw already keeps that attachment (it is the same "
            "passthrough), and a new attachment goes through the mapping.",
            "PVE accepts raw devices from root@pam (password login) only, never from a token: a raw address "
            "to attach, or a raw attachment to replace, with any other login is refused before anything is "
            "written.",
        ),
        ("hostpci*",),
        _hostpci,
        elements="dict",
        owns="hostpci",
        subs=(
            Sub("mapping", doc="ID of a cluster PCI resource mapping."),
            Sub(
                "host", doc="Host address; V(0000:02:00) without a function passes all functions of the card."
            ),
            *_flags(
                pcie="Attach as PCI Express (needs O(machine=q35)).",
                x_vga="Primary GPU of the VM.",
                rombar="Map the device ROM.",
            ),
        ),
    ),
    Option(
        "cdrom",
        "str",
        "An ISO volume for the CD-ROM, such as V(local:iso/ubuntu-24.04.3-live-server-amd64.iso); V(none) empties it.",
        ("ide*", "sata*"),
        _cdrom,
    ),
    Option("cdrom_slot", "str", "Config key of the CD-ROM (with O(cdrom)).", default="ide2"),
    Option(
        "cloudinit",
        "dict",
        "A cloud-init drive and its settings.",
        (*_DRIVES, "ciuser", "sshkeys", "ipconfig*", "ciupgrade", "cipassword"),
        _cloudinit,
        subs=(
            Sub("storage", doc="Storage for the cloud-init drive.", required=True),
            Sub("slot", doc="Config key of the drive.", default="ide2"),
            Sub("user", doc="User to create."),
            Sub("ssh_keys", "list", "Public SSH keys for the user.", elements="str", no_log=False),
            Sub("ipconfig", doc="C(ipconfig0), such as V(ip=dhcp).", default="ip=dhcp"),
            Sub("upgrade", "bool", "Upgrade packages on first boot."),
            Sub(
                "password",
                doc="Password for the user; set when the VM is created and never compared (PVE does not show it).",
                no_log=True,
            ),
        ),
    ),
    Option(
        "serial_console",
        "bool",
        "A serial port as the console (C(serial0=socket), C(vga=serial0)), as cloud images expect.",
        ("serial*", "vga"),
        _serial,
    ),
    Option(
        "boot_order", "list", "Boot devices in order, such as V([scsi0]).", ("boot",), _boot, elements="str"
    ),
    _plain("description", "str", "VM description (notes)."),
    Option("tags", "list", "Tags.", ("tags",), _tags, elements="str"),
    Option(
        "extra_config",
        "dict",
        (
            "Further config keys as PVE spells them (key to value; null removes the key). They go through the "
            "same normalisation as the rest.",
        ),
        ("*",),
        _extra,
    ),
)

# The options that say which VM and what to do with it.
CONTROL: tuple[Option, ...] = (
    Option("node", "str", "The PVE node the VM lives on.", required=True),
    Option("vmid", "int", "The VM ID.", required=True),
    Option(
        "name",
        "str",
        ("The VM name. An existing VM with this ID but another name is never taken over.",),
        required=True,
    ),
    Option(
        "state",
        "str",
        (
            "V(present) creates or updates the VM and leaves its power state alone; V(started) also starts it; "
            "V(stopped) shuts it down (forced stop after the timeout); V(absent) stops and destroys it.",
            "V(restarted) shuts an existing VM down and starts it again without touching its config (always "
            "changed; the guest renews its DHCP lease). Only O(node), O(vmid) and O(name) are needed.",
        ),
        choices=("present", "started", "stopped", "absent", "restarted"),
        default="present",
    ),
    *OPTIONS,
    Option(
        "create_only",
        "list",
        (
            "Options (of those above) used only when the VM is created; an existing VM keeps what it has for "
            "them, such as the CD-ROM, boot order and guest agent of a VM made by hand.",
        ),
        elements="str",
        default=[],
        choices=tuple(o.name for o in OPTIONS),
    ),
    Option("restart", "bool", "Restart a running VM whose hardware changes are pending.", default=False),
    Option(
        "timeout", "int", "Seconds to wait for each PVE task (create, update, start, shutdown).", default=600
    ),
    Option(
        "lock_timeout", "int", "Seconds to wait for a locked VM to be unlocked before failing.", default=60
    ),
    Option(
        "wait_for_address",
        "bool",
        "After the VM runs, wait for the guest agent to report an IPv4 address on C(net0).",
        default=False,
    ),
    Option("address_timeout", "int", "Seconds to wait for the address.", default=300),
    Option(
        "read_host_keys",
        "bool",
        (
            "After the VM runs, read its SSH public host keys (C(/etc/ssh/ssh_host_*_key.pub)) through the guest "
            "agent (C(agent/file-read), privilege C(VM.GuestAgent.FileRead)), waiting up to O(address_timeout) "
            "seconds for the agent; RV(host_keys) has them. Reads only; check mode reads them of a VM that runs.",
        ),
        default=False,
    ),
    Option(
        "host_keys_known",
        "bool",
        (
            "The controller already trusts a host key of this VM (its known_hosts has a line for it): with "
            "O(read_host_keys), read the keys only when this run creates, starts or restarts the VM, so a run "
            "that leaves a running VM alone sends no guest agent request.",
        ),
        default=False,
    ),
    Option(
        "owner_tag",
        "str",
        (
            "With O(state=absent): destroy the VM only when it carries this PVE tag (the mark of the VMs gpulab "
            "creates, set in the create call only); a VM without it is kept and RV(kept) says why. Unset: no "
            "such check.",
        ),
    ),
    Option(
        "destroy_untagged",
        "bool",
        "With O(state=absent) and O(owner_tag): destroy the VM even without the tag (an adopted VM its owner named).",
        default=False,
    ),
    Option(
        "backup_storage",
        "str",
        (
            "With O(state=absent): take a vzdump backup (mode stop, zstd) of the VM to this storage before it is "
            "destroyed; a failed backup leaves the VM in place. The storage's content must include C(backup).",
        ),
    ),
)

BY_NAME: dict[str, Option] = {o.name: o for o in CONTROL}


def argument_spec() -> dict[str, dict[str, Any]]:
    """Every option of the module but the connection's, as AnsibleModule takes them."""
    return {o.name: o.spec() for o in CONTROL}


def documentation() -> dict[str, Any]:
    """The same options as DOCUMENTATION's `options:` mapping."""
    return {o.name: _doc(o) for o in CONTROL}


def build(params: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The PVE config keys for the given option values, and the key families they own.

    Options absent or None are not managed. Each key comes from the row of the option that names it
    (tests/unit/pve/test_vm_options.py holds every row to its keys).
    """
    cfg: dict[str, Any] = {"name": params["name"]}
    families: list[str] = []
    for option in OPTIONS:
        value = params.get(option.name)
        if value is None or option.build is None:
            continue
        cfg.update(option.build(value, params))
        if option.owns:
            families.append(option.owns)
    return cfg, tuple(families)


def read(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The option values a PVE config holds, for the options that read them back (None ones left out)."""
    out = {}
    for option in OPTIONS:
        if option.read is not None:
            value = option.read(cfg)
            if value is not None:
                out[option.name] = value
    return out
