"""``cellcal solve``: run a calibration on a station file and print the report.

Exit codes: 0 solved; 2 bad file or arguments (the message names the line); 3 the data
cannot determine the calibration (``NotEnoughSamples`` / ``DegenerateGeometry``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from cellcal.daemon.report import format_report, result_to_wire, transforms_of
from cellcal.daemon.stations_io import StationFileError, read_stations
from cellcal.solver import CalibrationError, calibrate_base_frame, calibrate_hand_eye, calibrate_tool_point
from cellcal.solver.se3 import rotation_angle, se3_inverse

EXIT_BAD_INPUT = 2
EXIT_UNDETERMINED = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("file", nargs="?", help="station file: .jsonl (SI, 4x4 lists) or .csv (mm + quaternion)")
    src.add_argument("--synthetic", type=int, metavar="N", help="solve a seeded synthetic scene of N stations instead")
    p.add_argument("--kind", choices=("base_frame", "hand_eye", "tool_point"), default="base_frame")
    p.add_argument("--format", choices=("auto", "jsonl", "csv"), default="auto", dest="fmt")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--noise-mm", type=float, default=0.02, help="synthetic: tracker noise per axis, mm")
    p.add_argument("--noise-deg", type=float, default=0.01, help="synthetic: tracker noise per axis, deg")
    p.add_argument("--seed", type=int, default=0, help="synthetic: random seed")


def _solve(kind: str, G: np.ndarray, M: np.ndarray | None):
    if kind == "base_frame":
        return calibrate_base_frame(G, M)
    if kind == "hand_eye":
        return calibrate_hand_eye(G, M)
    return calibrate_tool_point(G)


def run(args: argparse.Namespace) -> int:
    truth: dict[str, np.ndarray] = {}
    names: list[str] | None = None
    if args.synthetic is not None:
        from cellcal.solver import synthetic

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
            truth = dict(zip(keys, (scene.X, scene.Y)))
    else:
        try:
            st = read_stations(args.file, args.kind, args.fmt)
        except StationFileError as exc:
            print(f"cellcal solve: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        G, M = st.base_T_flange, st.measured
        names = [f"line {n}" for n in st.lines]
    try:
        result = _solve(args.kind, G, M)
    except CalibrationError as exc:
        print(f"cellcal solve: cannot calibrate: {exc}", file=sys.stderr)
        return EXIT_UNDETERMINED
    except ValueError as exc:  # bad station content the file reader could not see
        print(f"cellcal solve: bad input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        out = result_to_wire(result)
        if truth:
            out["truth_error"] = _truth_error(result, truth)
        print(json.dumps(out))
        return 0
    print(format_report(result, station_names=names))
    if truth:
        print("  error against the synthetic truth:")
        for name, (t_m, r_rad) in _truth_error(result, truth).items():
            print(f"    {name}: {t_m * 1e3:.4f} mm, {math.degrees(r_rad):.5f} deg")
    return 0


def _truth_error(result, truth: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    est = transforms_of(result)
    out = {}
    for name, T in truth.items():
        E = se3_inverse(T) @ est[name]
        out[name] = (float(np.linalg.norm(T[:3, 3] - est[name][:3, 3])), rotation_angle(E[:3, :3]))
    return out
