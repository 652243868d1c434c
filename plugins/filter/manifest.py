"""Filters of the roles' manifest templates (roles/*/templates/*.yaml.j2), which write YAML as PyYAML does.

`value | yaml_scalar` is one scalar as PyYAML writes it as the value of a block mapping: plain when YAML reads it
back as the same string (`hami`, `2.10.0`), quoted otherwise (`'2.10'`, `'on'`, `''`), so a manifest rendered from
a template keeps the bytes of one gpulab dumped in Python, and a version or name keeps its type.
`values | helm_values_content` is a chart's values as the YAML text of a HelmChart's valuesContent
(gpulab.hami.values_content: key order kept, strings YAML 1.1 would read otherwise quoted).
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import hami
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    hami = MissingEngine(err)


def _plain(value: Any) -> Any:
    """The value as plain Python types: Ansible's tagged strings and mappings are subclasses that PyYAML's safe
    dumper refuses."""
    return json.loads(json.dumps(value))


def yaml_scalar(value: Any) -> str:
    value = _plain(value)
    if isinstance(value, (dict, list)):
        raise AnsibleFilterError(f"yaml_scalar: {value!r} is not a scalar")
    text = yaml.safe_dump({"v": value}, default_flow_style=False)
    return text[len("v: ") :].rstrip("\n")


def helm_values_content(values: Any) -> str:
    if not isinstance(values, dict):
        raise AnsibleFilterError(f"helm_values_content: the chart values must be a mapping, not {values!r}")
    return hami.values_content(_plain(values))


class FilterModule:
    def filters(self):
        return {"yaml_scalar": yaml_scalar, "helm_values_content": helm_values_content}
