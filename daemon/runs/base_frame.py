"""A run of kind ``base_frame`` measured as 6-DoF poses: where the robot base sits in the cell.

Station i pairs the robot's flange pose ``G_i = base_T_flange`` with the tracker's pose of the
target ``M_i = cell_T_target``; ``calibrate_base_frame`` solves ``M_i = X G_i Y`` for
``X = cell_T_base`` and ``Y = flange_T_target`` (seed 000, ADR 0003, 0004). A base-frame run
measured as 3-DoF points (``[tracker] measure = "point"``) is the same run kind on the wire,
and its own module: ``cellcal.daemon.runs.points``.

* **Plan**: ``[plan]``'s explicit stations, the generated plan (``cellcal.daemon.runs.plan``), or
  a run to a target (``cellcal.daemon.runs.to_target``), which solves after every station
  and stops when the predicted error at the task points is small enough.
* **Capture**: robot at rest, tracker at rest, the windows overlapping (``CaptureEngine``);
  from 3 stations on, each new station must agree with the run's rough estimate (the gross
  error test, ``solve.rough_estimate``).
* **Solve**: the stored stations with the declared noise (``solve.declared_noise``); data
  that leave a direction undetermined (``DegenerateGeometry``) get the planner's station for
  it in command mode, up to ``[plan] max_extra_stations``.
* **Gates**: ``cellcal.daemon.gates`` with the run's robot poses and the arm's reach; the
  predicted error at ``[solve] task_points_mm`` is stored with the result.
* **Resume**: a run started measuring poses is not resumed measuring points (or back).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence

from cellcal.daemon import consensus, drift, solve
from cellcal.daemon import protocol as P
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.consensus import Screened
from cellcal.daemon.gates import check_gates
from cellcal.daemon.runs import to_target as target
from cellcal.daemon.runs.base import (
    Finished,
    Measure,
    PlanRefused,
    RunContext,
    RunKind,
    SolverResult,
    as_calibration,
    planned_poses,
)
from cellcal.daemon.runs.plan import PlannedStation, plan_from_config, plan_to_dict, to_target
from cellcal.daemon.store import RunRecord, StationRecord
from cellcal.solver import CalibrationError, CalibrationResult, DegenerateGeometry, calibrate_base_frame

log = logging.getLogger(__name__)

__all__ = ["BaseFrame", "started_measure"]


def started_measure(ctx: RunContext, run: RunRecord) -> str:
    """What the run's stations measure (``[tracker] measure`` when it started; runs stored
    before the start record: the configuration's)."""
    started = run.plan.get("started") or {}
    measure = started.get("measure", ctx.cfg.tracker.measure) if isinstance(started, Mapping) else ctx.cfg.tracker.measure
    return str(measure)


class BaseFrame(RunKind):
    """``cell_T_base`` and ``flange_T_target`` from robot and tracker poses (module docstring)."""

    name = P.KIND_BASE_FRAME

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        return plan_to_dict(stations if stations is not None else plan_from_config(ctx.cfg, ctx.model))

    def _adaptive(self, ctx: RunContext) -> bool:
        return to_target(ctx.cfg.plan) and ctx.commands_robot

    def check_plan(self, ctx: RunContext, run: RunRecord) -> None:
        """Refuse a plan whose rotations cannot determine the base frame (too small, or about
        one axis only: the rotation about it and the translation along it are lost), by the
        solver's own observability test on the planned poses, when the planner may not add
        the stations that fix it (``[plan] max_extra_stations = 0``); with extra stations
        allowed, the run measures the plan and then the planner's stations (logged now)."""
        if self._adaptive(ctx):
            return  # a run to a target chooses its stations as it goes
        G = planned_poses(ctx, run)
        if G is None or len(G) < 3:
            return
        try:
            # The poses against themselves (X = Y = I): the solve's observability test sees
            # the planned motions alone, before anything is measured.
            calibrate_base_frame(G, G, options=solve.solver_options(ctx.cfg.solve), holdout=False, refine=False)
        except DegenerateGeometry as exc:
            if ctx.cfg.plan.max_extra_stations > 0:
                log.info("run %d: the plan's motions are degenerate (%s); the planner adds stations after it", run.id,
                         exc)
                return
            raise PlanRefused(f"base_frame run {run.id} refused before the first move: its {len(G)} planned poses "
                              f"cannot determine the base frame ([plan] max_extra_stations = 0): {exc}") from exc
        except (CalibrationError, ValueError) as exc:  # judged on the measurements, not the plan
            log.debug("run %d: plan check: %s", run.id, exc)

    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        return engine.capture(planned.index, [s.base_T_flange for s in accepted], abort, expected=expected)

    def estimate(self, ctx: RunContext, records: Sequence[StationRecord]) -> Expected | None:
        tc = ctx.cfg.tracker
        return solve.rough_estimate(records, tc.gross_error_m, tc.gross_error_rad)

    def screen(self, ctx: RunContext, records: Sequence[StationRecord], new: StationRecord) -> Screened | None:
        tc = ctx.cfg.tracker
        return consensus.screen(consensus.POSE, records, new, max_error_m=tc.consensus_error_m,
                                max_error_rad=tc.consensus_error_rad)

    def visit(self, ctx: RunContext, todo: list[PlannedStation], records: list[StationRecord]) -> Iterator[PlannedStation]:
        return target.stations_to_visit(todo, records, ctx.cfg, ctx.model, adaptive=self._adaptive(ctx))

    def planned_count(self, ctx: RunContext, n_plan: int) -> int:
        # A run to a target announces its most, and says fewer by stopping.
        return max(n_plan, int(ctx.cfg.plan.max_stations)) if self._adaptive(ctx) else n_plan

    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> CalibrationResult:
        return solve.solve_base_frame(stations, ctx.cfg.solve)

    def extra_station(self, ctx: RunContext, stations: Sequence[StationRecord],
                      exc: DegenerateGeometry) -> PlannedStation | None:
        if not ctx.commands_robot:
            return None
        nxt = solve.suggest_station(*solve.station_arrays(stations), ctx.model, ctx.cfg.plan)
        if nxt is None:
            return None
        index = max((s.plan_index for s in stations), default=-1) + 1
        return PlannedStation(index, nxt.q_rad, nxt.base_T_flange)

    def solve_given(self, ctx: RunContext, given: Sequence[Mapping[str, object]]) -> CalibrationResult:
        return calibrate_base_frame(solve.given_poses(given, "base_T_flange"), solve.given_poses(given, "cell_T_target"),
                                    options=solve.solver_options(ctx.cfg.solve))

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        return finish_calibration(self.name, ctx, run, as_calibration(result), stations)

    def resume_refusal(self, ctx: RunContext, run: RunRecord) -> str | None:
        measure = started_measure(ctx, run)
        if measure != ctx.cfg.tracker.measure:
            # Pose and point stations are different models; one run's stations are one kind.
            return (f"run {run.id} closed, not resumed: started measuring {measure}s, the daemon now measures "
                    f"{ctx.cfg.tracker.measure}s ([tracker] measure)")
        return None


def finish_calibration(kind: str, ctx: RunContext, run: RunRecord, result: CalibrationResult,
                       stations: Sequence[StationRecord]) -> Finished:
    """Gates and stored record of a ``cellcal.solver.calibrate_*`` result (every kind but
    kinematics): the gates with the run's robot poses (the given ones when the client
    supplied the stations) and the arm's reach, the drift check stations, and the predicted
    error at ``[solve] task_points_mm`` when ``kind`` is the configured one (the task points
    are in that kind's frame)."""
    G = solve.station_arrays(stations)[0] if stations else solve.given_base_T_flange(run.plan.get("given") or [])
    report = check_gates(result, ctx.cfg.solve, context=solve.gate_context(kind, G, ctx.model_or_none()))
    checks = drift.choose_check_stations(stations, run.plan, ctx.cfg.drift.check_stations)
    task_points = ctx.cfg.solve.task_points_m if kind == ctx.cfg.solve.kind else None
    return Finished(report, solve.calibration_record(result, report, checks, task_points=task_points))
