"""Helpers of :mod:`labsim.netlab`: addressing, the hosts' PID 1, the node's boot and stand-ins."""
