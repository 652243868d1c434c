"""Bring one QEMU VM to a declared state: present, started, stopped or absent.

`build_config` turns the module's options (cores, disks, NICs, GPU, cloud-init, ...) into PVE config keys
through the option table of `vmoptions`.
`ensure_vm` reads the VM (one cluster-resources call and one config call), compares with
`vmconfig.diff`, writes only the difference in one config call (removed keys through `delete`, `digest`
for optimistic locking), grows disks, waits for each task, re-reads and reports before/after. A new VM
is made by one create call. Hardware changes to a running VM stay pending in PVE; the result says a
restart is needed, and `restart=True` does it.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.pve import vmconfig, vmoptions
from gpulab.pve.client import PveClient, PveError, PveTaskError

# Options PVE applies to a running VM at once (qemu-server's "fast plug" options); anything else
# written to a running VM may stay pending until a restart.
IMMEDIATE_KEYS = frozenset(
    {
        "name",
        "description",
        "tags",
        "onboot",
        "startup",
        "protection",
        "shares",
        "hookscript",
        "vmstatestorage",
        "lock",
        "migrate_downtime",
        "migrate_speed",
        "ciuser",
        "cipassword",
        "ciupgrade",
        "sshkeys",
        "nameserver",
        "searchdomain",
        "citype",
        "cicustom",
    }
)


class VmError(Exception):
    """A VM cannot be brought to the spec; the message says why and what to do."""


@dataclass
class VmSpec:
    node: str
    vmid: int
    name: str
    config: dict[str, Any]
    # Indexed key families the spec owns completely: keys of these families absent from `config` are
    # removed (net, hostpci). Disks are never removed implicitly.
    own_families: tuple[str, ...] = ()
    # The config a new VM is created with, when it holds more than `config` (options used only at
    # creation, vmoptions' `create_only`); None: `config`.
    create_config: dict[str, Any] | None = None
    # Current values that meet a desired key although spelt otherwise (vmoptions.equivalents).
    equivalents: dict[str, str] = field(default_factory=dict)
    # Whether this login may write a raw hostpci (root@pam with a password); None: not checked here.
    may_touch_raw_pci: bool | None = None


def build_config(*, name: str, **options: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The PVE config keys for the module's options (`gpulab.pve.vmoptions`), and the families they own.

    Options left at None are not managed.
    """
    try:
        return vmoptions.build({"name": name, **options})
    except vmoptions.OptionError as exc:
        raise VmError(str(exc)) from None


def build_spec(
    node: str,
    vmid: int,
    options: Mapping[str, Any],
    create_only: tuple[str, ...] | list[str] = (),
    may_touch_raw_pci: bool | None = None,
) -> VmSpec:
    """The VmSpec of the module's options (`name` among them): `create_only` options go into the config
    a new VM is created with and are left out of the one an existing VM is brought to."""
    config, families = build_config(**options)
    spec = VmSpec(node, vmid, options["name"], config, families, may_touch_raw_pci=may_touch_raw_pci)
    if create_only:
        managed = {k: v for k, v in options.items() if k not in create_only}
        spec.create_config = config
        spec.config, spec.own_families = build_config(**managed)
    spec.equivalents = vmoptions.equivalents(options)
    return spec


@dataclass
class VmResult:
    changed: bool = False
    created: bool = False
    status: str = "absent"
    # The VM's power state when the run found it (absent, stopped or running).
    status_before: str = "absent"
    before: dict[str, str] = field(default_factory=dict)
    after: dict[str, str] = field(default_factory=dict)
    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)
    resize: dict[str, str] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    restart_needed: bool = False
    restarted: bool = False
    actions: list[str] = field(default_factory=list)
    mac: str | None = None
    # With state absent: why the VM was kept instead of destroyed (it is not gpulab's); None otherwise.
    kept: str | None = None
    # With state absent and a backup storage: the archive vzdump wrote, as its log names it (None in check mode).
    backup: str | None = None
    # The config as PVE returns it (GET .../config, pending values applied) when this run read or wrote
    # it last; None in check mode once a change is planned (PVE does not hold that config).
    current: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _find(resources: list[dict[str, Any]], vmid: int) -> dict[str, Any] | None:
    for entry in resources or ():
        if int(entry.get("vmid", -1)) == int(vmid):
            return entry
    return None


def net0_mac(config: Mapping[str, str]) -> str | None:
    """The MAC of the VM's first NIC (net0), lower case; None without one."""
    net0 = config.get("net0")
    if not net0:
        return None
    props = vmconfig.NET_FORMAT.parse(net0) or {}
    mac = props.get("macaddr")
    return mac.lower() if mac else None


def tags_of(config: Mapping[str, Any]) -> list[str]:
    """The VM's PVE tags (config key `tags`: separated by `;`, `,` or spaces, as PVE accepts them)."""
    return [t for t in re.split(r"[;,\s]+", str(config.get("tags") or "")) if t]


def _shown(params: Mapping[str, Any]) -> dict[str, Any]:
    """Values as reported back: write-only keys (passwords) are never echoed."""
    return {k: ("(secret)" if vmconfig.key_info(k).write_only else v) for k, v in params.items()}


def _family_deletes(spec: VmSpec, current: Mapping[str, Any]) -> dict[str, None]:
    out: dict[str, None] = {}
    for key in current:
        for fam in spec.own_families:
            if key.startswith(fam) and key[len(fam) :].isdigit() and key not in spec.config:
                out[key] = None
    return out


def _is_raw_pci(value: Any) -> bool:
    props = vmconfig.HOSTPCI_FORMAT.parse(value) or {}
    return bool(props.get("host")) and not props.get("mapping")


def desired_update(spec: VmSpec, current: Mapping[str, Any]) -> dict[str, Any]:
    """What an existing VM is brought to: the spec's config, the owned families' extra keys removed,
    and each key whose current value is an equivalent of the desired one left as it is.

    Raises VmError before anything is written when the change would replace or remove a raw hostpci
    and the login may not (PVE lets only root@pam touch one).
    """
    desired = dict(spec.config)
    desired.update(_family_deletes(spec, current))
    for key, same in spec.equivalents.items():
        have = current.get(key)
        if have is not None and vmconfig.normalize_value(key, have) == vmconfig.normalize_value(key, same):
            desired[key] = have
    if spec.may_touch_raw_pci is False:
        for key, want in desired.items():
            have = current.get(key)
            if not key.startswith("hostpci") or have is None or not _is_raw_pci(have):
                continue
            if want is None or vmconfig.normalize_value(key, want) != vmconfig.normalize_value(key, have):
                raise VmError(
                    f"VM {spec.vmid} ({spec.name}) has {key}: {have} attached raw, which PVE lets only root@pam "
                    f"(password login) change, and the spec wants {want or 'it removed'}: keep the raw "
                    "attachment (leave vm_gpu_passthrough unset), or run stage vms once with root@pam "
                    "(pve_api_user: root@pam and pve_api_password) to move it to the mapping"
                )
    return desired


# Why a start task fails, read from its exit status (qemu-server src/PVE/QemuServer.pm and
# src/PVE/QemuServer/PCI.pm@e6352be (9.2.6): PVE takes a config with a missing mapping and refuses it only when
# the VM starts), and what to do about it. {vmid}, {name}, {node} are the VM's; the pattern's groups follow.
START_FIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"PCI device mapping not found for '(?P<mapping>[^']+)'"),
        "PVE has no PCI resource mapping '{mapping}' with an entry for node {node}: create it with an entry "
        "for that node (pve_pci_mapping; stage vms maps every card of a node's pve_gpus, so check that "
        "the VM's vm_gpu names a card in pve_gpus of node {node}), or give hostpci a mapping that exists, "
        "then run again",
    ),
    (
        re.compile(r"PCI device mapping invalid"),
        "the mapping no longer matches the card the node reports (a card moved or was replaced): run stage "
        "vms again, which writes each map entry from the node's own IDs, or correct the entry under "
        "Datacenter > Resource Mappings",
    ),
    (
        re.compile(r"VM \d+ already running"),
        "VM {vmid} was started by someone else after this run found it stopped (gpulab starts only a VM it "
        "finds stopped): run again, which finds it running and leaves it so",
    ),
    (
        re.compile(r"VM (?:\d+ )?is locked \((?P<lock>[^)]+)\)"),
        "another task holds VM {vmid} ({lock}): wait for it to end and run again, or clear a stale lock "
        "with `qm unlock {vmid}` on node {node}",
    ),
    (
        re.compile(r"already in use by VMID '(?P<other>\d+)'"),
        "the card is passed through to VM {other}, which runs: stop that VM, or give VM {vmid} another card",
    ),
    (
        re.compile(r"q35 machine model is not enabled"),
        "a PCI-Express passthrough (pcie=1) needs machine q35: set the VM's machine to q35",
    ),
    (
        re.compile(r"no PCI device found for '(?P<path>[^']+)'"),
        "node {node} has no PCI device {path}: check the card's address with lspci on the node and correct it",
    ),
    (
        re.compile(r"Cannot set both 'host' and 'mapping'|Either 'host' or 'mapping' must be set"),
        "each hostpci entry needs exactly one of host (a raw address) and mapping (a resource mapping id)",
    ),
    (
        re.compile(r"QEMU exited with code"),
        "QEMU did not start (the log line above says why; with a passed-through card, 'Cannot allocate memory' "
        "means the node lacks free memory to pin all of the VM's memory): stop another VM on node {node} or "
        "give this one less memory",
    ),
)


def start_failure(exc: PveTaskError, vmid: int, name: str, node: str) -> VmError:
    """The error of a failed start task: its log's last lines (the task's own words) and what to do."""
    status = exc.message.removeprefix("task failed: ")
    lines = [line for line in exc.log if line.strip()][-3:] or [f"TASK ERROR: {status}"]
    fix = (
        f"read the whole task log in the PVE web UI (node {node} > Tasks) or with "
        f"`pvesh get /nodes/{node}/tasks/{exc.upid}/log`"
    )
    for pattern, text in START_FIXES:
        m = pattern.search(status)
        if m:
            fix = text.format(vmid=vmid, name=name, node=node, **m.groupdict())
            break
    log = " / ".join(lines)
    return VmError(
        f"starting VM {vmid} ({name}) on node {node} failed, PVE's task log ends: {log}. Fix: {fix}"
    )


class VmManager:
    """Runs `ensure` for one VM over one client. `log` receives progress lines (optional)."""

    def __init__(
        self,
        client: PveClient,
        spec: VmSpec,
        *,
        check_mode: bool = False,
        timeout: float = 600,
        lock_timeout: float = 60,
        log: Callable[[str], None] | None = None,
        owner_tag: str | None = None,
        destroy_untagged: bool = False,
        backup_storage: str | None = None,
    ):
        """With state absent: `owner_tag` keeps a VM that does not carry that tag (one gpulab did not create)
        unless `destroy_untagged`; `backup_storage` takes a vzdump backup there before the destroy."""
        self.client = client
        self.spec = spec
        self.check_mode = check_mode
        self.timeout = timeout
        self.lock_timeout = lock_timeout
        self.log = log or (lambda _msg: None)
        self.owner_tag = owner_tag
        self.destroy_untagged = destroy_untagged
        self.backup_storage = backup_storage
        self.base = f"nodes/{spec.node}/qemu/{spec.vmid}"

    # ---------------------------------------------------------------------------------------- reads

    def _lookup(self) -> dict[str, Any] | None:
        entry = _find(self.client.get("cluster/resources", type="vm"), self.spec.vmid)
        if entry is None:
            return None
        if entry.get("type") not in (None, "qemu"):
            raise VmError(f"ID {self.spec.vmid} belongs to a {entry.get('type')} guest, not a QEMU VM")
        if entry.get("node") not in (None, self.spec.node):
            raise VmError(
                f"VM {self.spec.vmid} exists on node {entry.get('node')!r}, not {self.spec.node!r}: migrate it "
                "or correct vm_node in the inventory"
            )
        return entry

    def _check_name(self, entry: dict[str, Any] | None) -> dict[str, Any] | None:
        if entry is not None and entry.get("name") not in (None, self.spec.name):
            raise VmError(
                f"VM {self.spec.vmid} on {self.spec.node} is named {entry.get('name')!r}, the spec says "
                f"{self.spec.name!r}: refusing to take over another VM; pick a free vm_id or rename it"
            )
        return entry

    def _unlocked(self, entry: dict[str, Any]) -> dict[str, Any] | None:
        """Wait (bounded) until the VM carries no lock; return its fresh resources entry."""
        waited = 0.0
        while entry is not None and entry.get("lock"):
            if waited >= self.lock_timeout:
                raise VmError(
                    f"VM {self.spec.vmid} is locked ({entry['lock']}) for more than {self.lock_timeout:.0f}s; "
                    f"wait for the running task to end, or clear a stale lock with `qm unlock {self.spec.vmid}`"
                )
            self.log(f"VM {self.spec.vmid} is locked ({entry['lock']}), waiting")
            time.sleep(1)
            waited += 1
            entry = self._lookup()
        return entry

    def _settle(self) -> bool:
        """Wait for the VM's tasks that still run (bounded by lock_timeout), before this run writes to it.

        A run killed or cut off while a task of it ran (a start, a resize, an update) leaves that task running
        in PVE: the next run must not start or resize the VM a second time over it. One GET of the node's
        active tasks for this VM, made only when a write is about to happen (a run that changes nothing never
        asks). Returns whether it waited for any (the caller then reads the VM again)."""
        spec = self.spec
        active = self.client.get(f"nodes/{spec.node}/tasks", vmid=spec.vmid, source="active") or []
        running = [t["upid"] for t in active if t.get("upid") and t.get("status") in (None, "running")]
        for upid in running:
            self.log(f"VM {spec.vmid} has a task still running ({upid}), waiting for it")
            try:
                self.client.wait_task(spec.node, upid, self.lock_timeout, what=f"the earlier task {upid}")
            except PveTaskError as exc:
                if exc.message.startswith("task still running"):
                    raise VmError(
                        f"VM {spec.vmid} ({spec.name}) has a task running for more than {self.lock_timeout:.0f}s "
                        f"({upid}), probably left by an interrupted run: wait for it to end (node {spec.node} > "
                        "Tasks), then run again"
                    ) from exc
                self.log(f"the earlier task {upid} ended in error: {exc.message}")
        return bool(running)

    def _config(self) -> dict[str, Any]:
        return self.client.get(f"{self.base}/config")

    def _pending_view(self) -> tuple[dict[str, Any], list[str]]:
        """A running VM's config as it will be after a restart, and the keys still pending.

        One GET of .../pending gives both: every key with its current `value`, its `pending` value, or a
        `delete` mark. (GET .../config would show the same values but not which of them are pending.)
        """
        entries = self.client.get(f"{self.base}/pending") or []
        config: dict[str, Any] = {}
        pending: list[str] = []
        for e in entries:
            key = e.get("key")
            if not key:
                continue
            if int(e.get("delete") or 0) > 0:
                pending.append(key)
                continue
            if "pending" in e:
                pending.append(key)
                config[key] = e["pending"]
            elif "value" in e:
                config[key] = e["value"]
        return config, sorted(pending)

    def _wait(self, upid: Any, what: str) -> None:
        if isinstance(upid, str) and upid.startswith("UPID:"):
            self.client.wait_task(self.spec.node, upid, self.timeout, what=what)

    # --------------------------------------------------------------------------------------- writes

    def _power(self, action: str, **params: Any) -> None:
        upid = self.client.post(f"{self.base}/status/{action}", **params)
        try:
            self._wait(upid, f"{action} VM {self.spec.vmid}")
        except PveTaskError as exc:
            if action != "start" or not exc.message.startswith("task failed: "):
                raise  # a start still running at the timeout says so itself
            raise start_failure(exc, self.spec.vmid, self.spec.name, self.spec.node) from exc

    def _backup(self, storage: str) -> str | None:
        """A vzdump backup of the VM to `storage` (mode stop: consistent, the VM is shut down for it and
        started again if it ran; zstd), waited for; the archive its task log names, if it names one."""
        spec = self.spec
        self.log(
            f"backing up VM {spec.vmid} ({spec.name}) to storage {storage} (vzdump) before destroying it"
        )
        upid = self.client.post(
            f"nodes/{spec.node}/vzdump", vmid=str(spec.vmid), storage=storage, mode="stop", compress="zstd"
        )
        try:
            self._wait(upid, f"back up VM {spec.vmid} to {storage}")
        except PveTaskError as exc:
            raise VmError(
                f"the backup of VM {spec.vmid} ({spec.name}) to storage {storage!r} failed, so the VM was NOT "
                f"destroyed: {exc.message}. Fix: name a storage whose content includes 'backup' (Datacenter > "
                "Storage > Edit > Content) with room for the VM's disks, then run again"
            ) from exc
        if not isinstance(upid, str):
            return None
        for line in self.client.task_log(spec.node, upid, tail=50):
            m = re.search(r"creating vzdump archive '([^']+)'", line)
            if m:
                return m.group(1)
        return None

    def _shutdown(self) -> None:
        self._power("shutdown", timeout=int(min(self.timeout, 300)), forceStop=1)

    def ensure(self, state: str, restart: bool = False) -> VmResult:
        if state not in ("present", "started", "stopped", "absent", "restarted"):
            raise ValueError(f"unknown state {state!r}")
        spec = self.spec
        res = VmResult()
        entry = self._check_name(self._unlocked(self._lookup()))
        running = bool(entry) and entry.get("status") == "running"
        res.status_before = "absent" if entry is None else "running" if running else "stopped"
        if state == "restarted":
            return self._restart_now(entry, running, res)
        if state == "absent":
            if entry is None:
                return res
            config = self._config()
            res.before = vmconfig.view(config)
            if self.owner_tag and self.owner_tag not in tags_of(config) and not self.destroy_untagged:
                res.status = res.status_before
                res.kept = (
                    f"VM {spec.vmid} ({spec.name}) does not carry the tag {self.owner_tag!r}: gpulab did not create "
                    "it (it was adopted), so it is kept with its disks. To destroy it as well, name it: "
                    f"-e gpulab_teardown_adopted={spec.name}"
                )
                return res
            res.changed = True
            res.status = "absent"
            if self.backup_storage:
                res.actions.append("backup")
            res.actions.append("destroy")
            if not self.check_mode:
                if self.backup_storage:
                    res.backup = self._backup(self.backup_storage)
                if running:
                    self._power("stop")
                upid = self.client.delete(self.base, purge=1, **{"destroy-unreferenced-disks": 1})
                self._wait(upid, f"destroy VM {spec.vmid}")
            return res

        if entry is None:
            res.created = res.changed = True
            res.actions.append("create")
            create = spec.config if spec.create_config is None else spec.create_config
            desired = {k: v for k, v in create.items() if v is not None}
            params, resizes = vmconfig.create_params(desired)
            res.set = _shown(params)
            res.resize = dict(resizes)
            res.after = vmconfig.view(desired)
            res.status = "stopped"
            if not self.check_mode:
                upid = self.client.post(f"nodes/{spec.node}/qemu", vmid=spec.vmid, **params)
                self._wait(upid, f"create VM {spec.vmid} ({spec.name})")
                for disk, size in resizes.items():
                    upid = self.client.put(f"{self.base}/resize", disk=disk, size=size)
                    self._wait(upid, f"resize {disk} of VM {spec.vmid} to {size}")
                after = self.client.get(f"{self.base}/config")
                res.after = vmconfig.view(after)
                res.mac = net0_mac(after)
                res.current = after
        else:
            if running:
                current, pending = self._pending_view()
            else:
                current, pending = self._config(), []
            change = vmconfig.diff(current, desired_update(spec, current))
            if change.refused:
                raise VmError(f"VM {spec.vmid} ({spec.name}): " + "; ".join(change.refused))
            res.before, res.after = change.before, change.after
            res.set, res.delete, res.resize = _shown(change.set), change.delete, change.resize
            res.status = "running" if running else "stopped"
            res.mac = net0_mac(current)
            res.pending = pending
            res.current = None if change.changed else current
            if change.changed:
                res.changed = True
                if change.set or change.delete:
                    res.actions.append("update")
                if change.resize:
                    res.actions.append("resize")
                if running:
                    touched = set(change.set) | set(change.delete)
                    res.pending = sorted(set(pending) | (touched - IMMEDIATE_KEYS))
                if not self.check_mode:
                    settled = self._settle()
                    if settled:
                        entry = self._unlocked(self._lookup()) or entry
                        running = entry.get("status") == "running"
                        res.status = "running" if running else "stopped"
                    if running or settled:
                        # The digest is in GET config only; diff again against exactly that config.
                        current = self._config()
                        change = vmconfig.diff(current, desired_update(spec, current))
                        if change.refused:
                            raise VmError(f"VM {spec.vmid} ({spec.name}): " + "; ".join(change.refused))
                    self._apply(change, current.get("digest"))
                    if running:
                        after, res.pending = self._pending_view()
                    else:
                        after = self._config()
                    res.after = vmconfig.view(after)
                    res.mac = net0_mac(after)
                    res.current = after
            res.restart_needed = running and bool(res.pending)

        if res.restart_needed and restart and state in ("present", "started"):
            res.actions.append("restart")
            res.restarted = res.changed = True
            if not self.check_mode:
                self._shutdown()
                self._power("start")
            res.restart_needed = False
            res.pending = []
            res.status = "running"
        elif state == "started" and res.status != "running":
            res.changed = True
            res.actions.append("start")
            if not self.check_mode:
                # an interrupted run's start may still be running: wait for it rather than start twice (a VM
                # this run created has no earlier task)
                again = self._lookup() if not res.created and self._settle() else None
                if again is None or again.get("status") != "running":
                    self._power("start")
            res.status = "running"
        elif state == "stopped" and res.status == "running":
            res.changed = True
            res.actions.append("shutdown")
            if not self.check_mode:
                self._shutdown()
            res.status = "stopped"
            res.restart_needed = False
        return res

    def _restart_now(self, entry: dict | None, running: bool, res: VmResult) -> VmResult:
        """Shut the VM down (if it runs) and start it, leaving its config alone: a guest takes
        a new DHCP lease this way, on real hardware as in the lab."""
        if entry is None:
            raise VmError(f"VM {self.spec.vmid} does not exist on node {self.spec.node}: nothing to restart")
        config = self._config()
        res.before = res.after = vmconfig.view(config)
        res.mac = net0_mac(config)
        res.current = config
        res.changed = res.restarted = True
        res.actions += ["shutdown", "start"] if running else ["start"]
        if not self.check_mode:
            if running:
                self._shutdown()
            self._power("start")
        res.status = "running"
        return res

    def _apply(self, change: vmconfig.ConfigChange, digest: str | None) -> None:
        spec = self.spec
        if change.set or change.delete:
            params: dict[str, Any] = dict(change.set)
            if change.delete:
                params["delete"] = ",".join(change.delete)
            if digest:
                params["digest"] = digest
            try:
                upid = self.client.post(f"{self.base}/config", **params)
            except PveError as exc:
                if "digest" in str(exc).lower() or "config file has been modified" in str(exc).lower():
                    raise VmError(
                        f"VM {spec.vmid} changed while gpulab was updating it ({exc}); run again"
                    ) from exc
                raise
            self._wait(upid, f"update VM {spec.vmid} ({spec.name})")
        for disk, size in change.resize.items():
            upid = self.client.put(f"{self.base}/resize", disk=disk, size=size)
            self._wait(upid, f"resize {disk} of VM {spec.vmid} to {size}")


def guest_addresses(client: PveClient, node: str, vmid: int) -> list[dict[str, str]]:
    """IPv4 addresses the guest agent reports, loopback left out: [{name, mac, address}]."""
    data = client.get(f"nodes/{node}/qemu/{vmid}/agent/network-get-interfaces") or {}
    out = []
    for iface in data.get("result", []):
        if iface.get("name") == "lo":
            continue
        for addr in iface.get("ip-addresses", []) or []:
            if addr.get("ip-address-type") == "ipv4" and not str(addr.get("ip-address", "")).startswith(
                "127."
            ):
                out.append(
                    {
                        "name": iface.get("name", ""),
                        "mac": str(iface.get("hardware-address", "")).lower(),
                        "address": addr["ip-address"],
                    }
                )
    return out


def wait_for_address(
    client: PveClient, node: str, vmid: int, mac: str | None, timeout: float, poll: float = 0.5
) -> dict[str, str]:
    """Poll the guest agent until it reports an IPv4 address (on the NIC with `mac`, if given)."""
    deadline = time.monotonic() + timeout
    last_error = ""
    while True:
        try:
            for entry in guest_addresses(client, node, vmid):
                if mac is None or entry["mac"] == mac.lower():
                    return entry
            last_error = "the agent reports no IPv4 address yet"
        except PveError as exc:
            last_error = exc.message
        if time.monotonic() >= deadline:
            raise VmError(
                f"VM {vmid} reported no address through the guest agent within {timeout:.0f}s "
                f"(last answer: {last_error}); check that qemu-guest-agent runs in the guest and that the "
                "VM option agent is on"
            )
        time.sleep(poll)
        poll = min(poll * 1.5, 5.0)


#: the public host keys an Ubuntu cloud image's cloud-init makes at first boot (module ssh), in the order
#: OpenSSH prefers them
HOST_KEY_FILES = (
    "/etc/ssh/ssh_host_ed25519_key.pub",
    "/etc/ssh/ssh_host_ecdsa_key.pub",
    "/etc/ssh/ssh_host_rsa_key.pub",
)
HOST_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)

#: how the guest agent's file-open says the guest has no such file (qemu's qga, through PVE's QMP client)
FILE_MISSING = ("failed to open file", "No such file or directory")


def host_key_line(text: str, path: str) -> str:
    """`TYPE BASE64` of a public key file's first line (its comment left out); ValueError when it is none."""
    fields = text.strip().splitlines()[0].split() if text.strip() else []
    if len(fields) < 2 or fields[0] not in HOST_KEY_TYPES:
        raise ValueError(f"{path} does not hold an SSH public host key (it reads {text[:60]!r})")
    try:
        base64.b64decode(fields[1], validate=True)
    except ValueError as exc:
        raise ValueError(f"{path} does not hold an SSH public host key: {exc}") from exc
    return f"{fields[0]} {fields[1]}"


def read_host_keys(
    client: PveClient,
    node: str,
    vmid: int,
    timeout: float,
    files: tuple[str, ...] = HOST_KEY_FILES,
    poll: float = 0.5,
) -> list[str]:
    """The guest's SSH public host keys (`TYPE BASE64`), read through the guest agent (agent/file-read), a
    channel as trusted as the API's pinned TLS: no private key travels and nothing is taken from the network
    the guest answers on. Waits until the agent answers (it runs once cloud-init has installed it, after the
    keys were made); a key type the guest lacks is left out, and a guest with none is an error."""
    deadline = time.monotonic() + timeout
    while True:
        keys, missing = [], []
        try:
            for path in files:
                try:
                    data = client.get(f"nodes/{node}/qemu/{vmid}/agent/file-read", file=path) or {}
                except PveError as exc:
                    if exc.status is not None and exc.status < 500:  # refused (the token's privileges...)
                        raise VmError(f"VM {vmid}: reading {path} through the guest agent: {exc}") from exc
                    if not any(s in exc.message for s in FILE_MISSING):
                        raise  # the agent is not up yet (or did not answer): asked again
                    missing.append(f"{path}: {exc.message}")
                    continue
                keys.append(host_key_line(str(data.get("content", "")), path))
        except PveError as exc:
            if time.monotonic() >= deadline:
                raise VmError(
                    f"VM {vmid}: its SSH host keys could not be read through the guest agent within "
                    f"{timeout:.0f}s (last answer: {exc.message}); check that qemu-guest-agent runs in the guest"
                ) from exc
            time.sleep(poll)
            poll = min(poll * 1.5, 5.0)
            continue
        except ValueError as exc:
            raise VmError(f"VM {vmid}: {exc}") from exc
        if not keys:
            raise VmError(
                f"VM {vmid} has no SSH host key the guest agent can read ({'; '.join(missing)}); cloud-init makes "
                "them at first boot: check the guest's console (cloud-init status)"
            )
        return keys
