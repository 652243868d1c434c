"""OPNsense through its MVC API: Kea DHCPv4 reservations (default) or Dnsmasq hosts, then reconfigure.

Auth is an API key and secret sent as HTTP Basic (router_user = key, router_password = secret).
Writes answer HTTP 200 even when refused ({"result":"failed","validations":{...}}), so every answer
is checked. Nothing reaches the running service until reconfigure, sent once per run after all
writes. Kea reservations reference the subnet by uuid (found from router_subnet); Dnsmasq hosts
allow the same MAC twice, which the shared plan refuses. Do not talk to Kea directly on OPNsense:
OPNsense rewrites Kea's configuration on every reconfigure.
"""

from __future__ import annotations

import ipaddress

from .backend import Backend
from .http import HttpClient
from .model import ConflictError, Lease, PolicyError, Reservation, RouterError, ip4, norm_mac

# service -> (search, add, set, del, leases, reconfigure, payload key, field names)
SERVICES = {
    "kea": {
        "search": "/api/kea/dhcpv4/search_reservation",
        "add": "/api/kea/dhcpv4/add_reservation",
        "set": "/api/kea/dhcpv4/set_reservation/",
        "del": "/api/kea/dhcpv4/del_reservation/",
        "leases": "/api/kea/leases4/search",
        "reconfigure": "/api/kea/service/reconfigure",
        "obj": "reservation",
        "mac": "hw_address",
        "ip": "ip_address",
        "host": "hostname",
        "descr": "description",
    },
    "dnsmasq": {
        "search": "/api/dnsmasq/settings/search_host",
        "add": "/api/dnsmasq/settings/add_host",
        "set": "/api/dnsmasq/settings/set_host/",
        "del": "/api/dnsmasq/settings/del_host/",
        "leases": "/api/dnsmasq/leases/search",
        "reconfigure": "/api/dnsmasq/service/reconfigure",
        "obj": "host",
        "mac": "hwaddr",
        "ip": "ip",
        "host": "host",
        "descr": "descr",
    },
}


class OPNsenseBackend(Backend):
    kind = "opnsense"

    def __init__(self, url, *, key=None, secret=None, validate_certs=True, dhcp="kea", **kw):
        super().__init__(**kw)
        if dhcp not in SERVICES:
            raise RouterError(f"router_options.dhcp for opnsense must be kea or dnsmasq, not {dhcp!r}")
        self.svc = SERVICES[dhcp]
        self.dhcp = dhcp
        self.http = HttpClient(url, router=self.name, auth=(key or "", secret or ""), verify=validate_certs)
        self._subnet_uuid: str | None = None

    def _rows(self, path: str, doing: str) -> list[dict]:
        body = self.http.json(
            "POST", path, json={"current": 1, "rowCount": -1, "searchPhrase": ""}, doing=doing
        )
        return (body or {}).get("rows", [])

    def _subnet_ref(self) -> str | None:
        if self.dhcp != "kea":
            return None
        if self._subnet_uuid is None:
            rows = self._rows("/api/kea/dhcpv4/search_subnet", "reading the Kea subnets")
            found = [
                r
                for r in rows
                if self.subnet and ipaddress.IPv4Network(r["subnet"], strict=False) == self.subnet
            ]
            if len(found) != 1:
                have = ", ".join(r.get("subnet", "?") for r in rows) or "none"
                raise RouterError(
                    f"OPNsense's Kea has no subnet {self.subnet} (it has: {have}); add it under "
                    "Services > Kea DHCP > Kea DHCPv4 > Subnets, or fix router_subnet"
                )
            self._subnet_uuid = found[0]["uuid"]
        return self._subnet_uuid

    def list_reservations(self) -> list[Reservation]:
        s = self.svc
        rows = self._rows(s["search"], f"reading the {self.dhcp} reservations")
        sub = self._subnet_ref()
        out = []
        for r in rows:
            if sub is not None and r.get("subnet") not in (sub, None, ""):
                continue
            for mac in str(r.get(s["mac"]) or "").split(","):
                if mac.strip() and r.get(s["ip"]):
                    ip = str(r[s["ip"]]).split(",")[0]
                    out.append(Reservation(norm_mac(mac), ip4(ip), r.get(s["host"]) or None, r["uuid"]))
        return out

    def list_leases(self) -> list[Lease]:
        rows = self._rows(self.svc["leases"], f"reading the {self.dhcp} leases")
        out = []
        for r in rows:
            mac, ip = r.get("hwaddr") or r.get("hw_address"), r.get("address") or r.get("ip_address")
            if mac and ip:
                out.append(Lease(norm_mac(mac), ip4(ip), r.get("hostname") or None))
        return out

    def _payload(self, r: Reservation) -> dict:
        s = self.svc
        obj = {s["mac"]: r.mac, s["ip"]: str(r.ip), s["descr"]: "gpulab"}
        if r.hostname:
            obj[s["host"]] = r.hostname
        if self.dhcp == "kea":
            obj["subnet"] = self._subnet_ref()
        return {s["obj"]: obj}

    def _write(self, path: str, body: dict | None, doing: str, want: str) -> dict:
        answer = self.http.json("POST", path, json=body or {}, doing=doing) or {}
        if answer.get("result") == want:
            return answer
        problems = answer.get("validations") or {}
        text = "; ".join(f"{k}: {v}" for k, v in problems.items()) or f"result {answer.get('result')!r}"
        cls = RouterError
        if any("Duplicate" in str(v) for v in problems.values()):
            cls = ConflictError
        elif any("not in specified subnet" in str(v) for v in problems.values()):
            cls = PolicyError
        raise cls(self.http.mask(f"{doing}: OPNsense refused it ({text})"))

    def _create(self, r: Reservation) -> None:
        self._write(self.svc["add"], self._payload(r), f"adding {r.line()}", "saved")

    def _update(self, old: Reservation, new: Reservation) -> None:
        self._write(self.svc["set"] + old.ref, self._payload(new), f"changing {old.line()}", "saved")

    def _delete(self, old: Reservation) -> None:
        self._write(self.svc["del"] + old.ref, None, f"removing {old.line()}", "deleted")

    def _apply(self) -> None:
        answer = (
            self.http.json("POST", self.svc["reconfigure"], json={}, doing=f"reconfiguring {self.dhcp}") or {}
        )
        if answer.get("status") != "ok":
            raise RouterError(f"OPNsense could not reconfigure {self.dhcp}: {answer!r:.200}")

    def close(self) -> None:
        self.http.close()
