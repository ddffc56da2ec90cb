"""The dynamic check of a camera hand-eye run: the camera's residual latency against the robot.

The last rung of the temporal validation (ADR 0027, ADR 0031): a static calibration is made
from frames exposed while the robot rests, so it cannot see an error in the frames' time
stamps. With ``[camera.hand_eye] dynamic_check = true`` (command mode), after the solve the
daemon moves the flange along a straight path (``dynamic_path_mm`` long, along the
calibrated camera's image x axis, through the plan's view pose, orientation kept) in both
directions at the two ``dynamic_speeds``, the camera taking frames on the way
(``runs.base.Measure.sweep``: each with the flange pose and velocity at its mid-exposure).
Passes are repeated (at most :data:`MAX_PASSES` per speed) until each direction at each
speed has ``dynamic_min_frames`` moving frames. ``solver.camera_temporal.estimate_latency``
then fits the latency ``tau`` on those frames' corners through the calibrated chain: a
spatial error is the same whichever way the robot passes, a timing error flips its sign
with the direction and grows with the speed.

The stored record's ``camera_hand_eye.dynamic_check`` (``docs/protocols/zeromq.md``) holds
the latency (ms, positive when the images show the robot later than the pose they were
paired with), its 1-sigma (frames' noise and the calibration's own uncertainty), the frames
used each way and the speeds; a latency beyond ``max_latency_ms`` is the result's warning
``latency`` naming its size in ms (``latency_undetermined`` when the frames cannot tell it
to that bound). A check that could not be made (observe mode, the path out of reach, too
few frames seen moving) is ``{"made": false, "note": ...}`` and the warning
``dynamic_check_not_made``: never silent. The check is a warning, not a gate: the static
calibration stands; what the latency costs depends on the speed the cell uses the camera at.

The check measures wall-clock timing: on a simulation much faster than the wall clock (the
demo's x20, the suite's x30) the robot's 500 Hz samples are too far apart in simulated motion
for a velocity, and the figure is biased (ADR 0031, amendment of 2026-12-07).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.camera_capture import MovingFrame
from cellcal.daemon.consistency import DeviceFault, StationRejected
from cellcal.daemon.runs.base import Measure, RunContext
from cellcal.daemon.runs.intrinsics import VIEW_KEY
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.daemon.store import RunRecord
from cellcal.solver import CalibrationError
from cellcal.solver.camera_results import CameraChainResult
from cellcal.solver.camera_temporal import LatencyEstimate, estimate_latency

log = logging.getLogger(__name__)

__all__ = ["DYNAMIC_KEY", "MAX_PASSES", "dynamic_check", "moving_counts"]

#: The key of the dynamic check in the record's ``camera_hand_eye``.
DYNAMIC_KEY = "dynamic_check"
#: Passes along the path (each both ways) at one speed, at most.
MAX_PASSES = 4
#: A frame moves "along the path" when its speed along it is above this share of the
#: fastest frame's (``camera_temporal``'s own threshold).
_MOVING_SHARE = 0.1


def _warning(code: str, message: str, value: float | None = None) -> P.JsonObject:
    return {"code": code, "value": value, "message": message}


def not_made(note: str) -> tuple[P.JsonObject, list[P.JsonObject]]:
    """The record and warning of a dynamic check that was asked for and not made."""
    return ({"made": False, "note": note},
            [_warning("dynamic_check_not_made", f"dynamic check not made: {note}; the camera's latency against the "
                                                "robot is untested (a static calibration cannot see it)")])


def moving_counts(frames: Sequence[MovingFrame], direction: npt.NDArray[np.float64]) -> tuple[int, int]:
    """Frames moving forward and backward along ``direction`` (base frame, unit)."""
    if not frames:
        return 0, 0
    along = np.array([float(f.flange_velocity[:3] @ direction) for f in frames])
    moving = np.abs(along) > _MOVING_SHARE * float(np.max(np.abs(along)))
    return int(np.sum(moving & (along > 0))), int(np.sum(moving & (along < 0)))


def _path(run: RunRecord, result: CameraChainResult, length_m: float
          ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """``(start q (6,), A, B, direction)``: the path's ends (4, 4) about the plan's view pose
    and its direction, the calibrated camera's image x axis in the base frame."""
    view = run.plan.get(VIEW_KEY)
    if not isinstance(view, Mapping) or view.get("base_T_flange") is None:
        raise CalibrationError("the run's plan has no view pose (planned before the dynamic check existed)")
    G = np.asarray(view.get("base_T_flange"), dtype=float).reshape(4, 4)
    q = np.asarray(view.get("q_rad"), dtype=float).reshape(6)
    est = result.transforms()
    if "flange_T_camera" in est:
        R_cam = G[:3, :3] @ est["flange_T_camera"].value[:3, :3]
    else:
        R_cam = est["base_T_camera"].value[:3, :3]
    d = R_cam[:, 0] / float(np.linalg.norm(R_cam[:, 0]))
    A, B = G.copy(), G.copy()
    A[:3, 3] -= 0.5 * length_m * d
    B[:3, 3] += 0.5 * length_m * d
    return q, A, B, d


def dynamic_check(ctx: RunContext, run: RunRecord, result: CameraChainResult, measure: Measure | None
                  ) -> tuple[P.JsonObject, list[P.JsonObject]] | None:
    """The dynamic check of a camera hand-eye result (module docstring): ``(record,
    warnings)``, or None when ``[camera.hand_eye] dynamic_check`` is off. An abort propagates."""
    cam = ctx.cfg.camera
    if cam is None or not cam.hand_eye.dynamic_check:
        return None
    h = cam.hand_eye
    if measure is None or not ctx.commands_robot:
        return not_made("the daemon does not move this robot (observe mode or given stations)")
    try:
        q, A, B, d = _path(run, result, h.dynamic_path_m)
        # joints for the path's start: the move there is a joint move, as to any station
        q_start = np.asarray(ctx.model.inverse(A, q, tol_m=1e-6, tol_rad=1e-6, max_iter=80), dtype=float)
        ctx.model.inverse(B, q_start, tol_m=1e-6, tol_rad=1e-6, max_iter=80)  # the far end within reach
    except (CalibrationError, ValueError, TypeError) as exc:
        return not_made(f"the path cannot be planned: {exc}")
    start = PlannedStation(-1, q_start, A)
    frames: list[MovingFrame] = []
    try:
        for speed in h.dynamic_speeds:
            mine: list[MovingFrame] = []
            for _ in range(MAX_PASSES):
                mine += measure.sweep(start, [B, A], float(speed), f"dynamic check at speed {speed:g}")
                if min(moving_counts(mine, d)) >= h.dynamic_min_frames:
                    break
            frames += mine
        views = [(f.ids, f.image_points_px) for f in frames]
        est = estimate_latency(result, views, np.array([f.base_T_flange for f in frames]).reshape(-1, 4, 4),
                               np.array([f.flange_velocity for f in frames]).reshape(-1, 6),
                               max_latency_ms=h.max_latency_ms)
    except (StationRejected, DeviceFault, CalibrationError, ValueError) as exc:
        log.warning("run %d: dynamic check not made: %s", run.id, exc)
        return not_made(f"{exc} ({len(frames)} frames taken)")
    return _record(est, h.dynamic_speeds, h.dynamic_path_m), [
        _warning(w.code, w.message, w.value) for w in est.warnings]


def _record(est: LatencyEstimate, speeds: Sequence[float], path_m: float) -> P.JsonObject:
    return {
        "made": True, "latency_ms": float(est.latency_ms), "sigma_ms": float(est.sigma_ms),
        "sigma_noise_ms": float(est.sigma_noise_ms), "bound_ms": float(est.bound_ms), "n_frames": int(est.n_frames),
        "n_forward": int(est.n_forward), "n_backward": int(est.n_backward),
        "max_speed_m_s": float(np.max(est.speeds_m_s, initial=0.0)), "speeds": [float(s) for s in speeds],
        "path_m": float(path_m), "reprojection_rms_px": float(est.reprojection_rms_px),
        "rms_at_zero_px": float(est.rms_at_zero_px), "noise_px": float(est.noise_px), "converged": bool(est.converged),
        "stop_reason": est.stop_reason, "warnings": [w.code for w in est.warnings],
    }
