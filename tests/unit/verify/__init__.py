"""The unit tests of verify."""
