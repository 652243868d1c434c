"""The fixtures (and hooks) of tests/unit/host/conftest.py for host's lab tests: defined once, there."""

from unit.host.conftest import (  # noqa: F401
    cmdline_mod,
    facts_mod,
)
