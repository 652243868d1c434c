"""The lab tests of discover (tests/unit/discover has the others)."""
