"""OPNsense through its MVC API: Kea DHCPv4 reservations (default) or Dnsmasq hosts, then reconfigure.

Auth is an API key and secret sent as HTTP Basic (router_user = key, router_password = secret).
Writes answer HTTP 200 even when refused ({"result":"failed","validations":{...}}), so every answer
is checked. Nothing reaches the running service until reconfigure, sent once per run after all
writes. Kea reservations reference the subnet by uuid (found from router_subnet); Dnsmasq hosts
allow the same MAC twice, which the shared plan refuses. Do not talk to Kea directly on OPNsense:
OPNsense rewrites Kea's configuration on every reconfigure.

Nothing lost before reconfigure: OPNsense's API says nothing of saved changes not yet applied (its search
answers the saved model; only reconfigure renders it into the service's configuration), so a run cut off
between its writes and reconfigure would leave them saved, unserved, and the next run's plan empty. gpulab
marks them itself: every entry it adds or changes is saved with the description PENDING, and once
reconfigure has answered, each PENDING entry is set to the description FINAL. The description is not part of
what the service serves (opnsense/core's templates render a Kea reservation's hw_address, ip_address and
hostname, src/opnsense/service/templates/OPNsense/Kea/kea-dhcp4.conf, and a Dnsmasq dhcp-host line from
hwaddr, ip and host, .../OPNsense/Dnsmasq/dnsmasq.conf), so that last step needs no reconfigure. A run that
finds a PENDING entry (Backend.unapplied) reconfigures and finalises, even with nothing to write. A batch of
removals alone leaves no entry of its own to mark, so it first marks one of gpulab's entries it keeps; a batch
that removes every gpulab entry cannot be marked, and is served as saved only from the next reconfigure.
"""

from __future__ import annotations

import ipaddress

from .backend import Backend
from .http import HttpClient
from .model import ConflictError, Lease, Plan, PolicyError, Reservation, RouterError, ip4, norm_mac

# the description of gpulab's entries: saved but maybe not applied yet, and applied (module doc)
PENDING = "gpulab (saved, not applied yet)"
FINAL = "gpulab"

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
    unapplied_note = "reconfigured the DHCP service: a cut-off run had saved reservations it did not apply"
    unapplied_check_note = (
        "would reconfigure the DHCP service: a cut-off run saved reservations it did not apply, so they are "
        "not served yet"
    )

    def __init__(self, url, *, key=None, secret=None, validate_certs=True, dhcp="kea", **kw):
        super().__init__(**kw)
        if dhcp not in SERVICES:
            raise RouterError(f"router_options.dhcp for opnsense must be kea or dnsmasq, not {dhcp!r}")
        self.svc = SERVICES[dhcp]
        self.dhcp = dhcp
        self.http = HttpClient(url, router=self.name, auth=(key or "", secret or ""), verify=validate_certs)
        self._subnet_uuid: str | None = None
        self._descr: dict[str, str] = {}  # uuid -> description, of the entries the last read listed

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
        self._descr = {}
        for r in rows:
            if sub is not None and r.get("subnet") not in (sub, None, ""):
                continue
            self._descr[r["uuid"]] = str(r.get(s["descr"]) or "")
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
        obj = {s["mac"]: r.mac, s["ip"]: str(r.ip), s["descr"]: PENDING}
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

    def _describe(self, uuid: str, descr: str, doing: str) -> None:
        # set_* changes only the fields it is sent: opnsense/core's ApiMutableModelControllerBase::setBase
        # (src/opnsense/mvc/app/controllers/OPNsense/Base/) calls setNodes on the existing entry with them
        body = {self.svc["obj"]: {self.svc["descr"]: descr}}
        self._write(self.svc["set"] + uuid, body, doing, "saved")

    def unapplied(self) -> bool:
        if not self._descr:
            self.list_reservations()
        return PENDING in self._descr.values()

    def write(self, plan: Plan) -> None:
        if plan.changes and all(c.action == "delete" for c in plan.changes):
            gone = {c.before.ref for c in plan.changes}
            kept = [u for u, d in self._descr.items() if d in (FINAL, PENDING) and u not in gone]
            if kept:  # removals alone: mark an entry gpulab keeps, so a cut-off run is seen (module doc)
                self._describe(kept[0], PENDING, "marking the batch of removals pending")
        super().write(plan)

    def _apply(self) -> None:
        answer = (
            self.http.json("POST", self.svc["reconfigure"], json={}, doing=f"reconfiguring {self.dhcp}") or {}
        )
        if answer.get("status") != "ok":
            raise RouterError(f"OPNsense could not reconfigure {self.dhcp}: {answer!r:.200}")
        self.list_reservations()
        for uuid, descr in list(self._descr.items()):
            if descr == PENDING:  # served now: the final description needs no reconfigure (module doc)
                self._describe(uuid, FINAL, "marking the applied entry done")

    def close(self) -> None:
        self.http.close()
