#!/usr/bin/python
"""Ansible module lab_table: the end-of-run lab table (thin wrapper over gpulab.labtable)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: lab_table
short_description: Build the lab table of every VM from PVE, nvidia-smi and k3s, and store it
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Reads each VM's power state from the Proxmox VE API (one list) and its config (one read per VM, none
    for a VM whose C(config) is given), joins them with the GPU facts of each VM and the k3s node list, and returns the table.
  - Writes it as C(lab-table.md), C(lab-table.json) and C(lab-table.html) into O(state_dir) when given; C(changed) is true
    only when their content changed. In check mode nothing is written.
attributes:
  diff_mode:
    support: none
    details: The table it writes under O(state_dir) comes back as RV(lines) and RV(markdown) instead.
extends_documentation_fragment:
  - gpulab.homelab.pve
  - gpulab.homelab.attributes
options:
  vms:
    description:
      - The lab's VMs, each with C(name), C(node), C(vmid), and optionally C(address) and C(gpu) (its
        C(vm_gpu), a card id or a list of them for a VM with several cards).
      - Optionally C(down), true for a VM the run found unreachable (its k3s column then says C(down)).
      - Optionally C(config), the VM's config as the API returned it earlier in the same run (the
        C(current) result of pve_vm); that VM's config is then not read again.
    type: list
    elements: dict
    required: true
  gpus:
    description: GPU facts per VM name (the C(gpus) list of gpu_facts).
    type: dict
    default: {}
  k8s_nodes:
    description: The C(items) of C(kubectl get nodes -o json); node names are the VMs' inventory names.
    type: list
    elements: dict
    default: []
  k8s_pods:
    description:
      - The C(items) of C(kubectl get pods --all-namespaces -o json); their HAMi annotations
        (C(hami.io/vgpu-devices-allocated)) give who holds what on each card.
    type: list
    elements: dict
    default: []
  state_dir:
    description:
      - Folder for C(lab-table.md), C(lab-table.json) and C(lab-table.html) (a self-contained page with a picture
        of the lab with its nodes, VMs, cards, shares and problems); omitted, nothing is written.
    type: path
  links:
    description: Where the lab's UIs are reached (name to URL, as stage monitoring notes them), listed under the
      Markdown table and on the page. Stage monitoring's Prometheus, Grafana and HAMi-WebUI (keys C(prometheus),
      C(grafana), C(webui)) are endpoints of kind C(monitoring) of the VM that serves them too, like the engines.
    type: dict
    default: {}
  kube_context:
    description: The cluster's context in the controller's kubeconfig (stage k3s writes it, gpulab_lab_name), named
      in the row of each VM that is a node of the cluster, under the Markdown table and on the page.
    type: str
    default: ""
  endpoints:
    description:
      - The LAN engines stage workloads called from the controller (C(name), C(url), C(model), C(node), C(cards),
        C(gpu_memory_percent)). Each is listed in its node's row (C(endpoints)), under the Markdown table and on
        the page, with its URL, model and card share.
    type: list
    elements: dict
    default: []
"""

EXAMPLES = r"""
# In a play the connection comes from the inventory (pve_api_* of the first host in group proxmox).
- name: Build and store the lab table
  gpulab.homelab.lab_table:
    vms:
      - {name: vm-gpu, node: pve, vmid: 102, address: 192.168.100.55, gpu: rtx3090}
    gpus: {vm-gpu: [{name: NVIDIA GeForce RTX 3090, memory_total_mib: 24576, driver_version: "580.95.05"}]}
    state_dir: .gpulab
  register: table
"""

RETURN = r"""
requests: {description: 'API requests this run sent (reads, writes).', returned: always, type: dict}
rows:
  description:
    - One dict per VM with the keys vm, vmid, node (the PVE node the cluster list puts the VM on), address,
      shape, platform, gpu, onboot, driver, k3s, hami, shares.
    - C(k3s) starts with C(down (VM stopped)) for a VM PVE lists but not running, or C(down (not answering)) for
      one the run found unreachable, before the status its k3s node last had.
    - C(shares) says who holds what on each card HAMi registered on the VM's node (pods, their share, the
      free percent), from the pods' C(hami.io/vgpu-devices-allocated) annotations.
  returned: always
  type: list
  elements: dict
lines:
  description: The table as aligned text lines.
  returned: always
  type: list
  elements: str
markdown:
  description: The table in Markdown.
  returned: always
  type: str
files:
  description: The files written (or that would be written), when O(state_dir) is given.
  returned: when O(state_dir) is given
  type: list
  elements: str
"""

from ansible_collections.gpulab.homelab.plugins.module_utils import pve  # noqa: E402
from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    vms=dict(type="list", elements="dict", required=True),
    gpus=dict(type="dict", default={}),
    k8s_nodes=dict(type="list", elements="dict", default=[]),
    k8s_pods=dict(type="list", elements="dict", default=[]),
    state_dir=dict(type="path"),
    links=dict(type="dict", default={}),
    kube_context=dict(type="str", default=""),
    endpoints=dict(type="list", elements="dict", default=[]),
    **pve.CONNECTION,
)
RULES = pve.CONNECTION_RULES


def main():
    run_module(ARGUMENT_SPEC, RULES, "lab_table")  # AnsibleModule, then gpulab.tasks.lab_table


if __name__ == "__main__":
    main()
