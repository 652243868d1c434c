"""The e2e tests' lab: one real simulated lab per test module, torn down even on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import RunningLab, lab_down, lab_up, need_root


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    need_root()
    state = tmp_path_factory.mktemp("lab")
    try:
        yield lab_up(state)
    finally:
        lab_down(state)


@pytest.fixture(scope="module")
def homelab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    """The lab as the user has it before gpulab (fixture homelab: VMs made by hand, leases held)."""
    need_root()
    state = tmp_path_factory.mktemp("lab")
    try:
        yield lab_up(state, Path("homelab"))
    finally:
        lab_down(state)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    """A lab node without gpulab's API access yet (fixture access.bootstrap false): no user, role or token."""
    need_root()
    root = tmp_path_factory.mktemp("bare")
    fixture = root / "bare.yml"
    fixture.write_text("extends: reference\naccess:\n  bootstrap: false\n")
    state = root / "lab"
    try:
        yield lab_up(state, fixture)
    finally:
        lab_down(state)
