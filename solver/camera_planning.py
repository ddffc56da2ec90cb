"""Station planning for hand-eye with a camera (ADR 0027): what the image-level fit needs.

:func:`plan_camera_stations` chooses N robot stations for an eye-in-hand (camera on the
flange, target fixed) or eye-to-hand (camera fixed, target on the flange) calibration:

* **Feasible** stations only: joints within their limits, the flange in the workspace box,
  **every corner** of the target in the image with ``margin_px`` to spare and in front of the
  camera, the target **facing** the camera within ``cone_deg`` (the angle between the board's
  normal and its line of sight to the camera), and **large** enough in the image (the
  diagonal of the corners' bounding box at least ``min_target_fraction`` of the image's).
* **Information**: each candidate's Fisher information of the image-level model
  (:mod:`cellcal.solver._camera_chain`: projected corners with ``noise_px``, the view's robot
  correction under its repeatability marginalised out), so rotation excitation about several
  axes (AX=XB's observability, ADR 0002), the tilt the intrinsics need when they are
  estimated jointly, and the target's size and distance all count in one figure. The
  stations maximise the smallest eigenvalue (E-optimal, as :func:`cellcal.solver.planning.plan_stations`)
  of the primary transform's marginal information (``flange_T_camera`` or ``base_T_camera``;
  rotations scaled by ``lever_arm_m``, so ``1 / sqrt(lambda)`` is a 1-sigma in metres) with
  the second transform and the intrinsics (``intrinsics="joint"``: free; ``"known"``: under
  ``intrinsics_covariance`` or held) marginalised: greedy, then single exchanges.
* **Refusal**: if the chosen stations' robot rotations have ``axis_spread`` below
  ``min_axis_spread`` (the candidates cannot give spread rotations: a box or cone too small,
  a wrist that cannot turn), :class:`~cellcal.solver.errors.DegenerateGeometry` names the
  common axis, as the calibration itself would.
* **Order**: the chosen stations are ordered for short moves (nearest neighbour by the
  largest joint move from ``q_seed_rad``, then 2-opt).

Candidates: ``candidates_q_rad`` when given (the caller's own, for example a daemon's views
that turn about the target so it stays in view whatever the camera's mounting; the
feasibility tests still apply, nothing is sampled). Otherwise, with ``ik``
(``ik(base_T_flange, q_seed) -> q``, raising ValueError when it finds none), camera poses
(eye-in-hand) or target poses (eye-to-hand) are drawn directly: the line of sight tilted
from the board's normal by ``min_tilt_deg`` to ``cone_deg``, the distance in ``distance_m``,
a point near the board's centre (eye-in-hand) or an image position inside the margin
(eye-to-hand), a roll about the line of sight up to ``max_roll_deg``; solved from
``q_seed_rad`` and kept when feasible. One in eight candidates is such an anchor, the rest
short random walks in joint space from them (forward kinematics only). Without ``ik``, joint
vectors are sampled uniformly and walked from the feasible ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver.camera_model import N_PARAMETERS, CameraModel
from cellcal.solver.errors import DegenerateGeometry
from cellcal.solver.hand_eye_camera import DEFAULT_REPEATABILITY_M, DEFAULT_REPEATABILITY_RAD
from cellcal.solver.planning import workspace_box
from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp
from cellcal.solver.target import CalibrationTarget

__all__ = ["CameraStationPlan", "plan_camera_stations", "camera_station_information", "axis_spread_of"]

DEFAULT_CAMERA_CONE_DEG = 40.0
DEFAULT_MIN_TILT_DEG = 10.0
_ANCHOR_EVERY = 8
_MIN_ANCHORS = 16
_IK_BUDGET = 4
_WALK_RAD = 0.12
_BUDGET = 8


@dataclass(frozen=True, kw_only=True, eq=False)
class CameraStationPlan:
    """Planned camera stations (in move order) and what they determine.

    Attributes
    ----------
    setup : {"eye_in_hand", "eye_to_hand"}
    q_rad : numpy.ndarray, shape (N, n_joints)
    base_T_flange : numpy.ndarray, shape (N, 4, 4)
    camera_T_target : numpy.ndarray, shape (N, 4, 4)
        The target as the camera will see it (from the approximate transforms), m.
    information : numpy.ndarray, shape (6, 6)
        Marginal information of the primary transform (rotations scaled by ``lever_arm_m``), 1/m^2.
    min_eigenvalue : float
    worst_sigma_m : float
        ``1 / sqrt(min_eigenvalue)``.
    weakest_description : str
    predicted_sigma_translation_mm, predicted_sigma_rotation_deg : float
        The primary transform's predicted 1-sigma (root of the trace) at ``noise_px``.
    axis_spread : float
        Of the robot's relative rotations (ADR 0002), in ``axis_frame``.
    weakest_axis : numpy.ndarray, shape (3,)
    axis_frame : str
    view_tilt_deg : numpy.ndarray, shape (N,)
        Angle between the board's normal and the optical axis per station.
    tilt_deg : float
        RMS tilt along the weakest image direction (the intrinsics' refusal figure, ADR 0022).
    target_fraction : numpy.ndarray, shape (N,)
        The corners' bounding-box diagonal over the image's.
    move_rad : float
        Sum over the moves (from ``q_seed_rad`` when given) of the largest joint move.
    n_candidates, n_feasible : int
    """

    setup: str
    q_rad: np.ndarray
    base_T_flange: np.ndarray
    camera_T_target: np.ndarray
    information: np.ndarray
    min_eigenvalue: float
    worst_sigma_m: float
    weakest_description: str
    predicted_sigma_translation_mm: float
    predicted_sigma_rotation_deg: float
    axis_spread: float
    weakest_axis: np.ndarray
    axis_frame: str
    view_tilt_deg: np.ndarray
    tilt_deg: float
    target_fraction: np.ndarray
    move_rad: float
    n_candidates: int
    n_feasible: int


def axis_spread_of(base_T_flange: np.ndarray, setup: str) -> tuple[float, np.ndarray, str]:
    """``(axis_spread, weakest axis, frame)`` of the robot's relative rotations over all
    pairs (ADR 0002): flange-frame motions ``G_j^-1 G_i`` for eye-in-hand, base-frame
    ``G_j G_i^-1`` for eye-to-hand."""
    R = np.asarray(base_T_flange, float)[:, :3, :3]
    S = R.sum(axis=0)
    n = R.shape[0]
    # sum over ordered pairs of (R_ij - I)^T (R_ij - I) = 2 (n^2 I - M) with M = S^T S or S S^T
    M = S.T @ S if setup == _chain.EYE_IN_HAND else S @ S.T
    C = 2.0 * (n * n * np.eye(3) - 0.5 * (M + M.T))
    w, V = np.linalg.eigh(C)
    tr = float(np.trace(C))
    spread = 3.0 * max(float(w[0]), 0.0) / tr if tr > 0 else 0.0
    return spread, V[:, 0], "flange" if setup == _chain.EYE_IN_HAND else "base"


def _views_of(setup: str, G: np.ndarray, A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``camera_T_target`` (M, 4, 4) of flange poses ``G``: eye-in-hand ``A = flange_T_camera``,
    ``B = base_T_target``; eye-to-hand ``A = base_T_camera``, ``B = flange_T_target``."""
    if setup == _chain.EYE_IN_HAND:
        return _chain.inverse_batch(G @ A) @ B
    return se3_inverse(A) @ G @ B


def _checks(setup, G, Q, lim, lo, hi, camera, target, A, B, cone_deg, margin_px, min_fraction):
    """Feasible mask, views, per-station tilt and size."""
    O = _views_of(setup, G, A, B)
    pts = target.corners_m
    Pc = (O[:, None, :3, :3] @ pts[None, :, :, None])[..., 0] + O[:, None, :3, 3]
    front = np.all(Pc[..., 2] > 0.05, axis=1)
    uv = camera.project(O[:, None], pts[None]).uv
    inside = np.all(camera.in_image(uv, margin_px) & np.isfinite(uv).all(axis=-1), axis=1)
    c = O[:, :3, :3] @ np.array([*(0.5 * np.asarray(target.size_m)), 0.0]) + O[:, :3, 3]
    cosv = np.einsum("ni,ni->n", O[:, :3, 2], c) / np.linalg.norm(c, axis=1)
    facing = cosv >= math.cos(math.radians(cone_deg))
    with np.errstate(invalid="ignore"):
        span = np.nanmax(uv, axis=1) - np.nanmin(uv, axis=1)
    frac = np.hypot(span[:, 0], span[:, 1]) / math.hypot(*camera.image_size)
    p = G[:, :3, 3]
    ok = front & inside & facing & (np.nan_to_num(frac) >= min_fraction)
    ok &= np.all((p >= lo) & (p <= hi), axis=1) & np.all((Q >= lim[:, 0]) & (Q <= lim[:, 1]), axis=1)
    tilt = np.degrees(np.arccos(np.clip(np.abs(O[:, 2, 2]), 0.0, 1.0)))
    return ok, O, tilt, np.nan_to_num(frac)


def camera_station_information(setup: str, base_T_flange: np.ndarray, camera: CameraModel, target: CalibrationTarget,
                               A: np.ndarray, B: np.ndarray, *, noise_px: float = 0.1,
                               robot_sd: tuple[float, float] = (DEFAULT_REPEATABILITY_M, DEFAULT_REPEATABILITY_RAD),
                               ) -> np.ndarray:
    """Each station's Fisher information (M, 21, 21) of ``[X, Z, intrinsics]`` at ``noise_px``
    with its robot correction (prior ``robot_sd``) marginalised (module docstring)."""
    G = np.asarray(base_T_flange, float).reshape(-1, 4, 4)
    m = G.shape[0]
    if setup == _chain.EYE_IN_HAND:
        X, Z = A, B
    else:
        X, Z = A, B
    obj = np.tile(target.corners_m, (m, 1))
    view = np.repeat(np.arange(m), target.n_corners)
    sd = np.tile(np.array([robot_sd[0]] * 3 + [robot_sd[1]] * 3), (m, 1))
    prob = _chain.ChainProblem(setup, obj, np.zeros((obj.shape[0], 2)), view, G, noise_px, sd,
                               np.ones(_chain.N_GLOBAL, bool))
    st = _chain.ChainState(X, Z, camera.parameters, np.zeros((m, 6)))
    _r, Jg, Jd = prob.jacobians(st)
    Jg, Jd = Jg / noise_px, Jd / noise_px
    s = prob.starts
    U = np.add.reduceat(np.swapaxes(Jg, 1, 2) @ Jg, s, axis=0)
    W = np.add.reduceat(np.swapaxes(Jg, 1, 2) @ Jd, s, axis=0)
    V = np.add.reduceat(np.swapaxes(Jd, 1, 2) @ Jd, s, axis=0) + (1.0 / sd**2)[:, :, None] * np.eye(6)
    return U - W @ np.linalg.solve(V, np.swapaxes(W, 1, 2))


def _focus(F: np.ndarray, prior: np.ndarray, lever: float) -> np.ndarray:
    """The primary transform's scaled marginal information of stacks ``F`` (..., 21, 21)."""
    Ft = F + prior
    a, b = slice(0, 6), slice(6, _chain.N_GLOBAL)
    D = Ft[..., b, b]
    ridge = 1e-10 * (np.trace(Ft, axis1=-2, axis2=-1)[..., None, None] / _chain.N_GLOBAL + 1e-30) * np.eye(D.shape[-1])
    M = Ft[..., a, a] - Ft[..., a, b] @ np.linalg.solve(D + ridge, np.swapaxes(Ft[..., a, b], -1, -2))
    s = 1.0 / np.array([1, 1, 1, lever, lever, lever], float)
    return M * s[:, None] * s[None, :]


def _describe(v: np.ndarray, name: str) -> str:
    t, r = v[:3], v[3:]
    if np.linalg.norm(t) >= np.linalg.norm(r):
        b, how = t / np.linalg.norm(t), "translation along"
    else:
        b, how = r / np.linalg.norm(r), "rotation about"
    j = int(np.argmax(np.abs(b)))
    if b[j] < 0:
        b = -b
    return f"{name} {how} [{b[0]:.2f}, {b[1]:.2f}, {b[2]:.2f}] (its child frame)"


def _order(Q: np.ndarray, q0: np.ndarray | None) -> np.ndarray:
    """Nearest neighbour by the largest joint move, then 2-opt on the open path."""
    n = Q.shape[0]
    D = np.max(np.abs(Q[:, None] - Q[None]), axis=2)
    start = int(np.argmin(np.max(np.abs(Q - q0), axis=1))) if q0 is not None else 0
    path = [start]
    left = set(range(n)) - {start}
    while left:
        k = min(left, key=lambda j: D[path[-1], j])
        path.append(k)
        left.remove(k)
    improved = True
    while improved:
        improved = False
        for i in range(1, n - 1):
            for j in range(i + 1, n):
                a, b = path[i - 1], path[i]
                c = path[j]
                d = path[j + 1] if j + 1 < n else None
                before = D[a, b] + (D[c, d] if d is not None else 0.0)
                after = D[a, c] + (D[b, d] if d is not None else 0.0)
                if after < before - 1e-12:
                    path[i:j + 1] = path[i:j + 1][::-1]
                    improved = True
    return np.array(path)


def _line_of_sight(rng, normal: np.ndarray, lo_deg: float, hi_deg: float) -> np.ndarray:
    """A unit vector tilted from ``normal`` by an angle uniform on the cap between the two."""
    c = rng.uniform(math.cos(math.radians(hi_deg)), math.cos(math.radians(lo_deg)))
    a = rng.uniform(0, 2 * math.pi)
    s = math.sqrt(max(0.0, 1 - c * c))
    z = normal / np.linalg.norm(normal)
    x = np.cross(z, [0.31, 0.52, 0.79])
    x /= np.linalg.norm(x)
    return np.column_stack([x, np.cross(z, x), z]) @ np.array([s * math.cos(a), s * math.sin(a), c])


def _look_at(eye, at, roll) -> np.ndarray:
    z = at - eye
    z /= np.linalg.norm(z)
    x = np.cross([0.0, 0.0, 1.0], z)
    if np.linalg.norm(x) < 1e-6:
        x = np.cross([1.0, 0.0, 0.0], z)
    x /= np.linalg.norm(x)
    return make_transform(np.column_stack([x, np.cross(z, x), z]) @ so3_exp(np.array([0.0, 0.0, roll])), eye)


def _anchor_pose(setup, rng, camera, target, A, B, distance_m, tilt_deg, cone_deg, roll_rad, margin_px) -> np.ndarray:
    """A flange pose that shows the whole board to the camera from a drawn line of sight."""
    centre = np.array([*(0.5 * np.asarray(target.size_m)), 0.0])
    d = rng.uniform(*distance_m)
    roll = rng.uniform(-roll_rad, roll_rad)
    if setup == _chain.EYE_IN_HAND:
        X, Z = A, B
        c = Z[:3, :3] @ centre + Z[:3, 3]
        los = _line_of_sight(rng, -Z[:3, 2], tilt_deg, cone_deg)
        at = c + Z[:3, :3] @ np.r_[rng.normal(0, 0.1, 2) * np.asarray(target.size_m), 0.0]
        base_T_camera = _look_at(c + d * los, at, roll)
        return base_T_camera @ se3_inverse(X)
    X, Y = A, B
    w, h = camera.image_size
    u = rng.uniform(0.3 * w, 0.7 * w)
    v = rng.uniform(0.3 * h, 0.7 * h)
    xy, _ok = camera.undistort(np.array([u, v]))
    ray = np.array([xy[0], xy[1], 1.0])
    ray /= np.linalg.norm(ray)
    p = d * ray  # the board's centre, camera frame
    los = _line_of_sight(rng, -ray, tilt_deg, cone_deg)  # board normal toward the camera
    zt = -los
    xt = np.cross([0.0, 1.0, 0.0], zt)
    xt /= np.linalg.norm(xt)
    Rt = np.column_stack([xt, np.cross(zt, xt), zt]) @ so3_exp(np.array([0.0, 0.0, roll]))
    O = make_transform(Rt, p - Rt @ centre)
    return X @ O @ se3_inverse(Y)


def plan_camera_stations(
    fk: Callable,
    joint_limits_rad,
    workspace_box_m,
    camera: CameraModel,
    target: CalibrationTarget,
    setup: str,
    n_stations: int,
    *,
    flange_T_camera=None,
    base_T_target=None,
    base_T_camera=None,
    flange_T_target=None,
    ik: Callable | None = None,
    q_seed_rad=None,
    distance_m: tuple[float, float] = (0.3, 0.6),
    cone_deg: float = DEFAULT_CAMERA_CONE_DEG,
    min_tilt_deg: float = DEFAULT_MIN_TILT_DEG,
    max_roll_deg: float = 90.0,
    margin_px: float = 10.0,
    min_target_fraction: float = 0.25,
    noise_px: float = 0.1,
    intrinsics: str = "joint",
    intrinsics_covariance=None,
    robot_repeatability_m: float = DEFAULT_REPEATABILITY_M,
    robot_repeatability_rad: float = DEFAULT_REPEATABILITY_RAD,
    lever_arm_m: float = 0.5,
    n_candidates: int = 400,
    exchange_passes: int = 2,
    min_axis_spread: float = 1e-2,
    rng: np.random.Generator | int | None = 0,
    candidates_q_rad=None,
) -> CameraStationPlan:
    """N camera stations for the image-level hand-eye calibration (module docstring).

    Parameters
    ----------
    fk : callable
        ``fk(q_rad (n_joints,)) -> base_T_flange (4, 4)``, m.
    joint_limits_rad : array_like, shape (n_joints, 2)
    workspace_box_m : pair of array_like (3,)
        Lower and upper corner (robot base frame) the flange origin stays in, m.
    camera : CameraModel
        Approximate intrinsics and the image size.
    target : CalibrationTarget
    setup : {"eye_in_hand", "eye_to_hand"}
    n_stations : int
        At least 3.
    flange_T_camera, base_T_target : (4, 4), eye-in-hand
    base_T_camera, flange_T_target : (4, 4), eye-to-hand
        Approximate transforms (a drawing: centimetres and degrees do not matter).
    ik, q_seed_rad
        Inverse kinematics and the seed its solutions stay near (module docstring).
    distance_m, cone_deg, min_tilt_deg, max_roll_deg, margin_px, min_target_fraction
        The candidates' geometry and the feasibility tests (module docstring).
    noise_px : float
        Corner noise for the information (only the figures' scale depends on it).
    intrinsics : {"joint", "known"}
        Intrinsics estimated with the hand-eye (the information marginalises them) or known
        (under ``intrinsics_covariance`` when given, else held).
    robot_repeatability_m, robot_repeatability_rad : float
    lever_arm_m : float
        A rotation counts as the displacement it causes at this distance.
    n_candidates, exchange_passes
    min_axis_spread : float
        Refuse below this spread of the chosen stations' rotations.
    rng : Generator, int or None
    candidates_q_rad : array_like, shape (M, n_joints), optional
        Choose among these joint vectors (after the feasibility tests) instead of sampling.

    Returns
    -------
    CameraStationPlan

    Raises
    ------
    ValueError
        Bad arguments, or fewer feasible candidates than ``n_stations``.
    DegenerateGeometry
        The best stations found rotate about one axis only (``axis``, ``frame`` named).
    """
    if setup not in _chain.SETUPS:
        raise ValueError(f"setup must be one of {_chain.SETUPS}, got {setup!r}")
    if int(n_stations) < 3:
        raise ValueError(f"n_stations must be >= 3, got {n_stations}")
    if intrinsics not in ("joint", "known"):
        raise ValueError(f"intrinsics must be 'joint' or 'known', got {intrinsics!r}")
    need = ("flange_T_camera", "base_T_target") if setup == _chain.EYE_IN_HAND else ("base_T_camera", "flange_T_target")
    given = dict(flange_T_camera=flange_T_camera, base_T_target=base_T_target, base_T_camera=base_T_camera,
                 flange_T_target=flange_T_target)
    for nm in need:
        if given[nm] is None:
            raise ValueError(f"{setup} planning needs {nm}= (an approximate value)")
    A, B = (np.asarray(given[need[0]], float), np.asarray(given[need[1]], float))
    n = int(n_stations)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    lim = np.asarray(joint_limits_rad, float)
    if lim.ndim != 2 or lim.shape[1] != 2 or not np.all(lim[:, 1] > lim[:, 0]):
        raise ValueError(f"joint_limits_rad must be (n_joints, 2) rows of [low, high], got {lim.tolist()}")
    lo, hi = workspace_box(workspace_box_m)
    nj = lim.shape[0]
    seed = None if q_seed_rad is None else np.clip(np.asarray(q_seed_rad, float).reshape(nj), lim[:, 0], lim[:, 1])

    def fk_all(Q: np.ndarray) -> np.ndarray:
        return np.array([np.asarray(fk(q), float) for q in Q]).reshape(-1, 4, 4)

    def feasible(Q: np.ndarray):
        if len(Q) == 0:
            return Q.reshape(0, nj), np.zeros((0, 4, 4))
        G = fk_all(Q)
        ok = _checks(setup, G, Q, lim, lo, hi, camera, target, A, B, cone_deg, margin_px, min_target_fraction)[0]
        return Q[ok], G[ok]

    want = int(n_candidates)
    evaluated = 0
    if candidates_q_rad is not None:
        Qc = np.asarray(candidates_q_rad, float)
        if Qc.ndim != 2 or Qc.shape[1] != nj or not np.all(np.isfinite(Qc)):
            raise ValueError(f"candidates_q_rad must be finite (M, {nj}) joint vectors, got shape {Qc.shape}")
        want = evaluated = Qc.shape[0]
        Q, G = feasible(Qc)
    elif ik is not None:
        q0 = seed if seed is not None else lim.mean(axis=1)
        qs: list[np.ndarray] = []
        n_anchor = min(want, max(_MIN_ANCHORS, want // _ANCHOR_EVERY))
        tries = 0
        while len(qs) < n_anchor and tries < _IK_BUDGET * n_anchor:
            tries += 1
            T = _anchor_pose(setup, rng, camera, target, A, B, distance_m, min_tilt_deg, cone_deg,
                             math.radians(max_roll_deg), margin_px)
            for s0 in ((q0, qs[0]) if qs else (q0,)):
                try:
                    q = np.asarray(ik(T, s0), float).reshape(nj)
                except (ValueError, ArithmeticError, np.linalg.LinAlgError):
                    continue
                if np.all(np.isfinite(q)):
                    qs.append(q)
                    break
        evaluated += tries
        Q, G = feasible(np.array(qs).reshape(-1, nj))
    else:
        Q, G = feasible(rng.uniform(lim[:, 0], lim[:, 1], size=(want, nj)))
        evaluated += want
    budget = evaluated if candidates_q_rad is not None else evaluated + _BUDGET * want
    batch = max(32, want // 4)
    while 0 < len(Q) < want and evaluated < budget:
        seeds = Q[rng.integers(0, len(Q), size=batch)]
        Qa, Ga = feasible(np.clip(seeds + rng.normal(scale=_WALK_RAD, size=seeds.shape), lim[:, 0], lim[:, 1]))
        evaluated += batch
        if len(Qa):
            Q, G = np.concatenate([Q, Qa]), np.concatenate([G, Ga])
    Q, G = Q[:want], G[:want]
    if len(Q) < n:
        raise ValueError(
            f"only {len(Q)} of {evaluated} candidate stations keep the joints in their limits, the flange in the "
            f"box and every corner in the image facing the camera (cone {cone_deg:g} deg, margin {margin_px:g} px, "
            f"target at least {min_target_fraction:.0%} of the image); {n} stations were asked for: widen the box, "
            "the cone or the distances, or sample more")
    Fc = camera_station_information(setup, G, camera, target, A, B, noise_px=noise_px,
                                    robot_sd=(robot_repeatability_m, robot_repeatability_rad))
    prior = np.zeros((_chain.N_GLOBAL, _chain.N_GLOBAL))
    if intrinsics == "known":
        if intrinsics_covariance is None:
            prior[_chain.SL_K, _chain.SL_K] = 1e12 * np.eye(N_PARAMETERS)  # held
        else:
            C = np.asarray(intrinsics_covariance, float)
            d = np.diag(C) <= 0
            Cp = C + np.diag(np.where(d, 1e-24, 0.0))
            prior[_chain.SL_K, _chain.SL_K] = np.linalg.inv(Cp)
    # a little of everything, so the marginal is defined before the set determines it all
    ridge = 1e-9 * float(np.mean(np.trace(Fc, axis1=1, axis2=2))) * np.eye(_chain.N_GLOBAL)
    chosen: list[int] = []
    F = np.zeros((_chain.N_GLOBAL, _chain.N_GLOBAL))
    free = np.ones(len(Q), bool)

    def score(Ft: np.ndarray) -> np.ndarray:
        M = _focus(Ft, prior + ridge, lever_arm_m)
        lam = np.linalg.eigvalsh(M)[..., 0]
        return lam

    for _ in range(n):
        idx = np.flatnonzero(free)
        sc = score(F[None] + Fc[idx])
        if sc.max() <= 1e-6 * max(float(np.abs(sc).max()), 1e-300):
            # while one more station cannot lift the smallest eigenvalue, rank by the trace of the inverse
            M = _focus(F[None] + Fc[idx], prior + ridge, lever_arm_m)
            sc = -np.trace(np.linalg.inv(M + 1e-12 * np.eye(6)), axis1=1, axis2=2)
        k = int(idx[np.argmax(sc)])
        chosen.append(k)
        free[k] = False
        F = F + Fc[k]
    for _ in range(int(exchange_passes)):
        improved = False
        for pos in range(n):
            base = F - Fc[chosen[pos]]
            idx = np.flatnonzero(free)
            if len(idx) == 0:
                break
            sc = score(base[None] + Fc[idx])
            j = int(np.argmax(sc))
            if sc[j] > float(score(F[None])[0]) * (1.0 + 1e-6):
                free[chosen[pos]] = True
                free[idx[j]] = False
                chosen[pos] = int(idx[j])
                F = base + Fc[idx[j]]
                improved = True
        if not improved:
            break
    sel = np.array(chosen)
    order = _order(Q[sel], seed)
    sel = sel[order]
    Qs, Gs = Q[sel], G[sel]
    spread, axis, frame = axis_spread_of(Gs, setup)
    if spread < min_axis_spread:
        raise DegenerateGeometry(
            f"{setup} planning: the best {n} feasible stations rotate the flange about (nearly) one axis "
            f"[{axis[0]:.3f}, {axis[1]:.3f}, {axis[2]:.3f}] ({frame} frame; axis_spread {spread:.3g} < "
            f"{min_axis_spread:g}): the camera's rotation about it and its translation along it would be "
            "undetermined; widen the cone, the roll or the workspace box",
            axis=axis, frame=frame, axis_spread=spread,
            unrecoverable=("camera rotation about axis", "camera translation along axis"),
            max_rotation_rad=math.nan)
    M = _focus(F, prior + ridge, lever_arm_m)
    w, Vv = np.linalg.eigh(M)
    lam = float(w[0])
    name = "flange_T_camera" if setup == _chain.EYE_IN_HAND else "base_T_camera"
    C = np.linalg.inv(M)
    s = np.array([1, 1, 1, lever_arm_m, lever_arm_m, lever_arm_m], float)
    C = C / s[:, None] / s[None, :]
    ok, O, tilt, frac = _checks(setup, Gs, Qs, lim, lo, hi, camera, target, A, B, cone_deg, margin_px, min_target_fraction)
    nrm = O[:, :2, 2]
    ev = np.linalg.eigvalsh(nrm.T @ nrm / len(nrm))
    weak = math.degrees(math.asin(min(1.0, math.sqrt(max(float(ev[0]), 0.0)))))
    start = seed if seed is not None else Qs[0]
    path = np.vstack([start[None], Qs])
    move = float(np.sum(np.max(np.abs(np.diff(path, axis=0)), axis=1)))
    return CameraStationPlan(
        setup=setup, q_rad=Qs, base_T_flange=Gs, camera_T_target=O, information=M, min_eigenvalue=lam,
        worst_sigma_m=1.0 / math.sqrt(lam) if lam > 0 else math.inf, weakest_description=_describe(Vv[:, 0], name),
        predicted_sigma_translation_mm=1e3 * math.sqrt(max(float(np.trace(C[:3, :3])), 0.0)),
        predicted_sigma_rotation_deg=math.degrees(math.sqrt(max(float(np.trace(C[3:, 3:])), 0.0))),
        axis_spread=spread, weakest_axis=axis, axis_frame=frame, view_tilt_deg=tilt, tilt_deg=weak,
        target_fraction=frac, move_rad=move, n_candidates=evaluated, n_feasible=len(Q))
