"""The fixtures (and hooks) of tests/unit/routers/conftest.py for routers's lab tests: defined once, there."""

from unit.routers.conftest import (  # noqa: F401
    dnsmasq_router,
    kea_router,
    lan,
    sshd,
)
