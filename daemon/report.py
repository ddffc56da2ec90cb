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
    if worst > 0:
        lines.append("  worst-fitting stations:")
        for i in result.residuals.worst(worst):
            label = station_names[i] if station_names else f"station {i}"
            lines.append(
                f"    {label}: {result.residuals.translation_m[i] * 1e3:.4f} mm, "
                f"{math.degrees(result.residuals.rotation_rad[i]):.5f} deg"
            )
    return "\n".join(lines)
