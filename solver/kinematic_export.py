"""Exports of an identified arm: parameters JSON, a URDF, a UR ROS driver calibration YAML.

Pure functions returning text (the daemon writes the files).

**From DH rows to joint origins.** A URDF (and the UR ROS description) chains, per joint,
a fixed *origin* ``O_i`` and then the joint's rotation about its own z axis::

    base_T_flange(q) = O_1 Rz(q_1) O_2 Rz(q_2) ... O_6 Rz(q_6) F

Each DH row ``Rz(q_i + theta_i) Tz(d_i) Tx(a_i) Rx(alpha_i) Ry(beta_i)`` is split at the
joint rotation: ``Rz(theta_i)`` and ``Tz(d_i)`` commute with ``Rz(q_i)`` and move in front of
it, the rest of the row goes behind it, into the next joint's origin::

    O_1 = Tz(d_1) Rz(theta_1)
    O_i = Tx(a_{i-1}) Rx(alpha_{i-1}) Ry(beta_{i-1}) Tz(d_i) Rz(theta_i)     (i = 2..6)
    F   = Tx(a_6) Rx(alpha_6) Ry(beta_6)                                     (fixed, flange)

which is also how Universal Robots' ROS description reads its ``default_kinematics.yaml``
(shoulder ``z = d1``; upper_arm ``roll = alpha1``; forearm ``x = a2``; wrist_1 ``x = a3,
z = d4``; ...), each origin written as ``x y z`` (m) and fixed-axis ``roll pitch yaw`` (rad,
``R = Rz(yaw) Ry(pitch) Rx(roll)``, the URDF convention). In the UR description the DH base
is ``base_link_inertia`` and ``tool0`` coincides with the DH flange; ``F`` must be the
identity there (the last row's ``a``, ``alpha``, ``beta`` are folded into the target by
identification and stay at the nominal zeros), else :func:`ur_calibration_yaml` refuses.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import numpy as np

from cellcal.solver.kinematics import N_JOINTS, DHParameters

__all__ = [
    "joint_origins",
    "rpy_from_matrix",
    "kinematic_parameters_dict",
    "kinematic_parameters_json",
    "urdf_from_model",
    "ur_calibration_yaml",
    "UR_JOINT_SEGMENTS",
]

#: Segment names of the UR ROS driver's calibration YAML, joint 1 to 6.
UR_JOINT_SEGMENTS = ("shoulder", "upper_arm", "forearm", "wrist_1", "wrist_2", "wrist_3")


def _rz(t: float) -> np.ndarray:
    c, s = math.cos(t), math.sin(t)
    T = np.eye(4)
    T[:2, :2] = [[c, -s], [s, c]]
    return T


def _rx(t: float) -> np.ndarray:
    c, s = math.cos(t), math.sin(t)
    T = np.eye(4)
    T[1:3, 1:3] = [[c, -s], [s, c]]
    return T


def _ry(t: float) -> np.ndarray:
    c, s = math.cos(t), math.sin(t)
    T = np.eye(4)
    T[0, 0], T[0, 2], T[2, 0], T[2, 2] = c, s, -s, c
    return T


def _tr(x: float, y: float, z: float) -> np.ndarray:
    T = np.eye(4)
    T[:3, 3] = (x, y, z)
    return T


def joint_origins(model: DHParameters) -> np.ndarray:
    """Joint origins ``O_1..O_6`` and the fixed flange ``F`` (module docstring), (7, 4, 4)."""
    out = np.empty((N_JOINTS + 1, 4, 4))
    for i in range(N_JOINTS):
        pre = np.eye(4) if i == 0 else (_tr(model.a[i - 1], 0, 0) @ _rx(model.alpha[i - 1]) @ _ry(model.beta[i - 1]))
        out[i] = pre @ _tr(0, 0, model.d[i]) @ _rz(model.theta[i])
    out[N_JOINTS] = _tr(model.a[-1], 0, 0) @ _rx(model.alpha[-1]) @ _ry(model.beta[-1])
    return out


def rpy_from_matrix(R: np.ndarray) -> tuple[float, float, float]:
    """Fixed-axis ``(roll, pitch, yaw)`` (rad) with ``R = Rz(yaw) Ry(pitch) Rx(roll)``."""
    R = np.asarray(R, dtype=np.float64)
    pitch = math.atan2(-R[2, 0], math.hypot(R[0, 0], R[1, 0]))
    if math.hypot(R[0, 0], R[1, 0]) < 1e-12:  # gimbal lock: roll and yaw share one axis
        return 0.0, pitch, math.atan2(-R[0, 1], R[1, 1])
    return math.atan2(R[2, 1], R[2, 2]), pitch, math.atan2(R[1, 0], R[0, 0])


def _f(v: float) -> str:
    return format(float(v), ".17g")


def _num(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _arrays(m: DHParameters) -> dict[str, list[float]]:
    return {k: [float(x) for x in getattr(m, k)] for k in ("a", "d", "alpha", "theta", "beta")}


def kinematic_parameters_dict(result: Any) -> dict[str, Any]:
    """A :class:`~cellcal.solver.identify.KinematicResult` as plain JSON-ready data (SI)."""
    params = {
        name: {"value": result.parameters[name], "delta": result.deltas[name], "sigma": result.sigmas[name]}
        for name in result.estimated
    }
    out: dict[str, Any] = {
        "format": "cellcal.kinematics/1",
        "units": "m, rad",
        "convention": "standard DH: Rz(q + theta) Tz(d) Tx(a) Rx(alpha) Ry(beta); theta = theta_nominal + zero_offset",
        "measurement": result.measurement,
        "nominal": {"name": result.nominal.name, **_arrays(result.nominal)},
        "identified": {"name": result.model.name, **_arrays(result.model)},
        "parameters": params,
        "unidentifiable": {n: result.unidentifiable_reasons.get(n, "") for n in result.unidentifiable},
        "condition_number": _num(result.condition_number),
        "cell_T_base": np.asarray(result.cell_T_base).tolist(),
        "converged": bool(result.converged),
        "stop_reason": result.stop_reason,
        "noise_source": result.noise_source,
        "dof": int(result.dof),
        "rms_translation_m": _num(result.rms_translation_m),
        "warnings": [{"code": w.code, "message": w.message, "value": w.value} for w in result.warnings],
    }
    if result.flange_T_target is not None:
        out["flange_T_target"] = np.asarray(result.flange_T_target).tolist()
    if result.flange_p_target is not None:
        out["flange_p_target"] = np.asarray(result.flange_p_target).tolist()
    if result.validation is not None:
        out["validation"] = {
            k: {f: _num(v) if isinstance(v, float) else v for f, v in vars(getattr(result.validation, k)).items()}
            for k in ("before", "after")
        }
    return out


def kinematic_parameters_json(result: Any, *, indent: int = 2) -> str:
    """:func:`kinematic_parameters_dict` as JSON text (NaN written as null)."""
    return json.dumps(kinematic_parameters_dict(result), indent=indent)


def urdf_from_model(model: DHParameters, *, robot_name: str = "cellcal_arm", prefix: str = "",
                    lower_rad: float = -2 * math.pi, upper_rad: float = 2 * math.pi) -> str:
    """A URDF of the arm's kinematic chain with the model's joint origins (module docstring).

    Links ``{prefix}base_link``, ``{prefix}link1..link6``, ``{prefix}flange``; revolute
    joints ``{prefix}joint1..joint6`` about z; a fixed ``{prefix}flange_joint``. No
    inertias or meshes: the file carries the calibrated geometry, for FK and visualisation.
    """
    O = joint_origins(model)
    links = [f"{prefix}base_link"] + [f"{prefix}link{i + 1}" for i in range(N_JOINTS)] + [f"{prefix}flange"]
    lines = ['<?xml version="1.0"?>', f'<robot name="{robot_name}">']
    lines += [f'  <link name="{n}"/>' for n in links]

    def origin(T: np.ndarray) -> str:
        r, p, y = rpy_from_matrix(T[:3, :3])
        return (f'    <origin xyz="{_f(T[0, 3])} {_f(T[1, 3])} {_f(T[2, 3])}" '
                f'rpy="{_f(r)} {_f(p)} {_f(y)}"/>')

    for i in range(N_JOINTS):
        lines += [f'  <joint name="{prefix}joint{i + 1}" type="revolute">',
                  f'    <parent link="{links[i]}"/>', f'    <child link="{links[i + 1]}"/>', origin(O[i]),
                  '    <axis xyz="0 0 1"/>',
                  f'    <limit lower="{_f(lower_rad)}" upper="{_f(upper_rad)}" effort="0" velocity="3.14"/>',
                  '  </joint>']
    lines += [f'  <joint name="{prefix}flange_joint" type="fixed">', f'    <parent link="{links[N_JOINTS]}"/>',
              f'    <child link="{links[-1]}"/>', origin(O[N_JOINTS]), '  </joint>', '</robot>', '']
    return "\n".join(lines)


def ur_calibration_yaml(model: DHParameters, *, hash_value: str | None = None) -> str:
    """The UR ROS driver's calibration YAML (``kinematics:`` per segment ``x y z roll
    pitch yaw``, then ``hash:``) for ``model`` (module docstring for the mapping).

    ``hash_value`` defaults to ``calib_`` and digits derived from the parameters. The driver
    compares it with the controller's own calibration checksum and warns when they differ,
    which they do for a calibration made outside the controller: expected, not an error.

    Raises
    ------
    ValueError
        A non-zero ``a``, ``alpha`` or ``beta`` in the last row (the UR description's
        ``tool0`` is fixed to ``wrist_3_link``: nowhere to put them).
    """
    if max(abs(model.a[-1]), abs(model.alpha[-1]), abs(model.beta[-1])) > 1e-12:
        raise ValueError("row 6 has a non-zero a, alpha or beta: the UR description has no place for them "
                         "(identification folds them into the target; keep them nominal)")
    O = joint_origins(model)
    if hash_value is None:
        digest = hashlib.sha256(json.dumps(_arrays(model)).encode()).hexdigest()
        hash_value = f"calib_{int(digest[:15], 16)}"
    lines = ["kinematics:"]
    for seg, T in zip(UR_JOINT_SEGMENTS, O[:N_JOINTS], strict=True):
        r, p, y = rpy_from_matrix(T[:3, :3])
        lines += [f"  {seg}:", f"    x: {_f(T[0, 3])}", f"    y: {_f(T[1, 3])}", f"    z: {_f(T[2, 3])}",
                  f"    roll: {_f(r)}", f"    pitch: {_f(p)}", f"    yaw: {_f(y)}"]
    lines += [f"  hash: {hash_value}", ""]
    return "\n".join(lines)
