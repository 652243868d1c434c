"""Action plugin behind preflight: validates the whole lab definition on the controller, then
reaches the APIs the selected stages use. A run whose inventory has no hosts (a forgotten -i: ansible.cfg
names no default inventory) stops here with a message naming -i.

It reads the inventory's hostvars (only the lab definition's variables), and the names the inventory
itself sets for each host (not facts or extra vars: a misspelt variable is refused), and hands them to
gpulab.labdef, the same validation `gpulab plan` runs, so the messages are the same. The variables given with
-e are checked by name too (gpulab.labdef.check_extra_vars): they are read with ansible.utils.vars.load_extra_vars,
the public function Ansible's VariableManager itself builds the run's extra vars with (from the command line it
parsed, context.CLIARGS), so exactly what -e gave is seen, and nothing set by a play, vars_files or set_fact is
mistaken for it (hostvars mix all of those; no private attribute is read). When the definition
is valid it resolves each VM (gpulab.vmspec) and the router with every VM's reservation (gpulab.routerspec,
with the run's router_dhcp settings); and when a selected stage talks to the Proxmox VE API (vms, network,
verify), it reads GET /version
with the inventory's API settings (gpulab.reach): a refused token or a node that is down stops the run
before any stage has changed anything. With stage vms in the run it also reads each node's storages (one
GET /nodes/{node}/storage per node) and checks, from the controller, every file a node will download
(gpulab.downloads: the URL answers, the pinned checksum is the one its folder's SHA256SUMS lists; skipped
with gpulab_download_check: false). A run that logs in to the VMs without
stage vms (--tags k3s, ...) reads PVE's VM list once: a VM that does not exist yet, or is stopped (a GPU VM
stage vms held back while its node waits for a reboot), stops the run here, named with why and what brings it
up, rather than as an unreachable host later (gpulab.reach.absent_vm_problems).
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.vars import load_extra_vars
from ansible_collections.gpulab.homelab.plugins.modules.preflight import ARGUMENT_SPEC
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import inventory, labdef, reach, routerspec, vmspec
    from gpulab.pve import connection
    from gpulab.tasks import plain as _plain
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    inventory = labdef = reach = routerspec = vmspec = connection = _plain = MissingEngine(err)

# Where a sudo password can come from in the inventory (or the vault), besides -K.
BECOME_PASSWORD_VARS = (
    "ansible_become_password",
    "ansible_become_pass",
    "ansible_sudo_pass",
    "ansible_sudo_password",
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        hostvars = task_vars["hostvars"]
        groups = task_vars.get("groups", {})
        if not groups.get("all"):
            return self._no_inventory(result, task_vars)

        def hostvar(host, name):
            try:
                hv = hostvars[host]
                return _plain(hv.get(name))
            except AnsibleError:
                return None  # undefined, e.g. a vault variable nobody provided: "not set"

        # The run's inventory, read again from its sources (Ansible hands plugins no InventoryManager).
        sources = [str(s) for s in task_vars.get("ansible_inventory_sources") or []]
        run_inventory = inventory.of_run(self._loader, sources, task_vars.get("ansible_limit"))
        names = inventory.defined_names(run_inventory, self._loader, sources)
        definition, problems = labdef.check(groups, hostvar, names)
        problems = [*problems, *labdef.check_extra_vars(_plain(load_extra_vars(self._loader)), definition)]
        stages = reach.selected_stages(task_vars.get("ansible_run_tags"), task_vars.get("ansible_skip_tags"))
        args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)[1]
        if args["stages"] is not None:  # a stage playbook run alone: its own stages only
            stages &= set(args["stages"])
        if definition is not None and stages & reach.SUDO_STAGES:
            problems = [*problems, *self._sudo_problems(definition, hostvar)]
        result["changed"] = False
        result["problems"] = [str(p) for p in problems]
        result["reached"] = []
        if problems:
            result["failed"] = True
            result["msg"] = (
                f"The lab definition has {len(problems)} problem(s); nothing was changed:\n"
                + "\n".join(f"- {p}" for p in problems)
            )
            return result
        result["plan"] = labdef.plan_text(definition).splitlines()
        # Each VM resolved once (gpulab.vmspec): stage vms passes these specs through as they are.
        # ...and the stages this run selected, for the checks of playbooks/preflight.yml that depend on them.
        # Returned as results, not facts: playbooks/preflight.yml sets them as variables (facts used as plain
        # variables are deprecated, INJECT_FACTS_AS_VARS).
        result["vms"] = vmspec.resolve(definition)
        # ...and the router with each VM's reservation (gpulab.routerspec), read by dhcp_reservation's
        # action plugin: names of the router host's secret variables, never their values.
        result["router"] = routerspec.resolve(definition, lambda name: hostvar("localhost", name))
        # ...and the PVE connection of the modules of action group gpulab.homelab.pve without its secrets
        # (playbooks/vars/pve_api.yml adds them from the inventory when a task runs): each play's module_defaults.
        result["pve_api"] = connection.public_params(definition.globals)
        result["stages"] = sorted(stages)
        result["msg"] = "The lab definition is valid."
        if stages & reach.PVE_STAGES:
            reached, problem = reach.reach_pve(definition.globals)
            if problem is not None:
                result["problems"] = [str(problem)]
                result["failed"] = True
                result["msg"] = (
                    f"The lab definition is valid, but an API it needs is not; nothing was changed:\n- {problem}"
                )
                return result
            result["reached"] = [reached]
            result["msg"] = f"The lab definition is valid; reached the {reached}."
            found = reach.existing_vm_problems(definition.globals, definition.vms) if "vms" in stages else []
            if found:
                return self._refused(result, "the VMs that exist", found)
            # The storages stage vms writes to, and the files it will have a node download (from here, online).
            found = reach.node_problems(definition.globals, result["vms"]) if "vms" in stages else []
            if found:
                return self._refused(result, "the nodes' storages or the downloads", found)
        # A run without stage vms (--tags k3s, ...) that logs in to a VM PVE does not have, or has stopped (a GPU
        # VM held back for its node's reboot), would stop at it later as unreachable: say which and why here.
        limited = [h.name for h in run_inventory.get_hosts("all")]
        hosts = reach.login_hosts(stages, groups, limited)
        found = reach.absent_vms(definition.globals, definition, hosts, stages)
        if found:
            result["problems"] = [str(p) for p in found]
            result["failed"] = True
            result["msg"] = (
                "A VM this run logs in to is not there, and this run does not create or start VMs (stage vms); "
                "nothing was changed:\n" + "\n".join(f"- {p}" for p in found)
            )
        return result

    @staticmethod
    def _refused(result, what, found):
        result["problems"] = [str(p) for p in found]
        result["failed"] = True
        result["msg"] = f"The lab definition does not fit {what}; nothing was changed:\n" + "\n".join(
            f"- {p}" for p in found
        )
        return result

    def _sudo_problems(self, definition, hostvar):
        """A VM installed by hand from the ISO has the account the Ubuntu installer made, whose sudo asks for
        its password: the run needs one (-K, or an inventory/vault value) unless vm_sudo_nopasswd says it
        does not. Checked here, not in `gpulab plan`: only the run knows what -K gave."""
        if self._play_context.become_pass:
            return []
        out = []
        for host, vm in definition.vms.items():
            if vm.get("vm_os_install") != "iso" or vm.get("vm_sudo_nopasswd"):
                continue
            given = [hostvar(host, name) for name in BECOME_PASSWORD_VARS]
            if any(isinstance(v, str) and v and not v.startswith("__omit_place_holder__") for v in given):
                continue
            out.append(
                labdef.Problem(
                    host,
                    "ansible_become_password",
                    None,
                    f"{host} was installed by hand from the ISO, and the account the Ubuntu installer made asks "
                    "for its password at sudo (stages guests to workloads use sudo)",
                    "run with -K (--ask-become-pass), or put vault_vm_become_password in the vault "
                    "(group_vars/vms.yml hands it to sudo); if sudo on it needs no password, set "
                    "vm_sudo_nopasswd: true",
                )
            )
        return out

    @staticmethod
    def _no_inventory(result, task_vars):
        """A run without -i: ansible.cfg names no default inventory, so none (or an empty one) was parsed."""
        sources = ", ".join(str(s) for s in task_vars.get("ansible_inventory_sources") or []) or "none"
        result.update(changed=False, failed=True, problems=[], reached=[])
        result["msg"] = (
            f"No lab to run against: the inventory ({sources}) has no hosts, so nothing was run or changed. "
            "Name your lab's inventory with -i: `ansible-playbook -i inventory/mylab site.yml` "
            "(the simulated lab: `-i inventory/demo`), or make it the default for this shell with "
            "`export ANSIBLE_INVENTORY=$PWD/inventory/mylab`."
        )
        return result
