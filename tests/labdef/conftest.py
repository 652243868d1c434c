import copy

import pytest

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
    "pve": {
        "ansible_host": "192.168.100.5",
        "pve_node": "pve",
        "pve_memory_mib": 31744,
        "pve_threads": 20,
        "pve_storages": {
            "local": {"type": "dir", "content": ["iso", "import"], "size_gb": 1700},
            "local-zfs": {"type": "zfspool", "content": ["images", "rootdir"], "size_gb": 1700},
        },
        "pve_gpus": [
            {
                "id": "rtx3090",
                "pci": "0000:02:00",
                "vendor_device": "10de:2204",
                "functions": ["0000:02:00.0", "0000:02:00.1"],
                "iommu_group": 13,
                "boot_display": True,
            }
        ],
    },
    "isp-router": {
        "router_kind": "huawei_ont",
        "router_address": "192.168.100.1",
        "router_subnet": "192.168.100.0/24",
        "router_dhcp_pool": {"start": "192.168.100.2", "end": "192.168.100.254"},
        "router_user": "admin",
        "router_password": "s3cret-pass",
    },
    "vm-1": {
        "vm_id": 100,
        "vm_cores": 4,
        "vm_memory_mib": 4096,
        "vm_disk_gb": 60,
        "vm_address": "192.168.100.53",
    },
    "vm-2": {
        "vm_id": 101,
        "vm_cores": 4,
        "vm_memory_mib": 4096,
        "vm_disk_gb": 60,
        "vm_address": "192.168.100.54",
    },
    "vm-gpu": {
        "vm_id": 102,
        "vm_cores": 8,
        "vm_memory_mib": 16384,
        "vm_balloon": False,
        "vm_disk_gb": 200,
        "vm_machine": "q35",
        "vm_firmware": "ovmf",
        "vm_cpu": "host",
        "vm_gpu": "rtx3090",
        "vm_onboot": False,
        "vm_address": "192.168.100.55",
    },
}
VM_COMMON = {"vm_node": "pve", "vm_storage": "local-zfs", "vm_ssh_public_key": "ssh-ed25519 AAAAC3Nza test"}


class Inventory:
    """A reference-lab inventory as plain data, to mutate in tests."""

    def __init__(self):
        self.groups = copy.deepcopy(GROUPS)
        self.globals = copy.deepcopy(GLOBALS)
        self.hosts = copy.deepcopy(HOSTS)
        for vm in self.groups["vms"]:
            self.hosts[vm] = {**VM_COMMON, **self.hosts[vm]}

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
