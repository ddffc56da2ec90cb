"""Station plans: which flange poses a calibration run visits.

* **explicit**: the stations listed in the configuration (joint vectors, or flange poses in
  the base frame), in the order given.
* **generated**: ``n`` stations inside a workspace box (base frame), each reachable by
  inverse kinematics from the home configuration within the joint limits, with
  orientations tilted from the home orientation about axes spread around the circle and
  turned about the tool axis, so the relative rotations between stations have well
  spread axes (a high ``axis_spread``, ADR 0002). The order is a nearest-neighbour tour
  in joint space from home, which keeps moves short.

A plan is stored with its run (as plain lists), so a run resumed after a crash visits
exactly the same stations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import make_transform, matrix_from_quat, so3_exp

__all__ = ["PlannedStation", "PlanError", "generate_plan", "explicit_plan", "plan_to_dict", "plan_from_dict"]


class PlanError(CellcalError, ValueError):
    """No plan can be made from the settings given (say which and why)."""


@dataclass(frozen=True)
class PlannedStation:
    """One station of a plan.

    Attributes
    ----------
    index : int
        Position in the plan (the store's ``plan_index``).
    q_rad : numpy.ndarray or None, shape (6,)
        Joint target, when known.
    base_T_flange : numpy.ndarray or None, shape (4, 4)
        Flange target in the base frame (m), when known.
    """

    index: int
    q_rad: np.ndarray | None
    base_T_flange: np.ndarray | None


def _halton(i: int, base: int) -> float:
    f, r = 1.0, 0.0
    while i > 0:
        f /= base
        r += f * (i % base)
        i //= base
    return r


def generate_plan(
    model: Any,
    *,
    n: int,
    box_min_m: np.ndarray,
    box_max_m: np.ndarray,
    max_tilt_rad: float,
    home_q_rad: np.ndarray,
    q_min_rad: np.ndarray | None = None,
    q_max_rad: np.ndarray | None = None,
    seed: int = 0,
    max_draws: int | None = None,
) -> list[PlannedStation]:
    """Generate ``n`` reachable stations with well-spread rotation axes.

    Parameters
    ----------
    model : object with ``forward(q) -> (4, 4)`` and ``inverse(T, q_seed) -> q``
        The robot's kinematics (``cellcal.drivers.kinematics.DHModel``).
    n : int
        Stations wanted (>= 3).
    box_min_m, box_max_m : (3,) arrays
        Workspace box for the flange origin, base frame, metres.
    max_tilt_rad : float
        Largest tilt from the home orientation (the turn about the tool axis is up to the
        same angle).
    home_q_rad : (6,) array
        Home configuration: IK seed and the start of the tour.
    q_min_rad, q_max_rad : (6,) arrays, optional
        Joint limits (default +-2 pi).
    seed : int
        Seed for the position draw (the plan is a deterministic function of its inputs).

    Raises
    ------
    PlanError
        If fewer than ``n`` reachable stations were found in ``max_draws`` draws.
    """
    if n < 3:
        raise PlanError(f"a plan needs at least 3 stations, got {n}")
    home = np.asarray(home_q_rad, dtype=float)
    lo = np.full(home.shape, -2 * math.pi) if q_min_rad is None else np.asarray(q_min_rad, float)
    hi = np.full(home.shape, 2 * math.pi) if q_max_rad is None else np.asarray(q_max_rad, float)
    box_min_m, box_max_m = np.asarray(box_min_m, float), np.asarray(box_max_m, float)
    R_home = model.forward(home)[:3, :3]
    rng = np.random.default_rng(seed)
    shift = rng.uniform(0, 1, 3)  # a seeded Cranley-Patterson rotation of the Halton points
    golden = math.pi * (3.0 - math.sqrt(5.0))
    stations: list[tuple[np.ndarray, np.ndarray]] = []
    draws = 0
    limit = max_draws if max_draws is not None else 20 * n
    while len(stations) < n and draws < limit:
        draws += 1
        u = np.array([(_halton(draws, b) + s) % 1.0 for b, s in zip((2, 3, 5), shift)])
        p = box_min_m + u * (box_max_m - box_min_m)
        # Tilt axis turns by the golden angle per station; tilt and tool-axis turn alternate
        # in sign and size so every pair of stations differs about a different axis.
        phi = golden * draws
        tilt = max_tilt_rad * (0.5 + 0.5 * _halton(draws, 7))
        yaw = max_tilt_rad * (2.0 * _halton(draws, 11) - 1.0)
        axis = np.array([math.cos(phi), math.sin(phi), 0.0])
        R = R_home @ so3_exp(np.array([0.0, 0.0, yaw])) @ so3_exp(axis * tilt)
        T = make_transform(R, p)
        seed_q = stations[-1][0] if stations else home
        try:
            q = model.inverse(T, seed_q)
        except ValueError:
            try:
                q = model.inverse(T, home)
            except ValueError:
                continue
        if np.any(q < lo) or np.any(q > hi):
            continue
        stations.append((q, T))
    if len(stations) < n:
        raise PlanError(
            f"only {len(stations)} of {n} stations reachable in {draws} draws: widen the "
            f"workspace box, reduce max_tilt_deg or move it nearer the robot's home pose"
        )
    order = _tour([q for q, _ in stations], home)
    return [PlannedStation(i, stations[j][0], stations[j][1]) for i, j in enumerate(order)]


def _tour(qs: list[np.ndarray], start: np.ndarray) -> list[int]:
    """Nearest-neighbour order in joint space (largest joint move as the distance)."""
    left = list(range(len(qs)))
    order: list[int] = []
    cur = start
    while left:
        j = min(left, key=lambda i: float(np.max(np.abs(qs[i] - cur))))
        order.append(j)
        left.remove(j)
        cur = qs[j]
    return order


def explicit_plan(stations: list[Any], model: Any | None = None) -> list[PlannedStation]:
    """A plan from the configuration's ``[[plan.stations]]`` (already in SI)."""
    out = []
    for i, st in enumerate(stations):
        if st.q_rad:
            q = np.asarray(st.q_rad, dtype=float)
            T = model.forward(q) if model is not None else None
            out.append(PlannedStation(i, q, T))
        else:
            T = make_transform(matrix_from_quat(np.asarray(st.flange_quat_wxyz, float)), np.asarray(st.flange_xyz_m, float))
            out.append(PlannedStation(i, None, T))
    return out


def plan_to_dict(plan: list[PlannedStation]) -> dict:
    """JSON-ready form stored with a run."""
    return {
        "stations": [
            {
                "index": s.index,
                "q_rad": None if s.q_rad is None else [float(v) for v in s.q_rad],
                "base_T_flange": None if s.base_T_flange is None else [float(v) for v in np.asarray(s.base_T_flange).reshape(16)],
            }
            for s in plan
        ]
    }


def plan_from_dict(d: dict) -> list[PlannedStation]:
    """Inverse of :func:`plan_to_dict`."""
    out = []
    for s in d["stations"]:
        q = None if s["q_rad"] is None else np.asarray(s["q_rad"], dtype=float)
        T = None if s["base_T_flange"] is None else np.asarray(s["base_T_flange"], dtype=float).reshape(4, 4)
        out.append(PlannedStation(int(s["index"]), q, T))
    return out
