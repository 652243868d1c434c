"""The QEMU VM config model: a declarative table of config keys and one pure diff.

`GET /nodes/{node}/qemu/{vmid}/config` returns keys in many spellings: `memory: 4096` or
`memory: current=4096`, `cpu: host` or `cpu: cputype=host`, `net0: virtio=BC:24:..,bridge=vmbr0` or
`net0: model=virtio,macaddr=..,bridge=vmbr0`, `hostpci0: 02:00` or `0000:02:00,pcie=1`, booleans as
`1`, `on`, `yes`, `true`, defaults written out or left away. Every key in `KEYS` has a normaliser that maps
all spellings of one meaning to one canonical string, so that `diff` compares meanings, never spellings.

Contract of every normaliser (as in community.routeros' api_modify):
  * idempotent: normalize(normalize(x)) == normalize(x);
  * a value it cannot read is passed through as a string, unchanged.

`diff(current, desired)` is pure: it returns what to write (`set`), what to remove (`delete`), disks to
grow (`resize`), changes it refuses (`refused`, e.g. shrinking a disk) and the normalised `before` and
`after` views. Keys absent from `desired` are not managed and never compared; a desired value of `None`
means "remove this key".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote

from gpulab.pve import propstr

_TRUE = {"1", "on", "yes", "true"}
_FALSE = {"0", "off", "no", "false"}

# Keys GET config returns that describe the config file or the running instance, never written.
READ_ONLY_PATTERNS = (
    "digest",
    "meta",
    "lock",
    "parent",
    "snaptime",
    "vmstate",
    "runningcpu",
    "runningmachine",
    "running-nets-host-mtu",
    r"unused\d+",
)

# The real index ranges (the schema collapses them to `name[n]`).
INDEX_RANGES = {
    "ide": 3,
    "sata": 5,
    "scsi": 30,
    "virtio": 15,
    "hostpci": 15,
    "net": 31,
    "ipconfig": 31,
    "usb": 13,
    "serial": 3,
    "parallel": 2,
    "numa": 7,
    "virtiofs": 9,
    "unused": 255,
}

DISK_BUSES = ("ide", "sata", "scsi", "virtio")

NET_MODELS = (
    "e1000",
    "e1000-82540em",
    "e1000-82544gc",
    "e1000-82545em",
    "e1000e",
    "i82551",
    "i82557b",
    "i82559er",
    "ne2k_isa",
    "ne2k_pci",
    "pcnet",
    "rtl8139",
    "virtio",
    "vmxnet3",
)


def norm_bool(value: Any) -> str:
    """`1`, `on`, `yes`, `true`, True, 1 -> "1"; the false spellings -> "0"; anything else unchanged."""
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value).strip()
    low = text.lower()
    if low in _TRUE:
        return "1"
    if low in _FALSE:
        return "0"
    return text


def norm_int(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return str(int(text))
    return text


def norm_str(value: Any) -> str:
    return str(value)


def norm_text(value: Any) -> str:
    """Free text (description): PVE may add or drop a trailing newline."""
    return str(value).rstrip("\n")


def norm_tags(value: Any) -> str:
    items = sorted({t for t in re.split(r"[;,\s]+", str(value)) if t})
    return ";".join(items)


# `urlencoded` format: the characters PVE accepts unescaped.
_URL_SAFE = "-_.!~*'()"


def norm_sshkeys(value: Any) -> str:
    """sshkeys travel percent-encoded (`%20`, `%0A`, never `+`); compare the decoded keys line by line."""
    text = unquote(str(value))
    keys = [line.strip() for line in text.splitlines() if line.strip()]
    return quote("\n".join(keys), safe=_URL_SAFE)


def encode_sshkeys(keys: list[str] | str) -> str:
    """The wire form of a list of public keys (one per line, percent-encoded)."""
    if isinstance(keys, str):
        keys = keys.splitlines()
    return norm_sshkeys("\n".join(keys))


@dataclass(frozen=True)
class PropFormat:
    """How to read one property-string key: its default key, sub-key defaults and spellings."""

    default_key: str | None = None
    defaults: Mapping[str, str] = field(default_factory=dict)
    booleans: frozenset[str] = frozenset()
    integers: frozenset[str] = frozenset()
    aliases: Mapping[str, str] = field(default_factory=dict)
    lower: frozenset[str] = frozenset()
    upper: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    sorted_lists: frozenset[str] = frozenset()
    key_alias_values: tuple[str, ...] = ()
    key_alias_target: tuple[str, str] | None = None
    fixup: Callable[[dict[str, str]], dict[str, str]] | None = None
    # Sub-keys compared only when the desired value names them, and carried over from the current
    # value when a changed value is written: those PVE fills in itself (a NIC's MAC) and those the
    # user may have set by hand that a spec leaves alone unless it says otherwise (a NIC's firewall).
    volatile: frozenset[str] = frozenset()

    def __post_init__(self):
        for key in self.defaults:
            if key in self.booleans and self.defaults[key] not in ("0", "1"):
                raise ValueError(f"boolean sub-key {key!r} needs a default of '0' or '1'")
        if self.key_alias_target is not None and not self.key_alias_values:
            raise ValueError("key_alias_target needs key_alias_values")

    def parse(self, value: Any) -> dict[str, str] | None:
        """Canonical dict of sub-keys (defaults dropped), or None when the string cannot be read."""
        try:
            props = propstr.parse(
                str(value),
                self.default_key,
                self.aliases,
                self.key_alias_values,
                self.key_alias_target,
            )
        except propstr.PropertyStringError:
            return None
        out: dict[str, str] = {}
        for key, val in props.items():
            if key in self.ignore:
                continue
            if key in self.booleans:
                val = norm_bool(val)
            elif key in self.integers:
                val = norm_int(val)
            if key in self.lower:
                val = val.lower()
            if key in self.upper:
                val = val.upper()
            if key in self.sorted_lists:
                val = ";".join(sorted(v for v in val.split(";") if v))
            if self.defaults.get(key) == val:
                continue
            out[key] = val
        if self.fixup is not None:
            out = self.fixup(out)
        return out

    def named(self, value: Any) -> set[str]:
        """The sub-keys `value` spells out, defaults included (empty when it cannot be read)."""
        try:
            props = propstr.parse(
                str(value), self.default_key, self.aliases, self.key_alias_values, self.key_alias_target
            )
        except propstr.PropertyStringError:
            return set()
        return set(props)

    def render(self, props: Mapping[str, str]) -> str:
        return propstr.render(props, self.default_key)

    def normalize(self, value: Any) -> str:
        props = self.parse(value)
        if props is None:
            return str(value)
        return self.render(props)


def _pci_id(one: str) -> str:
    one = one.lower()
    # Only a `bus:dev[.fn]` without domain gets PVE's implied domain 0000; anything else passes through.
    return f"0000:{one}" if re.fullmatch(r"[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-9a-f])?", one) else one


def _hostpci_fixup(props: dict[str, str]) -> dict[str, str]:
    host = props.get("host")
    if host:
        props["host"] = ";".join(_pci_id(h) for h in host.split(";") if h)
    return props


def _machine_fixup(props: dict[str, str]) -> dict[str, str]:
    # i440fx is QEMU's `pc`; an absent machine is `pc` too (dropped as the default).
    if props.get("type") in ("i440fx", "pc"):
        del props["type"]
    return props


def _cpu_fixup(props: dict[str, str]) -> dict[str, str]:
    flags = props.get("flags")
    if flags:
        props["flags"] = ";".join(sorted(f for f in flags.split(";") if f))
    return props


NET_FORMAT = PropFormat(
    default_key="model",
    defaults={"firewall": "0", "link_down": "0"},
    booleans=frozenset({"firewall", "link_down"}),
    integers=frozenset({"mtu", "queues", "tag"}),
    upper=frozenset({"macaddr"}),
    key_alias_values=NET_MODELS,
    key_alias_target=("model", "macaddr"),
    # Only model and bridge are always compared: the MAC PVE picked, and the firewall, VLAN tag, MTU,
    # queues, rate limit and link state the Create VM wizard or the user set, stay unless named.
    volatile=frozenset({"macaddr", "firewall", "tag", "mtu", "queues", "rate", "link_down"}),
)

HOSTPCI_FORMAT = PropFormat(
    default_key="host",
    defaults={"pcie": "0", "x-vga": "0", "rombar": "1", "legacy-igd": "0", "driver": "vfio"},
    booleans=frozenset({"pcie", "x-vga", "rombar", "legacy-igd"}),
    lower=frozenset({"vendor-id", "device-id", "sub-vendor-id", "sub-device-id"}),
    fixup=_hostpci_fixup,
)

MACHINE_FORMAT = PropFormat(
    default_key="type",
    booleans=frozenset({"enable-s3", "enable-s4"}),
    integers=frozenset({"aw-bits"}),
    fixup=_machine_fixup,
)

CPU_FORMAT = PropFormat(
    default_key="cputype",
    defaults={"cputype": "kvm64", "hidden": "0"},
    booleans=frozenset({"hidden"}),
    integers=frozenset({"guest-phys-bits"}),
    fixup=_cpu_fixup,
)

MEMORY_FORMAT = PropFormat(
    default_key="current", defaults={"current": "512"}, integers=frozenset({"current"})
)

AGENT_FORMAT = PropFormat(
    default_key="enabled",
    defaults={"enabled": "0", "freeze-fs": "1", "fstrim_cloned_disks": "0", "type": "virtio"},
    booleans=frozenset({"enabled", "freeze-fs", "fstrim_cloned_disks"}),
    aliases={"freeze-fs-on-backup": "freeze-fs", "guest-fsfreeze": "freeze-fs"},
)

BOOT_FORMAT = PropFormat(default_key="legacy", defaults={"legacy": "cdn"})

VGA_FORMAT = PropFormat(default_key="type", defaults={"type": "std"}, integers=frozenset({"memory"}))

STARTUP_FORMAT = PropFormat(default_key="order", integers=frozenset({"order", "up", "down"}))

IPCONFIG_FORMAT = PropFormat(lower=frozenset({"ip6"}))

SMBIOS_FORMAT = PropFormat()

DRIVE_FORMAT = PropFormat(
    default_key="file",
    defaults={
        "media": "disk",
        "backup": "1",
        "iothread": "0",
        "ssd": "0",
        "replicate": "1",
        "discard": "ignore",
        "ro": "0",
        "shared": "0",
        "snapshot": "0",
        "scsiblock": "0",
    },
    booleans=frozenset({"backup", "iothread", "ssd", "replicate", "ro", "shared", "snapshot", "scsiblock"}),
    aliases={"volume": "file"},
    # `size` is informational in a config and handled by the disk comparison.
    ignore=frozenset({"size"}),
)

EFIDISK_FORMAT = PropFormat(
    default_key="file",
    defaults={"efitype": "2m", "pre-enrolled-keys": "0"},
    booleans=frozenset({"pre-enrolled-keys"}),
    aliases={"volume": "file"},
    # ms-cert is an informational marker PVE maintains itself.
    ignore=frozenset({"size", "ms-cert"}),
)

TPM_FORMAT = PropFormat(
    default_key="file",
    defaults={"version": "v1.2"},
    aliases={"volume": "file"},
    ignore=frozenset({"size"}),
)


@dataclass(frozen=True)
class KeyInfo:
    """One row of the config-key table.

    default: the canonical value a key has when GET config leaves it out (None: no default).
    default_from: a key whose value is the default (balloon defaults to memory).
    read_only: returned by GET, refused in a desired config.
    write_only: GET never shows the real value (a password): set when absent, never compared.
    deletable: may be removed through `delete`.
    disk: compared by `diff_disk` (volume, options, size) instead of by string.
    """

    normalize: Callable[[Any], str] = norm_str
    default: str | None = None
    default_from: str | None = None
    read_only: bool = False
    write_only: bool = False
    deletable: bool = True
    disk: bool = False
    fmt: PropFormat | None = None

    def __post_init__(self):
        if self.read_only and self.write_only:
            raise ValueError("a key cannot be read-only and write-only")
        if self.default is not None and self.default_from is not None:
            raise ValueError("default and default_from are exclusive")
        if self.default is not None and self.normalize(self.default) != self.default:
            raise ValueError(f"default {self.default!r} is not in canonical form")


def _prop(fmt: PropFormat, **kw: Any) -> KeyInfo:
    return KeyInfo(normalize=fmt.normalize, fmt=fmt, default=kw.pop("default", fmt.normalize("")), **kw)


def _bool(default: str | None = None) -> KeyInfo:
    return KeyInfo(normalize=norm_bool, default=default)


def _int(default: str | None = None, **kw: Any) -> KeyInfo:
    return KeyInfo(normalize=norm_int, default=default, **kw)


def _str(default: str | None = None) -> KeyInfo:
    return KeyInfo(normalize=norm_str, default=default)


# Plain keys. Indexed families are in INDEXED below.
KEYS: dict[str, KeyInfo] = {
    "name": _str(),
    "description": KeyInfo(normalize=norm_text),
    "tags": KeyInfo(normalize=norm_tags),
    "ostype": _str(),
    "arch": _str(),
    "bios": _str("seabios"),
    "machine": _prop(MACHINE_FORMAT),
    "cpu": _prop(CPU_FORMAT),
    "cores": _int("1"),
    "sockets": _int("1"),
    "vcpus": _int(),
    "cpulimit": _str("0"),
    "cpuunits": _int(),
    "affinity": _str(),
    "numa": _bool("0"),
    "memory": _prop(MEMORY_FORMAT),
    "balloon": _int(default_from="memory"),
    "shares": _int(),
    "hugepages": _str(),
    "keephugepages": _bool("0"),
    "scsihw": _str("lsi"),
    "boot": _prop(BOOT_FORMAT),
    "bootdisk": _str(),
    "onboot": _bool("0"),
    "startup": _prop(STARTUP_FORMAT),
    "agent": _prop(AGENT_FORMAT),
    "vga": _prop(VGA_FORMAT),
    "kvm": _bool("1"),
    "acpi": _bool("1"),
    "tablet": _bool("1"),
    "protection": _bool("0"),
    "template": _bool("0"),
    "hotplug": _str(),
    "smbios1": _prop(SMBIOS_FORMAT, default=None),
    "vmgenid": _str(),
    "efidisk0": KeyInfo(normalize=EFIDISK_FORMAT.normalize, fmt=EFIDISK_FORMAT, disk=True),
    "tpmstate0": KeyInfo(normalize=TPM_FORMAT.normalize, fmt=TPM_FORMAT, disk=True),
    "citype": _str(),
    "ciuser": _str(),
    "cipassword": KeyInfo(write_only=True),
    "ciupgrade": _bool("1"),
    "cicustom": _str(),
    "sshkeys": KeyInfo(normalize=norm_sshkeys),
    "nameserver": _str(),
    "searchdomain": _str(),
    "allow-ksm": _bool("1"),
}

# Indexed families: prefix -> KeyInfo (range in INDEX_RANGES).
INDEXED: dict[str, KeyInfo] = {
    "net": _prop(NET_FORMAT, default=None),
    "hostpci": _prop(HOSTPCI_FORMAT, default=None),
    "ipconfig": _prop(IPCONFIG_FORMAT, default=None),
    "serial": _str(),
    "usb": _str(),
    "parallel": _str(),
    "numa": _str(),
    "virtiofs": _str(),
    **{bus: KeyInfo(normalize=DRIVE_FORMAT.normalize, fmt=DRIVE_FORMAT, disk=True) for bus in DISK_BUSES},
}

_READ_ONLY_RE = re.compile("^(?:" + "|".join(READ_ONLY_PATTERNS) + ")$")
_INDEXED_RE = re.compile(r"^([a-z]+)(\d+)$")
_GENERIC = KeyInfo()
_READ_ONLY = KeyInfo(read_only=True, deletable=False)


def _check_table() -> None:
    for prefix in INDEXED:
        if prefix not in INDEX_RANGES:
            raise ValueError(f"indexed key family {prefix!r} has no index range")
    for name, info in KEYS.items():
        if info.default_from is not None and info.default_from not in KEYS:
            raise ValueError(f"{name}: default_from names unknown key {info.default_from!r}")


_check_table()


def key_info(key: str) -> KeyInfo:
    """The table row for a config key, `cdrom` and every indexed name (`net3`, `hostpci15`) included."""
    if _READ_ONLY_RE.match(key):
        return _READ_ONLY
    if key in KEYS:
        return KEYS[key]
    m = _INDEXED_RE.match(key)
    if m and m.group(1) in INDEXED and int(m.group(2)) <= INDEX_RANGES[m.group(1)]:
        return INDEXED[m.group(1)]
    return _GENERIC


def canonical_key(key: str) -> str:
    """`cdrom` is PVE's alias for `ide2`."""
    return "ide2" if key == "cdrom" else key


def normalize_value(key: str, value: Any) -> str:
    return key_info(key).normalize(value)


def normalize_config(config: Mapping[str, Any]) -> dict[str, str]:
    """A GET config result as canonical strings, without the read-only bookkeeping keys."""
    out = {}
    for key, value in config.items():
        key = canonical_key(key)
        info = key_info(key)
        if info.read_only or value is None:
            continue
        out[key] = info.normalize(value)
    return out


def default_of(key: str, current: Mapping[str, str]) -> str | None:
    """The canonical value of `key` when absent, given the other (canonical) current keys."""
    info = key_info(key)
    if info.default_from is not None:
        src = current.get(info.default_from)
        if src is None:
            src = key_info(info.default_from).default
        if src is None:
            return None
        props = MEMORY_FORMAT.parse(src) if info.default_from == "memory" else None
        if props is not None:
            return props.get("current", MEMORY_FORMAT.defaults["current"])
        return src
    return info.default


# ---------------------------------------------------------------------------------------------- disks

_NEW_DISK_RE = re.compile(r"^(?:([^/:\s]+):)?(\d+(?:\.\d+)?)$")
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT])?(?:iB)?$")
_UNITS = {None: 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int | None:
    """PVE disk-size (`200G`, `4M`, `1.5T`, bare bytes) -> bytes."""
    m = _SIZE_RE.match(str(text).strip())
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(size: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


@dataclass(frozen=True)
class Disk:
    """A drive value read apart: where it lives, what it is, its options and size."""

    kind: str  # new | volume | cloudinit | iso | none | path | unreadable
    storage: str | None
    file: str
    options: dict[str, str]
    size: int | None  # bytes (new: the requested size; volume: size= from config)
    import_from: str | None = None


def read_disk(fmt: PropFormat, value: Any) -> Disk:
    try:
        raw = propstr.parse(str(value), fmt.default_key, fmt.aliases)
    except propstr.PropertyStringError:
        return Disk("unreadable", None, str(value), {}, None)
    file = raw.get("file", "")
    size = parse_size(raw["size"]) if "size" in raw else None
    import_from = raw.get("import-from")
    options = fmt.parse(propstr.render({k: v for k, v in raw.items() if k != "import-from"}, "file")) or {}
    options.pop("file", None)
    m = _NEW_DISK_RE.match(file)
    if m:
        gib = float(m.group(2))
        return Disk("new", m.group(1), file, options, int(gib * (1 << 30)), import_from)
    if file in ("none", "cdrom"):
        return Disk("none", None, file, options, size)
    if file.startswith("/"):
        return Disk("path", None, file, options, size)
    storage, _, volname = file.partition(":")
    if volname == "cloudinit" or re.search(r"(^|/)vm-\d+-cloudinit(\.\w+)?$", volname):
        return Disk("cloudinit", storage, file, options, size)
    if volname.startswith("iso/"):
        return Disk("iso", storage, file, options, size)
    return Disk("volume", storage, file, options, size, import_from)


def show_disk(disk: Disk, fmt: PropFormat) -> str:
    """Canonical display of a drive: volume, options, size."""
    if disk.kind == "unreadable":
        return disk.file
    if disk.kind == "new":
        head = f"{disk.storage}:new"
    elif disk.kind == "cloudinit":
        head = f"{disk.storage}:cloudinit"
    else:
        head = disk.file
    props = dict(disk.options)
    props["file"] = head
    if disk.size is not None and disk.kind in ("new", "volume") and fmt is DRIVE_FORMAT:
        props["size"] = format_size(disk.size)
    if disk.import_from:
        props["import-from"] = disk.import_from
    return fmt.render(props)


@dataclass
class DiskChange:
    set_value: str | None = None
    resize: str | None = None
    refused: str | None = None


def diff_disk(key: str, desired: Any, current: Any | None) -> DiskChange:
    """Compare one drive. A new volume is `STORAGE:SIZE_GiB[,opts][,import-from=SRC]`; anything else
    is an existing volume (`local:iso/x.iso,media=cdrom`, `none,media=cdrom`, `STORE:cloudinit`).
    """
    fmt = key_info(key).fmt
    assert fmt is not None
    want = read_disk(fmt, desired)
    if current is None:
        return DiskChange(set_value=str(desired))
    have = read_disk(fmt, current)
    if want.kind == "unreadable" or have.kind == "unreadable":
        if normalize_value(key, desired) != normalize_value(key, current):
            return DiskChange(set_value=str(desired))
        return DiskChange()
    if want.kind == "new":
        if have.kind not in ("volume", "path"):
            return DiskChange(
                refused=f"{key} holds {have.file!r} ({have.kind}), not a disk: remove it first to put a "
                f"new {format_size(want.size or 0)} disk there"
            )
        if have.storage != want.storage:
            return DiskChange(
                refused=f"{key} lives on storage {have.storage!r}, the spec says {want.storage!r}: moving "
                "a disk is not done here (use `qm disk move`), or correct the spec"
            )
        change = DiskChange()
        if key == "efidisk0" or key == "tpmstate0":
            if want.options != have.options:
                change.refused = (
                    f"{key} was created with {fmt.render(have.options) or 'default options'} and the spec "
                    f"asks {fmt.render(want.options) or 'default options'}: these are fixed when the disk is "
                    f"created; delete {key} (VM stopped) to have it recreated"
                )
            return change
        if want.options != have.options:
            props = dict(want.options)
            props["file"] = have.file
            change.set_value = fmt.render(props)
        if want.size and have.size is not None:
            if want.size > have.size:
                change.resize = format_size(want.size)
            elif want.size < have.size:
                change.refused = (
                    f"{key} is {format_size(have.size)} and the spec asks {format_size(want.size)}: PVE "
                    "disks never shrink; raise the size in the spec to at least the current one"
                )
        return change
    # An existing volume, a CD-ROM, a cloud-init drive or none: same kind, file and options, or set it.
    same_file = (
        want.storage == have.storage if want.kind == have.kind == "cloudinit" else want.file == have.file
    )
    same_opts = {
        k: v for k, v in want.options.items() if k != "media" or want.kind not in ("cloudinit",)
    } == {k: v for k, v in have.options.items() if k != "media" or have.kind not in ("cloudinit",)}
    if want.kind == have.kind and same_file and same_opts:
        return DiskChange()
    if want.kind == "cloudinit" and have.kind == "cloudinit":
        return DiskChange(
            refused=f"{key} is a cloud-init drive on {have.storage!r}; the spec wants it on {want.storage!r}: "
            f"delete {key} to have it recreated"
        )
    return DiskChange(set_value=str(desired))


# ----------------------------------------------------------------------------------------------- diff


@dataclass
class ConfigChange:
    """The result of `diff`: what to write and the two views of the config."""

    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    resize: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete or self.resize)


def _display(key: str, value: Any) -> str:
    info = key_info(key)
    if info.disk and info.fmt is not None:
        return show_disk(read_disk(info.fmt, value), info.fmt)
    if info.write_only:
        return "(secret)"
    shown = info.normalize(value)
    # A value made only of defaults normalises to "" (machine=pc, agent=0): show what was written.
    return shown if shown or value in (None, "") else str(value)


def view(config: Mapping[str, Any]) -> dict[str, str]:
    """Canonical, human-readable view of a whole config (for diff output and results)."""
    out = {}
    for key, value in config.items():
        key = canonical_key(key)
        if key_info(key).read_only or value is None:
            continue
        out[key] = _display(key, value)
    return dict(sorted(out.items()))


def diff(current: Mapping[str, Any], desired: Mapping[str, Any]) -> ConfigChange:
    """Compare a GET config result with a desired config (key -> wire value, or None to remove).

    Raises ValueError for a desired read-only key.
    """
    cur = {canonical_key(k): v for k, v in current.items() if v is not None}
    cur_norm = normalize_config(cur)
    change = ConfigChange(before=view(cur))
    after = dict(change.before)
    for raw_key, want in desired.items():
        key = canonical_key(raw_key)
        info = key_info(key)
        if info.read_only:
            raise ValueError(f"config key {key!r} is read-only in PVE and cannot be set")
        have = cur.get(key)
        if want is None:
            if have is not None and info.deletable:
                change.delete.append(key)
                after.pop(key, None)
            continue
        if info.write_only:
            if have is None:
                change.set[key] = str(want)
                after[key] = _display(key, want)
            continue
        if info.disk:
            dchange = diff_disk(key, want, have)
            if dchange.refused:
                change.refused.append(dchange.refused)
                continue
            if dchange.set_value is not None:
                change.set[key] = dchange.set_value
            base = want if have is None else (dchange.set_value or have)
            if dchange.set_value is not None or dchange.resize is not None:
                disk = read_disk(info.fmt, base)
                if have is not None:
                    old = read_disk(info.fmt, have)
                    disk = Disk(disk.kind, disk.storage, disk.file, disk.options, old.size, disk.import_from)
                if dchange.resize is not None:
                    change.resize[key] = dchange.resize
                    disk = Disk(
                        disk.kind, disk.storage, disk.file, disk.options, parse_size(dchange.resize), None
                    )
                after[key] = show_disk(disk, info.fmt)
            continue
        want_norm = info.normalize(want)
        have_norm = default_of(key, cur_norm) if have is None else cur_norm.get(key, info.normalize(have))
        fmt = info.fmt
        wire = str(want)
        if fmt is not None and fmt.volatile and have is not None:
            want_props = fmt.parse(want) or {}
            have_props = fmt.parse(have) or {}
            named = fmt.named(want)
            for sub in fmt.volatile - named:
                if sub in have_props:
                    want_props[sub] = have_props[sub]
            want_norm = fmt.render(want_props)
            wire = want_norm
        if want_norm != have_norm:
            change.set[key] = wire
            after[key] = want_norm if not info.disk else _display(key, want)
    change.after = dict(sorted(after.items()))
    return change


def create_params(desired: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The parameters of one create call for `desired`, and the resizes to run after it.

    Keys equal to their default are left out (PVE would store nothing for them). A disk imported with
    `import-from` is created with the `STORAGE:0,import-from=` syntax PVE demands; its wanted size is
    returned as a resize.
    """
    params: dict[str, str] = {}
    resizes: dict[str, str] = {}
    norm: dict[str, str] = {}
    for raw_key, want in desired.items():
        key = canonical_key(raw_key)
        if want is not None and not key_info(key).disk and not key_info(key).write_only:
            norm[key] = key_info(key).normalize(want)
    for raw_key, want in desired.items():
        key = canonical_key(raw_key)
        info = key_info(key)
        if info.read_only:
            raise ValueError(f"config key {key!r} is read-only in PVE and cannot be set")
        if want is None:
            continue
        if info.disk and info.fmt is not None:
            disk = read_disk(info.fmt, want)
            if disk.kind == "new" and disk.import_from:
                props = dict(disk.options)
                props["file"] = f"{disk.storage}:0"
                props["import-from"] = disk.import_from
                params[key] = info.fmt.render(props)
                if disk.size:
                    resizes[key] = format_size(disk.size)
                continue
            params[key] = str(want)
            continue
        if not info.write_only and norm.get(key) == default_of(key, norm):
            continue
        params[key] = str(want)
    return params, resizes
