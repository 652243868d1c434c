"""Action plugin wait: runs a module (or an action such as ansible.builtin.reboot) and says, at a
steady pace, what it waits for and how long it has waited (plugins/modules/wait.py documents it).

With `until`, the module runs again every `interval` seconds until every condition holds, as a task's own
`until`/`retries`/`delay` would, but without a "FAILED - RETRYING" line per look: one line every
`progress_interval` seconds, "<host>: waiting for <what>: 40 s of 600 s", printed through Ansible's display
(so every stdout callback shows it, between the task's header and its result). The conditions see the
module's result under the task's `register` name, as `until` does. A look that is the last one (the
condition holds, or the module was skipped) ends the wait at once: a wait that is already over costs one
look, no sleep and no line. Without `until` the module runs once (it waits itself) and the lines come from
a thread while it blocks.

With `retry_unreachable`, a host that does not answer (SSH refused, no route, timed out) is tried again for
that many seconds, the lines saying so, before the task ends unreachable.

The result is the module's last result, with `waited` (seconds), `looks` and `timed_out`; a wait that
timed out fails with a message that names what it waited for and for how long (a task's failed_when still
has the last word, as for any module).
"""

from __future__ import annotations

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.template import Templar
from ansible_collections.gpulab.homelab.plugins.plugin_utils.waiting_action import (
    ActionModule as WaitingAction,
)
from ansible_collections.gpulab.homelab.plugins.plugin_utils.waiting_action import waiting


class ActionModule(WaitingAction):
    MODULE = "gpulab.homelab.wait"

    def wait(self, args: dict, task_vars: dict, host: str) -> dict:
        what, timeout, interval = args["what"], args["timeout"], args["interval"]
        every, retry_unreachable, until = args["progress_interval"], args["retry_unreachable"], args["until"]
        module, module_args = args["module"], dict(args["module_args"])
        # register is a name, or (ansible-core 2.21) a mapping of names to what each takes of the result
        register = self._task.register or {}
        names = list(register) if isinstance(register, dict) else [register]
        progress = self.progress(host, what, timeout, every)

        def gave_up(msg):
            return (
                f"{host} did not answer while waiting for {what} ({waiting.seconds(progress.elapsed())}; tried for "
                f"{waiting.seconds(retry_unreachable)}): {msg}"
            )

        def look():
            try:
                return self._run_module(module, module_args, task_vars)
            except AnsibleConnectionFailure as exc:
                address = self._address(task_vars, host)
                problem = waiting.host_key_problem(host, address, str(exc))
                if problem is not None:
                    raise AnsibleConnectionFailure(problem) from exc
                if progress.elapsed() >= retry_unreachable:
                    raise AnsibleConnectionFailure(gave_up(str(exc))) from exc
                return {"unreachable": True, "msg": str(exc)}

        def met(res):
            if res.get("unreachable") or not until:
                return not res.get("unreachable")
            variables = {**task_vars, **dict.fromkeys(names or ["result"], res)}
            templar = Templar(loader=self._loader, variables=variables)
            return all(c if isinstance(c, bool) else templar.evaluate_conditional(c) for c in until)

        def stop(res):
            return bool(res.get("skipped"))

        outcome = waiting.poll(look, met, progress, interval=interval, stop=stop)
        out = dict(outcome.result)
        if out.get("unreachable"):
            out["msg"] = gave_up(out.get("msg", ""))
        elif outcome.timed_out and until:
            out["failed"] = True
            out["msg"] = (
                f"gave up waiting for {what} after {waiting.seconds(outcome.waited)} "
                f"(timeout {waiting.seconds(timeout)}, {outcome.looks} looks, one every {waiting.seconds(interval)})"
            )
        out.update(waited=round(outcome.waited, 1), looks=outcome.looks, timed_out=outcome.timed_out)
        return out

    def _address(self, task_vars, host):
        """The address the connection was given: its templated ansible_host (a VM's is `{{ vm_address }}`)."""
        try:
            address = self._connection.get_option("host")
        except (AttributeError, KeyError, AnsibleError):
            address = None
        if not address or "{{" in str(address):
            address = self._templar.template(task_vars.get("ansible_host") or host)
        return str(address or host)

    def _run_module(self, module, module_args, task_vars):
        """One run of `module` with `module_args`, through its action plugin when it has one."""
        task = self._task.copy(exclude_parent=False)
        task.args = dict(module_args)
        task.action = module
        loader = self._shared_loader_obj.action_loader
        handler_name = module if loader.has_plugin(module, collection_list=self._task.collections) else None
        handler = loader.get(
            handler_name or "ansible.legacy.normal",
            task=task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        try:
            return dict(handler.run(task_vars=task_vars))
        finally:
            handler.cleanup()
