"""The roles' manifest templates rendered by the engine, with the filters they share with Ansible.

A template under roles/*/templates that the engine renders itself (stage workloads' engine.yaml.j2: the plan
validates exactly the text the stage places, and preflight and `gpulab plan` check the same) is rendered here
with Jinja2 set as Ansible's template lookup sets it (trim_blocks, the trailing newline kept, undefined names an
error) and the collection's filters under their full names (gpulab.homelab.yaml_scalar), so the same file gives
the same bytes through either (tests/unit/k3s/test_manifest_templates.py renders it through both).

`yaml_scalar` writes one scalar as PyYAML writes it in a block mapping: plain when YAML reads it back as the
same value, quoted otherwise. PyYAML folds a long scalar at a space past column 80, so where the scalar stands
matters: `indent` and `key` place it as the value of `key` in a block mapping whose keys start at column
`indent` (key "-": as an item of a block sequence whose dash is at `indent`); the text returned holds the
folded lines with their indentation. Without them it stands after `v: ` at column 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import yaml

#: the checkout's roles (as gpulab.labdef.catalogue reads their argument specs)
ROLES_DIR = Path(__file__).resolve().parents[3] / "roles"


class TemplateError(ValueError):
    """A template could not be rendered: a missing variable, a value a filter refuses."""


def plain(value: Any) -> Any:
    """The value as plain Python types: Ansible's tagged strings and mappings are subclasses that PyYAML's safe
    dumper refuses."""
    return json.loads(json.dumps(value))


def yaml_scalar(value: Any, indent: int = 0, key: str = "v") -> str:
    value = plain(value)
    if isinstance(value, (dict, list)):
        raise TemplateError(f"yaml_scalar: {value!r} is not a scalar")
    if indent < 0 or indent % 2:
        raise TemplateError(f"yaml_scalar: indent must be an even number of columns, not {indent!r}")
    # The scalar where it stands: under indent/2 mappings of one key each (PyYAML indents by 2), as the value
    # of `key`, or as the item of a sequence, which PyYAML writes under its key without indentation.
    node: Any = {"s": [value]} if key == "-" else {key: value}
    for _ in range(indent // 2):
        node = {"x": node}
    text = yaml.safe_dump(node, default_flow_style=False, sort_keys=False, width=80)
    lines = text.rstrip("\n").split("\n")
    prefix = " " * indent + ("- " if key == "-" else f"{key}: ")
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            return "\n".join([line[len(prefix) :], *lines[i + 1 :]])
    raise TemplateError(f"yaml_scalar: cannot place {value!r} at column {indent}")  # pragma: no cover


FILTERS = {"gpulab.homelab.yaml_scalar": yaml_scalar}


def environment(folder: Path) -> jinja2.Environment:
    """Jinja2 as Ansible's template lookup runs it, with the collection's filters the templates use."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        trim_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.filters.update(FILTERS)
    return env


def render(path: Path | str, variables: dict[str, Any]) -> str:
    """The template file `path` rendered with `variables`. Raises TemplateError."""
    path = Path(path)
    try:
        return environment(path.parent).get_template(path.name).render(**variables)
    except (jinja2.TemplateError, OSError) as err:
        raise TemplateError(f"template {path}: {err}") from err
