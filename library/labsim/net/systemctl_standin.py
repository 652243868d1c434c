#!/usr/bin/python3
"""A stand-in for systemctl on a lab host that runs no systemd (:mod:`labsim.net.mount_ns_host`).

It answers what the k3s install script stand-in, its uninstall and killall scripts, and Ansible's
systemd_service module ask: daemon-reload, enable/disable, start/stop/restart, is-enabled/is-active, show,
list-unit-files. A unit with an ExecStart really runs, in the background, in a new session, with the
environment systemd would give it (a plain PATH plus the unit's EnvironmentFile= lines), its output appended
to /var/log/<unit>.log. Unit state lives in /var/lib/gpulab-sim/systemd/<unit>.json; every call is appended
to the lab's stand-in log, /var/log/gpulab-standins.log (JSON lines: time, command, argv, rc, as
:mod:`labsim.net.command_standins` writes them). Standard library only; all paths are the host's own.
Answers, streams and exit codes are systemd 255's (Ubuntu 24.04), as library/labsim/UPSTREAM.md lists them.
"""

import contextlib
import json
import os
import shlex
import subprocess
import sys
import time

UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
STATE_DIR = "/var/lib/gpulab-sim/systemd"
LOG = "/var/log/gpulab-standins.log"  # command_standins.LOG (this file runs alone in the host)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LOG_DIR = "/var/log"  # where a unit's output goes (/var/log/<unit>.log)


def unit_name(name):
    name = name.strip("'\"")
    if "/" in name:
        name = os.path.basename(name)
    return name if "." in name else f"{name}.service"


def unit_file(unit):
    for d in UNIT_DIRS:
        if os.path.exists(f"{d}/{unit}"):
            return f"{d}/{unit}"
    return None


def directives(unit):
    """(key, value) pairs of the unit file, continuation lines joined."""
    path = unit_file(unit)
    if not path:
        return []
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    return [
        (k.strip(), v.strip())
        for k, _, v in (line.partition("=") for line in text.splitlines())
        if v and not k.startswith(("#", ";", "["))
    ]


def exec_start(unit):
    for key, value in directives(unit):
        if key == "ExecStart":
            return shlex.split(value)
    return None


def environment(unit):
    env = {"PATH": PATH, "LANG": "C.UTF-8"}
    service = unit.rsplit(".", 1)[0]
    for key, value in directives(unit):
        if key != "EnvironmentFile":
            continue
        path = value.lstrip("-").replace("%N", service)
        with contextlib.suppress(OSError), open(path) as f:
            for line in f:
                name, sep, val = line.strip().partition("=")
                if sep and not name.startswith("#"):
                    env[name] = val.strip("'\"")
    return env


INSTALL_KEYS = ("WantedBy", "RequiredBy", "UpheldBy", "Alias", "Also", "DefaultInstance")


def file_state(unit, st):
    """The unit file's state as is-enabled says it: enabled, disabled, or static (no [Install] settings)."""
    if st["enabled"]:
        return "enabled"
    return "disabled" if any(k in INSTALL_KEYS for k, _ in directives(unit)) else "static"


def load(unit):
    try:
        with open(f"{STATE_DIR}/{unit}.json") as f:
            return json.load(f)
    except (OSError, ValueError):
        return {"enabled": False, "active": False, "pid": None}


def save(unit, st):
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(f"{STATE_DIR}/{unit}.json.tmp", "w") as f:
        json.dump(st, f)
    os.replace(f"{STATE_DIR}/{unit}.json.tmp", f"{STATE_DIR}/{unit}.json")


def alive(pid):
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def active(unit, st):
    return alive(st.get("pid")) if exec_start(unit) else bool(st.get("active"))


def stop(st):
    if alive(st.get("pid")):
        with contextlib.suppress(OSError):
            os.killpg(st["pid"], 15)
        for _ in range(50):
            if not alive(st["pid"]):
                break
            time.sleep(0.1)
    st.update(active=False, pid=None)


def start(unit, st):
    argv = exec_start(unit)
    if argv:
        os.makedirs(LOG_DIR, exist_ok=True)
        with open(f"{LOG_DIR}/{unit}.log", "a") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                env=environment(unit),
                cwd="/",
                start_new_session=True,
            )
        st.update(pid=proc.pid)
    st.update(active=True)


def systemctl(args):
    args = [
        a for a in args if a not in ("--no-block", "--system", "--force", "-l", "--no-pager", "-q", "--quiet")
    ]
    now = "--now" in args
    args = [a for a in args if a != "--now"]
    verb, names = (args[0], args[1:]) if args else ("", [])
    if verb in ("daemon-reload", "daemon-reexec", "reset-failed", ""):
        return 0
    if verb == "list-unit-files":
        for n in names:
            unit = unit_name(n.rstrip("*"))
            if unit_file(unit):
                print(f"{unit} {'enabled' if load(unit)['enabled'] else 'disabled'}")
        return 0
    if verb in ("is-active", "is-enabled"):
        return is_state(verb, [unit_name(n) for n in names])
    rc = 0
    for n in names:
        unit = unit_name(n)
        if verb != "show" and not unit_file(unit):
            # systemctl's start/stop/...: the manager's NoSuchUnit error, exit EXIT_NOTINSTALLED (5)
            print(f"Failed to {verb} {unit}: Unit {unit} not found.", file=sys.stderr)
            rc = 5
            continue
        st = load(unit)
        if verb == "show":
            loaded = unit_file(unit) is not None
            on = loaded and active(unit, st)
            print(
                f"Id={unit}\nNames={unit}\nLoadState={'loaded' if loaded else 'not-found'}\n"
                f"ActiveState={'active' if on else 'inactive'}\nSubState={'running' if on else 'dead'}\n"
                f"UnitFileState={file_state(unit, st) if loaded else ''}\nMainPID={st.get('pid') or 0}"
            )
        elif verb in ("enable", "disable"):
            st["enabled"] = verb == "enable"
            if now:
                stop(st)
                if verb == "enable":
                    start(unit, st)
        elif verb in ("start", "restart", "reload-or-restart", "try-restart"):
            if verb == "start" and active(unit, st):
                continue
            if verb == "try-restart" and not active(unit, st):
                continue
            stop(st)
            start(unit, st)
        elif verb == "stop":
            stop(st)
        else:
            print(f"systemctl stand-in: verb {verb} is not stood in", file=sys.stderr)
            return 1
        save(unit, st)
    return rc


def is_state(verb, units):
    """``is-active``/``is-enabled``: one state a line on stdout; 0 when any unit is active (enabled), else 4
    (LSB "status unknown") when no unit file exists, else 3 for is-active and 1 for is-enabled (systemd 253+:
    a unit that does not exist reads ``inactive`` or ``not-found``)."""
    good, found = False, False
    for unit in units:
        exists = unit_file(unit) is not None
        found = found or exists
        st = load(unit)
        if verb == "is-active":
            on = exists and active(unit, st)
            print("active" if on else "inactive")
        else:
            state = file_state(unit, st) if exists else "not-found"
            on = state in ("enabled", "static")
            print(state)
        good = good or on
    if good:
        return 0
    if not found:
        return 4
    return 3 if verb == "is-active" else 1


def main(argv):
    rc = systemctl(argv)
    with contextlib.suppress(OSError), open(LOG, "a") as f:
        f.write(json.dumps({"time": time.time(), "command": "systemctl", "argv": argv, "rc": rc}) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
