"""Preflight's online check of the files stage vms will have a node download, from the controller.

PVE's download-url fetches the whole file (600 MB for the cloud image, 3 GB for the ISO) and only then compares
it with the pinned checksum; a URL that has gone answers 404 only once the stage has started. Both happen after
stage host, which may have rebooted the node. Distribution folders move under their URLs: Canonical rebuilds
``cloud-images.ubuntu.com/noble/current/`` every few days, and releases.ubuntu.com keeps only the newest point
release of a series (older ones move to old-releases.ubuntu.com). So, before any change:

- the URL must answer (HEAD, redirects followed) with the file, not a 404 or a web page;
- where the URL's folder publishes ``SHA256SUMS`` (``SHA512SUMS`` for a sha512 pin), as Ubuntu's folders do,
  the pinned checksum must be the one listed there for the file.

A problem names the variable, the URL, what was pinned and what the folder lists now, so the fix is a copy.
:func:`check_images` is pure apart from ``fetch``; :func:`http_fetch` is the controller's (urllib, or an HTTP
proxy that fetches ``https://`` URLs itself, ``gpulab_download_check_proxy``).
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

from gpulab.labdef.problems import Problem

TIMEOUT_S = 15
MAX_REDIRECTS = 5
# The checksum file a folder publishes for each digest (Ubuntu's cloud-images and releases folders do).
SUMS_FILES = {"sha256": "SHA256SUMS", "sha512": "SHA512SUMS"}
# releases.ubuntu.com/<x.y.z>/ holds only the newest point release; older ones move to old-releases.
_POINT_RELEASE_RE = re.compile(r"^https?://releases\.ubuntu\.com/(\d+\.\d+\.\d+)/(.+)$")
_SUMS_LINE_RE = re.compile(r"^([0-9A-Fa-f]{32,128})\s+\*?(.+?)\s*$")
SKIP = "set gpulab_download_check: false to skip this check (PVE still checks the checksum after downloading)"


class Unreachable(Exception):
    """The controller could not ask the server at all (no route, no DNS, a refused or timed-out connection)."""


@dataclass(frozen=True)
class Answer:
    """What a server answered: the status, the URL it came from after redirects, its content type, its body."""

    status: int
    url: str
    content_type: str = ""
    body: str = ""


Fetch = Callable[[str, str], Answer]


def sums_url(url: str, algorithm: str = "sha256") -> str:
    """The checksum file of the folder that holds ``url``."""
    return urljoin(url, SUMS_FILES.get(algorithm, "SHA256SUMS"))


def parse_sums(text: str) -> dict[str, str]:
    """A SHA256SUMS file (``HEX *name`` or ``HEX  name`` per line): file name -> lower-case digest."""
    out = {}
    for line in text.splitlines():
        m = _SUMS_LINE_RE.match(line.strip())
        if m:
            out[m.group(2).lstrip("./")] = m.group(1).lower()
    return out


def _gone_fix(var: str, url: str) -> str:
    m = _POINT_RELEASE_RE.match(url)
    if m:
        point, rest = m.groups()
        return (
            f"releases.ubuntu.com keeps only the newest point release of a series: set {var}.url: "
            f"https://old-releases.ubuntu.com/releases/{point}/{rest} (the same file and checksum), or the "
            "newest point release with the checksum its SHA256SUMS lists"
        )
    if "/current/" in url:
        return (
            f"the folder moved on; pin a dated folder instead of current/ (cloud images: "
            f"https://cloud-images.ubuntu.com/releases/noble/release-YYYYMMDD/) in {var}.url with its checksum"
        )
    return f"correct {var}.url (the folder's listing names the files it holds now)"


def check_image(var: str, image: Mapping[str, Any], fetch: Fetch) -> Problem | None:
    """One image's URL and pinned checksum against what its server answers now (None: fine)."""
    url = str(image["url"])
    algorithm = str(image.get("checksum_algorithm") or "sha256").lower()
    pinned = str(image.get("checksum") or "").lower()
    try:
        head = fetch("HEAD", url)
    except Unreachable as exc:
        return Problem(
            "all",
            "gpulab_download_check",
            True,
            f"the controller could not reach {urlsplit(url).netloc} to check {var}.url {url} ({exc})",
            "give the controller internet access (or a proxy: https_proxy, or gpulab_download_check_proxy), "
            f"or {SKIP}",
        )
    if head.status >= 400:
        return Problem(
            "all",
            f"{var}.url",
            url,
            f"the URL answers HTTP {head.status} (checked from the controller): the node's download would fail",
            _gone_fix(var, url),
        )
    if head.content_type.split(";")[0].strip().lower() in ("text/html", "application/xhtml+xml"):
        where = f" after redirects to {head.url}" if head.url != url else ""
        return Problem(
            "all",
            f"{var}.url",
            url,
            f"the URL answers with a web page ({head.content_type}){where}, not the file",
            _gone_fix(var, url),
        )
    return _check_sums(var, url, head.url, algorithm, pinned, fetch)


def _check_sums(var: str, url: str, final: str, algorithm: str, pinned: str, fetch: Fetch) -> Problem | None:
    sums = sums_url(final, algorithm)
    try:
        answer = fetch("GET", sums)
    except Unreachable:
        return None  # the file answered a moment ago: a folder without a checksum file is left to PVE
    if answer.status >= 400 or not answer.body:
        return None  # this folder publishes no checksum file: PVE checks the pin after downloading
    listed = parse_sums(answer.body)
    name = final.rsplit("/", 1)[-1]
    now = listed.get(name)
    if now is None:
        return Problem(
            "all",
            f"{var}.url",
            url,
            f"the folder's {sums.rsplit('/', 1)[-1]} ({sums}) does not list {name}, so the pinned checksum cannot "
            "be the one published",
            _gone_fix(var, url),
        )
    if now != pinned:
        return Problem(
            "all",
            f"{var}.checksum",
            pinned,
            f"{sums} lists {now} for {name} now, not the pinned one: the file at {url} was rebuilt, and PVE "
            "would download it and then fail with 'checksum mismatch'",
            f"set {var}.checksum: {now} (and give {var}.filename a new name, so that a node holding the old "
            "file gets the new one), or pin a dated folder that does not change",
        )
    return None


def check_images(images: Iterable[tuple[str, Mapping[str, Any]]], fetch: Fetch) -> list[Problem]:
    """Each (variable, image) once, in the order given."""
    out: list[Problem] = []
    seen: set[str] = set()
    for var, image in images:
        if var in seen:
            continue
        seen.add(var)
        problem = check_image(var, image, fetch)
        if problem is not None:
            out.append(problem)
    return out


# ------------------------------------------------------------------------------------------ the controller's
class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def http_fetch(proxy: str | None = None, timeout: float = TIMEOUT_S) -> Fetch:
    """The controller's fetch: urllib (the environment's proxies, CONNECT for https), or, with ``proxy``, an
    HTTP proxy asked in absolute form (``GET https://host/path``) that fetches the URL itself."""

    def fetch(method: str, url: str) -> Answer:
        for _ in range(MAX_REDIRECTS + 1):
            answer, location = (_via_proxy if proxy else _direct)(method, url, proxy, timeout)
            if location is None:
                return answer
            url = urljoin(url, location)
        raise Unreachable(f"more than {MAX_REDIRECTS} redirects")

    return fetch


def _read(method: str, body: bytes) -> str:
    return "" if method == "HEAD" else body[: 1 << 20].decode("utf-8", "replace")


def _direct(method: str, url: str, _proxy: str | None, timeout: float) -> tuple[Answer, str | None]:
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, method=method, headers={"User-Agent": "gpulab-preflight"})
    try:
        with opener.open(request, timeout=timeout) as r:
            return Answer(r.status, url, r.headers.get("Content-Type", ""), _read(method, r.read())), None
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400 and exc.headers.get("Location"):
            return Answer(exc.code, url), exc.headers["Location"]
        return Answer(exc.code, url, exc.headers.get("Content-Type", "")), None
    except (urllib.error.URLError, OSError) as exc:
        raise Unreachable(str(getattr(exc, "reason", exc))) from exc


def _via_proxy(method: str, url: str, proxy: str | None, timeout: float) -> tuple[Answer, str | None]:
    where = urlsplit(proxy or "")
    conn = http.client.HTTPConnection(where.hostname or "", where.port or 3128, timeout=timeout)
    try:
        conn.request(method, url, headers={"User-Agent": "gpulab-preflight"})
        r = conn.getresponse()
        body = r.read()
    except OSError as exc:
        raise Unreachable(f"proxy {proxy}: {exc}") from exc
    finally:
        conn.close()
    if r.status == 502:  # the proxy could not reach the server: as unreachable as without a proxy
        raise Unreachable(body.decode("utf-8", "replace").strip() or f"{r.status} {r.reason}")
    if 300 <= r.status < 400 and r.getheader("Location"):
        return Answer(r.status, url), r.getheader("Location")
    return Answer(r.status, url, r.getheader("Content-Type") or "", _read(method, body)), None
