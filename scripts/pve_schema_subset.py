#!/usr/bin/env python3
"""Make the PVE API schema subset that the simulated lab (labsim) validates against.

Input: a full ``apidoc.json`` (the Proxmox VE API dump, pve-docs ``api-viewer/apidata.js`` as JSON) and
the hand-transcribed supplement ``named-formats.json`` (sub-keys of the named property-string formats,
index ranges of ``name[n]`` keys, regexes of code-validated formats).

Output: one JSON file holding, for every endpoint the simulator serves, the schema's ``info`` for each of
its methods (parameters, permissions, returns, allowtoken, protected), with property descriptions
dropped to keep it small, plus the supplement and a provenance/licence block.

    scripts/pve_schema_subset.py --apidoc ../shared/pve-api/apidoc.json \
        --named-formats ../shared/pve-api/named-formats.json \
        --out library/labsim/data/pve-api-subset.json

The output is deterministic (sorted keys), so re-running it on the same input gives the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

# The endpoints labsim serves; every method the schema lists for them is kept.
SERVED_PATHS = (
    "/version",
    "/access/ticket",
    "/access/roles",
    "/access/roles/{roleid}",
    "/access/users",
    "/access/users/{userid}",
    "/access/users/{userid}/token",
    "/access/users/{userid}/token/{tokenid}",
    "/access/acl",
    "/cluster/resources",
    "/cluster/status",
    "/cluster/nextid",
    "/cluster/mapping/pci",
    "/cluster/mapping/pci/{id}",
    "/nodes",
    "/nodes/{node}/status",
    "/nodes/{node}/qemu",
    "/nodes/{node}/qemu/{vmid}",
    "/nodes/{node}/qemu/{vmid}/config",
    "/nodes/{node}/qemu/{vmid}/pending",
    "/nodes/{node}/qemu/{vmid}/status/current",
    "/nodes/{node}/qemu/{vmid}/status/start",
    "/nodes/{node}/qemu/{vmid}/status/shutdown",
    "/nodes/{node}/qemu/{vmid}/status/stop",
    "/nodes/{node}/qemu/{vmid}/resize",
    "/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces",
    "/nodes/{node}/qemu/{vmid}/agent/file-read",
    "/nodes/{node}/storage",
    "/nodes/{node}/storage/{storage}/status",
    "/nodes/{node}/storage/{storage}/content",
    "/nodes/{node}/storage/{storage}/download-url",
    "/nodes/{node}/query-url-metadata",
    "/nodes/{node}/hardware/pci",
    "/nodes/{node}/vzdump",
    "/nodes/{node}/certificates/info",
    "/nodes/{node}/tasks",
    "/nodes/{node}/tasks/{upid}",
    "/nodes/{node}/tasks/{upid}/status",
    "/nodes/{node}/tasks/{upid}/log",
)

# Keys dropped from every property schema (human text only; validation does not read them).
DROPPED_PROPERTY_KEYS = ("description", "verbose_description")

LICENCE = (
    "AGPL-3.0-or-later. This file is generated from the Proxmox VE API schema "
    "(pve-docs api-viewer/apidata.js, (c) Proxmox Server Solutions GmbH, AGPL-3.0-or-later) and from "
    "named-formats.json, transcribed from qemu-server/pve-common/pve-storage source (AGPL-3.0-or-later). "
    "It is data, kept apart from gpulab's own code; see NOTICE.md beside it."
)


def _index(tree: list[dict]) -> dict[str, dict]:
    """Map every path of the apidoc tree to its ``info`` (method -> method schema)."""
    found: dict[str, dict] = {}
    stack = list(tree)
    while stack:
        node = stack.pop()
        if node.get("info"):
            found[node["path"]] = node["info"]
        stack.extend(node.get("children") or [])
    return found


def _strip(schema):
    """Return a copy of a property schema without its prose (names of properties and sub-keys are kept)."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in DROPPED_PROPERTY_KEYS:
            continue
        if key in ("properties", "format") and isinstance(value, dict):
            out[key] = {name: _strip(sub) for name, sub in value.items()}
        elif key in ("items", "returns", "additionalProperties") and isinstance(value, dict):
            out[key] = _strip(value)
        else:
            out[key] = value
    return out


def _method(info: dict) -> dict:
    out = {k: v for k, v in info.items() if k not in ("parameters", "returns")}
    out["parameters"] = _strip(info.get("parameters") or {})
    out["returns"] = _strip(info.get("returns") or {})
    return out


def build(apidoc_bytes: bytes, named_formats: dict) -> dict:
    index = _index(json.loads(apidoc_bytes))
    missing = [p for p in SERVED_PATHS if p not in index]
    if missing:
        raise SystemExit(f"apidoc.json lacks served paths: {', '.join(missing)}")
    endpoints = {p: {m: _method(i) for m, i in sorted(index[p].items())} for p in SERVED_PATHS}
    return {
        "_provenance": {
            "apidoc_sha256": hashlib.sha256(apidoc_bytes).hexdigest(),
            "apidoc_origin": "proxmox/pve-docs api-viewer/apidata.js (PVE 9.1 series), converted to JSON",
            "named_formats_note": named_formats.get("_note", ""),
            "generator": "scripts/pve_schema_subset.py",
        },
        "_license": LICENCE,
        "endpoints": endpoints,
        "hash_formats": named_formats["hash_formats"],
        "index_ranges": named_formats["index_ranges"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apidoc", required=True, type=Path)
    parser.add_argument("--named-formats", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    subset = build(args.apidoc.read_bytes(), json.loads(args.named_formats.read_text()))
    text = json.dumps(subset, sort_keys=True, indent=1) + "\n"
    args.out.write_text(text)
    methods = sum(len(v) for v in subset["endpoints"].values())
    print(f"wrote {args.out}: {len(subset['endpoints'])} paths, {methods} methods, {len(text)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
