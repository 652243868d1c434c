"""The unit tests of labsim (tests/lab/labsim has the others)."""
