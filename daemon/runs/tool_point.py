"""A run of kind ``tool_point``: where the tool tip sits on the flange (a pivot calibration).

The tip is held at one point while the flange turns about it; station i is the robot's
flange pose alone (``CaptureEngine.capture_robot_only``: at rest, new, FK-consistent; no
tracker), and ``calibrate_tool_point`` solves ``R_i p_tip + t_i = p_pivot`` for the tip on
the flange ``flange_p_tip`` and the pivot in the base ``base_p_pivot`` (DESIGN section 2).
The plan is ``[plan]``'s (a pivot needs the flange turned about the tip: stations chosen for
it, usually explicit ones); the gates are ``cellcal.daemon.gates``'.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from cellcal.daemon import consensus, solve
from cellcal.daemon import protocol as P
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.consensus import Screened
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
from cellcal.daemon.runs.base_frame import finish_calibration
from cellcal.daemon.runs.plan import PlannedStation, plan_from_config, plan_to_dict
from cellcal.daemon.store import RunRecord, StationRecord
from cellcal.solver import (
    CalibrationResult,
    DegenerateGeometry,
    ImplausibleGeometry,
    NotEnoughSamples,
    calibrate_tool_point,
)

__all__ = ["ToolPoint"]


class ToolPoint(RunKind):
    """``flange_p_tip`` and ``base_p_pivot`` from robot poses alone (module docstring)."""

    name = P.KIND_TOOL_POINT
    needs_tracker = False

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        return plan_to_dict(stations if stations is not None else plan_from_config(ctx.cfg, ctx.model))

    def check_plan(self, ctx: RunContext, run: RunRecord) -> None:
        """Refuse a plan that is no pivot motion: the solver's own observability test on the
        planned poses (rotations too small, or about one axis only: the tip along it is not
        determined), then the plan's own pivot fit (the daemon moves the flange to these
        poses, so the stations will be them: poses that hold no point fixed close no
        better than the fit of the plan, and fail the gate after every station was taken)."""
        G = planned_poses(ctx, run)
        if G is None:
            return
        try:
            fit = calibrate_tool_point(G, options=solve.solver_options(ctx.cfg.solve), holdout=False)
        except (DegenerateGeometry, NotEnoughSamples) as exc:
            raise PlanRefused(f"tool_point run {run.id} refused before the first move: its {len(G)} planned poses "
                              f"are no pivot motion: {exc}") from exc
        except (ImplausibleGeometry, ValueError) as exc:
            raise PlanRefused(f"tool_point run {run.id} refused before the first move: its {len(G)} planned poses "
                              f"hold no point fixed (their pivot fit: {exc}); plan poses that turn the flange "
                              "about the tool tip ([plan] stations)") from exc
        limit = ctx.cfg.solve.max_rms_translation_m
        if fit.rms_translation_m > limit:
            raise PlanRefused(
                f"tool_point run {run.id} refused before the first move: its {len(G)} planned poses hold no point "
                f"fixed (the pivot fit of the plan itself closes to {fit.rms_translation_m * 1e3:.1f} mm RMS, beyond "
                f"the gate's [solve] max_rms_mm = {limit * 1e3:g}): plan poses that turn the flange about the tool "
                "tip ([plan] stations)")

    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        return engine.capture_robot_only(planned.index, [s.base_T_flange for s in accepted], abort)

    def screen(self, ctx: RunContext, records: Sequence[StationRecord], new: StationRecord) -> Screened | None:
        # The pivot of robot poses alone: a pose that is not the one reported (a drive's lie
        # the motion checks missed) is beyond the tip the other stations agree on.
        tc = ctx.cfg.tracker
        return consensus.screen(consensus.PIVOT, records, new, max_error_m=tc.consensus_error_m,
                                max_error_rad=tc.consensus_error_rad)

    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> CalibrationResult:
        return calibrate_tool_point(solve.station_arrays(stations)[0], options=solve.solver_options(ctx.cfg.solve))

    def solve_given(self, ctx: RunContext, given: Sequence[Mapping[str, object]]) -> CalibrationResult:
        return calibrate_tool_point(solve.given_poses(given, "base_T_flange"),
                                    options=solve.solver_options(ctx.cfg.solve))

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        return finish_calibration(self.name, ctx, run, as_calibration(result), stations)
