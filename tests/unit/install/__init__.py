"""Tests of `gpulab install-media` and its pieces; `install_media` runs the command as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def install_media(inventory: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m gpulab.cli install-media INVENTORY OUT ARGS...` in the repository, with this shell's
    GPULAB_* settings cleared and `env` added (the root password, HOME, the lab's state)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "gpulab.cli", "install-media", str(inventory), str(out), *args],
        capture_output=True,
        text=True,
        env=environ,
        cwd=ROOT,
        check=False,
    )
