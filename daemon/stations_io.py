"""Station files for ``cellcal solve``: JSON lines and CSV.

JSON lines (SI units): one station per line, an object with ``base_T_flange`` and the
measurement under its name, each a nested 4x4 list in metres::

    {"base_T_flange": [[1,0,0,0.4],[0,1,0,0],[0,0,1,0.3],[0,0,0,1]],
     "cell_T_target": [[...], [...], [...], [0,0,0,1]]}

The measurement key is ``cell_T_target`` for a base-frame calibration and
``camera_T_target`` for hand-eye; a tool-point file needs only ``base_T_flange``. Blank
lines and lines starting with ``#`` are skipped.

CSV (vendor units: millimetres, quaternion ``w, x, y, z``), a header row naming the
columns, then one station per row::

    flange_x_mm,flange_y_mm,flange_z_mm,flange_qw,flange_qx,flange_qy,flange_qz,
    target_x_mm,target_y_mm,target_z_mm,target_qw,target_qx,target_qy,target_qz

``flange_*`` is ``base_T_flange``; ``target_*`` is the measurement (``cell_T_target`` or
``camera_T_target``); a tool-point file has only the ``flange_*`` columns. Quaternions are
normalised on reading (vendor exports round them), but one with a norm off by more than
1e-3 is rejected as a typo.

Every error is a :class:`StationFileError` naming the file, the line and what is wrong.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import check_transform, matrix_from_quat

__all__ = ["StationFileError", "Stations", "read_stations", "MEASUREMENT_KEYS", "QUATERNION_ORDERS"]

#: measurement key per calibration kind (None: robot poses only)
MEASUREMENT_KEYS = {"base_frame": "cell_T_target", "hand_eye": "camera_T_target", "tool_point": None}

_POSE_COLS = ("x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz")


class StationFileError(CellcalError, ValueError):
    """A station file that cannot be read; the message names file and line."""


@dataclass(frozen=True)
class Stations:
    """Stations read from a file.

    Attributes
    ----------
    base_T_flange : numpy.ndarray, shape (N, 4, 4)
    measured : numpy.ndarray or None, shape (N, 4, 4)
        ``cell_T_target`` or ``camera_T_target``; None for a tool point.
    lines : list of int
        File line of each station (1-based), to name stations in reports.
    """

    base_T_flange: np.ndarray
    measured: np.ndarray | None
    lines: list[int]


#: Component orders a CSV's quaternion columns may be read in (``read_stations``).
QUATERNION_ORDERS = ("wxyz", "xyzw")


def read_stations(path: str | Path, kind: str = "base_frame", fmt: str = "auto", *,
                  quaternion_order: str | dict[str, str] = "wxyz") -> Stations:
    """Read a station file (JSON lines or CSV; ``fmt="auto"`` goes by the extension).

    ``quaternion_order`` (CSV only): how the four ``*_qw, *_qx, *_qy, *_qz`` columns are
    read, ``"wxyz"`` (the format) or ``"xyzw"`` (their values in x, y, z, w order, as some
    exporters write them); one order for both poses, or a dict by prefix (``"flange"``,
    ``"target"``). ``cellcal solve`` uses it to tell a user whose file fits far better read
    the other way.
    """
    orders = {"flange": quaternion_order, "target": quaternion_order} if isinstance(quaternion_order, str) \
        else {"flange": "wxyz", "target": "wxyz", **quaternion_order}
    for o in orders.values():
        if o not in QUATERNION_ORDERS:
            raise ValueError(f"quaternion_order must be one of {QUATERNION_ORDERS}, got {o!r}")
    if kind not in MEASUREMENT_KEYS:
        raise ValueError(f"kind must be one of {sorted(MEASUREMENT_KEYS)}, got {kind!r}")
    path = Path(path)
    if fmt == "auto":
        fmt = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise StationFileError(f"{path}: cannot read: {exc}") from exc
    if fmt == "jsonl":
        return _read_jsonl(text, str(path), MEASUREMENT_KEYS[kind])
    if fmt == "csv":
        return _read_csv(text, str(path), MEASUREMENT_KEYS[kind], orders)
    raise ValueError(f"format must be auto, jsonl or csv, got {fmt!r}")


def _matrix(value: object, where: str, key: str) -> np.ndarray:
    try:
        a = np.array(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise StationFileError(f"{where}: {key} is not a 4x4 list of numbers") from exc
    try:
        return check_transform(a, key)
    except ValueError as exc:
        raise StationFileError(f"{where}: {exc}") from exc


def _read_jsonl(text: str, name: str, meas_key: str | None) -> Stations:
    G, M, lines = [], [], []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{name}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise StationFileError(f"{where}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise StationFileError(f"{where}: expected a JSON object per line")
        needed = ["base_T_flange"] + ([meas_key] if meas_key else [])
        for key in needed:
            if key not in obj:
                raise StationFileError(f"{where}: missing key {key!r} (have {sorted(obj)})")
        G.append(_matrix(obj["base_T_flange"], where, "base_T_flange"))
        if meas_key:
            M.append(_matrix(obj[meas_key], where, meas_key))
        lines.append(lineno)
    if not lines:
        raise StationFileError(f"{name}: no stations")
    return Stations(np.array(G), np.array(M) if meas_key else None, lines)


def _pose(row: dict[str, str], prefix: str, where: str, order: str = "wxyz") -> np.ndarray:
    vals = []
    for col in _POSE_COLS:
        key = f"{prefix}_{col}"
        raw = row.get(key)
        if raw is None or raw.strip() == "":
            raise StationFileError(f"{where}: column {key!r} is empty")
        try:
            v = float(raw)
        except ValueError as exc:
            raise StationFileError(f"{where}: column {key!r} is not a number: {raw!r}") from exc
        if not math.isfinite(v):
            raise StationFileError(f"{where}: column {key!r} is not finite: {raw!r}")
        vals.append(v)
    q = np.array(vals[3:])
    if order == "xyzw":  # the qw, qx, qy, qz columns hold x, y, z, w
        q = q[[3, 0, 1, 2]]
    norm = float(np.linalg.norm(q))
    if abs(norm - 1.0) > 1e-3:
        raise StationFileError(f"{where}: {prefix} quaternion has norm {norm:.6g}, expected 1")
    T = np.eye(4)
    T[:3, :3] = matrix_from_quat(q)
    T[:3, 3] = np.array(vals[:3]) * 1e-3
    return T


def _read_csv(text: str, name: str, meas_key: str | None, orders: dict[str, str] | None = None) -> Stations:
    orders = orders or {"flange": "wxyz", "target": "wxyz"}
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    needed = [f"flange_{c}" for c in _POSE_COLS] + ([f"target_{c}" for c in _POSE_COLS] if meas_key else [])
    missing = [c for c in needed if c not in header]
    if missing:
        raise StationFileError(f"{name}:1: header lacks column(s) {', '.join(missing)}")
    G, M, lines = [], [], []
    for row in reader:
        lineno = reader.line_num
        where = f"{name}:{lineno}"
        if None in row:
            raise StationFileError(f"{where}: more fields than the header has columns")
        if all((v or "").strip() == "" for v in row.values()):
            continue
        G.append(_pose(row, "flange", where, orders["flange"]))
        if meas_key:
            M.append(_pose(row, "target", where, orders["target"]))
        lines.append(lineno)
    if not lines:
        raise StationFileError(f"{name}: no stations")
    return Stations(np.array(G), np.array(M) if meas_key else None, lines)
