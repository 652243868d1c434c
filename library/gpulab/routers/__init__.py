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

from .backend import Backend, Result
from .kinds import KINDS, OPTION_DEFAULTS, SSH, ssh_settings
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
    "KINDS",
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


def _shell(cfg: dict):
    from .shell import LocalShell, SSHShell, parse_ssh_args

    ssh = ssh_settings(cfg.get("address"), cfg.get("user"), cfg.get("ssh"))
    if ssh["local"]:
        return LocalShell()
    parsed = parse_ssh_args(ssh["ssh_args"])
    policy = "no" if not ssh["host_key_checking"] else parsed["policy"]
    return SSHShell(
        ssh["host"],
        port=ssh["port"],
        user=ssh["user"],
        password=ssh["password"],
        key_filename=ssh["key_file"],
        known_hosts=ssh["known_hosts"] or parsed["known_hosts"],
        host_key_policy=policy or "strict",
        become=ssh["become"],
    )


def make_backend(cfg: dict) -> Backend:
    """Build the backend of `cfg`'s kind (its row of gpulab.routers.kinds.KINDS): kind, address, subnet,
    pool {start, end}, user, password, url, validate_certs, ssh {host, port, user, password, key_file,
    host_key_checking, known_hosts, ssh_args, become, local}, options (the kind's, see KINDS), name (for
    messages)."""
    kind = KINDS.get(cfg.get("kind"))
    if kind is None:
        raise RouterError(
            f"unknown router kind {cfg.get('kind')!r}: router_kind must be one of {', '.join(KINDS)}"
        )
    given = cfg.get("options") or {}
    unknown = set(given) - set(kind.options)
    if unknown:
        raise RouterError(
            f"unknown option(s) {', '.join(sorted(unknown))} for router kind {kind.name}; known: "
            + ", ".join(sorted(kind.options))
        )
    opts = {**kind.defaults(), **{k: v for k, v in given.items() if v is not None}}
    common = {
        "subnet": cfg.get("subnet"),
        "pool": cfg.get("pool"),
        "name": cfg.get("name") or f"{kind.name} router",
        "address": cfg.get("address"),
    }
    if kind.reach == SSH:
        return kind.cls(_shell(cfg), **opts, **common)
    # a kind with a `url` option (Kea's control agent) takes it before router_url
    url = opts.pop("url", None) or kind.base_url(cfg.get("address"), cfg.get("url"))
    user, password = kind.login
    login = {user: cfg.get("user"), password: cfg.get("password")}
    if cfg.get("validate_certs") is not None:  # else the class's own default: check the certificate
        login["validate_certs"] = cfg["validate_certs"]
    return kind.cls(url, **login, **opts, **common)


def probe(cfg: dict) -> dict:
    """Reach the router read-only (for preflight): log in, list reservations and leases.

    Returns {"kind", "reservations": n, "leases": n}; raises RouterError (AuthError, ConnectError...)
    with the same messages a real run would give.
    """
    with make_backend(cfg) as router:
        reservations = router.list_reservations()
        leases = router.list_leases()
    return {"kind": cfg["kind"], "reservations": len(reservations), "leases": len(leases)}
