"""Fixtures for the router tests: real DHCP servers and clients in network namespaces of our own.

Every namespace and link name starts with `gt4` plus the test process id, so parallel runs and other
test areas never collide, and everything is removed again even when a test fails. The LAN inside the
namespaces is 192.168.100.0/24 (the reference lab's); nothing is routed out of them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

LAN = "192.168.100.0/24"
ROUTER_IP = "192.168.100.1"
POOL = ("192.168.100.100", "192.168.100.200")
KEA_PW = "kea-S3cret-pw"
CLIENT_SCRIPT = Path(__file__).with_name("dhcp_client_hook.sh")


def _need_root(*tools):
    if os.geteuid() != 0:
        pytest.skip("needs root: runs real daemons (network namespaces, DHCP servers and clients, sshd)")
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}: apt-get install -y " + " ".join(missing))


def sh(*args, check=True, **kw):
    return subprocess.run(args, check=check, capture_output=True, text=True, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lan:
    """A router namespace and client namespaces joined by veth pairs through a bridge in the router ns."""

    def __init__(self, tag: str, workdir: Path):
        self.subnet = LAN
        self.pool = {"start": POOL[0], "end": POOL[1]}
        self.tag = tag
        self.dir = workdir
        self.router = f"gt4{tag}r"
        self.clients: dict[str, str] = {}  # mac -> netns
        self.procs: list[subprocess.Popen] = []
        sh("ip", "netns", "add", self.router)
        self._ns(self.router, "ip", "link", "set", "lo", "up")
        self._ns(self.router, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        self._ns(self.router, "ip", "link", "add", "br0", "type", "bridge", "forward_delay", "0")
        self._ns(self.router, "ip", "addr", "add", f"{ROUTER_IP}/24", "dev", "br0")
        self._ns(self.router, "ip", "link", "set", "br0", "up")

    @staticmethod
    def _ns(ns, *cmd, check=True):
        return sh("ip", "netns", "exec", ns, *cmd, check=check)

    def add_client(self, mac: str) -> str:
        n = len(self.clients)
        ns = f"gt4{self.tag}c{n}"
        sh("ip", "netns", "add", ns)
        self.clients[mac] = ns
        sh("ip", "link", "add", f"gt4{self.tag}v{n}", "netns", self.router, "type", "veth", "peer", "name",
           "eth0", "netns", ns, "address", mac)  # fmt: skip
        self._ns(self.router, "ip", "link", "set", f"gt4{self.tag}v{n}", "master", "br0", "up")
        self._ns(ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        self._ns(ns, "ip", "link", "set", "lo", "up")
        self._ns(ns, "ip", "link", "set", "eth0", "up")
        # DHCP replies over veth are dropped by the client unless TX checksum offload is off
        self._ns(ns, "ethtool", "-K", "eth0", "tx", "off", check=False)
        self._ns(self.router, "ethtool", "-K", f"gt4{self.tag}v{n}", "tx", "off", check=False)
        self._ns(self.router, "ethtool", "-K", "br0", "tx", "off", check=False)
        return ns

    def start(self, ns: str | None, argv: list[str], log: str, env=None) -> subprocess.Popen:
        prefix = ["ip", "netns", "exec", ns] if ns else []
        out = open(self.dir / log, "w")  # noqa: SIM115 (kept open for the daemon's lifetime)
        p = subprocess.Popen(
            [*prefix, *argv], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=env,
        )  # fmt: skip
        self.procs.append(p)
        return p

    def dhcp(self, mac: str, timeout: float = 20) -> str | None:
        """Run dhclient once on the client with this MAC (INIT-REBOOT when it holds a lease); its address."""
        ns = self.clients[mac]
        lf, pf = self.dir / f"{ns}.leases", self.dir / f"{ns}.pid"
        self._stop_dhclient(pf)
        env = dict(os.environ, GT4_LOG=str(self.dir / f"{ns}.events"))
        sh("ip", "netns", "exec", ns, "dhclient", "-4", "-1", "-sf", str(CLIENT_SCRIPT), "-lf", str(lf),
           "-pf", str(pf), "eth0", check=False, timeout=timeout, env=env)  # fmt: skip
        self._stop_dhclient(pf)
        return self.address(mac)

    @staticmethod
    def _stop_dhclient(pf: Path):
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            pid = int(pf.read_text().strip())
            if "dhclient" in Path(f"/proc/{pid}/comm").read_text():
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    if not Path(f"/proc/{pid}").exists():
                        break
                    time.sleep(0.02)
            pf.unlink()

    def address(self, mac: str) -> str | None:
        out = self._ns(self.clients[mac], "ip", "-4", "-o", "addr", "show", "dev", "eth0").stdout
        for line in out.splitlines():
            return line.split()[3].split("/")[0]
        return None

    def close(self):
        for ns in self.clients.values():
            self._stop_dhclient(self.dir / f"{ns}.pid")
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for ns in [*self.clients.values(), self.router]:
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture
def lan():
    _need_root("ip", "dhclient")
    # short: unix socket paths are limited to 107 bytes
    workdir = Path(tempfile.mkdtemp(prefix="gt4"))
    tag = f"{os.getpid() % 100000}"[-4:] + hex(int(time.time() * 1000) % 4096)[2:]
    net = Lan(tag, workdir)
    try:
        yield net
    finally:
        net.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def dnsmasq_router(lan):
    """dnsmasq serving the LAN from the router namespace, with a gpulab-owned dhcp-hostsfile."""
    _need_root("dnsmasq")
    d = lan.dir
    paths = {"hostsfile": str(d / "hosts"), "leasefile": str(d / "leases"), "pidfile": str(d / "dnsmasq.pid")}
    Path(paths["hostsfile"]).write_text("")
    Path(paths["leasefile"]).write_text("")
    lan.start(
        lan.router,
        ["dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--user=root", "--port=0",
         "--interface=br0", "--bind-interfaces", "--dhcp-authoritative",
         f"--dhcp-range={POOL[0]},{POOL[1]},255.255.255.0,2m", f"--dhcp-hostsfile={paths['hostsfile']}",
         f"--dhcp-leasefile={paths['leasefile']}", f"--pid-file={paths['pidfile']}",
         "--dhcp-option=3", "--dhcp-option=6",
         # no 3 s ping probe before each new address: the tests run many clients
         "--no-ping", "--log-dhcp", f"--log-facility={d / 'dnsmasq.log'}"],
        "dnsmasq.out",
    )  # fmt: skip
    for _ in range(100):
        if Path(paths["pidfile"]).exists() and Path(paths["pidfile"]).read_text().strip():
            break
        time.sleep(0.05)
    else:
        pytest.fail("dnsmasq did not start: " + (d / "dnsmasq.out").read_text())
    return paths


@pytest.fixture
def kea_router(lan):
    """kea-dhcp4 in the router namespace; its control agent on 127.0.0.1 here, joined by a unix socket."""
    _need_root("kea-dhcp4", "kea-ctrl-agent")
    d = lan.dir
    hooks = [p for p in Path("/usr/lib").glob("*/kea/hooks/libdhcp_lease_cmds.so")]
    sock = str(d / "k4.sock")
    conf = {
        "Dhcp4": {
            "interfaces-config": {"interfaces": ["br0"]},
            "control-socket": {"socket-type": "unix", "socket-name": sock},
            "lease-database": {
                "type": "memfile",
                "persist": True,
                "lfc-interval": 0,
                "name": str(d / "l4.csv"),
            },
            "valid-lifetime": 120,
            "authoritative": True,
            "hooks-libraries": [{"library": str(hooks[0])}] if hooks else [],
            "subnet4": [{"id": 1, "subnet": LAN, "pools": [{"pool": f"{POOL[0]} - {POOL[1]}"}]}],
            "loggers": [
                {"name": "kea-dhcp4", "severity": "INFO", "output_options": [{"output": str(d / "kea4.log")}]}
            ],
        }
    }
    port = free_port()
    agent = {
        "Control-agent": {
            "http-host": "127.0.0.1",
            "http-port": port,
            "control-sockets": {"dhcp4": {"socket-type": "unix", "socket-name": sock}},
            "authentication": {
                "type": "basic",
                "realm": "kea",
                "clients": [{"user": "gpulab", "password": KEA_PW}],
            },
            "loggers": [
                {
                    "name": "kea-ctrl-agent",
                    "severity": "INFO",
                    "output_options": [{"output": str(d / "ca.log")}],
                }
            ],
        }
    }
    (d / "kea4.json").write_text(json.dumps(conf, indent=2))
    (d / "ca.json").write_text(json.dumps(agent, indent=2))
    # Kea 2.6.2+ takes lease files, logs and sockets only from its own folders or these (the socket's
    # folder 0750 at most); Kea 2.2 ignores the variables
    d.chmod(0o750)
    dirs = ("PIDFILE", "LOCKFILE", "CONTROL_SOCKET", "DHCP_DATA", "LOG_FILE")
    env = dict(os.environ, **{f"KEA_{name}_DIR": str(d) for name in dirs})
    lan.start(lan.router, ["kea-dhcp4", "-c", str(d / "kea4.json")], "kea4.out", env=env)
    for _ in range(100):
        if Path(sock).exists():
            break
        time.sleep(0.05)
    lan.start(None, ["kea-ctrl-agent", "-c", str(d / "ca.json")], "ca.out", env=env)
    import requests

    url = f"http://127.0.0.1:{port}/"
    for _ in range(100):
        with contextlib.suppress(requests.RequestException):
            r = requests.post(
                url, json={"command": "version-get", "service": ["dhcp4"]}, auth=("gpulab", KEA_PW), timeout=2
            )
            if r.ok and r.json()[0]["result"] == 0:
                break
        time.sleep(0.1)
    else:
        pytest.fail("Kea did not come up: " + (d / "kea4.out").read_text() + (d / "ca.out").read_text())
    return {
        "url": url,
        "user": "gpulab",
        "password": KEA_PW,
        "config": str(d / "kea4.json"),
        "log": str(d / "kea4.log"),
    }


@pytest.fixture
def sshd(tmp_path):
    """A real sshd on 127.0.0.1 (a free port) that lets in one throw-away key as root."""
    _need_root("sshd", "ssh-keygen")
    d = Path(tempfile.mkdtemp(prefix="gt4s"))
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key"))
    sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key"))
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    os.chmod(d, 0o700)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "w"), start_new_session=True)  # noqa: SIM115 # fmt: skip
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("sshd did not start: " + (d / "sshd.log").read_text())
        yield {"host": "127.0.0.1", "port": port, "key_file": str(d / "client_key"), "dir": d}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
        shutil.rmtree(d, ignore_errors=True)
