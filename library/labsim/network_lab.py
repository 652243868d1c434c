"""The lab's real hosts: a private network with sshd hosts, a real DHCP router, VMs that boot.

Run as root, :func:`up` builds, on this machine but apart from it:

* a lab bridge with a private range that overlaps nothing the machine already routes (chosen
  at ``up`` time, or the fixture's ``network.subnet``, refused when it overlaps), the machine's
  side of the lab at the range's last address, and a blackhole route for the range (higher
  metric than the bridge's own route) so that, while the lab exists, traffic to its range can
  never leave through another interface;
* the router host (``lab-router``, the range's first address, SSH as root): real dnsmasq
  (default) or Kea (fixture ``network.router: kea``, control agent on the router's address)
  handing out the pool with 2-minute leases renewed every ``network.dhcp_renew_s``; it also
  serves the lab's package archive and file server (:mod:`labsim.net.package_archive`: stand-in
  NVIDIA driver, container toolkit in a signed repository, k3s and its install script);
* a Proxmox node host for each node of the fixture (the first at the range's ``.5``, the next ones at
  ``.6``, ``.7`` ...; STATE/net/hosts/node0, node1 ...): its own namespace, copy-on-write root (its writes
  land in its own upper directory), hostname, sshd and the node files and stand-ins stage "host"
  works on, with a hardware view that follows each simulated boot (:mod:`labsim.net.node_host`);
  its ``pveproxy`` (:mod:`labsim.net.pveproxy`) makes ``https://<node>:8006`` the PVE API, as on a
  real node (the same server, certificate and state as the description's ``pve_url`` on 127.0.0.1).

:func:`make_hooks` gives the PVE simulator hooks that turn a started VM into such a host, with
the MAC of its net0, an address from the router's DHCP, the cloud-init user and keys, systemd as
its service manager (the guest image's systemd, where the machine mounts cgroup2; ``network.vm_init``), the GPUs its
``hostpciN`` passes through (as nvidia-smi shows them), and a guest-agent answer from the address
it really holds. Each host's PID 1 is :mod:`labsim.net.hostinit`.

Everything made is named ``gl<3 hex digits of the state directory's hash>...`` and recorded
(before it is made) in ``<state_dir>/net/record.json``; :func:`down` removes exactly that, also
after a crash, and is idempotent. Host disks (upper directories) stay in ``<state_dir>/net/hosts``.
Hosts have no default route; every listener is bound to a lab address or 127.0.0.1, except the
DHCP server's and clients' UDP sockets inside lab namespaces whose only link is the lab's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from labsim.net import addressing, guest_kernel
from labsim.net.addressing import SubnetConflict
from labsim.vm_hooks import VmHooks, net0_mac

__all__ = ["LabNetError", "SubnetConflict", "down", "make_hooks", "node_boot_state", "status", "up"]

PREFIX = "gl"
BLACKHOLE_METRIC = 4242
NET_DIR = "net"
HOST_TIMEOUT_S = 30.0
NET_PACKAGE = Path(__file__).resolve().parent / "net"
#: a host's own sshd: its key and the config its PID 1 writes, both inside the host
HOST_KEY = "/etc/ssh/ssh_host_ed25519_key"  # where cloud-init puts an Ubuntu guest's
SSHD_CONFIG = "/etc/ssh/gpulab_sshd_config"

#: programs this machine runs for the lab (its own side, the router host, the archive), with their Debian
#: package; the VM and node hosts run the guest image's own (labsim.net.guest_image.COMMANDS)
TOOLS = {
    "ip": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "chroot": "coreutils",
    "stat": "coreutils",
    "/usr/bin/python3": "python3",  # the router host's archive server (the machine's own root)
    "sshd": "openssh-server",
    "ssh": "openssh-client",
    "ssh-keygen": "openssh-client",
    "gpg": "gnupg",
    "gpgconf": "gnupg",
    "dpkg-deb": "dpkg",
}
ROUTER_TOOLS = {
    "dnsmasq": {"dnsmasq": "dnsmasq-base"},
    "kea": {"kea-dhcp4": "kea-dhcp4-server", "kea-ctrl-agent": "kea-ctrl-agent"},
}
#: what building the guest image needs (only while this machine has none for the current package list)
IMAGE_TOOLS = {
    "debootstrap": "debootstrap",
    "/usr/share/keyrings/debian-archive-keyring.gpg": "debian-archive-keyring",
}

_thread_lock = threading.RLock()
_lock_depth = threading.local()


class LabNetError(RuntimeError):
    """The lab network cannot be brought up or down; the message says why and what to do."""


# --- small helpers --------------------------------------------------------------------------------------


def lab_id(state_dir: Path) -> str:
    """The short unique prefix of every object this lab makes (``gl`` + 3 hex digits)."""
    digest = hashlib.sha256(str(Path(state_dir).resolve()).encode()).hexdigest()
    return f"{PREFIX}{digest[:3]}"


def _run(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise LabNetError(f"`{' '.join(args)}` failed (exit {res.returncode}): {res.stderr.strip()}")
    return res


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run("ip", *args, check=check)


def _link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _netns_list() -> list[str]:
    res = _ip("-j", "netns", "list", check=False)
    try:
        return [n["name"] for n in json.loads(res.stdout or "[]")]
    except json.JSONDecodeError:
        return []


def _proc_start(pid: int) -> str | None:
    """The start time of a process (field 22 of /proc/PID/stat): with the pid, its identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(proc: dict[str, Any]) -> bool:
    start = _proc_start(int(proc["pid"]))
    if start != proc.get("start"):
        return False
    # a zombie (exited, not yet reaped by its parent) is not alive
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{proc['pid']}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return False


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _disable_ipv6(link: str, netns: str | None = None) -> None:
    if netns:
        _run("ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", check=False)
        _run(
            "ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1", check=False
        )
        return
    with contextlib.suppress(OSError):
        Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6").write_text("1")


# --- the state directory ----------------------------------------------------------------------------------


class NetworkLab:
    """Paths and the record of one lab's objects, with a lock shared by threads and processes."""

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir).resolve()
        self.dir = self.state_dir / NET_DIR
        self.id = lab_id(self.state_dir)
        self.record_file = self.dir / "record.json"
        self.facts_file = self.dir / "facts.json"
        # beside the lab description (inventory/demo reads STATE/ssh/id_ed25519.pub)
        self.ssh_dir = self.state_dir / "ssh"
        self.hosts_dir = self.dir / "hosts"
        self.cp_dir = self.dir / "cp"
        self.bridge = f"{self.id}br"

    @contextlib.contextmanager
    def locked(self):
        """Exclusive access to the record: threads of this process, and other processes (re-entrant)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with _thread_lock:
            depth = getattr(_lock_depth, "n", 0)
            _lock_depth.n = depth + 1
            try:
                if depth:
                    yield
                    return
                with open(self.dir / ".lock", "w") as fh:
                    fcntl.flock(fh, fcntl.LOCK_EX)
                    try:
                        yield
                    finally:
                        fcntl.flock(fh, fcntl.LOCK_UN)
            finally:
                _lock_depth.n = depth

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.record_file.read_text())
        except (OSError, json.JSONDecodeError):
            return None

    def save(self, rec: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.record_file, rec)

    def note(self, kind: str, value: Any) -> None:
        """Record an object before it is made (so a crash half way still leaves it findable)."""
        with self.locked():
            rec = self.load() or self.new_record()
            items = rec.setdefault(kind, [])
            if value not in items:
                items.append(value)
            self.save(rec)

    def forget(self, kind: str, value: Any) -> None:
        with self.locked():
            rec = self.load()
            if rec and value in rec.get(kind, []):
                rec[kind].remove(value)
                self.save(rec)

    def set_proc(self, key: str, pid: int) -> None:
        with self.locked():
            rec = self.load() or self.new_record()
            rec.setdefault("procs", {})[key] = {"pid": pid, "start": _proc_start(pid)}
            self.save(rec)

    def drop_proc(self, key: str) -> None:
        with self.locked():
            rec = self.load()
            if rec and key in rec.get("procs", {}):
                del rec["procs"][key]
                self.save(rec)

    def new_record(self) -> dict[str, Any]:
        return {"lab_id": self.id, "state": "starting", "netns": [], "links": [], "routes": [], "procs": {}}

    def facts(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.facts_file.read_text())
        except (OSError, json.JSONDecodeError):
            return None


# --- network pieces -------------------------------------------------------------------------------------


def _make_bridge(lab: NetworkLab, address: str) -> None:
    lab.note("links", lab.bridge)
    _ip("link", "add", "name", lab.bridge, "type", "bridge")
    _disable_ipv6(lab.bridge)
    _ip("addr", "add", address, "dev", lab.bridge)
    _ip("link", "set", lab.bridge, "up")


def _add_blackhole(lab: NetworkLab, subnet: str) -> None:
    route = {"type": "blackhole", "dst": subnet, "metric": BLACKHOLE_METRIC}
    lab.note("routes", route)
    _ip("route", "add", "blackhole", subnet, "metric", str(BLACKHOLE_METRIC))


def _make_netns(
    lab: NetworkLab,
    tag: str,
    iface: str,
    mac: str | None,
    address: str | None,
    bridge_port: str | None = None,
) -> tuple[str, str]:
    """A namespace with a veth whose far end (``iface``) is inside and whose near end is on the bridge.

    With ``bridge_port`` (a Proxmox node: ``iface`` is its LAN bridge, vmbr0) the far end is that port, a
    member of a Linux bridge ``iface`` inside the namespace that holds the address and has the port's MAC, as
    PVE's ifupdown2 gives a bridge its first port's MAC: /sys/class/net/vmbr0/brif/PORT as on the node."""
    ns, veth = f"{lab.id}-{tag}", f"{lab.id}{tag}"
    lab.note("netns", ns)
    lab.note("links", veth)
    if ns in _netns_list():  # remains of an earlier incarnation of this host (a stop that failed half way)
        _ip("link", "del", veth, check=False)
        _ip("netns", "del", ns, check=False)
    _ip("netns", "add", ns)
    peer = ["peer", "name", bridge_port or iface, "netns", ns]
    if mac:
        peer += ["address", mac]
    _ip("link", "add", veth, "type", "veth", *peer)
    _disable_ipv6(veth)
    _ip("link", "set", veth, "master", lab.bridge, "up")
    if bridge_port:
        _disable_ipv6(bridge_port, netns=ns)
        _ip("-n", ns, "link", "add", iface, *(["address", mac] if mac else []), "type", "bridge")
        _ip("-n", ns, "link", "set", bridge_port, "master", iface, "up")
    _disable_ipv6(iface, netns=ns)
    _ip("-n", ns, "link", "set", "lo", "up")
    if address:
        _ip("-n", ns, "addr", "add", address, "dev", iface)
        # a neighbour entry from an earlier host on this address stalls new connections for seconds
        _ip("neigh", "flush", "to", address.split("/")[0], "dev", lab.bridge, check=False)
    else:
        _ip("neigh", "flush", "dev", lab.bridge, check=False)
    _ip("-n", ns, "link", "set", iface, "up")
    return ns, veth


def _remove_netns(lab: NetworkLab, ns: str, veth: str | None) -> None:
    """Wait until no process is left in the namespace, then delete the veth and the namespace."""
    deadline = time.monotonic() + 5
    while ns in _netns_list() and time.monotonic() < deadline:
        if not _ip("netns", "pids", ns, check=False).stdout.strip():
            break
        time.sleep(0.05)
    if veth and _link_exists(veth):
        _ip("link", "del", veth, check=False)
    if ns in _netns_list():
        _ip("netns", "del", ns, check=False)
    lab.forget("netns", ns)
    if veth:
        lab.forget("links", veth)


def _kill_proc(proc: dict[str, Any]) -> None:
    """SIGKILL a recorded process, only if it is still the process that was recorded."""
    if not proc or not _alive(proc):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(proc["pid"]), signal.SIGKILL)
    deadline = time.monotonic() + 3
    while _alive(proc) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(int(proc["pid"]), os.WNOHANG)
        time.sleep(0.02)


# --- ssh material ---------------------------------------------------------------------------------------


def _host_pattern(subnet: ipaddress.IPv4Network) -> str:
    """A known_hosts pattern that matches the lab's addresses only."""
    octets = str(subnet.network_address).split(".")
    keep = max(1, min(3, subnet.prefixlen // 8))
    if subnet.prefixlen % 8 == 0:
        return ".".join(octets[:keep] + ["*"] * (4 - keep))
    return ",".join(str(a) for a in subnet.hosts())


def _ensure_ssh(lab: NetworkLab, subnet: ipaddress.IPv4Network) -> None:
    lab.ssh_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(lab.ssh_dir, 0o700)
    key = lab.ssh_dir / "id_ed25519"
    if not key.exists():
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpulab-lab", "-f", str(key))
    _write_known_hosts(lab, subnet)
    _write_user_known_hosts(lab)
    lab.cp_dir.mkdir(exist_ok=True)


def _write_known_hosts(lab: NetworkLab, subnet: ipaddress.IPv4Network) -> None:
    """One line per lab host key, each valid for the lab's addresses only.

    A VM's address comes from DHCP and may change (a new reservation): with the lab-range pattern
    the line stays true, and no address outside the lab accepts these keys.
    """
    pattern = _host_pattern(subnet)
    lines = []
    for pub in sorted(lab.hosts_dir.glob(f"*/upper{HOST_KEY}.pub")):
        keytype, blob = pub.read_text().split()[:2]
        lines.append(f"{pattern} {keytype} {blob} {pub.parts[-5]}@gpulab-lab\n")
    _write_text_atomic(lab.ssh_dir / "known_hosts", "".join(lines))


#: the comment that marks the lines the lab writes in the user's known_hosts (the others are kept as they are)
LAB_KEY_MARK = "@gpulab-lab"


def _write_user_known_hosts(lab: NetworkLab) -> None:
    """The known_hosts a user has after README step 4, for the inventory's own use (fact
    ``ssh_user_known_hosts``): the key of each host gpulab does not create (the nodes, the router) at its
    own address, and nothing for the VMs, whose keys gpulab learns itself (stage vms). Lines the lab did not
    write (the VMs' that gpulab added) are kept; the file is written only when the lab's lines change."""
    path = lab.ssh_dir / "user_known_hosts"
    ours = []
    for pub in sorted(lab.hosts_dir.glob(f"*/upper{HOST_KEY}.pub")):
        mark = pub.parents[3] / "known_address"
        if not mark.exists():
            continue
        keytype, blob = pub.read_text().split()[:2]
        ours.append(f"{mark.read_text().strip()} {keytype} {blob} {pub.parts[-5]}{LAB_KEY_MARK}\n")
    try:
        current = path.read_text().splitlines(keepends=True)
    except FileNotFoundError:
        current = []
    kept = [line for line in current if not line.rstrip().endswith(LAB_KEY_MARK)]
    kept = [line if line.endswith("\n") else line + "\n" for line in kept]
    if current and [line for line in current if line.rstrip().endswith(LAB_KEY_MARK)] == ours:
        return
    _write_text_atomic(path, "".join(ours + kept))


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _host_key(
    lab: NetworkLab, hdir: Path, name: str, subnet: ipaddress.IPv4Network, known_as: str | None = None
) -> None:
    """The host's own ed25519 key (first boot only), listed in the lab's known_hosts; a host gpulab does not
    create (``known_as``, its address) also in the user's (:func:`_write_user_known_hosts`)."""
    key = hdir / "upper" / HOST_KEY.lstrip("/")
    key.parent.mkdir(parents=True, exist_ok=True)
    if not key.exists():
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@gpulab-lab", "-f", str(key))
    mark = hdir / "known_address"
    if known_as:
        mark.write_text(known_as + "\n")
    else:
        mark.unlink(missing_ok=True)
    with lab.locked():
        _write_known_hosts(lab, subnet)
        _write_user_known_hosts(lab)


# --- hosts ----------------------------------------------------------------------------------------------


def cgroup2_mount() -> Path | None:
    """Where this machine mounts the cgroup2 hierarchy (``/sys/fs/cgroup`` or ``.../unified``), if anywhere."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split(" ", 1)[0] == "cgroup2":
                return Path(left.split()[4])
    return None


def systemd_hosts_possible(image_root: Path | None = None) -> str | None:
    """None when VM hosts can boot systemd here (the guest image's), else why not."""
    from labsim.net import guest_image

    root = image_root or guest_image.image_root()
    if guest_image.ready() and not (root / "lib/systemd/systemd").exists():
        return f"the guest image {root} has no systemd"
    if cgroup2_mount() is None:
        return "this machine has no cgroup2 hierarchy mounted"
    return None


def _host_cgroup(lab: NetworkLab, name: str) -> Path:
    mnt = cgroup2_mount()
    if mnt is None:
        raise LabNetError("a systemd lab host needs the cgroup2 hierarchy, and this machine mounts none")
    top = mnt / f"gpulab-{lab.id}"
    lab.note("cgroups", str(top))
    cg = top / name
    _remove_cgroup(cg)
    cg.mkdir(parents=True, exist_ok=True)
    return cg


def _remove_cgroup(path: Path) -> None:
    """Remove a cgroup and its children, deepest first, once their processes are gone."""
    deadline = time.monotonic() + 5
    while path.is_dir() and time.monotonic() < deadline:
        for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: -t[0].count("/")):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)
        if path.is_dir():
            time.sleep(0.05)


def _start_host(
    lab: NetworkLab,
    facts: dict[str, Any],
    *,
    name: str,
    hostname: str,
    tag: str,
    iface: str,
    mac: str | None,
    address: str | None,
    users: list[dict[str, Any]],
    files: dict[str, str] | None = None,
    tools: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
    generation: str = "",
    lower: str = "/",
    bridge_port: str | None = None,
) -> dict[str, Any]:
    """Start one host (node or VM) and wait until its sshd answers; return its status.

    ``lower`` is the read-only half of its root: the guest image for the node and the VMs, the
    machine's ``/`` only for the router (whose DHCP servers are the machine's programs).
    """
    subnet = ipaddress.ip_network(facts["subnet"])
    hdir = lab.hosts_dir / name
    # the lab moved to another range (or the router to another server): the first-boot files name the old one
    upper = prepare_host_dir(hdir, hostname, address, f"{facts['subnet']} {generation}".strip(), files, tools)
    state = hdir / "state"
    # a VM's key is gpulab's to learn (stage vms); the others' the user records (README step 4)
    _host_key(lab, hdir, name, subnet, None if name.startswith("vm") else address)
    ns, veth = _make_netns(
        lab, tag, iface, mac, f"{address}/{subnet.prefixlen}" if address else None, bridge_port
    )
    cfg = {
        "name": hostname,
        "root": str(hdir / "root"),
        "upper": str(upper),
        "work": str(hdir / "work"),
        "lower": lower,
        "state": str(state),
        "iface": iface,
        "address": address,
        "dhcp": {"hook": "/usr/local/sbin/gpulab-dhcp-hook", "timeout": 20},
        "users": users,
        "host_key": HOST_KEY,
        "sshd_config": SSHD_CONFIG,
        **(extra or {}),
    }
    cfg_file = state / "init.json"
    _write_json(cfg_file, cfg)
    prefix: list[str] = []
    if cfg.get("init") == "systemd":
        # the host's own cgroup, joined before `ip netns exec` (which hides /sys/fs/cgroup)
        cg = _host_cgroup(lab, name)
        prefix = ["sh", "-c", 'echo 0 > "$1/cgroup.procs" && shift && exec "$@"', "sh", str(cg)]
    proc = start_host_init(cfg_file, [*prefix, "ip", "netns", "exec", ns])
    lab.set_proc(f"host:{name}", proc.pid)
    st = wait_until_booted(proc, state, name)
    st.update(netns=ns, link=veth, name=name)
    return st


#: the namespaces of a lab host's PID 1 besides its network: its own mounts, hostname and processes
HOST_NAMESPACES = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "--uts",
    "--pid",
    "--fork",
    "--kill-child",
]


def prepare_host_dir(
    hdir: Path,
    hostname: str,
    address: str | None,
    identity: str,
    files: dict[str, str] | None,
    tools: dict[str, str] | None,
) -> Path:
    """A host's folders (upper, work, root, state) and its upper dir; return the upper dir.

    ``files`` are its "installation": written at the first boot, and again when ``identity`` changed
    since. ``tools`` (the lab's own programs in the host) are written every time.
    """
    for sub in ("upper", "work", "root", "state"):
        (hdir / sub).mkdir(parents=True, exist_ok=True)
    for stale in ("status.json", "sshd.log"):
        (hdir / "state" / stale).unlink(missing_ok=True)
    upper = hdir / "upper"
    marker = upper / "etc" / "gpulab-lab-host"
    if not marker.exists() or marker.read_text().split("\n")[0] != identity:
        _write_first_boot_files(upper, hostname, address, files or {})
        (upper / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")  # as a first boot makes it
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{identity}\nthis host is part of a gpulab lab; its files live in its upper dir\n")
    _write_files(upper, tools or {})
    _own_dirs(upper)
    return upper


def start_host_init(cfg_file: Path, prefix: list[str]) -> subprocess.Popen:
    """Start a host's PID 1 (:mod:`labsim.net.hostinit`) with ``cfg_file``; ``prefix`` enters its network."""
    console = open(cfg_file.parent / "console.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [
                *prefix,
                *HOST_NAMESPACES,
                "--",
                sys.executable,
                str(NET_PACKAGE / "hostinit.py"),
                str(cfg_file),
            ],
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=console,
            start_new_session=True,
        )
    finally:
        console.close()


def wait_until_booted(proc: subprocess.Popen, state: Path, name: str) -> dict[str, Any]:
    """The host's status once its sshd answers; LabNetError when it fails or takes too long."""
    deadline = time.monotonic() + HOST_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            st = json.loads((state / "status.json").read_text())
            if st.get("error"):
                raise LabNetError(
                    f"lab host {name} did not boot: {st['error']} (see {state / 'console.log'})"
                )
            if st.get("address"):
                return st
        if proc.poll() is not None:
            tail = (state / "console.log").read_text(errors="replace")[-800:]
            raise LabNetError(f"lab host {name} stopped while booting (exit {proc.returncode}): {tail}")
        time.sleep(0.03)
    raise LabNetError(
        f"lab host {name} was not up after {HOST_TIMEOUT_S:.0f} s (see {state / 'console.log'})"
    )


#: directories of the machine a lab host must not see: its home directories are its own (the machine's
#: shell start-up files, tool caches and their locks would otherwise run and pile up in every host)
PRIVATE_DIRS = ("root", "home")


def _own_dirs(upper: Path) -> None:
    """Mark the host's /root and /home opaque in its upper dir, so the machine's copies stay hidden."""
    for name in PRIVATE_DIRS:
        d = upper / name
        d.mkdir(mode=0o700 if name == "root" else 0o755, exist_ok=True)
        try:
            if os.getxattr(d, "trusted.overlay.opaque") == b"y":
                continue
        except OSError:
            pass
        os.setxattr(d, "trusted.overlay.opaque", b"y")


def _write_first_boot_files(upper: Path, hostname: str, address: str | None, files: dict[str, str]) -> None:
    """Files a host has from its "installation": written into its upper directory before it first runs."""
    etc = upper / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hostname").write_text(f"{hostname}\n")
    hosts = (
        f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n"
        if not address
        else f"127.0.0.1 localhost\n{address} {hostname}\n"
    )
    (etc / "hosts").write_text(hosts)
    _write_files(upper, files)


def _write_files(upper: Path, files: dict[str, str]) -> None:
    """Write files into a host's upper dir (host stopped); ``@opaque`` dirs and ``@symlink:`` links too."""
    hook = upper / "usr" / "local" / "sbin" / "gpulab-dhcp-hook"
    hook.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(NET_PACKAGE / "dhcp-hook.sh", hook)
    hook.chmod(0o755)
    for path, content in sorted(files.items(), key=lambda kv: kv[1] != "@opaque"):
        dest = upper / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if content == "@opaque":  # a directory whose lower (machine) entries the host does not see
            dest.mkdir(exist_ok=True)
            os.setxattr(dest, "trusted.overlay.opaque", b"y")
            continue
        if content == "@dir":
            dest.mkdir(exist_ok=True)
            continue
        if content.startswith("@symlink:"):
            if dest.is_symlink() or dest.exists():
                dest.unlink()
            dest.symlink_to(content.removeprefix("@symlink:"))
            continue
        dest.write_text(content)
        if path.startswith(("/usr/sbin/", "/usr/bin/", "/usr/local/")):
            dest.chmod(0o755)


def _stop_host(lab: NetworkLab, name: str) -> None:
    rec = lab.load() or {}
    proc = rec.get("procs", {}).get(f"host:{name}")
    _kill_proc(proc)
    lab.drop_proc(f"host:{name}")
    tag = _tag_of(name)
    _remove_netns(lab, f"{lab.id}-{tag}", f"{lab.id}{tag}")
    mnt = cgroup2_mount()
    if mnt is not None:
        _remove_cgroup(mnt / f"gpulab-{lab.id}" / name)


def _tag_of(name: str) -> str:
    """Short tag of a host in link and namespace names: node0 -> n0, vm100 -> v100, router -> r."""
    if name.startswith("vm"):
        return "v" + name[2:]
    if name.startswith("node"):
        return "n" + name[4:]
    return name[0]


def _close_ssh_masters(lab: NetworkLab) -> None:
    """Close ssh ControlMaster connections into the lab, so none outlives a host (see the testenv notes)."""
    if not lab.cp_dir.is_dir():
        return
    for sock in lab.cp_dir.iterdir():
        if sock.is_socket():
            subprocess.run(
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "lab"],
                capture_output=True,
                timeout=5,
                check=False,
            )


# --- router ---------------------------------------------------------------------------------------------


def _router_settings(fixture: dict[str, Any], subnet: ipaddress.IPv4Network) -> dict[str, Any]:
    """The router address, DHCP pool and kind inside the lab's range (fixture values keep their host part)."""
    net = fixture.get("network") or {}
    hosts = list(subnet.hosts())
    router = net.get("router_address", "auto")
    router_ip = hosts[0] if router in (None, "auto") else addressing.translate(router, subnet)
    pool = net.get("pool", "auto")
    if pool in (None, "auto"):
        # the reference router's pool: every address after the router's (the lab's own are left out)
        first, last = hosts[1], hosts[-1]
    else:
        a, b = (p.strip() for p in str(pool).split("-", 1))
        first, last = addressing.translate(a, subnet), addressing.translate(b, subnet)
    kind = str(net.get("router") or "dnsmasq")
    if kind not in ROUTER_KINDS:
        raise LabNetError(
            f"network.router: {kind!r} is not a lab router; use one of {', '.join(ROUTER_KINDS)}"
        )
    renew_s = int(net.get("dhcp_renew_s") or DEFAULT_RENEW_S)
    if not 1 <= renew_s < LEASE_S:
        raise LabNetError(f"network.dhcp_renew_s must be between 1 and {LEASE_S - 1} seconds (got {renew_s})")
    return {
        "renew_s": renew_s,
        "kind": kind,
        "server": "kea" if kind == "kea" else "dnsmasq",
        "address": router_ip,
        "pool_first": first,
        "pool_last": last,
    }


ROUTER_NAME = "lab-router"
#: what the router host runs: a real DHCP server, or (huawei_ont) the ONT's web form in front of a real dnsmasq
ROUTER_KINDS = ("dnsmasq", "kea", "huawei_ont")
#: the Huawei ONT's web form (labsim.routers.lab_ont): its settings and static table inside the router host,
#: and its port on the router's address (80 serves the lab's package archive)
ONT_CONF = "/etc/gpulab-ont/ont.json"
ONT_STATE = "/var/lib/gpulab-ont/static.json"
ONT_PORT = 8080
ONT_USER = "admin"
ONT_LIB = "/usr/local/lib/gpulab-ont"
KEA_CTRL_PORT = 8000
# Paths inside the router host (the router_dhcp role's defaults for a dnsmasq router reached over SSH)
DNSMASQ_HOSTS_FILE = "/etc/dnsmasq.gpulab-hosts"
DNSMASQ_HOSTS_DIR = "/etc/dnsmasq.gpulab-hosts.d"
DNSMASQ_LEASES = "/var/lib/misc/dnsmasq.leases"
DNSMASQ_PID = "/run/dnsmasq/dnsmasq.pid"
KEA_DHCP4_CONF = "/etc/kea/kea-dhcp4.conf"
KEA_CTRL_CONF = "/etc/kea/kea-ctrl-agent.conf"
KEA_LEASES = "/var/lib/kea/kea-leases4.csv"
KEA_SOCKET = "/run/kea/kea4-ctrl-socket"
# Kea 2.6.2+ accepts lease files, logs and control sockets only in its own directories (the socket's
# 0750 at most): the router keeps Debian's layout
KEA_LOG = "/var/log/kea/kea-dhcp4.log"
ARCHIVE_DIR = "/srv/gpulab-lab"


#: the router host runs the machine's DHCP programs, but none of the machine's package or login state
ROUTER_PRIVATE = {
    "/var/lib/apt/lists": "@opaque",
    "/var/cache/apt": "@opaque",
    "/etc/apt/sources.list.d": "@opaque",
    "/etc/sudoers.d": "@opaque",
}


def _start_router(
    lab: NetworkLab, facts: dict[str, Any], rs: dict[str, Any], static: list, leases: list | None = None
) -> dict[str, Any]:
    """The router host: its own root, sshd for root with the lab key, and the DHCP server as a service.

    ``leases`` (a seeded lab's, :func:`labsim.seed.leases`) are in dnsmasq's lease file from the router's
    first boot: the router already holds them when the lab starts, so each of those MACs gets its address.
    """
    subnet = ipaddress.ip_network(facts["subnet"])
    address = str(rs["address"])
    ranges = addressing.pool_ranges(rs["pool_first"], rs["pool_last"], static)
    if not ranges:
        raise LabNetError(f"the DHCP pool {rs['pool_first']}-{rs['pool_last']} holds no free address")
    tools: dict[str, str] = {}
    if rs["server"] == "kea":
        files, services, run_dirs, info = _kea_setup(subnet, address, ranges, rs["renew_s"])
    else:
        files, services, run_dirs, info = _dnsmasq_setup(subnet, ranges, rs["renew_s"])
        # dnsmasq's lease file: expiry (0: infinite, until the client's next exchange sets its own), MAC,
        # address, host name, client id
        files[DNSMASQ_LEASES] = "".join(
            f"0 {x['mac']} {x['address']} {x['hostname']} *\n" for x in leases or []
        )
    if rs["kind"] == "huawei_ont":
        info.update(_ont_setup(lab, subnet, address, tools, services))
    # the lab's package archive, served by the router host (built while the router is down)
    from labsim.net import package_archive

    archive = lab.hosts_dir / "router" / "upper" / ARCHIVE_DIR.lstrip("/")
    package_archive.build(archive, lab.dir / "gnupg", files_url=f"http://{address}/k3s")
    services.append(
        {
            "name": "archive",
            "argv": [
                "/usr/bin/python3",
                "-m",
                "http.server",
                "80",
                "--bind",
                address,
                "--directory",
                ARCHIVE_DIR,
            ],
        }
    )
    lab_key = (lab.ssh_dir / "id_ed25519.pub").read_text().strip()
    st = _start_host(
        lab,
        facts,
        name="router",
        hostname=ROUTER_NAME,
        tag="r",
        iface="lan0",
        mac="02:00:00:00:00:01",
        address=address,
        users=[{"name": "root", "keys": [lab_key]}],
        files={**ROUTER_PRIVATE, **files},
        tools=tools,
        extra={"services": services, "run_dirs": run_dirs},
        generation=f"{rs['server']} renew={rs['renew_s']}"
        + (" seeded" if leases else "")
        + (" ont" if rs["kind"] == "huawei_ont" else ""),
    )
    upper = lab.hosts_dir / "router" / "upper"
    _wait_port(address, 80, "the lab's package archive")
    info.update(
        archive_url=f"http://{address}/ubuntu",
        nvidia_repo_url=f"http://{address}/nvidia/stable/deb/$(ARCH)",
        nvidia_key_url=f"http://{address}/nvidia/gpgkey",
        k3s_install_script_url=f"http://{address}/k3s/install.sh",
    )
    if rs["server"] == "kea":
        _wait_port(address, KEA_CTRL_PORT, f"Kea's control agent (see {lab.hosts_dir / 'router' / 'state'})")
    if rs["kind"] == "huawei_ont":
        _wait_port(address, ONT_PORT, f"the ONT's web form (see {lab.hosts_dir / 'router' / 'state'})")
    return {
        "kind": rs["kind"],
        "server": rs["server"],
        "name": ROUTER_NAME,
        "address": address,
        "ssh_user": "root",
        "netns": st["netns"],
        "pool": f"{rs['pool_first']}-{rs['pool_last']}",
        "pool_ranges": [f"{a}-{b}" for a, b in ranges],
        "lease_s": LEASE_S,
        "renew_s": rs["renew_s"],
        "upper_dir": str(upper),
        **info,
    }


def _ont_setup(lab: NetworkLab, subnet, address: str, tools: dict, services: list) -> dict[str, Any]:
    """The ONT's web form as a router-host service writing dnsmasq's hosts file (labsim.routers.lab_ont).

    Its admin password is a lab secret made once and kept in the router host's own settings (so a restarted
    lab keeps it); lab.json's ``router`` gives it, with the form's URL and login, to the lab's inventory."""
    conf_path = lab.hosts_dir / "router" / "upper" / ONT_CONF.lstrip("/")
    try:
        password = json.loads(conf_path.read_text())["password"]
    except (OSError, ValueError, KeyError):
        password = secrets.token_urlsafe(12)
    conf = {
        "address": address,
        "port": ONT_PORT,
        "lan": f"{address}/{subnet.prefixlen}",
        "user": ONT_USER,
        "password": password,
        "hosts_file": DNSMASQ_HOSTS_FILE,
        "leases_file": DNSMASQ_LEASES,
        "pid_file": DNSMASQ_PID,
        "state_file": ONT_STATE,
    }
    # written at every start (the host's first-boot files are not): the lab's range may have moved
    conf_path.parent.mkdir(parents=True, exist_ok=True)
    _write_text_atomic(conf_path, json.dumps(conf, indent=1) + "\n")
    os.chmod(conf_path, 0o600)
    # the router host runs the machine's /usr/bin/python3: the simulator's modules go into the host as the lab's
    # own tools (package gpulab_ont; they import nothing outside it)
    from labsim import routers as sims

    for module in ("base", "huawei", "lab_ont"):
        tools[f"{ONT_LIB}/gpulab_ont/{module}.py"] = (Path(sims.__file__).parent / f"{module}.py").read_text()
    tools[f"{ONT_LIB}/gpulab_ont/__init__.py"] = ""
    services.append(
        {
            "name": "ont",
            "argv": ["/usr/bin/python3", "-m", "gpulab_ont.lab_ont", ONT_CONF],
            "env": {"PYTHONPATH": ONT_LIB},
        }
    )
    return {
        "web_url": f"http://{address}:{ONT_PORT}",
        "web_user": ONT_USER,
        "web_password": password,
        "ont_state_file": ONT_STATE,
    }


def _wait_port(address: str, port: int, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex((address, port)) == 0:
                return
        time.sleep(0.05)
    raise LabNetError(f"{what} did not listen on {address}:{port}")


LEASE_S = 120  # dnsmasq's shortest lease
DEFAULT_RENEW_S = 30


def _dnsmasq_setup(subnet, ranges, renew_s: int):
    argv = [
        "/usr/sbin/dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--user=root", "--group=root",
        "--port=0",  # no DNS: DHCP only
        "--interface=lan0", "--except-interface=lo", "--bind-interfaces", "--dhcp-authoritative",
        "--no-ping",  # answer at once (no ICMP probe of the offered address)
        "--dhcp-option=3", "--dhcp-option=6",  # no gateway, no DNS server: nothing leaves the lab
        f"--dhcp-hostsfile={DNSMASQ_HOSTS_FILE}", f"--dhcp-hostsdir={DNSMASQ_HOSTS_DIR}",
        f"--dhcp-leasefile={DNSMASQ_LEASES}", f"--pid-file={DNSMASQ_PID}",
        "--log-dhcp", "--log-facility=/var/log/dnsmasq.log",
    ]  # fmt: skip
    # short leases renewed every renew_s (T1), so a changed reservation moves a running VM at its next renew
    argv += [f"--dhcp-range={a},{b},{subnet.netmask},{LEASE_S}" for a, b in ranges]
    argv += [
        f"--dhcp-option=option:T1,{renew_s}",
        f"--dhcp-option=option:T2,{max(renew_s + 1, LEASE_S * 7 // 8)}",
    ]
    files = {DNSMASQ_HOSTS_FILE: "", f"{DNSMASQ_HOSTS_DIR}/.keep": "", DNSMASQ_LEASES: ""}
    services = [{"name": "dnsmasq", "argv": argv, "ready_file": DNSMASQ_PID}]
    info = {
        "hosts_file": DNSMASQ_HOSTS_FILE,
        "hosts_dir": DNSMASQ_HOSTS_DIR,
        "leases_file": DNSMASQ_LEASES,
        "pid_file": DNSMASQ_PID,
        "log_file": "/var/log/dnsmasq.log",
    }
    return files, services, ["/run/dnsmasq"], info


def _kea_setup(subnet, address: str, ranges, renew_s: int):
    dhcp4 = {
        "Dhcp4": {
            "interfaces-config": {"interfaces": ["lan0"], "dhcp-socket-type": "raw"},
            "control-socket": {"socket-type": "unix", "socket-name": KEA_SOCKET},
            "lease-database": {"type": "memfile", "persist": True, "name": KEA_LEASES, "lfc-interval": 0},
            "valid-lifetime": LEASE_S,
            "renew-timer": renew_s,
            "rebind-timer": max(renew_s + 1, LEASE_S * 7 // 8),
            "authoritative": True,
            "host-reservation-identifiers": ["hw-address"],
            "subnet4": [
                {
                    "id": 1,
                    "subnet": str(subnet),
                    "pools": [{"pool": f"{a} - {b}"} for a, b in ranges],
                    "reservations": [],
                }
            ],
            "loggers": [
                {
                    "name": "kea-dhcp4",
                    "output_options": [{"output": KEA_LOG}],
                    "severity": "INFO",
                }
            ],
        }
    }
    ctrl = {
        "Control-agent": {
            "http-host": address,  # the router's lab address only
            "http-port": KEA_CTRL_PORT,
            "control-sockets": {"dhcp4": {"socket-type": "unix", "socket-name": KEA_SOCKET}},
            "loggers": [
                {
                    "name": "kea-ctrl-agent",
                    "output_options": [{"output": "/var/log/kea/kea-ctrl-agent.log"}],
                    "severity": "INFO",
                }
            ],
        }
    }
    files = {
        KEA_DHCP4_CONF: json.dumps(dhcp4, indent=1) + "\n",
        KEA_CTRL_CONF: json.dumps(ctrl, indent=1) + "\n",
        "/var/lib/kea/.keep": "",
        "/var/log/kea/.keep": "",
    }
    env = {"KEA_PIDFILE_DIR": "/run/kea", "KEA_LOCKFILE_DIR": "/run/kea"}
    services = [
        {
            "name": "kea-dhcp4",
            "argv": ["/usr/sbin/kea-dhcp4", "-c", KEA_DHCP4_CONF],
            "env": env,
            "ready_file": KEA_SOCKET,
        },
        {"name": "kea-ctrl-agent", "argv": ["/usr/sbin/kea-ctrl-agent", "-c", KEA_CTRL_CONF], "env": env},
    ]
    info = {
        "control_agent_url": f"http://{address}:{KEA_CTRL_PORT}/",
        "config_file": KEA_DHCP4_CONF,
        "leases_file": KEA_LEASES,
        "control_socket": KEA_SOCKET,
        "log_file": KEA_LOG,
    }
    return files, services, ["/run/kea"], info


# --- up / down / status ---------------------------------------------------------------------------------


def _skipped(reason: str) -> dict[str, Any]:
    return {
        "network": "skipped",
        "skipped": [
            {"what": "lab bridge, private range and blackhole route", "why": reason},
            {"what": "router host with a real DHCP server (dnsmasq or Kea)", "why": reason},
            {"what": "Proxmox node host (own address, files and sshd)", "why": reason},
            {
                "what": "VM hosts (sshd, DHCP lease, cloud-init user); the guest agent answers from the pool",
                "why": reason,
            },
        ],
        "note": "nothing in this machine's network was changed; the API-only stages work as before",
    }


#: file systems an overlay upper directory cannot live on
UPPER_FS_REFUSED = {
    "overlayfs",
    "overlay",
    "nfs",
    "cifs",
    "smb2",
    "fuseblk",
    "fuse",
    "9p",
    "vfat",
    "msdos",
    "ecryptfs",
}


def fs_type(path: Path) -> str:
    """The file system type of the nearest existing directory at or above ``path`` (as ``stat -f`` names it)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    res = _run("stat", "-f", "-c", "%T", str(p), check=False)
    return res.stdout.strip()


def check_disk_fs(state_dir: Path) -> None:
    """Refuse a state directory where the hosts' copy-on-write disks cannot live, saying where they can."""
    kind = fs_type(state_dir)
    if kind in UPPER_FS_REFUSED:
        raise LabNetError(
            f"the lab keeps its hosts' disks (overlay upper directories) in {state_dir}, which is on {kind}; "
            "overlayfs cannot use that. Give `gpulab lab up --state` a directory on a local disk or a tmpfs "
            "(e.g. /var/tmp/gpulab-lab or /dev/shm/gpulab-lab)"
        )


def _missing_tools(fixture: dict[str, Any]) -> dict[str, str]:
    """The programs the lab would run that this machine lacks, each with its Debian package."""
    from labsim.net import guest_image

    server = "kea" if (fixture.get("network") or {}).get("router") == "kea" else "dnsmasq"
    need = {**TOOLS, **ROUTER_TOOLS[server]}
    if not guest_image.ready():
        need.update(IMAGE_TOOLS)
    return {tool: pkg for tool, pkg in need.items() if not _have(tool)}


def _have(tool: str) -> bool:
    if tool.startswith("/"):
        return os.path.exists(tool) and (tool.endswith((".gpg", ".asc")) or os.access(tool, os.X_OK))
    return shutil.which(tool) is not None


def prepare(fixture: dict[str, Any]) -> Path:
    """Everything the lab needs before it starts: the programs (:func:`check_prerequisites`), then the guest image."""
    if os.geteuid() != 0:
        raise LabNetError("the lab's hosts need root (network namespaces, veth links, routes and mounts)")
    check_prerequisites(fixture)
    return _guest_image()


def _guest_image() -> Path:
    """The guest image's root, built first (with progress on stderr) when this machine has none."""
    from labsim.net import guest_image

    try:
        return guest_image.ensure(log=lambda msg: print(f"gpulab lab: {msg}", file=sys.stderr, flush=True))
    except guest_image.ImageError as exc:
        raise LabNetError(str(exc)) from None


def check_prerequisites(fixture: dict[str, Any]) -> None:
    """Refuse, before anything starts, a machine that lacks a program the lab's hosts run; name each one."""
    missing = _missing_tools(fixture)
    if missing:
        named = ", ".join(f"{tool} (apt package {pkg})" for tool, pkg in missing.items())
        raise LabNetError(
            f"the lab needs {named}; install them (`make deps`, or apt-get install "
            f"{' '.join(sorted(set(missing.values())))}) and retry"
        )


def _health(lab: NetworkLab, rec: dict[str, Any]) -> list[str]:
    """What of a recorded lab is missing or dead (empty: the lab runs)."""
    problems = []
    if rec.get("state") != "up":
        problems.append(f"a start that did not finish (state {rec.get('state')!r})")
    if not _link_exists(lab.bridge):
        problems.append(f"bridge {lab.bridge} is gone")
    # a VM host may end by itself (the guest powered off); the lab's own hosts may not
    for key, proc in rec.get("procs", {}).items():
        if not key.startswith("host:vm") and not _alive(proc):
            problems.append(f"process {key} (pid {proc['pid']}) is dead")
    present = set(_netns_list())
    problems += [
        f"namespace {ns} is gone"
        for ns in rec.get("netns", [])
        if ns not in present and "-v" not in ns[len(lab.id) :]
    ]
    return problems


def _leftovers(lab: NetworkLab) -> list[str]:
    """Objects named with this lab's prefix that exist on the machine."""
    found = [f"namespace {ns}" for ns in _netns_list() if ns.startswith(lab.id)]
    with contextlib.suppress(OSError):
        found += [f"link {n}" for n in sorted(os.listdir("/sys/class/net")) if n.startswith(lab.id)]
    return found


def up(state_dir: Path, fixture: dict[str, Any]) -> dict[str, Any]:
    """Bring up the lab bridge, the router host and the node host; return facts for `gpulab lab up`.

    Idempotent: a lab that runs is reused (``reused: true``). Refuses to start over the remains of
    a lab that crashed (run :func:`down` first), and a fixture range that overlaps the machine's
    networks (:class:`SubnetConflict`, naming the route). Without root it changes nothing and says
    what it skipped.
    """
    started = time.monotonic()
    lab = NetworkLab(state_dir)
    if os.geteuid() != 0:
        return _skipped("needs root (network namespaces, veth links, routes and mounts need CAP_SYS_ADMIN)")
    check_prerequisites(fixture)
    check_disk_fs(lab.state_dir)
    with lab.locked():
        rec = lab.load()
        if rec:
            problems = _health(lab, rec)
            if not problems:
                facts = lab.facts() or {}
                return {**facts, "reused": True}
            raise LabNetError(
                f"remains of an earlier lab in {lab.dir} that did not stop cleanly: {'; '.join(problems)}. "
                f"Run `gpulab lab down` with the same state directory to clean them up, then `gpulab lab up` again"
            )
        leftovers = _leftovers(lab)
        if leftovers:
            raise LabNetError(
                f"objects named {lab.id}* exist that {lab.dir} did not record: {', '.join(leftovers)}. They "
                f"belong to another lab whose state directory hashes to the same prefix (take that one down "
                f"first), or their record was deleted (remove them with `ip netns del` / `ip link del`); "
                f"or use another state directory"
            )
        rec = lab.new_record()
        lab.save(rec)
    try:
        facts = _bring_up(lab, fixture)
    except BaseException:
        with contextlib.suppress(Exception):
            down(state_dir)
        raise
    facts["started_in_s"] = round(time.monotonic() - started, 2)
    _write_json(lab.facts_file, facts)
    with lab.locked():
        rec = lab.load() or lab.new_record()
        rec["state"] = "up"
        lab.save(rec)
    return {**facts, "reused": False}


def _bring_up(lab: NetworkLab, fixture: dict[str, Any]) -> dict[str, Any]:
    from labsim.net import node_host

    net = fixture.get("network") or {}
    routes = addressing.read_routes()
    wanted = net.get("subnet", "auto")
    if wanted in (None, "auto"):
        subnet = addressing.choose_subnet(str(lab.state_dir), routes)
    else:
        subnet = ipaddress.ip_network(str(wanted), strict=False)
        if subnet.prefixlen > 29 or not subnet.is_private:
            raise SubnetConflict(f"lab network {subnet} must be a private IPv4 range of /29 or larger")
        addressing.check_subnet(subnet, routes)
    hosts = list(subnet.hosts())
    bridge_ip = hosts[-1]
    rs = _router_settings(fixture, subnet)
    with lab.locked():
        rec = lab.load() or lab.new_record()
        rec.update(subnet=str(subnet), bridge=lab.bridge, bridge_address=str(bridge_ip))
        lab.save(rec)
    facts: dict[str, Any] = {
        "network": "up",
        "lab_id": lab.id,
        "subnet": str(subnet),
        "prefix": subnet.prefixlen,
        "netmask": str(subnet.netmask),
        "bridge": lab.bridge,
        "bridge_address": str(bridge_ip),
        "blackhole_route": f"blackhole {subnet} metric {BLACKHOLE_METRIC}",
        "net_state_dir": str(lab.dir),
    }
    _make_bridge(lab, f"{bridge_ip}/{subnet.prefixlen}")
    _add_blackhole(lab, str(subnet))
    _ensure_ssh(lab, subnet)
    facts.update(
        ssh_private_key=str(lab.ssh_dir / "id_ed25519"),
        ssh_public_key=str(lab.ssh_dir / "id_ed25519.pub"),
        ssh_known_hosts=str(lab.ssh_dir / "known_hosts"),
        ssh_user_known_hosts=str(lab.ssh_dir / "user_known_hosts"),
        ssh_control_path_dir=str(lab.cp_dir),
    )
    image_root = _guest_image()  # up() checked the programs first
    facts["guest_image"] = str(image_root)
    wanted_init = str(net.get("vm_init") or "auto")
    why_not = systemd_hosts_possible(image_root)
    if wanted_init == "systemd" and why_not:
        raise LabNetError(f"network.vm_init is systemd, but {why_not}")
    facts["vm_init"] = "simple" if wanted_init == "simple" or why_not else "systemd"
    if why_not and wanted_init == "auto":
        facts["vm_init_note"] = f"VM hosts run without systemd: {why_not}"
    lab_key = (lab.ssh_dir / "id_ed25519.pub").read_text().strip()
    nodes = fixture["nodes"]
    node_ips = _node_addresses(hosts, len(nodes), taken=(rs["address"], bridge_ip))
    _seed_node_vms(lab, fixture)
    from labsim import seed

    leases = seed.leases(fixture, subnet)
    if leases and rs["server"] != "dnsmasq":
        raise LabNetError("a seeded lab's DHCP leases are written for dnsmasq: set network.router: dnsmasq")
    # the router and every node boot side by side (each waits for its own sshd)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1 + len(nodes)) as pool:
        router = pool.submit(_start_router, lab, facts, rs, [rs["address"], bridge_ip, *node_ips], leases)
        boots = []
        for i, (node, node_ip) in enumerate(zip(nodes, node_ips, strict=True)):
            name = node_dir_name(i)
            spec = node_host.node_host_spec(
                node,
                lab.hosts_dir / name,
                api_dir=lab.state_dir / "node-api",
                address=str(node_ip),
                pve=fixture["pve"],
            )
            boots.append(
                pool.submit(
                    _start_host,
                    lab,
                    facts,
                    name=name,
                    hostname=node["name"],
                    tag=_tag_of(name),
                    iface="vmbr0",
                    bridge_port=NODE_LAN_PORT,
                    mac=f"02:00:00:00:00:{5 + i:02x}",
                    address=str(node_ip),
                    users=[{"name": "root", "keys": [lab_key]}],
                    files=spec["files"],
                    tools=spec["tools"],
                    extra=spec["init"],
                    lower=str(image_root),
                )
            )
        facts["router"] = router.result()
        booted = [b.result() for b in boots]
    node_hosts = {}
    for i, (node, st) in enumerate(zip(nodes, booted, strict=True)):
        hdir = lab.hosts_dir / node_dir_name(i)
        # the node's pveproxy forwards its port 8006 to the API server (what a user's inventory names)
        _wait_port(
            st["address"], node_host.API_PORT, f"node {node['name']}'s pveproxy (see {hdir / 'state'})"
        )
        node_hosts[node["name"]] = {
            "name": node["name"],
            "address": st["address"],
            "pve_api_url": f"https://{st['address']}:{node_host.API_PORT}",
            "ssh_user": "root",
            "netns": st["netns"],
            "upper_dir": str(hdir / "upper"),
            "standins_log": str(hdir / "upper" / node_host.STANDINS_LOG.lstrip("/")),
            # inside the node: sys/, proc/ and lib/modules/ of its simulated hardware in one tree
            "hardware_root": node_host.HW_ROOT,
            "views_skipped": st.get("views_skipped", []),
        }
    # every node of the cluster by its PVE name; node_host is the first (the one a one-node lab has)
    facts["node_hosts"] = node_hosts
    facts["node_host"] = node_hosts[nodes[0]["name"]]
    if leases:
        facts["seed_leases"] = {x["hostname"]: x["address"] for x in leases}
    return facts


#: the node's network port on its LAN bridge vmbr0 (the bridge has its MAC)
NODE_LAN_PORT = "eno1"


def node_dir_name(index: int) -> str:
    """The folder (under STATE/net/hosts) and host name of the fixture's ``index``-th node: node0, node1, ..."""
    return f"node{index}"


def _node_addresses(hosts: list, count: int, taken: tuple) -> list:
    """The nodes' static addresses: the 5th host address of the range and the ones after it (the reference
    node's .5), skipping the router's and the bridge's."""
    start = min(4, len(hosts) - 2 - count)
    free = [h for h in hosts[start:] if h not in taken]
    if len(free) < count:
        raise LabNetError(
            f"the lab's range has no room for {count} node hosts: give network.subnet a larger one"
        )
    return free[:count]


def node_host_dir(lab: NetworkLab, fixture: dict[str, Any], node: str) -> Path:
    """The host folder of the node named ``node`` (the first node's for a name the fixture lacks)."""
    names = [n["name"] for n in fixture.get("nodes", [])]
    return lab.hosts_dir / node_dir_name(names.index(node) if node in names else 0)


def _seed_node_vms(lab: NetworkLab, fixture: dict[str, Any]) -> None:
    """A seeded lab's VMs in the node's ``qm list`` from its first boot (the VM hooks keep it up to date)."""
    vms = (fixture.get("seed") or {}).get("vms") or []
    path = lab.hosts_dir / node_dir_name(0) / "state" / "pve" / "vms.json"  # seed.py seeds the first node
    if not vms or path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)  # before the node's first boot
    entries = {}
    for vm in vms:
        create = vm["create"]
        entries[str(vm["vmid"])] = {
            "name": create["name"],
            "mem_mb": int(str(create.get("memory", "512")).split(",")[0].removeprefix("current=")),
            "bootdisk_gb": float(str(create.get("scsi0", "")).split(",")[0].rpartition(":")[2] or 0),
            "status": "stopped",
            "pid": 0,
        }
    _write_json(path, entries)


def down(state_dir: Path) -> None:
    """Remove every namespace, link, process, route and mount this lab made, and nothing else.

    Idempotent, and works from the record alone, so it also cleans up after a lab that was killed.
    Host disks (upper directories) stay in the state directory, as a real disk outlives a power cut.
    """
    lab = NetworkLab(state_dir)
    rec = lab.load()
    if rec is None:
        return  # every object is recorded before it is made: no record, nothing of ours
    if os.geteuid() != 0:
        raise LabNetError("removing the lab network needs root: run `gpulab lab down` as root")
    with contextlib.suppress(Exception):
        _close_ssh_masters(lab)
    procs = rec.get("procs", {})
    # hosts first (their sshd sockets close while the links still exist), routers last
    for key in sorted(procs, key=lambda k: (not k.startswith("host:"), k)):
        _kill_proc(procs[key])
        lab.drop_proc(key)
    present = set(_netns_list())
    for ns in rec.get("netns", []):
        if ns in present:
            _kill_netns_pids(ns)  # e.g. a host whose pid was not recorded yet when the lab crashed
        _remove_netns(lab, ns, f"{lab.id}{ns[len(lab.id) + 1 :]}")
    names = set(rec.get("links", []))
    for link in sorted(names, key=lambda n: n == lab.bridge):  # the bridge last
        if _link_exists(link):
            _ip("link", "del", link, check=False)
        lab.forget("links", link)
    for route in rec.get("routes", []):
        _ip("route", "del", route["type"], route["dst"], "metric", str(route["metric"]), check=False)
        lab.forget("routes", route)
    for cg in rec.get("cgroups", []):
        _remove_cgroup(Path(cg))
    for d in rec.get("dirs", []):
        shutil.rmtree(d, ignore_errors=True)
    lab.record_file.unlink(missing_ok=True)
    lab.facts_file.unlink(missing_ok=True)


def _kill_netns_pids(ns: str) -> None:
    """SIGKILL what still runs in one of the lab's own namespaces (only lab processes can be there)."""
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def node_boot_state(state_dir: Path, index: int = 0) -> dict[str, Any] | None:
    """The ``index``-th node host's last simulated boot: ``{"boot", "state" (stock|blacklisted|vfio), "cmdline"}``, or None.

    For the PVE simulator, e.g. to refuse starting a VM with a passed-through GPU that vfio-pci does not hold.
    """
    path = (
        NetworkLab(state_dir).hosts_dir
        / node_dir_name(index)
        / "upper/var/lib/gpulab-sim/boot/last-boot.json"
    )
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def status(state_dir: Path) -> dict[str, Any] | None:
    """The running lab's facts plus its health and VM hosts, or None when no lab is recorded."""
    lab = NetworkLab(state_dir)
    rec = lab.load()
    if rec is None:
        return None
    facts = lab.facts() or {}
    problems = _health(lab, rec) if os.geteuid() == 0 else ["cannot check without root"]
    vms = {}
    for key in rec.get("procs", {}):
        if key.startswith("host:vm"):
            name = key.split(":", 1)[1]
            with contextlib.suppress(OSError, json.JSONDecodeError):
                st = json.loads((lab.hosts_dir / name / "state" / "status.json").read_text())
                res = _ip(
                    "-n", f"{lab.id}-{_tag_of(name)}", "-4", "-j", "addr", "show", "dev", "ens18", check=False
                )
                live = [a["local"] for i in json.loads(res.stdout or "[]") for a in i.get("addr_info", [])]
                vms[name[2:]] = {"address": live[0] if live else None, "boot": st.get("boot")}
    return {**facts, "healthy": not problems, "problems": problems, "vm_hosts": vms}


# --- VM hooks -------------------------------------------------------------------------------------------


def cloud_init_users(config: dict[str, Any], lab_key: str) -> list[dict[str, Any]]:
    """The users a VM's cloud-init would create: ``ciuser`` (default ubuntu) with ``sshkeys``; root gets the lab key."""
    keys_text = urllib.parse.unquote(str(config.get("sshkeys", "")))
    keys = [k.strip() for k in keys_text.splitlines() if k.strip() and not k.strip().startswith("#")]
    user = str(config.get("ciuser") or "ubuntu")
    users = [{"name": "root", "keys": [lab_key, *keys] if user == "root" else [lab_key]}]
    if user != "root":
        users.append({"name": user, "keys": keys, "sudo": True})
    return users


def static_address(config: dict[str, Any]) -> str | None:
    """The address of ``ipconfig0=ip=A/N,gw=G`` (None for ``ip=dhcp`` or no ipconfig0)."""
    for part in str(config.get("ipconfig0", "ip=dhcp")).split(","):
        key, _, value = part.partition("=")
        if key.strip() == "ip" and value not in ("dhcp", ""):
            return value.split("/")[0]
    return None


class NetVmHooks(VmHooks):
    """Hooks that make each started VM a real lab host (see the module docs)."""

    def __init__(self, state_dir: Path, fixture: dict[str, Any]):
        super().__init__(fixture)
        self.lab = NetworkLab(state_dir)

    def _running(self) -> dict[str, Any] | None:
        facts = self.lab.facts()
        return facts if facts and facts.get("network") == "up" else None

    def vm_started(self, node: str, vmid: int, config: dict) -> None:
        facts = self._running()
        if facts is None:
            return
        name = f"vm{int(vmid)}"
        self._stop(name)  # a start over a host that is still there is a reset
        lab_key = (self.lab.ssh_dir / "id_ed25519.pub").read_text().strip()
        installed = self._installation(vmid, config)
        gpus = vm_gpus(config, self.fixture, node)
        gpus_file = self.lab.hosts_dir / name / "upper" / "etc" / "gpulab-sim" / "gpus.json"
        gpus_file.parent.mkdir(parents=True, exist_ok=True)
        gpus_file.write_text(json.dumps(gpus, indent=1) + "\n")  # the passed-through cards of this start
        (gpus_file.parent / "firmware.json").write_text(json.dumps(vm_firmware(config)) + "\n")
        extra: dict[str, Any] = {"boot_hook": VM_BOOT_HOOK, "init": facts.get("vm_init", "simple")}
        tools, services = _vm_tools(
            Path(facts["guest_image"]),
            systemd=facts.get("vm_init") == "systemd",
            apt_hold_s=apt_hold_s(self.fixture),
        )
        if services:
            extra["services"] = services
        # the Ubuntu kernel the guest runs (the fixture's guest_kernels): its release and its packages
        series = guest_kernel.series_of(self.fixture, str(config.get("name") or name), int(vmid))
        guest_kernel.install(self.lab.hosts_dir / name / "upper", Path(facts["guest_image"]), series)
        views = [guest_kernel.osrelease_view(self.lab.hosts_dir / name / "state", series)]
        tools[guest_kernel.UNAME] = guest_kernel.UNAME_STANDIN
        if installed is None:
            users = cloud_init_users(config, lab_key)
        else:
            # installed from the ISO: the installer's user with its password and the lab key, no cloud-init,
            # a disk of its own (the hardware view follows the VM config's disk size)
            users = [
                {"name": installed["user"], "keys": [lab_key], "password": installed["password"],
                 "sudo": installed["sudo"]}
            ]  # fmt: skip
            tools.pop("/usr/bin/cloud-init", None)
            tools.update(iso_guest_tools())
            _write_iso_installation(
                self.lab.hosts_dir / name / "upper", installed, facts["router"]["address"]
            )
            self._write_disk_hardware(vmid, config, installed)
            views.append([str(self.lab.hosts_dir / name / "state" / "hw"), ISO_GUEST_HW])
        extra["views"] = views
        _start_host(
            self.lab,
            facts,
            name=name,
            hostname=str(config.get("name") or name),
            tag=_tag_of(name),
            iface="ens18",
            mac=net0_mac(config),
            address=static_address(config),
            users=users,
            files=_vm_files(facts["router"]["address"]),
            tools=tools,
            extra=extra,
            lower=facts["guest_image"],
        )
        self._node_vm(node, vmid, config, status="running")

    def _installation(self, vmid: int, config: dict) -> dict[str, Any] | None:
        """The seeded ISO installation on this VM's disk, while the VM still boots from that disk."""
        from labsim import seed

        inst = seed.installation(self.lab.state_dir, vmid)
        if inst is None or inst.get("install") != "iso":
            return None
        slot, volid = inst["disk"]["slot"], inst["disk"]["volid"]
        return inst if str(config.get(slot, "")).split(",")[0] == volid else None

    def _write_disk_hardware(self, vmid: int, config: dict, installed: dict[str, Any]) -> None:
        """The guest's view of its disks (``/run/gpulab-sim/hw/disks.json``): boot disk and CD-ROM sizes."""
        hw = self.lab.hosts_dir / f"vm{int(vmid)}" / "state" / "hw"
        hw.mkdir(parents=True, exist_ok=True)
        disk = (
            _drive_size(str(config.get(installed["disk"]["slot"], "")))
            or installed["disk"]["installed_bytes"]
        )
        cdrom = str(config.get("ide2", ""))
        sr0 = _drive_size(cdrom) if "media=cdrom" in cdrom and not cdrom.startswith("none") else None
        _write_json(hw / "disks.json", {"sda": disk, "sr0": sr0})

    def vm_resized(self, node: str, vmid: int, disk: str, size: int, config: dict) -> None:
        installed = self._installation(vmid, config)
        if installed is not None and disk == installed["disk"]["slot"]:
            self._write_disk_hardware(vmid, config, installed)  # a running guest sees the bigger disk at once

    def _stop(self, name: str) -> None:
        rec = self.lab.load() or {}
        if f"host:{name}" in rec.get("procs", {}) or f"{self.lab.id}-{_tag_of(name)}" in rec.get("netns", []):
            _stop_host(self.lab, name)

    def vm_stopped(self, node: str, vmid: int) -> None:
        self._stop(f"vm{int(vmid)}")
        self._node_vm(node, vmid, status="stopped")

    def vm_destroyed(self, node: str, vmid: int) -> None:
        name = f"vm{int(vmid)}"
        self._stop(name)
        shutil.rmtree(self.lab.hosts_dir / name, ignore_errors=True)  # its disk goes with it
        self._node_vm(node, vmid, remove=True)

    def _node_vm(
        self, node: str, vmid: int, config: dict | None = None, status: str = "", remove: bool = False
    ) -> None:
        """Keep the VM's node host's view of its VMs (``qm list``) in step with the simulator."""
        path = node_host_dir(self.lab, self.fixture, node) / "state" / "pve" / "vms.json"
        if not path.parent.is_dir():
            return
        with self.lab.locked():
            try:
                vms = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                vms = {}
            key = str(int(vmid))
            if remove:
                vms.pop(key, None)
            else:
                vm = vms.setdefault(key, {})
                if config is not None:
                    vm.update(
                        name=str(config.get("name") or f"VM {key}"), mem_mb=int(config.get("memory") or 2048)
                    )
                    vm["bootdisk_gb"] = _bootdisk_gb(config)
                vm["status"] = status
                rec = self.lab.load() or {}
                vm["pid"] = rec.get("procs", {}).get(f"host:vm{key}", {}).get("pid", 0)
            _write_json(path, vms)

    def guest_interfaces(self, node: str, vmid: int, config: dict) -> list[dict]:
        if self._running() is None:
            return super().guest_interfaces(node, vmid, config)
        upper = self.lab.hosts_dir / f"vm{int(vmid)}" / "upper"
        if self._installation(vmid, config) is not None and not (upper / "usr/sbin/qemu-ga").exists():
            # the ISO install has no qemu-guest-agent until the guest installs it (the lab's package)
            raise LabNetError(f"VM {vmid}: no QEMU guest agent in the guest")
        ns = f"{self.lab.id}-{_tag_of(f'vm{int(vmid)}')}"
        res = _ip("-n", ns, "-j", "-s", "addr", "show", check=False)
        if res.returncode != 0:
            return []
        return agent_interfaces(json.loads(res.stdout or "[]"))

    def guest_file_read(self, node: str, vmid: int, config: dict, path: str) -> bytes:
        """The file as the VM host holds it: its own copy (the overlay's upper half), else the guest
        image's, read only while the guest's agent runs (the ISO install has none until it installs it)."""
        facts = self._running()
        if facts is None:
            return super().guest_file_read(node, vmid, config, path)
        name = f"vm{int(vmid)}"
        upper = self.lab.hosts_dir / name / "upper"
        if self._installation(vmid, config) is not None and not (upper / "usr/sbin/qemu-ga").exists():
            raise LabNetError(f"VM {vmid}: no QEMU guest agent in the guest")
        if not (self.lab.hosts_dir / name / "state").is_dir():
            raise LabNetError(f"VM {vmid}: its host is not running")
        inner = Path(path).relative_to("/") if path.startswith("/") else Path(path)
        lower = Path(facts.get("guest_image") or "/")
        for half in (upper, lower):
            target = half / inner
            if target.exists() or target.is_symlink():
                return target.read_bytes()
        raise FileNotFoundError(2, "No such file or directory", path)


#: where an ISO guest sees its virtual disks' sizes (a view of STATE/net/hosts/vmN/state/hw)
ISO_GUEST_HW = "/run/gpulab-sim/hw"


def iso_guest_tools() -> dict[str, str]:
    """The disk stand-ins of an ISO-installed guest (:mod:`labsim.net.disk_standins`) and their wrappers."""
    from labsim.net import command_standins, disk_standins

    script = "/usr/local/lib/gpulab/disk.py"
    files = {script: Path(disk_standins.__file__).read_text()}
    for cmd, path in disk_standins.PATHS.items():
        files[path] = command_standins.wrapper(cmd, script)
    return files


def _write_iso_installation(upper: Path, installed: dict[str, Any], router: str) -> None:
    """What the Ubuntu installer left on the disk, written once (the guest changes it afterwards): the disk
    layout, and apt's package lists of the archive the guest installed from (the installer runs apt-get update
    against its mirror, so a guest that has run since can plan an install before its own first update, as a
    check run's apt does)."""
    from labsim.net import disk_standins

    marker = upper / "etc" / "gpulab-sim" / "installed.json"
    if marker.exists():
        return
    _seed_apt_lists(upper, router)
    layout = disk_standins.install_layout(
        int(installed["disk"]["installed_bytes"]), installed["firmware"] == "efi"
    )
    target = upper / disk_standins.LAYOUT.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    _write_json(target, layout)
    marker.parent.mkdir(parents=True, exist_ok=True)
    info = {k: installed[k] for k in ("os", "install", "user", "firmware")}
    _write_json(marker, {**info, "installed_bytes": installed["disk"]["installed_bytes"]})


def _seed_apt_lists(upper: Path, router: str) -> None:
    """apt-get update of the guest's sources (``_vm_files``) from this machine into the guest's lists folder."""
    lists = upper / "var" / "lib" / "apt" / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    sources = upper / "etc" / "apt" / "sources.list"
    sources.parent.mkdir(parents=True, exist_ok=True)
    if not sources.exists():
        sources.write_text(_vm_files(router)["/etc/apt/sources.list"])
    cache = upper / "var" / "cache" / "apt"
    cache.mkdir(parents=True, exist_ok=True)
    options = {
        "Dir::Etc::SourceList": str(sources),
        "Dir::Etc::SourceParts": "/dev/null",
        "Dir::State::Lists": str(lists),
        "Dir::Cache": str(cache),
        "Dir::State::status": "/dev/null",
        "APT::Sandbox::User": "root",
        f"Acquire::http::Proxy::{router}": "DIRECT",
        "Acquire::Retries": "0",
    }
    argv = ["apt-get", "-q", "update"] + [a for k, v in options.items() for a in ("-o", f"{k}={v}")]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if res.returncode != 0:
        raise LabNetError(f"the ISO guest's apt lists: `apt-get update` failed: {res.stderr.strip()[-400:]}")


def _drive_size(drive: str) -> int:
    """Bytes of a drive's ``size=`` (``60G``, ``3137758K``); 0 when it has none."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    for part in drive.split(","):
        k, _, v = part.partition("=")
        if k == "size" and v:
            with contextlib.suppress(ValueError):
                return int(float(v[:-1]) * units[v[-1].upper()]) if v[-1].isalpha() else int(v)
    return 0


def _bootdisk_gb(config: dict[str, Any]) -> float:
    """Size of the boot disk from ``scsi0``/``virtio0``/... ``size=60G`` (0 when not given)."""
    units = {"K": 1 / 2**20, "M": 1 / 2**10, "G": 1, "T": 2**10}
    for key in ("scsi0", "virtio0", "sata0", "ide0"):
        for part in str(config.get(key, "")).split(","):
            k, _, v = part.partition("=")
            if k == "size" and v:
                with contextlib.suppress(ValueError):
                    return (
                        float(v[:-1]) * units.get(v[-1].upper(), 1) if v[-1].isalpha() else float(v) / 2**30
                    )
    return 0.0


def agent_interfaces(ip_json: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`ip -j -s addr` output in the guest agent's network-get-interfaces format."""
    result = []
    for link in ip_json:
        addrs = [
            {
                "ip-address": a["local"],
                "ip-address-type": "ipv4" if a.get("family") == "inet" else "ipv6",
                "prefix": a.get("prefixlen"),
            }
            for a in link.get("addr_info", [])
            if a.get("family") in ("inet", "inet6")
        ]
        s64 = link.get("stats64", {})
        rx, tx = s64.get("rx", {}), s64.get("tx", {})
        entry: dict[str, Any] = {
            "name": link["ifname"],
            "hardware-address": link.get("address", "00:00:00:00:00:00"),
            "statistics": {
                "rx-bytes": rx.get("bytes", 0),
                "rx-dropped": rx.get("dropped", 0),
                "rx-errs": rx.get("errors", 0),
                "rx-packets": rx.get("packets", 0),
                "tx-bytes": tx.get("bytes", 0),
                "tx-dropped": tx.get("dropped", 0),
                "tx-errs": tx.get("errors", 0),
                "tx-packets": tx.get("packets", 0),
            },
        }
        if addrs:
            entry["ip-addresses"] = addrs
        result.append(entry)
    return result


# at each boot of a VM: the NVIDIA kernel module "loads" when a module package installed it (its kind goes to
# nvidia-loaded), except a DKMS-built one under Secure Boot, which the kernel refuses ("Key was rejected by
# service": shared/reference/guest-stack.md 2.4), and Canonical's signed modules built for another kernel than the
# one the VM runs (the 4th word of the marker, against labsim.net.guest_kernel's release file): the kernel has no
# nvidia module then
VM_BOOT_HOOK = [
    "sh",
    "-c",
    'M="$GPULAB_HOST_ROOT/usr/lib/gpulab-sim/nvidia-module-installed"; '
    'F="$GPULAB_HOST_ROOT/etc/gpulab-sim/firmware.json"; '
    'K="$(cat "$GPULAB_HOST_ROOT/etc/gpulab-sim/kernel" 2>/dev/null)"; '
    'if [ -e "$M" ] && ! { grep -q dkms "$M" && grep -q \'"secure_boot": true\' "$F" 2>/dev/null; }; then'
    ' set -- $(head -n 1 "$M"); if [ -z "$4" ] || [ "$4" = "$K" ]; then'
    ' cp "$M" "$GPULAB_HOST_ROOT/run/gpulab/nvidia-loaded"; fi; fi',
]


SSHD_UNIT = """[Unit]
Description=OpenSSH server of this gpulab lab host (listens on the lab address only)
After=network.target

[Service]
ExecStart=/usr/sbin/sshd -D -e -f /etc/ssh/gpulab_sshd_config
ExecReload=/bin/kill -HUP $MAINPID
RuntimeDirectory=sshd
RuntimeDirectoryMode=0755
Restart=always

[Install]
WantedBy=multi-user.target
"""
#: units of the machine's own installation that a lab VM must not run (network is set up from outside,
#: /dev/console is /dev/null, udev has no devices to manage, the machine's daemons are not the VM's)
MASKED_UNITS = (
    "systemd-networkd.service", "systemd-networkd.socket", "systemd-networkd-wait-online.service",
    "systemd-resolved.service", "console-getty.service", "getty@tty1.service", "serial-getty@ttyS0.service",
    "systemd-udevd.service", "systemd-udev-trigger.service", "systemd-udev-settle.service",
    "systemd-udevd-control.socket", "systemd-udevd-kernel.socket", "ssh.service", "ssh.socket",
    "networking.service", "ifupdown-pre.service",
)  # fmt: skip


def _systemd_files(image_root: Path) -> dict[str, str]:
    """A systemd VM's units: our sshd, the image's enabled units hidden (opaque), noisy units masked."""
    files: dict[str, str] = {"/etc/systemd/system/gpulab-sshd.service": SSHD_UNIT}
    with contextlib.suppress(OSError):
        for entry in os.listdir(image_root / "etc/systemd/system"):
            if entry.endswith(".wants"):
                files[f"/etc/systemd/system/{entry}"] = "@opaque"
    files["/etc/systemd/system/multi-user.target.wants"] = "@opaque"
    files["/etc/systemd/system/multi-user.target.wants/gpulab-sshd.service"] = (
        "@symlink:../gpulab-sshd.service"
    )
    for unit in MASKED_UNITS:
        files[f"/etc/systemd/system/{unit}"] = "@symlink:/dev/null"
    # the guest keeps "its clock in sync" as a real one would, but never touches the machine's clock
    files["/etc/systemd/system/systemd-timesyncd.service.d/gpulab-lab.conf"] = TIMESYNCD_DROPIN
    # enabled in an Ubuntu image (the opaque sysinit.target.wants hid the image's own link)
    files["/etc/systemd/system/sysinit.target.wants/systemd-timesyncd.service"] = (
        "@symlink:/lib/systemd/system/systemd-timesyncd.service"
    )
    return files


TIMESYNCD_DROPIN = """# gpulab lab: a container shares the machine's clock, so this unit runs a stand-in that only stays up
[Unit]
ConditionVirtualization=
ConditionCapability=

[Service]
Type=simple
WatchdogSec=0
AmbientCapabilities=
CapabilityBoundingSet=
ExecStart=
ExecStart=/bin/sleep infinity
"""


#: seconds the unattended-upgrades stand-in holds apt's locks after each VM boot (fixture
#: ``network.guest_apt_hold_s``; 0: it does not run): short, since every lab VM meets it
DEFAULT_APT_HOLD_S = 25
#: the environment variable that replaces :data:`DEFAULT_APT_HOLD_S` where the fixture names no hold: the test
#: session's labs (tests/conftest.py) meet the same wait, shorter, on each of their many fresh converges
APT_HOLD_ENV = "GPULAB_LAB_APT_HOLD_S"
#: where the stand-in is (:mod:`labsim.net.unattended_upgrades`), as Ubuntu's unattended-upgrades package has it
UNATTENDED_UPGRADE = "/usr/bin/unattended-upgrade"
#: a systemd VM starts it at boot as Ubuntu's apt-daily-upgrade.service would (there through a timer that fires
#: soon after a boot, Persistent=true); Type=simple so that the boot is not held up by it
APT_DAILY_UPGRADE_UNIT = f"""[Unit]
Description=Daily apt upgrade and clean activities (gpulab lab: unattended-upgrades' stand-in after boot)
Documentation=man:apt(8)

[Service]
Type=simple
ExecStart={UNATTENDED_UPGRADE}
KillMode=process

[Install]
WantedBy=multi-user.target
"""


def apt_hold_s(fixture: dict[str, Any]) -> float:
    """The fixture's ``network.guest_apt_hold_s`` (seconds, 0 or more), else $GPULAB_LAB_APT_HOLD_S
    (:data:`APT_HOLD_ENV`), else :data:`DEFAULT_APT_HOLD_S`."""
    value = (fixture.get("network") or {}).get("guest_apt_hold_s")
    where = "network.guest_apt_hold_s"
    if value is None and os.environ.get(APT_HOLD_ENV):
        value, where = os.environ[APT_HOLD_ENV], APT_HOLD_ENV
    try:
        hold = float(DEFAULT_APT_HOLD_S if value is None else value)
    except ValueError:
        hold = -1.0
    if hold < 0:
        raise LabNetError(f"{where} must be 0 or more seconds (got {value})")
    return hold


def _unattended_upgrades(hold_s: float, systemd: bool) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The unattended-upgrades stand-in of a VM: its files, and (without systemd) its one-shot boot service."""
    from labsim.net import unattended_upgrades

    if hold_s <= 0:
        return {}, []
    files = {
        UNATTENDED_UPGRADE: Path(unattended_upgrades.__file__).read_text(),
        unattended_upgrades.CONFIG: json.dumps({"hold_s": hold_s}) + "\n",
    }
    if systemd:
        files["/etc/systemd/system/apt-daily-upgrade.service"] = APT_DAILY_UPGRADE_UNIT
        files["/etc/systemd/system/multi-user.target.wants/apt-daily-upgrade.service"] = (
            "@symlink:../apt-daily-upgrade.service"
        )
        return files, []
    return files, [{"name": "unattended-upgrades", "argv": [UNATTENDED_UPGRADE], "once": True}]


def _vm_tools(image_root: Path, systemd: bool, apt_hold_s: float = 0) -> tuple[dict[str, str], list]:
    """The lab's tools in a VM (rewritten at each start): systemd units or power stand-ins, cloud-init, the
    unattended-upgrades stand-in; and the services its PID 1 starts at boot (without systemd)."""
    from labsim.net import node_host

    tools = (
        {**_systemd_files(image_root), **node_host.guest_standins(power=False)}
        if systemd
        else node_host.guest_standins()
    )
    tools["/usr/bin/cloud-init"] = node_host.CLOUD_INIT_STANDIN
    files, services = _unattended_upgrades(apt_hold_s, systemd)
    tools.update(files)
    return tools, services


def _vm_files(router: str) -> dict[str, str]:
    """A VM's "installation" over the guest image: apt pointed at the lab's archive (its mirror setting)."""
    # directories every Ubuntu guest has
    files: dict[str, str] = {"/etc/modprobe.d": "@dir", "/etc/modules-load.d": "@dir"}
    files["/etc/apt/sources.list"] = f"deb [trusted=yes] http://{router}/ubuntu ./\n"
    files["/etc/apt/apt.conf.d/99gpulab-lab"] = (
        f'Acquire::http::Proxy::{router} "DIRECT";\nAcquire::Retries "0";\n'
    )
    return files


def vm_firmware(config: dict[str, Any]) -> dict[str, bool]:
    """UEFI or BIOS, and Secure Boot (OVMF with a 4m EFI disk whose keys are pre-enrolled; PVE's default is 0)."""
    efi = str(config.get("bios", "seabios")) == "ovmf"
    parts = {p.partition("=")[0]: p.partition("=")[2] for p in str(config.get("efidisk0", "")).split(",")}
    enrolled = parts.get("pre-enrolled-keys") == "1" and parts.get("efitype") == "4m"
    return {"efi": efi, "secure_boot": efi and enrolled}


GPU_MEMORY_MIB = {"0x2204": 24576, "0x2230": 49140, "0x2684": 24564, "0x20b5": 81920, "0x2504": 12288}


def vm_gpus(config: dict[str, Any], fixture: dict[str, Any], node: str) -> list[dict[str, Any]]:
    """The GPUs a VM's ``hostpciN`` entries pass through, as the guest's nvidia-smi sees them: one card per
    entry that holds one of the node's NVIDIA display devices, in hostpci0, hostpci1, ... order, each with a
    UUID of its own (stable per node and card address). An entry names its card by address (``0000:02:00``,
    ``host=...``; the hooks get mapped entries with the address their mapping gives on the node, see
    ``PveApiSim.hook_config``); a mapped entry without an address takes the node's next NVIDIA card."""
    import uuid

    keys = sorted(
        (k for k in config if k.startswith("hostpci") and k[7:].isdigit()), key=lambda k: int(k[7:])
    )
    if not keys:
        return []
    nodes = {n["name"]: n for n in fixture.get("nodes", [])}
    pci = (nodes.get(node) or fixture["nodes"][0]).get("pci", [])
    cards = [
        d for d in pci if str(d.get("vendor")) == "0x10de" and str(d.get("class", "")).startswith("0x03")
    ]
    chosen: list[dict[str, Any]] = []
    for key in keys:
        parts = str(config[key]).split(",")
        host = next((p.removeprefix("host=") for p in parts if p.startswith("host=") or "=" not in p), None)
        if host:
            paths = [p if p.count(":") == 2 else "0000:" + p for p in host.split(";")]
            hit = [d for d in cards if any(p in (d["id"], d["id"].rsplit(".", 1)[0]) for p in paths)]
        elif any(p.startswith("mapping=") for p in parts):
            hit = [d for d in cards if d not in chosen][:1]
        else:
            hit = []
        chosen += [d for d in hit[:1] if d not in chosen]
    gpus = []
    for dev in chosen:
        name = str(dev.get("device_name", "GPU"))
        if "[" in name:
            name = name[name.index("[") + 1 : name.rindex("]")]
        gpus.append(
            {
                "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpulab-lab:{node}:{dev["id"]}')}",
                "name": name if name.startswith("NVIDIA") else f"NVIDIA {name}",
                "memory_mib": int(dev.get("memory_mib") or GPU_MEMORY_MIB.get(str(dev.get("device")), 0)),
                "pci_bus_id": f"00000000:{len(gpus) + 1:02X}:00.0",
                "host_address": dev["id"],
                # the only NVIDIA kernel modules that find this card (fixture key; unset: either)
                "kernel_modules": dev.get("kernel_modules"),
            }
        )
    return gpus


def make_hooks(state_dir: Path, fixture: dict[str, Any]) -> VmHooks:
    """Hooks for the PVE simulator: real VM hosts when run as root, the API-only hooks otherwise."""
    if os.geteuid() != 0:
        return VmHooks(fixture)
    return NetVmHooks(state_dir, fixture)
