"""A simulated cell for kinematic identification: a UR5e truth arm with hidden errors.

The truth is the nominal UR5e plus 0.1 deg (1-sigma) joint zeros and twists, 0.3 mm link
``a`` and ``d`` errors and Hayati tilts ``beta`` on the parallel pairs (rows 2 and 3), all
seeded. The base stands 1.2 m from the cell origin, the tracker 3-4 m from the arm, the
target 80 mm off the flange; the tracker noise is :class:`TrackerNoiseModel` from the ISO
10360-10 example MPE (6-DoF probe: 0.01 deg MPE per axis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver.identify import parameter_names
from cellcal.solver.kinematics import UR5E, DHParameters
from cellcal.solver.se3 import se3_exp
from cellcal.solver.tracker_noise import TrackerNoiseModel

CELL_T_BASE = se3_exp(np.array([1.2, 0.4, 0.0, 0.0, 0.0, 0.4]))
FLANGE_T_TARGET = se3_exp(np.array([0.0, 0.03, 0.08, 0.05, 0.0, 0.0]))
CELL_P_TRACKER = np.array([4.0, 1.0, 0.8])
TRACKER = TrackerNoiseModel.from_mpe(CELL_P_TRACKER, rotation_mpe_rad=math.radians(0.01))


def truth_arm(rng: np.random.Generator) -> DHParameters:
    """The nominal UR5e with hidden errors (module docstring)."""
    d = math.radians(0.1)
    return UR5E.with_errors(
        delta_theta=rng.normal(0, d, 6), delta_a=rng.normal(0, 3e-4, 6), delta_d=rng.normal(0, 3e-4, 6),
        delta_alpha=rng.normal(0, d, 6), delta_beta=[0.0, rng.normal(0, d), rng.normal(0, d), 0.0, 0.0, 0.0],
        name="ur5e truth",
    )


def equivalent_truth(truth: DHParameters, name: str) -> float:
    """The truth of parameter ``name`` as identification can see it: the ``d`` of the
    parallel rows 2 and 3 slides along the parallel axes into row 4's (exact to the
    nanometre for tilts of 0.1 deg), the rest as it is."""
    if name == "link4.d":
        return float(truth.d[3] + (truth.d[1] - UR5E.d[1]) + (truth.d[2] - UR5E.d[2]))
    kind_row = name.split(".")
    if kind_row[1] == "zero_offset":
        i = int(kind_row[0][5:]) - 1
        return float(truth.theta[i] - UR5E.theta[i])
    i = int(kind_row[0][4:]) - 1
    return float(getattr(truth, kind_row[1])[i])


@dataclass
class Stations:
    q: np.ndarray
    cell_T_target: np.ndarray  # measured
    cell_p_target: np.ndarray  # measured, the same stations read as a reflector
    pose_cov: np.ndarray
    point_cov: np.ndarray
    noise: np.ndarray  # (N, 6) the draws (dp, dphi)


def measure(truth: DHParameters, q: np.ndarray, rng: np.random.Generator) -> Stations:
    """Tracker measurements of the target at joints ``q`` on the truth arm."""
    Tm, C, e = TRACKER.sample_poses(rng, CELL_T_BASE @ truth.forward(q) @ FLANGE_T_TARGET)
    return Stations(q=q, cell_T_target=Tm, cell_p_target=Tm[:, :3, 3].copy(), pose_cov=C,
                    point_cov=C[:, :3, :3].copy(), noise=e)


def random_q(rng: np.random.Generator, n: int) -> np.ndarray:
    """Joint vectors over the whole range, shoulder above the table."""
    q = rng.uniform(-math.pi, math.pi, (n, 6))
    q[:, 1] = rng.uniform(-math.pi, 0.0, n)
    return q


__all__ = ["CELL_T_BASE", "FLANGE_T_TARGET", "CELL_P_TRACKER", "TRACKER", "truth_arm", "equivalent_truth",
           "measure", "random_q", "Stations", "parameter_names"]
