"""The lines `wget --progress=dot:giga` writes, as a PVE download-url task logs them.

PVE's download-url runs pve-common's PVE::Tools::download_file_from_url in a worker task: it prints
"downloading <url> to <dest>", runs `wget --progress=dot:giga -O <dest>.tmp_dwnl.<pid> <url>` (whose stderr is
the task log), then "calculating checksum...OK, checksum verified" and "download of '<url>' to '<dest>'
finished". With dot:giga, each dot is 1 MiB, in clusters of 8, 32 on a line (32 MiB), and a line appears
when it is complete: the offset in KiB, the dots, the percentage (rounded down), the rate over that line
(" %4.*f%c": a 1024-based unit, wget's precision) and the time left; the last line is padded and ends with "=<time
taken>". Then a blank line and "<date> (<rate>) - '<file>' saved [<bytes>/<total>]".
"""

from __future__ import annotations

import time

DOT = 2**20
DOTS_IN_LINE = 32
SPACING = 8
ROW = DOT * DOTS_IN_LINE


def _rate(bytes_per_s: float) -> str:
    """wget's calc_rate and print_row_stats: ' %4.*f%c' over a 1024-based unit."""
    value, unit = float(bytes_per_s), " "
    for name in "KMG":
        if value < 1024:
            break
        value, unit = value / 1024, name
    digits = 0 if value >= 99.95 else 1 if value >= 9.995 else 2
    return f"{value:4.{digits}f}{unit}"


def _human_short(secs: int) -> str:
    """wget's eta_to_human_short, condensed."""
    if secs < 100:
        return f"{secs}s"
    if secs < 100 * 60:
        return f"{secs // 60}m{secs % 60}s"
    if secs < 48 * 3600:
        return f"{secs // 3600}h{(secs // 60) % 60}m"
    if secs < 100 * 86400:
        return f"{secs // 86400}d{(secs // 3600) % 24}h"
    return f"{secs // 86400}d"


def _dots(count: int) -> str:
    out = ""
    for i in range(DOTS_IN_LINE):
        if i % SPACING == 0:
            out += " "
        out += "." if i < count else " "
    return out


def header(url: str, host: str, size: int, mimetype: str, tmp: str, now: float | None = None) -> list[str]:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    giga = f"{size / 2**30:.1f}G" if size >= 2**30 else f"{size / 2**20:.0f}M"
    return [
        f"--{stamp}--  {url}",
        f"Resolving {host} ({host})... 192.0.2.80",
        f"Connecting to {host} ({host})|192.0.2.80|:443... connected.",
        "HTTP request sent, awaiting response... 200 OK",
        f"Length: {size} ({giga}) [{mimetype}]",
        f"Saving to: '{tmp}'",
        "",
    ]


def row(index: int, size: int, rate: float) -> str:
    """The line wget writes when full row `index` (from 0) is complete, at `rate` bytes/s."""
    done = (index + 1) * ROW
    left = max(0.0, (size - done) / rate) if rate > 0 else 0.0
    return f"{index * ROW // 1024:6d}K{_dots(DOTS_IN_LINE)}{100 * done // size:3d}% {_rate(rate)} {_human_short(int(left + 0.5))}"


def last_row(size: int, rate: float, took: float) -> str:
    """The last, partial line (or the last full one), padded, with the total time."""
    full = size // ROW
    if size % ROW == 0 and full:
        full -= 1
    dots = (size - full * ROW) // DOT
    spent = f"{took:.1f}s" if took < 10 else _human_short(int(took + 0.5))
    return f"{full * ROW // 1024:6d}K{_dots(dots)}100% {_rate(rate)}={spent}"


def rows_done(size: int, fraction: float) -> int:
    """How many full lines wget has written when `fraction` of `size` has arrived (the last line excluded)."""
    full = size // ROW if size % ROW else max(0, size // ROW - 1)
    return min(full, int(fraction * size) // ROW)


def footer(tmp: str, size: int, rate: float, now: float | None = None) -> list[str]:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    value, unit = float(rate), "B/s"
    for name in ("KB/s", "MB/s", "GB/s"):
        if value < 1024:
            break
        value, unit = value / 1024, name
    return [
        "",
        f"{stamp} ({value:.{0 if value >= 99.95 else 1 if value >= 9.995 else 2}f} {unit}) - '{tmp}' saved [{size}/{size}]",
        "",
    ]
