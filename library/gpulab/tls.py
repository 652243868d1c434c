"""Tell a rejected certificate from a connection that broke during or after the TLS handshake.

requests raises SSLError for both. Only the first is a setting to fix (a CA, a pinned fingerprint); the
second is a dropped connection like any other (a proxy restarting, a reset while the answer was read:
OpenSSL reports an EOF without close_notify as UNEXPECTED_EOF_WHILE_READING) and is retried as one.
"""

from __future__ import annotations

import ssl

# urllib3's own words when a pinned fingerprint (assert_fingerprint) does not match the peer's certificate.
_FINGERPRINT_MISMATCH = "Fingerprints did not match"


def certificate_rejected(exc: BaseException) -> bool:
    """True when the chain under `exc` holds a certificate check that failed, not a broken connection."""
    seen: set[int] = set()
    stack: list[object] = [exc]
    while stack:
        err = stack.pop()
        if not isinstance(err, BaseException) or id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, ssl.SSLCertVerificationError) or _FINGERPRINT_MISMATCH in str(err):
            return True
        stack.extend([err.__cause__, err.__context__, getattr(err, "reason", None), *err.args])
    return False
