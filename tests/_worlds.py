"""Seeded test worlds for the statistical solver tests, vectorised so that hundreds of
trials cost milliseconds to build (the solves are what the one-minute budget is for).

* :func:`base_frame_scenes`: the distribution of ``cellcal.solver.synthetic.base_frame_scene``
  (base 2 m from the tracker in a random direction, flange in a 0.4 m box with tilts up to
  60 deg from tool-down, per-axis tracker noise: translation in the cell frame, rotation on
  the right), T scenes at once.
* :func:`ur5e_world`: a UR5e-like cell whose *truth* arm is the nominal one plus joint-zero
  and link-length errors (the fit believes the nominal), joint configurations sampled in
  front of the robot, the tracker 2 m away.
"""

from __future__ import annotations

import math

import numpy as np

from cellcal.solver.kinematics import UR5E, DHParameters


def so3_exp_batch(w: np.ndarray) -> np.ndarray:
    """Rotation matrices (..., 3, 3) of rotation vectors (..., 3) (Rodrigues)."""
    th = np.linalg.norm(w, axis=-1)[..., None, None]
    K = np.zeros(w.shape[:-1] + (3, 3))
    K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -w[..., 2], w[..., 1], -w[..., 0]
    K[..., 1, 0], K[..., 2, 0], K[..., 2, 1] = w[..., 2], -w[..., 1], w[..., 0]
    small = th < 1e-8
    ths = np.where(small, 1.0, th)
    a = np.where(small, 1.0, np.sin(ths) / ths)
    b = np.where(small, 0.5, (1.0 - np.cos(ths)) / ths**2)
    return np.eye(3) + a * K + b * (K @ K)


def random_rotations(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    q = rng.normal(size=shape + (4,))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    R = np.empty(shape + (3, 3))
    R[..., 0, 0], R[..., 0, 1], R[..., 0, 2] = 1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)
    R[..., 1, 0], R[..., 1, 1], R[..., 1, 2] = 2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)
    R[..., 2, 0], R[..., 2, 1], R[..., 2, 2] = 2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)
    return R


def _transforms(R: np.ndarray, t: np.ndarray) -> np.ndarray:
    T = np.zeros(R.shape[:-2] + (4, 4))
    T[..., :3, :3] = R
    T[..., :3, 3] = t
    T[..., 3, 3] = 1.0
    return T


def perturb(T: np.ndarray, rng: np.random.Generator, mm: float, deg: float) -> np.ndarray:
    """Tracker noise on poses (..., 4, 4): rotation on the right, translation in the parent."""
    out = T.copy()
    out[..., :3, :3] = T[..., :3, :3] @ so3_exp_batch(rng.normal(scale=math.radians(deg), size=T.shape[:-2] + (3,)))
    out[..., :3, 3] += rng.normal(scale=mm * 1e-3, size=T.shape[:-2] + (3,))
    return out


def base_frame_scenes(trials: int, n: int, rng: np.random.Generator, mm: float, deg: float,
                      max_tilt_deg: float = 60.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(G (T, n, 4, 4), M (T, n, 4, 4), X (T, 4, 4), Y (T, 4, 4))``."""
    d = rng.normal(size=(trials, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    X = _transforms(random_rotations(rng, (trials,)), 2.0 * d)
    Y = _transforms(so3_exp_batch(rng.normal(scale=0.3, size=(trials, 3))), rng.uniform(-0.1, 0.1, size=(trials, 3)))
    tilt = rng.normal(size=(trials, n, 3))
    tilt *= (math.radians(max_tilt_deg) * rng.uniform(0.3, 1.0, size=(trials, n)) / np.linalg.norm(tilt, axis=2))[..., None]
    down = np.diag([1.0, -1.0, -1.0])
    G = _transforms(down @ so3_exp_batch(tilt), rng.uniform((0.3, -0.4, 0.2), (0.7, 0.4, 0.6), size=(trials, n, 3)))
    M = perturb(X[:, None] @ G @ Y[:, None], rng, mm, deg)
    return G, M, X, Y


def ur5e_joints(n: int, rng: np.random.Generator) -> np.ndarray:
    """Joint vectors (n, 6) whose flange is 0.3-0.85 m from the base and above the table,
    with the wrist turned freely (large orientation changes between stations)."""
    out = np.empty((0, 6))
    while out.shape[0] < n:
        q = np.column_stack([
            rng.uniform(-1.6, 1.6, 4 * n), rng.uniform(-2.6, -0.5, 4 * n), rng.uniform(0.4, 2.6, 4 * n),
            rng.uniform(-math.pi, math.pi, 4 * n), rng.uniform(-2.0, 2.0, 4 * n), rng.uniform(-math.pi, math.pi, 4 * n),
        ])
        p = UR5E.forward(q)[:, :3, 3]
        r = np.linalg.norm(p, axis=1)
        out = np.vstack([out, q[(r > 0.3) & (r < 0.85) & (p[:, 2] > 0.05)]])
    return out[:n]


def ur5e_truth(rng: np.random.Generator, joint_deg: float = 0.1, link_mm: float = 0.3) -> DHParameters:
    """The nominal UR5e plus seeded joint-zero errors (1-sigma ``joint_deg``) and link
    errors on ``a`` and ``d`` (1-sigma ``link_mm``)."""
    return UR5E.with_errors(
        delta_theta=rng.normal(scale=math.radians(joint_deg), size=6),
        delta_a=rng.normal(scale=link_mm * 1e-3, size=6),
        delta_d=rng.normal(scale=link_mm * 1e-3, size=6),
        name="ur5e truth",
    )


def ur5e_world(n: int, rng: np.random.Generator, *, mm: float, deg: float, model_error: bool = True,
               joint_deg: float = 0.1, link_mm: float = 0.3, fk_base: bool = False):
    """``(G nominal FK (n, 4, 4), M tracker (n, 4, 4), X cell_T_base, Y flange_T_target)``.

    ``fk_base``: ``X`` is the base *as the controller's FK uses it* (DESIGN, frames): joint 1's
    zero error and ``d1``'s are a rotation about and a shift along the base's z axis before
    every other joint, so they are the base frame's, and a calibration is right to absorb
    them; the same measurements, only the truth they are compared with differs.
    """
    truth = ur5e_truth(rng, joint_deg, link_mm) if model_error else UR5E
    q = ur5e_joints(n, rng)
    d = rng.normal(size=3)
    d /= np.linalg.norm(d)
    X = _transforms(random_rotations(rng, ()), 2.0 * d)
    Y = _transforms(so3_exp_batch(rng.normal(scale=0.3, size=3)), rng.uniform(-0.1, 0.1, 3))
    M = perturb(X @ truth.forward(q) @ Y, rng, mm, deg)
    if fk_base:
        dth, dd = float(truth.theta[0] - UR5E.theta[0]), float(truth.d[0] - UR5E.d[0])
        B = np.eye(4)
        B[:2, :2] = [[math.cos(dth), -math.sin(dth)], [math.sin(dth), math.cos(dth)]]
        B[2, 3] = dd
        X = X @ B
    return UR5E.forward(q), M, X, Y
