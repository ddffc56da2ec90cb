"""A run of kind ``intrinsics``: a camera's intrinsics from views of its target (ADR 0022, 0030).

* **refuse_start**: a cell without a ``[camera]`` section.
* **plan**: ``[camera.plan] n_views`` views (``cellcal.daemon.runs.camera_plan``) turning the
  camera about its target (eye-in-hand) or the target in front of the camera (eye-to-hand),
  stored with the view pose they were planned from.
* **check_plan**: refuses, before the first move, views that cannot determine intrinsics
  whatever they see: fewer than the solver's minimum, or views whose predicted tilt figure is
  below ``[camera.intrinsics] refuse_tilt_deg`` (``InsufficientTilt``, as the solve would).
* **capture**: a camera station (``CaptureEngine.capture_camera``,
  ``cellcal.daemon.camera_capture``): the robot at rest through a settled exposure, the
  target's corners found and sharp; the image written beside the store before the row.
* **solve**: ``calibrate_intrinsics`` on the stations' detections with
  ``[camera.intrinsics]``'s noise, fixed terms, held-out folds and refusal thresholds; the
  stations must all be of one image size and one target file (its sha256).
* **finish**: the gates (reprojection RMS, image coverage, 1-sigma of the focal lengths,
  convergence) and the stored record (:func:`intrinsics_record`): the camera at the top
  (``camera_matrix``, ``dist_coeffs``, ``image_size``, ``reprojection_rms_px``), everything
  behind it under ``intrinsics`` (covariance, per-view and held-out reprojection, coverage,
  per-corner residuals, the target and its file's sha256), no transforms.
* **outputs** (``cellcal.daemon.runs.intrinsics_report``): ``cellcal show``'s intrinsics with
  their sigmas, the report's residual, radial, coverage and per-view figures, and the ROS
  ``camera_info`` and OpenCV FileStorage exports.

``cellcal solve DATASET_DIR --setup intrinsics`` solves the same stations offline with the
same record (:func:`views_of_stations` and :func:`intrinsics_record` are shared).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import FRAME_CONVENTION, UNCERTAINTY_CONVENTION
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.config import Camera, Config, Export
from cellcal.daemon.config.camera import stored_intrinsics_id
from cellcal.daemon.gates import GateCheck, GateReport, gates_passed
from cellcal.daemon.runs import camera_plan
from cellcal.daemon.runs import intrinsics_report as ir
from cellcal.daemon.runs.base import (
    Finished,
    Measure,
    ReportParts,
    ResultBody,
    RunContext,
    RunKind,
    SolverResult,
    as_intrinsics,
)
from cellcal.daemon.runs.plan import PlannedStation, plan_to_dict
from cellcal.daemon.store import ResultRecord, RunRecord, StationRecord, Store, UnknownRecord
from cellcal.solver import CalibrationError, IntrinsicsResult, NotEnoughSamples, calibrate_intrinsics
from cellcal.solver.errors import InsufficientTilt
from cellcal.solver.intrinsics import MIN_VIEWS, ViewCorners
from cellcal.solver.target import CalibrationTarget

__all__ = ["Intrinsics", "SOLVER_NAME", "VIEW_KEY", "TARGET_KEY", "views_of_stations", "solve_views",
           "intrinsics_record", "intrinsics_gates", "target_wire", "camera_plan_extra", "stored_intrinsics", "Corners"]

#: ``solver`` of an intrinsics result (provenance and wire).
SOLVER_NAME = "calibrate_intrinsics: Zhang's start, maximum likelihood on the image corners (ADR 0022)"
#: The key of a camera run's plan that records the view pose it was planned from.
VIEW_KEY = "camera_view"
#: The key of a camera run's plan that keeps its target file (``{"sha256", "toml"}``).
TARGET_KEY = "camera_target"


def camera_plan_extra(cfg: Config) -> P.JsonObject:
    """What every camera run stores with its plan: the target file it captures with (its
    text and sha256), so ``cellcal stations`` writes its stations with exactly that file."""
    cam = cfg.camera
    if cam is None:
        return {}
    return {TARGET_KEY: {"sha256": cam.target_sha256, "toml": cam.target_toml, "mounting": cam.mounting}}


class Corners(Protocol):
    """One view's detected corners as the solver reads them (a :class:`ViewCorners`): ``ids``
    (M,) and ``image_points_px`` (M, 2)."""

    @property
    def ids(self) -> npt.NDArray[np.intp]: ...

    @property
    def image_points_px(self) -> npt.NDArray[np.float64]: ...


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, (list, tuple)) else []


def views_of_stations(stations: Sequence[StationRecord | Mapping[str, object]]) -> tuple[
        list[Corners], tuple[int, int], list[int], str | None]:
    """The detections of camera stations as the solver's views: ``(views, image_size
    (width, height), plan indices, target file sha256)``.

    A station is a ``StationRecord`` (its ``camera``) or a mapping with ``plan_index`` and
    ``camera`` (the dataset folder's reader gives those).

    Raises
    ------
    ValueError
        A station without a camera detection, or stations of different image sizes or
        target files (naming the station).
    """
    views: list[Corners] = []
    indices: list[int] = []
    size: tuple[int, int] | None = None
    sha: str | None = None
    for st in stations:
        index = int(st.plan_index) if isinstance(st, StationRecord) else int(str(st.get("plan_index", len(views))))
        cam = _map(st.camera if isinstance(st, StationRecord) else st.get("camera"))
        det = _map(cam.get("detection"))
        if not det:
            raise ValueError(f"station {index} has no camera detection (not a camera station)")
        wh = [int(str(v)) for v in _list(cam.get("image_size"))]
        if len(wh) != 2:
            raise ValueError(f"station {index}: its camera record has no image_size")
        if size is None:
            size = (wh[0], wh[1])
        elif (wh[0], wh[1]) != size:
            raise ValueError(f"station {index}: a {wh[0]} x {wh[1]} image, the run's first is {size[0]} x {size[1]}")
        s = cam.get("target_sha256")
        s = str(s) if s else None
        if sha is None:
            sha = s
        elif s is not None and s != sha:
            raise ValueError(f"station {index} was captured with another target file (sha256 {s[:12]}..., the run's "
                             f"first {sha[:12]}...)")
        ids = np.array([int(str(i)) for i in _list(det.get("ids"))], dtype=np.intp)
        pts = np.array([[float(str(u)) for u in _list(p)] for p in _list(det.get("image_points_px"))], dtype=float)
        views.append(ViewCorners(ids, pts.reshape(-1, 2)))
        indices.append(index)
    if size is None:
        raise NotEnoughSamples(0, MIN_VIEWS, "intrinsics", hint="camera stations with the target's corners")
    return views, size, indices, sha


def solve_views(views: Sequence[Corners], target: CalibrationTarget, image_size: tuple[int, int],
                camera: Camera) -> IntrinsicsResult:
    """``calibrate_intrinsics`` with ``[camera.intrinsics]``'s options."""
    c = camera.intrinsics
    return calibrate_intrinsics(views, target, image_size, noise_px=c.noise_px, fix=tuple(c.fix),
                                holdout_folds=c.holdout_folds, min_tilt_deg=c.refuse_tilt_deg,
                                min_coverage=c.refuse_coverage, max_iterations=c.max_iterations)


def _f(v: object) -> float | None:
    try:
        x = float(str(v)) if not isinstance(v, (int, float, np.floating, np.integer)) else float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _matrix(C: npt.NDArray[np.float64]) -> P.JsonObject:
    C = np.asarray(C, dtype=float)
    return {"shape": list(C.shape), "values": [_f(v) for v in C.reshape(-1)]}


def target_wire(target: CalibrationTarget) -> P.JsonObject:
    """The target's description on the wire (``protocol.TargetWire``, SI)."""
    return {"type": target.kind, "squares_x": int(target.squares_x), "squares_y": int(target.squares_y),
            "square_m": float(target.square_m), "marker_m": target.marker_m, "dictionary": target.dictionary,
            "sha256": target.sha256}


def intrinsics_record(result: IntrinsicsResult, view_indices: Sequence[int]) -> P.JsonObject:
    """The result's wire form (``protocol.ResultBody`` with the intrinsics keys; module
    docstring): what the store keeps before gates, and what ``cellcal solve --setup
    intrinsics --json`` prints. ``view_indices``: the station of each view the solver was
    given (the result's ``views`` index into them)."""
    views = [int(view_indices[i]) for i in result.views]
    dropped = [int(view_indices[i]) for i in result.views_dropped]
    h, cov, res = result.holdout, result.coverage, result.residuals
    warnings: list[P.JsonValue] = [{"code": w.code, "message": w.message, "value": None if w.value is None else _f(w.value)}
                                   for w in result.warnings]
    intrinsics: P.JsonObject = {
        "parameter_names": list(result.parameter_names),
        "parameters": [float(v) for v in result.parameters],
        "sigmas": [_f(v) for v in result.sigmas],
        "covariance": _matrix(result.covariance),
        "fixed": list(result.fixed),
        "view_rms_px": [float(v) for v in result.view_rms_px],
        "views": list[P.JsonValue](views),
        "views_dropped": list[P.JsonValue](dropped),
        "view_tilt_deg": [float(v) for v in result.view_tilt_deg],
        "tilt_deg": float(result.tilt_deg),
        "holdout": {"method": h.method, "folds": int(h.folds), "rms_px": _f(h.rms_px), "inflation": _f(h.inflation),
                    "view_rms_px": [_f(v) for v in h.view_rms_px]},
        "coverage": {"fraction": float(cov.fraction), "grid": [int(cov.grid[0]), int(cov.grid[1])],
                     "occupied": [[bool(x) for x in row] for row in cov.occupied],
                     "max_radius_fraction": float(cov.max_radius_fraction)},
        "corners": {"view": [int(v) for v in res.view], "ids": [int(i) for i in res.ids],
                    "image_points_px": [[float(u), float(v)] for u, v in res.image_points_px],
                    "residuals_px": [[float(u), float(v)] for u, v in res.residuals_px]},
        "noise_px": float(result.noise_px), "noise_source": result.noise_source,
        "chi2": float(result.chi2), "dof": int(result.dof), "n_views": int(result.n_views),
        "n_corners": int(result.n_corners), "target": target_wire(result.target),
    }
    K = np.asarray(result.camera_matrix, dtype=float)
    return {
        "transforms": {}, "points": {},
        "n_stations": int(result.n_views), "n_motions": 0,
        # closure figures of a pose calibration: none here (the residuals are pixels, below)
        "rms_translation_m": 0.0, "max_translation_m": 0.0, "rms_rotation_rad": 0.0, "max_rotation_rad": 0.0,
        "axis_spread": 1.0, "residuals": {"translation_m": [], "rotation_rad": []},
        "solver": SOLVER_NAME, "frame_convention": FRAME_CONVENTION,
        "uncertainty": {
            "convention": UNCERTAINTY_CONVENTION, "covariance": {}, "joint": {"order": [], "shape": [0, 0], "values": []},
            "sigma_translation_m": None, "sigma_rotation_rad": None, "noise_translation_m": None,
            "noise_rotation_rad": None, "noise_source": f"corner noise {result.noise_source}",
            "chi2": float(result.chi2), "dof": int(result.dof), "refined": True, "iterations": int(result.iterations),
            "downweighted_stations": [],
        },
        "holdout": None, "linear_agreement": None,
        "converged": bool(result.converged), "stop_reason": str(result.stop_reason),
        "iterations": int(result.iterations), "dof": int(result.dof), "downweighted": [],
        "warnings": warnings, "residual_tests": None,
        "camera_matrix": [[float(v) for v in row] for row in K],
        "dist_coeffs": [float(v) for v in result.dist_coeffs],
        "image_size": [int(result.image_size[0]), int(result.image_size[1])],
        "reprojection_rms_px": float(result.reprojection_rms_px),
        "target_sha256": result.target_sha256,
        "intrinsics": intrinsics,
    }


def intrinsics_gates(result: IntrinsicsResult, cfg: Config) -> GateReport:
    """``[camera.intrinsics]``'s gates (and ``[solve] require_converged``) on a result."""
    assert cfg.camera is not None
    g = cfg.camera.intrinsics
    checks: list[GateCheck] = []
    rms = float(result.reprojection_rms_px)
    ok = rms <= g.max_rms_px
    checks.append(GateCheck("reprojection_rms", rms, g.max_rms_px, "px", ok,
                            f"reprojection RMS {rms:.3f} px {'<=' if ok else '>'} {g.max_rms_px:.3f} px"))
    frac = float(result.coverage.fraction)
    ok = frac >= g.min_coverage
    checks.append(GateCheck("image_coverage", frac, g.min_coverage, "fraction", ok,
                            f"corners cover {frac:.0%} of the image {'>=' if ok else '<'} {g.min_coverage:.0%}"))
    s = result.sigmas
    sig = float(max(s[0], s[1]))
    ok = math.isfinite(sig) and sig <= g.max_sigma_focal_px
    checks.append(GateCheck("sigma_focal", sig, g.max_sigma_focal_px, "px", ok,
                            f"1-sigma of the focal lengths {sig:.3f} px {'<=' if ok else '>'} {g.max_sigma_focal_px:.3f} px"))
    if cfg.solve.require_converged:
        ok = bool(result.converged)
        checks.append(GateCheck("converged", 1.0 if ok else 0.0, 1.0, "bool", ok,
                                "refinement converged" if ok else f"refinement did not converge ({result.stop_reason})"))
    return GateReport(tuple(checks))


def stored_intrinsics(store: Store, camera: Camera, *, limit: int = 50) -> ResultRecord | None:
    """The intrinsics result later camera kinds take (``[camera] use_intrinsics``): ``result:<id>``
    that result (``CalibrationError`` unless it is an intrinsics result that passed its gates);
    ``latest`` the newest intrinsics result among the ``limit`` newest that passed its gates
    and is not suspect (None without one); ``estimate`` None (the kind estimates them)."""
    rid = stored_intrinsics_id(camera)
    if rid is not None:
        try:
            rec = store.get_result(rid)
        except UnknownRecord:
            raise CalibrationError(f"[camera] use_intrinsics names result {rid}, which the store does not hold") from None
        if rec.kind != P.KIND_INTRINSICS or not gates_passed(rec.result):
            raise CalibrationError(f"[camera] use_intrinsics names result {rid}, a {rec.kind} result"
                                   f"{'' if gates_passed(rec.result) else ' that failed its gates'}: not usable intrinsics")
        return rec
    if camera.use_intrinsics != "latest":
        return None
    for rec in store.list_results(limit=limit):
        if rec.kind == P.KIND_INTRINSICS and not rec.suspect and gates_passed(rec.result):
            return rec
    return None


class Intrinsics(RunKind):
    """A camera's intrinsics from views of its target (module docstring)."""

    name = P.KIND_INTRINSICS
    needs_tracker = False
    needs_camera = True

    def refuse_start(self, ctx: RunContext) -> str | None:
        if ctx.cfg.camera is None:
            return "an intrinsics run needs a camera: this cell has no [camera] section"
        return None

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        q, T = camera_plan.view_pose(ctx.cfg, ctx.model)
        planned = stations if stations is not None else camera_plan.camera_views(ctx.cfg, ctx.model)
        return {**plan_to_dict(planned), **camera_plan_extra(ctx.cfg),
                VIEW_KEY: {"q_rad": [float(v) for v in q], "base_T_flange": [float(v) for v in T.reshape(16)]}}

    def check_plan(self, ctx: RunContext, run: RunRecord) -> None:
        cam = ctx.cfg.camera
        if cam is None:
            raise CalibrationError("an intrinsics run needs a camera: this cell has no [camera] section")
        stations = _list(_map(run.plan).get("stations"))
        if len(stations) < MIN_VIEWS:
            raise NotEnoughSamples(len(stations), MIN_VIEWS, "intrinsics", hint="planned views of the target")
        view = _map(_map(run.plan).get(VIEW_KEY))
        base = view.get("base_T_flange")
        if base is None or not ctx.commands_robot:
            return  # observe mode: the cell's program chooses the views; the solve judges them
        T_view = np.asarray(base, dtype=float).reshape(4, 4)
        inv = np.linalg.inv(T_view)
        rel = [inv @ np.asarray(_map(s)["base_T_flange"], dtype=float).reshape(4, 4) for s in stations
               if _map(s).get("base_T_flange") is not None]
        tilt, axis = camera_plan.predicted_tilt_deg(ctx.cfg, rel)
        limit = cam.intrinsics.refuse_tilt_deg
        if tilt < limit:
            raise InsufficientTilt(
                f"intrinsics: the planned views tilt the target {tilt:.1f} deg (RMS) about its weakest image direction "
                f"({axis[0]:+.2f}, {axis[1]:+.2f}), at least {limit:g} deg needed: raise [camera.plan] max_tilt_deg "
                "or plan more views", tilt_deg=tilt, required_deg=limit, axis=axis, view_tilt_deg=())

    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        return engine.capture_camera(planned.index, [s.base_T_flange for s in accepted], abort)

    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> IntrinsicsResult:
        cam = ctx.cfg.camera
        if cam is None or cam.target is None:
            raise CalibrationError("an intrinsics run is solved with the [camera] target_file: this cell has none")
        views, size, indices, sha = views_of_stations(stations)
        if sha is not None and cam.target_sha256 and sha != cam.target_sha256:
            raise CalibrationError(f"run {run.id}'s stations were captured with the target file of sha256 {sha[:12]}..., "
                                   f"the configuration's {cam.target_path} is {cam.target_sha256[:12]}...: solve them "
                                   "with that file (cellcal stations, then cellcal solve --setup intrinsics)")
        return solve_views(views, cam.target, size, cam)

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        r = as_intrinsics(result)
        _views, _size, indices, _sha = views_of_stations(stations)
        report = intrinsics_gates(r, ctx.cfg)
        record = intrinsics_record(r, indices)
        record["gates"] = report.to_wire()
        record["check_stations"] = []  # a camera's intrinsics have no drift check (no tracker model)
        return Finished(report, record)

    def resume_refusal(self, ctx: RunContext, run: RunRecord) -> str | None:
        cam = ctx.cfg.camera
        if cam is None:
            return f"run {run.id} closed, not resumed: the daemon has no camera now ([camera] removed)"
        stations = ctx.store.stations(run.id)
        shas = {str(_map(s.camera).get("target_sha256") or "") for s in stations} - {""}
        if shas and shas != {cam.target_sha256}:
            return (f"run {run.id} closed, not resumed: its stations were captured with another target file than "
                    f"{cam.target_path} (sha256 {cam.target_sha256[:12]}...)")
        return None

    # ---- outputs ---------------------------------------------------------------------------------
    def show_lines(self, body: ResultBody) -> list[str]:
        return ir.show_lines(body)

    def report_sections(self, body: ResultBody, stations: Sequence[StationRecord] | None) -> ReportParts:
        return ir.report_parts(body, stations)

    def write_exports(self, directory: Path, result_id: int, body: ResultBody, export: Export) -> dict[str, Path]:
        return ir.write_exports(directory, result_id, body, export)

    def stations_refusal(self, run: RunRecord) -> str | None:
        return None
