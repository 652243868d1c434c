"""VM lifecycle hooks: what happens "inside" a simulated VM.

The server calls `vm_started` when a start task ends well, `vm_stopped` after stop and shutdown,
`vm_destroyed` after destroy, `vm_resized` after a disk resize, `guest_interfaces` for GET
.../agent/network-get-interfaces and `guest_file_read` for GET .../agent/file-read.

`VmHooks` is the API-only implementation (no root needed): the guest's address is derived from the net0
MAC, inside the fixture's DHCP pool, so it is stable across restarts. With root, the server asks
`labsim.network_lab.make_hooks(state_dir, fixture)` for hooks that run real hosts instead.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from typing import Any

from labsim.fixture import net0_mac, network_settings

__all__ = ["HOST_KEY_PUB", "VmHooks", "address_for_mac", "net0_mac"]

#: where cloud-init leaves a guest's ed25519 SSH host key (the lab's VM hosts' sshd uses it too)
HOST_KEY_PUB = "/etc/ssh/ssh_host_ed25519_key.pub"


def address_for_mac(mac: str, fixture: dict[str, Any]) -> str:
    """A deterministic address inside the fixture's DHCP pool for this MAC."""
    net = network_settings(fixture)
    first = int(ipaddress.ip_address(net["pool_first"]))
    last = int(ipaddress.ip_address(net["pool_last"]))
    offset = int.from_bytes(hashlib.sha256(mac.lower().encode()).digest()[:4], "big") % (last - first + 1)
    return str(ipaddress.ip_address(first + offset))


class VmHooks:
    """API-only hooks: nothing runs; the agent answers with a derived address."""

    def __init__(self, fixture: dict[str, Any]):
        self.fixture = fixture

    def vm_started(self, node: str, vmid: int, config: dict) -> None:
        """Called once the start task has succeeded, with the config the VM starts with (``hostpciN`` through a
        resource mapping spelt with the node's device address in front: ``PveApiSim.hook_config``)."""

    def vm_stopped(self, node: str, vmid: int) -> None:
        """Called once a stop or shutdown task has succeeded."""

    def vm_destroyed(self, node: str, vmid: int) -> None:
        """Called once a destroy task has succeeded."""

    def vm_resized(self, node: str, vmid: int, disk: str, size: int, config: dict) -> None:
        """Called once a resize task has succeeded: ``disk`` now has ``size`` bytes (a running guest sees it)."""

    def guest_interfaces(self, node: str, vmid: int, config: dict) -> list[dict]:
        """The QEMU guest agent's network-get-interfaces ``result`` list."""
        result = [
            {
                "name": "lo",
                "hardware-address": "00:00:00:00:00:00",
                "ip-addresses": [
                    {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                    {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128},
                ],
                "statistics": _zero_stats(),
            }
        ]
        mac = net0_mac(config)
        if mac:
            prefix = network_settings(self.fixture)["prefix"]
            result.append(
                {
                    "name": "ens18",
                    "hardware-address": mac,
                    "ip-addresses": [
                        {
                            "ip-address": address_for_mac(mac, self.fixture),
                            "ip-address-type": "ipv4",
                            "prefix": prefix,
                        },
                        {"ip-address": _link_local(mac), "ip-address-type": "ipv6", "prefix": 64},
                    ],
                    "statistics": _zero_stats(),
                }
            )
        return result

    def guest_file_read(self, node: str, vmid: int, config: dict, path: str) -> bytes:
        """The bytes of file `path` as the guest agent reads it; OSError (FileNotFoundError...) when the
        guest cannot open it. Without a guest, only the SSH host key cloud-init would have made exists: an
        ed25519 public key derived from the net0 MAC (a VM made again gets a new MAC, so a new key)."""
        if path != HOST_KEY_PUB:
            raise FileNotFoundError(2, "No such file or directory", path)
        seed = hashlib.sha256(f"{net0_mac(config) or vmid}".lower().encode()).digest()
        blob = _ssh_string(b"ssh-ed25519") + _ssh_string(seed)
        return f"ssh-ed25519 {base64.b64encode(blob).decode()} root@{config.get('name') or vmid}\n".encode()


def _ssh_string(data: bytes) -> bytes:
    """SSH wire format string: a 4-byte length, then the bytes."""
    return len(data).to_bytes(4, "big") + data


def _zero_stats() -> dict[str, int]:
    keys = (
        "rx-bytes",
        "rx-dropped",
        "rx-errs",
        "rx-packets",
        "tx-bytes",
        "tx-dropped",
        "tx-errs",
        "tx-packets",
    )
    return dict.fromkeys(keys, 0)


def _link_local(mac: str) -> str:
    octets = [int(x, 16) for x in mac.split(":")]
    octets[0] ^= 0x02
    eui = [*octets[:3], 255, 254, *octets[3:]]
    return str(ipaddress.IPv6Address(b"\xfe\x80" + b"\x00" * 6 + bytes(eui)))
