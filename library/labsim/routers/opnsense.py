"""OPNsense MVC API simulator: Kea DHCPv4 reservations and Dnsmasq hosts, each with reconfigure.

Built from docs.opnsense.org (core API: kea, dnsmasq) and the models' rules: API key and secret as
HTTP Basic (401 otherwise); add/set answer HTTP 200 with {"result":"saved"[,"uuid"]} or
{"result":"failed","validations":{"<obj>.<field>":"<message>"}}; del answers {"result":"deleted"}
or {"result":"not found"}; search answers {"rows","rowCount","total","current"}; reconfigure
answers {"status":"ok"} and only then does the running service see the changes. Kea reservations
reference a subnet by uuid, `hw_address` is unique per subnet ("Duplicate entry exists") and
`ip_address` must lie in the subnet ("Address not in specified subnet"). Dnsmasq hosts have no
uniqueness rule on `hwaddr`.
"""

from __future__ import annotations

import ipaddress
import uuid

from .base import Reply, Request, RouterSim


def _search(rows: list[dict]) -> Reply:
    return Reply(200, {"rows": rows, "rowCount": len(rows), "total": len(rows), "current": 1})


class OPNsenseSim(RouterSim):
    name = "opnsense"

    def __init__(self, *, key="key", secret="secret", subnet="192.168.1.0/24", **kw):
        super().__init__(**kw)
        self.key, self.secret = key, secret
        self.subnets = {str(uuid.uuid4()): {"subnet": subnet, "description": "LAN"}}
        self.reservations: dict[str, dict] = {}
        self.hosts: dict[str, dict] = {}
        self.kea_leases: list[dict] = []
        self.dnsmasq_leases: list[dict] = []
        self.running = {"kea": {}, "dnsmasq": {}}  # what the services serve (set on reconfigure)
        self.reconfigures = {"kea": 0, "dnsmasq": 0}

    def add_lease(self, mac, ip, hostname="", service="kea"):
        with self.lock:
            row = {
                "address": ip,
                "hwaddr": mac.lower(),
                "hostname": hostname,
                "expire": 4102444800,
                "if": "lan",
            }
            (self.kea_leases if service == "kea" else self.dnsmasq_leases).append(row)

    def _kea_validate(self, obj: dict, me: str | None) -> dict:
        errors = {}
        sub = self.subnets.get(obj.get("subnet", ""))
        if sub is None:
            errors["reservation.subnet"] = "Related item not found"
        for rid, r in self.reservations.items():
            if (
                rid != me
                and r["subnet"] == obj.get("subnet")
                and r["hw_address"].lower() == obj.get("hw_address", "").lower()
            ):
                errors["reservation.hw_address"] = "Duplicate entry exists"
        try:
            ip = ipaddress.IPv4Address(obj.get("ip_address", ""))
            if sub is not None and ip not in ipaddress.IPv4Network(sub["subnet"]):
                errors["reservation.ip_address"] = "Address not in specified subnet"
        except ValueError:
            errors["reservation.ip_address"] = "Please specify a valid IPv4 address."
        return errors

    def handle(self, req: Request) -> Reply:
        if req.basic_auth() != (self.key, self.secret):
            return Reply(401, {"status": 401, "message": "Authentication Failed"})
        p = req.path.rstrip("/")
        # --- Kea ---
        if p == "/api/kea/dhcpv4/search_subnet":
            return _search([{"uuid": k, **v} for k, v in self.subnets.items()])
        if p == "/api/kea/dhcpv4/search_reservation":
            return _search([{"uuid": k, **v} for k, v in self.reservations.items()])
        if p == "/api/kea/leases4/search":
            return _search(self.kea_leases)
        if p == "/api/kea/service/reconfigure" and req.method == "POST":
            self.running["kea"] = {k: dict(v) for k, v in self.reservations.items()}
            self.reconfigures["kea"] += 1
            return Reply(200, {"status": "ok"})
        if p == "/api/kea/dhcpv4/add_reservation" and req.method == "POST":
            obj = (req.json() or {}).get("reservation", {})
            errors = self._kea_validate(obj, None)
            if errors:
                return Reply(200, {"result": "failed", "validations": errors})
            rid = str(uuid.uuid4())
            self.reservations[rid] = {
                k: str(obj.get(k, ""))
                for k in ("subnet", "ip_address", "hw_address", "hostname", "description")
            }
            return Reply(200, {"result": "saved", "uuid": rid})
        for verb in ("set_reservation", "del_reservation"):
            if p.startswith(f"/api/kea/dhcpv4/{verb}/") and req.method == "POST":
                rid = p.rsplit("/", 1)[1]
                if rid not in self.reservations:
                    return Reply(
                        200, {"result": "not found"} if verb == "del_reservation" else {"result": "failed"}
                    )
                if verb == "del_reservation":
                    del self.reservations[rid]
                    return Reply(200, {"result": "deleted"})
                obj = {**self.reservations[rid], **(req.json() or {}).get("reservation", {})}
                errors = self._kea_validate(obj, rid)
                if errors:
                    return Reply(200, {"result": "failed", "validations": errors})
                self.reservations[rid] = obj
                return Reply(200, {"result": "saved"})
        # --- Dnsmasq ---
        if p == "/api/dnsmasq/settings/search_host":
            return _search([{"uuid": k, **v} for k, v in self.hosts.items()])
        if p == "/api/dnsmasq/leases/search":
            return _search(self.dnsmasq_leases)
        if p == "/api/dnsmasq/service/reconfigure" and req.method == "POST":
            self.running["dnsmasq"] = {k: dict(v) for k, v in self.hosts.items()}
            self.reconfigures["dnsmasq"] += 1
            return Reply(200, {"status": "ok"})
        if p == "/api/dnsmasq/settings/add_host" and req.method == "POST":
            obj = (req.json() or {}).get("host", {})
            try:
                ipaddress.IPv4Address(obj.get("ip", ""))
            except ValueError:
                return Reply(
                    200,
                    {"result": "failed", "validations": {"host.ip": "Please specify a valid IP address."}},
                )
            hid = str(uuid.uuid4())
            self.hosts[hid] = {k: str(obj.get(k, "")) for k in ("host", "domain", "ip", "hwaddr", "descr")}
            return Reply(200, {"result": "saved", "uuid": hid})
        for verb in ("set_host", "del_host"):
            if p.startswith(f"/api/dnsmasq/settings/{verb}/") and req.method == "POST":
                hid = p.rsplit("/", 1)[1]
                if hid not in self.hosts:
                    return Reply(200, {"result": "not found"} if verb == "del_host" else {"result": "failed"})
                if verb == "del_host":
                    del self.hosts[hid]
                    return Reply(200, {"result": "deleted"})
                self.hosts[hid].update({k: str(v) for k, v in (req.json() or {}).get("host", {}).items()})
                return Reply(200, {"result": "saved"})
        return Reply(404, {"errorMessage": "Endpoint not found", "errorTitle": "Error"})
