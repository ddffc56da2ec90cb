"""The calibration target: a ChArUco board or a plain chessboard, and its target file (ADR 0021).

Geometry
--------
The target frame is OpenCV's board frame: origin at the outer corner of square (0, 0)
(top left as printed), x along the squares' columns, y along their rows (down the print),
z into the board (away from a camera that sees the print), metres. Square ``(col, row)``
is black when ``col + row`` is even (OpenCV's ChArUco layout; a ChArUco board's markers sit
in the white squares). The inner corners, where four squares meet, are numbered row by row:
corner ``i`` is at column ``i % (squares_x - 1)``, row ``i // (squares_x - 1)``, at
``((col + 1) square, (row + 1) square, 0)``: the ids OpenCV's ChArUco detector reports.

Target file
-----------
TOML with one ``[target]`` table, millimetres at the edge::

    [target]
    type = "charuco"            # or "chessboard"
    squares_x = 10              # squares along x (columns)
    squares_y = 7               # squares along y (rows)
    square_mm = 25.0
    marker_mm = 18.0            # charuco only: the ArUco marker's side
    dictionary = "DICT_5X5_100" # charuco only: OpenCV's name of the marker dictionary
    legacy_pattern = false      # charuco only: OpenCV's older layout (matters for an even squares_y)
    flatness_mm = 0.05          # optional: the board's measured flatness (peak to valley)

A chessboard must have one even and one odd side (``squares_x + squares_y`` odd): only then
does the colour of the first square tell its corner apart from the opposite one, so the
detector can number the corners without a 180-degree ambiguity. Errors are
:class:`~cellcal.solver.errors.TargetFileError` naming the dotted key. The file's sha256
(of its bytes) goes into every result's provenance: two calibrations with the same hash used
the same board description.

This module is pure (bytes in, a value out); reading the file is
:func:`cellcal.drivers.detect.load_target`'s job.
"""

from __future__ import annotations

import hashlib
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.solver.errors import TargetFileError

__all__ = ["CalibrationTarget", "TARGET_TYPES", "ARUCO_DICTIONARIES", "parse_target", "target_from_toml"]

TARGET_TYPES = ("charuco", "chessboard")

#: OpenCV's predefined ArUco dictionaries by name -> number of markers in it.
ARUCO_DICTIONARIES: dict[str, int] = {
    **{f"DICT_{n}X{n}_{k}": k for n in (4, 5, 6, 7) for k in (50, 100, 250, 1000)},
    "DICT_ARUCO_ORIGINAL": 1024,
    "DICT_APRILTAG_16h5": 30,
    "DICT_APRILTAG_25h9": 35,
    "DICT_APRILTAG_36h10": 2320,
    "DICT_APRILTAG_36h11": 587,
    "DICT_ARUCO_MIP_36h12": 250,
}

_MM = 1e-3
#: A square smaller than this is a unit mistake (metres given as millimetres), not a board.
_MIN_SQUARE_MM = 0.5
_MAX_SQUARE_MM = 2000.0
_MAX_SQUARES = 200


@dataclass(frozen=True, kw_only=True, eq=False)
class CalibrationTarget:
    """A planar calibration target.

    Attributes
    ----------
    kind : {"charuco", "chessboard"}
    squares_x, squares_y : int
        Squares along the target's x (columns) and y (rows).
    square_m : float
        Side of a square, metres.
    marker_m : float or None
        Side of a ChArUco marker, metres (None for a chessboard).
    dictionary : str or None
        OpenCV's name of the ArUco dictionary (``"DICT_5X5_100"``; None for a chessboard).
    legacy_pattern : bool
        The board follows OpenCV's older ChArUco layout, which places the markers
        differently when ``squares_y`` is even (``CharucoBoard.setLegacyPattern``).
    flatness_m : float or None
        Measured flatness (peak to valley), metres; None when not measured.
    sha256 : str or None
        Hex digest of the target file's bytes (None for a target built in code).
    source : str
        Where it came from (a path, ``"<string>"``).
    """

    kind: str
    squares_x: int
    squares_y: int
    square_m: float
    marker_m: float | None = None
    dictionary: str | None = None
    legacy_pattern: bool = False
    flatness_m: float | None = None
    sha256: str | None = None
    source: str = "<code>"

    def __post_init__(self) -> None:
        for name in ("square_m", "marker_m", "flatness_m"):
            v = getattr(self, name)
            if isinstance(v, (int, np.integer, np.floating)) and not isinstance(v, bool):
                object.__setattr__(self, name, float(v))
        _validate(self)
        pts = np.zeros((self.n_corners, 3))
        ids = np.arange(self.n_corners)
        cols = self.squares_x - 1
        pts[:, 0] = (ids % cols + 1) * self.square_m
        pts[:, 1] = (ids // cols + 1) * self.square_m
        pts.setflags(write=False)
        object.__setattr__(self, "_corners", pts)

    # -- geometry -------------------------------------------------------------------------
    @property
    def inner_corners(self) -> tuple[int, int]:
        """``(columns, rows)`` of inner corners: ``(squares_x - 1, squares_y - 1)``."""
        return self.squares_x - 1, self.squares_y - 1

    @property
    def n_corners(self) -> int:
        return (self.squares_x - 1) * (self.squares_y - 1)

    @property
    def size_m(self) -> tuple[float, float]:
        """Printed area ``(width, height)``, metres."""
        return self.squares_x * self.square_m, self.squares_y * self.square_m

    @property
    def corners_m(self) -> np.ndarray:
        """(n_corners, 3) corner positions in the target frame by id, metres (read-only)."""
        return self._corners  # type: ignore[attr-defined]

    def corner_points(self, ids: np.ndarray) -> np.ndarray:
        """(M, 3) target-frame positions (m) of corner ``ids``.

        Raises
        ------
        ValueError
            An id outside ``[0, n_corners)``, naming it.
        """
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_corners):
            bad = int(ids[(ids < 0) | (ids >= self.n_corners)][0])
            raise ValueError(f"corner id {bad} is not on this target (ids 0..{self.n_corners - 1})")
        return self.corners_m[ids.astype(np.intp)]

    def square_is_black(self, col: int, row: int) -> bool:
        """Colour of square ``(col, row)`` as printed."""
        return (col + row) % 2 == 0

    @property
    def n_markers(self) -> int:
        """ArUco markers on the board (one per white square; 0 for a chessboard)."""
        return (self.squares_x * self.squares_y) // 2 if self.kind == "charuco" else 0

    def describe(self) -> str:
        """One line for a person (``charuco 10x7, 25 mm squares, 18 mm DICT_5X5_100 markers``)."""
        s = f"{self.kind} {self.squares_x}x{self.squares_y}, {self.square_m / _MM:g} mm squares"
        if self.kind == "charuco":
            s += f", {self.marker_m / _MM:g} mm {self.dictionary} markers"  # type: ignore[operator]
        return s

    def to_dict(self) -> dict[str, Any]:
        """The ``[target]`` table (mm at the edge) with the file's hash: provenance."""
        d: dict[str, Any] = {"type": self.kind, "squares_x": self.squares_x, "squares_y": self.squares_y,
                             "square_mm": self.square_m / _MM}
        if self.kind == "charuco":
            d.update(marker_mm=self.marker_m / _MM, dictionary=self.dictionary,  # type: ignore[operator]
                     legacy_pattern=self.legacy_pattern)
        if self.flatness_m is not None:
            d["flatness_mm"] = self.flatness_m / _MM
        d["sha256"] = self.sha256
        return d


def _fail(key: str, why: str) -> TargetFileError:
    return TargetFileError(f"{key}: {why}", key=key)


def _validate(t: CalibrationTarget) -> None:
    if t.kind not in TARGET_TYPES:
        raise _fail("target.type", f"must be one of {', '.join(map(repr, TARGET_TYPES))}, got {t.kind!r}")
    for key in ("squares_x", "squares_y"):
        v = getattr(t, key)
        if isinstance(v, bool) or not isinstance(v, int) or not 2 <= v <= _MAX_SQUARES:
            raise _fail(f"target.{key}", f"must be an integer in [2, {_MAX_SQUARES}] (a board has inner corners), got {v!r}")
    if not (isinstance(t.square_m, float) and math.isfinite(t.square_m)  # mypy: float checked here
            and _MIN_SQUARE_MM * _MM <= t.square_m <= _MAX_SQUARE_MM * _MM):
        raise _fail("target.square_mm", f"must be in [{_MIN_SQUARE_MM}, {_MAX_SQUARE_MM}] mm, got "
                    f"{t.square_m / _MM!r} mm")
    if t.flatness_m is not None and not (math.isfinite(t.flatness_m) and 0.0 <= t.flatness_m < t.square_m):
        raise _fail("target.flatness_mm", f"must be >= 0 and below a square, got {t.flatness_m / _MM!r} mm")
    if t.kind == "chessboard":
        if t.marker_m is not None or t.dictionary is not None or t.legacy_pattern:
            key = "marker_mm" if t.marker_m is not None else "dictionary" if t.dictionary is not None else "legacy_pattern"
            raise _fail(f"target.{key}", "a chessboard has no markers (type = \"charuco\" for a ChArUco board)")
        if (t.squares_x + t.squares_y) % 2 == 0:
            raise _fail("target.squares_y", f"a chessboard needs one even and one odd side ({t.squares_x}x{t.squares_y}): "
                        "a symmetric board's corners cannot be numbered without ambiguity")
        return
    if t.marker_m is None:
        raise _fail("target.marker_mm", "required for a charuco board")
    if not (math.isfinite(t.marker_m) and 0.0 < t.marker_m < t.square_m):
        raise _fail("target.marker_mm", f"must be > 0 and below target.square_mm ({t.square_m / _MM:g}), "
                    f"got {t.marker_m / _MM!r}")
    if t.dictionary is None:
        raise _fail("target.dictionary", "required for a charuco board (OpenCV's name, e.g. \"DICT_5X5_100\")")
    if t.dictionary not in ARUCO_DICTIONARIES:
        raise _fail("target.dictionary", f"unknown dictionary {t.dictionary!r} (OpenCV's names: "
                    f"{', '.join(sorted(ARUCO_DICTIONARIES))})")
    need, have = (t.squares_x * t.squares_y) // 2, ARUCO_DICTIONARIES[t.dictionary]
    if need > have:
        raise _fail("target.dictionary", f"{t.dictionary} has {have} markers, a {t.squares_x}x{t.squares_y} "
                    f"board needs {need}")


_KEYS = ("type", "squares_x", "squares_y", "square_mm", "marker_mm", "dictionary", "legacy_pattern", "flatness_mm")


def _number(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise _fail(f"target.{key}", f"expected a finite number, got {v!r}")
    return float(v)


def parse_target(table: Mapping[str, Any], *, sha256: str | None = None, source: str = "<string>") -> CalibrationTarget:
    """A target from a parsed ``[target]`` table (mm at the edge; module docstring).

    Raises
    ------
    TargetFileError
        A missing, unknown or invalid key, named ``target.<key>``.
    """
    if not isinstance(table, Mapping):
        raise _fail("target", f"expected a table, got {type(table).__name__}")
    unknown = sorted(set(table) - set(_KEYS))
    if unknown:
        raise _fail(f"target.{unknown[0]}", f"unknown key (keys: {', '.join(_KEYS)})")
    for key in ("type", "squares_x", "squares_y", "square_mm"):
        if key not in table:
            raise _fail(f"target.{key}", "required key missing")
    kind = table["type"]
    if not isinstance(kind, str):
        raise _fail("target.type", f"expected a string, got {kind!r}")
    dictionary = table.get("dictionary")
    if dictionary is not None and not isinstance(dictionary, str):
        raise _fail("target.dictionary", f"expected a string, got {dictionary!r}")
    legacy = table.get("legacy_pattern", False)
    if not isinstance(legacy, bool):
        raise _fail("target.legacy_pattern", f"expected true or false, got {legacy!r}")
    marker = table.get("marker_mm")
    flat = table.get("flatness_mm")
    return CalibrationTarget(
        kind=kind,
        squares_x=table["squares_x"],
        squares_y=table["squares_y"],
        square_m=_number("square_mm", table["square_mm"]) * _MM,
        marker_m=None if marker is None else _number("marker_mm", marker) * _MM,
        dictionary=dictionary,
        legacy_pattern=legacy,
        flatness_m=None if flat is None else _number("flatness_mm", flat) * _MM,
        sha256=sha256,
        source=source,
    )


def target_from_toml(content: bytes | str, *, source: str = "<string>") -> CalibrationTarget:
    """A target from a target file's bytes (its sha256 recorded; module docstring).

    Raises
    ------
    TargetFileError
        Not UTF-8 TOML, no ``[target]`` table, other top-level keys, or a bad key (named).
    """
    raw = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    digest = hashlib.sha256(raw).hexdigest()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TargetFileError(f"{source}: not a valid TOML target file: {exc}") from exc
    if "target" not in data:
        raise _fail("target", f"{source}: required table [target] missing")
    extra = sorted(set(data) - {"target"})
    if extra:
        raise _fail(extra[0], f"unknown top-level key in {source} (a target file holds one [target] table)")
    return parse_target(data["target"], sha256=digest, source=source)
