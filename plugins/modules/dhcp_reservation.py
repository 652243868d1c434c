#!/usr/bin/python
# Copyright: gpulab contributors
# MIT License (see pyproject.toml)
"""DHCP reservations (MAC -> IPv4 address) on the lab's router, for every router kind gpulab knows."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: dhcp_reservation
short_description: Ensure DHCP reservations (MAC to IPv4 address) on the lab's router
version_added: "0.1.0"
author: gpulab contributors (!UNKNOWN)
description:
  - Lists the router's leases and reservations, plans every change of the run at once, refuses
    before any write when the request cannot work, writes the whole batch, applies it on the router
    once and verifies it by re-reading the router's reservations.
  - Reservations are keyed on the normalised MAC (lower case, colon separated).
  - Refusals, all before the first write, are the router's own address, an address outside O(subnet), an address reserved for or
    currently leased to another MAC, an address of O(keep_free) that a MAC holds or has reserved,
    the same MAC twice (in O(reservations) or on the router),
    an address inside the DHCP pool on a router that refuses it (pfSense), the router's reservation
    limit (16 on the Huawei ONT), and authentication failures.
  - Runs on the controller and needs the C(gpulab) Python package (the project's virtualenv). SSH
    routers (V(dnsmasq), V(openwrt)) are reached with paramiko, so the router needs no Python.
  - Its action plugin fills what the task leaves out from the router preflight resolved (the fact
    C(gpulab_router), C(gpulab.routerspec)) when the task names no O(kind); without that fact (stage network
    run on its own) it resolves the inventory's router the same way. The router's secrets are read from the
    variables C(gpulab_router.secrets) names (C(router_password), C(ansible_password)) of the router's host.
requirements:
  - gpulab, the project's engine, in the controller's Python (requirements.txt; C(make venv) in a checkout)
options:
  kind:
    description: The router's kind (the inventory's C(router_kind)); default the router spec's.
    type: str
    choices: [dnsmasq, openwrt, kea, mikrotik, opnsense, pfsense, huawei_ont]
  address:
    description: The router's LAN address (C(router_address)); the default host for SSH and HTTP.
    type: str
  subnet:
    description: The LAN subnet in CIDR form (C(router_subnet)); reservations must lie inside it.
    type: str
  pool:
    description: The DHCP pool (C(router_dhcp_pool)), used for the pfSense in-pool refusal and messages.
    type: dict
    suboptions:
      start:
        description: First address of the pool.
        type: str
        required: true
      end:
        description: Last address of the pool.
        type: str
        required: true
  user:
    description:
      - Login user for HTTP routers (C(router_user)); the API key for V(opnsense).
      - For V(pfsense) with C(options.auth=api_key) it is ignored.
    type: str
  password:
    description:
      - Password for HTTP routers (C(router_password)); the API secret for V(opnsense), the API key for
        V(pfsense) with C(options.auth=api_key). Never shown in output or errors.
    type: str
  url:
    description:
      - Base URL of HTTP routers (C(router_url)); default C(https://<address>), C(http://<address>) for
        V(huawei_ont), C(http://<address>:8000/) for V(kea) (the control agent).
    type: str
  validate_certs:
    description:
      - Check the router's TLS certificate (C(router_validate_certs), true unless the inventory says otherwise).
      - Unset, the backend checks it.
    type: bool
  ssh:
    description: How to reach SSH routers (V(dnsmasq), V(openwrt)); ignored for the others.
    type: dict
    suboptions:
      host:
        description: SSH host (default O(address)).
        type: str
      port:
        description: SSH port (unset, 22; gpulab.routers.kinds fills what O(ssh) leaves out).
        type: int
      user:
        description: SSH user (default O(user), then C(root)).
        type: str
      password:
        description: SSH password, when no key is used.
        type: str
      key_file:
        description: Private key file.
        type: path
      host_key_checking:
        description:
          - Check the router's host key. V(false) accepts any key; turn it off only for throw-away labs.
          - With V(true) (or unset), O(ssh.ssh_args) may still say C(StrictHostKeyChecking=accept-new) (trust a
            first-seen key and record it in the known_hosts file).
        type: bool
      known_hosts:
        description: An extra known_hosts file (the user's own is always read).
        type: path
      ssh_args:
        description:
          - OpenSSH arguments of the router host (C(ansible_ssh_common_args) and C(ansible_ssh_extra_args));
            C(-o UserKnownHostsFile=...) and C(-o StrictHostKeyChecking=...) are honoured, the rest ignored.
        type: str
      become:
        description: Run the router commands through C(sudo -n) (for a non-root SSH user).
        type: bool
        default: false
      local:
        description: Run the commands on the controller itself (a router on this machine; tests).
        type: bool
        default: false
  options:
    description:  # generated from gpulab.routers.kinds by `make docs`
      - Backend-specific settings (the inventory's C(router_options)).
      - 'V(dnsmasq): C(hostsfile) (default C(/etc/dnsmasq.gpulab-hosts)): the C(--dhcp-hostsfile) dnsmasq reads; C(leasefile)
        (default C(/var/lib/misc/dnsmasq.leases)); C(pidfile) (default C(/run/dnsmasq/dnsmasq.pid)): SIGHUP goes to it;
        C(reload_command): run instead of the SIGHUP; C(check_wiring) (default C(true)): refuse when the running dnsmasq
        does not read C(hostsfile).'
      - 'V(openwrt): C(leasefile): default from C(uci get dhcp.@dnsmasq[0].leasefile), else C(/tmp/dhcp.leases); C(reload_command)
        (default C(/etc/init.d/dnsmasq reload)).'
      - 'V(kea): C(url): the control agent, default C(http://<address>:8000/); C(service) (default C(dhcp4)): empty for
        Kea 3 daemons listening on HTTP themselves; C(subnet_id): default the C(subnet4) entry equal to O(subnet); C(config_write)
        (default C(true)).'
      - 'V(mikrotik): C(server): the DHCP server''s name, default the server that holds the lease.'
      - 'V(opnsense): C(dhcp) (default C(kea)): V(kea) or V(dnsmasq), the DHCP service in use.'
      - 'V(pfsense): C(interface) (default C(lan)): the C(parent_id) of the static mappings; C(auth) (default C(basic)):
        V(basic) or V(api_key).'
      - 'V(huawei_ont): C(profile): an http_form profile mapping overriding the built-in Huawei one, for ISP firmware
        with other paths.'
    type: dict
    default: {}
  reservations:
    description:
      - The reservations to ensure (or, with O(state=absent), to remove).
      - Omitted, the action plugin gives one per VM of the router spec (C(gpulab_router.reservations)), with
        the MAC stage vms recorded for a VM without C(vm_mac) (C(gpulab_vm_mac)) and the address it holds
        (C(gpulab_vm_address)); the VMs of group C(gpulab_new_vms) (not created yet) are left out.
    type: list
    elements: dict
    default: []
    suboptions:
      mac:
        description: The VM's MAC address, in any common spelling.
        type: str
        required: true
      address:
        description:
          - The address to reserve. Omit it (or V(keep)) to keep what the MAC holds, an existing
            reservation first, then the router's current lease, then O(reservations[].current_address).
        type: str
      hostname:
        description: Host name to store with the reservation where the router has the field.
        type: str
      current_address:
        description: The address the VM reports (guest agent), used in keep mode when the router has no lease.
        type: str
      expect:
        description:
          - In keep mode, the address the rest of the run uses for the VM (its C(vm_address)). When the address
            kept differs, the module fails before any write, naming both and the two ways out.
        type: str
      name:
        description: The inventory name, for messages.
        type: str
  keep_free:
    description:
      - Addresses no device may lease or have reserved, because the lab holds them without DHCP (the kube-vip
        VIP of the k3s servers). The module fails before any write when the router reserves one for a MAC,
        leases one to a MAC right now, or O(reservations) would reserve one, naming O(keep_free[].host),
        O(keep_free[].field), the address and the fix.
    type: list
    elements: dict
    default: []
    suboptions:
      address:
        description: The address.
        type: str
        required: true
      host:
        description: The inventory host (or V(all) for group_vars/all) that sets it, for messages.
        type: str
      field:
        description: The inventory variable that sets it, for messages.
        type: str
      what:
        description: What holds the address, for messages.
        type: str
  known_only:
    description:
      - With O(reservations) omitted, leave out the VMs whose MAC is not known yet instead of failing (preflight
        plans the reservations of the VMs that exist).
    type: bool
    default: false
  state:
    description: V(present) ensures the reservations; V(absent) removes every reservation of each MAC.
    type: str
    choices: [present, absent]
    default: present
extends_documentation_fragment:
  - gpulab.homelab.attributes
attributes:
  check_mode:
    support: full
    description: Lists and plans only; Kea additionally runs config-test on the planned configuration.
  diff_mode:
    support: full
    description: The router's reservations before and after, one C(mac address [hostname]) line each.
notes:
  - Run it once per play with every VM in O(reservations) so the router applies the batch once.
"""

EXAMPLES = r"""
- name: Keep the addresses the VMs hold (dnsmasq on the lab's router host)
  gpulab.homelab.dhcp_reservation:
    kind: dnsmasq
    address: 192.168.100.1
    subnet: 192.168.100.0/24
    ssh:
      user: root
      key_file: ~/.ssh/id_ed25519
    reservations:
      - {mac: "BC:24:11:00:00:01", name: vm-1, hostname: vm-1}
      - {mac: "BC:24:11:00:00:02", name: vm-2, hostname: vm-2}

- name: Planned addresses on a Huawei ONT
  gpulab.homelab.dhcp_reservation:
    kind: huawei_ont
    address: 192.168.100.1
    subnet: 192.168.100.0/24
    pool: {start: 192.168.100.2, end: 192.168.100.254}
    user: admin
    password: "{{ vault_router_password }}"
    reservations:
      - {mac: "bc:24:11:00:00:01", address: 192.168.100.53, name: vm-1}
"""

RETURN = r"""
changes:
  description: What was (or, in check mode, would be) changed.
  returned: always
  type: list
  elements: dict
  contains:
    action:
      description: V(create), V(update) or V(delete).
      type: str
    mac:
      description: Normalised MAC.
      type: str
    before:
      description: The reservation before (C(mac), C(address), C(hostname)), or null.
      type: dict
    after:
      description: The reservation after, or null.
      type: dict
    summary:
      description: One line in words.
      type: str
      sample: add bc:24:11:00:00:01 192.168.100.53 vm-1
reservations:
  description: Normalised MAC -> the reservation it holds after the run (C(mac), C(address), C(hostname)).
  returned: when state is present
  type: dict
  sample: {"bc:24:11:00:00:01": {"mac": "bc:24:11:00:00:01", "address": "192.168.100.53", "hostname": "vm-1"}}
addresses:
  description: Each reservation's O(reservations[].name) -> the address reserved for it after the run.
  returned: when state is present
  type: dict
  sample: {"vm-1": "192.168.100.53"}
notes:
  description:
    - What the run did besides its changes, or in check mode would do; today that a run cut off earlier had
      left the router's table saved but not applied (pfSense, OPNsense), or served but not saved (Kea), and
      this run finished it (changed, with no changes listed). Each is a warning too.
  returned: always
  type: list
  elements: str
  sample:
    - >-
      the kea router at 192.168.100.1 saved Kea's configuration, which a cut-off run had left served but not
      saved (config-write), so a restart of Kea keeps the reservations
error_code:
  description: On failure, the kind of refusal (conflict, policy, limit, auth_failed, unreachable, apply_failed, verify_failed).
  returned: failure
  type: str
"""

from ansible_collections.gpulab.homelab.plugins.module_utils.controller_module import run_module  # noqa: E402

POOL_OPTIONS = dict(start=dict(type="str", required=True), end=dict(type="str", required=True))
SSH_OPTIONS = dict(
    host=dict(type="str"),
    port=dict(type="int"),
    user=dict(type="str"),
    password=dict(type="str", no_log=True),
    key_file=dict(type="path", no_log=False),
    host_key_checking=dict(type="bool"),
    known_hosts=dict(type="path"),
    ssh_args=dict(type="str"),
    become=dict(type="bool", default=False),
    local=dict(type="bool", default=False),
)
RESERVATIONS_OPTIONS = dict(
    mac=dict(type="str", required=True),
    address=dict(type="str"),
    hostname=dict(type="str"),
    current_address=dict(type="str"),
    expect=dict(type="str"),
    name=dict(type="str"),
)
KEEP_FREE_OPTIONS = dict(
    address=dict(type="str", required=True),
    host=dict(type="str"),
    field=dict(type="str"),
    what=dict(type="str"),
)
ARGUMENT_SPEC = dict(
    kind=dict(
        type="str", choices=["dnsmasq", "openwrt", "kea", "mikrotik", "opnsense", "pfsense", "huawei_ont"]
    ),
    address=dict(type="str"),
    subnet=dict(type="str"),
    pool=dict(type="dict", options=POOL_OPTIONS),
    user=dict(type="str"),
    password=dict(type="str", no_log=True),
    url=dict(type="str"),
    validate_certs=dict(type="bool"),
    ssh=dict(type="dict", options=SSH_OPTIONS),
    options=dict(type="dict", default={}),
    reservations=dict(type="list", elements="dict", default=[], options=RESERVATIONS_OPTIONS),
    keep_free=dict(type="list", elements="dict", default=[], options=KEEP_FREE_OPTIONS),
    known_only=dict(type="bool", default=False),
    state=dict(type="str", choices=["present", "absent"], default="present"),
)
RULES = {}


def main():
    run_module(ARGUMENT_SPEC, RULES, "dhcp_reservation")  # AnsibleModule, then gpulab.tasks.dhcp_reservation


if __name__ == "__main__":
    main()
