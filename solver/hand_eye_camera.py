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
from typing import Any, NamedTuple

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver import _camera_options as _options
from cellcal.solver import _stats
from cellcal.solver._camera_fit import (
    MIN_VIEWS,
    _bootstrap,
    _closures,
    _consistency_test,
    _fit,
    _holdout,
    _implied_corrections,
    _pnp,
    _project,
    _redundancies,
    _structure_test,
)
from cellcal.solver._camera_options import UNSET, Unset
from cellcal.solver.calibrate import (
    MAX_ROTATION_SIGMA_RAD,
    CalibrationResult,
    Residuals,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
)
from cellcal.solver.camera_model import N_PARAMETERS, PARAMETER_NAMES, CameraModel, camera_matrix_from_parameters
from cellcal.solver.camera_results import (
    FALSE_ALARM,
    Bootstrap,
    CameraChainResult,
    CameraResidualTests,
    EyeToHandCameraResult,
    HandEyeCameraResult,
)
from cellcal.solver.diagnostics import ResidualTests, SolveWarning
from cellcal.solver.errors import DegenerateGeometry, NotEnoughSamples
from cellcal.solver.intrinsics import MIN_VIEW_CORNERS, CornerResiduals, IntrinsicsResult, calibrate_intrinsics
from cellcal.solver.options import SolverOptions, resolve_options
from cellcal.solver.se3 import check_transform, se3_inverse
from cellcal.solver.target import CalibrationTarget
from cellcal.solver.uncertainty import sigma_figures
from cellcal.solver.validation import agreement

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
#: Estimated corner noise never goes below this (px): noise-free data reach the rounding floor.
NOISE_FLOOR_PX = 1e-6
_MAX_ITERATIONS = 50
_DEFAULT_OPTIONS = SolverOptions()
_FALSE_ALARM = FALSE_ALARM
_WARN_HOLDOUT = 1.5
_WARN_BOOTSTRAP = 2.0
_OUTLIER_SIGMAS = 5.0


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
    options: SolverOptions | None = None,
    noise_px: float | None = None,
    robot_repeatability_m: float = DEFAULT_REPEATABILITY_M,
    robot_repeatability_rad: float = DEFAULT_REPEATABILITY_RAD,
    robot_accuracy_m: float | Unset = UNSET,
    robot_accuracy_rad: float = 0.0,
    huber: float | None | Unset = UNSET,
    holdout: bool | Unset = UNSET,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    cross_check: bool = True,
    seed: int = 0,
    max_iterations: int | Unset = UNSET,
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
    options : SolverOptions, optional
        The shared record (:class:`~cellcal.solver.SolverOptions`, whose fields are
        documented there). It fills every keyword below that is not given; a keyword given
        overrides it. Used: ``huber``, ``holdout``, ``max_iterations`` and
        ``robot_accuracy_m`` as the keywords of those names (below); ``pairs``,
        ``translation``, ``min_axis_spread``, ``min_rotation_rad`` and ``max_reach_m`` by
        the AX=XB start, and ``max_target_offset_m`` by the eye-to-hand start (the target's
        distance from the flange). Ignored (nothing here for them to act on, so one record
        serves a cell): ``uncertainty`` (this solve always refines and computes its
        covariance), ``expected_tolerance_m``, ``expected_tolerance_rad`` (no prior is
        taken), ``min_point_spread``, and ``noise_translation_m`` and ``noise_rotation_rad``
        (the tracker's noise: this fit's measurements are corners, ``noise_px``). Refused, a
        ``ValueError`` naming the field and this function, when not at its default:
        ``refine`` (always refined) and ``reject_k`` (no station is dropped).
    noise_px : float, optional
        Declared corner noise (1-sigma per axis, px); estimated if omitted.
    robot_repeatability_m, robot_repeatability_rad : float
        The robot's pose repeatability, 1-sigma per axis (m, rad) in the flange frame.
    robot_accuracy_m, robot_accuracy_rad : float
        Its absolute accuracy, 1-sigma per axis, added to the per-view prior (ADR 0027);
        default 0. Not given, ``robot_accuracy_m`` is the record's (a 3-D RMS) divided by
        sqrt(3), or 0 when the record's is None.
    huber : float, optional
        Huber loss on each corner's whitened length at this many sigmas; default the
        record's (None: plain least squares).
    holdout : bool
        k-fold held-out views (5 folds; needs 6 views); default the record's (True).
    n_bootstrap : int
        Bootstrap replicates over views (0: none; the OpenCV cross-check is judged only with 10 or more).
    cross_check : bool
        Run OpenCV's five closed forms on the PnP poses.
    seed : int
        The bootstrap's.
    max_iterations : int
        Iterations of the image fit at most; default 50, or the record's when it is not at
        its own default (20, the pose solves' budget).
    **axxb
        The AX=XB start's fields of the record as keywords, overriding it (``pairs``,
        ``translation``, ``min_axis_spread``, ``min_rotation_rad``, ``max_reach_m``,
        ``max_target_offset_m``); any other is a ``TypeError``.

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
    UnreachableStations, ImplausibleGeometry
        The AX=XB start's input checks (``max_reach_m``, ``max_target_offset_m``; ADR 0014).
    ValueError
        Malformed input, naming the view or station; a field of ``options`` this solve cannot
        honour, naming it.
    TypeError
        ``options`` is not a :class:`~cellcal.solver.SolverOptions`, or an unexpected keyword.
    """
    return _calibrate(_chain.EYE_IN_HAND, views, target, base_T_flange, intrinsics, intrinsics_covariance,
                      intrinsics_mode, image_size, noise_px, robot_repeatability_m, robot_repeatability_rad,
                      robot_accuracy_rad, n_bootstrap, cross_check, seed,
                      _settings("calibrate_hand_eye_camera", options, huber, holdout, max_iterations, robot_accuracy_m, axxb))


def calibrate_eye_to_hand_camera(
    views: Sequence[Any],
    target: CalibrationTarget,
    base_T_flange: np.ndarray,
    *,
    intrinsics: IntrinsicsResult | CameraModel | None = None,
    intrinsics_covariance: np.ndarray | None = None,
    intrinsics_mode: str | None = None,
    image_size: tuple[int, int] | None = None,
    options: SolverOptions | None = None,
    noise_px: float | None = None,
    robot_repeatability_m: float = DEFAULT_REPEATABILITY_M,
    robot_repeatability_rad: float = DEFAULT_REPEATABILITY_RAD,
    robot_accuracy_m: float | Unset = UNSET,
    robot_accuracy_rad: float = 0.0,
    huber: float | None | Unset = UNSET,
    holdout: bool | Unset = UNSET,
    n_bootstrap: int = DEFAULT_N_BOOTSTRAP,
    cross_check: bool = True,
    seed: int = 0,
    max_iterations: int | Unset = UNSET,
    **axxb: Any,
) -> EyeToHandCameraResult:
    """Eye-to-hand on the image: the camera fixed, the target on the flange.

    Parameters (``options`` among them) and raises as :func:`calibrate_hand_eye_camera`;
    ``DegenerateGeometry.axis`` is in the robot base frame.

    Returns
    -------
    EyeToHandCameraResult
    """
    return _calibrate(_chain.EYE_TO_HAND, views, target, base_T_flange, intrinsics, intrinsics_covariance,
                      intrinsics_mode, image_size, noise_px, robot_repeatability_m, robot_repeatability_rad,
                      robot_accuracy_rad, n_bootstrap, cross_check, seed,
                      _settings("calibrate_eye_to_hand_camera", options, huber, holdout, max_iterations, robot_accuracy_m, axxb))


class _Settings(NamedTuple):
    """The keywords and record of one camera hand-eye call, resolved."""

    huber: float | None
    holdout: bool
    max_iterations: int
    robot_accuracy_m: float
    start: dict[str, Any]  # the AX=XB start's keywords


#: The record's fields the AX=XB start uses, and the keywords ``**axxb`` takes (ADR 0004).
START_FIELDS = frozenset({"pairs", "translation", "min_axis_spread", "min_rotation_rad", "max_reach_m",
                          "max_target_offset_m"})
#: The record's fields these solves cannot honour: a non-default value is a ``ValueError``.
REFUSED_FIELDS = ("refine", "reject_k")


def _settings(fn: str, options: SolverOptions | None, huber: float | None | Unset, holdout: bool | Unset,
              max_iterations: int | Unset, robot_accuracy_m: float | Unset, axxb: dict[str, Any]) -> _Settings:
    """The keywords given, else the record's fields (converted), else the solve's defaults."""
    o = _options.record(fn, options)
    _options.refuse(fn, o, REFUSED_FIELDS)
    start = resolve_options(fn, o, axxb, START_FIELDS)
    if isinstance(robot_accuracy_m, Unset):
        # the record's is the 3-D RMS flange error, this solve's the 1-sigma per axis
        robot_accuracy_m = 0.0 if o.robot_accuracy_m is None else o.robot_accuracy_m / math.sqrt(3.0)
    if isinstance(max_iterations, Unset):
        # the record's default is the pose solves' budget; the image fit has its own
        max_iterations = _MAX_ITERATIONS if o.max_iterations == _DEFAULT_OPTIONS.max_iterations else o.max_iterations
    return _Settings(
        huber=o.huber if isinstance(huber, Unset) else huber,
        holdout=o.holdout if isinstance(holdout, Unset) else holdout,
        max_iterations=max_iterations, robot_accuracy_m=robot_accuracy_m,
        start={k: getattr(start, k) for k in sorted(START_FIELDS)})


def _calibrate(setup, views, target, base_T_flange, intrinsics, intrinsics_covariance, intrinsics_mode, image_size,
               noise_px, rep_m, rep_rad, acc_rad, n_bootstrap, cross_check, seed, settings: _Settings):
    huber, holdout, max_iterations, acc_m = settings.huber, settings.holdout, settings.max_iterations, \
        settings.robot_accuracy_m
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
    init_kw = settings.start
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
        # A held-out view has no fitted pose correction: it is predicted from the robot's pose as
        # reported. Its yardstick is the fit's views predicted the same way (the full answer with
        # zero corrections), not their corrected residuals: on an arm with model error those are
        # the corner noise, and the ratio to them is the robot's error, not the chain leaning on
        # particular views (the demo's eye-in-hand cell warned at 76x with every estimate within
        # its sigma).
        P0, _D0 = prob.poses(_chain.ChainState(st.X, st.Z, st.k, np.zeros((nv, 6))))
        e0 = img - _project(st.k, P0[view], obj)
        in_rms = max(rms_px, math.sqrt(float(np.mean(np.sum(e0 * e0, axis=1)))))
        if math.isfinite(h_rms) and h_rms > _WARN_HOLDOUT * in_rms and not floor:
            warnings.append(SolveWarning(code="holdout", value=h_rms / in_rms, message=(
                f"held-out views reproject at {h_rms:.3f} px RMS, {h_rms / in_rms:.2f}x the fit's {in_rms:.3f} px "
                "(its views predicted from the robot's poses as reported, as a held-out view is): the chain "
                "leans on particular views")))

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
