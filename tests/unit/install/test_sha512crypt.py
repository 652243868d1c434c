"""The SHA-512 crypt hash answer.toml's root-password-hashed carries: the specification's own test vectors,
and openssl's `passwd -6` where the machine has it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpulab.install.sha512crypt import sha512_crypt

# from "Unix crypt using SHA-256 and SHA-512" (Ulrich Drepper), the SHA-512 test vectors
VECTORS = [
    (
        "Hello world!",
        "saltstring",
        None,
        "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1",
    ),
    (
        "Hello world!",
        "saltstringsaltstring",
        10000,
        "$6$rounds=10000$saltstringsaltst$OW1/O6BYHV6BcXZu8QVeXbDWra3Oeqh0sbHbbMCVNSnCM/UrjmM0Dp8vOuZeHBy/YTBmSK6H9qs/y3RnOaw5v.",
    ),
    (
        "This is just a test",
        "toolongsaltstring",
        5000,
        "$6$rounds=5000$toolongsaltstrin$lQ8jolhgVRVhY4b5pZKaysCLi0QBxGoNeKQzQ3glMhwllF7oGDZxUhx1yxdYcz/e1JSbq3y6JMxxl8audkUEm0",
    ),
]


@pytest.mark.parametrize(("password", "salt", "rounds", "expected"), VECTORS)
def test_the_specification_s_vectors(password: str, salt: str, rounds: int | None, expected: str) -> None:
    assert sha512_crypt(password, salt, rounds) == expected


def test_a_random_salt_each_time() -> None:
    a, b = sha512_crypt("correct horse"), sha512_crypt("correct horse")
    assert a != b and a.startswith("$6$") and len(a.split("$")[2]) == 16


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_openssl_makes_the_same_hash() -> None:
    made = subprocess.run(
        ["openssl", "passwd", "-6", "-salt", "gpulabSalt", "pass word"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert sha512_crypt("pass word", "gpulabSalt") == made
