"""The lab's internet: the files the fixture's ``downloads`` table lists, as their servers publish them.

One table for both sides of a download: the PVE API simulator's download-url fetches from it (the node's
internet), and :class:`InternetProxy`, an HTTP proxy on 127.0.0.1, answers the controller's requests for the
same URLs (``GET https://host/path`` in absolute form, as a proxy such as Squid takes them; the lab description
names it ``internet_proxy`` and inventory/demo hands it to gpulab as ``gpulab_download_check_proxy``).

Each folder that holds a download publishes ``SHA256SUMS`` and ``SHA512SUMS`` listing its files (``HEX *name``,
as Ubuntu's cloud-images and releases folders do). A URL of a known host that the table lacks answers 404; an
unknown host, 502 (the proxy could not resolve it).

The world moves: ``STATE/internet.json`` overrides the table while the lab runs (:func:`publish`): a URL with
another entry (a ``current/`` folder rebuilt: new size and digests, and its SHA256SUMS with it), or null (the
file is gone: 404). Both sides read it at each request.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from labsim.fixture import download_digest

INTERNET_FILE = "internet.json"
SUMS = {"SHA256SUMS": "sha256", "SHA512SUMS": "sha512"}


def publish(state_dir: str | Path, url: str, entry: dict[str, Any] | None) -> dict[str, Any]:
    """Put ``entry`` (url, size, format, digests) at ``url`` from now on, or take the file away (None: 404)."""
    path = Path(state_dir) / INTERNET_FILE
    current = json.loads(path.read_text()) if path.exists() else {}
    current[url] = None if entry is None else {**entry, "url": url}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    os.replace(tmp, path)
    return current


class Internet:
    """The fixture's downloads with the state's overrides."""

    def __init__(self, state_dir: str | Path, downloads: list[dict[str, Any]]):
        self.path = Path(state_dir) / INTERNET_FILE
        self.table = {e["url"]: e for e in downloads}

    def _now(self) -> dict[str, dict[str, Any] | None]:
        try:
            overrides = json.loads(self.path.read_text())
        except (OSError, ValueError):
            overrides = {}
        return {**self.table, **overrides}

    def lookup(self, url: str) -> dict[str, Any] | None:
        """The file at ``url`` now, or None."""
        return self._now().get(url)

    def known_host(self, url: str) -> bool:
        host = urlsplit(url).netloc
        return any(urlsplit(u).netloc == host for u in self._now())

    def sums(self, url: str) -> str | None:
        """``url``'s text when it names a folder's SHA256SUMS or SHA512SUMS that lists a file, else None."""
        folder, _, name = url.rpartition("/")
        algorithm = SUMS.get(name)
        if algorithm is None:
            return None
        lines = [
            f"{download_digest(e, algorithm)} *{u.rsplit('/', 1)[-1]}"
            for u, e in sorted(self._now().items())
            if e is not None and u.rpartition("/")[0] == folder
        ]
        return "\n".join(lines) + "\n" if lines else None


class InternetProxy(ThreadingHTTPServer):
    """The controller's way to the lab's internet: an HTTP proxy taking absolute-form requests."""

    daemon_threads = True

    def __init__(self, internet: Internet):
        self.internet = internet
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> InternetProxy:
        self.thread.start()
        return self

    def stop(self) -> None:
        if self.thread.is_alive():
            self.shutdown()
        self.server_close()


class _ProxyHandler(BaseHTTPRequestHandler):
    server: InternetProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        url = self.path
        internet = self.server.internet
        if not url.startswith(("http://", "https://")):
            return self._send(400, "text/plain", b"a proxy request names the whole URL\n", body)
        if not internet.known_host(url):
            why = f"{urlsplit(url).hostname}: Name or service not known"
            return self._send(502, "text/plain", f"{why}\n".encode(), body, reason=why)
        sums = internet.sums(url)
        if sums is not None:
            return self._send(200, "text/plain", sums.encode(), body)
        entry = internet.lookup(url)
        if entry is None:
            page = b"<html><body><h1>Not Found</h1></body></html>\n"
            return self._send(404, "text/html", page, body)
        kind = "application/x-iso9660-image" if entry.get("format") == "iso" else "application/octet-stream"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(int(entry["size"])) if not body else "0")
        self.end_headers()

    def _send(self, status: int, kind: str, data: bytes, body: bool, reason: str | None = None) -> None:
        self.send_response(status, reason)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
