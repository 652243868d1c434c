"""The fixtures (and hooks) of tests/unit/discover/conftest.py for discover's lab tests: defined once, there."""

from unit.discover.conftest import (  # noqa: F401
    homelab_sim,
    reference_sim,
)
