"""Results as people read them: the text report of a solver result (``cellcal solve``).

The HTML report is :mod:`cellcal.daemon.report.html`, the export files
:mod:`cellcal.daemon.report.exports` (a camera hand-eye chain's ROS/URDF/easy_handeye/MoveIt files
:mod:`cellcal.daemon.report.hand_eye_exports`), the one-line summaries
:mod:`cellcal.daemon.report.human`.
A result's wire form is built in ``cellcal.daemon.bodies``; its helpers are re-exported here,
where code written before that move (the ZeroMQ contract tests among it) imports them.

The text report uses mm and degrees, with the unit in every label.
"""

from __future__ import annotations

import math

import numpy as np

from cellcal.daemon.bodies import (  # noqa: F401 - re-exported (module docstring)
    FRAME_CONVENTION,
    UNCERTAINTY_CONVENTION,
    point_to_wire,
    result_to_wire,
    task_point_errors,
    transform_from_wire,
    transform_to_wire,
    transforms_of,
    warnings_to_wire,
)
from cellcal.solver import PointBaseFrameResult, ToolPointResult
from cellcal.solver.calibrate import CalibrationResult, Estimate
from cellcal.solver.se3 import quat_from_matrix, so3_log

__all__ = ["format_report", "transform_to_wire", "transform_from_wire", "point_to_wire", "result_to_wire",
           "transforms_of", "task_point_errors", "warnings_to_wire", "FRAME_CONVENTION", "UNCERTAINTY_CONVENTION"]


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
    # A point base frame or a tool point fits positions only: no rotation figure to print as 0.
    positions_only = isinstance(result, (PointBaseFrameResult, ToolPointResult))
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
        ("  residual rotation:    n/a (the measurements carry no orientation)" if positions_only else
         f"  residual rotation:    RMS {math.degrees(result.rms_rotation_rad):.5f} deg, worst "
         f"{math.degrees(result.max_rotation_rad):.5f} deg"),
        f"  uncertainty (1 sigma): {result.sigma_translation_mm:.4f} mm"
        + ("" if positions_only else f", {result.sigma_rotation_deg:.5f} deg")
        + f" ({'refined' if result.refined else 'linear'}; noise {result.noise_source})",
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
        rotation = "" if positions_only else (
            f"; rotation P50 {math.degrees(h.p50_rotation_rad):.5f} / P90 {math.degrees(h.p90_rotation_rad):.5f} / max "
            f"{math.degrees(h.max_rotation_rad):.5f} deg")
        lines.append(
            f"  held-out closure ({h.method}): translation P50 {h.p50_translation_m * 1e3:.4f} / P90 "
            f"{h.p90_translation_m * 1e3:.4f} / max {h.max_translation_m * 1e3:.4f} mm{rotation}"
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
            rotation = "" if positions_only else f", {math.degrees(result.residuals.rotation_rad[i]):.5f} deg"
            lines.append(f"    {label}: {result.residuals.translation_m[i] * 1e3:.4f} mm{rotation}")
    return "\n".join(lines)
