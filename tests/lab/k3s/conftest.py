"""The fixtures (and hooks) of tests/unit/k3s/conftest.py for k3s's lab tests: defined once, there."""

from unit.k3s.conftest import (  # noqa: F401
    nshosts,
    ports,
)
