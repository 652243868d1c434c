"""`gpulab lab up|down|status`: start, stop and describe the simulated lab.

``up`` starts the PVE API simulator as a detached background process (its pid in ``STATE/server.pid``),
waits until it listens, writes the lab description to ``STATE/lab.json`` (mode 0600) and prints it as one
JSON line. On a running lab it prints the running lab's description. With root and
`labsim.network_lab` present, ``up`` also calls ``network_lab.up(state_dir, fixture)`` (its dict is merged
into the description) and ``down`` calls ``network_lab.down(state_dir)``; otherwise it says on stderr what it
skipped and why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LAB_JSON = "lab.json"
PID_FILE = "server.pid"
START_TIMEOUT_S = 15.0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _running_pid(state_dir: Path) -> int | None:
    try:
        pid = int((state_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    if not _pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return pid
    return pid if b"labsim.pve_api_server" in cmdline else None


def _write_lab_json(state_dir: Path, desc: dict[str, Any]) -> None:
    path = state_dir / LAB_JSON
    fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(desc, fh, sort_keys=True)
        fh.write("\n")
    os.replace(path.with_suffix(".tmp"), path)
    os.chmod(path, 0o600)


API_ONLY_ENV = "GPULAB_LAB_API_ONLY"
# Keys of the lab description that network_lab's answer may not replace.
CORE_KEYS = (
    "pve_url",
    "pve_host",
    "pve_port",
    "node",
    "user",
    "password",
    "token_id",
    "token_user",
    "token_name",
    "token_secret",
    "fingerprint",
    "internet_proxy",
    "state_dir",
    "fixture",
    "pid",
    "seed",
)


def _network_lab():
    """The network_lab module when it exists, we are root and API-only mode is off; else (None, reason)."""
    if os.environ.get(API_ONLY_ENV):
        return None, f"{API_ONLY_ENV} is set"
    if os.geteuid() != 0:
        return None, "not root"
    from labsim import network_lab

    return network_lab, None


def status(state_dir: Path) -> dict[str, Any] | None:
    """The running lab's description, or None."""
    pid = _running_pid(state_dir)
    if pid is None:
        return None
    try:
        desc = json.loads((state_dir / LAB_JSON).read_text())
    except (OSError, ValueError):
        return None
    return desc if desc.get("pid") == pid else None


def up(state_dir: Path, fixture: str | None) -> dict[str, Any]:
    """Start the lab (or find it running) and return its description.

    The lab's prerequisites (every program its hosts run, the guest image) are checked before
    anything starts; a start that fails stops what it started (the PVE API simulator included).
    """
    from labsim.fixture import resolve_fixture

    if fixture:
        fixture = str(resolve_fixture(fixture))  # a path, or the name of a fixture of labsim/fixtures
    state_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    network_lab, reason = _network_lab()
    desc = status(state_dir)
    if network_lab is not None:
        from labsim.fixture import load_fixture

        network_lab.prepare(
            load_fixture((desc or {}).get("fixture") or fixture)
        )  # a running lab keeps its own
    started = desc is None
    if started:
        desc = _start_server(state_dir, fixture)
    if network_lab is not None:
        try:
            extra = network_lab.up(state_dir, load_fixture(desc.get("fixture") or fixture)) or {}
        except BaseException:
            if started:
                with contextlib.suppress(Exception):
                    down(state_dir)
            raise
        desc.update({k: v for k, v in extra.items() if k not in CORE_KEYS})
        for name, address in (extra.get("seed_leases") or {}).items():
            desc["seed"]["vms"][name]["address"] = address  # the lease's address in the lab's own range
        if desc.get("token_secret") is None and extra.get("node_host"):
            fx = load_fixture(desc.get("fixture") or fixture)
            try:
                secret = bootstrap_on_node(state_dir, fx, extra)
            except BaseException:
                if started:
                    with contextlib.suppress(Exception):
                        down(state_dir)
                raise
            if secret is not None:
                desc["token_secret"] = secret
                desc.pop("access_note", None)
    else:
        print(f"gpulab lab: real lab hosts skipped ({reason}); the PVE API runs alone", file=sys.stderr)
    _write_lab_json(state_dir, desc)
    return desc


def bootstrap_on_node(state_dir: Path, fixture: dict[str, Any], facts: dict[str, Any]) -> str | None:
    """The lab's own API access, made as a user makes it: README's pveum steps run as root on the node host
    over SSH (labsim.pve_access.bootstrap_commands), the token's secret read from pveum's answer. None for
    a bare node (fixture access.bootstrap false). Only a lab with real hosts gets here; an API-only lab's
    server makes the same access through the same handlers when its state is new."""
    from labsim.pve_access import bootstrap_commands, wants_bootstrap

    if not wants_bootstrap(fixture):
        return None
    ssh = state_dir / "ssh"
    proc = subprocess.run(
        [
            "ssh",
            "-i",
            str(ssh / "id_ed25519"),
            "-o",
            f"UserKnownHostsFile={ssh / 'known_hosts'}",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            f"{facts['node_host'].get('ssh_user', 'root')}@{facts['node_host']['address']}",
            "sh",
            "-s",
        ],
        input=bootstrap_commands(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"the lab's API access could not be made with pveum on the node: {proc.stderr.strip()}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])["value"]


def _start_server(state_dir: Path, fixture: str | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "labsim.pve_api_server", "--state", str(state_dir)]
    if fixture:
        cmd += ["--fixture", str(Path(fixture).resolve())]
    previous = state_dir / LAB_JSON
    if previous.exists():
        with contextlib.suppress(ValueError, KeyError, OSError):
            cmd += ["--port", str(int(json.loads(previous.read_text())["pve_port"]))]
    line = _spawn(state_dir, cmd)
    if not line and "--port" in cmd:
        # The previous port is taken now: start on a free one.
        i = cmd.index("--port")
        line = _spawn(state_dir, cmd[:i] + cmd[i + 2 :])
    if not line:
        raise RuntimeError(f"the lab server did not start; see {state_dir / 'server.log'}")
    return json.loads(line)


def _spawn(state_dir: Path, cmd: list[str]) -> str:
    """Start the server detached; return the description line it prints once it listens ("" if it failed)."""
    with open(state_dir / "server.log", "ab") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    line = _read_line(proc, START_TIMEOUT_S)
    if not line:
        proc.kill()
        proc.wait(5)
    return line


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf and time.monotonic() < deadline:
        if not sel.select(max(0.0, deadline - time.monotonic())):
            break
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
    sel.close()
    proc.stdout.close()
    return buf.split(b"\n", 1)[0].decode().strip() if b"\n" in buf else ""


def down(state_dir: Path) -> bool:
    """Stop the lab and everything it started; True when something was running. Idempotent."""
    stopped = False
    network_lab, reason = _network_lab()
    if network_lab is not None:
        network_lab.down(state_dir)
    elif (state_dir / LAB_JSON).exists():
        print(f"gpulab lab: real lab hosts skipped ({reason})", file=sys.stderr)
    pid = _running_pid(state_dir)
    if pid is not None:
        stopped = True
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    (state_dir / PID_FILE).unlink(missing_ok=True)
    return stopped


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="gpulab lab", description="the simulated lab")
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--state", default=".lab", type=Path, help="state directory (default .lab)")
    parser.add_argument(
        "--fixture",
        help="lab fixture: a YAML file or a name in labsim/fixtures (reference, the default; homelab: "
        "the user's lab before gpulab ran; homelab-blacklisted: the same with the GPU blacklist on "
        "the node's kernel command line; homelab-running: the user's lab as it runs, behind its Huawei ONT; cluster: the reference node and a second PC with an RTX 4090, "
        "each a node host of its own; two-gpus: the reference node with an RTX 3060 next to its RTX 3090; "
        "igpu-boot-vga: the reference node with its Intel UHD 630 iGPU on i915 as the boot display; "
        "turing-usbc: an RTX 2080 with its USB-C functions, xhci_pci built into the kernel; "
        "grub-stray-cmdline: a GRUB node with a leftover /etc/kernel/cmdline and no ESP registered)",
    )
    parser.add_argument(
        "--api-only",
        action="store_true",
        help=f"only the PVE API, no real hosts even as root (or set {API_ONLY_ENV}=1)",
    )
    args = parser.parse_args(argv)
    if args.api_only:
        os.environ[API_ONLY_ENV] = "1"  # inherited by the server process
    state_dir = args.state.resolve()
    if args.action == "up":
        try:
            desc = up(state_dir, args.fixture)
        except (RuntimeError, OSError, ValueError) as exc:
            print(f"gpulab lab up: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(desc, sort_keys=True))
        return 0
    if args.action == "status":
        desc = status(state_dir)
        if desc is None:
            print(f"gpulab lab: no lab running in {state_dir}", file=sys.stderr)
            return 1
        print(json.dumps(desc, sort_keys=True))
        return 0
    stopped = down(state_dir)
    print(f"gpulab lab: {'stopped' if stopped else 'nothing was running'} ({state_dir})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
