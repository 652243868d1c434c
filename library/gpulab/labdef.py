"""The lab definition: every inventory variable gpulab reads, and the one validation of it.

The inventory (groups ``proxmox``, ``router``, ``vms``, ``k3s_server``, ``k3s_agent`` and their
variables) is read into plain dicts, one per host, and checked here. ``gpulab plan`` and the preflight
play (stage 0 of site.yml) both call :func:`validate`, so the same mistake gets the same message
whichever runs it. Nothing here knows about Ansible; callers hand in ``groups`` and a way to read a
host's variables.

Every message names the host, the field, the value, why it is wrong and how to fix it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

GROUPS = ("proxmox", "router", "vms", "k3s_server", "k3s_agent")

ROUTER_KINDS = ("dnsmasq", "openwrt", "kea", "mikrotik", "opnsense", "pfsense", "huawei_ont")
MACHINES = ("i440fx", "q35")
FIRMWARES = ("seabios", "ovmf")
OS_INSTALLS = ("cloud_image", "iso")
CHECKSUM_LENGTHS = {"sha256": 64, "sha512": 128}
VMID_MIN, VMID_MAX = 100, 999_999_999

MAC_RE = re.compile(r"^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$")
PCI_SLOT_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}$")
PCI_FUNC_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
VENDOR_DEVICE_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{4}$")
DNS_NAME_RE = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?$")
TOKEN_ID_RE = re.compile(r"^[^\s@!]+@[A-Za-z][A-Za-z0-9.\-_]*![A-Za-z][A-Za-z0-9.\-_]*$")
USER_RE = re.compile(r"^[^\s@!]+@[A-Za-z][A-Za-z0-9.\-_]*$")
FINGERPRINT_RE = re.compile(r"^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$")
URL_RE = re.compile(r"^https://[^/\s:]+(:\d{1,5})?/?$")
STORAGE_ID_RE = re.compile(r"^[a-z][a-z0-9\-_.]*[a-z0-9]$")
PLACEHOLDER_RE = re.compile(r"change[-_ ]?me|replace[-_ ]?me|^x+$|<.*>", re.IGNORECASE)


@dataclass(frozen=True)
class Var:
    """One variable of the lab definition: where it lives, its type and default, and what it means."""

    name: str
    scope: str  # all | proxmox | vms | router
    type: str  # str | int | bool | list | dict
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
        "gpulab_host_reserve_mib",
        "all",
        "int",
        4096,
        doc="Memory kept for the Proxmox host itself (and the ZFS ARC) in the pinned-memory budget.",
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
# Router kinds that log in with a password (the SSH kinds use keys).
PASSWORD_ROUTERS = ("mikrotik", "opnsense", "pfsense", "huawei_ont", "kea")


@dataclass(frozen=True)
class Problem:
    host: str
    field: str
    value: Any
    why: str
    fix: str

    def __str__(self) -> str:
        shown = "(not set)" if self.value is None else repr(self.value)
        return f"{self.host}: {self.field}={shown}: {self.why}. Fix: {self.fix}."


class LabDefinitionError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass
class Lab:
    """The lab definition as read from the inventory, defaults applied."""

    globals: dict[str, Any]
    nodes: dict[str, dict[str, Any]]  # inventory host -> vars
    vms: dict[str, dict[str, Any]]
    router: tuple[str, dict[str, Any]] | None
    k3s_servers: list[str]
    k3s_agents: list[str]
    problems: list[Problem] = field(default_factory=list)

    def node_by_name(self, pve_node: str) -> tuple[str, dict[str, Any]] | None:
        for host, node in self.nodes.items():
            if node.get("pve_node") == pve_node:
                return host, node
        return None


def _coerce(host: str, var: Var, value: Any, problems: list[Problem]) -> Any:
    """Check a value's type; return it (bools and ints from strings are refused: YAML gives types)."""
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "list": isinstance(value, list),
        "dict": isinstance(value, dict),
    }[var.type]
    if ok:
        return value
    if var.type == "int" and isinstance(value, str) and value.strip().isdigit():
        return int(value)  # templated values arrive as strings
    if var.type == "float" and isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
        return float(value)
    if var.type == "bool" and isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if var.type == "str" and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    problems.append(
        Problem(
            host,
            var.name,
            value,
            f"expected a {var.type}, got {type(value).__name__}",
            f"write it as a {var.type} ({var.doc})",
        )
    )
    return var.default


def _read(host: str, scope: str, get: Callable[[str], Any], problems: list[Problem]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var in CATALOGUE:
        if var.scope != scope:
            continue
        value = get(var.name)
        if value is None or (var.secret and value == ""):
            if var.required:
                problems.append(
                    Problem(
                        host, var.name, None, "required and not set", f"set it in the inventory ({var.doc})"
                    )
                )
            out[var.name] = var.default
            continue
        out[var.name] = _coerce(host, var, value, problems)
    return out


def load(groups: dict[str, Iterable[str]], hostvar: Callable[[str, str], Any]) -> Lab:
    """Read the lab definition; ``hostvar(host, name)`` returns a host's variable or None."""
    problems: list[Problem] = []
    groups = {g: list(groups.get(g) or []) for g in GROUPS}
    everyone = sorted({h for g in GROUPS for h in groups[g]})
    first = (groups["proxmox"] or everyone or ["all"])[0]
    glob = _read("all", "all", lambda n: hostvar(first, n), problems)
    nodes = {}
    for h in groups["proxmox"]:
        nodes[h] = _read(h, "proxmox", lambda n, h=h: hostvar(h, n), problems)
        nodes[h]["ansible_host"] = hostvar(h, "ansible_host")
    vms = {}
    for h in groups["vms"]:
        vm = _read(h, "vms", lambda n, h=h: hostvar(h, n), problems)
        vm["vm_name"] = vm.get("vm_name") or h
        vms[h] = vm
    router = None
    if groups["router"]:
        rh = groups["router"][0]
        router = (rh, _read(rh, "router", lambda n: hostvar(rh, n), problems))
        for extra in groups["router"][1:]:
            problems.append(
                Problem(
                    extra,
                    "group router",
                    extra,
                    "only one router is supported",
                    f"keep one host in group router (first is {rh})",
                )
            )
    return Lab(glob, nodes, vms, router, groups["k3s_server"], groups["k3s_agent"], problems)


# --- checks ---------------------------------------------------------------------------------------


def _check_api(lab: Lab, out: list[Problem]) -> None:
    g = lab.globals
    url = g.get("pve_api_url")
    if url and not URL_RE.match(url):
        out.append(
            Problem(
                "all",
                "pve_api_url",
                url,
                "not an https:// URL of a host and optional port",
                "write it like https://192.168.100.5:8006",
            )
        )
    tid, secret = g.get("pve_api_token_id"), g.get("pve_api_token_secret")
    user, password = g.get("pve_api_user"), g.get("pve_api_password")
    if tid and not TOKEN_ID_RE.match(tid):
        out.append(
            Problem(
                "all",
                "pve_api_token_id",
                tid,
                "a token id is USER@REALM!TOKENNAME",
                "copy the token id from Datacenter > Permissions > API Tokens, e.g. root@pam!gpulab",
            )
        )
    if user and not USER_RE.match(user):
        out.append(Problem("all", "pve_api_user", user, "a user is USER@REALM", "write it like root@pam"))
    if not tid and not user:
        out.append(
            Problem(
                "all",
                "pve_api_token_id",
                None,
                "no way to log in to the Proxmox API",
                "set pve_api_token_id and its secret, or pve_api_user and pve_api_password",
            )
        )
    if tid and not secret:
        out.append(
            Problem(
                "all",
                "pve_api_token_secret",
                None,
                "missing secret for the API token " + tid,
                "put vault_pve_api_token_secret in the vault or export GPULAB_PVE_API_TOKEN_SECRET",
            )
        )
    if user and not tid and not password:
        out.append(
            Problem(
                "all",
                "pve_api_password",
                None,
                "missing secret: password of " + user,
                "put vault_pve_api_password in the vault or export GPULAB_PVE_API_PASSWORD",
            )
        )
    for name in ("pve_api_token_secret", "pve_api_password"):
        value = g.get(name)
        if value and PLACEHOLDER_RE.search(value):
            out.append(
                Problem(
                    "all",
                    name,
                    "<placeholder>",
                    "the example placeholder was never replaced",
                    "put the real secret in the vault (ansible-vault edit ...)",
                )
            )
    fp = g.get("pve_api_fingerprint")
    if fp and not FINGERPRINT_RE.match(fp):
        out.append(
            Problem(
                "all",
                "pve_api_fingerprint",
                fp,
                "not a SHA-256 fingerprint (32 hex bytes with colons)",
                "copy it from the node's Certificates page or `openssl x509 -fingerprint -sha256`",
            )
        )
    for name in ("gpulab_os_image", "gpulab_os_iso"):
        img = g.get(name)
        if not img:
            continue
        algo = img.get("checksum_algorithm", "sha256")
        if algo not in CHECKSUM_LENGTHS:
            out.append(
                Problem(
                    "all",
                    f"{name}.checksum_algorithm",
                    algo,
                    "PVE checks sha256 or sha512 here",
                    "use sha256 or sha512",
                )
            )
            continue
        ck = str(img.get("checksum", ""))
        if not re.fullmatch(rf"[0-9a-fA-F]{{{CHECKSUM_LENGTHS[algo]}}}", ck):
            out.append(
                Problem(
                    "all",
                    f"{name}.checksum",
                    ck or None,
                    f"a {algo} checksum is {CHECKSUM_LENGTHS[algo]} hex digits",
                    "copy the image's line from the distribution's SHA256SUMS file",
                )
            )
        if not str(img.get("url", "")).startswith(("https://", "http://")):
            out.append(
                Problem(
                    "all",
                    f"{name}.url",
                    img.get("url"),
                    "PVE downloads from an http(s) URL",
                    "give the image's full download URL",
                )
            )
        for key in ("filename", "storage"):
            if not img.get(key):
                out.append(
                    Problem(
                        "all",
                        f"{name}.{key}",
                        None,
                        "required",
                        f"set {name}.{key} (see inventory/homelab/group_vars/all/main.yml)",
                    )
                )


def _check_nodes(lab: Lab, out: list[Problem]) -> dict[str, tuple[str, dict]]:
    gpus: dict[str, tuple[str, dict]] = {}  # "node/gpu-id" -> (host, gpu)
    names: dict[str, str] = {}
    if not lab.nodes:
        out.append(
            Problem(
                "inventory",
                "group proxmox",
                None,
                "no Proxmox node in the inventory",
                "add the node under group proxmox with pve_node, pve_memory_mib, pve_storages",
            )
        )
    for host, node in lab.nodes.items():
        name = node.get("pve_node")
        if name in names:
            out.append(
                Problem(
                    host,
                    "pve_node",
                    name,
                    f"the same node name as {names[name]}",
                    "give each node its own name as PVE knows it",
                )
            )
        names[name] = host
        storages = node.get("pve_storages") or {}
        for sid, st in storages.items():
            if not STORAGE_ID_RE.match(str(sid)):
                out.append(
                    Problem(
                        host,
                        "pve_storages",
                        sid,
                        "not a valid PVE storage id",
                        "use the storage id shown under Datacenter > Storage",
                    )
                )
            if not isinstance(st, dict) or not isinstance(st.get("content", []), list):
                out.append(
                    Problem(
                        host,
                        f"pve_storages.{sid}",
                        st,
                        "expected {type, content: [...], size_gb}",
                        "describe the storage as a mapping",
                    )
                )
        seen_slots: dict[str, str] = {}
        for i, gpu in enumerate(node.get("pve_gpus") or []):
            where = f"pve_gpus[{i}]"
            if not isinstance(gpu, dict) or not gpu.get("id"):
                out.append(
                    Problem(
                        host,
                        where,
                        gpu,
                        "a GPU needs at least id and pci",
                        "write {id: rtx3090, pci: '0000:02:00', ...}",
                    )
                )
                continue
            key = f"{name}/{gpu['id']}"
            if key in gpus:
                out.append(
                    Problem(
                        host,
                        f"{where}.id",
                        gpu["id"],
                        "two GPUs with the same id on this node",
                        "give each GPU its own id",
                    )
                )
            gpus[key] = (host, gpu)
            slot = str(gpu.get("pci", ""))
            if not PCI_SLOT_RE.match(slot):
                out.append(
                    Problem(
                        host,
                        f"{where}.pci",
                        gpu.get("pci"),
                        "not a PCI slot DDDD:BB:SS (lower-case hex, no function)",
                        "copy it from `lspci -D` without the .function, e.g. 0000:02:00",
                    )
                )
            elif slot in seen_slots:
                out.append(
                    Problem(
                        host,
                        f"{where}.pci",
                        slot,
                        f"the same slot as GPU {seen_slots[slot]}",
                        "list each card once",
                    )
                )
            seen_slots[slot] = gpu["id"]
            for fn in gpu.get("functions") or []:
                if not PCI_FUNC_RE.match(str(fn)) or not str(fn).startswith(slot + "."):
                    out.append(
                        Problem(
                            host,
                            f"{where}.functions",
                            fn,
                            f"not a function DDDD:BB:SS.F of slot {slot}",
                            "list the card's functions as `lspci -D -s SLOT` shows them",
                        )
                    )
            vd = gpu.get("vendor_device")
            if vd is not None and not VENDOR_DEVICE_RE.match(str(vd)):
                out.append(
                    Problem(
                        host,
                        f"{where}.vendor_device",
                        vd,
                        "not VVVV:DDDD in lower-case hex",
                        "copy it from `lspci -nn` (e.g. 10de:2204)",
                    )
                )
    return gpus


def _check_vms(lab: Lab, gpus: dict[str, tuple[str, dict]], out: list[Problem]) -> None:
    ids: dict[int, str] = {}
    names: dict[str, str] = {}
    macs: dict[str, str] = {}
    gpu_users: dict[str, str] = {}
    for host, vm in lab.vms.items():
        vmid = vm.get("vm_id")
        if isinstance(vmid, int):
            if not VMID_MIN <= vmid <= VMID_MAX:
                out.append(
                    Problem(
                        host,
                        "vm_id",
                        vmid,
                        f"PVE VMIDs are {VMID_MIN}-{VMID_MAX}",
                        "pick a free id in that range, e.g. 100",
                    )
                )
            elif vmid in ids:
                out.append(
                    Problem(
                        host, "vm_id", vmid, f"already used by {ids[vmid]}", "give every VM its own vm_id"
                    )
                )
            ids.setdefault(vmid, host)
        name = vm["vm_name"]
        if not DNS_NAME_RE.match(name):
            out.append(
                Problem(
                    host,
                    "vm_name",
                    name,
                    "PVE VM names are DNS labels (letters, digits, '-')",
                    "rename it, e.g. vm-gpu",
                )
            )
        elif name.lower() in names:
            out.append(
                Problem(
                    host,
                    "vm_name",
                    name,
                    f"the same name as {names[name.lower()]}",
                    "give every VM its own name",
                )
            )
        names.setdefault(name.lower(), host)
        mac = vm.get("vm_mac")
        if mac is not None:
            if not MAC_RE.match(mac):
                out.append(
                    Problem(
                        host,
                        "vm_mac",
                        mac,
                        "not a MAC address XX:XX:XX:XX:XX:XX",
                        "write six hex pairs with colons, or leave vm_mac unset",
                    )
                )
            elif int(mac[:2], 16) & 1:
                out.append(
                    Problem(
                        host,
                        "vm_mac",
                        mac,
                        "a multicast MAC cannot be a NIC's address",
                        "use a unicast MAC (even first byte), e.g. BC:24:11:...",
                    )
                )
            elif mac.lower() in macs:
                out.append(
                    Problem(
                        host,
                        "vm_mac",
                        mac,
                        f"the same MAC as {macs[mac.lower()]}",
                        "give every VM its own MAC",
                    )
                )
            else:
                macs[mac.lower()] = host
        for key, allowed in (
            ("vm_machine", MACHINES),
            ("vm_firmware", FIRMWARES),
            ("vm_os_install", OS_INSTALLS),
        ):
            if vm.get(key) not in allowed:
                out.append(
                    Problem(host, key, vm.get(key), "unknown value", "use one of " + ", ".join(allowed))
                )
        for key, low in (("vm_cores", 1), ("vm_memory_mib", 512), ("vm_disk_gb", 1)):
            val = vm.get(key)
            if isinstance(val, int) and val < low:
                out.append(Problem(host, key, val, f"must be at least {low}", f"set {key} to {low} or more"))
        bmin = vm.get("vm_balloon_min_mib")
        if isinstance(bmin, int) and isinstance(vm.get("vm_memory_mib"), int) and bmin > vm["vm_memory_mib"]:
            out.append(
                Problem(
                    host,
                    "vm_balloon_min_mib",
                    bmin,
                    "above the VM's memory",
                    f"set it at most vm_memory_mib ({vm['vm_memory_mib']})",
                )
            )
        if vm.get("vm_os_install") == "cloud_image" and not lab.globals.get("gpulab_os_image"):
            out.append(
                Problem(
                    host,
                    "gpulab_os_image",
                    None,
                    "the VM installs from the cloud image, none is set",
                    "set gpulab_os_image in group_vars/all or use vm_os_install: iso",
                )
            )
        if vm.get("vm_os_install") == "cloud_image" and not vm.get("vm_ssh_public_key"):
            out.append(
                Problem(
                    host,
                    "vm_ssh_public_key",
                    None,
                    "cloud-init needs a public key to let you log in",
                    "set vm_ssh_public_key to the contents of your ~/.ssh/id_ed25519.pub",
                )
            )
        if vm.get("vm_os_install") == "iso" and not lab.globals.get("gpulab_os_iso"):
            out.append(
                Problem(
                    host,
                    "gpulab_os_iso",
                    None,
                    "the VM installs from the ISO, none is set",
                    "set gpulab_os_iso in group_vars/all or use vm_os_install: cloud_image",
                )
            )

        # node, storage, cores
        found = lab.node_by_name(vm.get("vm_node"))
        if found is None:
            known = ", ".join(n.get("pve_node") or h for h, n in lab.nodes.items()) or "none"
            out.append(
                Problem(
                    host,
                    "vm_node",
                    vm.get("vm_node"),
                    "no Proxmox node of that name",
                    f"use the pve_node of a host in group proxmox ({known})",
                )
            )
            continue
        _, node = found
        storages = node.get("pve_storages") or {}
        st = storages.get(vm.get("vm_storage"))
        if st is None:
            out.append(
                Problem(
                    host,
                    "vm_storage",
                    vm.get("vm_storage"),
                    f"node {node['pve_node']} has no such storage",
                    "use one of " + (", ".join(storages) or "its storages"),
                )
            )
        elif "images" not in (st.get("content") or []):
            out.append(
                Problem(
                    host,
                    "vm_storage",
                    vm.get("vm_storage"),
                    "this storage does not hold VM disks",
                    "pick a storage whose content includes images (e.g. local-zfs)",
                )
            )
        threads = node.get("pve_threads")
        if isinstance(threads, int) and isinstance(vm.get("vm_cores"), int) and vm["vm_cores"] > threads:
            out.append(
                Problem(
                    host,
                    "vm_cores",
                    vm["vm_cores"],
                    f"node {node['pve_node']} has {threads} threads",
                    f"give at most {threads} vCPUs",
                )
            )

        # GPU rules
        gpu_id = vm.get("vm_gpu")
        if gpu_id is None:
            continue
        key = f"{node['pve_node']}/{gpu_id}"
        if key not in gpus:
            have = ", ".join(g.get("id") for g in node.get("pve_gpus") or [] if isinstance(g, dict)) or "none"
            out.append(
                Problem(
                    host,
                    "vm_gpu",
                    gpu_id,
                    f"node {node['pve_node']} has no GPU with that id",
                    f"use an id from its pve_gpus ({have})",
                )
            )
            continue
        if key in gpu_users:
            out.append(
                Problem(
                    host,
                    "vm_gpu",
                    gpu_id,
                    f"already given to {gpu_users[key]}",
                    "a card can be passed through to one VM only; share it inside k3s with HAMi",
                )
            )
        gpu_users.setdefault(key, host)
        gpu = gpus[key][1]
        if vm.get("vm_machine") != "q35":
            out.append(
                Problem(
                    host,
                    "vm_machine",
                    vm.get("vm_machine"),
                    "a GPU VM needs PCI Express",
                    "set vm_machine: q35",
                )
            )
        if vm.get("vm_firmware") != "ovmf":
            out.append(
                Problem(
                    host,
                    "vm_firmware",
                    vm.get("vm_firmware"),
                    "a GPU VM needs UEFI for the card's ROM",
                    "set vm_firmware: ovmf",
                )
            )
        if vm.get("vm_balloon"):
            out.append(
                Problem(
                    host,
                    "vm_balloon",
                    True,
                    "ballooning cannot work with a passed-through device (all memory is pinned)",
                    "set vm_balloon: false",
                )
            )
        if vm.get("vm_efi_pre_enrolled_keys"):
            out.append(
                Problem(
                    host,
                    "vm_efi_pre_enrolled_keys",
                    True,
                    "Secure Boot with Microsoft keys refuses the unsigned NVIDIA module",
                    "set vm_efi_pre_enrolled_keys: false",
                )
            )
        if vm.get("vm_onboot") and gpu.get("boot_display") and not vm.get("vm_onboot_override_boot_display"):
            out.append(
                Problem(
                    host,
                    "vm_onboot",
                    True,
                    f"GPU {gpu_id} is the host's boot display: starting the VM at boot takes the "
                    "host's only screen",
                    "set vm_onboot: false, or vm_onboot_override_boot_display: true if you accept it",
                )
            )


def _check_capacity(lab: Lab, out: list[Problem]) -> None:
    reserve = lab.globals.get("gpulab_host_reserve_mib") or 0
    for host, node in lab.nodes.items():
        mine = [(h, vm) for h, vm in lab.vms.items() if vm.get("vm_node") == node.get("pve_node")]
        pinned = reserve + sum(pinned_mib(vm) for _, vm in mine)
        total = node.get("pve_memory_mib")
        if isinstance(total, int) and pinned > total:
            parts = ", ".join(f"{h} {pinned_mib(vm)}" for h, vm in mine)
            out.append(
                Problem(
                    host,
                    "pve_memory_mib",
                    total,
                    f"pinned memory {pinned} MiB ({parts}, host reserve {reserve}) exceeds it",
                    "lower vm_memory_mib, enable ballooning with vm_balloon_min_mib on VMs "
                    "without a GPU, or remove a VM",
                )
            )
        for sid, st in (node.get("pve_storages") or {}).items():
            size = st.get("size_gb") if isinstance(st, dict) else None
            if not isinstance(size, int | float):
                continue
            used = [
                (h, vm["vm_disk_gb"])
                for h, vm in mine
                if vm.get("vm_storage") == sid and isinstance(vm.get("vm_disk_gb"), int)
            ]
            for h, gb in used:
                if gb > size:
                    out.append(
                        Problem(
                            h,
                            "vm_disk_gb",
                            gb,
                            f"larger than storage {sid} ({size} GB)",
                            f"use at most {size} GB or another storage",
                        )
                    )
            total_gb = sum(gb for _, gb in used)
            if total_gb > size and all(gb <= size for _, gb in used):
                out.append(
                    Problem(
                        host,
                        f"pve_storages.{sid}.size_gb",
                        size,
                        f"the VM disks on it add up to {total_gb} GB",
                        "shrink vm_disk_gb of some VMs or put them on another storage",
                    )
                )


def _check_router(lab: Lab, out: list[Problem]) -> None:
    if lab.router is None:
        out.append(
            Problem(
                "inventory",
                "group router",
                None,
                "no router in the inventory",
                "add the router host under group router with router_kind, router_address, ...",
            )
        )
        return
    host, r = lab.router
    if r.get("router_kind") not in ROUTER_KINDS:
        out.append(
            Problem(
                host,
                "router_kind",
                r.get("router_kind"),
                "unknown router kind",
                "use one of " + ", ".join(ROUTER_KINDS),
            )
        )
    elif r["router_kind"] in PASSWORD_ROUTERS and not r.get("router_password"):
        out.append(
            Problem(
                host,
                "router_password",
                None,
                f"missing secret: the {r['router_kind']} router's password",
                "put vault_router_password in the vault or export GPULAB_ROUTER_PASSWORD",
            )
        )
    try:
        net = ipaddress.IPv4Network(str(r.get("router_subnet")), strict=True)
    except ValueError as exc:
        out.append(
            Problem(
                host,
                "router_subnet",
                r.get("router_subnet"),
                f"not an IPv4 network ({exc})",
                "write it like 192.168.100.0/24",
            )
        )
        return
    raddr = _ip(host, "router_address", r.get("router_address"), out)
    if raddr is not None and raddr not in net:
        out.append(
            Problem(
                host,
                "router_address",
                str(raddr),
                f"outside router_subnet {net}",
                "fix the router's address or the subnet",
            )
        )
    pool = r.get("router_dhcp_pool") or {}
    start = _ip(host, "router_dhcp_pool.start", pool.get("start"), out)
    end = _ip(host, "router_dhcp_pool.end", pool.get("end"), out)
    if start and end:
        if start not in net or end not in net:
            out.append(
                Problem(
                    host,
                    "router_dhcp_pool",
                    f"{start}-{end}",
                    f"not inside {net}",
                    "give a pool inside the router's subnet",
                )
            )
        elif start > end:
            out.append(
                Problem(
                    host, "router_dhcp_pool", f"{start}-{end}", "start is after end", "swap start and end"
                )
            )
    seen: dict[ipaddress.IPv4Address, str] = {}
    for vhost, vm in lab.vms.items():
        addr = _ip(vhost, "vm_address", vm.get("vm_address"), out)
        if addr is None:
            continue
        if addr not in net:
            out.append(
                Problem(
                    vhost,
                    "vm_address",
                    str(addr),
                    f"outside the router's subnet {net}",
                    f"pick an address in {net}",
                )
            )
        elif addr in (net.network_address, net.broadcast_address):
            out.append(
                Problem(
                    vhost,
                    "vm_address",
                    str(addr),
                    "the network or broadcast address of " + str(net),
                    "pick a host address",
                )
            )
        elif addr == raddr:
            out.append(
                Problem(
                    vhost,
                    "vm_address",
                    str(addr),
                    "that is the router's own address",
                    "pick another free address",
                )
            )
        elif addr in seen:
            out.append(
                Problem(
                    vhost,
                    "vm_address",
                    str(addr),
                    f"already given to {seen[addr]}",
                    "give every VM its own address",
                )
            )
        seen.setdefault(addr, vhost)
    for nhost, node in lab.nodes.items():
        addr = node.get("ansible_host")
        if addr and str(addr) in {str(a) for a in seen}:
            vhost = seen[ipaddress.IPv4Address(str(addr))]
            out.append(
                Problem(
                    vhost,
                    "vm_address",
                    str(addr),
                    f"that is the address of Proxmox node {nhost}",
                    "pick another free address",
                )
            )


def _ip(host: str, name: str, value: Any, out: list[Problem]) -> ipaddress.IPv4Address | None:
    if value is None:
        return None
    try:
        return ipaddress.IPv4Address(str(value))
    except ValueError:
        out.append(Problem(host, name, value, "not an IPv4 address", "write it like 192.168.100.53"))
        return None


def _check_k3s(lab: Lab, out: list[Problem]) -> None:
    servers, agents = lab.k3s_servers, lab.k3s_agents
    if not servers:
        out.append(
            Problem(
                "inventory",
                "group k3s_server",
                None,
                "k3s has no server",
                "put one VM (e.g. vm-1) in group k3s_server",
            )
        )
    elif len(servers) % 2 == 0:
        out.append(
            Problem(
                "inventory",
                "group k3s_server",
                servers,
                f"{len(servers)} servers: embedded etcd needs an odd number for a quorum",
                "use 1 or 3 servers",
            )
        )
    for h in set(servers) & set(agents):
        out.append(
            Problem(
                h,
                "group k3s_agent",
                h,
                "the host is both k3s server and agent",
                "keep it in one of k3s_server or k3s_agent",
            )
        )
    for h in [*servers, *agents]:
        if h not in lab.vms:
            out.append(
                Problem(
                    h,
                    "group vms",
                    h,
                    "a k3s node that is not a lab VM",
                    "add it to group vms with its vm_* settings, or remove it from k3s",
                )
            )
    shares: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for i, engine in enumerate(lab.globals.get("workloads_engines") or []):
        where = f"workloads_engines[{i}]"
        if not isinstance(engine, dict) or not engine.get("name") or not engine.get("node"):
            out.append(
                Problem(
                    "all",
                    where,
                    engine,
                    "an engine needs at least name and node",
                    "write {name: vllm, node: vm-gpu, gpus: [0], gpu_memory_percent: 45, ...}",
                )
            )
            continue
        node = engine["node"]
        if node not in lab.vms or not lab.vms[node].get("vm_gpu"):
            out.append(
                Problem(
                    "all",
                    f"{where}.node",
                    node,
                    "not a lab VM with a GPU",
                    "use the inventory name of a VM that has vm_gpu set, e.g. vm-gpu",
                )
            )
        pct = engine.get("gpu_memory_percent", 100)
        if not isinstance(pct, int) or not 1 <= pct <= 100:
            out.append(
                Problem(
                    "all",
                    f"{where}.gpu_memory_percent",
                    pct,
                    "a share of a card is 1-100 percent",
                    "give the percentage of each card's memory the engine may use",
                )
            )
            continue
        for card in engine.get("gpus") or [0]:
            shares.setdefault((node, str(card)), []).append((engine["name"], pct))
    for (node, card), users in shares.items():
        total = sum(p for _, p in users)
        if total > 100:
            parts = " + ".join(f"{n} {p}%" for n, p in users)
            out.append(
                Problem(
                    "all",
                    "workloads_engines",
                    f"{node} card {card}",
                    f"the engines ask for {total}% of one card ({parts})",
                    "lower gpu_memory_percent so the engines on a card add up to 100 or less",
                )
            )
    split = lab.globals.get("hami_device_split_count")
    if isinstance(split, int) and split < 1:
        out.append(
            Problem(
                "all",
                "hami_device_split_count",
                split,
                "must be at least 1",
                "set how many pods may share one card, e.g. 10",
            )
        )
    scaling = lab.globals.get("hami_device_memory_scaling")
    if isinstance(scaling, int | float) and scaling <= 0:
        out.append(
            Problem(
                "all", "hami_device_memory_scaling", scaling, "must be above 0", "use 1 for no overcommit"
            )
        )


def pinned_mib(vm: dict[str, Any]) -> int:
    """Memory PVE cannot take back from a VM: all of it with a GPU or without ballooning,
    else its balloon floor (which defaults to all of it)."""
    mem = vm.get("vm_memory_mib") if isinstance(vm.get("vm_memory_mib"), int) else 0
    if vm.get("vm_gpu") or not vm.get("vm_balloon"):
        return mem
    floor = vm.get("vm_balloon_min_mib")
    return min(floor, mem) if isinstance(floor, int) else mem


def validate(lab: Lab) -> list[Problem]:
    """Every problem of the lab definition, in inventory order; empty when it is valid."""
    out = list(lab.problems)
    _check_api(lab, out)
    gpus = _check_nodes(lab, out)
    _check_vms(lab, gpus, out)
    _check_capacity(lab, out)
    _check_router(lab, out)
    _check_k3s(lab, out)
    # one message per (host, field, why): a missing value may be reported by two checks
    unique: dict[tuple[str, str, str], Problem] = {}
    for p in out:
        unique.setdefault((p.host, p.field, p.why), p)
    return list(unique.values())


def check(groups: dict[str, Iterable[str]], hostvar: Callable[[str, str], Any]) -> tuple[Lab, list[Problem]]:
    lab = load(groups, hostvar)
    return lab, validate(lab)


# --- the plan -------------------------------------------------------------------------------------


def plan_text(lab: Lab) -> str:
    """A readable plan: VMs per node, pinned-memory budget, GPU assignments, addresses."""
    lines: list[str] = []
    reserve = lab.globals.get("gpulab_host_reserve_mib") or 0
    role = {h: "server" for h in lab.k3s_servers} | {h: "agent" for h in lab.k3s_agents}
    for host, node in lab.nodes.items():
        mine = [(h, vm) for h, vm in lab.vms.items() if vm.get("vm_node") == node.get("pve_node")]
        lines.append(f"Node {node.get('pve_node')} ({host}): {node.get('pve_memory_mib')} MiB RAM")
        header = (
            "vmid",
            "name",
            "vCPU",
            "memory",
            "disk",
            "machine/firmware",
            "GPU",
            "onboot",
            "address",
            "k3s",
        )
        rows = [header]
        for h, vm in sorted(mine, key=lambda x: x[1].get("vm_id") or 0):
            mem = f"{vm.get('vm_memory_mib')} MiB" + ("" if vm.get("vm_balloon") else " fixed")
            rows.append(
                (
                    str(vm.get("vm_id")),
                    vm["vm_name"],
                    str(vm.get("vm_cores")),
                    mem,
                    f"{vm.get('vm_disk_gb')} GB {vm.get('vm_storage')}",
                    f"{vm.get('vm_machine')}/{vm.get('vm_firmware')}",
                    vm.get("vm_gpu") or "-",
                    "yes" if vm.get("vm_onboot") else "no",
                    str(vm.get("vm_address")),
                    role.get(h, "-"),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        pinned = sum(pinned_mib(vm) for _, vm in mine)
        total = node.get("pve_memory_mib")
        free = (total - pinned - reserve) if isinstance(total, int) else "?"
        lines.append(
            f"  pinned memory: {pinned} MiB of VMs + {reserve} MiB host reserve = "
            f"{pinned + reserve} of {total} MiB ({free} MiB left)"
        )
        for gpu in node.get("pve_gpus") or []:
            if not isinstance(gpu, dict):
                continue
            users = [h for h, vm in mine if vm.get("vm_gpu") == gpu.get("id")]
            disp = ", boot display" if gpu.get("boot_display") else ""
            lines.append(
                f"  GPU {gpu.get('id')} {gpu.get('pci')} ({gpu.get('vendor_device', '?')}, "
                f"IOMMU group {gpu.get('iommu_group', '?')}{disp}) -> {', '.join(users) or 'unused'}"
            )
    if lab.router:
        rh, r = lab.router
        pool = r.get("router_dhcp_pool") or {}
        lines.append(
            f"Router {rh}: {r.get('router_kind')} at {r.get('router_address')}, "
            f"subnet {r.get('router_subnet')}, pool {pool.get('start')}-{pool.get('end')}"
        )
        for h, vm in lab.vms.items():
            lines.append(f"  reserve {vm.get('vm_mac') or '(MAC from PVE)'} -> {vm.get('vm_address')} ({h})")
    lines.append(
        f"k3s {lab.globals.get('k3s_version')}: server {', '.join(lab.k3s_servers) or '-'}; "
        f"agents {', '.join(lab.k3s_agents) or '-'}"
    )
    lines.append(
        f"HAMi {lab.globals.get('hami_chart_version')}: {lab.globals.get('hami_device_split_count')} "
        f"shares per card"
    )
    return "\n".join(lines)
