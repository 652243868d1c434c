"""pve_vm: a VM made and kept as its declarative spec says (gpulab.pve.vm), started, its address found."""

from __future__ import annotations

from gpulab.pve import connection, vmconfig, vmoptions
from gpulab.pve.vm import VmError, VmManager, build_spec, read_host_keys, wait_for_address
from gpulab.tasks import Run, Task


def refuse_raw_hostpci(entries, conn):
    """PVE attaches a raw PCI address for root@pam password logins only; refuse it up front otherwise
    (an entry with a mapping as well never writes the raw address)."""
    for index, dev in enumerate(entries or ()):
        if dev.get("host") and not dev.get("mapping") and not conn.may_attach_raw_pci:
            raise ValueError(
                f"hostpci[{index}] names the raw device {dev['host']} but PVE only lets root@pam (password "
                f"login) attach raw PCI devices, and this module logs in as {conn.userid}: create a PCI "
                "resource mapping (pve_pci_mapping) and give its id as mapping"
            )


def run(task: Task) -> dict:
    p = task.params
    result = {
        "vmid": p["vmid"],
        "node": p["node"],
        "status": "absent",
        "created": False,
        "actions": [],
        "config": {},
        "current": None,
        "set": {},
        "delete": [],
        "resize": {},
        "pending": [],
        "restart_needed": False,
        "restarted": False,
        "mac": None,
        "kept": None,
        "backup": None,
    }
    what = f"VM {p['vmid']} ({p['name']}) on node {p['node']}"
    with Run(task, f"Managing {what}", VmError, ValueError, result=result) as run:
        conn = connection.connection_from_params(p)
        refuse_raw_hostpci(p["hostpci"], conn)
        options = {o.name: p[o.name] for o in vmoptions.OPTIONS}
        spec = build_spec(
            p["node"], p["vmid"], {**options, "name": p["name"]}, p["create_only"], conn.may_attach_raw_pci
        )
        client = run.connect()
        manager = VmManager(
            client,
            spec,
            check_mode=task.check_mode,
            timeout=p["timeout"],
            lock_timeout=p["lock_timeout"],
            log=task.log,
            owner_tag=p["owner_tag"],
            destroy_untagged=p["destroy_untagged"],
            backup_storage=p["backup_storage"],
        )
        res = manager.ensure(p["state"], restart=p["restart"])
        result.update(
            changed=res.changed,
            status=res.status,
            created=res.created,
            actions=res.actions,
            config=res.after,
            set=res.set,
            delete=res.delete,
            resize=res.resize,
            pending=res.pending,
            restart_needed=res.restart_needed,
            restarted=res.restarted,
            mac=res.mac,
            kept=res.kept,
            backup=res.backup,
            current=None
            if res.current is None
            else {
                k: v for k, v in res.current.items() if k != "digest" and not vmconfig.key_info(k).write_only
            },
        )
        if res.restart_needed:
            task.warn(
                f"{what} runs with hardware changes PVE holds as pending ({', '.join(res.pending)}): they apply "
                "at its next restart; restart it, or run with restart=true (stage vms: -e pve_vms_restart=true)"
            )
        # In check mode the agent is asked too when the VM already runs (reads only).
        runs_now = not task.check_mode or not ({"create", "start", "restart"} & set(res.actions))
        if p["wait_for_address"] and res.status == "running" and runs_now:
            found = wait_for_address(client, p["node"], p["vmid"], res.mac, p["address_timeout"])
            result["address"] = found["address"]
            result["mac"] = result["mac"] or found["mac"]
        booted = bool({"create", "start", "restart"} & set(res.actions)) or res.restarted
        if (
            p["read_host_keys"]
            and res.status == "running"
            and runs_now
            and (booted or not p["host_keys_known"])
        ):
            result["host_keys"] = read_host_keys(client, p["node"], p["vmid"], p["address_timeout"])
        if task.diff:
            # The power state goes with the config, so that a VM that is only started (or stopped) shows
            # what the run does to it.
            power = "(power state)"
            before = {**res.before, power: res.status_before} if res.status_before != "absent" else res.before
            after = {**res.after, power: res.status} if p["state"] != "absent" else {}
            result["diff"] = {
                "before_header": f"{what} (current)",
                "after_header": f"{what} ({'would be' if task.check_mode else 'now'})",
                "before": before,
                "after": after,
            }
    return run.done()
