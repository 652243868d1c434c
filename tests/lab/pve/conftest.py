"""The fixtures (and hooks) of tests/unit/pve/conftest.py for pve's lab tests: defined once, there."""

from unit.pve.conftest import (  # noqa: F401
    lab,
    own_lab,
    shared_lab,
)
