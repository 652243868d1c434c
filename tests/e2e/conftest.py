"""The e2e tests' lab: one real simulated lab per test module, torn down even on failure."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .helpers import RunningLab, running_lab


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    yield from running_lab(tmp_path_factory.mktemp("lab"))


@pytest.fixture(scope="module")
def homelab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    """The lab as the user has it before gpulab (fixture homelab: VMs made by hand, leases held)."""
    yield from running_lab(tmp_path_factory.mktemp("lab"), Path("homelab"))


def _bare_lab(tmp_path_factory: pytest.TempPathFactory, extends: str) -> Iterator[RunningLab]:
    """Fixture `extends` with a node that has no gpulab API access yet (access.bootstrap false)."""
    root = tmp_path_factory.mktemp("bare")
    fixture = root / f"bare-{extends}.yml"
    fixture.write_text(f"extends: {extends}\naccess:\n  bootstrap: false\n")
    yield from running_lab(root / "lab", fixture)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    """A lab node without gpulab's API access yet: no user, role or token."""
    yield from _bare_lab(tmp_path_factory, "reference")


@pytest.fixture(scope="module")
def bare_homelab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningLab]:
    """The user's lab before gpulab (fixture homelab) on a node without gpulab's API access yet."""
    yield from _bare_lab(tmp_path_factory, "homelab")
