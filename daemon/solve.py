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

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np
import numpy.typing as npt

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
from cellcal.solver.options import SolverOptions
from cellcal.solver.planning import NextStation, suggest_next_station
from cellcal.solver.tracker_noise import TrackerNoiseModel

log = logging.getLogger(__name__)

__all__ = ["station_arrays", "station_points", "is_point_run", "declared_noise", "station_covariance", "beam_covariance",
           "capture_signature", "solver_options",
           "solve_settings", "settings_solve", "SOLVE_SETTING_KEYS", "CaptureSignature", "solve_base_frame", "given_poses",
           "given_base_T_flange",
           "suggest_station", "calibration_record", "gate_context", "rough_estimate",
           "ESTIMATE_MIN_STATIONS", "ESTIMATE_MIN_AXIS_SPREAD", "DeclaredNoise"]

#: Accepted stations before a run's own estimate checks the next ones (2 motions at least).
ESTIMATE_MIN_STATIONS = 3
#: The estimate is used only when the motions' axes are this well spread (0..1): with
#: near-parallel axes a translation along them is not determined, and a prediction from it
#: could be off by far more than any bound, rejecting good stations.
ESTIMATE_MIN_AXIS_SPREAD = 0.1


def station_arrays(stations: Sequence[StationRecord]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64] | None]:
    """``(base_T_flange (N, 4, 4), cell_T_target (N, 4, 4) or None)`` of stored stations.

    ``cell_T_target`` is None when a station has no 6-DoF measurement (a robot-only run).
    """
    if not stations:
        return np.zeros((0, 4, 4)), np.zeros((0, 4, 4))
    G = np.array([s.base_T_flange for s in stations])
    if any(s.cell_T_target is None for s in stations):
        return G, None
    return G, np.array([s.cell_T_target for s in stations])


def station_points(stations: Sequence[StationRecord]) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
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
    """The solvers' per-station noise keywords (:func:`declared_noise`): one covariance per
    station, of a pose (``cell_T_target_cov``) or of a point (``cell_p_target_cov``), or none."""

    cell_T_target_cov: npt.NDArray[np.float64]
    cell_p_target_cov: npt.NDArray[np.float64]


class CaptureSignature(TypedDict):
    """When and how still each station was captured (:func:`capture_signature`)."""

    capture_time_s: npt.NDArray[np.float64]
    capture_speed_m_s: npt.NDArray[np.float64]


#: Floor of a station's instrument variance (m^2, rad^2): a reported std of zero is no
#: measurement without noise, and a singular covariance cannot whiten a residual.
_MIN_VAR = 1e-18


def _halves(station: StationRecord, key: str) -> npt.NDArray[np.float64] | None:
    """The per-axis std (3,) the instrument reported for each of a station's two averaged
    halves (``raw["tracker_halves"]``), as an array (2, 3); None when the station lacks them."""
    halves = station.raw.get("tracker_halves") if isinstance(station.raw, Mapping) else None
    if not isinstance(halves, list) or len(halves) != 2:
        return None
    out = []
    for h in halves:
        v = h.get(key) if isinstance(h, Mapping) else None
        if not isinstance(v, list) or len(v) != 3:
            return None
        row = [float(x) for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(row) != 3:
            return None
        out.append(row)
    return np.array(out)


def beam_covariance(cell_p: npt.NDArray[np.float64], axis_var_m2: npt.NDArray[np.float64],
                    cell_p_instrument: npt.NDArray[np.float64] | None = None
                    ) -> npt.NDArray[np.float64]:
    """A laser tracker's position covariance (3, 3) in the cell frame from the variances it
    reported along the cell axes.

    A tracker's noise is along the beam (its distance meter) and across it (its angle
    encoders, times the range), uncorrelated in beam coordinates: ``C = a d d^T + b (I - d
    d^T)`` with ``d`` the beam's direction from the instrument (default the cell origin) to
    the point (:class:`~cellcal.solver.tracker_noise.TrackerNoiseModel`). The per-axis
    variances it reports are that covariance's diagonal, ``var_k = a d_k^2 + b (1 - d_k^2)``.
    ``(a, b)`` is fitted to them by least squares with the total variance kept (``a + 2 b =
    sum(var)``: the figures' size is the instrument's statement; only its split between the
    beam's directions is inferred). A beam along a cell diagonal, whose diagonal cannot tell
    the two apart, and figures that no beam model reproduces give the isotropic covariance of
    the same total.
    """
    origin = np.zeros(3) if cell_p_instrument is None else np.asarray(cell_p_instrument, dtype=float).reshape(3)
    p = np.asarray(cell_p, dtype=float).reshape(3)
    v = np.maximum(np.asarray(axis_var_m2, dtype=float).reshape(3), _MIN_VAR)
    total = float(np.sum(v))
    r = float(np.linalg.norm(p - origin))
    if not math.isfinite(r) or r < 1e-6:
        return np.diag(v)
    d = (p - origin) / r
    d2 = d * d
    u = 1.0 - 3.0 * d2  # d var / d b at a fixed total
    uu = float(u @ u)
    b = total / 3.0 if uu < 1e-6 else float(u @ (v - d2 * total)) / uu
    b = min(max(b, _MIN_VAR), total / 2.0 - _MIN_VAR / 2.0)
    a = max(total - 2.0 * b, _MIN_VAR)
    model = TrackerNoiseModel(radial_std_m=math.sqrt(a), transverse_std_m=math.sqrt(b), cell_p_instrument=origin)
    return model.point_covariance(p)[0]


def station_covariance(station: StationRecord, solve_cfg: Solve, *, point: bool) -> npt.NDArray[np.float64] | None:
    """A station's measurement covariance as the solver takes it: the instrument's plus the
    robot's repeatability (the flange's pose scatters that much between visits of one pose,
    which the tracker sees as measurement noise).

    The instrument's: its reported per-axis std of each of the station's two averaged halves
    (the station is their mean: variance ``(v1 + v2) / 4``), read as a laser tracker's noise
    along and across the beam (:func:`beam_covariance`); an orientation's, about the target's
    own axes, rotated into the cell's (the solver's convention: ``R' = Exp(dphi) R``, ``dphi``
    about the cell axes). A station stored without its halves' figures falls back on its
    pooled scalar std, isotropic. None when it has no usable figure (the noise is then
    estimated from the residuals).

    Returns
    -------
    numpy.ndarray or None
        (3, 3) m^2 for a point, (6, 6) ``(dp [m], dphi [rad])`` for a pose.
    """
    rep_t, rep_r = float(solve_cfg.robot_repeatability_m), float(solve_cfg.robot_repeatability_rad)
    p = np.asarray(station.cell_p_target, dtype=float).reshape(3)
    ht = _halves(station, "std_translation_m")
    if ht is not None:
        var_t = (ht[0] ** 2 + ht[1] ** 2) / 4.0
    elif station.tracker_std_translation_m and math.isfinite(station.tracker_std_translation_m):
        var_t = np.full(3, float(station.tracker_std_translation_m) ** 2)
    else:
        return None
    C_t = beam_covariance(p, var_t) + rep_t * rep_t * np.eye(3)
    if point:
        return C_t
    if station.cell_T_target is None:
        return None
    hr = _halves(station, "std_rotation_rad")
    if hr is not None:
        var_r = (hr[0] ** 2 + hr[1] ** 2) / 4.0
    elif station.tracker_std_rotation_rad is not None and math.isfinite(station.tracker_std_rotation_rad):
        var_r = np.full(3, float(station.tracker_std_rotation_rad) ** 2)
    else:
        return None
    R = np.asarray(station.cell_T_target, dtype=float)[:3, :3]
    C = np.zeros((6, 6))
    C[:3, :3] = C_t
    C_r = R @ np.diag(np.maximum(var_r, _MIN_VAR)) @ R.T
    C[3:, 3:] = 0.5 * (C_r + C_r.T) + rep_r * rep_r * np.eye(3)  # symmetric to the last bit
    return C


def declared_noise(stations: Sequence[StationRecord], solve_cfg: Solve, *, point: bool) -> DeclaredNoise:
    """The measurement covariance the daemon declares to the solver for each of a run's
    stored stations (:func:`station_covariance`). With it the solver tests the residuals
    against the noise: a cell whose residuals are several times the noise (robot kinematic
    error) gets a ``model_error`` warning and a widened covariance even from a few stations,
    where a noise estimated from the residuals would take the model error for noise and
    report it as precision. ``{}`` (noise estimated from the residuals) when ``[solve]
    declare_noise = false`` or a station has no usable figure.
    """
    if not solve_cfg.declare_noise or not stations:
        return {}
    covs = [station_covariance(s, solve_cfg, point=point) for s in stations]
    if any(c is None for c in covs):
        return {}
    stack = np.array(covs)
    return {"cell_p_target_cov": stack} if point else {"cell_T_target_cov": stack}


def capture_signature(stations: Sequence[StationRecord]) -> CaptureSignature:
    """Each station's capture time (s, host monotonic clock, from the run's first station) and
    the flange's largest speed while it was taken (m/s, the settle detector's figure): what
    the solver's motion and pairing tests read (``motion_during_capture``, ``pairing_suspect``)."""
    t0 = min((s.robot_t_host_ns for s in stations), default=0)
    speeds = []
    for s in stations:
        v = s.settle.get("robot_max_flange_speed_m_s") if isinstance(s.settle, Mapping) else None
        speeds.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0)
    return {"capture_time_s": np.array([(s.robot_t_host_ns - t0) * 1e-9 for s in stations], dtype=float),
            "capture_speed_m_s": np.array(speeds, dtype=float)}


def solver_options(solve_cfg: Solve) -> SolverOptions:
    """``[solve]`` as the solver's options record: the refusal thresholds, the iteration
    budget, the arm's accuracy and the target's mount."""
    return SolverOptions(min_axis_spread=solve_cfg.min_axis_spread, max_iterations=solve_cfg.max_iterations,
                         robot_accuracy_m=solve_cfg.robot_accuracy_m, max_target_offset_m=solve_cfg.max_target_offset_m)


#: The ``[solve]`` keys a solve of stored stations depends on (:func:`solve_settings`).
SOLVE_SETTING_KEYS = ("declare_noise", "robot_repeatability_m", "robot_repeatability_rad", "min_axis_spread",
                      "max_iterations", "robot_accuracy_m", "max_target_offset_m")


def solve_settings(solve_cfg: Solve) -> dict[str, float | int | bool]:
    """The ``[solve]`` settings a solve of stored stations depends on, SI, as plain JSON: a
    result's provenance carries them and ``cellcal stations`` writes them into the station
    file, so ``cellcal solve FILE`` repeats the daemon's solve whatever the configuration is
    by then (:func:`settings_solve` reads them back)."""
    out: dict[str, float | int | bool] = {}
    for key in SOLVE_SETTING_KEYS:
        v = getattr(solve_cfg, key)
        out[key] = v if isinstance(v, (bool, int)) else float(v)
    return out


def settings_solve(settings: Mapping[str, object], base: Solve | None = None) -> Solve:
    """``base`` (default ``Solve()``) with the :func:`solve_settings` in ``settings``; a key
    missing keeps ``base``'s value.

    Raises
    ------
    ValueError
        A value of the wrong type (names the key).
    """
    ref = base if base is not None else Solve()

    def num(key: str, whole: bool = False) -> float:
        v = settings.get(key, getattr(ref, key))
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) \
                or (whole and float(v) != int(v)):
            raise ValueError(f"solve setting {key}: expected {'an integer' if whole else 'a number'}, got {v!r}")
        return float(v)

    declare = settings.get("declare_noise", ref.declare_noise)
    if not isinstance(declare, bool):
        raise ValueError(f"solve setting declare_noise: expected true or false, got {declare!r}")
    return dataclasses.replace(
        ref, declare_noise=declare, robot_repeatability_m=num("robot_repeatability_m"),
        robot_repeatability_rad=num("robot_repeatability_rad"), min_axis_spread=num("min_axis_spread"),
        max_iterations=int(num("max_iterations", whole=True)), robot_accuracy_m=num("robot_accuracy_m"),
        max_target_offset_m=num("max_target_offset_m"))


def solve_base_frame(stations: Sequence[StationRecord], solve_cfg: Solve) -> BaseFrameResult | PointBaseFrameResult:
    """The base frame of a run's stored stations: robot + tracker poses
    (``calibrate_base_frame``), or robot + tracker points (:func:`is_point_run`:
    ``calibrate_base_frame_points``), with ``[solve]``'s options (:func:`solver_options`),
    each station's declared covariance (:func:`declared_noise`) and the capture signature
    (:func:`capture_signature`). ``cellcal stations`` writes exactly these into a station file,
    so ``cellcal solve FILE`` repeats this solve.

    Raises
    ------
    CalibrationError
        ``NotEnoughSamples``, ``DegenerateGeometry`` (the run may then add stations),
        ``ImplausibleGeometry``.
    """
    opts = solver_options(solve_cfg)
    sig = capture_signature(stations)
    if is_point_run(stations):
        return calibrate_base_frame_points(*station_points(stations), options=opts,
                                           **declared_noise(stations, solve_cfg, point=True), **sig)
    G, M = station_arrays(stations)
    return calibrate_base_frame(G, M if M is not None else np.zeros((0, 4, 4)), options=opts,
                                **declared_noise(stations, solve_cfg, point=False), **sig)


def given_poses(given: Sequence[Mapping[str, object]], key: str) -> npt.NDArray[np.float64]:
    """``(N, 4, 4)`` poses under ``key`` of stations a client supplied (16 row-major numbers
    each). Raises ``KeyError``, ``TypeError`` or ``ValueError`` when they are malformed."""
    return np.array([np.asarray(s[key], dtype=float).reshape(4, 4) for s in given])


def suggest_station(G: npt.NDArray[np.float64], M: npt.NDArray[np.float64] | None, model: DHModel,
                    plan_cfg: Plan) -> NextStation | None:
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


def given_base_T_flange(given: object) -> npt.NDArray[np.float64] | None:
    """The robot poses (N, 4, 4) of client-supplied stations (a run's stored ``plan["given"]``),
    or None when they are malformed (the solve has then refused them already)."""
    if not isinstance(given, (list, tuple)) or not all(isinstance(s, Mapping) for s in given):
        return None
    try:
        return given_poses(given, "base_T_flange")
    except (KeyError, TypeError, ValueError):
        return None


def gate_context(kind: str, base_T_flange: npt.NDArray[np.float64] | None, model: DHModel | None) -> GateContext:
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
