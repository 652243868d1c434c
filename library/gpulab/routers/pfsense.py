"""pfSense through the pfrest REST API v2 (pfSense-pkg-RESTAPI): DHCP server static mappings.

pfSense refuses a static mapping inside the interface's DHCP range (409), so keeping a pool address
is impossible there: the plan refuses it up front and says how to fix it (plan an address outside
the pool, or shrink the pool). Object ids are array indices that shift after a delete, so every
update or delete first finds the mapping's current id by MAC. Changes are written, then applied
once (POST .../dhcp_server/apply). Check mode also sends each write with dry_run=true, which runs
pfSense's own validation without saving.
Auth: HTTP Basic with router_user/router_password, or `options.auth: api_key` (router_password is
then sent as X-API-Key).
"""

from __future__ import annotations

from .backend import Backend
from .http import HttpClient
from .model import ConflictError, Lease, Plan, PolicyError, Reservation, RouterError, ip4, norm_mac

V2 = "/api/v2"
ONE = V2 + "/services/dhcp_server/static_mapping"


class PfSenseBackend(Backend):
    kind = "pfsense"
    in_pool_allowed = False

    def __init__(
        self, url, *, user=None, password=None, validate_certs=True, interface="lan", auth="basic", **kw
    ):
        super().__init__(**kw)
        if auth == "api_key":
            self.http = HttpClient(url, router=self.name, headers={"X-API-Key": password or ""}, verify=validate_certs,
                                   secrets=[password])  # fmt: skip
        elif auth == "basic":
            self.http = HttpClient(
                url, router=self.name, auth=(user or "", password or ""), verify=validate_certs
            )
        else:
            raise RouterError(f"router_options.auth for pfsense must be basic or api_key, not {auth!r}")
        self.interface = interface

    def _call(self, method, path, *, doing, **kw):
        body = self.http.json(method, path, doing=doing, ok=(200, 400, 404, 409), **kw) or {}
        code = body.get("code", 200)
        if code == 409 and "IPADDR_OVERLAPS" in body.get("response_id", ""):
            raise PolicyError(
                self.http.mask(
                    f"{doing}: pfSense refuses it: {body.get('message')} Plan an address outside the DHCP "
                    "range (vm_address with router_dhcp_reservation_mode: planned) or shrink the range"
                )
            )
        if code == 400 and body.get("response_id") == "FIELD_MUST_BE_UNIQUE":
            raise ConflictError(self.http.mask(f"{doing}: pfSense refuses it: {body.get('message')}"))
        if code != 200:
            raise RouterError(
                self.http.mask(
                    f"{doing}: pfSense answered {code} {body.get('response_id')}: {body.get('message')}"
                )
            )
        return body.get("data")

    def _mappings(self) -> list[dict]:
        return self._call("GET", V2 + "/services/dhcp_server/static_mappings", params={"parent_id": self.interface},
                          doing=f"reading the static mappings of {self.interface}") or []  # fmt: skip

    def list_reservations(self) -> list[Reservation]:
        return [
            Reservation(norm_mac(m["mac"]), ip4(m["ipaddr"]), m.get("hostname") or None, str(m["id"]))
            for m in self._mappings()
            if m.get("mac") and m.get("ipaddr")
        ]

    def list_leases(self) -> list[Lease]:
        rows = self._call("GET", V2 + "/status/dhcp_server/leases", doing="reading the DHCP leases") or []
        return [
            Lease(norm_mac(r["mac"]), ip4(r["ip"]), r.get("hostname") or None)
            for r in rows
            if r.get("mac") and r.get("ip") and r.get("active_status", "active") == "active"
        ]

    def _id_of(self, mac: str) -> int:
        for m in self._mappings():
            if norm_mac(m["mac"]) == mac:
                return int(m["id"])
        raise RouterError(f"the static mapping of {mac} vanished from pfSense while gpulab was changing it")

    def _body(self, r: Reservation) -> dict:
        body = {"parent_id": self.interface, "mac": r.mac, "ipaddr": str(r.ip), "descr": "gpulab"}
        if r.hostname:
            body["hostname"] = r.hostname
        return body

    def dry_run(self, plan: Plan) -> None:
        for c in plan.changes:
            if c.action == "create":
                self._call(
                    "POST",
                    ONE,
                    json={**self._body(c.after), "dry_run": True},
                    doing=f"checking {c.describe()}",
                )

    def unapplied(self) -> bool:
        status = (
            self._call("GET", V2 + "/services/dhcp_server/apply", doing="reading the DHCP apply status") or {}
        )
        return status.get("applied") is False

    def write(self, plan: Plan) -> None:
        status = (
            self._call("GET", V2 + "/services/dhcp_server/apply", doing="reading the DHCP apply status") or {}
        )
        if status.get("applied") is False:
            raise RouterError(
                "pfSense has DHCP server changes that are saved but not applied, and they are not gpulab's; "
                "apply or undo them (Services > DHCP Server), then run again"
            )
        super().write(plan)

    def _create(self, r: Reservation) -> None:
        self._call("POST", ONE, json=self._body(r), doing=f"adding {r.line()}")

    def _update(self, old: Reservation, new: Reservation) -> None:
        body = {**self._body(new), "id": self._id_of(old.mac)}
        self._call("PATCH", ONE, json=body, doing=f"changing {old.line()}")

    def _delete(self, old: Reservation) -> None:
        params = {"parent_id": self.interface, "id": self._id_of(old.mac)}
        self._call("DELETE", ONE, params=params, doing=f"removing {old.line()}")

    def _apply(self) -> None:
        self._call(
            "POST", V2 + "/services/dhcp_server/apply", json={}, doing="applying the DHCP server changes"
        )

    def close(self) -> None:
        self.http.close()
