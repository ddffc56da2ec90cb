"""``cellcal solve DATASET_DIR --setup intrinsics [--json]``: a camera calibrated offline from a
dataset folder (``cellcal.daemon.cli.dataset``: ``target.toml``, ``stations.csv``, the PNGs).

Every image is searched for the target with the daemon's detector (``cellcal.drivers.detect``),
and the detections are solved by ``calibrate_intrinsics`` with the daemon's defaults
(``[camera.intrinsics]``: the refusal thresholds, five held-out folds) unless the options say
otherwise: the result is the daemon's for the same images (``cellcal stations RUN -o DIR``
writes a camera run as such a folder). ``--json`` prints the result as the daemon stores it
(``cellcal.daemon.runs.intrinsics.intrinsics_record``: ``camera_matrix`` 3x3 px,
``dist_coeffs`` in OpenCV's order, ``image_size`` ``[width, height]``, ``reprojection_rms_px``
and everything behind them under ``intrinsics``) with ``dataset`` (the folder and the image of
each view); otherwise the intrinsics with their sigmas, for people.

Exit codes as for ``cellcal solve``: 0 solved; 2 a bad folder or argument (the message names
the file, line and column); 3 the images cannot determine the intrinsics (refused: too few
views with the target, too little tilt, too little of the image covered); 1 an unexpected
failure, in one line.
"""

from __future__ import annotations

import argparse
import json
import sys

from cellcal.daemon.cli.dataset import DatasetError, read_dataset
from cellcal.daemon.config import CameraIntrinsics
from cellcal.daemon.runs import intrinsics_report
from cellcal.daemon.runs.intrinsics import intrinsics_record
from cellcal.drivers.detect import Detection, OpenCVUnavailable, TargetDetector
from cellcal.solver import CalibrationError, calibrate_intrinsics
from cellcal.solver.camera_model import PARAMETER_NAMES

__all__ = ["SETUPS", "add_arguments", "run"]

#: What ``--setup`` solves (the hand-eye setups come with issue 27).
SETUPS = ("intrinsics",)

EXIT_BAD_INPUT = 2
EXIT_UNDETERMINED = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The camera options of ``cellcal solve`` (beside its own)."""
    p.add_argument("--setup", choices=SETUPS, default=None,
                   help="solve a camera dataset folder (FILE is the folder: target.toml, stations.csv, PNG images)")
    d = CameraIntrinsics()
    p.add_argument("--noise-px", type=float, default=None, metavar="PX",
                   help="--setup: declared corner noise, 1 sigma per axis, px (default: estimated from the residuals)")
    p.add_argument("--fix", action="append", default=[], choices=PARAMETER_NAMES[4:], metavar="TERM",
                   help="--setup: hold a distortion term at 0 (k1, k2, p1, p2, k3; repeat for more)")
    p.add_argument("--holdout-folds", type=int, default=d.holdout_folds, metavar="K",
                   help=f"--setup: folds of the held-out views (0: none; default {d.holdout_folds})")


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as exc:  # no input may end in a traceback
        print(f"cellcal solve: internal error ({type(exc).__name__}: {exc}); please report it with the dataset",
              file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.file is None:
        print("cellcal solve: --setup needs the dataset folder", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.noise_px is not None and not args.noise_px > 0:
        print(f"cellcal solve: --noise-px must be positive, got {args.noise_px!r}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.holdout_folds < 0:
        print(f"cellcal solve: --holdout-folds must be >= 0, got {args.holdout_folds}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        ds = read_dataset(args.file)
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
    except (DatasetError, OpenCVUnavailable) as exc:
        print(f"cellcal solve: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    assert size is not None  # read_dataset refuses a dataset without rows
    d = CameraIntrinsics()
    try:
        result = calibrate_intrinsics(views, ds.target, size, noise_px=args.noise_px, fix=tuple(args.fix),
                                      holdout_folds=args.holdout_folds, min_tilt_deg=d.refuse_tilt_deg,
                                      min_coverage=d.refuse_coverage, max_iterations=d.max_iterations)
    except CalibrationError as exc:
        print(f"cellcal solve: cannot calibrate: {exc}", file=sys.stderr)
        return EXIT_UNDETERMINED
    except ValueError as exc:
        print(f"cellcal solve: bad input: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    record = intrinsics_record(result, list(range(len(views))))
    record["dataset"] = {"folder": str(ds.folder), "images": [s.image.name for s in ds.stations],
                         "corners_found": [int(v.n_corners) for v in views]}
    if args.json:
        print(json.dumps(record))
        return 0
    print(f"intrinsics of {len(views)} images in {ds.folder} ({ds.target.describe()}):")
    for line in intrinsics_report.show_lines(record):
        print(line)
    for w in result.warnings:
        print(f"  warning {w.code}: {w.message}")
    return 0
