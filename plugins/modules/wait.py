#!/usr/bin/python
"""Documentation of the wait action (the work is done in plugins/action)."""

DOCUMENTATION = r"""
---
module: wait
short_description: Run a module until a condition holds, saying what it waits for and for how long
description:
  - Runs O(module) with O(module_args) on the task's host, through its action plugin when it has one (so
    V(ansible.builtin.reboot) and V(ansible.builtin.shell) work as in a task of their own).
  - With O(until), runs it again every O(interval) seconds until every condition holds, the last look at
    O(timeout), as a task's own C(until), C(retries) and C(delay) would, but without a C(FAILED - RETRYING)
    line per look. The conditions see the module's result under the task's C(register) name.
  - Without O(until), runs it once (a module that waits itself, such as V(ansible.builtin.wait_for) or
    V(ansible.builtin.reboot)).
  - Every O(progress_interval) seconds of the wait it prints, through Ansible's display, a line
    C(<host>) C(waiting for <what>) C(<n> s of <timeout> s), also while a look blocks. A wait that is over
    at its first look prints nothing and does not sleep.
  - A skipped result (such as a command module in check mode) ends the wait at once.
  - Returns the module's last result with RV(waited), RV(looks) and RV(timed_out). A wait with O(until)
    that times out fails with a message naming O(what) and how long it waited; the task's C(failed_when)
    and C(changed_when) still have the last word.
options:
  what:
    description: What the wait is for, as the progress lines and the timeout message name it.
    type: str
    required: true
  timeout:
    description: Seconds to wait at most (the last look comes at this time).
    type: int
    required: true
  interval:
    description: Seconds between the starts of two looks (with O(until), or O(retry_unreachable)).
    type: int
    default: 5
  progress_interval:
    description: Seconds between two progress lines.
    type: int
    default: 10
  module:
    description: The module (or action) to run, such as V(ansible.builtin.command).
    type: str
    required: true
  module_args:
    description: Its options.
    type: dict
    default: {}
  until:
    description: Conditions (as in a task's C(until)) that must all hold for the wait to end.
    type: list
    elements: raw
    default: []
  retry_unreachable:
    description:
      - Seconds during which a host that does not answer (SSH refused, no route, timed out) is tried again
        every O(interval) seconds, the lines saying so; after that the task ends unreachable. V(0) tries once.
      - A host whose SSH host key known_hosts lacks or holds another key for ends unreachable at once, with the
        C(ssh-keyscan) (or C(ssh-keygen -R)) fix, since no retry cures that.
    type: int
    default: 0
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    details: The module runs as the task's check mode says (a read with C(check_mode=false) runs); a skipped result ends the wait.
  diff_mode:
    support: none
    details: The result is the waited-for module's; a diff it returns is passed on as it is.
author: gpulab contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Wait until every node is registered and Ready
  gpulab.homelab.wait:
    what: every k3s node Ready
    timeout: 600
    interval: 5
    module: ansible.builtin.command
    module_args:
      cmd: k3s kubectl get nodes -o json
    until:
      - nodes.rc == 0
      - (nodes.stdout | from_json)['items'] | length == 3
  register: nodes
  changed_when: false
  failed_when: false

- name: Reboot the node, saying how long it has been gone
  gpulab.homelab.wait:
    what: the node to come back after its reboot
    timeout: 600
    module: ansible.builtin.reboot
    module_args:
      reboot_timeout: 600
"""

RETURN = r"""
waited:
  description: Seconds from the first look to the end of the wait.
  returned: always
  type: float
looks:
  description: How many times the module ran.
  returned: always
  type: int
timed_out:
  description: Whether the wait gave up at its timeout with a condition of O(until) still false.
  returned: always
  type: bool
"""

# The options, which the action plugin validates with (plugins/action/wait.py).
ARGUMENT_SPEC = {
    "what": {"type": "str", "required": True},
    "timeout": {"type": "int", "required": True},
    "interval": {"type": "int", "default": 5},
    "progress_interval": {"type": "int", "default": 10},
    "module": {"type": "str", "required": True},
    "module_args": {"type": "dict", "default": {}},
    "until": {"type": "list", "elements": "raw", "default": []},
    "retry_unreachable": {"type": "int", "default": 0},
}
