"""The fixtures (and hooks) of tests/unit/guests/conftest.py for guests's lab tests: defined once, there."""

from unit.guests.conftest import (  # noqa: F401
    gpu_facts,
)
