"""The lab's self-signed HTTPS certificate, kept in the state dir like PVE's pve-ssl.pem."""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

CERT_FILE = "pve-ssl.pem"
KEY_FILE = "pve-ssl.key"


def ensure_certificate(state_dir: Path, hostname: str = "pve") -> tuple[Path, Path]:
    """Create the certificate and key once; return their paths."""
    cert_path, key_path = Path(state_dir) / CERT_FILE, Path(state_dir) / KEY_FILE
    if cert_path.exists() and key_path.exists():
        return cert_path, key_path
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, f"{hostname}.lab.gpulab"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "gpulab simulated PVE"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName(hostname),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def fingerprint(cert_path: Path) -> str:
    """SHA-256 fingerprint as PVE shows it: upper-case hex pairs joined by ':'."""
    import hashlib
    import ssl

    der = ssl.PEM_cert_to_DER_cert(Path(cert_path).read_text())
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def certificate_info(cert_path: Path) -> dict:
    """What GET /nodes/{node}/certificates/info (``pvenode cert info``) tells of the node's certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    pem = Path(cert_path).read_text()
    cert = x509.load_pem_x509_certificate(pem.encode())

    def oneline(name: x509.Name) -> str:  # OpenSSL's one-line form, as PVE prints subject and issuer
        return "".join(f"/{attr.rfc4514_attribute_name}={attr.value}" for attr in name)

    key = cert.public_key()
    kind = (
        "id-ecPublicKey"
        if isinstance(key, ec.EllipticCurvePublicKey)
        else ("rsaEncryption" if isinstance(key, rsa.RSAPublicKey) else type(key).__name__)
    )
    try:
        san_ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        san = [str(v) for v in san_ext.get_values_for_type(x509.DNSName)]
        san += [str(v) for v in san_ext.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        san = []
    return {
        "filename": Path(cert_path).name,
        "fingerprint": fingerprint(cert_path),
        "issuer": oneline(cert.issuer),
        "subject": oneline(cert.subject),
        "notbefore": int(cert.not_valid_before_utc.timestamp()),
        "notafter": int(cert.not_valid_after_utc.timestamp()),
        "public-key-type": kind,
        "public-key-bits": key.key_size,
        "san": san,
        "pem": pem,
    }
