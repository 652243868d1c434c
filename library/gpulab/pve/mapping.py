"""Cluster-wide PCI resource mappings (`/cluster/mapping/pci`): one entry per GPU, so that an API token
can attach the card to a VM (`hostpciN: mapping=<id>`); tokens are refused raw `host=` devices."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpulab.pve import propstr
from gpulab.pve.client import PveClient

_PATH_RE = re.compile(
    r"^(?:[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?;)*[a-f0-9]{4,}:[a-f0-9]{2}:[a-f0-9]{2}(?:\.[a-f0-9])?$"
)
_ID_RE = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{4}$")
_MAP_ID_RE = re.compile(r"^[a-z][a-z0-9_-]+$", re.I)
_KEY_ORDER = ("node", "path", "id", "iommugroup", "subsystem-id", "description")


class MappingError(Exception):
    pass


def map_entry(entry: Mapping[str, Any]) -> str:
    """One `map` item from {node, path, id (vendor:device), iommugroup, subsystem_id, description}."""
    path = str(entry["path"]).lower()
    if not _PATH_RE.match(path):
        raise MappingError(f"path {entry['path']!r} must carry its domain, like 0000:02:00 (all functions)")
    vid = str(entry["id"]).lower().replace("0x", "")
    if not _ID_RE.match(vid):
        raise MappingError(f"id {entry['id']!r} must be vendor:device like 10de:2204")
    props = {"node": str(entry["node"]), "path": path, "id": vid}
    if entry.get("iommugroup") is not None:
        props["iommugroup"] = str(int(entry["iommugroup"]))
    if entry.get("subsystem_id"):
        props["subsystem-id"] = str(entry["subsystem_id"]).lower().replace("0x", "")
    if entry.get("description"):
        props["description"] = str(entry["description"])
    return ",".join(f"{k}={props[k]}" for k in _KEY_ORDER if k in props)


def normalise_map(item: str) -> str:
    try:
        props = propstr.parse(item)
    except propstr.PropertyStringError:
        return item
    for key in ("path", "id", "subsystem-id"):
        if key in props:
            props[key] = props[key].lower()
    return ",".join(
        f"{k}={props[k]}" for k in (*_KEY_ORDER, *sorted(set(props) - set(_KEY_ORDER))) if k in props
    )


def _canon(entry: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    maps = entry.get("map") or []
    if isinstance(maps, str):
        maps = [maps]
    return {"map": sorted(normalise_map(m) for m in maps), "description": entry.get("description") or ""}


@dataclass
class MappingResult:
    changed: bool = False
    id: str = ""
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)


def ensure_pci_mapping(
    client: PveClient,
    *,
    mapping_id: str,
    entries: list[Mapping[str, Any]],
    description: str | None = None,
    state: str = "present",
    check_mode: bool = False,
) -> MappingResult:
    if not _MAP_ID_RE.match(mapping_id):
        raise MappingError(f"mapping id {mapping_id!r} must start with a letter: [a-z][a-z0-9_-]+")
    res = MappingResult(id=mapping_id)
    listing = client.get("cluster/mapping/pci") or []
    current = next((m for m in listing if m.get("id") == mapping_id), None)
    res.before = _canon(current)
    if state == "absent":
        res.after = None
        res.changed = current is not None
        if res.changed and not check_mode:
            client.delete(f"cluster/mapping/pci/{mapping_id}")
        return res
    if not entries:
        raise MappingError(f"mapping {mapping_id!r} needs at least one map entry")
    maps = [map_entry(e) for e in entries]
    desired = {"map": sorted(normalise_map(m) for m in maps), "description": description or ""}
    if description is None and res.before is not None:
        desired["description"] = res.before["description"]
    res.after = desired
    res.changed = res.before != desired
    if not res.changed or check_mode:
        return res
    params: dict[str, Any] = {"map": maps}
    if description:
        params["description"] = description
    if current is None:
        client.post("cluster/mapping/pci", id=mapping_id, **params)
    else:
        if description == "" and res.before and res.before["description"]:
            params["delete"] = "description"
        if current.get("digest"):
            params["digest"] = current["digest"]
        client.put(f"cluster/mapping/pci/{mapping_id}", **params)
    return res
