"""Action plugin behind gpulab_preflight: validates the whole lab definition on the controller.

It reads the inventory's hostvars (only the lab definition's variables) and hands them to
gpulab.labdef, the same validation `gpulab plan` runs, so the messages are the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

from gpulab import labdef


def _plain(value):
    """The value with Ansible's tagged str/int/float/list/dict types made plain (messages name types)."""
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


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
                return _plain(hv.get(name))
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
