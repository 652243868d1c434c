"""Action plugin behind run_lock: the module keeps the lock file on the node; this part, on the
controller, says who this run is, finds out whether a run that holds the lock is gone (gpulab.runlock), and
refuses the run, with the holder's PID, controller and start, when it is not.

The run is the ansible-playbook process, the parent of the worker this plugin runs in. A holder that is gone
(its process ended, on this controller) is replaced with a warning that names it; one on another controller is
replaced only with `break_lock` (-e gpulab_run_lock_break=true). In check mode nothing is written and a held
lock is only a warning.
"""

from __future__ import annotations

import os

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import runlock
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    runlock = MissingEngine(err)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("state", "path", "break_lock"))

    def _lock(self, task_vars, **args):
        return self._execute_module(
            module_name="gpulab.homelab.run_lock", module_args=args, task_vars=task_vars
        )

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        state = args.get("state", "held")
        path = args.get("path") or runlock.LOCK_PATH
        node = task_vars.get("inventory_hostname", "?")
        me = runlock.this_run(os.getppid(), task_vars.get("inventory_dir"))
        first = self._lock(task_vars, path=path, state=state, holder=me)
        if first.get("failed"):
            return {**result, **first}
        result.update(changed=False, acquired=first.get("acquired"), holder=first.get("holder"), path=path)
        if state == "released":
            result["released"] = first.get("released", False)
            result["msg"] = "released the run lock" if result["released"] else "this run held no run lock"
            return result
        if first.get("acquired"):
            result["msg"] = (
                f"this run holds the lab's run lock ({path} on node {node}): {runlock.describe(me)}"
            )
            return result
        holder = first.get("holder") or {}
        forced = boolean(args.get("break_lock", False), strict=False)
        if runlock.gone(holder) or forced:
            if self._task.check_mode:
                result.update(
                    acquired=True, msg=runlock.takeover(holder, node, forced) + " (check mode: not written)"
                )
                return result
            second = self._lock(task_vars, path=path, state="held", holder=me, replace=holder.get("id"))
            if second.get("failed"):
                return {**result, **second}
            if second.get("acquired"):
                msg = runlock.takeover(holder, node, forced)
                result.update(acquired=True, holder=me, replaced=holder, msg=msg, warnings=[msg])
                return result
            holder = second.get("holder") or {}  # another run took it meanwhile
        msg = runlock.refusal(holder, node, path)
        if self._task.check_mode:
            result.update(msg=msg, warnings=[msg + " (check mode writes nothing, so it goes on)"])
            return result
        result.update(failed=True, msg=msg)
        return result
