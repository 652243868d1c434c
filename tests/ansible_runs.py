"""ansible-playbook as the tests start it: this virtualenv's, in the repository, with the project's
ansible.cfg and an environment cleared of this shell's own Ansible and gpulab settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


#: For a test that runs one stage playbook on an inventory of that stage's hosts only (a node, or a router and its
#: VMs), which preflight would refuse as a lab: the test stands in for preflight, so the fact a run's preflight
#: leaves (gpulab_preflight_done) ends the stage's own import of playbooks/preflight.yml at once, as it does
#: after site.yml's. Never for a whole lab: there preflight runs.
STAGE_ON_ITS_HOSTS = ("-e", "gpulab_preflight_done=true")


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


RECAP = re.compile(
    r"^(?P<host>\S+)\s+: ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)\s+"
    r"failed=(?P<failed>\d+)",
    re.M,
)


def recaps(proc: subprocess.CompletedProcess[str]) -> dict[str, dict[str, int]]:
    """The PLAY RECAP of a run: host -> its ok, changed, unreachable and failed counts (a run without one fails)."""
    found = {
        m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
        for m in RECAP.finditer(proc.stdout)
    }
    assert found, proc.stdout[-3000:] + proc.stderr
    return found


def galaxy(*args: str | Path, env: dict[str, str], cwd: Path) -> None:
    """`ansible-galaxy ARGS` with `env`, which must succeed."""
    proc = subprocess.run(
        [str(BIN / "ansible-galaxy"), *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def build_collection(out: Path, env: dict[str, str]) -> Path:
    """The checkout's collection tarball, built into `out` (`ansible-galaxy collection build`)."""
    galaxy("collection", "build", "--output-path", out, ROOT, env=env, cwd=out)
    (tarball,) = out.glob("*.tar.gz")
    return tarball


def install_collection(tarball: Path, path: Path, env: dict[str, str]) -> None:
    """`ansible-galaxy collection install` of `tarball` into the collections path `path`; `env`'s ansible.cfg must
    not be the checkout's (it finds gpulab.homelab through .collections, and the install would skip it)."""
    galaxy("collection", "install", "-p", path, tarball, env=env, cwd=path)
