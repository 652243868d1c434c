"""gpulab: the Python engine behind the playbooks (Proxmox API, routers, lab definition, CLI).

The simulated lab that proves it is a package of its own, labsim (library/labsim/).
"""

__version__ = "0.2.0"
