"""ansible-playbook as the tests start it: this virtualenv's, in the repository, with the project's
ansible.cfg and an environment cleared of this shell's own Ansible and gpulab settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def playbook_env(**extra: str) -> dict[str, str]:
    """This process's environment without ANSIBLE_* and GPULAB_* (a developer's shell may set them), with the
    project's ansible.cfg, no colours and this virtualenv first on PATH; `extra` is added last."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ANSIBLE_", "GPULAB_")) and k != "PYTEST_CURRENT_TEST"
    }
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_NOCOLOR="1",
        PATH=f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    env.update(extra)
    return env


def ansible_playbook(
    *args: str | Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `ansible-playbook ARGS` from the repository root and return what it did (never raises on rc)."""
    return subprocess.run(
        [str(BIN / "ansible-playbook"), *map(str, args)],
        cwd=ROOT,
        env=playbook_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
