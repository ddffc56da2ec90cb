"""A base-frame run measured as 3-DoF points (``[tracker] measure = "point"``): a reflector.

The same run kind on the wire as ``cellcal.daemon.runs.base_frame`` (``kind = "base_frame"``),
with the same plan, capture path and gates; what differs is what a point determines. The
stations pair ``base_T_flange`` with the tracker's point ``cell_p_target``;
``calibrate_base_frame_points`` solves ``p_i = X (G_i y)`` for ``X = cell_T_base`` and the
reflector's point on the flange ``y = flange_p_target`` (ADR 0004).

* the rough estimate a new station is judged against is the converged point fit of at least
  :data:`ESTIMATE_MIN_POINT_STATIONS` stations, predicting the next point (its translation
  bound only: a point has no orientation);
* the planner's extra station for a degenerate direction is chosen for the point model's
  information, with the reflector where the rough fit puts it;
* a run started measuring points is not resumed measuring poses (``BaseFrame.resume_refusal``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from cellcal.daemon import consensus, solve
from cellcal.daemon.capture import Expected
from cellcal.daemon.config import Plan
from cellcal.daemon.consensus import Screened
from cellcal.daemon.runs.base import RunContext
from cellcal.daemon.runs.base_frame import BaseFrame
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.daemon.store import StationRecord
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import CalibrationError, DegenerateGeometry, calibrate_base_frame_points
from cellcal.solver.planning import NextStation, suggest_next_station
from cellcal.solver.points import MIN_POINT_STATIONS

log = logging.getLogger(__name__)

__all__ = ["PointBaseFrame", "point_estimate", "suggest_for_points", "ESTIMATE_MIN_POINT_STATIONS"]

#: Accepted point stations before the run's own estimate checks the next ones: one more
#: than the point fit's minimum (``MIN_POINT_STATIONS``), so the estimate has redundant
#: equations and its RMS closure means something.
ESTIMATE_MIN_POINT_STATIONS = MIN_POINT_STATIONS + 1


def point_estimate(stations: Sequence[StationRecord], floor_m: float, floor_rad: float) -> Expected | None:
    """The run's rough current point fit (``calibrate_base_frame_points``, unrefined) of at
    least :data:`ESTIMATE_MIN_POINT_STATIONS` stations, predicting the next point within
    ``Expected.bounds`` of its RMS closure (never less than ``floor_m``); None before, or
    when the stations do not determine it (axis spread below
    ``solve.ESTIMATE_MIN_AXIS_SPREAD``)."""
    if len(stations) < ESTIMATE_MIN_POINT_STATIONS:
        return None
    try:
        pres = calibrate_base_frame_points(*solve.station_points(stations),
                                           min_axis_spread=solve.ESTIMATE_MIN_AXIS_SPREAD, refine=False,
                                           holdout=False)
    except (CalibrationError, ValueError):
        return None
    bt, _ = Expected.bounds(pres.rms_translation_m, 0.0, floor_m, floor_rad)
    return Expected.of_point(pres.cell_T_base, pres.flange_p_target, bt, len(stations))


def suggest_for_points(stations: Sequence[StationRecord], model: DHModel, plan_cfg: Plan) -> NextStation | None:
    """The planner's next station for a run's degenerate point stations, or None when it has
    none: rough base and reflector for the line-of-sight test and the point model's information."""
    G, Pts = solve.station_points(stations)
    X0, Y0 = np.eye(4), np.eye(4)
    try:
        res = calibrate_base_frame_points(G, Pts, min_axis_spread=0.0, min_point_spread=0.0, refine=False,
                                          holdout=False)
        X0, Y0[:3, 3] = res.cell_T_base, res.flange_p_target
    except (CalibrationError, ValueError):
        pass
    p = plan_cfg
    try:
        return suggest_next_station(
            G, model.forward, np.column_stack([p.joint_min_rad, p.joint_max_rad]),
            (np.array(p.workspace_min_m), np.array(p.workspace_max_m)), np.zeros(3), X0, flange_T_target=Y0,
            measurement="point", rng=p.seed,
        )
    except ValueError as exc:
        log.warning("no station suggestion: %s", exc)
        return None


class PointBaseFrame(BaseFrame):
    """``cell_T_base`` and ``flange_p_target`` from robot poses and tracker points."""

    def estimate(self, ctx: RunContext, records: Sequence[StationRecord]) -> Expected | None:
        tc = ctx.cfg.tracker
        return point_estimate(records, tc.gross_error_m, tc.gross_error_rad)

    def screen(self, ctx: RunContext, records: Sequence[StationRecord], new: StationRecord) -> Screened | None:
        tc = ctx.cfg.tracker
        return consensus.screen(consensus.POINT, records, new, max_error_m=tc.consensus_error_m,
                                max_error_rad=tc.consensus_error_rad)

    def extra_station(self, ctx: RunContext, stations: Sequence[StationRecord],
                      exc: DegenerateGeometry) -> PlannedStation | None:
        if not ctx.commands_robot:
            return None
        nxt = suggest_for_points(stations, ctx.model, ctx.cfg.plan)
        if nxt is None:
            return None
        index = max((s.plan_index for s in stations), default=-1) + 1
        return PlannedStation(index, nxt.q_rad, nxt.base_T_flange)
