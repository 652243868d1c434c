"""The lab tests of pve (tests/unit/pve has the others)."""
