"""Helpers of :mod:`labsim.network_lab`: addressing, the hosts' PID 1, the node's boot and stand-ins."""
