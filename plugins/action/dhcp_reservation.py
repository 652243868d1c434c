"""dhcp_reservation with the router preflight resolved (fact `gpulab_router`, gpulab.routerspec).

The module runs in the task's worker on the controller (plugins/plugin_utils/controller.py). A task that
names no `kind` gets the router from the fact `gpulab_router`: kind, address, subnet, pool, user, url,
validate_certs, options and, for an SSH router, ssh, each as the spec has it unless the task sets it. Its
secrets are read here, when the module runs, from the router host's variables the spec names
(`secrets`: router_password, and ansible_password for an SSH router): the fact holds no secret, and the
module's no_log hides them in its result. A task that gives no `reservations` gets the spec's, joined with
what stage vms recorded on each VM host (gpulab_vm_mac, gpulab_vm_address; gpulab.routerspec.reservations)
and the MAC stage network read on each Proxmox node (gpulab_node_lan_mac), the VMs of group gpulab_new_vms
left out. So roles/router_dhcp passes only what the run does (state,
keep_free, known_only).

Without the fact (playbooks/network.yml run on its own, without preflight) the inventory's router is
resolved here with the same function, gpulab.routerspec.resolve, from the lab definition's variables and
the run's router_dhcp settings.
"""

from __future__ import annotations

from ansible.errors import AnsibleError, AnsibleUndefinedVariable, AnsibleValueOmittedError
from ansible.module_utils.common.validation import check_type_bool
from ansible_collections.gpulab.homelab.plugins.plugin_utils.controller import (
    ActionModule as ControllerAction,
)
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import labdef, routerspec
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    labdef = routerspec = MissingEngine(err)

ROUTER = ("kind", "address", "subnet", "pool", "user", "url", "validate_certs", "options")


def _get(hostvars, host, name):
    """A host's variable, templated; one that is undefined or omitted reads as unset."""
    try:
        return hostvars[host].get(name)
    except (AnsibleUndefinedVariable, AnsibleValueOmittedError, AnsibleError):
        return None


class ActionModule(ControllerAction):
    def module_args(self, task_vars):
        args = dict(self._task.args)
        if args.get("kind") is not None and args.get("reservations"):
            return args  # the task describes its router and reservations itself
        hostvars = task_vars["hostvars"]
        try:
            spec = self._spec(task_vars)
            if args.get("kind") is None:
                for key in ROUTER:
                    if args.get(key) is None and spec.get(key) is not None:
                        args[key] = spec[key]
                if spec.get("ssh") is not None:
                    args["ssh"] = {**spec["ssh"], **(args.get("ssh") or {})}
                for option, var in spec["secrets"].items():
                    value = _get(hostvars, spec["host"], var)
                    if value and option == "password":
                        args.setdefault("password", value)
                    elif value and "ssh" in args:
                        args["ssh"].setdefault("password", value)
            if not args.get("reservations"):
                facts = {
                    r["host"]: {
                        "mac": _get(hostvars, r["host"], routerspec.MAC_FACT[r.get("machine", "vm")]),
                        "address": _get(hostvars, r["host"], "gpulab_vm_address"),
                    }
                    for r in spec["reservations"]
                }
                new = task_vars.get("groups", {}).get("gpulab_new_vms", [])
                known_only = check_type_bool(args.get("known_only", False))
                args["reservations"] = routerspec.reservations(spec, facts, new, known_only)
        except routerspec.RouterSpecError as e:
            raise AnsibleError(str(e)) from None
        return args

    def _spec(self, task_vars):
        """The fact gpulab_router, or (preflight did not run) the inventory's router resolved here."""
        spec = task_vars.get("gpulab_router")
        if spec:
            return self._templar.template(spec)
        hostvars = task_vars["hostvars"]
        groups = {g: task_vars.get("groups", {}).get(g, []) for g in labdef.GROUPS}
        definition = labdef.load(groups, lambda host, name: _get(hostvars, host, name), lambda _host: ())
        return routerspec.resolve(definition, lambda name: self._setting(task_vars, name))

    def _setting(self, task_vars, name):
        try:
            return self._templar.template(task_vars.get(name))
        except (AnsibleUndefinedVariable, AnsibleValueOmittedError):
            return None
