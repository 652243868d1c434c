import copy

import pytest
from builders import SSH_KEY, gpu_vm, reference_node, vm

GROUPS = {
    "proxmox": ["pve"],
    "router": ["isp-router"],
    "vms": ["vm-1", "vm-2", "vm-gpu"],
    "k3s_server": ["vm-1"],
    "k3s_agent": ["vm-2", "vm-gpu"],
}

GLOBALS = {
    "pve_api_url": "https://192.168.100.5:8006",
    "pve_api_token_id": "gpulab@pve!ansible",
    "pve_api_token_secret": "0b1f8a3e-5a43-4c2e-9d8e-7f2b1c3d4e5f",
    "gpulab_os_image": {
        "url": "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img",
        "filename": "noble-server-cloudimg-amd64.qcow2",
        "checksum": "d1940f7d69d343355e183dff1e08a59852d32e7309baa7a4bad8365b11b005ac",
        "checksum_algorithm": "sha256",
        "storage": "local",
    },
    "k3s_version": "v1.33.5+k3s1",
}

HOSTS = {
    "pve": reference_node(),
    "isp-router": {
        "router_kind": "huawei_ont",
        "router_address": "192.168.100.1",
        "router_subnet": "192.168.100.0/24",
        "router_dhcp_pool": {"start": "192.168.100.2", "end": "192.168.100.254"},
        "router_user": "admin",
        "router_password": "s3cret-pass",
    },
    "vm-1": vm(100, address="192.168.100.53"),
    "vm-2": vm(101, address="192.168.100.54"),
    "vm-gpu": gpu_vm(102, "rtx3090", address="192.168.100.55"),
}
# what every VM of this inventory has unless it says otherwise
VM_COMMON = {"vm_node": "pve", "vm_storage": "local-zfs", "vm_ssh_public_key": SSH_KEY}


class Inventory:
    """A reference-lab inventory as plain data, to mutate in tests."""

    def __init__(self):
        self.groups = copy.deepcopy(GROUPS)
        self.globals = copy.deepcopy(GLOBALS)
        self.hosts = copy.deepcopy(HOSTS)
        for name in self.groups["vms"]:
            self.hosts[name] = {**VM_COMMON, **self.hosts[name]}

    def add_node(self, name, host_vars):
        """Another Proxmox node."""
        self.groups["proxmox"].append(name)
        self.hosts[name] = host_vars

    def add_vm(self, name, host_vars, group="k3s_agent"):
        """Another VM, a k3s agent unless `group` says otherwise, with VM_COMMON for what it does not set."""
        self.groups["vms"].append(name)
        self.groups[group].append(name)
        self.hosts[name] = {**VM_COMMON, **host_vars}

    def hostvar(self, host, name):
        own = self.hosts.get(host, {})
        if name in own:
            return own[name]
        return self.globals.get(name)

    def names(self, host):
        """The names the inventory sets for the host: its own and group_vars/all's."""
        return [*self.hosts.get(host, {}), *self.globals]

    def check(self):
        from gpulab import labdef

        return labdef.check(self.groups, self.hostvar, self.names)

    def messages(self):
        return [str(p) for p in self.check()[1]]


@pytest.fixture
def inv():
    return Inventory()
