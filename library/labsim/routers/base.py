"""What every HTTP router simulator shares: a threaded server on 127.0.0.1 (or a lab address), a request
log, faults.

A simulator subclasses `RouterSim` and implements `handle(req) -> Reply`. State lives in memory
behind one lock (each request is handled atomically, like the single-threaded web servers of
these routers). Every request is logged (method, path, status) and optionally appended to a
JSON-lines file; `fail_next(n, status, body)` makes the next n requests fail.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclasses.dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes
    cookies: dict[str, str]

    def json(self):
        return json.loads(self.body or b"null")

    def form(self) -> dict[str, str]:
        return {
            k: v[-1] for k, v in urllib.parse.parse_qs(self.body.decode(), keep_blank_values=True).items()
        }

    def basic_auth(self) -> tuple[str, str] | None:
        value = self.headers.get("authorization", "")
        if not value.lower().startswith("basic "):
            return None
        try:
            user, _, pw = base64.b64decode(value[6:]).decode().partition(":")
        except ValueError:
            return None
        return user, pw


@dataclasses.dataclass
class Reply:
    status: int = 200
    body: object = None  # dict/list -> JSON, str -> text/html, bytes -> as is
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    content_type: str | None = None

    def encode(self) -> tuple[bytes, str]:
        if self.body is None:
            return b"", self.content_type or "text/plain"
        if isinstance(self.body, bytes):
            return self.body, self.content_type or "application/octet-stream"
        if isinstance(self.body, str):
            return self.body.encode(), self.content_type or "text/html; charset=utf-8"
        return json.dumps(self.body).encode(), self.content_type or "application/json"


class RouterSim:
    """Base of the router simulators; use as a context manager: `with MikroTikSim() as sim: sim.url`."""

    name = "router"

    def __init__(
        self,
        *,
        log_file: str | Path | None = None,
        tls_dir: str | Path | None = None,
        port: int = 0,
        bind: str = "127.0.0.1",
    ):
        self.tls_dir = Path(tls_dir) if tls_dir else None  # serve HTTPS with a self-signed certificate
        self.port = port
        self.bind = bind  # the address served on: 127.0.0.1, or a lab router's own (labsim.routers.lab_ont)
        self.lock = threading.RLock()
        self.log: list[dict] = []
        self.log_file = Path(log_file) if log_file else None
        self._faults: list[Reply] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- to implement ---------------------------------------------------------------------------
    def handle(self, req: Request) -> Reply:  # pragma: no cover - abstract
        raise NotImplementedError

    # --- fault injection ------------------------------------------------------------------------
    def fail_next(self, n: int = 1, status: int = 500, body: object = "Internal Server Error") -> None:
        with self.lock:
            self._faults.extend(Reply(status, body) for _ in range(n))

    # --- server ---------------------------------------------------------------------------------
    def _dispatch(self, req: Request) -> Reply:
        with self.lock:
            if self._faults:
                reply = self._faults.pop(0)
            else:
                try:
                    reply = self.handle(req)
                except (ValueError, KeyError, TypeError) as e:
                    reply = Reply(400, {"error": 400, "message": "Bad Request", "detail": str(e)})
            entry = {"t": time.time(), "method": req.method, "path": req.path, "status": reply.status}
            self.log.append(entry)
            if self.log_file:
                with self.log_file.open("a") as fh:
                    fh.write(json.dumps(entry) + "\n")
            return reply

    def start(self) -> RouterSim:
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes

            def log_message(self, *args):
                pass

            def _any(self):
                parsed = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                cookies = {}
                for part in (self.headers.get("Cookie") or "").split(";"):
                    k, _, v = part.strip().partition("=")
                    if k:
                        cookies[k] = v
                req = Request(
                    self.command,
                    urllib.parse.unquote(parsed.path),
                    {
                        k: v[-1]
                        for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()
                    },
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    cookies,
                )
                reply = sim._dispatch(req)
                data, ctype = reply.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

        self._server = ThreadingHTTPServer((self.bind, self.port), Handler)
        self._server.daemon_threads = True
        if self.tls_dir:
            import ssl

            from labsim.certs import ensure_certificate

            self.tls_dir.mkdir(parents=True, exist_ok=True)
            cert, key = ensure_certificate(self.tls_dir, self.name)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name=f"{self.name}-sim", daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self.tls_dir else 'http'}://{host}:{port}"

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def count(self, method: str | None = None, path_prefix: str = "") -> int:
        with self.lock:
            return sum(
                1
                for e in self.log
                if (method is None or e["method"] == method) and e["path"].startswith(path_prefix)
            )
