"""ISC Kea DHCPv4 through its Control Agent (or, on Kea 3, the daemon's own HTTP control socket).

Reservations are edited in the running configuration: config-get, edit the subnet's `reservations`,
config-test, config-set, config-write. Kea 2.2 (Debian 12) ships no host_cmds hook, so this is the
only way without premium hooks. The rule that matters: never config-set a configuration that did not
pass config-test. A rejected config-set leaves Kea 2.2 in DHCP4_CONFIG_UNRECOVERABLE_ERROR, alive on
its control channel but serving no DHCP at all (verified); should it happen anyway, this backend
sends config-reload to bring back the configuration on disk.
Current addresses come from the lease_cmds hook (lease4-get-all), shipped with Kea.

Nothing lost between config-set and config-write: config-set serves the new reservations at once but only
config-write saves them, and a connection dropped between the two would leave them served and unsaved, with
the next run's plan empty (config-get already shows them) and a restart of Kea losing them. So a write
config-sets the new configuration with a marker, MARKER in the Dhcp4 element's user-context (Kea keeps
user-context as it is and returns it from config-get), then finishes: config-write (saved, marker
included), config-set of the same configuration without the marker, config-write again. Wherever the
connection drops, config-get or the saved file (the one a restart reads) holds the new reservations, and the
one that is not yet clean shows the marker: a run that finds it served (Backend.unapplied) finishes the
sequence from its first config-write, so the file ends equal to what Kea serves. A marker only in the file
comes back with the next restart of Kea and is finished then; what Kea serves is right meanwhile.
"""

from __future__ import annotations

import copy
import ipaddress

from .backend import Backend
from .http import HttpClient
from .model import ApplyError, Lease, Plan, Reservation, RouterError, ip4, norm_mac

# The key gpulab adds to Dhcp4's user-context while a written configuration is not yet saved (module doc)
MARKER = "gpulab-unsaved"


class KeaBackend(Backend):
    kind = "kea"
    unapplied_note = (
        "saved Kea's configuration, which a cut-off run had left served but not saved (config-write), so a "
        "restart of Kea keeps the reservations"
    )
    unapplied_check_note = (
        "would save Kea's configuration, which a cut-off run left served but not saved (config-write); "
        "a restart of Kea would lose the reservations until then"
    )

    def __init__(
        self,
        url: str,
        *,
        user: str | None = None,
        password: str | None = None,
        validate_certs: bool = True,
        service: str | None = "dhcp4",
        subnet_id: int | None = None,
        config_write: bool = True,
        **kw,
    ):
        super().__init__(**kw)
        auth = (user, password) if user and password else None
        self.http = HttpClient(url, router=self.name, auth=auth, verify=validate_certs, secrets=[password])
        self.service = service
        self.subnet_id = subnet_id
        self.config_write = config_write
        self._config: dict | None = None

    # --- protocol -------------------------------------------------------------------------------
    def command(self, command: str, arguments: dict | None = None, *, doing: str, ok=(0,)) -> dict:
        body: dict = {"command": command}
        if self.service:
            body["service"] = [self.service]
        if arguments is not None:
            body["arguments"] = arguments
        reply = self.http.json(
            "POST", "/", json=body, doing=doing, headers={"Content-Type": "application/json"}
        )
        if isinstance(reply, list):
            reply = reply[0] if reply else {}
        if not isinstance(reply, dict) or "result" not in reply:
            raise RouterError(self.http.mask(f"{doing}: unexpected answer from Kea: {reply!r:.300}"))
        if reply["result"] not in ok:
            raise RouterError(
                self.http.mask(f"{doing}: Kea answered result {reply['result']}: {reply.get('text', '')}")
            )
        return reply

    def _subnet(self, config: dict) -> dict:
        subnets = config.get("Dhcp4", {}).get("subnet4", [])
        if self.subnet_id is not None:
            found = [s for s in subnets if s.get("id") == self.subnet_id]
            how = f"id {self.subnet_id}"
        elif self.subnet is not None:
            found = [s for s in subnets if ipaddress.IPv4Network(s["subnet"], strict=False) == self.subnet]
            how = str(self.subnet)
        else:
            found = subnets if len(subnets) == 1 else []
            how = "the only subnet"
        if len(found) != 1:
            have = ", ".join(f"{s.get('id')}={s.get('subnet')}" for s in subnets) or "none"
            raise RouterError(
                f"Kea has no subnet4 matching {how} (it has {have}); set router_kea_subnet_id or "
                "router_subnet to the subnet the VMs live in"
            )
        return found[0]

    # --- reads ----------------------------------------------------------------------------------
    def load_config(self) -> dict:
        reply = self.command("config-get", doing="reading Kea's configuration (config-get)")
        config = reply.get("arguments") or {}
        config.pop("hash", None)  # Kea >= 2.4 adds it; config-set/test do not take it
        self._config = config
        return config

    def list_reservations(self) -> list[Reservation]:
        subnet = self._subnet(self.load_config())
        out = []
        for n, r in enumerate(subnet.get("reservations") or []):
            if "hw-address" not in r or "ip-address" not in r:
                continue  # client-id / circuit-id / flex-id reservations are not ours to judge
            out.append(
                Reservation(
                    norm_mac(r["hw-address"]), ip4(r["ip-address"]), r.get("hostname") or None, str(n)
                )
            )
        return out

    def list_leases(self) -> list[Lease]:
        args = {"subnets": [self._subnet(self._config or self.load_config())["id"]]}
        reply = self.command(
            "lease4-get-all", args, doing="reading Kea's leases (lease4-get-all)", ok=(0, 2, 3)
        )
        if reply["result"] == 2:
            return []  # lease_cmds hook not loaded: keep mode then relies on the address the VM reports
        out = []
        for lease in (reply.get("arguments") or {}).get("leases", []):
            if lease.get("state", 0) != 0 or not lease.get("hw-address"):
                continue  # declined or expired-reclaimed
            expires = lease.get("cltt", 0) + lease.get("valid-lft", 0) if lease.get("cltt") else None
            out.append(
                Lease(
                    norm_mac(lease["hw-address"]),
                    ip4(lease["ip-address"]),
                    lease.get("hostname") or None,
                    expires,
                )
            )
        return out

    # --- writes ---------------------------------------------------------------------------------
    def render(self, plan: Plan) -> dict:
        config = copy.deepcopy(self._config if self._config is not None else self.load_config())
        subnet = self._subnet(config)
        entries = list(subnet.get("reservations") or [])
        drop = set()
        for c in plan.changes:
            if c.action == "update":
                entry = dict(entries[int(c.before.ref)])
                entry["ip-address"] = str(c.after.ip)
                if c.after.hostname:
                    entry["hostname"] = c.after.hostname
                entries[int(c.before.ref)] = entry
            elif c.action == "delete":
                drop.add(int(c.before.ref))
        entries = [e for n, e in enumerate(entries) if n not in drop]
        for c in plan.changes:
            if c.action == "create":
                entry = {"hw-address": c.after.mac, "ip-address": str(c.after.ip)}
                if c.after.hostname:
                    entry["hostname"] = c.after.hostname
                entries.append(entry)
        subnet["reservations"] = entries
        return config

    def _test(self, config: dict) -> None:
        reply = self.command("config-test", config, doing="testing the new configuration", ok=(0, 1))
        if reply["result"] != 0:
            raise ApplyError(
                self.http.mask(
                    f"Kea's config-test refused the new reservations, so nothing was changed: {reply.get('text')}"
                )
            )

    def dry_run(self, plan: Plan) -> None:
        self._test(self.render(plan))

    def write(self, plan: Plan) -> None:
        config = self.render(plan)
        if self.config_write:
            config = marked(config, True)
        self._test(config)
        self._set(config, "applying the new configuration")
        if self.config_write:
            self._finish(config)

    def _set(self, config: dict, doing: str) -> None:
        reply = self.command("config-set", config, doing=doing, ok=(0, 1))
        if reply["result"] != 0:
            try:
                self.command("config-reload", doing="restoring the configuration on disk (config-reload)")
                restored = "its configuration file was reloaded"
            except RouterError as e:
                restored = f"config-reload failed too ({e}); restart kea-dhcp4 now"
            raise ApplyError(
                self.http.mask(
                    f"Kea refused config-set after a passing config-test: {reply.get('text')}; {restored}"
                )
            )

    def _save(self) -> None:
        reply = self.command("config-write", {}, doing="saving the configuration", ok=(0, 1))
        if reply["result"] != 0:
            raise ApplyError(
                self.http.mask(
                    f"Kea serves the new reservations but could not save them (config-write: "
                    f"{reply.get('text')}); they are lost on restart. Let Kea write its config file, then run again"
                )
            )

    def _finish(self, config: dict) -> None:
        """Save a configuration Kea serves with MARKER, then serve and save it without (module doc)."""
        self._save()  # from here the file holds the new reservations, whatever comes next
        self._set(marked(config, False), "clearing gpulab's unsaved marker (config-set)")
        self._save()

    def unapplied(self) -> bool:
        config = self._config if self._config is not None else self.load_config()
        return self.config_write and MARKER in (config.get("Dhcp4", {}).get("user-context") or {})

    def _apply(self) -> None:
        # Backend.apply calls this when unapplied(): a cut-off run's marked configuration is served
        self._finish(copy.deepcopy(self._config if self._config is not None else self.load_config()))

    def close(self) -> None:
        self.http.close()


def marked(config: dict, on: bool) -> dict:
    """A copy of `config` with MARKER set in (on) or taken out of (off) Dhcp4's user-context; other
    user-context keys stay as they are, and a user-context left empty goes (as before gpulab marked it)."""
    config = copy.deepcopy(config)
    dhcp4 = config.setdefault("Dhcp4", {})
    context = dict(dhcp4.get("user-context") or {})
    if on:
        context[MARKER] = "a gpulab run config-set this; it is not config-written yet"
    else:
        context.pop(MARKER, None)
    if context:
        dhcp4["user-context"] = context
    else:
        dhcp4.pop("user-context", None)
    return config
