#!/usr/bin/python
"""Documentation of the preflight action (the work is done in plugins/action)."""

DOCUMENTATION = r"""
---
module: preflight
short_description: Validate the whole gpulab lab definition before any change
description:
  - Reads the lab definition from the inventory (groups C(proxmox), C(router), C(vms), C(k3s_server),
    C(k3s_agent) and their variables) and checks it with the same validation as C(gpulab plan).
  - Fails with one line per problem, each naming the host, the field, the value, why it is wrong and how
    to fix it. Writes nothing anywhere.
  - When the definition is valid and the run's tags select a stage that uses the Proxmox VE API (vms,
    network, verify), reads C(GET /version) with the inventory's C(pve_api_*) settings (10 s timeout, one
    retry) and fails the same way when the API cannot be reached or refuses the credentials.
  - With stage vms in the run it also reads each node's storages (one C(GET /nodes/{node}/storage) per node)
    and fails when a storage the VMs need is missing, disabled or lacks the content type (C(images) for
    vm_storage, C(import) or C(iso) for the image, C(snippets) for gpulab_snippet_storage), naming the
    C(pvesm set) command or the variable to change; then, unless gpulab_download_check is false, it asks
    from the controller every URL a node will download (a file not on its storage yet) and fails on a 404,
    a web page, or a pinned checksum the folder's C(SHA256SUMS) no longer lists (C(gpulab.downloads)).
  - When the definition is valid, returns C(vms), each VM resolved once (C(gpulab.vmspec)) into the whole spec
    stage vms sends, with every default and decision made, C(router), the router and each VM's reservation
    resolved once (C(gpulab.routerspec)) for stage network, and C(stages), the stages the run's tags select.
    C(playbooks/preflight.yml) keeps them for the later stages as C(gpulab_vms), C(gpulab_router) and
    C(gpulab_stages).
  - Runs on the controller. A stage playbook run alone (C(playbooks/vms.yml)) names its own stages in
    O(stages), so that only what those stages use is checked and reached.
options:
  stages:
    description:
      - The stages the playbook being run holds; the run's tags then select among these only. Left out (site.yml),
        every stage of gpulab.
    type: list
    elements: str
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    details: It only reads (the inventory, the PVE API, the download URLs); a check run does the same.
  diff_mode:
    support: none
author: gpulab contributors (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Validate the lab definition
  gpulab.homelab.preflight:
  register: gpulab_preflight_result
"""

RETURN = r"""
plan:
  description: The plan, one line per item (VMs per node, pinned memory, GPUs, addresses, k3s).
  returned: when the lab definition is valid
  type: list
  elements: str
problems:
  description: Every problem found, as the message shown to the user.
  returned: always
  type: list
  elements: str
reached:
  description: The APIs reached, with what they answered (such as the PVE version).
  returned: always
  type: list
  elements: str
vms:
  description:
    - Each VM by inventory host, plain VMs first and GPU VMs last, with C(host), C(node), C(node_host), C(vmid),
      C(name), C(install), C(gpus) (the card ids of vm_gpu, empty for a VM without one), C(address),
      C(ssh_user), C(snippet) and C(spec), the options of pve_vm.
  returned: when the lab definition is valid
  type: dict
router:
  description:
    - The router as dhcp_reservation takes it, with C(host) (the inventory host describing it), C(kind),
      C(address), C(subnet), C(pool), C(user), C(url) (HTTP routers), C(validate_certs), C(options) (the kind's
      defaults, C(router_options) and C(router_dhcp_options) merged), C(ssh) (for SSH routers, host, port, user,
      key_file, ssh_args, host_key_checking, local), C(secrets) (the names of the router host's variables that
      hold the password and the SSH password; never their values) and C(mode) (C(router_dhcp_reservation_mode)).
    - C(reservations), one per VM in inventory order, each with C(host), C(hostname), C(mac) (C(vm_mac)
      normalised, null when PVE picks it), C(address) (C(vm_address) in planned mode) and C(expect) (C(vm_address)
      in keep mode, which the address kept must be).
  returned: when the lab definition is valid
  type: dict
stages:
  description:
    - The stages the run's C(--tags) and C(--skip-tags) select, sorted (C(workloads) only when named), among
      O(stages) when given.
  returned: when the lab definition is valid
  type: list
  elements: str
"""

# The options, which the action plugin validates with (plugins/action/preflight.py).
ARGUMENT_SPEC = {
    "stages": {"type": "list", "elements": "str"},
}
