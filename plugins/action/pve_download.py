"""pve_download, and a task that waits for the download (wait=true, the default) says how far it has got.

Such a task is one task: the module starts the download (wait=false) and, when PVE started a task, the
plugin looks at it every poll_interval seconds (the module with upid: GET status and log) and prints a line
each time through Ansible's display, "pve: downloading local:iso/x.iso: 1.2 GiB of 3.0 GiB (40%) at 104 MiB/s,
30 s of 3600 s", the bytes, total and rate read from the task log (the lines of PVE's wget, gpulab.pve.download
.transfer_of), until the task ends or timeout passes. A file that is already there (or check mode) ends at the
first call, with no line and no further request. The result is the start's (changed, present_before, diff)
with the end's state (done, transferred, progress, bytes, total, rate, log, msg).

A task with upid, wait=false or async runs the module once, as before.
"""

from __future__ import annotations

from ansible.module_utils.common.validation import check_type_bool, check_type_int
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import waiting
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    waiting = MissingEngine(err)

display = Display()


def size(value: float | None) -> str:
    """Bytes in a binary unit, as the progress lines show them."""
    if value is None:
        return "?"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def progress_line(volid: str, state: dict, elapsed: float, timeout: float) -> str:
    """One progress line from the last look at the download task."""
    done, total, rate = state.get("bytes"), state.get("total"), state.get("rate")
    waited = f"{waiting.seconds(elapsed)} of {waiting.seconds(timeout)}"
    if not done and total is None:
        return f"downloading {volid}: started, nothing logged yet, {waited}"
    part = f"{size(done)} of {size(total)}"
    if total:
        part += f" ({100 * (done or 0) // total}%)"
    if rate:
        part += f" at {size(rate)}/s"
    return f"downloading {volid}: {part}, {waited}"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = True

    # a test runs the plugin on a fake clock
    clock = None
    sleep = None

    def run(self, tmp=None, task_vars=None):
        args = self._task.args
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        wrap_async = self._task.async_val
        if args.get("upid") or not check_type_bool(args.get("wait", True)) or wrap_async:
            result.update(self._execute_module(task_vars=task_vars, wrap_async=wrap_async))
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        # the task's arguments, the play's module_defaults in them (the connection, group/gpulab.homelab.pve)
        base = dict(args)
        timeout = check_type_int(args.get("timeout", 3600))
        interval = check_type_int(args.get("poll_interval", 5))
        started = self._once({**base, "wait": False}, task_vars)
        upid = started.get("upid")
        if started.get("failed") or not upid:
            result.update(started)
            return result

        host = task_vars.get("inventory_hostname", "")
        volid = started.get("volid", "")
        last: dict = {}
        extra = {k: v for k, v in {"clock": self.clock, "sleep": self.sleep}.items() if v is not None}
        progress = waiting.Progress(
            f"the download of {volid}",
            timeout,
            every=interval,
            emit=lambda text: display.display(f"{host}: {text}"),
            line=lambda elapsed: progress_line(volid, last, elapsed, timeout),
            **extra,
        )

        def look():
            state = self._once({**base, "wait": False, "upid": upid}, task_vars)
            last.clear()
            last.update(state)
            return state

        outcome = waiting.poll(
            look,
            lambda s: bool(s.get("done")),
            progress,
            interval=interval,
            stop=lambda s: bool(s.get("failed")),
        )
        end = outcome.result
        result.update(started)
        result.update(
            {k: v for k, v in end.items() if k not in ("changed", "diff", "present_before", "volid")}
        )
        result["waited"] = round(outcome.waited, 1)
        if end.get("failed"):
            result["changed"] = False  # PVE kept nothing of a download that failed
        elif outcome.timed_out:
            result["failed"] = True
            result["msg"] = (
                f"gave up waiting for the download of {volid} after {waiting.seconds(outcome.waited)} (timeout "
                f"{waiting.seconds(timeout)}; {progress_line(volid, end, outcome.waited, timeout).split(': ', 1)[1]}). "
                f"PVE goes on downloading (task {upid}, in the node's task list): run again later, or raise the "
                "timeout (pve_vms_download_timeout in the role pve_vms)"
            )
        else:
            took = f"{size(end.get('bytes'))} in {waiting.seconds(outcome.waited)}"
            verdict = "downloaded and verified" if end.get("transferred") else "was already correct"
            result["msg"] = f"{volid} {verdict} ({took})"
            if progress.lines:
                display.display(f"{host}: downloaded {volid}: {took}")
        return result

    def _once(self, args, task_vars):
        """The module once, with `args` (the task's, its module_defaults included)."""
        out = self._execute_module(module_args=args, task_vars=task_vars)
        self._remove_tmp_path(self._connection._shell.tmpdir)
        return out
