"""``cellcal solve DATASET_DIR --setup intrinsics|eye_in_hand|eye_to_hand [--json]``: a camera
calibrated offline from a dataset folder (``cellcal.daemon.cli.dataset``: ``target.toml``,
``stations.csv``, the PNGs).

Every image is searched for the target with the daemon's detector (``cellcal.drivers.detect``),
and the detections are solved by ``calibrate_intrinsics`` with the daemon's defaults
(``[camera.intrinsics]``: the refusal thresholds, five held-out folds) unless the options say
otherwise: the result is the daemon's for the same images (``cellcal stations RUN -o DIR``
writes a camera run as such a folder). ``--json`` prints the result as the daemon stores it
(``cellcal.daemon.runs.intrinsics.intrinsics_record``: ``camera_matrix`` 3x3 px,
``dist_coeffs`` in OpenCV's order, ``image_size`` ``[width, height]``, ``reprojection_rms_px``
and everything behind them under ``intrinsics``) with ``dataset`` (the folder and the image of
each view); otherwise the intrinsics with their sigmas, for people.

``--setup eye_in_hand`` / ``eye_to_hand`` (ADR 0027) solve the hand-eye chain on the image
from the same detections and each row's flange pose (``base_T_flange``, every row must give
one): :func:`~cellcal.solver.calibrate_hand_eye_camera` / ``calibrate_eye_to_hand_camera``
with the intrinsics estimated jointly from the same images, or, with ``--intrinsics FILE``
(what ``--setup intrinsics --json`` prints, or a stored intrinsics result's export
``result_<id>.json``), refined under the prior of that file's covariance: intrinsics from
*other* images (a file solved from the same images is noted on stderr: its prior would count
them twice). ``--json`` prints the pose result's wire form
(``transforms``, ``uncertainty`` ...: ``cellcal.daemon.bodies.result_to_wire``) with, at the
top level, ``setup``, ``camera_matrix``, ``dist_coeffs``, ``image_size``,
``reprojection_rms_px``, and each transform by its name (``flange_T_camera`` and
``base_T_target``, or ``base_T_camera`` and ``flange_T_target``: 4x4, metres) beside its
``<name>_covariance`` (6x6, right perturbation ``(rho, phi)`` in the child frame, ADR 0004);
``camera`` holds the rest (intrinsics and their covariance, corner noise, per-view RMS, the
held-out views, OpenCV's five on the same PnP poses). Without ``--json``: a summary for people.
``--export DIR`` also writes the integrator files
(:func:`cellcal.daemon.report.hand_eye_exports.hand_eye_export_texts`: ROS 2 static
transforms, URDF, xacro, easy_handeye YAML, MoveIt Calibration's launch files).

``-o FILE`` writes what would be printed to ``FILE`` instead, by the rules of every output a
person names (``cellcal.daemon.cli.output``: never through a symlink, never over a file
unless ``--force``, never half-written); ``--export`` writes each file by the same rules.

Exit codes as for ``cellcal solve``: 0 solved; 2 a bad folder or argument (the message names
the file, line and column); 3 the images cannot determine the intrinsics (refused: too few
views with the target, too little tilt, too little of the image covered; the hand-eye
setups: the AX=XB start's refusals, a degenerate rotation named by its axis); 1 an unexpected
failure, in one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from cellcal.daemon.bodies import result_to_wire
from cellcal.daemon.cli.dataset import Dataset, DatasetError, read_dataset
from cellcal.daemon.cli.output import OutputRefused, check_output, write_output
from cellcal.daemon.config import CameraIntrinsics
from cellcal.daemon.protocol import JsonValue
from cellcal.daemon.report.hand_eye_exports import hand_eye_export_texts
from cellcal.daemon.runs import intrinsics_report
from cellcal.daemon.runs.intrinsics import intrinsics_record
from cellcal.drivers.detect import Detection, OpenCVUnavailable, TargetDetector
from cellcal.solver import CalibrationError, calibrate_eye_to_hand_camera, calibrate_hand_eye_camera, calibrate_intrinsics
from cellcal.solver.camera_model import N_PARAMETERS, PARAMETER_NAMES, CameraModel, parameters_from_camera
from cellcal.solver.camera_results import CameraChainResult
from cellcal.solver.se3 import so3_log

__all__ = ["SETUPS", "HAND_EYE_SETUPS", "add_arguments", "camera_options_given", "run", "read_intrinsics_file", "hand_eye_record"]

#: What ``--setup`` solves.
SETUPS = ("intrinsics", "eye_in_hand", "eye_to_hand")
#: The setups that solve a hand-eye chain (every row needs its flange pose).
HAND_EYE_SETUPS = SETUPS[1:]

EXIT_BAD_INPUT = 2
EXIT_UNDETERMINED = 3


class _Bad(Exception):
    """A bad argument or input file (exit 2); the message says which and why."""


#: The options only a camera dataset's solve reads: (attribute, flag).
_CAMERA_OPTIONS = (("noise_px", "--noise-px"), ("fix", "--fix"), ("holdout_folds", "--holdout-folds"),
                   ("intrinsics", "--intrinsics"), ("robot_accuracy_deg", "--robot-accuracy-deg"),
                   ("output", "-o/--output"), ("export", "--export"), ("force", "--force"))


def camera_options_given(args: argparse.Namespace) -> list[str]:
    """The camera-only options (flags as typed) set to other than their defaults in ``args``."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    d = defaults.parse_args([])
    return [flag for attr, flag in _CAMERA_OPTIONS if getattr(args, attr, None) != getattr(d, attr)]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The camera options of ``cellcal solve`` (beside its own)."""
    p.add_argument("--setup", choices=SETUPS, default=None,
                   help="solve a camera dataset folder (FILE is the folder: target.toml, stations.csv, PNG images): "
                        "the intrinsics, or the camera on the flange (eye_in_hand) or fixed in the cell (eye_to_hand)")
    d = CameraIntrinsics()
    p.add_argument("--noise-px", type=float, default=None, metavar="PX",
                   help="--setup: declared corner noise, 1 sigma per axis, px (default: estimated from the residuals)")
    p.add_argument("--fix", action="append", default=[], choices=PARAMETER_NAMES[4:], metavar="TERM",
                   help="--setup intrinsics: hold a distortion term at 0 (k1, k2, p1, p2, k3; repeat for more)")
    p.add_argument("--holdout-folds", type=int, default=d.holdout_folds, metavar="K",
                   help=f"--setup: folds of the held-out views (0: none; default {d.holdout_folds}; the hand-eye "
                        "setups hold out in 5 folds or not at all)")
    p.add_argument("--intrinsics", metavar="FILE", default=None,
                   help="--setup eye_in_hand|eye_to_hand: the camera's intrinsics from a JSON file (what "
                        "`cellcal solve DIR --setup intrinsics --json` prints), refined under its covariance "
                        "(default: estimated jointly from the same images)")
    p.add_argument("--robot-accuracy-deg", type=float, default=None, metavar="DEG",
                   help="--setup eye_in_hand|eye_to_hand: the arm's orientation accuracy, 1 sigma per axis, deg "
                        "(with --robot-accuracy-mm: what each view's pose may be off by beyond its repeatability; "
                        "default 0: poses as exact as the arm repeats)")
    p.add_argument("-o", "--output", metavar="FILE", default=None,
                   help="--setup: write what would be printed (the JSON with --json) to FILE instead (never over "
                        "a file or through a symlink unless --force)")
    p.add_argument("--export", metavar="DIR", default=None,
                   help="--setup eye_in_hand|eye_to_hand: also write the integrator files (ROS 2 static transform "
                        "launch file, URDF, xacro, easy_handeye YAML, MoveIt Calibration's launch files) into DIR")
    p.add_argument("--force", action="store_true", help="-o / --export: replace existing files (a symlink itself, "
                                                         "never the file it points to)")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # no input may end in a traceback
        print(f"cellcal solve: internal error ({type(exc).__name__}: {exc}); please report it with the dataset",
              file=sys.stderr)
        return 1


def _check_args(args: argparse.Namespace) -> None:
    if args.file is None:
        raise _Bad("--setup needs the dataset folder")
    if args.noise_px is not None and not (math.isfinite(args.noise_px) and args.noise_px > 0):
        raise _Bad(f"--noise-px must be positive, got {args.noise_px!r}")
    if args.holdout_folds < 0:
        raise _Bad(f"--holdout-folds must be >= 0, got {args.holdout_folds}")
    hand_eye = args.setup in HAND_EYE_SETUPS
    if not hand_eye:
        for opt, v in (("--intrinsics", args.intrinsics), ("--export", args.export),
                       ("--robot-accuracy-deg", args.robot_accuracy_deg)):
            if v is not None:
                raise _Bad(f"{opt} applies to --setup eye_in_hand or eye_to_hand")
    elif args.fix:
        raise _Bad("--fix applies to --setup intrinsics (hand-eye: give --intrinsics, or let them be estimated)")
    for opt, v in (("--robot-accuracy-mm", getattr(args, "robot_accuracy_mm", None)),
                   ("--robot-accuracy-deg", args.robot_accuracy_deg)):
        if v is not None and not (math.isfinite(v) and v >= 0.0):
            raise _Bad(f"{opt} must be a non-negative number, got {v!r}")
    if args.output is not None:
        try:
            check_output(args.output, force=args.force)
        except OutputRefused as exc:
            raise _Bad(str(exc)) from None
    if args.export is not None:
        d = Path(args.export)
        if d.is_symlink():  # its files would land wherever it points, --force or not
            raise _Bad(f"--export {d} is a symbolic link (to {os.readlink(d)}); give the directory itself")
        if d.exists() and not d.is_dir():
            raise _Bad(f"--export {d} is not a directory")


def _detect(ds: Dataset) -> tuple[list[Detection], tuple[int, int]]:
    detector = TargetDetector(ds.target)
    views: list[Detection] = []
    size: tuple[int, int] | None = None
    for st in ds.stations:
        det = detector.detect(ds.load_image(st))
        if size is not None and det.image_size != size:
            raise DatasetError(f"{ds.folder / 'stations.csv'}:{st.line}: image {st.image.name} is "
                               f"{det.image_size[0]} x {det.image_size[1]} px, the first {size[0]} x {size[1]}")
        size = det.image_size
        views.append(det)
    assert size is not None  # read_dataset refuses a dataset without rows
    return views, size


def _run(args: argparse.Namespace) -> int:
    try:
        _check_args(args)
        intrinsics = None
        if args.setup in HAND_EYE_SETUPS and args.intrinsics is not None:
            intrinsics = read_intrinsics_file(args.intrinsics)
        ds = read_dataset(args.file)
        if args.setup in HAND_EYE_SETUPS:
            missing = [s for s in ds.stations if s.base_T_flange is None]
            if missing:
                raise DatasetError(f"{ds.folder / 'stations.csv'}:{missing[0].line}: image {missing[0].image.name} "
                                   f"has no flange pose (x_mm, y_mm, z_mm, qw, qx, qy, qz empty): --setup {args.setup} "
                                   f"needs one on every row ({len(missing)} of {len(ds.stations)} rows give none)")
        views, size = _detect(ds)
        if intrinsics is not None and intrinsics[0].image_size != size:
            w, h = intrinsics[0].image_size
            raise _Bad(f"--intrinsics {args.intrinsics}: calibrated for {w} x {h} px images, the dataset's are "
                       f"{size[0]} x {size[1]}")
    except (_Bad, DatasetError, OpenCVUnavailable) as exc:
        print(f"cellcal solve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if args.setup in HAND_EYE_SETUPS:
            text, result = _hand_eye(args, ds, views, size, intrinsics)
        else:
            text, result = _intrinsics(args, ds, views, size), None
    except CalibrationError as exc:
        print(f"cellcal solve: cannot calibrate: {exc}", file=sys.stderr)
        return EXIT_UNDETERMINED
    except ValueError as exc:
        print(f"cellcal solve: bad input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        if result is not None and args.export is not None:
            files = write_hand_eye_exports(args.export, result, force=args.force)
            print(f"cellcal solve: wrote {len(files)} export files to {args.export}", file=sys.stderr)
        if args.output is not None:
            write_output(args.output, text, force=args.force)
        else:
            sys.stdout.write(text)
    except OutputRefused as exc:
        print(f"cellcal solve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


def _intrinsics(args: argparse.Namespace, ds: Dataset, views: list[Detection], size: tuple[int, int]) -> str:
    d = CameraIntrinsics()
    result = calibrate_intrinsics(views, ds.target, size, noise_px=args.noise_px, fix=tuple(args.fix),
                                  holdout_folds=args.holdout_folds, min_tilt_deg=d.refuse_tilt_deg,
                                  min_coverage=d.refuse_coverage, max_iterations=d.max_iterations)
    record = intrinsics_record(result, list(range(len(views))))
    record["dataset"] = _dataset_wire(ds, views)
    if args.json:
        return json.dumps(record) + "\n"
    lines = [f"intrinsics of {len(views)} images in {ds.folder} ({ds.target.describe()}):"]
    lines += intrinsics_report.show_lines(record)
    lines += [f"  warning {w.code}: {w.message}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def _dataset_wire(ds: Dataset, views: Sequence[Detection]) -> dict[str, JsonValue]:
    return {"folder": str(ds.folder), "images": [s.image.name for s in ds.stations],
            "corners_found": [int(v.n_corners) for v in views]}


# -- hand-eye ---------------------------------------------------------------------------------------


class _CameraChainKeywords(TypedDict, total=False):
    """The keyword arguments ``calibrate_hand_eye_camera`` and ``calibrate_eye_to_hand_camera``
    share that the command line sets."""

    noise_px: float | None
    holdout: bool
    image_size: tuple[int, int]
    intrinsics: CameraModel
    intrinsics_covariance: npt.NDArray[np.float64] | None
    robot_accuracy_m: float
    robot_accuracy_rad: float


def read_intrinsics_file(path: str | Path) -> tuple[CameraModel, npt.NDArray[np.float64] | None]:
    """The camera and its (9, 9) covariance from an intrinsics JSON file.

    The file is what ``cellcal solve DIR --setup intrinsics --json`` prints (or a stored
    intrinsics result's export ``exports/result_<id>.json``): ``camera_matrix`` (3x3 px),
    ``dist_coeffs`` (5, OpenCV's order), ``image_size`` ``[width, height]``, and under
    ``intrinsics`` the ``covariance`` (``{"shape": [9, 9], "values": [...]}``, ordered
    :data:`~cellcal.solver.camera_model.PARAMETER_NAMES`); without it the intrinsics are
    held fixed.

    Raises
    ------
    _Bad
        The file cannot be read or lacks a key, naming the file and the key.
    """
    p = Path(path)
    where = f"--intrinsics {p}"
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise _Bad(f"{where}: cannot read: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Bad(f"{where}: not a JSON file ({exc})") from None
    if not isinstance(doc, dict):
        raise _Bad(f"{where}: expected a JSON object (what `--setup intrinsics --json` prints)")
    try:
        K = np.array(doc["camera_matrix"], dtype=float)
        D = np.array(doc["dist_coeffs"], dtype=float).reshape(-1)
        w, h = (int(v) for v in doc["image_size"])
    except KeyError as exc:
        raise _Bad(f"{where}: no {exc.args[0]!r} (what `--setup intrinsics --json` prints has it)") from None
    except (TypeError, ValueError) as exc:
        raise _Bad(f"{where}: camera_matrix, dist_coeffs or image_size malformed ({exc})") from None
    if K.shape != (3, 3) or D.shape != (5,) or not (np.all(np.isfinite(K)) and np.all(np.isfinite(D))):
        raise _Bad(f"{where}: camera_matrix must be 3x3 and dist_coeffs 5 finite numbers (k1, k2, p1, p2, k3)")
    if not (w > 0 and h > 0):
        raise _Bad(f"{where}: image_size must be two positive integers [width, height]")
    try:
        cam = CameraModel.from_parameters(parameters_from_camera(K, D), (w, h))
    except ValueError as exc:
        raise _Bad(f"{where}: {exc}") from None
    cov_wire = doc.get("intrinsics", {}).get("covariance") if isinstance(doc.get("intrinsics"), dict) else None
    if cov_wire is None:
        return cam, None
    try:
        C = np.array(cov_wire["values"], dtype=float).reshape(N_PARAMETERS, N_PARAMETERS)
    except (KeyError, TypeError, ValueError):
        raise _Bad(f"{where}: intrinsics.covariance must be {{\"shape\": [9, 9], \"values\": [81 numbers]}}") from None
    scale = float(np.max(np.abs(C))) if np.all(np.isfinite(C)) else math.inf
    # A solver's covariance is symmetric to its rounding (1e-11 of its largest entry, not of each).
    if not math.isfinite(scale) or not np.allclose(C, C.T, rtol=0.0, atol=1e-9 * scale) \
            or np.min(np.linalg.eigvalsh(0.5 * (C + C.T))) < -1e-12 * max(1.0, scale):
        raise _Bad(f"{where}: intrinsics.covariance is not a symmetric positive semi-definite 9x9 matrix")
    return cam, 0.5 * (C + C.T)


def _hand_eye(args: argparse.Namespace, ds: Dataset, views: list[Detection], size: tuple[int, int],
              intrinsics: tuple[CameraModel, npt.NDArray[np.float64] | None] | None) -> tuple[str, CameraChainResult]:
    G = np.array([s.base_T_flange for s in ds.stations], dtype=float)
    kw: _CameraChainKeywords = {"noise_px": args.noise_px, "holdout": args.holdout_folds > 0, "image_size": size}
    if intrinsics is not None:
        kw["intrinsics"], kw["intrinsics_covariance"] = intrinsics
    if getattr(args, "robot_accuracy_mm", None) is not None:
        kw["robot_accuracy_m"] = args.robot_accuracy_mm * 1e-3
    if args.robot_accuracy_deg is not None:
        kw["robot_accuracy_rad"] = math.radians(args.robot_accuracy_deg)
    solve = calibrate_hand_eye_camera if args.setup == "eye_in_hand" else calibrate_eye_to_hand_camera
    result = solve(views, ds.target, G, **kw)
    record = hand_eye_record(result)
    record["dataset"] = _dataset_wire(ds, views)
    if intrinsics is not None:
        camera = record["camera"]
        if isinstance(camera, dict):  # hand_eye_record's camera block (a JSON value to the type checker)
            camera["intrinsics_file"] = str(args.intrinsics)
        if _same_images(args.intrinsics, ds):
            # A prior from the same corners counts them twice: the covariance comes out too small.
            print(f"cellcal solve: note: {args.intrinsics} was solved from these same images; its prior counts "
                  "them twice (sigmas too small): leave --intrinsics out to estimate the intrinsics jointly",
                  file=sys.stderr)
    if args.json:
        return json.dumps(record, allow_nan=False) + "\n", result
    return "\n".join(_summary(result, ds, args)) + "\n", result


def _same_images(path: str | Path, ds: Dataset) -> bool:
    """The intrinsics file names this dataset's folder and images (``--setup intrinsics --json``'s ``dataset``)."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8")).get("dataset")
    except (OSError, ValueError, AttributeError):
        return False
    if not isinstance(d, dict) or not isinstance(d.get("folder"), str):
        return False
    try:
        same_folder = Path(d["folder"]).resolve() == ds.folder.resolve()
    except OSError:
        return False
    return same_folder and d.get("images") == [s.image.name for s in ds.stations]


def _finite(v: object) -> object:
    """``v`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def _rows(a: npt.NDArray[np.float64]) -> list[list[float]]:
    return [[float(x) for x in row] for row in np.asarray(a, dtype=float)]


def hand_eye_record(result: CameraChainResult) -> dict[str, object]:
    """The JSON ``--setup eye_in_hand|eye_to_hand --json`` prints (module docstring).

    Parameters
    ----------
    result : HandEyeCameraResult or EyeToHandCameraResult

    Returns
    -------
    dict
        JSON-ready (no NaN: None): ``result_to_wire``'s keys, ``setup``, ``camera_matrix``,
        ``dist_coeffs``, ``image_size``, ``reprojection_rms_px``, ``<name>`` (4x4, m) and
        ``<name>_covariance`` (6x6) per transform, and ``camera`` (the camera's own figures).
    """
    out: dict[str, object] = result_to_wire(result)
    out["setup"] = result.setup
    out["camera_matrix"] = _rows(result.camera_matrix)
    out["dist_coeffs"] = [float(v) for v in result.dist_coeffs]
    out["image_size"] = [int(result.image_size[0]), int(result.image_size[1])]
    out["reprojection_rms_px"] = float(result.reprojection_rms_px)
    for name, est in result.transforms().items():
        out[name] = _rows(est.value)
        out[f"{name}_covariance"] = _rows(est.covariance)
    cc = result.cross_check
    cross: dict[str, object] | None = None
    if cc is not None:
        cross = {"name": cc.name, "methods": list(cc.methods), "closest": cc.closest, "agrees": cc.agrees,
                 "translation_m": {k: float(v) for k, v in cc.translation_m.items()},
                 "rotation_rad": {k: float(v) for k, v in cc.rotation_rad.items()},
                 "distance": {k: float(v) for k, v in cc.distance.items()}, "gate": float(cc.gate),
                 "spread_translation_m": float(cc.spread_translation_m),
                 "spread_rotation_rad": float(cc.spread_rotation_rad), "failed": list(cc.failed)}
    sig = np.sqrt(np.clip(np.diag(result.intrinsics_covariance), 0.0, None))
    out["camera"] = {
        "intrinsics_mode": result.intrinsics_mode,
        "parameter_names": list(PARAMETER_NAMES),
        "parameters": [float(v) for v in result.intrinsics],
        "sigmas": [float(v) for v in sig],
        "covariance": {"shape": [N_PARAMETERS, N_PARAMETERS],
                       "values": [float(v) for v in result.intrinsics_covariance.reshape(-1)]},
        "fixed": list(result.intrinsics_fixed),
        "noise_px": float(result.noise_px), "noise_source": result.noise_source,
        "view_rms_px": [float(v) for v in result.view_rms_px],
        "views": [int(v) for v in result.views], "views_dropped": [int(v) for v in result.views_dropped],
        "holdout_view_rms_px": [float(v) for v in result.holdout_view_rms_px],
        "holdout_reprojection_rms_px": float(result.holdout_reprojection_rms_px),
        "robot": {"repeatability_m": result.robot_repeatability_m, "repeatability_rad": result.robot_repeatability_rad,
                  "accuracy_m": result.robot_accuracy_m, "accuracy_rad": result.robot_accuracy_rad,
                  "variance_factor": [float(v) for v in result.robot_variance_factor]},
        "cross_check": cross,
        "bootstrap": None if result.bootstrap is None else {
            "n": int(result.bootstrap.n), "sigma_ratio_translation": float(result.bootstrap.sigma_ratio_translation),
            "sigma_ratio_rotation": float(result.bootstrap.sigma_ratio_rotation)},
        "target_sha256": result.target_sha256,
    }
    return {k: _finite(v) for k, v in out.items()}


def _summary(result: CameraChainResult, ds: Dataset, args: argparse.Namespace) -> list[str]:
    how = {"joint": "estimated jointly from the same images", "prior": f"from {args.intrinsics}, refined under its "
           "covariance", "fixed": f"from {args.intrinsics}, held fixed"}[result.intrinsics_mode]
    lines = [f"{result.setup} of {len(result.views)} images in {ds.folder} ({ds.target.describe()}):"]
    for name, est in result.transforms().items():
        t = est.value[:3, 3] * 1e3
        rv = np.degrees(so3_log(est.value[:3, :3]))
        st = np.sqrt(np.diag(est.covariance)[:3]) * 1e3
        sr = np.degrees(np.sqrt(np.diag(est.covariance)[3:]))
        lines.append(f"  {name}: xyz {t[0]:.3f} {t[1]:.3f} {t[2]:.3f} mm  rotation vector {rv[0]:.4f} {rv[1]:.4f} "
                     f"{rv[2]:.4f} deg")
        lines.append(f"    1 sigma: {st[0]:.3f} {st[1]:.3f} {st[2]:.3f} mm, {sr[0]:.4f} {sr[1]:.4f} {sr[2]:.4f} deg "
                     "(right perturbation, the child frame's axes)")
    K = result.camera_matrix
    lines.append(f"  intrinsics ({how}): fx {K[0, 0]:.2f} fy {K[1, 1]:.2f} cx {K[0, 2]:.2f} cy {K[1, 2]:.2f} px, "
                 "k1..k3 " + " ".join(f"{v:.5f}" for v in result.dist_coeffs))
    lines.append(f"  reprojection RMS {result.reprojection_rms_px:.3f} px (corner noise {result.noise_px:.3f} px, "
                 f"{result.noise_source}); held out {result.holdout_reprojection_rms_px:.3f} px")
    cc = result.cross_check
    if cc is not None:
        verdict = {True: "agrees", False: "DISAGREES", None: "not judged"}[cc.agrees]
        lines.append(f"  OpenCV's five on the same PnP poses: spread {cc.spread_translation_m * 1e3:.3f} mm, "
                     f"{math.degrees(cc.spread_rotation_rad):.4f} deg; closest {cc.closest} ({verdict})")
    if result.views_dropped:
        names = ", ".join(ds.stations[i].image.name for i in result.views_dropped)
        lines.append(f"  not used (too few corners): {names}")
    lines += [f"  warning {w.code}: {w.message}" for w in result.warnings]
    return lines


def write_hand_eye_exports(directory: str | Path, result: CameraChainResult, *, force: bool) -> list[Path]:
    """Write :func:`~cellcal.daemon.report.hand_eye_exports.hand_eye_export_texts` of an offline
    result (no gates: not refused) into ``directory`` (created), each file by
    :func:`~cellcal.daemon.cli.output.write_output`'s rules."""
    est = result.transforms()
    texts = hand_eye_export_texts(result.setup, {k: e.value for k, e in est.items()},
                                  {k: e.covariance for k, e in est.items()}, result_id=None, refused=None)
    d = Path(directory)
    for name in texts:  # refuse before writing any, so a refusal leaves none half-done
        check_output(d / name, force=force)
    return [write_output(d / name, text, force=force, make_parents=True) for name, text in texts.items()]
