"""The lab definition: every inventory variable gpulab reads, and the one validation of it.

The inventory (groups ``proxmox``, ``router``, ``vms``, ``k3s_server``, ``k3s_agent`` and their
variables) is read into plain dicts, one per host, and checked here. ``gpulab plan`` and the preflight
play (stage 0 of site.yml) both call :func:`check`, so the same mistake gets the same message whichever
runs it. Nothing here knows about Ansible; callers hand in ``groups``, a way to read a host's variables
and the names the inventory sets for each host.

- ``catalogue``: the variables (:data:`CATALOGUE`), their formats, and the roles' declared options;
- ``problems``: :class:`Problem` and the list the checks add to (below every check, so none imports another);
- ``definition``: :class:`LabDefinition` as read from the inventory;
- ``rules``: the table of single-value rules;
- ``checks``, ``vm_checks`` and ``node_checks``: everything that ties values together (``node_checks``: one
  node to the others), and the inventory's own names;
- ``plan``: :func:`plan_text`.

Every message names the host, the field, the value, why it is wrong and how to fix it.
"""

from gpulab.labdef.catalogue import BY_NAME, CATALOGUE, GROUPS, Var, known_names, role_options
from gpulab.labdef.checks import check, check_extra_vars, validate
from gpulab.labdef.definition import LabDefinition, gpu_ids, load, pinned_mib
from gpulab.labdef.plan import plan_text
from gpulab.labdef.problems import LabDefinitionError, Problem

__all__ = [
    "BY_NAME",
    "CATALOGUE",
    "GROUPS",
    "LabDefinition",
    "LabDefinitionError",
    "Problem",
    "Var",
    "check",
    "check_extra_vars",
    "gpu_ids",
    "known_names",
    "load",
    "pinned_mib",
    "plan_text",
    "role_options",
    "validate",
]
