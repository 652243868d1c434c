"""The catalogue: every inventory variable the lab definition reads, the formats its values take, and the
variables the roles declare (their meta/argument_specs.yml). docs/variables.md's tables are generated from
the two and a test keeps them in sync."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpulab.constants import (
    DIGEST_HEX_DIGITS,
    PASSWORD_ROUTER_KINDS,
    PVE_FINGERPRINT_RE,
    PVE_TOKEN_ID_RE,
    PVE_USER_RE,
    ROUTER_KINDS,
)

GROUPS = ("proxmox", "router", "vms", "k3s_server", "k3s_agent")

OS_INSTALLS = ("cloud_image", "iso")
# The install kind's image variable and the download-url content it is stored as.
OS_IMAGES = {"gpulab_os_image": "import", "gpulab_os_iso": "iso"}
# The two digests the lab definition accepts for an OS image (distributions publish SHA256SUMS/SHA512SUMS).
CHECKSUM_LENGTHS = {a: DIGEST_HEX_DIGITS[a] for a in ("sha256", "sha512")}
VMID_MIN, VMID_MAX = 100, 999_999_999
NVIDIA_BRANCH_MIN, NVIDIA_BRANCH_MAX = 100, 999
PASSWORD_ROUTERS = PASSWORD_ROUTER_KINDS
TOKEN_ID_RE, USER_RE, FINGERPRINT_RE = PVE_TOKEN_ID_RE, PVE_USER_RE, PVE_FINGERPRINT_RE

MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
PCI_SLOT_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$")
PCI_FUNC_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
VENDOR_DEVICE_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
DNS_NAME_RE = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$")
URL_RE = re.compile(r"^https://[^/\s:]+(:\d{1,5})?/?$")
# What the run downloads from: a whole http(s) URL with a host.
DOWNLOAD_URL_RE = re.compile(r"^https?://[^/\s:]+(:\d{1,5})?(/\S*)?$")
# A file name PVE keeps as given (download-url drops any folder and turns other characters into `_`).
FILENAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,255}$")
STORAGE_ID_RE = re.compile(r"^[a-z][a-z0-9\-_.]*[a-z0-9]$")
PLACEHOLDER_RE = re.compile(r"change[-_ ]?me|replace[-_ ]?me|^x+$|<.*>", re.IGNORECASE)
# The version rules, once: preflight checks them (gpulab.labdef.rules) before any stage runs, and the roles
# rely on that (site.yml runs preflight first, and its tags include `always`).
# A k3s release as k3s tags it (v1.36.2+k3s1): every k3s release with a +k3sN suffix is a Kubernetes 1.x.
K3S_VERSION_RE = re.compile(r"^v1\.\d+\.\d+\+k3s\d+$")
# A kube-vip release as its image is tagged (ghcr.io/kube-vip/kube-vip:v1.2.2): 1.2.2 without the v names no image.
KUBE_VIP_VERSION_RE = re.compile(r"^v\d+\.\d+\.\d+$")
CHART_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
# Debian's [epoch:]upstream[-revision], as apt pins it (nvidia-container-toolkit=1.20.0-1).
DEBIAN_VERSION_RE = re.compile(r"^(\d+:)?\d[A-Za-z0-9.+~]*(-[A-Za-z0-9.+~]+)?$")
IMAGE_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")

# Variables with these prefixes belong to the lab definition or to a role (and each role's own name is a
# prefix too): such a name must be in the catalogue or in a role's argument_specs, or it is a mistake.
OWNED_PREFIXES = ("vm_", "pve_", "router_", "gpulab_", "k3s_", "hami_", "nvidia_", "workloads_")
ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"


@dataclass(frozen=True)
class Var:
    """One variable of the lab definition: where it lives, its type and default, and what it means."""

    name: str
    scope: str  # all | proxmox | vms | router
    type: str  # str | int | float | bool | list | dict
    default: Any = None
    required: bool = False
    secret: bool = False
    doc: str = ""


# The catalogue: every variable the lab definition reads, as data (gpulab/data/catalogue.yml). README's
# variable table is generated from it and a test keeps the two in sync.
CATALOGUE_FILE = Path(__file__).resolve().parents[1] / "data" / "catalogue.yml"


def _load_catalogue(path: Path) -> tuple[Var, ...]:
    rows = yaml.safe_load(path.read_text())
    out = []
    for name, row in rows.items():
        row = dict(row)
        row["doc"] = row.get("doc", "").replace("{router_kinds}", ", ".join(ROUTER_KINDS))
        out.append(Var(name, **row))
    return tuple(out)


CATALOGUE: tuple[Var, ...] = _load_catalogue(CATALOGUE_FILE)

BY_NAME = {v.name: v for v in CATALOGUE}


def role_options() -> dict[str, dict[str, Any]]:
    """Every option of every role's meta/argument_specs.yml (all entry points): name -> its spec."""
    return _role_options(ROLES_DIR)


def owned_prefixes() -> tuple[str, ...]:
    """The prefixes above and each role's name followed by `_` (pve_host_, guest_base_, ...)."""
    return _owned_prefixes(ROLES_DIR)


def run_switches() -> frozenset[str]:
    """The names with a prefix gpulab owns that the playbooks and roles read themselves, beyond the catalogue and
    the roles' options: switches given with -e for one run (gpulab_run_lock_break, gpulab_teardown_confirm, ...)
    and the facts one stage leaves for the next (pve_host_gpu_state, which a run of stage vms alone may be given)."""
    return _run_switches(ROLES_DIR.parent, owned_prefixes())


@functools.cache
def _run_switches(root: Path, prefixes: tuple[str, ...]) -> frozenset[str]:
    word = re.compile(r"\b(?:" + "|".join(map(re.escape, prefixes)) + r")[a-z0-9_]+\b")
    files = [
        *sorted((root / "playbooks").rglob("*.yml")),
        *sorted((root / "roles").rglob("*.yml")),
        root / "site.yml",
    ]
    return frozenset(w for f in files if f.is_file() for w in word.findall(f.read_text()))


def known_names() -> frozenset[str]:
    """The names a prefixed variable may have: the catalogue's and the roles' options."""
    return frozenset(BY_NAME) | frozenset(role_options())


@functools.cache
def _role_options(roles_dir: Path) -> dict[str, dict[str, Any]]:
    specs = sorted(roles_dir.glob("*/meta/argument_specs.yml"))
    if not specs:
        raise FileNotFoundError(f"no roles/*/meta/argument_specs.yml under {roles_dir}")
    options: dict[str, dict[str, Any]] = {}
    for spec in specs:
        data = yaml.safe_load(spec.read_text()) or {}
        for entry in (data.get("argument_specs") or {}).values():
            for name, option in (entry.get("options") or {}).items():
                options.setdefault(name, option or {})
    return options


@functools.cache
def _owned_prefixes(roles_dir: Path) -> tuple[str, ...]:
    roles = sorted(spec.parent.parent.name for spec in roles_dir.glob("*/meta/argument_specs.yml"))
    return OWNED_PREFIXES + tuple(f"{r}_" for r in roles if not f"{r}_".startswith(OWNED_PREFIXES))
