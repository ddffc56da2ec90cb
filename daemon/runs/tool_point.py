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

from cellcal.daemon import protocol as P
from cellcal.daemon import solve
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.runs.base import Finished, Measure, RunContext, RunKind, SolverResult, as_calibration
from cellcal.daemon.runs.base_frame import finish_calibration
from cellcal.daemon.runs.plan import PlannedStation, plan_from_config, plan_to_dict
from cellcal.daemon.store import RunRecord, StationRecord
from cellcal.solver import CalibrationResult, calibrate_tool_point

__all__ = ["ToolPoint"]


class ToolPoint(RunKind):
    """``flange_p_tip`` and ``base_p_pivot`` from robot poses alone (module docstring)."""

    name = P.KIND_TOOL_POINT
    needs_tracker = False

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        return plan_to_dict(stations if stations is not None else plan_from_config(ctx.cfg, ctx.model))

    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        return engine.capture_robot_only(planned.index, [s.base_T_flange for s in accepted], abort)

    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> CalibrationResult:
        return calibrate_tool_point(solve.station_arrays(stations)[0], options=solve.solver_options(ctx.cfg.solve))

    def solve_given(self, ctx: RunContext, given: Sequence[Mapping[str, object]]) -> CalibrationResult:
        return calibrate_tool_point(solve.given_poses(given, "base_T_flange"),
                                    options=solve.solver_options(ctx.cfg.solve))

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        return finish_calibration(self.name, ctx, run, as_calibration(result), stations)
