"""Fault injection for the simulated PVE API, driven by ``STATE/faults.json``.

Keys (all optional):

- ``fail_next``: the next N API requests fail; ``fail_status`` is an HTTP status (default 500) or
  ``"reset"`` (the connection is closed without an answer); ``fail_match`` limits the failures to requests
  whose ``"METHOD /path"`` matches this regex; ``fail_message`` is the error text.
- ``delay_s``: every API answer is held back this many seconds; ``delay_next`` limits the delay to the next
  N requests (absent: all of them, until the key is removed).
- ``task_error_next``: the next N tasks end in error with ``task_error_message``.

Write the file with `inject()` (or PUT the same JSON object to ``/_lab/faults`` as root@pam); the server
counts the faults down and writes the remaining counts back.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

FAULTS_FILE = "faults.json"


def inject(state_dir: str | Path, **faults: Any) -> dict[str, Any]:
    """Merge `faults` into the state dir's faults file (a value of None removes a key); return the result."""
    path = Path(state_dir) / FAULTS_FILE
    current = json.loads(path.read_text()) if path.exists() else {}
    for k, v in faults.items():
        if v is None:
            current.pop(k, None)
        else:
            current[k] = v
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(current))
    os.replace(tmp, path)
    return current


def clear(state_dir: str | Path) -> None:
    (Path(state_dir) / FAULTS_FILE).unlink(missing_ok=True)


class Faults:
    """The server side: reads the file when it changes and counts faults down."""

    def __init__(self, state_dir: str | Path):
        self.path = Path(state_dir) / FAULTS_FILE
        self.lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self.current: dict[str, Any] = {}

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self.current = None, {}
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                self.current = json.loads(self.path.read_text() or "{}")
            except (OSError, ValueError):
                self.current = {}
            self._stamp = stamp

    def _write_back(self) -> None:
        tmp = self.path.with_suffix(".srv.tmp")
        tmp.write_text(json.dumps(self.current))
        os.replace(tmp, self.path)
        st = self.path.stat()
        self._stamp = (st.st_mtime_ns, st.st_size)

    def replace(self, faults: dict[str, Any]) -> None:
        with self.lock:
            self.current = dict(faults)
            self._write_back()

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            self._refresh()
            return dict(self.current)

    def for_request(self, method: str, path: str) -> tuple[float, Any]:
        """(delay seconds, failure) for this request; failure is None, an HTTP status, or "reset"."""
        with self.lock:
            self._refresh()
            f = self.current
            if not f:
                return 0.0, None
            changed = False
            delay = 0.0
            if f.get("delay_s"):
                if "delay_next" not in f:
                    delay = float(f["delay_s"])
                elif int(f["delay_next"]) > 0:
                    delay = float(f["delay_s"])
                    f["delay_next"] = int(f["delay_next"]) - 1
                    changed = True
            failure = None
            if int(f.get("fail_next", 0)) > 0:
                match = f.get("fail_match")
                if not match or re.search(match, f"{method} {path}"):
                    f["fail_next"] = int(f["fail_next"]) - 1
                    failure = f.get("fail_status", 500)
                    changed = True
            if changed:
                self._write_back()
            return delay, failure

    def message(self) -> str:
        return str(self.current.get("fail_message", "injected failure (gpulab lab fault injection)"))

    def next_task_error(self) -> str | None:
        with self.lock:
            self._refresh()
            if int(self.current.get("task_error_next", 0)) > 0:
                self.current["task_error_next"] = int(self.current["task_error_next"]) - 1
                self._write_back()
                return str(self.current.get("task_error_message", "injected task failure"))
            return None
