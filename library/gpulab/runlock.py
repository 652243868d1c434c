"""One run at a time: who a run is, whether a run that holds the lab's lock is gone, and the refusal.

The lock itself is a file on the lab's first Proxmox node (plugins/modules/run_lock.py writes it under
flock, so every controller of the lab sees it); the action plugin of that name describes this run with
`this_run`, and when another run holds the lock asks `gone` whether that run still exists. A run is its
ansible-playbook process: the PID, the process's start (clock ticks since boot, /proc/PID/stat field 22, so a
PID the kernel gave to another process later does not count as the same run) and the controller's host name.
Only a holder on this controller can be found gone; one on another controller is taken as running, and the
message says how to break its lock when the owner knows it is gone.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
from typing import Any

LOCK_PATH = "/var/lib/gpulab/run-lock.json"


def _proc_start(pid: int) -> int | None:
    """The process's start in clock ticks since boot, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count fields after its ')'
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 of the whole line
    except (IndexError, ValueError):
        return None


def _started_iso(pstart: int | None) -> str:
    """The process's start as UTC ISO time, from the boot time (/proc/stat btime) and its start ticks."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        stamp = btime + (pstart or 0) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        stamp = dt.datetime.now(dt.UTC).timestamp()
    return dt.datetime.fromtimestamp(stamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def this_run(pid: int, inventory: str | None = None) -> dict[str, Any]:
    """The holder record of the run whose ansible-playbook process is `pid` (the action plugin's worker's
    parent)."""
    pstart = _proc_start(pid)
    controller = socket.gethostname()
    return {
        "id": f"{controller}/{pid}/{pstart}",
        "pid": pid,
        "pstart": pstart,
        "controller": controller,
        "user": getpass.getuser(),
        "started": _started_iso(pstart),
        "inventory": inventory or "",
    }


def gone(holder: dict[str, Any], controller: str | None = None) -> bool | None:
    """True when `holder`'s run no longer exists, False when it does, None when this controller cannot tell
    (the holder ran on another controller)."""
    if holder.get("id") == "unreadable":
        return True
    if holder.get("controller") != (controller or socket.gethostname()):
        return None
    try:
        pid = int(holder.get("pid"))
    except (TypeError, ValueError):
        return True
    start = _proc_start(pid)
    return start is None or (holder.get("pstart") is not None and start != holder.get("pstart"))


def describe(holder: dict[str, Any]) -> str:
    return (
        f"PID {holder.get('pid')} on controller {holder.get('controller')} (user {holder.get('user')}), "
        f"started {holder.get('started')}, inventory {holder.get('inventory') or '?'}"
    )


def refusal(holder: dict[str, Any], node: str, path: str = LOCK_PATH) -> str:
    """The message of a run that finds the lab's lock held by another run that may still be running."""
    where = "this controller" if gone(holder) is False else "another controller"
    text = (
        f"another gpulab run holds this lab's run lock ({path} on node {node}): {describe(holder)}. Two runs at "
        "once would fight over the same VMs and router table, so this run stops before any change. Wait for "
        f"that run to end (it runs on {where}), or stop it; a run that is gone is taken over on the next try"
    )
    if where == "another controller":
        text += (
            ". This controller cannot see that controller's processes: if you know that run is gone (its "
            "controller shut down or lost the lab), run again with -e gpulab_run_lock_break=true"
        )
    return text


def takeover(holder: dict[str, Any], node: str, forced: bool) -> str:
    why = "broken on request (gpulab_run_lock_break)" if forced else "its run is gone"
    return f"took over this lab's run lock on node {node} from {describe(holder)}: {why}"
