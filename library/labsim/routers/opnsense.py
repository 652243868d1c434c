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

    def rendered(self, service: str) -> dict[str, dict]:
        """What reconfigure renders of the saved entries into the service's configuration, by uuid: only the
        fields opnsense/core's templates use (a Kea reservation's hw_address, ip_address and hostname in its
        subnet, src/opnsense/service/templates/OPNsense/Kea/kea-dhcp4.conf; a dhcp-host line's hwaddr, ip
        and host, .../OPNsense/Dnsmasq/dnsmasq.conf). The description is not among them: changing it alone
        changes nothing served."""
        store, fields = (
            (self.reservations, _KEA_SERVED) if service == "kea" else (self.hosts, _DNSMASQ_SERVED)
        )
        with self.lock:
            return {k: {f: v.get(f, "") for f in fields} for k, v in store.items()}

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
        if p == "/api/kea/dhcpv4/search_subnet":
            return _search([{"uuid": k, **v} for k, v in self.subnets.items()])
        if p == "/api/kea/leases4/search":
            return _search(self.kea_leases)
        if p == "/api/dnsmasq/leases/search":
            return _search(self.dnsmasq_leases)
        for service in ("kea", "dnsmasq"):
            if p == f"/api/{service}/service/reconfigure" and req.method == "POST":
                self.running[service] = self.rendered(service)
                self.reconfigures[service] += 1
                return Reply(200, {"status": "ok"})
        kea = ("/api/kea/dhcpv4", "reservation", self.reservations, _KEA_FIELDS, self._kea_validate)
        dnsmasq = ("/api/dnsmasq/settings", "host", self.hosts, _DNSMASQ_FIELDS, _dnsmasq_validate)
        for prefix, item, store, fields, validate in (kea, dnsmasq):
            reply = _model_call(req, p, prefix, item, store, fields, validate)
            if reply is not None:
                return reply
        return Reply(404, {"errorMessage": "Endpoint not found", "errorTitle": "Error"})


_KEA_FIELDS = ("subnet", "ip_address", "hw_address", "hostname", "description")
_DNSMASQ_FIELDS = ("host", "domain", "ip", "hwaddr", "descr")
_KEA_SERVED = ("subnet", "ip_address", "hw_address", "hostname")
_DNSMASQ_SERVED = ("host", "ip", "hwaddr")


def _dnsmasq_validate(obj: dict, me: str | None) -> dict:
    try:
        ipaddress.IPv4Address(obj.get("ip", ""))
    except ValueError:
        return {"host.ip": "Please specify a valid IP address."}
    return {}


def _model_call(req: Request, p: str, prefix: str, item: str, store: dict, fields, validate) -> Reply | None:
    """search/add/set/del on one model (Kea reservations, Dnsmasq hosts) under `prefix`, as OPNsense's
    MVC controllers answer them; None where `p` is none of these."""
    if p == f"{prefix}/search_{item}":
        return _search([{"uuid": k, **v} for k, v in store.items()])
    if req.method != "POST":
        return None
    sent = {k: str(v) for k, v in (req.json() or {}).get(item, {}).items()}
    if p == f"{prefix}/add_{item}":
        errors = validate(sent, None)
        if errors:
            return Reply(200, {"result": "failed", "validations": errors})
        uid = str(uuid.uuid4())
        store[uid] = {k: sent.get(k, "") for k in fields}
        return Reply(200, {"result": "saved", "uuid": uid})
    for verb in ("set", "del"):
        if p.startswith(f"{prefix}/{verb}_{item}/"):
            uid = p.rsplit("/", 1)[1]
            if uid not in store:
                return Reply(200, {"result": "not found" if verb == "del" else "failed"})
            if verb == "del":
                del store[uid]
                return Reply(200, {"result": "deleted"})
            obj = {**store[uid], **sent}
            errors = validate(obj, uid)
            if errors:
                return Reply(200, {"result": "failed", "validations": errors})
            store[uid] = obj
            return Reply(200, {"result": "saved"})
    return None
