"""Simulators of the HTTP routers gpulab can drive (the SSH and Kea ones run for real).

    python -m labsim.routers KIND [--port N] [--user U] [--password P] [--tls-dir DIR] [--log FILE]

serves one simulator on 127.0.0.1 until interrupted and prints its URL. KIND is one of SIMULATORS.
The classes are imported lazily, so the uci stand-in (`openwrt_uci`) starts fast.
"""

from __future__ import annotations

import importlib

_CLASSES = {
    "MikroTikSim": "mikrotik",
    "OPNsenseSim": "opnsense",
    "PfSenseSim": "pfsense",
    "HuaweiOntSim": "huawei",
}
KINDS = {
    "mikrotik": "MikroTikSim",
    "opnsense": "OPNsenseSim",
    "pfsense": "PfSenseSim",
    "huawei_ont": "HuaweiOntSim",
}

__all__ = ["KINDS", "SIMULATORS", *_CLASSES]


def __getattr__(name: str):
    if name in _CLASSES:
        return getattr(importlib.import_module(f"{__name__}.{_CLASSES[name]}"), name)
    if name == "SIMULATORS":
        return {kind: __getattr__(cls) for kind, cls in KINDS.items()}
    raise AttributeError(name)
