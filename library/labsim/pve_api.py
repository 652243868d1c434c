"""The simulated Proxmox VE node(s): `PveApiSim`, one object made of the API's rooms.

`PveApiSim.call(method, path, params, principal)` runs one API call after the server has authenticated it:
schema validation, the schema's permission check, then the endpoint's handler, `h_<method>_<path template>`,
which one of the rooms mixed in here holds (each a module of its own, with its own tests):

- labsim.pve_qemu (QemuHandlers): ``/nodes/{node}/qemu/...``, the VMs;
- labsim.pve_nodes (NodeHandlers): ``/version``, ``/nodes``, node status, ``hardware/pci``, the cluster lists;
- labsim.pve_storage (StorageHandlers): storages, volumes, download-url;
- labsim.pve_mapping (MappingHandlers): ``/cluster/mapping/pci``;
- labsim.pve_tasks (TaskHandlers): ``/nodes/{node}/tasks/...``;
- labsim.pve_access (AccessHandlers): ``/access/...`` and the certificate info.

Their behaviour is copied from PVE as described in shared/pve-api/NOTES.md (locks, digest, pending changes,
the root@pam rule for raw PCI devices, download-url checksum semantics, UPID tasks that run for a while).
Errors are `ApiError` (labsim.pve_common, which every room imports; none imports another room or this module).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labsim.internet import Internet
from labsim.pve_access import AccessHandlers
from labsim.pve_auth import PermissionDenied, Principal
from labsim.pve_common import ApiError
from labsim.pve_mapping import MappingHandlers
from labsim.pve_nodes import NodeHandlers
from labsim.pve_qemu import AwaitTask, QemuHandlers
from labsim.pve_schema import ParamError, Schema
from labsim.pve_state import State
from labsim.pve_storage import StorageHandlers
from labsim.pve_tasks import TaskHandlers, TaskManager
from labsim.vm_hooks import VmHooks

# Handlers that wait for something else (a guest's agent) take the state lock themselves.
_UNLOCKED_HANDLERS = {
    "h_get_nodes_node_qemu_vmid_agent_network_get_interfaces",
    "h_get_nodes_node_qemu_vmid_agent_file_read",
}


class PveApiSim(QemuHandlers, NodeHandlers, StorageHandlers, MappingHandlers, TaskHandlers, AccessHandlers):
    """All simulated nodes, their VMs, storages, PCI devices, mappings and tasks."""

    def __init__(
        self,
        state_dir: Path,
        fixture: dict[str, Any],
        schema: Schema,
        hooks: VmHooks | None = None,
        on_destroyed: Callable[[int], None] | None = None,
    ):
        """``hooks``: what happens inside a VM (labsim.vm_hooks; the network lab's run real hosts);
        ``on_destroyed(vmid)``: called once a destroy task has removed the VM (the server forgets a seeded
        guest's installation with it, labsim.seed.forget_installation)."""
        self.state_dir = Path(state_dir)
        self.fixture = fixture
        self.schema = schema
        self.hooks = hooks or VmHooks(fixture)
        self.on_destroyed = on_destroyed or (lambda vmid: None)
        self.state = State(self.state_dir)
        self.lock = self.state.lock
        d = self.state.data
        d.setdefault("vms", {})
        d.setdefault("volumes", {})  # "node/storage" -> list of volume records
        d.setdefault("mappings", {})
        d.setdefault("tasks", {})
        self.nodes = {n["name"]: n for n in fixture["nodes"]}
        # a state written before volumes were kept per node ("storage" keys) was a one-node lab's
        first = fixture["nodes"][0]["name"]
        for key in [k for k in d["volumes"] if "/" not in k]:
            d["volumes"].setdefault(f"{first}/{key}", []).extend(d["volumes"].pop(key))
        self.tasks = TaskManager(d["tasks"], self.lock, self.state.mark)
        self.timings = fixture["timings"]
        self.downloads = {e["url"]: e for e in fixture.get("downloads", [])}
        # what download-url fetches: the fixture's downloads as the lab's internet has them now (labsim.internet)
        self.internet = Internet(self.state_dir, fixture.get("downloads", []))

    def call(self, method: str, path: str, params: dict[str, Any], who: Principal | None) -> tuple[Any, dict]:
        """Run one call; return (data, extra envelope keys)."""
        found = self.schema.route(path)
        if found is None:
            raise ApiError(501, f"Method '{method} /{path.lstrip('/')}' not implemented")
        template, path_params = found
        info = self.schema.method(template, method)
        if info is None:
            raise ApiError(501, f"Method '{method} {path}' not implemented")
        merged = {**params, **path_params}
        try:
            args = self.schema.validate(info, merged)
        except ParamError as exc:
            raise ApiError(400, "Parameter verification failed.", exc.errors) from exc
        if who is not None and not info.get("allowtoken", 1) and who.via == "token":
            raise ApiError(401, "API tokens are not allowed for this call")
        if who is not None:
            self._check_permissions(info.get("permissions") or {}, args, who)
        handler = getattr(
            self, "h_" + re.sub(r"[^a-z0-9]+", "_", f"{method} {template}".lower()).strip("_"), None
        )
        if handler is None:
            raise ApiError(501, f"Method '{method} {path}' not implemented")
        if "node" in args and args["node"] not in self.nodes:
            raise ApiError(595, f"no such cluster node '{args['node']}'")
        # Handlers run one at a time under the state lock (they only touch memory); the two that wait
        # for something else (a guest's agent, a task) take the lock themselves and wait without it.
        if handler.__name__ in _UNLOCKED_HANDLERS:
            result = handler(args, who)
        else:
            with self.lock:
                result = handler(args, who)
        if isinstance(result, AwaitTask):
            result = result.wait()
        if isinstance(result, tuple):
            return result
        return result, {}

    def _check_permissions(self, perms: dict, args: dict, who: Principal) -> None:
        check = perms.get("check")
        if check:
            self._eval_check(check, args, who, raise_it=True)

    def _eval_check(self, check: list, args: dict, who: Principal, raise_it: bool) -> bool:
        op = check[0]
        if op == "perm":
            path = re.sub(r"\{([a-z_-]+)\}", lambda m: str(args.get(m.group(1), "")), check[1])
            any_of = len(check) > 3 and check[3] == "any"
            if raise_it:
                who.require(path, list(check[2]), any_of)
                return True
            return who.has(path, list(check[2]), any_of)
        if op == "userid-param":
            # ["userid-param", "self"]: the call is about the caller's own user; ["userid-param", PRIV]:
            # PRIV on the realm of the user the call names
            userid = str(args.get("userid", ""))
            if check[1] == "self":
                ok = userid == who.user
                if not ok and raise_it:
                    raise PermissionDenied(f"/access/users/{userid}, self")
                return ok
            return self._eval_check(
                ["perm", f"/access/realm/{userid.rsplit('@', 1)[-1]}", [check[1]]], args, who, raise_it
            )
        if op == "userid-group":
            # the lab has no groups: PVE then wants the privilege on /access/groups
            return self._eval_check(["perm", "/access/groups", list(check[1]), "any"], args, who, raise_it)
        if op == "perm-modify":
            path = re.sub(r"\{([a-z_-]+)\}", lambda m: str(args.get(m.group(1), "")), check[1])
            return self._eval_check(["perm", path, ["Permissions.Modify"]], args, who, raise_it)
        if op == "and":
            return all(self._eval_check(c, args, who, raise_it) for c in check[1:])
        if op == "or":
            if any(self._eval_check(c, args, who, False) for c in check[1:]):
                return True
            if raise_it:
                self._eval_check(check[1], args, who, True)
            return False
        return True

    def _node(self, name: str) -> dict:
        return self.nodes[name]

    def close(self) -> None:
        self.tasks.join(2.0)
        self.state.close()
