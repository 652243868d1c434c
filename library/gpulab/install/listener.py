"""The controller's end of the installer's post-installation webhook: the new node's host keys, trusted.

When the answer file has a ``[post-installation-webhook]`` (``gpulab install-media --webhook URL``), the
installer POSTs what it installed once it is done, among it the node's SSH public host keys
(``ssh-public-host-keys``: ecdsa, ed25519, rsa) and the opaque ``auth-token`` of the answer echoed back as
``token`` (proxmox-installer-types ``post_hook.rs`` PostHookInfo; pve-installer 9.2.7
``proxmox-post-hook/src/main.rs``). The answer pins this listener's certificate (``cert-fingerprint``, the
SHA-256 of its DER form, which the installer compares), so the installer talks to nobody else; the token,
baked into the ISO the user made, tells the listener the POST is that install's. Only then are the keys
written into known_hosts for the node's address, replacing what was there for it: the controller learns
the node without trusting the network.

:func:`make_material` writes the certificate, its key and the token beside the answer; :func:`serve` waits
for the POST (``gpulab install-media --listen OUTDIR``). Until then it also serves the answer file to an ISO
prepared with ``--fetch-from http`` (:data:`ANSWER_PATH` of the same address and certificate): the
installer's fetch POSTs its system information there with ``Authorization: Bearer TOKEN`` (the ISO's
``--answer-auth-token``) and takes the body as its answer (pve-installer 9.2.7
``proxmox-fetch-answer/src/fetch_plugins/http.rs``, ``proxmox-installer-common/src/http.rs`` post: 200 or
201, TOML unless the Content-Type is JSON).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import http.server
import ipaddress
import json
import secrets
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MATERIAL = "webhook"  # the folder beside answer.toml
ANSWER_PATH = "/answer"  # where the listener serves answer.toml to an ISO prepared with --fetch-from http
KEY_TYPES = ("ed25519", "ecdsa", "rsa")


@dataclass(frozen=True)
class Material:
    cert: Path
    key: Path
    token: str
    fingerprint: str
    address: str  # the node's address, whose known_hosts entries the POST replaces
    url: str  # the webhook URL of the answer


def fingerprint_of(cert_pem: bytes) -> str:
    """SHA-256 of the certificate's DER form, as ``AA:BB:...`` (the answer's cert-fingerprint)."""
    der = ssl.PEM_cert_to_DER_cert(cert_pem.decode())
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def make_material(outdir: Path, url: str, node_address: str) -> Material:
    """A self-signed certificate for ``host`` (the controller's address or name in the webhook URL), its key
    and a fresh token, in ``outdir/webhook`` (mode 0700), kept when they are already there."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    host = urlsplit(url).hostname or ""
    folder = outdir / MATERIAL
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    cert_path, key_path, token_path = folder / "cert.pem", folder / "key.pem", folder / "token"
    if not (cert_path.exists() and key_path.exists() and token_path.exists()):
        key = ec.generate_private_key(ec.SECP256R1())
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpulab install-media {host}")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .sign(key, hashes.SHA256())
        )
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        key_path.chmod(0o600)
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        token_path.write_text(secrets.token_urlsafe(32) + "\n")
        token_path.chmod(0o600)
    (folder / "node").write_text(node_address + "\n")
    (folder / "url").write_text(url + "\n")
    return load_material(outdir)


def load_material(outdir: Path) -> Material:
    folder = outdir / MATERIAL
    cert = folder / "cert.pem"
    return Material(
        cert=cert,
        key=folder / "key.pem",
        token=(folder / "token").read_text().strip(),
        fingerprint=fingerprint_of(cert.read_bytes()),
        address=(folder / "node").read_text().strip(),
        url=(folder / "url").read_text().strip(),
    )


def host_keys(payload: dict[str, Any]) -> list[str]:
    """The ``TYPE BASE64`` public host keys of a post-hook POST, in KEY_TYPES order."""
    found = payload.get("ssh-public-host-keys") or {}
    keys = []
    for kind in KEY_TYPES:
        parts = str(found.get(kind) or "").split()
        if len(parts) >= 2 and parts[0].startswith(("ssh-", "ecdsa-")):
            keys.append(f"{parts[0]} {parts[1]}")
    return keys


def _names(line: str, address: str) -> bool:
    """Whether a known_hosts line is for ``address``, in plain (``a,b``) or hashed (``|1|salt|hash``) form."""
    field = line.split(" ", 1)[0]
    if field.startswith("|1|"):
        try:
            _, _, salt, digest = field.split("|")
            mac = hmac.new(base64.b64decode(salt), address.encode(), hashlib.sha1).digest()
            return hmac.compare_digest(base64.b64encode(mac).decode(), digest)
        except ValueError:
            return False
    return address in field.split(",")


def replace_known_hosts(path: Path, address: str, keys: list[str]) -> None:
    """known_hosts with every entry for ``address`` replaced by ``keys`` (as ssh-keygen -R, then added)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = path.read_text().splitlines() if path.exists() else []
    kept = [ln for ln in lines if not _names(ln, address)]
    kept += [f"{address} {key}" for key in keys]
    path.write_text("\n".join(kept) + "\n")
    path.chmod(0o600)


def accept(material: Material, body: bytes, known_hosts: Path) -> tuple[int, str]:
    """The listener's answer (status, message) to one POST; the keys are written only for the right token."""
    try:
        payload = json.loads(body)
    except ValueError:
        return 400, "not JSON"
    if not isinstance(payload, dict) or not hmac.compare_digest(
        str(payload.get("token", "")), material.token
    ):
        return 403, "wrong or missing token: this POST is not from the install gpulab prepared"
    keys = host_keys(payload)
    if not keys:
        return 400, "no SSH public host keys in the POST"
    replace_known_hosts(known_hosts, material.address, keys)
    return 200, f"{material.address}: {len(keys)} host key(s) of {payload.get('fqdn', 'the node')} written"


def answer_url(material: Material) -> str:
    """The URL the listener serves answer.toml at: the webhook's scheme, host and port, path /answer."""
    parts = urlsplit(material.url)
    return f"{parts.scheme}://{parts.netloc}{ANSWER_PATH}"


def answer_for(material: Material, outdir: Path, authorization: str | None) -> tuple[int, str]:
    """The listener's answer (status, body) to the installer's answer fetch: answer.toml for the ISO's token."""
    if not hmac.compare_digest(authorization or "", f"Bearer {material.token}"):
        return 403, "wrong or missing token: prepare the ISO with --answer-auth-token (README-install.md)"
    return 200, (outdir / "answer.toml").read_text()


def serve(
    outdir: Path, bind: str, known_hosts: Path, port: int | None = None, timeout: float | None = None
) -> str | None:
    """Serve HTTPS on bind:port (default: the webhook URL's port) with the material's certificate until one
    POST with the right token arrives (its message returned) or ``timeout`` seconds pass (None returned);
    meanwhile answer.toml to the installer's fetch at :data:`ANSWER_PATH`."""
    material = load_material(outdir)
    port = port if port is not None else (urlsplit(material.url).port or 443)
    done: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(min(length, 10 << 20))
            kind = "text/plain; charset=utf-8"
            fetch = urlsplit(self.path).path == ANSWER_PATH
            if fetch:
                status, text = answer_for(material, outdir, self.headers.get("Authorization"))
                message = "answer.toml sent" if status == 200 else text
                kind = "application/toml; charset=utf-8" if status == 200 else kind
            else:
                status, message = accept(material, body, known_hosts)
                text = message
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(text.encode() + (b"" if text.endswith("\n") else b"\n"))
            print(f"gpulab install-media --listen: {self.client_address[0]}: {status} {message}", flush=True)
            if status == 200 and not fetch:
                done.append(message)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.HTTPServer((bind, port), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(material.cert, material.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.timeout = 1.0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while not done and (deadline is None or time.monotonic() < deadline):
            server.handle_request()
    finally:
        server.server_close()
    return done[0] if done else None
