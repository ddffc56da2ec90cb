"""Camera intrinsics from views of a planar target: Zhang's start, maximum likelihood on the image.

:func:`calibrate_intrinsics` (ADR 0022) takes per-view corner detections (ids and pixel
positions, :class:`cellcal.drivers.detect.Detection` or :class:`ViewCorners`) and the target
(:class:`~cellcal.solver.target.CalibrationTarget`), and returns an :class:`IntrinsicsResult`.

Model and estimator
-------------------
The camera of :mod:`cellcal.solver.camera_model` (pinhole, Brown-Conrady ``k1, k2, p1, p2,
k3``, OpenCV's convention). Corner noise is taken as independent, isotropic and Gaussian in
the image, so the maximum-likelihood estimate minimises the sum of squared reprojection
errors over all views, jointly in the nine intrinsics and every view's ``camera_T_target``.

* **Start** (Zhang): one homography per view (normalised DLT); the focal lengths from
  Zhang's two constraints per view (``r1 . r2 = 0``, ``|r1| = |r2|``) with the principal
  point at the image centre and no distortion, as OpenCV starts (a linear least-squares
  problem in ``1/fx^2`` and ``1/fy^2``); each view's pose from its homography, made a
  rotation by SVD.
* **Refinement**: Gauss-Newton with Levenberg-Marquardt damping after a rejected step, on
  the analytic Jacobians of the camera model; poses perturbed on the right (ADR 0004). The
  normal equations have an arrow structure (9 intrinsics, 6 per view, views independent
  given the intrinsics), solved through the Schur complement on the intrinsics: one 9x9
  solve and a batch of 6x6 inverses per iteration, everything per corner batched in numpy.
* **Covariance**: the inverse Fisher information, ``sigma^2 S^-1`` for the intrinsics
  (``S`` the Schur complement: the intrinsics' information with every pose marginalised
  out), in the order :data:`~cellcal.solver.camera_model.PARAMETER_NAMES` = ``(fx, fy, cx,
  cy, k1, k2, p1, p2, k3)``; each view's pose covariance (6x6, right perturbation, target
  frame) from the same block inverse. ``sigma`` is the caller's ``noise_px`` or, by default,
  estimated from the residuals (``sum r^2 / (2n - p)``); with a declared figure the residual
  is chi-square tested against it.
* **Held-out views**: k-fold (``holdout_folds``, default 5): each fold's views are left
  out, the intrinsics refitted on the rest, and every left-out view's pose fitted alone
  under those intrinsics; its RMS reprojection is the held-out figure. Folds start from the
  full solution (the minimum they reach is their own: the start only saves iterations).

Refusals (typed, :mod:`cellcal.solver.errors`)
----------------------------------------------
* :class:`~cellcal.solver.errors.NotEnoughSamples`: fewer than ``MIN_VIEWS`` views with at
  least ``MIN_VIEW_CORNERS`` corners each (views with fewer are dropped, with a warning), or
  fewer observations than unknowns.
* :class:`~cellcal.solver.errors.InsufficientTilt`: the target's normal must tilt away from
  the optical axis about both image axes. The figure is the RMS, over the views, of the
  normal's tilt component along its weakest image-plane direction (degrees): 0 for
  fronto-parallel views, and for views all tilted about one axis. Below ``min_tilt_deg``
  (default 5) the focal lengths, the principal point and the target's distance trade
  against each other within the noise.
* :class:`~cellcal.solver.errors.InsufficientCoverage`: the fraction of a 10 x 10 grid over
  the image holding a corner of some view, below ``min_coverage`` (default 0.25). Distortion
  is a polynomial in the radius: fitted near the centre it is extrapolated at the edges.

Warnings (:class:`~cellcal.solver.diagnostics.SolveWarning`): ``views_dropped``,
``coverage`` (below 0.5 of the grid), ``edges`` (no corner beyond 0.7 of the half-diagonal),
``noise`` (declared noise contradicted by the residuals), ``holdout`` (held-out RMS over 1.5x
the in-sample one), ``outliers`` (corners beyond 5 robust sigmas), ``flatness`` (the target's
declared flatness moves corners by more than the corner noise), ``not_converged``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from cellcal.solver import _camera_options as _options
from cellcal.solver import _stats
from cellcal.solver._camera_options import UNSET, Unset
from cellcal.solver.camera_model import N_PARAMETERS, PARAMETER_NAMES, CameraModel, camera_matrix_from_parameters, project
from cellcal.solver.diagnostics import SolveWarning
from cellcal.solver.errors import InsufficientCoverage, InsufficientTilt, NotEnoughSamples
from cellcal.solver.options import SolverOptions
from cellcal.solver.target import CalibrationTarget

__all__ = [
    "calibrate_intrinsics",
    "IntrinsicsResult",
    "ViewCorners",
    "CornerResiduals",
    "ImageCoverage",
    "IntrinsicsHoldout",
    "MIN_VIEWS",
    "MIN_VIEW_CORNERS",
    "DEFAULT_MIN_TILT_DEG",
    "DEFAULT_MIN_COVERAGE",
    "COVERAGE_GRID",
]

MIN_VIEWS = 3
MIN_VIEW_CORNERS = 6
DEFAULT_MIN_TILT_DEG = 5.0
DEFAULT_MIN_COVERAGE = 0.25
#: ``(columns, rows)`` of the coverage grid over the image.
COVERAGE_GRID = (10, 10)
_WARN_COVERAGE = 0.5
_WARN_RADIUS = 0.7
_WARN_HOLDOUT = 1.5
_OUTLIER_SIGMAS = 5.0
#: Level of the declared-noise chi-square test.
_NOISE_TEST_ALPHA = 0.005
_MAX_ITERATIONS = 100
#: Folds of the held-out check by default.
DEFAULT_HOLDOUT_FOLDS = 5
#: The fields of :class:`~cellcal.solver.SolverOptions` this solve cannot honour (a non-default
#: value is a ``ValueError``).
INTRINSICS_REFUSED_FIELDS = ("refine", "huber", "reject_k")
_DEFAULT_OPTIONS = SolverOptions()


class ViewCorners(NamedTuple):
    """One view's detected corners: ``ids`` (M,) and ``image_points_px`` (M, 2)."""

    ids: np.ndarray
    image_points_px: np.ndarray


class _HasCorners(Protocol):
    @property
    def ids(self) -> np.ndarray: ...

    @property
    def image_points_px(self) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True, eq=False)
class CornerResiduals:
    """Every corner the fit used, with its reprojection residual.

    Attributes
    ----------
    view : numpy.ndarray of intp, shape (n,)
        Index of the corner's view in the result's views (``IntrinsicsResult.views``).
    ids : numpy.ndarray of intp, shape (n,)
        Target corner id.
    image_points_px : numpy.ndarray, shape (n, 2)
        Detected position, px.
    residuals_px : numpy.ndarray, shape (n, 2)
        Detected minus reprojected, px.
    """

    view: np.ndarray
    ids: np.ndarray
    image_points_px: np.ndarray
    residuals_px: np.ndarray

    def __len__(self) -> int:
        return int(self.view.shape[0])

    @property
    def norm_px(self) -> np.ndarray:
        """(n,) residual length, px."""
        return np.hypot(self.residuals_px[:, 0], self.residuals_px[:, 1])

    def radial_px(self, camera_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each corner's distance from the principal point (px) and the radial component of
        its residual (px, outward positive): the radial residual plot's two axes."""
        c = np.array([camera_matrix[0, 2], camera_matrix[1, 2]])
        d = self.image_points_px - c
        r = np.hypot(d[:, 0], d[:, 1])
        with np.errstate(invalid="ignore", divide="ignore"):
            radial = np.where(r > 0, np.sum(d * self.residuals_px, axis=1) / r, 0.0)
        return r, radial


@dataclass(frozen=True, kw_only=True, eq=False)
class ImageCoverage:
    """How much of the image the corners of all views cover.

    Attributes
    ----------
    fraction : float
        Share of grid cells holding at least one corner.
    grid : tuple of int
        ``(columns, rows)``.
    occupied : numpy.ndarray of bool, shape (rows, columns)
    max_radius_fraction : float
        The farthest corner from the image centre, over the half-diagonal.
    """

    fraction: float
    grid: tuple[int, int]
    occupied: np.ndarray
    max_radius_fraction: float


@dataclass(frozen=True, kw_only=True, eq=False)
class IntrinsicsHoldout:
    """Reprojection of views held out of the intrinsics' fit.

    Attributes
    ----------
    method : str
        ``"k-fold refit"`` or ``"none"`` (too few views to leave some out).
    folds : int
    view_rms_px : numpy.ndarray, shape (V,)
        Each view's RMS reprojection (px) under intrinsics fitted without it, its own pose
        fitted alone (NaN with ``method == "none"``).
    rms_px : float
        RMS over all held-out corners.
    inflation : float
        ``rms_px`` over the in-sample RMS: near 1 for a sound fit.
    """

    method: str
    folds: int
    view_rms_px: np.ndarray
    rms_px: float
    inflation: float


@dataclass(frozen=True, kw_only=True, eq=False)
class IntrinsicsResult:
    """Camera intrinsics with their uncertainty and everything behind them.

    Attributes
    ----------
    camera_matrix : numpy.ndarray, shape (3, 3)
        ``[[fx, 0, cx], [0, fy, cy], [0, 0, 1]]``, px.
    dist_coeffs : numpy.ndarray, shape (5,)
        ``(k1, k2, p1, p2, k3)``.
    image_size : tuple of int
        ``(width, height)``.
    parameter_names : tuple of str
        :data:`~cellcal.solver.camera_model.PARAMETER_NAMES`, the order of ``parameters``,
        ``covariance`` and ``sigmas``.
    parameters : numpy.ndarray, shape (9,)
    covariance : numpy.ndarray, shape (9, 9)
        Of the intrinsics (px^2 and unitless); rows and columns of ``fixed`` parameters 0.
    fixed : tuple of str
        Parameters held at their start value (``fix=``).
    reprojection_rms_px : float
        RMS of the residual length over all corners.
    view_rms_px : numpy.ndarray, shape (V,)
    views : tuple of int
        Index in the caller's sequence of each view used (``view`` indices below refer to
        this order).
    views_dropped : tuple of int
        Caller's indices of views with too few corners.
    camera_T_target : numpy.ndarray, shape (V, 4, 4)
        Each view's pose, metres.
    camera_T_target_covariance : numpy.ndarray, shape (V, 6, 6)
        Right perturbation ``(rho, phi)`` in the target frame (ADR 0004), intrinsics'
        uncertainty included.
    view_tilt_deg : numpy.ndarray, shape (V,)
        Angle between each view's target normal and the optical axis.
    tilt_deg : float
        The tilt figure the refusal reads (module docstring).
    residuals : CornerResiduals
    coverage : ImageCoverage
    holdout : IntrinsicsHoldout
    noise_px : float
        Corner noise used for the covariance (1-sigma per image axis).
    noise_source : str
        ``"declared"`` or ``"estimated"``.
    chi2, dof : float, int
        Sum of squared residuals over ``noise_px^2``; observations minus unknowns.
    noise_p_value : float or None
        Declared noise: ``P(chi2_dof > chi2)``; None when estimated.
    n_views, n_corners : int
    converged : bool
    iterations : int
    stop_reason : str
    warnings : tuple of SolveWarning
    target : CalibrationTarget
    target_sha256 : str or None
        The target file's hash (provenance).
    """

    camera_matrix: np.ndarray
    dist_coeffs: np.ndarray
    image_size: tuple[int, int]
    parameter_names: tuple[str, ...]
    parameters: np.ndarray
    covariance: np.ndarray
    fixed: tuple[str, ...]
    reprojection_rms_px: float
    view_rms_px: np.ndarray
    views: tuple[int, ...]
    views_dropped: tuple[int, ...]
    camera_T_target: np.ndarray
    camera_T_target_covariance: np.ndarray
    view_tilt_deg: np.ndarray
    tilt_deg: float
    residuals: CornerResiduals
    coverage: ImageCoverage
    holdout: IntrinsicsHoldout
    noise_px: float
    noise_source: str
    chi2: float
    dof: int
    noise_p_value: float | None
    n_views: int
    n_corners: int
    converged: bool
    iterations: int
    stop_reason: str
    warnings: tuple[SolveWarning, ...]
    target: CalibrationTarget
    target_sha256: str | None

    @property
    def sigmas(self) -> np.ndarray:
        """(9,) 1-sigma of each intrinsic, in :attr:`parameter_names` order."""
        return np.sqrt(np.clip(np.diag(self.covariance), 0.0, None))

    @property
    def camera(self) -> CameraModel:
        """The calibrated camera as a :class:`~cellcal.solver.camera_model.CameraModel`."""
        return CameraModel(self.camera_matrix, self.dist_coeffs, self.image_size)

    def nees(self, true_parameters: np.ndarray) -> float:
        """Normalised estimation error squared of the free intrinsics against a truth
        (simulation): ``d^T C^-1 d`` over the parameters not fixed (mean = their number for
        an honest covariance)."""
        free = np.array([n not in self.fixed for n in PARAMETER_NAMES])
        d = (self.parameters - np.asarray(true_parameters, dtype=float))[free]
        C = self.covariance[np.ix_(free, free)]
        return float(d @ np.linalg.solve(C, d))


# -- batched SE(3) for the poses --------------------------------------------------------------


def _so3_exp_batch(phi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rotations (n, 3, 3) of rotation vectors (n, 3), with their hat matrices and squared angles."""
    th2 = np.einsum("ni,ni->n", phi, phi)
    th = np.sqrt(th2)
    small = th2 < 1e-8
    ths = np.where(small, 1.0, th)
    a = np.where(small, 1.0 - th2 / 6.0, np.sin(ths) / ths)
    b = np.where(small, 0.5 - th2 / 24.0, (1.0 - np.cos(ths)) / np.where(small, 1.0, th2))
    K = np.zeros(phi.shape[:-1] + (3, 3))
    K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -phi[..., 2], phi[..., 1], -phi[..., 0]
    K[..., 1, 0], K[..., 2, 0], K[..., 2, 1] = phi[..., 2], -phi[..., 1], phi[..., 0]
    return np.eye(3) + a[:, None, None] * K + b[:, None, None] * (K @ K), K, th2


def _se3_exp_batch(xi: np.ndarray) -> np.ndarray:
    """(n, 4, 4) group exponentials of twists (n, 6) ordered ``(rho, phi)``."""
    R, K, th2 = _so3_exp_batch(xi[:, 3:])
    th = np.sqrt(th2)
    small = th2 < 1e-8
    ths = np.where(small, 1.0, th)
    a = np.where(small, 0.5 - th2 / 24.0, (1.0 - np.cos(ths)) / np.where(small, 1.0, th2))
    b = np.where(small, 1.0 / 6.0 - th2 / 120.0, (ths - np.sin(ths)) / (np.where(small, 1.0, th2) * ths))
    Vm = np.eye(3) + a[:, None, None] * K + b[:, None, None] * (K @ K)
    T = np.zeros((xi.shape[0], 4, 4))
    T[:, :3, :3] = R
    T[:, :3, 3] = np.einsum("nij,nj->ni", Vm, xi[:, :3])
    T[:, 3, 3] = 1.0
    return T


# -- start: Zhang's homographies --------------------------------------------------------------


def _homography(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``dst ~ H src`` (points (m, 2)) by the normalised DLT."""

    def norm(p):
        c = p.mean(axis=0)
        s = math.sqrt(2.0) / max(float(np.mean(np.linalg.norm(p - c, axis=1))), 1e-12)
        return np.array([[s, 0, -s * c[0]], [0, s, -s * c[1]], [0, 0, 1.0]])

    Ts, Td = norm(src), norm(dst)
    s = src @ Ts[:2, :2].T + Ts[:2, 2]
    d = dst @ Td[:2, :2].T + Td[:2, 2]
    m = src.shape[0]
    A = np.zeros((2 * m, 9))
    A[0::2, 0:2], A[0::2, 2] = s, 1.0
    A[0::2, 6:8], A[0::2, 8] = -d[:, :1] * s, -d[:, 0]
    A[1::2, 3:5], A[1::2, 5] = s, 1.0
    A[1::2, 6:8], A[1::2, 8] = -d[:, 1:] * s, -d[:, 1]
    H = np.linalg.svd(A, full_matrices=False)[2][-1].reshape(3, 3)
    H = np.linalg.solve(Td, H @ Ts)
    return H / H[2, 2] if abs(H[2, 2]) > 1e-12 else H


def _initial_focal(Hs: list[np.ndarray], cx: float, cy: float) -> tuple[float, float]:
    """fx, fy from Zhang's constraints with the principal point at (cx, cy)."""
    Tc = np.array([[1, 0, -cx], [0, 1, -cy], [0, 0, 1.0]])
    rows, rhs = [], []
    for H in Hs:
        G = Tc @ H
        G = G / np.linalg.norm(G[:, :2])
        h1, h2 = G[:, 0], G[:, 1]
        rows.append([h1[0] * h2[0], h1[1] * h2[1]])
        rhs.append(-h1[2] * h2[2])
        rows.append([h1[0] ** 2 - h2[0] ** 2, h1[1] ** 2 - h2[1] ** 2])
        rhs.append(-(h1[2] ** 2 - h2[2] ** 2))
    A, b = np.array(rows), np.array(rhs)
    ab = np.linalg.lstsq(A, b, rcond=None)[0]
    if np.all(ab > 0):
        return 1.0 / math.sqrt(ab[0]), 1.0 / math.sqrt(ab[1])
    # one focal length for both axes (the aspect ratio is the weaker figure)
    a1 = A.sum(axis=1)
    c = float(a1 @ b) / max(float(a1 @ a1), 1e-300)
    if c > 0:
        f = 1.0 / math.sqrt(c)
        return f, f
    raise ValueError("no focal length fits the views' homographies")


def _pose_from_homography(K: np.ndarray, H: np.ndarray) -> np.ndarray:
    M = np.linalg.solve(K, H)
    lam = 2.0 / (np.linalg.norm(M[:, 0]) + np.linalg.norm(M[:, 1]))
    if M[2, 2] * lam < 0:  # the target in front of the camera
        lam = -lam
    r1, r2, t = lam * M[:, 0], lam * M[:, 1], lam * M[:, 2]
    R = np.column_stack([r1, r2, np.cross(r1, r2)])
    U, _, Vt = np.linalg.svd(R)
    R = U @ np.diag([1.0, 1.0, np.linalg.det(U @ Vt)]) @ Vt
    T = np.eye(4)
    T[:3, :3], T[:3, 3] = R, t
    return T


# -- refinement ---------------------------------------------------------------------------------


class _Problem:
    """Corners of the fitted views, sorted by view, and the arrow-structured normal equations."""

    def __init__(self, obj: np.ndarray, img: np.ndarray, view: np.ndarray, n_views: int, free: np.ndarray) -> None:
        self.obj, self.img, self.view, self.nv = obj, img, view, n_views
        self.starts = np.searchsorted(view, np.arange(n_views))
        self.free = free.astype(float)

    def residual(self, params: np.ndarray, poses: np.ndarray) -> np.ndarray:
        return self.img - project(params, poses[self.view], self.obj).uv

    def normal(self, params: np.ndarray, poses: np.ndarray):
        pr = project(params, poses[self.view], self.obj, jacobians=True)
        r = self.img - pr.uv
        assert pr.J_uv_intrinsics is not None and pr.J_uv_pose is not None
        Ji = pr.J_uv_intrinsics * self.free
        Jp = pr.J_uv_pose
        st = self.starts
        # matmul, not einsum: several times faster for these small batched products
        Jif = Ji.reshape(-1, N_PARAMETERS)
        U = Jif.T @ Jif
        JpT = Jp.swapaxes(1, 2)
        V = np.add.reduceat(JpT @ Jp, st, axis=0)
        W = np.add.reduceat(Ji.swapaxes(1, 2) @ Jp, st, axis=0)
        gi = Jif.T @ r.reshape(-1)
        gp = np.add.reduceat((JpT @ r[:, :, None])[:, :, 0], st, axis=0)
        return r, U, V, W, gi, gp

    def solve(self, U, V, W, gi, gp, lam: float):
        fixed = self.free == 0
        Ud = U + lam * np.diag(np.diag(U))
        Ud[fixed, fixed] = 1.0
        Vd = V + lam * (np.eye(6) * np.einsum("nii->ni", V)[:, :, None])
        Vinv = np.linalg.inv(Vd)
        WVi = W @ Vinv  # (nv, 9, 6)
        S = Ud - np.einsum("nij,nkj->ik", WVi, W)
        rhs = gi - np.einsum("nij,nj->i", WVi, gp)
        rhs[fixed] = 0.0
        di = np.linalg.solve(S, rhs)
        dp = np.einsum("nij,nj->ni", Vinv, gp - np.einsum("nji,j->ni", W, di))
        return di, dp, S, Vinv


def _refine(prob: _Problem, params: np.ndarray, poses: np.ndarray, max_iter: int):
    """Levenberg-Marquardt; returns params, poses, iterations, converged, stop_reason."""
    cost = 0.5 * float(np.sum(prob.residual(params, poses) ** 2))
    lam = 0.0
    it = 0
    stop = "iteration limit"
    converged = False
    rejected = 0
    while it < max_iter:
        it += 1
        r, U, V, W, gi, gp = prob.normal(params, poses)
        di, dp, _S, _Vi = prob.solve(U, V, W, gi, gp, lam)
        # decrease the linear model predicts for this step
        pred = float(di @ gi + np.sum(dp * gp)) - 0.5 * (
            float(di @ U @ di) + 2.0 * float(np.einsum("i,nij,nj->", di, W, dp))
            + float(np.einsum("ni,nij,nj->", dp, V, dp)))
        new_params = params + di
        new_poses = poses @ _se3_exp_batch(dp)
        if not np.all(np.isfinite(new_params)) or new_params[0] <= 0 or new_params[1] <= 0:
            new_cost = math.inf
        else:
            new_cost = 0.5 * float(np.sum(prob.residual(new_params, new_poses) ** 2))
        if new_cost <= cost:
            params, poses = new_params, new_poses
            done = cost - new_cost <= 1e-12 * cost or pred <= 1e-14 * max(cost, 1e-300)
            cost = new_cost
            lam = 0.0 if lam < 1e-6 else lam / 4.0
            rejected = 0
            if done:
                converged, stop = True, "converged"
                break
        else:
            if pred <= 1e-14 * max(cost, 1e-300) or cost <= 1e-24:
                converged, stop = True, "converged at the rounding floor"
                break
            rejected += 1
            if rejected >= 12:
                stop = "stalled"
                break
            lam = 1e-4 if lam == 0.0 else lam * 8.0
    return params, poses, it, converged, stop


def _fit_poses(params: np.ndarray, obj: np.ndarray, img: np.ndarray, view: np.ndarray, poses: np.ndarray,
               max_iter: int = 30) -> np.ndarray:
    """Every view's pose under fixed intrinsics: the same solver with no intrinsic free (the
    views then decouple, and one batched 6x6 solve per view and iteration does them all)."""
    prob = _Problem(obj, img, view, poses.shape[0], np.zeros(N_PARAMETERS, dtype=bool))
    return _refine(prob, params, poses, max_iter)[1]


# -- checks ---------------------------------------------------------------------------------


def _check_views(views: Sequence[_HasCorners | tuple], target: CalibrationTarget):
    out = []
    for i, v in enumerate(views):
        if isinstance(v, tuple):
            ids, pts = v
        else:
            ids, pts = v.ids, v.image_points_px
        ids = np.asarray(ids)
        pts = np.asarray(pts, dtype=float)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"view {i}: ids must be a 1-D integer array, got shape {ids.shape} dtype {ids.dtype}")
        if pts.shape != (ids.shape[0], 2):
            raise ValueError(f"view {i}: image_points_px must have shape ({ids.shape[0]}, 2), got {pts.shape}")
        if not np.all(np.isfinite(pts)):
            raise ValueError(f"view {i}: image points contain NaN or inf")
        if ids.size and (ids.min() < 0 or ids.max() >= target.n_corners):
            raise ValueError(f"view {i}: corner ids must be in [0, {target.n_corners}) for {target.describe()}")
        if np.unique(ids).size != ids.size:
            raise ValueError(f"view {i}: a corner id appears twice")
        out.append((ids.astype(np.intp), pts))
    return out


def _coverage(img: np.ndarray, image_size: tuple[int, int]) -> ImageCoverage:
    w, h = image_size
    gc, gr = COVERAGE_GRID
    occ = np.zeros((gr, gc), dtype=bool)
    if img.shape[0]:
        ci = np.clip((img[:, 0] + 0.5) / w * gc, 0, gc - 1).astype(int)
        ri = np.clip((img[:, 1] + 0.5) / h * gr, 0, gr - 1).astype(int)
        occ[ri, ci] = True
    centre = np.array([(w - 1) / 2.0, (h - 1) / 2.0])
    half_diag = 0.5 * math.hypot(w, h)
    rmax = float(np.max(np.linalg.norm(img - centre, axis=1))) / half_diag if img.shape[0] else 0.0
    return ImageCoverage(fraction=float(occ.mean()), grid=(gc, gr), occupied=occ, max_radius_fraction=rmax)


def _tilt(poses: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """Per-view tilt (deg), the weakest-direction RMS tilt (deg) and that direction."""
    n = poses[:, :3, 2]  # target z in the camera frame
    tilt = np.degrees(np.arccos(np.clip(np.abs(n[:, 2]), 0.0, 1.0)))
    nxy = n[:, :2]
    M = nxy.T @ nxy / max(nxy.shape[0], 1)
    evals, evecs = np.linalg.eigh(M)
    weak = float(np.degrees(np.arcsin(min(1.0, math.sqrt(max(evals[0], 0.0))))))
    return tilt, weak, evecs[:, 0]


# -- the calibration -------------------------------------------------------------------------


def calibrate_intrinsics(
    views: Sequence[_HasCorners | tuple[np.ndarray, np.ndarray]],
    target: CalibrationTarget,
    image_size: tuple[int, int],
    *,
    options: SolverOptions | None = None,
    noise_px: float | None = None,
    fix: Sequence[str] = (),
    initial: np.ndarray | None = None,
    holdout_folds: int | Unset = UNSET,
    min_views: int = MIN_VIEWS,
    min_tilt_deg: float = DEFAULT_MIN_TILT_DEG,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
    max_iterations: int | Unset = UNSET,
) -> IntrinsicsResult:
    """Calibrate a camera's intrinsics from views of a planar target (module docstring).

    Parameters
    ----------
    views : sequence
        Per view: an object with ``ids`` (M,) and ``image_points_px`` (M, 2) (a
        :class:`cellcal.drivers.detect.Detection`, a :class:`ViewCorners`) or a tuple
        ``(ids, image_points_px)``. Pixel ``(0, 0)`` is the centre of the first pixel.
    target : CalibrationTarget
        Gives each corner id its position on the target.
    image_size : (int, int)
        ``(width, height)``, px.
    options : SolverOptions, optional
        The shared record (:class:`~cellcal.solver.SolverOptions`, whose fields are
        documented there). It fills ``holdout_folds`` and ``max_iterations`` when they are
        not given (a keyword given overrides it): ``holdout=False`` is no fold, ``True``
        the default 5; ``max_iterations`` when not at the record's own default (20, the
        pose solves' budget). Ignored (nothing here for them to act on, so one record
        serves a cell): the robot's and the AX=XB solve's fields (``pairs``,
        ``translation``, ``min_axis_spread``, ``min_rotation_rad``, ``min_point_spread``,
        ``max_reach_m``, ``max_target_offset_m``, ``robot_accuracy_m``), the prior
        tolerances (``expected_tolerance_m``, ``expected_tolerance_rad``), ``uncertainty``
        (the covariance is always computed) and the tracker's noise (``noise_translation_m``,
        ``noise_rotation_rad``: the measurements are corners, ``noise_px``). Refused, a
        ``ValueError`` naming the field and this function, when not at its default:
        ``refine`` (always refined), ``huber`` and ``reject_k`` (plain least squares).
    noise_px : float, optional
        Declared corner noise (1-sigma per axis, px); estimated from the residuals if omitted.
    fix : sequence of str
        Parameters held at their start value (names of
        :data:`~cellcal.solver.camera_model.PARAMETER_NAMES`; e.g. ``("k3",)`` for a lens
        whose sixth-order term the data cannot determine, ``("p1", "p2")``).
    initial : array_like, shape (9,), optional
        Start intrinsics (else Zhang's start with no distortion); fixed parameters keep
        their value from it (0 for distortion without it).
    holdout_folds : int
        Folds of the held-out check (0: none); default 5, or 0 with the record's
        ``holdout=False``.
    min_views, min_tilt_deg, min_coverage : float
        Refusal thresholds (module docstring).
    max_iterations : int
        Iterations of the refinement at most; default 100, or the record's when it is not
        at its own default.

    Returns
    -------
    IntrinsicsResult

    Raises
    ------
    NotEnoughSamples, InsufficientTilt, InsufficientCoverage
        The views cannot determine the intrinsics (module docstring).
    ValueError
        Malformed input, naming the view; a field of ``options`` this solve cannot honour,
        naming it.
    TypeError
        ``options`` is not a :class:`~cellcal.solver.SolverOptions`.
    """
    o = _options.record("calibrate_intrinsics", options)
    _options.refuse("calibrate_intrinsics", o, INTRINSICS_REFUSED_FIELDS)
    if isinstance(holdout_folds, Unset):
        holdout_folds = DEFAULT_HOLDOUT_FOLDS if o.holdout else 0
    if isinstance(max_iterations, Unset):
        # the record's default is the pose solves' budget; this fit has its own
        max_iterations = _MAX_ITERATIONS if o.max_iterations == _DEFAULT_OPTIONS.max_iterations else o.max_iterations
    w, h = (int(image_size[0]), int(image_size[1]))
    if w <= 0 or h <= 0:
        raise ValueError(f"image_size must be positive (width, height), got {image_size!r}")
    unknown = [n for n in fix if n not in PARAMETER_NAMES]
    if unknown:
        raise ValueError(f"fix: unknown parameter {unknown[0]!r} (names: {', '.join(PARAMETER_NAMES)})")
    if initial is None and set(fix) & set(PARAMETER_NAMES[:4]):
        raise ValueError(f"fix: holding {sorted(set(fix) & set(PARAMETER_NAMES[:4]))} needs initial= (their values)")
    free = np.array([n not in fix for n in PARAMETER_NAMES])
    if noise_px is not None and not (math.isfinite(noise_px) and noise_px > 0):
        raise ValueError(f"noise_px must be > 0, got {noise_px!r}")
    checked = _check_views(views, target)
    warnings: list[SolveWarning] = []
    used = [i for i, (ids, _) in enumerate(checked) if ids.shape[0] >= MIN_VIEW_CORNERS]
    dropped = tuple(i for i in range(len(checked)) if i not in used)
    if dropped:
        warnings.append(SolveWarning(
            code="views_dropped", value=float(len(dropped)),
            message=f"{len(dropped)} view(s) with fewer than {MIN_VIEW_CORNERS} corners not used: {list(dropped)}"))
    if len(used) < min_views:
        raise NotEnoughSamples(len(used), min_views, "intrinsics", hint=(
            f"views of the target with at least {MIN_VIEW_CORNERS} corners each, tilted about both image axes"))
    nv = len(used)
    obj = np.concatenate([target.corner_points(checked[i][0]) for i in used])
    img = np.concatenate([checked[i][1] for i in used])
    ids_all = np.concatenate([checked[i][0] for i in used])
    view = np.concatenate([np.full(checked[i][0].shape[0], k, dtype=np.intp) for k, i in enumerate(used)])
    n = img.shape[0]
    n_unknowns = int(free.sum()) + 6 * nv
    if 2 * n <= n_unknowns:
        raise NotEnoughSamples(nv, nv + 1, "intrinsics", hint=(
            f"{2 * n} observations for {n_unknowns} unknowns: more corners per view"))

    coverage = _coverage(img, (w, h))
    if coverage.fraction < min_coverage:
        raise InsufficientCoverage(
            f"intrinsics: the corners cover {coverage.fraction:.0%} of the image "
            f"({COVERAGE_GRID[0]}x{COVERAGE_GRID[1]} grid), at least {min_coverage:.0%} needed: "
            "move the target toward the image's edges and corners",
            coverage=coverage.fraction, required=min_coverage, grid=COVERAGE_GRID)

    # Zhang's start
    starts = np.searchsorted(view, np.arange(nv))
    ends = np.append(starts[1:], n)
    Hs = [_homography(obj[a:b, :2], img[a:b]) for a, b in zip(starts, ends, strict=True)]
    if initial is not None:
        params = np.array(initial, dtype=float).reshape(N_PARAMETERS)
    else:
        cx0, cy0 = (w - 1) / 2.0, (h - 1) / 2.0
        try:
            fx0, fy0 = _initial_focal(Hs, cx0, cy0)
        except ValueError:
            fx0 = fy0 = float(max(w, h))
        params = np.array([fx0, fy0, cx0, cy0, 0, 0, 0, 0, 0], dtype=float)
    K0 = camera_matrix_from_parameters(params)
    poses = np.stack([_pose_from_homography(K0, H) for H in Hs])
    tilt, weak, axis = _tilt(poses)
    if weak < min_tilt_deg:
        raise InsufficientTilt(
            f"intrinsics: the target tilts {weak:.1f} deg (RMS over {nv} views) about its weakest image "
            f"direction ({axis[0]:+.2f}, {axis[1]:+.2f}), at least {min_tilt_deg:g} deg needed "
            f"(largest view tilt {float(tilt.max()):.1f} deg): tilt the target about both image axes",
            tilt_deg=weak, required_deg=min_tilt_deg, axis=axis, view_tilt_deg=tuple(tilt))
    # each pose alone under the start intrinsics: the joint fit then starts near its basin
    poses = _fit_poses(params, obj, img, view, poses, max_iter=10)

    prob = _Problem(obj, img, view, nv, free)
    params, poses, iterations, converged, stop = _refine(prob, params, poses, max_iterations)
    if not converged:
        warnings.append(SolveWarning(code="not_converged", value=float(iterations),
                                     message=f"intrinsics refinement did not converge ({stop} after {iterations} iterations)"))
    r, U, V, W, gi, gp = prob.normal(params, poses)
    _di, _dp, S, Vinv = prob.solve(U, V, W, gi, gp, 0.0)
    ssr = float(np.sum(r * r))
    dof = 2 * n - n_unknowns
    if noise_px is None:
        sigma = math.sqrt(ssr / dof)
        source, p_value = "estimated", None
    else:
        sigma, source = float(noise_px), "declared"
        p_value = _stats.chi2_sf(ssr / sigma**2, dof)
        if p_value < _NOISE_TEST_ALPHA:
            ratio = math.sqrt(ssr / dof) / sigma
            warnings.append(SolveWarning(
                code="noise", value=ratio,
                message=(f"reprojection residuals are {ratio:.2f}x the declared corner noise of {sigma:.3g} px "
                         f"(chi2 {ssr / sigma**2:.0f} for {dof} dof): the camera model or the detections are "
                         "not what the noise figure says")))
    chi2 = ssr / sigma**2
    Sinv = np.linalg.inv(S)
    Sinv[~free, :] = 0.0
    Sinv[:, ~free] = 0.0
    cov = sigma**2 * Sinv
    WVi = W @ Vinv
    pose_cov = sigma**2 * (Vinv + np.einsum("nji,jk,nkl->nil", WVi, Sinv, WVi))

    res_norm2 = np.sum(r * r, axis=1)
    view_rms = np.sqrt(np.add.reduceat(res_norm2, starts) / np.diff(np.append(starts, n)))
    rms = math.sqrt(float(res_norm2.mean()))
    tilt, weak, _axis = _tilt(poses)

    holdout = _holdout(prob, params, poses, holdout_folds, min_views, max_iterations, rms)
    if holdout.method != "none" and holdout.inflation > _WARN_HOLDOUT:
        warnings.append(SolveWarning(
            code="holdout", value=holdout.inflation,
            message=(f"held-out views reproject at {holdout.rms_px:.3f} px RMS, {holdout.inflation:.2f}x the fit's "
                     f"{rms:.3f} px: the intrinsics lean on particular views")))
    if coverage.fraction < _WARN_COVERAGE:
        warnings.append(SolveWarning(
            code="coverage", value=coverage.fraction,
            message=f"corners cover {coverage.fraction:.0%} of the image: distortion is extrapolated elsewhere"))
    if coverage.max_radius_fraction < _WARN_RADIUS:
        warnings.append(SolveWarning(
            code="edges", value=coverage.max_radius_fraction,
            message=(f"no corner beyond {coverage.max_radius_fraction:.0%} of the half-diagonal: "
                     "the image's corners rely on extrapolated distortion")))
    robust = 1.4826 * float(np.median(np.abs(r))) if n else 0.0
    if robust > 0:
        outl = np.flatnonzero(np.sqrt(res_norm2) > _OUTLIER_SIGMAS * robust * math.sqrt(2.0))
        if outl.size:
            warnings.append(SolveWarning(
                code="outliers", value=float(outl.size),
                message=(f"{outl.size} corner(s) beyond {_OUTLIER_SIGMAS:g} robust sigmas "
                         f"(views {sorted({int(used[view[i]]) for i in outl})}): misdetections or a bent target")))
    if target.flatness_m is not None and target.flatness_m > 0:
        depth = np.median(poses[:, 2, 3])
        shift = float(params[0]) * target.flatness_m / max(float(depth), 1e-9) * math.sin(math.radians(float(np.median(tilt))))
        if shift > sigma:
            warnings.append(SolveWarning(
                code="flatness", value=shift,
                message=(f"the target's flatness ({target.flatness_m * 1e3:.3g} mm) moves corners by about "
                         f"{shift:.2f} px at the median view, more than the corner noise ({sigma:.3f} px): "
                         "the intrinsics carry the board's bending")))

    return IntrinsicsResult(
        camera_matrix=camera_matrix_from_parameters(params),
        dist_coeffs=params[4:9].copy(),
        image_size=(w, h),
        parameter_names=PARAMETER_NAMES,
        parameters=params,
        covariance=cov,
        fixed=tuple(n for n in PARAMETER_NAMES if n in fix),
        reprojection_rms_px=rms,
        view_rms_px=view_rms,
        views=tuple(used),
        views_dropped=dropped,
        camera_T_target=poses,
        camera_T_target_covariance=pose_cov,
        view_tilt_deg=tilt,
        tilt_deg=weak,
        residuals=CornerResiduals(view=view, ids=ids_all, image_points_px=img, residuals_px=r),
        coverage=coverage,
        holdout=holdout,
        noise_px=sigma,
        noise_source=source,
        chi2=chi2,
        dof=dof,
        noise_p_value=p_value,
        n_views=nv,
        n_corners=n,
        converged=converged,
        iterations=iterations,
        stop_reason=stop,
        warnings=tuple(warnings),
        target=target,
        target_sha256=target.sha256,
    )


def _holdout(prob: _Problem, params: np.ndarray, poses: np.ndarray, folds: int, min_views: int,
             max_iterations: int, rms: float) -> IntrinsicsHoldout:
    nv = prob.nv
    k = min(int(folds), nv)
    if k < 2 or nv - math.ceil(nv / k) < min_views:
        return IntrinsicsHoldout(method="none", folds=0, view_rms_px=np.full(nv, np.nan), rms_px=math.nan,
                                 inflation=math.nan)
    view_rms = np.zeros(nv)
    sq, cnt = 0.0, 0
    for f in range(k):
        out = np.arange(f, nv, k)
        keep = np.setdiff1d(np.arange(nv), out)
        remap = np.full(nv, -1, dtype=np.intp)
        remap[keep] = np.arange(keep.size)
        m = remap[prob.view] >= 0
        sub = _Problem(prob.obj[m], prob.img[m], remap[prob.view[m]], keep.size, prob.free > 0)
        p_f, _poses_f, *_ = _refine(sub, params.copy(), poses[keep].copy(), max_iterations)
        remap[:] = -1
        remap[out] = np.arange(out.size)
        m = remap[prob.view] >= 0
        o_view = remap[prob.view[m]]
        T = _fit_poses(p_f, prob.obj[m], prob.img[m], o_view, poses[out].copy())
        e2 = np.sum((prob.img[m] - project(p_f, T[o_view], prob.obj[m]).uv) ** 2, axis=1)
        per = np.bincount(o_view, weights=e2, minlength=out.size) / np.bincount(o_view, minlength=out.size)
        view_rms[out] = np.sqrt(per)
        sq += float(e2.sum())
        cnt += int(e2.size)
    hr = math.sqrt(sq / cnt)
    return IntrinsicsHoldout(method="k-fold refit", folds=k, view_rms_px=view_rms, rms_px=hr,
                             inflation=hr / rms if rms > 0 else math.inf)
