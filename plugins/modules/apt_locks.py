#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""Ansible module apt_locks: which process holds apt's and dpkg's locks, waited for until none does."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: apt_locks
short_description: Wait until no other process holds apt's and dpkg's locks, naming the one that does
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - On Ubuntu, C(apt-daily.service) (C(apt-get update)) and C(apt-daily-upgrade.service) (C(unattended-upgrade))
    run after a fresh boot and daily, and hold apt's and dpkg's locks for minutes (longer with a kernel update).
    An apt task that meets them waits only its C(lock_timeout) (60 s by default) and then fails with
    C(Could not get lock ... It is held by process N (unattended-upgr)).
  - This task waits until none of O(paths) is locked, looking again every O(interval) seconds for at most
    O(timeout) seconds. While it waits it prints, through Ansible's display, which process holds which lock (its
    PID and name, as apt names it) at once and then every O(progress_interval) seconds. When the time is up it
    fails naming the process that still holds a lock.
  - A lock is what apt's C(GetLock) (apt-pkg/contrib/fileutl.cc) and dpkg take, an C(fcntl) write lock
    (C(F_SETLK), C(F_WRLCK)) on the whole file; the holder is what C(fcntl(F_GETLK)) answers, its name the
    C(Name:) line of C(/proc/PID/status), as in apt's own message. The look opens each file read-only and takes
    no lock, so it never delays apt; a lock file that does not exist is free.
  - The module runs on the managed host with the Python standard library only and looks once; its action
    plugin of the same name, on the controller, looks again until the locks are free and prints the lines.
  - It reads only, and never reports changed. Reading the lock files needs root (C(become)).
options:
  timeout:
    description:
      - Seconds to wait at most for the locks to be free (the last look comes at this time). V(0) looks once and
        fails at once when a lock is held.
      - gpulab's roles give C(gpulab_apt_lock_timeout) here, and the same number to their apt tasks'
        C(lock_timeout).
    type: int
    default: 900
  interval:
    description: Seconds between two looks.
    type: int
    default: 5
  progress_interval:
    description: Seconds between two lines saying who holds the locks, while the wait goes on.
    type: int
    default: 10
  paths:
    description:
      - The lock files, each an C(fcntl) lock on the whole file. The default is what apt and dpkg take, namely
        dpkg's front-end lock and its database lock (C(debSystem::Lock), which every apt and dpkg run that
        changes packages takes, in this order), the package lists' lock (C(apt-get update)) and the package
        cache's lock (downloads).
    type: list
    elements: path
    default:
      - /var/lib/dpkg/lock-frontend
      - /var/lib/dpkg/lock
      - /var/lib/apt/lists/lock
      - /var/cache/apt/archives/lock
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    details: It only reads, so a check run looks and waits as a real one does (its apt tasks read apt's cache).
notes:
  - Removing a lock file does not free the lock (the holder keeps the lock on the file it opened) and may break
    the package database; let the holder finish.
"""

EXAMPLES = r"""
- name: Wait until Ubuntu's apt-daily and unattended-upgrades let go of apt's locks
  gpulab.homelab.apt_locks:
    timeout: 900
  register: apt_locks

- name: Install a package, waiting as long for a lock taken in between
  ansible.builtin.apt:
    name: qemu-guest-agent
    lock_timeout: "{{ apt_locks.timeout }}"
"""

RETURN = r"""
holders:
  description: The processes that held a lock at the last look, one entry per process (empty when all are free).
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Its PID, as C(fcntl(F_GETLK)) gives it (V(-1) for an open file description lock, which has none).
      type: int
    name:
      description: Its name as apt shows it (C(Name:) of C(/proc/PID/status), at most 15 characters), or empty.
      type: str
    cmdline:
      description: Its command line (C(/proc/PID/cmdline)), or empty.
      type: str
    paths:
      description: The lock files it holds.
      type: list
      elements: str
  sample: [{pid: 812, name: unattended-upgr, cmdline: /usr/bin/python3 /usr/bin/unattended-upgrade, paths: [/var/lib/dpkg/lock-frontend]}]
msg:
  description: Who holds which lock (or that none is held), in one sentence; on a timeout, also what to do.
  returned: always
  type: str
  sample: "/var/lib/dpkg/lock-frontend is held by process 812 (unattended-upgr)"
timeout:
  description: The O(timeout) the task waited with (what an apt task after it gives as its C(lock_timeout)).
  returned: always
  type: int
waited:
  description: Seconds from the first look to the end of the wait (action plugin).
  returned: always
  type: float
looks:
  description: How many times it looked (action plugin).
  returned: always
  type: int
timed_out:
  description: Whether the time ran out with a lock still held (action plugin).
  returned: always
  type: bool
"""

import errno  # noqa: E402
import fcntl  # noqa: E402
import os  # noqa: E402
import struct  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

DEFAULT_PATHS = [
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/lock",
    "/var/lib/apt/lists/lock",
    "/var/cache/apt/archives/lock",
]

# struct flock on 64-bit Linux (amd64, arm64): short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid, with the C padding (32 bytes)
_FLOCK = "hhqqi4x"


def lock_holder(path):
    """The PID that holds an fcntl lock on `path` that would keep apt's write lock out, or None when there is
    none (or the file does not exist). -1 for an open file description lock (it has no PID)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise
    try:
        # F_GETLK with the lock apt asks for (F_WRLCK over the whole file): the kernel answers F_UNLCK when it
        # could be taken, else the first conflicting lock with its owner's PID
        query = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        answer = struct.unpack(_FLOCK, fcntl.fcntl(fd, fcntl.F_GETLK, query))
    finally:
        os.close(fd)
    return None if answer[0] == fcntl.F_UNLCK else answer[4]


def process_name(pid, proc="/proc"):
    """What apt calls the process: the `Name:` line of /proc/PID/status ('' when it is gone)."""
    try:
        with open(f"{proc}/{pid}/status", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("Name:"):
                    return line[5:].strip()
    except OSError:
        pass
    return ""


def process_cmdline(pid, proc="/proc"):
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def holders(paths, proc="/proc"):
    """One entry per process that holds a lock on one of `paths`: pid, name, cmdline and the paths it holds,
    in the order of `paths`."""
    found = {}
    for path in paths:
        pid = lock_holder(path)
        if pid is None:
            continue
        if pid not in found:
            named = pid > 0
            found[pid] = {
                "pid": pid,
                "name": process_name(pid, proc) if named else "",
                "cmdline": process_cmdline(pid, proc) if named else "",
                "paths": [],
            }
        found[pid]["paths"].append(path)
    return list(found.values())


def who(holder):
    """`process 812 (unattended-upgr)`, as apt's `Could not get lock` message names a holder."""
    if holder["pid"] < 0:
        return "an open file description lock (no process ID)"
    return f"process {holder['pid']} ({holder['name']})" if holder["name"] else f"process {holder['pid']}"


def describe(found):
    """One sentence: which lock each holder holds, or that all are free."""
    if not found:
        return "apt's and dpkg's locks are free"
    parts = []
    for holder in found:
        paths = holder["paths"]
        held = paths[0] if len(paths) == 1 else ", ".join(paths[:-1]) + " and " + paths[-1]
        verb = "is" if len(paths) == 1 else "are"
        parts.append(f"{held} {verb} held by {who(holder)}")
    return "; ".join(parts)


ARGUMENT_SPEC = {
    "timeout": {"type": "int", "default": 900},
    "interval": {"type": "int", "default": 5},
    "progress_interval": {"type": "int", "default": 10},
    "paths": {"type": "list", "elements": "path", "default": list(DEFAULT_PATHS)},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    try:
        found = holders(p["paths"])
    except OSError as exc:
        module.fail_json(
            msg=f"cannot read the lock file {exc.filename}: {exc.strerror} (reading apt's locks needs root: "
            "run the task with become)",
            holders=[],
            timeout=p["timeout"],
        )
    module.exit_json(changed=False, holders=found, msg=describe(found), timeout=p["timeout"])


if __name__ == "__main__":
    main()
