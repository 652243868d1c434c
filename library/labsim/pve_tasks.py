"""PVE worker tasks: UPIDs in PVE's exact format, a log, and running -> stopped with an exit status
(`TaskManager`, which the rooms that start tasks use), and the tasks room of the PVE API simulator
(`TaskHandlers`, ``/nodes/{node}/tasks/...``)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from labsim.pve_common import ApiError

UPID_RE = re.compile(
    r"^UPID:(?P<node>[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?):(?P<pid>[0-9A-Fa-f]{8}):(?P<pstart>[0-9A-Fa-f]{8,9}):"
    r"(?P<starttime>[0-9A-Fa-f]{8}):(?P<type>[^:\s]+):(?P<id>[^:\s]*):(?P<user>[^:\s]+):$"
)
KEEP_TASKS = 1000


class TaskFailed(Exception):
    """Raised by a task body: the task ends with this text as its exit status ("TASK ERROR: <text>")."""


def parse_upid(upid: str) -> dict[str, Any] | None:
    m = UPID_RE.match(upid)
    if not m:
        return None
    d = m.groupdict()
    return {
        "node": d["node"],
        "pid": int(d["pid"], 16),
        "pstart": int(d["pstart"], 16),
        "starttime": int(d["starttime"], 16),
        "type": d["type"],
        "id": d["id"],
        "user": d["user"],
    }


class Task:
    """One worker task; `log()` appends a line; the record is what the state file keeps."""

    def __init__(self, record: dict[str, Any], on_change: Callable[[], None]):
        self.record = record
        self._on_change = on_change

    @property
    def upid(self) -> str:
        return self.record["upid"]

    def log(self, line: str) -> None:
        self.record["log"].append(line)
        self._on_change()


class TaskManager:
    """Creates tasks, runs their bodies in threads, and keeps their records in the lab state."""

    def __init__(self, store: dict[str, Any], lock: threading.RLock, save: Callable[[], None]):
        self.store = store  # upid -> record (part of the persisted state)
        self.lock = lock
        self.save = save
        self._pid = 0x10000 + (os.getpid() % 0x10000) * 16
        self._pstart = int(time.monotonic() * 100) % 0xFFFFFFFF
        self.error_hook: Callable[[], str | None] | None = None  # fault injection: next task fails
        self.threads: list[threading.Thread] = []
        for record in self.store.values():
            if record["status"] == "running":
                # The server stopped while this task ran: PVE reports such tasks this way.
                record.update(status="stopped", exitstatus="unexpected status", endtime=int(time.time()))

    def start(
        self,
        node: str,
        kind: str,
        ident: str,
        user: str,
        body: Callable[[Task], None],
        on_error: Callable[[Task, str], None] | None = None,
    ) -> str:
        """Start `body` in a thread and return the UPID at once."""
        with self.lock:
            self._pid += 1
            now = int(time.time())
            upid = f"UPID:{node}:{self._pid:08X}:{self._pstart:08X}:{now:08X}:{kind}:{ident}:{user}:"
            record = {
                "upid": upid,
                "node": node,
                "pid": self._pid,
                "pstart": self._pstart,
                "starttime": now,
                "type": kind,
                "id": ident,
                "user": user,
                "status": "running",
                "log": [],
            }
            self.store[upid] = record
            self._trim()
            self.save()
        task = Task(record, self.save)
        thread = threading.Thread(target=self._run, args=(task, body, on_error), name=upid, daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()]
        self.threads.append(thread)
        thread.start()
        return upid

    def _run(self, task: Task, body: Callable[[Task], None], on_error) -> None:
        try:
            body(task)
            injected = self.error_hook() if self.error_hook else None
            if injected:
                raise TaskFailed(injected)
        except TaskFailed as exc:
            self._finish(task, str(exc), on_error)
        except Exception as exc:  # a simulator bug must still end the task, visibly
            self._finish(task, f"internal simulator error: {exc!r}", on_error)
        else:
            self._finish(task, None, None)

    def _finish(self, task: Task, error: str | None, on_error) -> None:
        with self.lock:
            if error is not None and on_error is not None:
                on_error(task, error)
            if error is None:
                task.record["log"].append("TASK OK")
                task.record["exitstatus"] = "OK"
            else:
                task.record["log"].append(f"TASK ERROR: {error}")
                task.record["exitstatus"] = error
            task.record["status"] = "stopped"
            task.record["endtime"] = int(time.time())
            self.save()

    def _trim(self) -> None:
        if len(self.store) > KEEP_TASKS:
            for upid in sorted(self.store, key=lambda u: self.store[u]["starttime"])[
                : len(self.store) - KEEP_TASKS
            ]:
                if self.store[upid]["status"] != "running":
                    del self.store[upid]

    def join(self, timeout: float = 5.0) -> None:
        """Wait for running task threads (used at shutdown and by tests)."""
        deadline = time.monotonic() + timeout
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))


class TaskHandlers:
    """The task endpoints (``/nodes/{node}/tasks/...``): a node knows only its own tasks, and someone else's
    needs Sys.Audit on the node. Mixed into labsim.pve_api.PveApiSim; it uses the sim's ``state``."""

    state: Any

    def _task(self, args, who) -> dict:
        if parse_upid(args["upid"]) is None:
            raise ApiError(400, "unable to parse worker upid")
        rec = self.state.data["tasks"].get(args["upid"])
        if rec is None or rec["node"] != args["node"]:  # a node knows only its own tasks
            raise ApiError(500, "no such task")
        if rec["user"] != who.userid and not who.has(f"/nodes/{args['node']}", ["Sys.Audit"]):
            raise ApiError(403, f"Permission check failed (/nodes/{args['node']}, Sys.Audit)")
        return rec

    def h_get_nodes_node_tasks_upid_status(self, args, who):
        rec = self._task(args, who)
        out = {
            k: rec[k] for k in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user", "status")
        }
        if rec["status"] == "stopped":
            out["exitstatus"] = rec["exitstatus"]
        return out

    def h_get_nodes_node_tasks_upid_log(self, args, who):
        rec = self._task(args, who)
        lines = list(rec["log"])
        start, limit = int(args.get("start", 0)), int(args.get("limit", 50))
        window = lines[start : start + limit] if limit else lines[start:]
        return [{"n": start + i + 1, "t": t} for i, t in enumerate(window)], {"total": len(lines)}

    def h_get_nodes_node_tasks_upid(self, args, who):
        self._task(args, who)
        return [{"name": "log"}, {"name": "status"}]

    def h_delete_nodes_node_tasks_upid(self, args, who):
        rec = self._task(args, who)
        if rec["status"] == "running":
            raise ApiError(500, "stopping a running simulated task is not supported")
        return None

    def h_get_nodes_node_tasks(self, args, who):
        out = []
        for rec in sorted(self.state.data["tasks"].values(), key=lambda r: -r["starttime"]):
            if rec["node"] != args["node"]:
                continue
            if rec["user"] != who.userid and not who.has(f"/nodes/{args['node']}", ["Sys.Audit"]):
                continue
            if "vmid" in args and rec["id"] != str(args["vmid"]):
                continue
            if "typefilter" in args and rec["type"] != args["typefilter"]:
                continue
            if args.get("source") == "active" and rec["status"] != "running":
                continue
            if args.get("errors") and rec.get("exitstatus") in (None, "OK"):
                continue
            item = {k: rec[k] for k in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user")}
            if rec["status"] == "stopped":
                item["status"] = rec["exitstatus"]
                item["endtime"] = rec.get("endtime", rec["starttime"])
            out.append(item)
        start, limit = int(args.get("start", 0)), int(args.get("limit", 50))
        return out[start : start + limit], {"total": len(out)}
