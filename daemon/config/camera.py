"""``[camera]``: the cell's camera, its calibration target, how a camera station is captured,
the views a camera run visits and the intrinsics solve with its gates (ADR 0030).

The section is optional: without it the daemon has no camera (nothing opens, the heartbeat
names no camera, a camera run kind refuses to start). With it:

* ``url`` is the camera's (``gige://<ipv4>[:port]``, ``dir://<folder>``), checked by the
  driver's own URL parser (``cellcal.drivers.camera.parse_camera_url``) and, with
  ``[camera.options]``, by building the driver (constructors do no I/O), each error under its
  own key (``camera.options.heartbeat_timeout_s``);
* ``target_file`` is read and checked when the configuration is loaded
  (:func:`load_camera_target`, relative paths from the configuration file's folder): a bad
  board description fails ``check-config`` naming the target file's key, and its sha256 is
  kept (:attr:`Camera.target_sha256`) for every camera result's provenance;
* ``exposure_ms``, ``gain_db``, ``pixel_format`` and ``trigger`` are applied after the camera
  opens (absent: the camera's own settings stay); ``auto_exposure = true`` says the camera
  sets its exposure itself, so a station waits for it to settle (and ``exposure_ms`` may not
  be given with it);
* ``use_intrinsics`` is what later camera kinds (hand-eye, issue 27) take for the camera's
  intrinsics: ``"latest"`` (the newest stored intrinsics result of this camera that passed its
  gates), ``"result:<id>"`` (that one) or ``"estimate"`` (estimated with the hand-eye).

The sections are defined here beside the schema, as the plant interfaces' are
(``cellcal.daemon.config.plant``): the schema hooks them in through :data:`BOUNDS`,
:data:`CHOICES`, :data:`STR_LISTS`; :func:`validate_camera` is the one hook of
``config.checks``; :func:`load_camera_target` the loader's.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias, TypeVar

from cellcal.daemon.config.errors import ConfigError
from cellcal.drivers.camera import TriggerMode, connect_camera, parse_camera_url
from cellcal.solver.camera_model import PARAMETER_NAMES
from cellcal.solver.errors import TargetFileError
from cellcal.solver.target import CalibrationTarget, target_from_toml

__all__ = ["Camera", "CameraCapture", "CameraPlan", "CameraIntrinsics", "CameraHandEye", "MOUNTINGS", "MOUNTING_EYE_IN_HAND",
           "MOUNTING_EYE_TO_HAND", "BOUNDS", "CHOICES", "STR_LISTS", "validate_camera", "load_camera_target",
           "stored_intrinsics_id", "DEFAULT_PIVOT_M", "CameraOptions"]

_T = TypeVar("_T")
_MM = 1e-3
_DEG = math.pi / 180.0

#: ``[camera.options]``: TOML values forwarded as keyword arguments to the driver's
#: ``connect_camera``, which checks them (:func:`validate_camera` names the key): ``object``,
#: as the drivers check them.
CameraOptions: TypeAlias = dict[str, object]

MOUNTING_EYE_IN_HAND = "eye_in_hand"
MOUNTING_EYE_TO_HAND = "eye_to_hand"
#: Where the camera sits: on the flange looking at a target fixed in the cell, or fixed in the
#: cell looking at a target on the flange.
MOUNTINGS = (MOUNTING_EYE_IN_HAND, MOUNTING_EYE_TO_HAND)
#: ``[camera.plan] planner``: views chosen by their information for the camera transform, or the first reachable.
PLANNERS = ("information", "views")
#: The point a plan's views turn about when ``[camera.plan] pivot_mm`` is not given (flange
#: frame, m): half a metre along the flange's z for a camera on the flange (the target it
#: looks at), 50 mm along it for a target on the flange (its centre).
DEFAULT_PIVOT_M = {MOUNTING_EYE_IN_HAND: (0.0, 0.0, 0.5), MOUNTING_EYE_TO_HAND: (0.0, 0.0, 0.05)}

_USE_INTRINSICS = re.compile(r"latest|estimate|result:[1-9][0-9]{0,17}")


def _k(default: _T, name: str, scale: float = 1.0, doc: str = "") -> _T:
    """A field with its TOML key (``cellcal.daemon.config.schema``'s form)."""
    meta = {"key": name, "scale": scale, "doc": doc}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def _key(name: str) -> dict[str, str | float]:
    """A sub-table field's metadata: its TOML key."""
    return {"key": name, "scale": 1.0, "doc": ""}


@dataclass(frozen=True)
class CameraCapture:
    """``[camera.capture]``: when a camera station is accepted."""

    min_corners: int = _k(12, "min_corners", doc="fewer target corners found: the station is refused")
    max_blur_px: float = _k(2.5, "max_blur_px", doc="edge blur (Gaussian sigma) of the target, px; more: refused")
    exposure_settled_pct: float = _k(3.0, "exposure_settled_pct",
                                     doc="auto-exposure: settled when two frames' exposures differ by less")
    max_exposure_frames: int = _k(20, "max_exposure_frames", doc="auto-exposure: frames to wait at most")
    grab_timeout_s: float = _k(5.0, "grab_timeout_s", doc="one frame's deadline beyond the exposure")


@dataclass(frozen=True)
class CameraPlan:
    """``[camera.plan]``: the views a camera run visits (ADR 0030)."""

    n_views: int = _k(15, "n_views")
    view_q_rad: list[float] = _k([], "view_q_deg", _DEG,
                                 doc="joints where the camera sees the target (default: [plan] home_q_deg)")
    view_flange_xyz_m: list[float] = _k([], "view_flange_xyz_mm", _MM, doc="... or that flange pose, base frame")
    view_flange_quat_wxyz: list[float] = _k([], "view_flange_quat_wxyz")
    pivot_m: list[float] = _k([], "pivot_mm", _MM,
                              doc="point the views turn about, flange frame at the view ([]: by mounting)")
    max_tilt_rad: float = _k(math.radians(25.0), "max_tilt_deg", _DEG, doc="tilt of the target against the view")
    max_roll_rad: float = _k(math.radians(30.0), "max_roll_deg", _DEG, doc="turn about the view axis")
    max_shift_m: float = _k(0.04, "max_shift_mm", _MM, doc="sideways, moving the target across the image")
    max_approach_m: float = _k(0.06, "max_approach_mm", _MM, doc="nearer and farther along the view axis")
    seed: int = _k(0, "seed")
    planner: str = _k("information", "planner",
                      doc="hand-eye kinds: information (the views that determine the camera best) or views")
    focal_px: float = _k(0.0, "focal_px", doc="nominal focal length the information plan judges views by when the "
                         "intrinsics are estimated (0: the first reachable views)")
    image_size_px: list[int] = _k([], "image_size_px", doc="... and the image's width and height (px), with focal_px")


@dataclass(frozen=True)
class CameraIntrinsics:
    """``[camera.intrinsics]``: the intrinsics solve (``calibrate_intrinsics``) and its gates."""

    noise_px: float | None = _k(None, "noise_px", doc="declared corner noise, 1-sigma (off: estimated)")
    fix: list[str] = _k([], "fix", doc="distortion terms held at 0 (k3, p1, p2 ...)")
    holdout_folds: int = _k(5, "holdout_folds", doc="folds of the held-out views (0: none)")
    refuse_tilt_deg: float = _k(5.0, "refuse_tilt_deg", doc="the solver refuses views tilted less (ADR 0022)")
    refuse_coverage: float = _k(0.25, "refuse_coverage", doc="the solver refuses corners covering less of the image")
    max_iterations: int = _k(100, "max_iterations")
    max_rms_px: float = _k(0.5, "max_rms_px", doc="gate: reprojection RMS")
    min_coverage: float = _k(0.5, "min_coverage", doc="gate: share of the image's 10 x 10 grid holding a corner")
    max_sigma_focal_px: float = _k(2.0, "max_sigma_focal_px", doc="gate: 1-sigma of fx and fy")


@dataclass(frozen=True)
class CameraHandEye:
    """``[camera.hand_eye]``: the camera hand-eye solves (``calibrate_hand_eye_camera``,
    ``calibrate_eye_to_hand_camera``) of the ``hand_eye`` and ``eye_to_hand`` kinds and their
    gates (ADR 0031). The gates are in the units the result is measured in: the image's in
    pixels, the transforms' sigmas and the held-out closure in mm and deg."""

    noise_px: float | None = _k(None, "noise_px", doc="declared corner noise, 1-sigma (off: estimated)")
    robot_repeatability_m: float = _k(1.0e-5, "robot_repeatability_mm", _MM,
                                      doc="the robot's pose repeatability, 1-sigma per axis (the per-view prior)")
    robot_repeatability_rad: float = _k(1.5e-5, "robot_repeatability_deg", _DEG, doc="... its rotation")
    robot_accuracy_m: float = _k(0.0, "robot_accuracy_mm", _MM,
                                 doc="the robot's absolute accuracy, 1-sigma per axis, added to the prior")
    robot_accuracy_rad: float = _k(0.0, "robot_accuracy_deg", _DEG, doc="... its rotation")
    n_bootstrap: int = _k(30, "n_bootstrap", doc="bootstrap replicates over views (the cross-check needs 10)")
    cross_check: bool = _k(True, "cross_check", doc="OpenCV's five closed forms on the same PnP poses")
    min_axis_spread: float = _k(0.05, "min_axis_spread",
                                doc="a plan whose rotations spread less (0..1, ADR 0002) is refused before moving")
    max_iterations: int = _k(50, "max_iterations")
    max_rms_px: float = _k(0.5, "max_rms_px", doc="gate: reprojection RMS over every corner")
    max_sigma_translation_m: float = _k(0.001, "max_sigma_translation_mm", _MM,
                                        doc="gate: 1-sigma of the camera transform's translation (RSS)")
    max_sigma_rotation_rad: float = _k(math.radians(0.1), "max_sigma_rotation_deg", _DEG,
                                       doc="gate: 1-sigma of the camera transform's rotation (RSS)")
    max_holdout_p90_m: float | None = _k(0.002, "max_holdout_p90_mm", _MM,
                                         doc="gate: 90th percentile of the held-out views' static-target closure")
    allow_model_error: bool = _k(False, "allow_model_error", doc="gate off: a model_error test of the chain")
    require_cross_check: bool = _k(True, "require_cross_check",
                                   doc="gate: a closed form of OpenCV's agrees (when judged)")
    tracker_target_m: list[float] = _k([], "tracker_target_mm", _MM,
                                       doc="eye to hand: the tracker's target on the camera's target, its frame "
                                           "([]: no tracker check)")
    tracker_flange_target: bool = _k(False, "tracker_flange_target",
                                     doc="eye in hand: the tracker measures its flange target at every view, "
                                         "checked against the camera chain")
    dynamic_check: bool = _k(False, "dynamic_check",
                             doc="after the solve, frames while moving both ways at two speeds: the residual latency "
                                 "(command mode)")
    dynamic_path_m: float = _k(0.08, "dynamic_path_mm", _MM,
                               doc="the dynamic check's path: this long, along the camera's image x, through the view pose")
    dynamic_speeds: list[float] = _k([0.1, 0.3], "dynamic_speeds",
                                     doc="its two speeds, fractions of the robot's nominal speed as [capture] move_speed")
    dynamic_min_frames: int = _k(3, "dynamic_min_frames",
                                 doc="moving frames wanted each way at each speed (passes repeated, at most 4 times)")
    max_latency_ms: float = _k(1.0, "max_latency_ms", doc="warn when the residual latency is beyond this")


@dataclass(frozen=True)
class Camera:
    """``[camera]``: the camera device and what the daemon does with it (module docstring)."""

    url: str = _k("", "url", doc="gige://<ipv4>[:port] or dir://<folder>")
    target_file: str = _k("", "target_file", doc="the calibration target's TOML (relative: to this file's folder)")
    mounting: str = _k("", "mounting", doc="eye_in_hand or eye_to_hand")
    use_intrinsics: str = _k("latest", "use_intrinsics", doc="for later kinds: latest, result:<id> or estimate")
    exposure_ms: float | None = _k(None, "exposure_ms", doc="set at open (absent: the camera's)")
    gain_db: float | None = _k(None, "gain_db", doc="set at open (absent: the camera's)")
    pixel_format: str | None = _k(None, "pixel_format", doc="PFNC name set at open (Mono8, Mono16 ...)")
    trigger: str = _k(TriggerMode.SOFTWARE, "trigger", doc="software (one frame per station) or off (free-running)")
    auto_exposure: bool = _k(False, "auto_exposure", doc="the camera sets its exposure: wait for it to settle")
    options: CameraOptions = _k({}, "options", doc="passed to cellcal.drivers.connect_camera")
    capture: CameraCapture = field(default_factory=CameraCapture, metadata=_key("capture"))
    plan: CameraPlan = field(default_factory=CameraPlan, metadata=_key("plan"))
    intrinsics: CameraIntrinsics = field(default_factory=CameraIntrinsics, metadata=_key("intrinsics"))
    hand_eye: CameraHandEye = field(default_factory=CameraHandEye, metadata=_key("hand_eye"))
    #: The target read from ``target_file`` at load (:func:`load_camera_target`).
    target: CalibrationTarget | None = field(default=None, metadata={"internal": True})
    #: Its file's sha256 (hex), for every camera result's provenance.
    target_sha256: str = field(default="", metadata={"internal": True})
    #: ``target_file`` resolved against the configuration's folder.
    target_path: str = field(default="", metadata={"internal": True})
    #: The target file's text as read (a camera run keeps it with its plan: its stations are
    #: written out with the very file they were captured with, ``cellcal stations``).
    target_toml: str = field(default="", metadata={"internal": True})

    @property
    def pivot(self) -> tuple[float, float, float]:
        """The plan's pivot (flange frame, m): ``[camera.plan] pivot_mm`` or the mounting's default."""
        p = self.plan.pivot_m
        if len(p) == 3:
            return float(p[0]), float(p[1]), float(p[2])
        return DEFAULT_PIVOT_M.get(self.mounting, DEFAULT_PIVOT_M[MOUNTING_EYE_IN_HAND])


CHOICES: dict[tuple[type, str], tuple[str, ...]] = {
    (Camera, "mounting"): MOUNTINGS,
    (Camera, "trigger"): TriggerMode.ALL,
    (CameraPlan, "planner"): PLANNERS,
}
STR_LISTS: set[tuple[type, str]] = {(CameraIntrinsics, "fix")}
#: Bounds in the keys' own units (``cellcal.daemon.config.schema._BOUNDS``' form).
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "camera.exposure_ms": (0.0, 60_000.0, True),
    "camera.gain_db": (-20.0, 60.0, False),
    "camera.capture.min_corners": (4, 100_000, False),
    "camera.capture.max_blur_px": (0.0, 50.0, True),
    "camera.capture.exposure_settled_pct": (0.0, 100.0, True),
    "camera.capture.max_exposure_frames": (2, 1000, False),
    "camera.capture.grab_timeout_s": (0.0, 600.0, True),
    "camera.plan.n_views": (3, 500, False),
    "camera.plan.view_q_deg[]": (-3600.0, 3600.0, False),
    "camera.plan.view_flange_xyz_mm[]": (-1e5, 1e5, False),
    "camera.plan.view_flange_quat_wxyz[]": (-1.001, 1.001, False),
    "camera.plan.pivot_mm[]": (-1e5, 1e5, False),
    "camera.plan.max_tilt_deg": (0.0, 80.0, True),
    "camera.plan.max_roll_deg": (0.0, 180.0, False),
    "camera.plan.max_shift_mm": (0.0, 1000.0, False),
    "camera.plan.max_approach_mm": (0.0, 1000.0, False),
    "camera.plan.seed": (0, 2**63 - 1, False),
    "camera.plan.focal_px": (0.0, 1e6, False),
    "camera.plan.image_size_px[]": (1, 100_000, False),
    "camera.intrinsics.noise_px": (0.0, 10.0, True),
    "camera.intrinsics.holdout_folds": (0, 50, False),
    "camera.intrinsics.refuse_tilt_deg": (0.0, 80.0, True),
    "camera.intrinsics.refuse_coverage": (0.0, 1.0, True),
    "camera.intrinsics.max_iterations": (1, 10_000, False),
    "camera.intrinsics.max_rms_px": (0.0, 10.0, True),
    "camera.intrinsics.min_coverage": (0.0, 1.0, True),
    "camera.intrinsics.max_sigma_focal_px": (0.0, 1000.0, True),
    "camera.hand_eye.noise_px": (0.0, 10.0, True),
    "camera.hand_eye.robot_repeatability_mm": (0.0, 100.0, True),
    "camera.hand_eye.robot_repeatability_deg": (0.0, 10.0, True),
    "camera.hand_eye.robot_accuracy_mm": (0.0, 100.0, False),
    "camera.hand_eye.robot_accuracy_deg": (0.0, 10.0, False),
    "camera.hand_eye.n_bootstrap": (0, 1000, False),
    "camera.hand_eye.min_axis_spread": (0.0, 1.0, False),
    "camera.hand_eye.max_iterations": (1, 10_000, False),
    "camera.hand_eye.max_rms_px": (0.0, 10.0, True),
    "camera.hand_eye.max_sigma_translation_mm": (0.0, 1000.0, True),
    "camera.hand_eye.max_sigma_rotation_deg": (0.0, 90.0, True),
    "camera.hand_eye.max_holdout_p90_mm": (0.0, 1000.0, True),
    "camera.hand_eye.tracker_target_mm[]": (-1e4, 1e4, False),
    "camera.hand_eye.dynamic_path_mm": (0.0, 2000.0, True),
    "camera.hand_eye.dynamic_speeds[]": (0.0, 1.0, True),
    "camera.hand_eye.dynamic_min_frames": (2, 100, False),
    "camera.hand_eye.max_latency_ms": (0.0, 1000.0, True),
}


def stored_intrinsics_id(camera: Camera) -> int | None:
    """The result id ``use_intrinsics = "result:<id>"`` names (None for ``latest`` / ``estimate``)."""
    kind, _, rid = camera.use_intrinsics.partition(":")
    return int(rid) if kind == "result" else None


def _try_build(url: str, options: Mapping[str, object], path: str) -> None:
    try:
        driver = connect_camera(url, **options)
    except TypeError as exc:
        raise ConfigError(path, f"not accepted by the driver: {exc}") from None
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise ConfigError(path, str(exc) or type(exc).__name__) from None
    driver.close()  # never opened: a no-op, but leaves nothing behind


def validate_camera(camera: Camera | None) -> None:
    """What the types do not say of ``[camera]`` (no device is touched): the URL by the
    driver's own parser, the options by building the driver (each error under its key), the
    required keys, and the relations between keys.

    Raises
    ------
    cellcal.daemon.config.ConfigError
        Under the dotted key (``camera.url``, ``camera.options.retries``,
        ``camera.plan.view_flange_quat_wxyz``).
    """
    if camera is None:
        return
    c = camera
    if not c.url:
        raise ConfigError("camera.url", "missing (gige://<ipv4>[:port] or dir://<folder>)")
    try:
        parse_camera_url(c.url)
    except ValueError as exc:
        raise ConfigError("camera.url", str(exc)) from None
    _try_build(c.url, {}, "camera.url")
    for k, v in c.options.items():
        _try_build(c.url, {k: v}, f"camera.options.{k}")
    _try_build(c.url, c.options, "camera.options")
    if not c.target_file:
        raise ConfigError("camera.target_file", "missing (the calibration target's TOML file, docs/simulation.md)")
    if not c.mounting:
        raise ConfigError("camera.mounting", f"missing ({' or '.join(MOUNTINGS)})")
    if not _USE_INTRINSICS.fullmatch(c.use_intrinsics):
        raise ConfigError("camera.use_intrinsics", f"expected latest, estimate or result:<id>, got {c.use_intrinsics!r}")
    if c.auto_exposure and c.exposure_ms is not None:
        raise ConfigError("camera.exposure_ms", "auto_exposure = true: the camera sets its exposure, give none")
    if c.pixel_format is not None and not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", c.pixel_format):
        raise ConfigError("camera.pixel_format", f"expected a PFNC name (Mono8, Mono16 ...), got {c.pixel_format!r}")
    for i, name in enumerate(c.intrinsics.fix):
        if name not in PARAMETER_NAMES:
            raise ConfigError(f"camera.intrinsics.fix[{i}]", f"unknown parameter {name!r} (names: {', '.join(PARAMETER_NAMES)})")
        if name in PARAMETER_NAMES[:4]:
            raise ConfigError(f"camera.intrinsics.fix[{i}]", f"{name} is estimated: only distortion terms "
                                                              f"({', '.join(PARAMETER_NAMES[4:])}) may be held at 0")
    if len(c.hand_eye.tracker_target_m) not in (0, 3):
        raise ConfigError("camera.hand_eye.tracker_target_mm",
                          f"expected 3 numbers (x, y, z, target frame) or [], got {len(c.hand_eye.tracker_target_m)}")
    speeds = c.hand_eye.dynamic_speeds
    if len(speeds) != 2 or speeds[0] == speeds[1]:
        raise ConfigError("camera.hand_eye.dynamic_speeds",
                          f"expected two different speeds (fractions in (0, 1]), got {list(speeds)}")
    p = c.plan
    if (p.focal_px > 0.0) != bool(p.image_size_px) or len(p.image_size_px) not in (0, 2):
        raise ConfigError("camera.plan.image_size_px", "a nominal camera is focal_px > 0 with image_size_px = [width, "
                                                       f"height], got focal_px {p.focal_px:g} and {list(p.image_size_px)}")
    if len(p.pivot_m) not in (0, 3):
        raise ConfigError("camera.plan.pivot_mm", f"expected 3 numbers (x, y, z, flange frame) or [], got {len(p.pivot_m)}")
    has_q, has_pose = bool(p.view_q_rad), bool(p.view_flange_xyz_m) or bool(p.view_flange_quat_wxyz)
    if has_q and has_pose:
        raise ConfigError("camera.plan.view_q_deg", "give view_q_deg or view_flange_xyz_mm + view_flange_quat_wxyz, "
                                                    "not both")
    if has_q and len(p.view_q_rad) != 6:
        raise ConfigError("camera.plan.view_q_deg", f"expected 6 numbers (one per joint), got {len(p.view_q_rad)}")
    if has_pose:
        if len(p.view_flange_xyz_m) != 3:
            raise ConfigError("camera.plan.view_flange_xyz_mm", f"expected 3 numbers, got {len(p.view_flange_xyz_m)}")
        if len(p.view_flange_quat_wxyz) != 4:
            raise ConfigError("camera.plan.view_flange_quat_wxyz",
                              f"expected 4 numbers (w, x, y, z), got {len(p.view_flange_quat_wxyz)}")
        if abs(math.sqrt(sum(x * x for x in p.view_flange_quat_wxyz)) - 1.0) > 1e-3:
            raise ConfigError("camera.plan.view_flange_quat_wxyz", "quaternion must have unit norm")


def load_camera_target(camera: Camera | None, source: str) -> Camera | None:
    """``camera`` with its target read from ``target_file`` (relative to the folder of the
    configuration file ``source``; the working directory for a configuration given as text),
    its sha256 and resolved path kept.

    Raises
    ------
    cellcal.daemon.config.ConfigError
        Under ``camera.target_file`` (unreadable), or under the target file's own key
        (``camera.target_file: target.marker_mm: ...``).
    """
    if camera is None or not camera.target_file:
        return camera
    path = Path(camera.target_file).expanduser()
    if not path.is_absolute():
        base = Path(source).parent if source and not source.startswith("<") else Path.cwd()
        path = base / path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError("camera.target_file", f"cannot read {path}: {exc}") from None
    try:
        target = target_from_toml(data, source=str(path))
    except TargetFileError as exc:
        raise ConfigError("camera.target_file", f"{path}: {exc}") from None
    return dataclasses.replace(camera, target=target, target_sha256=str(target.sha256 or ""), target_path=str(path),
                               target_toml=data.decode("utf-8"))
