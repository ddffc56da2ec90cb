"""Hand-eye calibration with a camera, refined on the image (ADR 0027).

:func:`calibrate_hand_eye_camera` (eye-in-hand: the camera on the flange, the target fixed
in the cell) and :func:`calibrate_eye_to_hand_camera` (the camera fixed, the target on the
flange) take per-view corner detections, the target, the robot's flange poses and the
camera's intrinsics (given with their covariance, held fixed, or estimated jointly), and
return a :class:`HandEyeCameraResult` / :class:`EyeToHandCameraResult`: calibration results
like every other (:class:`~cellcal.solver.calibrate.CalibrationResult`, ``transforms()``,
``predicted_error_at``, held-out closure, residual tests, warnings) with the camera's own
figures beside them.

Steps
-----
1. **Intrinsics**: an :class:`~cellcal.solver.intrinsics.IntrinsicsResult` (its values and
   covariance become a Gaussian prior), a :class:`~cellcal.solver.camera_model.CameraModel`
   with or without a covariance, or none: then :func:`~cellcal.solver.intrinsics.calibrate_intrinsics`
   runs on the same views (its refusals: too little tilt or coverage) and the intrinsics stay
   free in the refinement (``intrinsics_mode="joint"``).
2. **PnP** per view under those intrinsics (homography on the undistorted corners, then the
   pose alone by Gauss-Newton on the image), and the shared AX=XB / AX=YB solve of
   :func:`~cellcal.solver.calibrate.calibrate_hand_eye` / ``calibrate_eye_to_hand`` on the
   PnP poses: the start, and every refusal of those solves (``DegenerateGeometry`` naming the
   axis the rotations share, ``NotEnoughSamples``) carried over unchanged.
3. **Maximum likelihood on the corners** of every view jointly (:mod:`cellcal.solver._camera_chain`):
   both transforms, the intrinsics (free, under their prior, or fixed) and a correction of
   every view's robot pose held by a zero-mean prior of the robot's declared repeatability
   (and accuracy, where given). Corner noise is the caller's ``noise_px`` or estimated.
4. **Uncertainty**: the inverse Fisher information; with the intrinsics fixed and a
   covariance given, their uncertainty is carried into the transforms' (consider
   covariance). Each transform's 6x6 in the right-perturbation convention of ADR 0004.
5. **Tests and warnings** (noise-only false-alarm rate 1 %, Bonferroni over the tests run):
   the image residuals against declared noise (chi-square), a structure test of the image
   residuals (a smooth field over the image the model cannot absorb: lens or target model),
   and the robot's corrections against their prior (the arm moving more than declared: its
   kinematic error). A robot excess raises its prior by the measured factor and refits
   (variance-component estimation, never below the declared figure), with ``model_error``.
6. **Held-out views** (k-fold refits): reprojection of the views left out through the chain
   fitted without them, and their static-target closure in the base frame.
7. **Cross-checks** (:mod:`cellcal.solver.camera_checks`): OpenCV's five ``calibrateHandEye``
   methods on the same PnP poses, judged against the paired bootstrap over views.

Gauge
-----
No gauge is left free: the board's printed geometry fixes the target frame and the scale,
the robot's kinematics fix the base and flange frames (the corrections have mean zero under
their prior), the camera model fixes the camera frame (its optical axis and principal point).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver import _stats
from cellcal.solver.calibrate import (
    MAX_ROTATION_SIGMA_RAD,
    CalibrationResult,
    Estimate,
    Residuals,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
)
from cellcal.solver.camera_model import N_PARAMETERS, PARAMETER_NAMES, CameraModel, camera_matrix_from_parameters, undistort
from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.errors import DegenerateGeometry, NotEnoughSamples
from cellcal.solver.intrinsics import (
    MIN_VIEW_CORNERS,
    CornerResiduals,
    IntrinsicsResult,
    _fit_poses,
    _homography,
    _pose_from_homography,
    calibrate_intrinsics,
)
from cellcal.solver.se3 import check_transform, se3_inverse
from cellcal.solver.target import CalibrationTarget
from cellcal.solver.uncertainty import PredictedError, point_error, sigma_figures
from cellcal.solver.validation import HoldoutClosure, agreement

__all__ = [
    "calibrate_hand_eye_camera",
    "calibrate_eye_to_hand_camera",
    "CameraChainResult",
    "HandEyeCameraResult",
    "EyeToHandCameraResult",
    "CameraResidualTests",
    "Bootstrap",
    "INTRINSICS_MODES",
    "GLOBAL_PARAMETER_NAMES",
    "DEFAULT_REPEATABILITY_M",
    "DEFAULT_REPEATABILITY_RAD",
    "DEFAULT_N_BOOTSTRAP",
    "MIN_VIEWS",
]

INTRINSICS_MODES = ("prior", "fixed", "joint")
#: Order of the globals in :attr:`CameraChainResult.joint_covariance`.
GLOBAL_PARAMETER_NAMES = tuple(f"X.{c}" for c in ("rho_x", "rho_y", "rho_z", "phi_x", "phi_y", "phi_z")) + tuple(
    f"Z.{c}" for c in ("rho_x", "rho_y", "rho_z", "phi_x", "phi_y", "phi_z")) + PARAMETER_NAMES
#: The robot's pose repeatability, 1-sigma per axis (m): ISO 9283's +-0.03 mm of a UR-class
#: arm read as RP = mean + 3 sigma of the 3-D distance of an isotropic Gaussian (~3.6 sigma).
DEFAULT_REPEATABILITY_M = 1.0e-5
#: Its rotation, 1-sigma per axis (rad): 0.0005 deg of encoder noise on six joints.
DEFAULT_REPEATABILITY_RAD = 1.5e-5
#: Bootstrap replicates by default (the cross-check's gate needs at least 10).
DEFAULT_N_BOOTSTRAP = 30
MIN_VIEWS = 3
#: Estimated corner noise never goes below this (px): noise-free data reach the rounding floor.
NOISE_FLOOR_PX = 1e-6
_MAX_ITERATIONS = 50
_HOLDOUT_FOLDS = 5
_FALSE_ALARM = 0.01
_WARN_HOLDOUT = 1.5
_WARN_BOOTSTRAP = 2.0
_OUTLIER_SIGMAS = 5.0
#: Variance-component rounds (noise estimate, robot prior factor) at most.
_VCE_ROUNDS = 8
_VCE_TOL = 0.01
#: Directions of the structure basis with less than this sine of principal angle to the
#: model's span are the model's own (absorbed).
_MIN_SINE = 0.01
_MIN_STRUCTURE_DOF = 10


@dataclass(frozen=True, kw_only=True, eq=False)
class CameraResidualTests:
    """The residual tests of a camera-chain fit (module docstring, step 5).

    Attributes
    ----------
    declared_noise : bool
        ``noise_px`` was given (so ``image_chi2_p`` was computed).
    image_chi2, image_redundancy, image_chi2_p : float
        Whitened image residual energy, its redundancy (corners' degrees of freedom left
        after the fit), ``P(chi2_r > chi2)`` (NaN with estimated noise).
    robot_chi2, robot_redundancy, robot_chi2_p : float
        The same for the robot corrections against their declared prior (NaN when the
        corrections are not observable: redundancy below 1).
    consistency_f, consistency_p : float
        Nested F test of the chain (at the declared priors) against each view's pose fitted
        alone: the views disagree with one rigid chain beyond the corner noise (the robot's
        kinematic error, or held intrinsics that are wrong). It runs whatever the prior's
        redundancy, which a repeatability far below the PnP's precision leaves near 0.
    consistency_dof : tuple of int
    structure_f, structure_p : float
        F test of a smooth field over the image (cubic in the image coordinates, per axis)
        in the image residuals beyond what the model absorbs (NaN when it could not run).
    structure_dof : tuple of int
    structure_rms_px : float
        RMS per corner of the residual's part in that field, px.
    image_variance_factor, robot_variance_factor : float
        Factors the corner noise's and the robot prior's variances carry in the final fit
        (1: as declared; the robot's, the larger of its translation and rotation factors).
    model_error : bool
        A test fired.
    false_alarm_rate : float
        Noise-only probability of ``model_error`` (split over the tests run).
    """

    declared_noise: bool
    image_chi2: float
    image_redundancy: float
    image_chi2_p: float
    robot_chi2: float
    robot_redundancy: float
    robot_chi2_p: float
    consistency_f: float
    consistency_p: float
    consistency_dof: tuple[int, int]
    structure_f: float
    structure_p: float
    structure_dof: tuple[int, int]
    structure_rms_px: float
    image_variance_factor: float
    robot_variance_factor: float
    model_error: bool
    false_alarm_rate: float = _FALSE_ALARM


@dataclass(frozen=True, kw_only=True, eq=False)
class Bootstrap:
    """Resampling the views with replacement and refitting (validation ladder level 3).

    Attributes
    ----------
    n : int
        Replicates that fitted (of ``n_requested``).
    n_requested : int
    seed : int
    covariance : dict of str to numpy.ndarray (6, 6)
        Per transform name, the replicates' covariance in the result's convention (right
        perturbation of the full-data answer).
    sigma_ratio_translation, sigma_ratio_rotation : float
        Bootstrap over analytic 1-sigma (root of the traces) of the primary transform: near 1
        when the covariance describes the data's spread.
    primary : numpy.ndarray, shape (n, 6)
        The primary transform's replicates, as twists from the full-data answer.
    """

    n: int
    n_requested: int
    seed: int
    covariance: dict[str, np.ndarray]
    sigma_ratio_translation: float
    sigma_ratio_rotation: float
    primary: np.ndarray


@dataclass(frozen=True, kw_only=True)
class CameraChainResult(CalibrationResult):
    """What both camera setups report beside :class:`~cellcal.solver.calibrate.CalibrationResult`.

    The closure figures (``rms_translation_m``, ``residuals``, ``holdout``) are each view's
    static-target closure in the base frame: eye-in-hand ``base_T_flange @ flange_T_camera @
    camera_T_target`` (the view's own PnP pose) against ``base_T_target``; eye-to-hand
    ``base_T_camera @ camera_T_target`` against ``base_T_flange @ flange_T_target``.
    ``axis_spread``, ``weakest_axis``, ``n_motions``, ``max_motion_rad`` are the AX=XB
    start's. ``noise_translation_m`` and ``noise_rotation_rad`` are NaN (the measurement is
    in pixels: ``noise_px``); ``residual_tests`` holds what has the same meaning as for a
    pose fit (the image tests; model-error sizes of the robot) and ``camera_tests`` all of it.

    Attributes
    ----------
    setup : {"eye_in_hand", "eye_to_hand"}
    camera_matrix : numpy.ndarray, shape (3, 3)
    dist_coeffs : numpy.ndarray, shape (5,)
    image_size : tuple of int
    intrinsics : numpy.ndarray, shape (9,)
        Ordered :data:`~cellcal.solver.camera_model.PARAMETER_NAMES`.
    intrinsics_covariance : numpy.ndarray, shape (9, 9)
        Zero rows and columns for fixed parameters (``intrinsics_fixed``).
    intrinsics_mode : {"prior", "fixed", "joint"}
    intrinsics_fixed : tuple of str
    reprojection_rms_px : float
        RMS residual length over every corner.
    view_rms_px : numpy.ndarray, shape (N,)
    noise_px : float
        Corner noise the fit used (1-sigma per image axis), ``noise_source`` says whence.
    corner_residuals : CornerResiduals
    robot_repeatability_m, robot_repeatability_rad, robot_accuracy_m, robot_accuracy_rad : float
        The declared priors (1-sigma per axis).
    robot_variance_factor : numpy.ndarray, shape (2,)
        Factors on the prior's translation and rotation variances in the final fit (1 unless
        a robot test fired).
    robot_corrections : numpy.ndarray, shape (N, 6)
        Each view's fitted correction of ``base_T_flange`` ``(rho, phi)`` (m, rad, flange
        frame): ``base_T_flange_true = base_T_flange @ [exp(phi), rho]``.
    robot_corrections_covariance : numpy.ndarray, shape (N, 6, 6)
    base_T_flange : numpy.ndarray, shape (N, 4, 4)
        The robot poses used, m.
    camera_T_target : numpy.ndarray, shape (N, 4, 4)
        The fitted chain's pose of the target in each view.
    pnp_camera_T_target, pnp_covariance : numpy.ndarray, shape (N, 4, 4) and (N, 6, 6)
        Each view's pose fitted alone under the final intrinsics (right perturbation, target
        frame; corner noise only): what the closures and the cross-checks use.
    parameter_names : tuple of str
        Order of ``joint_covariance``: :data:`GLOBAL_PARAMETER_NAMES` (the primary transform,
        the second one, the nine intrinsics).
    joint_covariance : numpy.ndarray, shape (21, 21)
    views, views_dropped : tuple of int
        Caller's indices of the views used, and of those with too few corners.
    holdout_view_rms_px : numpy.ndarray, shape (N,)
        Each view's RMS reprojection through the chain fitted without it (NaN: not held out).
    holdout_reprojection_rms_px : float
    cross_check : CrossCheck or None
        OpenCV's five closed forms on the same PnP poses (None: not run or unavailable).
    bootstrap : Bootstrap or None
    camera_tests : CameraResidualTests
    pose_level : HandEyeResult or EyeToHandResult
        The AX=XB answer on the PnP poses (the start; ``linear_agreement`` compares it).
    target : CalibrationTarget
    target_sha256 : str or None
    """

    setup: str
    camera_matrix: np.ndarray
    dist_coeffs: np.ndarray
    image_size: tuple[int, int]
    intrinsics: np.ndarray
    intrinsics_covariance: np.ndarray
    intrinsics_mode: str
    intrinsics_fixed: tuple[str, ...]
    reprojection_rms_px: float
    view_rms_px: np.ndarray
    noise_px: float
    corner_residuals: CornerResiduals
    robot_repeatability_m: float
    robot_repeatability_rad: float
    robot_accuracy_m: float
    robot_accuracy_rad: float
    robot_variance_factor: np.ndarray
    robot_corrections: np.ndarray
    robot_corrections_covariance: np.ndarray
    base_T_flange: np.ndarray
    camera_T_target: np.ndarray
    pnp_camera_T_target: np.ndarray
    pnp_covariance: np.ndarray
    parameter_names: tuple[str, ...]
    joint_covariance: np.ndarray
    views: tuple[int, ...]
    views_dropped: tuple[int, ...]
    holdout_view_rms_px: np.ndarray
    holdout_reprojection_rms_px: float
    cross_check: Any
    bootstrap: Bootstrap | None
    camera_tests: CameraResidualTests
    pose_level: CalibrationResult
    target: CalibrationTarget
    target_sha256: str | None

    @property
    def camera(self) -> CameraModel:
        """The intrinsics as a :class:`~cellcal.solver.camera_model.CameraModel`."""
        return CameraModel(self.camera_matrix, self.dist_coeffs, self.image_size)

    @property
    def primary_name(self) -> str:
        return next(iter(self.transforms()))

    def nees(self, truth: dict[str, np.ndarray]) -> float:
        """Normalised estimation error squared of the transforms named in ``truth`` (jointly,
        with their cross-covariance): ``xi^T C^-1 xi`` with ``xi = log(T^-1 T_true)`` each;
        its mean is 6 per transform for an honest covariance (simulation)."""
        est = self.transforms()
        names = [n for n in est if n in truth]
        if not names:
            raise ValueError(f"truth names none of {list(est)}")
        xi = np.concatenate([_chain.log_batch(se3_inverse(est[n].value) @ np.asarray(truth[n], float)) for n in names])
        idx = np.concatenate([np.arange(6) + 6 * list(est).index(n) for n in names])
        C = self.covariance[np.ix_(idx, idx)]
        return float(xi @ np.linalg.solve(C, xi))


@dataclass(frozen=True, kw_only=True)
class HandEyeCameraResult(CameraChainResult):
    """Eye-in-hand on the image: ``flange_T_camera`` and ``base_T_target``.

    Attributes
    ----------
    flange_T_camera, base_T_target : numpy.ndarray, shape (4, 4)
        Metres. ``base_T_flange @ flange_T_camera @ camera_T_target = base_T_target``.
    flange_T_camera_covariance, base_T_target_covariance : numpy.ndarray, shape (6, 6)
        Right perturbation ``(rho, phi)`` in each transform's child frame (ADR 0004);
        ``covariance`` (12, 12) is the joint one, ordered ``[flange_T_camera, base_T_target]``.
    """

    flange_T_camera: np.ndarray
    base_T_target: np.ndarray
    flange_T_camera_covariance: np.ndarray
    base_T_target_covariance: np.ndarray

    def transforms(self) -> dict[str, Estimate]:
        """``flange_T_camera``, ``base_T_target``."""
        return {
            "flange_T_camera": Estimate.of("flange_T_camera", self.flange_T_camera, self.flange_T_camera_covariance),
            "base_T_target": Estimate.of("base_T_target", self.base_T_target, self.base_T_target_covariance),
        }

    def predicted_error_at(self, camera_p_task) -> PredictedError:
        """Error of a point the camera sees, mapped to the flange with ``flange_T_camera``.

        Parameters
        ----------
        camera_p_task : array_like, shape (3,)
            The point in the camera frame, m.

        Returns
        -------
        PredictedError
            Covariance of ``flange_T_camera @ camera_p`` in the flange frame; lever arm
            ``|camera_p|``. Only the calibration's error (not the camera's sighting of the point).
        """
        return point_error(self.flange_T_camera, self.flange_T_camera_covariance, camera_p_task, "flange")


@dataclass(frozen=True, kw_only=True)
class EyeToHandCameraResult(CameraChainResult):
    """Eye-to-hand on the image: ``base_T_camera`` and ``flange_T_target``.

    Attributes
    ----------
    base_T_camera, flange_T_target : numpy.ndarray, shape (4, 4)
        Metres. ``base_T_camera @ camera_T_target = base_T_flange @ flange_T_target``.
    base_T_camera_covariance, flange_T_target_covariance : numpy.ndarray, shape (6, 6)
        Right perturbation ``(rho, phi)``; ``covariance`` (12, 12) ordered
        ``[base_T_camera, flange_T_target]``.
    """

    base_T_camera: np.ndarray
    flange_T_target: np.ndarray
    base_T_camera_covariance: np.ndarray
    flange_T_target_covariance: np.ndarray

    def transforms(self) -> dict[str, Estimate]:
        """``base_T_camera``, ``flange_T_target``."""
        return {
            "base_T_camera": Estimate.of("base_T_camera", self.base_T_camera, self.base_T_camera_covariance),
            "flange_T_target": Estimate.of("flange_T_target", self.flange_T_target, self.flange_T_target_covariance),
        }

    def predicted_error_at(self, camera_p_task) -> PredictedError:
        """Error of a point the camera sees, mapped to the robot base with ``base_T_camera``.

        Parameters
        ----------
        camera_p_task : array_like, shape (3,)
            The point in the camera frame, m.

        Returns
        -------
        PredictedError
            Covariance of ``base_T_camera @ camera_p`` in the base frame; lever arm ``|camera_p|``.
        """
        return point_error(self.base_T_camera, self.base_T_camera_covariance, camera_p_task, "base")


# -- inputs ---------------------------------------------------------------------------------------


def _views(views: Sequence[Any], target: CalibrationTarget) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for i, v in enumerate(views):
        ids, pts = v if isinstance(v, tuple) else (v.ids, v.image_points_px)
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


def _poses(base_T_flange: Any, n: int) -> np.ndarray:
    G = np.asarray(base_T_flange, dtype=float)
    if G.ndim != 3 or G.shape[1:] != (4, 4):
        raise ValueError(f"base_T_flange must have shape (N, 4, 4), got {G.shape}")
    if G.shape[0] != n:
        raise ValueError(f"base_T_flange has {G.shape[0]} stations but there are {n} views: they must pair up")
    for i in range(n):
        check_transform(G[i], f"base_T_flange[{i}]")
    return G.copy()


def _sd(name: str, value: float) -> float:
    v = float(value)
    if not (math.isfinite(v) and v >= 0.0):
        raise ValueError(f"{name} must be a finite 1-sigma >= 0, got {value!r}")
    return v


def _intrinsics(intrinsics, intrinsics_covariance, intrinsics_mode, image_size):
    """``(k (9,), covariance (9, 9) or None, mode, fixed names, image_size)`` from the caller's."""
    cov = None if intrinsics_covariance is None else np.asarray(intrinsics_covariance, dtype=float)
    fixed: tuple[str, ...] = ()
    if intrinsics is None:
        if intrinsics_mode not in (None, "joint"):
            raise ValueError(f"intrinsics_mode={intrinsics_mode!r} needs intrinsics=")
        if image_size is None:
            raise ValueError("estimating the intrinsics jointly needs image_size=(width, height)")
        return None, None, "joint", fixed, (int(image_size[0]), int(image_size[1]))
    if isinstance(intrinsics, IntrinsicsResult):
        k = np.asarray(intrinsics.parameters, dtype=float).copy()
        size = intrinsics.image_size
        if cov is None:
            cov = np.asarray(intrinsics.covariance, dtype=float)
        fixed = tuple(intrinsics.fixed)
    elif isinstance(intrinsics, CameraModel):
        k, size = intrinsics.parameters.copy(), intrinsics.image_size
    else:
        raise ValueError(f"intrinsics must be an IntrinsicsResult, a CameraModel or None, got {type(intrinsics).__name__}")
    if image_size is not None and tuple(int(v) for v in image_size) != tuple(size):
        raise ValueError(f"image_size {tuple(image_size)} differs from the intrinsics' {tuple(size)}")
    if cov is not None:
        if cov.shape != (N_PARAMETERS, N_PARAMETERS) or not np.all(np.isfinite(cov)):
            raise ValueError(f"intrinsics_covariance must be a finite ({N_PARAMETERS}, {N_PARAMETERS}) array")
        cov = 0.5 * (cov + cov.T)
        zero = np.diag(cov) <= 0.0
        fixed = tuple(n for n, z in zip(PARAMETER_NAMES, zero, strict=True) if z or n in fixed)
    mode = intrinsics_mode or ("prior" if cov is not None else "fixed")
    if mode not in INTRINSICS_MODES:
        raise ValueError(f"intrinsics_mode must be one of {INTRINSICS_MODES}, got {mode!r}")
    if mode == "prior" and cov is None:
        raise ValueError("intrinsics_mode='prior' needs a covariance (an IntrinsicsResult or intrinsics_covariance=)")
    return k, cov, mode, fixed, (int(size[0]), int(size[1]))


# -- PnP -------------------------------------------------------------------------------------------


def _pnp(k: np.ndarray, obj: np.ndarray, img: np.ndarray, view: np.ndarray, nv: int, start: np.ndarray | None = None):
    """Each view's pose alone under intrinsics ``k``: homography on the undistorted corners,
    then Gauss-Newton on the image. Returns poses (nv, 4, 4) and their covariance per unit
    corner variance (nv, 6, 6)."""
    if start is None:
        xy, ok = undistort(k, img)
        starts = np.searchsorted(view, np.arange(nv))
        ends = np.append(starts[1:], view.shape[0])
        poses = np.empty((nv, 4, 4))
        for j, (a, b) in enumerate(zip(starts, ends, strict=True)):
            m = ok[a:b]
            if m.sum() < 4:
                m = np.ones(b - a, bool)
            H = _homography(obj[a:b][m, :2], np.where(np.isfinite(xy[a:b][m]), xy[a:b][m], 0.0))
            poses[j] = _pose_from_homography(np.eye(3), H)
    else:
        poses = start.copy()
    poses = _fit_poses(k, obj, img, view, poses)
    from cellcal.solver.camera_model import project

    pr = project(k, poses[view], obj, jacobians=True)
    assert pr.J_uv_pose is not None
    Jp = pr.J_uv_pose
    info = np.add.reduceat(np.swapaxes(Jp, 1, 2) @ Jp, np.searchsorted(view, np.arange(nv)), axis=0)
    with np.errstate(all="ignore"):
        try:
            cov = np.linalg.inv(info)
        except np.linalg.LinAlgError:
            cov = np.full((nv, 6, 6), np.inf)
    return poses, cov


# -- the fit ---------------------------------------------------------------------------------------


@dataclass
class _Fit:
    prob: _chain.ChainProblem
    state: _chain.ChainState
    iterations: int
    converged: bool
    stop: str
    Sinv: np.ndarray
    Cd: np.ndarray
    pieces: tuple
    robot_factor: np.ndarray  # (2,): translation, rotation


@dataclass
class _Redundancy:
    image: float
    robot: np.ndarray  # (2,) translation rows, rotation rows
    chi_image: float
    chi_robot: np.ndarray  # (2,)
    n_k_prior: int


def _problem(setup, obj, img, view, G, sigma, prior_sd, free, k_prior, huber, twist=None) -> _chain.ChainProblem:
    return _chain.ChainProblem(setup, obj, img, view, G, sigma, prior_sd, free, k_prior=k_prior, twist=twist,
                               huber=huber)


def _redundancies(prob: _chain.ChainProblem, state: _chain.ChainState, Sinv, Cd, pieces) -> _Redundancy:
    """Image and robot (translation, rotation) redundancy numbers and whitened chi-squares
    (Foerstner: a group's expected weighted residual energy is its redundancy)."""
    r, w, U, V, W, S, Vinv = pieces
    info = 1.0 / prob.prior_sd**2
    td = np.einsum("nii->ni", Cd) * info
    tr_d = np.array([float(td[:, :3].sum()), float(td[:, 3:].sum())])
    tr_k = 0.0
    n_kp = 0
    if prob.k_prior is not None:
        fk = prob.free[_chain.SL_K]
        C = Sinv[_chain.SL_K, _chain.SL_K]
        tr_k = float(np.trace(C @ (prob.k_prior[1] * np.outer(fk, fk))))
        n_kp = int(fk.sum())
    p_tot = int(prob.free.sum()) + 6 * prob.n_views
    n = r.shape[0]
    r_img = 2 * n - (p_tot - float(tr_d.sum()) - tr_k)
    r_rob = 3 * prob.n_views - tr_d
    chi_img = float(np.sum(w[:, None] * r * r)) / prob.sigma_px**2
    if prob.huber is not None:
        # the corner noise from the corners inside the Huber threshold, for the truncation of
        # a 2-D Gaussian's squared length there (outliers must not set the scale)
        s2 = np.sum(r * r, axis=1) / prob.sigma_px**2
        k2 = prob.huber**2
        inside = s2 <= k2
        m_k = 2.0 - (k2 + 2.0) * math.exp(-0.5 * k2)  # E[chi2_2 ; chi2_2 <= k^2]
        chi_img = float(np.sum(s2[inside])) * 2.0 / m_k
    q = (state.d / prob.prior_sd) ** 2
    chi_rob = np.array([float(q[:, :3].sum()), float(q[:, 3:].sum())])
    return _Redundancy(r_img, r_rob, chi_img, chi_rob, n_kp)


def _fit(setup, obj, img, view, G, state, sigma, declared: bool, prior_sd0, free, k_prior, huber, max_iter,
         robot_factor0: np.ndarray | None) -> _Fit:
    """Refine, estimating the corner noise (unless declared) and, given ``robot_factor0``
    (translation, rotation), the factors on the robot prior's variance (never below 1)
    until all settle (variance-component estimation)."""
    vce = robot_factor0 is not None
    factor = np.ones(2) if robot_factor0 is None else np.maximum(np.asarray(robot_factor0, float), 1.0)
    it_total = 0
    conv, stop = False, _chain.STOP_ITERATIONS
    for _round in range(_VCE_ROUNDS * (2 if vce else 1)):
        sd = prior_sd0 * np.repeat(np.sqrt(factor), 3)
        prob = _problem(setup, obj, img, view, G, sigma, sd, free, k_prior, huber)
        state, it, conv, stop = _chain.refine_chain(prob, state, max_iter)
        it_total += it
        Sinv, Cd, pieces = prob.covariance(state)
        if not conv:
            break
        red = _redundancies(prob, state, Sinv, Cd, pieces)
        changed = False
        if not declared and red.image > 0:
            f = red.chi_image / red.image
            if abs(f - 1.0) > _VCE_TOL:
                sigma *= math.sqrt(f)
                changed = True
        if vce:
            for c in range(2):
                if red.robot[c] >= 0.5:
                    f = max(1.0, factor[c] * red.chi_robot[c] / red.robot[c])
                    if abs(f / factor[c] - 1.0) > 0.02:
                        factor[c] = f
                        changed = True
        if not changed:
            break
    return _Fit(prob, state, it_total, conv, stop, Sinv, Cd, pieces, factor)


def _implied_corrections(setup: str, X, Z, G, O) -> np.ndarray:
    """(N, 6) the corrections that would make the chain reproduce each view's own PnP pose."""
    if setup == _chain.EYE_IN_HAND:
        D = _chain.inverse_batch(G) @ Z @ _chain.inverse_batch(X @ O)  # D = G^-1 Z O^-1 X^-1
    else:
        D = _chain.inverse_batch(G) @ X @ O @ se3_inverse(Z)
    return np.concatenate([D[:, :3, 3], _chain.log_batch(D)[:, 3:]], axis=1)


def _consistency_test(fit: _Fit, red: _Redundancy, O: np.ndarray, obj, img, view) -> tuple[float, float, tuple[int, int]]:
    """Nested F test of the chain against every view's pose fitted alone: do the views agree
    with one rigid chain within the corner noise? ``(F, p, (q, dof))``."""
    prob = fit.prob
    e = img - _project(fit.state.k, O[view], obj)
    ssr_p = float(np.sum(e * e))
    dof_p = 2 * img.shape[0] - 6 * prob.n_views
    ssr_c = prob.sigma_px**2 * (red.chi_image + float(red.chi_robot.sum()))
    q = 6 * prob.n_views + red.n_k_prior - int(prob.free.sum())
    if q <= 0 or dof_p <= 0 or ssr_p <= 0:
        return math.nan, math.nan, (0, 0)
    F = max(ssr_c - ssr_p, 0.0) / q / (ssr_p / dof_p)
    return F, _stats.f_sf(F, q, dof_p), (q, dof_p)


def _structure_basis(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(n, 2, 20): cubic monomials of the normalised image coordinates, one set per axis."""
    w, h = size
    a = (img[:, 0] - 0.5 * (w - 1)) / (0.5 * w)
    b = (img[:, 1] - 0.5 * (h - 1)) / (0.5 * h)
    mons = np.stack([np.ones_like(a), a, b, a * a, a * b, b * b, a**3, a * a * b, a * b * b, b**3], axis=1)
    Z = np.zeros((img.shape[0], 2, 20))
    Z[:, 0, :10] = mons
    Z[:, 1, 10:] = mons
    return Z


def _structure_test(fit: _Fit, size: tuple[int, int]) -> tuple[float, float, tuple[int, int], float]:
    """F test of the image residuals' part in a smooth image field (ADR 0027); returns
    ``(F, p, (p1, nu - p1), rms_px)`` (NaN when it cannot run)."""
    prob, st = fit.prob, fit.state
    r, w, U, V, W, S, Vinv = fit.pieces
    _r, Jg, Jd = prob.jacobians(st)
    sq = (np.sqrt(w) / prob.sigma_px)[:, None, None]
    Jg, Jd = Jg * sq, Jd * sq
    rw = (r * sq[:, :, 0])
    Zb = _structure_basis(prob.img, size) * sq
    q = Zb.shape[2]
    Zf = Zb.reshape(-1, q)
    ZZ = Zf.T @ Zf
    try:
        L = np.linalg.cholesky(ZZ + 1e-12 * np.trace(ZZ) / q * np.eye(q))
    except np.linalg.LinAlgError:
        return math.nan, math.nan, (0, 0), math.nan
    Li = np.linalg.inv(L)
    Zo = Zb @ Li.T  # orthonormal columns over the image rows
    Ag = Jg.reshape(-1, Jg.shape[2]).T @ Zo.reshape(-1, q)
    Ad = np.add.reduceat(np.swapaxes(Jd, 1, 2) @ Zo, prob.starts, axis=0)
    fixed = ~prob.free
    Ag[fixed] = 0.0
    WVi = W @ Vinv
    yg = np.linalg.solve(S, Ag - np.einsum("nij,njq->iq", WVi, Ad))
    yg[fixed] = 0.0
    yd = Vinv @ (Ad - np.swapaxes(W, 1, 2) @ yg[None])
    M = np.eye(q) - (Ag.T @ yg + np.einsum("niq,nir->qr", Ad, yd))
    lam, E = np.linalg.eigh(0.5 * (M + M.T))
    keep = lam > _MIN_SINE**2
    p1 = int(keep.sum())
    n_obs = 2 * prob.img.shape[0] + (int(prob.free[_chain.SL_K].sum()) if prob.k_prior is not None else 0)
    nu = n_obs - int(prob.free.sum())
    if p1 == 0 or nu - p1 < _MIN_STRUCTURE_DOF:
        return math.nan, math.nan, (0, 0), math.nan
    b = Zo.reshape(-1, q).T @ rw.reshape(-1)
    Ek = E[:, keep]
    qz = float(np.sum((Ek.T @ b) ** 2 / lam[keep]))
    ssr = float(np.sum(rw * rw)) + float(np.sum((st.d / prob.prior_sd) ** 2))
    if prob.k_prior is not None:
        e = st.k - prob.k_prior[0]
        ssr += float(e @ prob.k_prior[1] @ e)
    rest = max(ssr - qz, 1e-300)
    F = (qz / p1) / (rest / (nu - p1))
    p = _stats.f_sf(F, p1, nu - p1)
    rms = prob.sigma_px * math.sqrt(qz / prob.img.shape[0])
    return F, p, (p1, nu - p1), rms


def _closures(setup: str, X, Z, G, O) -> tuple[np.ndarray, np.ndarray]:
    """Per view static-target closure in the base frame: translation (m) and angle (rad)."""
    if setup == _chain.EYE_IN_HAND:
        A = G @ X @ O  # base_T_target seen by each view
        B = np.broadcast_to(Z, A.shape)
    else:
        A = X @ O  # the target in the base through the camera
        B = G @ Z  # ... and through the robot
    dt = np.linalg.norm(A[:, :3, 3] - B[:, :3, 3], axis=1)
    Rrel = np.swapaxes(B[:, :3, :3], 1, 2) @ A[:, :3, :3]
    cos = np.clip((np.trace(Rrel, axis1=1, axis2=2) - 1.0) * 0.5, -1.0, 1.0)
    return dt, np.arccos(cos)


def _percentile(x: np.ndarray, q: float) -> float:
    x = np.sort(x[np.isfinite(x)]) if np.any(np.isfinite(x)) else np.array([math.inf])
    return float(np.percentile(x, q)) if x.size else math.inf


def _subset(obj, img, view, ids: np.ndarray, nv: int):
    """Corners of views ``ids`` (in that order, repeats allowed) with views renumbered."""
    starts = np.searchsorted(view, np.arange(nv))
    ends = np.append(starts[1:], view.shape[0])
    sel = [np.arange(starts[i], ends[i]) for i in ids]
    idx = np.concatenate(sel)
    nview = np.concatenate([np.full(s.size, j, dtype=np.intp) for j, s in enumerate(sel)])
    return obj[idx], img[idx], nview


# -- the public solves ---------------------------------------------------------------------------


def calibrate_hand_eye_camera(
    views: Sequence[Any],
    target: CalibrationTarget,
    base_T_flange: np.ndarray,
    *,
    intrinsics: IntrinsicsResult | CameraModel | None = None,
    intrinsics_covariance: np.ndarray | None = None,
    intrinsics_mode: str | None = None,
    image_size: tuple[int, int] | None = None,
    noise_px: float | None = None,
    robot_repeatability_m: float = DEFAULT_REPEATABILITY_M,
    robot_repeatability_rad: float = DEFAULT_REPEATABILITY_RAD,
    robot_accuracy_m: float = 0.0,
    robot_accuracy_rad: float = 0.0,
    huber: float | None = None,
    holdout: bool = True,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    cross_check: bool = True,
    seed: int = 0,
    max_iterations: int = _MAX_ITERATIONS,
    **axxb: Any,
) -> HandEyeCameraResult:
    """Eye-in-hand on the image: the camera on the flange, the target fixed (module docstring).

    Parameters
    ----------
    views : sequence
        Per view: an object with ``ids`` (M,) and ``image_points_px`` (M, 2) (a
        :class:`cellcal.drivers.detect.Detection`) or a tuple ``(ids, image_points_px)``.
    target : CalibrationTarget
    base_T_flange : array_like, shape (N, 4, 4)
        The flange pose in the robot base frame when each view was taken (at mid-exposure), m.
    intrinsics : IntrinsicsResult or CameraModel, optional
        The camera's intrinsics; None estimates them jointly (then ``image_size`` is needed).
    intrinsics_covariance : array_like, shape (9, 9), optional
        Their covariance (an IntrinsicsResult's own by default); zero variances hold a
        parameter fixed.
    intrinsics_mode : {"prior", "fixed", "joint"}, optional
        ``"prior"`` (default with a covariance): refined under a Gaussian prior of it (for
        intrinsics from *other* images: on the same images use ``"joint"``); ``"fixed"``
        (default without one): held, their covariance (if any) carried into the
        transforms'; ``"joint"``: free, no prior.
    image_size : (int, int), optional
    noise_px : float, optional
        Declared corner noise (1-sigma per axis, px); estimated if omitted.
    robot_repeatability_m, robot_repeatability_rad : float
        The robot's pose repeatability, 1-sigma per axis (m, rad) in the flange frame.
    robot_accuracy_m, robot_accuracy_rad : float
        Its absolute accuracy, 1-sigma per axis, added to the per-view prior (ADR 0027).
    huber : float, optional
        Huber loss on each corner's whitened length at this many sigmas.
    holdout : bool
        k-fold held-out views (5 folds; needs 6 views).
    n_bootstrap : int
        Bootstrap replicates over views (0: none; the OpenCV cross-check is judged only with 10 or more).
    cross_check : bool
        Run OpenCV's five closed forms on the PnP poses.
    seed : int
        The bootstrap's.
    max_iterations : int
    **axxb
        Passed to the AX=XB start (``min_axis_spread``, ``min_rotation_rad``).

    Returns
    -------
    HandEyeCameraResult

    Raises
    ------
    NotEnoughSamples
        Fewer than 3 views with enough corners.
    DegenerateGeometry
        The AX=XB start's refusal (``.axis`` in the flange frame), or a rotation the refined
        fit determines only beyond 0.1 rad.
    InsufficientTilt, InsufficientCoverage
        Joint intrinsics from views that cannot determine them.
    ValueError
        Malformed input, naming the view or station.
    """
    return _calibrate(_chain.EYE_IN_HAND, views, target, base_T_flange, intrinsics, intrinsics_covariance,
                      intrinsics_mode, image_size, noise_px, robot_repeatability_m, robot_repeatability_rad,
                      robot_accuracy_m, robot_accuracy_rad, huber, holdout, n_bootstrap, cross_check, seed,
                      max_iterations, axxb)


def calibrate_eye_to_hand_camera(
    views: Sequence[Any],
    target: CalibrationTarget,
    base_T_flange: np.ndarray,
    *,
    intrinsics: IntrinsicsResult | CameraModel | None = None,
    intrinsics_covariance: np.ndarray | None = None,
    intrinsics_mode: str | None = None,
    image_size: tuple[int, int] | None = None,
    noise_px: float | None = None,
    robot_repeatability_m: float = DEFAULT_REPEATABILITY_M,
    robot_repeatability_rad: float = DEFAULT_REPEATABILITY_RAD,
    robot_accuracy_m: float = 0.0,
    robot_accuracy_rad: float = 0.0,
    huber: float | None = None,
    holdout: bool = True,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    cross_check: bool = True,
    seed: int = 0,
    max_iterations: int = _MAX_ITERATIONS,
    **axxb: Any,
) -> EyeToHandCameraResult:
    """Eye-to-hand on the image: the camera fixed, the target on the flange.

    Parameters and raises as :func:`calibrate_hand_eye_camera`; ``DegenerateGeometry.axis``
    is in the robot base frame.

    Returns
    -------
    EyeToHandCameraResult
    """
    return _calibrate(_chain.EYE_TO_HAND, views, target, base_T_flange, intrinsics, intrinsics_covariance,
                      intrinsics_mode, image_size, noise_px, robot_repeatability_m, robot_repeatability_rad,
                      robot_accuracy_m, robot_accuracy_rad, huber, holdout, n_bootstrap, cross_check, seed,
                      max_iterations, axxb)


def _calibrate(setup, views, target, base_T_flange, intrinsics, intrinsics_covariance, intrinsics_mode, image_size,
               noise_px, rep_m, rep_rad, acc_m, acc_rad, huber, holdout, n_bootstrap, cross_check, seed,
               max_iterations, axxb):
    problem = "hand-eye calibration (camera)" if setup == _chain.EYE_IN_HAND else "eye-to-hand calibration (camera)"
    checked = _views(views, target)
    G_all = _poses(base_T_flange, len(checked))
    rep_m, rep_rad = _sd("robot_repeatability_m", rep_m), _sd("robot_repeatability_rad", rep_rad)
    acc_m, acc_rad = _sd("robot_accuracy_m", acc_m), _sd("robot_accuracy_rad", acc_rad)
    if rep_m + acc_m <= 0 or rep_rad + acc_rad <= 0:
        raise ValueError("the robot's repeatability (or accuracy) must be > 0: a robot pose is never exact")
    if noise_px is not None and not (math.isfinite(noise_px) and noise_px > 0):
        raise ValueError(f"noise_px must be > 0, got {noise_px!r}")
    if huber is not None and not (math.isfinite(huber) and huber > 0):
        raise ValueError(f"huber must be > 0 (sigmas), got {huber!r}")
    k0, kcov, mode, kfixed, size = _intrinsics(intrinsics, intrinsics_covariance, intrinsics_mode, image_size)
    warnings: list[SolveWarning] = []
    used = [i for i, (ids, _) in enumerate(checked) if ids.shape[0] >= MIN_VIEW_CORNERS]
    dropped = tuple(i for i in range(len(checked)) if i not in used)
    if dropped:
        warnings.append(SolveWarning(code="views_dropped", value=float(len(dropped)), message=(
            f"{len(dropped)} view(s) with fewer than {MIN_VIEW_CORNERS} corners not used: {list(dropped)}")))
    if len(used) < MIN_VIEWS:
        raise NotEnoughSamples(len(used), MIN_VIEWS, problem, hint=(
            f"views with at least {MIN_VIEW_CORNERS} corners each, the robot rotating about two axes or more"))
    nv = len(used)
    G = G_all[used]
    obj = np.concatenate([target.corner_points(checked[i][0]) for i in used])
    img = np.concatenate([checked[i][1] for i in used])
    ids_all = np.concatenate([checked[i][0] for i in used])
    view = np.concatenate([np.full(checked[i][0].shape[0], j, dtype=np.intp) for j, i in enumerate(used)])
    n = img.shape[0]

    # 1. intrinsics, 2. PnP
    if mode == "joint":
        ir = calibrate_intrinsics([checked[i] for i in used], target, size, noise_px=noise_px, holdout_folds=0)
        k = ir.parameters.copy()
        kfixed = tuple(ir.fixed)
        O, pnp_cov = _pnp(k, obj, img, view, nv, start=ir.camera_T_target)
    else:
        assert k0 is not None
        k = k0.copy()
        O, pnp_cov = _pnp(k, obj, img, view, nv)
    sigma0 = noise_px
    if sigma0 is None:
        e = img - _project(k, O[view], obj)
        sigma0 = math.sqrt(float(np.sum(e * e)) / max(2 * n - 6 * nv, 1))
    # noise-free data: residuals at rounding, which no test can read
    floor = noise_px is None and sigma0 < NOISE_FLOOR_PX
    sigma0 = max(sigma0, NOISE_FLOOR_PX) if noise_px is None else sigma0

    # the AX=XB start, with its refusals
    init_kw = {kk: axxb[kk] for kk in ("min_axis_spread", "min_rotation_rad", "pairs") if kk in axxb}
    unknown = set(axxb) - set(init_kw)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    if setup == _chain.EYE_IN_HAND:
        pose_level: CalibrationResult = calibrate_hand_eye(G, O, holdout=False, **init_kw)
        X0, Z0 = pose_level.flange_T_camera, pose_level.base_T_target  # type: ignore[attr-defined]
    else:
        pose_level = calibrate_eye_to_hand(G, O, holdout=False, **init_kw)
        X0, Z0 = pose_level.base_T_camera, pose_level.flange_T_target  # type: ignore[attr-defined]

    # 3. the image-level fit
    free = np.ones(_chain.N_GLOBAL, dtype=bool)
    fixed_k = np.array([nm in kfixed for nm in PARAMETER_NAMES])
    k_prior = None
    if mode == "fixed":
        free[_chain.SL_K] = False
    else:
        free[_chain.SL_K] = ~fixed_k
        if mode == "prior":
            assert kcov is not None
            Cf = kcov[np.ix_(~fixed_k, ~fixed_k)]
            Ik = np.zeros((N_PARAMETERS, N_PARAMETERS))
            Ik[np.ix_(~fixed_k, ~fixed_k)] = np.linalg.inv(Cf)
            k_prior = (k.copy(), Ik)
    prior_sd = np.tile(np.array([math.hypot(rep_m, acc_m)] * 3 + [math.hypot(rep_rad, acc_rad)] * 3), (nv, 1))
    state = _chain.ChainState(X0.copy(), Z0.copy(), k.copy(), np.zeros((nv, 6)))
    declared = noise_px is not None or floor
    # first fit at the declared priors: the robot's tests are decided there
    fit0 = _fit(setup, obj, img, view, G, state, sigma0, declared, prior_sd, free, k_prior, huber, max_iterations, None)
    red0 = _redundancies(fit0.prob, fit0.state, fit0.Sinv, fit0.Cd, fit0.pieces)
    F_c, p_c, dof_c = _consistency_test(fit0, red0, O, obj, img, view)
    rob_r, rob_chi = float(red0.robot.sum()), float(red0.chi_robot.sum())
    tests_run = 2 + (rob_r >= 1.0) + (noise_px is not None) + math.isfinite(p_c)
    alpha = _FALSE_ALARM / tests_run if not floor else 0.0
    p_rob = _stats.chi2_sf(rob_chi, rob_r) if rob_r >= 1.0 else math.nan
    robot_excess = (math.isfinite(p_rob) and p_rob < alpha) or (math.isfinite(p_c) and p_c < alpha)
    fit = fit0
    if robot_excess:
        # start the robot's prior where the views' own poses put the corrections, then let
        # variance-component estimation settle it (never below the declared figures)
        dimp = _implied_corrections(setup, fit0.state.X, fit0.state.Z, G, O)
        f0 = np.array([np.mean(dimp[:, :3] ** 2) / prior_sd[0, 0] ** 2, np.mean(dimp[:, 3:] ** 2) / prior_sd[0, 3] ** 2])
        fit = _fit(setup, obj, img, view, G, fit0.state, fit0.prob.sigma_px, declared, prior_sd, free, k_prior, huber,
                   max_iterations, f0)
    red = _redundancies(fit.prob, fit.state, fit.Sinv, fit.Cd, fit.pieces)
    r_img, chi_img, n_kp = red.image, red.chi_image, red.n_k_prior
    F_s, p_s, dof_s, rms_s = _structure_test(fit, size)
    p_img = _stats.chi2_sf(chi_img, r_img) if noise_px is not None and r_img > 0 else math.nan
    structured = math.isfinite(p_s) and p_s < alpha
    image_excess = math.isfinite(p_img) and p_img < alpha and noise_px is not None
    image_factor = 1.0
    if image_excess or structured:
        # the corner noise is larger than declared (or the model misses a smooth field): the
        # covariance takes the measured excess
        image_factor = max(1.0, chi_img / r_img) if r_img > 0 else 1.0
    if not fit.converged:
        warnings.append(SolveWarning(code="not_converged", value=float(fit.iterations), message=(
            f"{problem}: the refinement on the image did not converge ({fit.stop} after {fit.iterations} iterations)")))
    st = fit.state
    prob = fit.prob
    Sinv = fit.Sinv * image_factor
    Cd = fit.Cd * image_factor
    if mode == "fixed" and kcov is not None:
        Sinv = Sinv + _consider(prob, st, kcov, fixed_k) * 1.0
    elif mode == "fixed":
        warnings.append(SolveWarning(code="intrinsics_fixed", message=(
            "intrinsics held fixed without a covariance: the transforms' covariance leaves out their uncertainty")))
    X, Z = st.X, st.Z
    # the robot error common to every view leaves no residual: the fit absorbs it into X and Z
    lever = float(np.sqrt(np.mean(np.sum(G[:, :3, 3] ** 2, axis=1))))
    tau_t, tau_r = _absorbed_size(acc_m, acc_rad, rep_m, rep_rad, fit.robot_factor, robot_excess, lever)
    rf = float(np.max(fit.robot_factor))
    if tau_t > 0 or tau_r > 0:
        Sinv = Sinv + _absorbed_covariance(X, Z, tau_t, tau_r)
    cov12 = Sinv[:12, :12].copy()
    covX, covZ = cov12[:6, :6].copy(), cov12[6:, 6:].copy()
    kcov_out = Sinv[_chain.SL_K, _chain.SL_K].copy()
    if mode == "fixed" and kcov is not None:
        kcov_out = kcov.copy()
    frame = "flange" if setup == _chain.EYE_IN_HAND else "base"
    _determined(covX, X, problem, frame, pose_level)

    # residuals, closures
    P, _D = prob.poses(st)
    r_px = img - _project(st.k, P[view], obj)
    res2 = np.sum(r_px * r_px, axis=1)
    starts = prob.starts
    view_rms = np.sqrt(np.add.reduceat(res2, starts) / np.diff(np.append(starts, n)))
    rms_px = math.sqrt(float(res2.mean()))
    O_f, pnp_c = _pnp(st.k, obj, img, view, nv, start=O)
    pnp_c = pnp_c * prob.sigma_px**2 * image_factor
    ct, cr = _closures(setup, X, Z, G, O_f)
    wts = prob.weights(r_px)
    down = np.flatnonzero(wts < 1.0)
    down_views = np.unique(view[down])

    # warnings from the tests
    sig_mm = math.hypot(rep_m, acc_m)
    if robot_excess:
        vis = float(np.sqrt(np.mean(st.d[:, :3] ** 2)))
        warnings.append(SolveWarning(code="model_error", value=vis * 1e3, message=(
            f"the robot's poses need corrections of {vis * 1e3:.3f} mm RMS per axis to fit the images, "
            f"{math.sqrt(fit.robot_factor[0]):.1f}x the declared {sig_mm * 1e3:.3f} mm (views against one rigid chain: "
            f"F {F_c:.1f}, p {p_c:.2g}): the arm's kinematic error, a wrong repeatability figure, or intrinsics that "
            "are not the camera's; the prior was widened to what the images show; consider a kinematic "
            "calibration")))
    if structured:
        warnings.append(SolveWarning(code="model_error", value=rms_s, message=(
            f"the corner residuals follow a smooth field over the image ({rms_s:.3f} px RMS, F {F_s:.1f}, "
            f"p {p_s:.2g}): the lens model or the target's geometry (flatness, print scale) is not what the "
            "images show")))
    elif image_excess:
        ratio = math.sqrt(chi_img / r_img)
        warnings.append(SolveWarning(code="noise", value=ratio, message=(
            f"corner residuals are {ratio:.2f}x the declared {noise_px:.3g} px (chi2 {chi_img:.0f} for "
            f"{r_img:.0f} dof): the covariance takes the measured noise")))
    robust = 1.4826 * float(np.median(np.abs(r_px)))
    if robust > 0 and not floor:
        out = np.flatnonzero(np.sqrt(res2) > _OUTLIER_SIGMAS * robust * math.sqrt(2.0))
        if out.size:
            warnings.append(SolveWarning(code="outliers", value=float(out.size), message=(
                f"{out.size} corner(s) beyond {_OUTLIER_SIGMAS:g} robust sigmas (views "
                f"{sorted({int(used[view[i]]) for i in out})}): misdetections, or consider huber=")))

    # 6. held-out views
    hv = np.full(nv, np.nan)
    h_rms = math.nan
    h_closure = None
    if holdout and nv >= 2 * MIN_VIEWS:
        h_closure, hv, h_rms = _holdout(setup, obj, img, view, G, st, prob, O_f, ct, max_iterations)
        in_rms = rms_px
        if math.isfinite(h_rms) and h_rms > _WARN_HOLDOUT * in_rms and not floor:
            warnings.append(SolveWarning(code="holdout", value=h_rms / in_rms, message=(
                f"held-out views reproject at {h_rms:.3f} px RMS, {h_rms / in_rms:.2f}x the fit's {in_rms:.3f} px: "
                "the chain leans on particular views")))

    names = ("flange_T_camera", "base_T_target") if setup == _chain.EYE_IN_HAND else ("base_T_camera", "flange_T_target")
    # 7. bootstrap and cross-checks
    boot = None
    boot_pairs: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
    if n_bootstrap and n_bootstrap > 0:
        boot, boot_pairs = _bootstrap(setup, obj, img, view, G, st, prob, O_f, int(n_bootstrap), int(seed), names,
                                      covX, covZ, cross_check, max_iterations)
        if boot is not None and boot.n >= 10 and max(boot.sigma_ratio_translation, boot.sigma_ratio_rotation) > _WARN_BOOTSTRAP:
            warnings.append(SolveWarning(code="bootstrap", value=max(boot.sigma_ratio_translation,
                                                                     boot.sigma_ratio_rotation), message=(
                f"the bootstrap over views spreads {boot.sigma_ratio_translation:.2f}x (translation) and "
                f"{boot.sigma_ratio_rotation:.2f}x (rotation) the reported sigma of {names[0]}: single views "
                "carry the answer, or the noise model is wrong")))
    xc = None
    if cross_check:
        from cellcal.solver import camera_checks

        xc = camera_checks.opencv_cross_check(setup, G, O_f, X, covX, boot_pairs)
        if xc is None:
            warnings.append(SolveWarning(code="cross_check_unavailable", message=(
                "OpenCV's calibrateHandEye is not available (opencv-python-headless>=4.8,<5 binds it): "
                "no cross-check against the closed forms")))
        elif xc.agrees is False:
            warnings.append(SolveWarning(code="cross_solver", value=xc.distance[xc.closest], message=(
                f"no closed form agrees with this result: the closest, OpenCV {xc.closest}, is "
                f"{xc.translation_m[xc.closest] * 1e3:.3f} mm and {math.degrees(xc.rotation_rad[xc.closest]):.4f} deg "
                f"away ({xc.distance[xc.closest]:.1f} sigma of the paired difference, gate {xc.gate:.1f}): "
                "a convention error or a model the closed forms do not share")))

    # the figures every result carries
    st_mm, sr_deg = sigma_figures(covX)
    noise_only = fit.Sinv[:6, :6]
    nt, nr = sigma_figures(noise_only)
    p_tot = int(prob.free.sum()) + 6 * nv
    dof = int(round(2 * n + 6 * nv + n_kp - p_tot))
    chi2 = chi_img + float(np.sum((st.d / prob.prior_sd) ** 2))
    vis_t = float(np.sqrt(np.mean(st.d[:, :3] ** 2))) if robot_excess else 0.0
    vis_r = float(np.sqrt(np.mean(st.d[:, 3:] ** 2))) if robot_excess else 0.0
    rt = ResidualTests(
        declared_noise=noise_px is not None, chi2_per_dof=chi_img / r_img if r_img > 0 else math.nan,
        chi2_p=p_img, structure_f=F_s, structure_p=p_s, structure_dof=dof_s,
        redundancy_translation=math.nan, redundancy_rotation=math.nan,
        variance_factor_translation=image_factor, variance_factor_rotation=rf,
        small_sample_factor=1.0, model_error_translation_m=vis_t, model_error_rotation_rad=vis_r,
        inflation_translation=st_mm / nt if nt > 0 else 1.0, inflation_rotation=sr_deg / nr if nr > 0 else 1.0,
        false_alarm_rate=_FALSE_ALARM)
    ctests = CameraResidualTests(
        declared_noise=noise_px is not None, image_chi2=chi_img, image_redundancy=r_img, image_chi2_p=p_img,
        robot_chi2=rob_chi, robot_redundancy=rob_r, robot_chi2_p=p_rob, consistency_f=F_c, consistency_p=p_c,
        consistency_dof=dof_c, structure_f=F_s, structure_p=p_s,
        structure_dof=dof_s, structure_rms_px=rms_s, image_variance_factor=image_factor,
        robot_variance_factor=rf, model_error=robot_excess or structured)
    lin = agreement(X0, X, covX) if np.all(np.isfinite(covX)) else None
    joint = np.zeros((_chain.N_GLOBAL, _chain.N_GLOBAL))
    joint[:] = Sinv
    if mode == "fixed" and kcov is not None:
        joint[_chain.SL_K, _chain.SL_K] = kcov
    common: dict[str, Any] = dict(
        n_stations=nv, n_motions=pose_level.n_motions,
        rms_translation_m=float(np.sqrt(np.mean(ct**2))), max_translation_m=float(ct.max()),
        rms_rotation_rad=float(np.sqrt(np.mean(cr**2))), max_rotation_rad=float(cr.max()),
        axis_spread=pose_level.axis_spread, weakest_axis=pose_level.weakest_axis, axis_frame=pose_level.axis_frame,
        max_motion_rad=pose_level.max_motion_rad, residuals=Residuals(translation_m=ct, rotation_rad=cr),
        solver=(f"{setup} on the image: maximum likelihood over {n} corners of {nv} views "
                f"(intrinsics {mode}, robot corrections under a prior), from AX=XB on PnP poses"),
        covariance=cov12, sigma_translation_mm=st_mm, sigma_rotation_deg=sr_deg,
        noise_translation_m=math.nan, noise_rotation_rad=math.nan,
        noise_source=("declared" if noise_px is not None else
                      f"estimated, at its floor of {NOISE_FLOOR_PX:g} px (noise-free data: no residual test ran)"
                      if floor else "estimated"), chi2=chi2, dof=dof, refined=True,
        converged=fit.converged, iterations=fit.iterations, stop_reason=fit.stop,
        downweighted=np.array([used[i] for i in down_views], dtype=int), warnings=tuple(warnings),
        residual_tests=rt, holdout=h_closure, linear_agreement=lin,
        setup=setup, camera_matrix=camera_matrix_from_parameters(st.k), dist_coeffs=st.k[4:9].copy(),
        image_size=size, intrinsics=st.k.copy(), intrinsics_covariance=kcov_out, intrinsics_mode=mode,
        intrinsics_fixed=tuple(nm for nm, f in zip(PARAMETER_NAMES, ~free[_chain.SL_K], strict=True) if f),
        reprojection_rms_px=rms_px, view_rms_px=view_rms, noise_px=prob.sigma_px * math.sqrt(image_factor),
        corner_residuals=CornerResiduals(view=view, ids=ids_all, image_points_px=img, residuals_px=r_px),
        robot_repeatability_m=rep_m, robot_repeatability_rad=rep_rad, robot_accuracy_m=acc_m,
        robot_accuracy_rad=acc_rad, robot_variance_factor=fit.robot_factor.copy(), robot_corrections=st.d.copy(),
        robot_corrections_covariance=Cd, base_T_flange=G, camera_T_target=P, pnp_camera_T_target=O_f,
        pnp_covariance=pnp_c, parameter_names=GLOBAL_PARAMETER_NAMES, joint_covariance=joint,
        views=tuple(used), views_dropped=dropped, holdout_view_rms_px=hv, holdout_reprojection_rms_px=h_rms,
        cross_check=xc, bootstrap=boot, camera_tests=ctests, pose_level=pose_level, target=target, target_sha256=target.sha256,
    )
    if setup == _chain.EYE_IN_HAND:
        return HandEyeCameraResult(**common, flange_T_camera=X, base_T_target=Z, flange_T_camera_covariance=covX,
                                   base_T_target_covariance=covZ)
    return EyeToHandCameraResult(**common, base_T_camera=X, flange_T_target=Z, base_T_camera_covariance=covX,
                                 flange_T_target_covariance=covZ)


def _project(k, P, obj) -> np.ndarray:
    from cellcal.solver.camera_model import project

    return project(k, P, obj).uv


def _consider(prob: _chain.ChainProblem, st: _chain.ChainState, kcov: np.ndarray, fixed_k: np.ndarray) -> np.ndarray:
    """What fixed intrinsics' covariance adds to the globals' (the consider covariance):
    ``A C_k A^T`` with ``A = -S_gg^-1 S_gk`` from the information with the intrinsics free."""
    free = prob.free.copy()
    free[_chain.SL_K] = ~fixed_k
    full = _chain.ChainProblem(prob.setup, prob.obj, prob.img, prob.view, prob.G, prob.sigma_px, prob.prior_sd, free,
                               huber=prob.huber)
    _r, _w, U, V, W, gg, gv = full.normal(st)
    _dg, _dd, S, _Vi = full.solve(U, V, W, gg, gv, 0.0)
    g = np.flatnonzero(prob.free)
    kk = np.flatnonzero(free & ~prob.free)
    A = -np.linalg.solve(S[np.ix_(g, g)], S[np.ix_(g, kk)])
    out = np.zeros_like(S)
    out[np.ix_(g, g)] = A @ kcov[np.ix_(kk - 12, kk - 12)] @ A.T
    return out


#: The robot error common to all views (which leaves no residual and moves the transforms),
#: per unit of the declared accuracy: 0.7 (half its variance), chosen on simulated UR5e arms
#: with 0.03 deg / 0.2 mm kinematic errors (ADR 0027: 1.0 was 2x conservative, 0.5 optimistic).
ABSORBED_PER_ACCURACY = 0.7
#: ... and per unit of the visible excess when only the robot tests tell of it (as the pose
#: fits' diagnostics do, ADR 0004), the rotation at least the translation over the arm's lever.
ABSORBED_TO_VISIBLE = 2.0


def _absorbed_size(acc_m, acc_rad, rep_m, rep_rad, factor, excess, lever_m) -> tuple[float, float]:
    """Per-axis 1-sigma (m, rad) of the robot error common to all views."""
    t, r = ABSORBED_PER_ACCURACY * acc_m, ABSORBED_PER_ACCURACY * acc_rad
    if excess:
        # the prior's widening beyond the declared figures is the error the images saw
        vt = math.hypot(rep_m, acc_m) * math.sqrt(max(float(factor[0]) - 1.0, 0.0))
        vr = math.hypot(rep_rad, acc_rad) * math.sqrt(max(float(factor[1]) - 1.0, 0.0))
        t, r = max(t, ABSORBED_TO_VISIBLE * vt), max(r, ABSORBED_TO_VISIBLE * vr)
        # an arm's error is joint errors turning links: its rotation is its translation over
        # the arm's lever, which the corrections' split cannot tell apart (they trade)
        r = max(r, t / max(lever_m, 1e-3))
        t = max(t, r * lever_m)
    return t, r


def _absorbed_covariance(X: np.ndarray, Z: np.ndarray, tau_t: float, tau_r: float) -> np.ndarray:
    """(21, 21) addition: a common flange-frame robot error moves one transform by
    ``Ad(T^-1) eps`` and a common base-frame one the other (eye-in-hand: X by the flange's, Z
    by the base's; eye-to-hand: Y by the flange's, X by the base's), each of size ``tau``."""
    D = np.diag([tau_t**2] * 3 + [tau_r**2] * 3)
    out = np.zeros((_chain.N_GLOBAL, _chain.N_GLOBAL))
    for sl, T in ((_chain.SL_X, X), (_chain.SL_Z, Z)):
        A = _chain.adjoint_batch(se3_inverse(T))
        out[sl, sl] = A @ D @ A.T
    return out


def _determined(covX: np.ndarray, X: np.ndarray, problem: str, frame: str, pose_level: CalibrationResult) -> None:
    """Refuse a primary rotation the fit determines only beyond ``MAX_ROTATION_SIGMA_RAD`` (ADR 0002)."""
    C = covX[3:, 3:]
    if not np.all(np.isfinite(C)):
        return
    lam, V = np.linalg.eigh(0.5 * (C + C.T))
    sig = math.sqrt(max(float(lam[-1]), 0.0))
    if sig <= MAX_ROTATION_SIGMA_RAD:
        return
    axis = X[:3, :3] @ V[:, -1]
    raise DegenerateGeometry(
        f"{problem}: the views determine the rotation about [{axis[0]:.3f}, {axis[1]:.3f}, {axis[2]:.3f}] "
        f"({frame} frame) only to {math.degrees(sig):.1f} deg (1 sigma): add views that rotate about another axis",
        axis=axis, frame=frame, axis_spread=pose_level.axis_spread,
        unrecoverable=("rotation about axis", "translation along axis"), max_rotation_rad=pose_level.max_motion_rad)


def _refit(setup, obj, img, view, G, st: _chain.ChainState, prob: _chain.ChainProblem, ids: np.ndarray, nv: int,
           max_iter: int) -> _chain.ChainState | None:
    """The chain refitted on views ``ids`` (repeats allowed) from the full answer, at the
    full fit's noise and priors."""
    o, im, vw = _subset(obj, img, view, ids, nv)
    sub = _chain.ChainProblem(setup, o, im, vw, G[ids], prob.sigma_px, prob.prior_sd[ids], prob.free,
                              k_prior=prob.k_prior, huber=prob.huber)
    s0 = _chain.ChainState(st.X.copy(), st.Z.copy(), st.k.copy(), st.d[ids].copy())
    s, _it, conv, _stop = _chain.refine_chain(sub, s0, max_iter)
    return s if np.all(np.isfinite(s.X)) and np.all(np.isfinite(s.Z)) else None


def _holdout(setup, obj, img, view, G, st, prob, O_f, ct_in, max_iter):
    nv = prob.n_views
    k = min(_HOLDOUT_FOLDS, nv)
    hv = np.full(nv, np.nan)
    ht = np.full(nv, np.inf)
    hr = np.full(nv, np.inf)
    sq, cnt = 0.0, 0
    for f in range(k):
        out = np.arange(f, nv, k)
        keep = np.setdiff1d(np.arange(nv), out)
        s = _refit(setup, obj, img, view, G, st, prob, keep, nv, max_iter)
        if s is None:
            continue
        o, im, vw = _subset(obj, img, view, out, nv)
        Gout = G[out]
        tmp = _chain.ChainProblem(setup, o, im, vw, Gout, prob.sigma_px, prob.prior_sd[out], prob.free)
        e = im - _project(s.k, tmp.poses(_chain.ChainState(s.X, s.Z, s.k, np.zeros((out.size, 6))))[0][vw], o)
        e2 = np.sum(e * e, axis=1)
        hv[out] = np.sqrt(np.bincount(vw, weights=e2, minlength=out.size) / np.bincount(vw, minlength=out.size))
        sq += float(e2.sum())
        cnt += int(e2.size)
        O_out, _c = _pnp(s.k, o, im, vw, out.size, start=O_f[out])
        t, r = _closures(setup, s.X, s.Z, Gout, O_out)
        ht[out], hr[out] = t, r
    h_rms = math.sqrt(sq / cnt) if cnt else math.nan
    in_rms = float(np.sqrt(np.mean(ct_in**2)))
    fin = ht[np.isfinite(ht)]
    infl = float(np.sqrt(np.mean(fin**2))) / in_rms if fin.size and in_rms > 0 else math.inf
    closure = HoldoutClosure(
        method="k-fold refit", folds=k, translation_m=ht, rotation_rad=hr,
        p50_translation_m=_percentile(ht, 50), p90_translation_m=_percentile(ht, 90),
        max_translation_m=float(np.max(ht)), p50_rotation_rad=_percentile(hr, 50),
        p90_rotation_rad=_percentile(hr, 90), max_rotation_rad=float(np.max(hr)), inflation=infl)
    return closure, hv, h_rms


def _bootstrap(setup, obj, img, view, G, st, prob, O_f, n_boot, seed, names, covX, covZ, with_cv, max_iter):
    """Views resampled with replacement, the chain refitted from the full answer; with the
    cross-check, OpenCV's closed forms on each replicate's distinct views (paired)."""
    rng = np.random.default_rng(seed)
    nv = prob.n_views
    xs: list[np.ndarray] = []
    zs: list[np.ndarray] = []
    pairs: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
    cv = False
    if with_cv:
        from cellcal.solver import camera_checks

        cv = camera_checks.closed_forms_available()
    for _ in range(n_boot):
        ids = np.sort(rng.integers(0, nv, nv))
        if np.unique(ids).size < MIN_VIEWS:
            continue
        s = _refit(setup, obj, img, view, G, st, prob, ids, nv, min(max_iter, 20))
        if s is None:
            continue
        xi_x = _chain.log_batch(se3_inverse(st.X) @ s.X)
        xi_z = _chain.log_batch(se3_inverse(st.Z) @ s.Z)
        xs.append(xi_x)
        zs.append(xi_z)
        if cv:
            from cellcal.solver import camera_checks

            u = np.unique(ids)
            try:
                sols = camera_checks.opencv_closed_forms(setup, G[u], O_f[u])
            except Exception:  # noqa: BLE001 - a closed form failing on a replicate is a figure, not an error
                sols = {}
            pairs.append((s.X, sols))
    if not xs:
        return None, []
    Xs, Zs = np.array(xs), np.array(zs)
    cx = np.cov(Xs.T) if len(xs) > 1 else np.full((6, 6), np.nan)
    cz = np.cov(Zs.T) if len(zs) > 1 else np.full((6, 6), np.nan)
    bt, br = sigma_figures(cx)
    at, ar = sigma_figures(covX)
    boot = Bootstrap(n=len(xs), n_requested=n_boot, seed=seed, covariance={names[0]: cx, names[1]: cz},
                     sigma_ratio_translation=bt / at if at > 0 else math.inf,
                     sigma_ratio_rotation=br / ar if ar > 0 else math.inf, primary=Xs)
    return boot, pairs
