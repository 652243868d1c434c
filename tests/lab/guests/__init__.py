"""The lab tests of guests (tests/unit/guests has the others)."""
