#!/usr/bin/python
"""Ansible module pve_info: read-only facts about a Proxmox VE node."""

DOCUMENTATION = r"""
module: pve_info
short_description: Node memory, PCI devices with IOMMU groups, VMs, storages and PCI mappings of a Proxmox VE node
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Reads what preflight checks and the end-of-run table show. Changes nothing.
  - Each section is one GET request; ask only for the sections you need.
attributes:
  diff_mode:
    support: none
    details: It changes nothing.
extends_documentation_fragment:
  - gpulab.homelab.pve
  - gpulab.homelab.attributes
options:
  node:
    description: The node to describe.
    type: str
    required: true
  gather:
    description: Sections to read.
    type: list
    elements: str
    choices: [version, memory, pci, vms, storages, mappings, nics]
    default: [version, memory, pci, vms, storages, mappings]
"""

EXAMPLES = r"""
# In a play the connection comes from the inventory (pve_api_* of node pve's host in group proxmox).
- name: What the node has
  gpulab.homelab.pve_info:
    node: pve
    gather: [memory, pci, vms]
  register: pve_facts

- name: The GPU's IOMMU group holds nothing else
  ansible.builtin.assert:
    that: pve_facts.iommu_groups['13'] == ['0000:02:00.0', '0000:02:00.1']

- name: The version, read with a login of the task's own (it wins over the inventory's token)
  gpulab.homelab.pve_info:
    api_user: root@pam
    api_password: "{{ vault_pve_root_password }}"
    node: pve
    gather: [version]
"""

RETURN = r"""
requests: {description: 'API requests this run sent (reads, writes).', returned: always, type: dict}
node:
  description: The node.
  returned: always
  type: str
version:
  description: C(version), C(release) and C(repoid) of PVE.
  returned: when V(version) is gathered
  type: dict
memory:
  description: Node memory in MiB (C(total_mib), C(used_mib), C(free_mib), C(available_mib)).
  returned: when V(memory) is gathered
  type: dict
pci:
  description:
    - PCI devices, unfiltered; C(id) (C(0000:02:00.0)), C(class) and C(vendor_device) without C(0x),
      C(iommugroup) (-1 without IOMMU), C(subsystem_id), names.
  returned: when V(pci) is gathered
  type: list
  elements: dict
iommu_groups:
  description: IOMMU group number (as a string) to the device IDs in it.
  returned: when V(pci) is gathered
  type: dict
iommu_enabled:
  description: Whether every device has an IOMMU group.
  returned: when V(pci) is gathered
  type: bool
vms:
  description: VMs on the node (C(vmid), C(name), C(status), C(maxmem_mib), C(cpus), C(lock)).
  returned: when V(vms) is gathered
  type: list
  elements: dict
storages:
  description: Storages of the node (C(storage), C(type), C(content), C(active), C(total), C(avail)).
  returned: when V(storages) is gathered
  type: list
  elements: dict
nics:
  description:
    - Per VM on the node, C(vmid), C(name), the C(mac) of C(net0) and, when the VM runs and its guest agent
      answers, the IPv4 C(address) on that NIC (else null).
  returned: when V(nics) is gathered
  type: list
  elements: dict
mappings:
  description: Cluster PCI resource mappings as PVE lists them.
  returned: when V(mappings) is gathered
  type: list
  elements: dict
"""

from ansible_collections.gpulab.homelab.plugins.module_utils import pve  # noqa: E402
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    node=dict(type="str", required=True),
    gather=dict(
        type="list",
        elements="str",
        choices=["version", "memory", "pci", "vms", "storages", "mappings", "nics"],
        default=["version", "memory", "pci", "vms", "storages", "mappings"],
    ),
    **pve.CONNECTION,
)
RULES = pve.CONNECTION_RULES


def main():
    run_module(ARGUMENT_SPEC, RULES, "pve_info")  # AnsibleModule, then gpulab.tasks.pve_info


if __name__ == "__main__":
    main()
