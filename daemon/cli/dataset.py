"""Camera datasets for ``cellcal solve DATASET_DIR --setup ...``: a folder of images, the robot's
pose at each, and the calibration target (ADR 0030).

The folder::

    <folder>/
      target.toml     the calibration target file (docs/simulation.md, "The calibration target");
                      its sha256 goes into the result's provenance
      stations.csv    one row per image, in order
      *.png           the images stations.csv names

``stations.csv`` (RFC 4180, UTF-8; lines starting with ``#`` before the header are comments)
has exactly the columns ``image,x_mm,y_mm,z_mm,qw,qx,qy,qz`` (in any order): the image's file
name (in the folder: no path separators, not hidden), and the flange pose in the robot base
frame when the image was taken (``base_T_flange``: millimetres, quaternion ``w, x, y, z``).
A row's seven pose cells are all given or all empty: an intrinsics calibration needs no pose;
the hand-eye setups need them all. Quaternions are normalised on reading, but one whose norm
is off by more than 1e-3 is refused as a typo. Every error is a :class:`DatasetError` naming
the file, the line and the column.

:func:`read_dataset` reads a folder (images are decoded when :meth:`Dataset.load_image` is
called); :func:`write_dataset` writes one (``cellcal stations RUN -o DIR`` for a camera run):
the images and ``target.toml`` first, ``stations.csv`` last, each through a temporary file,
fsync and rename, so a folder that has a ``stations.csv`` holds everything it names. It
refuses a folder that already holds a dataset.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cellcal.daemon.report.exports import atomic_write_bytes
from cellcal.drivers.detect import import_cv2
from cellcal.solver.errors import CellcalError, TargetFileError
from cellcal.solver.se3 import make_transform, matrix_from_quat, quat_from_matrix
from cellcal.solver.target import CalibrationTarget, target_from_toml

__all__ = ["DatasetError", "Dataset", "DatasetStation", "read_dataset", "write_dataset", "COLUMNS", "STATIONS_FILE",
           "TARGET_FILE", "MAX_ROWS"]

STATIONS_FILE = "stations.csv"
TARGET_FILE = "target.toml"
#: The columns of ``stations.csv``.
COLUMNS = ("image", "x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz")
_POSE = COLUMNS[1:]
#: Most rows a dataset may have.
MAX_ROWS = 10_000
#: Longest translation accepted (mm): a cell is not kilometres wide.
_MAX_MM = 1e7
_NAME = re.compile(r"[^/\\\x00]+")


class DatasetError(CellcalError, ValueError):
    """A dataset folder that cannot be read (or written); the message names file, line and column."""


@dataclass(frozen=True)
class DatasetStation:
    """One row of ``stations.csv``.

    Attributes
    ----------
    image : Path
        The image file.
    base_T_flange : numpy.ndarray, shape (4, 4), or None
        The flange pose in the base frame, metres (None: the row gives none).
    line : int
        Its line in ``stations.csv`` (1-based).
    """

    image: Path
    base_T_flange: npt.NDArray[np.float64] | None
    line: int


@dataclass(frozen=True)
class Dataset:
    """A dataset folder as read (module docstring)."""

    folder: Path
    target: CalibrationTarget
    stations: tuple[DatasetStation, ...]

    @property
    def has_poses(self) -> bool:
        """Every row gives the flange pose."""
        return all(s.base_T_flange is not None for s in self.stations)

    def load_image(self, station: DatasetStation) -> npt.NDArray[np.float64]:
        """A station's image as OpenCV decodes it (8- or 16-bit grey; colour as BGR).

        Raises
        ------
        DatasetError
            Not an image OpenCV reads, naming the file and its line.
        """
        cv2 = import_cv2()
        img = cv2.imread(str(station.image), cv2.IMREAD_UNCHANGED)
        if img is None:
            raise DatasetError(f"{self.folder / STATIONS_FILE}:{station.line}: image {station.image.name} is not an "
                               "image OpenCV can read")
        return np.asarray(img)


def _number(text: str, where: str, col: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise DatasetError(f"{where}: {col} {text!r} is not a number") from None
    if not math.isfinite(v):
        raise DatasetError(f"{where}: {col} {text!r} is not a finite number")
    return v


def _pose(row: dict[str, str], where: str) -> npt.NDArray[np.float64] | None:
    cells = [row[c].strip() for c in _POSE]
    if not any(cells):
        return None
    missing = [c for c, v in zip(_POSE, cells, strict=True) if not v]
    if missing:
        raise DatasetError(f"{where}: {', '.join(missing)} empty: give the seven pose columns together, or none")
    x, y, z, *q = (_number(v, where, c) for v, c in zip(cells, _POSE, strict=True))
    if max(abs(x), abs(y), abs(z)) > _MAX_MM:
        raise DatasetError(f"{where}: the flange is more than {_MAX_MM:g} mm from the base (x_mm, y_mm, z_mm)")
    qa = np.array(q, dtype=float)
    n = float(np.linalg.norm(qa))
    if abs(n - 1.0) > 1e-3:
        raise DatasetError(f"{where}: quaternion qw, qx, qy, qz has norm {n:.6g}, not 1 (a typo?)")
    return make_transform(matrix_from_quat(qa / n), np.array([x, y, z]) * 1e-3)


def read_dataset(folder: str | Path) -> Dataset:
    """Read a dataset folder (module docstring).

    Raises
    ------
    DatasetError
        Naming the file, line and column of what is wrong.
    """
    d = Path(folder)
    if not d.is_dir():
        raise DatasetError(f"{d}: not a folder (a dataset is a folder with {TARGET_FILE} and {STATIONS_FILE})")
    tpath = d / TARGET_FILE
    try:
        target = target_from_toml(tpath.read_bytes(), source=str(tpath))
    except OSError as exc:
        raise DatasetError(f"{tpath}: cannot read the target file: {exc}") from None
    except TargetFileError as exc:
        raise DatasetError(f"{tpath}: {exc}") from None
    spath = d / STATIONS_FILE
    try:
        text = spath.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{spath}: cannot read: {exc}") from None
    lines = text.splitlines(keepends=True)
    skip = 0
    while skip < len(lines) and lines[skip].lstrip().startswith("#"):
        skip += 1
    reader = csv.DictReader(io.StringIO("".join(lines[skip:])))
    header = [h.strip() for h in (reader.fieldnames or [])]
    if sorted(header) != sorted(COLUMNS):
        extra = sorted(set(header) - set(COLUMNS))
        missing = [c for c in COLUMNS if c not in header]
        what = (f"unknown column(s) {', '.join(extra)}" if extra else "") + ("; " if extra and missing else "") + (
            f"missing {', '.join(missing)}" if missing else "") or "a column given twice"
        raise DatasetError(f"{spath}:{skip + 1}: {what} (the columns are {','.join(COLUMNS)})")
    reader.fieldnames = header
    stations: list[DatasetStation] = []
    for row in reader:
        line = skip + reader.line_num
        where = f"{spath}:{line}"
        if len(stations) >= MAX_ROWS:
            raise DatasetError(f"{where}: more than {MAX_ROWS} rows")
        if None in row or any(v is None for v in row.values()):
            raise DatasetError(f"{where}: expected {len(COLUMNS)} cells")
        name = row["image"].strip()
        if not name or not _NAME.fullmatch(name) or name.startswith(".") or name in ("..",):
            raise DatasetError(f"{where}: image {name!r} is not a file name in the folder (no path separators, "
                               "not hidden)")
        image = d / name
        if not image.is_file():
            raise DatasetError(f"{where}: image {name} is not in {d}")
        stations.append(DatasetStation(image, _pose(row, where), line))
    if not stations:
        raise DatasetError(f"{spath}: no rows (one per image)")
    return Dataset(d, target, tuple(stations))


def _cell(v: float) -> str:
    return repr(float(v))


def write_dataset(folder: str | Path, target_toml: str, rows: Sequence[tuple[str, bytes, npt.NDArray[np.float64] | None]], *,
                  comments: Sequence[str] = ()) -> Path:
    """Write a dataset folder (module docstring): ``rows`` are ``(image file name, its PNG
    bytes, base_T_flange (4, 4) or None)``; ``comments`` become ``#`` lines before the header.

    Raises
    ------
    DatasetError
        The folder already holds a dataset, or a name is no file name.
    OSError
        Writing failed (wrapped by the store's errors for the atomic writes).
    """
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    if (d / STATIONS_FILE).exists():
        raise DatasetError(f"{d} already holds a dataset ({STATIONS_FILE})")
    out = io.StringIO()
    for c in comments:
        out.write(f"# {c}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(COLUMNS)
    for name, png, T in rows:
        if not _NAME.fullmatch(name) or name.startswith(".") or name in (STATIONS_FILE, TARGET_FILE):
            raise DatasetError(f"image name {name!r} is not a file name for the dataset")
        atomic_write_bytes(d / name, png)
        if T is None:
            w.writerow([name, "", "", "", "", "", "", ""])
        else:
            Ta = np.asarray(T, dtype=float)
            q = quat_from_matrix(Ta[:3, :3])
            w.writerow([name, *(_cell(v * 1e3) for v in Ta[:3, 3]), *(_cell(v) for v in q)])
    atomic_write_bytes(d / TARGET_FILE, target_toml.encode("utf-8"))
    atomic_write_bytes(d / STATIONS_FILE, out.getvalue().encode("utf-8"))
    return d
