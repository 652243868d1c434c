#!/usr/bin/python
"""Ansible module pve_pci_mapping: a cluster PCI resource mapping (one per GPU)."""

DOCUMENTATION = r"""
module: pve_pci_mapping
short_description: Keep a Proxmox VE cluster PCI resource mapping, so that API tokens can attach a GPU
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Creates, updates or removes one entry of C(/cluster/mapping/pci). A VM then names the card with
    C(hostpciN=mapping=<id>), which API tokens may do with C(Mapping.Use); PVE allows raw C(host=)
    devices to root@pam (password login) only.
  - PVE checks the map against the hardware when the VM starts; O(entries[].id),
    O(entries[].subsystem_id) and O(entries[].iommugroup) must equal what the node reports (see
    M(gpulab.homelab.pve_info)).
  - The comparison ignores the order of entries and the case of hex IDs; only a difference is written.
attributes:
  diff_mode:
    support: full
    details: Shows the mapping (C(map) entries, C(description)) before and after.
extends_documentation_fragment:
  - gpulab.homelab.pve
  - gpulab.homelab.attributes
options:
  id:
    description: Mapping ID, C([a-z][a-z0-9_-]+), such as V(rtx3090).
    type: str
    required: true
  state:
    description: Whether the mapping exists.
    type: str
    choices: [present, absent]
    default: present
  description:
    description: Description of the mapping; left alone when not given.
    type: str
  entries:
    description: One entry per node that has the device.
    type: list
    elements: dict
    default: []
    suboptions:
      node:
        description: Node name.
        type: str
        required: true
      path:
        description: PCI address with domain; V(0000:02:00) (no function) maps every function of the card.
        type: str
        required: true
      id:
        description: C(vendor:device) of the first function, such as V(10de:2204).
        type: str
        required: true
      iommugroup:
        description: IOMMU group of the device.
        type: int
      subsystem_id:
        description: C(subsystem-vendor:subsystem-device), such as V(1462:3881).
        type: str
"""

EXAMPLES = r"""
# In a play the connection comes from the inventory (pve_api_* of the host in group proxmox of the
# entries' node).
- name: Map the RTX 3090 of node pve
  gpulab.homelab.pve_pci_mapping:
    id: rtx3090
    entries:
      - node: pve
        path: "0000:02:00"
        id: "10de:2204"
        iommugroup: 13
        subsystem_id: "1462:3881"
"""

RETURN = r"""
requests: {description: 'API requests this run sent (reads, writes).', returned: always, type: dict}
id:
  description: The mapping ID.
  returned: always
  type: str
mapping:
  description: The mapping after the run (C(map) entries normalised and sorted, C(description)); null when absent.
  returned: always
  type: dict
  sample:
    map: ["node=pve,path=0000:02:00,id=10de:2204,iommugroup=13,subsystem-id=1462:3881"]
    description: ""
"""

from ansible_collections.gpulab.homelab.plugins.module_utils import pve  # noqa: E402
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ENTRIES_OPTIONS = dict(
    node=dict(type="str", required=True),
    path=dict(type="str", required=True),
    id=dict(type="str", required=True),
    iommugroup=dict(type="int"),
    subsystem_id=dict(type="str"),
)
ARGUMENT_SPEC = dict(
    id=dict(type="str", required=True),
    state=dict(type="str", choices=["present", "absent"], default="present"),
    description=dict(type="str"),
    entries=dict(type="list", elements="dict", default=[], options=ENTRIES_OPTIONS),
    **pve.CONNECTION,
)
RULES = pve.CONNECTION_RULES


def main():
    run_module(ARGUMENT_SPEC, RULES, "pve_pci_mapping")  # AnsibleModule, then gpulab.tasks.pve_pci_mapping


if __name__ == "__main__":
    main()
