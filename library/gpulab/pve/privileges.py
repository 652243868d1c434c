"""The Proxmox VE API access gpulab needs: its role's privileges, its user and its token, each named once.

The docs' `pveum` commands (library/gpulab/data/commands.yml, docs/getting-started.md step 3) create exactly
these; tests/unit/pve/test_privileges.py fails when that role command or the simulated lab's token grant differ. Each privilege
is listed with the calls that check it (shared/pve-api/NOTES.md, the PVE 9.1 schema's permission entries);
none is there that no call checks (VM.Console, which README once listed, opens consoles: no call of gpulab
does).

With privilege separation (the token's default), a token holds a privilege only where both the token and
its user hold it, so the role is granted on `/` to both.
"""

from __future__ import annotations

ROLE = "gpulab"
USER = "gpulab@pve"
TOKEN_NAME = "ansible"
TOKEN_ID = f"{USER}!{TOKEN_NAME}"
ACL_PATH = "/"

# privilege -> what it is for
PRIVILEGES: dict[str, str] = {
    "VM.Allocate": "create the VMs (POST /nodes/{node}/qemu); playbooks/teardown.yml destroys them",
    "VM.Audit": "read VM lists, configs and status",
    "VM.Backup": "the vzdump backup playbooks/teardown.yml takes before a destroy (POST /nodes/{node}/vzdump)",
    "VM.Config.CDROM": "the ISO drive (ide2) of an ISO-installed VM",
    "VM.Config.CPU": "cores and CPU type",
    "VM.Config.Cloudinit": "cloud-init settings of a cloud-image VM",
    "VM.Config.Disk": "disks, the EFI disk, imports and resizes",
    "VM.Config.HWType": "machine, firmware, SCSI controller, a mapped hostpci",
    "VM.Config.Memory": "memory and balloon",
    "VM.Config.Network": "the NIC (net0)",
    "VM.Config.Options": "name, start at boot, guest agent, boot order, OS type",
    "VM.GuestAgent.Audit": "a VM's addresses through the guest agent",
    "VM.GuestAgent.FileRead": "a new cloud-image VM's SSH host keys through the guest agent (agent/file-read)",
    "VM.PowerMgmt": "start, shut down and restart the VMs",
    "Datastore.AllocateSpace": "allocate the VMs' disks",
    "Datastore.AllocateTemplate": "download-url: the OS image and ISO",
    "Datastore.Audit": "list a storage's content (is the image there yet?) and, in preflight, each node's "
    "storages with their content types and whether they are enabled (GET /nodes/{node}/storage)",
    "Sys.AccessNetwork": "download-url from the internet (instead of Sys.Modify on /)",
    "Sys.Audit": "node status, PCI devices and IOMMU groups, task logs",
    "SDN.Use": "attach a NIC to the bridge (vmbr0)",
    "Mapping.Audit": "read the PCI resource mappings",
    "Mapping.Modify": "create and update a GPU's PCI resource mapping",
    "Mapping.Use": "attach a GPU through its mapping (hostpci0 mapping=...)",
}


def pveum_commands() -> list[str]:
    """The commands, run as root on the node, that create the role, the user, the token and both ACLs."""
    return [
        f'pveum role add {ROLE} --privs "{",".join(PRIVILEGES)}"',
        f"pveum user add {USER} --comment 'gpulab automation (API token only)'",
        f"pveum user token add {USER} {TOKEN_NAME} --privsep 1",
        f"pveum acl modify {ACL_PATH} --roles {ROLE} --users {USER}",
        f"pveum acl modify {ACL_PATH} --roles {ROLE} --tokens '{TOKEN_ID}'",
    ]
