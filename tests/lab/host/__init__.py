"""The lab tests of host (tests/unit/host has the others)."""
