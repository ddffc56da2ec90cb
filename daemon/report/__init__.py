"""Results as people and clients read them: the wire form of a result, and the text report.

Both are written once for every result type: they walk ``result.transforms()`` (name ->
:class:`cellcal.solver.Estimate`), so a base frame, hand-eye, eye-to-hand, point base frame
and tool point result all publish every transform and point they estimated, each with its
covariance. ``docs/protocols/zeromq.md`` (the result body and "Frames and units") is the
contract; ``cellcal.daemon.protocol.ResultBody`` its checked form.

The wire form of a transform named ``a_T_b``::

    {"parent_frame": "a", "child_frame": "b", "matrix": [16 floats, row-major],
     "translation_m": [x, y, z], "quaternion": {"w": .., "x": .., "y": .., "z": ..}}

with SI units and ``w >= 0``; of a point named ``a_p_x``::

    {"frame": "a", "position_m": [x, y, z]}

Covariances go under ``uncertainty.covariance`` by the same names (6x6 twist ``(rho, phi)``
in m and rad for a transform, 3x3 in m^2 for a point, row-major), and the joint one under
``uncertainty.joint`` with the order of its blocks. Numbers that are not finite (a figure
the solve did not compute, an undetermined held-out closure) are ``None`` on the wire.

What acceptance gates read is at the top level too: ``converged``, ``stop_reason``,
``iterations``, ``dof``, ``downweighted`` (station indices), ``warnings`` (a list of
``{"code", "message", "value"}``, e.g. code ``"model_error"`` with ``value`` the RMS of the
structured residual in mm) and ``residual_tests`` (chi-square against declared noise, the
structure test, redundancies, the small-sample and model-error factors in the covariance).
``result_to_wire(result, task_points=...)`` adds ``task_points``: the predicted error of
each cell-frame task point (:func:`task_point_errors`).

The human report uses mm and degrees, with the unit in every label.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cellcal.solver.calibrate import CalibrationResult, Estimate
from cellcal.solver.se3 import quat_from_matrix, so3_log

__all__ = [
    "transform_to_wire",
    "transform_from_wire",
    "point_to_wire",
    "result_to_wire",
    "format_report",
    "transforms_of",
    "task_point_errors",
    "warnings_to_wire",
    "FRAME_CONVENTION",
    "UNCERTAINTY_CONVENTION",
]

#: The ``frame_convention`` every result carries (ADR 0001).
FRAME_CONVENTION = "a_T_b maps coordinates in frame b to frame a; SI units; quaternion w,x,y,z with w >= 0"
#: The ``uncertainty.convention`` every result carries (ADR 0004).
UNCERTAINTY_CONVENTION = (
    "right perturbation T exp(xi), xi = (rho [m], phi [rad]); 6x6 row-major per transform, "
    "3x3 [m^2] in the point's frame per point; joint: blocks in the order given"
)


def transform_to_wire(name: str, T: np.ndarray) -> dict[str, Any]:
    """Wire form of the transform called ``name`` (``"parent_T_child"``)."""
    parent, sep, child = name.partition("_T_")
    if not sep or not parent or not child:
        raise ValueError(f"transform name must look like parent_T_child, got {name!r}")
    T = np.asarray(T, dtype=float)
    q = quat_from_matrix(T[:3, :3])
    return {
        "parent_frame": parent,
        "child_frame": child,
        "matrix": [float(v) for v in T.reshape(16)],
        "translation_m": [float(v) for v in T[:3, 3]],
        "quaternion": {"w": float(q[0]), "x": float(q[1]), "y": float(q[2]), "z": float(q[3])},
    }


def transform_from_wire(obj: dict[str, Any]) -> np.ndarray:
    """4x4 transform from its wire form (the ``matrix`` field is authoritative)."""
    m = np.array(obj["matrix"], dtype=float)
    if m.shape != (16,):
        raise ValueError(f"matrix must have 16 numbers, got {m.shape}")
    return m.reshape(4, 4)


def point_to_wire(frame: str, p: np.ndarray) -> dict[str, Any]:
    """Wire form of a point given in ``frame``: ``{"frame", "position_m"}``."""
    return {"frame": frame, "position_m": [float(v) for v in np.asarray(p, dtype=float).reshape(3)]}


def transforms_of(result: CalibrationResult) -> dict[str, np.ndarray]:
    """The named transforms and points a result carries: name -> (4, 4) or (3,) value.

    The values of ``result.transforms()``, for callers that need no covariance.
    """
    return {name: e.value for name, e in result.transforms().items()}


def _f(v: Any) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _matrix_to_wire(C: np.ndarray) -> dict[str, Any]:
    C = np.asarray(C, dtype=float)
    return {"shape": list(C.shape), "values": [_f(v) for v in C.reshape(-1)]}


def warnings_to_wire(result: CalibrationResult) -> list[dict[str, Any]]:
    """``[{"code", "message", "value"}]`` of a result's warnings (``value`` None if absent)."""
    return [{"code": w.code, "message": w.message, "value": None if w.value is None else _f(w.value)}
            for w in getattr(result, "warnings", ())]


def task_point_errors(result: CalibrationResult, task_points: Any) -> list[dict[str, Any]]:
    """Predicted error of each task point through the result (``predicted_error_at``).

    Parameters
    ----------
    result : CalibrationResult
        Any result; a tool point has one figure, its tip, whatever points are asked.
    task_points : array_like, shape (K, 3)
        Points in the frame the result's ``predicted_error_at`` takes (the cell for a base
        frame, the camera for hand-eye), metres.

    Returns
    -------
    list of dict
        ``{"point_m", "sigma_m", "sigma_max_m", "frame", "lever_arm_m"}`` per point.
    """
    pts = np.asarray(task_points, dtype=float).reshape(-1, 3)
    out = []
    for p in pts:
        try:
            pe = result.predicted_error_at(p)  # type: ignore[attr-defined]
        except TypeError:  # the tool point: its tip only
            pe = result.predicted_error_at()  # type: ignore[attr-defined]
        out.append({"point_m": [float(v) for v in p], "sigma_m": _f(pe.sigma_m), "sigma_max_m": _f(pe.sigma_max_m),
                    "frame": pe.frame, "lever_arm_m": _f(pe.lever_arm_m)})
    return out


def _tests_to_wire(result: CalibrationResult) -> dict[str, Any] | None:
    t = getattr(result, "residual_tests", None)
    if t is None:
        return None
    return {
        "declared_noise": bool(t.declared_noise), "chi2_per_dof": _f(t.chi2_per_dof), "chi2_p": _f(t.chi2_p),
        "structure_f": _f(t.structure_f), "structure_p": _f(t.structure_p),
        "structure_dof": [int(v) for v in t.structure_dof],
        "redundancy_translation": _f(t.redundancy_translation), "redundancy_rotation": _f(t.redundancy_rotation),
        "variance_factor_translation": _f(t.variance_factor_translation),
        "variance_factor_rotation": _f(t.variance_factor_rotation),
        "small_sample_factor": _f(t.small_sample_factor),
        "model_error_translation_m": _f(t.model_error_translation_m),
        "model_error_rotation_rad": _f(t.model_error_rotation_rad),
        "inflation_translation": _f(t.inflation_translation), "inflation_rotation": _f(t.inflation_rotation),
        "false_alarm_rate": _f(t.false_alarm_rate),
    }


def result_to_wire(result: CalibrationResult, *, task_points: Any = None) -> dict[str, Any]:
    """JSON-ready dict of a calibration result of any type.

    Fields: ``transforms`` (name -> transform) and ``points`` (name -> point), both always
    present and together every estimate of ``result.transforms()``; the closure figures,
    ``weakest_axis``, per-station ``residuals``, ``solver``, ``frame_convention``;
    ``uncertainty`` (per-estimate and joint covariance, noise, chi2); ``holdout`` and
    ``linear_agreement`` (``None`` when the result has none); ``converged``, ``stop_reason``,
    ``iterations``, ``dof``, ``downweighted``, ``warnings``, ``residual_tests``; with
    ``task_points`` (K, 3) also ``task_points`` (:func:`task_point_errors`).
    ``docs/protocols/zeromq.md`` documents every field.
    """
    estimates = result.transforms()
    out: dict[str, Any] = {
        "transforms": {k: transform_to_wire(k, e.value) for k, e in estimates.items() if not e.is_point},
        "points": {k: point_to_wire(e.frame, e.value) for k, e in estimates.items() if e.is_point},
        "n_stations": result.n_stations,
        "n_motions": result.n_motions,
        "rms_translation_m": result.rms_translation_m,
        "max_translation_m": result.max_translation_m,
        "rms_rotation_rad": result.rms_rotation_rad,
        "max_rotation_rad": result.max_rotation_rad,
        "axis_spread": result.axis_spread,
        "weakest_axis": {"frame": result.axis_frame, "unit": [float(v) for v in result.weakest_axis]},
        "max_motion_rad": result.max_motion_rad,
        "residuals": {
            "translation_m": [float(v) for v in result.residuals.translation_m],
            "rotation_rad": [float(v) for v in result.residuals.rotation_rad],
        },
        "solver": result.solver,
        "frame_convention": FRAME_CONVENTION,
        "uncertainty": _uncertainty_to_wire(result, estimates),
        "holdout": None,
        "linear_agreement": None,
        "converged": bool(getattr(result, "converged", True)),
        "stop_reason": str(getattr(result, "stop_reason", "")),
        "iterations": int(result.iterations),
        "dof": int(result.dof),
        "downweighted": [int(i) for i in np.asarray(result.downweighted, dtype=int).reshape(-1)],
        "warnings": warnings_to_wire(result),
        "residual_tests": _tests_to_wire(result),
    }
    if task_points is not None:
        out["task_points"] = task_point_errors(result, task_points)
    h = result.holdout
    if h is not None:
        out["holdout"] = {
            "method": h.method, "folds": int(h.folds),
            "p50_translation_m": _f(h.p50_translation_m), "p90_translation_m": _f(h.p90_translation_m),
            "max_translation_m": _f(h.max_translation_m), "p50_rotation_rad": _f(h.p50_rotation_rad),
            "p90_rotation_rad": _f(h.p90_rotation_rad), "max_rotation_rad": _f(h.max_rotation_rad),
            "inflation": _f(h.inflation),
            "translation_m": [_f(v) for v in h.translation_m], "rotation_rad": [_f(v) for v in h.rotation_rad],
        }
    a = result.linear_agreement
    if a is not None:
        out["linear_agreement"] = {
            "translation_m": _f(a.translation_m), "rotation_rad": _f(a.rotation_rad), "sigmas": _f(a.sigmas),
        }
    return out


def _uncertainty_to_wire(result: CalibrationResult, estimates: dict[str, Estimate]) -> dict[str, Any]:
    """Covariances (per estimate and joint), the primary's 1-sigma, the noise the fit used."""
    return {
        "convention": UNCERTAINTY_CONVENTION,
        "covariance": {name: _matrix_to_wire(e.covariance) for name, e in estimates.items()},
        "joint": {"order": list(estimates), **_matrix_to_wire(result.covariance)},
        "sigma_translation_m": _f(result.sigma_translation_mm * 1e-3),
        "sigma_rotation_rad": _f(math.radians(result.sigma_rotation_deg)),
        "noise_translation_m": _f(result.noise_translation_m),
        "noise_rotation_rad": _f(result.noise_rotation_rad),
        "noise_source": result.noise_source,
        "chi2": _f(result.chi2),
        "dof": int(result.dof),
        "refined": bool(result.refined),
        "iterations": int(result.iterations),
        "downweighted_stations": [int(i) for i in np.asarray(result.downweighted, dtype=int).reshape(-1)],
    }


def _sigma_text(e: Estimate) -> str:
    """1-sigma (root of the covariance trace) of an estimate, mm and deg."""
    C = np.asarray(e.covariance, dtype=float)
    t = float(np.trace(C[:3, :3]))
    if not math.isfinite(t):
        return "not computed"
    text = f"{1e3 * math.sqrt(max(t, 0.0)):.4f} mm"
    if not e.is_point:
        r = float(np.trace(C[3:, 3:]))
        text += f", {math.degrees(math.sqrt(max(r, 0.0))):.5f} deg"
    return text


def _estimate_lines(e: Estimate) -> str:
    if e.is_point:
        p = np.asarray(e.value, dtype=float) * 1e3
        return (f"  {e.name}_mm  [{p[0]:10.3f} {p[1]:10.3f} {p[2]:10.3f}]\n"
                f"    sigma           {_sigma_text(e)}")
    T = np.asarray(e.value, dtype=float)
    t = T[:3, 3] * 1e3
    rv = np.degrees(so3_log(T[:3, :3]))
    q = quat_from_matrix(T[:3, :3])
    return (
        f"  {e.name}:\n"
        f"    translation_mm  [{t[0]:10.3f} {t[1]:10.3f} {t[2]:10.3f}]\n"
        f"    rotvec_deg      [{rv[0]:10.4f} {rv[1]:10.4f} {rv[2]:10.4f}]   "
        f"(angle {math.degrees(np.linalg.norm(so3_log(T[:3, :3]))):.4f} deg)\n"
        f"    quat_wxyz       [{q[0]:.8f} {q[1]:.8f} {q[2]:.8f} {q[3]:.8f}]\n"
        f"    sigma           {_sigma_text(e)}"
    )


def format_report(result: CalibrationResult, *, station_names: list[str] | None = None, worst: int = 3) -> str:
    """Human-readable report: every transform and point in mm/deg with its 1-sigma, the
    axis spread, RMS and worst residuals, uncertainty, held-out closure."""
    lines = [f"cellcal {type(result).__name__.removesuffix('Result')} calibration ({result.solver})"]
    lines += [_estimate_lines(e) for e in result.transforms().values()]
    a = result.weakest_axis
    lines += [
        f"  stations {result.n_stations}, motions {result.n_motions}, largest motion "
        f"{math.degrees(result.max_motion_rad):.1f} deg",
        f"  axis_spread {result.axis_spread:.4f} (0 = parallel axes, 1 = isotropic); weakest axis "
        f"[{a[0]:.3f} {a[1]:.3f} {a[2]:.3f}] in {result.axis_frame}",
        f"  residual translation: RMS {result.rms_translation_m * 1e3:.4f} mm, worst "
        f"{result.max_translation_m * 1e3:.4f} mm",
        f"  residual rotation:    RMS {math.degrees(result.rms_rotation_rad):.5f} deg, worst "
        f"{math.degrees(result.max_rotation_rad):.5f} deg",
        f"  uncertainty (1 sigma): {result.sigma_translation_mm:.4f} mm, {result.sigma_rotation_deg:.5f} deg"
        f" ({'refined' if result.refined else 'linear'}; noise {result.noise_source})",
    ]
    lines.append(f"  solve: {'converged' if result.converged else 'DID NOT CONVERGE'} ({result.stop_reason}; "
                 f"{result.iterations} iterations, {result.dof} degrees of freedom)")
    t = result.residual_tests
    parts = [f"chi2/dof {t.chi2_per_dof:.2f}" + (f" (p {t.chi2_p:.2g} against the declared noise)"
                                                 if math.isfinite(t.chi2_p) else "")]
    if math.isfinite(t.structure_p):
        parts.append(f"structure F {t.structure_f:.2f} (p {t.structure_p:.2g})")
    if t.small_sample_factor > 1.0:
        parts.append(f"small-sample factor {t.small_sample_factor:.2f}")
    if t.inflation_translation > 1.0 or t.inflation_rotation > 1.0:
        parts.append(f"sigma widened x{t.inflation_translation:.1f} (translation), "
                     f"x{t.inflation_rotation:.1f} (rotation) for model error")
    lines.append("  residual tests: " + "; ".join(parts))
    h = result.holdout
    if h is not None:
        lines.append(
            f"  held-out closure ({h.method}): translation P50 {h.p50_translation_m * 1e3:.4f} / P90 "
            f"{h.p90_translation_m * 1e3:.4f} / max {h.max_translation_m * 1e3:.4f} mm; rotation P50 "
            f"{math.degrees(h.p50_rotation_rad):.5f} / P90 {math.degrees(h.p90_rotation_rad):.5f} / max "
            f"{math.degrees(h.max_rotation_rad):.5f} deg"
        )
    la = result.linear_agreement
    if la is not None:
        lines.append(
            f"  linear vs refined: {la.translation_m * 1e3:.4f} mm, {math.degrees(la.rotation_rad):.5f} deg"
            f" ({la.sigmas:.1f} sigma)"
        )
    if result.warnings:
        lines.append("  WARNINGS:")
        for w in result.warnings:
            lines.append(f"    [{w.code}] {w.message}")
    if worst > 0:
        lines.append("  worst-fitting stations:")
        for i in result.residuals.worst(worst):
            label = station_names[i] if station_names else f"station {i}"
            lines.append(
                f"    {label}: {result.residuals.translation_m[i] * 1e3:.4f} mm, "
                f"{math.degrees(result.residuals.rotation_rad[i]):.5f} deg"
            )
    return "\n".join(lines)
