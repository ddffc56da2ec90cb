"""Uncertainty figures from a covariance: 1-sigma in mm/deg, and error at a task point.

Convention (ADR 0004): a transform estimate ``T_hat = T @ se3_exp(xi)`` with ``xi`` a twist
``(rho, phi)`` (m, rad) in T's *child* frame (right perturbation), ``xi ~ N(0, Sigma)``.

Lever arm: a point ``p`` given in T's child frame maps to
``T_hat p = T p + R (rho - [p]x phi)`` to first order, so its error in T's parent frame has
covariance ``R [I, -[p]x] Sigma [I, -[p]x]^T R^T``: the rotation error is multiplied by the
distance of the point from the child origin.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from cellcal.solver.se3 import hat, se3_adjoint

__all__ = ["PredictedError", "point_error", "sigma_figures", "inverse_covariance_map"]


class PredictedError(NamedTuple):
    """First-order error of a point mapped through a calibrated transform.

    Attributes
    ----------
    sigma_m : float
        RMS length of the 3-D position error (square root of the covariance trace), m.
    sigma_max_m : float
        1-sigma along the worst direction (square root of the largest eigenvalue), m.
    covariance_m2 : numpy.ndarray, shape (3, 3)
        Position error covariance, m^2, in ``frame``.
    frame : str
        Frame the covariance is expressed in.
    lever_arm_m : float
        Distance of the point from the origin of the calibrated transform's child frame:
        what multiplies its rotation error.
    """

    sigma_m: float
    sigma_max_m: float
    covariance_m2: np.ndarray
    frame: str
    lever_arm_m: float


def point_error(T: np.ndarray, cov6: np.ndarray, child_p: np.ndarray, frame: str) -> PredictedError:
    """Error of ``T @ child_p`` given ``cov6`` of ``T`` (right perturbation, (rho, phi)).

    The covariance is expressed in T's parent frame; ``frame`` names it.
    """
    p = np.asarray(child_p, dtype=float).reshape(3)
    if not np.all(np.isfinite(p)):
        raise ValueError(f"task point must be 3 finite numbers, got {child_p!r}")
    Jp = np.hstack([np.eye(3), -hat(p)])
    R = np.asarray(T, float)[:3, :3]
    C = R @ Jp @ np.asarray(cov6, float) @ Jp.T @ R.T
    C = 0.5 * (C + C.T)
    return _packed(C, frame, float(np.linalg.norm(p)))


def covariance_point_error(C: np.ndarray, frame: str, lever_arm_m: float = 0.0) -> PredictedError:
    """A :class:`PredictedError` from a 3x3 position covariance (e.g. a tool tip)."""
    C = np.asarray(C, float)
    return _packed(0.5 * (C + C.T), frame, lever_arm_m)


def _packed(C: np.ndarray, frame: str, lever: float) -> PredictedError:
    if not np.all(np.isfinite(C)):
        return PredictedError(math.inf, math.inf, C, frame, lever)
    tr = float(np.trace(C))
    lmax = float(np.linalg.eigvalsh(C)[-1])
    return PredictedError(math.sqrt(max(tr, 0.0)), math.sqrt(max(lmax, 0.0)), C, frame, lever)


def sigma_figures(cov6: np.ndarray) -> tuple[float, float]:
    """``(sigma_translation_mm, sigma_rotation_deg)`` of a 6x6 twist covariance: the RMS
    lengths (root of the trace) of the translation and rotation error vectors."""
    c = np.asarray(cov6, float)
    tt = float(c[0, 0] + c[1, 1] + c[2, 2])
    rr = float(c[3, 3] + c[4, 4] + c[5, 5])
    st = 1e3 * math.sqrt(tt) if math.isfinite(tt) and tt >= 0 else math.inf
    sr = math.degrees(math.sqrt(rr)) if math.isfinite(rr) and rr >= 0 else math.inf
    return st, sr


def inverse_covariance_map(T: np.ndarray) -> np.ndarray:
    """6x6 map from a right perturbation of ``T`` to the right perturbation of ``T^-1``.

    ``(T exp(xi))^-1 = exp(-xi) T^-1 = T^-1 exp(-Ad_T xi)``, so ``xi' = -Ad_T xi`` and
    ``Sigma' = Ad_T Sigma Ad_T^T``.
    """
    return -se3_adjoint(T)
