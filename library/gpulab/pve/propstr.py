"""Property strings, the `k=v,k=v` values PVE uses for compound config keys (net0, scsi0, hostpci0, ...).

`parse` turns a string into an ordered dict, resolving the default key, key aliases and the `keyAlias`
form of network devices (`virtio=AA:BB:..` is `model=virtio,macaddr=AA:BB:..`). `render` writes a dict
back, default key first and without `k=`, the way PVE itself prints it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class PropertyStringError(ValueError):
    """A property string PVE would refuse (duplicate key, unknown bare value, ...)."""


def parse(
    value: str,
    default_key: str | None = None,
    aliases: Mapping[str, str] | None = None,
    key_alias_values: Iterable[str] = (),
    key_alias_target: tuple[str, str] | None = None,
) -> dict[str, str]:
    """Parse `value` into a dict of sub-key -> string.

    default_key: the key a bare part (no `=`) belongs to.
    aliases: old name -> new name (e.g. `volume` -> `file`).
    key_alias_values / key_alias_target: for `virtio=MAC`, the names that, used as a key, mean
    "target[0]=name, target[1]=value" (the net model / macaddr pair).
    """
    aliases = aliases or {}
    key_alias_values = set(key_alias_values)
    result: dict[str, str] = {}
    if value is None:
        return result
    for part in str(value).split(","):
        if part == "":
            continue
        if "=" in part:
            key, val = part.split("=", 1)
        elif default_key is not None:
            key, val = default_key, part
        else:
            raise PropertyStringError(f"value without key: {part!r} in {value!r}")
        key = aliases.get(key, key)
        if key_alias_target is not None and key in key_alias_values:
            pairs = [(key_alias_target[0], key), (key_alias_target[1], val)]
        else:
            pairs = [(key, val)]
        for k, v in pairs:
            if k in result:
                raise PropertyStringError(f"duplicate key {k!r} in {value!r}")
            result[k] = v
    return result


def render(props: Mapping[str, object], default_key: str | None = None) -> str:
    """Write `props` back as a property string, default key first without `k=`, the rest sorted."""
    parts = []
    if default_key is not None and props.get(default_key) is not None:
        value = str(props[default_key])
        # An empty default-key value must stay visible, or it would vanish on the next parse.
        parts.append(value if value else f"{default_key}=")
    for key in sorted(props):
        if key == default_key or props[key] is None:
            continue
        parts.append(f"{key}={props[key]}")
    return ",".join(parts)
