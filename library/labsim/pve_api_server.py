"""HTTPS front of the simulated PVE API (standard library http.server + ssl).

``python -m labsim.pve_api_server --state DIR [--fixture FILE] [--port N]`` serves
``https://127.0.0.1:PORT/api2/json/...``; when it is listening it prints one JSON line (the lab
description) on stdout and then writes its own output to ``STATE/server.log``. `labsim.cli` starts
it in the background. Every API request is appended to ``STATE/pve-requests.jsonl``.

Served besides the API: ``GET|PUT /_lab/faults`` (root@pam ticket only), the fault injection settings; and,
on a port of its own, the lab's internet for the controller (labsim.internet; ``internet_proxy`` in the lab
description).

The node's own tools (``pvesh``, ``pveum``, ``pvenode`` of the lab's node host, which real PVE runs
in-process as root) reach the same API through ``STATE/node-api/api.sock`` (plain HTTP on a Unix socket,
no fault injection: real pvesh does not pass through pveproxy), with the root@pam password the server
writes beside it in ``STATE/node-api/root.json`` (mode 0600). The lab binds that folder into the node host
(:data:`NODE_API_DIR`, :mod:`labsim.net.node_host`); a Unix socket crosses the network namespace.

The node's own address answers too, as a real node's pveproxy does on port 8006: the same HTTPS API (same
certificate, authentication and injected faults as ``127.0.0.1:PORT``) is served on a second socket in that
folder, ``STATE/node-api/pveproxy.sock``, and the node host's ``pveproxy`` service
(:mod:`labsim.net.pveproxy`) forwards its TCP port 8006 there. Those requests are logged with
``"listener": "node:8006"``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import signal
import socket
import socketserver
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from labsim import seed
from labsim.certs import ensure_certificate, fingerprint
from labsim.fixture import load_fixture
from labsim.internet import InternetProxy
from labsim.pve_api import PveApiSim
from labsim.pve_auth import Access, AuthError, PermissionDenied, new_credentials
from labsim.pve_common import ApiError
from labsim.pve_faults import Faults
from labsim.pve_schema import load_schema
from labsim.vm_hooks import VmHooks

API_PREFIX = "/api2/json"
NODE_API_DIR = "node-api"  # in STATE: the node tools' socket and root credential
NODE_API_SOCKET = "api.sock"
NODE_API_CREDENTIALS = "root.json"
#: the HTTPS API for the node's own address (``https://NODE:8006``), forwarded by the node's pveproxy
NODE_PROXY_SOCKET = "pveproxy.sock"
SECRET_PARAM = re.compile(r"pass|secret|ticket|token|key", re.I)


def _mask(params: dict[str, Any]) -> dict[str, Any]:
    return {k: ("********" if SECRET_PARAM.search(k) and k != "sshkeys" else v) for k, v in params.items()}


class PveApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, addr, lab: PveApiSim, access: Access, faults: Faults, log_path: Path):
        super().__init__(addr, Handler)
        self.lab = lab
        self.access = access
        self.faults = faults
        self.log_path = log_path
        self.log_lock = threading.Lock()
        self._log_fh = open(log_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the server

    ssl_context: ssl.SSLContext | None = None

    def get_request(self):
        """Accept, and leave the TLS handshake to the request's own thread (a slow client blocks no one)."""
        sock, addr = self.socket.accept()
        # Headers and body leave in two writes: without this, Nagle plus delayed ACK add ~40 ms per answer.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def log_request_line(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True, default=str)
        with self.log_lock:
            self._log_fh.write(line + "\n")

    def server_close(self) -> None:
        super().server_close()
        self._log_fh.close()
        internet = getattr(self, "internet", None)
        if internet is not None:
            internet.stop()


class _NoFaults:
    """The node-local channel passes no proxy, so it gets none of the proxy's injected faults."""

    @staticmethod
    def for_request(method: str, path: str):
        return 0, None


class _UnixApiServer(socketserver.ThreadingUnixStreamServer):
    """The API of a :class:`PveApiServer` (same simulator, access and request log) on a Unix socket at `path`
    (mode 0600), served by `handler`; each request log line gets `mark` added."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, path: Path, main: PveApiServer, handler: type, faults: Any, mark: dict[str, str]):
        path.unlink(missing_ok=True)
        super().__init__(str(path), handler)
        os.chmod(path, 0o600)
        self.lab, self.access, self.faults = main.lab, main.access, faults
        self._main, self._mark = main, mark

    def log_request_line(self, record: dict[str, Any]) -> None:
        self._main.log_request_line({**record, **self._mark})


class NodeApiServer(_UnixApiServer):
    """The plain-HTTP API for the node's own tools (pvesh, pveum, pvenode), without injected faults; its
    request log lines are marked as calls of the node's own tools."""

    def __init__(self, path: Path, main: PveApiServer):
        super().__init__(path, main, NodeHandler, _NoFaults(), {"via": "node"})


class ProxyApiServer(_UnixApiServer):
    """The HTTPS API of :class:`PveApiServer` (its certificate and faults too): what the node host's pveproxy
    forwards its port 8006 to."""

    def __init__(self, path: Path, main: PveApiServer):
        super().__init__(path, main, ProxyHandler, main.faults, {"listener": "node:8006"})
        self.ssl_context = main.ssl_context

    def get_request(self):
        sock, addr = self.socket.accept()
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: PveApiServer
    server_version = "pve-api-daemon/3.0"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        return  # requests go to pve-requests.jsonl instead

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # ---------------------------------------------------------------------------------------------
    def _params(self, method: str) -> dict[str, Any]:
        url = urlsplit(self.path)
        pairs = parse_qsl(url.query, keep_blank_values=True)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        params: dict[str, Any] = {}
        if body:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
            if ctype == "application/json":
                try:
                    data = json.loads(body)
                except ValueError as exc:
                    raise ApiError(400, f"unable to parse JSON body: {exc}") from exc
                if not isinstance(data, dict):
                    raise ApiError(400, "JSON body must be an object")
                params.update({k: v for k, v in data.items() if v is not None})
            else:
                pairs += parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        for k, v in pairs:
            if k in params:
                params[k] = (params[k] if isinstance(params[k], list) else [params[k]]) + [v]
            else:
                params[k] = v
        return params

    def _serve(self, method: str) -> None:
        started = time.monotonic()
        path = urlsplit(self.path).path
        status, payload, params, user = 500, {"data": None}, {}, None
        srv = self.server
        try:
            delay, failure = srv.faults.for_request(method, path)
            if delay:
                time.sleep(delay)
            if failure == "reset":
                self._reset()
                srv.log_request_line(
                    {
                        "time": time.time(),
                        "method": method,
                        "path": path,
                        "status": "reset",
                        "duration": round(time.monotonic() - started, 4),
                        "fault": True,
                    }
                )
                return
            params = self._params(method)
            if failure is not None:
                raise ApiError(int(failure), srv.faults.message())
            if path.startswith("/_lab/"):
                status, payload = self._lab_control(method, path, params)
            elif not path.startswith(API_PREFIX + "/"):
                raise ApiError(501, f"Method '{method} {path}' not implemented")
            else:
                api_path = path[len(API_PREFIX) :].rstrip("/") or "/"
                status, payload, user = self._api(method, api_path, params)
        except ApiError as exc:
            status = exc.status
            payload = {
                "data": None,
                "message": exc.message + ("\n" if not exc.message.endswith("\n") else ""),
            }
            if exc.errors:
                payload["errors"] = exc.errors
        except Exception as exc:  # never leave a client without an answer
            status, payload = 500, {"data": None, "message": f"internal simulator error: {exc!r}\n"}
        # Logged before the answer goes out: a client that has its answer finds the request in the log.
        srv.log_request_line(
            {
                "time": time.time(),
                "method": method,
                "path": path,
                "params": _mask(params),
                "status": status,
                "user": user,
                "duration": round(time.monotonic() - started, 4),
            }
        )
        self._send(status, payload)

    def _api(self, method: str, path: str, params: dict[str, Any]):
        srv = self.server
        if path == "/access/ticket" and method == "POST":
            found = srv.lab.schema.method("/access/ticket", "POST")
            try:
                args = srv.lab.schema.validate(found, params)
            except Exception as exc:
                raise ApiError(400, "Parameter verification failed.", getattr(exc, "errors", None)) from exc
            try:
                data = srv.access.login(args["username"], args["password"], args.get("realm"))
            except AuthError as exc:
                raise ApiError(401, str(exc)) from exc
            return 200, {"data": data}, data["username"]
        found = srv.lab.schema.route(path)
        info = srv.lab.schema.method(found[0], method) if found else None
        if info and (info.get("permissions") or {}).get("user") == "world":
            who = None  # e.g. GET /access/ticket: answered without credentials, as PVE does
        else:
            try:
                who = srv.access.authenticate(self.headers, method)
            except AuthError as exc:
                raise ApiError(401, str(exc)) from exc
        try:
            data, extra = srv.lab.call(method, path, params, who)
        except PermissionDenied as exc:
            raise ApiError(403, str(exc)) from exc
        return 200, {"data": data, **extra}, who.userid if who else None

    def _lab_control(self, method: str, path: str, params: dict[str, Any]):
        srv = self.server
        try:
            who = srv.access.authenticate(self.headers, method)
        except AuthError as exc:
            raise ApiError(401, str(exc)) from exc
        if not who.is_root_ticket:
            raise ApiError(403, "Permission check failed (/_lab, root@pam only)")
        if path.rstrip("/") != "/_lab/faults":
            raise ApiError(501, f"Method '{method} {path}' not implemented")
        if method == "PUT":
            srv.faults.replace(
                {
                    k: (json.loads(v) if isinstance(v, str) and v[:1] in '0123456789[{"' else v)
                    for k, v in params.items()
                }
            )
        elif method != "GET":
            raise ApiError(501, f"Method '{method} {path}' not implemented")
        return 200, {"data": srv.faults.snapshot()}

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode()
        reason = (payload.get("message") or "").split("\n")[0].encode("latin-1", "replace").decode("latin-1")
        self.send_response(status, reason or None)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "max-age=0")
        self.send_header("Pragma", "no-cache")
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        """Close the connection without an answer (RST), as a crashing proxy would."""
        import struct

        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.close()


class NodeHandler(Handler):
    def address_string(self) -> str:
        return "node-api"


class ProxyHandler(Handler):
    def address_string(self) -> str:
        return "node:8006"


# ================================================================================================ lab set-up
def load_or_create_credentials(state_dir: Path, lab: PveApiSim) -> dict[str, Any]:
    with lab.lock:
        creds = lab.state.data.get("credentials")
        if not creds:
            creds = lab.state.data["credentials"] = new_credentials()
            lab.state.data["boot_time"] = int(time.time())
            lab.state.mark()
        return creds


def make_hooks(
    state_dir: Path, fixture: dict[str, Any], api_only: bool = False
) -> tuple[VmHooks, str | None]:
    """The hooks network_lab offers when running as root, else the API-only ones (with the reason)."""
    if api_only:
        return VmHooks(fixture), "API-only lab: VMs get API-only hooks"
    if os.environ.get("GPULAB_LAB_API_ONLY"):
        return VmHooks(fixture), "GPULAB_LAB_API_ONLY is set: VMs get API-only hooks"
    if os.geteuid() != 0:
        return VmHooks(fixture), "not root: VMs get API-only hooks (no real hosts)"
    try:
        from labsim import network_lab  # type: ignore[attr-defined]
    except ImportError:
        return VmHooks(fixture), "labsim.network_lab is not available: VMs get API-only hooks"
    factory = getattr(network_lab, "make_hooks", None)
    if factory is None:
        return VmHooks(fixture), "labsim.network_lab has no make_hooks(): VMs get API-only hooks"
    return factory(state_dir, fixture), None


def lab_description(
    state_dir: Path, port: int, fixture: dict[str, Any], creds: dict[str, Any], fp: str
) -> dict:
    node = fixture["nodes"][0]["name"]
    return {
        "pve_url": f"https://127.0.0.1:{port}",
        "pve_host": "127.0.0.1",
        "pve_port": port,
        "node": node,
        "user": "root@pam",
        "password": creds["root_password"],
        "token_id": f"{creds['token_user']}!{creds['token_name']}",
        "token_user": creds["token_user"],
        "token_name": creds["token_name"],
        "token_secret": creds["token_secret"],
        "fingerprint": fp,
        "state_dir": str(Path(state_dir).resolve()),
        "fixture": fixture["_path"],
        "pid": os.getpid(),
    }


def resume_guests(lab: PveApiSim, state_dir: Path, timeout: float = 60.0) -> list[int]:
    """After a restart of a lab with real hosts, boot again the guests of the VMs PVE still has running.

    `gpulab lab down` ends every lab host; the API state keeps those VMs running (as a host that was
    suspended would). Once the lab's network is back (`gpulab lab up` brings it right after the server),
    each such VM's host is started again, so its agent answers; a VM whose host cannot start is marked
    stopped, as PVE would show a guest that died. Returns the VMIDs resumed."""
    if type(lab.hooks) is VmHooks:
        return []  # API-only lab: there is no host to boot
    with lab.lock:
        running = [
            (vm["node"], int(vmid), lab.hook_config(vm["node"], vm["config"]))
            for vmid, vm in lab.state.data["vms"].items()
            if vm.get("status") == "running"
        ]
    if not running:
        return []
    from labsim import network_lab

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        facts = network_lab.status(state_dir) or {}
        if facts.get("healthy") and facts.get("router"):
            break
        time.sleep(0.3)
    resumed = []
    for node, vmid, config in running:
        try:
            lab.hooks.vm_started(node, vmid, config)
            resumed.append(vmid)
        except Exception as exc:
            print(
                f"resume: the host of VM {vmid} did not come up again ({exc}); VM marked stopped", flush=True
            )
            with lab.lock:
                lab.state.data["vms"][str(vmid)].update(status="stopped", started_at=None, pci_in_use=[])
                lab.state.mark()
    return resumed


def node_api(state_dir: Path, server: PveApiServer, creds: dict[str, Any]) -> NodeApiServer:
    """The node tools' channel: the socket, and root@pam's credential beside it (both root's only)."""
    folder = Path(state_dir) / NODE_API_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    fd = os.open(folder / NODE_API_CREDENTIALS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"username": "root@pam", "password": creds["root_password"]}, fh)
    return NodeApiServer(folder / NODE_API_SOCKET, server)


def serve_node_api(server: PveApiServer) -> threading.Thread:
    """Serve the node tools' socket in a daemon thread (stopped with the main server's shutdown)."""
    thread = threading.Thread(
        target=server.node_api.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
    )
    thread.start()
    return thread


def serve_node_proxy(server: PveApiServer) -> threading.Thread:
    """Serve the HTTPS API for the node's port 8006 (:data:`NODE_PROXY_SOCKET`) in a daemon thread."""
    thread = threading.Thread(
        target=server.node_proxy.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
    )
    thread.start()
    return thread


def build(state_dir: Path, fixture_path: str | None, port: int = 0, api_only: bool = False):
    """Create the server (bound and ready to serve) and the lab description."""
    state_dir.mkdir(parents=True, exist_ok=True)
    fixture = load_fixture(fixture_path)
    cert, key = ensure_certificate(state_dir, fixture["nodes"][0]["name"])
    fp = fingerprint(cert)
    fixture["_fingerprint"] = fp
    hooks, hooks_note = make_hooks(state_dir, fixture, api_only)
    # a destroyed VM's disk takes a seeded guest's installation with it
    lab = PveApiSim(
        state_dir, fixture, load_schema(), hooks, functools.partial(seed.forget_installation, state_dir)
    )
    creds = load_or_create_credentials(state_dir, lab)
    if fixture.get("seed"):
        seed.seed_state(lab, creds)  # the user's lab as it was before gpulab (once per state directory)
    # the project's role, user, token and ACLs, unless a bare node is asked for; with real hosts `gpulab lab
    # up` makes them with the node's pveum once the node is up
    lab.bootstrap_access(creds, on_node=hooks_note is None)
    access = Access(creds, (fixture.get("access") or {}).get("tokens"), store=lab)
    faults = Faults(state_dir)
    lab.tasks.error_hook = faults.next_task_error
    server = PveApiServer(("127.0.0.1", port), lab, access, faults, state_dir / "pve-requests.jsonl")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.ssl_context = ctx
    server.node_api = node_api(state_dir, server, creds)
    server.node_proxy = ProxyApiServer(state_dir / NODE_API_DIR / NODE_PROXY_SOCKET, server)
    # the controller's way to the lab's internet (labsim.internet): what preflight's download check asks
    server.internet = InternetProxy(lab.internet).start()
    desc = lab_description(state_dir, server.server_address[1], fixture, creds, fp)
    desc["internet_proxy"] = server.internet.url
    token = lab.token_record(desc["token_id"])
    if token is None:
        # a bare node (fixture access.bootstrap false): the lab's token is not there; the flow makes its own
        desc["token_secret"] = None
        desc["access_note"] = (
            f"no token {desc['token_id']} on the node (bare node): playbooks/access.yml makes it"
        )
    else:
        desc["token_secret"] = token["secret"]  # the token's own, also once pveum rotated it
    if hooks_note:
        desc["hooks_note"] = hooks_note
    if fixture.get("seed"):
        desc["seed"] = seed.description(fixture, creds)
    return server, desc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labsim.pve_api_server")
    parser.add_argument("--state", required=True, type=Path)
    parser.add_argument("--fixture")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    state_dir = args.state.resolve()
    server, desc = build(state_dir, args.fixture, args.port)
    (state_dir / "server.pid").write_text(f"{os.getpid()}\n")

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(json.dumps(desc), flush=True)
    # From here on, output goes to the log file: the parent that read the line above may be gone.
    log = os.open(state_dir / "server.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    threading.Thread(target=resume_guests, args=(server.lab, state_dir), daemon=True).start()
    pods_stop = threading.Event()
    pods = None
    if type(server.lab.hooks) is not VmHooks:  # real hosts: the chart pods their k3s stand-ins ask for
        from labsim.net import chart_pods

        pods = threading.Thread(target=chart_pods.run, args=(state_dir, pods_stop), daemon=True)
        pods.start()
    serve_node_api(server)
    serve_node_proxy(server)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for side in (server.node_api, server.node_proxy):
            side.shutdown()
            side.server_close()
        server.server_close()
        pods_stop.set()
        if pods is not None:
            pods.join(timeout=60)
        server.lab.close()
        (state_dir / "server.pid").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
