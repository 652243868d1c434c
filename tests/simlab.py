"""A whole simulated lab (`gpulab lab up`, hosts included) for a test, in a state dir of its own, always
stopped afterwards. Skips with the reason when not root, a tool is missing or the lab comes up without
what the test needs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "labsim"]


@contextlib.contextmanager
def running_lab(
    prefix: str, tools: Iterable[str], ready: Callable[[dict[str, Any]], bool], what: str
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yields (state dir, lab.json) once the lab's network is up and `ready(lab.json)` holds."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab's hosts live in network namespaces")
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}")
    state = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        up = subprocess.run([*CLI, "up", "--state", str(state)], capture_output=True, text=True, timeout=300,
                            check=False, cwd=ROOT)  # fmt: skip
        desc = json.loads((state / "lab.json").read_text()) if (state / "lab.json").exists() else {}
        if up.returncode != 0 or desc.get("network") != "up":
            # as root with the lab's programs present, a lab that cannot start is a failure, not a skip
            pytest.fail(f"the simulated lab did not come up: {up.stderr[-800:]}")
        if not ready(desc):
            pytest.skip(f"the simulated lab came up, but not {what}: {up.stderr[-500:]}")
        yield state, desc
    finally:
        subprocess.run(
            [*CLI, "down", "--state", str(state)], capture_output=True, timeout=120, check=False, cwd=ROOT
        )
        shutil.rmtree(state, ignore_errors=True)


@contextlib.contextmanager
def machine_apt_lists_aged(age_s: float) -> Iterator[None]:
    """The machine's /var/lib/apt/lists dated ``age_s`` seconds ago for the block (0: just updated), then back."""
    lists = Path("/var/lib/apt/lists")
    before = lists.stat()
    stamp = time.time() - age_s
    os.utime(lists, (stamp, stamp))
    try:
        yield
    finally:
        os.utime(lists, ns=(before.st_atime_ns, before.st_mtime_ns))
