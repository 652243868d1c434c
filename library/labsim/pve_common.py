"""What the rooms of the PVE API simulator share, at the bottom of its imports: the API error, PVE's size
notation, the config digest check, how PVE prints a drive, a VM's memory. Imports nothing of labsim."""

from __future__ import annotations

import re

GiB = 2**30


class ApiError(Exception):
    """An HTTP error with PVE's message (and, for 400, the per-parameter errors map)."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


def format_size(size: int) -> str:
    """PVE's size= notation: the largest unit that divides the size exactly."""
    for unit, factor in (("T", 2**40), ("G", GiB), ("M", 2**20), ("K", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def parse_size(text: str) -> int:
    m = re.match(r"^(\d+(?:\.\d+)?)([KMGT]?)(?:iB)?$", text)
    if not m:
        raise ValueError(text)
    factor = {"": 1, "K": 1024, "M": 2**20, "G": GiB, "T": 2**40}[m.group(2)]
    return int(float(m.group(1)) * factor)


def check_digest(args: dict, current: str) -> None:
    if "digest" in args and args["digest"] != current:
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")


def print_drive(volid: str, options: dict) -> str:
    """A drive the way PVE writes it: the volume first, then the other keys in sorted order."""
    return ",".join([volid, *(f"{k}={v}" for k, v in sorted(options.items()))])


def vm_memory_mib(config: dict) -> int:
    """A VM's memory in MiB (``memory``, or its ``current=``; PVE's default 512)."""
    mem = str(config.get("memory", "512"))
    m = re.search(r"(?:^|current=)(\d+)", mem)
    return int(m.group(1)) if m else 512
