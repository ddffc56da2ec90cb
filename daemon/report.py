"""Results as people and clients read them: the wire form of transforms, and the report.

The wire form (DESIGN.md section 5) of a transform named ``a_T_b``::

    {"parent_frame": "a", "child_frame": "b", "matrix": [16 floats, row-major],
     "translation_m": [x, y, z], "quaternion": {"w": .., "x": .., "y": .., "z": ..}}

with SI units and ``w >= 0``. The human report uses mm and degrees, with the unit in every
label.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cellcal.solver.calibrate import BaseFrameResult, CalibrationResult, HandEyeResult, ToolPointResult
from cellcal.solver.se3 import quat_from_matrix, so3_log

__all__ = ["transform_to_wire", "transform_from_wire", "result_to_wire", "format_report", "transforms_of"]


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


def transforms_of(result: CalibrationResult) -> dict[str, np.ndarray]:
    """The named transforms (or points) a result carries."""
    if isinstance(result, BaseFrameResult):
        return {"cell_T_base": result.cell_T_base, "flange_T_target": result.flange_T_target}
    if isinstance(result, HandEyeResult):
        return {"flange_T_camera": result.flange_T_camera, "base_T_target": result.base_T_target}
    return {}


def result_to_wire(result: CalibrationResult) -> dict[str, Any]:
    """JSON-ready dict of a calibration result: transforms, figures, per-station residuals."""
    out: dict[str, Any] = {"transforms": {k: transform_to_wire(k, T) for k, T in transforms_of(result).items()}}
    if isinstance(result, ToolPointResult):
        out["points"] = {
            "flange_p_tip": {"frame": "flange", "position_m": [float(v) for v in result.flange_p_tip]},
            "base_p_pivot": {"frame": "base", "position_m": [float(v) for v in result.base_p_pivot]},
        }
    out.update(
        n_stations=result.n_stations,
        n_motions=result.n_motions,
        rms_translation_m=result.rms_translation_m,
        max_translation_m=result.max_translation_m,
        rms_rotation_rad=result.rms_rotation_rad,
        max_rotation_rad=result.max_rotation_rad,
        axis_spread=result.axis_spread,
        weakest_axis={"frame": result.axis_frame, "unit": [float(v) for v in result.weakest_axis]},
        max_motion_rad=result.max_motion_rad,
        residuals={
            "translation_m": [float(v) for v in result.residuals.translation_m],
            "rotation_rad": [float(v) for v in result.residuals.rotation_rad],
        },
        solver=result.solver,
        frame_convention="a_T_b maps coordinates in frame b to frame a; SI units; quaternion w,x,y,z with w >= 0",
    )
    out.update(_uncertainty_to_wire(result))
    return out


def _f(v: Any) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _uncertainty_to_wire(result: CalibrationResult) -> dict[str, Any]:
    """Covariance, held-out closure and linear/refined agreement, where the result has them."""
    out: dict[str, Any] = {}
    covs = {}
    for name in list(transforms_of(result)) + ["flange_p_tip"]:
        C = getattr(result, f"{name}_covariance", None)
        if C is not None:
            covs[name] = {"shape": list(np.shape(C)), "values": [float(v) for v in np.asarray(C).reshape(-1)]}
    if covs or getattr(result, "sigma_translation_mm", None) is not None:
        out["uncertainty"] = {
            "convention": "right perturbation T exp(xi), xi = (rho [m], phi [rad]); 6x6 row-major per transform",
            "covariance": covs,
            "sigma_translation_m": _f(result.sigma_translation_mm * 1e-3) if getattr(result, "sigma_translation_mm", None) is not None else None,
            "sigma_rotation_rad": _f(math.radians(result.sigma_rotation_deg)) if getattr(result, "sigma_rotation_deg", None) is not None else None,
            "noise_translation_m": _f(getattr(result, "noise_translation_m", float("nan"))),
            "noise_rotation_rad": _f(getattr(result, "noise_rotation_rad", float("nan"))),
            "noise_source": getattr(result, "noise_source", ""),
            "chi2": _f(getattr(result, "chi2", float("nan"))),
            "dof": int(getattr(result, "dof", 0) or 0),
            "refined": bool(getattr(result, "refined", False)),
            "downweighted_stations": [int(i) for i in np.asarray(getattr(result, "downweighted", []), dtype=int).reshape(-1)],
        }
    h = getattr(result, "holdout", None)
    if h is not None:
        out["holdout"] = {
            "method": h.method, "folds": int(h.folds),
            "p50_translation_m": _f(h.p50_translation_m), "p90_translation_m": _f(h.p90_translation_m),
            "max_translation_m": _f(h.max_translation_m), "p50_rotation_rad": _f(h.p50_rotation_rad),
            "p90_rotation_rad": _f(h.p90_rotation_rad), "max_rotation_rad": _f(h.max_rotation_rad),
            "translation_m": [_f(v) for v in h.translation_m], "rotation_rad": [_f(v) for v in h.rotation_rad],
        }
    a = getattr(result, "linear_agreement", None)
    if a is not None:
        out["linear_agreement"] = {"translation_m": _f(a.translation_m), "rotation_rad": _f(a.rotation_rad), "sigmas": _f(a.sigmas)}
    return out


def _pose_line(name: str, T: np.ndarray) -> str:
    t = T[:3, 3] * 1e3
    rv = np.degrees(so3_log(T[:3, :3]))
    q = quat_from_matrix(T[:3, :3])
    return (
        f"  {name}:\n"
        f"    translation_mm  [{t[0]:10.3f} {t[1]:10.3f} {t[2]:10.3f}]\n"
        f"    rotvec_deg      [{rv[0]:10.4f} {rv[1]:10.4f} {rv[2]:10.4f}]   "
        f"(angle {math.degrees(np.linalg.norm(so3_log(T[:3, :3]))):.4f} deg)\n"
        f"    quat_wxyz       [{q[0]:.8f} {q[1]:.8f} {q[2]:.8f} {q[3]:.8f}]"
    )


def format_report(result: CalibrationResult, *, station_names: list[str] | None = None, worst: int = 3) -> str:
    """Human-readable report: transforms in mm/deg, spread, RMS and worst residuals."""
    lines = [f"cellcal {type(result).__name__.removesuffix('Result')} calibration ({result.solver})"]
    for name, T in transforms_of(result).items():
        lines.append(_pose_line(name, T))
    if isinstance(result, ToolPointResult):
        p, c = result.flange_p_tip * 1e3, result.base_p_pivot * 1e3
        lines.append(f"  flange_p_tip_mm  [{p[0]:10.3f} {p[1]:10.3f} {p[2]:10.3f}]")
        lines.append(f"  base_p_pivot_mm  [{c[0]:10.3f} {c[1]:10.3f} {c[2]:10.3f}]")
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
    ]
    if getattr(result, "sigma_translation_mm", None) is not None:
        lines.append(
            f"  uncertainty (1 sigma): {result.sigma_translation_mm:.4f} mm, {result.sigma_rotation_deg:.5f} deg"
            f" ({'refined' if getattr(result, 'refined', False) else 'linear'}; noise {result.noise_source})"
        )
    h = getattr(result, "holdout", None)
    if h is not None:
        lines.append(
            f"  held-out closure ({h.method}): translation P50 {h.p50_translation_m * 1e3:.4f} / P90 "
            f"{h.p90_translation_m * 1e3:.4f} / max {h.max_translation_m * 1e3:.4f} mm; rotation P50 "
            f"{math.degrees(h.p50_rotation_rad):.5f} / P90 {math.degrees(h.p90_rotation_rad):.5f} / max "
            f"{math.degrees(h.max_rotation_rad):.5f} deg"
        )
    a = getattr(result, "linear_agreement", None)
    if a is not None:
        lines.append(
            f"  linear vs refined: {a.translation_m * 1e3:.4f} mm, {math.degrees(a.rotation_rad):.5f} deg ({a.sigmas:.1f} sigma)"
        )
    if worst > 0:
        lines.append("  worst-fitting stations:")
        for i in result.residuals.worst(worst):
            label = station_names[i] if station_names else f"station {i}"
            lines.append(
                f"    {label}: {result.residuals.translation_m[i] * 1e3:.4f} mm, "
                f"{math.degrees(result.residuals.rotation_rad[i]):.5f} deg"
            )
    return "\n".join(lines)
