"""The lab tests of labsim (tests/unit/labsim has the others)."""
