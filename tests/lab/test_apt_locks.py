"""apt_locks: the holder of apt's and dpkg's locks found on real fcntl locks (its PID and the name apt
shows), free locks and missing lock files seen as free, and the task in a play on this machine: it waits while
a process holds a lock, naming it at once and at a steady pace, and fails naming it when the time is up."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from ansible_modules import MODULES, run_json
from ansible_runs import BIN, ROOT, ansible_playbook, playbook_env

STANDIN = ROOT / "library" / "labsim" / "net" / "unattended_upgrades.py"
APT_LOCKS = ("/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock", "/var/lib/apt/lists/lock")


def module():
    spec = importlib.util.spec_from_file_location("gpulab_apt_locks_test", MODULES / "apt_locks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextmanager
def unattended_upgrade(root: Path, hold_s: float) -> Iterator[subprocess.Popen]:
    """The lab's unattended-upgrades stand-in holding apt's locks under `root` (named unattended-upgrade, run by
    its #! line, so its process name is unattended-upgr), until it has them all."""
    script = root / "bin" / "unattended-upgrade"
    script.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(STANDIN, script)
    script.chmod(0o755)
    env = {**os.environ, "GPULAB_STANDIN_ROOT": str(root / "host")}
    proc = subprocess.Popen([str(script), "--gpulab-hold", str(hold_s)], env=env)
    try:
        deadline = time.monotonic() + 10
        lookup = module()
        while time.monotonic() < deadline:
            found = lookup.holders([str(root / "host" / p.lstrip("/")) for p in APT_LOCKS])
            if found and len(found[0]["paths"]) == len(APT_LOCKS):
                break
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def locks(root: Path) -> list[str]:
    return [str(root / "host" / p.lstrip("/")) for p in APT_LOCKS]


# --- the look, on real fcntl locks ----------------------------------------------------------------------------


def test_a_held_lock_names_the_process_as_apt_does(tmp_path):
    lookup = module()
    with unattended_upgrade(tmp_path, 30) as proc:
        found = lookup.holders(locks(tmp_path))
    assert found == [
        {
            "pid": proc.pid,
            "name": "unattended-upgr",  # the script's name cut to 15 characters, as /proc/PID/status has it
            # run by its #! line: /usr/bin/python3 SCRIPT ARGS
            "cmdline": f"/usr/bin/python3 {tmp_path / 'bin' / 'unattended-upgrade'} --gpulab-hold 30",
            "paths": locks(tmp_path),
        }
    ]
    assert lookup.describe(found) == (
        f"{locks(tmp_path)[0]}, {locks(tmp_path)[1]} and {locks(tmp_path)[2]} are held by process {proc.pid} "
        "(unattended-upgr)"
    )


def test_free_and_missing_lock_files_are_free(tmp_path):
    lookup = module()
    free = tmp_path / "lock-frontend"
    free.write_text("")
    assert lookup.holders([str(free), str(tmp_path / "missing" / "lock")]) == []
    assert lookup.describe([]) == "apt's and dpkg's locks are free"
    # a lock of this very process does not keep its own look out, and is not reported as another's
    fd = os.open(free, os.O_RDWR)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        assert lookup.holders([str(free)]) == []
    finally:
        os.close(fd)


def test_a_lock_on_part_of_the_file_and_an_open_file_description_lock_count_too(tmp_path):
    lookup = module()
    path = tmp_path / "lock"
    path.write_text("")
    # another process holds a read lock on byte 10 (apt's write lock on the whole file would be refused)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, struct, sys, time\n"
            f"fd = os.open({str(path)!r}, os.O_RDWR)\n"
            "fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 10, 1, 0))\n"
            "print('held', flush=True)\n"
            "time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        [found] = lookup.holders([str(path)])
        assert found["pid"] == holder.pid and found["paths"] == [str(path)]
    finally:
        holder.kill()
        holder.wait()
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0))
        [found] = lookup.holders([str(path)])
        assert found["pid"] == -1 and lookup.who(found) == "an open file description lock (no process ID)"
    finally:
        os.close(fd)


def test_the_module_reports_holders_in_check_mode_and_changes_nothing(tmp_path):
    with unattended_upgrade(tmp_path, 30) as proc:
        res = run_json(MODULES / "apt_locks.py", {"paths": locks(tmp_path)}, check_mode=True)
    assert res["changed"] is False and res["timeout"] == 900
    assert [(h["pid"], h["name"]) for h in res["holders"]] == [(proc.pid, "unattended-upgr")]
    assert res["msg"].endswith(f"are held by process {proc.pid} (unattended-upgr)")


# --- the task in a play on this machine -----------------------------------------------------------------------


def _book(tmp_path: Path, paths: list[str], timeout: int) -> list[str | Path]:
    """The arguments of ansible-playbook for the wait on this machine, then a task that shows what it did."""
    task = {
        "name": "Wait until no other process holds apt's and dpkg's locks",
        "gpulab.homelab.apt_locks": {
            "timeout": timeout,
            "interval": 1,
            "progress_interval": 2,
            "paths": paths,
        },
        "register": "apt_locks",
    }
    show = {
        "name": "show",
        "ansible.builtin.debug": {"msg": "waited {{ apt_locks.waited }} looks {{ apt_locks.looks }}"},
    }
    book = tmp_path / "book.yml"
    book.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": [task, show]}]))
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return ["-i", inv, book]


def _play(tmp_path: Path, paths: list[str], timeout: int) -> subprocess.CompletedProcess:
    return ansible_playbook(
        *_book(tmp_path, paths, timeout), env=playbook_env(ANSIBLE_STDOUT_CALLBACK="default")
    )


def test_the_task_waits_naming_the_holder_until_it_lets_go(tmp_path):
    # The stand-in lets go once the task has said who holds the locks and said it again at its pace, however
    # long ansible-playbook took to start (a hold of a few seconds can be over before a loaded machine's first look).
    with unattended_upgrade(tmp_path, 600) as proc:
        pid = proc.pid
        play = subprocess.Popen(
            [str(BIN / "ansible-playbook"), *map(str, _book(tmp_path, locks(tmp_path), timeout=60))],
            cwd=ROOT,
            env=playbook_env(ANSIBLE_STDOUT_CALLBACK="default"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        seen = []
        for line in play.stdout:
            seen.append(line)
            if line.startswith("localhost: waiting for apt's locks:"):
                break
        proc.kill()  # its locks go with it
        proc.wait()
        stdout = "".join(seen) + play.communicate(timeout=120)[0]
    assert play.returncode == 0, stdout
    # at once: who holds what, and how long the task waits
    assert re.search(
        rf"^localhost: .*/var/lib/apt/lists/lock are held by process {pid} \(unattended-upgr\); waiting up to 60 s",
        stdout,
        re.M,
    ), stdout
    # then at a steady pace, still naming it
    assert re.search(
        rf"^localhost: waiting for apt's locks: .* held by process {pid} \(unattended-upgr\): \d+ s of 60 s$",
        stdout,
        re.M,
    ), stdout
    waited, looks = re.search(r"waited ([\d.]+) looks (\d+)", stdout).groups()
    assert float(waited) >= 2 and int(looks) >= 2


def test_the_task_fails_naming_the_process_when_the_time_is_up(tmp_path):
    with unattended_upgrade(tmp_path, 120) as proc:
        started = time.monotonic()
        run = _play(tmp_path, locks(tmp_path), timeout=3)
        pid = proc.pid
        assert time.monotonic() - started < 60
    assert run.returncode != 0
    assert f"is held by process {pid} (unattended-upgr)" in run.stdout or (
        f"are held by process {pid} (unattended-upgr)" in run.stdout
    ), run.stdout
    assert "apt's locks on localhost are still held after" in run.stdout
    assert "raise gpulab_apt_lock_timeout" in run.stdout and "Do not remove the lock files" in run.stdout


def test_free_locks_cost_one_look_and_no_line(tmp_path):
    run = _play(tmp_path, [str(tmp_path / "no" / "lock")], timeout=60)
    assert run.returncode == 0, run.stdout
    assert "looks 1" in run.stdout and "waiting for apt's locks" not in run.stdout


def _slow_first_look(monkeypatch, answers: list[dict]) -> tuple[dict, list[str]]:
    """The action's wait on a fake clock whose first look takes 25 s (a loaded host, a slow SSH login), past its
    progress_interval of 2 s, so that a line falls due while it runs; later looks answer at once. The task's
    result, and the lines it printed."""
    from ansible_collections.gpulab.homelab.plugins.action import apt_locks as action
    from ansible_collections.gpulab.homelab.plugins.plugin_utils import waiting_action

    lines: list[str] = []
    monkeypatch.setattr(waiting_action.display, "display", lambda text, *a, **k: lines.append(text))
    now = [0.0]
    plugin = object.__new__(action.ActionModule)
    plugin.clock = lambda: now[0]
    plugin.sleep = lambda seconds: now.__setitem__(0, now[0] + seconds)
    pending = iter(answers)

    def execute_module(**_kwargs):
        if now[0] == 0.0:
            now[0] = 25.0
            time.sleep(1.0)  # the progress thread looks every 0.5 s of real time while a look runs
        return next(pending)

    plugin._execute_module = execute_module
    args = {"timeout": 60, "interval": 5, "progress_interval": 2, "paths": ["/var/lib/dpkg/lock"]}
    return plugin.wait(args, {}, "vm-1"), lines


def test_a_slow_first_look_prints_no_line_before_it_names_a_holder(monkeypatch):
    free = {"holders": [], "msg": "apt's locks are free"}
    result, lines = _slow_first_look(monkeypatch, [free])
    assert result["looks"] == 1 and not result.get("failed")
    assert lines == []  # over at its first look: nothing printed, however long that look took
    held = {
        "holders": [{"pid": 4242, "name": "unattended-upgr", "paths": ["/var/lib/dpkg/lock"]}],
        "msg": "/var/lib/dpkg/lock is held by process 4242 (unattended-upgr)",
    }
    result, lines = _slow_first_look(monkeypatch, [held, held, free])
    assert result["looks"] == 3 and not result.get("failed")
    assert lines and all("held by process 4242 (unattended-upgr)" in line for line in lines), lines


# --- the lab's stand-in against apt's own lock code (library/labsim/UPSTREAM.md, "apt locks") --------------------


def test_unattended_upgrades_lock_taken_gives_up(tmp_path):
    with unattended_upgrade(tmp_path, 30):
        env = {**os.environ, "GPULAB_STANDIN_ROOT": str(tmp_path / "host")}
        script = tmp_path / "bin" / "unattended-upgrade"
        res = subprocess.run([str(script), "--gpulab-hold", "30"], env=env, capture_output=True, text=True)
    assert res.returncode == 1 and res.stdout == "Cache lock can not be acquired, exiting\n"
    log = (tmp_path / "host" / "var/log/unattended-upgrades/unattended-upgrades.log").read_text().splitlines()
    assert log[-1].endswith(" ERROR Lock could not be acquired (another package manager running?)")
    assert [line.split(" ", 2)[2] for line in log[:2]] == ["INFO Starting unattended upgrades script"] * 2


def test_apt_get_lock_holder(tmp_path):
    """This machine's apt-get, pointed at the stand-in's lists folder, names the holder apt_locks names."""
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get on this machine")
    lists = tmp_path / "host" / "var/lib/apt/lists"
    with unattended_upgrade(tmp_path, 30) as proc:
        res = subprocess.run(
            [
                "apt-get", "update",
                "-o", f"Dir::State::Lists={lists}/",
                "-o", "Dir::Etc::SourceList=/dev/null",
                "-o", "Dir::Etc::SourceParts=/dev/null",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        [found] = module().holders([str(lists / "lock")])
    assert res.returncode == 100
    assert (
        f"E: Could not get lock {lists}/lock. It is held by process {found['pid']} ({found['name']})"
        in res.stderr
    )
    assert (found["pid"], found["name"]) == (proc.pid, "unattended-upgr")


def test_a_lock_file_the_stand_in_makes_leaves_its_folder_times(tmp_path):
    """The lab image's lists folder has no lock file: making one must not look like an apt-get update to Ansible's
    apt module, which reads the folder's mtime as the time of the last update (cache_valid_time)."""
    lists = tmp_path / "host" / "var/lib/apt/lists"
    lists.mkdir(parents=True)
    os.utime(lists, (1754697600, 1754697600))  # the image's date
    with unattended_upgrade(tmp_path, 30):
        assert (lists / "lock").exists() and lists.stat().st_mtime == 1754697600


# --- every apt task of the roles waits ------------------------------------------------------------------------

APT_MODULES = {"ansible.builtin.apt", "apt", "ansible.builtin.package", "ansible.builtin.apt_repository"}


def _tasks(items: list) -> Iterator[dict]:
    for task in items if isinstance(items, list) else []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always", "pre_tasks", "tasks", "post_tasks", "handlers"):
            yield from _tasks(task.get(key) or [])


def test_every_apt_task_of_the_roles_waits_for_apt_s_locks_as_long():
    """An apt task of a role or a playbook (the guests' and any on the Proxmox node) follows a apt_locks wait of
    its own file and gives apt the timeout that wait used, so a lock taken in between is waited for as long."""
    found = 0
    books = [
        *ROOT.glob("roles/*/tasks/*.yml"),
        *ROOT.glob("roles/*/handlers/*.yml"),
        *ROOT.glob("playbooks/**/*.yml"),
    ]
    for path in sorted(books):
        waits: list[str] = []
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            if "gpulab.homelab.apt_locks" in task:
                assert task["gpulab.homelab.apt_locks"] == {
                    "timeout": "{{ gpulab_apt_lock_timeout | default(omit) }}"
                }, path
                waits.append(task["register"])
            module = next((m for m in APT_MODULES if m in task), None)
            if module is None:
                continue
            found += 1
            assert module == "ansible.builtin.apt", f"{path}: {task['name']}: use ansible.builtin.apt"
            assert waits, f"{path}: {task['name']}: no apt_locks wait before it"
            assert task[module].get("lock_timeout") == f"{{{{ {waits[-1]}.timeout }}}}", (
                f"{path}: {task['name']}"
            )
    assert found >= 4  # guest_base, the driver, the toolkit's refresh and install


def test_the_catalogue_default_is_the_module_s():
    from gpulab.labdef import catalogue

    assert (
        catalogue.BY_NAME["gpulab_apt_lock_timeout"].default == module().ARGUMENT_SPEC["timeout"]["default"]
    )
