#!/usr/bin/python
"""Ansible module gpulab_pve_vm: one QEMU VM on Proxmox VE, declared and kept in shape."""

DOCUMENTATION = r"""
module: gpulab_pve_vm
short_description: Create, update, start, stop or remove a Proxmox VE QEMU VM from a declarative spec
description:
  - Reads the VM (one cluster-resources call and one config call), compares it with the spec through one
    table-driven diff, and writes only the difference in one config call, with removed keys in C(delete)
    and the config C(digest) for optimistic locking. It waits for each task, reads the config again and
    returns it before and after.
  - A new VM is created in one create call (disks imported from an image are grown afterwards).
  - Disks grow with a resize and never shrink; a smaller size fails with the reason before anything is written.
  - Hardware changes to a running VM stay pending in PVE; the result says RV(restart_needed), and
    O(restart=true) restarts the VM to apply them.
  - Options left out are not managed. For O(nets) and O(hostpci) the list is the whole truth; extra
    C(netN)/C(hostpciN) keys are removed. Disks are never removed by this module.
version_added: "0.1.0"
author: gpulab
extends_documentation_fragment:
  - gpulab_pve
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
options:
  node:
    description: The PVE node the VM lives on.
    type: str
    required: true
  vmid:
    description: The VM ID.
    type: int
    required: true
  name:
    description:
      - The VM name. An existing VM with this ID but another name is never taken over.
    type: str
    required: true
  state:
    description:
      - V(present) creates or updates the VM and leaves its power state alone; V(started) also starts it;
        V(stopped) shuts it down (forced stop after the timeout); V(absent) stops and destroys it.
      - V(restarted) shuts an existing VM down and starts it again without touching its config (always
        changed; the guest renews its DHCP lease). Only O(node), O(vmid) and O(name) are needed.
    type: str
    choices: [present, started, stopped, absent, restarted]
    default: present
  cores:
    description: Cores per socket.
    type: int
  sockets:
    description: CPU sockets.
    type: int
  memory:
    description: Memory in MiB.
    type: int
  balloon:
    description:
      - Balloon target in MiB; V(0) removes the balloon device (needed with a passed-through GPU, whose
        memory is pinned). Equal to O(memory) is PVE's default.
    type: int
  machine:
    description: Machine type, V(i440fx) (QEMU's C(pc)) or V(q35), or a pinned version such as V(pc-q35-9.2).
    type: str
  bios:
    description: Firmware.
    type: str
    choices: [seabios, ovmf]
  cpu:
    description: CPU type, such as V(host) or V(x86-64-v2-AES) (a full C(cpu) property string is accepted).
    type: str
  ostype:
    description: Guest OS type, such as V(l26).
    type: str
  scsihw:
    description: SCSI controller, such as V(virtio-scsi-single).
    type: str
  agent:
    description: Enable the QEMU guest agent channel.
    type: bool
  onboot:
    description: Start the VM when the node boots.
    type: bool
  numa:
    description: Enable NUMA.
    type: bool
  efidisk:
    description: The EFI vars disk (with O(bios=ovmf)). Its options are fixed when it is created.
    type: dict
    suboptions:
      storage:
        description: Storage for the EFI disk.
        type: str
        required: true
      efitype:
        description: Size and type of the EFI vars.
        type: str
        choices: ["2m", "4m"]
        default: "4m"
      pre_enrolled_keys:
        description: Enrol distribution and Microsoft keys (turns Secure Boot on; unsigned modules then fail to load).
        type: bool
        default: false
  disks:
    description: Disks. A disk that exists is compared by storage, options and size.
    type: list
    elements: dict
    suboptions:
      slot:
        description: Config key, such as V(scsi0) or V(virtio1).
        type: str
        default: scsi0
      storage:
        description: Storage for the disk.
        type: str
        required: true
      size_gb:
        description: Size in GiB. A larger size than the current one grows the disk; a smaller one is refused.
        type: int
        required: true
      import_from:
        description:
          - Volume to import the disk from when the VM is created, such as
            V(local:import/noble-server-cloudimg-amd64.qcow2). Ignored for an existing disk.
        type: str
      iothread:
        description: Own I/O thread.
        type: bool
      discard:
        description: Pass discard/trim through.
        type: bool
      ssd:
        description: Present the disk as an SSD.
        type: bool
  nets:
    description: Network devices, C(net0) first. Without a MAC, PVE picks one and it is kept afterwards.
    type: list
    elements: dict
    suboptions:
      model:
        description: NIC model.
        type: str
        default: virtio
      bridge:
        description: Bridge.
        type: str
        default: vmbr0
      macaddr:
        description: Fixed MAC address.
        type: str
      firewall:
        description: PVE firewall on this NIC.
        type: bool
      tag:
        description: VLAN tag.
        type: int
  hostpci:
    description:
      - PCI devices, C(hostpci0) first. Each entry names a resource O(hostpci[].mapping), a raw
        O(hostpci[].host) address, or both.
      - With both, the mapping is used, except when the module logs in as root@pam with a password
        (PVE accepts raw devices from root@pam only, never from a token).
    type: list
    elements: dict
    suboptions:
      mapping:
        description: ID of a cluster PCI resource mapping.
        type: str
      host:
        description: Host address; V(0000:02:00) without a function passes all functions of the card.
        type: str
      pcie:
        description: Attach as PCI Express (needs O(machine=q35)).
        type: bool
      x_vga:
        description: Primary GPU of the VM.
        type: bool
      rombar:
        description: Map the device ROM.
        type: bool
  cdrom:
    description: An ISO volume for the CD-ROM, such as V(local:iso/ubuntu-24.04.3-live-server-amd64.iso); V(none) empties it.
    type: str
  cdrom_slot:
    description: Config key of the CD-ROM.
    type: str
    default: ide2
  cloudinit:
    description: A cloud-init drive and its settings.
    type: dict
    suboptions:
      storage:
        description: Storage for the cloud-init drive.
        type: str
        required: true
      slot:
        description: Config key of the drive.
        type: str
        default: ide2
      user:
        description: User to create.
        type: str
      ssh_keys:
        description: Public SSH keys for the user.
        type: list
        elements: str
      ipconfig:
        description: C(ipconfig0), such as V(ip=dhcp).
        type: str
        default: ip=dhcp
      upgrade:
        description: Upgrade packages on first boot.
        type: bool
      password:
        description: Password for the user; set when the VM is created and never compared (PVE does not show it).
        type: str
  serial_console:
    description: A serial port as the console (C(serial0=socket), C(vga=serial0)), as cloud images expect.
    type: bool
  boot_order:
    description: Boot devices in order, such as V([scsi0]).
    type: list
    elements: str
  description:
    description: VM description (notes).
    type: str
  tags:
    description: Tags.
    type: list
    elements: str
  extra_config:
    description:
      - Further config keys as PVE spells them (key to value; null removes the key). They go through the
        same normalisation as the rest.
    type: dict
  restart:
    description: Restart a running VM whose hardware changes are pending.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for each PVE task (create, update, start, shutdown).
    type: int
    default: 600
  lock_timeout:
    description: Seconds to wait for a locked VM to be unlocked before failing.
    type: int
    default: 60
  wait_for_address:
    description: After the VM runs, wait for the guest agent to report an IPv4 address on C(net0).
    type: bool
    default: false
  address_timeout:
    description: Seconds to wait for the address.
    type: int
    default: 300
"""

EXAMPLES = r"""
- name: The GPU VM of the reference lab, started, GPU through its resource mapping
  gpulab_pve_vm:
    api_url: https://pve.example:8006
    api_token_id: root@pam!gpulab
    api_token_secret: "{{ vault_pve_token_secret }}"
    api_fingerprint: "AB:CD:..."
    node: pve
    vmid: 102
    name: vm-gpu
    state: started
    machine: q35
    bios: ovmf
    efidisk:
      storage: local-zfs
      pre_enrolled_keys: false
    cpu: host
    cores: 8
    memory: 16384
    balloon: 0
    scsihw: virtio-scsi-single
    disks:
      - slot: scsi0
        storage: local-zfs
        size_gb: 200
        import_from: local:import/noble-server-cloudimg-amd64.qcow2
        iothread: true
    nets:
      - bridge: vmbr0
    hostpci:
      - mapping: rtx3090
        host: "0000:02:00"
        pcie: true
    cloudinit:
      storage: local-zfs
      user: ubuntu
      ssh_keys: ["{{ lookup('ansible.builtin.file', '~/.ssh/id_ed25519.pub') }}"]
    agent: true
    onboot: false
    wait_for_address: true
  register: vm

- name: Remove a VM
  gpulab_pve_vm:
    api_url: https://pve.example:8006
    api_token_id: root@pam!gpulab
    api_token_secret: "{{ vault_pve_token_secret }}"
    node: pve
    vmid: 150
    name: scratch
    state: absent
"""

RETURN = r"""
vmid:
  description: The VM ID.
  returned: always
  type: int
node:
  description: The node.
  returned: always
  type: str
status:
  description: The VM's power state after the run (V(running), V(stopped) or V(absent)).
  returned: always
  type: str
created:
  description: Whether the VM was (or in check mode would be) created.
  returned: always
  type: bool
actions:
  description: What was done, in order (create, update, resize, start, restart, shutdown, destroy).
  returned: always
  type: list
  elements: str
config:
  description: The VM config after the run, normalised (in check mode, as it would be).
  returned: always
  type: dict
current:
  description:
    - The VM config as the API returns it (C(GET .../config)), as last read or written by this run, so
      later plays need not read it again; write-only keys and the digest are left out.
    - Null in check mode when a change is planned, and for an absent VM.
  returned: always
  type: dict
set:
  description: Config keys written, with the values sent.
  returned: always
  type: dict
delete:
  description: Config keys removed.
  returned: always
  type: list
  elements: str
resize:
  description: Disks grown, with their new size.
  returned: always
  type: dict
pending:
  description: Config keys PVE holds as pending until the VM restarts.
  returned: always
  type: list
  elements: str
restart_needed:
  description: Whether pending hardware changes wait for a restart of the running VM.
  returned: always
  type: bool
restarted:
  description: Whether the VM was restarted to apply pending changes.
  returned: always
  type: bool
mac:
  description: MAC address of C(net0), lower case (null in check mode for a new VM).
  returned: always
  type: str
address:
  description: IPv4 address the guest agent reported on C(net0) (with O(wait_for_address)).
  returned: when O(wait_for_address=true) and the VM runs (in check mode, when it already ran)
  type: str
requests:
  description: API requests this run sent, as counts of reads (GET) and writes.
  returned: always
  type: dict
  contains:
    reads:
      description: GET requests.
      type: int
    writes:
      description: POST, PUT and DELETE requests.
      type: int
"""

import traceback  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib  # noqa: E402

try:
    from gpulab.pve import connection, vmconfig
    from gpulab.pve.client import PveError
    from gpulab.pve.vm import VmError, VmManager, VmSpec, build_config, wait_for_address
except ImportError:
    HAS_GPULAB, GPULAB_ERR = False, traceback.format_exc()
else:
    HAS_GPULAB, GPULAB_ERR = True, None


def build_argument_spec(fallback=None):
    spec = connection.argument_spec(fallback) if HAS_GPULAB else {}
    spec.update(
        node={"type": "str", "required": True},
        vmid={"type": "int", "required": True},
        name={"type": "str", "required": True},
        state={
            "type": "str",
            "choices": ["present", "started", "stopped", "absent", "restarted"],
            "default": "present",
        },
        cores={"type": "int"},
        sockets={"type": "int"},
        memory={"type": "int"},
        balloon={"type": "int"},
        machine={"type": "str"},
        bios={"type": "str", "choices": ["seabios", "ovmf"]},
        cpu={"type": "str"},
        ostype={"type": "str"},
        scsihw={"type": "str"},
        agent={"type": "bool"},
        onboot={"type": "bool"},
        numa={"type": "bool"},
        efidisk={
            "type": "dict",
            "options": {
                "storage": {"type": "str", "required": True},
                "efitype": {"type": "str", "choices": ["2m", "4m"], "default": "4m"},
                "pre_enrolled_keys": {"type": "bool", "default": False},
            },
        },
        disks={
            "type": "list",
            "elements": "dict",
            "options": {
                "slot": {"type": "str", "default": "scsi0"},
                "storage": {"type": "str", "required": True},
                "size_gb": {"type": "int", "required": True},
                "import_from": {"type": "str"},
                "iothread": {"type": "bool"},
                "discard": {"type": "bool"},
                "ssd": {"type": "bool"},
            },
        },
        nets={
            "type": "list",
            "elements": "dict",
            "options": {
                "model": {"type": "str", "default": "virtio"},
                "bridge": {"type": "str", "default": "vmbr0"},
                "macaddr": {"type": "str"},
                "firewall": {"type": "bool"},
                "tag": {"type": "int"},
            },
        },
        hostpci={
            "type": "list",
            "elements": "dict",
            "options": {
                "mapping": {"type": "str"},
                "host": {"type": "str"},
                "pcie": {"type": "bool"},
                "x_vga": {"type": "bool"},
                "rombar": {"type": "bool"},
            },
        },
        cdrom={"type": "str"},
        cdrom_slot={"type": "str", "default": "ide2"},
        cloudinit={
            "type": "dict",
            "options": {
                "storage": {"type": "str", "required": True},
                "slot": {"type": "str", "default": "ide2"},
                "user": {"type": "str"},
                "ssh_keys": {"type": "list", "elements": "str", "no_log": False},
                "ipconfig": {"type": "str", "default": "ip=dhcp"},
                "upgrade": {"type": "bool"},
                "password": {"type": "str", "no_log": True},
            },
        },
        serial_console={"type": "bool"},
        boot_order={"type": "list", "elements": "str"},
        description={"type": "str"},
        tags={"type": "list", "elements": "str"},
        extra_config={"type": "dict"},
        restart={"type": "bool", "default": False},
        timeout={"type": "int", "default": 600},
        lock_timeout={"type": "int", "default": 60},
        wait_for_address={"type": "bool", "default": False},
        address_timeout={"type": "int", "default": 300},
    )
    return spec


def choose_hostpci(entries, conn):
    """Mapping by default; the raw address only for root@pam password logins (PVE refuses it to tokens)."""
    if entries is None:
        return None
    root_password = not conn.uses_token and conn.user == "root@pam"
    out = []
    for index, dev in enumerate(entries):
        dev = {k: v for k, v in dev.items() if v is not None}
        if dev.get("mapping") and dev.get("host"):
            dev.pop("mapping" if root_password else "host")
        elif dev.get("host") and not root_password:
            raise ValueError(
                f"hostpci[{index}] names the raw device {dev['host']} but PVE only lets root@pam (password "
                f"login) attach raw PCI devices, and this module logs in as {conn.userid}: create a PCI "
                "resource mapping (gpulab_pve_pci_mapping) and give its id as mapping"
            )
        out.append(dev)
    return out


def main():
    module = AnsibleModule(
        argument_spec=build_argument_spec(env_fallback),
        supports_check_mode=True,
        **(connection.MODULE_KWARGS if HAS_GPULAB else {}),
    )
    if not HAS_GPULAB:
        module.fail_json(
            msg=missing_required_lib("gpulab (the project's Python package)"), exception=GPULAB_ERR
        )
    p = module.params
    result = {
        "changed": False,
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
        "requests": {"reads": 0, "writes": 0},
    }
    client = None
    what = f"VM {p['vmid']} ({p['name']}) on node {p['node']}"
    try:
        conn = connection.connection_from_params(p)
        hostpci = choose_hostpci(p["hostpci"], conn)
        config, families = build_config(
            name=p["name"],
            cores=p["cores"],
            sockets=p["sockets"],
            memory=p["memory"],
            balloon=p["balloon"],
            machine=p["machine"],
            bios=p["bios"],
            cpu=p["cpu"],
            ostype=p["ostype"],
            scsihw=p["scsihw"],
            agent=p["agent"],
            onboot=p["onboot"],
            numa=p["numa"],
            efidisk=p["efidisk"],
            disks=p["disks"],
            nets=p["nets"],
            hostpci=hostpci,
            cdrom=p["cdrom"],
            cdrom_slot=p["cdrom_slot"],
            cloudinit=p["cloudinit"],
            serial_console=p["serial_console"],
            boot_order=p["boot_order"],
            description=p["description"],
            tags=p["tags"],
            extra_config=p["extra_config"],
        )
        spec = VmSpec(node=p["node"], vmid=p["vmid"], name=p["name"], config=config, own_families=families)
        client = connection.connect(p)
        manager = VmManager(
            client,
            spec,
            check_mode=module.check_mode,
            timeout=p["timeout"],
            lock_timeout=p["lock_timeout"],
            log=module.log,
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
            current=None
            if res.current is None
            else {
                k: v for k, v in res.current.items() if k != "digest" and not vmconfig.key_info(k).write_only
            },
        )
        # In check mode the agent is asked too when the VM already runs (reads only).
        runs_now = not module.check_mode or not ({"create", "start", "restart"} & set(res.actions))
        if p["wait_for_address"] and res.status == "running" and runs_now:
            found = wait_for_address(client, p["node"], p["vmid"], res.mac, p["address_timeout"])
            result["address"] = found["address"]
            result["mac"] = result["mac"] or found["mac"]
        if module._diff:
            result["diff"] = {
                "before_header": f"{what} (current)",
                "after_header": f"{what} ({'would be' if module.check_mode else 'now'})",
                "before": res.before,
                "after": res.after if p["state"] != "absent" else {},
            }
    except (PveError, VmError, ValueError) as exc:
        if client is not None:
            result["requests"] = {"reads": client.reads, "writes": client.writes}
        module.fail_json(msg=f"Managing {what}: {exc}", **result)
    result["requests"] = {"reads": client.reads, "writes": client.writes}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
