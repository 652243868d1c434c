"""MikroTik RouterOS v7 over its REST API (/rest/ip/dhcp-server/lease), HTTP Basic auth.

Leases and reservations share one table: dynamic entries are leases, static ones reservations. To
keep the address a VM holds, its dynamic lease is pinned in place with `make-static` (RouterOS's own
way to reserve a pool address); otherwise a static lease is added with PUT. Changes apply at once
(no commit step). The host name is kept in the lease's comment as `gpulab:<name>`. RouterOS .ids
are only handles: the table is re-read before every write batch and after it.
"""

from __future__ import annotations

from .backend import Backend
from .http import HttpClient
from .model import ConflictError, Lease, Reservation, RouterError, ip4, norm_mac

PATH = "/rest/ip/dhcp-server/lease"
TAG = "gpulab:"


class MikroTikBackend(Backend):
    kind = "mikrotik"

    def __init__(self, url: str, *, user=None, password=None, validate_certs=True, server=None, **kw):
        super().__init__(**kw)
        self.http = HttpClient(
            url, router=self.name, auth=(user or "", password or ""), verify=validate_certs
        )
        self.server = server
        self._rows: list[dict] = []

    def _call(self, method, path, *, doing, **kw):
        resp = self.http.request(method, path, doing=doing, ok=(200, 201, 204, 400), **kw)
        if resp.status_code == 400:
            detail = (resp.json() if resp.content else {}).get("detail", resp.text)
            cls = ConflictError if "already have" in detail else RouterError
            raise cls(self.http.mask(f"{doing}: RouterOS refused it: {detail}"))
        return resp.json() if resp.content else None

    def _table(self) -> list[dict]:
        self._rows = self._call("GET", PATH, doing="reading the DHCP lease table") or []
        return self._rows

    def list_leases(self) -> list[Lease]:
        return [
            Lease(norm_mac(r["mac-address"]), ip4(r["address"]), r.get("host-name") or None)
            for r in self._table()
            if r.get("dynamic") == "true" and r.get("status") == "bound"
        ]

    def list_reservations(self) -> list[Reservation]:
        out = []
        for r in self._table():
            if r.get("dynamic") == "true" or "mac-address" not in r:
                continue
            comment = r.get("comment") or ""
            host = comment[len(TAG) :] if comment.startswith(TAG) else None
            out.append(Reservation(norm_mac(r["mac-address"]), ip4(r["address"]), host or None, r[".id"]))
        return out

    def _server_for(self, mac: str) -> str:
        if self.server:
            return self.server
        dyn = [r for r in self._rows if r.get("dynamic") == "true" and norm_mac(r["mac-address"]) == mac]
        if dyn and dyn[0].get("server"):
            return dyn[0]["server"]
        servers = self._call("GET", "/rest/ip/dhcp-server", doing="listing the DHCP servers") or []
        if len(servers) == 1:
            return servers[0]["name"]
        names = ", ".join(s.get("name", "?") for s in servers) or "none"
        raise RouterError(
            f"cannot tell which DHCP server of the router should hold {mac} (it has: {names}); "
            "set router_options.server in the inventory"
        )

    def _fields(self, r: Reservation) -> dict:
        return {"address": str(r.ip), "comment": TAG + r.hostname if r.hostname else ""}

    def _create(self, r: Reservation) -> None:
        self._table()
        dyn = next(
            (x for x in self._rows if x.get("dynamic") == "true" and norm_mac(x["mac-address"]) == r.mac),
            None,
        )
        if dyn is not None:
            self._call(
                "POST", PATH + "/make-static", json={".id": dyn[".id"]}, doing=f"pinning the lease of {r.mac}"
            )
            # make-static may hand the entry a new .id: find it again by MAC
            pinned = [
                x for x in self._table() if x.get("dynamic") != "true" and norm_mac(x["mac-address"]) == r.mac
            ]
            if len(pinned) != 1:
                raise RouterError(
                    f"make-static for {r.mac} left {len(pinned)} static entries; check the router"
                )
            self._call(
                "PATCH", f"{PATH}/{pinned[0]['.id']}", json=self._fields(r), doing=f"setting {r.line()}"
            )
            return
        body = {"mac-address": r.mac.upper(), "server": self._server_for(r.mac), **self._fields(r)}
        self._call("PUT", PATH, json=body, doing=f"adding {r.line()}")

    def _update(self, old: Reservation, new: Reservation) -> None:
        self._call("PATCH", f"{PATH}/{old.ref}", json=self._fields(new), doing=f"changing {old.line()}")

    def _delete(self, old: Reservation) -> None:
        self._call("DELETE", f"{PATH}/{old.ref}", doing=f"removing {old.line()}")

    def close(self) -> None:
        self.http.close()
