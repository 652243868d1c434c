"""Long waits that say how far they have got: the engine of plugins/action/wait.py and of the
image download's progress (plugins/action/pve_download.py).

A `Progress` prints one line every `every` seconds of a wait ("waiting for <what>: 40 s of 600 s"), never
at its start: a wait that is over at its first look prints nothing. While a blocking call runs (a reboot,
`cloud-init status --wait`, a kubectl wait), `Progress.watching()` keeps the lines coming from a thread.
`poll()` looks, and looks again every `interval` seconds, until a condition holds or `timeout` would pass.
The clock, the sleep and where the lines go are parameters, so that tests run waits on a fake clock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


def seconds(value: float) -> str:
    """Whole seconds as a wait line shows them."""
    return f"{int(value)} s"


# What ssh prints when the host's key does not match known_hosts, or is not there with host key checking on:
# no retry cures either, so a wait for a host to answer stops at once with the fix.
HOST_KEY_FAILURES = ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED")


# What ssh prints when the ControlPath (Ansible's control_path_dir plus a hash, and ssh's own 17-character
# suffix while it makes the socket) does not fit a Unix socket's 107 bytes: ssh gives up before it connects.
CONTROL_PATH_TOO_LONG = "too long for Unix domain socket"


def host_key_problem(host: str, address: str, message: str) -> str | None:
    """The message for a connection failure that waiting cannot cure (the host's SSH key, an SSH control
    socket path that is too long), or None."""
    if CONTROL_PATH_TOO_LONG in message:
        return (
            f"ssh cannot make its control socket for {host} ({address}): its path is too long for a Unix socket "
            f"({message.strip().splitlines()[-1]}); waiting does not cure that. Fix: give Ansible a shorter "
            "folder for it (ansible_control_path_dir, or ANSIBLE_SSH_CONTROL_PATH_DIR=/tmp/ansible-cp), then "
            "run again."
        )
    if not any(f in message for f in HOST_KEY_FAILURES):
        return None
    changed = "REMOTE HOST IDENTIFICATION HAS CHANGED" in message
    why = (
        "its SSH host key differs from the one known_hosts holds for it (a VM made again at the same address "
        "has new keys)"
        if changed
        else "its SSH host key is not in known_hosts, and host key checking is on"
    )
    fix = (
        f"ssh-keygen -R {address}, then ssh-keyscan -H {address} >> ~/.ssh/known_hosts"
        if changed
        else f"ssh-keyscan -H {address} >> ~/.ssh/known_hosts (compare its fingerprint with the VM's console)"
    )
    return f"{host} ({address}) answers, but {why}; waiting does not cure that. Fix: {fix}, then run again."


class Progress:
    """Lines at a steady pace: at `every`, 2 x `every`, ... seconds after the start (none at the start)."""

    def __init__(
        self,
        what: str,
        timeout: float,
        *,
        every: float = 10.0,
        emit: Callable[[str], None] = print,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        line: Callable[[float], str] | None = None,
    ):
        self.what = what
        self.timeout = timeout
        self.every = max(float(every), 0.1)
        self.emit = emit
        self.clock = clock
        self._sleep = sleep
        self._line = line
        self.start = clock()
        self.next_due = self.every
        self.lines = 0
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def line(self, elapsed: float) -> str:
        if self._line is not None:
            return self._line(elapsed)
        return f"waiting for {self.what}: {seconds(elapsed)} of {seconds(self.timeout)}"

    def tick(self) -> None:
        """Print the line that is due, if one is (at most one per call, even after a long block)."""
        with self._lock:
            elapsed = self.elapsed()
            if elapsed < self.next_due:
                return
            self.next_due = (elapsed // self.every + 1) * self.every
            if elapsed > self.timeout:
                return  # a last look that overruns the timeout: its result says how it ended
            self.lines += 1
            text = self.line(elapsed)
        self.emit(text)

    def sleep(self, duration: float) -> None:
        """Sleep `duration` seconds, printing each line that falls due before its end (one due at the end
        comes after the look that follows, so that it can tell what that look found)."""
        end = self.clock() + duration
        while True:
            now = self.clock()
            due = self.start + self.next_due
            if due >= end:
                self._sleep(max(0.0, end - now))
                return
            self._sleep(max(0.0, due - now))
            self.tick()

    @contextlib.contextmanager
    def watching(self, period: float = 1.0) -> Iterator[None]:
        """Keep printing the due lines from a thread while the body blocks (a call that waits itself)."""
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(min(period, self.every / 4)):
                self.tick()

        thread = threading.Thread(target=run, name=f"progress: {self.what}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(1.0)


@dataclass
class Outcome:
    result: Any
    met: bool  # the condition held at the last look
    looks: int
    waited: float  # seconds from the first look to the end
    timed_out: bool  # gave up because the next look would have come after the timeout


def poll(
    look: Callable[[], Any],
    met: Callable[[Any], bool],
    progress: Progress,
    *,
    interval: float,
    stop: Callable[[Any], bool] | None = None,
) -> Outcome:
    """Look at once; while `met(result)` is false, look again at `interval`, 2 x `interval`, ... seconds
    from the start (a look that overran skips its slot), the last look at `progress.timeout` (as
    until/retries/delay with timeout // interval retries; at least two looks, even when the first outlasts
    the timeout). `stop(result)` true ends the wait at once
    without the condition (a result that cannot change by waiting, such as a skipped task). A line that
    falls due during a look, or with it, is printed after it, with what it found."""
    interval = max(float(interval), 0.001)
    looks = 0
    while True:
        began = progress.elapsed()
        with progress.watching():
            result = look()
        looks += 1
        if met(result):
            return Outcome(result, True, looks, progress.elapsed(), False)
        progress.tick()
        if stop is not None and stop(result):
            return Outcome(result, False, looks, progress.elapsed(), False)
        elapsed = progress.elapsed()
        if began >= progress.timeout:
            return Outcome(result, False, looks, elapsed, True)
        # the next slot, or the timeout itself for the last look (at once when a slow look passed it)
        slot = (elapsed // interval + 1) * interval
        progress.sleep(max(0.0, min(slot, progress.timeout) - elapsed))
