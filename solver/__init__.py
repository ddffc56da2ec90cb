"""cellcal's calibration solver: pure numpy, no I/O.

Public API (DESIGN.md section 3)::

    calibrate_base_frame(base_T_flange, cell_T_target, *, workspace=None) -> BaseFrameResult
    calibrate_hand_eye(base_T_flange, camera_T_target, *, workspace=None) -> HandEyeResult
    calibrate_tool_point(base_T_flange, *, workspace=None) -> ToolPointResult

and (issue 7, ADR 0004)::

    calibrate_eye_to_hand(base_T_flange, camera_T_target, *, workspace=None) -> EyeToHandResult
    calibrate_base_frame_points(base_T_flange, cell_p_target, *, workspace=None) -> PointBaseFrameResult
    planning.plan_stations(...), planning.suggest_next_station(...)

Every result carries its covariance, 1-sigma figures, ``predicted_error_at(...)`` and a
held-out closure (:class:`HoldoutClosure`), and lists what it estimated with
``transforms()``: name -> :class:`Estimate` (value, covariance, parent and child frame).
Every result also says whether it ``converged`` (``stop_reason``), what a person should know
(``warnings``: :class:`SolveWarning` records, e.g. ``"model_error"``) and the residual tests
behind them (:class:`ResidualTests`); ADR 0004. Inputs are checked for what residuals
cannot show (ADR 0014): ``expected_cell_T_base`` (:class:`PriorMismatch`), ``max_reach_m``
(:class:`UnreachableStations`), duplicates and units. :class:`TrackerNoiseModel` turns a
tracker's beam-coordinate noise into the per-station covariances the solvers take. Plus
:class:`Workspace`, the error tree (:class:`CellcalError`, :class:`CalibrationError`,
:class:`NotEnoughSamples`, :class:`DegenerateGeometry`) and the SE(3) helpers in
:mod:`cellcal.solver.se3`; a small standard-DH arm in :mod:`cellcal.solver.kinematics`.
"""

from cellcal.solver.calibrate import (
    DEFAULT_MIN_AXIS_SPREAD,
    DEFAULT_MIN_ROTATION_RAD,
    MIN_STATIONS,
    BaseFrameResult,
    CalibrationResult,
    Estimate,
    EyeToHandResult,
    HandEyeResult,
    Residuals,
    ToolPointResult,
    calibrate_base_frame,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.errors import (
    CalibrationError,
    CellcalError,
    DegenerateGeometry,
    NotEnoughSamples,
    PriorMismatch,
    UnreachableStations,
)
from cellcal.solver.planning import NextStation, StationPlan, plan_stations, suggest_next_station
from cellcal.solver.points import PointBaseFrameResult, calibrate_base_frame_points
from cellcal.solver.tracker_noise import TrackerNoiseModel
from cellcal.solver.uncertainty import PredictedError
from cellcal.solver.validation import Agreement, HoldoutClosure
from cellcal.solver.workspace import Workspace

__all__ = [
    "calibrate_base_frame",
    "calibrate_hand_eye",
    "calibrate_tool_point",
    "calibrate_eye_to_hand",
    "calibrate_base_frame_points",
    "plan_stations",
    "suggest_next_station",
    "StationPlan",
    "NextStation",
    "PointBaseFrameResult",
    "BaseFrameResult",
    "HandEyeResult",
    "EyeToHandResult",
    "ToolPointResult",
    "HoldoutClosure",
    "Agreement",
    "PredictedError",
    "CalibrationResult",
    "Estimate",
    "Residuals",
    "Workspace",
    "CellcalError",
    "CalibrationError",
    "NotEnoughSamples",
    "DegenerateGeometry",
    "PriorMismatch",
    "UnreachableStations",
    "SolveWarning",
    "ResidualTests",
    "TrackerNoiseModel",
    "DEFAULT_MIN_AXIS_SPREAD",
    "DEFAULT_MIN_ROTATION_RAD",
    "MIN_STATIONS",
]
