"""A base-frame run to a target (``[plan] target_sigma_mm`` with task points).

The run starts with the first few planned stations (``plan.FIRST_STATIONS_POSE`` /
``FIRST_STATIONS_POINT``) and then, after every accepted station, solves what it has: once
the predicted error at every task point is at most the target it stops, otherwise it
measures the station :func:`cellcal.solver.planning.suggest_next_station` picks for the task
points (:func:`next_station`, called from the capture loop through :func:`stations_to_visit`),
up to ``[plan] max_stations``. It also stops when the result's model error alone puts more
than the target at a task point (:data:`FLOOR_MIN_STATIONS`), or when the predicted error no
longer falls (:data:`PLATEAU_STATIONS`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence

import numpy as np

from cellcal.daemon.config import Config
from cellcal.daemon.runs.plan import FIRST_STATIONS_POINT, PlannedStation, candidate_pool, joint_limits
from cellcal.daemon.solve import solve_base_frame
from cellcal.daemon.store import StationRecord
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import BaseFrameResult, CalibrationError, PointBaseFrameResult
from cellcal.solver.diagnostics import absorbed_error_covariance
from cellcal.solver.planning import suggest_next_station
from cellcal.solver.uncertainty import point_error

__all__ = ["predicted_task_sigma", "next_station", "stations_to_visit", "PLATEAU_STATIONS", "PLATEAU_GAIN",
           "NEAR_BEST", "FLOOR_MIN_STATIONS", "model_error_floor", "plateau"]

log = logging.getLogger(__name__)


def predicted_task_sigma(records: Sequence[StationRecord],
                         cfg: Config) -> tuple[float, BaseFrameResult | PointBaseFrameResult | None]:
    """``(largest predicted error at the task points (m), result or None)`` of a base-frame
    run's stations solved as they are (inf when they do not yet determine it)."""
    if len(records) < 3:
        return math.inf, None
    try:
        result = solve_base_frame(records, cfg.solve)
    except (CalibrationError, ValueError):
        return math.inf, None
    sig = max(float(result.predicted_error_at(np.asarray(t, float)).sigma_m) for t in cfg.solve.task_points_m)
    return (sig if math.isfinite(sig) else math.inf), result


#: A run to a target also stops when the last ``PLATEAU_STATIONS`` stations together did not
#: bring the best predicted error down by ``PLATEAU_GAIN`` of what averaging alone would
#: (``1 - sqrt((n - 4) / n)`` for n stations): the error is then set by something more
#: stations do not average away (the arm's kinematic error, which the result's covariance
#: includes), and capturing up to ``max_stations`` would be downtime for nothing.
PLATEAU_STATIONS = 4
PLATEAU_GAIN = 0.5
#: A run to a target stops as soon as the result's model error alone (the robot error a rigid
#: fit absorbs, which the covariance carries and more stations do not average away) puts
#: more than the target at a task point, from this many stations on: then the residual of
#: 8 pose stations has 36 degrees of freedom, and the model error's size is known to about
#: 12 % (a point run has 24 and about 15 %).
FLOOR_MIN_STATIONS = 8
#: Of the candidates whose predicted error at the task points is within this (relative) of
#: the best, the next station is the one nearest the robot in joint space.
NEAR_BEST = 0.05


def plateau(history: list[float]) -> tuple[float, float] | None:
    """``(best before, best of the last PLATEAU_STATIONS)`` of a run's predicted errors
    (``history[k]``: with ``k + 3`` stations, the last with all of them) when they have
    stopped falling, else None."""
    n = len(history) + 2
    if n < FIRST_STATIONS_POINT + PLATEAU_STATIONS or not math.isfinite(history[-1]):
        return None
    before, recent = min(history[:-PLATEAU_STATIONS]), min(history[-PLATEAU_STATIONS:])
    averaging = 1.0 - math.sqrt((n - PLATEAU_STATIONS) / n)
    if math.isfinite(before) and recent > (1.0 - PLATEAU_GAIN * averaging) * before:
        return before, recent
    return None


def _plateau(records: Sequence[StationRecord], cfg: Config, sigma: float) -> tuple[float, float] | None:
    if len(records) < FIRST_STATIONS_POINT + PLATEAU_STATIONS or not math.isfinite(sigma):
        return None
    return plateau([predicted_task_sigma(records[:k], cfg)[0] for k in range(3, len(records))] + [sigma])


def model_error_floor(result: BaseFrameResult | PointBaseFrameResult, records: Sequence[StationRecord], cfg: Config) -> float:
    """The largest error at the task points (m) that the result's model error alone puts
    there (:func:`cellcal.solver.diagnostics.absorbed_error_covariance` about the stations'
    target positions, the size the residual tests found); 0 without a model error. More
    stations do not lower it: it is the arm's error, not noise."""
    t = getattr(result, "residual_tests", None)
    tau_t = float(getattr(t, "model_error_translation_m", 0.0) or 0.0)
    tau_r = float(getattr(t, "model_error_rotation_rad", 0.0) or 0.0)
    if not (tau_t > 0.0 or tau_r > 0.0) or not records:
        return 0.0
    G = np.array([r.base_T_flange for r in records], dtype=float).reshape(-1, 4, 4)
    if isinstance(result, PointBaseFrameResult):
        y = np.asarray(result.flange_p_target, dtype=float)
    else:
        y = np.asarray(result.flange_T_target, dtype=float)[:3, 3]
    c = np.mean(G[:, :3, :3] @ y + G[:, :3, 3], axis=0)
    C = absorbed_error_covariance(c, tau_t, tau_r)
    X = np.asarray(result.cell_T_base, dtype=float)
    return max(float(point_error(np.eye(4), C, X[:3, :3].T @ (np.asarray(p, float) - X[:3, 3]), "base").sigma_m)
               for p in cfg.solve.task_points_m)


def next_station(records: Sequence[StationRecord], visited: list[PlannedStation], cfg: Config, model: DHModel,
                 index: int) -> PlannedStation | None:
    """The decision of a run to a target: None when the predicted error at the task points
    is at most ``[plan] target_sigma_mm``, when the model error alone puts more than the
    target there (``FLOOR_MIN_STATIONS``), when it no longer falls (``PLATEAU_STATIONS``), or
    when ``max_stations`` were visited; else the station the planner suggests for the task
    points from the stations accepted so far.

    Parameters
    ----------
    records : list of StationRecord
        The run's accepted stations.
    visited : list of PlannedStation
        Every station visited or given up so far (never suggested again).
    cfg : Config
        ``[plan]``, ``[solve]`` and ``[tracker]`` are read.
    model : DHModel
        The robot's kinematics.
    index : int
        ``plan_index`` of the station to suggest.
    """
    p = cfg.plan
    t0 = time.monotonic()
    sigma, result = predicted_task_sigma(records, cfg)
    if sigma <= p.target_sigma_m:
        log.info("plan: predicted error at the task points %.4f mm <= target %.4f mm after %d stations: done",
                 sigma * 1e3, p.target_sigma_m * 1e3, len(records))
        return None
    model_floor = model_error_floor(result, records, cfg) if result is not None else 0.0
    if len(records) >= FLOOR_MIN_STATIONS and model_floor > p.target_sigma_m:
        log.warning("plan: the arm's model error alone puts %.4f mm at the task points (predicted %.4f mm after %d "
                    "stations), above the target %.4f mm: more stations do not average it away (a kinematic "
                    "calibration does); stopping", model_floor * 1e3, sigma * 1e3, len(records),
                    p.target_sigma_m * 1e3)
        return None
    floor = _plateau(records, cfg, sigma)
    if floor is not None:
        log.warning("plan: predicted error at the task points %.4f mm no longer falls with more stations (best %.4f mm "
                    "%d stations ago, %.4f mm since): the target %.4f mm is below what this cell reaches (the residual "
                    "tests name the arm's or the tracker's model error); stopping after %d stations", sigma * 1e3,
                    floor[0] * 1e3, PLATEAU_STATIONS, floor[1] * 1e3, p.target_sigma_m * 1e3, len(records))
        return None
    if len(visited) >= p.max_stations:
        log.warning("plan: %d stations visited (plan.max_stations), predicted error at the task points %.4f mm "
                    "still above the target %.4f mm", len(visited), sigma * 1e3, p.target_sigma_m * 1e3)
        return None
    point = cfg.tracker.measure == "point"
    home = np.asarray(p.home_q_rad, float)
    tracker_cfg = np.asarray(p.tracker_xyz_m, float) if p.tracker_xyz_m else None
    Y = np.eye(4)
    a = np.asarray(p.target_axis, float)
    if result is not None:
        # What the stations say: the base in the cell, the target on the flange, and the
        # tracker where the configuration puts it in the cell.
        X, tracker = result.cell_T_base, np.asarray(p.tracker_cell_xyz_m, float)
        if isinstance(result, PointBaseFrameResult):
            Y[:3, 3] = result.flange_p_target
        else:
            Y = result.flange_T_target
            a = Y[:3, :3].T @ a  # the facing direction in the target frame
        if tracker_cfg is None:
            # The tracker estimated from the stations, to a decimetre (the line of sight
            # barely changes with it, and the candidates are then solved once per run).
            tracker_cfg = np.round(X[:3, :3].T @ (tracker - X[:3, 3]), 1)
    else:
        X, tracker = np.eye(4), None
    (Q, G), tracker_b, cone_deg = candidate_pool(
        model, n=p.max_stations, box_min_m=p.workspace_min_m, box_max_m=p.workspace_max_m,
        max_tilt_rad=p.max_tilt_rad, home_q_rad=home, q_min_rad=p.joint_min_rad, q_max_rad=p.joint_max_rad,
        seed=p.seed, max_draws=None, tracker_base_m=tracker_cfg, target_axis=p.target_axis, cone_rad=p.cone_rad)
    if tracker is None:
        tracker = tracker_b
    lim = joint_limits(home, p.joint_min_rad, p.joint_max_rad)
    S = np.array([r.base_T_flange for r in records]).reshape(-1, 4, 4)
    # Where the robot is now: the last station visited (measured or given up).
    q_now = next((v.q_rad for v in reversed(visited) if v.q_rad is not None), None)
    if q_now is None and records and records[-1].q_rad is not None:
        q_now = records[-1].q_rad
    try:
        nxt = suggest_next_station(
            S, model.forward, lim, (np.asarray(p.workspace_min_m), np.asarray(p.workspace_max_m)), tracker, X,
            flange_T_target=Y, measurement="point" if point else "pose", target_axis=a, cone_deg=cone_deg,
            candidates=(Q, G), task_points=np.asarray(cfg.solve.task_points_m, float), rng=p.seed + index,
            # Stations visited (also those given up after rejections) are not suggested
            # again, nor any the capture would refuse as the same pose.
            exclude=np.array([v.base_T_flange for v in visited if v.base_T_flange is not None]).reshape(-1, 4, 4),
            min_separation_m=cfg.capture.min_pose_change_m, min_separation_rad=cfg.capture.min_pose_change_rad,
            q_current_rad=q_now, near_best=NEAR_BEST,
        )
    except ValueError as exc:
        log.warning("plan: no next station (%s); predicted error at the task points %.4f mm", exc, sigma * 1e3)
        return None
    # The planner's figures are for its nominal noise; the result's for the noise the
    # stations showed: the ratio carries the prediction over.
    ratio = nxt.task_sigma_after_m / nxt.task_sigma_before_m if math.isfinite(nxt.task_sigma_before_m) else math.nan
    log.info("plan: predicted error at the task points %.4f mm after %d stations (target %.4f mm); next station "
             "%d, expected to bring it to %.4f mm (decided in %.0f ms)", sigma * 1e3, len(records),
             p.target_sigma_m * 1e3, index, sigma * ratio * 1e3, (time.monotonic() - t0) * 1e3)
    return PlannedStation(index, nxt.q_rad, nxt.base_T_flange)


def stations_to_visit(todo: list[PlannedStation], records: Sequence[StationRecord], cfg: Config, model: DHModel,
                      *, adaptive: bool) -> Iterator[PlannedStation]:
    """The stations a run visits: ``todo`` (its plan's, not yet measured), then, when
    ``adaptive`` (a run to ``[plan] target_sigma_mm``), :func:`next_station`'s until it says
    stop. ``records`` is the run's list of accepted stations, which the caller extends as
    it measures: every decision sees the stations accepted before it."""
    visited = list(todo)
    yield from todo
    if not adaptive:
        return
    used = {ps.index for ps in todo} | {r.plan_index for r in records}
    while True:
        # Visited: the stations accepted before this capture began (a resumed run), then every
        # station yielded, measured or given up, in order (the last is where the robot is).
        mine = {v.index for v in visited}
        earlier = [PlannedStation(r.plan_index, r.q_rad, r.base_T_flange) for r in records if r.plan_index not in mine]
        nxt = next_station(records, earlier + visited, cfg, model, max(used, default=-1) + 1)
        if nxt is None:
            return
        used.add(nxt.index)
        visited.append(nxt)
        yield nxt
