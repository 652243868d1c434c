"""The simulated Proxmox VE node(s): what each served endpoint does.

`PveApiSim.call(method, path, params, principal)` runs one API call after the server has authenticated it:
schema validation, the schema's permission check, then the endpoint's own behaviour, copied from PVE as
described in shared/pve-api/NOTES.md (locks, digest, pending changes, the root@pam rule for raw PCI
devices, download-url checksum semantics, UPID tasks that run for a while). Errors are `ApiError`.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import secrets
import time
import uuid
from pathlib import Path
from typing import Any

from labsim import wget_log
from labsim.fixture import download_digest, node_address
from labsim.pve_access import AccessHandlers
from labsim.pve_auth import PermissionDenied, Principal
from labsim.pve_schema import ParamError, Schema
from labsim.pve_state import State
from labsim.pve_tasks import TaskFailed, TaskManager, parse_upid
from labsim.seed import forget_installation
from labsim.vm_hooks import VmHooks


class ApiError(Exception):
    """An HTTP error with PVE's message (and, for 400, the per-parameter errors map)."""

    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.errors = errors


DISK_RE = re.compile(r"^(ide|sata|scsi|virtio)(\d+)$|^(efidisk0|tpmstate0)$")
NEW_DISK_RE = re.compile(r"^(([^/:\s]+):)?(\d+(\.\d+)?)$")
CLOUDINIT_RE = re.compile(r"^([^/:\s]+):cloudinit$")
UNUSED_RE = re.compile(r"^unused(\d+)$")
GiB = 2**30

# Keys a running VM takes at once (not via pending): PVE's "fast plug" options, and what the default
# hotplug set (network,disk,usb) covers. CD-ROM media changes are live too; everything else waits.
LIVE_OPTIONS = {
    "name",
    "description",
    "onboot",
    "tags",
    "startup",
    "protection",
    "lock",
    "shares",
    "hookscript",
    "vmstatestorage",
}
HOTPLUG_RE = re.compile(r"^(net\d+|scsi\d+|virtio\d+|sata\d+|usb\d+|unused\d+)$")

CONFIG_PRIV = [
    (re.compile(r"^(cores|sockets|vcpus|cpu|cpulimit|cpuunits|numa\d*|affinity)$"), "VM.Config.CPU"),
    (re.compile(r"^(memory|balloon|shares|hugepages)$"), "VM.Config.Memory"),
    (re.compile(r"^net\d+$"), "VM.Config.Network"),
    (re.compile(r"^(ide|sata|scsi|virtio)\d+$|^(efidisk0|tpmstate0|unused\d+)$"), "VM.Config.Disk"),
    (
        re.compile(
            r"^(ipconfig\d+|ciuser|cipassword|citype|cicustom|sshkeys|nameserver|searchdomain|ciupgrade)$"
        ),
        "VM.Config.Cloudinit",
    ),
    (
        re.compile(
            r"^(machine|bios|vga|scsihw|ostype|kvm|acpi|tablet|arch|usb\d+|serial\d+|parallel\d+|"
            r"rng0|tpmstate0|audio0|watchdog|smbios1|hostpci\d+|virtiofs\d+)$"
        ),
        "VM.Config.HWType",
    ),
]


def _config_priv(key: str) -> str:
    for rx, priv in CONFIG_PRIV:
        if rx.match(key):
            return priv
    return "VM.Config.Options"


def format_size(size: int) -> str:
    """PVE's size= notation: the largest unit that divides the size exactly."""
    for unit, factor in (("T", 2**40), ("G", GiB), ("M", 2**20), ("K", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def parse_size(text: str) -> int:
    m = re.match(r"^(\d+(?:\.\d+)?)([KMGT]?)(?:iB)?$", text)
    if not m:
        raise ValueError(text)
    factor = {"": 1, "K": 1024, "M": 2**20, "G": GiB, "T": 2**40}[m.group(2)]
    return int(float(m.group(1)) * factor)


_UNLOCKED_HANDLERS = {"h_get_nodes_node_qemu_vmid_agent_network_get_interfaces"}


class _AwaitTask:
    """PVE's background_delay: wait (without the state lock) up to `seconds` for the task; answer null
    when it ended well by then, else its UPID."""

    def __init__(self, record: dict, seconds: int):
        self.record = record
        self.seconds = seconds

    def wait(self) -> str | None:
        deadline = time.monotonic() + self.seconds
        while self.record["status"] == "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        return None if self.record.get("exitstatus") == "OK" else self.record["upid"]


def _check_digest(args: dict, current: str) -> None:
    if "digest" in args and args["digest"] != current:
        raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")


def _print_drive(volid: str, options: dict) -> str:
    """A drive the way PVE writes it: the volume first, then the other keys in sorted order."""
    return ",".join([volid, *(f"{k}={v}" for k, v in sorted(options.items()))])


def _normalise_filename(name: str) -> str:
    name = re.split(r"[/\\]", name)[-1]
    return re.sub(r"[^a-zA-Z0-9_.-]", "_", name)


class PveApiSim(AccessHandlers):
    """All simulated nodes, their VMs, storages, PCI devices, mappings and tasks."""

    def __init__(
        self, state_dir: Path, fixture: dict[str, Any], schema: Schema, hooks: VmHooks | None = None
    ):
        self.state_dir = Path(state_dir)
        self.fixture = fixture
        self.schema = schema
        self.hooks = hooks or VmHooks(fixture)
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

    # ============================================================================ dispatch
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
        if isinstance(result, _AwaitTask):
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

    # ============================================================================ helpers
    def _node(self, name: str) -> dict:
        return self.nodes[name]

    def _vm(self, node: str, vmid: int) -> dict:
        vm = self.state.data["vms"].get(str(vmid))
        if vm is None or vm["node"] != node:
            raise ApiError(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist")
        return vm

    def _storage(self, node: str, storeid: str) -> dict:
        for s in self._node(node)["storages"]:
            if s["name"] == storeid:
                return s
        raise ApiError(500, f"storage '{storeid}' does not exist")

    def _volumes(self, node: str, storeid: str) -> list[dict]:
        """The volumes on one node's storage: the lab's storages are local to their node (none is shared),
        so `local` of one node is not `local` of another."""
        return self.state.data["volumes"].setdefault(f"{node}/{storeid}", [])

    def _set_volumes(self, node: str, storeid: str, volumes: list[dict]) -> None:
        self.state.data["volumes"][f"{node}/{storeid}"] = volumes

    def _node_storages(self, node: str) -> list[str]:
        """The storage ids of a node that hold volumes in the state."""
        prefix = f"{node}/"
        return [k[len(prefix) :] for k in self.state.data["volumes"] if k.startswith(prefix)]

    def _find_volume(self, node: str, volid: str) -> dict | None:
        storeid = volid.split(":", 1)[0]
        return next((v for v in self._volumes(node, storeid) if v["volid"] == volid), None)

    def _storage_used(self, node: str, storeid: str) -> int:
        return sum(v["size"] for v in self._volumes(node, storeid))

    @staticmethod
    def render_config(config: dict, pending: dict, pending_delete: list[str]) -> str:
        """The VM config file text (what PVE hashes for `digest`)."""
        lines = []
        desc = config.get("description")
        if desc:
            lines += ["#" + line for line in str(desc).split("\n")]
        lines += [f"{k}: {v}" for k, v in sorted(config.items()) if k != "description"]
        if pending or pending_delete:
            lines += ["", "[PENDING]"]
            if pending_delete:
                lines.append("delete: " + ",".join(pending_delete))
            lines += [f"{k}: {v}" for k, v in sorted(pending.items())]
        return "\n".join(lines) + "\n"

    def _digest(self, vm: dict) -> str:
        text = self.render_config(vm["config"], vm["pending"], vm["pending_delete"])
        return hashlib.sha1(text.encode()).hexdigest()

    def _typed(self, key: str, value: Any) -> Any:
        """Config values the way PVE's JSON has them: integers and booleans as numbers."""
        props = self.schema.endpoints["/nodes/{node}/qemu"]["POST"]["parameters"]["properties"]
        schema = self.schema.property_schema(props, key) or {}
        kind = schema.get("type")
        if kind in ("integer", "boolean"):
            try:
                return int(value)
            except (TypeError, ValueError):
                return value
        if kind == "number":
            try:
                return float(value)
            except (TypeError, ValueError):
                return value
        return value

    def _vm_to_change(self, args: dict, who: Principal) -> tuple[str, int, dict]:
        """The node, id and state of the VM `args` names, once it exists and is not locked (lock held)."""
        node, vmid = args["node"], args["vmid"]
        vm = self._vm(node, vmid)
        self._check_lock(vm, vmid, args, who)
        return node, vmid, vm

    @staticmethod
    def _check_skiplock(args: dict, who: Principal) -> None:
        if args.get("skiplock") and not who.is_root_ticket:
            raise ApiError(
                400, "Parameter verification failed.", {"skiplock": "Only root may use this option."}
            )

    def _check_lock(self, vm: dict, vmid: int, args: dict, who: Principal) -> None:
        self._check_skiplock(args, who)
        if vm.get("lock") and not args.get("skiplock"):
            raise ApiError(500, f"VM {vmid} is locked ({vm['lock']})")

    def _sleep(self, kind: str) -> None:
        time.sleep(float(self.timings.get(kind, 0.2)))

    def _mac(self) -> str:
        rnd = random.SystemRandom()
        return "BC:24:11:" + ":".join(f"{rnd.randrange(256):02X}" for _ in range(3))

    # ============================================================================ /version, /access
    def h_get_version(self, args, who):
        pve = self.fixture["pve"]
        return {"version": str(pve["version"]), "release": str(pve["release"]), "repoid": str(pve["repoid"])}

    def h_get_access_ticket(self, args, who):
        return None

    # ============================================================================ /nodes, /cluster
    def _node_mem(self, node: str) -> dict[str, int]:
        n = self._node(node)
        total = int(n["memory"]["total"])
        used = int(n["memory"].get("host_used", 0))
        for vm in self.state.data["vms"].values():
            if vm["node"] == node and vm["status"] == "running":
                used += self._vm_memory_mib(vm["config"]) * 2**20
        used = min(used, total)
        return {"total": total, "used": used, "free": total - used, "available": total - used}

    @staticmethod
    def _vm_memory_mib(config: dict) -> int:
        mem = str(config.get("memory", "512"))
        m = re.search(r"(?:^|current=)(\d+)", mem)
        return int(m.group(1)) if m else 512

    def h_get_nodes(self, args, who):
        out = []
        for name, n in self.nodes.items():
            mem = self._node_mem(name)
            out.append(
                {
                    "node": name,
                    "status": "online",
                    "cpu": 0.02,
                    "maxcpu": int(n["cpu"].get("threads", n["cpu"].get("cores", 1))),
                    "mem": mem["used"],
                    "maxmem": mem["total"],
                    "uptime": int(time.time() - self.state.data.setdefault("boot_time", int(time.time()))),
                    "level": "",
                    "ssl_fingerprint": self.fixture.get("_fingerprint", ""),
                    "id": f"node/{name}",
                    "type": "node",
                }
            )
        return out

    def h_get_nodes_node_status(self, args, who):
        n = self._node(args["node"])
        cpu = n["cpu"]
        boot = {"mode": n["boot"].get("mode", "efi")}
        if boot["mode"] == "efi":
            boot["secureboot"] = int(n["boot"].get("secureboot", 0))
        root_total = int(n.get("rootfs_total", 100 * GiB))
        return {
            "memory": self._node_mem(args["node"]),
            "cpu": 0.02,
            "cpuinfo": {
                "model": cpu.get("model", ""),
                "sockets": int(cpu.get("sockets", 1)),
                "cores": int(cpu.get("cores", 1)),
                "cpus": int(cpu.get("threads", cpu.get("cores", 1))),
            },
            "loadavg": ["0.12", "0.10", "0.08"],
            "rootfs": {
                "total": root_total,
                "used": 3 * GiB,
                "free": root_total - 3 * GiB,
                "avail": root_total - 3 * GiB,
            },
            "boot-info": boot,
            "current-kernel": {
                "sysname": "Linux",
                "release": n.get("kernel", ""),
                "version": "#1 SMP PREEMPT_DYNAMIC PMX",
                "machine": "x86_64",
            },
            "kversion": f"Linux {n.get('kernel', '')} #1 SMP PREEMPT_DYNAMIC PMX",
            "pveversion": f"pve-manager/{self.fixture['pve']['version']}/{self.fixture['pve']['repoid']}",
            "uptime": int(time.time() - self.state.data.setdefault("boot_time", int(time.time()))),
        }

    def h_get_cluster_resources(self, args, who):
        kind = args.get("type")
        out = []
        if kind in (None, "node"):
            for n in self.h_get_nodes(args, who):
                out.append({**n, "id": f"node/{n['node']}", "type": "node", "disk": 0, "maxdisk": 0})
        if kind in (None, "storage"):
            for name, n in self.nodes.items():
                for s in n["storages"]:
                    if not who.has(
                        f"/storage/{s['name']}", ["Datastore.Audit", "Datastore.AllocateSpace"], True
                    ):
                        continue
                    out.append(
                        {
                            "id": f"storage/{name}/{s['name']}",
                            "type": "storage",
                            "storage": s["name"],
                            "node": name,
                            "status": "available",
                            "plugintype": s["type"],
                            "content": ",".join(s["content"]),
                            "shared": 0,
                            "disk": self._storage_used(name, s["name"]),
                            "maxdisk": int(s["total"]),
                        }
                    )
        if kind in (None, "vm"):
            for vmid, vm in sorted(self.state.data["vms"].items(), key=lambda kv: int(kv[0])):
                if not who.has(f"/vms/{vmid}", ["VM.Audit"]):
                    continue
                entry = {"id": f"qemu/{vmid}", "type": "qemu", **self._vm_summary(int(vmid), vm)}
                out.append(entry)
        return out

    def h_get_cluster_status(self, args, who):
        """pvecm's view: a lone node answers only its own entry; nodes joined in a cluster (a fixture with
        several nodes, or a ``cluster`` name) add the cluster's entry first. The listener answers as the
        first node (``local``)."""
        names = list(self.nodes)
        cluster = self.fixture.get("cluster") or {}
        clustered = len(names) > 1 or bool(cluster.get("name"))
        out = []
        if clustered:
            out.append(
                {
                    "type": "cluster",
                    "id": "cluster",
                    "name": str(cluster.get("name") or "lab"),
                    "nodes": len(names),
                    "quorate": 1,
                    "version": len(names),
                }
            )
        for i, name in enumerate(names):
            out.append(
                {
                    "type": "node",
                    "id": f"node/{name}",
                    "name": name,
                    "ip": node_address(self.fixture, name),
                    "local": int(i == 0),
                    "nodeid": i + 1 if clustered else 0,
                    "online": 1,
                    "level": "",
                }
            )
        return out

    def _vm_summary(self, vmid: int, vm: dict) -> dict:
        cfg = vm["config"]
        return {
            "vmid": vmid,
            "name": cfg.get("name", f"VM {vmid}"),
            "node": vm["node"],
            "status": vm["status"],
            "template": 0,
            "maxcpu": int(cfg.get("cores", 1)) * int(cfg.get("sockets", 1)),
            "disk": 0,
            **self._vm_usage(vm),
        }

    def _vm_usage(self, vm: dict) -> dict:
        """What a VM's list entry and its status/current share: memory, disk, uptime, load, lock and tags."""
        cfg = vm["config"]
        running = vm["status"] == "running"
        usage = {
            "maxmem": self._vm_memory_mib(cfg) * 2**20,
            "mem": self._vm_memory_mib(cfg) * 2**20 // 2 if running else 0,
            "cpu": 0.01 if running else 0,
            "maxdisk": self._boot_disk_size(cfg),
            "uptime": int(time.time() - vm["started_at"]) if running and vm.get("started_at") else 0,
            "diskread": 0,
            "diskwrite": 0,
            "netin": 0,
            "netout": 0,
        }
        if cfg.get("tags"):
            usage["tags"] = cfg["tags"]
        if vm.get("lock"):
            usage["lock"] = vm["lock"]
        return usage

    def _boot_disk_size(self, cfg: dict) -> int:
        for key in sorted(cfg):
            m = DISK_RE.match(key)
            if m and not key.startswith(("efidisk", "tpmstate")) and "media=cdrom" not in str(cfg[key]):
                sm = re.search(r"(?:^|,)size=([^,]+)", str(cfg[key]))
                if sm:
                    return parse_size(sm.group(1))
        return 0

    def h_get_cluster_nextid(self, args, who):
        vms = self.state.data["vms"]
        if "vmid" in args:
            if str(args["vmid"]) in vms:
                raise ApiError(
                    400, "Parameter verification failed.", {"vmid": f"VM {args['vmid']} already exists"}
                )
            return args["vmid"]
        vmid = 100
        while str(vmid) in vms:
            vmid += 1
        return str(vmid)  # PVE's quirk: the next id comes back as a JSON string

    # ============================================================================ hardware/pci
    def h_get_nodes_node_hardware_pci(self, args, who):
        blacklist = args.get("pci-class-blacklist", "05;06;0b")
        prefixes = [p for p in re.split(r"[,;\s]+", blacklist) if p]
        verbose = args.get("verbose", 1)
        out = []
        for dev in sorted(self._node(args["node"])["pci"], key=lambda d: d["id"]):
            cls = str(dev["class"])
            if any(cls.lower().startswith("0x" + p.lower()) for p in prefixes):
                continue
            item = {k: dev[k] for k in ("id", "class", "vendor", "device", "iommugroup") if k in dev}
            if dev.get("mdev"):
                item["mdev"] = 1
            if verbose:
                for k in (
                    "vendor_name",
                    "device_name",
                    "subsystem_vendor",
                    "subsystem_device",
                    "subsystem_vendor_name",
                    "subsystem_device_name",
                ):
                    if k in dev:
                        item[k] = dev[k]
            out.append(item)
        return out

    def _pci_functions(self, node: str, path: str) -> list[dict]:
        """The fixture's devices matched by a hostpci/mapping path (``02:00`` = all functions)."""
        full = path if re.match(r"^[0-9a-f]{4,}:", path) else "0000:" + path
        devs = self._node(node)["pci"]
        if "." in full.split(":")[-1]:
            return [d for d in devs if d["id"] == full]
        return [d for d in devs if d["id"].rsplit(".", 1)[0] == full]

    def hook_config(self, node: str, config: dict) -> dict:
        """A copy of a VM's config as the VM hooks see it start: each ``hostpciN`` through a resource mapping
        is spelt with the device path of the map entry for this node in front (``host=0000:05:00,mapping=
        rtx3060,pcie=1``), the device QEMU gets once qemu-server resolved the mapping; an entry with no such
        entry stays as it is. Call with the lock held."""
        out = dict(config)
        for key, value in config.items():
            if not re.fullmatch(r"hostpci\d+", key):
                continue
            parts = str(value).split(",")
            mid = next((p.removeprefix("mapping=") for p in parts if p.startswith("mapping=")), None)
            mapping = self.state.data["mappings"].get(mid) if mid else None
            entry = (
                next((e for e in self._map_entries(mapping) if e["node"] == node), None) if mapping else None
            )
            if entry is not None:
                out[key] = ",".join([f"host={entry['path']}", *parts])
        return out

    # ============================================================================ mappings
    def _render_mappings(self) -> str:
        lines = []
        for mid, m in sorted(self.state.data["mappings"].items()):
            lines.append(mid)
            lines += [f"\tmap {e}" for e in m["map"]]
            for k in ("description", "live-migration-capable", "mdev"):
                if k in m:
                    lines.append(f"\t{k} {m[k]}")
            lines.append("")
        return "\n".join(lines) + "\n"

    def _mappings_digest(self) -> str:
        return hashlib.sha1(self._render_mappings().encode()).hexdigest()

    def _map_format(self) -> dict:
        info = self.schema.endpoints["/cluster/mapping/pci"]["POST"]
        return info["parameters"]["properties"]["map"]["items"]["format"]

    def _map_entries(self, mapping: dict) -> list[dict]:
        return [self.schema.parse_property_string(self._map_format(), e, "map") for e in mapping["map"]]

    def _mapping_checks(self, mid: str, mapping: dict, node: str) -> list[dict]:
        entries = self._map_entries(mapping)
        mine = [e for e in entries if e["node"] == node]
        if not mine:
            return [{"severity": "warning", "message": f"No mapping for node {node}."}]
        checks = []
        for e in mine:
            first = e["path"].split(";")[0]
            devs = self._pci_functions(node, first)
            if not devs:
                fn = first if "." in first.split(":")[-1] else first + ".0"
                checks.append({"severity": "error", "message": f"pci device '{fn}' not found\n"})
                continue
            dev = devs[0]
            want_id = f"{dev['vendor'][2:]}:{dev['device'][2:]}"
            if e["id"].lower() != want_id:
                checks.append(
                    {
                        "severity": "error",
                        "message": f"Invalid configuration: 'id' does not match for '{mid}' ({e['id']} != {want_id})\n",
                    }
                )
            if "subsystem_vendor" in dev:
                want_sub = f"{dev['subsystem_vendor'][2:]}:{dev['subsystem_device'][2:]}"
                if "subsystem-id" not in e:
                    checks.append(
                        {
                            "severity": "error",
                            "message": f"missing expected property 'subsystem-id' for device '{dev['id']}'\n",
                        }
                    )
                elif e["subsystem-id"].lower() != want_sub:
                    checks.append(
                        {
                            "severity": "error",
                            "message": "Invalid configuration: 'subsystem-id' does not match "
                            f"for '{mid}' ({e['subsystem-id']} != {want_sub})\n",
                        }
                    )
            if "iommugroup" in e and int(e["iommugroup"]) != int(dev["iommugroup"]):
                checks.append(
                    {
                        "severity": "error",
                        "message": "Invalid configuration: 'iommugroup' does not match "
                        f"for '{mid}' ({e['iommugroup']} != {dev['iommugroup']})\n",
                    }
                )
        return checks

    def h_get_cluster_mapping_pci(self, args, who):
        out = []
        digest = self._mappings_digest()
        for mid, m in sorted(self.state.data["mappings"].items()):
            if not who.has(f"/mapping/pci/{mid}", ["Mapping.Modify", "Mapping.Use", "Mapping.Audit"], True):
                continue
            item = {"id": mid, "type": "pci", "digest": digest, "map": list(m["map"])}
            for k in ("description", "mdev", "live-migration-capable"):
                if k in m:
                    item[k] = m[k]
            if "check-node" in args:
                item["checks"] = self._mapping_checks(mid, m, args["check-node"])
            out.append(item)
        return out

    def h_post_cluster_mapping_pci(self, args, who):
        mid = args["id"]
        with self.lock:
            if mid in self.state.data["mappings"]:
                raise ApiError(500, f"pci ID '{mid}' already defined")
            entry = {"map": self._check_map_entries(args["map"])}
            for k in ("description", "mdev", "live-migration-capable"):
                if k in args:
                    entry[k] = args[k]
            self.state.data["mappings"][mid] = entry
            self.state.mark()
        return None

    def _check_map_entries(self, entries: list[str]) -> list[str]:
        nodes = set()
        for e in entries:
            try:
                parsed = self.schema.parse_property_string(self._map_format(), e, "map")
            except ParamError as exc:
                raise ApiError(
                    400, "Parameter verification failed.", {"map": "invalid format - " + exc.errors["map"]}
                ) from exc
            if parsed["node"] in nodes:
                raise ApiError(
                    400,
                    "Parameter verification failed.",
                    {"map": f"duplicate mapping for node '{parsed['node']}'"},
                )
            nodes.add(parsed["node"])
        return list(entries)

    def h_get_cluster_mapping_pci_id(self, args, who):
        m = self.state.data["mappings"].get(args["id"])
        if m is None:
            raise ApiError(500, f"PCI mapping '{args['id']}' not found")
        return {"id": args["id"], "type": "pci", "digest": self._mappings_digest(), **m}

    def h_put_cluster_mapping_pci_id(self, args, who):
        with self.lock:
            m = self.state.data["mappings"].get(args["id"])
            if m is None:
                raise ApiError(500, f"PCI mapping '{args['id']}' not found")
            _check_digest(args, self._mappings_digest())
            for k in filter(None, re.split(r"[,;\s]+", args.get("delete", ""))):
                if k == "map":
                    raise ApiError(
                        400,
                        "Parameter verification failed.",
                        {"delete": "cannot delete required property 'map'"},
                    )
                m.pop(k, None)
            if "map" in args:
                m["map"] = self._check_map_entries(args["map"])
            for k in ("description", "mdev", "live-migration-capable"):
                if k in args:
                    m[k] = args[k]
            self.state.mark()
        return None

    def h_delete_cluster_mapping_pci_id(self, args, who):
        with self.lock:
            if self.state.data["mappings"].pop(args["id"], None) is None:
                raise ApiError(500, f"PCI mapping '{args['id']}' not found")
            self.state.mark()
        return None

    # ============================================================================ storage
    def _storage_entry(self, node: str, s: dict) -> dict:
        used = self._storage_used(node, s["name"])
        total = int(s["total"])
        return {
            "storage": s["name"],
            "type": s["type"],
            "content": ",".join(s["content"]),
            "active": 1,
            "enabled": 1,
            "shared": 0,
            "total": total,
            "used": used,
            "avail": total - used,
            "used_fraction": used / total if total else 0,
        }

    def h_get_nodes_node_storage(self, args, who):
        out = []
        for s in self._node(args["node"])["storages"]:
            if not who.has(f"/storage/{s['name']}", ["Datastore.Audit", "Datastore.AllocateSpace"], True):
                continue
            if "storage" in args and s["name"] != args["storage"]:
                continue
            if "content" in args and not set(re.split(r"[,;\s]+", args["content"])) & set(s["content"]):
                continue
            out.append(self._storage_entry(args["node"], s))
        return out

    def h_get_nodes_node_storage_storage_status(self, args, who):
        s = self._storage(args["node"], args["storage"])
        return self._storage_entry(args["node"], s)

    def h_get_nodes_node_storage_storage_content(self, args, who):
        self._storage(args["node"], args["storage"])
        out = []
        for v in self._volumes(args["node"], args["storage"]):
            if "content" in args and v["content"] != args["content"]:
                continue
            if "vmid" in args and v.get("vmid") != args["vmid"]:
                continue
            item = {k: v[k] for k in ("volid", "format", "size", "content", "ctime") if k in v}
            if v.get("vmid"):
                item["vmid"] = v["vmid"]
            out.append(item)
        return sorted(out, key=lambda i: i["volid"])

    def h_get_nodes_node_query_url_metadata(self, args, who):
        entry = self.downloads.get(args["url"])
        if entry is None:
            host = re.sub(r"^https?://([^/:]+).*$", r"\1", args["url"])
            raise ApiError(
                500, f"invalid server response: '500 Can't connect to {host}:443 (Name or service not known)'"
            )
        mimetype = (
            "application/x-iso9660-image" if entry.get("format") == "iso" else "application/octet-stream"
        )
        return {"filename": args["url"].rsplit("/", 1)[-1], "mimetype": mimetype, "size": int(entry["size"])}

    def h_post_nodes_node_storage_storage_download_url(self, args, who):
        node, storeid, content = args["node"], args["storage"], args["content"]
        s = self._storage(node, storeid)
        if s["type"] not in ("dir", "nfs", "cifs", "cephfs", "btrfs"):
            raise ApiError(500, f"can't upload to storage type '{s['type']}', not a file based storage!")
        if content not in s["content"]:
            raise ApiError(500, f"storage '{storeid}' is not configured for content-type '{content}'")
        filename = _normalise_filename(args["filename"])
        ext_ok = {
            "iso": re.search(r"\.(iso|img)$", filename, re.I),
            "import": re.search(r"\.(ova|qcow2|raw|vmdk)$", filename),
            "vztmpl": re.search(r"\.tar\.(gz|xz|zst|bz2)$", filename),
        }[content]
        if not ext_ok:
            message = "wrong file extension" if content == "iso" else "invalid filename or wrong extension"
            raise ApiError(400, "Parameter verification failed.", {"filename": message})
        volid = f"{storeid}:{content}/{filename}"
        base = s.get("path", "/var/lib/vz")
        subdir = {"iso": "template/iso", "vztmpl": "template/cache", "import": "import"}[content]
        fs_path = f"{base}/{subdir}/{filename}"
        algo = args.get("checksum-algorithm")
        expect = args.get("checksum", "").lower() if algo else None
        url = args["url"]

        def body(task):
            # pve-common PVE::Tools::download_file_from_url: the lines of library/labsim/wget_log.py
            task.log(f"downloading {url} to {fs_path}")
            existing = self._find_volume(node, volid)
            if existing is not None:
                if expect is None:
                    raise TaskFailed(f"refusing to override existing file '{fs_path}'")
                got = (
                    existing["digests"].get(algo) or hashlib.new(algo, existing["volid"].encode()).hexdigest()
                )
                if got.lower() != expect:
                    task.log("calculating checksum of existing file...")
                    raise TaskFailed(f"checksum mismatch: got '{got}' != expect '{expect}', aborting")
                task.log(
                    "calculating checksum of existing file...OK, got correct file already, no need to download"
                )
                return
            entry = self.downloads.get(url)
            host = re.sub(r"^https?://([^/:]+).*$", r"\1", url)
            if entry is None:
                time.sleep(min(0.2, float(self.timings["download_max_s"])))
                raise TaskFailed(
                    f"download failed: 500 Can't connect to {host}:443 (Name or service not known)"
                )
            size = int(entry["size"])
            free = int(s["total"]) - self._storage_used(node, storeid)
            if size > free:
                raise TaskFailed(
                    f"not enough space on storage '{storeid}' ({free} bytes free, {size} needed)"
                )
            duration = min(size / float(self.timings["download_rate"]), float(self.timings["download_max_s"]))
            step = max(0.05, float(self.timings["download_progress_s"]))
            rate = size / duration if duration > 0 else float(self.timings["download_rate"])
            tmp = f"{fs_path}.tmp_dwnl.{os.getpid()}"
            mimetype = (
                "application/x-iso9660-image" if entry.get("format") == "iso" else "application/octet-stream"
            )
            for line in wget_log.header(url, host, size, mimetype, tmp):
                task.log(line)
            started = time.monotonic()
            written = 0
            while True:
                elapsed = time.monotonic() - started
                frac = 1.0 if duration <= 0 else min(1.0, elapsed / duration)
                for index in range(written, wget_log.rows_done(size, frac)):
                    task.log(wget_log.row(index, size, rate))
                written = max(written, wget_log.rows_done(size, frac))
                if frac >= 1.0:
                    break
                time.sleep(min(step, max(0.0, duration - elapsed)))
            task.log(wget_log.last_row(size, rate, duration))
            for line in wget_log.footer(tmp, size, rate):
                task.log(line)
            digests = {
                a: download_digest(entry, a) for a in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512")
            }
            if expect is not None:
                if digests[algo] != expect:
                    task.log("calculating checksum...")
                    raise TaskFailed(f"checksum mismatch: got '{digests[algo]}' != expect '{expect}'")
                task.log("calculating checksum...OK, checksum verified")
            task.log("download of '" + url + "' to '" + fs_path + "' finished")
            with self.lock:
                self._volumes(node, storeid).append(
                    {
                        "volid": volid,
                        "content": content,
                        "format": "iso" if content == "iso" else filename.rsplit(".", 1)[-1],
                        "size": size,
                        "virtual_size": int(entry.get("virtual_size", size)),
                        "ctime": int(time.time()),
                        "digests": digests,
                    }
                )
                self.state.mark()

        return self.tasks.start(node, "download", filename, who.userid, body)

    # ============================================================================ qemu: list/create
    def h_get_nodes_node_qemu(self, args, who):
        out = []
        for vmid, vm in sorted(self.state.data["vms"].items(), key=lambda kv: int(kv[0])):
            if vm["node"] != args["node"] or not who.has(f"/vms/{vmid}", ["VM.Audit"]):
                continue
            s = self._vm_summary(int(vmid), vm)
            s["cpus"] = s.pop("maxcpu")
            s.pop("node")
            if vm["status"] == "running":
                s["pid"] = vm.get("pid", 0)
            out.append(s)
        return out

    def h_get_nodes_node_qemu_vmid(self, args, who):
        self._vm(args["node"], args["vmid"])
        subdirs = ["config", "pending", "status", "agent", "resize", "rrd", "rrddata", "firewall", "snapshot"]
        return [{"subdir": s} for s in subdirs]

    def _prepare_changes(
        self, node: str, vmid: int, args: dict, who: Principal, create: bool, current: dict
    ) -> tuple[dict, list[tuple[str, dict]]]:
        """Check the config keys of a create/update call; return (values to set, disks to allocate)."""
        skip = {
            "node",
            "vmid",
            "digest",
            "delete",
            "revert",
            "force",
            "skiplock",
            "background_delay",
            "start",
            "storage",
            "pool",
            "unique",
            "archive",
            "bwlimit",
            "live-restore",
            "ha-managed",
        }
        sets = {k: v for k, v in args.items() if k not in skip}
        if "cdrom" in sets:
            sets["ide2"] = sets.pop("cdrom")
            if "media=" not in sets["ide2"]:
                sets["ide2"] += ",media=cdrom"
        errors: dict[str, str] = {}
        allocations: list[tuple[str, dict]] = []
        # PVE allocates the EFI vars and TPM state volumes before the other disks (disk-0, disk-1, ...).
        for key, value in sorted(sets.items(), key=lambda kv: kv[0] not in ("efidisk0", "tpmstate0")):
            if DISK_RE.match(key):
                if not create:  # on create, the storage checks stand for these
                    cdrom = "media=cdrom" in str(value)
                    who.require(f"/vms/{vmid}", ["VM.Config.CDROM" if cdrom else "VM.Config.Disk"])
            elif not (key.startswith("hostpci") or UNUSED_RE.match(key)):
                who.require(f"/vms/{vmid}", [_config_priv(key)])
            if key.startswith("hostpci"):
                self._check_hostpci(key, str(value), current.get(key), who, vmid)
            elif DISK_RE.match(key):
                alloc = self._check_drive(node, key, str(value), args, who, errors)
                if alloc:
                    allocations.append((key, alloc))
            elif key.startswith("net"):
                sets[key] = self._normalise_net(str(value), node, who)
            elif key == "boot":
                self._check_boot(str(value), {**current, **sets}, errors)
            elif UNUSED_RE.match(key):
                errors[key] = "unable to set unused disk directly"
            elif key == "cipassword" and not str(value).startswith("$"):
                sets[key] = _hash_password(str(value))
        if errors:
            raise ApiError(400, "Parameter verification failed.", errors)
        return sets, allocations

    def _check_hostpci(self, key: str, value: str, old: str | None, who: Principal, vmid: int) -> None:
        """The permission check a config write makes for a hostpciN (qemu-server src/PVE/API2/Qemu.pm@e6352be
        (9.2.6), check_hostpci_perm, on the old value as on the new): root@pam (password) passes with no check
        at all; anyone else gets a raw ``host`` refused (with ``mapping`` beside it too), needs Mapping.Use on
        the mapping (which need not exist yet) and VM.Config.HWType, and may not give a ``romfile``. Whether
        the mapping exists, or ``host`` and ``mapping`` come together, is the start's business
        (`_start_checks`)."""
        if who.is_root_ticket:
            return
        fmt = self.schema.named["pve-qm-hostpci"]
        for val in ([old] if old else []) + [value]:
            dev = self.schema.parse_property_string(fmt, val, key)
            if dev.get("host"):
                raise ApiError(500, f"only root can set '{key}' config for non-mapped devices")
            if not dev.get("mapping"):
                raise ApiError(500, "either 'host' or 'mapping' must be set.")
            who.require(f"/mapping/pci/{dev['mapping']}", ["Mapping.Use"])
            who.require(f"/vms/{vmid}", ["VM.Config.HWType"])
            if "romfile" in dev:
                raise ApiError(
                    400, "Parameter verification failed.", {key: "only root@pam can set 'romfile' option"}
                )

    def _drive_format(self, key: str) -> dict:
        props = self.schema.endpoints["/nodes/{node}/qemu"]["POST"]["parameters"]["properties"]
        return self.schema.format_of(self.schema.property_schema(props, key))

    def _check_drive(
        self, node: str, key: str, value: str, args: dict, who: Principal, errors: dict
    ) -> dict | None:
        drive = self.schema.parse_property_string(self._drive_format(key), value, key)
        file = drive["file"]
        ci = CLOUDINIT_RE.match(file)
        if ci:
            store = self._storage(node, ci.group(1))
            if "images" not in store["content"]:
                raise ApiError(500, f"storage '{ci.group(1)}' does not support content-type 'images'")
            who.require(f"/storage/{ci.group(1)}", ["Datastore.AllocateSpace"])
            return {"storage": ci.group(1), "size_gib": 0, "drive": drive, "cloudinit": True}
        m = NEW_DISK_RE.match(file)
        if m:
            storeid = m.group(2) or args.get("storage")
            if not storeid:
                errors[key] = "no storage ID specified (and no default storage)"
                return None
            size_gib = float(m.group(3))
            if drive.get("import-from"):
                if size_gib != 0:
                    errors[key] = (
                        "'import-from' requires special syntax - use <storage ID>:0,import-from=<source>"
                    )
                    return None
                if key == "efidisk0" and not ("efitype" in drive and "pre-enrolled-keys" in drive):
                    errors[key] = "'efitype' and 'pre-enrolled-keys' must be set when importing an EFI disk"
                    return None
                src = drive["import-from"]
                if src.startswith("/"):
                    if not who.is_root_ticket:
                        raise ApiError(
                            403, "Permission check failed (Only root can pass arbitrary filesystem paths.)"
                        )
                else:
                    vol = self._find_volume(node, src)
                    if vol is None:
                        raise ApiError(500, f"volume '{src}' does not exist")
                    if vol["content"] not in ("images", "import"):
                        raise ApiError(
                            500, f"{src} has wrong type '{vol['content']}' - needs to be 'images' or 'import'"
                        )
                    who.require(f"/storage/{src.split(':')[0]}", ["Datastore.Audit"])
            store = self._storage(node, storeid)
            if "images" not in store["content"]:
                raise ApiError(500, f"storage '{storeid}' does not support content-type 'images'")
            who.require(f"/storage/{storeid}", ["Datastore.AllocateSpace"])
            return {"storage": storeid, "size_gib": size_gib, "drive": drive}
        if file in ("none", "cdrom") or file.startswith("/"):
            if file.startswith("/") and not who.is_root_ticket:
                raise ApiError(
                    403, "Permission check failed (Only root can pass arbitrary filesystem paths.)"
                )
            return None
        vol = self._find_volume(node, file)
        if vol is None:
            raise ApiError(500, f"volume '{file}' does not exist")
        if vol["content"] == "iso" and drive.get("media") != "cdrom":
            errors[key] = "explicit 'media=cdrom' is required for iso images"
        who.require(f"/storage/{file.split(':')[0]}", ["Datastore.AllocateSpace", "Datastore.Audit"], True)
        return None

    def _normalise_net(self, value: str, node: str, who: Principal) -> str:
        fmt = self._drive_format("net0")
        net = self.schema.parse_property_string(fmt, value, "net")
        if "model" not in net:
            raise ApiError(400, "Parameter verification failed.", {"net": "missing model"})
        mac = (net.pop("macaddr", None) or self._mac()).upper()
        bridge = net.get("bridge")
        if bridge:
            if bridge not in self._node(node).get("bridges", []):
                raise ApiError(500, f"bridge '{bridge}' does not exist")
            who.require(f"/sdn/zones/localnetwork/{bridge}", ["SDN.Use"])
        model = net.pop("model")
        rest = [f"{k}={v}" for k, v in sorted(net.items(), key=lambda kv: (kv[0] != "bridge", kv[0]))]
        return ",".join([f"{model}={mac}", *rest])

    def _check_boot(self, value: str, config: dict, errors: dict) -> None:
        boot = self.schema.parse_property_string(self.schema.named["pve-qm-boot"], value, "boot")
        for dev in filter(None, str(boot.get("order", "")).split(";")):
            if not re.match(r"^(ide|sata|scsi|virtio|net|usb|hostpci)\d+$", dev):
                errors["boot"] = f"invalid format - format error\nboot.order: invalid boot device '{dev}'\n"
            elif dev not in config:
                errors["boot"] = f"boot device '{dev}' does not exist in VM config"

    def _allocate(self, node: str, vmid: int, key: str, alloc: dict) -> str:
        """Create a volume for a new disk; return the drive string PVE would write."""
        drive = dict(alloc["drive"])
        storeid = alloc["storage"]
        store = self._storage(node, storeid)
        if alloc.get("cloudinit"):
            # PVE names the cloud-init image after the VM, attaches it as a CD-ROM and records no size.
            volname = (
                f"vm-{vmid}-cloudinit" if store["type"] != "dir" else f"{vmid}/vm-{vmid}-cloudinit.qcow2"
            )
            volid = f"{storeid}:{volname}"
            if self._find_volume(node, volid) is None:
                self._volumes(node, storeid).append(
                    {
                        "volid": volid,
                        "content": "images",
                        "format": "raw" if store["type"] != "dir" else "qcow2",
                        "size": 4 * 2**20,
                        "vmid": vmid,
                        "ctime": int(time.time()),
                    }
                )
            drive = {k: v for k, v in drive.items() if k not in ("file", "format", "size")}
            drive["media"] = "cdrom"
            return _print_drive(volid, drive)
        if drive.get("import-from"):
            src = self._find_volume(node, drive.pop("import-from"))
            size = int(src.get("virtual_size", src["size"])) if src else GiB
        elif key == "efidisk0":
            size = 528 * 1024 if drive.get("efitype") == "4m" else 128 * 1024
        elif key == "tpmstate0":
            size = 4 * 2**20
        else:
            size = int(alloc["size_gib"] * GiB)
        free = int(store["total"]) - self._storage_used(node, storeid)
        if size > free:
            raise TaskFailed(
                f"unable to create image: not enough space on storage '{storeid}' ({free} bytes free)"
            )
        names = {v["volid"] for v in self._volumes(node, storeid)}
        n = 0
        while any(f"vm-{vmid}-disk-{n}" in v for v in names):
            n += 1
        volname = f"vm-{vmid}-disk-{n}" if store["type"] != "dir" else f"{vmid}/vm-{vmid}-disk-{n}.raw"
        volid = f"{storeid}:{volname}"
        if store["type"] == "zfspool" and key == "efidisk0":
            size = 2**20  # ZFS rounds the EFI vars volume up to 1 MiB
        self._volumes(node, storeid).append(
            {
                "volid": volid,
                "content": "images",
                "format": "raw",
                "size": size,
                "vmid": vmid,
                "ctime": int(time.time()),
            }
        )
        drive.pop("file")
        drive["size"] = format_size(size)
        return _print_drive(volid, drive)

    def _with_iso_size(self, node: str, key: str, value: str) -> str:
        drive = (
            self.schema.parse_property_string(self._drive_format(key), value, key)
            if DISK_RE.match(key)
            else {}
        )
        vol = self._find_volume(node, drive.get("file", "")) if drive else None
        if vol is not None and vol["content"] == "iso" and "size" not in drive:
            drive["size"] = f"{vol['size'] // 1024}K"
            file = drive.pop("file")
            return _print_drive(file, drive)
        return value

    def h_post_nodes_node_qemu(self, args, who):
        node, vmid = args["node"], args["vmid"]
        if "archive" in args:
            raise ApiError(501, "restore is not simulated")
        pool = args.get("pool")
        if not (
            who.has(f"/vms/{vmid}", ["VM.Allocate"]) or (pool and who.has(f"/pool/{pool}", ["VM.Allocate"]))
        ):
            who.require(f"/vms/{vmid}", ["VM.Allocate"])
        if args.get("start"):
            who.require(f"/vms/{vmid}", ["VM.PowerMgmt"])
        with self.lock:
            if str(vmid) in self.state.data["vms"]:
                other = self.state.data["vms"][str(vmid)]["node"]
                raise ApiError(
                    500, f"unable to create VM {vmid} - VM {vmid} already exists on node '{other}'"
                )
            sets, allocations = self._prepare_changes(node, vmid, args, who, create=True, current={})
            sets = {k: self._with_iso_size(node, k, str(v)) for k, v in sets.items()}
            sets.setdefault("smbios1", f"uuid={uuid.uuid4()}")
            sets.setdefault("vmgenid", str(uuid.uuid4()))
            sets.setdefault("meta", f"creation-qemu=10.1.2,ctime={int(time.time())}")
            vm = {
                "node": node,
                "config": {},
                "pending": {},
                "pending_delete": [],
                "status": "stopped",
                "lock": "create",
            }
            self.state.data["vms"][str(vmid)] = vm
            self.state.mark()

        def body(task):
            self._sleep("qmcreate")
            with self.lock:
                config = {k: v for k, v in sets.items() if k not in dict(allocations)}
                for key, alloc in allocations:
                    config[key] = self._allocate(node, vmid, key, alloc)
                    task.log(f"{key}: successfully created disk '{config[key].split(',')[0]}'")
                vm["config"] = {k: str(v) for k, v in config.items()}
                vm["lock"] = None
                self.state.mark()
            if args.get("start"):
                self._start_now(task, node, vmid)

        def on_error(task, error):
            self.state.data["vms"].pop(str(vmid), None)
            for storeid in self._node_storages(node):
                self._set_volumes(
                    node, storeid, [v for v in self._volumes(node, storeid) if v.get("vmid") != vmid]
                )
            self.state.mark()

        return self.tasks.start(node, "qmcreate", str(vmid), who.userid, body, on_error)

    # ============================================================================ qemu: config
    def h_get_nodes_node_qemu_vmid_config(self, args, who):
        vm = self._vm(args["node"], args["vmid"])
        with self.lock:
            config = dict(vm["config"])
            if not args.get("current"):
                config.update(vm["pending"])
                for k in vm["pending_delete"]:
                    config.pop(k, None)
            out = {k: self._typed(k, v) for k, v in config.items()}
            if "cipassword" in out:
                out["cipassword"] = "**********"  # PVE never returns the (hashed) password
            out["digest"] = self._digest(vm)
            if vm.get("lock"):
                out["lock"] = vm["lock"]
        return out

    def h_get_nodes_node_qemu_vmid_pending(self, args, who):
        vm = self._vm(args["node"], args["vmid"])
        out = []
        with self.lock:
            for k in sorted(set(vm["config"]) | set(vm["pending"]) | set(vm["pending_delete"])):
                item: dict[str, Any] = {"key": k}
                if k in vm["config"]:
                    item["value"] = "**********" if k == "cipassword" else self._typed(k, vm["config"][k])
                if k in vm["pending"]:
                    item["pending"] = "**********" if k == "cipassword" else self._typed(k, vm["pending"][k])
                if k in vm["pending_delete"]:
                    item["delete"] = 1
                out.append(item)
        return out

    def _update(self, args, who, sync: bool):
        node, vmid = args["node"], args["vmid"]
        with self.lock:
            vm = self._vm(node, vmid)
            _check_digest(args, self._digest(vm))
            self._check_lock(vm, vmid, args, who)
            deletes = [k for k in re.split(r"[,;\s\0]+", args.get("delete", "")) if k]
            reverts = [k for k in re.split(r"[,;\s\0]+", args.get("revert", "")) if k]
            both = set(deletes) & set(args)
            if both:
                key = sorted(both)[0]
                raise ApiError(
                    400,
                    "Parameter verification failed.",
                    {"delete": f"you can't use '-{key}' and -delete {key}' at the same time"},
                )
            props = self.schema.endpoints["/nodes/{node}/qemu/{vmid}/config"]["PUT"]["parameters"][
                "properties"
            ]
            for k in deletes:
                if self.schema.property_schema(props, k) is None:
                    raise ApiError(
                        400, "Parameter verification failed.", {"delete": f"invalid configuration ID '{k}'"}
                    )
                who.require(f"/vms/{vmid}", [_config_priv(k)])
                if k.startswith("hostpci") and vm["config"].get(k):
                    self._check_hostpci(k, vm["config"][k], None, who, vmid)
            current = {**vm["config"], **vm["pending"]}
            sets, allocations = self._prepare_changes(node, vmid, args, who, create=False, current=current)
            sets = {k: self._with_iso_size(node, k, str(v)) for k, v in sets.items()}
            for k in reverts:
                vm["pending"].pop(k, None)
                if k in vm["pending_delete"]:
                    vm["pending_delete"].remove(k)
            alloc_keys = dict(allocations)
            for k, v in sets.items():
                if k not in alloc_keys:
                    vm["pending"][k] = str(v)
                if k in vm["pending_delete"]:
                    vm["pending_delete"].remove(k)
            for k in deletes:
                vm["pending"].pop(k, None)
                if k in vm["config"] and k not in vm["pending_delete"]:
                    vm["pending_delete"].append(k)
            self.state.mark()

        def apply(task=None):
            with self.lock:
                for key, alloc in allocations:
                    value = self._allocate(node, vmid, key, alloc)
                    vm["pending"][key] = value
                    if task:
                        task.log(f"{key}: successfully created disk '{value.split(',')[0]}'")
                self._apply_pending(
                    vm, vmid, only_live=vm["status"] == "running", force=bool(args.get("force"))
                )
                self.state.mark()

        if sync:
            try:
                apply()
            except TaskFailed as exc:
                raise ApiError(500, str(exc)) from exc
            return None

        def body(task):
            self._sleep("qmconfig")
            for k, v in sorted(sets.items()):
                task.log(f"update VM {vmid}: -{k} {v}")
            apply(task)

        upid = self.tasks.start(node, "qmconfig", str(vmid), who.userid, body)
        if args.get("background_delay"):
            return _AwaitTask(self.state.data["tasks"][upid], int(args["background_delay"]))
        return upid

    def h_post_nodes_node_qemu_vmid_config(self, args, who):
        return self._update(args, who, sync=False)

    def h_put_nodes_node_qemu_vmid_config(self, args, who):
        return self._update(args, who, sync=True)

    def _apply_pending(self, vm: dict, vmid: int, only_live: bool, force: bool = False) -> None:
        """Move pending values into the config (all of them, or what a running VM takes at once)."""
        config = vm["config"]

        def live(k: str) -> bool:
            if not only_live or k in LIVE_OPTIONS or HOTPLUG_RE.match(k):
                return True
            return "media=cdrom" in str(vm["pending"].get(k, config.get(k, "")))

        for k in list(vm["pending_delete"]):
            if not live(k):
                continue
            old = config.pop(k, None)
            vm["pending_delete"].remove(k)
            if old is not None:
                self._drop_volume(vm, k, old, force)
        for k, v in list(vm["pending"].items()):
            if not live(k):
                continue
            old = config.get(k)
            config[k] = v
            del vm["pending"][k]
            if old is not None and DISK_RE.match(k) and old.split(",")[0] != v.split(",")[0]:
                self._drop_volume(vm, k, old, force=False)

    def _drop_volume(self, vm: dict, key: str, value: str, force: bool) -> None:
        """A removed disk becomes unusedN, or is destroyed (force, or removing an unusedN)."""
        volid = value.split(",")[0]
        if not (DISK_RE.match(key) or UNUSED_RE.match(key)):
            return
        cloudinit = volid.endswith("-cloudinit") or volid.endswith("-cloudinit.qcow2")
        if "media=cdrom" in value and not cloudinit:
            return
        vol = self._find_volume(vm["node"], volid)
        if vol is None or vol.get("content") != "images":
            return
        if force or cloudinit or UNUSED_RE.match(key):
            storeid = volid.split(":")[0]
            keep = [v for v in self._volumes(vm["node"], storeid) if v["volid"] != volid]
            self._set_volumes(vm["node"], storeid, keep)
            return
        n = 0
        while f"unused{n}" in vm["config"]:
            n += 1
        vm["config"][f"unused{n}"] = volid

    # ============================================================================ qemu: resize
    def h_put_nodes_node_qemu_vmid_resize(self, args, who):
        node, vmid, disk = args["node"], args["vmid"], args["disk"]
        with self.lock:
            vm = self._vm(node, vmid)
            _check_digest(args, self._digest(vm))
            self._check_lock(vm, vmid, args, who)
            value = vm["config"].get(disk)
            if value is None:
                raise ApiError(500, f"disk '{disk}' does not exist")
            if "media=cdrom" in value:
                raise ApiError(500, "you can't resize a cdrom")
            volid = value.split(",")[0]
            vol = self._find_volume(node, volid)
            if vol is None:
                raise ApiError(500, f"volume '{volid}' does not exist")
            text = args["size"]
            grow = text.startswith("+")
            amount = parse_size(text.lstrip("+") if re.search(r"[KMGT]$", text) else text.lstrip("+") + "G")
            new = vol["size"] + amount if grow else amount
            if new < vol["size"]:
                raise ApiError(500, "shrinking disks is not supported")

        def body(task):
            self._sleep("resize")
            with self.lock:
                task.log(f"Image resized. {disk}: {format_size(vol['size'])} -> {format_size(new)}")
                vol["size"] = new
                drive = self.schema.parse_property_string(self._drive_format(disk), vm["config"][disk], disk)
                drive["size"] = format_size(new)
                file = drive.pop("file")
                vm["config"][disk] = _print_drive(file, drive)
                self.state.mark()
                config = dict(vm["config"])
            self._quiet_hook(self.hooks.vm_resized, node, vmid, disk, new, config)

        return self.tasks.start(node, "resize", str(vmid), who.userid, body)

    # ============================================================================ qemu: power
    def h_get_nodes_node_qemu_vmid_status_current(self, args, who):
        vm = self._vm(args["node"], args["vmid"])
        cfg = vm["config"]
        running = vm["status"] == "running"
        out = {
            "vmid": args["vmid"],
            "status": vm["status"],
            "qmpstatus": vm["status"],
            "name": cfg.get("name", f"VM {args['vmid']}"),
            "ha": {"managed": 0},
            "cpus": int(cfg.get("cores", 1)) * int(cfg.get("sockets", 1)),
            **self._vm_usage(vm),
        }
        if self._agent_enabled(cfg):
            out["agent"] = 1
        if running:
            out["pid"] = vm.get("pid", 0)
            out["running-machine"] = (
                "pc-q35-10.1+pve0" if "q35" in cfg.get("machine", "") else "pc-i440fx-10.1+pve0"
            )
            out["running-qemu"] = "10.1.2"
        return out

    def _agent_enabled(self, cfg: dict) -> bool:
        if "agent" not in cfg:
            return False
        fmt = self._drive_format("agent")
        return bool(self.schema.parse_property_string(fmt, str(cfg["agent"]), "agent").get("enabled"))

    def _start_checks(self, node: str, vmid: int, vm: dict) -> list[str]:
        """Resolve passed-through devices (raising TaskFailed like PVE's start does); return their ids.

        qemu-server src/PVE/QemuServer/PCI.pm@e6352be (9.2.6), parse_hostpci_devices and parse_hostpci: each
        hostpciN in index order, ``host`` and ``mapping`` together refused, a mapping taken from its entry
        for the node the VM starts on (none, or no such mapping: "not found") and checked against the
        node's hardware, each device looked up (lspci), then ``pcie`` without q35; devices held by a
        running VM are refused once all are resolved."""
        cfg = vm["config"]
        fmt = self.schema.named["pve-qm-hostpci"]
        paths = []
        for key in sorted((k for k in cfg if re.fullmatch(r"hostpci\d+", k)), key=lambda k: int(k[7:])):
            dev = self.schema.parse_property_string(fmt, cfg[key], key)
            if dev.get("host") and dev.get("mapping"):
                raise TaskFailed("Cannot set both 'host' and 'mapping'.")
            if dev.get("mapping"):
                mapping = self.state.data["mappings"].get(dev["mapping"])
                if mapping is None or not any(e["node"] == node for e in self._map_entries(mapping)):
                    raise TaskFailed(f"PCI device mapping not found for '{dev['mapping']}'")
                errors = [
                    c for c in self._mapping_checks(dev["mapping"], mapping, node) if c["severity"] == "error"
                ]
                if errors:
                    raise TaskFailed(
                        "PCI device mapping invalid (hardware probably changed): "
                        + errors[0]["message"].strip()
                    )
                entry = next(e for e in self._map_entries(mapping) if e["node"] == node)
                path = entry["path"].split(";")[0]
            elif dev.get("host"):
                path = dev["host"].split(";")[0]
            else:
                raise TaskFailed("Either 'host' or 'mapping' must be set.")
            devs = self._pci_functions(node, path)
            if not devs:
                raise TaskFailed(f"no PCI device found for '{path}'")
            if dev.get("pcie") and "q35" not in cfg.get("machine", ""):
                raise TaskFailed("q35 machine model is not enabled")
            paths.append(devs)
        used = []
        for devs in paths:
            for d in devs:
                for other_id, other in self.state.data["vms"].items():
                    if (
                        other_id != str(vmid)
                        and other["status"] == "running"
                        and d["id"] in other.get("pci_in_use", [])
                    ):
                        raise TaskFailed(f"PCI device '{d['id']}' already in use by VMID '{other_id}'")
                used.append(d["id"])
        return used

    @staticmethod
    def _refuse_start(vm: dict, vmid: int, skiplock: bool) -> None:
        """What a start task checks first, with the VM's config locked (qemu-server
        src/PVE/QemuServer.pm@e6352be (9.2.6), vm_start): its lock (unless skiplock), then whether it runs.
        Both end the task in error; the call itself has answered its UPID."""
        if vm.get("lock") and not skiplock:
            raise TaskFailed(f"VM {vmid} is locked ({vm['lock']})")
        if vm["status"] == "running":
            raise TaskFailed(f"VM {vmid} already running")

    def _start_now(self, task, node: str, vmid: int, skiplock: bool = False) -> None:
        with self.lock:
            vm = self._vm(node, vmid)
            self._refuse_start(vm, vmid, skiplock)
            self._apply_pending(vm, vmid, only_live=False)
            pci = self._start_checks(node, vmid, vm)
            need = self._vm_memory_mib(vm["config"]) * 2**20
            if need > self._node_mem(node)["available"]:
                if pci:
                    task.log(
                        f"kvm: -device vfio-pci,host={pci[0]}: vfio {pci[0]}: failed to setup container "
                        "for group: memory listener initialization failed: Region pc.ram: "
                        "vfio_container_dma_map: VFIO_MAP_DMA failed: Cannot allocate memory"
                    )
                raise TaskFailed("start failed: QEMU exited with code 1")
            vm["status"] = "running"
            vm["started_at"] = time.time()
            vm["pid"] = random.randint(2000, 4_000_000)
            vm["pci_in_use"] = pci
            config = self.hook_config(node, vm["config"])
            self.state.mark()
        try:
            self.hooks.vm_started(node, vmid, config)
        except Exception as exc:
            with self.lock:
                vm.update(status="stopped", started_at=None, pci_in_use=[])
                self.state.mark()
            raise TaskFailed(f"start failed: lab host for VM {vmid} did not come up: {exc}") from exc

    def h_post_nodes_node_qemu_vmid_status_start(self, args, who):
        """The call checks only its parameters; the task refuses a locked or running VM
        (qemu-server src/PVE/API2/Qemu.pm@e6352be (9.2.6), vm_start: the checks are in the worker)."""
        with self.lock:
            node, vmid = args["node"], args["vmid"]
            self._vm(node, vmid)
            self._check_skiplock(args, who)
        skiplock = bool(args.get("skiplock"))
        started = []  # set once this task has made the VM run

        def body(task):
            with self.lock:
                self._refuse_start(self._vm(node, vmid), vmid, skiplock)
            self._sleep("qmstart")
            self._start_now(task, node, vmid, skiplock)
            started.append(True)

        def on_error(task, error):
            # A start task that ends in error leaves the VM stopped, as on PVE (QEMU is not left running):
            # one that failed after it made the VM run stops it; a refused one leaves the VM as it was.
            if started:
                self._stop_now(node, vmid)

        return self.tasks.start(node, "qmstart", str(vmid), who.userid, body, on_error)

    def _stop_now(self, node: str, vmid: int) -> None:
        with self.lock:
            vm = self._vm(node, vmid)
            was_running = vm["status"] == "running"
            vm["status"] = "stopped"
            vm["started_at"] = None
            vm["pci_in_use"] = []
            self.state.mark()
        if was_running:
            self._quiet_hook(self.hooks.vm_stopped, node, vmid)

    def _quiet_hook(self, hook, node: str, vmid: int, *args: Any) -> None:
        """Stop/destroy/resize hooks must not fail the PVE task: their failure goes to the server log."""
        try:
            hook(node, vmid, *args)
        except Exception as exc:
            print(f"labsim: {hook.__name__}({node}, {vmid}) failed: {exc!r}", flush=True)

    def _power_off(self, args, who, kind: str):
        """A qmshutdown (refused unless the VM runs) or qmstop (whatever its state) task."""
        with self.lock:
            node, vmid, vm = self._vm_to_change(args, who)
            if kind == "qmshutdown" and vm["status"] != "running":
                raise ApiError(500, f"VM {vmid} not running")

        def body(task):
            self._sleep(kind)
            self._stop_now(node, vmid)

        return self.tasks.start(node, kind, str(vmid), who.userid, body)

    def h_post_nodes_node_qemu_vmid_status_shutdown(self, args, who):
        return self._power_off(args, who, "qmshutdown")

    def h_post_nodes_node_qemu_vmid_status_stop(self, args, who):
        return self._power_off(args, who, "qmstop")

    def h_delete_nodes_node_qemu_vmid(self, args, who):
        with self.lock:
            node, vmid, vm = self._vm_to_change(args, who)
            if vm["status"] == "running":
                raise ApiError(500, f"VM {vmid} is running - destroy failed")
            vm["lock"] = "destroyed"
            self.state.mark()

        def body(task):
            self._sleep("qmdestroy")
            with self.lock:
                for storeid in self._node_storages(node):
                    keep = []
                    for v in self._volumes(node, storeid):
                        if v.get("vmid") == vmid:
                            task.log(f"Removing image: 100% complete...done. ({v['volid']})")
                        else:
                            keep.append(v)
                    self._set_volumes(node, storeid, keep)
                self.state.data["vms"].pop(str(vmid), None)
                self.state.mark()
            forget_installation(self.state_dir, vmid)  # a seeded guest's disk is gone with it
            self._quiet_hook(self.hooks.vm_destroyed, node, vmid)

        def on_error(task, error):
            vm["lock"] = None

        return self.tasks.start(node, "qmdestroy", str(vmid), who.userid, body, on_error)

    def h_get_nodes_node_qemu_vmid_agent_network_get_interfaces(self, args, who):
        node, vmid = args["node"], args["vmid"]
        with self.lock:
            vm = self._vm(node, vmid)
            if not self._agent_enabled(vm["config"]):
                raise ApiError(500, "No QEMU guest agent configured")
            if vm["status"] != "running":
                raise ApiError(500, f"VM {vmid} is not running")
            if time.time() - (vm.get("started_at") or 0) < float(self.timings["agent_delay"]):
                raise ApiError(500, "QEMU guest agent is not running")
            config = dict(vm["config"])
        try:
            result = self.hooks.guest_interfaces(node, vmid, config)
        except Exception as exc:  # the guest did not answer
            raise ApiError(500, "QEMU guest agent is not running") from exc
        return {"result": result}

    # ============================================================================ tasks
    def _task(self, args, who) -> dict:
        if parse_upid(args["upid"]) is None:
            raise ApiError(400, "unable to parse worker upid")
        rec = self.state.data["tasks"].get(args["upid"])
        if rec is None or rec["node"] != args["node"]:  # a node knows only its own tasks
            raise ApiError(500, "no such task")
        if rec["user"] != who.userid and not who.has(f"/nodes/{args['node']}", ["Sys.Audit"]):
            raise ApiError(403, f"Permission check failed (/nodes/{args['node']}, Sys.Audit)")
        return rec

    def h_get_nodes_node_tasks_upid_status(self, args, who):
        rec = self._task(args, who)
        out = {
            k: rec[k] for k in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user", "status")
        }
        if rec["status"] == "stopped":
            out["exitstatus"] = rec["exitstatus"]
        return out

    def h_get_nodes_node_tasks_upid_log(self, args, who):
        rec = self._task(args, who)
        lines = list(rec["log"])
        start, limit = int(args.get("start", 0)), int(args.get("limit", 50))
        window = lines[start : start + limit] if limit else lines[start:]
        return [{"n": start + i + 1, "t": t} for i, t in enumerate(window)], {"total": len(lines)}

    def h_get_nodes_node_tasks_upid(self, args, who):
        self._task(args, who)
        return [{"name": "log"}, {"name": "status"}]

    def h_delete_nodes_node_tasks_upid(self, args, who):
        rec = self._task(args, who)
        if rec["status"] == "running":
            raise ApiError(500, "stopping a running simulated task is not supported")
        return None

    def h_get_nodes_node_tasks(self, args, who):
        out = []
        for rec in sorted(self.state.data["tasks"].values(), key=lambda r: -r["starttime"]):
            if rec["node"] != args["node"]:
                continue
            if rec["user"] != who.userid and not who.has(f"/nodes/{args['node']}", ["Sys.Audit"]):
                continue
            if "vmid" in args and rec["id"] != str(args["vmid"]):
                continue
            if "typefilter" in args and rec["type"] != args["typefilter"]:
                continue
            if args.get("source") == "active" and rec["status"] != "running":
                continue
            if args.get("errors") and rec.get("exitstatus") in (None, "OK"):
                continue
            item = {k: rec[k] for k in ("upid", "node", "pid", "pstart", "starttime", "type", "id", "user")}
            if rec["status"] == "stopped":
                item["status"] = rec["exitstatus"]
                item["endtime"] = rec.get("endtime", rec["starttime"])
            out.append(item)
        start, limit = int(args.get("start", 0)), int(args.get("limit", 50))
        return out[start : start + limit], {"total": len(out)}

    def close(self) -> None:
        self.tasks.join(2.0)
        self.state.close()


def _hash_password(password: str) -> str:
    """PVE stores cloud-init passwords crypt()-hashed; a salted SHA-256 in crypt's shape stands in."""
    salt = secrets.token_hex(8)
    return f"$5${salt}${hashlib.sha256((salt + password).encode()).hexdigest()}"
