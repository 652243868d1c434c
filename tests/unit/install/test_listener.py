"""`gpulab install-media --webhook URL` and `--listen OUTDIR`: the answer pins the listener's certificate and
carries its token; a POST shaped as the installer's post-hook sends it (pve-installer 9.2.7
proxmox-post-hook, proxmox-installer-types post_hook.rs) writes the node's host keys into known_hosts for the
node's address, replacing old entries (hashed ones too); a POST without the token writes nothing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import ssl
import threading
import tomllib
from pathlib import Path

import pytest
import requests

from gpulab.install import listener

from . import install_media

ROOT = Path(__file__).resolve().parents[3]
KEYS = {
    "ecdsa": "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEx root@pve",
    "ed25519": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG1lY2hhbmljYWxseS1tYWRlLWtleQ root@pve",
    "rsa": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 root@pve",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def written(tmp_path: Path) -> tuple[Path, int]:
    port = free_port()
    out = tmp_path / "out"
    proc = install_media(
        ROOT / "inventory" / "homelab",
        out,
        "--webhook",
        f"https://127.0.0.1:{port}/",
        GPULAB_PVE_ROOT_PASSWORD="correct horse battery",
        HOME=str(tmp_path / "home"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, port


def post_hook_body(token: str) -> dict:
    """The fields of the installer's POST this listener reads, as post_hook.rs names them (kebab-case)."""
    return {
        "$schema": {"version": "1.0"},
        "fqdn": "pve.home.arpa",
        "network-interfaces": [
            {"name": "nic0", "mac": "aa:bb:cc:dd:ee:ff", "address": "192.168.100.5/24", "is-management": True}
        ],
        "ssh-public-host-keys": KEYS,
        "token": token,
    }


def listen(out: Path, known: Path) -> tuple[threading.Thread, list]:
    got: list = []
    thread = threading.Thread(
        target=lambda: got.append(listener.serve(out, "127.0.0.1", known, timeout=20)), daemon=True
    )
    thread.start()
    return thread, got


def post(port: int, out: Path, body: dict) -> requests.Response:
    for _ in range(50):
        try:
            return requests.post(
                f"https://127.0.0.1:{port}/", json=body, verify=str(out / "webhook" / "cert.pem"), timeout=10
            )
        except requests.ConnectionError:
            threading.Event().wait(0.1)
    raise AssertionError("the listener did not answer")


def test_the_answer_pins_the_listener_s_certificate_and_carries_its_token(written) -> None:
    out, port = written
    hook = tomllib.loads((out / "answer.toml").read_text())["post-installation-webhook"]
    material = listener.load_material(out)
    assert hook["url"] == f"https://127.0.0.1:{port}/" and hook["auth-token"] == material.token
    thread, _ = listen(out, out / "known_hosts")
    post(port, out, {"token": "warm-up"})  # the listener is up
    served = ssl.get_server_certificate(("127.0.0.1", port))
    der = ssl.PEM_cert_to_DER_cert(served)
    assert hook["cert-fingerprint"].replace(":", "").lower() == hashlib.sha256(der).hexdigest()
    post(port, out, post_hook_body(material.token))
    thread.join(10)


def test_the_node_s_host_keys_replace_its_old_entries(written, tmp_path: Path) -> None:
    out, port = written
    known = tmp_path / "known_hosts"
    salt = os.urandom(20)
    hashed = base64.b64encode(hmac.new(salt, b"192.168.100.5", hashlib.sha1).digest()).decode()
    known.write_text(
        "192.168.100.5 ssh-ed25519 AAAAold-plain\n"
        f"|1|{base64.b64encode(salt).decode()}|{hashed} ssh-ed25519 AAAAold-hashed\n"
        "192.168.100.53 ssh-ed25519 AAAAvm-1\n"
    )
    thread, got = listen(out, known)
    bad = post(port, out, post_hook_body("not-the-token"))
    assert bad.status_code == 403 and "AAAAold-plain" in known.read_text()
    good = post(port, out, post_hook_body(listener.load_material(out).token))
    assert good.status_code == 200, good.text
    thread.join(10)
    assert got and "3 host key(s) of pve.home.arpa written" in got[0]
    assert known.read_text().splitlines() == [
        "192.168.100.53 ssh-ed25519 AAAAvm-1",
        "192.168.100.5 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG1lY2hhbmljYWxseS1tYWRlLWtleQ",
        "192.168.100.5 ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEx",
        "192.168.100.5 ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7",
    ]
    assert known.stat().st_mode & 0o777 == 0o600


def test_a_post_without_keys_or_json_is_refused(tmp_path: Path) -> None:
    material = listener.Material(tmp_path, tmp_path, "tok", "AA", "10.0.0.5", "https://x/")
    assert listener.accept(material, b"{", tmp_path / "kh")[0] == 400
    assert listener.accept(material, json.dumps({"token": "tok"}).encode(), tmp_path / "kh")[0] == 400
    assert not (tmp_path / "kh").exists()


def fetch_answer(port: int, out: Path, token: str) -> requests.Response:
    """The installer's answer fetch (proxmox-fetch-answer http.rs): a POST of its system information with
    the ISO's token as a bearer token, over the pinned certificate."""
    for _ in range(50):
        try:
            return requests.post(
                f"https://127.0.0.1:{port}/answer",
                json={"$schema": {"version": "1.0"}, "product": {"product": "pve"}},
                headers={
                    "Authorization": f"Bearer {token}",
                    "Accept": "application/json, application/toml;q=0.5",
                },
                verify=str(out / "webhook" / "cert.pem"),
                timeout=10,
            )
        except requests.ConnectionError:
            threading.Event().wait(0.1)
    raise AssertionError("the listener did not answer")


def test_the_listener_serves_the_answer_to_the_iso_s_token_until_the_keys_come(
    written, tmp_path: Path
) -> None:
    out, port = written
    material = listener.load_material(out)
    assert listener.answer_url(material) == f"https://127.0.0.1:{port}/answer"
    thread, got = listen(out, tmp_path / "known_hosts")
    assert fetch_answer(port, out, "not-the-token").status_code == 403
    served = fetch_answer(port, out, material.token)
    assert served.status_code == 200 and served.headers["Content-Type"].startswith("application/toml")
    assert served.text == (out / "answer.toml").read_text()
    assert thread.is_alive()  # the answer is not the end: the host keys are
    post(port, out, post_hook_body(material.token))
    thread.join(10)
    assert got and "host key(s)" in got[0]
    # README-install.md's command for that ISO: this URL, this certificate, the token from its file
    readme = (out / "README-install.md").read_text()
    assert f"--fetch-from http --url https://127.0.0.1:{port}/answer" in readme
    assert f"--cert-fingerprint {material.fingerprint}" in readme
    assert '--answer-auth-token "$(cat webhook/token)"' in readme and material.token not in readme
