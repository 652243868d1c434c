"""Helpers of :mod:`gpulab.labsim.netlab`: addressing, the hosts' PID 1, the node's boot and stand-ins."""
