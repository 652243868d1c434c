"""The lab definition's single-value rules, as a table: for a variable, what its value must look like.

A rule says why a value is wrong and how to fix it; the checks apply every rule of a variable in order
and report the first that fails. Values that are not set are not checked here (required variables are
reported by the loader), nor values of the wrong type (the loader reported those too). The roles' own
`choices` (meta/argument_specs.yml) are rules as well.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpulab import hami
from gpulab.constants import DIGEST_HEX_DIGITS, FIRMWARES, MACHINES, ROUTER_KINDS
from gpulab.labdef.catalogue import (
    CHART_VERSION_RE,
    DEBIAN_VERSION_RE,
    DNS_NAME_RE,
    DOWNLOAD_URL_RE,
    FINGERPRINT_RE,
    IMAGE_TAG_RE,
    K3S_VERSION_RE,
    KUBE_VIP_VERSION_RE,
    MAC_RE,
    NVIDIA_BRANCH_MAX,
    NVIDIA_BRANCH_MIN,
    OS_INSTALLS,
    STORAGE_ID_RE,
    TOKEN_ID_RE,
    URL_RE,
    USER_RE,
    VMID_MAX,
    VMID_MIN,
    role_options,
)


@dataclass(frozen=True)
class Rule:
    test: Callable[[Any], bool]
    why: str
    fix: str


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def one_of(options: tuple | list, why: str = "unknown value") -> Rule:
    shown = ", ".join(str(o) if o != "" else '""' for o in options)
    return Rule(lambda v: v in options, why, f"use one of {shown}")


def at_least(name: str, low: int, fix: str = "") -> Rule:
    return Rule(
        lambda v: not _int(v) or v >= low, f"must be at least {low}", fix or f"set {name} to {low} or more"
    )


def matching(regex: re.Pattern[str], why: str, fix: str, empty_ok: bool = False) -> Rule:
    return Rule(lambda v: isinstance(v, str) and (bool(regex.match(v)) or (empty_ok and v == "")), why, fix)


def _has_chart_facts(version: Any) -> bool:
    return not isinstance(version, str) or hami.facts_path(version).is_file()


def _known_charts() -> str:
    return ", ".join(hami.known_versions()) or "none"


def _digest(value: Any) -> bool:
    """Ansible's `ALGORITHM:HEX` checksum, or empty."""
    if value == "":
        return True
    algo, _, digest = str(value).partition(":")
    return algo in DIGEST_HEX_DIGITS and bool(
        re.fullmatch(rf"[0-9a-fA-F]{{{DIGEST_HEX_DIGITS[algo]}}}", digest)
    )


def _image(value: Any) -> bool:
    """A {registry, repository, tag} mapping whose tag is empty (the chart's) or a container image tag."""
    if not isinstance(value, dict):
        return False
    tag = value.get("tag") or ""
    return all(isinstance(value.get(k), str) and value[k] for k in ("registry", "repository")) and (
        tag == "" or bool(IMAGE_TAG_RE.match(str(tag)))
    )


K3S_RELEASE = matching(
    K3S_VERSION_RE,
    "not a k3s release: k3s tags its releases v1.Y.Z+k3sN and downloads nothing else",
    "write the release as k3s tags it, e.g. v1.36.2+k3s1 (https://github.com/k3s-io/k3s/releases)",
)
DOWNLOAD_URL = matching(
    DOWNLOAD_URL_RE,
    "not an http(s) URL: the run downloads from it",
    "give the whole http(s) URL, or leave the variable out for the role's default",
)

# An HTTP proxy that fetches https:// URLs itself (gpulab.downloads asks it in absolute form, in plain HTTP).
PROXY_URL_RE = re.compile(r"^http://[^/\s:]+(:\d{1,5})?/?$")

# variable -> its rules, checked in order; the first that fails is reported.
RULES: dict[str, tuple[Rule, ...]] = {
    # --- the Proxmox API ---
    "pve_api_url": (
        matching(
            URL_RE,
            "not an https:// URL of a host and optional port",
            "write it like https://192.168.100.5:8006",
        ),
    ),
    "pve_api_token_id": (
        matching(
            TOKEN_ID_RE,
            "a token id is USER@REALM!TOKENNAME",
            "copy the token id from Datacenter > Permissions > API Tokens, e.g. root@pam!gpulab",
        ),
    ),
    "pve_api_user": (matching(USER_RE, "a user is USER@REALM", "write it like root@pam"),),
    "pve_api_fingerprint": (
        matching(
            FINGERPRINT_RE,
            "not a SHA-256 fingerprint (32 hex bytes with colons)",
            "copy it from the node's Certificates page or `openssl x509 -fingerprint -sha256`",
        ),
    ),
    "gpulab_snippet_storage": (
        matching(
            STORAGE_ID_RE,
            "not a PVE storage ID",
            "name a storage of the node (Datacenter > Storage), e.g. local or local-btrfs",
        ),
    ),
    "gpulab_download_check_proxy": (
        matching(
            PROXY_URL_RE,
            "not the http:// URL of a proxy (host and port; the check asks it in plain HTTP)",
            "write it like http://proxy.example:3128, or leave it out (the environment's https_proxy)",
            empty_ok=True,
        ),
    ),
    # --- what the run installs, and where it downloads it from ---
    "k3s_version": (K3S_RELEASE,),
    "k3s_server_version": (K3S_RELEASE,),
    "k3s_agent_version": (K3S_RELEASE,),
    "workloads_k3s_version": (
        matching(K3S_VERSION_RE, K3S_RELEASE.why, K3S_RELEASE.fix + ", or empty to skip", empty_ok=True),
    ),
    "k3s_server_kube_vip_version": (
        matching(
            KUBE_VIP_VERSION_RE,
            "not a kube-vip release: its images are tagged vX.Y.Z, so this names an image that does not exist",
            "write the release with its v, e.g. v1.2.2 (https://github.com/kube-vip/kube-vip/releases)",
        ),
    ),
    "hami_chart_version": (
        matching(CHART_VERSION_RE, "not a Helm chart version X.Y.Z", "write it like 2.10.0"),
        Rule(
            _has_chart_facts,
            "gpulab holds no key facts for this HAMi chart version, so its values cannot be checked",
            f"use a version whose facts gpulab ships ({_known_charts()}), or generate them with "
            "`python -m gpulab.hami VALUES.yaml VERSION` into library/gpulab/data/",
        ),
    ),
    "hami_chart_repo": (DOWNLOAD_URL,),
    "hami_kube_scheduler_image": (
        Rule(
            _image,
            "not an image {registry, repository, tag} with a container image tag (or an empty one)",
            "write it like {registry: registry.k8s.io, repository: kube-scheduler, tag: v1.36.2}",
        ),
    ),
    "nvidia_driver_branch": (
        Rule(
            lambda v: not _int(v) or NVIDIA_BRANCH_MIN <= v <= NVIDIA_BRANCH_MAX,
            "not a driver branch (the three-digit number of nvidia-driver-580-server)",
            "use a branch Ubuntu packages, e.g. 580",
        ),
    ),
    "nvidia_container_toolkit_version": (
        matching(
            DEBIAN_VERSION_RE,
            "not a Debian package version",
            "pin a version `apt-cache madison nvidia-container-toolkit` lists (e.g. 1.20.0-1), or leave it "
            "empty for the newest",
            empty_ok=True,
        ),
    ),
    "nvidia_container_toolkit_key_checksum": (
        Rule(
            _digest,
            "not a checksum ALGORITHM:HEX",
            "write it like sha256:<64 hex digits>, or leave it empty",
        ),
    ),
    "k3s_server_install_script_url": (DOWNLOAD_URL,),
    "k3s_agent_install_script_url": (DOWNLOAD_URL,),
    "nvidia_container_toolkit_key_url": (DOWNLOAD_URL,),
    "nvidia_container_toolkit_repo_url": (DOWNLOAD_URL,),
    "gpulab_apt_lock_timeout": (
        at_least("gpulab_apt_lock_timeout", 0, "give the seconds to wait for apt's locks, e.g. 900"),
    ),
    # --- HAMi ---
    "hami_device_split_count": (
        at_least("hami_device_split_count", 1, "set how many pods may share one card, e.g. 10"),
    ),
    "hami_device_memory_scaling": (
        Rule(
            lambda v: not isinstance(v, int | float) or v > 0,
            "must be above 0",
            "use 1 for no overcommit",
        ),
    ),
    # --- each VM ---
    "vm_id": (
        Rule(
            lambda v: not _int(v) or VMID_MIN <= v <= VMID_MAX,
            f"PVE VMIDs are {VMID_MIN}-{VMID_MAX}",
            "pick a free id in that range, e.g. 100",
        ),
    ),
    "vm_name": (
        matching(DNS_NAME_RE, "PVE VM names are DNS labels (letters, digits, '-')", "rename it, e.g. vm-gpu"),
    ),
    "vm_mac": (
        matching(
            MAC_RE,
            "not a MAC address XX:XX:XX:XX:XX:XX",
            "write six hex pairs with colons, or leave vm_mac unset",
        ),
        Rule(
            lambda v: not int(v[:2], 16) & 1,
            "a multicast MAC cannot be a NIC's address",
            "use a unicast MAC (even first byte), e.g. BC:24:11:...",
        ),
    ),
    "vm_machine": (one_of(MACHINES),),
    "vm_firmware": (one_of(FIRMWARES),),
    "vm_os_install": (one_of(OS_INSTALLS),),
    "vm_gpu_passthrough": (one_of(("mapping",)),),
    "vm_cores": (at_least("vm_cores", 1),),
    "vm_memory_mib": (at_least("vm_memory_mib", 512),),
    "vm_disk_gb": (at_least("vm_disk_gb", 1),),
    "vm_guest_phys_bits": (
        Rule(
            lambda v: not _int(v) or 32 <= v <= 64,
            "PVE's guest-phys-bits is 32-64",
            "set the IOMMU's address width that `gpulab doctor` names (e.g. 39), or leave it unset",
        ),
    ),
    # --- the router ---
    "router_kind": (one_of(ROUTER_KINDS, "unknown router kind"),),
}


def rules_for(name: str) -> tuple[Rule, ...]:
    """The table's rules of a variable, then its role's `choices` if a role declares any."""
    choices = (role_options().get(name) or {}).get("choices")
    return RULES.get(name, ()) + ((one_of(choices),) if choices else ())


def first_failure(name: str, value: Any) -> Rule | None:
    """The first rule the value breaks (None when it keeps them all, or when it is not set)."""
    if value is None:
        return None
    return next((rule for rule in rules_for(name) if not rule.test(value)), None)
