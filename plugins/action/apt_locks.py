"""Action plugin apt_locks: waits until no process holds apt's and dpkg's locks on the host, saying which
process holds them while it waits (plugins/modules/apt_locks.py documents it).

The module looks once on the host (fcntl F_GETLK on each lock file, the holder's name from /proc); this part
looks again every `interval` seconds until every lock is free, at most `timeout` seconds (gpulab.waiting.poll,
as wait). A first look that finds a lock held prints at once which process holds it and how long the task
waits; then one line every `progress_interval` seconds names the holder of that moment. When the time is up the
task fails naming the process that still holds a lock and what to do. A wait that is over at its first look costs
one look and prints nothing.
"""

from __future__ import annotations

from ansible_collections.gpulab.homelab.plugins.plugin_utils.waiting_action import (
    ActionModule as WaitingAction,
)
from ansible_collections.gpulab.homelab.plugins.plugin_utils.waiting_action import waiting


def gave_up(host: str, last: dict, waited: float, timeout: int) -> str:
    """The failure when the time is up: who still holds what, why that is likely, and what to do."""
    return (
        f"apt's locks on {host} are still held after {waiting.seconds(waited)} (timeout {waiting.seconds(timeout)}): "
        f"{last.get('msg', '')}. On Ubuntu that is apt-daily or unattended-upgrades at work (after a boot, and "
        f"daily), which can take many minutes (a kernel update). Let it finish (on {host}: systemctl status "
        "apt-daily.service apt-daily-upgrade.service; tail -f /var/log/unattended-upgrades/unattended-upgrades.log) "
        "and run again, or wait longer: raise gpulab_apt_lock_timeout. Do not remove the lock files: that does not "
        "free the lock and can break the package database."
    )


class ActionModule(WaitingAction):
    MODULE = "gpulab.homelab.apt_locks"

    def wait(self, args: dict, task_vars: dict, host: str) -> dict:
        timeout, interval, paths = args["timeout"], args["interval"], args["paths"]
        last: dict = {}
        progress = self.progress(
            host,
            "apt's locks",
            timeout,
            args["progress_interval"],
            line=lambda elapsed: (
                f"waiting for apt's locks: {last.get('msg', '')}: "
                f"{waiting.seconds(elapsed)} of {waiting.seconds(timeout)}"
            ),
        )

        # Each line names the holder a look found: none before a look has found one. A first look slower than
        # progress_interval (a loaded host, a slow SSH login) would otherwise print a line with no holder in it,
        # and a wait that is over at its first look would print one.
        say = progress.emit
        progress.emit = lambda text: say(text) if last.get("holders") else None

        def look() -> dict:
            res = self._execute_module(
                module_name=self.MODULE, module_args={"paths": paths}, task_vars=task_vars
            )
            first = not last
            last.clear()
            last.update(res)
            if first and res.get("holders") and not res.get("failed"):
                say(
                    f"{res.get('msg')}; waiting up to {waiting.seconds(timeout)} for it to let go "
                    "(Ubuntu's apt-daily and unattended-upgrades run after a boot, and daily)"
                )
            return res

        outcome = waiting.poll(
            look,
            lambda res: not res.get("holders"),
            progress,
            interval=interval,
            stop=lambda res: bool(res.get("failed")),
        )
        out = dict(outcome.result)
        out.update(
            changed=False,
            timeout=timeout,
            waited=round(outcome.waited, 1),
            looks=outcome.looks,
            timed_out=outcome.timed_out,
        )
        if outcome.timed_out:
            out.update(failed=True, msg=gave_up(host, out, outcome.waited, timeout))
        elif out.get("holders") == [] and outcome.looks > 1:
            out["msg"] = f"apt's locks are free (waited {waiting.seconds(outcome.waited)})"
        return out
