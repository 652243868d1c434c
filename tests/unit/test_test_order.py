"""The test run's own order: the files that share one lab (simlab.SHARED_LABS) run in the group's order, the
file that reads the lab before the file that goes on from it, whatever their names and however they are given."""

import subprocess
import sys
from pathlib import Path

import simlab

ROOT = Path(__file__).resolve().parents[2]


def collected_files(*args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files: list[str] = []
    for line in out.splitlines():
        path = line.split("::", 1)[0]
        if "::" in line and (not files or files[-1] != path):
            files.append(path)
    return files


def test_each_shared_lab_group_runs_in_its_order_whatever_the_files_are_called():
    for group in simlab.SHARED_LABS.values():
        for args in (tuple(reversed(group)), group, (str(Path(group[0]).parent),)):
            files = [f for f in collected_files(*args) if f in group]
            assert files == list(group), (args, files)
