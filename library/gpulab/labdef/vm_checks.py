"""The VM checks of the lab definition: what ties a VM to the others (ids, names, MACs, GPUs), to its
node (storage, threads, the cards of vm_gpu) and to the OS image it installs from.

Each VM's single values (ranges, names, choices) are checked by the rules table (gpulab.labdef.rules)
before these run; a value that broke its rule is not compared with the others here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpulab import cards as nvidia
from gpulab.labdef.rules import first_failure

if TYPE_CHECKING:
    from gpulab.labdef.definition import LabDefinition
    from gpulab.labdef.problems import Problems

# What a VM with a passed-through GPU must have: (field, is it right, why, fix).
GPU_VM_RULES: tuple[tuple[str, Any, str, str], ...] = (
    (
        "vm_machine",
        lambda vm: vm.get("vm_machine") == "q35",
        "a GPU VM needs PCI Express",
        "set vm_machine: q35",
    ),
    (
        "vm_firmware",
        lambda vm: vm.get("vm_firmware") == "ovmf",
        "a GPU VM needs UEFI for the card's ROM",
        "set vm_firmware: ovmf",
    ),
    (
        "vm_balloon",
        lambda vm: not vm.get("vm_balloon"),
        "ballooning cannot work with a passed-through device (all memory is pinned)",
        "set vm_balloon: false",
    ),
)

# What each install kind needs: (install kind, field, where it is read, why, fix).
INSTALL_NEEDS = (
    (
        "cloud_image",
        "gpulab_os_image",
        "globals",
        "the VM installs from the cloud image, none is set",
        "set gpulab_os_image in group_vars/all or use vm_os_install: iso",
    ),
    (
        "cloud_image",
        "vm_ssh_public_key",
        "vm",
        "cloud-init needs a public key to let you log in",
        "set vm_ssh_public_key to the contents of your ~/.ssh/id_ed25519.pub",
    ),
    (
        "iso",
        "gpulab_os_iso",
        "globals",
        "the VM installs from the ISO, none is set",
        "set gpulab_os_iso in group_vars/all or use vm_os_install: cloud_image",
    ),
)


# What no two VMs may share: (field, the value compared, why, fix).
DISTINCT: tuple[tuple[str, Any, str, str], ...] = (
    ("vm_id", lambda v: v, "already used by", "give every VM its own vm_id"),
    ("vm_name", str.lower, "the same name as", "give every VM its own name"),
    ("vm_mac", str.lower, "the same MAC as", "give every VM its own MAC"),
)


def check_vms(d: LabDefinition, gpus: dict[str, tuple[str, dict]], out: Problems) -> None:
    seen: dict[str, dict[Any, str]] = {field: {} for field, *_ in DISTINCT}
    gpu_users: dict[str, str] = {}
    for host, vm in d.vms.items():
        for field, key_of, why, fix in DISTINCT:
            value = vm.get(field)
            if value is None or first_failure(field, value) is not None:
                continue  # not set, or its own rule already failed
            key = key_of(value)
            if key in seen[field]:
                out.add(host, field, value, f"{why} {seen[field][key]}", fix)
            seen[field].setdefault(key, host)
        bmin, mem = vm.get("vm_balloon_min_mib"), vm.get("vm_memory_mib")
        if isinstance(bmin, int) and isinstance(mem, int) and bmin > mem:
            fix = f"set it at most vm_memory_mib ({mem})"
            out.add(host, "vm_balloon_min_mib", bmin, "above the VM's memory", fix)
        for kind, field, where, why, fix in INSTALL_NEEDS:
            if vm.get("vm_os_install") == kind and not (d.globals if where == "globals" else vm).get(field):
                out.add(host, field, None, why, fix)

        # node, storage, cores
        found = d.node_by_name(vm.get("vm_node"))
        if found is None:
            known = ", ".join(n.get("pve_node") or h for h, n in d.nodes.items()) or "none"
            fix = f"use the pve_node of a host in group proxmox ({known})"
            out.add(host, "vm_node", vm.get("vm_node"), "no Proxmox node of that name", fix)
            continue
        _, node = found
        storages = node.get("pve_storages") or {}
        st = storages.get(vm.get("vm_storage"))
        if st is None:
            fix = "use one of " + (", ".join(storages) or "its storages")
            why = f"node {node['pve_node']} has no such storage"
            out.add(host, "vm_storage", vm.get("vm_storage"), why, fix)
        elif "images" not in (st.get("content") or []):
            fix = "pick a storage whose content includes images (e.g. local-zfs)"
            out.add(host, "vm_storage", vm.get("vm_storage"), "this storage does not hold VM disks", fix)
        threads = node.get("pve_threads")
        if isinstance(threads, int) and isinstance(vm.get("vm_cores"), int) and vm["vm_cores"] > threads:
            why = f"node {node['pve_node']} has {threads} threads"
            out.add(host, "vm_cores", vm["vm_cores"], why, f"give at most {threads} vCPUs")

        # GPU rules: vm_gpu names one card id or a list of them, each a card of this node given to no other VM
        value = vm.get("vm_gpu")
        if value is None:
            continue
        cards = _gpu_cards(host, value, out)
        found_cards = 0
        for gpu_field, gpu_id in cards:
            key = f"{node['pve_node']}/{gpu_id}"
            if key not in gpus:
                have = (
                    ", ".join(g.get("id") for g in node.get("pve_gpus") or [] if isinstance(g, dict))
                    or "none"
                )
                why = f"node {node['pve_node']} has no GPU with that id"
                out.add(host, gpu_field, gpu_id, why, f"use an id from its pve_gpus ({have})")
                continue
            found_cards += 1
            if key in gpu_users:
                fix = "a card can be passed through to one VM only; share it inside k3s with HAMi"
                out.add(host, gpu_field, gpu_id, f"already given to {gpu_users[key]}", fix)
            gpu_users.setdefault(key, host)
            gpu = gpus[key][1]
            if (
                vm.get("vm_onboot")
                and gpu.get("boot_display")
                and not vm.get("vm_onboot_override_boot_display")
            ):
                why = f"GPU {gpu_id} is the host's boot display: starting the VM at boot takes the host's only screen"
                fix = "set vm_onboot: false, or vm_onboot_override_boot_display: true if you accept it"
                out.add(host, "vm_onboot", True, why, fix)
        if not found_cards:
            continue  # no card of this node: what a GPU VM needs follows once it names one
        for field, right, why, fix in GPU_VM_RULES:
            if not right(vm):
                out.add(host, field, vm.get(field), why, fix)
        known = [
            (gid, nvidia.card(gpus[f"{node['pve_node']}/{gid}"][1].get("vendor_device")))
            for _, gid in cards
            if f"{node['pve_node']}/{gid}" in gpus
        ]
        check_driver(d, host, vm, known, out)


def check_driver(d: LabDefinition, host: str, vm: dict, known: list, out: Problems) -> None:
    """The GPU VM's driver: a flavour and a branch every card can use (gpulab.cards), and with Secure Boot (pre-enrolled
    keys) a kernel flavour that has Canonical-signed precompiled modules."""
    flavour = d.globals.get("nvidia_driver_flavour")
    for gid, why, fix in nvidia.flavour_problems(known, flavour):
        field = "nvidia_driver_flavour" if flavour is not None else "vm_gpu"
        out.add(host, field, flavour if flavour is not None else gid, why, fix)
    branch = d.globals.get("nvidia_driver_branch")
    for _gid, why, fix in nvidia.branch_problems(known, branch):
        out.add(host, "nvidia_driver_branch", branch, why, fix)
    # unset: the guest's running kernel decides, read on the guest (roles/nvidia_driver refuses one without them)
    kflavour = d.globals.get("nvidia_driver_kernel_flavour")
    if vm.get("vm_efi_pre_enrolled_keys") and kflavour and kflavour not in nvidia.SIGNED_KERNEL_FLAVOURS:
        why = (
            f"Secure Boot is on (pre-enrolled keys) and Ubuntu has no Canonical-signed NVIDIA modules for kernel "
            f"flavour {kflavour!r} ({', '.join(nvidia.SIGNED_KERNEL_FLAVOURS)} have them), so the DKMS-built module "
            "would be refused"
        )
        fix = (
            "(1) set vm_efi_pre_enrolled_keys: false (Secure Boot off), or (2) run a kernel flavour with signed "
            "modules and set nvidia_driver_kernel_flavour to it (e.g. generic), or leave it unset so the guest's "
            "running kernel decides"
        )
        out.add(host, "vm_efi_pre_enrolled_keys", True, why, fix)


def _gpu_cards(host: str, value: Any, out: Problems) -> list[tuple[str, str]]:
    """The (field, card id) pairs of a VM's vm_gpu: (`vm_gpu`, id) for one id, (`vm_gpu[i]`, id) for each
    id of a list. An empty list, an entry that is not an id, and an id listed twice are reported here."""
    if not isinstance(value, list):
        return [("vm_gpu", str(value))]
    if not value:
        fix = "name at least one id from the node's pve_gpus, or remove vm_gpu for a VM without a GPU"
        out.add(host, "vm_gpu", value, "an empty list passes no card through", fix)
        return []
    cards: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for i, entry in enumerate(value):
        where = f"vm_gpu[{i}]"
        if not isinstance(entry, str | int) or isinstance(entry, bool) or str(entry) == "":
            fix = "write each card as the id of a GPU in the node's pve_gpus, e.g. [rtx3090, rtx3060]"
            out.add(host, where, entry, "not a GPU id", fix)
            continue
        gpu_id = str(entry)
        if gpu_id in seen:
            out.add(host, where, gpu_id, f"the same card as {seen[gpu_id]}", "list each card once")
            continue
        seen[gpu_id] = where
        cards.append((where, gpu_id))
    return cards
