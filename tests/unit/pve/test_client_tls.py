"""A connection that breaks inside TLS is retried like a reset; only a rejected certificate is a TLS error.

A real TLS server on a loopback port (the lab's own certificate): for the first connections it reads the
ClientHello and closes the socket (a listener restarting, or a reset racing the handshake, as CI once saw
from the lab's reset fault), which the client's OpenSSL reports as UNEXPECTED_EOF_WHILE_READING; requests
raises SSLError for it, as it does for a certificate that fails verification.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpulab.pve.client import PveClient, PveConnection, PveConnectionError
from gpulab.tls import certificate_rejected
from labsim import certs

TOKEN = {"token_id": "gpulab@pve!lab", "token_secret": "00000000-0000-0000-0000-000000000000"}


class DroppingServer:
    """Answers GET /version with 200 after dropping the first `drops` connections during the handshake."""

    def __init__(self, state: Path, drops: int):
        cert, key = certs.ensure_certificate(state)
        self.fingerprint = certs.fingerprint(cert)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.drops = drops
        self.requests = 0
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            with contextlib.suppress(OSError, ssl.SSLError):
                self.connections += 1
                if self.connections <= self.drops:
                    # a listener going away mid-handshake: read the ClientHello, close (FIN, no TLS alert)
                    raw.recv(65536)
                    raw.close()
                    continue
                conn = self.context.wrap_socket(raw, server_side=True)
                if not conn.recv(65536):
                    continue  # the client hung up after the handshake (it did not like the certificate)
                self.requests += 1
                body = json.dumps({"data": {"version": "9.1.1", "release": "9.1"}}).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                conn.close()

    def conn(self, **kw) -> PveConnection:
        base = {"api_url": f"https://127.0.0.1:{self.port}", "fingerprint": self.fingerprint, "backoff": 0.01}
        return PveConnection(**{**base, **TOKEN, **kw})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[[int], DroppingServer]]:
    made: list[DroppingServer] = []

    def start(drops: int) -> DroppingServer:
        srv = DroppingServer(tmp_path, drops)
        srv.thread.start()
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.sock.close()


def test_a_tls_eof_is_retried_and_the_call_succeeds(server):
    srv = server(drops=2)
    client = PveClient(srv.conn())
    assert client.get("version")["version"] == "9.1.1"
    assert (srv.connections, srv.requests, client.reads) == (3, 1, 3)


def test_a_tls_eof_that_persists_is_no_answer_not_a_certificate_problem(server):
    srv = server(drops=100)
    with pytest.raises(PveConnectionError) as err:
        PveClient(srv.conn(retries=2)).get("version")
    msg = str(err.value)
    assert "no answer after 3 attempts" in msg and "TLS verification failed" not in msg, msg
    assert "UNEXPECTED_EOF" in msg and srv.connections == 3


def test_a_certificate_that_does_not_match_is_still_a_tls_problem_and_not_retried(server):
    srv = server(drops=0)
    for conn in (srv.conn(fingerprint=":".join(["AB"] * 32)), srv.conn(fingerprint=None)):
        client = PveClient(conn)  # a wrong pin, then the self-signed certificate against the system store
        with pytest.raises(PveConnectionError) as err:
            client.get("version")
        assert "TLS verification failed" in str(err.value) and "api_fingerprint" in str(err.value)
        assert client.reads == 1, "a certificate that does not match was tried again"
    assert srv.requests == 0


def test_certificate_rejected_reads_the_cause_chain():
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    outer = RuntimeError("wrapped")
    outer.__cause__ = verify
    assert certificate_rejected(outer)
    assert not certificate_rejected(ssl.SSLEOFError(8, "[SSL: UNEXPECTED_EOF_WHILE_READING] unexpected eof"))
