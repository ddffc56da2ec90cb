"""Station files for ``cellcal solve``: JSON lines and CSV.

JSON lines (SI units): one station per line, an object with ``base_T_flange`` and the
measurement under its name, each a nested 4x4 list in metres::

    {"base_T_flange": [[1,0,0,0.4],[0,1,0,0],[0,0,1,0.3],[0,0,0,1]],
     "cell_T_target": [[...], [...], [...], [0,0,0,1]]}

The measurement key is ``cell_T_target`` for a base-frame calibration and
``camera_T_target`` for hand-eye; a tool-point file needs only ``base_T_flange``. A
base-frame file of 3-DoF point stations (a tracker measuring a reflector:
``[tracker] measure = "point"``) has ``cell_p_target`` instead, a list of three numbers in
metres; a file holds pose or point stations, never both. Blank lines and lines starting
with ``#`` are skipped.

CSV (vendor units: millimetres, quaternion ``w, x, y, z``), a header row naming the
columns, then one station per row::

    flange_x_mm,flange_y_mm,flange_z_mm,flange_qw,flange_qx,flange_qy,flange_qz,
    target_x_mm,target_y_mm,target_z_mm,target_qw,target_qx,target_qy,target_qz

``flange_*`` is ``base_T_flange``; ``target_*`` is the measurement (``cell_T_target`` or
``camera_T_target``); a tool-point file has only the ``flange_*`` columns; a base-frame file
of point stations has ``target_x_mm, target_y_mm, target_z_mm`` and no ``target_q*`` columns. Quaternions are
normalised on reading (vendor exports round them), but one with a norm off by more than
1e-3 is rejected as a typo.

Limits (each breach is a :class:`StationFileError` naming the line, found before the line is
read whole): a line (a CSV record, with its quoted line breaks) holds at most
:data:`MAX_LINE_BYTES` bytes, a file at most :data:`MAX_STATIONS` stations, a JSON line nests
at most 64 arrays/objects deep. Matrix entries must be JSON numbers (not strings, not
``true``), finite as float 64, and translations within :data:`MAX_TRANSLATION_M` of the
origin (a cell is not kilometres wide; beyond, the solve would lose its digits to squares of
huge numbers). So memory is bounded per line, whatever the file holds.

**What the daemon solved with** (optional, all or none per file; ``cellcal stations`` writes
them so that ``cellcal solve FILE`` repeats the daemon's solve):

* each station's measurement covariance, SI (m^2; for a pose ``(dx, dy, dz, dphi_x, dphi_y,
  dphi_z)`` about the cell axes, ``R' = Exp(dphi) R``, rad): in JSON lines under
  ``cell_T_target_cov`` (6x6 list) or ``cell_p_target_cov`` (3x3 list); in CSV as the upper
  triangle, columns ``target_cov_<i><j>`` for ``i <= j`` (0-based; SI, whatever the poses'
  units);
* its capture time (``capture_time_s``: seconds from the run's first station) and the
  flange's largest speed while it was taken (``capture_speed_m_s``), a key or column each;
* the solve's settings, one comment line ``# cellcal-settings: {...}`` (a JSON object:
  ``solve``, the daemon's ``[solve]`` settings in SI; ``noise``, ``"declared per station"``
  (the covariances) or ``"estimated"`` (from the residuals); ``result``, the stored result
  they reproduce: ``id``, ``run_id`` and its ``transforms``, name -> 4x4 list).

A covariance must be symmetric and positive definite; an entry that is not is named.

Every error is a :class:`StationFileError` naming the file, the line and what is wrong.

:func:`write_stations` writes the same formats (``cellcal stations RUN_ID -o FILE``): JSON
lines with every number as Python's ``repr`` (read back bit for bit), CSV in millimetres
with the quaternion ``w >= 0`` (read back to about 1e-15 relative). Both may start with
``#`` comment lines naming where the stations came from; :func:`read_stations` skips them.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import check_transform, matrix_from_quat, quat_from_matrix

__all__ = [
    "StationFileError", "Stations", "read_stations", "write_stations", "format_stations", "MEASUREMENT_KEYS",
    "POINT_KEYS", "COV_KEYS", "SETTINGS_PREFIX",
    "MAX_LINE_BYTES", "MAX_STATIONS", "MAX_TRANSLATION_M", "MAX_JSON_DEPTH", "QUATERNION_ORDERS",
]

#: measurement key per calibration kind (None: robot poses only)
MEASUREMENT_KEYS = {"base_frame": "cell_T_target", "hand_eye": "camera_T_target", "tool_point": None}
#: the key of a 3-DoF point measurement, per kind that may be measured by points
POINT_KEYS = {"base_frame": "cell_p_target"}

#: Longest line (CSV: record) read; a station line is about 1 kB.
MAX_LINE_BYTES = 64 * 1024
#: Most stations in one file.
MAX_STATIONS = 100_000
#: Largest |translation| accepted in a matrix (metres).
MAX_TRANSLATION_M = 1e4
#: Deepest nesting of arrays and objects in a JSON line (a station needs 3).
MAX_JSON_DEPTH = 64

_POSE_COLS = ("x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz")

#: The comment line that carries the solve's settings (a JSON object after the prefix).
SETTINGS_PREFIX = "# cellcal-settings: "
#: The per-station covariance key of a pose and of a point station (JSON lines).
COV_KEYS = {"pose": "cell_T_target_cov", "point": "cell_p_target_cov"}


class StationFileError(CellcalError, ValueError):
    """A station file that cannot be read; the message names file and line."""


@dataclass(frozen=True)
class Stations:
    """Stations read from a file.

    Attributes
    ----------
    base_T_flange : numpy.ndarray, shape (N, 4, 4)
    measured : numpy.ndarray or None, shape (N, 4, 4)
        ``cell_T_target`` or ``camera_T_target``; None for a tool point and for point
        stations.
    lines : list of int
        File line of each station (1-based), to name stations in reports.
    points : numpy.ndarray or None, shape (N, 3)
        ``cell_p_target`` of a base-frame file of 3-DoF point stations, metres; else None.
    covariances : numpy.ndarray or None, shape (N, 6, 6) or (N, 3, 3)
        Each station's measurement covariance (SI) when the file carries them.
    capture_time_s, capture_speed_m_s : numpy.ndarray or None, shape (N,)
        Capture times (s) and the flange's speed while captured (m/s), when carried.
    settings : dict or None
        The ``# cellcal-settings:`` object, when the file has one.
    """

    base_T_flange: npt.NDArray[np.float64]
    measured: npt.NDArray[np.float64] | None
    lines: list[int]
    points: npt.NDArray[np.float64] | None = None
    covariances: npt.NDArray[np.float64] | None = None
    capture_time_s: npt.NDArray[np.float64] | None = None
    capture_speed_m_s: npt.NDArray[np.float64] | None = None
    settings: dict[str, object] | None = None


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

    Raises
    ------
    StationFileError
        The file cannot be read, or a line is malformed or beyond a limit (named).
    ValueError
        An unknown ``kind``, ``fmt`` or ``quaternion_order`` (a caller's mistake, not the file's).
    """
    orders = {"flange": quaternion_order, "target": quaternion_order} if isinstance(quaternion_order, str) \
        else {"flange": "wxyz", "target": "wxyz", **quaternion_order}
    for o in orders.values():
        if o not in QUATERNION_ORDERS:
            raise ValueError(f"quaternion_order must be one of {QUATERNION_ORDERS}, got {o!r}")
    if kind not in MEASUREMENT_KEYS:
        raise ValueError(f"kind must be one of {sorted(MEASUREMENT_KEYS)}, got {kind!r}")
    if fmt not in ("auto", "jsonl", "csv"):
        raise ValueError(f"format must be auto, jsonl or csv, got {fmt!r}")
    path = Path(path)
    if fmt == "auto":
        fmt = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; errors of open are the file's
    except OSError as exc:
        raise StationFileError(f"{path}: cannot read: {exc}") from exc
    with f:
        lines = _Lines(f, str(path))
        try:
            if fmt == "jsonl":
                return _read_jsonl(lines, str(path), MEASUREMENT_KEYS[kind], POINT_KEYS.get(kind))
            return _read_csv(lines, str(path), MEASUREMENT_KEYS[kind], orders, POINT_KEYS.get(kind))
        except OSError as exc:  # a read error half way (EIO, a directory)
            raise StationFileError(f"{path}: cannot read: {exc}") from exc


class _Lines:
    """The file's lines, decoded, each read with a bounded ``readline``: a 50 MB line costs
    at most :data:`MAX_LINE_BYTES` of memory before it is refused. ``record_bytes`` counts
    what was read since :meth:`start_record` (a CSV record may span lines)."""

    def __init__(self, f: BinaryIO, name: str) -> None:
        self._f = f
        self.name = name
        self.lineno = 0
        self.record_bytes = 0
        self._record_line = 1
        self.settings: dict[str, object] | None = None

    def start_record(self) -> None:
        self.record_bytes = 0
        self._record_line = self.lineno + 1

    def __iter__(self) -> Iterator[str]:
        while True:
            raw = self._f.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            self.lineno += 1
            self.record_bytes += len(raw)
            if self.record_bytes > MAX_LINE_BYTES:
                what = "line" if self._record_line == self.lineno else f"record starting on line {self._record_line}"
                raise StationFileError(
                    f"{self.name}:{self.lineno}: {what} longer than {MAX_LINE_BYTES} bytes (a station needs about 1 kB)"
                )
            try:
                text = raw.decode("utf-8-sig" if self.lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise StationFileError(f"{self.name}:{self.lineno}: not UTF-8 text ({exc.reason})") from None
            if text.startswith(SETTINGS_PREFIX):
                self.settings = _settings(text[len(SETTINGS_PREFIX):], f"{self.name}:{self.lineno}")
            yield text


def _settings(text: str, where: str) -> dict[str, object]:
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise StationFileError(f"{where}: the cellcal-settings line is not a JSON object ({exc})") from None
    if not isinstance(obj, dict):
        raise StationFileError(f"{where}: the cellcal-settings line is not a JSON object")
    return obj


def _covariance(C: npt.NDArray[np.float64], where: str, key: str) -> npt.NDArray[np.float64]:
    """A measurement covariance: finite, symmetric, positive definite."""
    if float(np.max(np.abs(C - C.T))) > 1e-9 * float(np.max(np.abs(C))):
        raise StationFileError(f"{where}: {key} is not symmetric")
    try:
        np.linalg.cholesky(C)
    except np.linalg.LinAlgError:
        raise StationFileError(f"{where}: {key} is not positive definite") from None
    return C


def _scalar(v: object, where: str, key: str) -> float:
    x = _entry(v, where, key)
    if x < 0.0:
        raise StationFileError(f"{where}: {key} must not be negative, got {x!r}")
    return x


class _Extras:
    """The optional per-station figures (covariance, capture time and speed): all stations
    carry each or none does, decided by the first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cov: list[npt.NDArray[np.float64]] = []
        self.t: list[float] = []
        self.v: list[float] = []
        self.has: dict[str, bool] | None = None

    def add(self, where: str, found: dict[str, object | None], cov_key: str, n: int) -> None:
        present = {k: v is not None for k, v in found.items()}
        if self.has is None:
            self.has = present
        for k, here in present.items():
            if here != self.has[k]:
                k = cov_key if k == "cov" else k
                raise StationFileError(f"{where}: {'has' if here else 'lacks'} {k} where the first station "
                                       f"{'lacks' if here else 'has'} it: a file gives it for every station or none")
        if found["cov"] is not None:
            C = found["cov"]
            assert isinstance(C, np.ndarray)
            if C.shape != (n, n):
                raise StationFileError(f"{where}: {cov_key} must be {n}x{n}")
            self.cov.append(_covariance(C, where, cov_key))
        if found["capture_time_s"] is not None:
            self.t.append(_scalar(found["capture_time_s"], where, "capture_time_s"))
        if found["capture_speed_m_s"] is not None:
            self.v.append(_scalar(found["capture_speed_m_s"], where, "capture_speed_m_s"))

    def stations(self, G: list[npt.NDArray[np.float64]], M: npt.NDArray[np.float64] | None, lines: list[int],
                 points: npt.NDArray[np.float64] | None,
                 settings: dict[str, object] | None) -> Stations:
        return Stations(np.array(G), M, lines, points, covariances=np.array(self.cov) if self.cov else None,
                        capture_time_s=np.array(self.t) if self.t else None,
                        capture_speed_m_s=np.array(self.v) if self.v else None, settings=settings)


def _too_many(name: str, lineno: int) -> StationFileError:
    return StationFileError(f"{name}:{lineno}: more than {MAX_STATIONS} stations")


# --- JSON lines ------------------------------------------------------------------------------


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def _json_depth(line: str) -> int:
    """Deepest nesting of arrays and objects outside strings (cheap; before json.loads)."""
    depth = deepest = 0
    in_str = esc = False
    for ch in line:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _entry(v: object, where: str, key: str, *index: int) -> float:
    """One number of a JSON line, ``key[i][j]`` (a matrix) or ``key[i]`` (a point)."""
    # bool is an int in Python and "0.1" would pass np.array(dtype=float): refuse both.
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise StationFileError(f"{where}: {key}{''.join(f'[{i}]' for i in index)} must be a number, "
                               f"got {json.dumps(v)[:40]}")
    x = float(v)  # parse_int made every integer a float already; this is exact
    if not math.isfinite(x):
        raise StationFileError(f"{where}: {key}{''.join(f'[{i}]' for i in index)} is not a finite float 64 "
                               f"({v!r:.40})")
    return x


def _matrix(value: object, where: str, key: str) -> npt.NDArray[np.float64]:
    if not (isinstance(value, list) and len(value) == 4 and all(isinstance(r, list) and len(r) == 4 for r in value)):
        raise StationFileError(f"{where}: {key} is not a 4x4 list of numbers")
    a = np.array([[_entry(value[i][j], where, key, i, j) for j in range(4)] for i in range(4)])
    try:
        a = check_transform(a, key)
    except ValueError as exc:
        raise StationFileError(f"{where}: {exc}") from exc
    t = float(np.max(np.abs(a[:3, 3])))
    if t > MAX_TRANSLATION_M:
        raise StationFileError(f"{where}: {key} translation {t:.6g} m is beyond {MAX_TRANSLATION_M:g} m")
    return a


def _point(value: object, where: str, key: str) -> npt.NDArray[np.float64]:
    if not (isinstance(value, list) and len(value) == 3):
        raise StationFileError(f"{where}: {key} is not a list of three numbers (x, y, z in metres)")
    p = np.array([_entry(value[i], where, key, i) for i in range(3)])
    t = float(np.max(np.abs(p)))
    if t > MAX_TRANSLATION_M:
        raise StationFileError(f"{where}: {key} {t:.6g} m is beyond {MAX_TRANSLATION_M:g} m")
    return p


def _read_jsonl(lines: _Lines, name: str, meas_key: str | None, point_key: str | None = None) -> Stations:
    G: list[npt.NDArray[np.float64]] = []
    M: list[npt.NDArray[np.float64]] = []
    Pts: list[npt.NDArray[np.float64]] = []
    nums: list[int] = []
    extras = _Extras(name)
    # Pose or point stations, decided by the first station (when the kind has a point form).
    points: bool | None = None if point_key else False
    for raw in lines:
        lines.start_record()
        lineno = lines.lineno
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{name}:{lineno}"
        if len(nums) >= MAX_STATIONS:
            raise _too_many(name, lineno)
        # (the exact scan only for lines with many brackets: a station line has 11)
        if line.count("[") + line.count("{") > MAX_JSON_DEPTH and _json_depth(line) > MAX_JSON_DEPTH:
            raise StationFileError(f"{where}: nested more than {MAX_JSON_DEPTH} deep (a station needs 3)")
        try:
            # integers as floats: a 5000-digit integer becomes inf (refused below), never a
            # ValueError from int() or an OverflowError from numpy
            obj = json.loads(line, parse_int=float, parse_constant=_no_constant)
        except json.JSONDecodeError as exc:
            raise StationFileError(f"{where}: not valid JSON ({exc.msg})") from exc
        except (ValueError, RecursionError) as exc:
            raise StationFileError(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise StationFileError(f"{where}: expected a JSON object per line")
        is_point = point_key is not None and meas_key not in obj and point_key in obj
        if points is None:
            points = is_point
        elif is_point != points and (meas_key in obj or point_key in obj):
            raise StationFileError(f"{where}: {point_key if is_point else meas_key} where the first station has "
                                   f"{meas_key if is_point else point_key}: a file holds pose or point stations, "
                                   "not both")
        mkey = point_key if points else meas_key
        needed = ["base_T_flange"] + ([mkey] if mkey else [])
        for key in needed:
            if key not in obj:
                also = f" or {point_key!r}" if key == meas_key and point_key and not nums else ""
                raise StationFileError(f"{where}: missing key {key!r}{also} (have {sorted(obj)[:10]})")
        G.append(_matrix(obj["base_T_flange"], where, "base_T_flange"))
        if points:
            assert point_key is not None
            Pts.append(_point(obj[point_key], where, point_key))
        elif meas_key:
            M.append(_matrix(obj[meas_key], where, meas_key))
        cov_key = COV_KEYS["point" if points else "pose"]
        n = 3 if points else 6
        raw_cov = obj.get(cov_key)
        cov = None
        if raw_cov is not None:
            if not (isinstance(raw_cov, list) and len(raw_cov) == n
                    and all(isinstance(r, list) and len(r) == n for r in raw_cov)):
                raise StationFileError(f"{where}: {cov_key} is not a {n}x{n} list of numbers")
            cov = np.array([[_entry(raw_cov[i][j], where, cov_key, i, j) for j in range(n)] for i in range(n)])
        extras.add(where, {"cov": cov, "capture_time_s": obj.get("capture_time_s"),
                           "capture_speed_m_s": obj.get("capture_speed_m_s")}, cov_key, n)
        nums.append(lineno)
    if not nums:
        raise StationFileError(f"{name}: no stations")
    if points:
        return extras.stations(G, None, nums, np.array(Pts), lines.settings)
    return extras.stations(G, np.array(M) if meas_key else None, nums, None, lines.settings)


# --- CSV -------------------------------------------------------------------------------------


def _numbers(row: dict[str, str], prefix: str, cols: tuple[str, ...], where: str) -> list[float]:
    """The finite numbers of the columns ``{prefix}_{col}`` of a CSV row."""
    vals = []
    for col in cols:
        key = f"{prefix}_{col}"
        raw = row.get(key)
        if raw is None or raw.strip() == "":
            raise StationFileError(f"{where}: column {key!r} is empty")
        try:
            v = float(raw)
        except ValueError as exc:
            raise StationFileError(f"{where}: column {key!r} is not a number: {raw[:40]!r}") from exc
        if not math.isfinite(v):
            raise StationFileError(f"{where}: column {key!r} is not finite: {raw[:40]!r}")
        vals.append(v)
    return vals


def _position(row: dict[str, str], prefix: str, where: str) -> npt.NDArray[np.float64]:
    """``{prefix}_x_mm .. _z_mm`` in metres, within :data:`MAX_TRANSLATION_M`."""
    vals = _numbers(row, prefix, _POSE_COLS[:3], where)
    if max(abs(v) for v in vals) * 1e-3 > MAX_TRANSLATION_M:
        raise StationFileError(f"{where}: {prefix} position is beyond {MAX_TRANSLATION_M * 1e3:g} mm")
    return np.array(vals) * 1e-3


def _pose(row: dict[str, str], prefix: str, where: str, order: str = "wxyz") -> npt.NDArray[np.float64]:
    t = _position(row, prefix, where)
    q = np.array(_numbers(row, prefix, _POSE_COLS[3:], where))
    if order == "xyzw":  # the qw, qx, qy, qz columns hold x, y, z, w
        q = q[[3, 0, 1, 2]]
    norm = float(np.linalg.norm(q))
    if abs(norm - 1.0) > 1e-3:
        raise StationFileError(f"{where}: {prefix} quaternion has norm {norm:.6g}, expected 1")
    T = np.eye(4)
    T[:3, :3] = matrix_from_quat(q)
    T[:3, 3] = t
    return T


def _read_csv(lines: _Lines, name: str, meas_key: str | None, orders: dict[str, str] | None = None,
              point_key: str | None = None) -> Stations:
    orders = orders or {"flange": "wxyz", "target": "wxyz"}
    # '#' comment lines before the header (what write_stations puts there) are skipped
    reader = csv.DictReader(ln for ln in lines if not ln.startswith("#"))
    try:
        header = reader.fieldnames or []
    except csv.Error as exc:
        raise StationFileError(f"{name}:{lines.lineno}: not valid CSV ({exc})") from None
    # Point stations: the target's position columns without its quaternion (the kind allows them).
    points = (point_key is not None and all(f"target_{c}" in header for c in _POSE_COLS[:3])
              and not any(f"target_{c}" in header for c in _POSE_COLS[3:]))
    target_cols = _POSE_COLS[:3] if points else _POSE_COLS
    needed = [f"flange_{c}" for c in _POSE_COLS] + ([f"target_{c}" for c in target_cols] if meas_key else [])
    missing = [c for c in needed if c not in header]
    if missing:
        raise StationFileError(f"{name}:1: header lacks column(s) {', '.join(missing)}")
    n = 3 if points else 6
    cov_cols = [f"target_cov_{i}{j}" for i in range(n) for j in range(i, n)]
    have_cov = [c in header for c in cov_cols]
    if any(have_cov) and not all(have_cov):
        raise StationFileError(f"{name}:1: header has some target_cov_* columns but lacks "
                               f"{', '.join(c for c, h in zip(cov_cols, have_cov, strict=True) if not h)}")
    G: list[npt.NDArray[np.float64]] = []
    M: list[npt.NDArray[np.float64]] = []
    nums: list[int] = []
    extras = _Extras(name)
    while True:
        lines.start_record()
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:  # e.g. a quoted field never closed, NUL bytes
            raise StationFileError(f"{name}:{lines.lineno}: not valid CSV ({exc})") from None
        lineno = lines.lineno  # the file's line (reader.line_num would not count skipped comments)
        where = f"{name}:{lineno}"
        if None in row:
            raise StationFileError(f"{where}: more fields than the header has columns")
        if all((v or "").strip() == "" for v in row.values()):
            continue
        if len(nums) >= MAX_STATIONS:
            raise _too_many(name, lineno)
        G.append(_pose(row, "flange", where, orders["flange"]))
        if points:
            M.append(_position(row, "target", where))
        elif meas_key:
            M.append(_pose(row, "target", where, orders["target"]))
        cov = None
        if all(have_cov):
            upper = _numbers(row, "target", tuple(c[len("target_"):] for c in cov_cols), where)
            cov = np.zeros((n, n))
            cov[np.triu_indices(n)] = upper
            cov = cov + np.triu(cov, 1).T
        found: dict[str, object | None] = {"cov": cov}
        for key in ("capture_time_s", "capture_speed_m_s"):
            found[key] = _numbers(row, key.split("_", 1)[0], (key.split("_", 1)[1],), where)[0] \
                if key in header else None
        extras.add(where, found, "target_cov", n)
        nums.append(lineno)
    if not nums:
        raise StationFileError(f"{name}: no stations")
    if points:
        return extras.stations(G, None, nums, np.array(M), lines.settings)
    return extras.stations(G, np.array(M) if meas_key else None, nums, None, lines.settings)


# --- writing ---------------------------------------------------------------------------------


def _pose_cells(T: npt.NDArray[np.float64]) -> list[str]:
    q = quat_from_matrix(T[:3, :3])  # w >= 0
    return [repr(float(v) * 1e3) for v in T[:3, 3]] + [repr(float(v)) for v in q]


def write_stations(path: str | Path, base_T_flange: npt.NDArray[np.float64], measured: npt.NDArray[np.float64] | None,
                   kind: str = "base_frame", *, fmt: str = "auto", comments: tuple[str, ...] = (),
                   covariances: npt.NDArray[np.float64] | None = None, capture_time_s: npt.NDArray[np.float64] | None = None,
                   capture_speed_m_s: npt.NDArray[np.float64] | None = None,
                   settings: dict[str, object] | None = None) -> Path:
    """Write stations in the format :func:`read_stations` reads: :func:`format_stations`'s
    text, to a temporary name first and then renamed (its parameters and errors).

    Returns
    -------
    Path
        ``path``, written whole.
    """
    path = Path(path)
    text = format_stations(path, base_T_flange, measured, kind, fmt=fmt, comments=comments, covariances=covariances,
                           capture_time_s=capture_time_s, capture_speed_m_s=capture_speed_m_s, settings=settings)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def format_stations(path: str | Path, base_T_flange: npt.NDArray[np.float64], measured: npt.NDArray[np.float64] | None,
                    kind: str = "base_frame", *, fmt: str = "auto", comments: tuple[str, ...] = (),
                    covariances: npt.NDArray[np.float64] | None = None, capture_time_s: npt.NDArray[np.float64] | None = None,
                    capture_speed_m_s: npt.NDArray[np.float64] | None = None,
                    settings: dict[str, object] | None = None) -> str:
    """The text of a station file in the format :func:`read_stations` reads (``fmt="auto"``:
    by ``path``'s extension, ``.csv`` or else JSON lines).

    Parameters
    ----------
    path : str or Path
    base_T_flange : numpy.ndarray, shape (N, 4, 4)
        Flange poses, metres.
    measured : numpy.ndarray, shape (N, 4, 4) or (N, 3), or None
        The measurement of ``kind`` (``MEASUREMENT_KEYS``): ``cell_T_target`` or
        ``camera_T_target``; for a base frame measured by points, ``cell_p_target``
        (N, 3) in metres (``POINT_KEYS``); None for a tool point.
    kind : str
    comments : tuple of str
        Lines written first, each after ``# `` (where the stations came from).
    covariances : numpy.ndarray, shape (N, 6, 6) or (N, 3, 3), optional
        Each station's measurement covariance, SI (the module docstring's columns and keys).
    capture_time_s, capture_speed_m_s : numpy.ndarray, shape (N,), optional
    settings : dict, optional
        Written as the ``# cellcal-settings:`` line (plain JSON types).

    Returns
    -------
    str
        The file's text (``path`` names the format when ``fmt="auto"``).

    Raises
    ------
    ValueError
        An unknown ``kind`` or ``fmt``, or poses of the wrong shape or count.
    """
    if kind not in MEASUREMENT_KEYS:
        raise ValueError(f"kind must be one of {sorted(MEASUREMENT_KEYS)}, got {kind!r}")
    if fmt not in ("auto", "jsonl", "csv"):
        raise ValueError(f"format must be auto, jsonl or csv, got {fmt!r}")
    path = Path(path)
    if fmt == "auto":
        fmt = "csv" if path.suffix.lower() == ".csv" else "jsonl"
    G = np.asarray(base_T_flange, dtype=float).reshape(-1, 4, 4)
    key = MEASUREMENT_KEYS[kind]
    M = None
    points = False
    if key is not None:
        if measured is None:
            raise ValueError(f"a {kind} station file needs {key} for every station")
        m = np.asarray(measured, dtype=float)
        points = kind in POINT_KEYS and m.ndim == 2 and m.shape[-1] == 3
        if points:
            key = POINT_KEYS[kind]
            M = m
        else:
            M = m.reshape(-1, 4, 4)
        if len(M) != len(G):
            raise ValueError(f"{len(G)} flange poses but {len(M)} {key}: they must pair up")
    n = 3 if points else 6
    C = None
    if covariances is not None:
        C = np.asarray(covariances, dtype=float)
        if M is None or C.shape != (len(G), n, n):
            raise ValueError(f"covariances: expected shape ({len(G)}, {n}, {n}) for these stations, got {C.shape}")
    extra: dict[str, npt.NDArray[np.float64]] = {}
    for name, v in (("capture_time_s", capture_time_s), ("capture_speed_m_s", capture_speed_m_s)):
        if v is not None:
            a = np.asarray(v, dtype=float).reshape(-1)
            if len(a) != len(G):
                raise ValueError(f"{name}: {len(a)} values for {len(G)} stations")
            extra[name] = a
    out: list[str] = [f"# {c}" for c in comments]
    if settings is not None:
        out.append(SETTINGS_PREFIX + json.dumps(settings, allow_nan=False))
    cov_key = COV_KEYS["point" if points else "pose"]
    upper = np.triu_indices(n)
    if fmt == "jsonl":
        for i, g in enumerate(G):
            obj: dict[str, object] = {"base_T_flange": g.tolist()}
            if M is not None and key is not None:
                obj[key] = M[i].tolist()
            if C is not None:
                obj[cov_key] = C[i].tolist()
            for name, a in extra.items():
                obj[name] = float(a[i])
            out.append(json.dumps(obj))  # repr of every float: exact
    else:
        target = _POSE_COLS[:3] if points else _POSE_COLS
        cols = [f"flange_{c}" for c in _POSE_COLS] + ([f"target_{c}" for c in target] if M is not None else [])
        if C is not None:
            cols += [f"target_cov_{i}{j}" for i, j in zip(*upper, strict=True)]
        cols += list(extra)
        out.append(",".join(cols))
        for i, g in enumerate(G):
            meas = [] if M is None else ([repr(float(v) * 1e3) for v in M[i]] if points else _pose_cells(M[i]))
            cov = [] if C is None else [repr(float(v)) for v in C[i][upper]]
            out.append(",".join(_pose_cells(g) + meas + cov + [repr(float(a[i])) for a in extra.values()]))
    return "\n".join(out) + "\n"
