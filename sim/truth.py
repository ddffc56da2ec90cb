"""How a result stands against a simulated cell's hidden truth: error, NEES, 3-sigma verdict.

A simulated cell knows the answer (``world.cell_T_base()``), so ``cellcal demo`` (and the
benchmarks) can say not only how far the result is from the truth but whether the result's
own reported uncertainty covers that error -- the honest-uncertainty promise (ADR 0004).

* ``xi = log(X^-1 X_true)`` in the result's convention (right perturbation, ``(rho [m],
  phi [rad])``, ``report.UNCERTAINTY_CONVENTION``);
* ``NEES = xi^T C^-1 xi`` with ``C`` the reported 6x6 covariance of ``cell_T_base``: for an
  honest covariance it is chi-square with 6 degrees of freedom, so the 3-sigma bound (the
  99.73 % quantile, the coverage of +-3 sigma in one dimension) is
  :data:`NEES_BOUND_3SIGMA_6DOF` = 20.06; ``within_3_sigma`` says whether NEES is below it;
* ``residual_vs_noise``: the fit's RMS translation closure over the tracker's own noise
  floor (the 3-D RMS of the stations' reported standard deviations): about 1 when the
  residuals are the tracker's noise, far above it when the robot's kinematics leave
  structured residuals the base frame cannot absorb.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cellcal.solver.diagnostics import NEES_BOUND_3SIGMA
from cellcal.solver.se3 import rotation_angle, se3_inverse, se3_log

__all__ = ["NEES_BOUND_3SIGMA_6DOF", "truth_error", "residual_vs_noise"]

#: chi-square quantile for 6 degrees of freedom at 0.9973 (the +-3 sigma coverage of a
#: normal variable): a NEES above it means the error is outside the reported 3 sigma.
NEES_BOUND_3SIGMA_6DOF = NEES_BOUND_3SIGMA[6]


def _covariance(result: Mapping[str, Any], name: str) -> np.ndarray | None:
    try:
        c = result["uncertainty"]["covariance"][name]
        values = [math.nan if v is None else float(v) for v in c["values"]]
        C = np.asarray(values, dtype=float).reshape(c["shape"])
    except (KeyError, TypeError, ValueError):
        return None
    return C if C.shape == (6, 6) and np.all(np.isfinite(C)) else None


def truth_error(result: Mapping[str, Any], X: np.ndarray, truth: np.ndarray, name: str = "cell_T_base") -> dict[str, Any]:
    """The error of the estimate ``X`` (4, 4) against ``truth`` (4, 4), and whether the
    result's reported covariance of ``name`` covers it.

    Returns
    -------
    dict
        ``translation_m``, ``rotation_rad`` (the plain error), ``xi`` (6, the twist above),
        ``sigma_translation_m`` / ``sigma_rotation_rad`` (the reported 1-sigma along the
        error's own direction), ``component_sigmas`` (6, ``|xi_k| / sigma_k``), ``nees``,
        ``nees_3sigma_bound``, ``within_3_sigma`` (None without a usable covariance).
    """
    out: dict[str, Any] = {
        "translation_m": float(np.linalg.norm(X[:3, 3] - truth[:3, 3])),
        "rotation_rad": float(rotation_angle(truth[:3, :3].T @ X[:3, :3])),
        "nees": None, "nees_3sigma_bound": NEES_BOUND_3SIGMA_6DOF, "within_3_sigma": None,
        "sigma_translation_m": None, "sigma_rotation_rad": None, "component_sigmas": None,
    }
    xi = se3_log(se3_inverse(X) @ truth)
    out["xi"] = [float(v) for v in xi]
    C = _covariance(result, name)
    if C is None:
        return out
    try:
        nees = float(xi @ np.linalg.solve(C, xi))
    except np.linalg.LinAlgError:
        return out
    sig = np.sqrt(np.clip(np.diag(C), 0.0, None))
    out["component_sigmas"] = [float(abs(x) / s) if s > 0 else None for x, s in zip(xi, sig, strict=True)]
    for key, part in (("sigma_translation_m", slice(0, 3)), ("sigma_rotation_rad", slice(3, 6))):
        v = xi[part]
        n = float(np.linalg.norm(v))
        if n > 0:
            u = v / n
            out[key] = float(math.sqrt(max(float(u @ C[part, part] @ u), 0.0)))
    out["nees"] = nees
    out["within_3_sigma"] = bool(nees <= NEES_BOUND_3SIGMA_6DOF)
    return out


def residual_vs_noise(result: Mapping[str, Any], station_std_m: Sequence[float]) -> dict[str, Any]:
    """The residual RMS over the tracker's noise floor.

    Parameters
    ----------
    result : dict
        The wire result (``rms_translation_m``).
    station_std_m : sequence of float
        Each station's reported per-axis translation std (m); the floor is their 3-D RMS
        (``sqrt(3)`` times the per-axis RMS).
    """
    rms = float(result.get("rms_translation_m") or 0.0)
    s = np.asarray([float(v) for v in station_std_m if v is not None and math.isfinite(float(v))], dtype=float)
    floor = float(math.sqrt(3.0) * math.sqrt(float(np.mean(s * s)))) if s.size else None
    return {"rms_translation_m": rms, "tracker_noise_m": floor,
            "ratio": (rms / floor) if floor else None}
