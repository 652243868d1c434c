"""A problem of the lab definition (host, field, value, why, fix), the list the checks add to, and the way every
problem message is worded (gpulab.install.answer words its own problems the same way).

A module of its own, below every check: gpulab.labdef.checks runs the checks of vm_checks and node_checks,
and all of them add to one `Problems` list, so none of them imports another for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def described(field: str, value: Any, why: str, fix: str) -> str:
    """A problem as every message says it: FIELD=VALUE: WHY. Fix: FIX. (an unset value as "(not set)")."""
    shown = "(not set)" if value is None else repr(value)
    return f"{field}={shown}: {why}. Fix: {fix}."


class ProblemsError(Exception):
    """Raised with the problems found (`problems`); its message is one problem a line."""

    def __init__(self, problems: list[Any]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


@dataclass(frozen=True)
class Problem:
    host: str
    field: str
    value: Any
    why: str
    fix: str

    def __str__(self) -> str:
        return f"{self.host}: {described(self.field, self.value, self.why, self.fix)}"


class Problems(list[Problem]):
    def add(self, host: str, field: str, value: Any, why: str, fix: str) -> None:
        self.append(Problem(host, field, value, why, fix))


class LabDefinitionError(ProblemsError):
    problems: list[Problem]
