"""The unit tests of labdef."""
