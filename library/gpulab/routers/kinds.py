"""The router kinds gpulab drives, one row each: the backend class, how it is reached, its options and docs.

`KINDS` is the one table behind `make_backend` (which class to build and with what), the options a kind
accepts in `router_options` (the keyword arguments of the class that the row names; their defaults are
the class's own, read from its signature, so each default is written once), and the module
dhcp_reservation's documentation of `options` (`option_docs()`; a test keeps the module's text
equal to it). A new router kind is a backend class and a row here (and its name in
gpulab.constants.ROUTER_KINDS, which the lab definition offers; a test keeps the two the same).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .backend import Backend
from .dnsmasq import DnsmasqBackend
from .huawei import HuaweiOntBackend
from .kea import KeaBackend
from .mikrotik import MikroTikBackend
from .openwrt import OpenWrtBackend
from .opnsense import OPNsenseBackend
from .pfsense import PfSenseBackend

SSH, HTTP = "ssh", "http"
# How an SSH router is reached when the inventory says nothing else (module option `ssh`).
SSH_PORT = 22
SSH_USER = "root"


@dataclass(frozen=True)
class Kind:
    """One router kind.

    `reach`: SSH (the class takes a shell) or HTTP (it takes a base URL, the login and validate_certs).
    `options`: the keys of `router_options` the kind takes, each a keyword argument of the class, with
    its documentation (Ansible markup). `url`: the default base URL (`{address}` is the router's address),
    for HTTP kinds. `login`: the class's keyword arguments for router_user and router_password.
    """

    name: str
    cls: type[Backend]
    reach: str
    options: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None
    login: tuple[str, str] = ("user", "password")

    def defaults(self) -> dict[str, Any]:
        """Each option with the default the class gives it."""
        params = inspect.signature(self.cls.__init__).parameters
        return {name: _default(params[name]) for name in self.options}

    def base_url(self, address: str | None, url: str | None = None) -> str | None:
        """The URL an HTTP router is reached at: `url` (router_url) when given, else the kind's default."""
        if url:
            return url
        return self.url.format(address=address) if self.url and address else None

    def doc(self) -> str:
        """The kind's line of the module's `options` documentation."""
        parts = []
        for name, text in self.options.items():
            default = self.defaults()[name]
            shown = (
                ""
                if default is None
                else f" (default C({str(default).lower() if default is True else default}))"
            )
            parts.append(f"C({name}){shown}{': ' + text if text else ''}")
        return f"V({self.name}): " + "; ".join(parts) + "."


def _default(param: inspect.Parameter) -> Any:
    return None if param.default is inspect.Parameter.empty else param.default


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind(
            "dnsmasq",
            DnsmasqBackend,
            SSH,
            {
                "hostsfile": "the C(--dhcp-hostsfile) dnsmasq reads",
                "leasefile": "",
                "pidfile": "SIGHUP goes to it",
                "reload_command": "run instead of the SIGHUP",
                "check_wiring": "refuse when the running dnsmasq does not read C(hostsfile)",
            },
        ),
        Kind(
            "openwrt",
            OpenWrtBackend,
            SSH,
            {
                "leasefile": "default from C(uci get dhcp.@dnsmasq[0].leasefile), else C(/tmp/dhcp.leases)",
                "reload_command": "",
            },
        ),
        Kind(
            "kea",
            KeaBackend,
            HTTP,
            {
                "url": "the control agent, default C(http://<address>:8000/)",
                "service": "empty for Kea 3 daemons listening on HTTP themselves",
                "subnet_id": "default the C(subnet4) entry equal to O(subnet)",
                "config_write": "",
            },
            url="http://{address}:8000/",
        ),
        Kind(
            "mikrotik",
            MikroTikBackend,
            HTTP,
            {"server": "the DHCP server's name, default the server that holds the lease"},
            url="https://{address}",
        ),
        Kind(
            "opnsense",
            OPNsenseBackend,
            HTTP,
            {"dhcp": "V(kea) or V(dnsmasq), the DHCP service in use"},
            url="https://{address}",
            login=("key", "secret"),
        ),
        Kind(
            "pfsense",
            PfSenseBackend,
            HTTP,
            {"interface": "the C(parent_id) of the static mappings", "auth": "V(basic) or V(api_key)"},
            url="https://{address}",
        ),
        Kind(
            "huawei_ont",
            HuaweiOntBackend,
            HTTP,
            {
                "profile": "an http_form profile mapping overriding the built-in Huawei one, for ISP firmware with other paths"
            },
            # these ONTs serve their admin page over plain HTTP
            url="http://{address}",
        ),
    )
}

# Each kind's options with their defaults.
OPTION_DEFAULTS: dict[str, dict[str, Any]] = {name: kind.defaults() for name, kind in KINDS.items()}


def option_docs() -> list[str]:
    """The module's documentation of `options`: one line per kind."""
    return ["Backend-specific settings (the inventory's C(router_options))."] + [
        k.doc() for k in KINDS.values()
    ]


def ssh_settings(address: str | None, user: str | None, ssh: Mapping[str, Any] | None) -> dict[str, Any]:
    """How an SSH router is reached: `ssh` (module option `ssh`) with what it leaves out filled in, the
    router's address for the host, router_user and then root for the user."""
    ssh = dict(ssh or {})
    return {
        "host": ssh.get("host") or address,
        "port": int(ssh.get("port") or SSH_PORT),
        "user": ssh.get("user") or user or SSH_USER,
        "password": ssh.get("password"),
        "key_file": ssh.get("key_file"),
        "host_key_checking": ssh.get("host_key_checking") is not False,
        "known_hosts": ssh.get("known_hosts"),
        "ssh_args": ssh.get("ssh_args"),
        "become": bool(ssh.get("become")),
        "local": bool(ssh.get("local")),
    }
