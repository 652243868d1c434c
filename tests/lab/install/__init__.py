"""The lab tests of install (tests/unit/install has the others)."""
