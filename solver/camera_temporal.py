"""The camera's residual latency against the robot, from frames taken while moving (ADR 0027).

The dynamic reversal test of the validation ladder: a camera whose images are stamped
``tau`` early shows the robot where it is ``tau`` after the pose the images were paired with,
so every moving frame's error is the flange's velocity times ``tau``; a spatial error of the
calibration is the same whichever way and however fast the robot passes. Frames taken along
a path in both directions at two speeds separate the two: :func:`estimate_latency` fits
``tau`` on the image corners of those frames through the calibrated chain
(:mod:`cellcal.solver._camera_chain`: the view's flange pose ``base_T_flange @ [exp(tau
omega_b), tau v_b]``, the body twist from the velocity given), with each view's robot pose
under its prior as in the calibration, and the calibration's own uncertainty carried into
the latency's sigma (consider covariance from the result's joint covariance).

Sign: ``tau > 0`` means the images show the robot *later* than the robot state they were
paired with: add ``tau`` to the camera's mid-exposure stamps (or subtract it from the
robot's) before interpolating.

Not modelled: a rolling shutter's row times (each row its own ``tau``; the simulated camera
has a global shutter by default) and motion blur's asymmetry (the simulated and a real
global-shutter exposure blur symmetrically about mid-exposure).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver.camera_model import project
from cellcal.solver.diagnostics import SolveWarning
from cellcal.solver.errors import NotEnoughSamples
from cellcal.solver.intrinsics import MIN_VIEW_CORNERS

__all__ = ["LatencyEstimate", "estimate_latency", "DEFAULT_MAX_LATENCY_MS"]

#: Above this residual latency (ms) a warning names it: at 0.25 m/s, 1 ms is 0.25 mm.
DEFAULT_MAX_LATENCY_MS = 1.0
#: A frame moves "along the path" when its speed is above this share of the fastest's.
_MOVING_SHARE = 0.1
_MIN_PER_DIRECTION = 2
#: Rotation counts as the displacement it causes at this distance when the path's direction is found.
_LEVER_M = 0.5


@dataclass(frozen=True, kw_only=True, eq=False)
class LatencyEstimate:
    """The residual latency of the camera against the robot.

    Attributes
    ----------
    latency_ms : float
        ``tau`` (module docstring: positive when the images lag the robot state), ms.
    sigma_ms : float
        Its 1-sigma: the frames' corner noise and the robot's repeatability, and the
        calibration's uncertainty (``sigma_noise_ms`` without the latter).
    sigma_noise_ms : float
    n_frames, n_forward, n_backward : int
        Frames used, and those moving each way along the path's main direction.
    speeds_m_s : numpy.ndarray, shape (n,)
        Each frame's flange speed (translation), m/s.
    reprojection_rms_px, rms_at_zero_px : float
        RMS residual with the latency fitted and with none.
    noise_px : float
        Corner noise of the moving frames (estimated unless declared).
    bound_ms : float
    converged : bool
    stop_reason : str
    warnings : tuple of SolveWarning
        ``"latency"`` (beyond ``bound_ms``), ``"latency_undetermined"`` (sigma beyond it).
    """

    latency_ms: float
    sigma_ms: float
    sigma_noise_ms: float
    n_frames: int
    n_forward: int
    n_backward: int
    speeds_m_s: np.ndarray
    reprojection_rms_px: float
    rms_at_zero_px: float
    noise_px: float
    bound_ms: float
    converged: bool
    stop_reason: str
    warnings: tuple[SolveWarning, ...]


def estimate_latency(
    result: Any,
    views: Sequence[Any],
    base_T_flange: np.ndarray,
    flange_velocity: np.ndarray,
    *,
    max_latency_ms: float = DEFAULT_MAX_LATENCY_MS,
    noise_px: float | None = None,
    huber: float | None = None,
    max_iterations: int = 30,
) -> LatencyEstimate:
    """Residual latency from frames taken while moving (module docstring).

    Parameters
    ----------
    result : HandEyeCameraResult or EyeToHandCameraResult
        The static calibration (its transforms, intrinsics, robot priors, joint covariance).
    views : sequence
        The moving frames' detections (``ids``, ``image_points_px``) as for the calibration.
    base_T_flange : array_like, shape (N, 4, 4)
        The robot's flange pose interpolated to each frame's (mapped) mid-exposure, m.
    flange_velocity : array_like, shape (N, 6)
        The flange's velocity there, base frame: the flange origin's linear velocity (m/s)
        then the angular velocity (rad/s), as a robot controller reports its TCP speed.
    max_latency_ms : float
        Warn above this.
    noise_px : float, optional
        Declared corner noise of the moving frames; estimated if omitted.
    huber : float, optional
    max_iterations : int

    Returns
    -------
    LatencyEstimate

    Raises
    ------
    NotEnoughSamples
        Fewer than two moving frames each way along the path.
    ValueError
        Shapes that do not pair up.
    """
    from cellcal.solver.hand_eye_camera import _poses, _views

    tgt = result.target
    checked = _views(views, tgt)
    G_all = _poses(base_T_flange, len(checked))
    V = np.asarray(flange_velocity, dtype=float)
    if V.shape != (len(checked), 6) or not np.all(np.isfinite(V)):
        raise ValueError(f"flange_velocity must be ({len(checked)}, 6) finite (v m/s, omega rad/s), got {V.shape}")
    used = [i for i, (ids, _) in enumerate(checked) if ids.shape[0] >= MIN_VIEW_CORNERS]
    G, V = G_all[used], V[used]
    speeds = np.linalg.norm(V[:, :3], axis=1)
    s = np.concatenate([V[:, :3], _LEVER_M * V[:, 3:]], axis=1)
    w, E = np.linalg.eigh(s.T @ s)
    proj = s @ E[:, -1]
    moving = np.abs(proj) > _MOVING_SHARE * float(np.max(np.abs(proj), initial=0.0))
    n_fw, n_bw = int(np.sum(moving & (proj > 0))), int(np.sum(moving & (proj < 0)))
    if min(n_fw, n_bw) < _MIN_PER_DIRECTION:
        raise NotEnoughSamples(min(n_fw, n_bw), _MIN_PER_DIRECTION, "latency estimate", hint=(
            f"frames moving each way along the path ({n_fw} one way, {n_bw} the other): pass the path in both "
            "directions, at two speeds"))
    nv = len(used)
    obj = np.concatenate([tgt.corner_points(checked[i][0]) for i in used])
    img = np.concatenate([checked[i][1] for i in used])
    view = np.concatenate([np.full(checked[i][0].shape[0], j, dtype=np.intp) for j, i in enumerate(used)])
    # the body twist: G(t + tau) = G [exp(tau R^T omega), tau R^T v]
    Rt = np.swapaxes(G[:, :3, :3], 1, 2)
    twist = np.concatenate([(Rt @ V[:, :3, None])[:, :, 0], (Rt @ V[:, 3:, None])[:, :, 0]], axis=1)
    sd = np.array([math.hypot(result.robot_repeatability_m, result.robot_accuracy_m)] * 3
                  + [math.hypot(result.robot_repeatability_rad, result.robot_accuracy_rad)] * 3)
    sd = np.tile(sd * np.repeat(np.sqrt(result.robot_variance_factor), 3), (nv, 1))
    free = np.zeros(_chain.N_GLOBAL + 1, dtype=bool)
    free[_chain.I_TAU] = True
    k = np.asarray(result.intrinsics, float)
    X, Z = result.transforms().values()
    state = _chain.ChainState(X.value.copy(), Z.value.copy(), k.copy(), np.zeros((nv, 6)), 0.0)
    sigma = float(noise_px) if noise_px is not None else float(result.noise_px)
    prob0 = _chain.ChainProblem(result.setup, obj, img, view, G, sigma, sd, free, twist=twist, huber=huber)
    rms0 = float(np.sqrt(np.mean(np.sum(prob0.residual_px(state) ** 2, axis=1))))
    conv, stop = False, _chain.STOP_ITERATIONS
    for _round in range(8):
        prob = _chain.ChainProblem(result.setup, obj, img, view, G, sigma, sd, free, twist=twist, huber=huber)
        state, _it, conv, stop = _chain.refine_chain(prob, state, max_iterations)
        if noise_px is not None or not conv:
            break
        r = prob.residual_px(state)
        Sinv, Cd, pieces = prob.covariance(state)
        info = 1.0 / sd**2
        p_tot = 1 + 6 * nv
        r_img = 2 * r.shape[0] - (p_tot - float(np.sum(np.einsum("nii->ni", Cd) * info)))
        f = float(np.sum(prob.weights(r)[:, None] * r * r)) / sigma**2 / max(r_img, 1.0)
        if abs(f - 1.0) < 0.01:
            break
        sigma *= math.sqrt(f)
    prob = _chain.ChainProblem(result.setup, obj, img, view, G, sigma, sd, free, twist=twist, huber=huber)
    Sinv, _Cd, _pieces = prob.covariance(state)
    var_noise = float(Sinv[_chain.I_TAU, _chain.I_TAU])
    # the calibration's own uncertainty, carried through the information with every global free
    full = _chain.ChainProblem(result.setup, obj, img, view, G, sigma, sd, np.ones_like(free), twist=twist, huber=huber)
    _r, _w, U, Vb, W, gg, gv = full.normal(state)
    _dg, _dd, S, _Vi = full.solve(U, Vb, W, gg, gv, 0.0)
    t = _chain.I_TAU
    A = -S[t, :t] / S[t, t]
    Cg = np.asarray(result.joint_covariance, float)
    var = var_noise + float(A @ Cg @ A)
    r = img - project(state.k, prob.poses(state)[0][view], obj).uv
    rms = float(np.sqrt(np.mean(np.sum(r * r, axis=1))))
    tau_ms, sig_ms = 1e3 * state.tau, 1e3 * math.sqrt(max(var, 0.0))
    warnings: list[SolveWarning] = []
    if abs(tau_ms) > max_latency_ms:
        warnings.append(SolveWarning(code="latency", value=tau_ms, message=(
            f"the camera's images lag the robot's poses by {tau_ms:+.2f} ms (1 sigma {sig_ms:.2f} ms), beyond the "
            f"{max_latency_ms:g} ms bound: at {float(speeds.max()):.2f} m/s that is {abs(tau_ms) * float(speeds.max()):.2f} "
            "mm; correct the camera's stamps (mid-exposure, clock mapping) before using it on a moving robot")))
    if sig_ms > max_latency_ms:
        warnings.append(SolveWarning(code="latency_undetermined", value=sig_ms, message=(
            f"the moving frames determine the latency only to {sig_ms:.2f} ms (1 sigma), more than the "
            f"{max_latency_ms:g} ms bound: move faster or take more frames")))
    return LatencyEstimate(
        latency_ms=tau_ms, sigma_ms=sig_ms, sigma_noise_ms=1e3 * math.sqrt(max(var_noise, 0.0)), n_frames=nv,
        n_forward=n_fw, n_backward=n_bw, speeds_m_s=speeds, reprojection_rms_px=rms, rms_at_zero_px=rms0,
        noise_px=sigma, bound_ms=float(max_latency_ms), converged=conv, stop_reason=stop, warnings=tuple(warnings))

