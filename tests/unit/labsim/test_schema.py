"""The validator against the committed schema subset: conformance requests built from the schema itself."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from labsim.pve_schema import ParamError, load_schema, perl_regex

ROOT = Path(__file__).resolve().parents[3]
SHARED = ROOT.parent / "shared" / "pve-api"

# Values that satisfy each code-validated format (the validator must accept them).
FORMAT_SAMPLES = {
    "pve-node": "pve",
    "pve-vmid": "100",
    "pve-configid": "abc",
    "pve-storage-id": "local",
    "pve-volume-id": "local:iso/x.iso",
    "pve-volume-id-or-qm-path": "none",
    "pve-volume-id-or-absolute-path": "local:import/x.qcow2",
    "disk-size": "1G",
    "dns-name": "vm-1",
    "mac-addr": "BC:24:11:00:00:01",
    "pve-bridge-id": "vmbr0",
    "pve-storage-content": "iso",
    "pve-storage-content-list": "iso,images",
    "pve-configid-list": "abc,def",
    "pve-tag-list": "tag1;tag2",
    "pve-poolid": "pool1",
    "pve-realm": "pam",
    "pve-priv-list": "VM.Audit",
    "pve-roleid": "Reader",
    "pve-roleid-list": "Reader,PVEAuditor",
    "pve-userid": "reader@pve",
    "pve-userid-list": "reader@pve",
    "pve-tokenid-list": "reader@pve!t1",
    "pve-groupid-list": "admins",
    "email-opt": "reader@example.com",
    "pve-startup-order": "order=1,up=5",
    "pve-hotplug-features": "network,disk",
    "pve-cpuset": "0-3",
    "pve-qm-bootdisk": "scsi0",
    "address-list": "10.0.0.1",
    "CIDR": "10.0.0.0/24",
    "pve-qm-ipconfig": "ip=dhcp",
    "pve-vm-cpu-conf": "host",
    "pve-qm-boot": "order=scsi0",
    "pve-qm-hostpci": "mapping=gpu,pcie=1",
    "pve-qm-ide": "none,media=cdrom",
    "string-list": "05;06",
    "pve-task-status-type-list": "ok",
    "storage-pair-list": "a:b",
    "urlencoded": "abc",
}
PATTERN_CANDIDATES = [
    "1",
    "abc",
    "https://example.org/x.iso",
    "10de:2204",
    "0000:02:00.0",
    "now",
    "1.2",
    "q35",
    "+1G",
    "scsi0",
    "socket",
    "net0=1",
    "0x0123456789abcdef",
    "0123abcd",
    "2M",
]


def sample(schema_obj, key: str):
    """A valid value for a property schema, or None when this generator cannot build one."""
    kind = schema_obj.get("type", "string")
    if schema_obj.get("enum"):
        return str(schema_obj["enum"][0])
    if kind == "boolean":
        return "1"
    if kind == "integer":
        low = schema_obj.get("minimum", 1)
        return str(max(low, 100) if schema_obj.get("format") == "pve-vmid" else low)
    if kind == "number":
        return str(schema_obj.get("minimum", 1))
    if kind == "array":
        return [sample(schema_obj.get("items") or {}, key)]
    fmt = schema_obj.get("format")
    schema = load_schema()
    table = fmt if isinstance(fmt, dict) else schema.named.get(fmt) if isinstance(fmt, str) else None
    if table is not None and not (isinstance(fmt, str) and fmt in FORMAT_SAMPLES):
        parts = []
        for sub, sub_schema in table.items():
            if "alias" in sub_schema or sub_schema.get("optional"):
                continue
            value = sample(sub_schema, sub)
            if value is None:
                return None
            parts.append(f"{sub}={value}")
        return ",".join(parts) if parts else None
    if isinstance(fmt, str):
        return FORMAT_SAMPLES.get(fmt)
    if "pattern" in schema_obj:
        rx = perl_regex(schema_obj["pattern"])
        return next((c for c in PATTERN_CANDIDATES if rx.match(c)), None)
    return "x" * int(schema_obj.get("minLength", 1))


def methods():
    schema = load_schema()
    for path, by_method in sorted(schema.endpoints.items()):
        for method, info in sorted(by_method.items()):
            yield pytest.param(path, method, info, id=f"{method} {path}")


def valid_params(info, include_optional: bool):
    props = (info.get("parameters") or {}).get("properties") or {}
    params, skipped = {}, []
    for key, prop in props.items():
        if prop.get("optional") and not include_optional:
            continue
        name = key.replace("[n]", "0")
        value = sample(prop, name)
        if value is None:
            skipped.append(key)
            continue
        params[name] = value
    return params, skipped


@pytest.mark.parametrize(("path", "method", "info"), list(methods()))
def test_valid_requests_built_from_the_schema_are_accepted(path, method, info):
    schema = load_schema()
    required, skipped = valid_params(info, include_optional=False)
    assert not skipped, f"cannot build required {skipped}"
    schema.validate(info, required)
    full, skipped = valid_params(info, include_optional=True)
    props = (info.get("parameters") or {}).get("properties") or {}
    assert len(skipped) <= len(props) // 4, skipped
    schema.validate(info, full)


# PVE's answer to a parameter the method does not define.
NOT_IN_SCHEMA = "property is not defined in schema and the schema does not allow additional properties"


@pytest.mark.parametrize(("path", "method", "info"), list(methods()))
def test_unknown_parameter_is_refused_everywhere(path, method, info):
    schema = load_schema()
    params, _ = valid_params(info, include_optional=False)
    params["no-such-param"] = "1"
    with pytest.raises(ParamError) as exc:
        schema.validate(info, params)
    assert exc.value.errors == {"no-such-param": NOT_IN_SCHEMA}


@pytest.mark.parametrize(("path", "method", "info"), list(methods()))
def test_missing_required_parameter_is_refused(path, method, info):
    schema = load_schema()
    props = (info.get("parameters") or {}).get("properties") or {}
    required = [k for k, p in props.items() if not p.get("optional") and "[n]" not in k]
    if not required:
        pytest.skip("no required parameter")
    params, _ = valid_params(info, include_optional=False)
    params.pop(required[-1])
    with pytest.raises(ParamError) as exc:
        schema.validate(info, params)
    assert exc.value.errors[required[-1]] == "property is missing and it is not optional"


CREATE = ("/nodes/{node}/qemu", "POST")


def create_info():
    return load_schema().method(*CREATE)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("onboot", "true", "type check ('boolean') failed - got 'true'"),
        ("onboot", "yes", "type check ('boolean') failed - got 'yes'"),
        ("cores", "two", "type check ('integer') failed - got 'two'"),
        ("cores", "0", "value must have a minimum value of 1"),
        ("bios", "uefi", "value 'uefi' does not have a value in the enumeration 'seabios, ovmf'"),
        ("description", "x" * 8193, "value may only be 8192 characters long"),
        ("name", "bad_name!", "value does not look like a valid DNS name"),
        ("hostpci16", "mapping=gpu", NOT_IN_SCHEMA),
        ("net32", "virtio", NOT_IN_SCHEMA),
        ("scsi31", "local-zfs:1", NOT_IN_SCHEMA),
        ("hostpci01", "mapping=gpu", NOT_IN_SCHEMA),
    ],
)
def test_invalid_top_level_values_get_pves_messages(key, value, message):
    with pytest.raises(ParamError) as exc:
        load_schema().validate(create_info(), {"node": "pve", "vmid": "100", key: value})
    assert exc.value.errors == {key: message}


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("net0", "virtio,bridge=vmbr0,colour=red", "net0.colour: property is not defined in schema"),
        ("net0", "virtio,tag=5000", "net0.tag: value must have a maximum value of 4094"),
        ("net0", "virtio=BC:24:11:00:00:01,macaddr=BC:24:11:00:00:02", "duplicate key"),
        (
            "net0",
            "virtio=01:24:11:00:00:01",
            "net0.macaddr: value does not look like a valid unicast MAC address",
        ),
        ("hostpci0", "0000:02:00,pcie=maybe", "hostpci0.pcie: type check ('boolean') failed - got 'maybe'"),
        ("hostpci0", "0000:02:00,x-vga=on,bogus=1", "hostpci0.bogus: property is not defined in schema"),
        ("hostpci0", "02:00.0,vendor-id=10de", "hostpci0.vendor-id: value does not match the regex pattern"),
        ("hostpci0", "0000:0G:00", "hostpci0.host: value does not match the regex pattern"),
        ("cpu", "host,phys-bits=99", "cpu.phys-bits: invalid phys-bits '99'"),
        ("boot", "order=scsi0,legacy=zz", "boot.legacy: value does not match the regex pattern"),
        (
            "efidisk0",
            "local-zfs:1,efitype=8m",
            "efidisk0.efitype: value '8m' does not have a value in the enumeration",
        ),
        ("memory", "current=8", "memory.current: value must have a minimum value of 16"),
        ("agent", "enabled=2", "agent.enabled: type check ('boolean') failed - got '2'"),
        ("scsi0", "size=4G", "scsi0.file: property is missing and it is not optional"),
    ],
)
def test_property_strings_are_parsed_and_checked(key, value, fragment):
    with pytest.raises(ParamError) as exc:
        load_schema().validate(create_info(), {"node": "pve", "vmid": "100", key: value})
    message = exc.value.errors[key]
    assert message.startswith("invalid format - "), message
    assert fragment in message


def test_property_string_booleans_aliases_and_key_alias():
    schema = load_schema()
    fmt = schema.format_of(schema.property_schema(create_info()["parameters"]["properties"], "net0"))
    parsed = schema.parse_property_string(fmt, "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=on", "net0")
    assert parsed == {"model": "virtio", "macaddr": "BC:24:11:AA:BB:CC", "bridge": "vmbr0", "firewall": 1}
    agent = schema.format_of(create_info()["parameters"]["properties"]["agent"])
    assert schema.parse_property_string(agent, "1,guest-fsfreeze=no", "agent") == {
        "enabled": 1,
        "freeze-fs": 0,
    }


def test_json_booleans_and_numbers_are_accepted_and_normalised():
    out = load_schema().validate(
        create_info(), {"node": "pve", "vmid": 100, "onboot": True, "cores": 4, "numa": 0}
    )
    assert out == {"node": "pve", "vmid": 100, "onboot": 1, "cores": 4, "numa": 0}


def test_requires_is_enforced():
    info = load_schema().method("/nodes/{node}/storage/{storage}/download-url", "POST")
    base = {
        "node": "pve",
        "storage": "local",
        "url": "https://x/y.iso",
        "content": "iso",
        "filename": "y.iso",
    }
    with pytest.raises(ParamError) as exc:
        load_schema().validate(info, {**base, "checksum": "ab"})
    assert exc.value.errors == {"checksum-algorithm": "missing property - 'checksum' requires this property"}


def test_list_format_accepts_a_json_array_and_array_type_wraps_a_scalar():
    schema = load_schema()
    update = schema.method("/nodes/{node}/qemu/{vmid}/config", "PUT")
    out = schema.validate(update, {"node": "pve", "vmid": "100", "delete": ["ide2", "net1"]})
    assert out["delete"] == "ide2,net1"
    mapping = schema.method("/cluster/mapping/pci", "POST")
    out = schema.validate(mapping, {"id": "gpu", "map": "node=pve,path=0000:02:00,id=10de:2204"})
    assert out["map"] == ["node=pve,path=0000:02:00,id=10de:2204"]


def test_every_schema_pattern_compiles_in_python():
    patterns = set()

    def walk(obj):
        if isinstance(obj, dict):
            if isinstance(obj.get("pattern"), str):
                patterns.add(obj["pattern"])
            for v in obj.values():
                walk(v)
        elif isinstance(obj, list):
            for v in obj:
                walk(v)

    walk(load_schema().data)
    assert len(patterns) > 15
    for p in patterns:
        assert isinstance(perl_regex(p), re.Pattern)


@pytest.mark.skipif(
    not (SHARED / "apidoc.json").exists(), reason="the full apidoc.json (../shared/pve-api) is absent"
)
def test_generator_reproduces_the_committed_subset(tmp_path):
    out = tmp_path / "subset.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "pve_schema_subset.py"),
            "--apidoc",
            str(SHARED / "apidoc.json"),
            "--named-formats",
            str(SHARED / "named-formats.json"),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    committed = ROOT / "library" / "labsim" / "data" / "pve-api-subset.json"
    assert json.loads(out.read_text()) == json.loads(committed.read_text())
    assert "AGPL-3.0-or-later" in json.loads(committed.read_text())["_license"]


def invalid_variants(prop):
    """(value, expected message) pairs that break one rule of a top-level property schema."""
    kind = prop.get("type", "string")
    out = []
    if kind == "boolean":
        out.append(("true", "type check ('boolean') failed - got 'true'"))
    if kind == "integer":
        out.append(("1.5", "type check ('integer') failed - got '1.5'"))
        if "minimum" in prop:
            out.append(
                (
                    str(int(float(prop["minimum"])) - 1),
                    f"value must have a minimum value of {prop['minimum']}",
                )
            )
        if "maximum" in prop:
            out.append(
                (
                    str(int(float(prop["maximum"])) + 1),
                    f"value must have a maximum value of {prop['maximum']}",
                )
            )
    if kind == "number":
        out.append(("many", "type check ('number') failed - got 'many'"))
    if kind == "string" and prop.get("enum") and not prop.get("format"):  # a format is checked first
        out.append(
            (
                "not-in-enum",
                f"value 'not-in-enum' does not have a value in the enumeration '{', '.join(map(str, prop['enum']))}'",
            )
        )
    if kind == "string" and "maxLength" in prop and not prop.get("format") and not prop.get("pattern"):
        out.append(
            ("a" * (int(prop["maxLength"]) + 1), f"value may only be {prop['maxLength']} characters long")
        )
    if kind == "string" and prop.get("pattern") and not prop.get("format") and not prop.get("enum"):
        out.append(("\n!\n", "value does not match the regex pattern"))
    return out


def invalid_cases():
    for path, by_method in sorted(load_schema().endpoints.items()):
        for method, info in sorted(by_method.items()):
            for key, prop in ((info.get("parameters") or {}).get("properties") or {}).items():
                for value, message in invalid_variants(prop):
                    yield pytest.param(
                        info,
                        key.replace("[n]", "0"),
                        value,
                        message,
                        id=f"{method} {path} {key}={value[:12]!r}",
                    )


@pytest.mark.parametrize(("info", "key", "value", "message"), list(invalid_cases()))
def test_each_kind_of_invalid_value_is_refused_on_every_endpoint(info, key, value, message):
    params, _ = valid_params(info, include_optional=False)
    params[key] = value
    with pytest.raises(ParamError) as exc:
        load_schema().validate(info, params)
    assert exc.value.errors.get(key) == message
