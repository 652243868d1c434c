"""DHCP reservations on the lab's router: one interface, many routers.

    from gpulab.routers import make_backend
    with make_backend({"kind": "dnsmasq", "address": "192.168.100.1", ...}) as router:
        router.ensure("BC:24:11:00:00:01")                 # keep the address it holds
        router.ensure("bc:24:11:00:00:02", "192.168.100.54", "vm-2")
        result = router.apply(check_mode=False)          # plan, refuse or write once, verify

Every backend lists leases and reservations keyed on the normalised MAC, stages `ensure`/`remove`,
and `apply`s once per run; refusals (outside the subnet, address held by another MAC, duplicate MAC,
router limit, in-pool on pfSense) are raised before any write, authentication failures as AuthError.
"""

from __future__ import annotations

from gpulab.constants import ROUTER_KINDS

from .backend import Backend, Result
from .model import (
    ApplyError,
    AuthError,
    ConflictError,
    ConnectError,
    LimitError,
    PolicyError,
    RouterError,
    VerifyError,
)

# The interface: build a backend (or probe a router) and the errors it raises. The data model the
# backends share (Desired, Lease, Reservation, norm_mac, make_plan) stays in gpulab.routers.model.
__all__ = [
    "OPTION_DEFAULTS",
    "ApplyError",
    "AuthError",
    "Backend",
    "ConflictError",
    "ConnectError",
    "LimitError",
    "PolicyError",
    "Result",
    "RouterError",
    "VerifyError",
    "make_backend",
    "probe",
]

# Backend-specific options (the `options` mapping), with their defaults; documented in the module.
OPTION_DEFAULTS = {
    "dnsmasq": {
        "hostsfile": "/etc/dnsmasq.gpulab-hosts",
        "leasefile": "/var/lib/misc/dnsmasq.leases",
        "pidfile": "/run/dnsmasq/dnsmasq.pid",
        "reload_command": None,
        "check_wiring": True,
    },
    "openwrt": {"leasefile": None, "reload_command": "/etc/init.d/dnsmasq reload"},
    "kea": {"url": None, "service": "dhcp4", "subnet_id": None, "config_write": True},
    "mikrotik": {"server": None},
    "opnsense": {"dhcp": "kea"},
    "pfsense": {"interface": "lan", "auth": "basic"},
    "huawei_ont": {"profile": None},
}


def _shell(cfg: dict):
    from .shell import LocalShell, SSHShell, parse_ssh_args

    ssh = cfg.get("ssh") or {}
    if ssh.get("local"):
        return LocalShell()
    parsed = parse_ssh_args(ssh.get("ssh_args"))
    policy = "no" if ssh.get("host_key_checking") is False else parsed["policy"]
    return SSHShell(
        ssh.get("host") or cfg["address"],
        port=int(ssh.get("port") or 22),
        user=ssh.get("user") or cfg.get("user") or "root",
        password=ssh.get("password"),
        key_filename=ssh.get("key_file"),
        known_hosts=ssh.get("known_hosts") or parsed["known_hosts"],
        host_key_policy=policy or "strict",
        become=bool(ssh.get("become")),
    )


def make_backend(cfg: dict) -> Backend:
    """Build the backend for `cfg`: kind, address, subnet, pool {start, end}, user, password, url,
    validate_certs, ssh {host, port, user, password, key_file, host_key_checking, known_hosts, ssh_args,
    become, local},
    options (backend-specific, see OPTION_DEFAULTS), name (for messages)."""
    kind = cfg.get("kind")
    if kind not in ROUTER_KINDS:
        raise RouterError(
            f"unknown router kind {kind!r}: router_kind must be one of {', '.join(ROUTER_KINDS)}"
        )
    unknown = set(cfg.get("options") or {}) - set(OPTION_DEFAULTS[kind])
    if unknown:
        raise RouterError(
            f"unknown option(s) {', '.join(sorted(unknown))} for router kind {kind}; known: "
            + ", ".join(sorted(OPTION_DEFAULTS[kind]))
        )
    opts = {**OPTION_DEFAULTS[kind], **{k: v for k, v in (cfg.get("options") or {}).items() if v is not None}}
    common = {
        "subnet": cfg.get("subnet"),
        "pool": cfg.get("pool"),
        "name": cfg.get("name") or f"{kind} router",
        "address": cfg.get("address"),
    }
    address = cfg.get("address")
    url = cfg.get("url") or (f"https://{address}" if address else None)
    verify = cfg.get("validate_certs", True)
    user, password = cfg.get("user"), cfg.get("password")
    if kind == "dnsmasq":
        from .dnsmasq import DnsmasqBackend

        return DnsmasqBackend(_shell(cfg), **opts, **common)
    if kind == "openwrt":
        from .openwrt import OpenWrtBackend

        return OpenWrtBackend(_shell(cfg), **opts, **common)
    if kind == "kea":
        from .kea import KeaBackend

        kea_url = opts.pop("url") or cfg.get("url") or f"http://{address}:8000/"
        return KeaBackend(kea_url, user=user, password=password, validate_certs=verify, **opts, **common)
    if kind == "mikrotik":
        from .mikrotik import MikroTikBackend

        return MikroTikBackend(url, user=user, password=password, validate_certs=verify, **opts, **common)
    if kind == "opnsense":
        from .opnsense import OPNsenseBackend

        return OPNsenseBackend(url, key=user, secret=password, validate_certs=verify, **opts, **common)
    if kind == "pfsense":
        from .pfsense import PfSenseBackend

        return PfSenseBackend(url, user=user, password=password, validate_certs=verify, **opts, **common)
    from .huawei import HuaweiOntBackend

    url = cfg.get("url") or f"http://{address}"  # these ONTs serve their admin page over plain HTTP
    return HuaweiOntBackend(url, user=user, password=password, validate_certs=verify, **opts, **common)


def probe(cfg: dict) -> dict:
    """Reach the router read-only (for preflight): log in, list reservations and leases.

    Returns {"kind", "reservations": n, "leases": n}; raises RouterError (AuthError, ConnectError...)
    with the same messages a real run would give.
    """
    with make_backend(cfg) as router:
        reservations = router.list_reservations()
        leases = router.list_leases()
    return {"kind": cfg["kind"], "reservations": len(reservations), "leases": len(leases)}
