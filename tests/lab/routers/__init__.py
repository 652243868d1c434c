"""The lab tests of routers (tests/unit/routers has the others)."""
