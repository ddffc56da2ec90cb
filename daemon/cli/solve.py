"""``cellcal solve``: run a calibration on a station file and print the report.

Every solve declares the measurement noise (``--noise-mm`` / ``--noise-deg``, defaults a
laser tracker's 6-DoF probe plus a robot's repeatability would give), so the residuals are
tested against it: a fit whose residual RMS exceeds ten times that noise is refused with
the likely causes (units, quaternion order, swapped or inverted inputs, a robot model
error), and a milder excess is reported as a ``model_error`` warning with a widened
uncertainty. A CSV whose quaternion columns fit far better read as x, y, z, w is named as
such. ``--expect-base`` checks the answer against the cell drawing; ``--robot-model`` sets
the arm's reach, which catches swapped arguments and millimetres (ADR 0014). A base-frame
file of 3-DoF point stations (``cell_p_target``, ``cellcal.daemon.cli.stations_io``) is solved
by the point model (``calibrate_base_frame_points``: ``cell_T_base`` and the reflector's
``flange_p_target``), with ``--noise-mm`` alone.

A station file written by ``cellcal stations`` carries what the daemon solved it with (its
``# cellcal-settings:`` line, each station's covariance, capture times and speeds:
``cellcal.daemon.cli.stations_io``); unless a noise option or ``--ignore-file-settings`` is
given, the solve uses them, repeats the daemon's solve, and says how far its answer lies from
the stored result's (``reproduces`` in ``--json``).

``cellcal solve DATASET_DIR --setup intrinsics|eye_in_hand|eye_to_hand`` solves a camera
dataset folder instead (``cellcal.daemon.cli.solve_camera``): the camera's intrinsics, or the
hand-eye chain refined on the image; only there do ``-o``, ``--export`` and the other camera
options apply (given for a station file they are refused, exit 2).

Exit codes: 0 solved; 2 bad file or arguments (the message names the line); 3 the data
cannot determine the calibration, or determine one that cannot be right (refused, with
the reason). No input produces a traceback: an unexpected failure is reported in one line
(exit 1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import TypedDict

import numpy as np
import numpy.typing as npt

from cellcal.daemon import solve as daemon_solve
from cellcal.daemon.bodies import result_to_wire, transforms_of
from cellcal.daemon.cli import solve_camera
from cellcal.daemon.cli.stations_io import StationFileError, Stations, read_stations
from cellcal.daemon.report import format_report
from cellcal.drivers.kinematics import dh_model
from cellcal.solver import (
    CalibrationError,
    CalibrationResult,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_hand_eye,
    calibrate_tool_point,
    synthetic,
)
from cellcal.solver.options import SolverOptions, SolverOptionsKeywords
from cellcal.solver.se3 import make_transform, rotation_angle, se3_inverse, so3_exp

EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_UNDETERMINED = 3

#: Declared noise per axis, 1 sigma, unless given: a laser tracker with a 6-DoF probe (about
#: 0.02 mm, 0.01 deg) plus a robot's repeatability and settling (0.02-0.1 mm, 0.01-0.05 deg).
DEFAULT_NOISE_MM = 0.1
DEFAULT_NOISE_DEG = 0.05
#: A residual RMS beyond this many times the declared noise is refused: no tracker, robot
#: or model error makes it; wrong inputs do. 0.5-1 mm of robot kinematic error is 3-6x the
#: default noise (a warning), a unit or quaternion mix-up hundreds of times it.
REFUSE_RATIO = 10.0
#: A repeated solve within this of the stored result (m, every transform) is the same solve.
REPRODUCE_TOLERANCE_M = 1e-9
#: The x,y,z,w reading is named when it fits at least this much better.
QUATERNION_ORDER_GAIN = 10.0


class _Given(TypedDict, total=False):
    """What a solve is given besides the options' fields (``SolverOptionsKeywords``): the
    daemon's options record, a prior, each station's covariance and capture signature.
    :func:`_solve` passes each calibrate function the ones it takes (the options' checks give
    a kind only its own)."""

    options: SolverOptions
    expected_cell_T_base: npt.NDArray[np.float64]
    cell_T_target_cov: npt.NDArray[np.float64]
    cell_p_target_cov: npt.NDArray[np.float64]
    capture_time_s: npt.NDArray[np.float64]
    capture_speed_m_s: npt.NDArray[np.float64]


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("file", nargs="?", help="station file: .jsonl (SI, 4x4 lists) or .csv (mm + quaternion w,x,y,z); "
                                            "a base-frame file may hold 3-DoF point stations (cell_p_target)")
    src.add_argument("--synthetic", type=int, metavar="N", help="solve a seeded synthetic scene of N stations instead")
    p.add_argument("--kind", choices=("base_frame", "hand_eye", "tool_point"), default="base_frame")
    p.add_argument("--format", choices=("auto", "jsonl", "csv"), default="auto", dest="fmt")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--noise-mm", type=float, default=None, metavar="MM",
                   help=f"declared measurement noise per axis, 1 sigma, mm (default {DEFAULT_NOISE_MM}: a laser tracker "
                        "with a 6-DoF probe, about 0.02 mm, plus a robot's repeatability); the residuals are tested "
                        "against it, and --synthetic draws its noise with it")
    p.add_argument("--noise-deg", type=float, default=None, metavar="DEG",
                   help=f"declared orientation noise per axis, 1 sigma, deg (default {DEFAULT_NOISE_DEG})")
    p.add_argument("--estimate-noise", action="store_true",
                   help="estimate the noise from the residuals instead of declaring it (the refusal threshold still "
                        "uses --noise-mm / --noise-deg)")
    p.add_argument("--robot-accuracy-mm", type=float, default=None, metavar="MM",
                   help="the arm's absolute accuracy at the flange, RMS distance (3-D): what the uncertainty carries "
                        "when too few stations test for model error (default 1 mm; 0: an exact arm, a simulation); "
                        "with --setup eye_in_hand|eye_to_hand 1 sigma per axis of each view's pose (default 0)")
    p.add_argument("--max-target-offset-mm", type=float, default=None, metavar="MM",
                   help="refuse a fit that puts the target farther than this from the flange (default 1000 mm: "
                        "inverted or swapped inputs fit exactly and put it metres away)")
    p.add_argument("--ignore-file-settings", action="store_true",
                   help="solve a file written by `cellcal stations` with this command's defaults instead of the "
                        "settings and covariances the daemon solved it with")
    p.add_argument("--expect-base", metavar="X,Y,Z,RX,RY,RZ",
                   help="expected cell_T_base from the cell drawing: translation in mm and rotation vector in deg "
                        "(as on a UR pendant); an answer outside --expect-tolerance is refused")
    p.add_argument("--expect-tolerance", metavar="MM,DEG", default="50,5",
                   help="tolerance of --expect-base (default 50 mm, 5 deg)")
    p.add_argument("--robot-model", metavar="NAME",
                   help="robot model (ur3e, ur5e, ur10e): flange poses beyond its reach are refused")
    p.add_argument("--huber", type=float, metavar="K", help="robust fit: Huber threshold in sigmas (e.g. 3)")
    p.add_argument("--reject-k", type=float, metavar="K", help="robust fit: drop stations beyond K robust sigmas")
    p.add_argument("--seed", type=int, default=0, help="synthetic: random seed")
    solve_camera.add_arguments(p)  # --setup DATASET_DIR and its options (ADR 0030)


class _Usage(Exception):
    """A bad argument (exit 2)."""


def _numbers(text: str, count: int, option: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",")]
    except ValueError:
        raise _Usage(f"{option}: expected {count} comma-separated numbers, got {text!r}") from None
    if len(vals) != count or not all(math.isfinite(v) for v in vals):
        raise _Usage(f"{option}: expected {count} comma-separated finite numbers, got {text!r}")
    return vals


def _noise_given(args: argparse.Namespace) -> bool:
    return args.noise_mm is not None or args.noise_deg is not None or bool(args.estimate_noise)


def _file_settings(args: argparse.Namespace, st: Stations | None) -> dict[str, object] | None:
    """The daemon's settings a ``cellcal stations`` file carries, unless the command line
    declares its own noise or ignores them."""
    if st is None or st.settings is None or args.ignore_file_settings or _noise_given(args):
        return None
    return st.settings


def _reproduce(args: argparse.Namespace, st: Stations, settings: dict[str, object], points: bool,
               kw: SolverOptionsKeywords, given: _Given) -> None:
    """The keywords that repeat the daemon's solve: its options, each station's covariance,
    the capture signature; and the noise the refusal test compares with (their RMS)."""
    raw = settings.get("solve")
    if not isinstance(raw, dict):
        raise _Usage("the file's cellcal-settings line has no \"solve\" object")
    try:
        solve_cfg = daemon_solve.settings_solve(raw)
    except ValueError as exc:
        raise _Usage(f"the file's cellcal-settings: {exc}") from None
    opts = daemon_solve.solver_options(solve_cfg)
    changes: dict[str, float] = {}
    if args.robot_accuracy_mm is not None:
        changes["robot_accuracy_m"] = args.robot_accuracy_mm * 1e-3
    if args.max_target_offset_mm is not None:
        changes["max_target_offset_m"] = args.max_target_offset_mm * 1e-3
    kw.pop("robot_accuracy_m", None)
    kw.pop("max_target_offset_m", None)
    given["options"] = opts.replace(**changes) if changes else opts
    if settings.get("noise") == "estimated":
        args.estimate_noise = True
    elif args.kind == "base_frame" and st.covariances is not None:
        C = st.covariances
        if points:
            given["cell_p_target_cov"] = C
        else:
            given["cell_T_target_cov"] = C
        args.noise_mm = math.sqrt(float(np.mean(np.trace(C[:, :3, :3], axis1=1, axis2=2))) / 3.0) * 1e3
        if not points:
            args.noise_deg = math.degrees(math.sqrt(float(np.mean(np.trace(C[:, 3:, 3:], axis1=1, axis2=2))) / 3.0))
    if args.kind != "tool_point":
        if st.capture_time_s is not None:
            given["capture_time_s"] = st.capture_time_s
        if st.capture_speed_m_s is not None:
            given["capture_speed_m_s"] = st.capture_speed_m_s


def _reproduction(result: CalibrationResult, settings: dict[str, object] | None) -> dict[str, object] | None:
    """How far this solve's transforms lie from the stored result's the file names."""
    ref = settings.get("result") if settings else None
    if not isinstance(ref, dict) or not isinstance(ref.get("transforms"), dict):
        return None
    est = transforms_of(result)
    diffs: dict[str, object] = {}
    worst = 0.0
    for name, M in ref["transforms"].items():
        if name not in est:
            continue
        try:
            T = np.asarray(M, dtype=float).reshape(4, 4)
        except (TypeError, ValueError):
            continue
        E = se3_inverse(T) @ est[name]
        dt = float(np.linalg.norm(T[:3, 3] - est[name][:3, 3]))
        worst = max(worst, dt)
        diffs[name] = {"translation_m": dt, "rotation_rad": rotation_angle(E[:3, :3])}
    if not diffs:
        return None
    return {"result_id": ref.get("id"), "run_id": ref.get("run_id"), "differences": diffs,
            "same": worst <= REPRODUCE_TOLERANCE_M}


def _options(args: argparse.Namespace, points: bool = False) -> tuple[SolverOptionsKeywords, _Given]:
    for name in ("noise_mm", "noise_deg"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v > 0.0):
            raise _Usage(f"--{name.replace('_', '-')} must be a positive number, got {v!r}")
    kw: SolverOptionsKeywords = {}
    given: _Given = {}
    for name in ("robot_accuracy_mm", "max_target_offset_mm"):
        v = getattr(args, name)
        if v is not None and (not (math.isfinite(v) and v >= 0.0) or (name == "max_target_offset_mm" and v <= 0.0)):
            what = "positive" if name == "max_target_offset_mm" else "non-negative"
            raise _Usage(f"--{name.replace('_', '-')} must be a {what} number, got {v!r}")
    if args.robot_accuracy_mm is not None:
        kw["robot_accuracy_m"] = args.robot_accuracy_mm * 1e-3
    if args.max_target_offset_mm is not None:
        kw["max_target_offset_m"] = args.max_target_offset_mm * 1e-3
    if not args.estimate_noise:
        kw["noise_translation_m"] = args.noise_mm * 1e-3
        if args.kind != "tool_point" and not points:
            kw["noise_rotation_rad"] = math.radians(args.noise_deg)
    if args.kind != "tool_point":
        if args.huber is not None:
            kw["huber"] = args.huber
        if args.reject_k is not None:
            kw["reject_k"] = args.reject_k
    elif args.huber is not None or args.reject_k is not None:
        raise _Usage("--huber / --reject-k: not offered for a tool point (a closed-form pivot)")
    if args.expect_base is not None:
        if args.kind != "base_frame":
            raise _Usage("--expect-base applies to --kind base_frame")
        x, y, z, rx, ry, rz = _numbers(args.expect_base, 6, "--expect-base")
        given["expected_cell_T_base"] = make_transform(so3_exp(np.radians([rx, ry, rz])), np.array([x, y, z]) * 1e-3)
        mm, deg = _numbers(args.expect_tolerance, 2, "--expect-tolerance")
        if not (mm > 0 and deg > 0):
            raise _Usage("--expect-tolerance: both figures must be positive")
        kw["expected_tolerance_m"] = mm * 1e-3
        kw["expected_tolerance_rad"] = math.radians(deg)
    if args.robot_model is not None:
        try:
            model = dh_model(args.robot_model)
        except ValueError as exc:
            raise _Usage(f"--robot-model: {exc}") from None
        kw["max_reach_m"] = float(np.sum(np.abs(model.a_m)) + np.sum(np.abs(model.d_m)))
    return kw, given


def _solve(kind: str, G: npt.NDArray[np.float64], M: npt.NDArray[np.float64] | None, kw: SolverOptionsKeywords,
           given: _Given, points: npt.NDArray[np.float64] | None = None) -> CalibrationResult:
    options, expected = given.get("options"), given.get("expected_cell_T_base")
    times, speeds = given.get("capture_time_s"), given.get("capture_speed_m_s")
    if points is not None:  # a base frame measured as 3-DoF points
        return calibrate_base_frame_points(G, points, options=options, cell_p_target_cov=given.get("cell_p_target_cov"),
                                           expected_cell_T_base=expected, capture_time_s=times, capture_speed_m_s=speeds,
                                           **kw)
    if kind == "base_frame":
        return calibrate_base_frame(G, M, options=options, cell_T_target_cov=given.get("cell_T_target_cov"),
                                    expected_cell_T_base=expected, capture_time_s=times, capture_speed_m_s=speeds, **kw)
    if kind == "hand_eye":
        return calibrate_hand_eye(G, M, options=options, capture_time_s=times, capture_speed_m_s=speeds, **kw)
    return calibrate_tool_point(G, options=options, **kw)


def _ratios(result: CalibrationResult, args: argparse.Namespace, points: bool = False) -> tuple[float, float]:
    """Per-axis residual RMS over the declared noise: translation, rotation (nan: none)."""
    rt = result.rms_translation_m / math.sqrt(3.0) / (args.noise_mm * 1e-3)
    if args.kind == "tool_point" or points:
        return rt, math.nan
    rr = result.rms_rotation_rad / math.sqrt(3.0) / math.radians(args.noise_deg)
    return rt, rr


def _worst(r: tuple[float, float]) -> float:
    return max(v for v in r if math.isfinite(v))


def _refusal(result: CalibrationResult, ratios: tuple[float, float], args: argparse.Namespace) -> str:
    rt, rr = ratios
    what = [f"translation {result.rms_translation_m * 1e3:.3g} mm RMS ({rt:.0f}x the declared "
            f"{args.noise_mm:g} mm)"]
    if math.isfinite(rr):
        what.append(f"rotation {math.degrees(result.rms_rotation_rad):.3g} deg RMS ({rr:.0f}x the declared "
                    f"{args.noise_deg:g} deg)")
    return (
        "refused: the residuals are far beyond any tracker or robot noise: " + ", ".join(what) + ". "
        "Likely causes: units (poses in mm where metres are expected, or one input in mm and the other in m); "
        "quaternion order (x,y,z,w where w,x,y,z is expected); swapped or inverted inputs (robot and tracker poses "
        "exchanged, or a_T_b given for b_T_a on one side only); stations that do not pair up (misaligned rows); or a "
        "robot model error far larger than a kinematic calibration would leave. Check the inputs; if the noise "
        "really is that large, declare it with --noise-mm / --noise-deg."
    )


def _quaternion_order_hint(args: argparse.Namespace, kw: SolverOptionsKeywords, given: _Given,
                           base: tuple[float, float], st0: Stations) -> str | None:
    """For a CSV that fits badly: does reading its quaternions as x,y,z,w fit far better?"""
    best: tuple[float, str] | None = None
    points = st0.points is not None
    prefixes = ("flange",) if args.kind == "tool_point" or points else ("flange", "target")
    variants = [{p: "xyzw"} for p in prefixes] + ([{"flange": "xyzw", "target": "xyzw"}] if len(prefixes) == 2 else [])
    for order in variants:
        try:
            st = read_stations(args.file, args.kind, args.fmt, quaternion_order=order)
            res = _solve(args.kind, st.base_T_flange, st.measured, kw, given, st.points)
        except (CalibrationError, ValueError):
            continue
        w = _worst(_ratios(res, args, points))
        if best is None or w < best[0]:
            best = (w, " and ".join(f"{p}_q*" for p in order))
    if best is None or not best[0] * QUATERNION_ORDER_GAIN <= _worst(base):
        return None
    return (f"the {best[1]} quaternion columns fit far better read as x,y,z,w (residuals {best[0]:.1f}x the "
            f"declared noise instead of {_worst(base):.0f}x): the file's quaternions are probably in x,y,z,w order, "
            f"but cellcal's CSV columns are w,x,y,z (flange_qw, flange_qx, ...); reorder the columns")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "setup", None):
        return solve_camera.run(args)
    camera_only = solve_camera.camera_options_given(args)
    if camera_only:
        # a station file's solve has no output file of its own: an option it would ignore is
        # refused rather than read as done
        print(f"cellcal solve: {', '.join(camera_only)} apply to a camera dataset (--setup ...), not to a station "
              "file; its result is printed (--json for the machine form; redirect it to keep it)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        return _run(args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # no input may end in a traceback
        print(f"cellcal solve: internal error ({type(exc).__name__}: {exc}); please report it with the input file",
              file=sys.stderr)
        return EXIT_INTERNAL


def _run(args: argparse.Namespace) -> int:
    truth: dict[str, npt.NDArray[np.float64]] = {}
    names: list[str] | None = None
    st = None
    if args.synthetic is None:
        try:
            st = read_stations(args.file, args.kind, args.fmt)
        except StationFileError as exc:
            print(f"cellcal solve: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    points = st is not None and st.points is not None
    settings = _file_settings(args, st)
    if args.noise_mm is None:
        args.noise_mm = DEFAULT_NOISE_MM
    if args.noise_deg is None:
        args.noise_deg = DEFAULT_NOISE_DEG
    try:
        kw, given = _options(args, points)
        if settings is not None:
            assert st is not None
            kw.pop("noise_translation_m", None)
            kw.pop("noise_rotation_rad", None)
            _reproduce(args, st, settings, points, kw, given)
    except _Usage as exc:
        print(f"cellcal solve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    P = None
    if args.synthetic is not None:
        if args.synthetic < 1:
            print("cellcal solve: --synthetic needs N >= 1", file=sys.stderr)
            return EXIT_BAD_INPUT
        rng = np.random.default_rng(args.seed)
        if args.kind == "tool_point":
            G, _, _ = synthetic.pivot_scene(args.synthetic, rng, noise_mm=args.noise_mm)
            M = None
        else:
            make = synthetic.base_frame_scene if args.kind == "base_frame" else synthetic.hand_eye_scene
            scene = make(args.synthetic, rng, noise_mm=args.noise_mm, noise_deg=args.noise_deg)
            G, M = scene.base_T_flange, scene.measured
            keys = ("cell_T_base", "flange_T_target") if args.kind == "base_frame" else ("flange_T_camera", "base_T_target")
            truth = dict(zip(keys, (scene.X, scene.Y), strict=True))
    else:
        assert st is not None
        G, M, P = st.base_T_flange, st.measured, st.points
        names = [f"line {n}" for n in st.lines]
    try:
        result = _solve(args.kind, G, M, kw, given, P)
    except CalibrationError as exc:
        print(f"cellcal solve: cannot calibrate: {exc}", file=sys.stderr)
        return EXIT_UNDETERMINED
    except ValueError as exc:  # bad station content the file reader could not see
        print(f"cellcal solve: bad input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ratios = _ratios(result, args, points)
    if _worst(ratios) > REFUSE_RATIO:
        hint = None
        if st is not None and (args.fmt == "csv" or str(args.file).lower().endswith(".csv")):
            hint = _quaternion_order_hint(args, kw, given, ratios, st)
        print(f"cellcal solve: {hint}" if hint else f"cellcal solve: {_refusal(result, ratios, args)}", file=sys.stderr)
        return EXIT_UNDETERMINED
    again = _reproduction(result, settings)
    if args.json:
        out = result_to_wire(result)
        if truth:
            out["truth_error"] = _truth_error(result, truth)
        if settings is not None:
            out["settings"] = "from the file (the daemon's)"
        if again is not None:
            out["reproduces"] = again
        print(json.dumps(out))
        return 0
    print(format_report(result, station_names=names))
    if settings is not None:
        print("  settings: the daemon's, from the file (its [solve], each station's covariance and capture times)")
    if again is not None:
        diffs = again["differences"]
        assert isinstance(diffs, dict)
        figures = ", ".join(f"{name} {d['translation_m'] * 1e3:.2g} mm, {math.degrees(d['rotation_rad']):.2g} deg"
                            for name, d in diffs.items())
        verdict = "the same solve" if again["same"] else "NOT the same solve (different settings or stations?)"
        print(f"  against stored result {again['result_id']}: {figures}: {verdict}")
    if truth:
        print("  error against the synthetic truth:")
        for name, (t_m, r_rad) in _truth_error(result, truth).items():
            print(f"    {name}: {t_m * 1e3:.4f} mm, {math.degrees(r_rad):.5f} deg")
    return 0


def _truth_error(result: CalibrationResult, truth: dict[str, npt.NDArray[np.float64]]) -> dict[str, tuple[float, float]]:
    est = transforms_of(result)
    out = {}
    for name, T in truth.items():
        E = se3_inverse(T) @ est[name]
        out[name] = (float(np.linalg.norm(T[:3, 3] - est[name][:3, 3])), rotation_angle(E[:3, :3]))
    return out
