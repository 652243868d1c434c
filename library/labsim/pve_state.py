"""The lab's persistent state: one JSON file in the state directory, written atomically.

Writes are debounced: `mark()` flags a change and a background thread writes within `FLUSH_S`;
`flush()` writes at once (the server calls it on shutdown), so a restart finds what the API returned.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

STATE_FILE = "pve-state.json"
FLUSH_S = 0.1


class State:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / STATE_FILE
        self.lock = threading.RLock()
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="state-flusher", daemon=True)
        self._thread.start()

    def mark(self) -> None:
        self._dirty.set()

    def flush(self) -> None:
        with self.lock:
            self._dirty.clear()
            text = json.dumps(self.data, sort_keys=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.path)

    def _flusher(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(0.5) and not self._stop.is_set():
                self._stop.wait(FLUSH_S)
                self.flush()

    def close(self) -> None:
        self._stop.set()
        self._dirty.set()
        self._thread.join(2)
        self.flush()
