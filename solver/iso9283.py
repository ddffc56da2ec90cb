"""ISO 9283 pose accuracy (AP) and pose repeatability (RP), and the test poses P1-P5.

**Test poses.** ISO 9283 places five poses in the *measuring plane*, a diagonal plane of
the largest cube that fits the working space: P1 at the cube's centre, P2-P5 on the
plane's diagonals at 10 % of the diagonal's length from its corners. Here the plane is
the one through the cube's two vertical edges at ``(-h, -h)`` and ``(+h, +h)`` (cube axes
along the cell's, half side ``h``), and "largest cube in the working space" is made
concrete as the largest cube of that orientation about a chosen centre whose eight corners
the arm reaches with the chosen tool orientation (bisection on the side, inverse
kinematics on the given model): :func:`iso9283_test_poses`.

**Pose accuracy and repeatability** (clause 7.2 and 7.2.3), per pose ``j`` over ``n``
cycles, attained positions ``x_i`` with barycentre ``xbar`` and commanded ``x_c``::

    AP_p = |xbar - x_c|                         (position accuracy)
    l_i  = |x_i - xbar|,   lbar = mean(l_i)
    S_l  = sqrt(sum((l_i - lbar)^2) / (n - 1))
    RP_l = lbar + 3 S_l                         (position repeatability)

and for orientation ``AP_a, AP_b, AP_c`` (mean deviation of the angles about x, y, z from
the commanded, here the components of the rotation vector of ``R_c^T R_i``, exact to first
order for the small deviations the test measures) and ``RP_a, RP_b, RP_c = 3 S`` of each.
The standard asks for 30 cycles (``cycles``), the poses visited in the order P1-P5 each
cycle: :func:`iso9283_pose_test` computes the figures from the attained and commanded
poses, :func:`simulate_iso9283_cycles` produces the attained poses in a simulated cell
(a controller that solves inverse kinematics with its model, a true arm, joint
repeatability and tracker noise).

**Commanding the poses.** The commanded poses are those of the measured target (or of a
point on the flange, with the flange's orientation) in the cell, the measuring frame:
:func:`iso9283_commanded` takes P1-P5 there through a base frame and a target. A
controller reaches them with *its* model, base frame and target (the nominal arm with its
own best rigid fit, or the identified one): :func:`iso9283_joint_targets` gives the joint
angles it commands. The daemon's pose test and the simulation share both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from cellcal.solver.kinematic_parameters import _param_twists
from cellcal.solver.kinematics import N_JOINTS, DHParameters
from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp, so3_log

__all__ = [
    "ISO9283Poses",
    "ISO9283Result",
    "iso9283_test_poses",
    "iso9283_pose_test",
    "simulate_iso9283_cycles",
    "inverse_kinematics",
    "iso9283_commanded",
    "iso9283_joint_targets",
    "point_tool",
    "ISO9283_CYCLES",
    "ISO9283_POSE_NAMES",
]

#: Cycles ISO 9283 asks for in the pose test.
ISO9283_CYCLES = 30
#: The test poses, in the order each cycle visits them.
ISO9283_POSE_NAMES = ("P1", "P2", "P3", "P4", "P5")
_JOINTS = tuple(f"joint{i + 1}.zero_offset" for i in range(N_JOINTS))


def inverse_kinematics(model: DHParameters, base_T_flange: ArrayLike, q_seed: ArrayLike, *,
                       tol_m: float = 1e-10, max_iterations: int = 200) -> np.ndarray:
    """Joint angles (6,) reaching ``base_T_flange`` (4, 4) on ``model``, from ``q_seed``.

    Damped Newton on the pose error (position, m; rotation vector, rad) with the joint
    screws as the Jacobian; the branch is the seed's.

    Raises
    ------
    ValueError
        Not reached within ``max_iterations`` (out of reach, or a singular seed).
    """
    Td = np.asarray(base_T_flange, dtype=np.float64)
    q = np.array(q_seed, dtype=np.float64).reshape(N_JOINTS)
    lam = 1e-6
    for _ in range(max_iterations):
        T, tw = _param_twists(model, q[None, :], _JOINTS)
        T, tw = T[0], tw[0]
        p = T[:3, 3]
        err = np.concatenate([Td[:3, 3] - p, so3_log(Td[:3, :3] @ T[:3, :3].T)])
        if np.linalg.norm(err[:3]) < tol_m and np.linalg.norm(err[3:]) < tol_m:
            return q
        J = np.empty((6, N_JOINTS))
        J[:3] = (tw[:, :3] + np.cross(tw[:, 3:], p)).T
        J[3:] = tw[:, 3:].T
        step = np.linalg.solve(J.T @ J + lam * np.eye(N_JOINTS), J.T @ err)
        big = float(np.max(np.abs(step)))
        q = q + (step if big <= 0.3 else step * (0.3 / big))  # far seeds: no overshoot
    raise ValueError("inverse_kinematics: pose not reached (out of reach or a singular seed)")


@dataclass(frozen=True, kw_only=True)
class ISO9283Poses:
    """The five ISO 9283 test poses (module docstring).

    Attributes
    ----------
    base_T_flange : numpy.ndarray, shape (5, 4, 4)
        P1-P5 as flange poses in the base frame, m.
    q : numpy.ndarray, shape (5, 6)
        Joint angles reaching them on the model they were planned with, rad.
    cube_centre_m : numpy.ndarray, shape (3,)
    cube_side_m : float
    """

    base_T_flange: np.ndarray
    q: np.ndarray
    cube_centre_m: np.ndarray
    cube_side_m: float


def _cube_points(centre: np.ndarray, side: float) -> tuple[np.ndarray, np.ndarray]:
    h = 0.5 * side
    corners = centre + h * np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], float)
    plane = centre + h * np.array([[-1, -1, -1], [1, 1, -1], [1, 1, 1], [-1, -1, 1]], float)
    p = [centre] + [c + 0.2 * (centre - c) for c in plane]  # 10 % of the diagonal from each corner
    return corners, np.array(p)


def iso9283_test_poses(model: DHParameters, *, cube_centre_m: ArrayLike, base_R_flange: ArrayLike | None = None,
                       cube_side_m: float | None = None, q_seed: ArrayLike | None = None,
                       max_side_m: float = 1.0) -> ISO9283Poses:
    """P1-P5 of ISO 9283 for ``model`` (module docstring).

    Parameters
    ----------
    model : DHParameters
    cube_centre_m : array_like, shape (3,)
        Cube centre in the base frame, m.
    base_R_flange : array_like, shape (3, 3), optional
        Flange orientation at every pose (default: flange z pointing down, -z of the base).
    cube_side_m : float, optional
        The cube's side; default: the largest (to 1 mm, up to ``max_side_m``) whose corners
        the arm reaches. Given, its corners must be reachable.
    q_seed : array_like, shape (6,), optional
        Branch of the inverse kinematics (default: a UR-like elbow-up seed).

    Raises
    ------
    ValueError
        The centre itself (or, with ``cube_side_m``, a corner) is out of reach, or a bad
        argument.
    """
    c = np.asarray(cube_centre_m, dtype=np.float64).reshape(3)
    R = np.diag([1.0, -1.0, -1.0]) if base_R_flange is None else np.asarray(base_R_flange, dtype=np.float64)
    seed = np.array([0.0, -1.2, 1.5, -1.9, -1.57, 0.0]) if q_seed is None else np.asarray(q_seed, float).reshape(6)

    def solve_all(points: np.ndarray) -> np.ndarray:
        out = []
        q0 = inverse_kinematics(model, make_transform(R, c), seed)
        for p in points:
            q = inverse_kinematics(model, make_transform(R, p), q0)
            if np.max(np.abs(q - q0)) > 2.0:  # jumped branch: not the same arm configuration
                raise ValueError("branch change")
            out.append(q)
        return np.array(out)

    if cube_side_m is None:
        lo, hi = 0.0, float(max_side_m)
        while hi - lo > 1e-3:
            mid = 0.5 * (lo + hi)
            try:
                solve_all(np.vstack(_cube_points(c, mid)))
                lo = mid
            except ValueError:
                hi = mid
        side = lo
        if side <= 0.0:
            raise ValueError(f"cube centre {c.tolist()} is out of reach with that orientation")
    else:
        side = float(cube_side_m)
        if not side > 0:
            raise ValueError(f"cube_side_m must be positive, got {cube_side_m!r}")
        try:
            solve_all(_cube_points(c, side)[0])
        except ValueError:
            raise ValueError(f"a cube of side {side:g} m about {c.tolist()} leaves the working space "
                             "(a corner is out of reach with that orientation)") from None
    _, P = _cube_points(c, side)
    q = solve_all(P)
    T = np.array([make_transform(R, p) for p in P])
    return ISO9283Poses(base_T_flange=T, q=q, cube_centre_m=c, cube_side_m=side)


@dataclass(frozen=True, kw_only=True)
class ISO9283Result:
    """ISO 9283 pose accuracy and repeatability per pose (module docstring).

    Attributes
    ----------
    ap_m, rp_m : numpy.ndarray, shape (5,)
        Position accuracy ``AP_p`` and repeatability ``RP_l`` per pose, m.
    ap_abc_rad, rp_abc_rad : numpy.ndarray, shape (5, 3)
        Orientation accuracy ``AP_a, AP_b, AP_c`` and repeatability ``RP_a, RP_b, RP_c``,
        rad (NaN when positions only were given).
    cycles : int
    max_ap_m, max_rp_m : float
        The worst pose's figures, m.
    """

    ap_m: np.ndarray
    rp_m: np.ndarray
    ap_abc_rad: np.ndarray
    rp_abc_rad: np.ndarray
    cycles: int
    max_ap_m: float
    max_rp_m: float


def iso9283_pose_test(commanded: ArrayLike, attained: ArrayLike) -> ISO9283Result:
    """AP and RP of ISO 9283 from commanded and attained poses.

    Parameters
    ----------
    commanded : array_like, shape (P, 4, 4) or (P, 3)
        Commanded poses (or positions), any one frame, m.
    attained : array_like, shape (n, P, 4, 4) or (n, P, 3)
        Attained (measured) poses over ``n >= 2`` cycles, same frame, m.

    Raises
    ------
    ValueError
        Shapes that do not match, fewer than two cycles, or non-finite values.
    """
    C = np.asarray(commanded, dtype=np.float64)
    A = np.asarray(attained, dtype=np.float64)
    poses = C.ndim == 3
    if not ((poses and C.shape[1:] == (4, 4)) or (C.ndim == 2 and C.shape[1] == 3)):
        raise ValueError(f"commanded: expected (P, 4, 4) or (P, 3), got {C.shape}")
    if A.ndim != C.ndim + 1 or A.shape[1:] != C.shape:
        raise ValueError(f"attained: expected (n, {', '.join(map(str, C.shape))}), got {A.shape}")
    if A.shape[0] < 2:
        raise ValueError("attained: at least two cycles are needed for repeatability (ISO 9283 asks for 30)")
    if not (np.all(np.isfinite(A)) and np.all(np.isfinite(C))):
        raise ValueError("commanded/attained: contain NaN or inf")
    n, P = A.shape[0], A.shape[1]
    xc = C[:, :3, 3] if poses else C
    x = A[:, :, :3, 3] if poses else A
    xbar = x.mean(axis=0)
    ap = np.linalg.norm(xbar - xc, axis=1)
    lengths = np.linalg.norm(x - xbar[None], axis=2)
    rp = lengths.mean(axis=0) + 3.0 * lengths.std(axis=0, ddof=1)
    ap_abc = np.full((P, 3), math.nan)
    rp_abc = np.full((P, 3), math.nan)
    if poses:
        dev = np.array([[so3_log(C[j, :3, :3].T @ A[i, j, :3, :3]) for j in range(P)] for i in range(n)])
        ap_abc = dev.mean(axis=0)
        rp_abc = 3.0 * dev.std(axis=0, ddof=1)
    return ISO9283Result(ap_m=ap, rp_m=rp, ap_abc_rad=ap_abc, rp_abc_rad=rp_abc, cycles=int(n),
                         max_ap_m=float(ap.max()), max_rp_m=float(rp.max()))


def point_tool(flange_p_target: ArrayLike) -> np.ndarray:
    """A point on the flange (3,) as a tool frame (4, 4) with the flange's orientation.

    A 3-DoF measurement has no orientation of its own: its "pose" is the point with the
    flange's orientation, so the commanded and attained positions are the point's.
    """
    return make_transform(np.eye(3), np.asarray(flange_p_target, dtype=np.float64).reshape(3))


def iso9283_commanded(base_T_flange: ArrayLike, cell_T_base: ArrayLike, flange_T_tool: ArrayLike) -> np.ndarray:
    """Commanded tool poses in the cell (P, 4, 4) of flange poses in the base (P, 4, 4).

    ``cell_T_base @ base_T_flange[j] @ flange_T_tool``: e.g. :attr:`ISO9283Poses.base_T_flange`
    through a fitted base frame and target (:func:`point_tool` for a point target).
    """
    B = np.asarray(cell_T_base, dtype=np.float64).reshape(4, 4)
    F = np.asarray(base_T_flange, dtype=np.float64).reshape(-1, 4, 4)
    return np.einsum("ij,njk->nik", B, F) @ np.asarray(flange_T_tool, dtype=np.float64).reshape(4, 4)


def iso9283_joint_targets(commanded_cell_T_tool: ArrayLike, model: DHParameters, cell_T_base: ArrayLike,
                          flange_T_tool: ArrayLike, q_seed: ArrayLike) -> np.ndarray:
    """Joint angles (P, 6) a controller commands to reach tool poses in the cell (P, 4, 4).

    The controller's ``model``, base frame ``cell_T_base`` and tool ``flange_T_tool`` (its
    beliefs): inverse kinematics of ``cell_T_base^-1 @ C_j @ flange_T_tool^-1`` from
    ``q_seed``, (6,) or one per pose (P, 6) (e.g. :attr:`ISO9283Poses.q`).

    Raises
    ------
    ValueError
        A pose out of reach (:func:`inverse_kinematics`, naming the pose), or bad shapes.
    """
    C = np.asarray(commanded_cell_T_tool, dtype=np.float64)
    if C.ndim != 3 or C.shape[1:] != (4, 4):
        raise ValueError(f"commanded_cell_T_tool: expected (P, 4, 4), got {C.shape}")
    cb_inv = se3_inverse(np.asarray(cell_T_base, dtype=np.float64))
    ct_inv = se3_inverse(np.asarray(flange_T_tool, dtype=np.float64))
    seeds = np.asarray(q_seed, dtype=np.float64)
    seeds = np.broadcast_to(seeds, (len(C), N_JOINTS)) if seeds.ndim == 1 else seeds
    if seeds.shape != (len(C), N_JOINTS):
        raise ValueError(f"q_seed: expected ({N_JOINTS},) or ({len(C)}, {N_JOINTS}), got {seeds.shape}")
    out = np.empty((len(C), N_JOINTS))
    for j, (Tc, s) in enumerate(zip(C, seeds, strict=True)):
        try:
            out[j] = inverse_kinematics(model, cb_inv @ Tc @ ct_inv, s)
        except ValueError as exc:
            raise ValueError(f"pose {j + 1} of {len(C)}: {exc}") from None
    return out


def simulate_iso9283_cycles(
    commanded_cell_T_tool: ArrayLike,
    *,
    controller_model: DHParameters,
    controller_cell_T_base: ArrayLike,
    controller_flange_T_tool: ArrayLike,
    true_model: DHParameters,
    true_cell_T_base: ArrayLike,
    true_flange_T_tool: ArrayLike,
    q_seed: ArrayLike,
    rng: np.random.Generator,
    cycles: int = ISO9283_CYCLES,
    joint_repeatability_rad: float = 1e-5,
    measure_std_m: float = 0.0,
    measure_std_rad: float = 0.0,
) -> np.ndarray:
    """Attained tool poses in the cell (cycles, P, 4, 4) for commanded cell poses (P, 4, 4).

    The controller turns each commanded pose into joint angles with *its* model, base and
    tool (:func:`iso9283_joint_targets` from ``q_seed``, (6,) or one per pose (P, 6), e.g.
    :attr:`ISO9283Poses.q`); the true arm goes there with a Gaussian
    joint error of ``joint_repeatability_rad`` per cycle; the tracker adds isotropic noise.
    Compare the controller with the nominal model and with an identified one.
    """
    C = np.asarray(commanded_cell_T_tool, dtype=np.float64)
    tb = np.asarray(true_cell_T_base, dtype=np.float64)
    tt = np.asarray(true_flange_T_tool, dtype=np.float64)
    qc = iso9283_joint_targets(C, controller_model, controller_cell_T_base, controller_flange_T_tool, q_seed)
    out = np.empty((int(cycles),) + C.shape)
    for i in range(int(cycles)):
        q = qc + rng.normal(0.0, joint_repeatability_rad, size=qc.shape)
        T = np.einsum("ij,njk->nik", tb, true_model.forward(q)) @ tt
        if measure_std_m > 0:
            T[:, :3, 3] += rng.normal(0.0, measure_std_m, size=(len(T), 3))
        if measure_std_rad > 0:
            for k in range(len(T)):
                T[k, :3, :3] = so3_exp(rng.normal(0.0, measure_std_rad, size=3)) @ T[k, :3, :3]
        out[i] = T
    return out
