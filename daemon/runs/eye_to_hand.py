"""A run of kind ``eye_to_hand``: where a fixed camera stands in the robot's base frame.

The camera is fixed in the cell (``[camera] mounting = "eye_to_hand"``) and the calibration
target rides on the flange; station i pairs the flange pose ``G_i = base_T_flange`` with the
camera's view of the target, and the calibration is ``base_T_camera`` and
``flange_T_target`` (``base_T_camera @ camera_T_target_i = G_i @ flange_T_target``). The
daemon plans, captures, solves on the image corners (``calibrate_eye_to_hand_camera``),
gates, stores and activates as for ``hand_eye``: ``cellcal.daemon.runs.hand_eye_camera``
(ADR 0031). There is no given-stations path: a client's own pose pairs are solved offline.
"""

from __future__ import annotations

from cellcal.daemon import protocol as P
from cellcal.daemon.config.camera import MOUNTING_EYE_TO_HAND
from cellcal.daemon.runs.hand_eye_camera import CameraHandEyeKind

__all__ = ["EyeToHand"]


class EyeToHand(CameraHandEyeKind):
    """``base_T_camera`` and ``flange_T_target`` (module docstring)."""

    name = P.KIND_EYE_TO_HAND
    setup = MOUNTING_EYE_TO_HAND
