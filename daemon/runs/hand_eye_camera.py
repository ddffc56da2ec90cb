"""Hand-eye with the cell's camera, run unattended: what ``hand_eye`` and ``eye_to_hand`` share (ADR 0031).

:class:`CameraHandEyeKind` is the run kind of both setups; ``cellcal.daemon.runs.hand_eye``
(eye-in-hand: ``flange_T_camera`` and ``base_T_target``) and
``cellcal.daemon.runs.eye_to_hand`` (``base_T_camera`` and ``flange_T_target``) set only
which one it is.

* **refuse_start**: no ``[camera]``; a camera mounted the other way (``[camera] mounting``);
  no intrinsics to take (``[camera] use_intrinsics = "latest"`` with no intrinsics result
  that passed its gates, or a ``result:<id>`` that is none: run ``intrinsics`` first, or set
  ``"estimate"``).
* **plan**: the camera views (``cellcal.daemon.runs.camera_plan``: tilts about axes across
  the view axis in every image direction, rolls about it, shifts and approaches, within the
  joint limits, turning about a point of the target so it stays in view). With stored
  intrinsics to judge them by (and ``[camera.plan] planner = "information"``, the default),
  the ``n_views`` of four times as many reachable candidates that determine the camera
  transform best (``camera_plan.information_views``: ``solver.plan_camera_stations``,
  E-optimal on the image-level information), with their predicted 1-sigma; otherwise (or
  when the drawing the planner judges by sees too few of them) the first reachable ones.
  Stored with the target file, **the intrinsics the run takes** (:data:`INTRINSICS_KEY`: the
  result id, or ``"estimate"``), so a resumed run solves with what it started with, and how
  the views were chosen (:data:`PLANNER_KEY`).
* **check_plan**: refuses, before the first move, fewer than :data:`MIN_STATIONS` views, and
  planned flange rotations whose axis spread (``solver.camera_planning.axis_spread_of``, ADR
  0002) is below ``[camera.hand_eye] min_axis_spread`` (``DegenerateGeometry`` naming the
  axis), as the solve would after the moves.
* **extra_station**: a solve that finds the rotations sharing one axis (``DegenerateGeometry``)
  gets, in command mode, the camera plan's reachable candidate view turning most across it
  (``camera_plan.extra_view``), up to ``[plan] max_extra_stations``, instead of failing.
* **capture**: camera stations (``CaptureEngine.capture_camera``): the robot at rest through a
  settled exposure, the robot state interpolated to mid-exposure (ADR 0030).
* **solve**: ``calibrate_hand_eye_camera`` / ``calibrate_eye_to_hand_camera`` on the
  stations' detections and flange poses; the stored intrinsics as a prior (their covariance:
  intrinsics from *other* images, ``intrinsics_mode="prior"``) or estimated jointly;
  ``[camera.hand_eye]``'s noise, robot priors, bootstrap and cross-check.
* **finish**: :func:`camera_gates`, the tracker check where the run measured the tracker
  too (``cellcal.daemon.runs.hand_eye_tracker``: eye-to-hand with ``[camera.hand_eye]
  tracker_target_mm``, eye-in-hand with ``tracker_flange_target``; its own gate
  ``tracker_check``), the dynamic check with
  ``[camera.hand_eye] dynamic_check`` (``cellcal.daemon.runs.camera_dynamic``: frames while
  moving, the residual latency, a warning beyond ``max_latency_ms``) and the stored record
  (:func:`camera_record`).
* **write_exports**: beside the common exports, the integrator files of
  ``cellcal.daemon.report.hand_eye_exports`` (ROS 2 static transforms, URDF, xacro,
  easy_handeye YAML, MoveIt Calibration's launch files), ``result_<id>_hand_eye*``, with
  ``[export]``'s frame names (and its ``base_frame_yaw_deg``), each written atomically; a result that failed its gates gets
  them marked and disarmed, in the refused directory as its other exports.

The gates are in the units the result is measured in (ADR 0031): the reprojection RMS in px;
the 1-sigma of the camera transform (translation mm, rotation deg) from the image-level
covariance; the held-out views' static-target closure (mm); convergence; a ``model_error``
of the chain's own tests (the robot's corrections against their prior, a smooth field in the
image residuals), judged as a test and never as a length; and OpenCV's closed forms agreeing
with the result when the bootstrap could judge them. The generic pose gates of
``cellcal.daemon.gates`` are not used: their ``sigma_at_task_points`` carries ``[solve]
robot_accuracy_mm`` (a tracker cell's figure) and their ``model_error`` reads its value in
metres, which a camera result's image-structure warning is not.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import as_json, result_to_wire
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.config import Config, Export
from cellcal.daemon.config.camera import MOUNTING_EYE_IN_HAND, MOUNTING_EYE_TO_HAND
from cellcal.daemon.gates import GateCheck, GateReport, gates_failed, gates_passed
from cellcal.daemon.report.exports import atomic_write_bytes
from cellcal.daemon.report.hand_eye_exports import TRANSFORM_NAMES, hand_eye_export_texts, hand_eye_file_names
from cellcal.daemon.runs import camera_dynamic, camera_plan
from cellcal.daemon.runs import hand_eye_report as hr
from cellcal.daemon.runs import hand_eye_tracker as ht
from cellcal.daemon.runs.base import Finished, Measure, ReportParts, ResultBody, RunContext, RunKind, SolverResult
from cellcal.daemon.runs.intrinsics import (
    TARGET_KEY,
    VIEW_KEY,
    camera_plan_extra,
    stored_intrinsics,
    target_wire,
    views_of_stations,
)
from cellcal.daemon.runs.kinematics import identified_accuracy
from cellcal.daemon.runs.plan import PlanError, PlannedStation, plan_to_dict
from cellcal.daemon.store import RunRecord, StationRecord, Store, UnknownRecord
from cellcal.solver import CalibrationError, NotEnoughSamples
from cellcal.solver.camera_model import PARAMETER_NAMES, CameraModel
from cellcal.solver.camera_planning import axis_spread_of
from cellcal.solver.camera_results import CameraChainResult
from cellcal.solver.errors import DegenerateGeometry
from cellcal.solver.hand_eye_camera import calibrate_eye_to_hand_camera, calibrate_hand_eye_camera
from cellcal.solver.uncertainty import sigma_figures

__all__ = ["CameraHandEyeKind", "INTRINSICS_KEY", "PLANNER_KEY", "RECORD_KEY", "MIN_STATIONS", "camera_gates", "camera_record",
           "intrinsics_source", "as_camera_chain"]

#: The key of a camera hand-eye run's plan naming the intrinsics it takes:
#: ``{"use": "result", "result_id": <id>}`` or ``{"use": "estimate"}``.
INTRINSICS_KEY = "camera_intrinsics"
#: The key of the stored record holding the camera chain's figures (``docs/protocols/zeromq.md``).
RECORD_KEY = "camera_hand_eye"
#: The key of a camera hand-eye run's plan saying how its views were chosen: ``{"name":
#: "information", "predicted_sigma_translation_mm", "predicted_sigma_rotation_deg", "weakest",
#: "n_candidates", "n_seen", "axis_spread"}`` or ``{"name": "views", "reason"}`` (or ``"given"``).
PLANNER_KEY = "planner"
#: Fewer views than this cannot be held out (the solver's k-fold closure needs 6).
MIN_STATIONS = 6
#: ``solver`` prefix of the stored record (provenance).
SOLVER_NAME = "calibrate_{setup}_camera: maximum likelihood on the image corners from AX=XB on PnP poses (ADR 0027)"


def as_camera_chain(result: SolverResult) -> CameraChainResult:
    """The camera chain result a camera hand-eye kind's :meth:`RunKind.solve` returned."""
    if not isinstance(result, CameraChainResult):
        raise TypeError(f"a camera hand-eye result was expected, got {type(result).__name__}")
    return result


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def _list(v: object) -> list[object]:
    return list(v) if isinstance(v, (list, tuple)) else []


def _f(v: object) -> float | None:
    try:
        x = float(v) if isinstance(v, (int, float, np.floating, np.integer)) else float(str(v))
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def intrinsics_source(ctx: RunContext) -> P.JsonObject:
    """What a new run takes for the camera's intrinsics (``[camera] use_intrinsics``):
    ``{"use": "result", "result_id": id}`` or ``{"use": "estimate"}``.

    Raises
    ------
    CalibrationError
        ``latest`` with no usable intrinsics result stored, or a ``result:<id>`` that is none
        (the message names what to do).
    """
    cam = ctx.cfg.camera
    assert cam is not None
    if cam.use_intrinsics == "estimate":
        return {"use": "estimate"}
    rec = stored_intrinsics(ctx.store, cam)
    if rec is None:
        raise CalibrationError("[camera] use_intrinsics = \"latest\" and the store holds no intrinsics result that "
                               "passed its gates: run kind intrinsics first, or set use_intrinsics = \"estimate\" "
                               "(estimated with the hand-eye, from views planned for it)")
    return {"use": "result", "result_id": int(rec.id)}


def _run_source(run: RunRecord) -> P.JsonObject:
    """The intrinsics a run took (its plan's :data:`INTRINSICS_KEY`; none recorded: estimated)."""
    s = _map(_map(run.plan).get(INTRINSICS_KEY))
    if s.get("use") == "result":
        return {"use": "result", "result_id": int(str(s.get("result_id")))}
    return {"use": "estimate"}


def robot_accuracy(ctx: RunContext, run: RunRecord) -> tuple[float, float, P.JsonObject]:
    """The arm's absolute accuracy the solve declares, ``(1-sigma per axis m, rad, source)``:
    ``[camera.hand_eye] robot_accuracy_mm`` / ``_deg`` when either is set (source
    ``{"from": "config"}``); else, when the run's poses came from an identified model (a
    CiA 402 arm with ``[kinematics] use_identified``), that kinematics result's held-out
    figures (``kinematics.identified_accuracy``; source ``{"from": "kinematics",
    "result_id": N}``); else 0 (``{"from": "undeclared"}``: the record then warns
    ``robot_accuracy_undeclared``)."""
    cam = ctx.cfg.camera
    assert cam is not None  # a camera kind runs only with a [camera]
    h = cam.hand_eye
    if h.robot_accuracy_m > 0.0 or h.robot_accuracy_rad > 0.0:
        return h.robot_accuracy_m, h.robot_accuracy_rad, {"from": "config"}
    got = identified_accuracy(ctx.store, _map(_map(run.devices).get(P.DEVICE_ROBOT)))
    if got is None:
        return 0.0, 0.0, {"from": "undeclared"}
    return got[0], got[1], {"from": "kinematics", "result_id": got[2]}


def _serial(identity: object) -> str:
    return str(_map(identity).get("serial") or "")


def _stored_camera(store: Store, source: Mapping[str, object],
                   stations: Sequence[StationRecord]) -> tuple[CameraModel, npt.NDArray[np.float64]] | None:
    """The intrinsics a run took (its plan's :data:`INTRINSICS_KEY`): ``(model, covariance
    (9, 9))``, or None to estimate them.

    Raises
    ------
    CalibrationError
        The result is gone, or it calibrated another camera than the stations' (serials).
    """
    if source.get("use") != "result":
        return None
    rid = int(str(source.get("result_id")))
    try:
        rec = store.get_result(rid)
    except UnknownRecord:
        raise CalibrationError(f"the run took the intrinsics of result {rid}, which the store no longer holds") from None
    theirs = _serial(_map(rec.provenance.get("devices")).get(P.DEVICE_CAMERA))
    ours = {_serial(_map(s.camera).get("device")) for s in stations} - {""}
    if theirs and ours and ours != {theirs}:
        raise CalibrationError(f"the intrinsics of result {rid} are of camera {theirs}, the run's stations were taken "
                               f"by {', '.join(sorted(ours))}: run kind intrinsics with this camera, or set "
                               "[camera] use_intrinsics")
    body = rec.result
    K = np.asarray(body.get("camera_matrix"), dtype=float).reshape(3, 3)
    d = np.asarray(body.get("dist_coeffs"), dtype=float).reshape(5)
    wh = [int(str(v)) for v in _list(body.get("image_size"))]
    cov = _map(_map(body.get("intrinsics")).get("covariance"))
    C = np.array([np.nan if v is None else float(str(v)) for v in _list(cov.get("values"))], dtype=float)
    C = C.reshape(len(PARAMETER_NAMES), len(PARAMETER_NAMES))
    return CameraModel(K, d, (wh[0], wh[1])), np.nan_to_num(C, nan=0.0)


class CameraHandEyeKind(RunKind):
    """Hand-eye with the cell's camera (module docstring); subclasses set :attr:`setup`."""

    needs_tracker = False
    needs_camera = True
    #: ``"eye_in_hand"`` or ``"eye_to_hand"`` (the solver's and ``[camera] mounting``'s word).
    setup: ClassVar[str]

    def wants_tracker(self, cfg: Config) -> bool:
        # the tracker check's points: [camera.hand_eye] tracker_target_mm or tracker_flange_target
        return ht.wanted(cfg, self.setup)

    # ---- starting ------------------------------------------------------------------------------
    def refuse_start(self, ctx: RunContext) -> str | None:
        cam = ctx.cfg.camera
        a_run = f"{'an' if self.name == P.KIND_EYE_TO_HAND else 'a'} {self.name} run"
        if cam is None:
            return f"{a_run} needs a camera: this cell has no [camera] section"
        if cam.mounting != self.setup:
            other = P.KIND_EYE_TO_HAND if cam.mounting == MOUNTING_EYE_TO_HAND else P.KIND_HAND_EYE
            article = "an" if other == P.KIND_EYE_TO_HAND else "a"
            return (f"{a_run} calibrates a camera mounted {self.setup}; this cell's is {cam.mounting} "
                    f"([camera] mounting): start {article} {other} run")
        try:
            intrinsics_source(ctx)
        except CalibrationError as exc:
            return str(exc)
        return None

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        q, T = camera_plan.view_pose(ctx.cfg, ctx.model)
        source = intrinsics_source(ctx)
        planner: P.JsonObject
        if stations is not None:
            planned, planner = stations, {"name": "given"}
        else:
            planned, planner = self._views(ctx, source)
        return {**plan_to_dict(planned), **camera_plan_extra(ctx.cfg), INTRINSICS_KEY: source,
                VIEW_KEY: {"q_rad": [float(v) for v in q], "base_T_flange": [float(v) for v in T.reshape(16)]},
                PLANNER_KEY: planner}

    def _views(self, ctx: RunContext, source: P.JsonObject) -> tuple[list[PlannedStation], P.JsonObject]:
        """The plan's views and how they were chosen (module docstring, ``plan``)."""
        cam = ctx.cfg.camera
        assert cam is not None
        if cam.plan.planner == camera_plan.PLANNER_VIEWS:
            return camera_plan.camera_views(ctx.cfg, ctx.model), {
                "name": camera_plan.PLANNER_VIEWS, "reason": "[camera.plan] planner = \"views\""}
        stored = _stored_camera(ctx.store, source, ())
        nominal = camera_plan.nominal_camera(ctx.cfg) if stored is None else None
        if (stored is None and nominal is None) or cam.target is None:
            return camera_plan.camera_views(ctx.cfg, ctx.model), {
                "name": camera_plan.PLANNER_VIEWS,
                "reason": "no intrinsics before the run to judge views with ([camera] use_intrinsics = \"estimate\", "
                          "no [camera.plan] focal_px and image_size_px): the first reachable views"}
        chosen = stored if stored is not None else nominal
        assert chosen is not None
        model, C = chosen
        try:
            views, figures = camera_plan.information_views(ctx.cfg, ctx.model, self.setup, model, cam.target, C)
            figures["camera"] = "stored intrinsics" if stored is not None else "nominal ([camera.plan] focal_px)"
            return views, figures
        except PlanError as exc:
            # the drawing of the mounting sees too few candidates: the views turn about the
            # pivot, so the first reachable ones may still show the board (the solve judges)
            return camera_plan.camera_views(ctx.cfg, ctx.model), {
                "name": camera_plan.PLANNER_VIEWS, "reason": f"{exc}: the first reachable views"}

    def check_plan(self, ctx: RunContext, run: RunRecord) -> None:
        cam = ctx.cfg.camera
        if cam is None:
            raise CalibrationError(f"a {self.name} run needs a camera: this cell has no [camera] section")
        stations = [_map(s) for s in _list(_map(run.plan).get("stations"))]
        if len(stations) < MIN_STATIONS:
            raise NotEnoughSamples(len(stations), MIN_STATIONS, self.name, hint="planned camera views")
        poses = [s.get("base_T_flange") for s in stations]
        if not ctx.commands_robot or any(p is None for p in poses):
            return  # observe mode: the cell's program chooses the views; the solve judges them
        G = np.array([np.asarray(p, dtype=float).reshape(4, 4) for p in poses])
        spread, axis, frame = axis_spread_of(G, self.setup)
        limit = cam.hand_eye.min_axis_spread
        if spread < limit:
            raise DegenerateGeometry(
                f"{self.name}: the planned views turn the flange about one axis, [{axis[0]:.3f}, {axis[1]:.3f}, "
                f"{axis[2]:.3f}] ({frame} frame; axis spread {spread:.3f} < {limit:g}): raise [camera.plan] "
                "max_tilt_deg and max_roll_deg", axis=axis, frame=frame, axis_spread=spread,
                unrecoverable=("rotation about axis", "translation along axis"), max_rotation_rad=math.nan)

    # ---- capturing -----------------------------------------------------------------------------
    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        station = engine.capture_camera(planned.index, [s.base_T_flange for s in accepted], abort)
        if ht.wanted(engine.cfg, self.setup):
            station = ht.with_tracker(engine, station, planned, abort)
        return station

    # ---- solving -------------------------------------------------------------------------------
    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> CameraChainResult:
        cam = ctx.cfg.camera
        if cam is None or cam.target is None:
            raise CalibrationError(f"a {self.name} run is solved with the [camera] target_file: this cell has none")
        views, size, _indices, sha = views_of_stations(stations)
        if sha is not None and cam.target_sha256 and sha != cam.target_sha256:
            raise CalibrationError(f"run {run.id}'s stations were captured with the target file of sha256 {sha[:12]}..., "
                                   f"the configuration's {cam.target_path} is {cam.target_sha256[:12]}...")
        G = np.array([np.asarray(s.base_T_flange, dtype=float) for s in stations])
        source = _run_source(run)
        stored = _stored_camera(ctx.store, source, stations)
        h = cam.hand_eye
        solve = calibrate_hand_eye_camera if self.setup == MOUNTING_EYE_IN_HAND else calibrate_eye_to_hand_camera
        model: CameraModel | None = None
        C: npt.NDArray[np.float64] | None = None
        if stored is not None:
            model, C = stored
            if tuple(model.image_size) != tuple(size):
                raise CalibrationError(f"the intrinsics of result {source.get('result_id')} are of a "
                                       f"{model.image_size[0]} x {model.image_size[1]} image, the run's are "
                                       f"{size[0]} x {size[1]}: another camera or binning")
        acc_m, acc_rad, _source = robot_accuracy(ctx, run)
        return solve(views, cam.target, G, intrinsics=model, intrinsics_covariance=C,
                     intrinsics_mode=None if model is None else "prior", image_size=size, noise_px=h.noise_px,
                     robot_repeatability_m=h.robot_repeatability_m, robot_repeatability_rad=h.robot_repeatability_rad,
                     robot_accuracy_m=acc_m, robot_accuracy_rad=acc_rad,
                     n_bootstrap=h.n_bootstrap, cross_check=h.cross_check, max_iterations=h.max_iterations)

    def extra_station(self, ctx: RunContext, stations: Sequence[StationRecord],
                      exc: DegenerateGeometry) -> PlannedStation | None:
        if not ctx.commands_robot or ctx.cfg.camera is None:
            return None
        index = max((s.plan_index for s in stations), default=-1) + 1
        # candidates beyond any the plan drew (camera_views draws up to 6 per view), so the
        # view is a new one; each extra station its own
        n = ctx.cfg.camera.plan.n_views
        start = 6 * n + 60 * max(index - n, 0)
        return camera_plan.extra_view(ctx.cfg, ctx.model, exc.axis, exc.frame, index, start)

    def finish(self, ctx: RunContext, run: RunRecord, result: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        r = as_camera_chain(result)
        _views, _size, indices, _sha = views_of_stations(stations)
        check, why = ht.check_record(r, stations, ctx.cfg, ctx.store, _map(_map(run.devices).get(P.DEVICE_ROBOT)))
        report = camera_gates(r, ctx.cfg)
        report = GateReport((*report.checks, ht.tracker_gate(check, why)))
        record = camera_record(r, indices, _run_source(run))
        detail = record[RECORD_KEY]
        if isinstance(detail, dict):
            robot = detail.get("robot")
            if isinstance(robot, dict):
                robot["accuracy_source"] = robot_accuracy(ctx, run)[2]
            detail["tracker_check"] = check
            detail["tracker_check_note"] = why or None
            # how the views were chosen, with the plan's predicted sigma beside the result's own
            planner = _map(run.plan).get(PLANNER_KEY)
            detail["planner"] = dict(planner) if isinstance(planner, Mapping) else None
            dynamic = camera_dynamic.dynamic_check(ctx, run, r, measure)
            if dynamic is not None:
                detail[camera_dynamic.DYNAMIC_KEY] = dynamic[0]
                warnings = record.get("warnings")
                if isinstance(warnings, list):
                    warnings.extend(dynamic[1])
        record["gates"] = report.to_wire()
        record["check_stations"] = []  # a camera chain has no tracker drift check (its stations have no tracker pose)
        return Finished(report, record)

    def resume_refusal(self, ctx: RunContext, run: RunRecord) -> str | None:
        cam = ctx.cfg.camera
        if cam is None:
            return f"run {run.id} closed, not resumed: the daemon has no camera now ([camera] removed)"
        if cam.mounting != self.setup:
            return f"run {run.id} closed, not resumed: the camera is now mounted {cam.mounting} ([camera] mounting)"
        kept = _map(_map(run.plan).get(TARGET_KEY)).get("sha256")
        if kept and kept != cam.target_sha256:
            return (f"run {run.id} closed, not resumed: it was planned with another target file than "
                    f"{cam.target_path} (sha256 {cam.target_sha256[:12]}...)")
        return None

    # ---- outputs -------------------------------------------------------------------------------
    def show_lines(self, body: ResultBody) -> list[str]:
        return hr.show_lines(body)

    def report_sections(self, body: ResultBody, stations: Sequence[StationRecord] | None) -> ReportParts:
        return hr.report_parts(body)

    def write_exports(self, directory: Path, result_id: int, body: ResultBody, export: Export) -> dict[str, Path]:
        """The hand-eye integrator files (module docstring): export key (``hand_eye_launch``,
        ``hand_eye_urdf``, ...) -> path. ``directory`` is already the refused directory for a
        result that failed its gates (``report.exports.write_exports``)."""
        transforms = _map(body.get("transforms"))
        if not all(name in transforms for name in TRANSFORM_NAMES[self.setup]):
            return {}  # not a camera chain's body: the common exports say what it holds
        refused = None if gates_passed(body) else "; ".join(gates_failed(body))
        mine = {name: transforms[name] for name in TRANSFORM_NAMES[self.setup]}
        texts = hand_eye_export_texts(self.setup, _base_turned(mine, export.base_frame_yaw_rad),
                                      _map(_map(body.get("uncertainty")).get("covariance")), result_id, refused,
                                      frames=export)
        # keys of their own: the common exports' "urdf" and "launch" are other files
        return {f"hand_eye_{key}": atomic_write_bytes(Path(directory) / name, texts[name].encode())
                for key, name in hand_eye_file_names(result_id).items()}


def _base_turned(transforms: Mapping[str, object], yaw_rad: float) -> dict[str, npt.NDArray[np.float64]]:
    """The body's transforms (4, 4) with the exported base frame E turned ``yaw_rad`` about
    the controller base B's z (``[export] base_frame_yaw_deg``, ``B_T_E = Rz(yaw)``): a
    transform from the base is exported as ``E_T_child = Rz(-yaw) B_T_child``, as the common
    exports turn it (``report.exports``), so both sets of files agree on ``base_link``."""
    E_T_B = np.eye(4)
    c, s = math.cos(yaw_rad), math.sin(yaw_rad)
    E_T_B[:2, :2] = [[c, s], [-s, c]]
    out = {}
    for name, wire in transforms.items():
        T = np.asarray(_map(wire).get("matrix"), dtype=float).reshape(4, 4)
        out[name] = E_T_B @ T if name.startswith("base_T_") and yaw_rad != 0.0 else T
    return out


def camera_gates(result: CameraChainResult, cfg: Config) -> GateReport:
    """``[camera.hand_eye]``'s gates (module docstring) and ``[solve] require_converged``."""
    assert cfg.camera is not None
    g = cfg.camera.hand_eye
    name = result.primary_name
    checks: list[GateCheck] = []
    rms = float(result.reprojection_rms_px)
    ok = rms <= g.max_rms_px
    checks.append(GateCheck("reprojection_rms", rms, g.max_rms_px, "px", ok,
                            f"reprojection RMS {rms:.3f} px {'<=' if ok else '>'} {g.max_rms_px:.3f} px"))
    est = result.transforms()[name]
    st_mm, sr_deg = sigma_figures(est.covariance)
    st, sr = st_mm * 1e-3, math.radians(sr_deg)
    ok = math.isfinite(st) and st <= g.max_sigma_translation_m
    checks.append(GateCheck("sigma_translation", st, g.max_sigma_translation_m, "m", ok,
                            f"1-sigma of {name}'s translation {st_mm:.3f} mm {'<=' if ok else '>'} "
                            f"{g.max_sigma_translation_m * 1e3:g} mm"))
    ok = math.isfinite(sr) and sr <= g.max_sigma_rotation_rad
    checks.append(GateCheck("sigma_rotation", sr, g.max_sigma_rotation_rad, "rad", ok,
                            f"1-sigma of {name}'s rotation {sr_deg:.4f} deg {'<=' if ok else '>'} "
                            f"{math.degrees(g.max_sigma_rotation_rad):g} deg"))
    h = result.holdout
    if g.max_holdout_p90_m is not None:
        if h is None:
            checks.append(GateCheck.not_applicable("holdout_p90", g.max_holdout_p90_m, "m",
                                                   f"no held-out views (fewer than {MIN_STATIONS} views)"))
        else:
            v = float(h.p90_translation_m)
            ok = v <= g.max_holdout_p90_m
            checks.append(GateCheck("holdout_p90", v, g.max_holdout_p90_m, "m", ok,
                                    f"held-out views' static-target closure P90 {v * 1e3:.3f} mm "
                                    f"{'<=' if ok else '>'} {g.max_holdout_p90_m * 1e3:g} mm"))
    if cfg.solve.require_converged:
        ok = bool(result.converged)
        checks.append(GateCheck("converged", 1.0 if ok else 0.0, 1.0, "bool", ok,
                                "refinement converged" if ok else f"refinement did not converge ({result.stop_reason})"))
    t = result.camera_tests
    if g.allow_model_error:
        checks.append(GateCheck.not_applicable("model_error", 0.0, "bool", "allowed ([camera.hand_eye] allow_model_error)"))
    else:
        ok = not t.model_error
        which = [w.message for w in result.warnings if w.code == "model_error"]
        # The refusal says what to change: on a real arm (kinematic error of tenths of a mm)
        # with the accuracy undeclared the robot corrections outgrow the repeatability prior.
        forward = ("; declare the arm's absolute accuracy ([camera.hand_eye] robot_accuracy_mm, "
                   f"now {g.robot_accuracy_m * 1e3:g}) or accept the widened result "
                   "([camera.hand_eye] allow_model_error = true)")
        checks.append(GateCheck("model_error", 0.0 if ok else 1.0, 0.0, "bool", ok,
                                "the chain's tests see noise only (robot corrections within their prior, no field in "
                                "the image residuals)" if ok else "model_error: " + " / ".join(which) + forward))
    xc = result.cross_check
    if g.require_cross_check:
        if xc is None or xc.agrees is None:
            why = "no cross-check ran" if xc is None else f"{xc.n_bootstrap} bootstrap replicates, 10 needed to judge it"
            checks.append(GateCheck.not_applicable("cross_solver", 0.0, "sigma", why))
        else:
            d = float(xc.distance[xc.closest])
            checks.append(GateCheck("cross_solver", d, float(xc.gate), "sigma", bool(xc.agrees),
                                    f"the closest of OpenCV's closed forms ({xc.closest}) is {d:.2f} sigma of the paired "
                                    f"difference away, {'inside' if xc.agrees else 'beyond'} the gate {xc.gate:.2f}"))
    return GateReport(tuple(checks))


def _cross_check_wire(result: CameraChainResult) -> P.JsonObject | None:
    xc = result.cross_check
    if xc is None:
        return None
    return {"name": xc.name, "methods": list(xc.methods), "closest": xc.closest, "agrees": xc.agrees,
            "gate": _f(xc.gate), "n_bootstrap": int(xc.n_bootstrap), "failed": list(xc.failed),
            "spread_translation_m": _f(xc.spread_translation_m), "spread_rotation_rad": _f(xc.spread_rotation_rad),
            "translation_m": {k: _f(v) for k, v in xc.translation_m.items()},
            "rotation_rad": {k: _f(v) for k, v in xc.rotation_rad.items()},
            "distance": {k: _f(v) for k, v in xc.distance.items()}}


def camera_record(result: CameraChainResult, view_indices: Sequence[int], source: P.JsonObject) -> P.JsonObject:
    """The stored record of a camera hand-eye result before its gates: the common result
    (``result_to_wire``: the two transforms with their covariances, the static-target closure
    of every view, its held-out closure, warnings), the camera at the top (``camera_matrix``,
    ``dist_coeffs``, ``image_size``, ``reprojection_rms_px``) and the chain's own figures
    under :data:`RECORD_KEY` (``docs/protocols/zeromq.md``). ``view_indices``: the station
    (plan index) of each view the solver was given."""
    wire = as_json(result_to_wire(result))
    views = [int(view_indices[i]) for i in result.views]
    dropped = [int(view_indices[i]) for i in result.views_dropped]
    sig = np.sqrt(np.clip(np.diag(result.intrinsics_covariance), 0.0, None))
    b = result.bootstrap
    t = result.camera_tests
    d = np.asarray(result.robot_corrections, dtype=float)
    detail: P.JsonObject = {
        "setup": result.setup,
        "intrinsics_source": source,
        "intrinsics_mode": result.intrinsics_mode,
        "intrinsics": {"parameter_names": list(PARAMETER_NAMES), "parameters": [float(v) for v in result.intrinsics],
                       "sigmas": [_f(v) for v in sig], "fixed": list(result.intrinsics_fixed)},
        "noise_px": float(result.noise_px), "noise_source": result.noise_source,
        "views": list[P.JsonValue](views), "views_dropped": list[P.JsonValue](dropped),
        "view_rms_px": [float(v) for v in result.view_rms_px],
        "holdout_view_rms_px": [_f(v) for v in result.holdout_view_rms_px],
        "holdout_reprojection_rms_px": _f(result.holdout_reprojection_rms_px),
        "cross_check": _cross_check_wire(result),
        "bootstrap": None if b is None else {
            "n": int(b.n), "n_requested": int(b.n_requested), "seed": int(b.seed),
            "sigma_ratio_translation": _f(b.sigma_ratio_translation), "sigma_ratio_rotation": _f(b.sigma_ratio_rotation)},
        "tests": {"image_chi2": _f(t.image_chi2), "image_redundancy": _f(t.image_redundancy),
                  "image_chi2_p": _f(t.image_chi2_p), "robot_chi2": _f(t.robot_chi2), "robot_chi2_p": _f(t.robot_chi2_p),
                  "consistency_f": _f(t.consistency_f), "consistency_p": _f(t.consistency_p),
                  "structure_f": _f(t.structure_f), "structure_p": _f(t.structure_p),
                  "structure_rms_px": _f(t.structure_rms_px), "model_error": bool(t.model_error)},
        "robot": {"repeatability_m": float(result.robot_repeatability_m),
                  "repeatability_rad": float(result.robot_repeatability_rad),
                  "accuracy_m": float(result.robot_accuracy_m), "accuracy_rad": float(result.robot_accuracy_rad),
                  "variance_factor": [float(v) for v in result.robot_variance_factor],
                  "corrections_rms_m": float(np.sqrt(np.mean(d[:, :3] ** 2))) if d.size else 0.0,
                  "corrections_rms_rad": float(np.sqrt(np.mean(d[:, 3:] ** 2))) if d.size else 0.0},
        "target": target_wire(result.target),
        "tracker_check": None,
        "dynamic_check": None,
    }
    if result.robot_accuracy_m == 0.0 and result.robot_accuracy_rad == 0.0:
        # ADR 0027: an arm's error common to every view leaves no residual; undeclared, the
        # covariance holds only what the chain's tests saw of it (ADR 0031 keeps 0 the default)
        warnings = wire.get("warnings")
        if isinstance(warnings, list):
            warnings.append({"code": "robot_accuracy_undeclared", "value": None, "message": (
                "the robot's absolute accuracy is not declared ([camera.hand_eye] robot_accuracy_mm = 0): the "
                "covariance leaves out an arm error common to every view, which no residual shows; declare the "
                "arm's figure for a conservative one")})
    wire.update({
        "solver": SOLVER_NAME.format(setup="hand_eye" if result.setup == MOUNTING_EYE_IN_HAND else "eye_to_hand")
        + f"; {result.solver}",
        "camera_matrix": [[float(v) for v in row] for row in np.asarray(result.camera_matrix, dtype=float)],
        "dist_coeffs": [float(v) for v in result.dist_coeffs],
        "image_size": [int(result.image_size[0]), int(result.image_size[1])],
        "reprojection_rms_px": float(result.reprojection_rms_px),
        "target_sha256": result.target_sha256,
        RECORD_KEY: detail,
    })
    return wire
