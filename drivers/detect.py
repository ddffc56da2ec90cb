"""Finding the calibration target's corners in an image, through OpenCV (ADR 0021).

:class:`TargetDetector` turns one image into a :class:`Detection`: the corner ids of the
target (:mod:`cellcal.solver.target` numbers them) with their sub-pixel image positions, and
what else was seen (a ChArUco board's ArUco markers). It knows nothing of the camera's
intrinsics; the solver fits those and keeps every corner's residual
(:mod:`cellcal.solver.intrinsics`).

* **ChArUco**: ``cv2.aruco.CharucoDetector`` finds the markers, identifies them in the
  board's dictionary and interpolates the chessboard corners between them; a board seen in
  part still gives the corners around the markers found (with their true ids), which is what
  makes ChArUco the target to use for covering the image's edges.
* **Chessboard**: ``cv2.findChessboardCornersSB`` (the whole board must be visible). Its
  corner order is made ours: the grid is turned so its columns run along the target's x,
  and then by 180 degrees if the square the first corner closes is white (the target file
  requires an odd ``squares_x + squares_y``, so that colour decides).
* **Sub-pixel**: every corner is refined with ``cv2.cornerSubPix`` on the image in floating
  point (Mono16 keeps its depth), in a window of a third of the smallest distance between
  neighbouring corners (so the window never reaches the next corner), and for ChArUco at most
  0.8 of the white margin between a corner and the markers beside it (marker edges inside
  the window pull the corner), 2 to 11 px.

OpenCV (``opencv-python-headless``) is imported when a detector is built, not when this
module is: a missing install raises :class:`OpenCVUnavailable` with the line that installs it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cellcal.solver.errors import CellcalError
from cellcal.solver.target import CalibrationTarget, target_from_toml

__all__ = ["Detection", "TargetDetector", "OpenCVUnavailable", "load_target", "import_cv2", "OPENCV_REQUIREMENT"]

log = logging.getLogger(__name__)

#: The requirement line of pyproject.toml.
OPENCV_REQUIREMENT = "opencv-python-headless>=4.8,<5"
#: Sub-pixel window limits (half-size, px) and its share of the corner spacing.
_MIN_WIN_PX, _MAX_WIN_PX, _WIN_SHARE = 2, 11, 1.0 / 3.0


class OpenCVUnavailable(CellcalError, ImportError):
    """OpenCV's Python binding (``cv2``) is not installed or too old for the detector."""


def import_cv2() -> Any:
    """``cv2``, or :class:`OpenCVUnavailable` saying how to install it."""
    try:
        import cv2
    except ImportError as exc:
        raise OpenCVUnavailable(
            f"target detection needs OpenCV: pip install '{OPENCV_REQUIREMENT}' ({exc})") from exc
    if not hasattr(cv2, "aruco") or not hasattr(cv2.aruco, "CharucoDetector"):
        raise OpenCVUnavailable(f"OpenCV {cv2.__version__} has no cv2.aruco.CharucoDetector: "
                                f"pip install '{OPENCV_REQUIREMENT}'")
    return cv2


def load_target(path: str | Path) -> CalibrationTarget:
    """Read a target file (TOML, ``[target]``; :mod:`cellcal.solver.target`), hashing its bytes.

    Raises
    ------
    TargetFileError
        The file's content is invalid (the key named).
    OSError
        The file cannot be read.
    """
    p = Path(path)
    return target_from_toml(p.read_bytes(), source=str(p))


@dataclass(frozen=True, kw_only=True, eq=False)
class Detection:
    """The target's corners found in one image.

    Attributes
    ----------
    ids : numpy.ndarray of intp, shape (M,)
        Corner ids (:mod:`cellcal.solver.target`), ascending, unique.
    image_points_px : numpy.ndarray, shape (M, 2)
        Sub-pixel corner positions, pixels (``(0, 0)`` the centre of the first pixel).
    image_size : tuple of int
        ``(width, height)`` of the image.
    kind : str
        The target's kind (``"charuco"``, ``"chessboard"``).
    marker_ids : numpy.ndarray of int, shape (K,)
        ChArUco: the ArUco markers identified (empty for a chessboard).
    marker_corners_px : numpy.ndarray, shape (K, 4, 2)
        Their four corners, pixels.
    """

    ids: np.ndarray
    image_points_px: np.ndarray
    image_size: tuple[int, int]
    kind: str
    marker_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    marker_corners_px: np.ndarray = field(default_factory=lambda: np.zeros((0, 4, 2)))

    @property
    def n_corners(self) -> int:
        return int(self.ids.shape[0])

    @property
    def found(self) -> bool:
        """At least one corner was found."""
        return self.n_corners > 0

    def object_points(self, target: CalibrationTarget) -> np.ndarray:
        """(M, 3) target-frame positions (m) of the corners found."""
        return target.corner_points(self.ids)


def _gray(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8-bit image for the detectors and float32 image for the sub-pixel refinement."""
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[2] in (3, 4):
        a = a[..., :3].astype(np.float32) @ np.array([0.114, 0.587, 0.299], dtype=np.float32)  # BGR
    if a.ndim != 2:
        raise ValueError(f"image must be (H, W) or (H, W, 3), got shape {np.shape(image)}")
    f = a.astype(np.float32)
    if a.dtype == np.uint8:
        return a, f
    hi = float(np.percentile(f, 99.9)) if f.size else 1.0
    g8 = np.clip(f * (255.0 / max(hi, 1e-12)), 0, 255).astype(np.uint8)
    return g8, f


class TargetDetector:
    """Finds one target's corners in images.

    Parameters
    ----------
    target : CalibrationTarget
    subpixel : bool
        Refine every corner with ``cv2.cornerSubPix`` (module docstring).
    min_corners : int
        A detection with fewer corners is returned empty (a handful of corners interpolated
        from one or two markers carry little and are the least reliable).

    Raises
    ------
    OpenCVUnavailable
        ``cv2`` is missing or has no ChArUco detector.
    """

    def __init__(self, target: CalibrationTarget, *, subpixel: bool = True, min_corners: int = 4) -> None:
        self.cv2 = cv2 = import_cv2()
        self.target = target
        self.subpixel = bool(subpixel)
        self.min_corners = int(min_corners)
        self._charuco = None
        if target.kind == "charuco":
            dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, str(target.dictionary)))
            board = cv2.aruco.CharucoBoard((target.squares_x, target.squares_y), target.square_m,
                                           target.marker_m, dictionary)
            board.setLegacyPattern(bool(target.legacy_pattern))
            self.board = board
            self._charuco = cv2.aruco.CharucoDetector(board)

    def detect(self, image: np.ndarray) -> Detection:
        """Corners of the target in ``image`` ((H, W) uint8 / uint16 / float, or (H, W, 3) BGR).

        Returns an empty :class:`Detection` (``found`` false) when the target is not seen.
        """
        g8, gf = _gray(image)
        h, w = g8.shape
        size = (int(w), int(h))
        if self._charuco is not None:
            corners, ids, m_corners, m_ids = self._charuco.detectBoard(g8)
            mids = np.zeros(0, dtype=int) if m_ids is None else np.asarray(m_ids).reshape(-1).astype(int)
            mc = np.zeros((0, 4, 2)) if m_corners is None or len(m_corners) == 0 else \
                np.asarray(m_corners, dtype=float).reshape(-1, 4, 2)
            if ids is None or len(ids) < self.min_corners:
                return self._empty(size, mids, mc)
            cid = np.asarray(ids).reshape(-1).astype(np.intp)
            pts = np.asarray(corners, dtype=float).reshape(-1, 2)
        else:
            found = self._chessboard(g8)
            mids, mc = np.zeros(0, dtype=int), np.zeros((0, 4, 2))
            if found is None:
                return self._empty(size, mids, mc)
            pts = found
            cid = np.arange(pts.shape[0], dtype=np.intp)
        order = np.argsort(cid, kind="stable")
        cid, pts = cid[order], pts[order]
        keep = np.concatenate([[True], cid[1:] != cid[:-1]])
        cid, pts = cid[keep], pts[keep]
        if self.subpixel and pts.shape[0] >= 2:
            pts = self._refine(gf, pts)
        inside = (pts[:, 0] >= 0) & (pts[:, 0] <= w - 1) & (pts[:, 1] >= 0) & (pts[:, 1] <= h - 1)
        inside &= np.all(np.isfinite(pts), axis=1)
        cid, pts = cid[inside], pts[inside]
        if cid.shape[0] < self.min_corners:
            return self._empty(size, mids, mc)
        return Detection(ids=cid, image_points_px=pts, image_size=size, kind=self.target.kind,
                         marker_ids=mids, marker_corners_px=mc)

    def _empty(self, size: tuple[int, int], mids: np.ndarray, mc: np.ndarray) -> Detection:
        return Detection(ids=np.zeros(0, dtype=np.intp), image_points_px=np.zeros((0, 2)), image_size=size,
                         kind=self.target.kind, marker_ids=mids, marker_corners_px=mc)

    def _chessboard(self, g8: np.ndarray) -> np.ndarray | None:
        cv2 = self.cv2
        cols, rows = self.target.inner_corners
        flags = cv2.CALIB_CB_NORMALIZE_IMAGE | cv2.CALIB_CB_EXHAUSTIVE | cv2.CALIB_CB_ACCURACY
        found, corners = cv2.findChessboardCornersSB(g8, (cols, rows), flags=flags)
        if not found or corners is None:
            return None
        grid = np.asarray(corners, dtype=float).reshape(rows, cols, 2)
        # Handedness: the target's x cross y points away from the camera, which in the image
        # (u right, v down) is a positive u x v. A mirrored numbering is reversed along x.
        ex, ey = grid[0, -1] - grid[0, 0], grid[-1, 0] - grid[0, 0]
        if ex[0] * ey[1] - ex[1] * ey[0] < 0:
            grid = grid[:, ::-1]
        # 180 degrees: the square closed by corner 0 (its outer diagonal) must be black.
        c0, c1, cr = grid[0, 0], grid[0, 1], grid[1, 0]
        black = c0 - 0.5 * (c1 - c0) - 0.5 * (cr - c0)
        white = c0 + 0.5 * (c1 - c0) - 0.5 * (cr - c0)  # square (1, 0)
        if self._sample(g8, black) > self._sample(g8, white):
            grid = grid[::-1, ::-1]
        return grid.reshape(-1, 2)

    @staticmethod
    def _sample(img: np.ndarray, uv: np.ndarray) -> float:
        h, w = img.shape
        u = int(np.clip(round(float(uv[0])), 0, w - 1))
        v = int(np.clip(round(float(uv[1])), 0, h - 1))
        return float(img[max(v - 1, 0):v + 2, max(u - 1, 0):u + 2].mean())

    def _refine(self, gf: np.ndarray, pts: np.ndarray) -> np.ndarray:
        cv2 = self.cv2
        d = np.linalg.norm(pts[:, None, :] - pts[None, :, :], axis=2)
        np.fill_diagonal(d, np.inf)
        spacing = float(np.min(d))
        share = _WIN_SHARE
        t = self.target
        if t.kind == "charuco":
            # the window must stay inside the white margin between the corner and the markers
            share = min(share, 0.8 * (t.square_m - t.marker_m) / (2.0 * t.square_m))  # type: ignore[operator]
        half = int(np.clip(np.floor(share * spacing), _MIN_WIN_PX, _MAX_WIN_PX))
        crit = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 50, 1e-4)
        refined = cv2.cornerSubPix(gf, pts.astype(np.float32).reshape(-1, 1, 2).copy(), (half, half), (-1, -1), crit)
        out = np.asarray(refined, dtype=float).reshape(-1, 2)
        # A corner that wandered more than a window away found another feature: keep the
        # detector's position for it.
        moved = np.linalg.norm(out - pts, axis=1) > half
        out[moved] = pts[moved]
        return out
