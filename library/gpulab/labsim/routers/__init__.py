"""Simulators of the HTTP routers gpulab can drive (the SSH and Kea ones run for real).

    python -m gpulab.labsim.routers KIND [--port N] [--user U] [--password P] [--tls-dir DIR] [--log FILE]

serves one simulator on 127.0.0.1 until interrupted and prints its URL. KIND is one of SIMULATORS.
"""

from __future__ import annotations

from .huawei import HuaweiOntSim
from .mikrotik import MikroTikSim
from .opnsense import OPNsenseSim
from .pfsense import PfSenseSim

SIMULATORS = {
    "mikrotik": MikroTikSim,
    "opnsense": OPNsenseSim,
    "pfsense": PfSenseSim,
    "huawei_ont": HuaweiOntSim,
}

__all__ = ["SIMULATORS", "HuaweiOntSim", "MikroTikSim", "OPNsenseSim", "PfSenseSim"]
