"""Cross-checks of a camera hand-eye result: OpenCV's closed forms and an independent tracker (ADR 0027).

**OpenCV's five** ``calibrateHandEye`` methods (TSAI, PARK, HORAUD, ANDREFF, DANIILIDIS) run
on the very PnP poses and robot poses the result was fitted from
(:attr:`~cellcal.solver.hand_eye_camera.CameraChainResult.pnp_camera_T_target`). The
mapping (OpenCV's ``a2b`` names ``b_T_a``): eye-in-hand ``gripper2base = base_T_flange``,
``target2cam = camera_T_target``, answer ``cam2gripper = flange_T_camera``; eye-to-hand the
same call with ``inv(base_T_flange)`` in the ``gripper2base`` slot answers ``base_T_camera``
(the robot's motion seen from the flange instead of the base). ``method=`` always by keyword.
Verified at zero noise in ``tests/test_hand_eye_camera.py`` (1e-9 m).

Judging a disagreement needs the difference's own spread: the closed forms are noisier than
the image-level fit, so a distance in the result's sigmas says little. The bootstrap over
views (:class:`~cellcal.solver.hand_eye_camera.Bootstrap`) runs the five on each replicate's
views beside the refit (paired), and the observed difference of each method from the result
is measured in the covariance of those paired differences, against the prediction form of
Hotelling's T^2 at 0.1 % (``(B+1)(B-1)p / (B(B-p)) F(p, B-p)``, p = 6, B replicates). The
result *agrees* when the closest method lies inside that gate. Without 10 replicates the
figures are reported and not judged (``agrees`` None).

OpenCV is imported when a cross-check runs, never when the solver is: it is a core
dependency (ADR 0021) but the estimate does not need it, and a missing or 5.x install
(which binds no ``calibrateHandEye``) makes the cross-check ``None`` with a warning.

**Tracker check** (:func:`tracker_check`): points a laser tracker measured in the cell
against the camera chain's prediction of them through a known ``cell_T_base``: a reflector
on the static target (eye-in-hand, through ``base_T_target``), the tracker's target on the
flange located by the camera (eye-in-hand, ``base_T_target @ camera_T_target_v^-1 @
flange_T_camera^-1``: the flange where the camera's view of the static target puts it, not
where the robot says it is), a reflector on the flange's
target seen by the camera (eye-to-hand, ``base_T_camera @ camera_T_target_v``) or carried by
the robot (``base_T_flange_v @ flange_T_target``). The closure carries its own covariance
(the result's, ``cell_T_base``'s, the per-view PnP's or the robot's, and the tracker's, with
the correlations the shared transforms make) and is tested as a chi-square over all points
at ``alpha`` (0.1 %) and per point at ``alpha / K``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver import _stats
from cellcal.solver.se3 import hat, make_transform, rotation_angle, se3_inverse

__all__ = ["METHODS", "CrossCheck", "TrackerCheck", "opencv_closed_forms", "opencv_cross_check",
           "closed_forms_available", "tracker_check", "CROSS_CHECK_ALPHA", "MIN_BOOTSTRAP_FOR_GATE"]

METHODS = ("TSAI", "PARK", "HORAUD", "ANDREFF", "DANIILIDIS")
CROSS_CHECK_ALPHA = 1e-3
MIN_BOOTSTRAP_FOR_GATE = 10
_TRACKER_ALPHA = 1e-3


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        return None
    return cv2 if hasattr(cv2, "calibrateHandEye") else None


def closed_forms_available() -> bool:
    """OpenCV with ``calibrateHandEye`` is importable."""
    return _cv2() is not None


def opencv_closed_forms(setup: str, base_T_flange: np.ndarray, camera_T_target: np.ndarray) -> dict[str, np.ndarray]:
    """The primary transform (``flange_T_camera`` or ``base_T_camera``) by each of OpenCV's
    five methods (module docstring); a method that fails or returns non-finite gives NaNs.

    Raises
    ------
    ImportError
        OpenCV without ``calibrateHandEye``.
    """
    cv2 = _cv2()
    if cv2 is None:
        raise ImportError("OpenCV's calibrateHandEye is not available: pip install 'opencv-python-headless>=4.8,<5'")
    G = np.asarray(base_T_flange, float)
    A = G if setup == _chain.EYE_IN_HAND else _chain.inverse_batch(G)
    O = np.asarray(camera_T_target, float)
    Ra = [a[:3, :3].copy() for a in A]
    ta = [a[:3, 3].reshape(3, 1).copy() for a in A]
    Ro = [o[:3, :3].copy() for o in O]
    to = [o[:3, 3].reshape(3, 1).copy() for o in O]
    out: dict[str, np.ndarray] = {}
    for name in METHODS:
        code = getattr(cv2, f"CALIB_HAND_EYE_{name}")
        try:
            R, t = cv2.calibrateHandEye(Ra, ta, Ro, to, method=code)
            T = make_transform(np.asarray(R, float), np.asarray(t, float).reshape(3))
        except cv2.error:
            T = np.full((4, 4), np.nan)
        if not np.all(np.isfinite(T)):
            T = np.full((4, 4), np.nan)
        out[name] = T
    return out


@dataclass(frozen=True, kw_only=True, eq=False)
class CrossCheck:
    """The result against OpenCV's closed forms on the same PnP poses (module docstring).

    Attributes
    ----------
    name : str
        The transform compared (``flange_T_camera`` or ``base_T_camera``).
    methods : tuple of str
    transforms : dict of str to numpy.ndarray (4, 4)
        Each method's answer (NaN where it failed).
    translation_m, rotation_rad : dict of str to float
        Each answer's distance from the result's (m) and the angle between them (rad).
    distance : dict of str to float
        Mahalanobis length of each difference under its paired-bootstrap covariance (NaN
        when not judged).
    gate : float
        The length within which a difference is noise (NaN when not judged).
    spread_translation_m, spread_rotation_rad : float
        Largest pairwise distance and angle among the methods that returned an answer.
    closest : str
        The method nearest the result (by ``distance`` when judged, else translation).
    agrees : bool or None
        ``closest`` lies inside ``gate``; None without enough bootstrap replicates.
    n_bootstrap : int
        Replicates behind the difference covariances.
    failed : tuple of str
        Methods that returned no answer.
    """

    name: str
    methods: tuple[str, ...]
    transforms: dict[str, np.ndarray]
    translation_m: dict[str, float]
    rotation_rad: dict[str, float]
    distance: dict[str, float]
    gate: float
    spread_translation_m: float
    spread_rotation_rad: float
    closest: str
    agrees: bool | None
    n_bootstrap: int
    failed: tuple[str, ...]


def _gate(B: int, p: int = 6, alpha: float = CROSS_CHECK_ALPHA) -> float:
    """Prediction form of Hotelling's T^2 at level ``alpha``, as a length."""
    f = _stats.f_ppf(1.0 - alpha, p, B - p)
    return math.sqrt((B + 1) * (B - 1) * p / (B * (B - p)) * f)


def opencv_cross_check(setup: str, base_T_flange: np.ndarray, camera_T_target: np.ndarray, X: np.ndarray,
                       covX: np.ndarray, boot_pairs: list[tuple[np.ndarray, dict[str, np.ndarray]]]) -> CrossCheck | None:
    """OpenCV's five on ``(base_T_flange, camera_T_target)`` against the result's ``X``;
    ``boot_pairs`` are the bootstrap's ``(X_b, {method: X_m,b})`` (module docstring). None
    when OpenCV has no ``calibrateHandEye``."""
    if not closed_forms_available():
        return None
    sols = opencv_closed_forms(setup, base_T_flange, camera_T_target)
    name = "flange_T_camera" if setup == _chain.EYE_IN_HAND else "base_T_camera"
    ok = [m for m in METHODS if np.all(np.isfinite(sols[m]))]
    failed = tuple(m for m in METHODS if m not in ok)
    dt = {m: float(np.linalg.norm(sols[m][:3, 3] - X[:3, 3])) if m in ok else math.inf for m in METHODS}
    dr = {m: rotation_angle(X[:3, :3].T @ sols[m][:3, :3]) if m in ok else math.inf for m in METHODS}
    spread_t = max((float(np.linalg.norm(sols[a][:3, 3] - sols[b][:3, 3])) for a in ok for b in ok), default=math.nan)
    spread_r = max((rotation_angle(sols[a][:3, :3].T @ sols[b][:3, :3]) for a in ok for b in ok), default=math.nan)
    dist = {m: math.nan for m in METHODS}
    B = 0
    gate = math.nan
    for m in ok:
        diffs = [_chain.log_batch(se3_inverse(Xb) @ s[m]) for Xb, s in boot_pairs
                 if m in s and np.all(np.isfinite(s[m]))]
        if len(diffs) < MIN_BOOTSTRAP_FOR_GATE:
            continue
        D = np.array(diffs)
        C = np.cov(D.T)
        xi = _chain.log_batch(se3_inverse(X) @ sols[m])
        try:
            dist[m] = math.sqrt(max(float(xi @ np.linalg.solve(C, xi)), 0.0))
        except np.linalg.LinAlgError:
            dist[m] = math.inf
        B = len(diffs) if B == 0 else min(B, len(diffs))
    judged = [m for m in ok if math.isfinite(dist[m]) or dist[m] == math.inf]
    if judged and B >= MIN_BOOTSTRAP_FOR_GATE:
        gate = _gate(B)
        closest = min(judged, key=lambda m: dist[m])
        agrees: bool | None = bool(dist[closest] <= gate)
    else:
        closest = min(ok, key=lambda m: dt[m]) if ok else METHODS[0]
        agrees = None
    return CrossCheck(name=name, methods=METHODS, transforms=sols, translation_m=dt, rotation_rad=dr, distance=dist,
                      gate=gate, spread_translation_m=spread_t, spread_rotation_rad=spread_r, closest=closest,
                      agrees=agrees, n_bootstrap=B, failed=failed)


# -- the tracker ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class TrackerCheck:
    """The camera chain's prediction of tracker-measured points against the tracker.

    Attributes
    ----------
    via : {"target", "camera", "robot"}
        What predicted the points (:func:`tracker_check`).
    residuals_m : numpy.ndarray, shape (K, 3)
        Measured minus predicted, cell frame, m.
    distances_m : numpy.ndarray, shape (K,)
    sigma_m : numpy.ndarray, shape (K,)
        Each point's predicted 1-sigma (root of the trace of its covariance, the tracker's
        noise included), m.
    gate_m : numpy.ndarray, shape (K,)
        The distance along a point's worst direction its residual may reach at ``alpha / K``.
    rms_m, max_m : float
    nees : float
        Joint ``e^T C^-1 e`` over every point (with the correlations of shared transforms).
    dof : int
        ``3 K``.
    p_value : float
        ``P(chi2_dof > nees)``.
    alpha : float
    passed : bool
        ``p_value >= alpha`` and every point inside its gate.
    """

    via: str
    residuals_m: np.ndarray
    distances_m: np.ndarray
    sigma_m: np.ndarray
    gate_m: np.ndarray
    rms_m: float
    max_m: float
    nees: float
    dof: int
    p_value: float
    alpha: float
    passed: bool


def _point_jac(T: np.ndarray, p: np.ndarray) -> np.ndarray:
    """(K, 3, 6): d(T exp(xi) p) / d xi = R [I, -[p]x], for points (K, 3)."""
    J = np.zeros((p.shape[0], 3, 6))
    J[:, :, :3] = T[:3, :3]
    J[:, :, 3:] = -T[:3, :3] @ np.array([hat(q) for q in p])
    return J


def _via_flange(result: Any, target_p: np.ndarray, K: int, views: np.ndarray | None,
                target_p_covariance: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Eye-in-hand ``via="flange"``: the predicted points ``b`` (K, 3), base frame, their
    covariance (3K, 3K) from the shared ``[flange_T_camera, base_T_target]`` (jointly, with
    their correlation), each view's PnP and the flange point's own, and ``d b / d target_p``
    (3K, 3)."""
    fp = np.asarray(target_p, float).reshape(3)
    idx = np.arange(result.n_stations) if views is None else np.asarray(views, dtype=int).reshape(-1)
    if idx.shape[0] != K:
        raise ValueError(f"{K} measured points but {idx.shape[0]} views")
    X, Z = result.flange_T_camera, result.base_T_target
    Xi = se3_inverse(X)
    u = Xi[:3, :3] @ fp + Xi[:3, 3]  # the flange point in the camera frame
    C = np.zeros((3 * K, 3 * K))
    b = np.zeros((K, 3))
    J_shared = np.zeros((3 * K, 12))
    Jp = np.zeros((3 * K, 3))  # the one flange point, shared by every view
    for j, v in enumerate(idx):
        Oi = se3_inverse(result.pnp_camera_T_target[v])
        s_t = Oi[:3, :3] @ u + Oi[:3, 3]  # ... in the target frame
        P = Z @ Oi
        b[j] = Z[:3, :3] @ s_t + Z[:3, 3]
        sl = slice(3 * j, 3 * j + 3)
        # right perturbations: X exp(x) -> exp(-x) X^-1, O exp(o) -> exp(-o) O^-1, Z exp(z)
        J_shared[sl, :6] = -_point_jac(P, u[None])[0]
        J_shared[sl, 6:] = _point_jac(Z, s_t[None])[0]
        Jo = -_point_jac(Z, s_t[None])[0]
        C[sl, sl] += Jo @ result.pnp_covariance[v] @ Jo.T
        Jp[sl] = P[:3, :3] @ Xi[:3, :3]
    C += J_shared @ result.joint_covariance[:12, :12] @ J_shared.T
    if target_p_covariance is not None:
        C += Jp @ np.asarray(target_p_covariance, float).reshape(3, 3) @ Jp.T
    return b, C, Jp


def tracker_check(
    result: Any,
    cell_p_measured: np.ndarray,
    *,
    target_p: np.ndarray,
    cell_T_base: np.ndarray,
    tracker_noise_m: float | np.ndarray,
    cell_T_base_covariance: np.ndarray | None = None,
    via: str | None = None,
    views: np.ndarray | None = None,
    target_p_covariance: np.ndarray | None = None,
    cell_T_base_target_p_covariance: np.ndarray | None = None,
    alpha: float = _TRACKER_ALPHA,
) -> TrackerCheck:
    """Closure of the camera chain against a laser tracker (module docstring).

    Parameters
    ----------
    result : HandEyeCameraResult or EyeToHandCameraResult
    cell_p_measured : array_like, shape (K, 3)
        The tracker's points in the cell frame, m.
    target_p : array_like, shape (K, 3) or (3,)
        Eye-in-hand ``via="target"``: each reflector's position on the static target (target
        frame, m); ``via="flange"``: the tracker's target on the flange (flange frame, m; a
        base-frame calibration's ``flange_T_target``), the same at every view.
        Eye-to-hand: the reflector's position on the flange's target (target frame), the
        same at every view.
    cell_T_base : array_like, shape (4, 4)
        The robot base in the cell (a base-frame calibration), m.
    tracker_noise_m : float or array_like, shape (K, 3, 3)
        The tracker's 1-sigma per axis (m) or each point's covariance (m^2), cell frame.
    cell_T_base_covariance : array_like, shape (6, 6), optional
        Right perturbation ``(rho, phi)`` (base frame) of ``cell_T_base``; None: exact.
    via : {"target", "flange", "camera", "robot"}, optional
        Eye-in-hand: ``"target"`` (default) or ``"flange"``
        (``base_T_target @ camera_T_target_v^-1 @ flange_T_camera^-1 @ target_p``, the view's
        own PnP). Eye-to-hand: ``"camera"``
        (default; ``base_T_camera @ camera_T_target_v @ target_p``, the view's own PnP) or
        ``"robot"`` (``base_T_flange_v @ flange_T_target @ target_p``).
    views : array_like of int, shape (K,), optional
        Eye-to-hand and ``via="flange"``: the result's view (index into its views) of each measurement; all views
        in order by default.
    target_p_covariance : array_like, shape (3, 3), optional
        ``via="flange"``: the covariance of ``target_p`` (flange frame, m^2; None: exact).
    cell_T_base_target_p_covariance : array_like, shape (6, 3), optional
        ``via="flange"``: the cross-covariance of ``cell_T_base``'s right perturbation and
        ``target_p`` when both come from one base-frame fit (its joint covariance); needs
        both their covariances. None: uncorrelated.
    alpha : float
        The test's level.

    Returns
    -------
    TrackerCheck

    Raises
    ------
    ValueError
        Shapes that do not pair up, or ``via`` not offered by the setup.
    """
    c = np.asarray(cell_p_measured, float).reshape(-1, 3)
    K = c.shape[0]
    Xc = np.asarray(cell_T_base, float)
    setup = result.setup
    tp = np.asarray(target_p, float)
    Jp = None
    cross = None if cell_T_base_target_p_covariance is None else np.asarray(cell_T_base_target_p_covariance, float)
    if cross is not None and (via != "flange" or cross.shape != (6, 3) or cell_T_base_covariance is None
                              or target_p_covariance is None):
        raise ValueError("cell_T_base_target_p_covariance is a (6, 3) cross-covariance for via='flange' with both "
                         f"cell_T_base_covariance and target_p_covariance given (got shape {cross.shape}, via {via!r})")
    if setup == _chain.EYE_IN_HAND and via == "flange":
        b, C, Jp = _via_flange(result, tp, K, views, target_p_covariance)
    elif setup == _chain.EYE_IN_HAND:
        via = via or "target"
        if via != "target":
            raise ValueError(f"an eye-in-hand result is checked via 'target' or 'flange', not {via!r}")
        tp = tp.reshape(-1, 3)
        if tp.shape[0] != K:
            raise ValueError(f"{K} measured points but {tp.shape[0]} target points")
        Zt = result.base_T_target
        b = (Zt[:3, :3] @ tp.T).T + Zt[:3, 3]
        J_shared = _point_jac(Zt, tp).reshape(3 * K, 6)
        C = J_shared @ result.base_T_target_covariance @ J_shared.T
    else:
        via = via or "camera"
        if via not in ("camera", "robot"):
            raise ValueError(f"an eye-to-hand result is checked via 'camera' or 'robot', not {via!r}")
        tp = tp.reshape(3)
        idx = np.arange(result.n_stations) if views is None else np.asarray(views, dtype=int).reshape(-1)
        if idx.shape[0] != K:
            raise ValueError(f"{K} measured points but {idx.shape[0]} views")
        C = np.zeros((3 * K, 3 * K))
        b = np.zeros((K, 3))
        if via == "camera":
            X = result.base_T_camera
            for j, v in enumerate(idx):
                O = result.pnp_camera_T_target[v]
                q = O[:3, :3] @ tp + O[:3, 3]
                b[j] = X[:3, :3] @ q + X[:3, 3]
                Jo = _point_jac(X @ O, tp[None])[0]
                C[3 * j:3 * j + 3, 3 * j:3 * j + 3] += Jo @ result.pnp_covariance[v] @ Jo.T
            qs = np.array([result.pnp_camera_T_target[v][:3, :3] @ tp + result.pnp_camera_T_target[v][:3, 3] for v in idx])
            J_shared = _point_jac(X, qs).reshape(3 * K, 6)
            C += J_shared @ result.base_T_camera_covariance @ J_shared.T
        else:
            Y = result.flange_T_target
            yp = Y[:3, :3] @ tp + Y[:3, 3]
            sd2 = (np.array([math.hypot(result.robot_repeatability_m, result.robot_accuracy_m)] * 3
                            + [math.hypot(result.robot_repeatability_rad, result.robot_accuracy_rad)] * 3) ** 2
                   * np.repeat(result.robot_variance_factor, 3))
            rows = []
            for j, v in enumerate(idx):
                Gv = result.base_T_flange[v]
                b[j] = Gv[:3, :3] @ yp + Gv[:3, 3]
                Jr = _point_jac(Gv, yp[None])[0]
                C[3 * j:3 * j + 3, 3 * j:3 * j + 3] += (Jr * sd2) @ Jr.T
                rows.append(_point_jac(Gv @ Y, tp[None])[0])
            J_shared = np.concatenate(rows)
            C += J_shared @ result.flange_T_target_covariance @ J_shared.T
    pred = (Xc[:3, :3] @ b.T).T + Xc[:3, 3]
    Rc = np.kron(np.eye(K), Xc[:3, :3])
    C = Rc @ C @ Rc.T
    if cell_T_base_covariance is not None:
        Jx = _point_jac(Xc, b).reshape(3 * K, 6)
        C += Jx @ np.asarray(cell_T_base_covariance, float) @ Jx.T
        if cross is not None and Jp is not None:
            # One base-frame fit gave both: the flange point's and the base's errors correlate.
            Cx = Jx @ cross @ (Rc @ Jp).T
            C += Cx + Cx.T
    tn = np.asarray(tracker_noise_m, float)
    if tn.ndim == 0:
        C += float(tn) ** 2 * np.eye(3 * K)
    else:
        tn = tn.reshape(K, 3, 3)
        for j in range(K):
            C[3 * j:3 * j + 3, 3 * j:3 * j + 3] += tn[j]
    e = c - pred
    ef = e.reshape(-1)
    nees = float(ef @ np.linalg.solve(C, ef))
    dof = 3 * K
    p = _stats.chi2_sf(nees, dof)
    q3 = _stats.chi2_ppf(1.0 - alpha / K, 3)
    sig = np.empty(K)
    gate = np.empty(K)
    inside = True
    for j in range(K):
        Cj = C[3 * j:3 * j + 3, 3 * j:3 * j + 3]
        sig[j] = math.sqrt(max(float(np.trace(Cj)), 0.0))
        gate[j] = math.sqrt(q3 * max(float(np.linalg.eigvalsh(Cj)[-1]), 0.0))
        inside &= float(e[j] @ np.linalg.solve(Cj, e[j])) <= q3
    d = np.linalg.norm(e, axis=1)
    return TrackerCheck(via=via, residuals_m=e, distances_m=d, sigma_m=sig, gate_m=gate,
                        rms_m=float(np.sqrt(np.mean(d * d))), max_m=float(d.max()), nees=nees, dof=dof, p_value=p,
                        alpha=alpha, passed=bool(p >= alpha and inside))
