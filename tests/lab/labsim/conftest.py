"""The fixtures (and hooks) of tests/unit/labsim/conftest.py for labsim's lab tests: defined once, there."""

from unit.labsim.conftest import (  # noqa: F401
    api,
    lab,
    pytest_collection_modifyitems,
    root,
)
