"""Observability planning: which robot stations determine the calibration best.

The Fisher information of the stations (:mod:`cellcal.solver.refine`, evaluated at an
approximate ``cell_T_base`` and ``flange_T_target`` and the tracker's noise) says how well
every combination of the unknowns is determined; its smallest eigenvalue is the worst one.
The planner samples joint vectors, keeps those whose flange lies in the workspace box and
whose target the tracker can see, and picks N of them greedily to maximise that smallest
eigenvalue (E-optimal design), then improves the set by single exchanges.

What is maximised (``focus``): by default the information about ``cell_T_base`` alone, with
the target mount marginalised out (the Schur complement ``F_XX - F_XY F_YY^-1 F_YX``):
the mount's rotation is measured directly at every station and would otherwise set the
smallest eigenvalue whatever the stations are. ``focus="all"`` uses the full matrix.

Candidates: uniform joint vectors within the limits; a box and a cone usually leave few of
them, so the feasible ones then seed random walks in joint space (0.4 rad steps) until
enough candidates are feasible or the sampling budget is spent.

Units: the unknowns are ``[rho_X, phi_X, rho_Y, phi_Y]`` (pose tracker; ``X = cell_T_base``,
``Y = flange_T_target``, right perturbations) or ``[rho_X, phi_X, y]`` (point tracker,
``y = flange_p_target``). Rotations are scaled by ``lever_arm_m`` so that every
parameter is a length (a rotation counts as the displacement it causes at that distance).
An eigenvalue ``lambda`` of the scaled information is then in 1/m^2 and ``1 / sqrt(lambda)``
is the 1-sigma, in metres, of the corresponding combination: :attr:`StationPlan.worst_sigma_m`.

Line of sight (the cone): the target has a facing direction ``target_axis`` (unit vector in
the target frame; +z by default: the axis a 6-DoF probe or a reflector's opening looks
along). A station is visible when the angle between that direction, expressed in the cell
frame, and the direction from the target to the tracker is at most ``cone_deg``:
``dot(R_cell_target @ target_axis, unit(tracker - p_target)) >= cos(cone_deg)``. Typical
acceptance half-angles: about 30 deg for a 1.5" corner-cube reflector, 45 deg or more for
6-DoF probes. Occlusion by the robot itself is not modelled.

Candidates by inverse kinematics (``ik`` given, what the daemon does): flange positions
uniform in the box, each with the target facing a direction drawn uniformly in the outer
half of the cone around the direction to the tracker (tilted by half the cone or more, so
that stations differ by rotations about spread axes) and turned about that axis by at most
``max_roll_rad``,
solved from ``q_seed_rad`` (the home configuration: the solutions stay on its branch and the
moves between them short) and kept when the solution is within the joint limits and passes the
same box and line-of-sight test. These anchors (one candidate in eight) then seed short random
walks in joint space, kept by the same test, for the rest: forward kinematics is cheap, an
IK solve is not. The candidates face the tracker by construction, whereas uniform joint
samples rarely do.

Task points (``task_points``): the predicted error of a cell-frame point expressed in the
base, ``sqrt(trace(J C J^T))`` with ``J = [I, -[p_base]x]`` and ``C`` the marginal covariance
of ``cell_T_base`` (the inverse of the focus matrix): the figure ``predicted_error_at`` of a
base-frame result reports (:func:`task_point_sigma`). :func:`suggest_next_station` given task
points picks the station that lowers the largest of them most.

The robot model is a callable ``fk(q) -> base_T_flange`` so that the solver imports nothing
of ours (``cellcal.drivers.kinematics.DHModel.forward`` fits; ``DHModel.inverse`` for ``ik``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cellcal.solver.refine import fisher_information_point, fisher_information_pose

__all__ = [
    "StationPlan",
    "NextStation",
    "DEFAULT_CONE_DEG",
    "plan_stations",
    "suggest_next_station",
    "visible",
    "information",
    "candidate_stations",
    "task_point_sigma",
    "workspace_box",
]

#: Default acceptance half-angle of the target's line of sight.
DEFAULT_CONE_DEG = 45.0
#: Default noise for the planning information: a laser tracker's 6-DoF measurement.
DEFAULT_PLAN_NOISE_M = 2.0e-5
DEFAULT_PLAN_NOISE_RAD = math.radians(0.01)

_PARAM_NAMES = {
    "pose": (("cell_T_base translation", "base"), ("cell_T_base rotation", "base"),
             ("flange_T_target translation", "target"), ("flange_T_target rotation", "target")),
    "point": (("cell_T_base translation", "base"), ("cell_T_base rotation", "base"),
              ("flange_p_target", "flange")),
}


@dataclass(frozen=True, kw_only=True)
class StationPlan:
    """Planned stations and what they determine.

    Attributes
    ----------
    q_rad : numpy.ndarray, shape (N, n_joints)
        Joint vectors, radians.
    base_T_flange : numpy.ndarray, shape (N, 4, 4)
        Their flange poses (``fk(q)``), metres.
    information : numpy.ndarray, shape (p, p)
        Scaled Fisher information (module docstring), 1/m^2; p = 12 (pose) or 9 (point).
    min_eigenvalue : float
        Its smallest eigenvalue, 1/m^2.
    worst_sigma_m : float
        ``1 / sqrt(min_eigenvalue)``: 1-sigma of the worst-determined combination, m.
    weakest_direction : numpy.ndarray, shape (p,)
        The eigenvector of ``min_eigenvalue`` (unit, scaled parameters).
    weakest_description : str
        Which unknown that direction mostly moves, in words.
    predicted_sigma_translation_mm, predicted_sigma_rotation_deg : float
        Predicted 1-sigma (root of the trace) of ``cell_T_base`` from these stations with
        the planning noise, as the refined calibration would report it.
    n_candidates, n_feasible : int
        Joint vectors sampled, and those in the box and in line of sight.
    measurement : str
        ``"pose"`` or ``"point"``.
    """

    q_rad: np.ndarray
    base_T_flange: np.ndarray
    information: np.ndarray
    min_eigenvalue: float
    worst_sigma_m: float
    weakest_direction: np.ndarray
    weakest_description: str
    predicted_sigma_translation_mm: float
    predicted_sigma_rotation_deg: float
    n_candidates: int
    n_feasible: int
    measurement: str


@dataclass(frozen=True, kw_only=True)
class NextStation:
    """The station :func:`suggest_next_station` recommends.

    Attributes
    ----------
    q_rad : numpy.ndarray, shape (n_joints,)
        Its joint vector, radians.
    base_T_flange : numpy.ndarray, shape (4, 4)
        Its flange pose, metres.
    weakest_direction : numpy.ndarray, shape (p,)
        The weakest direction of the *current* stations (scaled parameters).
    weakest_description : str
        That direction in words (e.g. "cell_T_base rotation about [0, 0, 1] (base frame)").
    min_eigenvalue_before, min_eigenvalue_after : float
        Smallest eigenvalue of the information without and with the station, 1/m^2.
    worst_sigma_before_m, worst_sigma_after_m : float
        The corresponding worst 1-sigma, m (inf while something is undetermined).
    task_sigma_before_m, task_sigma_after_m : float
        With ``task_points``: the largest predicted error at them (:func:`task_point_sigma`)
        without and with the station, m (inf while undetermined); NaN without task points.
    """

    q_rad: np.ndarray
    base_T_flange: np.ndarray
    weakest_direction: np.ndarray
    weakest_description: str
    min_eigenvalue_before: float
    min_eigenvalue_after: float
    worst_sigma_before_m: float
    worst_sigma_after_m: float
    task_sigma_before_m: float = math.nan
    task_sigma_after_m: float = math.nan


# --- model pieces -----------------------------------------------------------------------------------


def visible(
    cell_T_target: np.ndarray, tracker_cell_p, *, target_axis=(0.0, 0.0, 1.0), cone_deg: float = DEFAULT_CONE_DEG
) -> np.ndarray:
    """Line-of-sight test of the module docstring for a stack (N, 4, 4); bool (N,)."""
    T = np.asarray(cell_T_target, float).reshape(-1, 4, 4)
    a = np.asarray(target_axis, float)
    a = a / np.linalg.norm(a)
    facing = T[:, :3, :3] @ a
    d = np.asarray(tracker_cell_p, float) - T[:, :3, 3]
    dist = np.linalg.norm(d, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.einsum("ij,ij->i", facing, d) / dist
    return np.nan_to_num(c, nan=-1.0) >= math.cos(math.radians(cone_deg))


def _scale(measurement: str, lever_arm_m: float) -> np.ndarray:
    L = float(lever_arm_m)
    if measurement == "pose":
        return np.array([1, 1, 1, L, L, L, 1, 1, 1, L, L, L], float)
    return np.array([1, 1, 1, L, L, L, 1, 1, 1], float)


def information(
    base_T_flange: np.ndarray,
    cell_T_base: np.ndarray,
    *,
    flange_T_target: np.ndarray | None = None,
    measurement: str = "pose",
    noise_translation_m: float = DEFAULT_PLAN_NOISE_M,
    noise_rotation_rad: float = DEFAULT_PLAN_NOISE_RAD,
    lever_arm_m: float = 1.0,
    per_station: bool = False,
) -> np.ndarray:
    """Scaled Fisher information of stations (module docstring): (p, p), or (N, p, p).

    Parameters
    ----------
    base_T_flange : array_like, shape (N, 4, 4)
        Flange poses, m.
    cell_T_base : array_like, shape (4, 4)
        Approximate base pose in the cell (the information depends on it only through the
        geometry; centimetres and degrees of error do not matter).
    flange_T_target : array_like, shape (4, 4), optional
        Approximate target mount (identity by default); for ``measurement="point"`` only
        its translation is used (the reflector's centre).
    measurement : {"pose", "point"}
        6-DoF or 3-DoF tracker.
    noise_translation_m, noise_rotation_rad : float
        Tracker 1-sigma per axis (planning figures; only their ratio changes the design).
    lever_arm_m : float
        Distance at which a rotation counts as a displacement (the task's lever arm).
    per_station : bool
        Return each station's contribution instead of the sum.
    """
    if measurement not in ("pose", "point"):
        raise ValueError(f"measurement must be 'pose' or 'point', got {measurement!r}")
    G = np.asarray(base_T_flange, float).reshape(-1, 4, 4)
    X = np.asarray(cell_T_base, float)
    Y = np.eye(4) if flange_T_target is None else np.asarray(flange_T_target, float)
    if measurement == "pose":
        F = fisher_information_pose(G, X, Y, noise_translation_m, noise_rotation_rad)
    else:
        F = fisher_information_point(G, X, Y[:3, 3], noise_translation_m)
    s = 1.0 / _scale(measurement, lever_arm_m)
    F = F * s[None, :, None] * s[None, None, :]
    return F if per_station else F.sum(axis=0)


def _describe(v: np.ndarray, measurement: str) -> str:
    names = _PARAM_NAMES[measurement]
    blocks = [v[3 * k: 3 * k + 3] for k in range(len(names))]
    k = int(np.argmax([np.linalg.norm(b) for b in blocks]))
    b = blocks[k] / max(np.linalg.norm(blocks[k]), 1e-300)
    j = int(np.argmax(np.abs(b)))
    if b[j] < 0:
        b = -b
    name, frame = names[k]
    how = "about" if "rotation" in name else "along"
    return f"{name} {how} [{b[0]:.2f}, {b[1]:.2f}, {b[2]:.2f}] ({frame} frame)"


def _eig_min(F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, V = np.linalg.eigh(F)
    return w[..., 0], V[..., :, 0]


def _predicted_sigmas(F: np.ndarray, measurement: str, lever_arm_m: float) -> tuple[float, float]:
    s = _scale(measurement, lever_arm_m)
    try:
        C = np.linalg.inv(F)
    except np.linalg.LinAlgError:
        return math.inf, math.inf
    C = C / s[:, None] / s[None, :]  # back to m and rad
    tt, rr = float(np.trace(C[:3, :3])), float(np.trace(C[3:6, 3:6]))
    if not (tt >= 0 and rr >= 0 and math.isfinite(tt + rr)):
        return math.inf, math.inf
    return 1e3 * math.sqrt(tt), math.degrees(math.sqrt(rr))


# --- candidates ---------------------------------------------------------------------------------------


#: Random-walk step in joint space when growing the candidate set from feasible seeds.
_WALK_RAD = 0.4
#: FK evaluations at most, as a multiple of ``n_candidates``.
_BUDGET = 8


def _candidates(
    fk: Callable, joint_limits_rad, box, tracker_cell_p, cell_T_base, flange_T_target,
    target_axis, cone_deg, n_candidates: int, rng: np.random.Generator,
    *, ik: Callable | None = None, q_seed_rad=None, max_roll_rad: float = math.pi,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Feasible joint vectors and their flange poses; returns ``(Q, G, n_evaluated)``."""
    lim = np.asarray(joint_limits_rad, float)
    if lim.ndim != 2 or lim.shape[1] != 2 or not np.all(lim[:, 1] > lim[:, 0]):
        raise ValueError(f"joint_limits_rad must be (n_joints, 2) rows of [low, high], got {lim.tolist()}")
    lo, hi = workspace_box(box)
    X = np.asarray(cell_T_base, float)
    Y = np.eye(4) if flange_T_target is None else np.asarray(flange_T_target, float)

    def feasible(Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(Q) == 0:
            return Q.reshape(0, lim.shape[0]), np.zeros((0, 4, 4))
        G = np.array([np.asarray(fk(q), float) for q in Q])
        if G.shape[1:] != (4, 4):
            raise ValueError(f"fk must return a (4, 4) base_T_flange, got shape {G.shape[1:]}")
        p = G[:, :3, 3]
        ok = np.all((p >= lo) & (p <= hi), axis=1)
        ok &= np.all((Q >= lim[:, 0]) & (Q <= lim[:, 1]), axis=1)
        ok &= visible(X @ G @ Y, tracker_cell_p, target_axis=target_axis, cone_deg=cone_deg)
        return Q[ok], G[ok]

    want = int(n_candidates)
    if ik is not None:
        return _ik_candidates(fk, ik, lim, lo, hi, X, Y, tracker_cell_p, target_axis, cone_deg, want, rng,
                              q_seed_rad, max_roll_rad, feasible)
    Q, G = feasible(rng.uniform(lim[:, 0], lim[:, 1], size=(want, lim.shape[0])))
    evaluated = want
    budget = _BUDGET * want
    batch = max(64, want // 4)
    while len(Q) < want // 2 and evaluated < budget:
        if len(Q):
            seeds = Q[rng.integers(0, len(Q), size=batch)]
            Qn = np.clip(seeds + rng.normal(scale=_WALK_RAD, size=seeds.shape), lim[:, 0], lim[:, 1])
        else:
            Qn = rng.uniform(lim[:, 0], lim[:, 1], size=(batch, lim.shape[0]))
        Qa, Ga = feasible(Qn)
        evaluated += batch
        if len(Qa):
            Q, G = np.concatenate([Q, Qa]), np.concatenate([G, Ga])
    return Q, G, evaluated


#: Inverse-kinematics attempts at most, as a multiple of the anchors wanted.
_IK_BUDGET = 3
#: Candidates solved by inverse kinematics ("anchors"): one in ``_ANCHOR_EVERY``, at least
#: ``_MIN_ANCHORS``; the others are random walks from them of ``_ANCHOR_WALK_RAD`` per joint.
_ANCHOR_EVERY = 8
_MIN_ANCHORS = 12
_ANCHOR_WALK_RAD = 0.15
#: The facing directions are drawn in this fraction of the cone: the target's offset from
#: the flange and the IK's residual must not carry a candidate out of it.
_CONE_MARGIN = 0.9


def _rotation_taking(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The smallest rotation taking unit vector ``a`` to unit vector ``b``."""
    v = np.cross(a, b)
    c = float(a @ b)
    s = float(np.linalg.norm(v))
    if s < 1e-12:
        if c > 0:
            return np.eye(3)
        # Opposite: half a turn about any axis perpendicular to a.
        e = np.eye(3)[int(np.argmin(np.abs(a)))]
        k = np.cross(a, e)
        k /= np.linalg.norm(k)
        return 2.0 * np.outer(k, k) - np.eye(3)
    K = np.array([[0.0, -v[2], v[1]], [v[2], 0.0, -v[0]], [-v[1], v[0], 0.0]])
    return np.eye(3) + K + K @ K * ((1.0 - c) / (s * s))


def _axis_angle(axis: np.ndarray, angle: float) -> np.ndarray:
    K = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return np.eye(3) + math.sin(angle) * K + (1.0 - math.cos(angle)) * (K @ K)


def _ik_candidates(fk, ik, lim, lo, hi, X, Y, tracker_cell_p, target_axis, cone_deg, want, rng,
                   q_seed_rad, max_roll_rad, feasible) -> tuple[np.ndarray, np.ndarray, int]:
    """Candidates of the module docstring's inverse-kinematics route."""
    n_j = lim.shape[0]
    seed = np.clip(np.asarray(q_seed_rad, float).reshape(n_j) if q_seed_rad is not None
                   else lim.mean(axis=1), lim[:, 0], lim[:, 1])
    a = np.asarray(target_axis, float)
    a = a / np.linalg.norm(a)
    Ry = Y[:3, :3]
    # The tracker in the base frame: the facing directions are drawn there.
    Xinv_R, Xinv_t = X[:3, :3].T, -X[:3, :3].T @ X[:3, 3]
    tracker_b = Xinv_R @ np.asarray(tracker_cell_p, float).reshape(3) + Xinv_t
    cos_cone = math.cos(math.radians(min(float(cone_deg), 180.0)) * _CONE_MARGIN)
    cos_half = math.cos(math.radians(min(float(cone_deg), 180.0)) * 0.5)
    qs: list[np.ndarray] = []
    evaluated = 0
    n_anchor = min(want, max(_MIN_ANCHORS, want // _ANCHOR_EVERY))
    while len(qs) < n_anchor and evaluated < _IK_BUDGET * n_anchor:
        evaluated += 1
        p = rng.uniform(lo, hi)  # the flange origin; the target's few cm from it do not matter here
        d = tracker_b - p
        nd = float(np.linalg.norm(d))
        if nd < 1e-9:
            continue
        d = d / nd
        # Uniform on the outer half of the cone's cap around d (tilts of half the cone and
        # more: stations that differ by rotations about spread axes, what the solver needs).
        cz = rng.uniform(cos_cone, cos_half)
        az = rng.uniform(0.0, 2.0 * math.pi)
        sz = math.sqrt(max(0.0, 1.0 - cz * cz))
        f_local = np.array([sz * math.cos(az), sz * math.sin(az), cz])
        facing = _rotation_taking(np.array([0.0, 0.0, 1.0]), d) @ f_local
        roll = rng.uniform(-max_roll_rad, max_roll_rad)
        R_target = _axis_angle(facing, roll) @ _rotation_taking(a, facing)  # base_R_target, R a = facing
        T = np.eye(4)
        T[:3, :3] = R_target @ Ry.T
        T[:3, 3] = p
        # Seeded at the first solution found (it faces the tracker as every candidate does,
        # so a few iterations reach the others), falling back to the given seed.
        q = None
        for s0 in ((qs[0], seed) if qs else (seed,)):
            try:
                q = np.asarray(ik(T, s0), float).reshape(n_j)
                break
            except (ValueError, ArithmeticError, np.linalg.LinAlgError):
                q = None
        if q is not None and np.all(np.isfinite(q)):
            qs.append(q)
    Q, G = feasible(np.array(qs).reshape(-1, n_j))
    # The rest by short random walks from the feasible ones (forward kinematics only, a
    # fraction of an IK solve each): they stay on the anchors' branch, near the tracker's
    # direction, and fill the box and the cone between the anchors.
    budget = evaluated + _BUDGET * want
    batch = max(32, want // 4)
    while 0 < len(Q) < want and evaluated < budget:
        seeds = Q[rng.integers(0, len(Q), size=batch)]
        Qn = np.clip(seeds + rng.normal(scale=_ANCHOR_WALK_RAD, size=seeds.shape), lim[:, 0], lim[:, 1])
        Qa, Ga = feasible(Qn)
        evaluated += batch
        if len(Qa):
            Q, G = np.concatenate([Q, Qa]), np.concatenate([G, Ga])
    return Q[:want], G[:want], evaluated


def workspace_box(box) -> tuple[np.ndarray, np.ndarray]:
    """Validate ``(lower corner, upper corner)`` of a box, m."""
    try:
        lo, hi = (np.asarray(b, float).reshape(3) for b in box)
    except (TypeError, ValueError):
        raise ValueError(f"workspace box must be ([xmin, ymin, zmin], [xmax, ymax, zmax]), got {box!r}") from None
    if not np.all(hi > lo):
        raise ValueError(f"workspace box must be ([xmin, ymin, zmin], [xmax, ymax, zmax]), got {box!r}")
    return lo, hi


def _focus(F: np.ndarray, focus: str) -> np.ndarray:
    """The matrix whose eigenvalues are optimised: ``F`` or the marginal information of
    ``cell_T_base`` (Schur complement; a tiny ridge keeps it defined while the nuisance
    block is still singular)."""
    if focus == "all":
        return F
    A, B, D = F[..., :6, :6], F[..., :6, 6:], F[..., 6:, 6:]
    p, k = F.shape[-1], D.shape[-1]
    # Relative to the whole matrix (D alone may be zero), floored so 1/ridge stays finite.
    scale = np.trace(F, axis1=-2, axis2=-1)[..., None, None] / p
    ridge = (1e-10 * scale + 1e-30) * np.eye(k)
    return A - B @ np.linalg.solve(D + ridge, np.swapaxes(B, -1, -2))


def _gain_scores(F: np.ndarray, Fc: np.ndarray, eps: float, focus: str) -> np.ndarray:
    """Score of adding each candidate: smallest eigenvalue of the focus matrix of
    ``F + Fc``, and while that is (near) zero for every candidate, minus the trace of the
    regularised inverse (an A-optimal surrogate that still ranks candidates when one
    station cannot complete the rank)."""
    Ff = _focus(F[None] + Fc, focus)
    lam = np.linalg.eigvalsh(Ff)[:, 0]
    if lam.max() > eps:
        return lam
    p = F.shape[0]
    inv = np.linalg.inv(F[None] + Fc + eps * np.eye(p)[None])
    return -np.trace(inv, axis1=1, axis2=2)


def _near(G: np.ndarray, V: np.ndarray, dist_m: float, angle_rad: float) -> np.ndarray:
    """(M, K) bool: pose ``G[m]`` is within both ``dist_m`` and ``angle_rad`` of ``V[k]``
    (identical poses always count)."""
    dp = np.linalg.norm(G[:, None, :3, 3] - V[None, :, :3, 3], axis=2)
    tr = np.einsum("mij,kij->mk", G[:, :3, :3], V[:, :3, :3])  # trace of R_g^T R_v
    ang = np.arccos(np.clip((tr - 1.0) / 2.0, -1.0, 1.0))
    return (dp <= max(dist_m, 1e-9)) & (ang <= max(angle_rad, 1e-6))


def _task_points(task_points) -> np.ndarray:
    pts = np.asarray(task_points, float)
    if pts.ndim == 1:
        pts = pts.reshape(1, -1)
    if pts.ndim != 2 or pts.shape[1] != 3 or len(pts) == 0 or not np.all(np.isfinite(pts)):
        raise ValueError(f"task_points must be (K, 3) finite cell-frame points (K >= 1), got {np.shape(task_points)}")
    return pts


def _task_variances(F: np.ndarray, cell_T_base: np.ndarray, pts: np.ndarray, measurement: str,
                    lever_arm_m: float) -> np.ndarray:
    """Predicted variance (trace) of each task point for a stack of informations: (..., K)."""
    Ff = _focus(F, "cell_T_base")
    s6 = _scale(measurement, lever_arm_m)[:6]
    X = np.asarray(cell_T_base, float)
    b = (pts - X[:3, 3]) @ X[:3, :3]  # the points in the base frame, (K, 3)
    J = np.zeros((len(pts), 3, 6))
    J[:, :, :3] = np.eye(3)
    J[:, 0, 4], J[:, 0, 5] = b[:, 2], -b[:, 1]  # -[b]x
    J[:, 1, 3], J[:, 1, 5] = -b[:, 2], b[:, 0]
    J[:, 2, 3], J[:, 2, 4] = b[:, 1], -b[:, 0]
    Js = J / s6  # scaled parameters back to metres and radians
    w = np.linalg.eigvalsh(Ff)
    tiny = 1e-9 * np.maximum(w[..., -1], 1e-300)
    ok = w[..., 0] > tiny
    lead = Ff.shape[:-2]
    Ff_safe = np.where(ok[..., None, None], Ff, np.eye(6))
    JT = np.swapaxes(Js, -1, -2)  # (K, 6, 3)
    Z = np.linalg.solve(Ff_safe[..., None, :, :], np.broadcast_to(JT, (*lead, *JT.shape)))
    var = np.einsum("kij,...kji->...k", Js, Z)
    return np.where(ok[..., None], np.maximum(var, 0.0), math.inf)


def task_point_sigma(
    information_matrix: np.ndarray,
    cell_T_base: np.ndarray,
    task_points,
    *,
    measurement: str = "pose",
    lever_arm_m: float = 1.0,
) -> np.ndarray:
    """Predicted 1-sigma error of task points from a station set's information.

    Parameters
    ----------
    information_matrix : array_like, shape (p, p)
        Scaled information (:func:`information`, same ``measurement`` and ``lever_arm_m``).
    cell_T_base : array_like, shape (4, 4)
        Approximate base pose (to express the points in the base frame), m.
    task_points : array_like, shape (K, 3)
        Points in the cell frame, m.

    Returns
    -------
    numpy.ndarray, shape (K,)
        Root of the trace of each point's covariance in the base frame, m (inf while
        ``cell_T_base`` is not determined): what a base-frame result's
        ``predicted_error_at(p).sigma_m`` reports for the same stations and noise.
    """
    if measurement not in ("pose", "point"):
        raise ValueError(f"measurement must be 'pose' or 'point', got {measurement!r}")
    F = np.asarray(information_matrix, float)
    return np.sqrt(_task_variances(F, cell_T_base, _task_points(task_points), measurement, lever_arm_m))


def candidate_stations(
    fk: Callable,
    joint_limits_rad,
    workspace_box_m,
    tracker_cell_p,
    cell_T_base,
    *,
    flange_T_target=None,
    target_axis=(0.0, 0.0, 1.0),
    cone_deg: float = DEFAULT_CONE_DEG,
    ik: Callable | None = None,
    q_seed_rad=None,
    max_roll_rad: float = math.pi,
    n_candidates: int = 1000,
    rng: np.random.Generator | int | None = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Feasible stations (in the box, within the joint limits, in sight): ``(Q (M, n), G (M, 4, 4))``.

    The pool :func:`plan_stations` and :func:`suggest_next_station` choose from (pass it
    back as ``candidates=`` to choose from the same pool again without sampling). With
    ``ik`` (``ik(base_T_flange, q_seed) -> q``) the candidates are solved from poses that face
    the tracker (module docstring), seeded at ``q_seed_rad``; without it, joint vectors are
    sampled. Parameters as for :func:`plan_stations`.
    """
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    Q, G, _ = _candidates(fk, joint_limits_rad, workspace_box_m, tracker_cell_p, cell_T_base, flange_T_target,
                          target_axis, cone_deg, n_candidates, rng, ik=ik, q_seed_rad=q_seed_rad,
                          max_roll_rad=max_roll_rad)
    return Q, G


def _pool(candidates, fk, joint_limits_rad, workspace_box_m, tracker_cell_p, cell_T_base, flange_T_target,
          target_axis, cone_deg, n_candidates, rng, ik, q_seed_rad, max_roll_rad) -> tuple[np.ndarray, np.ndarray, int]:
    """The candidates given (kept when still in the box and in sight) or sampled ones."""
    if candidates is None:
        return _candidates(fk, joint_limits_rad, workspace_box_m, tracker_cell_p, cell_T_base, flange_T_target,
                           target_axis, cone_deg, n_candidates, rng, ik=ik, q_seed_rad=q_seed_rad,
                           max_roll_rad=max_roll_rad)
    Q, G = (np.asarray(c, float) for c in candidates)
    if Q.ndim != 2 or G.shape != (len(Q), 4, 4):
        raise ValueError(f"candidates must be (Q (M, n_joints), G (M, 4, 4)), got {Q.shape} and {G.shape}")
    lo, hi = workspace_box(workspace_box_m)
    Y = np.eye(4) if flange_T_target is None else np.asarray(flange_T_target, float)
    p = G[:, :3, 3]
    ok = np.all((p >= lo) & (p <= hi), axis=1)
    ok &= visible(np.asarray(cell_T_base, float) @ G @ Y, tracker_cell_p, target_axis=target_axis, cone_deg=cone_deg)
    return Q[ok], G[ok], len(Q)


# --- public API ---------------------------------------------------------------------------------------

_FOCI = ("cell_T_base", "all")


def _check_common(measurement: str, focus: str) -> None:
    if measurement not in ("pose", "point"):
        raise ValueError(f"measurement must be 'pose' or 'point', got {measurement!r}")
    if focus not in _FOCI:
        raise ValueError(f"focus must be one of {_FOCI}, got {focus!r}")


def _min_eig(F: np.ndarray, focus: str) -> tuple[float, np.ndarray]:
    w, V = np.linalg.eigh(_focus(F, focus))
    return float(w[0]), V[:, 0]


def plan_stations(
    fk: Callable,
    joint_limits_rad,
    workspace_box_m,
    tracker_cell_p,
    cell_T_base,
    n_stations: int,
    *,
    flange_T_target=None,
    measurement: str = "pose",
    focus: str = "cell_T_base",
    target_axis=(0.0, 0.0, 1.0),
    cone_deg: float = DEFAULT_CONE_DEG,
    noise_translation_m: float = DEFAULT_PLAN_NOISE_M,
    noise_rotation_rad: float = DEFAULT_PLAN_NOISE_RAD,
    lever_arm_m: float = 1.0,
    n_candidates: int = 1000,
    exchange_passes: int = 2,
    rng: np.random.Generator | int | None = 0,
    ik: Callable | None = None,
    q_seed_rad=None,
    max_roll_rad: float = math.pi,
    candidates=None,
    min_separation_m: float = 0.0,
    min_separation_rad: float = 0.0,
) -> StationPlan:
    """N stations that maximise the smallest eigenvalue of the information matrix.

    Parameters
    ----------
    fk : callable
        ``fk(q_rad (n_joints,)) -> base_T_flange (4, 4)`` in metres.
    joint_limits_rad : array_like, shape (n_joints, 2)
        ``[low, high]`` per joint, radians.
    workspace_box_m : pair of array_like, each (3,)
        ``(lower corner, upper corner)`` in the robot base frame, m: the flange origin of
        every station must lie inside.
    tracker_cell_p : array_like, shape (3,)
        Tracker position in the cell frame, m.
    cell_T_base : array_like, shape (4, 4)
        Approximate base pose in the cell (a rough survey or a previous calibration).
    n_stations : int
        Stations to plan (>= 3).
    flange_T_target : array_like, shape (4, 4), optional
        Approximate target mount (identity: the tracker sees the flange itself).
    measurement : {"pose", "point"}
        6-DoF or 3-DoF tracker.
    focus : {"cell_T_base", "all"}
        Maximise the marginal information of ``cell_T_base`` (default) or of every unknown.
    target_axis, cone_deg
        Line-of-sight cone (module docstring).
    noise_translation_m, noise_rotation_rad, lever_arm_m
        Units of the information (module docstring).
    n_candidates : int
        Feasible candidates aimed for (and uniform samples drawn first).
    exchange_passes : int
        Passes of single-station exchanges after the greedy choice.
    rng : numpy.random.Generator or int or None
        Sampling seed (0 by default: the same inputs give the same plan).
    ik, q_seed_rad, max_roll_rad
        Candidates by inverse kinematics from ``q_seed_rad`` (module docstring):
        ``ik(base_T_flange (4, 4), q_seed (n_joints,)) -> q`` raising ValueError when it
        finds none; ``max_roll_rad`` bounds the turn about the target axis.
    candidates : (Q (M, n_joints), G (M, 4, 4)), optional
        A pool from :func:`candidate_stations` to choose from instead of sampling (those
        no longer in the box or in sight are dropped).
    min_separation_m, min_separation_rad : float
        No two stations chosen are within both of these of each other (a capture refuses
        a pose that near an accepted one as the same pose).

    Returns
    -------
    StationPlan

    Raises
    ------
    ValueError
        Bad limits or box, or fewer feasible candidates (in the box and in sight) than
        ``n_stations``.
    """
    _check_common(measurement, focus)
    if int(n_stations) < 3:
        raise ValueError(f"n_stations must be >= 3, got {n_stations}")
    n = int(n_stations)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    Q, G, n_cand = _pool(candidates, fk, joint_limits_rad, workspace_box_m, tracker_cell_p, cell_T_base,
                         flange_T_target, target_axis, cone_deg, n_candidates, rng, ik, q_seed_rad, max_roll_rad)
    if len(Q) < n:
        raise ValueError(
            f"only {len(Q)} of {n_cand} sampled joint vectors put the flange in the workspace box "
            f"with the target in the tracker's line of sight (cone {cone_deg:g} deg); "
            f"{n} stations were asked for: widen the box or the cone, or sample more"
        )
    info_kw = dict(flange_T_target=flange_T_target, measurement=measurement,
                   noise_translation_m=noise_translation_m, noise_rotation_rad=noise_rotation_rad,
                   lever_arm_m=lever_arm_m)
    Fc = information(G, cell_T_base, per_station=True, **info_kw)
    eps = 1e-9 * float(np.mean(np.trace(Fc, axis1=1, axis2=2)))
    p = Fc.shape[1]
    chosen: list[int] = []
    F = np.zeros((p, p))
    free = np.ones(len(Q), bool)
    near = _near(G, G, min_separation_m, min_separation_rad)  # a candidate is near itself
    for _ in range(n):
        idx = np.flatnonzero(free & ~near[chosen].any(axis=0)) if chosen else np.flatnonzero(free)
        if len(idx) == 0:
            raise ValueError(
                f"only {len(chosen)} of {len(Q)} feasible candidates are {min_separation_m * 1e3:g} mm or "
                f"{math.degrees(min_separation_rad):g} deg apart; {n} stations were asked for: widen the box or "
                "the cone, or sample more"
            )
        k = int(idx[np.argmax(_gain_scores(F, Fc[idx], eps, focus))])
        chosen.append(k)
        free[k] = False
        F = F + Fc[k]
    # Exchanges: replace a station by the candidate that raises the smallest eigenvalue most.
    for _ in range(int(exchange_passes)):
        improved = False
        for pos in range(n):
            base = F - Fc[chosen[pos]]
            others = [c for j, c in enumerate(chosen) if j != pos]
            idx = np.flatnonzero(free & ~near[others].any(axis=0))
            if len(idx) == 0:
                continue
            lam_c = np.linalg.eigvalsh(_focus(base[None] + Fc[idx], focus))[:, 0]
            j = int(np.argmax(lam_c))
            if lam_c[j] > _min_eig(F, focus)[0] * (1.0 + 1e-6):
                free[chosen[pos]] = True
                free[idx[j]] = False
                chosen[pos] = int(idx[j])
                F = base + Fc[idx[j]]
                improved = True
        if not improved:
            break
    lam, v = _min_eig(F, focus)
    st, sr = _predicted_sigmas(F, measurement, lever_arm_m)
    sel = np.array(chosen)
    return StationPlan(
        q_rad=Q[sel], base_T_flange=G[sel], information=F, min_eigenvalue=lam,
        worst_sigma_m=1.0 / math.sqrt(lam) if lam > 0 else math.inf,
        weakest_direction=v, weakest_description=_describe(v, measurement),
        predicted_sigma_translation_mm=st, predicted_sigma_rotation_deg=sr,
        n_candidates=n_cand, n_feasible=len(Q), measurement=measurement,
    )


def suggest_next_station(
    stations,
    fk: Callable,
    joint_limits_rad,
    workspace_box_m,
    tracker_cell_p,
    cell_T_base,
    *,
    flange_T_target=None,
    measurement: str = "pose",
    focus: str = "cell_T_base",
    target_axis=(0.0, 0.0, 1.0),
    cone_deg: float = DEFAULT_CONE_DEG,
    noise_translation_m: float = DEFAULT_PLAN_NOISE_M,
    noise_rotation_rad: float = DEFAULT_PLAN_NOISE_RAD,
    lever_arm_m: float = 1.0,
    n_candidates: int = 1000,
    rng: np.random.Generator | int | None = 0,
    ik: Callable | None = None,
    q_seed_rad=None,
    max_roll_rad: float = math.pi,
    candidates=None,
    task_points=None,
    min_separation_m: float = 0.0,
    min_separation_rad: float = 0.0,
    exclude=None,
    q_current_rad=None,
    near_best: float = 0.0,
) -> NextStation:
    """The reachable, visible station that best fixes the current stations' weakest direction.

    It maximises the smallest eigenvalue (of the ``focus`` information) with the station
    added; if no single station lifts it off zero (two or more are missing, e.g. too few
    stations so far), it maximises the information gained along the null directions.

    Parameters
    ----------
    stations : array_like, shape (N, 4, 4), or StationPlan
        The stations measured (or planned) so far: ``base_T_flange`` (N may be 0).
    fk, joint_limits_rad, workspace_box_m, tracker_cell_p, cell_T_base, ...
        As for :func:`plan_stations` (``ik``, ``q_seed_rad``, ``max_roll_rad`` and
        ``candidates`` too).
    task_points : array_like, shape (K, 3), optional
        Cell-frame points, m: once the stations with one more determine ``cell_T_base``,
        the station chosen is the one that lowers the largest predicted error at them
        (:func:`task_point_sigma`) most, instead of the one that lifts the smallest
        eigenvalue most. A candidate already among ``stations`` is never chosen again.
    min_separation_m, min_separation_rad : float
        Nor one within both of these of a station of ``stations`` or of ``exclude``.
    exclude : array_like, shape (K, 4, 4), optional
        Poses not to suggest (e.g. stations given up after rejections).
    q_current_rad : array_like, shape (n_joints,), optional
        Where the robot is: of the candidates scoring within ``near_best`` (relative) of
        the best, the one with the smallest largest joint move from here is chosen (moves
        are downtime too).
    near_best : float
        That tolerance (0: the best score only).

    Returns
    -------
    NextStation

    Raises
    ------
    ValueError
        Bad limits or box, or no sampled joint vector is feasible.
    """
    _check_common(measurement, focus)
    if isinstance(stations, StationPlan):
        stations = stations.base_T_flange
    S = np.asarray(stations, float).reshape(-1, 4, 4)
    pts = None if task_points is None else _task_points(task_points)
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    Q, G, n_cand = _pool(candidates, fk, joint_limits_rad, workspace_box_m, tracker_cell_p, cell_T_base,
                         flange_T_target, target_axis, cone_deg, n_candidates, rng, ik, q_seed_rad, max_roll_rad)
    V = S if exclude is None else np.concatenate([S, np.asarray(exclude, float).reshape(-1, 4, 4)])
    if len(V) and len(Q):
        # A station measured already (or as near as the capture calls the same pose) adds
        # nothing a capture would accept: drop it from the pool.
        fresh = ~_near(G, V, min_separation_m, min_separation_rad).any(axis=1)
        Q, G = Q[fresh], G[fresh]
    if len(Q) == 0:
        raise ValueError(
            f"none of {n_cand} sampled joint vectors puts the flange in the workspace box with the "
            f"target in the tracker's line of sight (cone {cone_deg:g} deg)"
        )
    info_kw = dict(flange_T_target=flange_T_target, measurement=measurement,
                   noise_translation_m=noise_translation_m, noise_rotation_rad=noise_rotation_rad,
                   lever_arm_m=lever_arm_m)
    Fc = information(G, cell_T_base, per_station=True, **info_kw)
    p = Fc.shape[1]
    F = information(S, cell_T_base, **info_kw) if len(S) else np.zeros((p, p))
    Ff = _focus(F, focus)
    w, V = np.linalg.eigh(Ff)
    lam0, v0 = float(w[0]), V[:, 0]
    eps = 1e-9 * float(np.mean(np.trace(Fc, axis1=1, axis2=2)))
    after = np.linalg.eigvalsh(_focus(F[None] + Fc, focus))[:, 0]
    task_before = task_after = math.nan
    task_all = None
    if pts is not None:
        task_before = float(np.sqrt(_task_variances(F, cell_T_base, pts, measurement, lever_arm_m).max()))
        task_all = np.sqrt(_task_variances(F[None] + Fc, cell_T_base, pts, measurement, lever_arm_m).max(axis=1))
    qc = None if q_current_rad is None else np.asarray(q_current_rad, float).reshape(-1)

    def nearest(good: np.ndarray, best: int) -> int:
        """Among the candidates ``good`` (bool), the one the robot reaches with the smallest
        largest joint move (``best`` without ``q_current_rad``)."""
        if qc is None or not good.any():
            return best
        idx = np.flatnonzero(good)
        return int(idx[np.argmin(np.max(np.abs(Q[idx] - qc), axis=1))])

    tol = max(float(near_best), 0.0)
    if task_all is not None and np.isfinite(task_all).any():
        k = int(np.argmin(task_all))
        k = nearest(task_all <= task_all[k] * (1.0 + tol), k)
        task_after = float(task_all[k])
    elif after.max() > eps:
        k = int(np.argmax(after))
        k = nearest(after >= after[k] * (1.0 - tol), k)
    else:
        # Gain along the null directions of the full matrix (the focus one is not defined
        # yet when the nuisance block is singular).
        wf, Vf = np.linalg.eigh(F)
        null = Vf[:, wf <= max(eps, 1e-9 * max(float(wf[-1]), 0.0))]
        gain = np.einsum("ia,nij,ja->n", null, Fc, null)
        k = int(np.argmax(gain))

    def sig(lam: float) -> float:
        return 1.0 / math.sqrt(lam) if lam > eps else math.inf

    return NextStation(
        q_rad=Q[k], base_T_flange=G[k], weakest_direction=v0,
        weakest_description=_describe(v0, measurement),
        min_eigenvalue_before=lam0, min_eigenvalue_after=float(after[k]),
        worst_sigma_before_m=sig(lam0), worst_sigma_after_m=sig(float(after[k])),
        task_sigma_before_m=task_before,
        task_sigma_after_m=task_after if task_all is None or math.isfinite(task_after) else math.inf,
    )
