"""The results of the camera hand-eye solves (ADR 0027): what both setups report.

Defined apart from :mod:`cellcal.solver.hand_eye_camera` (which computes them) so the solve stays
readable; every name is re-exported there and from :mod:`cellcal.solver`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver.calibrate import CalibrationResult, Estimate
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.intrinsics import CornerResiduals
from cellcal.solver.se3 import se3_inverse
from cellcal.solver.target import CalibrationTarget
from cellcal.solver.uncertainty import PredictedError, point_error

__all__ = ["CameraResidualTests", "Bootstrap", "CameraChainResult", "HandEyeCameraResult", "EyeToHandCameraResult",
           "FALSE_ALARM"]

#: Probability that noise alone raises ``model_error`` (split over the tests that run).
FALSE_ALARM = 0.01


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
    false_alarm_rate: float = FALSE_ALARM


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
