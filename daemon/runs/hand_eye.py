"""A run of kind ``hand_eye`` from stations a client supplies: where a camera sits on the flange.

Eye-in-hand: station i pairs the flange pose ``G_i = base_T_flange`` with the camera's view
of a calibration target ``O_i = camera_T_target``; ``calibrate_hand_eye`` solves
``G_i X O_i = base_T_target`` for ``X = flange_T_camera`` (DESIGN section 2, ADR 0003).
Without a camera device the daemon cannot capture such stations itself: a run of this kind
is started with its stations (``start_run kind=hand_eye stations=[...]``) and only solved,
gated and stored here; otherwise it is refused, naming ``cellcal solve``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence

from cellcal.daemon import protocol as P
from cellcal.daemon import solve
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.runs.base import Finished, Measure, RunContext, RunKind, SolverResult, as_calibration
from cellcal.daemon.runs.base_frame import finish_calibration
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.daemon.store import RunRecord, StationRecord
from cellcal.solver import CalibrationError, CalibrationResult, calibrate_hand_eye

__all__ = ["HandEye"]


class HandEye(RunKind):
    """``flange_T_camera`` and ``base_T_target`` from given stations (module docstring)."""

    name = P.KIND_HAND_EYE

    def refuse_start(self, ctx: RunContext) -> str | None:
        return ("hand_eye needs camera observations, and this cell has no camera device: solve them with "
                "`cellcal solve --kind hand_eye` (or the solver API)")

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        raise CalibrationError("a hand_eye run has no plan of its own: its stations are given")

    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        raise CalibrationError("a hand_eye run captures nothing: its stations are given")

    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> CalibrationResult:
        raise CalibrationError("a hand_eye run is solved from client-supplied stations only")

    def solve_given(self, ctx: RunContext, given: Sequence[Mapping[str, object]]) -> CalibrationResult:
        return calibrate_hand_eye(solve.given_poses(given, "base_T_flange"), solve.given_poses(given, "camera_T_target"),
                                  options=solve.solver_options(ctx.cfg.solve))

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        return finish_calibration(self.name, ctx, run, as_calibration(result), stations)
