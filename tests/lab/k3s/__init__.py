"""The lab tests of k3s (tests/unit/k3s has the others)."""
