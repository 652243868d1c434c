"""The kernel a lab VM "runs": an Ubuntu 24.04 kernel series, its release and its packages.

A lab VM shares this machine's kernel, so what a guest shows of its own is laid over it at each start:

* ``/proc/sys/kernel/osrelease`` (a boot view, what ``uname -r`` prints) holds the series' release, and a
  ``uname`` stand-in in ``/usr/local/bin`` answers ``-r`` from it (the rest goes to the real ``uname``);
* dpkg's status lists the kernel's packages as installed, as Ubuntu's installer leaves them:
  ``linux-image-<release>`` and the series' metapackage ``linux-image-<series>``, which depends on it
  (noble's ``linux-image-generic`` on the GA 6.8 kernel; ``linux-image-generic-hwe-24.04`` on the HWE kernel that
  newer point-release media install);
* ``/etc/gpulab-sim/kernel`` holds the release for the lab's boot hook, which loads a signed NVIDIA module only
  when it was built for the running kernel (a ``linux-modules-nvidia-*`` package of another series brings a module
  of another kernel: the guest boots without one, and nvidia-smi cannot talk to the driver).

The series of a VM is the fixture's ``guest_kernels`` entry for the VM's name (or id), ``generic`` when it names
none. The releases are constructed (Ubuntu's numbering: version, ABI, flavour); what the lab's archive serves for
each series is :mod:`labsim.net.package_archive`'s (the headers of each, the signed modules of the series Ubuntu
builds them for).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: series -> the release of its kernel. generic: noble's GA kernel (6.8); generic-hwe-24.04: the HWE kernel of
#: the later point releases (6.17 in 24.04.4); kvm: a flavour Ubuntu builds no signed NVIDIA modules for.
KERNELS = {
    "generic": "6.8.0-90-generic",
    "generic-hwe-24.04": "6.17.0-14-generic",
    "kvm": "6.8.0-1020-kvm",
}
DEFAULT_SERIES = "generic"
#: the series Canonical ships signed NVIDIA modules for (linux-restricted-modules), of the lab's KERNELS
SIGNED_SERIES = ("generic", "generic-hwe-24.04")
#: who signed each series' precompiled modules (modinfo -F signer): the HWE kernel's are signed with the later
#: key its kernels trust (``Canonical Ltd. Kernel Module Signing 2025 Kmod``, shared/reference/first-run-review.md
#: R11), the GA one's with the first one
SIGNERS = {
    "generic": "Canonical Ltd. Kernel Module Signing",
    "generic-hwe-24.04": "Canonical Ltd. Kernel Module Signing 2025 Kmod",
}
RELEASE_FILE = "/etc/gpulab-sim/kernel"
UNAME = "/usr/local/bin/uname"
UNAME_STANDIN = """#!/bin/sh
# gpulab lab stand-in: the guest kernel's release (the lab's /proc/sys/kernel/osrelease view) for -r; the rest is
# the real uname's
case "$1" in
  -r|--kernel-release) exec cat /proc/sys/kernel/osrelease ;;
  *) exec /usr/bin/uname "$@" ;;
esac
"""


class GuestKernelError(ValueError):
    """The fixture names a kernel series the lab does not have."""


def series_of(fixture: dict[str, Any], name: str, vmid: int) -> str:
    """The kernel series of VM `name` (id `vmid`): the fixture's ``guest_kernels`` entry, else generic."""
    kernels = fixture.get("guest_kernels") or {}
    series = str(kernels.get(name) or kernels.get(str(vmid)) or kernels.get(vmid) or DEFAULT_SERIES)
    if series not in KERNELS:
        raise GuestKernelError(
            f"fixture guest_kernels: {name}: {series!r} is no kernel series of the lab (one of {', '.join(KERNELS)})"
        )
    return series


def dpkg_stanzas(series: str) -> dict[str, str]:
    """The kernel's packages as dpkg's status lists them installed (deb-status(5)), by package name."""
    release = KERNELS[series]
    abi = release.rsplit("-", 1)[0]
    common = "Status: install ok installed\nPriority: optional\nSection: kernel\nArchitecture: amd64\n"
    common += "Maintainer: Ubuntu Kernel Team <kernel-team@lists.ubuntu.com>\n"
    return {
        f"linux-image-{release}": (
            f"Package: linux-image-{release}\n{common}Source: linux-signed\nVersion: {abi}.1\n"
            f"Description: Signed kernel image {series}\n"
        ),
        f"linux-image-{series}": (
            f"Package: linux-image-{series}\n{common}Source: linux-meta\nVersion: {abi.replace('-', '.')}.1\n"
            f"Depends: linux-image-{release}\nDescription: Generic Linux kernel image ({series})\n"
        ),
    }


def install(upper: Path, lower: Path, series: str) -> None:
    """Lay the kernel of `series` over a VM's root (its overlay's upper directory, the image `lower` below it):
    the release file and dpkg's entries of its packages (added once; apt's changes since are kept)."""
    release_file = upper / RELEASE_FILE.lstrip("/")
    release_file.parent.mkdir(parents=True, exist_ok=True)
    release_file.write_text(KERNELS[series] + "\n")
    status = upper / "var/lib/dpkg/status"
    if not status.exists():
        status.parent.mkdir(parents=True, exist_ok=True)
        base = lower / "var/lib/dpkg/status"
        status.write_text(base.read_text() if base.exists() else "")
    text = status.read_text()
    info = upper / "var/lib/dpkg/info"
    info.mkdir(parents=True, exist_ok=True)
    for package, stanza in dpkg_stanzas(series).items():
        if f"\nPackage: {package}\n" not in "\n" + text:
            text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + stanza
        (info / f"{package}.list").touch()  # dpkg warns about a package without its file list
    status.write_text(text.rstrip("\n") + "\n")


def osrelease_view(state: Path, series: str) -> list[str]:
    """The boot view of ``/proc/sys/kernel/osrelease`` (a file in the host's state folder, bound over it)."""
    view = state / "kernel" / "osrelease"
    view.parent.mkdir(parents=True, exist_ok=True)
    view.write_text(KERNELS[series] + "\n")
    return [str(view), "/proc/sys/kernel/osrelease"]
