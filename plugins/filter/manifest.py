"""Filters of the roles' manifest templates (roles/*/templates/*.yaml.j2), which write YAML as PyYAML does.

`value | yaml_scalar` is one scalar as PyYAML writes it as the value of a block mapping: plain when YAML reads it
back as the same string (`hami`, `2.10.0`), quoted otherwise (`'2.10'`, `'on'`, `''`), so a manifest rendered from
a template keeps the bytes of one gpulab dumped in Python, and a version or name keeps its type.
`value | yaml_scalar(indent, key)` writes it where it stands, as the value of `key` in a block mapping whose keys
start at column `indent` (key `-`: an item of a sequence whose dash is there), folded past column 80 as PyYAML
folds it (gpulab.k8s.template.yaml_scalar, which the engine uses when it renders the same templates).
`values | helm_values_content` is a chart's values as the YAML text of a HelmChart's valuesContent
(gpulab.hami.values_content: key order kept, strings YAML 1.1 would read otherwise quoted).
"""

from __future__ import annotations

import json
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.gpulab.homelab.plugins.plugin_utils.engine import MissingEngine

try:
    from gpulab import hami
    from gpulab.k8s import template
except ImportError as err:  # the engine runs here, on the controller: requirements.txt
    hami = template = MissingEngine(err)


def _plain(value: Any) -> Any:
    """The value as plain Python types: Ansible's tagged strings and mappings are subclasses that PyYAML's safe
    dumper refuses."""
    return json.loads(json.dumps(value))


def yaml_scalar(value: Any, indent: int = 0, key: str = "v") -> str:
    try:
        return template.yaml_scalar(_plain(value), indent, key)
    except template.TemplateError as err:
        raise AnsibleFilterError(str(err)) from err


def helm_values_content(values: Any) -> str:
    if not isinstance(values, dict):
        raise AnsibleFilterError(f"helm_values_content: the chart values must be a mapping, not {values!r}")
    return hami.values_content(_plain(values))


class FilterModule:
    def filters(self):
        return {"yaml_scalar": yaml_scalar, "helm_values_content": helm_values_content}
