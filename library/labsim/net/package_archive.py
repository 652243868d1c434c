"""The lab's package archive: stand-in packages with the real names, served by the router host.

Packages that cannot exist on this machine (the NVIDIA driver, its DKMS prerequisites, the
container toolkit, the guest agent) are built here as small ``.deb`` files with the real package
names and the real commands, whose behaviour follows the fixture's hardware:

* ``http://ROUTER/ubuntu ./`` — the "Ubuntu archive" every lab VM's ``/etc/apt/sources.list``
  points at (part of the VM image, like a mirror setting): ``nvidia-driver-580-server`` (and
  ``-open``, ``nvidia-headless-580-server``, ``nvidia-utils-580-server``, ``nvidia-dkms-580-server``),
  the same for branch 595 and the older branch 570 (``DRIVER_BRANCHES``; a branch's packages replace the
  other's), ``dkms``, ``linux-headers-<series>`` and ``linux-headers-<release>`` of each kernel
  series a lab guest runs (:mod:`labsim.net.guest_kernel`), Canonical's signed modules
  ``linux-modules-nvidia-<branch>-server[-open]-<series>`` for the series Ubuntu builds them for (each module for
  its series' kernel only), ``qemu-guest-agent``;
* ``http://ROUTER/nvidia/stable/deb/$(ARCH) /`` — NVIDIA's container toolkit repository, signed
  with the lab's own OpenPGP key (``http://ROUTER/nvidia/gpgkey``), so a role adds it exactly as it
  adds NVIDIA's (only the inventory's URL differs).

``nvidia-smi`` prints what the VM's passed-through GPU would (``/etc/gpulab-sim/gpus.json``, written
by the VM hooks from ``hostpciN``), in nvidia-smi's own formats, and only once the kernel module
"loaded", i.e. after a reboot that followed the driver's installation (and, when the loaded module is
another branch's, says NVML's driver/library version mismatch until the next reboot); ``nvidia-ctk`` configures
containerd's config as the real one does in outline. Every stand-in command records its calls in
``/var/log/gpulab-standins.log``.
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from labsim.net import guest_kernel
from labsim.net.k3s import build_zipapp

DRIVER_VERSION = "580.173.02"
DRIVER_DEB_VERSION = f"{DRIVER_VERSION}-0ubuntu0.24.04.1"
# The driver branches the lab's "Ubuntu archive" serves, each with its packages named as Ubuntu names the
# -server branches (nvidia-driver-<branch>-server, nvidia-utils-<branch>-server, ...; reference/guest-stack.md
# §2.1) and versioned <driver>-0ubuntu0.24.04.1: 580 (noble's, the default), 595 (the later branch gpulab
# offers for Turing and newer: noble-updates' source nvidia-graphics-drivers-595-server is
# 595.71.05-0ubuntu0.24.04.1, packages.ubuntu.com/noble-updates/libnvidia-extra-595-server) and 570, an older
# branch an upgrade can start from. The 570 point release follows NVIDIA's numbering; it is not checked against
# the archive.
DRIVER_BRANCHES = {"580": DRIVER_VERSION, "595": "595.71.05", "570": "570.195.03"}
TOOLKIT_VERSION = "1.20.0-1"
NVIDIA_MODULE_MARKER = "/usr/lib/gpulab-sim/nvidia-module-installed"
NVIDIA_LOADED = "/run/gpulab/nvidia-loaded"

_LOG_SNIPPET = """
import json, os, sys, time
def _log(rc):
    try:
        os.makedirs("/var/log", exist_ok=True)
        with open("/var/log/gpulab-standins.log", "a") as f:
            f.write(json.dumps({"time": time.time(), "command": os.path.basename(sys.argv[0]),
                                "argv": sys.argv[1:], "rc": rc}) + "\\n")
    except OSError:
        pass
"""

# The end of a stand-in that defines main(argv): run it, record the call and exit with its status.
_RUN_MAIN = """
if __name__ == "__main__":
    rc = main(sys.argv[1:])
    _log(rc)
    sys.exit(rc)
"""


def _standin(doc: str, body: str) -> str:
    """A stand-in command: a python3 script with docstring `doc`, the call log `_log`, then `body`."""
    return f'#!/usr/bin/python3\n"""{doc}"""\n' + _LOG_SNIPPET + body


def nvidia_smi(driver: str) -> str:
    """The nvidia-smi stand-in of the user-space driver `driver` (nvidia-utils-<branch>-server)."""
    return _standin(
        "gpulab lab stand-in for nvidia-smi: the GPUs passed through to this VM, in nvidia-smi's formats.",
        f"""
DRIVER = "{driver}"
FIELDS = {{
    "uuid": ("uuid", ""), "name": ("name", ""), "memory.total": ("memory_mib", " MiB"),
    "driver_version": ("driver", ""), "pci.bus_id": ("pci_bus_id", ""), "index": ("index", ""),
    "memory.used": ("zero", " MiB"), "memory.free": ("memory_mib", " MiB"), "count": ("count", ""),
}}

def main(argv):
    if not os.path.exists("{NVIDIA_LOADED}"):
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
              "Make sure that the latest NVIDIA driver is installed and running.")
        return 9
    try:
        with open("/etc/gpulab-sim/gpus.json") as f:
            gpus = json.load(f)
    except (OSError, ValueError):
        gpus = []
    # the kernel module that loaded ("open" or "proprietary", then "dkms" or "signed"; labsim's boot hook copies it
    # from the package's marker): a card that only the other modules support is not probed, so nvidia-smi does not
    # see it (open modules on a Pascal card, proprietary ones on Blackwell: NVIDIA/open-gpu-kernel-modules#862)
    with open("{NVIDIA_LOADED}") as f:
        loaded = f.read().split() or ["any"]
    kind = loaded[0]
    # the module that loaded is another driver's (the packages were upgraded, the VM not rebooted since): NVML
    # refuses (tests/unit/guests/fixtures/nvidia-smi/nvidia-smi-driver-mismatch-exit18.txt)
    if len(loaded) > 2 and loaded[2][:1].isdigit() and loaded[2] != DRIVER:
        print("Failed to initialize NVML: Driver/library version mismatch")
        print("NVML library version: " + ".".join(DRIVER.split(".")[:2]))
        return 18
    gpus = [g for g in gpus if g.get("kernel_modules") in (None, kind) or kind == "any"]
    if not gpus:
        print("No devices were found")
        return 6
    for i, g in enumerate(gpus):
        g.update(index=i, driver=DRIVER, zero=0, count=len(gpus))
    if "-L" in argv or "--list-gpus" in argv:
        for g in gpus:
            print(f"GPU {{g['index']}}: {{g['name']}} (UUID: {{g['uuid']}})")
        return 0
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is None and "--query-gpu" in argv:
        query = argv[argv.index("--query-gpu") + 1]
    if query:
        fmt = next((a.split("=", 1)[1] for a in argv if a.startswith("--format=")), "csv")
        opts = fmt.split(",")
        keys = [k.strip() for k in query.split(",")]
        for k in keys:
            if k not in FIELDS:
                print(f'Field "{{k}}" is not a valid field to query.')
                return 2
        if "noheader" not in opts:
            print(", ".join(k + (" [MiB]" if FIELDS[k][1] else "") for k in keys))
        for g in gpus:
            vals = []
            for k in keys:
                attr, unit = FIELDS[k]
                vals.append(f"{{g[attr]}}{{'' if 'nounits' in opts else unit}}")
            print(", ".join(vals))
        return 0
    print(f"NVIDIA-SMI {{DRIVER}}    Driver Version: {{DRIVER}}    CUDA Version: 13.0")
    for g in gpus:
        print(f"|   {{g['index']}}  {{g['name']}}  |  {{g['pci_bus_id']}}  |  0MiB / {{g['memory_mib']}}MiB |")
    return 0
"""
        + _RUN_MAIN,
    )


NVIDIA_SMI = nvidia_smi(DRIVER_VERSION)

NVIDIA_CTK = _standin(
    "gpulab lab stand-in for nvidia-ctk (NVIDIA Container Toolkit CLI).",
    f"""
VERSION = "{TOOLKIT_VERSION.split("-")[0]}"

def main(argv):
    if "--version" in argv or "-v" in argv:
        print(f"NVIDIA Container Toolkit CLI version {{VERSION}}")
        print("commit: 0000000000000000000000000000000000000000")
        return 0
    args = [a for a in argv if not a.startswith("--quiet")]
    if args[:2] == ["runtime", "configure"]:
        runtime = next((a.split("=", 1)[1] for a in args if a.startswith("--runtime=")), "docker")
        path = next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
        path = path or {{"containerd": "/etc/containerd/config.toml", "docker": "/etc/docker/daemon.json"}}.get(
            runtime, "/etc/containerd/config.toml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        text = open(path).read() if os.path.exists(path) else ""
        if "nvidia-container-runtime" not in text:
            with open(path, "a") as f:
                f.write('\\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\\n'
                        '  runtime_type = "io.containerd.runc.v2"\\n'
                        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\\n'
                        '  BinaryName = "/usr/bin/nvidia-container-runtime"\\n')
        print(f"INFO[0000] Wrote updated config to {{path}}")
        return 0
    if args[:1] == ["config"]:
        os.makedirs("/etc/nvidia-container-runtime", exist_ok=True)
        path = "/etc/nvidia-container-runtime/config.toml"
        if not os.path.exists(path):
            with open(path, "w") as f:
                f.write('[nvidia-container-runtime]\\nmode = "auto"\\n')
        return 0
    if args[:2] == ["cdi", "generate"]:
        print("INFO[0000] Generated CDI spec with version 0.8.0")
        return 0
    print("NAME:\\n   NVIDIA Container Toolkit CLI")
    return 0
"""
    + _RUN_MAIN,
)

RECORDING_TOOL = _standin(
    "gpulab lab stand-in: records the call and succeeds.",
    """
if __name__ == "__main__":
    _log(0)
""",
)


GUEST_AGENT = _standin(
    "gpulab lab stand-in for qemu-ga: runs until stopped (the lab answers the agent API itself).",
    """
import signal
if __name__ == "__main__":
    _log(0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.pause()
""",
)
GUEST_AGENT_UNIT = """[Unit]
Description=QEMU Guest Agent (gpulab lab stand-in)

[Service]
ExecStart=/usr/sbin/qemu-ga
Restart=always

[Install]
WantedBy=multi-user.target
"""


def _driver_packages(branch: str, driver: str) -> list[dict]:
    """One driver branch's packages (Ubuntu's -server names). The packages of two branches that ship the same
    file (nvidia-smi, the kernel module) conflict with and replace each other, so installing another branch's
    driver takes the first one's away, as apt does when a branch changes; the new module loads at the next boot."""
    drv = f"{driver}-0ubuntu0.24.04.1"
    others = [b for b in DRIVER_BRANCHES if b != branch]

    # what the module package installed: open|proprietary, dkms|signed, the driver and, for Canonical's signed
    # modules, the kernel they were built for and their signer (read at boot, and by modinfo)
    def marker(kind, series=None):
        built = f" {guest_kernel.KERNELS[series]}\nsigner: {guest_kernel.SIGNERS[series]}" if series else ""
        text = f"{kind} {driver}{built}\ninstalled by the lab's NVIDIA kernel module stand-in\n"
        return {NVIDIA_MODULE_MARKER: (0o644, text)}

    def exclusive(pattern):  # the same package of the other branches: Conflicts and Replaces
        names = ", ".join(pattern.format(b) for b in others)
        return {"conflicts": names, "replaces": names} if names else {}

    def signed(variant, kind):
        """Canonical's signed precompiled modules (linux-restricted-modules), one package per kernel series Ubuntu
        builds them for: linux-modules-nvidia-<branch>-server[-open]-<series>. They ship the lab's one module
        marker, so they replace each other (the other branches', and the other series' of this kind)."""
        names = [f"linux-modules-nvidia-{x}-server{variant}-{series}" for x in DRIVER_BRANCHES
                 for series in guest_kernel.SIGNED_SERIES]  # fmt: skip
        out = []
        for series in guest_kernel.SIGNED_SERIES:
            name = f"linux-modules-nvidia-{b}-server{variant}-{series}"
            others_ = ", ".join(n for n in names if n != name)
            out.append({"name": name, "version": drv, "files": marker(f"{kind} signed", series),
                        "conflicts": others_, "replaces": others_})  # fmt: skip
        return out

    b = branch
    return [
        {"name": f"nvidia-dkms-{b}-server", "version": drv, "depends": "dkms", "files": marker("proprietary dkms"),
         **exclusive("nvidia-dkms-{}-server")},
        {"name": f"nvidia-dkms-{b}-server-open", "version": drv, "depends": "dkms", "files": marker("open dkms"),
         **exclusive("nvidia-dkms-{}-server-open")},
        # Canonical-signed precompiled modules for each series of guest_kernel.SIGNED_SERIES, and the driver
        # without DKMS (what ubuntu-drivers --gpgpu installs with them)
        *signed("", "proprietary"),
        *signed("-open", "open"),
        {"name": f"nvidia-headless-no-dkms-{b}-server", "version": drv,
         "depends": f"nvidia-compute-utils-{b}-server (= {drv})"},
        {"name": f"nvidia-headless-no-dkms-{b}-server-open", "version": drv,
         "depends": f"nvidia-compute-utils-{b}-server (= {drv})"},
        {"name": f"nvidia-utils-{b}-server", "version": drv, "files": {"/usr/bin/nvidia-smi": (0o755, nvidia_smi(driver))},
         **exclusive("nvidia-utils-{}-server")},
        {"name": f"nvidia-compute-utils-{b}-server", "version": drv},
        {"name": f"nvidia-driver-{b}-server", "version": drv,
         "depends": f"nvidia-dkms-{b}-server (= {drv}), nvidia-utils-{b}-server (= {drv}), "
         f"nvidia-compute-utils-{b}-server (= {drv})"},
        {"name": f"nvidia-driver-{b}-server-open", "version": drv,
         "depends": f"nvidia-dkms-{b}-server-open (= {drv}), nvidia-utils-{b}-server (= {drv})"},
        {"name": f"nvidia-headless-{b}-server", "version": drv,
         "depends": f"nvidia-dkms-{b}-server (= {drv}), nvidia-compute-utils-{b}-server (= {drv})"},
    ]  # fmt: skip


def _headers(kernel: str) -> list[dict]:
    """The headers metapackage of each kernel series the lab's guests run (labsim.net.guest_kernel), with the
    headers of its kernel, and the headers of `kernel`."""
    metas = [
        {"name": f"linux-headers-{series}", "version": release.rsplit("-", 1)[0].replace("-", ".") + ".1",
         "depends": f"linux-headers-{release}"}
        for series, release in guest_kernel.KERNELS.items()
    ]  # fmt: skip
    releases = sorted({*guest_kernel.KERNELS.values(), kernel})
    return metas + [{"name": f"linux-headers-{release}", "version": "1.0-gpulab1"} for release in releases]


def _packages(kernel: str) -> dict[str, list[dict]]:
    """Stand-in packages per archive: name, version, depends, conflicts, replaces, files {path: (mode, text)},
    postinst."""
    ubuntu = [
        {"name": "dkms", "version": "3.0.11-1ubuntu13", "files": {"/usr/sbin/dkms": (0o755, RECORDING_TOOL)}},
        *_headers(kernel),
        {
            "name": "qemu-guest-agent",
            "version": "1:8.2.2+ds-0ubuntu1.4",
            "files": {
                "/usr/sbin/qemu-ga": (0o755, GUEST_AGENT),
                "/usr/lib/systemd/system/qemu-guest-agent.service": (0o644, GUEST_AGENT_UNIT),
            },
            # Ubuntu starts the agent at every boot (udev, when the virtio port shows up)
            "postinst": "mkdir -p /etc/systemd/system/multi-user.target.wants && ln -sf "
            "/usr/lib/systemd/system/qemu-guest-agent.service /etc/systemd/system/multi-user.target.wants/",
        },
        *(p for branch, driver in DRIVER_BRANCHES.items() for p in _driver_packages(branch, driver)),
    ]
    tk = TOOLKIT_VERSION
    nvidia = [
        {"name": "libnvidia-container1", "version": tk},
        {"name": "libnvidia-container-tools", "version": tk, "depends": f"libnvidia-container1 (= {tk})"},
        {
            "name": "nvidia-container-toolkit-base",
            "version": tk,
            "files": {
                "/usr/bin/nvidia-ctk": (0o755, NVIDIA_CTK),
                "/usr/bin/nvidia-container-runtime": (0o755, RECORDING_TOOL),
                "/usr/bin/nvidia-cdi-hook": (0o755, RECORDING_TOOL),
            },
            "postinst": "nvidia-ctk --quiet config --config-file=/etc/nvidia-container-runtime/config.toml --in-place",
        },
        {
            "name": "nvidia-container-toolkit",
            "version": tk,
            "depends": f"nvidia-container-toolkit-base (= {tk}), libnvidia-container-tools (= {tk})",
            "files": {"/usr/bin/nvidia-container-runtime-hook": (0o755, RECORDING_TOOL)},
        },
    ]
    return {"ubuntu": ubuntu, "nvidia/stable/deb/amd64": nvidia}


def _stanza(pkg: dict) -> list[str]:
    """The control fields a stand-in package's DEBIAN/control and its Packages entry share."""
    fields = [
        f"Package: {pkg['name']}",
        f"Version: {pkg['version']}",
        "Architecture: amd64",
        "Maintainer: gpulab lab <lab@gpulab.invalid>",
        "Section: misc",
        "Priority: optional",
    ]
    fields += [
        f"{field.capitalize()}: {pkg[field]}"
        for field in ("depends", "conflicts", "replaces")
        if pkg.get(field)
    ]
    return fields


def _build_deb(pkg: dict, out_dir: Path, work: Path) -> Path:
    root = work / pkg["name"]
    (root / "DEBIAN").mkdir(parents=True)
    for path, (mode, text) in pkg.get("files", {}).items():
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        dest.chmod(mode)
    control = _stanza(pkg)
    control.append(f"Description: gpulab lab stand-in for {pkg['name']}\n records what it is asked to do")
    (root / "DEBIAN" / "control").write_text("\n".join(control) + "\n")
    if pkg.get("postinst"):
        post = root / "DEBIAN" / "postinst"
        post.write_text(f"#!/bin/sh\nset -e\n{pkg['postinst']}\n")
        post.chmod(0o755)
    # file names leave the epoch out, as Debian's do
    deb = out_dir / f"{pkg['name']}_{pkg['version'].split(':', 1)[-1]}_amd64.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


def _index(repo: Path, debs: list[Path], pkgs: list[dict]) -> None:
    entries = []
    for deb, pkg in zip(debs, pkgs, strict=True):
        data = deb.read_bytes()
        lines = _stanza(pkg)
        lines += [
            f"Filename: ./{deb.name}",
            f"Size: {len(data)}",
            f"MD5sum: {hashlib.md5(data).hexdigest()}",
            f"SHA256: {hashlib.sha256(data).hexdigest()}",
            f"Description: gpulab lab stand-in for {pkg['name']}",
        ]
        entries.append("\n".join(lines) + "\n")
    packages = "\n".join(entries).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    date = email.utils.formatdate(usegmt=True)
    release = [
        "Origin: gpulab-lab",
        "Label: gpulab-lab",
        "Suite: ./",
        f"Date: {date}",
        "Architectures: amd64",
    ]
    release.append("SHA256:")
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        release.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    (repo / "Release").write_text("\n".join(release) + "\n")


def _gpg(gnupghome: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["gpg", "--batch", "--quiet", "--homedir", str(gnupghome), *args], check=True, capture_output=True
    )


def ensure_signing_key(gnupghome: Path) -> None:
    """The lab's OpenPGP key that signs the NVIDIA-style repository (made once per state directory)."""
    if (gnupghome / "lab.fpr").exists():
        return
    gnupghome.mkdir(parents=True, exist_ok=True)
    os.chmod(gnupghome, 0o700)
    _gpg(
        gnupghome,
        "--passphrase",
        "",
        "--quick-gen-key",
        "gpulab lab archive <lab@gpulab.invalid>",
        "ed25519",
        "sign",
        "never",
    )
    out = _gpg(gnupghome, "--with-colons", "--list-secret-keys").stdout.decode()
    fpr = next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))
    (gnupghome / "lab.fpr").write_text(fpr + "\n")


K3S_INSTALL = r"""#!/bin/sh
# gpulab lab stand-in for https://get.k3s.io: installs the lab's k3s stand-in the way the real script
# installs k3s, with its variables (INSTALL_K3S_VERSION, _EXEC, _BIN_DIR, _SYSTEMD_DIR, _NAME,
# _SKIP_DOWNLOAD, _SKIP_ENABLE, _SKIP_START, _FORCE_RESTART, _SYMLINK; K3S_URL, K3S_TOKEN, K3S_TOKEN_FILE),
# refusals, files (binary, kubectl/crictl/ctr links, k3s-killall.sh, <service>-uninstall.sh, unit, 0600 env
# file), [INFO] lines and idempotence (restart only when binary, unit or env file changed). The binary is
# the same file for every release: its version lives in /var/lib/gpulab-sim/k3s-version, which counts as
# part of the binary. Differences: the unit
# loads no kernel module; the service is not disabled and removed before being written again.
set -e
info() { echo '[INFO] ' "$@"; }
fatal() { echo '[ERROR] ' "$@" >&2; exit 1; }
VERSION_FILE=/var/lib/gpulab-sim/k3s-version
BIN_DIR=${INSTALL_K3S_BIN_DIR:-/usr/local/bin}
SYSTEMD_DIR=${INSTALL_K3S_SYSTEMD_DIR:-/etc/systemd/system}
VERSION=${INSTALL_K3S_VERSION:-v1.35.6+k3s1}

# setup_env: the command, then the checks, before anything is written
set -- ${INSTALL_K3S_EXEC:-} "$@"
case "$1" in
  server|agent) CMD=$1; shift ;;
  *)
    if [ -n "$K3S_URL" ]; then
      CMD=agent
      if [ -z "$K3S_TOKEN" ] && [ -z "$K3S_TOKEN_FILE" ]; then
        fatal "Defaulted k3s exec command to 'agent' because K3S_URL is defined, but K3S_TOKEN or K3S_TOKEN_FILE is not defined."
      fi
    else
      CMD=server
    fi ;;
esac
case "$K3S_URL" in
  ""|https://*) ;;
  *) fatal "Only https:// URLs are supported for K3S_URL (have $K3S_URL)" ;;
esac
if [ -n "$INSTALL_K3S_NAME" ]; then SYSTEM_NAME=k3s-$INSTALL_K3S_NAME
elif [ "$CMD" = server ]; then SYSTEM_NAME=k3s
else SYSTEM_NAME=k3s-agent; fi
UNIT=$SYSTEMD_DIR/$SYSTEM_NAME.service
ENV_FILE=$UNIT.env
KILLALL=$BIN_DIR/k3s-killall.sh
UNINSTALL=$BIN_DIR/$SYSTEM_NAME-uninstall.sh
hashes() { sha256sum "$BIN_DIR/k3s" "$UNIT" "$ENV_FILE" "$VERSION_FILE" 2>&1 || true; }
BEFORE=$(hashes)

# download_and_verify
if [ "$INSTALL_K3S_SKIP_DOWNLOAD" = true ]; then
  info 'Skipping k3s download and verify'
  [ -x "$BIN_DIR/k3s" ] || fatal "Executable k3s binary not found at $BIN_DIR/k3s"
else
  info "Using $VERSION as release"
  mkdir -p "$BIN_DIR"
  info "Downloading binary @FILES@/k3s"
  curl -fsS -o "$BIN_DIR/k3s.gpulab-new" "@FILES@/k3s"
  if cmp -s "$BIN_DIR/k3s.gpulab-new" "$BIN_DIR/k3s" && [ "$(cat "$VERSION_FILE" 2>/dev/null)" = "$VERSION" ]; then
    rm -f "$BIN_DIR/k3s.gpulab-new"
    info 'Skipping binary downloaded, installed k3s matches hash'
  else
    info "Installing k3s to $BIN_DIR/k3s"
    chmod 755 "$BIN_DIR/k3s.gpulab-new"
    mv -f "$BIN_DIR/k3s.gpulab-new" "$BIN_DIR/k3s"
  fi
fi
mkdir -p "$(dirname "$VERSION_FILE")"
[ "$(cat "$VERSION_FILE" 2>/dev/null)" = "$VERSION" ] || echo "$VERSION" > "$VERSION_FILE"

# create_symlinks: only where the command is neither in BIN_DIR nor on the PATH (INSTALL_K3S_SYMLINK)
for cmd in kubectl crictl ctr; do
  if [ "$INSTALL_K3S_SYMLINK" = skip ]; then continue; fi
  if [ ! -e "$BIN_DIR/$cmd" ] || [ "$INSTALL_K3S_SYMLINK" = force ]; then
    found=$(command -v "$cmd" 2>/dev/null || true)
    if [ -z "$found" ] || [ "$INSTALL_K3S_SYMLINK" = force ]; then
      info "Creating $BIN_DIR/$cmd symlink to k3s"
      ln -sf k3s "$BIN_DIR/$cmd"
    else
      info "Skipping $BIN_DIR/$cmd symlink to k3s, command exists in PATH at $found"
    fi
  else
    info "Skipping $BIN_DIR/$cmd symlink to k3s, already exists"
  fi
done

# create_killall: stops every k3s service (the stand-in runs no containers to kill)
info "Creating killall script $KILLALL"
cat > "$KILLALL" <<EOF
#!/bin/sh
# gpulab lab stand-in for k3s-killall.sh: stops the k3s services.
[ "\$(id -u)" -eq 0 ] || { echo "\$0 must be run as root" >&2; exit 1; }
for service in $SYSTEMD_DIR/k3s*.service; do
  [ -s "\$service" ] && systemctl stop "\$(basename "\$service")"
done
exit 0
EOF
chmod 755 "$KILLALL"

# create_uninstall
info "Creating uninstall script $UNINSTALL"
cat > "$UNINSTALL" <<EOF
#!/bin/sh
# gpulab lab stand-in for $SYSTEM_NAME-uninstall.sh: stops and removes $SYSTEM_NAME, the binary and k3s' data.
set -x
[ "\$(id -u)" -eq 0 ] || { echo "\$0 must be run as root" >&2; exit 1; }
$KILLALL
systemctl disable $SYSTEM_NAME >/dev/null 2>&1 || true
rm -f $UNIT $ENV_FILE
systemctl daemon-reload || true
for cmd in kubectl crictl ctr; do
  if [ "\$(readlink "$BIN_DIR/\$cmd" 2>/dev/null)" = k3s ]; then rm -f "$BIN_DIR/\$cmd"; fi
done
rm -rf /etc/rancher/k3s /run/k3s /var/lib/rancher/k3s /var/lib/kubelet $VERSION_FILE
rm -f $BIN_DIR/k3s $KILLALL
printf '{"time": %s, "command": "%s", "argv": [], "rc": 0}\n' "\$(date +%s.%N)" "$SYSTEM_NAME-uninstall.sh" >> /var/log/gpulab-standins.log
rm -f "\$0"
EOF
chmod 755 "$UNINSTALL"

# create_env_file: every exported K3S_*/CONTAINERD_* and proxy variable, as `sh -c export` quotes it
info "env: Creating environment file $ENV_FILE"
mkdir -p "$SYSTEMD_DIR"
( umask 0377
  sh -c export | while read -r _ line; do echo "$line"; done | grep -E '^(K3S|CONTAINERD)_' > "$ENV_FILE.new" || true
  sh -c export | while read -r _ line; do echo "$line"; done | grep -Ei '^(NO|HTTP|HTTPS)_PROXY' >> "$ENV_FILE.new" || true )
chmod 600 "$ENV_FILE.new"
mv -f "$ENV_FILE.new" "$ENV_FILE"

# create_service_file: the command on its own line, then one quoted line per argument
info "systemd: Creating service file $UNIT"
{
  printf '[Unit]\nDescription=Lightweight Kubernetes\nDocumentation=https://k3s.io\n'
  printf 'Wants=network-online.target\nAfter=network-online.target\n\n'
  printf '[Install]\nWantedBy=multi-user.target\n\n'
  # get.k3s.io: the server tells systemd when it is ready (its token written, its API listening)
  if [ "$CMD" = server ]; then SYSTEMD_TYPE=notify; else SYSTEMD_TYPE=exec; fi
  printf '[Service]\nType=%s\nEnvironmentFile=-/etc/default/%%N\nEnvironmentFile=-/etc/sysconfig/%%N\n' "$SYSTEMD_TYPE"
  printf 'EnvironmentFile=-%s\nKillMode=process\nDelegate=yes\nRestart=always\nRestartSec=5s\n' "$ENV_FILE"
  printf 'ExecStart=%s \\\n    %s \\\n' "$BIN_DIR/k3s" "$CMD"
  for arg in "$@"; do printf "\t'%s' \\\\\n" "$arg"; done
  printf '\n'
} > "$UNIT.new"
chmod 644 "$UNIT.new"
mv -f "$UNIT.new" "$UNIT"

# service_enable_and_start
[ "$INSTALL_K3S_SKIP_ENABLE" = true ] && exit 0
info "systemd: Enabling $SYSTEM_NAME unit"
systemctl daemon-reload >/dev/null
systemctl enable "$SYSTEM_NAME" >/dev/null 2>&1
[ "$INSTALL_K3S_SKIP_START" = true ] && exit 0
if [ "$(hashes)" = "$BEFORE" ] && [ "$INSTALL_K3S_FORCE_RESTART" != true ]; then
  info 'No change detected so skipping service start'
  exit 0
fi
info "systemd: Starting $SYSTEM_NAME"
systemctl restart "$SYSTEM_NAME"
"""


def build(dest: Path, gnupghome: Path, kernel: str | None = None, files_url: str = "") -> dict[str, str]:
    """Build the lab's archives under ``dest`` (replacing an earlier build); return their relative paths.

    ``files_url`` is where ``dest/k3s`` is served (the install script fetches the k3s binary there).
    """
    kernel = kernel or os.uname().release
    gnupghome.mkdir(parents=True, exist_ok=True)
    # gpg-agent's sockets live in the home and a Unix socket's path has at most 107 bytes: a deep state folder
    # (a test's) is reached through a short link instead
    short = Path(tempfile.mkdtemp(prefix="gl-gpg-"))
    home = short / "h"
    home.symlink_to(gnupghome.resolve(), target_is_directory=True)
    try:
        paths = _build(dest, home, kernel)
        k3s = dest / "k3s"
        k3s.mkdir()
        (k3s / "install.sh").write_text(K3S_INSTALL.replace("@FILES@", files_url.rstrip("/")))
        (k3s / "install.sh").chmod(0o755)
        build_zipapp(k3s / "k3s")
        return {**paths, "k3s_install": "k3s/install.sh", "k3s_binary": "k3s/k3s"}
    finally:
        # gpg starts an agent for the key's home; the lab leaves no process behind
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, check=False)
        shutil.rmtree(short, ignore_errors=True)


def _build(dest: Path, gnupghome: Path, kernel: str) -> dict[str, str]:
    ensure_signing_key(gnupghome)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpulab-repo-") as tmp:
        for rel, pkgs in _packages(kernel).items():
            repo = dest / rel
            repo.mkdir(parents=True)
            debs = [_build_deb(p, repo, Path(tmp) / rel.replace("/", "_")) for p in pkgs]
            _index(repo, debs, pkgs)
    nvidia = dest / "nvidia/stable/deb/amd64"
    _gpg(gnupghome, "--yes", "--pinentry-mode", "loopback", "--passphrase", "", "--clearsign",
         "-o", str(nvidia / "InRelease"), str(nvidia / "Release"))  # fmt: skip
    _gpg(gnupghome, "--yes", "--armor", "--export", "-o", str(dest / "nvidia" / "gpgkey"))
    return {"ubuntu": "ubuntu", "nvidia": "nvidia/stable/deb/$(ARCH)", "nvidia_key": "nvidia/gpgkey"}
