#!/usr/bin/python
"""Ansible module pve_vm: one QEMU VM on Proxmox VE, declared and kept in shape."""

DOCUMENTATION = r"""
module: pve_vm
short_description: Create, update, start, stop or remove a Proxmox VE QEMU VM from a declarative spec
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
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
  - A VM found running is not started again. PVE checks a start in its task (a C(hostpci) mapping with no
    entry for the node, the VM started by someone else meanwhile, a card in use by another VM, memory); such a
    failure ends the module with the last lines of the task's log and what to do about it.
extends_documentation_fragment:
  - gpulab.homelab.pve
  - gpulab.homelab.attributes
attributes:
  diff_mode:
    support: full
options:  # generated from gpulab.pve.vmoptions by `make docs`: edit the table, not this block
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
      - V(present) creates or updates the VM and leaves its power state alone; V(started) also starts it; V(stopped)
        shuts it down (forced stop after the timeout); V(absent) stops and destroys it.
      - V(restarted) shuts an existing VM down and starts it again without touching its config (always changed; the
        guest renews its DHCP lease). Only O(node), O(vmid) and O(name) are needed.
    type: str
    default: present
    choices:
      - present
      - started
      - stopped
      - absent
      - restarted
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
    description: 'Balloon target in MiB: the least memory the VM keeps when the host reclaims memory. V(0) removes
      the balloon device (needed with a passed-through GPU, whose memory is pinned). Equal to O(memory) is PVE''s
      default.'
    type: int
  machine:
    description: Machine type, V(i440fx) (QEMU's C(pc)) or V(q35), or a pinned version such as V(pc-q35-9.2).
    type: str
  bios:
    description: Firmware.
    type: str
    choices:
      - seabios
      - ovmf
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
        default: 4m
        choices:
          - 2m
          - 4m
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
          - Volume to import the disk from when the VM is created, such as V(local:import/noble-server-cloudimg-amd64.qcow2).
            Ignored for an existing disk.
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
      - 'PCI devices, C(hostpci0) first. Each entry names a resource O(hostpci[].mapping), a raw O(hostpci[].host)
        address, or both: the mapping, and the address it maps on this node. With both, a VM that has that address
        attached raw already keeps that attachment (it is the same passthrough), and a new attachment goes through
        the mapping.'
      - 'PVE accepts raw devices from root@pam (password login) only, never from a token: a raw address to attach,
        or a raw attachment to replace, with any other login is refused before anything is written.'
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
    description: An ISO volume for the CD-ROM, such as V(local:iso/ubuntu-24.04.3-live-server-amd64.iso); V(none)
      empties it.
    type: str
  cdrom_slot:
    description: Config key of the CD-ROM (with O(cdrom)).
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
      - Further config keys as PVE spells them (key to value; null removes the key). They go through the same normalisation
        as the rest.
    type: dict
  create_only:
    description:
      - Options (of those above) used only when the VM is created; an existing VM keeps what it has for them, such
        as the CD-ROM, boot order and guest agent of a VM made by hand.
    type: list
    default: []
    choices:
      - cores
      - sockets
      - memory
      - balloon
      - machine
      - bios
      - cpu
      - ostype
      - scsihw
      - agent
      - onboot
      - numa
      - efidisk
      - disks
      - nets
      - hostpci
      - cdrom
      - cdrom_slot
      - cloudinit
      - serial_console
      - boot_order
      - description
      - tags
      - extra_config
    elements: str
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
  read_host_keys:
    description:
      - After the VM runs, read its SSH public host keys (C(/etc/ssh/ssh_host_*_key.pub)) through the guest agent
        (C(agent/file-read), privilege C(VM.GuestAgent.FileRead)), waiting up to O(address_timeout) seconds for the
        agent; RV(host_keys) has them. Reads only; check mode reads them of a VM that runs.
    type: bool
    default: false
  host_keys_known:
    description:
      - 'The controller already trusts a host key of this VM (its known_hosts has a line for it): with O(read_host_keys),
        read the keys only when this run creates, starts or restarts the VM, so a run that leaves a running VM alone
        sends no guest agent request.'
    type: bool
    default: false
  owner_tag:
    description:
      - 'With O(state=absent): destroy the VM only when it carries this PVE tag (the mark of the VMs gpulab creates,
        set in the create call only); a VM without it is kept and RV(kept) says why. Unset: no such check.'
    type: str
  destroy_untagged:
    description: 'With O(state=absent) and O(owner_tag): destroy the VM even without the tag (an adopted VM its owner
      named).'
    type: bool
    default: false
  backup_storage:
    description:
      - 'With O(state=absent): take a vzdump backup (mode stop, zstd) of the VM to this storage before it is destroyed;
        a failed backup leaves the VM in place. The storage''s content must include C(backup).'
    type: str
"""

EXAMPLES = r"""
- name: The GPU VM of the reference lab, started, GPU through its resource mapping
  gpulab.homelab.pve_vm:
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
  gpulab.homelab.pve_vm:
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
kept:
  description: With O(state=absent), why the VM was kept instead of destroyed (it lacks O(owner_tag)); null otherwise.
  returned: always
  type: str
backup:
  description: With O(backup_storage), the archive vzdump wrote, as its task log names it (null in check mode).
  returned: always
  type: str
address:
  description: IPv4 address the guest agent reported on C(net0) (with O(wait_for_address)).
  returned: when O(wait_for_address=true) and the VM runs (in check mode, when it already ran)
  type: str
host_keys:
  description:
    - The guest's SSH public host keys as C(TYPE BASE64), one per key type it has (ed25519 first), read through
      the guest agent (with O(read_host_keys)).
  returned: when O(read_host_keys=true) and the VM runs (in check mode, when it already ran)
  type: list
  elements: str
  sample: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG1vY2sga2V5"]
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

from ansible_collections.gpulab.homelab.plugins.module_utils import pve  # noqa: E402
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

# generated from gpulab.pve.vmoptions by `make docs`: edit its OPTIONS, not these lines
EFIDISK_OPTIONS = dict(
    storage=dict(type="str", required=True),
    efitype=dict(type="str", default="4m", choices=["2m", "4m"]),
    pre_enrolled_keys=dict(type="bool", default=False),
)
DISKS_OPTIONS = dict(
    slot=dict(type="str", default="scsi0"),
    storage=dict(type="str", required=True),
    size_gb=dict(type="int", required=True),
    import_from=dict(type="str"),
    iothread=dict(type="bool"),
    discard=dict(type="bool"),
    ssd=dict(type="bool"),
)
NETS_OPTIONS = dict(
    model=dict(type="str", default="virtio"),
    bridge=dict(type="str", default="vmbr0"),
    macaddr=dict(type="str"),
    firewall=dict(type="bool"),
    tag=dict(type="int"),
)
HOSTPCI_OPTIONS = dict(
    mapping=dict(type="str"),
    host=dict(type="str"),
    pcie=dict(type="bool"),
    x_vga=dict(type="bool"),
    rombar=dict(type="bool"),
)
CLOUDINIT_OPTIONS = dict(
    storage=dict(type="str", required=True),
    slot=dict(type="str", default="ide2"),
    user=dict(type="str"),
    ssh_keys=dict(type="list", elements="str", no_log=False),
    ipconfig=dict(type="str", default="ip=dhcp"),
    upgrade=dict(type="bool"),
    password=dict(type="str", no_log=True),
)
ARGUMENT_SPEC = dict(
    node=dict(type="str", required=True),
    vmid=dict(type="int", required=True),
    name=dict(type="str", required=True),
    state=dict(
        type="str", default="present", choices=["present", "started", "stopped", "absent", "restarted"]
    ),
    cores=dict(type="int"),
    sockets=dict(type="int"),
    memory=dict(type="int"),
    balloon=dict(type="int"),
    machine=dict(type="str"),
    bios=dict(type="str", choices=["seabios", "ovmf"]),
    cpu=dict(type="str"),
    ostype=dict(type="str"),
    scsihw=dict(type="str"),
    agent=dict(type="bool"),
    onboot=dict(type="bool"),
    numa=dict(type="bool"),
    efidisk=dict(type="dict", options=EFIDISK_OPTIONS),
    disks=dict(type="list", elements="dict", options=DISKS_OPTIONS),
    nets=dict(type="list", elements="dict", options=NETS_OPTIONS),
    hostpci=dict(type="list", elements="dict", options=HOSTPCI_OPTIONS),
    cdrom=dict(type="str"),
    cdrom_slot=dict(type="str", default="ide2"),
    cloudinit=dict(type="dict", options=CLOUDINIT_OPTIONS),
    serial_console=dict(type="bool"),
    boot_order=dict(type="list", elements="str"),
    description=dict(type="str"),
    tags=dict(type="list", elements="str"),
    extra_config=dict(type="dict"),
    create_only=dict(
        type="list",
        default=[],
        choices=[
            "cores",
            "sockets",
            "memory",
            "balloon",
            "machine",
            "bios",
            "cpu",
            "ostype",
            "scsihw",
            "agent",
            "onboot",
            "numa",
            "efidisk",
            "disks",
            "nets",
            "hostpci",
            "cdrom",
            "cdrom_slot",
            "cloudinit",
            "serial_console",
            "boot_order",
            "description",
            "tags",
            "extra_config",
        ],
        elements="str",
    ),
    restart=dict(type="bool", default=False),
    timeout=dict(type="int", default=600),
    lock_timeout=dict(type="int", default=60),
    wait_for_address=dict(type="bool", default=False),
    address_timeout=dict(type="int", default=300),
    read_host_keys=dict(type="bool", default=False),
    host_keys_known=dict(type="bool", default=False),
    owner_tag=dict(type="str"),
    destroy_untagged=dict(type="bool", default=False),
    backup_storage=dict(type="str"),
    **pve.CONNECTION,
)
RULES = pve.CONNECTION_RULES
# end of the generated argument spec


def main():
    run_module(ARGUMENT_SPEC, RULES, "pve_vm")  # AnsibleModule, then gpulab.tasks.pve_vm


if __name__ == "__main__":
    main()
