"""Tests that start no lab: the inner loop (`make unit`, under two minutes)."""
