"""A problem of the lab definition (host, field, value, why, fix) and the list the checks add to.

A module of its own, below every check: gpulab.labdef.checks runs the checks of vm_checks and node_checks,
and all of them add to one `Problems` list, so none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Problem:
    host: str
    field: str
    value: Any
    why: str
    fix: str

    def __str__(self) -> str:
        shown = "(not set)" if self.value is None else repr(self.value)
        return f"{self.host}: {self.field}={shown}: {self.why}. Fix: {self.fix}."


class Problems(list[Problem]):
    def add(self, host: str, field: str, value: Any, why: str, fix: str) -> None:
        self.append(Problem(host, field, value, why, fix))


class LabDefinitionError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
