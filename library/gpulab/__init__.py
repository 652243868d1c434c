"""gpulab: the Python engine behind the playbooks (Proxmox API, routers, lab definition, labsim)."""

__version__ = "0.1.0"
