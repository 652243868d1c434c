"""The lab's guest image: a Debian root of its own, built once per machine, that every VM host boots from.

A lab VM must behave like a fresh cloud image, not like the machine the lab runs on. Its lower
directory (the read-only half of its copy-on-write root) is therefore this image, never the
machine's ``/``: its apt sources, lists and caches (and their timestamps), its users, sudoers and
package selections are the image's own, and nothing of the machine's package state decides an
outcome. The Proxmox node host boots from it too (PVE 9 is Debian 13).

The image is Debian 13 ("trixie", the base of PVE 9; its Python 3.13 is as new as an Ubuntu
24.04 image's 3.12 for Ansible) made with ``debootstrap --variant=minbase`` from the Debian
mirror the machine's apt uses, with :data:`PACKAGES`: what an Ubuntu 24.04 server cloud image has
and the stages rely on. It is then made to look like a published image (:func:`_finish`): no apt
sources (each VM gets the lab archive's), empty apt lists dated :data:`IMAGE_DATE`, no package
cache, no SSH host keys, an empty machine-id. It lives in :func:`cache_dir` under a key of the
suite, the package list and :data:`BUILD`, so a changed list builds a new image (and removes the
earlier ones no running lab host uses); about 70 s and 370 MB the first time, nothing afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SUITE = "trixie"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: bump when _finish changes what the image holds
BUILD = 1
#: the date a published image would carry on its (empty) apt lists: Debian 13's release
IMAGE_DATE = "2025-08-09T00:00:00Z"
CACHE_ENV = "GPULAB_LAB_IMAGE_DIR"
MANIFEST = "etc/gpulab-lab-image.json"
DEFAULT_CACHE = Path("/var/cache/gpulab/lab-image")

#: what the image has, and why (each is in an Ubuntu 24.04 server cloud image)
PACKAGES = (
    "sudo",  # Ansible's become for the cloud-init user
    "python3",  # every Ansible module and the lab's stand-ins
    "python3-apt",  # ansible.builtin.apt
    "python3-yaml",  # cloud-init's dependency in the Ubuntu image; the lab's k3s stand-in reads manifests with it
    "openssh-server",  # how the lab and Ansible reach the host
    "isc-dhcp-client",  # the VM's address from the router's DHCP
    "iproute2",
    "procps",
    "kmod",
    "systemd",  # the VM's service manager (network.vm_init: systemd)
    "systemd-sysv",
    "systemd-timesyncd",  # guest_base keeps the clock in sync with it
    "dbus",  # systemctl for users other than root talks to systemd over the system bus
    "gnupg",  # signing keys of apt repositories
    "ca-certificates",
    "curl",
    "netbase",
)

#: commands the lab's hosts run, each with the image package that has it (checked after the build)
COMMANDS = {
    "/usr/bin/sudo": "sudo",
    "/usr/bin/python3": "python3",
    "/usr/sbin/sshd": "openssh-server",
    "/usr/sbin/dhclient": "isc-dhcp-client",
    "/usr/sbin/ip": "iproute2",
    "/usr/sbin/useradd": "passwd",
    "/usr/sbin/usermod": "passwd",
    "/usr/bin/gpg": "gnupg",
    "/lib/systemd/systemd": "systemd",
    "/usr/bin/systemctl": "systemd",
    "/usr/bin/dbus-daemon": "dbus",
    "/lib/systemd/system/systemd-timesyncd.service": "systemd-timesyncd",
}
#: Python modules the hosts need (python3 -c "import ...")
PYTHON_MODULES = {"apt": "python3-apt", "yaml": "python3-yaml"}


class ImageError(RuntimeError):
    """The guest image cannot be built or is incomplete; the message says why and what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def image_key() -> str:
    text = json.dumps({"suite": SUITE, "packages": sorted(PACKAGES), "build": BUILD})
    return f"{SUITE}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def image_root() -> Path:
    """Where the image for the current package list is (or would be)."""
    return cache_dir() / image_key()


def ready() -> bool:
    """True when this machine has the image for the current package list (no build needed)."""
    return (image_root() / MANIFEST).exists()


def machine_mirror(sources: list[Path] | None = None) -> str:
    """The Debian mirror this machine's apt uses (first ``.../debian`` URI), else deb.debian.org."""
    if sources is None:
        sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = path.read_text()
            uris: list[str] = []
            if path.suffix == ".sources":
                for line in text.splitlines():
                    if line.strip().lower().startswith("uris:"):
                        uris += line.split(":", 1)[1].split()
            elif path.name.endswith(".list"):
                for line in text.splitlines():
                    # deb [options] URI suite components
                    m = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)", line)
                    if m:
                        uris.append(m.group(2))
            for uri in uris:
                if uri.rstrip("/").endswith("/debian") and uri.startswith(("http://", "https://")):
                    return uri.rstrip("/")
    return DEFAULT_MIRROR


def missing_in(root: Path) -> list[str]:
    """What the image at ``root`` lacks of what the lab's hosts run, each as 'COMMAND (package PKG)'."""
    missing = [
        f"{path} (package {pkg})"
        for path, pkg in COMMANDS.items()
        if not os.path.lexists(root / path.lstrip("/"))
    ]
    if not missing:
        for module, pkg in PYTHON_MODULES.items():
            res = subprocess.run(
                ["chroot", str(root), "/usr/bin/python3", "-c", f"import {module}"],
                capture_output=True,
                text=True,
                check=False,
            )
            if res.returncode != 0:
                missing.append(f"python module {module} (package {pkg})")
    return missing


def ensure(log: Callable[[str], None] | None = None) -> Path:
    """The image's root directory, built first when this machine has none for the current package list."""
    root = image_root()
    if ready():
        return root
    base = cache_dir()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f"{image_key()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another lab may be building the same image
        if ready():
            return root
        _build(root, log or (lambda _msg: None))
    return root


def _build(root: Path, log: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageError(
            "the lab builds its guest image with debootstrap, which this machine lacks (apt package "
            "debootstrap): run `make deps`, or apt-get install debootstrap debian-archive-keyring"
        )
    mirror = machine_mirror()
    tmp = root.with_name(f"{root.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    started = time.monotonic()
    log(f"building the lab's guest image (Debian {SUITE} from {mirror}, about a minute, once per machine)")
    log_file = root.with_name(f"{root.name}.build.log")
    with open(log_file, "w") as out:
        res = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(tmp),
                mirror,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    if res.returncode != 0:
        _unmount_below(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        tail = log_file.read_text(errors="replace").strip().splitlines()[-3:]
        raise ImageError(
            f"building the lab's guest image failed (debootstrap exit {res.returncode}): {' / '.join(tail)}. "
            f"It downloads Debian {SUITE} ({', '.join(PACKAGES)}) from {mirror}: check that this machine "
            f"reaches that mirror (full log: {log_file})"
        )
    _finish(tmp)
    missing = missing_in(tmp)
    if missing:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ImageError(f"the lab's guest image lacks {', '.join(missing)} after its build (see {log_file})")
    manifest = {
        "suite": SUITE,
        "mirror": mirror,
        "packages": list(PACKAGES),
        "build": BUILD,
        "key": image_key(),
        "built_in_s": round(time.monotonic() - started, 1),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    shutil.rmtree(root, ignore_errors=True)
    os.rename(tmp, root)
    log(f"the lab's guest image is ready in {root} ({manifest['built_in_s']:.0f} s)")
    _prune(root)


def _in_use(path: Path) -> bool:
    """Whether a lab host's root lies over ``path`` (any process's mount table names it as a lower dir)."""
    needle = re.compile(rf"lowerdir={re.escape(str(path))}[,:\s]")
    for mountinfo in Path("/proc").glob("[0-9]*/mountinfo"):
        with contextlib.suppress(OSError):
            if needle.search(mountinfo.read_text()):
                return True
    return False


def _prune(keep: Path) -> None:
    """Remove the images of earlier package lists that no running lab host uses (each is 370 MB)."""
    for old in keep.parent.glob(f"{SUITE}-*"):
        if old == keep or not old.is_dir() or not (old / MANIFEST).exists() or _in_use(old):
            continue
        shutil.rmtree(old, ignore_errors=True)
        (old.parent / f"{old.name}.lock").unlink(missing_ok=True)
        (old.parent / f"{old.name}.build.log").unlink(missing_ok=True)


def _unmount_below(path: Path) -> None:
    """Unmount whatever a failed debootstrap left mounted inside ``path`` (its proc and sys)."""
    with contextlib.suppress(OSError):
        mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for mnt in sorted((m for m in mounts if m.startswith(f"{path}/")), key=len, reverse=True):
            subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)


def _finish(root: Path) -> None:
    """Make the debootstrapped tree look like a published cloud image (see the module docs)."""
    apt = root / "etc" / "apt"
    (apt / "sources.list").unlink(missing_ok=True)
    for entry in (apt / "sources.list.d").glob("*"):
        entry.unlink()
    lists = root / "var" / "lib" / "apt" / "lists"
    for entry in lists.iterdir():
        if entry.name not in ("partial", "lock"):
            entry.unlink()
    cache = root / "var" / "cache" / "apt"
    for entry in cache.glob("*.bin"):
        entry.unlink()
    for entry in (cache / "archives").glob("*.deb"):
        entry.unlink()
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    (root / "etc" / "hostname").unlink(missing_ok=True)
    stamp = time.mktime(time.strptime(IMAGE_DATE, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    for path in (lists, lists / "partial", cache):
        if path.exists():
            os.utime(path, (stamp, stamp))
