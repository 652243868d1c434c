"""A test run that is stopped takes its labs down: SIGTERM (what `timeout` sends to the whole process group, as
a closed terminal's SIGHUP is) ends a pytest run as Ctrl-C does, so fixtures' teardowns run and each lab a
test started is stopped, with pytest-xdist workers and without (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

INNER = """
import json, os, subprocess, sys, time
from pathlib import Path
import pytest

@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    state = tmp_path_factory.mktemp("stopped-lab")
    subprocess.run([sys.executable, "-m", "labsim", "up", "--state", str(state)], check=True, capture_output=True)
    yield state
    subprocess.run([sys.executable, "-m", "labsim", "down", "--state", str(state)], check=True, capture_output=True)

def test_waits_until_stopped(lab):
    Path(os.environ["LAB_STATE_NOTE"]).write_text(str(lab))
    time.sleep(600)
"""


def gone(pid: int, within: float = 30) -> bool:
    """The process has exited within `within` seconds (a zombie no init reaped yet counts as exited)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False


def lab_running(state: Path) -> bool:
    """labsim's own status: 0 while the lab's API server runs."""
    out = subprocess.run(
        [sys.executable, "-m", "labsim", "status", "--state", str(state)], capture_output=True, cwd=ROOT
    )
    return out.returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_run_stopped_by_sigterm_takes_its_lab_down(tmp_path, workers):
    base = Path(tempfile.mkdtemp(prefix="gl-stop-"))  # short: the lab's sockets live in its state dir
    inner = tmp_path / "test_inner.py"
    inner.write_text(INNER)
    note = tmp_path / "state"
    env = {**os.environ, "GPULAB_LAB_API_ONLY": "1", "LAB_STATE_NOTE": str(note)}
    env.pop("PYTEST_XDIST_WORKER", None)
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", *workers,
            "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT), "--basetemp", str(base),
            str(inner)]  # fmt: skip
    run = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not note.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        assert note.exists(), run.communicate(timeout=30)[0].decode()[-3000:]
        state = Path(note.read_text())
        assert lab_running(state)
        server = json.loads((state / "lab.json").read_text())["pid"]
        os.killpg(run.pid, signal.SIGTERM)  # as `timeout` does: the whole process group
        out = run.communicate(timeout=120)[0].decode()
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for left in base.rglob("lab.json"):
            subprocess.run(
                [sys.executable, "-m", "labsim", "down", "--state", str(left.parent)], capture_output=True
            )
        shutil.rmtree(base, ignore_errors=True)
    assert run.returncode != 0
    assert "stopped by SIGTERM" in out or "KeyboardInterrupt" in out, out[-3000:]
    assert not lab_running(state), out[-3000:]
    assert gone(server)  # the API server itself is gone
