"""The Proxmox VE automated installer's answer file: its format as a table, a check, and a TOML writer.

The rules are read from the installer's own source at the pinned versions (:data:`PINNED`): the answer
types of ``proxmox-installer-types`` (``src/answer.rs``: sections, keys, kebab-case names with their
older snake_case aliases under the ``legacy`` feature that pve-installer enables, ``deny_unknown_fields``,
the enum spellings) and the checks of pve-installer's ``parse_answer`` (``proxmox-auto-installer/src/
utils.rs``) with the helpers it calls (``proxmox-installer-common``: ``options.rs``, ``disk_checks.rs``;
``proxmox-network-types``: ``fqdn.rs``). :func:`check` applies the rules the installer applies when it
reads the file; those that need the machine (the disks and NICs a filter matches, what DHCP hands out)
apply only when the machine's description is given (``run_env``, the installer's ``run-env-info.json``
shape, and ``udev``, its ``run-env-udev.json``), as the installer has them at that point.

Every problem names the key (``section.key``), the value, why the installer refuses it, and the fix.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase, translate
from pathlib import Path
from typing import Any

from gpulab.labdef.problems import ProblemsError, described

#: where each rule below was read (repository, path, version and commit)
PINNED = {
    "pve-installer": "proxmox/pve-installer 9.2.7 (ec2af90)",
    # pve-installer 9.2.7's Cargo.toml asks for 0.1.1; 0.1.0 is the newest source read (its changelog's
    # first release), so a rule 0.1.1 changed is not here
    "proxmox-installer-types": "proxmox/proxmox-rs proxmox-installer-types 0.1.0 (f3305009), legacy feature",
}

KEYBOARDS = [
    "de",
    "de-ch",
    "dk",
    "en-gb",
    "en-us",
    "es",
    "fi",
    "fr",
    "fr-be",
    "fr-ca",
    "fr-ch",
    "hu",
    "is",
    "it",
    "jp",
    "lt",
    "mk",
    "nl",
    "no",
    "pl",
    "pt",
    "pt-br",
    "se",
    "si",
    "tr",
]
ZFS_RAID = {"RAID0": 1, "RAID1": 2, "RAID10": 4, "RAIDZ-1": 3, "RAIDZ-2": 4, "RAIDZ-3": 5}
BTRFS_RAID = {"RAID0": 1, "RAID1": 2, "RAID10": 4}
ZFS_RAID_ALIASES = {k.lower(): k for k in ZFS_RAID}
BTRFS_RAID_ALIASES = {k.lower(): k for k in BTRFS_RAID}
ROOT_PASSWORD_MIN_LENGTH = 8
IFNAME_MIN, IFNAME_MAX = 2, 15
EMAIL_PLACEHOLDER = "mail@example.invalid"
# HTML's <input type=email> pattern, as options.rs email_validate uses it
EMAIL = re.compile(
    r"^[a-zA-Z0-9.!#$%&'*+/=?^_`{|}~-]+@[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
    r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*\Z"
)
# (\Z, not $: Rust's $ is the end of the text, Python's also matches before a final newline)
IFNAME = re.compile(r"^[a-z][a-z0-9_]{1,20}([:.][0-9]+)?\Z", re.IGNORECASE)
FQDN_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\Z")


@dataclass(frozen=True)
class Problem:
    key: str
    value: Any
    why: str
    fix: str

    def __str__(self) -> str:
        return described(self.key, self.value, self.why, self.fix)


class AnswerError(ProblemsError, ValueError):
    problems: list[Problem]


# --- the format: one row a key ------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One key of a table: its kebab-case name, the older snake_case spelling the installer still reads,
    whether it must be there, and the check of its value (None when it is fine, else why it is not)."""

    name: str
    check: Callable[[Any], str | None]
    required: bool = False
    alias: str | None = None
    doc: str = ""


def _is(kind: type | tuple[type, ...], what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if isinstance(value, bool) and kind is not bool:
            return f"a boolean where {what} is expected"
        return None if isinstance(value, kind) else f"{type(value).__name__} where {what} is expected"

    return check


def _one_of(choices: Iterable[str]) -> Callable[[Any], str | None]:
    allowed = list(choices)

    def check(value: Any) -> str | None:
        if not isinstance(value, str) or value not in allowed:
            return f"not one of {', '.join(allowed)}"
        return None

    return check


def _number(
    minimum: float, integer: bool = False, maximum: float | None = None
) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            return "not an integer" if integer else "not a number"
        if value < minimum or (maximum is not None and value > maximum):
            top = f" and at most {maximum:g}" if maximum is not None else ""
            return f"out of range: at least {minimum:g}{top}"
        return None

    return check


def _strings(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        return "not a list of strings"
    return None


def _string_table(value: Any) -> str | None:
    if not isinstance(value, dict) or not all(isinstance(x, str) for x in value.values()):
        return 'not a table of strings (KEY = "glob")'
    for pattern in value.values():
        try:
            re.compile(translate(pattern))
        except re.error:
            return f"the glob {pattern!r} is invalid"
    return None


def _fqdn(value: Any) -> str | None:
    """fqdn.rs Fqdn::from: 253 characters at most, labels of letters, digits and inner dashes, a host and a
    domain, a host that is not only digits."""
    if isinstance(value, dict):
        return None  # the extended form, checked as its own table
    if not isinstance(value, str):
        return 'neither a fully-qualified domain name nor a table with `source = "from-dhcp"`'
    if len(value) > 253:
        return f"longer than 253 characters ({len(value)})"
    parts = value.split(".")
    bad = [p for p in parts if len(p) > 63 or not FQDN_LABEL.match(p)]
    if bad:
        return f"the part {bad[0]!r} is not letters, digits and inner dashes"
    if len(parts) < 2:
        return "a host name without a domain (the installer needs HOST.DOMAIN)"
    if parts[0].isdigit():
        return "the host name is only digits"
    return None


def _parsed_by(parse: Callable[[Any], object], why: str) -> Callable[[Any], str | None]:
    """A check that `parse` takes the value (`why` when it raises ValueError)."""

    def check(value: Any) -> str | None:
        try:
            parse(value)
        except ValueError:
            return why
        return None

    return check


_ip = _parsed_by(ipaddress.ip_address, "not an IP address")
_interface = _parsed_by(
    ipaddress.ip_interface, "an invalid IP address or prefix length (IPv4 /0 to /32, IPv6 /0 to /128)"
)


def _cidr(value: Any) -> str | None:
    """ip_address.rs Cidr::from_str: ADDRESS/PREFIX with a decimal prefix (IPv4 at most 32, IPv6 at most 128),
    or a bare ADDRESS (a /32 or /128); no netmask form, no IPv6 zone."""
    if not isinstance(value, str):
        return "not ADDRESS/PREFIX"
    address, _, prefix = value.partition("/")
    if "%" in address or (_ and not re.fullmatch(r"[0-9]{1,3}", prefix)):
        return "an invalid IP address or prefix length (IPv4 /0 to /32, IPv6 /0 to /128)"
    return _interface(value)


def _email(value: Any) -> str | None:
    if not isinstance(value, str) or not EMAIL.match(value):
        return "does not look like a mail address (user@domain.tld)"
    if value == EMAIL_PLACEHOLDER:
        return "the installer's placeholder address, which it refuses"
    return None


def _raid(levels: dict[str, str]) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        if value in levels or value in levels.values():
            return None
        return f"not one of {', '.join(levels.values())} (or their lower-case spellings)"

    return check


GLOBAL = [
    Key("keyboard", _one_of(KEYBOARDS), required=True, doc="keyboard layout"),
    Key("country", _is(str, "a two-letter country code"), required=True, doc="country for the mirrors"),
    Key("fqdn", _fqdn, required=True, doc='HOST.DOMAIN, or a table with source = "from-dhcp"'),
    Key("mailto", _email, required=True, doc="root's mail address"),
    Key("timezone", _is(str, "a time zone name"), required=True, doc="e.g. Europe/Vienna or UTC"),
    Key("root-password", _is(str, "a string"), alias="root_password", doc="plain text"),
    Key("root-password-hashed", _is(str, "a crypt(3) hash"), alias="root_password_hashed"),
    Key("reboot-on-error", _is(bool, "true or false"), alias="reboot_on_error"),
    Key("reboot-mode", _one_of(["reboot", "power-off"]), alias="reboot_mode"),
    Key("root-ssh-keys", _strings, alias="root_ssh_keys"),
    Key("subscription-key", _is(str, "a subscription key"), alias="subscription_key"),
]
FQDN_FROM_DHCP = [
    Key("source", _one_of(["from-dhcp"])),
    Key("domain", _is(str, "a domain")),
]
PINNING = [
    Key("enabled", _is(bool, "true or false"), required=True),
    Key("mapping", _string_table),
]
NETWORK = {
    "from-dhcp": [Key("source", _one_of(["from-dhcp", "from-answer"]), required=True)],
    "from-answer": [
        Key("source", _one_of(["from-dhcp", "from-answer"]), required=True),
        Key("cidr", _cidr, required=True, doc="the node's address with its prefix"),
        Key("dns", _ip, required=True),
        Key("gateway", _ip, required=True),
        Key("filter", _string_table, doc="udev properties that pick the management NIC"),
    ],
}
DISK_SETUP = [
    Key("filesystem", _one_of(["ext4", "xfs", "zfs", "btrfs"]), required=True),
    Key("disk-list", _strings, alias="disk_list"),
    Key("filter", _string_table),
    Key("filter-match", _one_of(["any", "all"]), alias="filter_match"),
]
# The ranges below are the answer schema's (answer.rs under its api-types feature, the form Proxmox's own
# answer servers check); pve-installer's parse (legacy feature only) takes any unsigned integer or number
# here and leaves an out-of-range value to fail in the low-level installer.
ZFS = [
    Key("raid", _raid(ZFS_RAID_ALIASES)),
    Key("ashift", _number(9, integer=True, maximum=16)),
    Key("arc-max", _number(64, integer=True), alias="arc_max"),
    Key("checksum", _one_of(["on", "fletcher4", "sha256"])),
    Key("compress", _one_of(["on", "off", "lzjb", "lz4", "zle", "gzip", "zstd"])),
    Key("copies", _number(1, integer=True, maximum=3)),
    Key("hdsize", _number(2)),
]
LVM = [
    Key("hdsize", _number(2)),
    Key("swapsize", _number(0)),
    Key("maxroot", _number(2)),
    Key("maxvz", _number(0)),
    Key("minfree", _number(0)),
]
BTRFS = [
    Key("hdsize", _number(2)),
    Key("raid", _raid(BTRFS_RAID_ALIASES)),
    Key("compress", _one_of(["on", "off", "zlib", "lzo", "zstd"])),
]
FIRST_BOOT = [
    Key("source", _one_of(["from-url", "from-iso"]), required=True),
    Key("ordering", _one_of(["before-network", "network-online", "fully-up"])),
    Key("url", _is(str, "a URL")),
    Key("cert-fingerprint", _is(str, "a SHA-256 fingerprint"), alias="cert_fingerprint"),
]
WEBHOOK = [
    Key("url", _is(str, "a URL"), required=True),
    # both spellings are read without the legacy feature too (answer.rs: a plain serde alias)
    Key("cert-fingerprint", _is(str, "a SHA-256 fingerprint"), alias="cert_fingerprint"),
    Key("auth-token", _is(str, "a token"), alias="auth_token"),
]
SECTIONS = ("global", "network", "disk-setup", "first-boot", "post-installation-webhook")
REQUIRED_SECTIONS = ("global", "network", "disk-setup")


# --- the check ----------------------------------------------------------------------------------------


@dataclass
class _Checker:
    problems: list[Problem] = field(default_factory=list)

    def add(self, key: str, value: Any, why: str, fix: str) -> None:
        self.problems.append(Problem(key, value, why, fix))

    def has(self, key: str) -> bool:
        return any(p.key == key for p in self.problems)

    def table(self, where: str, data: Any, keys: list[Key], extra: Iterable[str] = ()) -> dict[str, Any]:
        """The table's values by kebab-case name; unknown keys, a key given in both spellings, a missing
        required key and a value of the wrong type or range are problems (serde: deny_unknown_fields)."""
        if not isinstance(data, dict):
            self.add(where, data, "not a table", f"write it as [{where}] with its keys below")
            return {}
        by_name = {k.name: k for k in keys}
        by_alias = {k.alias: k for k in keys if k.alias}
        seen: dict[str, Any] = {}
        for name, value in data.items():
            key = by_name.get(name) or by_alias.get(name)
            if key is None:
                if name in extra:
                    continue
                known = ", ".join(k.name for k in keys)
                self.add(
                    f"{where}.{name}",
                    value,
                    "an unknown key (the installer refuses unknown keys)",
                    f"remove it, or use one of: {known}",
                )
                continue
            if key.name in seen:
                self.add(
                    f"{where}.{key.name}",
                    value,
                    f"given twice (as {key.name} and {key.alias})",
                    "keep the kebab-case spelling only",
                )
                continue
            why = key.check(value)
            if why:
                hint = f"set it to {key.doc}" if key.doc else "correct the value"
                self.add(f"{where}.{key.name}", value, why, hint)
                continue
            seen[key.name] = value
        for key in keys:
            if key.required and key.name not in seen and not self.has(f"{where}.{key.name}"):
                hint = f" ({key.doc})" if key.doc else ""
                self.add(f"{where}.{key.name}", None, "required and missing", f"add {key.name} = ...{hint}")
        return seen


def _raid_level(value: Any, levels: dict[str, str]) -> str:
    return levels.get(value, value)


def check(
    answer: dict[str, Any], run_env: dict[str, Any] | None = None, udev: dict[str, Any] | None = None
) -> list[Problem]:
    """Every problem the installer would refuse the parsed answer for (empty when it is accepted). With
    ``udev`` (the installer's run-env-udev.json: each disk's and NIC's udev properties), the filters that
    pick the management NIC and the disks must match this machine's, as utils.rs get_single_udev_index and
    get_matched_udev_indexes require."""
    c = _Checker()
    for name in answer:
        if name not in SECTIONS:
            c.add(
                name,
                answer[name],
                "an unknown section",
                f"remove it, or use one of: {', '.join(SECTIONS)} (sections are kebab-case only)",
            )
    for name in REQUIRED_SECTIONS:
        if name not in answer:
            c.add(name, None, "a required section is missing", f"add [{name}]")
    if "global" in answer:
        _check_global(c, c.table("global", answer["global"], GLOBAL), run_env)
    if "network" in answer:
        _check_network(c, answer["network"], run_env)
    if "disk-setup" in answer:
        _check_disks(c, answer["disk-setup"], run_env)
    if "first-boot" in answer:
        first = c.table("first-boot", answer["first-boot"], FIRST_BOOT)
        if first.get("source") == "from-url" and not first.get("url"):
            c.add(
                "first-boot.url",
                None,
                'source is "from-url" but no url is given',
                'add url, or use source = "from-iso" with prepare-iso --on-first-boot FILE',
            )
    if "post-installation-webhook" in answer:
        c.table("post-installation-webhook", answer["post-installation-webhook"], WEBHOOK)
    if udev is not None:
        _check_filters(c, answer, udev)
    return c.problems


def udev_matches(
    filters: dict[str, str], devices: dict[str, dict[str, str]], match_all: bool = False
) -> list[str]:
    """The devices (udev list keys, sorted) a filter picks, as utils.rs get_matched_udev_indexes: with
    ``match_all``, a device whose every filtered property it has matches; else one that matches any. A
    filter key the device lacks does not count against it."""
    found = []
    for dev, props in devices.items():
        once, every = False, True
        for key, pattern in filters.items():
            if key in props:
                if fnmatchcase(str(props[key]), pattern):
                    once = True
                else:
                    every = False
        if (match_all and every) or (not match_all and once):
            found.append(dev)
    return sorted(found)


def _check_filters(c: _Checker, answer: dict[str, Any], udev: dict[str, Any]) -> None:
    network, disks = answer.get("network"), answer.get("disk-setup")
    if isinstance(network, dict) and network.get("source") == "from-answer" and not c.has("network.filter"):
        nic_filter = network.get("filter") or {}
        nics = udev.get("nics") or {}
        # get_single_udev_index: the first NIC (in name order) that any filter key matches
        if nic_filter and not udev_matches(nic_filter, dict(sorted(nics.items()))):
            c.add(
                "network.filter",
                nic_filter,
                "matches none of this machine's NICs (the installer stops: filter did not match any device)",
                "match one of: "
                + ", ".join(
                    f"{n} ({props.get('ID_NET_NAME_MAC', '?')})" for n, props in sorted(nics.items())
                ),
            )
    if isinstance(disks, dict) and not c.has("disk-setup.filter") and not disks.get("disk-list"):
        disk_filter = disks.get("filter") or {}
        if disk_filter and isinstance(disk_filter, dict):
            # ext4 and xfs take one disk, the first any filter key matches (get_single_udev_index)
            lvm = disks.get("filesystem") in ("ext4", "xfs")
            all_ = not lvm and disks.get("filter-match", disks.get("filter_match")) == "all"
            if not udev_matches(disk_filter, udev.get("disks") or {}, match_all=all_):
                c.add(
                    "disk-setup.filter",
                    disk_filter,
                    "matches none of this machine's disks (the installer stops: filter did not match any "
                    "devices)",
                    "match a disk's udev properties (udevadm info /dev/DISK), or use disk-list",
                )


def _countries() -> set[str] | None:
    """ISO 3166 two-letter codes from the system's time zone data (tzdata's iso3166.tab), lower case."""
    tab = Path("/usr/share/zoneinfo/iso3166.tab")
    if not tab.is_file():
        return None
    return {line.split("\t", 1)[0].lower() for line in tab.read_text().splitlines() if line[:1].isalpha()}


def _timezones() -> set[str]:
    """The zones the installer accepts: those of tzdata's zone.tab (country.pl parse_zoneinfo builds the
    installer's cczones from it; utils.rs verify_locale_settings adds UTC); without zone.tab, every zone
    this system knows."""
    tab = Path("/usr/share/zoneinfo/zone.tab")
    if tab.is_file():
        return {
            line.split("\t")[2]
            for line in tab.read_text().splitlines()
            if line[:1].isalpha() and line.count("\t") >= 2 and "/" in line.split("\t")[2]
        }
    import zoneinfo

    return set(zoneinfo.available_timezones())


def _check_global(c: _Checker, glob: dict[str, Any], run_env: dict[str, Any] | None) -> None:
    country = glob.get("country")
    if isinstance(country, str):
        known = _countries()
        if not re.fullmatch(r"[a-z]{2}", country) or (known is not None and country not in known):
            c.add(
                "global.country",
                country,
                "not a two-letter country code in lower case (ISO 3166)",
                'e.g. "at"',
            )
    tz = glob.get("timezone")
    if isinstance(tz, str) and tz != "UTC" and tz not in _timezones():
        c.add(
            "global.timezone",
            tz,
            "not a time zone the installer knows",
            'use a tz name such as "Europe/Vienna"',
        )
    plain, hashed = glob.get("root-password"), glob.get("root-password-hashed")
    if plain is not None and hashed is not None:
        c.add(
            "global.root-password",
            "(hidden)",
            "root-password and root-password-hashed cannot both be set",
            "keep one of them (gpulab writes root-password-hashed)",
        )
    elif plain is None and hashed is None:
        c.add(
            "global.root-password-hashed",
            None,
            "one of root-password and root-password-hashed must be set",
            "add root-password-hashed (mkpasswd -m sha-512) or root-password",
        )
    elif plain is not None and len(plain.encode()) < ROOT_PASSWORD_MIN_LENGTH:
        c.add(
            "global.root-password",
            "(hidden)",
            f"shorter than {ROOT_PASSWORD_MIN_LENGTH} characters",
            "use a longer password",
        )
    fqdn = glob.get("fqdn")
    if isinstance(fqdn, dict):
        extended = c.table("global.fqdn", fqdn, FQDN_FROM_DHCP)
        if run_env is not None:
            net = run_env.get("network", {})
            if not net.get("hostname"):
                c.add(
                    "global.fqdn.source",
                    "from-dhcp",
                    "the DHCP server did not provide a host name",
                    'give fqdn = "HOST.DOMAIN", or have the DHCP server hand out a host name',
                )
            elif not (net.get("dns") or {}).get("domain") and not extended.get("domain"):
                c.add(
                    "global.fqdn.domain",
                    None,
                    "no domain came from the DHCP server and none is set",
                    "set global.fqdn.domain",
                )


def _check_network(c: _Checker, network: Any, run_env: dict[str, Any] | None) -> None:
    if not isinstance(network, dict):
        c.add("network", network, "not a table", 'write [network] with source = "from-dhcp" or "from-answer"')
        return
    source = network.get("source")
    if source not in NETWORK:
        c.add("network.source", source, 'must be "from-dhcp" or "from-answer"', "set network.source")
        return
    values = c.table("network", network, NETWORK[source], extra=("interface-name-pinning",))
    if source == "from-answer" and "filter" in values and not values["filter"]:
        c.add("network.filter", {}, "empty: no filter defined", 'add filter.ID_NET_NAME_MAC = "*<mac>"')
    if source == "from-answer" and "filter" not in values and not c.has("network.filter"):
        c.add(
            "network.filter",
            None,
            "from-answer needs a filter that picks the management NIC",
            'add filter.ID_NET_NAME_MAC = "*<mac without colons>" (or ID_NET_NAME = "<name>")',
        )
    if "interface-name-pinning" in network:
        pin = c.table("network.interface-name-pinning", network["interface-name-pinning"], PINNING)
        names: dict[str, str] = {}
        # options.rs: a disabled pinning has no mapping, so its names are not checked
        mapping = (pin.get("mapping") or {}) if pin.get("enabled") else {}
        for mac, name in mapping.items():
            mac = mac.lower()
            key = f"network.interface-name-pinning.mapping.{mac}"
            if len(name) < IFNAME_MIN:
                c.add(key, name, f"shorter than {IFNAME_MIN} characters", "use a longer name")
            elif len(name) > IFNAME_MAX:
                c.add(key, name, f"longer than {IFNAME_MAX} characters", "use a shorter name")
            elif not IFNAME.match(name):
                c.add(key, name, "must start with a letter and hold only letters, digits and _", "rename it")
            elif name in names and names[name] != mac:
                c.add(key, name, f"the same name as for {names[name]}", "give each MAC its own name")
            names.setdefault(name, mac)


def _check_disks(c: _Checker, disks: Any, run_env: dict[str, Any] | None) -> None:
    values = c.table("disk-setup", disks, DISK_SETUP, extra=("zfs", "lvm", "btrfs"))
    if not isinstance(disks, dict):
        return
    fs = values.get("filesystem")
    options = {name: disks[name] for name in ("zfs", "lvm", "btrfs") if name in disks}
    tables = {"zfs": ZFS, "lvm": LVM, "btrfs": BTRFS}
    parsed = {name: c.table(f"disk-setup.{name}", value, tables[name]) for name, value in options.items()}
    listed, filtered = values.get("disk-list") or [], values.get("filter") or {}
    if not listed and not filtered and not c.has("disk-setup.disk-list") and not c.has("disk-setup.filter"):
        c.add("disk-setup.disk-list", None, "neither disk-list nor filter is set", 'add disk-list = ["sda"]')
    elif listed and filtered:
        c.add("disk-setup.filter", filtered, "disk-list and filter cannot both be set", "keep one of them")
    wanted = {"ext4": "lvm", "xfs": "lvm", "zfs": "zfs", "btrfs": "btrfs"}.get(fs)
    if wanted is None:
        return
    others = sorted(set(options) - {wanted})
    if others:
        c.add(
            f"disk-setup.{others[0]}",
            options[others[0]],
            f"options of another file system than {fs}",
            f'use only disk-setup.{wanted} options with filesystem = "{fs}"',
        )
    if fs in ("ext4", "xfs"):
        if len(listed) > 1:
            c.add(
                "disk-setup.disk-list",
                listed,
                f"{fs} installs on one disk",
                "list one disk, or use zfs/btrfs",
            )
        lvm = parsed.get("lvm", {})
        swap, hd = lvm.get("swapsize"), lvm.get("hdsize")
        if swap is not None and hd is not None and swap > hd / 2:
            c.add(
                "disk-setup.lvm.swapsize",
                swap,
                f"greater than hdsize / 2 ({hd / 2:g} GiB)",
                "make it smaller or hdsize larger",
            )
    else:
        levels = ZFS_RAID if fs == "zfs" else BTRFS_RAID
        aliases = ZFS_RAID_ALIASES if fs == "zfs" else BTRFS_RAID_ALIASES
        raid = parsed.get(fs, {}).get("raid")
        if raid is None:
            if not c.has(f"disk-setup.{fs}.raid"):
                c.add(
                    f"disk-setup.{fs}.raid",
                    None,
                    f"the RAID level must be set for {fs}",
                    f'set {fs}.raid, e.g. "raid0" for one disk',
                )
            return
        level = _raid_level(raid, aliases)
        min_disks = levels[level]
        if listed and len(listed) < min_disks:
            c.add(
                "disk-setup.disk-list",
                listed,
                f"{fs} {level} needs at least {min_disks} disks, got {len(listed)}",
                f"list more disks or choose another {fs}.raid level",
            )
        elif listed and fs == "zfs" and level == "RAID10" and len(listed) % 2:
            c.add("disk-setup.disk-list", listed, "zfs RAID10 needs an even number of disks", "list pairs")
    seen: set[str] = set()
    for disk in listed:
        if disk in seen:
            c.add("disk-setup.disk-list", listed, f"lists the device {disk} twice", "list each disk once")
            break
        seen.add(disk)
    if run_env is not None and listed:
        paths = [d[1] for d in run_env.get("disks", [])]
        missing = [d for d in listed if not any(p.endswith(d) for p in paths)]
        if missing and (fs in ("ext4", "xfs") or len(missing) == len(listed)):
            c.add(
                "disk-setup.disk-list",
                listed,
                f"no disk of this machine is {missing[0]}",
                f"use one of {', '.join(p.rsplit('/', 1)[-1] for p in paths)}",
            )


def parse(text: str) -> dict[str, Any]:
    """The TOML text as a table; a syntax error becomes a problem naming the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AnswerError([Problem("(file)", None, f"not valid TOML: {exc}", "fix the syntax")]) from exc


def check_text(
    text: str, run_env: dict[str, Any] | None = None, udev: dict[str, Any] | None = None
) -> list[Problem]:
    try:
        return check(parse(text), run_env, udev)
    except AnswerError as exc:
        return exc.problems


# --- writing ------------------------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """A TOML literal for a string, number, boolean or list of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    raise TypeError(f"no TOML form for {value!r}")


def toml_key(key: str) -> str:
    """A dotted key (``filter.ID_NET_NAME_MAC``) with each part bare where TOML allows, else quoted."""
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else toml_value(p) for p in key.split("."))
