"""Device drivers: wire protocols, device abstractions, kinematics and clock mapping.

Public entry points are imported lazily so that importing ``cellcal.drivers`` does not pull
in every backend's dependencies.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> module that defines it
_LAZY = {
    "connect_tracker": "cellcal.drivers.tracker",
    "TrackerDriver": "cellcal.drivers.tracker",
    "TrackerInfo": "cellcal.drivers.tracker",
    "TrackerMeasurement": "cellcal.drivers.tracker",
    "connect_robot": "cellcal.drivers.robot",
    "RobotDriver": "cellcal.drivers.robot",
    "RobotState": "cellcal.drivers.robot",
    "RobotMode": "cellcal.drivers.robot",
    "connect_camera": "cellcal.drivers.camera",
    "parse_camera_url": "cellcal.drivers.camera",
    "CameraDriver": "cellcal.drivers.camera",
    "CameraInfo": "cellcal.drivers.camera",
    "Frame": "cellcal.drivers.camera",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cellcal.drivers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
