"""cellcal's calibration solver: pure numpy, no I/O.

Public API::

    calibrate_base_frame(base_T_flange, cell_T_target, *, workspace=None) -> BaseFrameResult
    calibrate_hand_eye(base_T_flange, camera_T_target, *, workspace=None) -> HandEyeResult
    calibrate_tool_point(base_T_flange, *, workspace=None) -> ToolPointResult

and (ADR 0004)::

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
(:class:`UnreachableStations`), ``max_target_offset_m`` (:class:`ImplausibleGeometry`),
duplicates and units. How to solve and what to trust is one record, :class:`SolverOptions`,
taken by every ``calibrate_*`` as ``options=`` (its fields also as keywords; the camera
solves keep their own keywords beside it). :class:`TrackerNoiseModel` turns a
tracker's beam-coordinate noise into the per-station covariances the solvers take. Plus
:class:`Workspace`, the error tree (:class:`CellcalError`, :class:`CalibrationError`,
:class:`NotEnoughSamples`, :class:`DegenerateGeometry`) and the SE(3) helpers in
:mod:`cellcal.solver.se3`; a small standard-DH arm in :mod:`cellcal.solver.kinematics`.

Cameras (ADR 0021, 0022)::

    calibrate_intrinsics(views, target, image_size, *, noise_px=None, fix=(), ...) -> IntrinsicsResult
    CameraModel (camera_model: pinhole + Brown-Conrady, projection with Jacobians, undistortion)
    CalibrationTarget, target_from_toml (target: ChArUco / chessboard, the target file)

Hand-eye with a camera, refined on the image (ADR 0027)::

    calibrate_hand_eye_camera(views, target, base_T_flange, *, intrinsics=None, ...) -> HandEyeCameraResult
    calibrate_eye_to_hand_camera(views, target, base_T_flange, *, intrinsics=None, ...) -> EyeToHandCameraResult
    plan_camera_stations(fk, joint_limits_rad, workspace_box_m, camera, target, setup, n, ...) -> CameraStationPlan
    tracker_check(result, cell_p_measured, *, target_p, cell_T_base, tracker_noise_m, ...) -> TrackerCheck
    estimate_latency(result, views, base_T_flange, flange_velocity, ...) -> LatencyEstimate

Kinematic identification (ADR 0016)::

    identify_kinematics(q, model, *, cell_T_target=None, cell_p_target=None, parameters=None, ...)
        -> KinematicResult
    plan_identification_stations(model, n, ...) -> IdentificationPlan
    iso9283_test_poses(...), iso9283_pose_test(commanded, attained) -> ISO9283Result
    iso9283_commanded(base_T_flange, cell_T_base, flange_T_tool), iso9283_joint_targets(...)
    kinematic_parameters_json(result), urdf_from_model(model), ur_calibration_yaml(model)
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
from cellcal.solver.camera_checks import CrossCheck, TrackerCheck, tracker_check
from cellcal.solver.camera_model import PARAMETER_NAMES as INTRINSICS_PARAMETER_NAMES
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.camera_planning import CameraStationPlan, plan_camera_stations
from cellcal.solver.camera_temporal import LatencyEstimate, estimate_latency
from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.errors import (
    CalibrationError,
    CellcalError,
    DegenerateGeometry,
    ImplausibleGeometry,
    InsufficientCoverage,
    InsufficientTilt,
    NotEnoughSamples,
    PriorMismatch,
    TargetFileError,
    UnreachableStations,
)
from cellcal.solver.hand_eye_camera import (
    Bootstrap,
    CameraChainResult,
    CameraResidualTests,
    EyeToHandCameraResult,
    HandEyeCameraResult,
    calibrate_eye_to_hand_camera,
    calibrate_hand_eye_camera,
)
from cellcal.solver.identify import (
    KinematicResult,
    KinematicValidation,
    ValidationFigures,
    identify_kinematics,
    parameter_names,
)
from cellcal.solver.intrinsics import (
    CornerResiduals,
    ImageCoverage,
    IntrinsicsHoldout,
    IntrinsicsResult,
    ViewCorners,
    calibrate_intrinsics,
)
from cellcal.solver.iso9283 import (
    ISO9283Poses,
    ISO9283Result,
    inverse_kinematics,
    iso9283_commanded,
    iso9283_joint_targets,
    iso9283_pose_test,
    iso9283_test_poses,
    simulate_iso9283_cycles,
)
from cellcal.solver.kinematic_export import (
    kinematic_parameters_dict,
    kinematic_parameters_json,
    ur_calibration_yaml,
    urdf_from_model,
)
from cellcal.solver.kinematic_planning import IdentificationPlan, plan_identification_stations
from cellcal.solver.kinematics import UR5E, DHParameters, KinematicModel
from cellcal.solver.options import DEFAULT_MAX_TARGET_OFFSET_M, SolverOptions
from cellcal.solver.planning import NextStation, StationPlan, plan_stations, suggest_next_station
from cellcal.solver.points import PointBaseFrameResult, calibrate_base_frame_points
from cellcal.solver.target import CalibrationTarget, target_from_toml
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
    "calibrate_intrinsics",
    "IntrinsicsResult",
    "calibrate_hand_eye_camera",
    "calibrate_eye_to_hand_camera",
    "HandEyeCameraResult",
    "EyeToHandCameraResult",
    "CameraChainResult",
    "CameraResidualTests",
    "Bootstrap",
    "CrossCheck",
    "TrackerCheck",
    "tracker_check",
    "LatencyEstimate",
    "estimate_latency",
    "plan_camera_stations",
    "CameraStationPlan",
    "IntrinsicsHoldout",
    "ImageCoverage",
    "CornerResiduals",
    "ViewCorners",
    "CameraModel",
    "INTRINSICS_PARAMETER_NAMES",
    "CalibrationTarget",
    "target_from_toml",
    "InsufficientTilt",
    "InsufficientCoverage",
    "TargetFileError",
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
    "ImplausibleGeometry",
    "SolverOptions",
    "DEFAULT_MAX_TARGET_OFFSET_M",
    "SolveWarning",
    "ResidualTests",
    "TrackerNoiseModel",
    "DEFAULT_MIN_AXIS_SPREAD",
    "DEFAULT_MIN_ROTATION_RAD",
    "MIN_STATIONS",
    "DHParameters",
    "KinematicModel",
    "UR5E",
    "identify_kinematics",
    "KinematicResult",
    "KinematicValidation",
    "ValidationFigures",
    "parameter_names",
    "plan_identification_stations",
    "IdentificationPlan",
    "iso9283_test_poses",
    "iso9283_pose_test",
    "simulate_iso9283_cycles",
    "inverse_kinematics",
    "iso9283_commanded",
    "iso9283_joint_targets",
    "ISO9283Poses",
    "ISO9283Result",
    "kinematic_parameters_dict",
    "kinematic_parameters_json",
    "urdf_from_model",
    "ur_calibration_yaml",
]
