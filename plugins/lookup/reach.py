"""Lookup reach: whether a TCP port answers, tried from the controller itself.

The same question as `ansible.builtin.wait_for` with `host`/`port` delegated to localhost, asked without
running a module: that task forks a local Python and ships a module to it (about 0.3 s on two cores);
this opens the socket in the worker that templates the task.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: reach
short_description: Whether a TCP port answers, tried from the controller
description:
  - For each host given, whether a TCP connection to I(port) opens within I(timeout) seconds, tried again
    every half second while it is refused or unreachable (as M(ansible.builtin.wait_for) waits for a port
    to start). Runs on the controller, whatever host the task is for.
  - Used by playbooks/k3s_speaker.yml to tell a k3s server whose VM is stopped from one that answers,
    before anything logs in to it.
options:
  _terms:
    description: The host names or addresses to reach.
    required: true
    type: list
    elements: str
  port:
    description: The TCP port.
    type: int
    default: 22
  timeout:
    description: Seconds to keep trying one host before it counts as not answering.
    type: float
    default: 5
"""

EXAMPLES = r"""
- name: Whether the server's SSH port answers
  ansible.builtin.set_fact:
    server_answers: "{{ query('gpulab.homelab.reach', ansible_host, port=22, timeout=5) | first }}"
"""

RETURN = r"""
_raw:
  description: One boolean per host, in the order given, true where the port answered.
  type: list
  elements: bool
"""

import socket  # noqa: E402
import time  # noqa: E402

from ansible.plugins.lookup import LookupBase  # noqa: E402

RETRY_S = 0.5


def reaches(host: str, port: int, timeout: float) -> bool:
    """Whether a TCP connection to host:port opens before `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(left, 0.1)):
                return True
        except OSError:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(RETRY_S, left))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        port, timeout = int(self.get_option("port")), float(self.get_option("timeout"))
        return [reaches(str(host), port, timeout) for host in terms]
