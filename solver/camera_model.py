"""The pinhole camera with Brown-Conrady distortion, in OpenCV's convention (ADR 0022).

Model
-----
A point ``p`` in the target frame is seen at pixel ``(u, v)`` through ``camera_T_target``::

    (X, Y, Z) = R p + t                      camera frame: z along the optical axis, metres
    x = X / Z,  y = Y / Z,  r2 = x^2 + y^2   normalised image coordinates
    radial = 1 + k1 r2 + k2 r2^2 + k3 r2^3
    x_d = x radial + 2 p1 x y + p2 (r2 + 2 x^2)
    y_d = y radial + p1 (r2 + 2 y^2) + 2 p2 x y
    u = fx x_d + cx,  v = fy y_d + cy        pixels; (0, 0) is the centre of the first pixel

which is OpenCV's ``projectPoints`` with ``camera_matrix = [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``
(no skew) and ``dist_coeffs = (k1, k2, p1, p2, k3)``. The nine intrinsics are always ordered
:data:`PARAMETER_NAMES` = ``(fx, fy, cx, cy, k1, k2, p1, p2, k3)``: the order of every
covariance in :mod:`cellcal.solver.intrinsics`.

Jacobians
---------
:func:`project` returns, on request, the analytic derivatives of ``(u, v)`` with respect to
the intrinsics (``J_uv_intrinsics``, (..., 2, 9)), the pose (``J_uv_pose``, (..., 2, 6): a
right perturbation ``camera_T_target @ se3_exp(xi)``, ``xi = (rho, phi)`` in the *target*
frame, ADR 0004) and the point (``J_uv_point``, (..., 2, 3)). At ``xi = 0`` the perturbed
point is ``R (p + rho + phi x p) + t``, so ``d(X, Y, Z)/d rho = R`` and ``d/d phi = -R [p]x``.

Everything is batched: poses (..., 4, 4) and points (..., 3) broadcast against each other, so
one call projects every corner of every view (the hand-eye refinement of issue 27 calls it
with one pose per corner, gathered by view index).

Undistortion
------------
:func:`undistort` inverts the distortion by Newton's method on the 2x2 Jacobian (quadratic
convergence; the fixed-point iteration OpenCV uses converges only linearly and not at all
for strong distortion), started from the distorted point. A point is *converged* when the
distortion of its answer reproduces the input within ``tol`` (normalised units; the default
1e-12 is about 1e-9 px for ``fx`` = 1000) within ``max_iterations`` steps, and the
distortion's Jacobian there has a positive determinant (the model is locally one-to-one: past
the radius where the polynomial folds back, a "solution" exists but is not the ray the pixel
saw). Points that do not converge are NaN and flagged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "PARAMETER_NAMES",
    "N_PARAMETERS",
    "CameraModel",
    "Projection",
    "project",
    "distort",
    "undistort",
    "camera_matrix_from_parameters",
    "parameters_from_camera",
]

#: Order of the intrinsics in every parameter vector, Jacobian and covariance.
PARAMETER_NAMES = ("fx", "fy", "cx", "cy", "k1", "k2", "p1", "p2", "k3")
N_PARAMETERS = len(PARAMETER_NAMES)
#: Points closer to the camera plane than this (m) are "behind" the camera: no projection.
MIN_DEPTH_M = 1e-9


class Projection(NamedTuple):
    """Result of :func:`project`.

    Attributes
    ----------
    uv : numpy.ndarray, shape (..., 2)
        Pixel coordinates (NaN where ``in_front`` is false).
    in_front : numpy.ndarray of bool, shape (...)
        The point is in front of the camera (``Z > 0``).
    J_uv_intrinsics : numpy.ndarray, shape (..., 2, 9) or None
        ``d(u, v) / d(fx, fy, cx, cy, k1, k2, p1, p2, k3)``.
    J_uv_pose : numpy.ndarray, shape (..., 2, 6) or None
        ``d(u, v) / d xi`` for ``camera_T_target @ se3_exp(xi)``, ``xi = (rho, phi)`` (m, rad).
    J_uv_point : numpy.ndarray, shape (..., 2, 3) or None
        ``d(u, v) / d p`` (px per metre of the target-frame point).
    """

    uv: np.ndarray
    in_front: np.ndarray
    J_uv_intrinsics: np.ndarray | None = None
    J_uv_pose: np.ndarray | None = None
    J_uv_point: np.ndarray | None = None


def camera_matrix_from_parameters(params: np.ndarray) -> np.ndarray:
    """The 3x3 camera matrix (px) of a parameter vector ordered :data:`PARAMETER_NAMES`."""
    fx, fy, cx, cy = (float(v) for v in params[:4])
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def parameters_from_camera(camera_matrix: np.ndarray, dist_coeffs: np.ndarray) -> np.ndarray:
    """The (9,) parameter vector of a camera matrix and (k1, k2, p1, p2, k3)."""
    K = np.asarray(camera_matrix, dtype=float)
    d = np.asarray(dist_coeffs, dtype=float).reshape(-1)
    return np.array([K[0, 0], K[1, 1], K[0, 2], K[1, 2], *d[:5]])


def _check_params(params: np.ndarray) -> np.ndarray:
    p = np.asarray(params, dtype=float)
    if p.shape != (N_PARAMETERS,) or not np.all(np.isfinite(p)):
        raise ValueError(f"intrinsics must be {N_PARAMETERS} finite numbers {PARAMETER_NAMES}, got shape {p.shape}")
    if not (p[0] > 0 and p[1] > 0):
        raise ValueError(f"intrinsics: fx and fy must be > 0 px, got {p[0]!r}, {p[1]!r}")
    return p


def _distortion(params: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Distorted coordinates and the pieces the Jacobians reuse."""
    k1, k2, p1, p2, k3 = params[4:9]
    xx, yy, xy = x * x, y * y, x * y
    r2 = xx + yy
    r4 = r2 * r2
    r6 = r4 * r2
    radial = 1.0 + k1 * r2 + k2 * r4 + k3 * r6
    xd = x * radial + 2.0 * p1 * xy + p2 * (r2 + 2.0 * xx)
    yd = y * radial + p1 * (r2 + 2.0 * yy) + 2.0 * p2 * xy
    return xd, yd, r2, r4, r6, radial


def _distortion_jacobian(params: np.ndarray, x, y, r2, r4, radial):
    """``d(x_d, y_d) / d(x, y)`` as its four entries."""
    k1, k2, p1, p2, k3 = params[4:9]
    dr = k1 + 2.0 * k2 * r2 + 3.0 * k3 * r4  # d radial / d r2
    xy = x * y
    a = radial + 2.0 * x * x * dr + 2.0 * p1 * y + 6.0 * p2 * x
    b = 2.0 * xy * dr + 2.0 * p1 * x + 2.0 * p2 * y  # dxd/dy == dyd/dx
    d = radial + 2.0 * y * y * dr + 6.0 * p1 * y + 2.0 * p2 * x
    return a, b, b, d


def distort(params: np.ndarray, xy: np.ndarray) -> np.ndarray:
    """Pixels (..., 2) of normalised, undistorted image coordinates ``xy`` (..., 2)."""
    p = _check_params(params)
    xy = np.asarray(xy, dtype=float)
    xd, yd, *_ = _distortion(p, xy[..., 0], xy[..., 1])
    return np.stack([p[0] * xd + p[2], p[1] * yd + p[3]], axis=-1)


def project(
    params: np.ndarray,
    camera_T_target: np.ndarray,
    target_p: np.ndarray,
    *,
    jacobians: bool = False,
) -> Projection:
    """Project target-frame points into the image.

    Parameters
    ----------
    params : array_like, shape (9,)
        Intrinsics ordered :data:`PARAMETER_NAMES` (px, and unitless distortion).
    camera_T_target : array_like, shape (..., 4, 4)
        Pose of the target in the camera frame (metres); broadcast against ``target_p``.
    target_p : array_like, shape (..., 3)
        Points in the target frame, metres.
    jacobians : bool
        Also return the analytic Jacobians (module docstring).

    Returns
    -------
    Projection
        ``uv`` (..., 2) px, ``in_front`` (...) and, with ``jacobians``, the Jacobians.
        Points behind the camera have NaN pixels (and NaN Jacobians).
    """
    p = _check_params(params)
    T = np.asarray(camera_T_target, dtype=float)
    P = np.asarray(target_p, dtype=float)
    R = T[..., :3, :3]
    Pc = (R @ P[..., None])[..., 0] + T[..., :3, 3]
    Z = Pc[..., 2]
    in_front = Z > MIN_DEPTH_M
    iz = np.where(in_front, 1.0 / np.where(in_front, Z, 1.0), np.nan)
    x = Pc[..., 0] * iz
    y = Pc[..., 1] * iz
    fx, fy = p[0], p[1]
    xd, yd, r2, r4, r6, radial = _distortion(p, x, y)
    uv = np.stack([fx * xd + p[2], fy * yd + p[3]], axis=-1)
    if not jacobians:
        return Projection(uv, in_front)

    shape = x.shape
    Ji = np.zeros(shape + (2, N_PARAMETERS))
    Ji[..., 0, 0] = xd
    Ji[..., 1, 1] = yd
    Ji[..., 0, 2] = 1.0
    Ji[..., 1, 3] = 1.0
    xy = x * y
    for col, rk in ((4, r2), (5, r4), (8, r6)):
        Ji[..., 0, col] = fx * x * rk
        Ji[..., 1, col] = fy * y * rk
    Ji[..., 0, 6] = fx * 2.0 * xy
    Ji[..., 1, 6] = fy * (r2 + 2.0 * y * y)
    Ji[..., 0, 7] = fx * (r2 + 2.0 * x * x)
    Ji[..., 1, 7] = fy * 2.0 * xy

    # d(u, v)/d(X, Y, Z) = diag(fx, fy) D d(x, y)/d(X, Y, Z)
    a, b, c, d = _distortion_jacobian(p, x, y, r2, r4, radial)
    J_uv_xy = np.empty(shape + (2, 2))
    J_uv_xy[..., 0, 0] = fx * a
    J_uv_xy[..., 0, 1] = fx * b
    J_uv_xy[..., 1, 0] = fy * c
    J_uv_xy[..., 1, 1] = fy * d
    J_xy_P = np.zeros(shape + (2, 3))
    J_xy_P[..., 0, 0] = iz
    J_xy_P[..., 1, 1] = iz
    J_xy_P[..., 0, 2] = -x * iz
    J_xy_P[..., 1, 2] = -y * iz
    J_uv_P = J_uv_xy @ J_xy_P  # (..., 2, 3) per camera-frame metre
    J_point = J_uv_P @ np.broadcast_to(R, shape + (3, 3))
    J_pose = np.empty(shape + (2, 6))
    J_pose[..., :3] = J_point
    # d/d phi of R (p + phi x p) = -R [p]x, so J_uv_phi = -J_point [p]x
    Pb = np.broadcast_to(P, shape + (3,))
    px, py, pz = Pb[..., 0, None], Pb[..., 1, None], Pb[..., 2, None]
    j0, j1, j2 = J_point[..., 0], J_point[..., 1], J_point[..., 2]  # columns, (..., 2)
    # a row j times -[p]x, written out: (j2 py - j1 pz, j0 pz - j2 px, j1 px - j0 py)
    J_pose[..., 3] = j2 * py - j1 * pz
    J_pose[..., 4] = j0 * pz - j2 * px
    J_pose[..., 5] = j1 * px - j0 * py
    return Projection(uv, in_front, Ji, J_pose, J_point)


def undistort(
    params: np.ndarray,
    uv: np.ndarray,
    *,
    max_iterations: int = 20,
    tol: float = 1e-12,
) -> tuple[np.ndarray, np.ndarray]:
    """Normalised undistorted coordinates of pixels, by Newton's method.

    Parameters
    ----------
    params : array_like, shape (9,)
        Intrinsics ordered :data:`PARAMETER_NAMES`.
    uv : array_like, shape (..., 2)
        Pixel coordinates.
    max_iterations : int
        Newton steps at most.
    tol : float
        Convergence bound on the distortion's reproduction of the input, normalised units.

    Returns
    -------
    xy : numpy.ndarray, shape (..., 2)
        ``(X / Z, Y / Z)`` of the ray each pixel sees; NaN where not converged.
    converged : numpy.ndarray of bool, shape (...)
        Reproduced within ``tol`` in ``max_iterations`` steps where the model is one-to-one.
    """
    p = _check_params(params)
    uv = np.asarray(uv, dtype=float)
    xt = (uv[..., 0] - p[2]) / p[0]
    yt = (uv[..., 1] - p[3]) / p[1]
    x, y = xt.copy(), yt.copy()
    if not np.any(p[4:]):
        return np.stack([x, y], axis=-1), np.isfinite(x) & np.isfinite(y)
    for _ in range(int(max_iterations)):
        xd, yd, r2, r4, _r6, radial = _distortion(p, x, y)
        ex, ey = xt - xd, yt - yd
        if float(np.nanmax(np.abs(ex), initial=0.0)) <= tol and float(np.nanmax(np.abs(ey), initial=0.0)) <= tol:
            break
        a, b, c, d = _distortion_jacobian(p, x, y, r2, r4, radial)
        det = a * d - b * c
        with np.errstate(divide="ignore", invalid="ignore"):
            dx = (d * ex - b * ey) / det
            dy = (a * ey - c * ex) / det
        # A Newton step longer than the point's own radius (plus one) has left the region
        # where the polynomial is trustworthy: shorten it rather than jump to a fold.
        lim = 0.5 * (1.0 + np.sqrt(x * x + y * y))
        n = np.sqrt(dx * dx + dy * dy)
        s = np.where(n > lim, lim / np.where(n > 0, n, 1.0), 1.0)
        x = x + s * dx
        y = y + s * dy
    xd, yd, r2, r4, _r6, radial = _distortion(p, x, y)
    a, b, c, d = _distortion_jacobian(p, x, y, r2, r4, radial)
    ok = (np.abs(xt - xd) <= tol) & (np.abs(yt - yd) <= tol) & (a * d - b * c > 0)
    xy = np.stack([np.where(ok, x, np.nan), np.where(ok, y, np.nan)], axis=-1)
    return xy, ok


@dataclass(frozen=True, eq=False)
class CameraModel:
    """A calibrated (or true, simulated) camera: intrinsics and image size.

    Attributes
    ----------
    camera_matrix : numpy.ndarray, shape (3, 3)
        ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``, pixels (no skew).
    dist_coeffs : numpy.ndarray, shape (5,)
        ``(k1, k2, p1, p2, k3)``, OpenCV's order.
    image_size : tuple of int
        ``(width, height)`` in pixels.
    """

    camera_matrix: np.ndarray
    dist_coeffs: np.ndarray
    image_size: tuple[int, int]

    def __post_init__(self) -> None:
        K = np.array(self.camera_matrix, dtype=float)
        if K.shape != (3, 3) or not np.all(np.isfinite(K)):
            raise ValueError(f"camera_matrix must be a finite 3x3 array, got shape {K.shape}")
        if K[0, 1] != 0.0 or np.any(K[2] != (0.0, 0.0, 1.0)) or K[1, 0] != 0.0:
            raise ValueError("camera_matrix must be [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] (no skew)")
        d = np.array(self.dist_coeffs, dtype=float).reshape(-1)
        if d.shape == (4,):
            d = np.append(d, 0.0)
        if d.shape != (5,) or not np.all(np.isfinite(d)):
            raise ValueError(f"dist_coeffs must be 4 or 5 finite numbers (k1, k2, p1, p2[, k3]), got {d.shape}")
        w, h = self.image_size
        if not (isinstance(w, (int, np.integer)) and isinstance(h, (int, np.integer)) and w > 0 and h > 0):
            raise ValueError(f"image_size must be (width, height) positive integers, got {self.image_size!r}")
        _check_params(parameters_from_camera(K, d))
        K.setflags(write=False)
        d.setflags(write=False)
        object.__setattr__(self, "camera_matrix", K)
        object.__setattr__(self, "dist_coeffs", d)
        object.__setattr__(self, "image_size", (int(w), int(h)))

    @classmethod
    def from_parameters(cls, params: np.ndarray, image_size: tuple[int, int]) -> CameraModel:
        """The camera of a (9,) vector ordered :data:`PARAMETER_NAMES`."""
        p = _check_params(params)
        return cls(camera_matrix_from_parameters(p), p[4:9].copy(), image_size)

    @property
    def parameters(self) -> np.ndarray:
        """(9,) ``(fx, fy, cx, cy, k1, k2, p1, p2, k3)``."""
        return parameters_from_camera(self.camera_matrix, self.dist_coeffs)

    @property
    def width(self) -> int:
        return self.image_size[0]

    @property
    def height(self) -> int:
        return self.image_size[1]

    def project(self, camera_T_target: np.ndarray, target_p: np.ndarray, *, jacobians: bool = False) -> Projection:
        """:func:`project` with this camera's intrinsics."""
        return project(self.parameters, camera_T_target, target_p, jacobians=jacobians)

    def undistort(self, uv: np.ndarray, **kw) -> tuple[np.ndarray, np.ndarray]:
        """:func:`undistort` with this camera's intrinsics."""
        return undistort(self.parameters, uv, **kw)

    def in_image(self, uv: np.ndarray, margin_px: float = 0.0) -> np.ndarray:
        """Whether pixels (..., 2) lie inside the image (pixel centres from 0 to size - 1)."""
        uv = np.asarray(uv, dtype=float)
        w, h = self.image_size
        return ((uv[..., 0] >= -0.5 + margin_px) & (uv[..., 0] <= w - 0.5 - margin_px)
                & (uv[..., 1] >= -0.5 + margin_px) & (uv[..., 1] <= h - 0.5 - margin_px))
