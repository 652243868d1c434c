"""kube-vip on the stand-in (class ``KubeVip``).

While the manifests hold kube-vip's DaemonSet with a VIP in ARP mode for the control plane, the server that
leads (the etcd leader, standing in for the holder of kube-vip's Lease; the one server on SQLite) adds
``VIP/32`` to the DaemonSet's ``vip_interface`` (else its default route's), announces it with gratuitous ARP
(AF_PACKET) and answers the API on it; a server that stops leading or stops (SIGTERM) lets it go, and another
takes it once etcd has elected it (a few seconds). Without a quorum nobody holds it. ``get daemonsets`` lists
the manifests' DaemonSets.
"""

import contextlib
import http.server
import json
import socket
import sys
import threading
import time

from . import open_webui_chart
from .cluster import manifest_docs
from .common import truthy
from .etcd import etcd_addons

KUBE_VIP_TICK_S = 0.5
# gratuitous ARPs sent when this server takes the VIP (kube-vip sends a few, then repeats them)
GARP_COUNT = 3


def kube_vip_spec(docs):
    """The control-plane VIP kube-vip's DaemonSet in the manifests asks for in ARP mode: {address, interface,
    leader_election}, or None (no such DaemonSet, no address, or not ARP/control plane/hostNetwork)."""
    for d in docs:
        if d.get("kind") != "DaemonSet":
            continue
        spec = ((d.get("spec") or {}).get("template") or {}).get("spec") or {}
        for c in spec.get("containers") or []:
            if "kube-vip" not in str(c.get("image", "")):
                continue
            env = {e.get("name"): str(e.get("value")) for e in c.get("env") or [] if "value" in e}
            if (
                truthy(env.get("vip_arp"))
                and truthy(env.get("cp_enable"))
                and env.get("address")
                and truthy(spec.get("hostNetwork"))
            ):
                return {
                    "address": env["address"],
                    "interface": env.get("vip_interface") or "",
                    "leader_election": truthy(env.get("vip_leaderelection")),
                    "services": truthy(env.get("svc_enable")),
                }
    return None


def service_addresses(state):
    """With kube-vip's Service load balancer on (svc_enable), what its leader announces for LoadBalancer Services:
    (address, port) -> (node address, port) of the Ready pod behind it, for each Service of kube-vip's class that
    names its address (kube-vip.io/loadbalancerIPs; the stand-in's pods carry their Services' ports, module
    engine). kube-proxy carries a connection to the pod; the stand-in forwards it to the pod's node, where the
    engine stand-in answers."""
    out = {}
    for pod in state.get("pods") or []:
        node = (state.get("nodes") or {}).get(pod.get("node") or "") or {}
        if pod.get("ready") is None or not node.get("address"):
            continue
        for lan in pod.get("lan_ports") or []:
            if lan.get("address"):
                out[(lan["address"], int(lan["port"]))] = (node["address"], int(lan["port"]))
    # Open WebUI's pod answers on every server's address (module open_webui_chart): the first server's
    servers = sorted(
        n["address"]
        for n in (state.get("nodes") or {}).values()
        if n.get("address") and "node-role.kubernetes.io/control-plane" in (n.get("role_labels") or {})
    )
    for address, port in open_webui_chart.lan_ports(state.get("services") or {}):
        if address and servers:
            out[(address, port)] = (servers[0], port)
    return out


def forward(address, port, target):
    """A TCP listener on address:port that carries each connection to `target` (host, port); returns it."""
    import socketserver

    class Pipe(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                upstream = socket.create_connection(target, timeout=10)
            except OSError:
                return
            with upstream:
                threading.Thread(target=self.pump, args=(upstream, self.request), daemon=True).start()
                self.pump(self.request, upstream)

        @staticmethod
        def pump(src, dst):
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    server = Server((address, port), Pipe)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def default_interface():
    """The interface of the default route ('' without one), where kube-vip holds a VIP with no vip_interface."""
    import subprocess

    out = subprocess.run(
        ["ip", "-4", "-j", "route", "show", "default"], capture_output=True, text=True
    ).stdout
    routes = json.loads(out or "[]")
    return routes[0].get("dev", "") if routes else ""


def link_mac(iface):
    import subprocess

    out = subprocess.run(["ip", "-j", "link", "show", "dev", iface], capture_output=True, text=True).stdout
    links = json.loads(out or "[]")
    return bytes.fromhex(links[0]["address"].replace(":", "")) if links else None


def gratuitous_arp(address, iface, count=GARP_COUNT):
    """Announce `address` at `iface`'s MAC to the LAN: gratuitous ARP requests and replies (sender and target the
    VIP, to the broadcast address) through an AF_PACKET socket, as kube-vip's ARP mode does, so that every
    neighbour's cache moves to this server at once. Returns the frames sent."""
    import struct

    mac = link_mac(iface)
    if mac is None:
        return 0
    ip = socket.inet_aton(address)
    sent = 0
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((iface, 0))
        for _ in range(count):
            for op, target in ((1, b"\x00" * 6), (2, b"\xff" * 6)):
                arp = struct.pack("!HHBBH", 1, 0x0800, 6, 4, op) + mac + ip + target + ip
                sock.send(b"\xff" * 6 + mac + b"\x08\x06" + arp)
                sent += 1
    return sent


class KubeVip:
    """kube-vip's DaemonSet on this server (hostNetwork, ARP mode, leader election): while the cluster's manifests
    hold kube-vip with a VIP and this server leads (the etcd leader stands in for the holder of kube-vip's Lease
    plndr-cp-lock; one server on SQLite always leads), the VIP is on its LAN interface as ``ADDRESS/32``, announced
    with gratuitous ARP, and the API answers on it. A server that stops leading, or stops (SIGTERM: ``systemctl
    stop k3s``), lets it go; without a quorum nobody holds it, as kube-vip cannot renew its Lease then."""

    def __init__(self, cluster, port, handler, log=None):
        self.cluster, self.port, self.handler = cluster, port, handler
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.held = None  # (address, interface)
        self.server = None
        self.lock = threading.Lock()
        self.services = {}  # (address, port) -> (target, forwarder) of the Service addresses held (svc_enable)

    def wanted(self):
        etcd = self.cluster.etcd
        with self.cluster.lock:
            docs = etcd_addons(self.cluster.state, etcd.members) if etcd is not None else manifest_docs()
        spec = kube_vip_spec(docs)
        if spec is None or not (etcd is None or etcd.is_leader()):
            self.wanted_services = {}
            return None
        with self.cluster.lock:
            self.wanted_services = service_addresses(self.cluster.state) if spec.get("services") else {}
        return spec["address"], spec["interface"] or default_interface()

    def step(self):
        want = self.wanted()
        with self.lock:
            if want != self.held:
                self._release()
                if want is not None and want[1]:
                    self._take(*want)
            self._services(self.wanted_services if self.held else {})

    def _services(self, wanted):
        """Hold the Service addresses kube-vip announces (on the VIP's interface), each forwarded to its pod."""
        import subprocess

        for key in [k for k, (target, _) in self.services.items() if wanted.get(k) != target]:
            _, server = self.services.pop(key)
            server.shutdown()
            server.server_close()
            if not any(k[0] == key[0] for k in self.services):
                subprocess.run(["ip", "addr", "del", f"{key[0]}/32", "dev", self.held[1] if self.held else ""],
                               capture_output=True)  # fmt: skip
        for key, target in wanted.items():
            if key in self.services:
                continue
            iface = self.held[1]
            subprocess.run(["ip", "addr", "replace", f"{key[0]}/32", "dev", iface], capture_output=True)
            try:
                self.services[key] = (target, forward(key[0], key[1], target))
            except OSError as e:
                self.log(f'level=error msg="kube-vip: Service address {key[0]}:{key[1]}: {e}"')
                continue
            with contextlib.suppress(OSError):
                gratuitous_arp(key[0], iface)
            self.log(
                f'level=info msg="kube-vip: this server announces the Service address {key[0]}:{key[1]}"'
            )

    def _take(self, address, iface):
        import subprocess

        added = subprocess.run(
            ["ip", "addr", "replace", f"{address}/32", "dev", iface], capture_output=True, text=True
        )
        if added.returncode != 0:
            self.log(f'level=error msg="kube-vip: adding {address} to {iface}: {added.stderr.strip()}"')
            return
        try:
            server = http.server.ThreadingHTTPServer((address, self.port), self.handler)
        except OSError as e:
            subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", iface], capture_output=True)
            self.log(f'level=error msg="kube-vip: the API cannot listen on {address}:{self.port}: {e}"')
            return
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.server, self.held = server, (address, iface)
        try:
            gratuitous_arp(address, iface)
        except OSError as e:
            self.log(f'level=warning msg="kube-vip: gratuitous ARP for {address} on {iface}: {e}"')
        self.log(f'level=info msg="kube-vip: this server holds the VIP {address} on {iface}"')

    def _release(self):
        import subprocess

        if self.held is None:
            return
        self._services({})  # the Service addresses go with the VIP
        address, iface = self.held
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", iface], capture_output=True)
        self.server, self.held = None, None
        self.log(f'level=info msg="kube-vip: this server lets the VIP {address} go"')

    def release(self):
        with self.lock:
            self._release()

    def run(self):
        while True:
            try:
                self.step()
            except Exception as e:  # kube-vip's pod restarts; the stand-in says why and keeps trying
                self.log(f'level=error msg="kube-vip: {type(e).__name__}: {e}"')
            time.sleep(KUBE_VIP_TICK_S)
