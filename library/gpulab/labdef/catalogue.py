"""The catalogue: every inventory variable the lab definition reads, the formats its values take, and the
variables the roles declare (their meta/argument_specs.yml). README's variable tables are generated from
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
K3S_VERSION_RE = re.compile(r"^v\d+\.\d+\.\d+\+k3s\d+$")
CHART_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
# Debian's [epoch:]upstream[-revision], as apt pins it (nvidia-container-toolkit=1.18.1-1).
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


# The catalogue: every variable the lab definition reads. README's variable table is generated
# from it and a test keeps the two in sync.
CATALOGUE: tuple[Var, ...] = (
    # --- the Proxmox API (group_vars/all) ---
    Var("pve_api_url", "all", "str", required=True, doc="Proxmox VE API base, `https://ADDRESS:8006`."),
    Var(
        "pve_api_token_id",
        "all",
        "str",
        doc="API token `USER@REALM!NAME` (preferred). Needs the privileges listed in README.",
    ),
    Var(
        "pve_api_token_secret",
        "all",
        "str",
        secret=True,
        doc="Secret of that token: vault `vault_pve_api_token_secret` or env `GPULAB_PVE_API_TOKEN_SECRET`.",
    ),
    Var(
        "pve_api_user",
        "all",
        "str",
        doc="Password login `USER@REALM` instead of a token (`root@pam` is needed for raw PCI devices).",
    ),
    Var(
        "pve_api_password",
        "all",
        "str",
        secret=True,
        doc="Password for `pve_api_user`: vault `vault_pve_api_password` or env `GPULAB_PVE_API_PASSWORD`.",
    ),
    Var(
        "pve_api_validate_certs",
        "all",
        "bool",
        True,
        doc="Verify the API's TLS certificate (CA file or fingerprint pin). Keep on.",
    ),
    Var(
        "pve_api_fingerprint",
        "all",
        "str",
        doc="SHA-256 fingerprint of the API certificate (`AA:BB:...`, 32 bytes) to pin instead of a CA.",
    ),
    Var("pve_api_ca_file", "all", "str", doc="CA bundle that signed the API certificate."),
    Var(
        "gpulab_os_image",
        "all",
        "dict",
        doc="Cloud image PVE downloads itself: `{url, filename, checksum, checksum_algorithm, storage}`.",
    ),
    Var(
        "gpulab_os_iso",
        "all",
        "dict",
        doc="Live-server ISO for `vm_os_install: iso`, same keys as `gpulab_os_image`.",
    ),
    Var(
        "gpulab_guest_agent_snippet",
        "all",
        "bool",
        True,
        doc="Cloud-image VMs get the QEMU guest agent through a cloud-init vendor snippet that stage vms "
        "writes to the node's `local` snippets (over SSH: the API cannot upload snippets).",
    ),
    Var(
        "gpulab_host_reserve_mib",
        "all",
        "int",
        4096,
        doc="Memory kept for the Proxmox host itself (and the ZFS ARC) in the pinned-memory budget.",
    ),
    Var(
        "gpulab_state_dir",
        "all",
        "str",
        doc="Controller folder for the end-of-run table `lab-table.md`/`.json` (default: `.gpulab` in the "
        "repository).",
    ),
    # --- guests, k3s, HAMi (group_vars/all) ---
    Var("nvidia_driver_branch", "all", "int", 580, doc="NVIDIA driver branch: `nvidia-driver-<branch>-...`."),
    Var(
        "nvidia_driver_flavour",
        "all",
        "str",
        "server",
        doc="Package flavour: `server`, `server-open`, `open` or empty for the desktop package.",
    ),
    Var("k3s_version", "all", "str", required=True, doc="Pinned k3s release, e.g. `v1.33.5+k3s1`."),
    Var(
        "k3s_token",
        "all",
        "str",
        secret=True,
        doc="Cluster join token (vault `vault_k3s_token`); empty: generated once on the server.",
    ),
    Var("hami_chart_version", "all", "str", "2.10.0", doc="HAMi Helm chart version."),
    Var("hami_device_split_count", "all", "int", 10, doc="How many pods may share one card."),
    Var("hami_device_memory_scaling", "all", "float", 1, doc="Card memory overcommit factor (1: none)."),
    Var(
        "workloads_engines",
        "all",
        "list",
        [],
        doc="GPU engines for stage workloads: `{name, image, node, gpus: [index or UUID], gpu_memory_percent, "
        "cuda_disable_control, port, readiness_path, ...}` (see roles/workloads).",
    ),
    # --- each Proxmox node (host_vars of group proxmox) ---
    Var("pve_node", "proxmox", "str", required=True, doc="Node name as PVE knows it (`pvecm nodes`)."),
    Var(
        "pve_memory_mib",
        "proxmox",
        "int",
        required=True,
        doc="Usable host RAM in MiB (node status `memory.total`).",
    ),
    Var("pve_threads", "proxmox", "int", doc="CPU threads of the node (upper bound for `vm_cores`)."),
    Var(
        "pve_storages",
        "proxmox",
        "dict",
        required=True,
        doc="Storages: `NAME: {type, content: [images, iso, ...], size_gb}`.",
    ),
    Var(
        "pve_gpus",
        "proxmox",
        "list",
        [],
        doc="GPUs to pass through: `{id, pci: 0000:02:00, vendor_device, functions, iommu_group, "
        "boot_display}`.",
    ),
    # --- each VM (host_vars of group vms; the inventory host name is the VM name) ---
    Var("vm_node", "vms", "str", required=True, doc="Proxmox node (its `pve_node`) the VM lives on."),
    Var("vm_id", "vms", "int", required=True, doc="VMID, 100-999999999, unique in the cluster."),
    Var("vm_cores", "vms", "int", 2, doc="vCPUs (one socket)."),
    Var("vm_memory_mib", "vms", "int", 2048, doc="Memory in MiB."),
    Var(
        "vm_balloon",
        "vms",
        "bool",
        True,
        doc="Memory ballooning. Must be off for a GPU VM (its memory is pinned anyway).",
    ),
    Var(
        "vm_balloon_min_mib",
        "vms",
        "int",
        doc="Balloon floor in MiB (PVE `balloon`); unset: the whole `vm_memory_mib` counts as pinned.",
    ),
    Var("vm_disk_gb", "vms", "int", 32, doc="Boot disk size in GB (grown, never shrunk)."),
    Var("vm_storage", "vms", "str", required=True, doc="Storage for the disks (content `images`)."),
    Var("vm_machine", "vms", "str", "i440fx", doc="`i440fx` or `q35` (q35 for a GPU VM)."),
    Var("vm_firmware", "vms", "str", "seabios", doc="`seabios` or `ovmf` (OVMF for a GPU VM)."),
    Var(
        "vm_efi_pre_enrolled_keys",
        "vms",
        "bool",
        False,
        doc="OVMF with Microsoft keys (Secure Boot on): the unsigned NVIDIA module would not load.",
    ),
    Var("vm_cpu", "vms", "str", "x86-64-v2-AES", doc="CPU type (`host` for a GPU VM)."),
    Var("vm_gpu", "vms", "str", doc="`id` of a GPU in its node's `pve_gpus` to pass through."),
    Var("vm_onboot", "vms", "bool", True, doc="Start at boot."),
    Var(
        "vm_onboot_override_boot_display",
        "vms",
        "bool",
        False,
        doc="Allow start at boot although the VM's GPU is the host's boot display.",
    ),
    Var("vm_address", "vms", "str", required=True, doc="The VM's IPv4 address, reserved on the router."),
    Var("vm_mac", "vms", "str", doc="Fixed MAC for net0 (else PVE picks one)."),
    Var("vm_bridge", "vms", "str", "vmbr0", doc="Bridge of net0 (the node's LAN bridge)."),
    Var("vm_name", "vms", "str", doc="VM name in PVE (default: the inventory host name)."),
    Var(
        "vm_os_install",
        "vms",
        "str",
        "cloud_image",
        doc="`cloud_image` (cloud-init, no clicks) or `iso` (install by hand from the live-server ISO).",
    ),
    Var("vm_ssh_user", "vms", "str", "ubuntu", doc="Login user created by cloud-init."),
    Var("vm_ssh_public_key", "vms", "str", doc="Public key cloud-init authorises for `vm_ssh_user`."),
    # --- the router (host_vars of the single host in group router) ---
    Var("router_kind", "router", "str", required=True, doc="One of: " + ", ".join(ROUTER_KINDS) + "."),
    Var("router_address", "router", "str", required=True, doc="Router's LAN address."),
    Var("router_subnet", "router", "str", required=True, doc="LAN subnet, e.g. `192.168.100.0/24`."),
    Var("router_dhcp_pool", "router", "dict", required=True, doc="DHCP pool `{start, end}`."),
    Var("router_user", "router", "str", doc="Login user (web/API/SSH, by kind)."),
    Var(
        "router_url",
        "router",
        "str",
        doc="Web/API base URL for HTTP routers (default: `http(s)://router_address`).",
    ),
    Var("router_validate_certs", "router", "bool", True, doc="Verify the router's TLS certificate."),
    Var(
        "router_options",
        "router",
        "dict",
        {},
        doc="Backend settings by kind (dnsmasq file paths, Kea `subnet_id`, OPNsense `service`, ...).",
    ),
    Var(
        "router_password",
        "router",
        "str",
        secret=True,
        doc="Router password: vault `vault_router_password` or env `GPULAB_ROUTER_PASSWORD`.",
    ),
)

BY_NAME = {v.name: v for v in CATALOGUE}


def role_options() -> dict[str, dict[str, Any]]:
    """Every option of every role's meta/argument_specs.yml (all entry points): name -> its spec."""
    return _role_options(ROLES_DIR)


def owned_prefixes() -> tuple[str, ...]:
    """The prefixes above and each role's name followed by `_` (pve_host_, guest_base_, ...)."""
    return _owned_prefixes(ROLES_DIR)


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
