"""The PVE API simulator's mapping room: ``/cluster/mapping/pci`` (the cluster's PCI resource mappings, with
``check-node`` checks against a node's hardware), and the config a started VM's hooks see with each mapped
device resolved to the node's address.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from labsim.pve_common import ApiError, check_digest
from labsim.pve_schema import ParamError


class MappingHandlers:
    """The PCI resource mappings (the state's ``mappings``).

    Mixed into labsim.pve_api.PveApiSim; it uses the sim's ``state``, ``lock`` and ``schema``, and the nodes
    room's ``_pci_functions``."""

    state: Any
    schema: Any

    def _render_mappings(self) -> str:
        lines = []
        for mid, m in sorted(self.state.data["mappings"].items()):
            lines.append(mid)
            lines += [f"\tmap {e}" for e in m["map"]]
            for k in ("description", "live-migration-capable", "mdev"):
                if k in m:
                    lines.append(f"\t{k} {m[k]}")
            lines.append("")
        return "\n".join(lines) + "\n"

    def _mappings_digest(self) -> str:
        return hashlib.sha1(self._render_mappings().encode()).hexdigest()

    def _map_format(self) -> dict:
        info = self.schema.endpoints["/cluster/mapping/pci"]["POST"]
        return info["parameters"]["properties"]["map"]["items"]["format"]

    def _map_entries(self, mapping: dict) -> list[dict]:
        return [self.schema.parse_property_string(self._map_format(), e, "map") for e in mapping["map"]]

    def _mapping_checks(self, mid: str, mapping: dict, node: str) -> list[dict]:
        entries = self._map_entries(mapping)
        mine = [e for e in entries if e["node"] == node]
        if not mine:
            return [{"severity": "warning", "message": f"No mapping for node {node}."}]
        checks = []
        for e in mine:
            first = e["path"].split(";")[0]
            devs = self._pci_functions(node, first)
            if not devs:
                fn = first if "." in first.split(":")[-1] else first + ".0"
                checks.append({"severity": "error", "message": f"pci device '{fn}' not found\n"})
                continue
            dev = devs[0]
            want_id = f"{dev['vendor'][2:]}:{dev['device'][2:]}"
            if e["id"].lower() != want_id:
                checks.append(
                    {
                        "severity": "error",
                        "message": f"Invalid configuration: 'id' does not match for '{mid}' ({e['id']} != {want_id})\n",
                    }
                )
            if "subsystem_vendor" in dev:
                want_sub = f"{dev['subsystem_vendor'][2:]}:{dev['subsystem_device'][2:]}"
                if "subsystem-id" not in e:
                    checks.append(
                        {
                            "severity": "error",
                            "message": f"missing expected property 'subsystem-id' for device '{dev['id']}'\n",
                        }
                    )
                elif e["subsystem-id"].lower() != want_sub:
                    checks.append(
                        {
                            "severity": "error",
                            "message": "Invalid configuration: 'subsystem-id' does not match "
                            f"for '{mid}' ({e['subsystem-id']} != {want_sub})\n",
                        }
                    )
            if "iommugroup" in e and int(e["iommugroup"]) != int(dev["iommugroup"]):
                checks.append(
                    {
                        "severity": "error",
                        "message": "Invalid configuration: 'iommugroup' does not match "
                        f"for '{mid}' ({e['iommugroup']} != {dev['iommugroup']})\n",
                    }
                )
        return checks

    def h_get_cluster_mapping_pci(self, args, who):
        out = []
        digest = self._mappings_digest()
        for mid, m in sorted(self.state.data["mappings"].items()):
            if not who.has(f"/mapping/pci/{mid}", ["Mapping.Modify", "Mapping.Use", "Mapping.Audit"], True):
                continue
            item = {"id": mid, "type": "pci", "digest": digest, "map": list(m["map"])}
            for k in ("description", "mdev", "live-migration-capable"):
                if k in m:
                    item[k] = m[k]
            if "check-node" in args:
                item["checks"] = self._mapping_checks(mid, m, args["check-node"])
            out.append(item)
        return out

    def h_post_cluster_mapping_pci(self, args, who):
        mid = args["id"]
        with self.lock:
            if mid in self.state.data["mappings"]:
                raise ApiError(500, f"pci ID '{mid}' already defined")
            entry = {"map": self._check_map_entries(args["map"])}
            for k in ("description", "mdev", "live-migration-capable"):
                if k in args:
                    entry[k] = args[k]
            self.state.data["mappings"][mid] = entry
            self.state.mark()
        return None

    def _check_map_entries(self, entries: list[str]) -> list[str]:
        nodes = set()
        for e in entries:
            try:
                parsed = self.schema.parse_property_string(self._map_format(), e, "map")
            except ParamError as exc:
                raise ApiError(
                    400, "Parameter verification failed.", {"map": "invalid format - " + exc.errors["map"]}
                ) from exc
            if parsed["node"] in nodes:
                raise ApiError(
                    400,
                    "Parameter verification failed.",
                    {"map": f"duplicate mapping for node '{parsed['node']}'"},
                )
            nodes.add(parsed["node"])
        return list(entries)

    def h_get_cluster_mapping_pci_id(self, args, who):
        m = self.state.data["mappings"].get(args["id"])
        if m is None:
            raise ApiError(500, f"PCI mapping '{args['id']}' not found")
        return {"id": args["id"], "type": "pci", "digest": self._mappings_digest(), **m}

    def h_put_cluster_mapping_pci_id(self, args, who):
        with self.lock:
            m = self.state.data["mappings"].get(args["id"])
            if m is None:
                raise ApiError(500, f"PCI mapping '{args['id']}' not found")
            check_digest(args, self._mappings_digest())
            for k in filter(None, re.split(r"[,;\s]+", args.get("delete", ""))):
                if k == "map":
                    raise ApiError(
                        400,
                        "Parameter verification failed.",
                        {"delete": "cannot delete required property 'map'"},
                    )
                m.pop(k, None)
            if "map" in args:
                m["map"] = self._check_map_entries(args["map"])
            for k in ("description", "mdev", "live-migration-capable"):
                if k in args:
                    m[k] = args[k]
            self.state.mark()
        return None

    def h_delete_cluster_mapping_pci_id(self, args, who):
        with self.lock:
            if self.state.data["mappings"].pop(args["id"], None) is None:
                raise ApiError(500, f"PCI mapping '{args['id']}' not found")
            self.state.mark()
        return None

    # ---------------------------------------------------------------------------- what a start sees
    def hook_config(self, node: str, config: dict) -> dict:
        """A copy of a VM's config as the VM hooks see it start: each ``hostpciN`` through a resource mapping
        is spelt with the device path of the map entry for this node in front (``host=0000:05:00,mapping=
        rtx3060,pcie=1``), the device QEMU gets once qemu-server resolved the mapping; an entry with no such
        entry stays as it is. Call with the lock held."""
        out = dict(config)
        for key, value in config.items():
            if not re.fullmatch(r"hostpci\d+", key):
                continue
            parts = str(value).split(",")
            mid = next((p.removeprefix("mapping=") for p in parts if p.startswith("mapping=")), None)
            mapping = self.state.data["mappings"].get(mid) if mid else None
            entry = (
                next((e for e in self._map_entries(mapping) if e["node"] == node), None) if mapping else None
            )
            if entry is not None:
                out[key] = ",".join([f"host={entry['path']}", *parts])
        return out
