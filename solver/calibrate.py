"""The calibrations, on one shared AX=XB solve (ADR 0003).

* :func:`calibrate_base_frame`: ``cell_T_target_i = cell_T_base @ base_T_flange_i @
  flange_T_target``. Motions ``A = M_j M_i^-1`` (cell frame),
  ``B = G_j G_i^-1`` (base frame), ``A X = X B`` with ``X = cell_T_base``.
* :func:`calibrate_hand_eye` (eye-in-hand): ``base_T_flange_i @ flange_T_camera @
  camera_T_target_i = base_T_target``. Motions ``A = G_j^-1 G_i`` (flange frame),
  ``B = O_j O_i^-1`` (camera frame), ``A X = X B`` with ``X = flange_T_camera``.
* :func:`calibrate_eye_to_hand` (camera fixed in the cell, target on the flange):
  ``base_T_camera @ camera_T_target_i = base_T_flange_i @ flange_T_target``, i.e. the base
  frame's absolute form with the robot on the measured side: motions ``A = G_j G_i^-1``
  (base frame), ``B = O_j O_i^-1`` (camera frame), ``A X = X B`` with ``X = base_T_camera``.
* :func:`calibrate_tool_point` (pivot): ``R_i p_tip + t_i = p_pivot``, solved through the
  Schur complement of its fixed 6x6 normal equations.

The AX=XB problems differ only in which side each relative motion is taken on and in how
the constant edge is recovered afterwards; all run one solve (``_solve_axxb`` in the shared
pipeline, :mod:`cellcal.solver._pose_solve`; the result types are in
:mod:`cellcal.solver.pose_results`). The pivot shares
the workspace, the validation and the observability test. Every failure follows ADR 0002.

By default the linear answer then seeds the maximum-likelihood refinement of
:mod:`cellcal.solver.refine` (ADR 0004), and every result carries its covariance, 1-sigma
figures, held-out closure (:mod:`cellcal.solver.validation`) and, when refined, its
agreement with the linear answer. ``refine=False`` returns the linear answer unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np

from cellcal.solver import _core
from cellcal.solver import _observability as _obs
from cellcal.solver import diagnostics as _diag
from cellcal.solver import refine as _refine
from cellcal.solver import refine_models as _refine_models
from cellcal.solver import refine_noise as _refine_noise
from cellcal.solver import sanity as _sanity
from cellcal.solver import validation as _validation
from cellcal.solver._pose_solve import (  # the shared pipeline; its constants are this module's API
    CHECK_SPREAD,
    DEFAULT_EXPECTED_TOLERANCE_M,
    DEFAULT_EXPECTED_TOLERANCE_RAD,
    DEFAULT_MIN_AXIS_SPREAD,
    DEFAULT_MIN_ROTATION_RAD,
    MAX_ROTATION_SIGMA_RAD,
    MIN_STATIONS,
    PIVOT_KEYS,
    POSE_KEYS,
    _absolute_linear,
    _add_model_error,
    _check_determined,
    _check_observable,
    _check_translation_mode,
    _common_warnings,
    _field_spec,
    _hand_eye_linear,
    _input_checks,
    _inverse_stack,
    _inverted_first_outcome,
    _pairing_check,
    _pose_blocks,
    _pose_finish,
    _PoseOutcome,
    _prepare,
    _readonly,
    _residuals,
    _solver_text,
    _stats_fields,
    _transform,
    _uncertainty_fields,
)
from cellcal.solver.errors import CalibrationError
from cellcal.solver.options import SolverOptions, SolverOptionsKeywords, resolve_options
from cellcal.solver.pose_results import (
    BaseFrameResult,
    CalibrationResult,
    Estimate,
    EyeToHandResult,
    HandEyeResult,
    Residuals,
    ToolPointResult,
)
from cellcal.solver.se3 import se3_adjoint, se3_inverse
from cellcal.solver.workspace import Workspace

__all__ = [
    "Residuals",
    "Estimate",
    "CalibrationResult",
    "BaseFrameResult",
    "HandEyeResult",
    "EyeToHandResult",
    "ToolPointResult",
    "calibrate_base_frame",
    "calibrate_hand_eye",
    "calibrate_eye_to_hand",
    "calibrate_tool_point",
    "DEFAULT_MIN_AXIS_SPREAD",
    "DEFAULT_MIN_ROTATION_RAD",
    "DEFAULT_EXPECTED_TOLERANCE_M",
    "DEFAULT_EXPECTED_TOLERANCE_RAD",
    "MAX_ROTATION_SIGMA_RAD",
    "CHECK_SPREAD",
    "MIN_STATIONS",
]

# --- public API ------------------------------------------------------------------------------------


@_core.bounded_buffers
def calibrate_base_frame(
    base_T_flange: np.ndarray,
    cell_T_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    cell_T_target_std: np.ndarray | None = None,
    cell_T_target_cov: np.ndarray | None = None,
    expected_cell_T_base: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> BaseFrameResult:
    """Where the robot base sits in the cell, from paired robot and tracker stations.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame from the controller's forward kinematics, m.
    cell_T_target : array_like, shape (N, 4, 4)
        The same stations measured by the tracker: target pose in the cell frame, m.
    options : SolverOptions, optional
        How to solve and what to trust (refinement, hold-out, noise figures, robust loss,
        refusal thresholds, reach, target offset, robot accuracy), documented once on
        :class:`~cellcal.solver.SolverOptions`; defaults when not given.
    workspace : Workspace, optional
        Preallocated buffers (capacity >= N). With one, a warmed-up solve allocates nothing
        that grows with N, and ``residuals`` are views into it.
    cell_T_target_std : array_like, shape (N, 6), optional
        Per-station 1-sigma from the instrument: ``(x, y, z)`` in m (cell axes), then
        ``(rx, ry, rz)`` in rad (about the target's axes). Excludes the scalar figures.
    cell_T_target_cov : array_like, shape (N, 6, 6), optional
        Per-station covariance from the instrument in the **cell** frame, ordered
        ``(dx, dy, dz)`` of the target origin (m), then ``dphi`` about the cell axes (rad),
        i.e. ``p' = p + dp`` and ``R' = Exp(dphi) R`` (e.g. from
        :meth:`~cellcal.solver.TrackerNoiseModel.pose_covariance`: a laser tracker's radial
        and transverse noise). The refinement whitens each station by its Cholesky factor.
        Excludes every other noise figure.
    expected_cell_T_base : array_like, shape (4, 4), optional
        The answer the cell drawing gives: an answer farther than the options' tolerances
        raises :class:`~cellcal.solver.PriorMismatch` (ADR 0014).
    capture_time_s : array_like, shape (N,), optional
        When each station was captured (s, any monotonic origin). Orders the stations for the
        pairing test: residuals that follow the step to the next or previous station raise
        ``"pairing_suspect"`` (rows shifted by one, or a robot moving during capture).
    capture_speed_m_s : array_like, shape (N,), optional
        The flange's speed when each station was captured (m/s): residuals that follow the
        motion raise ``"motion_during_capture"`` (a clock offset between robot and tracker).
    **overrides
        Any field of :class:`~cellcal.solver.SolverOptions` by name (``huber=3.0``,
        ``noise_translation_m=2e-5``, ...): applied over ``options``.

    Returns
    -------
    BaseFrameResult
        ``cell_T_base`` and ``flange_T_target`` with the closure figures; residuals are the
        closure of each ``cell_T_target[i]`` against ``cell_T_base @ base_T_flange[i] @
        flange_T_target``; covariances, held-out closure and linear agreement as described
        on :class:`CalibrationResult`.

    Raises
    ------
    ValueError
        Wrong shape, N mismatch, NaN/inf, a non-orthonormal rotation or a bad last row
        (the message names the array and station index); bad noise figures.
    NotEnoughSamples
        N < 3.
    DegenerateGeometry
        No rotation, or all rotation axes parallel (judged on the robot's exact motions):
        ``.axis`` is in the cell frame; the base's rotation about it and its translation
        along it are undetermined. Also for nearly parallel axes whose rotation the noise
        leaves undetermined beyond 0.1 rad, and for a half-turn ambiguity (ADR 0002).
    PriorMismatch, UnreachableStations
        The input checks of ``expected_cell_T_base`` and ``max_reach_m`` (ADR 0014).

    Notes
    -----
    Input sanity always runs: duplicated robot poses count once (``"duplicate_stations"``),
    translations far beyond a cell draw a ``"units"`` warning, beyond 100 km a
    ``ValueError``. The result says whether it ``converged``; its ``warnings`` and
    ``residual_tests`` say whether the residuals are the noise they claim to be.
    """
    o = resolve_options("calibrate_base_frame", options, overrides, POSE_KEYS)
    pairs, translation, refine, holdout, uncertainty = o.pairs, o.translation, o.refine, o.holdout, o.uncertainty
    min_axis_spread, min_rotation_rad, max_reach_m = o.min_axis_spread, o.min_rotation_rad, o.max_reach_m
    huber, reject_k, max_iterations = o.huber, o.reject_k, o.max_iterations
    problem = "base-frame calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, M), n, ws, clear = _prepare(
        [(base_T_flange, "base_T_flange"), (cell_T_target, "cell_T_target")], workspace, problem
    )
    masked, extra = _input_checks(G, M, n, ws, max_reach_m, "cell_T_target", clear)
    noise = _refine.prepare_noise(
        cell_T_target_std, "cell_T_target_std", o.noise_translation_m, o.noise_rotation_rad, n, ws, 6,
        cov=cell_T_target_cov, cov_name="cell_T_target_cov", R_meas=M[:, :3, :3],
    )
    field = _field_spec(G, o, n, capture_time_s, capture_speed_m_s, cov=cell_T_target_cov)
    Rx, tx, Ry, ty, m, obs = _absolute_linear(G, M, n, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
    X, Y = _transform(Rx, tx), _transform(Ry, ty)
    stats = _core.closure_stats(n, ws)

    def fit_subset(idx, k):
        Gs, Ms = ws.Gx[:k], ws.Gy[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")  # "raise" copies through a buffer
        np.take(M, idx, axis=0, out=Ms, mode="clip")
        try:
            r = _absolute_linear(Gs, Ms, k, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        return _transform(r[0], r[1]), _transform(r[2], r[3])

    out = _pose_finish(
        M=M, G=G, A0=X, B0=Y, n=n, ws=ws, owned=workspace is None, refine=refine,
        holdout=holdout, uncertainty=uncertainty, noise=noise, huber=huber, reject_k=reject_k,
        masked=masked, max_iterations=max_iterations,
        fit_subset=fit_subset, stats=stats, measurement_residuals=False,
        determinacy=lambda C: _check_determined(C[:6, :6], problem, "cell", obs, X), spread=obs.axis_spread,
        field=field,
    )
    noise_covX = out.cov[:6, :6].copy()
    out.cov = _add_model_error(out.cov, out.assessment, _pose_blocks(out, base=True))
    covX, covY = out.cov[:6, :6].copy(), out.cov[6:, 6:].copy()
    _check_determined(noise_covX, problem, "cell", obs, out.A)
    if out.probe_cov is not None:
        _check_determined(out.probe_cov[:6, :6], problem, "cell", obs, out.A)
    _sanity.check_prior(out.A, expected_cell_T_base, o.expected_tolerance_m, o.expected_tolerance_rad, "cell_T_base")
    _pairing_check(out, out.assessment, extra, lambda g, m_: calibrate_base_frame(
        g, m_, refine=False, holdout=False, uncertainty=False, max_target_offset_m=None,
        min_axis_spread=0.0).rms_translation_m, G, M, capture_time_s)
    if not any(w.code == "units" for w in extra):  # millimetres: the units warning says what is wrong
        _sanity.check_offset(out.B[:3, 3], o.max_target_offset_m, "flange_T_target", "the tracker target")
    linear = f"quaternion-linear AX=XB rotation ({pairs} pairs), {translation} translation"
    return BaseFrameResult(
        n_stations=n, n_motions=m, **_stats_fields(out.stats),
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="cell",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver=_solver_text(linear, out, huber, reject_k),
        cell_T_base=out.A, flange_T_target=out.B,
        cell_T_base_covariance=covX, flange_T_target_covariance=covY,
        linear_agreement=_validation.agreement(X, out.A, covX) if out.refined else None,
        **_uncertainty_fields(out, covX, workspace is None, _common_warnings(out, extra), noise_covX),
    )


@_core.bounded_buffers
def calibrate_hand_eye(
    base_T_flange: np.ndarray,
    camera_T_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    camera_T_target_std: np.ndarray | None = None,
    camera_T_target_cov: np.ndarray | None = None,
    expected_flange_T_camera: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> HandEyeResult:
    """Eye-in-hand calibration: the camera on the flange, from views of a static target.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    camera_T_target : array_like, shape (N, 4, 4)
        The static target as the camera sees it at each station, m.
    options, workspace, capture_time_s, capture_speed_m_s, **overrides
        As for :func:`calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`;
        ``max_target_offset_m`` does not apply: a camera's mount is checked by its prior).
    camera_T_target_std : array_like, shape (N, 6), optional
        Per-station 1-sigma from the instrument: ``(x, y, z)`` in m, then ``(rx, ry, rz)``
        in rad. Excludes the scalar figures.
    camera_T_target_cov : array_like, shape (N, 6, 6), optional
        Per-station covariance in the **camera** frame, ``(dp, dphi)`` as
        ``cell_T_target_cov`` of :func:`calibrate_base_frame`.
    expected_flange_T_camera : array_like, shape (4, 4), optional
        Input sanity as for :func:`calibrate_base_frame`, on ``flange_T_camera`` (ADR 0014).

    Returns
    -------
    HandEyeResult
        ``flange_T_camera`` and ``base_T_target``; residuals are the closure of each
        ``base_T_flange[i] @ flange_T_camera @ camera_T_target[i]`` against ``base_T_target``
        (the same lengths as ``camera_T_target[i]`` against its prediction).

    Raises
    ------
    ValueError, NotEnoughSamples, DegenerateGeometry
        As for :func:`calibrate_base_frame`; ``DegenerateGeometry.axis`` is in the flange
        frame (the camera's rotation about it and translation along it are undetermined).
    """
    o = resolve_options("calibrate_hand_eye", options, overrides, POSE_KEYS)
    pairs, translation, refine, holdout, uncertainty = o.pairs, o.translation, o.refine, o.holdout, o.uncertainty
    min_axis_spread, min_rotation_rad, max_reach_m = o.min_axis_spread, o.min_rotation_rad, o.max_reach_m
    huber, reject_k, max_iterations = o.huber, o.reject_k, o.max_iterations
    problem = "hand-eye calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, O), n, ws, clear = _prepare(
        [(base_T_flange, "base_T_flange"), (camera_T_target, "camera_T_target")], workspace, problem
    )
    masked, extra = _input_checks(G, O, n, ws, max_reach_m, "camera_T_target", clear)
    noise = _refine.prepare_noise(
        camera_T_target_std, "camera_T_target_std", o.noise_translation_m, o.noise_rotation_rad, n, ws, 6,
        cov=camera_T_target_cov, cov_name="camera_T_target_cov", R_meas=O[:, :3, :3],
    )
    spec = _field_spec(G, o, n, capture_time_s, capture_speed_m_s, a_cols=slice(6, 12))

    def field(state):
        # The robot's error enters on the target's side: inv(Exp(xi) G) = inv(G) Exp(-xi),
        # a right twist -Ad(inv(base_T_target)) xi of base_T_target.
        return dataclasses.replace(spec, robot_map=-se3_adjoint(se3_inverse(state[1])))

    Rx, tx, Rz, tz, m, obs = _hand_eye_linear(G, O, n, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
    X, Z = _transform(Rx, tx), _transform(Rz, tz)
    stats = _core.closure_stats(n, ws)
    # Model form: O_i = inv(X) inv(G_i) Z, the camera's own measurement space.
    Ginv = _inverse_stack(G, ws.Gz[:n], ws)

    def fit_subset(idx, k):
        Gs, Os = ws.Gx[:k], ws.Gy[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")  # "raise" copies through a buffer
        np.take(O, idx, axis=0, out=Os, mode="clip")
        try:
            r = _hand_eye_linear(Gs, Os, k, ws, pairs, pair_t, min_axis_spread, min_rotation_rad)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        return se3_inverse(_transform(r[0], r[1])), _transform(r[2], r[3])

    out = _pose_finish(
        M=O, G=Ginv, A0=se3_inverse(X), B0=Z, n=n, ws=ws, owned=workspace is None,
        refine=refine, holdout=holdout, uncertainty=uncertainty, noise=noise, huber=huber,
        reject_k=reject_k, masked=masked,
        max_iterations=max_iterations, fit_subset=fit_subset, stats=stats,
        measurement_residuals=False,
        determinacy=lambda C: _check_determined(C[:6, :6], problem, "flange", obs, np.eye(4)),
        spread=obs.axis_spread, field=field,
    )
    out.cov = _add_model_error(out.cov, out.assessment, _pose_blocks(out, base=False))
    if out.probe_cov is not None:  # model form: A's child frame is the flange
        _check_determined(out.probe_cov[:6, :6], problem, "flange", obs, np.eye(4))
    _pairing_check(out, out.assessment, extra, lambda g, m_: calibrate_hand_eye(
        g, m_, refine=False, holdout=False, uncertainty=False, min_axis_spread=0.0).rms_translation_m,
        G, O, capture_time_s)
    Xo, covX, covZ, common = _inverted_first_outcome(
        out, X, n, m, obs, "flange", pairs, translation, huber, ws, workspace is None, reject_k, extra
    )
    _check_determined(out.noise_cov[:6, :6], problem, "flange", obs, np.eye(4))
    _sanity.check_prior(Xo, expected_flange_T_camera, o.expected_tolerance_m, o.expected_tolerance_rad, "flange_T_camera")
    return HandEyeResult(
        **common, flange_T_camera=Xo, base_T_target=out.B,
        flange_T_camera_covariance=covX, base_T_target_covariance=covZ,
    )


@_core.bounded_buffers
def calibrate_eye_to_hand(
    base_T_flange: np.ndarray,
    camera_T_target: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    camera_T_target_std: np.ndarray | None = None,
    camera_T_target_cov: np.ndarray | None = None,
    expected_base_T_camera: np.ndarray | None = None,
    capture_time_s: np.ndarray | None = None,
    capture_speed_m_s: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> EyeToHandResult:
    """Eye-to-hand (robot-world / hand-eye) calibration: a camera fixed in the cell sees a
    target carried on the flange.

    Model ``base_T_camera @ camera_T_target_i = base_T_flange_i @ flange_T_target``
    (``X O_i = G_i Y``): both constant edges are unknown. It is the base frame's absolute
    form with the robot on the measured side, so the same shared AX=XB solve runs on the
    motions ``G_j G_i^-1`` (base frame) and ``O_j O_i^-1`` (camera frame); the refinement
    then fits ``camera_T_target_i = inv(base_T_camera) @ base_T_flange_i @ flange_T_target``
    in the camera's measurement space.

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    camera_T_target : array_like, shape (N, 4, 4)
        The flange-mounted target as the fixed camera sees it at each station, m.
    options, workspace, capture_time_s, capture_speed_m_s, **overrides
        As for :func:`calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`; the
        options' ``max_target_offset_m`` applies to the target's distance from the flange).
    camera_T_target_std : array_like, shape (N, 6), optional
        Per-station 1-sigma from the instrument: ``(x, y, z)`` in m, then ``(rx, ry, rz)``
        in rad. Excludes the scalar figures.
    camera_T_target_cov : array_like, shape (N, 6, 6), optional
        Per-station covariance in the **camera** frame, ``(dp, dphi)`` as
        ``cell_T_target_cov`` of :func:`calibrate_base_frame`.
    expected_base_T_camera : array_like, shape (4, 4), optional
        Input sanity as for :func:`calibrate_base_frame`, on ``base_T_camera`` (ADR 0014).

    Returns
    -------
    EyeToHandResult
        ``base_T_camera`` and ``flange_T_target``; residuals are the closure of each
        ``camera_T_target[i]`` against ``inv(base_T_camera) @ base_T_flange[i] @
        flange_T_target`` (camera frame), for the linear answer too.

    Raises
    ------
    ValueError, NotEnoughSamples
        As for :func:`calibrate_base_frame`.
    DegenerateGeometry
        No rotation, or all the flange's rotation axes parallel: ``.axis`` is in the robot
        base frame; the camera's rotation about it and its translation along it are
        undetermined.
    """
    o = resolve_options("calibrate_eye_to_hand", options, overrides, POSE_KEYS)
    pairs, translation, refine, holdout, uncertainty = o.pairs, o.translation, o.refine, o.holdout, o.uncertainty
    min_axis_spread, min_rotation_rad, max_reach_m = o.min_axis_spread, o.min_rotation_rad, o.max_reach_m
    huber, reject_k, max_iterations = o.huber, o.reject_k, o.max_iterations
    problem = "eye-to-hand calibration"
    pair_t = _check_translation_mode(translation, pairs)
    (G, O), n, ws, clear = _prepare(
        [(base_T_flange, "base_T_flange"), (camera_T_target, "camera_T_target")], workspace, problem
    )
    masked, extra = _input_checks(G, O, n, ws, max_reach_m, "camera_T_target", clear)
    noise = _refine.prepare_noise(
        camera_T_target_std, "camera_T_target_std", o.noise_translation_m, o.noise_rotation_rad, n, ws, 6,
        cov=camera_T_target_cov, cov_name="camera_T_target_cov", R_meas=O[:, :3, :3],
    )
    field = _field_spec(G, o, n, capture_time_s, capture_speed_m_s)
    labels: dict[str, Any] = dict(problem=problem, frame="base", what_rot="camera rotation",
                                  what_trans="camera translation", robot_is_g=False)
    # G_i = X O_i inv(Y): the base frame's form with G measured and O as the "robot".
    Rx, tx, Ryi, tyi, m, obs = _absolute_linear(
        O, G, n, ws, pairs, pair_t, min_axis_spread, min_rotation_rad, **labels
    )
    X, Y = _transform(Rx, tx), se3_inverse(_transform(Ryi, tyi))
    stats = _core.closure_stats(n, ws)

    def fit_subset(idx, k):
        Gs, Os = ws.Gx[:k], ws.Gy[:k]
        np.take(G, idx, axis=0, out=Gs, mode="clip")  # "raise" copies through a buffer
        np.take(O, idx, axis=0, out=Os, mode="clip")
        try:
            r = _absolute_linear(Os, Gs, k, ws, pairs, pair_t, min_axis_spread, min_rotation_rad, **labels)
        except (CalibrationError, np.linalg.LinAlgError, FloatingPointError):
            return None
        return se3_inverse(_transform(r[0], r[1])), se3_inverse(_transform(r[2], r[3]))

    out = _pose_finish(
        M=O, G=G, A0=se3_inverse(X), B0=Y, n=n, ws=ws, owned=workspace is None,
        refine=refine, holdout=holdout, uncertainty=uncertainty, noise=noise, huber=huber,
        reject_k=reject_k, masked=masked,
        max_iterations=max_iterations, fit_subset=fit_subset, stats=stats,
        measurement_residuals=True,
        determinacy=lambda C: _check_determined(C[:6, :6], problem, "base", obs, np.eye(4)),
        spread=obs.axis_spread, field=field,
    )
    out.cov = _add_model_error(out.cov, out.assessment, _pose_blocks(out, base=True))
    if out.probe_cov is not None:  # model form: A's child frame is the robot base
        _check_determined(out.probe_cov[:6, :6], problem, "base", obs, np.eye(4))
    _pairing_check(out, out.assessment, extra, lambda g, m_: calibrate_eye_to_hand(
        g, m_, refine=False, holdout=False, uncertainty=False, max_target_offset_m=None,
        min_axis_spread=0.0).rms_translation_m, G, O, capture_time_s)
    Xo, covX, covY, common = _inverted_first_outcome(
        out, X, n, m, obs, "base", pairs, translation, huber, ws, workspace is None, reject_k, extra
    )
    _check_determined(out.noise_cov[:6, :6], problem, "base", obs, np.eye(4))
    _sanity.check_prior(Xo, expected_base_T_camera, o.expected_tolerance_m, o.expected_tolerance_rad, "base_T_camera")
    if not any(w.code == "units" for w in extra):
        _sanity.check_offset(out.B[:3, 3], o.max_target_offset_m, "flange_T_target", "the target")
    return EyeToHandResult(
        **common, base_T_camera=Xo, flange_T_target=out.B,
        base_T_camera_covariance=covX, flange_T_target_covariance=covY,
    )


@_core.bounded_buffers
def calibrate_tool_point(
    base_T_flange: np.ndarray,
    *,
    options: SolverOptions | None = None,
    workspace: Workspace | None = None,
    expected_flange_p_tip: np.ndarray | None = None,
    **overrides: Unpack[SolverOptionsKeywords],
) -> ToolPointResult:
    """Pivot calibration: the tool tip on the flange, held at one point while the flange turns.

    Solves ``[R_i  -I] [p_tip; p_pivot] = -t_i`` in least squares through its fixed 6x6
    normal equations (eliminating ``p_pivot`` leaves a 3x3 SPD system).

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses in the robot base frame, m.
    options, workspace, **overrides
        As for :func:`calibrate_base_frame` (:class:`~cellcal.solver.SolverOptions`). The
        pivot uses ``pairs`` (the relative rotations the observability test looks at),
        ``min_axis_spread``, ``min_rotation_rad``, ``holdout``, ``noise_translation_m``,
        ``expected_tolerance_m``, ``max_reach_m`` and ``max_target_offset_m``; the rest of a
        record is ignored, and as a keyword is a ``TypeError``.
    expected_flange_p_tip : array_like, shape (3,), optional
        The tip from the tool's drawing, m: an answer farther than the options'
        ``expected_tolerance_m`` raises :class:`~cellcal.solver.PriorMismatch` (ADR 0014).

    The pivot is linear least squares, so its leave-one-out (``holdout``) through the hat
    matrix is exact, not linearised. ``noise_translation_m`` is the per-axis 1-sigma of
    the tip's position scatter (m); estimated from the residuals
    (``sum |r|^2 / (3N - 6)``) when not given. The least-squares answer does not depend on
    it, only the covariance does: an estimated figure's is scaled by ``r / (r - 2)``,
    ``r = 3N - 6`` (few degrees of freedom, ADR 0004); a given one is tested against the
    scatter (chi-square), and the scatter is tested for a pattern in the flange position
    (``warnings``, ``residual_tests``). A tip farther from the flange than
    ``max_target_offset_m`` is refused (:class:`~cellcal.solver.ImplausibleGeometry`).

    Huber and ``reject_k`` are not offered: the pivot is one closed-form linear solve;
    screen outlier stations by their residuals and solve again.

    Returns
    -------
    ToolPointResult
        ``flange_p_tip`` and ``base_p_pivot``; residuals are the tip position scatter
        ``|R_i p_tip + t_i - p_pivot|`` (rotation residuals are zero); covariance
        ``sigma^2 (A^T A)^-1`` of ``[p_tip; p_pivot]`` with ``A_i = [R_i, -I]``.

    Raises
    ------
    ValueError, NotEnoughSamples
        As for :func:`calibrate_base_frame`.
    DegenerateGeometry
        All relative rotations about one axis (flange frame): the tip position along it
        cannot be recovered.
    """
    o = resolve_options("calibrate_tool_point", options, overrides, PIVOT_KEYS)
    pairs, holdout, min_axis_spread, min_rotation_rad = o.pairs, o.holdout, o.min_axis_spread, o.min_rotation_rad
    noise_translation_m, max_reach_m, expected_tolerance_m = o.noise_translation_m, o.max_reach_m, o.expected_tolerance_m
    problem = "tool-point calibration"
    _core.check_pair_scheme(pairs)
    (G,), n, ws, _ = _prepare([(base_T_flange, "base_T_flange")], workspace, problem)
    masked, extra = _input_checks(G, None, n, ws, max_reach_m, "")
    if masked:
        # A weighted pivot is not offered (closed form): merging the copies is exact here,
        # the copies' residuals are equal, so count the group once in the noise estimate.
        pass
    np.einsum("kij->ij", G[:, :3, :3], out=ws.R3)
    obs = _obs.observability(ws.R3, n, "right", G[:, :3, :3], ws)
    _check_observable(
        obs, frame="flange", problem=problem, what_rot="(nothing:) the flange",
        what_trans="tip position", min_axis_spread=min_axis_spread,
        min_rotation_rad=min_rotation_rad,
    )
    sigma_given = _refine_noise._check_sigma(noise_translation_m, "noise_translation_m")
    p_tip, p_pivot = _core.pivot_solve(G[:, :3, :3], G[:, :3, 3], ws)
    ws.res_r[:n] = 0.0
    rms_t, max_t, _, _ = _core.closure_stats(n, ws)
    # pivot_solve leaves R_i p + t_i - c in ws.v3b: the residual vectors.
    n_eff = float(ws.mask[:n].sum()) if masked else float(n)
    dof = int(round(3 * n_eff)) - 6
    chi = float(np.vdot(ws.res_t[:n], ws.res_t[:n])) if not masked else float(
        np.vdot(ws.res_t[:n] * ws.res_t[:n], ws.mask[:n]))
    if sigma_given is not None:
        sigma = sigma_given
    else:
        sigma = max(math.sqrt(chi / dof), _refine.NOISE_FLOOR_M) if dof > 0 else _refine.DEFAULT_NOISE_TRANSLATION_M
    nz = _refine.Noise(sigma, math.nan, sigma_given is None, False, False, 3,
                       start_t=sigma_given if sigma_given is not None else _refine.DEFAULT_NOISE_TRANSLATION_M)
    model = _refine.PivotModel(G[:, :3, :3], ws.v3b[:n], sigma, n, ws)
    if masked:
        # Duplicated poses count once: scale their rows by sqrt(1/k).
        Jw, ew, _ = model.views()
        np.sqrt(ws.mask[:n], out=ws.hsw[:n])
        _refine_models._rowscale(ws.hsw[:n], Jw, ws.KJ[: n * 18].reshape(n, 3, 6))
        np.copyto(Jw, ws.KJ[: n * 18].reshape(n, 3, 6))
        _refine_models._rowscale(ws.hsw[:n], ew, ws.e3[:n])
        np.copyto(ew, ws.e3[:n])
    H = ws.H12[:6, :6]
    J2 = ws.Jw[: n * 18].reshape(3 * n, 6)
    np.matmul(J2.T, J2, out=H)
    try:
        hinv = np.linalg.inv(H)
    except np.linalg.LinAlgError:  # excluded by the observability gate; kept for safety
        hinv = np.full((6, 6), np.inf)
    fit = _refine.Fit((p_tip, p_pivot), hinv, chi / (sigma * sigma), chi / (sigma * sigma), dof, 0, True,
                      ws.down[:0], nz, stop_reason="closed-form least squares")
    if dof >= _refine.MIN_NOISE_REDUNDANCY or sigma_given is not None:
        nz.redundancy_t = float(dof)
    else:
        nz.fallback_t, nz.sigma_t = True, nz.start_t
    assessment = _diag.assess(model, fit, nz, n, ws, robot_p=G[:, :3, 3], a_cols=slice(3, 6), huber=None,
                              masked=masked, converged=True, estimated_ok=not nz.fallback_t,
                              blocks=((0, 3), (3, 3)))
    cov = assessment.covariance * (nz.sigma_t / sigma) ** 2 if nz.fallback_t else assessment.covariance
    noise_cov = cov
    if assessment.model_error:
        cov = cov.copy()
        cov[:3, :3] += assessment.tau_t ** 2 * np.eye(3)
        cov[3:, 3:] += assessment.tau_t ** 2 * np.eye(3)
    ho = None
    if holdout and n >= _validation.MIN_HOLDOUT_STATIONS and np.all(np.isfinite(hinv)):
        _validation.loo_linearised(model, n, ws, hinv)
        ho = _validation.closure_from_buffers("leave-one-out (exact, linear model)", n, n, ws,
                                              workspace is None, rms_t)
    tip_cov = cov[:3, :3].copy()
    tr = float(np.trace(tip_cov))
    if expected_flange_p_tip is not None:
        _check_point_prior(p_tip, expected_flange_p_tip, expected_tolerance_m, "flange_p_tip")
    _sanity.check_offset(p_tip, o.max_target_offset_m, "flange_p_tip", "the tool tip")
    out = _PoseOutcome(None, None, cov, None, fit, ho, False, nz, assessment, True)
    tests = _diag.with_inflation(assessment.tests, _pad6(noise_cov[:3, :3]), _pad6(cov[:3, :3]))
    return ToolPointResult(
        n_stations=n, n_motions=0,
        rms_translation_m=rms_t, max_translation_m=max_t,
        rms_rotation_rad=0.0, max_rotation_rad=0.0,
        axis_spread=obs.axis_spread, weakest_axis=obs.axis.copy(), axis_frame="flange",
        max_motion_rad=obs.max_rotation_rad,
        residuals=_residuals(ws, n, workspace is None),
        solver="pivot least squares (6x6 normal equations, Schur complement)",
        flange_p_tip=p_tip, base_p_pivot=p_pivot,
        covariance=cov, flange_p_tip_covariance=tip_cov, base_p_pivot_covariance=cov[3:, 3:].copy(),
        sigma_translation_mm=1e3 * math.sqrt(tr) if math.isfinite(tr) else math.inf,
        sigma_rotation_deg=0.0, noise_translation_m=nz.sigma_t, noise_rotation_rad=math.nan,
        noise_source=nz.describe(), chi2=chi / (nz.sigma_t * nz.sigma_t), dof=dof, refined=False,
        converged=True, iterations=0, stop_reason="closed-form least squares",
        downweighted=_readonly(ws.down[:0], workspace is None), holdout=ho,
        warnings=_common_warnings(out, extra), residual_tests=tests,
    )


def _pad6(C3: np.ndarray) -> np.ndarray:
    out = np.zeros((6, 6))
    out[:3, :3] = C3
    return out


def _check_point_prior(p: np.ndarray, expected, tol_m: float, name: str) -> None:
    from cellcal.solver.errors import PriorMismatch

    e = np.asarray(expected, dtype=float).reshape(-1)
    if e.shape != (3,) or not np.all(np.isfinite(e)):
        raise ValueError(f"expected_{name}: expected 3 finite numbers, got {expected!r}")
    if not (math.isfinite(float(tol_m)) and float(tol_m) > 0.0):
        raise ValueError(f"expected_tolerance_m must be a positive finite number, got {tol_m!r}")
    d = float(np.linalg.norm(p - e))
    if d > tol_m:
        raise PriorMismatch(
            f"{name} is {1e3 * d:.1f} mm from the expected one (tolerance {1e3 * tol_m:.1f} mm): check the "
            "tool drawing, or whether the poses are in millimetres",
            translation_m=d, rotation_rad=0.0, tolerance_m=tol_m, tolerance_rad=math.inf, name=name,
        )
