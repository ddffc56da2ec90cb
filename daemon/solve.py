"""Where a run meets the solver: stored stations as the solver's arrays, the noise the daemon
declares, the rough estimate a new station is judged against, the planner's extra station,
and a solver result's stored record.

``cellcal.solver`` does the mathematics; the run kinds (``cellcal.daemon.runs``: base frame,
points, tool point, hand-eye, kinematics) call it with what these helpers make of their
stations and store what :func:`calibration_record` makes of its result: the solver's wire
form (``report.result_to_wire``), the gate report (``cellcal.daemon.gates``) and the drift
check stations.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import as_json, result_to_wire
from cellcal.daemon.capture import Expected
from cellcal.daemon.config import Plan, Solve
from cellcal.daemon.gates import GateContext, GateReport, model_reach_m
from cellcal.daemon.store import StationRecord
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import (
    BaseFrameResult,
    CalibrationError,
    CalibrationResult,
    PointBaseFrameResult,
    calibrate_base_frame,
    calibrate_base_frame_points,
)
from cellcal.solver.planning import NextStation, suggest_next_station

log = logging.getLogger(__name__)

__all__ = ["station_arrays", "station_points", "is_point_run", "declared_noise", "solve_base_frame", "given_poses",
           "given_base_T_flange",
           "suggest_station", "calibration_record", "gate_context", "rough_estimate",
           "ESTIMATE_MIN_STATIONS", "ESTIMATE_MIN_AXIS_SPREAD", "DeclaredNoise"]

#: Accepted stations before a run's own estimate checks the next ones (2 motions at least).
ESTIMATE_MIN_STATIONS = 3
#: The estimate is used only when the motions' axes are this well spread (0..1): with
#: near-parallel axes a translation along them is not determined, and a prediction from it
#: could be off by far more than any bound, rejecting good stations.
ESTIMATE_MIN_AXIS_SPREAD = 0.1


def station_arrays(stations: Sequence[StationRecord]) -> tuple[np.ndarray, np.ndarray | None]:
    """``(base_T_flange (N, 4, 4), cell_T_target (N, 4, 4) or None)`` of stored stations.

    ``cell_T_target`` is None when a station has no 6-DoF measurement (a robot-only run).
    """
    if not stations:
        return np.zeros((0, 4, 4)), np.zeros((0, 4, 4))
    G = np.array([s.base_T_flange for s in stations])
    if any(s.cell_T_target is None for s in stations):
        return G, None
    return G, np.array([s.cell_T_target for s in stations])


def station_points(stations: Sequence[StationRecord]) -> tuple[np.ndarray, np.ndarray]:
    """``(base_T_flange (N, 4, 4), cell_p_target (N, 3))`` of stored stations (a pose
    station's point is its target's origin)."""
    if not stations:
        return np.zeros((0, 4, 4)), np.zeros((0, 3))
    return (np.array([s.base_T_flange for s in stations]),
            np.array([np.asarray(s.cell_p_target, dtype=float).reshape(3) for s in stations]))


def is_point_run(stations: Sequence[StationRecord]) -> bool:
    """Whether a base-frame run's stations are 3-DoF points (``[tracker] measure = "point"``):
    some station has a position and no pose. Such a run is solved with the point model."""
    return any(s.cell_T_target is None and s.cell_p_target is not None for s in stations)


class DeclaredNoise(TypedDict, total=False):
    """The solvers' noise keywords (:func:`declared_noise`): both, the translation alone, or none."""

    noise_translation_m: float
    noise_rotation_rad: float


def declared_noise(stations: Sequence[StationRecord], solve_cfg: Solve, *, point: bool) -> DeclaredNoise:
    """The measurement noise the daemon declares to the solver for a run's stored stations.

    Each station's tracker std (the standard uncertainty of its averaged measurement, per
    axis, as the instrument reports it) combined in quadrature with the robot's
    repeatability (``[solve] robot_repeatability_mm / _deg``: the flange's pose scatters that
    much between visits of one pose, which the tracker sees as measurement noise), then the
    RMS over the run's stations: one figure per component, so that a run's exported stations
    (``cellcal stations``) solve to the same answer with ``cellcal solve --noise-mm X
    --noise-deg Y`` (the result's ``noise_translation_m`` / ``noise_rotation_rad``). With
    declared noise the solver tests the residuals against it (chi-square): a cell whose
    residuals are several times the noise (robot kinematic error) gets a ``model_error``
    warning and a widened covariance even from a few stations, where a noise estimated from
    the residuals takes the model error for noise and reports it as precision. ``{}`` (noise
    estimated from the residuals) when ``[solve] declare_noise = false`` or a station lacks a
    usable std.

    Returns
    -------
    dict
        ``{"noise_translation_m": float}`` for a point run, also ``"noise_rotation_rad"`` for
        a pose run, or ``{}``.
    """
    if not solve_cfg.declare_noise or not stations:
        return {}
    rep_t, rep_r = float(solve_cfg.robot_repeatability_m), float(solve_cfg.robot_repeatability_rad)
    std_t = np.array([float(s.tracker_std_translation_m or 0.0) for s in stations])
    sig_t = float(np.sqrt(np.mean(std_t * std_t) + rep_t * rep_t))
    if not math.isfinite(sig_t) or sig_t <= 0.0:
        return {}
    if point:
        return {"noise_translation_m": sig_t}
    std_r = [s.tracker_std_rotation_rad for s in stations]
    if any(v is None for v in std_r):
        return {}
    r = np.array(std_r, dtype=float)
    sig_r = float(np.sqrt(np.mean(r * r) + rep_r * rep_r))
    if not math.isfinite(sig_r) or sig_r <= 0.0:
        return {}
    return {"noise_translation_m": sig_t, "noise_rotation_rad": sig_r}


def solve_base_frame(stations: Sequence[StationRecord], solve_cfg: Solve) -> BaseFrameResult | PointBaseFrameResult:
    """The base frame of a run's stored stations: robot + tracker poses
    (``calibrate_base_frame``), or robot + tracker points (:func:`is_point_run`:
    ``calibrate_base_frame_points``), with ``[solve]``'s spread and iteration limits and the
    declared noise (:func:`declared_noise`).

    Raises
    ------
    CalibrationError
        ``NotEnoughSamples``, ``DegenerateGeometry`` (the run may then add stations).
    """
    spread, iters = solve_cfg.min_axis_spread, solve_cfg.max_iterations
    if is_point_run(stations):
        return calibrate_base_frame_points(*station_points(stations), min_axis_spread=spread, max_iterations=iters,
                                           **declared_noise(stations, solve_cfg, point=True))
    G, M = station_arrays(stations)
    return calibrate_base_frame(G, M if M is not None else np.zeros((0, 4, 4)), min_axis_spread=spread,
                                max_iterations=iters, **declared_noise(stations, solve_cfg, point=False))


def given_poses(given: Sequence[Mapping[str, object]], key: str) -> np.ndarray:
    """``(N, 4, 4)`` poses under ``key`` of stations a client supplied (16 row-major numbers
    each). Raises ``KeyError``, ``TypeError`` or ``ValueError`` when they are malformed."""
    return np.array([np.asarray(s[key], dtype=float).reshape(4, 4) for s in given])


def suggest_station(G: np.ndarray, M: np.ndarray | None, model: DHModel, plan_cfg: Plan) -> NextStation | None:
    """The planner's next station for degenerate base-frame data, or None when it has none.

    ``model``: the robot's kinematics (``forward``); ``plan_cfg``: ``[plan]`` (joint limits,
    workspace box, seed). Returns ``cellcal.solver.planning.NextStation``.
    """
    try:
        # A rough cell_T_base for the line-of-sight test: the degenerate data still fix it
        # but for one rotation; the tracker sits at the cell origin.
        X0 = calibrate_base_frame(G, M, min_axis_spread=0.0, refine=False, holdout=False).cell_T_base
    except (CalibrationError, ValueError):
        X0 = np.eye(4)
    p = plan_cfg
    try:
        return suggest_next_station(
            G, model.forward, np.column_stack([p.joint_min_rad, p.joint_max_rad]),
            (np.array(p.workspace_min_m), np.array(p.workspace_max_m)), np.zeros(3), X0, rng=p.seed,
        )
    except ValueError as exc:
        log.warning("no station suggestion: %s", exc)
        return None


def given_base_T_flange(given: object) -> np.ndarray | None:
    """The robot poses (N, 4, 4) of client-supplied stations (a run's stored ``plan["given"]``),
    or None when they are malformed (the solve has then refused them already)."""
    if not isinstance(given, (list, tuple)) or not all(isinstance(s, Mapping) for s in given):
        return None
    try:
        return given_poses(given, "base_T_flange")
    except (KeyError, TypeError, ValueError):
        return None


def gate_context(kind: str, base_T_flange: np.ndarray | None, model: DHModel | None) -> GateContext:
    """What the gates need beyond the result: the run's kind, its robot poses and the reach
    of the robot model (``model``: the driver's kinematics, or None when unknown)."""
    reach = name = None
    if model is not None:
        try:
            reach, name = model_reach_m(model), str(getattr(model, "name", ""))
        except (AttributeError, TypeError, ValueError):
            reach = None
    return GateContext(kind=kind, base_T_flange=base_T_flange, max_reach_m=reach, robot_model=name or "")


def calibration_record(result: CalibrationResult, gates: GateReport, check_stations: list[P.JsonObject], *,
                       task_points: Sequence[Sequence[float]] | None = None) -> P.JsonObject:
    """What the store keeps as ``ResultRecord.result``: the solver's wire form (with the
    predicted error at ``task_points``, ``[solve] task_points_m``, when there are any), the
    gate report (``gates.GateReport``) and the check stations."""
    wire = as_json(result_to_wire(result, task_points=task_points if task_points else None))
    wire["gates"] = gates.to_wire()
    wire["check_stations"] = list[P.JsonValue](check_stations)
    return wire


def rough_estimate(stations: Sequence[StationRecord], floor_m: float, floor_rad: float) -> Expected | None:
    """The run's rough current estimate of the cell from its accepted pose stations, or None.

    A linear base-frame solve (no refinement, no hold-out) of the stations so far; its
    prediction of the next station's tracker pose (``capture.Expected``) may differ from the
    measurement by at most ``capture.Expected.bounds``: ``GROSS_RMS_FACTOR`` times this fit's
    RMS closure, never less than ``floor_m`` / ``floor_rad`` (``[tracker] gross_error_mm`` /
    ``gross_error_deg``). None with fewer than :data:`ESTIMATE_MIN_STATIONS` pose stations,
    or when their motions do not determine the cell well (:data:`ESTIMATE_MIN_AXIS_SPREAD`):
    then no station is judged against it. (Point stations: ``points.point_estimate``.)
    """
    if len(stations) < ESTIMATE_MIN_STATIONS or any(s.cell_T_target is None for s in stations):
        return None
    G, M = station_arrays(stations)
    try:
        res = calibrate_base_frame(G, M, min_axis_spread=ESTIMATE_MIN_AXIS_SPREAD, refine=False, holdout=False,
                                   uncertainty=False)
    except (CalibrationError, ValueError):
        return None
    bt, br = Expected.bounds(res.rms_translation_m, res.rms_rotation_rad, floor_m, floor_rad)
    return Expected(res.cell_T_base, res.flange_T_target, bt, br, len(stations))
