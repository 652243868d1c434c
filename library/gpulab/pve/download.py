"""Files PVE downloads itself (`download-url`): OS images and ISOs, checked against a SHA-256/512.

Idempotent without a transfer: the storage's content list says whether the file is there. With
`verify_existing`, PVE is asked to check the existing file against the checksum (it answers "OK, got
correct file already, no need to download" without transferring, and fails on a mismatch).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpulab.constants import (
    DIGEST_HEX_DIGITS,
    DOWNLOAD_ALGORITHMS,
    DOWNLOAD_EXTENSION_HINTS,
    DOWNLOAD_EXTENSIONS,
)
from gpulab.pve.client import PveClient, PveTaskError

_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s*%")
# PVE downloads with `wget --progress=dot:giga` (pve-common PVE::Tools::download_file_from_url), whose output
# is the task log: "Length: 3213064192 (3.0G) [application/x-iso9660-image]", then one line per 32 MiB,
# "  32768K ........ ........ ........ ........  2%  104M 29s" (offset in KiB, a dot per MiB, the percentage,
# the rate of that line in bytes/s with a 1024-based unit, the time left), the last one ending "=28s", then
# "2026-... (109 MB/s) - '/var/lib/vz/...tmp_dwnl.1234' saved [3213064192/3213064192]".
_LENGTH_RE = re.compile(r"^Length: (\d+)")
_ROW_RE = re.compile(
    r"^\s*(?P<kib>\d+)K(?P<dots>[ .]*?)\s*(?P<pct>\d+)%\s+(?P<rate>\d+(?:\.\d+)?)(?P<unit>[KMGT]?)(?=[\s=]|$)"
)
_SAVED_RE = re.compile(r" saved \[(\d+)(?:/(\d+))?\]")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
DOT_BYTES = 2**20  # dot:giga: one dot per MiB


class DownloadError(Exception):
    pass


def normalise_filename(name: str) -> str:
    """What PVE turns a filename into: the part after the last / or \\, other characters as `_`."""
    base = re.split(r"[/\\]", name)[-1]
    return re.sub(r"[^a-zA-Z0-9_.\-]", "_", base)


def check_request(content: str, filename: str, checksum: str | None, algorithm: str | None) -> None:
    """Refuse what PVE would refuse, with the fix."""
    pattern = DOWNLOAD_EXTENSIONS.get(content)
    if pattern is not None and not pattern.search(filename):
        hint = DOWNLOAD_EXTENSION_HINTS[content]
        raise DownloadError(
            f"filename {filename!r} does not fit content {content!r}: it must end with {hint}"
        )
    if checksum:
        algo = (algorithm or "").lower()
        if algo not in DOWNLOAD_ALGORITHMS:
            raise DownloadError(
                f"checksum_algorithm {algorithm!r} is not one of {', '.join(DOWNLOAD_ALGORITHMS)}"
            )
        if not re.fullmatch(rf"[0-9a-fA-F]{{{DIGEST_HEX_DIGITS[algo]}}}", checksum):
            raise DownloadError(f"checksum is not a {algo} digest ({DIGEST_HEX_DIGITS[algo]} hex digits)")


@dataclass
class DownloadResult:
    changed: bool = False
    volid: str = ""
    present_before: bool = False
    transferred: bool = False
    upid: str = ""
    log: list[str] = field(default_factory=list)
    progress: float | None = None
    msg: str = ""


def progress_of(lines: list[str]) -> float | None:
    """The last percentage a download task logged, if any."""
    for line in reversed(lines):
        m = _PERCENT_RE.search(line)
        if m:
            return float(m.group(1))
    return None


def transfer_of(lines: list[str]) -> dict[str, int | None]:
    """How far a download task's wget got, from its log: bytes so far, the total (None when the server
    gave no length) and the rate of its last progress line in bytes/s (None before the first one)."""
    done, total, rate = 0, None, None
    for line in lines:
        if m := _LENGTH_RE.match(line):
            total = int(m.group(1))
        elif m := _ROW_RE.match(line):
            done = int(m.group("kib")) * 1024 + m.group("dots").count(".") * DOT_BYTES
            rate = int(float(m.group("rate")) * _UNITS[m.group("unit")])
        elif m := _SAVED_RE.search(line):
            done = int(m.group(1))
            total = int(m.group(2) or m.group(1))
    if total is not None:
        done = min(done, total)
    return {"bytes": done, "total": total, "rate": rate}


def ensure_download(
    client: PveClient,
    *,
    node: str,
    storage: str,
    url: str,
    filename: str,
    content: str = "iso",
    checksum: str | None = None,
    checksum_algorithm: str | None = "sha256",
    verify_certificates: bool = True,
    verify_existing: bool = False,
    check_mode: bool = False,
    wait: bool = True,
    timeout: float = 3600,
    on_progress: Callable[[float | None, list[str]], None] | None = None,
) -> DownloadResult:
    name = normalise_filename(filename)
    check_request(content, name, checksum, checksum_algorithm)
    res = DownloadResult(volid=f"{storage}:{content}/{name}")
    listing = client.get(f"nodes/{node}/storage/{storage}/content", content=content) or []
    res.present_before = any(item.get("volid") == res.volid for item in listing)
    if res.present_before and not (verify_existing and checksum):
        res.msg = f"{res.volid} is already there"
        return res
    if check_mode:
        res.changed = not res.present_before
        res.msg = f"would {'verify' if res.present_before else 'download'} {res.volid}"
        return res
    params: dict[str, Any] = {
        "url": url,
        "content": content,
        "filename": name,
        "verify-certificates": bool(verify_certificates),
    }
    if checksum:
        params["checksum"] = checksum.lower()
        params["checksum-algorithm"] = (checksum_algorithm or "sha256").lower()
    upid = client.post(f"nodes/{node}/storage/{storage}/download-url", **params)
    res.upid = str(upid or "")
    if not wait:
        res.changed = not res.present_before
        res.msg = f"download of {res.volid} started"
        return res
    return finish(client, node, res, timeout, on_progress)


def finish(
    client: PveClient,
    node: str,
    res: DownloadResult,
    timeout: float,
    on_progress: Callable[[float | None, list[str]], None] | None = None,
) -> DownloadResult:
    """Wait for a started download task and fill in the result."""
    seen: list[str] = []

    def _progress(_status: dict[str, Any], lines: list[str]) -> None:
        seen.extend(lines)
        res.progress = progress_of(seen) if progress_of(lines) is None else progress_of(lines)
        if on_progress is not None:
            on_progress(res.progress, lines)

    try:
        client.wait_task(node, res.upid, timeout, what=f"download {res.volid}", on_progress=_progress)
    except PveTaskError as exc:
        raise DownloadError(f"PVE could not download {res.volid}: {exc.message}") from exc
    res.log = seen[-20:]
    reused = any("no need to download" in line for line in seen)
    res.transferred = not reused
    res.changed = (not reused and not res.present_before) or (res.present_before and not reused)
    res.msg = f"{res.volid} {'was already correct' if reused else 'downloaded and verified'}"
    return res


def task_status(client: PveClient, node: str, upid: str) -> dict[str, Any]:
    """One look at a download task: done?, progress, the last log lines. For polling from a playbook."""
    status = client.get(f"nodes/{node}/tasks/{upid}/status")
    lines = [
        str(x.get("t", "")) for x in client.get(f"nodes/{node}/tasks/{upid}/log", start=0, limit=5000) or []
    ]
    done = status.get("status") == "stopped"
    transfer = transfer_of(lines)
    exitstatus = str(status.get("exitstatus", "")) if done else ""
    ok = done and (exitstatus == "OK" or exitstatus.startswith("WARNINGS"))
    return {
        "done": done,
        "ok": ok,
        "exitstatus": exitstatus,
        "progress": 100.0 if ok else progress_of(lines),
        "reused": any("no need to download" in line for line in lines),
        "log": lines[-20:],
        **transfer,
    }
