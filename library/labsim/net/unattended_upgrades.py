#!/usr/bin/python3
"""Stand-in for Ubuntu's unattended-upgrades run after a boot: holds apt's and dpkg's locks for a while.

Installed into every lab VM as ``/usr/bin/unattended-upgrade`` (this file, run by its ``#!`` line, so the
process's name is ``unattended-upgr``, the script's name cut to 15 characters, as the real Python script's is)
and started at each boot (systemd: ``apt-daily-upgrade.service``; without systemd: a one-shot service of the
host's PID 1). A fresh Ubuntu guest runs apt-daily (``apt-get update``) and apt-daily-upgrade
(``unattended-upgrade``) soon after boot, and both hold apt's locks for minutes; the lab's Debian image has
neither, so without this stand-in nothing in the lab would ever meet a held lock.

What it does, as upstream does (library/labsim/UPSTREAM.md, "apt locks"):

* takes each lock as apt's ``GetLock`` does: ``open(O_RDWR|O_CREAT|O_NOFOLLOW, 0640)``, close-on-exec, then
  ``fcntl(F_SETLK)`` with an ``F_WRLCK`` over the whole file: the package lists' lock (as apt-daily's
  ``apt-get update``), then dpkg's front-end lock and its database lock (``apt_pkg.pkgsystem_lock()``, as
  unattended-upgrade's ``run()``). One process holds all three here; upstream the lists' lock is apt-get's,
  in the service before. apt's own ``Could not get lock`` message then names this process;
* when another process holds one of them (an apt run that came first), it gives up as unattended-upgrade does:
  ``Lock could not be acquired (another package manager running?)`` in its log, exit 1;
* holds them for ``hold_s`` seconds (``/etc/gpulab-sim/unattended-upgrades.json``, written by the lab from the
  fixture's ``network.guest_apt_hold_s``; ``--gpulab-hold SECONDS`` overrides it), then lets go and exits 0.
  It upgrades nothing.

Its log is unattended-upgrade's, ``/var/log/unattended-upgrades/unattended-upgrades.log``.
``GPULAB_STANDIN_ROOT`` puts every path under another folder (tests run it on this machine that way).
Standard library only.
"""

import fcntl
import json
import os
import struct
import sys
import time

CONFIG = "/etc/gpulab-sim/unattended-upgrades.json"
LOG = "/var/log/unattended-upgrades/unattended-upgrades.log"
DEFAULT_HOLD_S = 25.0
#: in the order they are taken: apt-daily's update, then unattended-upgrade's pkgsystem_lock()
LOCKS = ("/var/lib/apt/lists/lock", "/var/lib/dpkg/lock-frontend", "/var/lib/dpkg/lock")


def host(path):
    """`path` of the lab host, under ``GPULAB_STANDIN_ROOT`` when that is set."""
    return os.environ.get("GPULAB_STANDIN_ROOT", "") + path


def log(message, level="INFO"):
    path = host(LOG)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    with open(path, "a") as f:
        f.write(f"{stamp},{int(time.time() * 1000) % 1000:03d} {level} {message}\n")


def hold_seconds(argv):
    if "--gpulab-hold" in argv[:-1]:
        return float(argv[argv.index("--gpulab-hold") + 1])
    try:
        with open(host(CONFIG)) as f:
            return float(json.load(f).get("hold_s", DEFAULT_HOLD_S))
    except (OSError, ValueError):
        return DEFAULT_HOLD_S


def get_lock(path):
    """apt's GetLock: the file's descriptor holding a write lock on all of it, or None when another holds it.

    A lock file it has to make (the lab image's empty lists folder has none, where a published Ubuntu image has
    the one its build's apt-get update left) leaves its folder's times as they were: Ansible's apt module takes
    the lists folder's mtime for the time of the last update (cache_valid_time), and this run fetched nothing."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    before = os.stat(folder)
    made = not os.path.lexists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    if made:
        os.utime(folder, ns=(before.st_atime_ns, before.st_mtime_ns))
    try:
        fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except OSError:
        os.close(fd)
        return None
    return fd


def main(argv):
    hold = hold_seconds(argv)
    log("Starting unattended upgrades script")
    held = []
    for path in LOCKS:
        fd = get_lock(host(path))
        if fd is None:
            for other in held:
                os.close(other)
            log("Lock could not be acquired (another package manager running?)", "ERROR")
            print("Cache lock can not be acquired, exiting")
            return 1
        held.append(fd)
    time.sleep(max(0.0, hold))
    for fd in held:
        os.close(fd)
    log("No packages found that can be upgraded unattended and no pending auto-removals")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
