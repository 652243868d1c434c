"""Action plugin behind gpulab_preflight: validates the whole lab definition on the controller.

It reads the inventory's hostvars (only the lab definition's variables) and hands them to
gpulab.labdef, the same validation `gpulab plan` runs, so the messages are the same.
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from gpulab import labdef


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset()

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        hostvars = task_vars["hostvars"]
        groups = task_vars.get("groups", {})

        def hostvar(host, name):
            try:
                hv = hostvars[host]
                return hv.get(name)
            except AnsibleError:
                return None  # undefined, e.g. a vault variable nobody provided: "not set"

        lab, problems = labdef.check(groups, hostvar)
        result["changed"] = False
        result["problems"] = [str(p) for p in problems]
        if problems:
            result["failed"] = True
            result["msg"] = (
                f"The lab definition has {len(problems)} problem(s); nothing was changed:\n"
                + "\n".join(f"- {p}" for p in problems)
            )
        else:
            result["plan"] = labdef.plan_text(lab).splitlines()
            result["msg"] = "The lab definition is valid."
        return result
