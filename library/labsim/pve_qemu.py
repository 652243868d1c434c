"""The PVE API simulator's qemu room: ``/nodes/{node}/qemu/...``, a node's VMs. Create (a task, with the VM
locked until it ends), config (POST async, PUT sync, ``digest``, pending changes of a running VM, disks
allocated and turned to ``unusedN``), resize, start (its checks in the task, as qemu-server's), shutdown,
stop, destroy, and the guest agent's interfaces through the VM hooks.
"""

from __future__ import annotations

import base64
import hashlib
import random
import re
import secrets
import time
import uuid
from typing import Any

from labsim.pve_auth import Principal
from labsim.pve_common import ApiError, GiB, check_digest, format_size, parse_size, print_drive, vm_memory_mib
from labsim.pve_tasks import TaskFailed

#: the most agent/file-read returns (qemu-server's $MAX_READ_SIZE, 16 MiB)
FILE_READ_MAX = 16 * 1024 * 1024

DISK_RE = re.compile(r"^(ide|sata|scsi|virtio)(\d+)$|^(efidisk0|tpmstate0)$")
NEW_DISK_RE = re.compile(r"^(([^/:\s]+):)?(\d+(\.\d+)?)$")
CLOUDINIT_RE = re.compile(r"^([^/:\s]+):cloudinit$")
UNUSED_RE = re.compile(r"^unused(\d+)$")

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


class AwaitTask:
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


def _hash_password(password: str) -> str:
    """PVE stores cloud-init passwords crypt()-hashed; a salted SHA-256 in crypt's shape stands in."""
    salt = secrets.token_hex(8)
    return f"$5${salt}${hashlib.sha256((salt + password).encode()).hexdigest()}"


class QemuHandlers:
    """The VMs (the state's ``vms``).

    Mixed into labsim.pve_api.PveApiSim; it uses the sim's ``state``, ``lock``, ``schema``, ``tasks``,
    ``timings``, ``hooks``, ``on_destroyed`` and ``_node``, the storage room's volumes (``_storage``,
    ``_volumes``, ``_find_volume``, ...), the mapping room's ``_map_entries``, ``_mapping_checks`` and
    ``hook_config``, and the nodes room's ``_node_mem`` and ``_pci_functions``."""

    state: Any
    schema: Any

    def _vm(self, node: str, vmid: int) -> dict:
        vm = self.state.data["vms"].get(str(vmid))
        if vm is None or vm["node"] != node:
            raise ApiError(500, f"Configuration file 'nodes/{node}/qemu-server/{vmid}.conf' does not exist")
        return vm

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
            raise ApiError(500, f"VM is locked ({vm['lock']})")

    def _sleep(self, kind: str) -> None:
        time.sleep(float(self.timings.get(kind, 0.2)))

    def _mac(self) -> str:
        rnd = random.SystemRandom()
        return "BC:24:11:" + ":".join(f"{rnd.randrange(256):02X}" for _ in range(3))

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
            "maxmem": vm_memory_mib(cfg) * 2**20,
            "mem": vm_memory_mib(cfg) * 2**20 // 2 if running else 0,
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

    # ------------------------------------------------------------------------------ list and create
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
            return print_drive(volid, drive)
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
        return print_drive(volid, drive)

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
            return print_drive(file, drive)
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
                    node,
                    storeid,
                    [
                        v
                        for v in self._volumes(node, storeid)
                        if v.get("vmid") != vmid or v.get("content") == "backup"
                    ],
                )
            self.state.mark()

        return self.tasks.start(node, "qmcreate", str(vmid), who.userid, body, on_error)

    # --------------------------------------------------------------------------------------- config
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
            check_digest(args, self._digest(vm))
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
            return AwaitTask(self.state.data["tasks"][upid], int(args["background_delay"]))
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

    # --------------------------------------------------------------------------------------- resize
    def h_put_nodes_node_qemu_vmid_resize(self, args, who):
        node, vmid, disk = args["node"], args["vmid"], args["disk"]
        with self.lock:
            vm = self._vm(node, vmid)
            check_digest(args, self._digest(vm))
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
                vm["config"][disk] = print_drive(file, drive)
                self.state.mark()
                config = dict(vm["config"])
            self._quiet_hook(self.hooks.vm_resized, node, vmid, disk, new, config)

        return self.tasks.start(node, "resize", str(vmid), who.userid, body)

    # ------------------------------------------------------------------------ power, destroy, agent
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

    def _snippet_checks(self, node: str, cfg: dict) -> None:
        """The cloud-init snippets of ``cicustom``, read when the start builds the cloud-init drive: each one's
        storage is activated first, and a disabled one ends the start (qemu-server
        src/PVE/QemuServer/Cloudinit.pm@e6352be6, read_cloudinit_snippets_file; pve-storage
        src/PVE/Storage.pm@0c56bad8, abs_filesystem_path -> activate_volumes -> activate_storage ->
        storage_check_enabled). qemu-server does not check the storage's `snippets` content type."""
        if not cfg.get("cicustom") or not any("cloudinit" in str(v) for v in cfg.values()):
            return
        for part in str(cfg["cicustom"]).split(","):
            volid = part.split("=", 1)[-1]
            if ":" in volid:
                storeid = volid.split(":", 1)[0]
                if self._storage(node, storeid).get("disable"):
                    raise TaskFailed(f"storage '{storeid}' is disabled")

    @staticmethod
    def _refuse_start(vm: dict, vmid: int, skiplock: bool) -> None:
        """What a start task checks first, with the VM's config locked (qemu-server
        src/PVE/QemuServer.pm@e6352be (9.2.6), vm_start): its lock (unless skiplock), then whether it runs.
        Both end the task in error; the call itself has answered its UPID."""
        if vm.get("lock") and not skiplock:
            raise TaskFailed(f"VM is locked ({vm['lock']})")
        if vm["status"] == "running":
            raise TaskFailed(f"VM {vmid} already running")

    def _start_now(self, task, node: str, vmid: int, skiplock: bool = False) -> None:
        with self.lock:
            vm = self._vm(node, vmid)
            self._refuse_start(vm, vmid, skiplock)
            self._apply_pending(vm, vmid, only_live=False)
            pci = self._start_checks(node, vmid, vm)
            self._snippet_checks(node, vm["config"])
            need = vm_memory_mib(vm["config"]) * 2**20
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
                        # a destroy removes the VM's disks, never its backups (content backup)
                        if v.get("vmid") == vmid and v.get("content") != "backup":
                            task.log(f"Removing image: 100% complete...done. ({v['volid']})")
                        else:
                            keep.append(v)
                    self._set_volumes(node, storeid, keep)
                self.state.data["vms"].pop(str(vmid), None)
                self.state.mark()
            self.on_destroyed(vmid)  # e.g. a seeded guest's installation, gone with its disk
            self._quiet_hook(self.hooks.vm_destroyed, node, vmid)

        def on_error(task, error):
            vm["lock"] = None

        return self.tasks.start(node, "qmdestroy", str(vmid), who.userid, body, on_error)

    # --------------------------------------------------------------------------------------- backup
    def h_post_nodes_node_vzdump(self, args, who):
        """A backup of one VM (`vmid`) to a storage, as pve-manager's vzdump endpoint and its worker do
        (PVE/API2/VZDump.pm, PVE/VZDump.pm@f6997e69): Datastore.AllocateSpace on the storage is checked by the
        call, VM.Backup on the guest by the task; the task (type vzdump, id the VMID) fails when the storage
        does not take backups, and writes `vzdump-qemu-<vmid>-<YYYY_MM_DD-HH_MM_SS>.vma.zst` (zstd) into the
        storage's dump directory, which a later destroy of the VM leaves alone. Only what gpulab sends is
        served: one VMID and a storage."""
        node = args["node"]
        vmids = [v for v in re.split(r"[,;\s]+", str(args.get("vmid") or "")) if v]
        if len(vmids) != 1 or args.get("all") or args.get("pool") or "storage" not in args:
            raise ApiError(501, "the simulated vzdump backs up one VM (vmid) to a storage (storage) only")
        vmid, storeid = int(vmids[0]), args["storage"]
        who.require(f"/storage/{storeid}", ["Datastore.AllocateSpace"])
        self._vm(node, vmid)
        compress = args.get("compress", "0")
        ext = {"zstd": ".vma.zst", "gzip": ".vma.gz", "1": ".vma.lzo", "lzo": ".vma.lzo"}.get(
            compress, ".vma"
        )

        def body(task):
            task.log(f"INFO: starting new backup job: vzdump {vmid} --storage {storeid} --mode "
                     f"{args.get('mode', 'snapshot')} --compress {compress}")  # fmt: skip
            with self.lock:
                store = self._storage(node, storeid)
                if "backup" not in store["content"]:
                    raise TaskFailed(
                        f"could not get storage information for '{storeid}': can't use storage '{storeid}' "
                        "for backups - wrong content type"
                    )
                if not who.has(f"/vms/{vmid}", ["VM.Backup"]):
                    raise TaskFailed(f"permission check failed (/vms/{vmid}, VM.Backup)")
                vm = self._vm(node, vmid)
                disks = [
                    v for s in self._node_storages(node) for v in self._volumes(node, s)
                    if v.get("vmid") == vmid and v.get("content") == "images"
                ]  # fmt: skip
                size = max(1, sum(int(v["size"]) for v in disks) // 20)  # zstd of mostly empty disks
                stamp = time.strftime("%Y_%m_%d-%H_%M_%S", time.gmtime())
                name = f"vzdump-qemu-{vmid}-{stamp}{ext}"
                self._volumes(node, storeid).append(
                    {
                        "volid": f"{storeid}:backup/{name}",
                        "content": "backup",
                        "format": ext.lstrip("."),
                        "size": size,
                        "vmid": vmid,
                        "ctime": int(time.time()),
                    }
                )
                self.state.mark()
                path = f"{store.get('path', '/mnt/pve/' + storeid)}/dump/{name}"
                task.log(f"INFO: Starting Backup of VM {vmid} (qemu)")
                task.log(f"INFO: VM Name: {vm['config'].get('name', '')}")
                task.log(f"INFO: creating vzdump archive '{path}'")
            self._sleep("vzdump")
            task.log(f"INFO: Finished Backup of VM {vmid}")
            task.log("INFO: Backup job finished successfully")

        return self.tasks.start(node, "vzdump", str(vmid), who.userid, body)

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

    def h_get_nodes_node_qemu_vmid_agent_file_read(self, args, who):
        """A file of the guest as its agent reads it (qemu-server's API2/Qemu/Agent.pm, UPSTREAM.md
        pve.agent.file-read): the agent must be configured, the VM running and its agent up; a file the
        guest cannot open fails as the agent's file-open does."""
        node, vmid, path = args["node"], args["vmid"], str(args["file"])
        with self.lock:
            vm = self._vm(node, vmid)
            if "agent" not in vm["config"]:
                raise ApiError(500, "No QEMU guest agent configured")
            if vm["status"] != "running":
                raise ApiError(500, f"VM {vmid} is not running")
            if not self._agent_enabled(vm["config"]) or time.time() - (vm.get("started_at") or 0) < float(
                self.timings["agent_delay"]
            ):
                raise ApiError(500, "QEMU guest agent is not running")
            config = dict(vm["config"])
        try:
            data = self.hooks.guest_file_read(node, vmid, config, path)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ApiError(
                500,
                f"VM {vmid} qga command 'guest-file-open' failed - failed to open file '{path}' "
                f"(mode: 'r'): {reason}",
            ) from exc
        except Exception as exc:  # the guest did not answer
            raise ApiError(500, "QEMU guest agent is not running") from exc
        offset = int(args.get("offset") or 0)
        count = int(args.get("count") or FILE_READ_MAX)
        chunk = data[offset : offset + count]
        decode = args.get("decode") in (None, True, 1, "1", "true")
        content = chunk.decode("utf-8", "surrogateescape") if decode else base64.b64encode(chunk).decode()
        out: dict[str, Any] = {"content": content, "bytes-read": len(chunk)}
        if offset + count < len(data):
            out["truncated"] = 1
        return out
