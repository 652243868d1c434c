#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Ansible module run_lock: the lab's one-run-at-a-time lock, a file on the Proxmox node."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: run_lock
short_description: Take or release the lab's run lock, a file on the first Proxmox node
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - One run at a time changes a lab. The lock is a JSON file on the lab's first Proxmox node, so every controller of
    the lab sees it, naming the run that holds it (O(holder)). It is kept on disk, not under C(/run), because the reboot
    that stage host may make in the middle of a run must not drop the running run's lock.
  - V(held) takes the lock when it is free or already this run's, or when it is held by O(replace) (a holder the
    action plugin found gone); otherwise it leaves the file alone and returns the holder in RV(holder) with
    RV(acquired=false). V(released) removes the file when this run holds it, and only then.
  - The check and the write happen under an exclusive C(flock) of the lock's directory, and the file is written
    whole to a temporary name and renamed, so two runs that start together cannot both take it and a reader never
    sees half a file.
  - The action plugin of the same name gives O(holder) (the controller's ansible-playbook PID, its start, the
    controller's host name), decides whether a holder is gone, and fails the run when another one holds the lock.
  - The lock is the run's own bookkeeping, taken at its start and released at its end, not part of the lab's state;
    the module never reports changed (a second run is still changed=0).
  - Runs on the managed host with the Python standard library only.
options:
  path:
    description: The lock file.
    type: path
    default: /var/lib/gpulab/run-lock.json
  state:
    description: V(held) takes the lock, V(released) gives it back.
    type: str
    choices: [held, released]
    default: held
  holder:
    description: This run, as the action plugin describes it (C(id), C(pid), C(controller), C(started), ...); the
      action plugin sets it.
    type: dict
  replace:
    description: With O(state=held), the C(id) of a holder that may be replaced (its run is gone); the action
      plugin sets it.
    type: str
  break_lock:
    description: Take the lock over from a holder on another controller, whose process this controller cannot
      see (the owner knows that run is gone). Read by the action plugin.
    type: bool
    default: false
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    description: Reads the lock and reports its holder; writes nothing.
"""

EXAMPLES = r"""
- name: Take the lab's run lock (the action plugin fills in the holder)
  gpulab.homelab.run_lock:
    state: held
"""

RETURN = r"""
acquired:
  description: Whether this run holds the lock now (in check mode, whether it could take it).
  returned: always
  type: bool
holder:
  description: The run that holds the lock (this one when RV(acquired)), or null when it is free.
  returned: always
  type: dict
replaced:
  description: The holder this run took the lock from (O(replace)), or null.
  returned: always
  type: dict
released:
  description: Whether O(state=released) removed the lock.
  returned: always
  type: bool
"""

import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def read_holder(path):
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return None
    except ValueError:
        return {"id": "unreadable", "note": f"{path} is not JSON"}
    return data if isinstance(data, dict) else {"id": "unreadable", "note": f"{path} is not an object"}


def write_holder(path, holder):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(holder, fh, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def decide(current, holder, replace, state):
    """What to do with the lock: (acquired, write, remove, replaced), a pure function of what is there."""
    mine = current is not None and current.get("id") == holder.get("id")
    if state == "released":
        return False, False, mine, None
    if current is None or mine:
        return True, not mine, False, None
    if replace and current.get("id") == replace:
        return True, True, False, current
    return False, False, False, None


ARGUMENT_SPEC = {
    "path": {"type": "path", "default": "/var/lib/gpulab/run-lock.json"},
    "state": {"type": "str", "choices": ["held", "released"], "default": "held"},
    "holder": {"type": "dict"},
    "replace": {"type": "str"},
    "break_lock": {"type": "bool", "default": False},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    path, holder = p["path"], p["holder"]
    if not holder or not holder.get("id"):
        module.fail_json(msg="run_lock: no holder; run it as a task (its action plugin says who the run is)")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        if module.check_mode:
            module.exit_json(changed=False, acquired=True, holder=holder, replaced=None, released=False)
        os.makedirs(directory, mode=0o755)
    guard = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        current = read_holder(path)
        acquired, write, remove, replaced = decide(current, holder, p["replace"], p["state"])
        if not module.check_mode:
            if write:
                write_holder(path, holder)
            if remove:
                os.unlink(path)
    finally:
        os.close(guard)
    module.exit_json(
        changed=False,
        acquired=acquired,
        holder=holder if acquired else (None if remove else current),
        replaced=replaced,
        released=remove,
    )


if __name__ == "__main__":
    main()
