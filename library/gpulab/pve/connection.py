"""The connection options every PVE module shares, as data, and the client built from them.

`make docs` writes `argument_spec(env_fallback)` (Ansible's env_fallback is passed in, so this package stays
free of Ansible) into plugins/module_utils/pve.py, whose CONNECTION every PVE module spreads into its
ARGUMENT_SPEC; the `pve` doc fragment documents the options.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpulab.pve.client import PveClient, PveConnection

# option -> (argument spec without fallback, environment variables)
OPTIONS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "api_url": ({"type": "str", "required": True}, ("PVE_API_URL",)),
    "api_token_id": ({"type": "str", "no_log": False}, ("PVE_API_TOKEN_ID",)),
    "api_token_secret": ({"type": "str", "no_log": True}, ("PVE_API_TOKEN_SECRET",)),
    "api_user": ({"type": "str"}, ("PVE_API_USER",)),
    "api_password": ({"type": "str", "no_log": True}, ("PVE_API_PASSWORD",)),
    "api_validate_certs": ({"type": "bool", "default": True}, ("PVE_API_VALIDATE_CERTS",)),
    "api_ca_file": ({"type": "path"}, ("PVE_API_CA_FILE",)),
    "api_fingerprint": ({"type": "str", "no_log": False}, ("PVE_API_FINGERPRINT",)),
    "api_timeout": ({"type": "int", "default": 30}, ()),
    "api_retries": ({"type": "int", "default": 3}, ()),
}

# the options whose values are secrets (no_log): never in a fact or a result
SECRETS = frozenset(name for name, (opts, _env) in OPTIONS.items() if opts.get("no_log"))

MODULE_KWARGS: dict[str, Any] = {
    "required_together": [("api_token_id", "api_token_secret"), ("api_user", "api_password")],
    "required_one_of": [("api_token_id", "api_user")],
    "mutually_exclusive": [("api_token_id", "api_user"), ("api_ca_file", "api_fingerprint")],
}


def argument_spec(env_fallback: Callable[..., Any] | None = None) -> dict[str, dict[str, Any]]:
    spec = {}
    for name, (opts, env) in OPTIONS.items():
        entry = dict(opts)
        if env and env_fallback is not None:
            entry["fallback"] = (env_fallback, list(env))
        spec[name] = entry
    return spec


def connection_from_params(params: Mapping[str, Any]) -> PveConnection:
    return PveConnection(
        api_url=params["api_url"],
        token_id=params.get("api_token_id") or None,
        token_secret=params.get("api_token_secret") or None,
        user=params.get("api_user") or None,
        password=params.get("api_password") or None,
        validate_certs=bool(params.get("api_validate_certs", True)),
        ca_file=params.get("api_ca_file") or None,
        fingerprint=params.get("api_fingerprint") or None,
        timeout=float(params.get("api_timeout") or 30),
        retries=int(params.get("api_retries") if params.get("api_retries") is not None else 3),
    )


def connect(params: Mapping[str, Any]) -> PveClient:
    return PveClient(connection_from_params(params))


def params_from_inventory(hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """The modules' `api_*` options from the inventory's `pve_api_*` variables (unset ones left out)."""
    out = {}
    for name in OPTIONS:
        value = hostvars.get(f"pve_{name}")
        if value is not None and value != "":
            out[name] = value
    return out


def public_params(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The connection options of the `pve_api_*` settings without the secrets (SECRETS): what preflight keeps
    as the fact gpulab_pve_api, the stage plays' module_defaults (playbooks/vars/pve_api.yml adds the secret
    from the inventory when a task runs)."""
    return {k: v for k, v in params_from_inventory(settings).items() if k not in SECRETS}
