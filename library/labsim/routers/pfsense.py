"""pfSense with the pfrest REST API v2 (pfSense-pkg-RESTAPI): DHCP server static mappings.

Built from the package's endpoint and model documentation: every answer is the envelope
{code, status, response_id, message, data}; auth by HTTP Basic (local users), `X-API-Key`, or a
JWT; object ids are array indices that shift after a delete; writes are pending until
POST /api/v2/services/dhcp_server/apply. Static mapping rules: `mac` unique per interface
(400 FIELD_MUST_BE_UNIQUE), `ipaddr` inside the interface subnet
(400 DHCP_SERVER_STATIC_MAPPING_IPADDR_NOT_WITHIN_SUBNET) and NOT inside the DHCP range
(409 DHCP_SERVER_STATIC_MAPPING_IPADDR_OVERLAPS_EXISTING_OBJECT).
"""

from __future__ import annotations

import ipaddress

from .base import Reply, Request, RouterSim

V2 = "/api/v2"


def envelope(code: int, response_id: str, message: str = "", data=None) -> Reply:
    status = {200: "ok", 400: "bad request", 401: "unauthorized", 404: "not found", 409: "conflict"}.get(
        code, "error"
    )
    return Reply(
        code,
        {"code": code, "status": status, "response_id": response_id, "message": message, "data": data or []},
    )


class PfSenseSim(RouterSim):
    name = "pfsense"

    def __init__(self, *, user="admin", password="pfsense", api_key=None, interfaces=None, **kw):
        super().__init__(**kw)
        self.user, self.password, self.api_key = user, password, api_key
        # interface -> {subnet, range_from, range_to}
        self.interfaces = interfaces or {
            "lan": {"subnet": "192.168.1.0/24", "range_from": "192.168.1.100", "range_to": "192.168.1.199"}
        }
        self.mappings: dict[str, list[dict]] = {k: [] for k in self.interfaces}
        self.leases: list[dict] = []
        self.pending = False
        self.applied: dict[str, list[dict]] = {k: [] for k in self.interfaces}

    def add_lease(self, mac, ip, hostname="", interface="lan"):
        with self.lock:
            self.leases.append({"ip": ip, "mac": mac.lower(), "hostname": hostname, "if": interface,
                                "starts": "2026/11/29 10:00:00", "ends": "2026/11/29 12:00:00",
                                "active_status": "active", "online_status": "online", "descr": ""})  # fmt: skip

    def _authorised(self, req: Request) -> bool:
        if self.api_key and req.headers.get("x-api-key") == self.api_key:
            return True
        return req.basic_auth() == (self.user, self.password)

    def _validate(self, parent: str, obj: dict, me: int | None) -> Reply | None:
        iface = self.interfaces[parent]
        for n, m in enumerate(self.mappings[parent]):
            if n != me and m["mac"].lower() == str(obj.get("mac", "")).lower():
                return envelope(
                    400,
                    "FIELD_MUST_BE_UNIQUE",
                    f"Field 'mac' must be unique. Value is in use by object with ID '{n}'.",
                )
        try:
            ip = ipaddress.IPv4Address(obj.get("ipaddr", ""))
        except ValueError:
            return envelope(400, "FIELD_INVALID_IPV4_ADDRESS", "Field 'ipaddr' must be a valid IPv4 address.")
        if ip not in ipaddress.IPv4Network(iface["subnet"]):
            return envelope(400, "DHCP_SERVER_STATIC_MAPPING_IPADDR_NOT_WITHIN_SUBNET",
                            f"Field 'ipaddr' must be an IP address within the '{parent}' interface's subnet.")  # fmt: skip
        lo, hi = (ipaddress.IPv4Address(iface[k]) for k in ("range_from", "range_to"))
        if lo <= ip <= hi:
            return envelope(409, "DHCP_SERVER_STATIC_MAPPING_IPADDR_OVERLAPS_EXISTING_OBJECT",
                            f"Field 'ipaddr' cannot be an address within the '{parent}' interface's DHCP range.")  # fmt: skip
        return None

    def handle(self, req: Request) -> Reply:
        if not self._authorised(req):
            return envelope(401, "AUTH_AUTHENTICATION_FAILED", "Authentication failed.")
        q = {**req.query, **(req.json() if req.body and req.method in ("POST", "PATCH") else {})}
        if req.path == V2 + "/status/dhcp_server/leases" and req.method == "GET":
            return envelope(200, "SUCCESS", data=self.leases)
        if req.path == V2 + "/services/dhcp_server/apply":
            if req.method == "POST":
                self.applied = {k: [dict(m) for m in v] for k, v in self.mappings.items()}
                self.pending = False
            return envelope(200, "SUCCESS", data={"applied": not self.pending})
        parent = q.get("parent_id", "")
        if req.path.startswith(V2 + "/services/dhcp_server/static_mapping") and parent not in self.interfaces:
            return envelope(404, "DHCP_SERVER_NOT_FOUND", f"Parent model with ID '{parent}' does not exist.")
        rows = self.mappings.get(parent, [])
        if req.path == V2 + "/services/dhcp_server/static_mappings" and req.method == "GET":
            return envelope(
                200, "SUCCESS", data=[{"id": n, "parent_id": parent, **m} for n, m in enumerate(rows)]
            )
        if req.path != V2 + "/services/dhcp_server/static_mapping":
            return envelope(404, "ENDPOINT_NOT_FOUND", "Endpoint not found.")
        fields = ("mac", "ipaddr", "hostname", "descr")
        if req.method == "POST":
            obj = {k: str(q.get(k) or "") for k in fields}
            err = self._validate(parent, obj, None)
            if err:
                return err
            if str(q.get("dry_run", "")).lower() != "true":
                rows.append(obj)
                self.pending = True
            return envelope(200, "SUCCESS", data={"id": len(rows) - 1, "parent_id": parent, **obj})
        try:
            n = int(q.get("id"))
            cur = rows[n]
        except (TypeError, ValueError, IndexError):
            return envelope(404, "MODEL_OBJECT_NOT_FOUND", f"Object with ID '{q.get('id')}' does not exist.")
        if req.method == "PATCH":
            obj = {**cur, **{k: str(q[k]) for k in fields if k in q}}
            err = self._validate(parent, obj, n)
            if err:
                return err
            rows[n] = obj
            self.pending = True
            return envelope(200, "SUCCESS", data={"id": n, "parent_id": parent, **obj})
        if req.method == "DELETE":
            rows.pop(n)  # later ids shift down by one
            self.pending = True
            return envelope(200, "SUCCESS", data={"id": n, "parent_id": parent, **cur})
        if req.method == "GET":
            return envelope(200, "SUCCESS", data={"id": n, "parent_id": parent, **cur})
        return envelope(405, "METHOD_NOT_ALLOWED", "Method not allowed.")
