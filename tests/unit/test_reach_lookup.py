"""plugins/lookup/reach.py: whether a TCP port answers, from the controller, with real sockets."""

from __future__ import annotations

import socket
import threading
import time

from ansible.plugins.loader import lookup_loader
from ansible_runs import ROOT

# through Ansible's plugin loader, as a task's query() finds it (its options come from DOCUMENTATION)
lookup_loader.add_directory(str(ROOT / "plugins" / "lookup"))
reach = lookup_loader.get("reach")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_listening_port_answers_and_a_closed_one_does_not():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert reach.run(["127.0.0.1"], variables={}, port=port, timeout=1) == [True]
    closed = free_port()
    started = time.monotonic()
    assert reach.run(["127.0.0.1", "127.0.0.1"], variables={}, port=closed, timeout=0.6) == [
        False,
        False,
    ]
    # refused at once, then tried again until the timeout, as wait_for waits for a port to start
    assert 1.1 <= time.monotonic() - started < 3


def test_a_port_that_opens_within_the_timeout_answers():
    port = free_port()
    listener = socket.socket()

    def open_later():
        time.sleep(0.7)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    opener = threading.Thread(target=open_later)
    opener.start()
    try:
        assert reach.run(["127.0.0.1"], variables={}, port=port, timeout=3) == [True]
    finally:
        opener.join()
        listener.close()
