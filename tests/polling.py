"""Waiting in tests for what another process does: `wait_until(predicate)`.

Imported by name from every tests folder (pyproject's pytest pythonpath holds tests/).
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, every: float = 0.1) -> bool:
    """True as soon as predicate() is (looked at every `every` seconds), False once `timeout` seconds passed.
    A loaded machine may take seconds for what an idle one does at once: the timeout is a bound, not a wait."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True
