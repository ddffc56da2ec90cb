"""Synthetic calibration scenes with known truth, for tests, benchmarks and the demo.

Pure numpy and seeded: the same ``rng`` gives the same scene. The default geometry is a
robot whose base stands about 2 m from the tracker, with the flange moving through a
0.4 m box at orientations within ``max_tilt_deg`` of tool-down; noise is added per axis
to the tracker measurements (1-sigma, translation in mm and rotation in deg at the edge,
converted to SI here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp

__all__ = ["Scene", "random_rotation", "perturb", "base_frame_scene", "hand_eye_scene", "pivot_scene"]


@dataclass(frozen=True)
class Scene:
    """Stations and the truth behind them (every array in metres)."""

    base_T_flange: np.ndarray  # (N, 4, 4) robot side
    measured: np.ndarray  # (N, 4, 4) cell_T_target (base frame) or camera_T_target (hand-eye)
    X: np.ndarray  # cell_T_base or flange_T_camera
    Y: np.ndarray  # flange_T_target or base_T_target


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """Uniformly distributed rotation matrix (from a normalised 4-D Gaussian)."""
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def perturb(T: np.ndarray, rng: np.random.Generator, noise_mm: float, noise_deg: float) -> np.ndarray:
    """``T`` with Gaussian noise: per-axis translation (mm) and rotation vector (deg), 1-sigma.

    The rotation noise is applied on the right (in the child frame), as a tracker's
    orientation error is a property of the target it sees.
    """
    out = T.copy()
    if noise_deg:
        out[:3, :3] = T[:3, :3] @ so3_exp(rng.normal(scale=math.radians(noise_deg), size=3))
    if noise_mm:
        out[:3, 3] += rng.normal(scale=noise_mm * 1e-3, size=3)
    return out


def _flange_poses(n: int, rng: np.random.Generator, max_tilt_deg: float) -> np.ndarray:
    down = np.diag([1.0, -1.0, -1.0])  # tool pointing down -z of the base
    G = np.empty((n, 4, 4))
    for i in range(n):
        tilt = rng.normal(size=3)
        tilt *= math.radians(max_tilt_deg) * rng.uniform(0.3, 1.0) / np.linalg.norm(tilt)
        R = down @ so3_exp(tilt)
        t = rng.uniform((0.3, -0.4, 0.2), (0.7, 0.4, 0.6))
        G[i] = make_transform(R, t)
    return G


def base_frame_scene(
    n: int,
    rng: np.random.Generator,
    *,
    noise_mm: float = 0.0,
    noise_deg: float = 0.0,
    distance_m: float = 2.0,
    max_tilt_deg: float = 60.0,
) -> Scene:
    """Base-frame stations: ``cell_T_target_i = X @ base_T_flange_i @ Y`` plus tracker noise."""
    direction = rng.normal(size=3)
    direction /= np.linalg.norm(direction)
    X = make_transform(random_rotation(rng), direction * distance_m)
    Y = make_transform(so3_exp(rng.normal(scale=0.3, size=3)), rng.uniform(-0.1, 0.1, size=3))
    G = _flange_poses(n, rng, max_tilt_deg)
    M = np.array([perturb(X @ g @ Y, rng, noise_mm, noise_deg) for g in G])
    return Scene(G, M, X, Y)


def hand_eye_scene(
    n: int,
    rng: np.random.Generator,
    *,
    noise_mm: float = 0.0,
    noise_deg: float = 0.0,
    max_tilt_deg: float = 45.0,
) -> Scene:
    """Eye-in-hand stations: ``camera_T_target_i = inv(G_i @ X) @ Z`` plus camera noise."""
    X = make_transform(so3_exp(rng.normal(scale=0.5, size=3)), rng.uniform(-0.1, 0.1, size=3))
    Z = make_transform(random_rotation(rng), np.array([0.5, 0.0, -0.1]))
    G = _flange_poses(n, rng, max_tilt_deg)
    O = np.array([perturb(se3_inverse(g @ X) @ Z, rng, noise_mm, noise_deg) for g in G])
    return Scene(G, O, X, Z)


def pivot_scene(
    n: int, rng: np.random.Generator, *, noise_mm: float = 0.0, max_tilt_deg: float = 40.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pivot stations: ``base_T_flange_i`` with ``R_i p_tip + t_i = p_pivot`` (+ robot noise).

    Returns ``(base_T_flange (N, 4, 4), flange_p_tip (3,), base_p_pivot (3,))``.
    """
    p_tip = np.array([0.01, -0.02, 0.18])
    p_pivot = np.array([0.5, 0.1, 0.05])
    G = np.empty((n, 4, 4))
    down = np.diag([1.0, -1.0, -1.0])
    for i in range(n):
        tilt = rng.normal(size=3)
        tilt *= math.radians(max_tilt_deg) * rng.uniform(0.3, 1.0) / np.linalg.norm(tilt)
        R = down @ so3_exp(tilt)
        t = p_pivot - R @ p_tip
        if noise_mm:
            t = t + rng.normal(scale=noise_mm * 1e-3, size=3)
        G[i] = make_transform(R, t)
    return G, p_tip, p_pivot
