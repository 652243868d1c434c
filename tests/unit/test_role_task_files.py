"""Roles' task and vars files are lists of steps and settings: no data is built with Jinja statements there.

Data shaping belongs in filter plugins (plugins/filter/, unit-tested), manifests in the roles' templates/.
A `{% for %}` or `{% set %}` inside a task's vars or message is logic no test reaches without a lab.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(
    p
    for p in (ROOT / "roles").glob("*/*/*.yml")
    if p.parent.name in ("tasks", "vars", "defaults", "handlers")
)
STATEMENT = re.compile(r"\{%-?\s*(\w+)")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_jinja_statements_in_role_tasks_or_vars(path):
    found = [
        f"line {n}: {m[1]}"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for m in STATEMENT.finditer(line)
    ]
    assert not found, (
        f"{path.relative_to(ROOT)} builds data with Jinja statements ({', '.join(found)}): move the shaping into a "
        "filter of plugins/filter/ (with a unit test) or the manifest into the role's templates/"
    )


def test_the_roles_are_found():
    assert len(FILES) > 20
