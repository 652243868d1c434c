"""Values that several parts of gpulab must agree on, each defined once and imported where it is used.

The PVE formats are Proxmox VE's own: the user, realm and token-id patterns of pve-access-control (the
token-id pattern is quoted in shared/pve-api/NOTES.md) and the certificate fingerprint pattern of the API
schema (`([A-Fa-f0-9]{2}:){31}[A-Fa-f0-9]{2}`, 32 bytes joined by colons).
"""

from __future__ import annotations

import re

# --- routers (gpulab.routers, the lab definition, module dhcp_reservation) ---
ROUTER_KINDS = ("dnsmasq", "openwrt", "kea", "mikrotik", "opnsense", "pfsense", "huawei_ont")
# Reached over SSH with keys; every other kind logs in with a password.
SSH_ROUTER_KINDS = ("dnsmasq", "openwrt")
PASSWORD_ROUTER_KINDS = tuple(k for k in ROUTER_KINDS if k not in SSH_ROUTER_KINDS)

# --- Proxmox VE API logins (the lab definition, gpulab.pve.client) ---
PVE_REALM = r"[A-Za-z][A-Za-z0-9.\-_]+"
PVE_USER_RE = re.compile(rf"^[^\s:/]+@{PVE_REALM}$")
PVE_TOKEN_ID_RE = re.compile(rf"^[^\s:/]+@{PVE_REALM}![A-Za-z][A-Za-z0-9.\-_]+$")
PVE_FINGERPRINT_RE = re.compile(r"^([0-9A-Fa-f]{2}:){31}[0-9A-Fa-f]{2}$")

# --- what `gpulab discover` writes for a value it could not read or one the user must decide; the lab
# definition refuses any value that holds it (gpulab.labdef.checks.check_placeholders) ---
PLACEHOLDER = "CHANGE-ME"

# --- VM hardware the lab definition offers ---
MACHINES = ("i440fx", "q35")
FIRMWARES = ("seabios", "ovmf")

# --- files PVE downloads itself (download-url): the lab definition, gpulab.pve.download ---
DIGEST_HEX_DIGITS = {"md5": 32, "sha1": 40, "sha224": 56, "sha256": 64, "sha384": 96, "sha512": 128}
DOWNLOAD_ALGORITHMS = tuple(DIGEST_HEX_DIGITS)
# The file name endings PVE accepts per content type, and the same in words.
DOWNLOAD_EXTENSIONS = {
    "iso": re.compile(r"\.(iso|img)$", re.I),
    "import": re.compile(r"\.(ova|qcow2|raw|vmdk)$"),
    "vztmpl": re.compile(r"\.tar\.(gz|xz|zst|bz2)$|\.tgz$"),
}
DOWNLOAD_EXTENSION_HINTS = {
    "iso": ".iso or .img",
    "import": ".qcow2, .raw, .vmdk or .ova (a cloud image .img is qcow2: name it .qcow2)",
    "vztmpl": ".tar.gz/.tar.xz/.tar.zst",
}
