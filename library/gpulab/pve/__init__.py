"""Proxmox VE side of gpulab: API client, VM config model and diff, and the operations behind the modules.

Nothing in this package knows about Ansible. The modules in plugins/modules build a spec, call one function
here and turn the result into module output.
"""
