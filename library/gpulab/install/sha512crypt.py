"""SHA-512 crypt (``$6$``), the password hash that ``mkpasswd -m sha-512`` and glibc's crypt(3) make.

Python 3.13 dropped the ``crypt`` module; this follows Ulrich Drepper's published specification
"Unix crypt using SHA-256 and SHA-512" (the algorithm glibc implements), with its default of 5000 rounds.
tests/unit/install/test_sha512crypt.py checks it against the specification's own test vectors and, where the
machine has it, against ``openssl passwd -6``.
"""

from __future__ import annotations

import hashlib
import secrets

ALPHABET = "./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ROUNDS_DEFAULT = 5000
ROUNDS_MIN, ROUNDS_MAX = 1000, 999_999_999
# the order in which the 64 digest bytes are encoded, three at a time (the specification's table)
_ORDER = [
    (0, 21, 42), (22, 43, 1), (44, 2, 23), (3, 24, 45), (25, 46, 4), (47, 5, 26), (6, 27, 48),
    (28, 49, 7), (50, 8, 29), (9, 30, 51), (31, 52, 10), (53, 11, 32), (12, 33, 54), (34, 55, 13),
    (56, 14, 35), (15, 36, 57), (37, 58, 16), (59, 17, 38), (18, 39, 60), (40, 61, 19), (62, 20, 41),
]  # fmt: skip


def _b64(b2: int, b1: int, b0: int, n: int) -> str:
    w = (b2 << 16) | (b1 << 8) | b0
    out = []
    for _ in range(n):
        out.append(ALPHABET[w & 0x3F])
        w >>= 6
    return "".join(out)


def _repeat(digest: bytes, length: int) -> bytes:
    return (digest * (length // len(digest) + 1))[:length]


def sha512_crypt(password: str, salt: str | None = None, rounds: int | None = None) -> str:
    """The ``$6$[rounds=N$]SALT$HASH`` string for ``password`` (a random 16-character salt by default)."""
    key = password.encode()
    if salt is None:
        salt = "".join(secrets.choice(ALPHABET) for _ in range(16))
    salt_b = salt.encode()[:16]
    explicit = rounds is not None
    n = ROUNDS_DEFAULT if rounds is None else min(max(rounds, ROUNDS_MIN), ROUNDS_MAX)

    b = hashlib.sha512(key + salt_b + key).digest()
    a = hashlib.sha512(key + salt_b)
    a.update(_repeat(b, len(key)))
    i = len(key)
    while i:
        a.update(b if i & 1 else key)
        i >>= 1
    a_digest = a.digest()
    p = _repeat(hashlib.sha512(key * len(key)).digest(), len(key))
    s = _repeat(hashlib.sha512(salt_b * (16 + a_digest[0])).digest(), len(salt_b))
    c = a_digest
    for r in range(n):
        h = hashlib.sha512(p if r & 1 else c)
        if r % 3:
            h.update(s)
        if r % 7:
            h.update(p)
        h.update(c if r & 1 else p)
        c = h.digest()
    encoded = "".join(_b64(c[x], c[y], c[z], 4) for x, y, z in _ORDER) + _b64(0, 0, c[63], 2)
    prefix = f"$6$rounds={n}$" if explicit else "$6$"
    return f"{prefix}{salt_b.decode()}${encoded}"
