"""Strict request validation against the committed PVE API schema subset.

The rules copy pve-common's JSONSchema as described in shared/pve-api/NOTES.md: unknown parameters are
refused, booleans are only 0/1 or JSON true/false, integers match ``^[+-]?\\d+$``, then format, pattern
(anchored, Perl syntax rewritten for Python), length, range and enum are checked in that order; property
strings are parsed (default key, aliases, keyAlias, duplicates) and their sub-keys checked the same way;
``name[n]`` keys are expanded to their real index ranges; ``requires`` is enforced.

`Schema.validate` returns the parameters normalised (booleans and integers as int, numbers as float,
arrays as lists of str) or raises `ParamError` holding PVE's per-parameter ``errors`` map.
"""

from __future__ import annotations

import ipaddress
import json
import re
from functools import cache
from importlib import resources
from typing import Any

SUBSET_FILE = "pve-api-subset.json"

# Index ranges the schema does not record (NOTES.md section 0); named-formats.json carries the same table.
_INDEXED = re.compile(r"^([a-z]+)(\d+)$")


class ParamError(Exception):
    """HTTP 400 "Parameter verification failed." with the per-parameter errors map."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("Parameter verification failed.")
        self.errors = errors


def perl_regex(pattern: str) -> re.Pattern:
    """Compile a schema pattern the way PVE matches it: anchored, with Perl-only syntax rewritten."""
    py = pattern.replace("(?^:", "(?:").replace("\\z", "\\Z")
    return re.compile(rf"^(?:{py})$")


_compiled_patterns: dict[str, re.Pattern] = {}


def _pattern(pattern: str) -> re.Pattern:
    rx = _compiled_patterns.get(pattern)
    if rx is None:
        rx = _compiled_patterns[pattern] = perl_regex(pattern)
    return rx


# ---------------------------------------------------------------- code-validated formats (pve-common)
_DNS_LABEL = r"[a-zA-Z0-9]([a-zA-Z0-9\-]*[a-zA-Z0-9])?"
_HOTPLUG = "network|disk|cpu|memory|usb|cloudinit"
# name: (pattern, with its flags inline, and the message; {v} is the value); compiled once below.
_CODE_FORMAT_PATTERNS = {
    "pve-node": (rf"^{_DNS_LABEL}$", "value does not look like a valid node name"),
    "pve-vmid": (r"^[1-9][0-9]{2,8}$", "value does not look like a valid VM ID"),
    "pve-configid": (r"(?i)^[a-z][a-z0-9_-]+$", "invalid configuration ID '{v}'"),
    "pve-storage-id": (r"(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]$", "storage ID '{v}' contains illegal characters"),
    "pve-bridge-id": (r"^[-_.\w\d]+$", "invalid format - value does not look like a valid bridge"),
    "pve-volume-id": (r"(?i)^[a-z][a-z0-9\-_.]*[a-z0-9]:.+$", "unable to parse volume ID '{v}'"),
    "disk-size": (r"^\d+(\.\d+)?([KMGT](iB)?)?$", "unable to parse size '{v}'"),
    "dns-name": (rf"^(({_DNS_LABEL})\.)*({_DNS_LABEL})$", "value does not look like a valid DNS name"),
    "mac-addr": (
        r"(?i)^[a-f0-9][02468ace](?::[a-f0-9]{2}){5}$",
        "value does not look like a valid unicast MAC address",
    ),
    "urlencoded": (r"^[-%a-zA-Z0-9_.!~*'()]*$", "value '{v}' is not urlencoded"),
    "pve-storage-content": (
        r"^(images|rootdir|vztmpl|iso|backup|snippets|import)$",
        "invalid content type '{v}'",
    ),
    "pve-poolid": (r"^[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+){0,2}$", "invalid pool ID '{v}'"),
    "pve-tag": (r"(?i)^[a-z0-9_][a-z0-9_\-+.]*$", "invalid tag '{v}'"),
    "pve-realm": (r"^[A-Za-z][A-Za-z0-9.\-_]+$", "value does not look like a valid realm"),
    "pve-priv": (r"^[A-Za-z.]+$", "invalid privilege '{v}'"),
    "pve-qm-bootdisk": (r"^(ide|sata|scsi|virtio|efidisk|tpmstate)\d+$", "invalid boot disk '{v}'"),
    "pve-cpuset": (r"^\d+(-\d+)?(,\d+(-\d+)?)*$", "invalid cpuset '{v}'"),
    "pve-hotplug-features": (
        rf"^(0|1|(({_HOTPLUG})(,({_HOTPLUG}))*))$",
        "invalid hotplug feature list '{v}'",
    ),
    "pve-phys-bits": (r"^(host|\d+)$", "invalid phys-bits '{v}'"),
    "pve-qm-bootdev": (r"^(ide|sata|scsi|virtio|net|usb|hostpci)\d+$", "invalid boot device '{v}'"),
    "pve-task-status-type": (r"^.+$", "invalid task status type '{v}'"),
    "storage-pair": (r"^.+$", "invalid storage pair '{v}'"),
    "string": (r"(?s)^.*$", ""),
}
_CODE_FORMATS: dict[str, tuple[re.Pattern, str]] = {
    name: (re.compile(pattern), message) for name, (pattern, message) in _CODE_FORMAT_PATTERNS.items()
}


def _check_ip_list(value: str) -> str | None:
    for item in filter(None, re.split(r"[,;\s]+", value)):
        try:
            ipaddress.ip_address(item)
        except ValueError:
            return f"invalid address '{item}'"
    return None


def _check_cidr(value: str) -> str | None:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return f"invalid CIDR '{value}'"
    return None


def _check_volume_or_path(value: str, allow_special: bool) -> str | None:
    if allow_special and value in ("none", "cdrom"):
        return None
    if value.startswith("/"):
        return None
    return _check_code_format("pve-volume-id", value)


def _check_code_format(name: str, value: str) -> str | None:
    """Return PVE's message when `value` fails the code-validated format `name`, else None."""
    if name.endswith("-opt"):
        return None if value == "" else _check_code_format(name[: -len("-opt")], value)
    if name.endswith("-list"):
        base = name[: -len("-list")]
        for item in filter(None, re.split(r"[,;\s\0]+", value)):
            err = _check_code_format(base, item)
            if err:
                return err
        return None
    if name == "pve-volume-id-or-qm-path":
        return _check_volume_or_path(value, allow_special=True)
    if name == "pve-volume-id-or-absolute-path":
        return _check_volume_or_path(value, allow_special=False)
    if name == "address":
        return _check_ip_list(value)
    if name == "CIDR":
        return _check_cidr(value)
    if name == "pve-phys-bits" and value != "host":
        if not value.isdigit() or not 8 <= int(value) <= 64:
            return f"invalid phys-bits '{value}'"
        return None
    entry = _CODE_FORMATS.get(name)
    if entry is None:
        # A format this subset does not model: accept it (NOTES.md section 7 allows this).
        return None
    rx, message = entry
    if name == "pve-storage-id" and len(value) < 2:
        return message.format(v=value)
    return None if rx.match(value) else message.format(v=value)


# ---------------------------------------------------------------------------------- scalar type checks
_INT_RE = re.compile(r"^[+-]?\d+$")
_NUM_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_PROP_TRUE = {"1", "on", "yes", "true"}
_PROP_FALSE = {"0", "off", "no", "false"}


def _type_check(schema: dict, value: Any, in_property_string: bool) -> tuple[Any, str | None]:
    """Check the JSON-schema type; return (normalised value, error)."""
    kind = schema.get("type", "string")
    if kind == "boolean":
        if isinstance(value, bool):
            return int(value), None
        if isinstance(value, int) and value in (0, 1):
            return value, None
        if isinstance(value, str):
            low = value.lower()
            if value in ("0", "1"):
                return int(value), None
            if in_property_string and low in _PROP_TRUE:
                return 1, None
            if in_property_string and low in _PROP_FALSE:
                return 0, None
        return value, f"type check ('boolean') failed - got '{value}'"
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not _INT_RE.match(str(value)):
            return value, f"type check ('integer') failed - got '{value}'"
        return int(value), None
    if kind == "number":
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float, str))
            or not _NUM_RE.match(str(value))
        ):
            return value, f"type check ('number') failed - got '{value}'"
        return float(value), None
    if kind == "string":
        if isinstance(value, (dict, list)):
            return value, "type check ('string') failed - got an array or object"
        if isinstance(value, bool):
            return str(int(value)), None
        return str(value), None
    return value, None


def _constraints(schema: dict, value: Any) -> str | None:
    """Format, pattern, lengths, range and enum, in PVE's order. `value` is already type-normalised."""
    if isinstance(value, str):
        pattern = schema.get("pattern")
        if pattern and not _pattern(pattern).match(value):
            return "value does not match the regex pattern"
        if "maxLength" in schema and len(value) > int(schema["maxLength"]):
            return f"value may only be {schema['maxLength']} characters long"
        if "minLength" in schema and len(value) < int(schema["minLength"]):
            return f"value must be at least {schema['minLength']} characters long"
    if isinstance(value, (int, float)):
        if "minimum" in schema and value < float(schema["minimum"]):
            return f"value must have a minimum value of {schema['minimum']}"
        if "maximum" in schema and value > float(schema["maximum"]):
            return f"value must have a maximum value of {schema['maximum']}"
    enum = schema.get("enum")
    if enum and str(value) not in [str(e) for e in enum]:
        return f"value '{value}' does not have a value in the enumeration '{', '.join(map(str, enum))}'"
    return None


class Schema:
    """The served endpoints of the PVE API and the validator for their parameters."""

    def __init__(self, data: dict):
        self.data = data
        self.endpoints: dict[str, dict] = data["endpoints"]
        self.hash_formats: dict[str, Any] = data["hash_formats"]
        self.index_ranges: dict[str, tuple[int, int]] = {
            k: tuple(int(x) for x in v.split("-")) for k, v in data["index_ranges"].items()
        }
        self._routes = [
            (re.compile("^" + re.sub(r"\\\{([a-z_-]+)\\\}", r"(?P<\1>[^/]+)", re.escape(p)) + "$"), p)
            for p in self.endpoints
        ]
        ide_fmt = self.endpoints["/nodes/{node}/qemu"]["POST"]["parameters"]["properties"]["ide[n]"]["format"]
        self.named: dict[str, dict] = {
            "pve-qm-hostpci": self.hash_formats["pve-qm-hostpci"],
            "pve-qm-boot": self.hash_formats["pve-qm-boot"],
            "pve-vm-cpu-conf": self.hash_formats["pve-vm-cpu-conf"],
            "pve-qm-ide": ide_fmt,
            "pve-qm-ipconfig": {
                "ip": {"type": "string", "optional": 1},
                "gw": {"type": "string", "optional": 1},
                "ip6": {"type": "string", "optional": 1},
                "gw6": {"type": "string", "optional": 1},
            },
            "pve-startup-order": {
                "order": {"type": "integer", "optional": 1, "default_key": 1, "minimum": 0},
                "up": {"type": "integer", "optional": 1, "minimum": 0},
                "down": {"type": "integer", "optional": 1, "minimum": 0},
            },
        }

    # ------------------------------------------------------------------------------------ routing
    def route(self, path: str) -> tuple[str, dict[str, str]] | None:
        """Find the schema path template for a request path; return (template, path params)."""
        for rx, template in self._routes:
            m = rx.match(path)
            if m:
                return template, m.groupdict()
        return None

    def method(self, template: str, method: str) -> dict | None:
        return self.endpoints.get(template, {}).get(method)

    # ------------------------------------------------------------------------------ validation
    def property_schema(self, properties: dict, key: str) -> dict | None:
        """The schema of parameter `key`, expanding ``name[n]`` keys to their real index ranges."""
        if key in properties:
            return properties[key]
        m = _INDEXED.match(key)
        if m and f"{m.group(1)}[n]" in properties:
            low, high = self.index_ranges.get(m.group(1), (0, -1))
            if low <= int(m.group(2)) <= high and str(int(m.group(2))) == m.group(2):
                return properties[f"{m.group(1)}[n]"]
        return None

    def validate(self, info: dict, params: dict[str, Any]) -> dict[str, Any]:
        """Validate request parameters against a method schema; return them normalised."""
        spec = info.get("parameters") or {}
        properties: dict = spec.get("properties") or {}
        errors: dict[str, str] = {}
        out: dict[str, Any] = {}
        for key, raw in params.items():
            schema = self.property_schema(properties, key)
            if schema is None:
                if not spec.get("additionalProperties", 0):
                    errors[key] = (
                        "property is not defined in schema and the schema does not allow additional properties"
                    )
                continue
            value, err = self.check_value(schema, raw, key)
            if err:
                errors[key] = err
            else:
                out[key] = value
        for key, schema in properties.items():
            if "[n]" in key or schema.get("optional"):
                continue
            if key not in params and key not in errors:
                errors[key] = "property is missing and it is not optional"
        for key in list(out):
            schema = self.property_schema(properties, key) or {}
            req = schema.get("requires")
            if req and req not in params and req not in errors:
                errors[req] = f"missing property - '{key}' requires this property"
        if errors:
            raise ParamError(errors)
        return out

    def check_value(self, schema: dict, raw: Any, key: str) -> tuple[Any, str | None]:
        kind = schema.get("type", "string")
        if kind == "array":
            items = raw if isinstance(raw, list) else [raw]
            item_schema = schema.get("items") or {"type": "string"}
            out = []
            for item in items:
                value, err = self.check_value(item_schema, item, key)
                if err:
                    return raw, err
                out.append(value)
            return out, None
        if kind == "string" and isinstance(raw, list):
            fmt = schema.get("format")
            if isinstance(fmt, str) and fmt.endswith("-list"):
                raw = ",".join(str(x) for x in raw)
            elif len(raw) == 1:
                raw = raw[0]
        value, err = _type_check(schema, raw, in_property_string=False)
        if err:
            return value, err
        err = self._format_check(schema, value, key)
        if err:
            return value, err
        return value, _constraints(schema, value)

    def _format_check(self, schema: dict, value: Any, key: str) -> str | None:
        fmt = schema.get("format")
        if fmt is None or not isinstance(value, str):
            return None
        if isinstance(fmt, dict):
            return self._property_string_error(fmt, value, key)
        if fmt in self.named:
            return self._property_string_error(self.named[fmt], value, key)
        return _check_code_format(fmt, value)

    def _property_string_error(self, fmt: dict, value: str, key: str) -> str | None:
        try:
            self.parse_property_string(fmt, value, key)
        except ParamError as exc:
            return "invalid format - " + exc.errors[key]
        return None

    def format_of(self, schema: dict) -> dict | None:
        """The sub-key table of a property-string schema (inline dict or named hash format)."""
        fmt = schema.get("format")
        if isinstance(fmt, dict):
            return fmt
        if isinstance(fmt, str):
            return self.named.get(fmt)
        return None

    def parse_property_string(self, fmt: dict, value: str, key: str = "value") -> dict[str, Any]:
        """Parse `value` with sub-key table `fmt` as pve-common does; raise ParamError({key: msg})."""
        raw: dict[str, str] = {}
        default_key = next((k for k, s in fmt.items() if s.get("default_key")), None)
        for part in value.split(","):
            if part.strip() == "":
                continue
            if "=" in part:
                k, v = part.split("=", 1)
                sub = fmt.get(k)
                if sub and "alias" in sub:
                    if "keyAlias" in sub:
                        if sub["keyAlias"] in raw:
                            raise ParamError(
                                {key: f"duplicate key in comma-separated list property: {sub['keyAlias']}"}
                            )
                        raw[sub["keyAlias"]] = k
                    k = sub["alias"]
            elif default_key is not None:
                k, v = default_key, part
                if k in raw:
                    raise ParamError({key: f"duplicate key in comma-separated list property: {k}"})
            else:
                raise ParamError({key: "value without key, but schema does not define a default key"})
            if k in raw:
                raise ParamError({key: f"duplicate key in comma-separated list property: {k}"})
            raw[k] = v
        errors = []
        out: dict[str, Any] = {}
        for k, v in raw.items():
            sub = fmt.get(k)
            if sub is None or "alias" in sub:
                errors.append(
                    f"{key}.{k}: property is not defined in schema and the schema does not allow additional properties"
                )
                continue
            val, err = _type_check(sub, v, in_property_string=True)
            if not err and isinstance(val, str):
                sub_fmt = sub.get("format")
                if isinstance(sub_fmt, str) and sub_fmt not in self.named:
                    err = _check_code_format(sub_fmt, val)
            if not err:
                err = _constraints(sub, val)
            if err:
                errors.append(f"{key}.{k}: {err}")
            else:
                out[k] = val
        for k, sub in fmt.items():
            if "alias" in sub or sub.get("optional") or k in raw:
                continue
            errors.append(f"{key}.{k}: property is missing and it is not optional")
        if errors:
            raise ParamError({key: "format error\n" + "\n".join(errors) + "\n"})
        return out


@cache
def load_schema() -> Schema:
    """The committed schema subset (package data), parsed once per process."""
    text = resources.files("labsim").joinpath("data", SUBSET_FILE).read_text()
    return Schema(json.loads(text))
