"""From a bare PC to a Proxmox VE node gpulab can run on: the automated installer's answer file, its check,
the first-boot hook, and the listener that learns the new node's host keys (`gpulab install-media`)."""
