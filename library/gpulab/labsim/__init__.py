"""The simulated lab: a strict Proxmox VE 9 API simulator (and, with root, real lab hosts).

`gpulab.labsim.cli.main(["up", "--state", DIR])` starts it; see `gpulab.labsim.server` for what it serves.
"""
