"""gpulab.waiting on a fake clock: progress lines at a steady pace, a wait that is over at its first look
returns at once, a timeout gives up before the next look would pass it."""

from __future__ import annotations

import pytest

from gpulab import waiting


class FakeClock:
    def __init__(self):
        self.now = 1000.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.slept.append(seconds)
        self.now += seconds


def progress(clock, lines, what="every k3s node Ready", timeout=60, every=10):
    return waiting.Progress(what, timeout, every=every, emit=lines.append, clock=clock, sleep=clock.sleep)


def test_a_wait_that_is_over_at_its_first_look_neither_sleeps_nor_prints():
    clock, lines, looks = FakeClock(), [], []
    out = waiting.poll(
        lambda: looks.append(1) or "ready", lambda r: r == "ready", progress(clock, lines), interval=5
    )
    assert out.met and not out.timed_out and out.looks == 1 and out.waited == 0
    assert looks == [1] and clock.slept == [] and lines == []


def test_lines_come_every_progress_interval_whatever_the_look_interval():
    clock, lines = FakeClock(), []
    answers = iter([False] * 7 + [True])

    def look():
        clock.now += 0.5  # each look takes half a second
        return next(answers)

    out = waiting.poll(look, bool, progress(clock, lines, every=10), interval=4)
    assert out.met and out.looks == 8
    # looks of 0.5 s at 0, 4, 8, ... 28 s; one line at 10 s (during a pause), one at 20 s (after the look then)
    assert out.waited == pytest.approx(28.5)
    assert lines == [
        "waiting for every k3s node Ready: 10 s of 60 s",
        "waiting for every k3s node Ready: 20 s of 60 s",
    ]


def test_a_look_interval_longer_than_the_progress_interval_still_prints_at_a_steady_pace():
    clock, lines = FakeClock(), []
    answers = iter([False, False, True])
    out = waiting.poll(
        lambda: next(answers), bool, progress(clock, lines, every=10, timeout=100), interval=25
    )
    assert out.met and out.looks == 3 and out.waited == pytest.approx(50.0)
    # looks at 0, 25 and 50 s; the one at 50 s ends the wait, so no line then
    assert [line.rsplit(": ", 1)[1] for line in lines] == [f"{n} s of 100 s" for n in (10, 20, 30, 40)]


def test_timeout_gives_up_when_the_next_look_would_come_after_it():
    clock, lines = FakeClock(), []
    seen = []
    out = waiting.poll(
        lambda: seen.append(clock.now) or "NotReady",
        lambda r: r == "Ready",
        progress(clock, lines, timeout=30),
        interval=10,
    )
    assert not out.met and out.timed_out and out.result == "NotReady"
    # as until/retries/delay did (timeout // interval retries after the first look): a fifth look would
    # come at 40 s, after the timeout
    assert [t - 1000.0 for t in seen] == [0, 10, 20, 30]
    assert out.waited == pytest.approx(30.0)
    assert lines == [f"waiting for every k3s node Ready: {n} s of 30 s" for n in (10, 20, 30)]


def test_a_result_that_cannot_change_ends_the_wait_at_once():
    clock, lines = FakeClock(), []
    out = waiting.poll(
        lambda: {"skipped": True},
        lambda r: False,
        progress(clock, lines),
        interval=5,
        stop=lambda r: r["skipped"],
    )
    assert not out.met and not out.timed_out and out.looks == 1 and clock.slept == []


def test_a_blocking_call_gets_its_lines_from_the_watching_thread():
    """A real clock: the call blocks 0.35 s; with a line due every 0.1 s, the thread prints about three."""
    lines = []
    p = waiting.Progress("the node to reboot", 2, every=0.1, emit=lines.append)
    import time

    with p.watching(period=0.02):
        time.sleep(0.35)
    assert 2 <= len(lines) <= 4, lines
    assert all(
        line.startswith("waiting for the node to reboot: ") and line.endswith(" of 2 s") for line in lines
    )


def test_own_line_text():
    clock, lines = FakeClock(), []
    p = waiting.Progress(
        "x", 60, every=5, emit=lines.append, clock=clock, sleep=clock.sleep, line=lambda e: f"at {e:.0f}"
    )
    p.sleep(12)
    assert lines == ["at 5", "at 10"]
    p.tick()
    assert lines == ["at 5", "at 10"]  # no line before it is due


def test_no_line_says_more_than_the_timeout_while_a_last_look_overruns_it():
    clock, lines = FakeClock(), []
    p = progress(clock, lines, timeout=20, every=10)
    for _ in range(4):
        clock.now += 10
        p.tick()
    assert lines == [
        "waiting for every k3s node Ready: 10 s of 20 s",
        "waiting for every k3s node Ready: 20 s of 20 s",
    ]


def test_a_first_look_that_outlasts_the_timeout_still_gets_a_second():
    clock, lines = FakeClock(), []
    seen = []

    def look():
        seen.append(clock.now - 1000.0)
        clock.now += 1.5
        return False

    out = waiting.poll(look, bool, progress(clock, lines, timeout=1), interval=1)
    assert out.timed_out and out.looks == 2 and seen == [0.0, 1.5]


def test_a_control_socket_path_too_long_stops_the_wait_at_once_naming_the_fix():
    # what OpenSSH 9.2 prints (after the connection) when Ansible's control_path_dir is too deep
    message = (
        'Failed to connect to the host via ssh: unix_listener: path "/tmp/pytest-of-root/pytest-0/popen-gw1/'
        'test_guest_base_fails_naming_u0/.ansible/cp/d3874a4287.kn7YUYocNqaw2dRx" too long for Unix domain socket'
    )
    problem = waiting.host_key_problem("vm1", "10.0.0.7", message)
    assert problem is not None
    assert problem.startswith("ssh cannot make its control socket for vm1 (10.0.0.7)")
    assert "ansible_control_path_dir" in problem and "waiting does not cure that" in problem
    assert (
        waiting.host_key_problem("vm1", "10.0.0.7", "ssh: connect to host 10.0.0.7 port 22: No route") is None
    )
