"""A run of kind ``hand_eye``: where a camera sits on the flange (eye-in-hand).

Station i pairs the flange pose ``G_i = base_T_flange`` with the camera's view of a
calibration target fixed in the cell; the calibration is ``flange_T_camera`` and
``base_T_target`` (DESIGN section 2, ADR 0003).

* **With the cell's camera** (``[camera]``, ``mounting = "eye_in_hand"``): the daemon plans
  the views, captures settled camera stations, takes the stored intrinsics (or estimates them
  jointly), solves on the image corners (``calibrate_hand_eye_camera``), gates, stores and
  activates: ``cellcal.daemon.runs.hand_eye_camera`` (ADR 0031).
* **Given stations** (``start_run kind=hand_eye stations=[...]``, each with ``base_T_flange``
  and ``camera_T_target``, a client's own PnP poses): solved with the pose-level
  ``calibrate_hand_eye`` and gated as every pose calibration (ADR 0018). Without a camera
  device this is the only way: a start without stations is refused, naming ``cellcal solve``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cellcal.daemon import protocol as P
from cellcal.daemon import solve
from cellcal.daemon.config.camera import MOUNTING_EYE_IN_HAND
from cellcal.daemon.runs.base import Finished, Measure, RunContext, SolverResult, as_calibration
from cellcal.daemon.runs.base_frame import finish_calibration
from cellcal.daemon.runs.hand_eye_camera import CameraHandEyeKind
from cellcal.daemon.store import RunRecord, StationRecord
from cellcal.solver import CalibrationResult, calibrate_hand_eye

__all__ = ["HandEye"]


class HandEye(CameraHandEyeKind):
    """``flange_T_camera`` and ``base_T_target`` (module docstring)."""

    name = P.KIND_HAND_EYE
    setup = MOUNTING_EYE_IN_HAND

    def refuse_start(self, ctx: RunContext) -> str | None:
        if ctx.cfg.camera is None:
            return ("hand_eye needs camera observations, and this cell has no camera device: solve them with "
                    "`cellcal solve --kind hand_eye` (or the solver API), or start the run with its stations")
        return super().refuse_start(ctx)

    def solve_given(self, ctx: RunContext, given: Sequence[Mapping[str, object]]) -> CalibrationResult:
        return calibrate_hand_eye(solve.given_poses(given, "base_T_flange"), solve.given_poses(given, "camera_T_target"),
                                  options=solve.solver_options(ctx.cfg.solve))

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        if "given" in run.plan:
            return finish_calibration(self.name, ctx, run, as_calibration(result), stations)
        return super().finish(ctx, run, result, stations, measure)
