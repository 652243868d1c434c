"""MikroTik RouterOS v7 REST API simulator: /rest/ip/dhcp-server and its lease table.

Built from the RouterOS REST API documentation (help.mikrotik.com, "REST API"): HTTP Basic auth;
GET prints (query parameters filter), PUT adds and returns the new object, PATCH /<.id> sets,
DELETE /<.id> removes (empty body), POST /<command> runs a console command. Every value is a string.
Errors: 401 {"error":401,"message":"Unauthorized"}, unknown .id 404 {"error":404,"message":"Not Found"},
400 {"error":400,"message":"Bad Request","detail":"..."} with RouterOS's failure texts. A static lease
that never bound shows status "waiting"; `server` is absent when it is "all".
"""

from __future__ import annotations

import ipaddress

from .base import Reply, Request, RouterSim

BASE = "/rest/ip/dhcp-server"


def _bad(detail: str) -> Reply:
    return Reply(400, {"error": 400, "message": "Bad Request", "detail": detail})


class MikroTikSim(RouterSim):
    name = "mikrotik"

    def __init__(self, *, user="admin", password="", servers=None, **kw):
        super().__init__(**kw)
        self.user, self.password = user, password
        # name -> (interface, network)
        self.servers = servers or {"defconf": ("bridge", "192.168.88.0/24")}
        self.leases: list[dict] = []
        self._next = 0x10

    def _id(self) -> str:
        self._next += 1
        return f"*{self._next:X}"

    def add_dynamic(self, mac: str, address: str, host: str | None = None, server: str = "defconf") -> dict:
        """A client got a lease from the pool (test helper)."""
        with self.lock:
            lease = {
                ".id": self._id(),
                "address": address,
                "mac-address": mac.upper(),
                "server": server,
                "dynamic": "true",
                "disabled": "false",
                "status": "bound",
                "active-address": address,
                "active-mac-address": mac.upper(),
                "last-seen": "5s",
                "comment": "",
            }
            if host:
                lease["host-name"] = host
            self.leases.append(lease)
            return lease

    def _find(self, lid: str) -> dict | None:
        return next((x for x in self.leases if x[".id"] == lid), None)

    def _check_static(self, obj: dict, me: dict | None) -> Reply | None:
        mac, addr, server = obj.get("mac-address", "").upper(), obj.get("address"), obj.get("server", "all")
        if server != "all" and server not in self.servers:
            return _bad("input does not match any value of server")
        try:
            ipaddress.IPv4Address(addr)
        except ValueError:
            return _bad(f"invalid value for argument address: {addr}")
        for other in self.leases:
            if other is me or other.get("dynamic") == "true":
                continue
            if other["mac-address"] == mac and (
                other.get("server", "all") == server or "all" in (server, other.get("server", "all"))
            ):
                return _bad("failure: already have static lease for this client")
            if other["address"] == addr:
                return _bad("failure: already have static lease with this IP address")
        return None

    def handle(self, req: Request) -> Reply:
        if req.basic_auth() != (self.user, self.password):
            return Reply(
                401, {"error": 401, "message": "Unauthorized"}, {"WWW-Authenticate": 'Basic realm="RouterOS"'}
            )
        if req.path == BASE and req.method == "GET":
            return Reply(
                200,
                [
                    {".id": f"*{n + 1}", "name": k, "interface": v[0]}
                    for n, (k, v) in enumerate(self.servers.items())
                ],
            )
        if not req.path.startswith(BASE + "/lease"):
            return _bad(f"no such command or directory ({req.path.removeprefix('/rest/').replace('/', ' ')})")
        rest = req.path[len(BASE + "/lease") :].lstrip("/")
        if req.method == "GET" and not rest:
            rows = [x for x in self.leases if all(x.get(k) == v for k, v in req.query.items())]
            return Reply(200, rows)
        if req.method == "POST" and rest == "make-static":
            lease = self._find((req.json() or {}).get(".id", ""))
            if lease is None:
                return _bad("no such item")
            if lease["dynamic"] != "true":
                return _bad("failure: lease is already static")
            probe = dict(lease)
            err = self._check_static(probe, lease)
            if err:
                return err
            lease["dynamic"] = "false"
            return Reply(200, [])
        if req.method == "PUT" and not rest:
            obj = {k: str(v) for k, v in (req.json() or {}).items()}
            if "mac-address" not in obj or "address" not in obj:
                return _bad("missing mac-address or address")
            err = self._check_static(obj, None)
            if err:
                return err
            lease = {
                ".id": self._id(),
                "dynamic": "false",
                "disabled": "false",
                "status": "waiting",
                "last-seen": "never",
                **obj,
            }
            lease["mac-address"] = obj["mac-address"].upper()
            if lease.get("server") == "all":
                lease.pop("server")
            self.leases.append(lease)
            return Reply(201, lease)
        lease = self._find(rest)
        if lease is None:
            return Reply(404, {"error": 404, "message": "Not Found"})
        if req.method == "GET":
            return Reply(200, lease)
        if req.method == "PATCH":
            changes = {k: str(v) for k, v in (req.json() or {}).items()}
            merged = {**lease, **changes}
            if lease["dynamic"] == "false":
                err = self._check_static(merged, lease)
                if err:
                    return err
            lease.update(changes)
            lease["mac-address"] = lease["mac-address"].upper()
            return Reply(200, lease)
        if req.method == "DELETE":
            self.leases.remove(lease)
            return Reply(204)
        return _bad("unsupported")
