"""A whole simulated lab (`gpulab lab up`, hosts included) for a test, in a state dir of its own, always
stopped afterwards. Skips with the reason when not root, a tool is missing or the lab comes up without
what the test needs."""

from __future__ import annotations

import contextlib
import fcntl
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

import ansible_runs
import pytest

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "labsim"]


@contextlib.contextmanager
def running_lab(
    prefix: str,
    tools: Iterable[str],
    ready: Callable[[dict[str, Any]], bool],
    what: str,
    fixture: str | None = None,
) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Yields (state dir, lab.json) once the lab's network is up and `ready(lab.json)` holds (on `fixture`, a
    name or path for `gpulab lab up --fixture`; default the reference machine)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the lab's hosts live in network namespaces")
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}")
    state = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        chosen = ["--fixture", fixture] if fixture else []
        up = subprocess.run([*CLI, "up", "--state", str(state), *chosen], capture_output=True, text=True,
                            timeout=300, check=False, cwd=ROOT)  # fmt: skip
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


#: a shell line that waits while a lab VM's unattended-upgrades (run after each boot) holds apt's locks, as a script
#: on a fresh Ubuntu guest must before `apt-get update`, whose lists' lock apt never waits for
def lab_ssh(
    facts: dict[str, Any], user: str, address: str, command: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """`command` as `user` on a lab host over SSH, with the lab's key and known_hosts (lab.json's `facts`),
    the host key checked, never a prompt."""
    argv = [
        "ssh",
        "-i", facts["ssh_private_key"],
        "-o", f"UserKnownHostsFile={facts['ssh_known_hosts']}",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "BatchMode=yes",
        "-o", "ConnectTimeout=3",
        "-o", "LogLevel=ERROR",
        f"{user}@{address}",
        command,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


WAIT_FOR_UNATTENDED_UPGRADES = "while pgrep -x unattended-upgr >/dev/null; do sleep 0.5; done"


@contextlib.contextmanager
def machine_apt_lists_aged(age_s: float) -> Iterator[None]:
    """The machine's /var/lib/apt/lists dated ``age_s`` seconds ago for the block (0: just updated), then back.

    One block at a time on the machine (a lock file beside the lists): the make targets run test files in two
    pytest workers, and two blocks interleaved would each put back what the other had set."""
    lists = Path("/var/lib/apt/lists")
    with open(lists.parent / ".gpulab-tests-lists-aged.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        before = lists.stat()
        stamp = time.time() - age_s
        os.utime(lists, (stamp, stamp))
        try:
            yield
        finally:
            os.utime(lists, ns=(before.st_atime_ns, before.st_mtime_ns))


#: the test files that share one session fixture (its lab): the make targets' pytest-xdist scheduler (tests/conftest.py)
#: runs each group's files in one worker, in collection order, so that the fixture is made once
SHARED_LABS = {"converged_demo": ("tests/e2e/test_secrets.py", "tests/e2e/test_lab_stack.py")}


class ConvergedDemo:
    """The demo lab (inventory/demo, fixture reference) after one whole site.yml converge at -vvv, with Ansible's
    JSON result format (no folded lines), while the machine's apt lists are days old.

    One converge for two proofs (the root conftest's session fixture `converged_demo`): tests/e2e/test_secrets.py
    reads that run's output and the lab's state right after it, then tests/e2e/test_lab_stack.py goes on from it
    (workloads, upgrade, teardown) and stops the lab when its module ends (`close`). SHARED_LABS has pytest-xdist's
    workers run both files in one process, in that order; `handed_on` says that a test went on from the converge
    (the lab's state is no longer the converge's)."""

    def __init__(self, stack: contextlib.ExitStack, state: Path, desc: dict[str, Any]) -> None:
        self._stack = stack
        self.state, self.desc = state, desc
        self.handed_on = False
        env = ansible_runs.playbook_env(GPULAB_LAB_STATE=str(state), ANSIBLE_CALLBACK_RESULT_FORMAT="json")
        # CI's make demo runs right after an apt-get update: the VMs' apt refresh must not depend on the
        # machine's lists, fresh or days old (the VMs have lists of their own)
        with machine_apt_lists_aged(5 * 86400):
            self.converge = ansible_runs.ansible_playbook(
                "-i", ROOT / "inventory" / "demo", ROOT / "site.yml", "-vvv", env=env, timeout=900
            )

    def close(self) -> None:
        """Stop the lab (again: nothing)."""
        self._stack.close()


@contextlib.contextmanager
def converged_demo() -> Iterator[ConvergedDemo]:
    with contextlib.ExitStack() as stack:
        state, desc = stack.enter_context(
            running_lab(
                "gtdemo", ("dnsmasq", "sshd"), lambda d: d.get("vm_init") == "systemd", "with its hosts"
            )
        )
        yield ConvergedDemo(stack, state, desc)
