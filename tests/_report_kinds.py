"""Result bodies of every kind on the wire, solved from seeded synthetic stations, for the
report tests (``tests/test_report_html.py``).

Each body is what the daemon publishes (``solve.calibration_record`` plus the record's identity
fields ``bodies.result_body`` adds), with the stations as the report reads them. A
``kinematics`` result (:func:`kinematics_kind`) is identified on the simulated arm of
``tests/_kin_world.py`` and wired by the daemon's own ``runs.kinematics.gate_and_wire``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cellcal.daemon.config import Config, Solve
from cellcal.daemon.gates import check_gates
from cellcal.daemon.runs.kinematics import gate_and_wire
from cellcal.daemon.solve import calibration_record as wire_result
from cellcal.solver import (
    UR5E,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
    identify_kinematics,
    synthetic,
)
from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp

KINDS = ("base_frame", "base_frame_points", "hand_eye", "eye_to_hand", "tool_point")

_SOLVE = Solve()  # the [solve] defaults: every gate the daemon applies


def _identity(body: dict[str, Any], kind: str, result: Any, rid: int) -> dict[str, Any]:
    body.update(result_id=str(rid), run_id=str(rid), kind=kind, active=True, suspect=False, suspect_reason="",
                created_ns=1_700_000_000_000_000_000, valid_from="2026-01-01T00:00:00+00:00",
                provenance={"config_sha256": "ab" * 32, "cellcal_version": "0.test",
                            "solver": getattr(result, "solver", None) or body.get("solver"),
                            "devices": {"robot": {"model": "UR5e", "serial": "20235500042"},
                                        "tracker": {"model": "sim", "serial": "T-1"}},
                            "robot_serial": "20235500042", "parent_result_id": None})
    return body


def _body(kind: str, result: Any, rid: int = 1) -> dict[str, Any]:
    body = wire_result(result, check_gates(result, _SOLVE), [{"plan_index": 0}, {"plan_index": 3}])
    return _identity(body, kind, result, rid)


def kinematics_kind(n_fit: int = 40, n_validation: int = 12, seed: int = 7
                    ) -> tuple[dict[str, Any], list[dict[str, Any]], Any]:
    """(result body, fit stations, the solver's ``KinematicResult``) of a ``kinematics`` run:
    a UR5e with hidden errors measured as 6-DoF poses, identified with held-out
    validation stations, gated and wired as the daemon stores it (``[kinematics]`` and
    ``[solve]`` defaults)."""
    from _kin_world import measure, random_q, truth_arm

    rng = np.random.default_rng(seed)
    truth = truth_arm(rng)
    fit = measure(truth, random_q(rng, n_fit), rng)
    val = measure(truth, random_q(rng, n_validation), rng)
    result = identify_kinematics(fit.q, UR5E, cell_T_target=fit.cell_T_target, cell_T_target_cov=fit.pose_cov,
                                 validation_q=val.q, validation_cell_T_target=val.cell_T_target)
    # The nominal arm's own rigid fit on the same stations (the daemon's runs.kinematics.nominal_fit).
    nominal = identify_kinematics(fit.q, UR5E, cell_T_target=fit.cell_T_target, cell_T_target_cov=fit.pose_cov,
                                  parameters=[], max_condition=math.inf)
    _, wire = gate_and_wire(result, Config(), [{"plan_index": 0}, {"plan_index": 3}], nominal=nominal)
    body = _identity(wire, "kinematics", result, 9)
    G = np.asarray(UR5E.forward(fit.q)).reshape(n_fit, 4, 4)  # what the controller's nominal FK reports
    stations = [{"plan_index": i, "q_rad": fit.q[i], "base_T_flange": G[i], "cell_T_target": fit.cell_T_target[i]}
                for i in range(n_fit)]
    return body, stations, result


def _stations(G: np.ndarray, key: str | None = None, M: np.ndarray | None = None) -> list[dict[str, Any]]:
    out = []
    for i, g in enumerate(G):
        d: dict[str, Any] = {"plan_index": i, "base_T_flange": g}
        if key is not None and M is not None:
            d[key] = M[i]
        out.append(d)
    return out


def drift_history(n: int = 5) -> list[dict[str, Any]]:
    """Drift check records (``bodies.drift``) with a slow rise into the warn band."""
    out = []
    cusum = 0.0
    for i in range(n):
        t = 0.2e-3 + 0.12e-3 * i
        cusum = max(0.0, cusum + t - 0.3e-3)
        status = "ok" if t < 0.6e-3 else ("warn" if t < 0.9e-3 else "fail")
        out.append({"result_id": "1", "check_id": i + 1, "deviation_translation_m": t, "deviation_rotation_rad": 1e-4,
                    "warn_translation_m": 0.6e-3, "fail_translation_m": 0.9e-3, "warn_rotation_rad": 0.01,
                    "fail_rotation_rad": 0.02, "cusum": {"value_m": cusum, "k_m": 0.3e-3, "h_m": 1.0e-3,
                                                         "alarm": cusum > 1e-3},
                    "status": status, "suspect": False, "action": "none", "stations": []})
    return out


def every_kind(n: int = 12, seed: int = 3) -> dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]:
    """kind -> (result body, stations) for every result kind on the wire."""
    rng = np.random.default_rng(seed)
    out: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    s = synthetic.base_frame_scene(n, rng, noise_mm=0.05, noise_deg=0.01)
    out["base_frame"] = (_body("base_frame", calibrate_base_frame(s.base_T_flange, s.measured)),
                         _stations(s.base_T_flange, "cell_T_target", s.measured))
    pts = s.measured[:, :3, 3]
    st = _stations(s.base_T_flange, "cell_p_target", pts)
    out["base_frame_points"] = (_body("base_frame", calibrate_base_frame_points(s.base_T_flange, pts)), st)
    h = synthetic.hand_eye_scene(n, rng, noise_mm=0.05, noise_deg=0.01)
    out["hand_eye"] = (_body("hand_eye", calibrate_hand_eye(h.base_T_flange, h.measured)),
                       _stations(h.base_T_flange, "camera_T_target", h.measured))
    base_T_camera = make_transform(so3_exp(np.array([0.2, -2.5, 0.1])), np.array([0.6, 0.2, 1.2]))
    Y = make_transform(so3_exp(np.array([0.1, 0.2, 0.3])), np.array([0.02, 0.0, 0.05]))
    G = s.base_T_flange
    O = np.array([synthetic.perturb(se3_inverse(base_T_camera) @ g @ Y, rng, 0.05, 0.01) for g in G])
    out["eye_to_hand"] = (_body("eye_to_hand", calibrate_eye_to_hand(G, O)), _stations(G, "camera_T_target", O))
    Gp, _, _ = synthetic.pivot_scene(n, rng, noise_mm=0.05)
    out["tool_point"] = (_body("tool_point", calibrate_tool_point(Gp)), _stations(Gp))
    return out
