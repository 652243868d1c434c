"""Each VM of the lab definition resolved once into the whole spec stage "vms" sends.

`resolve(lab)` is pure: it takes a validated lab definition (defaults applied, see gpulab.labdef) and
returns, for each VM in the order stage "vms" brings them up (GPU VMs last), where it lives, how it is
installed, the NVIDIA driver of a GPU VM (`driver`, gpulab.cards.driver_for), and the options of pve_vm (`gpulab.pve.vmoptions`) with every decision made: the
defaults, the GPUs (one hostpci entry per card of vm_gpu, hostpci0, hostpci1, ... in its order) and whether
each goes through its resource mapping or its raw address, start at boot, the balloon and its floor, the
name, the install kind. Preflight publishes the result as the fact `gpulab_vms`; roles/pve_vms passes it
through and decides nothing.

`VARIABLES` is the one mapping between a VM's inventory variables and the options they set, read both
ways: forwards here, backwards by gpulab.discover, which writes an existing VM's host_vars from the options
its PVE config holds (`gpulab.pve.vmoptions.read`, the table's other direction) with `variables()`.
"""

from __future__ import annotations

from typing import Any

from gpulab import cards as nvidia
from gpulab.labdef.definition import gpu_ids
from gpulab.pve.client import raw_pci_login

# Hardware every VM gets.
OSTYPE = "l26"
SCSIHW = "virtio-scsi-single"
# Options a VM installed from the ISO gets only when gpulab creates it (pve_vm's create_only).
ISO_CREATE_ONLY = ("cdrom", "boot_order", "agent", "ostype", "scsihw")
# The cloud image has no QEMU guest agent: a cloud-init vendor snippet on the node installs it, kept on the
# storage gpulab_snippet_storage names (default `local`, as the catalogue says).
SNIPPET_NAME = "gpulab-vendor.yaml"
# The PVE tag that marks a VM gpulab created, and nothing else does: it is set in the create call only
# (pve_vm's create_only), so a VM gpulab adopts never gets it, and teardown destroys only VMs that
# carry it (or that the owner names, gpulab_teardown_adopted).
OWNER_TAG = "gpulab"


# inventory variable -> the pve_vm option it sets (its path in the options), and how an option's
# value reads back as the variable (None: as it is; vm_machine names the kind of a pinned machine version).
VARIABLES: tuple[tuple[str, tuple[str | int, ...], Any], ...] = (
    ("vm_cores", ("cores",), None),
    ("vm_memory_mib", ("memory",), None),
    ("vm_machine", ("machine",), lambda machine: "q35" if "q35" in machine else "i440fx"),
    ("vm_firmware", ("bios",), None),
    ("vm_cpu", ("cpu",), None),
    ("vm_onboot", ("onboot",), None),
    ("vm_storage", ("disks", 0, "storage"), None),
    ("vm_disk_gb", ("disks", 0, "size_gb"), None),
    ("vm_bridge", ("nets", 0, "bridge"), None),
    ("vm_efi_pre_enrolled_keys", ("efidisk", "pre_enrolled_keys"), None),
)


def _at(options: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        try:
            options = options[step]
        except (KeyError, IndexError, TypeError):
            return None
    return options


def variables(options: dict[str, Any]) -> dict[str, Any]:
    """The inventory variables that give these pve_vm options (VARIABLES backwards; those the options
    leave unset are left out), and vm_balloon / vm_balloon_min_mib from the balloon (balloon_mib's other way)."""
    out = {}
    for var, path, back in VARIABLES:
        value = _at(options, path)
        if value is not None:
            out[var] = back(value) if back else value
    balloon, memory = options.get("balloon"), options.get("memory")
    if balloon == 0:
        out["vm_balloon"] = False
    elif balloon is not None and balloon != memory:
        out["vm_balloon_min_mib"] = balloon
    return out


def balloon_mib(vm: dict[str, Any]) -> int:
    """PVE's `balloon`: 0 (no balloon device) without ballooning, else the floor (all memory when unset)."""
    if not vm["vm_balloon"]:
        return 0
    return int(vm.get("vm_balloon_min_mib") or vm["vm_memory_mib"])


def image_download(image: dict[str, Any], content: str) -> dict[str, Any]:
    """What the node downloads for an install (pve_download's options) and the volume it becomes."""
    storage = image.get("storage") or "local"
    return {
        "storage": storage,
        "content": content,
        "url": image["url"],
        "filename": image["filename"],
        "checksum": image["checksum"],
        "checksum_algorithm": image.get("checksum_algorithm") or "sha256",
        "volume": f"{storage}:{content}/{image['filename']}",
    }


def _device(gpu: dict[str, Any], raw: bool, passthrough: str | None) -> dict[str, str]:
    """How one card is attached: its raw address with a root@pam login, else its resource mapping, together
    with the address (a VM that has the card attached raw keeps it) unless the inventory asks for the
    mapping alone."""
    if raw:
        return {"host": gpu["pci"].lower()}
    if passthrough == "mapping":
        return {"mapping": gpu["id"]}
    return {"mapping": gpu["id"], "host": gpu["pci"].lower()}


def resolve_vm(lab: Any, host: str) -> dict[str, Any]:
    """One VM's plan: identity, install kind, the image its node downloads, address, and the pve_vm
    options (`spec`)."""
    g = lab.globals
    vm = lab.vms[host]
    node_host, node = lab.node_by_name(vm["vm_node"])
    by_id = {x.get("id"): x for x in node.get("pve_gpus") or ()}
    cards = [by_id[gid] for gid in gpu_ids(vm) if gid in by_id]
    cloud = vm["vm_os_install"] == "cloud_image"
    spec: dict[str, Any] = {
        "balloon": balloon_mib(vm),
        "ostype": OSTYPE,
        "scsihw": SCSIHW,
        "agent": True,
        "disks": [{"slot": "scsi0", "iothread": True}],
        "nets": [{"model": "virtio"}],
        "hostpci": [],
        "serial_console": True if cloud else None,
        "boot_order": ["scsi0"] if cloud else ["scsi0", "ide2"],
        # gpulab's mark, on the VMs it creates only (an adopted VM keeps its own tags)
        "tags": [OWNER_TAG],
        # A VM installed by hand from the ISO may be one the user made in PVE's wizard: what only matters
        # for installing (the CD-ROM, the boot order) and the wizard's other choices stay as they are.
        "create_only": ["tags"] if cloud else [*ISO_CREATE_ONLY, "tags"],
    }
    if vm["vm_firmware"] == "ovmf":
        spec["efidisk"] = {"storage": vm["vm_storage"]}
    for var, path, _ in VARIABLES:  # the inventory's variables, where VARIABLES puts them
        if path[0] != "efidisk" or "efidisk" in spec:
            parent = _at(spec, path[:-1])
            parent[path[-1]] = vm.get(var)
    if "efidisk" in spec:
        spec["efidisk"]["pre_enrolled_keys"] = bool(spec["efidisk"]["pre_enrolled_keys"])
    if vm.get("vm_guest_phys_bits"):  # a large-BAR card's address width (gpulab doctor; qemu-server 9.0.18)
        spec["cpu"] = f"{spec['cpu']},guest-phys-bits={vm['vm_guest_phys_bits']}"
    if vm.get("vm_mac"):
        spec["nets"][0]["macaddr"] = vm["vm_mac"]
    if cards:
        raw = raw_pci_login(g.get("pve_api_token_id"), g.get("pve_api_user"))
        spec["hostpci"] = [
            {**_device(gpu, raw, vm.get("vm_gpu_passthrough")), "pcie": vm["vm_machine"] == "q35"}
            for gpu in cards
        ]
    driver = None
    if cards:  # the GPU guest's NVIDIA driver (gpulab.cards): flavour, packages, DKMS or signed modules
        driver = nvidia.vm_driver(g, vm, cards).as_dict()
    snippet = None
    image = (
        image_download(g["gpulab_os_image"], "import") if cloud else image_download(g["gpulab_os_iso"], "iso")
    )
    if cloud:
        spec["disks"][0]["import_from"] = image["volume"]
        keys = [vm["vm_ssh_public_key"]] if vm.get("vm_ssh_public_key") else []
        spec["cloudinit"] = {
            "storage": vm["vm_storage"],
            "slot": "ide2",
            "user": vm["vm_ssh_user"],
            "ssh_keys": keys,
            "ipconfig": "ip=dhcp",
            "upgrade": False,
        }
        if g["gpulab_guest_agent_snippet"]:
            store = g.get("gpulab_snippet_storage") or "local"
            snippet = {"storage": store, "name": SNIPPET_NAME}
            spec["extra_config"] = {"cicustom": f"vendor={store}:snippets/{SNIPPET_NAME}"}
    else:
        spec["cdrom"] = image["volume"]
    return {
        "host": host,
        "node": vm["vm_node"],
        "node_host": node_host,
        "vmid": vm["vm_id"],
        "name": vm["vm_name"],
        "install": vm["vm_os_install"],
        "gpus": [gpu["id"] for gpu in cards],
        "driver": driver,
        "address": vm["vm_address"],
        "ssh_user": vm["vm_ssh_user"],
        "image": image,
        "snippet": snippet,
        "spec": spec,
    }


def resolve(lab: Any) -> dict[str, dict[str, Any]]:
    """Every VM's plan by inventory host, plain VMs first, then GPU VMs (each in inventory order)."""
    plans = [resolve_vm(lab, host) for host in lab.vms]
    return {p["host"]: p for p in sorted(plans, key=lambda p: bool(p["gpus"]))}
