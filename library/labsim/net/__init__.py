"""The lab's hosts: the helpers of :mod:`labsim.network_lab` and two hosts that need no lab network.

- ``addressing``: the lab's range; ``hostinit``: a host's PID 1; ``node_host``: the Proxmox node's files and
  simulated boots; ``command_standins``: reboot, boot-loader, initramfs and ``qm`` stand-ins;
  ``systemctl_standin``: systemctl without systemd; ``k3s``: the k3s binary (a package, one zipapp on a host); ``package_archive``:
  the apt archives and k3s release the router serves; ``guest_image``: the VMs' Debian root.
- ``loopback_node``: the node host alone, its sshd on 127.0.0.1 (the pve_host role's tests).
- ``mount_ns_host``: a mount-namespace host with the lab's k3s release (the k3s stand-in's and roles' tests).
"""
