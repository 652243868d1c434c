"""The lab as its user built it before gpulab ran: a fixture's ``seed`` (fixtures/homelab.yml).

A seeded lab starts with what the user made by hand on the reference machine, through PVE's own
paths, so that what PVE stores is what the simulator's create and config calls store:

- ``isos``: ISO volumes already on a storage (``url`` of the fixture's ``downloads`` table and
  ``storage``), as an earlier download-url left them (same volume id, size and digests): a later
  download-url with the matching checksum transfers nothing.
- ``vms``: each one ``vmid``, ``create`` (the parameters PVE 9's Create VM wizard sends, e.g. ``ide2`` with
  the ISO, ``net0`` with the MAC the guest has had since), ``root_config`` (what root@pam set afterwards
  with a password login, such as a raw ``hostpci0``), ``status`` (``stopped``, the default, or
  ``running``; ``seed.status`` sets it for every VM that names none) and ``address`` (the address the router's lease gives the MAC; with an ``auto``
  network its host part is kept inside the lab's range).
- ``guest``: how the guests were installed (``os``, ``user``; ``sudo: password`` is the Ubuntu
  installer's default: the user is in group ``sudo`` and sudo asks for the password). The password is a
  lab secret (``seed.guest_password`` in ``lab.json``); the user's SSH key is the lab's key.
- ``node``: ``kernel_cmdline``, the first line of the node's ``/etc/kernel/cmdline`` (what its
  installer left; with the GPU blacklist already on it in fixtures/homelab-blacklisted.yml), and ``files``,
  path (under ``/etc/``) to text: node files as their owner or an earlier run left them, in place of the
  first-boot ones (fixtures/homelab-configured.yml: the node stage host has configured and rebooted).

:func:`seed_state` runs once per state directory (``seeded`` in the PVE state), as root@pam with a
password ticket, through :meth:`labsim.pve_api.PveApiSim.call`. For each seeded VM it writes
``STATE/guests/vm<vmid>.json`` (mode 0600): the installation the network lab gives that VM's host
(:func:`installation`), removed when the VM is destroyed (the server gives :func:`forget_installation` to the
API simulator for that). labsim.fixture.normalise_seed checks the keys and fills in their defaults when the
fixture is read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from labsim.fixture import SeedError, download_digest, network_settings
from labsim.net import addressing
from labsim.pve_auth import Principal
from labsim.pve_common import parse_size

GUESTS_DIR = "guests"
#: the Ubuntu installer's guided LVM layout (subiquity): volume group and root logical volume
UBUNTU_VG = "ubuntu-vg"
UBUNTU_LV = "ubuntu-lv"


# ------------------------------------------------------------------------------------------ secrets, files
def guest_password(creds: dict[str, Any]) -> str:
    """The seeded guests' user password (a lab secret kept with the lab's other credentials)."""
    creds.setdefault("guest_password", secrets.token_urlsafe(12))
    return creds["guest_password"]


def installation_path(state_dir: Path, vmid: int) -> Path:
    return Path(state_dir) / GUESTS_DIR / f"vm{int(vmid)}.json"


def installation(state_dir: Path, vmid: int) -> dict[str, Any] | None:
    """How VM ``vmid``'s guest was installed (seeded labs only), or None."""
    try:
        return json.loads(installation_path(state_dir, vmid).read_text())
    except (OSError, ValueError):
        return None


def forget_installation(state_dir: Path, vmid: int) -> None:
    """The VM was destroyed: its disk, and the installation on it, are gone."""
    installation_path(state_dir, vmid).unlink(missing_ok=True)


def _write_private(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ the seeding
def seed_state(lab: Any, creds: dict[str, Any]) -> bool:
    """Make the fixture's seed in a fresh state (once per state directory); True when it ran now."""
    seed = lab.fixture.get("seed")
    if not seed or lab.state.data.get("seeded"):
        return False
    node = lab.fixture["nodes"][0]["name"]
    root = Principal("root@pam", "ticket")
    with lab.lock:
        password = guest_password(creds)
        for iso in seed["isos"]:
            _add_iso(lab, node, iso)
        lab.state.mark()
    upids = [
        lab.call("POST", f"/nodes/{node}/qemu", {**vm["create"], "vmid": vm["vmid"]}, root)[0]
        for vm in seed["vms"]
    ]
    _wait(lab, upids)
    for vm in seed["vms"]:
        if vm["root_config"]:
            lab.call("PUT", f"/nodes/{node}/qemu/{vm['vmid']}/config", dict(vm["root_config"]), root)
        config = lab.state.data["vms"][str(vm["vmid"])]["config"]
        _write_private(
            installation_path(lab.state_dir, vm["vmid"]), _installation(lab, vm, config, seed, password)
        )
    _wait(lab, [lab.call("POST", f"/nodes/{node}/qemu/{vm['vmid']}/status/start", {}, root)[0]
                for vm in seed["vms"] if vm["status"] == "running"])  # fmt: skip
    with lab.lock:
        lab.state.data["seeded"] = {"fixture": lab.fixture.get("name", ""), "time": int(time.time())}
        lab.state.mark()
    return True


def _add_iso(lab: Any, node: str, iso: dict[str, Any]) -> None:
    if lab._find_volume(node, iso["volid"]) is not None:
        return
    entry = lab.downloads[iso["url"]]
    size = int(entry["size"])
    lab._volumes(node, iso["storage"]).append(
        {
            "volid": iso["volid"],
            "content": "iso",
            "format": "iso",
            "size": size,
            "virtual_size": size,
            "ctime": int(time.time()) - 30 * 86400,  # downloaded a month before gpulab's first run
            "digests": {
                a: download_digest(entry, a) for a in ("md5", "sha1", "sha224", "sha256", "sha384", "sha512")
            },
        }
    )


def _wait(lab: Any, upids: list[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    for upid in upids:
        rec = lab.state.data["tasks"][upid]
        while rec["status"] == "running" and time.monotonic() < deadline:
            time.sleep(0.02)
        if rec.get("exitstatus") != "OK":
            raise SeedError(f"seeding the lab: task {upid} ended with {rec.get('exitstatus')!r}")


def _installation(
    lab: Any, vm: dict[str, Any], config: dict[str, str], seed: dict[str, Any], password: str
) -> dict:
    disk = next((k for k in ("scsi0", "virtio0", "sata0", "ide0") if k in config), None)
    size = 0
    if disk:
        with contextlib.suppress(ValueError, StopIteration):
            size = parse_size(next(p[5:] for p in config[disk].split(",") if p.startswith("size=")))
    guest = seed["guest"]
    return {
        "vmid": vm["vmid"],
        "name": vm["create"]["name"],
        "os": guest["os"],
        "install": guest["install"],
        "user": guest["user"],
        "password": password,
        "sudo": guest["sudo"],
        "disk": {
            "slot": disk,
            "volid": config[disk].split(",")[0] if disk else None,
            "installed_bytes": size,
        },
        "firmware": "efi" if config.get("bios") == "ovmf" else "bios",
        "mac": vm["mac"],
        "address": vm.get("address"),
    }


def description(fixture: dict[str, Any], creds: dict[str, Any]) -> dict[str, Any] | None:
    """The ``seed`` entry of ``lab.json``: the seeded VMs and the guests' user and password."""
    seed = fixture.get("seed")
    if not seed:
        return None
    return {
        "fixture": fixture.get("name", ""),
        "guest_user": seed["guest"]["user"],
        "guest_password": guest_password(creds),
        "guest_sudo": seed["guest"]["sudo"],
        "guest_os": seed["guest"]["os"],
        "node_kernel_cmdline": (fixture["nodes"][0].get("lab") or {}).get("kernel_cmdline"),
        "isos": [i["volid"] for i in seed["isos"]],
        "vms": {
            vm["create"]["name"]: {"vmid": vm["vmid"], "mac": vm["mac"], "address": _lab_address(fixture, vm)}
            for vm in seed["vms"]
        },
    }


def _lab_address(fixture: dict[str, Any], vm: dict[str, Any]) -> str | None:
    """The seeded address inside the fixture's range (an ``auto`` range: the API-only lab's; the network
    lab's own range replaces it in ``lab.json``)."""
    if not vm.get("address"):
        return None
    subnet = ipaddress.ip_network(network_settings(fixture)["subnet"])
    return str(addressing.translate(str(vm["address"]), subnet))


def leases(fixture: dict[str, Any], subnet: Any) -> list[dict[str, str]]:
    """The DHCP leases the router holds for the seeded VMs, inside the lab's range: mac, address, hostname."""
    seed = fixture.get("seed") or {}
    out = []
    for vm in seed.get("vms", []):
        if vm.get("address"):
            out.append(
                {
                    "mac": vm["mac"],
                    "address": str(addressing.translate(str(vm["address"]), subnet)),
                    "hostname": vm["create"]["name"],
                }
            )
    return out
