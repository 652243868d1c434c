"""Preflight's check of `k3s_registries`, the text of k3s' /etc/rancher/k3s/registries.yaml.

k3s reads the file at start into rancher/wharfie's registries types (pkg/registries: Registry{mirrors, configs},
Mirror{endpoint, rewrite}, RegistryConfig{auth, tls}, AuthConfig{username, password, auth, identity_token},
TLSConfig{ca_file, cert_file, key_file, insecure_skip_verify}; docs.k3s.io/installation/private-registry). Go's
YAML reader drops a key it does not know and k3s starts as if it were not there: a misspelt `endpoints` or
`identitytoken` would leave every node pulling from Docker Hub anonymously. Refused here, before any change, with
the field, the value (never a credential), why and the fix.
"""

from __future__ import annotations

import re
from typing import Any

from gpulab.labdef.definition import LabDefinition
from gpulab.labdef.problems import Problems

NAME = "k3s_registries"
TOP = ("mirrors", "configs")
MIRROR = ("endpoint", "rewrite")
CONFIG = ("auth", "tls")
AUTH = ("username", "password", "auth", "identity_token")
TLS = ("ca_file", "cert_file", "key_file", "insecure_skip_verify")
# What a misspelling most likely meant (the Go field or TOML names k3s does not read from YAML).
NEAR = {
    "endpoints": "endpoint",
    "rewrites": "rewrite",
    "identitytoken": "identity_token",
    "identityToken": "identity_token",
    "auths": "configs.<registry>.auth",
    "mirror": "mirrors",
    "config": "configs",
    "insecure": "insecure_skip_verify",
    "ca": "ca_file",
}
# A registry as an image names it: host[:port], or "*" (every registry) in mirrors.
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:\d{1,5})?$")
# An endpoint k3s accepts: a URL with a scheme containerd speaks and a host, optionally a port and a path.
ENDPOINT_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?(/\S*)?$")
HIDDEN = "<hidden>"
DOCS = "docs.k3s.io/installation/private-registry; docs/getting-started.md 'Registries and pull limits'"


def _where(*parts: str | int) -> str:
    out = NAME
    for part in parts:
        out += (
            f"[{part}]"
            if isinstance(part, int)
            else (f'["{part}"]' if not part.isidentifier() else f".{part}")
        )
    return out


def _unknown(out: Problems, where: str, key: Any, known: tuple[str, ...]) -> None:
    near = NEAR.get(str(key))
    why = f"unknown key: k3s reads only {', '.join(known)} here and ignores the rest"
    fix = f"rename it to {near}" if near else f"use one of {', '.join(known)} ({DOCS})"
    out.add("all", f"{where}.{key}" if str(key).isidentifier() else f'{where}["{key}"]', key, why, fix)


def _mapping(out: Problems, where: str, value: Any, what: str, example: str) -> bool:
    if isinstance(value, dict):
        return True
    out.add(
        "all", where, value, f"expected a map of {what}, got {type(value).__name__}", f"write it as {example}"
    )
    return False


def _known_keys(
    out: Problems, where: str, value: Any, known: tuple[str, ...], what: str, example: str
) -> bool:
    """`value` must be a map (of `what`, as `example`) with only the keys k3s reads there (`known`); False
    when it is no map."""
    if not _mapping(out, where, value, what, example):
        return False
    for key in value:
        if key not in known:
            _unknown(out, where, key, known)
    return True


def _host(out: Problems, where: str, host: Any, star: bool) -> None:
    if isinstance(host, str) and (HOST_RE.match(host) or (star and host == "*")):
        return
    why = "not a registry as an image names it (a host name or address, an optional :port" + (
        ', or "*" for every registry)' if star else ")"
    )
    out.add("all", where, host, why, 'write the registry\'s host, e.g. docker.io or "mirror.lan:5000"')


def _mirror(out: Problems, host: str, mirror: Any) -> None:
    where = _where("mirrors", host)
    if not _known_keys(
        out, where, mirror, MIRROR, "endpoint and rewrite", '{endpoint: ["https://mirror.lan:5000"]}'
    ):
        return
    endpoints = mirror.get("endpoint", [])
    if isinstance(endpoints, str) or not isinstance(endpoints, list):
        why = "k3s reads endpoint as a list of URLs (tried in order, then the registry itself)"
        out.add("all", f"{where}.endpoint", endpoints, why, f'write it as a list: ["{endpoints}"]')
        endpoints = []
    for i, url in enumerate(endpoints):
        if not isinstance(url, str) or not ENDPOINT_RE.match(url):
            why = "not a URL: containerd needs http:// or https://, a host, and optionally :port and a path"
            fix = (
                'write the mirror\'s URL, e.g. "https://mirror.lan:5000" (http:// for a registry without TLS)'
            )
            out.add("all", _where("mirrors", host, "endpoint") + f"[{i}]", url, why, fix)
    rewrites = mirror.get("rewrite", {})
    if not _mapping(
        out, f"{where}.rewrite", rewrites, "regex -> replacement", '{"^rancher/(.*)": "mirror/$1"}'
    ):
        return
    for pattern, replacement in rewrites.items():
        field = f'{where}.rewrite["{pattern}"]'
        try:
            re.compile(str(pattern))
        except re.error as err:
            why = f"not a regular expression ({err})"
            out.add("all", field, pattern, why, "write a regex over the repository, e.g. ^rancher/(.*)")
            continue
        if not isinstance(replacement, str):
            why = f"the replacement must be a string (the new repository, $1 for a group), got {type(replacement).__name__}"
            out.add(
                "all", field, replacement, why, 'write it as a string, e.g. "mirrorproject/rancher-images/$1"'
            )


def _config(out: Problems, host: str, config: Any) -> None:
    where = _where("configs", host)
    if not _known_keys(out, where, config, CONFIG, "auth and tls", "{auth: {username: ..., password: ...}}"):
        return
    auth = config.get("auth")
    if auth is not None and not isinstance(auth, dict):
        why = f"expected a map of credentials, got {type(auth).__name__}"
        out.add("all", f"{where}.auth", HIDDEN, why, f"write it as {AUTH_EXAMPLE}")
    elif auth is not None:
        for key, value in auth.items():
            if key not in AUTH:
                _unknown(out, f"{where}.auth", key, AUTH)
            elif not isinstance(value, str):
                why = f"expected a string, got {type(value).__name__}"
                out.add("all", f"{where}.auth.{key}", HIDDEN, why, "quote it (from the vault)")
        if "username" in auth and "password" not in auth:
            why = "a username without a password"
            out.add(
                "all", f"{where}.auth.password", None, why, "add the password (vault) or remove the username"
            )
    tls = config.get("tls")
    if tls is not None and _mapping(
        out, f"{where}.tls", tls, "TLS settings", "{ca_file: /etc/ssl/mirror-ca.pem}"
    ):
        for key, value in tls.items():
            if key not in TLS:
                _unknown(out, f"{where}.tls", key, TLS)
            elif key == "insecure_skip_verify" and not isinstance(value, bool):
                out.add("all", f"{where}.tls.{key}", value, "expected true or false", "write true or false")
            elif key != "insecure_skip_verify" and (not isinstance(value, str) or not value.startswith("/")):
                why = "a path on the nodes (k3s reads the file there)"
                out.add(
                    "all", f"{where}.tls.{key}", value, why, "write the file's absolute path on every node"
                )
        if bool(tls.get("cert_file")) != bool(tls.get("key_file")):
            why = "cert_file and key_file go together (a client certificate and its key)"
            out.add("all", f"{where}.tls", sorted(k for k in tls if k in ("cert_file", "key_file")), why,
                    "give both, or neither")  # fmt: skip


AUTH_EXAMPLE = '{username: "{{ vault_registry_user }}", password: "{{ vault_registry_password }}"}'


def check_registries(d: LabDefinition, out: Problems) -> None:
    value = d.globals.get(NAME)
    if not value:
        return
    if not _known_keys(
        out, NAME, value, TOP, "mirrors and configs", "{mirrors: {docker.io: {endpoint: [...]}}}"
    ):
        return
    mirrors = value.get("mirrors") or {}
    if _mapping(
        out, _where("mirrors"), mirrors, "registry -> mirror", '{docker.io: {endpoint: ["https://..."]}}'
    ):
        for host, mirror in mirrors.items():
            _host(out, _where("mirrors", str(host)), host, star=True)
            _mirror(out, str(host), mirror)
    configs = value.get("configs") or {}
    if _mapping(out, _where("configs"), configs, "registry -> auth/tls", "{mirror.lan:5000: {auth: {...}}}"):
        for host, config in configs.items():
            _host(out, _where("configs", str(host)), host, star=True)
            _config(out, str(host), config)
