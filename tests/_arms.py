"""Held-out arms for the honesty tests of the model-error widening (ADR 0004, "A calibrated
widening"): the widening was chosen on UR5e worlds and the simulator's realistic arms; these
arms are drawn *independently* of those, with code of their own.

* An independent standard-DH forward kinematics (not ``cellcal.solver.kinematics``) and two
  arm geometries unlike the UR5e: an anthropomorphic arm with a spherical wrist (the
  geometry of 6R industrial arms) and a long-reach offset-wrist arm.
* Errors of a real arm's size, drawn per arm: the 1-sigma of its length errors uniform in
  0.1-0.5 mm, of its link twists and of its joint zeros uniform in 0.01-0.05 deg, on every
  row except the base frame's (joint 1's zero, ``d1``) and the tool's (joint 6's zero,
  ``d6``, ``a6``, ``alpha6``), which a calibration rightly absorbs (DESIGN: the base as the
  controller's FK uses it).
* Stations as a tracker sees them: random joint configurations whose flange is 0.45-0.95 m
  from the base axis, within 35 deg of a working azimuth, and whose target faces the tracker
  (2.5 m away) within 45 deg.
* The tracker: 0.02 mm / 0.01 deg per axis (``"iso"``), or the beam-coordinate model of
  :class:`~cellcal.solver.TrackerNoiseModel` from the ISO 10360-10 example MPE with its full
  per-station covariance (``"aniso"``); or a total station's points, 1 mm along the line of
  sight and 15 um across (``"total_station"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver.tracker_noise import TrackerNoiseModel

ARMS = {
    "spherical_wrist": dict(a=[0.15, 0.70, 0.0, 0.0, 0.0, 0.0],
                            alpha=[-math.pi / 2, 0.0, -math.pi / 2, math.pi / 2, -math.pi / 2, 0.0],
                            d=[0.49, 0.0, 0.0, 0.60, 0.0, 0.065], theta=[0.0, -math.pi / 2, 0.0, 0.0, 0.0, 0.0]),
    "offset_wrist": dict(a=[0.0, -0.61, -0.57, 0.0, 0.0, 0.0], alpha=[math.pi / 2, 0.0, 0.0, math.pi / 2, -math.pi / 2, 0.0],
                         d=[0.18, 0.0, 0.0, 0.17, 0.12, 0.12], theta=[0.0] * 6),
}


def fk(arm: dict, q: np.ndarray, err: dict | None = None) -> np.ndarray:
    """Standard DH ``base_T_flange`` (N, 4, 4) at joints ``q`` (N, 6)."""
    a, al, d, th = (np.array(arm[k], dtype=float) for k in ("a", "alpha", "d", "theta"))
    if err is not None:
        a, al, d, th = a + err["a"], al + err["alpha"], d + err["d"], th + err["theta"]
    q = np.atleast_2d(q)
    T = np.tile(np.eye(4), (len(q), 1, 1))
    for i in range(6):
        ct, st = np.cos(q[:, i] + th[i]), np.sin(q[:, i] + th[i])
        ca, sa = math.cos(al[i]), math.sin(al[i])
        A = np.zeros((len(q), 4, 4))
        A[:, 0, 0], A[:, 0, 1], A[:, 0, 2], A[:, 0, 3] = ct, -st * ca, st * sa, a[i] * ct
        A[:, 1, 0], A[:, 1, 1], A[:, 1, 2], A[:, 1, 3] = st, ct * ca, -ct * sa, a[i] * st
        A[:, 2, 1], A[:, 2, 2], A[:, 2, 3] = sa, ca, d[i]
        A[:, 3, 3] = 1.0
        T = T @ A
    return T


def draw_errors(rng: np.random.Generator) -> dict:
    sl = rng.uniform(0.1, 0.5) * 1e-3
    sa = math.radians(rng.uniform(0.01, 0.05))
    sz = math.radians(rng.uniform(0.01, 0.05))
    inner = np.array([0, 1, 1, 1, 1, 0.0])
    five = np.array([1, 1, 1, 1, 1, 0.0])
    return dict(a=rng.normal(0, sl, 6) * five, d=rng.normal(0, sl, 6) * inner,
                alpha=rng.normal(0, sa, 6) * five, theta=rng.normal(0, sz, 6) * inner)


def _rot(axis: int, ang: float) -> np.ndarray:
    c, s = math.cos(ang), math.sin(ang)
    R = np.eye(3)
    i, j = [(1, 2), (2, 0), (0, 1)][axis]
    R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
    return R


def stations(arm: dict, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Joint vectors (n, 6) in front of the tracker and the tracker's position in the base."""
    az0 = rng.uniform(-math.pi, math.pi)
    ang = az0 + rng.uniform(-0.8, 0.8)
    tracker = np.array([2.5 * math.cos(ang), 2.5 * math.sin(ang), rng.uniform(-0.3, 0.8)])
    out = np.zeros((0, 6))
    while len(out) < n:
        q = rng.uniform(-math.pi, math.pi, (4000, 6))
        q[:, 0] = az0 + rng.uniform(-1.2, 1.2, 4000)
        T = fk(arm, q)
        p = T[:, :3, 3]
        r, az = np.hypot(p[:, 0], p[:, 1]), np.arctan2(p[:, 1], p[:, 0])
        v = tracker - p
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        ok = ((r > 0.45) & (r < 0.95) & (p[:, 2] > 0.05) & (p[:, 2] < 0.8)
              & (np.abs(np.angle(np.exp(1j * (az - az0)))) < math.radians(35.0))
              & (np.einsum("ni,ni->n", T[:, :3, 2], v) >= math.cos(math.radians(45.0))))
        out = np.vstack([out, q[ok]])
    return out[:n], tracker


@dataclass
class Trial:
    base_T_flange: np.ndarray  # the controller's (nominal) FK
    cell_T_target: np.ndarray  # measured
    cov: np.ndarray  # (n, 6, 6) the instrument's per-station covariance
    cell_T_base: np.ndarray  # truth
    flange_T_target: np.ndarray
    base_p_task: np.ndarray  # (3, 3) task points among the stations, base frame


def trial(arm_name: str, n: int, seed: int, noise: str, error_scale: float = 1.0, along_m: float = 1e-3) -> Trial:
    """One held-out arm, its stations and measurements (module docstring); ``error_scale``
    scales the arm's drawn errors (0.3: an arm three times as accurate); ``along_m`` is the
    ``"total_station"`` noise's sigma along the line of sight (15 um across)."""
    rng = np.random.default_rng(seed)
    arm = ARMS[arm_name]
    err = {k: v * error_scale for k, v in draw_errors(rng).items()}
    q, tracker = stations(arm, n, rng)
    Rb = _rot(2, rng.uniform(-math.pi, math.pi))
    X = np.eye(4)
    X[:3, :3], X[:3, 3] = Rb, -Rb @ tracker  # the tracker is the cell's origin
    Y = np.eye(4)
    w = rng.normal(scale=0.2, size=3)
    Y[:3, :3] = _rot(0, w[0]) @ _rot(1, w[1]) @ _rot(2, w[2])
    Y[:3, 3] = np.array([0.0, 0.0, 0.05]) + rng.uniform(-0.05, 0.05, 3)
    G, Gt = fk(arm, q), fk(arm, q, err)
    Mt = X @ Gt @ Y
    if noise == "iso":
        sd = np.array([2e-5] * 3 + [math.radians(0.01)] * 3)
        e = rng.normal(size=(n, 6)) * sd
        M = Mt.copy()
        M[:, :3, 3] += e[:, :3]
        for i in range(n):
            th = np.linalg.norm(e[i, 3:])
            k = e[i, 3:] / th if th > 0 else np.zeros(3)
            K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
            M[i, :3, :3] = (np.eye(3) + math.sin(th) * K + (1 - math.cos(th)) * K @ K) @ Mt[i, :3, :3]
        C = np.tile(np.diag(sd ** 2), (n, 1, 1))
    elif noise == "total_station":
        # A total station at the cell's origin measuring the reflector: 1 mm along its line of
        # sight (the distance meter on a prism), 15 um across (its angles); points only, the
        # rotation block a placeholder (0.01 deg) that no point solve reads.
        M, C = Mt.copy(), np.tile(np.diag([0.0] * 3 + [math.radians(0.01) ** 2] * 3), (n, 1, 1))
        for i in range(n):
            u = Mt[i, :3, 3] / np.linalg.norm(Mt[i, :3, 3])
            a = np.cross(u, [0.0, 0.0, 1.0])
            a /= np.linalg.norm(a)
            R = np.stack([u, a, np.cross(u, a)], axis=1)
            sd = np.array([along_m, 15e-6, 15e-6])
            C[i, :3, :3] = R @ np.diag(sd ** 2) @ R.T
            M[i, :3, 3] += R @ (rng.normal(size=3) * sd)
    else:
        M, C, _ = TrackerNoiseModel.from_mpe(np.zeros(3), rotation_mpe_rad=math.radians(0.01)).sample_poses(rng, Mt)
    c = G[:, :3, 3].mean(axis=0)
    tasks = np.array([c, c + [0.2, 0.0, -0.1], c + [-0.1, 0.2, 0.1]])
    return Trial(G, M, C, X, Y, tasks)
