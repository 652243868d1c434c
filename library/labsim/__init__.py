"""The simulated lab: a strict Proxmox VE 9 API simulator (and, with root, real lab hosts).

`labsim.cli.main(["up", "--state", DIR])` starts it; see `labsim.pve_api_server` for what it serves.
"""
