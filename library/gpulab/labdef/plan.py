"""The plan: what site.yml would build from a lab definition, as text (`gpulab plan`, preflight)."""

from __future__ import annotations

from gpulab import cards as nvidia
from gpulab import routerspec
from gpulab.doctor import nomodeset_setting
from gpulab.labdef.definition import LabDefinition, gpu_ids, pinned_mib
from gpulab.labdef.hami_values import image_lines
from gpulab.labdef.node_checks import reboot_plan_lines
from gpulab.routers.kinds import KINDS


def plan_text(definition: LabDefinition) -> str:
    """A readable plan: VMs per node, pinned-memory budget, GPU assignments, addresses."""
    lines: list[str] = []
    reserve = definition.globals.get("gpulab_host_reserve_mib") or 0
    role = {h: "server" for h in definition.k3s_servers} | {h: "agent" for h in definition.k3s_agents}
    for host, node in definition.nodes.items():
        mine = [(h, vm) for h, vm in definition.vms.items() if vm.get("vm_node") == node.get("pve_node")]
        lines.append(f"Node {node.get('pve_node')} ({host}): {node.get('pve_memory_mib')} MiB RAM")
        header = (
            "vmid",
            "name",
            "vCPU",
            "memory",
            "disk",
            "machine/firmware",
            "GPU",
            "onboot",
            "address",
            "k3s",
        )
        rows = [header]
        for h, vm in sorted(mine, key=lambda x: x[1].get("vm_id") or 0):
            mem = f"{vm.get('vm_memory_mib')} MiB" + ("" if vm.get("vm_balloon") else " fixed")
            rows.append(
                (
                    str(vm.get("vm_id")),
                    vm["vm_name"],
                    str(vm.get("vm_cores")),
                    mem,
                    f"{vm.get('vm_disk_gb')} GB {vm.get('vm_storage')}",
                    f"{vm.get('vm_machine')}/{vm.get('vm_firmware')}",
                    "+".join(gpu_ids(vm)) or "-",
                    {True: "yes", False: "no"}.get(vm.get("vm_onboot"), "-"),
                    str(vm.get("vm_address")),
                    role.get(h, "-"),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        pinned = sum(pinned_mib(vm) for _, vm in mine)
        total = node.get("pve_memory_mib")
        free = (total - pinned - reserve) if isinstance(total, int) else "?"
        lines.append(
            f"  pinned memory: {pinned} MiB of VMs + {reserve} MiB host reserve = "
            f"{pinned + reserve} of {total} MiB ({free} MiB left)"
        )
        for gpu in node.get("pve_gpus") or []:
            if not isinstance(gpu, dict):
                continue
            users = [h for h, vm in mine if gpu.get("id") in gpu_ids(vm)]
            disp = ", boot display" if gpu.get("boot_display") else ""
            lines.append(
                f"  GPU {gpu.get('id')} {gpu.get('pci')} ({gpu.get('vendor_device', '?')}, "
                f"IOMMU group {gpu.get('iommu_group', '?')}{disp}) -> {', '.join(users) or 'unused'}"
            )
        lines.append(f"  {nomodeset_line(node, definition.node_nomodeset.get(host))}")
    lines += reboot_plan_lines(definition)
    lines += driver_lines(definition)
    if definition.router:
        rh, r = definition.router
        pool = r.get("router_dhcp_pool") or {}
        lines.append(
            f"Router {rh}: {r.get('router_kind')} at {r.get('router_address')}, "
            f"subnet {r.get('router_subnet')}, pool {pool.get('start')}-{pool.get('end')}"
        )
        for h, vm in definition.vms.items():
            lines.append(f"  reserve {vm.get('vm_mac') or '(MAC from PVE)'} -> {vm.get('vm_address')} ({h})")
        # each node keeps its static address; its reservation is that address for its LAN bridge's port
        kind = KINDS.get(r.get("router_kind"))
        for h, node in definition.nodes.items():
            address = node.get("ansible_host")
            why = routerspec.node_refusal(kind, address, r.get("router_subnet"), pool) if kind else None
            if address is None:
                continue
            if why:
                lines.append(f"  no reservation for node {h} ({address}): {why}")
            else:
                lines.append(f"  reserve (MAC of the node's LAN bridge port) -> {address} (node {h})")
    lines.append(
        f"k3s {definition.globals.get('k3s_version')}: server {', '.join(definition.k3s_servers) or '-'}; "
        f"agents {', '.join(definition.k3s_agents) or '-'}"
    )
    lines.append(
        f"HAMi {definition.globals.get('hami_chart_version')}: {definition.globals.get('hami_device_split_count')} "
        f"shares per card"
    )
    lines += image_lines(definition)
    return "\n".join(lines)


def driver_lines(definition: LabDefinition) -> list[str]:
    """The NVIDIA driver each GPU VM installs (gpulab.cards.driver_for): packages, flavour and why."""
    g = definition.globals
    lines = []
    for host, vm in definition.vms.items():
        found = definition.node_by_name(vm.get("vm_node"))
        if not gpu_ids(vm) or found is None:
            continue
        by_id = {x.get("id"): x for x in found[1].get("pve_gpus") or () if isinstance(x, dict)}
        cards = [by_id[i] for i in gpu_ids(vm) if i in by_id]
        if not cards:
            continue
        drv = nvidia.vm_driver(g, vm, cards)
        how = (
            "Canonical-signed precompiled modules (Secure Boot on)"
            if drv.modules == "signed"
            else "DKMS build"
        )
        pick = f"picked by gpulab: {drv.reason}" if drv.chosen else drv.reason
        lines.append(
            f"Driver {host}: {' '.join(drv.packages)} ({'open' if drv.open else 'proprietary'} kernel module, "
            f"{how}; flavour {drv.flavour or '(desktop)'}, {pick})"
        )
    return lines


def nomodeset_line(node: dict, value: object) -> str:
    """What stage host does about nomodeset on this node, from the inventory (the node's read decides auto)."""
    setting = nomodeset_setting(value)
    if setting is True:
        return (
            "nomodeset: on (pve_host_nomodeset: true; any other display adapter of the node loses its driver)"
        )
    if setting is False:
        return "nomodeset: off (pve_host_nomodeset: false)"
    gpus = [g for g in node.get("pve_gpus") or [] if isinstance(g, dict)]
    boot = [str(g.get("id")) for g in gpus if g.get("boot_display")]
    if not boot:
        return (
            "nomodeset: off (auto: no card of pve_gpus is the boot display; the NVIDIA blacklist is enough)"
        )
    return (
        f"nomodeset: auto, on if {boot[0]} (the boot display) is the node's only display adapter; off where another "
        "(an iGPU) could drive a screen, which the run reads from the node"
    )
