"""Independently perturbed arms for the consider covariance (ADR 0016, amendment).

Nothing here is drawn from the prior identification assumes
(``cellcal.solver.kinematic_consider.DEFAULT_PARAMETER_PRIOR``): every DH parameter of the
UR5e (zero offsets, a, d, alpha, and the Hayati tilts of rows 2 and 3) is off by a magnitude
uniform in 0.1-0.5 mm (lengths) or 0.01-0.05 deg (angles), with a random sign, as on a real
arm; the base frame, the target, the tracker (isotropic 0.02 mm and 0.01 deg, in the cell
frame) are this module's own, not those of ``_kin_world``.

:func:`reference` is the truth as the identification's parameterisation sees it: the
noise-free fit of the true arm on a generic station set (every joint moving) with the
same estimated parameters and the considered ones held at their *true* values. Structural
parameters (folded into the base frame or the target, or redundant along parallel axes)
then land where the identification puts them, so the estimate's error against it is
exactly what its sigmas must cover: noise, and the considered parameters' errors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver import UR5E, identify_kinematics
from cellcal.solver.identify import KinematicResult
from cellcal.solver.kinematic_parameters import _apply, _value
from cellcal.solver.kinematics import DHParameters
from cellcal.solver.se3 import se3_exp, se3_inverse, se3_log

CELL_T_BASE = se3_exp(np.array([1.5, -0.3, 0.2, 0.0, 0.0, -0.7]))
FLANGE_T_TARGET = se3_exp(np.array([0.02, -0.01, 0.06, 0.0, 0.1, 0.0]))
NOISE_M = 20e-6
NOISE_RAD = math.radians(0.01)
STILL_AT_RAD = 0.6


def independent_arm(rng: np.random.Generator) -> DHParameters:
    """UR5e with every parameter off by 0.1-0.5 mm or 0.01-0.05 deg, random sign."""
    def errors(lo: float, hi: float) -> np.ndarray:
        return rng.uniform(lo, hi, 6) * rng.choice([-1.0, 1.0], 6)

    lengths = (0.1e-3, 0.5e-3)
    angles = (math.radians(0.01), math.radians(0.05))
    beta = errors(*angles)
    beta[[0, 3, 4, 5]] = 0.0  # Hayati tilts only between the parallel axes (rows 2 and 3)
    return UR5E.with_errors(delta_theta=errors(*angles), delta_a=errors(*lengths), delta_d=errors(*lengths),
                            delta_alpha=errors(*angles), delta_beta=beta, name="independent truth")


def joints(rng: np.random.Generator, n: int, joint: int | None = None, range_rad: float = 0.0) -> np.ndarray:
    """``n`` joint vectors over the whole range (shoulder above the table); ``joint``
    (0-based) still at :data:`STILL_AT_RAD`, or moving within ``+-range_rad`` of it."""
    q = rng.uniform(-math.pi, math.pi, (n, 6))
    q[:, 1] = rng.uniform(-math.pi, 0.0, n)
    if joint is not None:
        q[:, joint] = STILL_AT_RAD + (rng.uniform(-range_rad, range_rad, n) if range_rad else 0.0)
    return q


def measure(rng: np.random.Generator, arm: DHParameters, q: np.ndarray) -> np.ndarray:
    """Tracker poses of the target: isotropic noise in the cell frame."""
    T = CELL_T_BASE @ arm.forward(q) @ FLANGE_T_TARGET
    out = T.copy()
    for k in range(len(q)):
        dphi = rng.normal(0.0, NOISE_RAD, 3)
        out[k, :3, :3] = se3_exp(np.r_[0.0, 0.0, 0.0, dphi])[:3, :3] @ T[k, :3, :3]
        out[k, :3, 3] += rng.normal(0.0, NOISE_M, 3)
    return out


def true_positions(arm: DHParameters, q: np.ndarray) -> np.ndarray:
    return (CELL_T_BASE @ arm.forward(q) @ FLANGE_T_TARGET)[:, :3, 3]


def prior_arm(rng: np.random.Generator) -> DHParameters:
    """UR5e with errors drawn from the default prior itself (Gaussian, 0.5 mm and 0.1 deg):
    the arithmetic's check, where a calibrated covariance must give NEES means at the dof."""
    from cellcal.solver.identify import DEFAULT_PARAMETER_PRIOR as P

    beta = rng.normal(0.0, P["beta"], 6)
    beta[[0, 3, 4, 5]] = 0.0
    return UR5E.with_errors(delta_theta=rng.normal(0.0, P["zero_offset"], 6), delta_a=rng.normal(0.0, P["a"], 6),
                            delta_d=rng.normal(0.0, P["d"], 6), delta_alpha=rng.normal(0.0, P["alpha"], 6),
                            delta_beta=beta, name="prior truth")


#: How exactly :func:`reference` must fit the true arm, m RMS.
REFERENCE_TOL_M = 1e-6


def reference(arm: DHParameters, res: KinematicResult) -> KinematicResult:
    """The truth as ``res``'s parameterisation sees it (module docstring)."""
    names = list(res.considered)
    true_c = np.array([_value(arm, UR5E, p) - _value(UR5E, UR5E, p) for p in names])
    nominal = _apply(UR5E, names, true_c, "reference")
    qg = np.random.default_rng(999).uniform(-math.pi, math.pi, (80, 6))
    T = CELL_T_BASE @ arm.forward(qg) @ FLANGE_T_TARGET
    kw = (dict(cell_T_target=T, noise_translation_m=1e-5, noise_rotation_rad=1e-5) if res.measurement == "pose"
          else dict(cell_p_target=T[:, :3, 3], noise_translation_m=1e-5))
    ref = identify_kinematics(qg, nominal, parameters=list(res.estimated), max_condition=1e9, **kw)
    # Exact to second order: the d of parallel axes slide into each other exactly only while
    # the axes are parallel; the arm's 0.05 deg tilts leave ~0.3 um, 1 % of the noise (the
    # prior's 0.1 deg arms up to ~3 um: main() of the trials relaxes the bound for them).
    assert ref.rms_translation_m < REFERENCE_TOL_M, ref.rms_translation_m
    return ref


@dataclass
class Scores:
    """z-scores of the estimated parameters against :func:`reference`, with the reported
    sigmas and with the noise-only ones; NEES of the base frame (6 dof)."""

    z: np.ndarray
    z_noise: np.ndarray
    base_nees: float
    base_nees_noise: float


def _base_nees(ref: KinematicResult, cell_T_base: np.ndarray, C: np.ndarray) -> float:
    d = se3_log(se3_inverse(ref.cell_T_base) @ cell_T_base)
    return float(d @ np.linalg.solve(C, d))


def scores(arm: DHParameters, res: KinematicResult) -> Scores:
    ref = reference(arm, res)
    z = np.array([(res.parameters[p] - ref.parameters[p]) / res.sigmas[p] for p in res.estimated])
    zn = np.array([(res.parameters[p] - ref.parameters[p]) / res.noise_sigmas[p] for p in res.estimated])
    P = len(res.estimated)
    # The base frame's noise-only covariance: the full one minus the consider term, which
    # is the same fit with every prior 0.
    old = res.covariance[P:P + 6, P:P + 6]
    if res.considered:
        S_rows = slice(P, P + 6)
        cross = res.full_covariance[S_rows, len(res.covariance_names):]
        Pc = res.full_covariance[len(res.covariance_names):, len(res.covariance_names):]
        old = old - cross @ np.linalg.solve(Pc, cross.T)
    return Scores(z=z, z_noise=zn, base_nees=_base_nees(ref, res.cell_T_base, res.covariance[P:P + 6, P:P + 6]),
                  base_nees_noise=_base_nees(ref, res.cell_T_base, old))


def identify(q: np.ndarray, M: np.ndarray, *, point: bool = False, declared: bool = True,
             **kw: object) -> KinematicResult:
    noise = {"noise_translation_m": NOISE_M} if declared else {}
    if point:
        return identify_kinematics(q, UR5E, cell_p_target=M[:, :3, 3], **noise, **kw)  # type: ignore[arg-type]
    if declared:
        noise["noise_rotation_rad"] = NOISE_RAD
    return identify_kinematics(q, UR5E, cell_T_target=M, **noise, **kw)  # type: ignore[arg-type]
