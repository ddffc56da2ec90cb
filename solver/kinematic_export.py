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

**Uncertainty** (ADR 0016, consider covariance). The parameters JSON carries every
estimated parameter's 1-sigma (``sigma``, the measurement noise and the prior of the
parameters fixed at nominal; ``noise_sigma``, the noise alone), the considered parameters
with their priors, the joint covariance of both (``covariance``, for predictions) and each
joint origin's 1-sigma (``joint_origins``). The URDF and the UR YAML carry the origin
sigmas as *comments* beside each origin (:func:`joint_origin_sigmas`: position along the
parent frame's x, y, z in m and a small rotation about them in rad, which stays defined at
gimbal lock where ``rpy`` rates do not): every URDF and YAML reader ignores a comment,
so the files load where they loaded before, and the sigma travels with the numbers it
qualifies. Cross-joint correlations are only in the JSON.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from cellcal.solver.kinematics import N_JOINTS, DHParameters

__all__ = [
    "joint_origins",
    "joint_origin_covariances",
    "joint_origin_sigmas",
    "origin_sigmas_from_parameters",
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


def _perturbed(model: DHParameters, name: str, step: float) -> DHParameters:
    from cellcal.solver.kinematic_parameters import _parse

    kind, row = _parse(name)
    key = "theta" if kind == "zero_offset" else kind
    arrays = {k: np.array(getattr(model, k)) for k in ("a", "d", "alpha", "theta", "beta")}
    arrays[key][row] += step
    return DHParameters(name=model.name, **arrays)


def _origin_error(O: np.ndarray, O_ref: np.ndarray) -> np.ndarray:
    """(7, 6): position change (parent frame) and rotation ``log(R R_ref^T)`` of each origin."""
    out = np.empty((O.shape[0], 6))
    out[:, :3] = O[:, :3, 3] - O_ref[:, :3, 3]
    for i in range(O.shape[0]):
        M = O[i, :3, :3] @ O_ref[i, :3, :3].T
        out[i, 3:] = 0.5 * np.array([M[2, 1] - M[1, 2], M[0, 2] - M[2, 0], M[1, 0] - M[0, 1]])
    return out


def joint_origin_covariances(model: DHParameters, names: Any, covariance: Any) -> np.ndarray:
    """Covariance of each joint origin ``O_1..O_6`` and the flange ``F`` from a covariance of
    DH parameters, (7, 6, 6): position in m along the parent frame's axes, then a small
    rotation in rad about them (module docstring).

    Parameters
    ----------
    model : DHParameters
        The arm the origins are of.
    names : sequence of str
        Parameter names (``joint{i}.zero_offset``, ``link{i}.a`` ...) of ``covariance``.
    covariance : array_like, shape (P, P)
        SI (``KinematicResult.full_covariance`` restricted to parameters).
    """
    names = list(names)
    C = np.asarray(covariance, dtype=np.float64)
    if C.shape != (len(names), len(names)):
        raise ValueError(f"covariance: expected shape {(len(names), len(names))} for {len(names)} names, got {C.shape}")
    O = joint_origins(model)
    J = np.zeros((N_JOINTS + 1, 6, len(names)))
    for k, n in enumerate(names):
        # The origins are smooth in every parameter; a central difference of 1e-7 (m or
        # rad) is exact to ~1e-14 relative on these magnitudes.
        eps = 1e-7
        up = _origin_error(joint_origins(_perturbed(model, n, eps)), O)
        down = _origin_error(joint_origins(_perturbed(model, n, -eps)), O)
        J[:, :, k] = (up - down) / (2 * eps)
    return np.asarray(np.einsum("oip,pq,ojq->oij", J, C, J))


def joint_origin_sigmas(result: Any) -> np.ndarray:
    """1-sigma of each joint origin of an identified arm, (7, 6): x, y, z (m), then rotation
    about x, y, z (rad), in the origin's parent frame; from the estimated and the considered
    parameters (``result.full_covariance``), so a joint that never moved shows the prior of
    its fixed neighbours. Structural parameters are exact by construction (their error is in
    the base frame, the target or ``link4.d``) and contribute nothing."""
    n_est = len(result.estimated)
    n_frames = len(result.covariance_names) - n_est
    idx = list(range(n_est)) + list(range(n_est + n_frames, len(result.full_covariance_names)))
    names = [result.full_covariance_names[i] for i in idx]
    C = np.asarray(result.full_covariance, dtype=np.float64)[np.ix_(idx, idx)]
    cov = joint_origin_covariances(result.model, names, C)
    return np.sqrt(np.maximum(np.diagonal(cov, axis1=1, axis2=2), 0.0))


def origin_sigmas_from_parameters(data: Any) -> np.ndarray | None:
    """The (7, 6) origin sigmas of a parameters dict (:func:`kinematic_parameters_dict`, as
    stored or read back from its JSON) for ``origin_sigmas=``; None when it has none (a
    dict written before the sigmas were exported)."""
    jo = data.get("joint_origins") if isinstance(data, Mapping) else None
    if not isinstance(jo, Mapping):
        return None
    t, r = jo.get("sigma_translation_m"), jo.get("sigma_rotation_rad")
    if t is None or r is None:
        return None
    a = np.column_stack([np.asarray(t, dtype=np.float64), np.asarray(r, dtype=np.float64)])
    return _check_origin_sigmas(a, N_JOINTS + 1)


def _sigma_comment(sig: Any) -> str:
    s = [float(v) for v in np.asarray(sig, dtype=np.float64).reshape(6)]
    return ("1-sigma: xyz " + " ".join(format(v, ".3g") for v in s[:3]) + " m, rotation about xyz "
            + " ".join(format(v, ".3g") for v in s[3:]) + " rad (parent frame)")


def _check_origin_sigmas(origin_sigmas: Any, rows: int) -> np.ndarray | None:
    if origin_sigmas is None:
        return None
    a = np.asarray(origin_sigmas, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 6 or a.shape[0] < rows or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise ValueError(f"origin_sigmas: expected finite non-negative values of shape ({rows} or more, 6) "
                         f"(joint_origin_sigmas), got shape {a.shape}")
    return a


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
    """A :class:`~cellcal.solver.identify.KinematicResult` as plain JSON-ready data (SI).

    Besides values, deltas and the refusals: ``parameters[name].sigma`` (noise and the
    considered priors) and ``.noise_sigma`` (noise alone); ``considered`` (name: nominal
    ``value``, ``prior_sigma`` and why it was not estimated); ``weak_excitation`` (the
    joints and parameters of that warning, or None); ``covariance`` (``names`` and the
    row-major ``values`` of ``result.full_covariance``: estimated parameters, base and target
    twists, considered parameters); ``joint_origins`` (``names`` and their 1-sigma,
    :func:`joint_origin_sigmas`).
    """
    params = {
        name: {"value": result.parameters[name], "delta": result.deltas[name], "sigma": result.sigmas[name],
               "noise_sigma": result.noise_sigmas[name]}
        for name in result.estimated
    }
    considered = {
        name: {"value": _nominal_value(result.nominal, name), "prior_sigma": result.prior_sigmas[name],
               "reason": result.unidentifiable_reasons.get(name, "not requested (parameters=)")}
        for name in result.considered
    }
    C = np.asarray(result.full_covariance, dtype=np.float64)
    origin_sig = joint_origin_sigmas(result)
    out: dict[str, Any] = {
        "format": "cellcal.kinematics/1",
        "units": "m, rad",
        "convention": "standard DH: Rz(q + theta) Tz(d) Tx(a) Rx(alpha) Ry(beta); theta = theta_nominal + zero_offset",
        "measurement": result.measurement,
        "nominal": {"name": result.nominal.name, **_arrays(result.nominal)},
        "identified": {"name": result.model.name, **_arrays(result.model)},
        "parameters": params,
        "unidentifiable": {n: result.unidentifiable_reasons.get(n, "") for n in result.unidentifiable},
        "considered": considered,
        "weak_excitation": ({"joints": [int(j) for j in result.weakly_excited_joints],
                             "parameters": list(result.weakly_excited)} if result.weakly_excited else None),
        "covariance": {"names": list(result.full_covariance_names), "shape": list(C.shape),
                       "values": [_num(v) for v in C.reshape(-1)]},
        "joint_origins": {"names": [f"joint{i + 1}" for i in range(N_JOINTS)] + ["flange"],
                          "frame": "parent", "sigma_translation_m": origin_sig[:, :3].tolist(),
                          "sigma_rotation_rad": origin_sig[:, 3:].tolist()},
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


def _nominal_value(nominal: DHParameters, name: str) -> float:
    from cellcal.solver.kinematic_parameters import _parse

    kind, row = _parse(name)
    return 0.0 if kind == "zero_offset" else float(getattr(nominal, kind)[row])


def kinematic_parameters_json(result: Any, *, indent: int = 2) -> str:
    """:func:`kinematic_parameters_dict` as JSON text (NaN written as null)."""
    return json.dumps(kinematic_parameters_dict(result), indent=indent)


def urdf_from_model(model: DHParameters, *, robot_name: str = "cellcal_arm", prefix: str = "",
                    lower_rad: float = -2 * math.pi, upper_rad: float = 2 * math.pi,
                    origin_sigmas: Any = None) -> str:
    """A URDF of the arm's kinematic chain with the model's joint origins (module docstring).

    Links ``{prefix}base_link``, ``{prefix}link1..link6``, ``{prefix}flange``; revolute
    joints ``{prefix}joint1..joint6`` about z; a fixed ``{prefix}flange_joint``. No
    inertias or meshes: the file carries the calibrated geometry, for FK and visualisation.

    ``origin_sigmas`` (7, 6), :func:`joint_origin_sigmas` (or the parameters JSON's
    ``joint_origins``): each joint's origin gets a comment with its 1-sigma.
    """
    O = joint_origins(model)
    sig = _check_origin_sigmas(origin_sigmas, N_JOINTS + 1)
    links = [f"{prefix}base_link"] + [f"{prefix}link{i + 1}" for i in range(N_JOINTS)] + [f"{prefix}flange"]
    lines = ['<?xml version="1.0"?>', f'<robot name="{robot_name}">']
    if sig is not None:
        lines.append("  <!-- cellcal: each origin's 1-sigma from the identification (measurement noise and the "
                     "prior of parameters fixed at nominal); correlations in the parameters JSON -->")
    lines += [f'  <link name="{n}"/>' for n in links]

    def origin(T: np.ndarray) -> str:
        r, p, y = rpy_from_matrix(T[:3, :3])
        return (f'    <origin xyz="{_f(T[0, 3])} {_f(T[1, 3])} {_f(T[2, 3])}" '
                f'rpy="{_f(r)} {_f(p)} {_f(y)}"/>')

    def comment(i: int) -> list[str]:
        return [] if sig is None else [f"    <!-- {_sigma_comment(sig[i])} -->"]

    for i in range(N_JOINTS):
        lines += [f'  <joint name="{prefix}joint{i + 1}" type="revolute">',
                  f'    <parent link="{links[i]}"/>', f'    <child link="{links[i + 1]}"/>', *comment(i), origin(O[i]),
                  '    <axis xyz="0 0 1"/>',
                  f'    <limit lower="{_f(lower_rad)}" upper="{_f(upper_rad)}" effort="0" velocity="3.14"/>',
                  '  </joint>']
    lines += [f'  <joint name="{prefix}flange_joint" type="fixed">', f'    <parent link="{links[N_JOINTS]}"/>',
              f'    <child link="{links[-1]}"/>', *comment(N_JOINTS), origin(O[N_JOINTS]), '  </joint>', '</robot>', '']
    return "\n".join(lines)


def ur_calibration_yaml(model: DHParameters, *, hash_value: str | None = None, origin_sigmas: Any = None) -> str:
    """The UR ROS driver's calibration YAML (``kinematics:`` per segment ``x y z roll
    pitch yaw``, then ``hash:``) for ``model`` (module docstring for the mapping).

    ``hash_value`` defaults to ``calib_`` and digits derived from the parameters. The driver
    compares it with the controller's own calibration checksum and warns when they differ,
    which they do for a calibration made outside the controller: expected, not an error.
    ``origin_sigmas`` (6 or 7, 6), :func:`joint_origin_sigmas`: a comment with each
    segment's 1-sigma above its values.

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
    sig = _check_origin_sigmas(origin_sigmas, N_JOINTS)
    if hash_value is None:
        digest = hashlib.sha256(json.dumps(_arrays(model)).encode()).hexdigest()
        hash_value = f"calib_{int(digest[:15], 16)}"
    # The first line stays "kinematics:" as in the controller's own file; the note goes under it.
    lines = ["kinematics:"]
    if sig is not None:
        lines.append("  # cellcal: 1-sigma of each segment from the identification (measurement noise "
                     "and the prior of parameters fixed at nominal); correlations in the parameters JSON")
    for i, (seg, T) in enumerate(zip(UR_JOINT_SEGMENTS, O[:N_JOINTS], strict=True)):
        r, p, y = rpy_from_matrix(T[:3, :3])
        lines.append(f"  {seg}:")
        if sig is not None:
            lines.append(f"    # {_sigma_comment(sig[i])}")
        lines += [f"    x: {_f(T[0, 3])}", f"    y: {_f(T[1, 3])}", f"    z: {_f(T[2, 3])}",
                  f"    roll: {_f(r)}", f"    pitch: {_f(p)}", f"    yaw: {_f(y)}"]
    lines += [f"  hash: {hash_value}", ""]
    return "\n".join(lines)
