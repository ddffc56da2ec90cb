"""A run of kind ``kinematics``: the arm's own DH geometry identified from tracker stations.

``cellcal.solver`` does the mathematics (``plan_identification_stations``,
``identify_kinematics``; ``docs/kinematics.md``, ADR 0016). This module is the daemon's side,
called from one place each in ``cellcal.daemon.service``:

* :func:`make_plan`: fit stations then held-out validation stations (``[kinematics]
  n_stations`` + ``n_validation``), planned on the robot's own model (the driver's
  ``DHModel``, :func:`solver_model`) and captured like a base-frame run (pose or point,
  ``[tracker] measure``). The plan records how many are fit stations (``plan["identification"]``).
* :func:`solve_run`: the stored stations -> ``identify_kinematics`` with the run's declared
  noise (``cellcal.daemon.solve.declared_noise``), the ``[kinematics]`` parameter set and
  condition gate; a request the stations cannot determine raises ``DegenerateGeometry``
  naming the parameters, and the run fails with that reason.
* :func:`gate_and_wire`: the acceptance gates (held-out RMS after identification at most
  ``[kinematics] max_holdout_rms_mm``, the fit's RMS at most ``[solve] max_rms_mm``, the
  condition number, convergence) and the stored record: the base-frame keys every result has
  (``transforms``, closure figures, ``residuals``) plus ``kinematics``: the identified
  parameters with values, deltas and sigmas, the unidentifiable ones with reasons, the
  condition number, observability, the nominal and identified DH arrays and the held-out
  figures before (nominal arm) and after (``cellcal.solver.kinematic_export``'s dictionary).

Use of the result: for a CiA 402 arm cellcal computes the forward kinematics itself, so with
``[kinematics] use_identified = true`` the active kinematics result's model replaces the
configured one when the robot is opened (:func:`identified_model`): later base-frame runs and
drift checks use it. A UR's controller computes its own FK: the result is reported and exported
(parameters JSON, URDF, the ROS driver's calibration YAML) only.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from cellcal.daemon import protocol as P
from cellcal.daemon.gates import GateCheck, GateContext, GateReport, rms_translation
from cellcal.daemon.plan import PlannedStation
from cellcal.daemon.report import FRAME_CONVENTION, point_to_wire, transform_to_wire
from cellcal.solver import DHParameters, identify_kinematics, plan_identification_stations
from cellcal.solver.kinematic_export import kinematic_parameters_dict

log = logging.getLogger(__name__)

__all__ = ["solver_model", "driver_model", "make_plan", "plan_extra", "solve_run", "gate_and_wire",
           "identified_model", "newest_identified", "sync_devices_model", "station_for_check", "SOLVER_NAME", "PLAN_KEY"]

#: ``solver`` of a kinematics result (provenance and wire).
SOLVER_NAME = "identify_kinematics"


def solver_model(model: Any) -> DHParameters:
    """The drivers' ``DHModel`` (six joints) as the solver's :class:`DHParameters` (m, rad)."""
    if isinstance(model, DHParameters):
        return model
    if getattr(model, "n_joints", 6) != 6:
        raise ValueError(f"kinematic identification needs a six-joint arm, the model has {model.n_joints}")
    return DHParameters(a=model.a_m, d=model.d_m, alpha=model.alpha_rad, theta=model.theta_offset_rad,
                        beta=model.beta_rad, name=str(getattr(model, "name", "custom")))


def driver_model(params: DHParameters | Mapping[str, Any], name: str | None = None) -> Any:
    """The solver's model (or the ``identified`` dict of a stored result) as a drivers' ``DHModel``."""
    from cellcal.drivers.kinematics import DHModel

    get = params.get if isinstance(params, Mapping) else (lambda k, d=None: getattr(params, k, d))
    label = name or str(get("name", "identified") or "identified")
    return DHModel(label, np.asarray(get("d"), dtype=float), np.asarray(get("a"), dtype=float),
                   np.asarray(get("alpha"), dtype=float), np.asarray(get("theta"), dtype=float),
                   np.asarray(get("beta"), dtype=float))


def _limits(plan_cfg: Any) -> np.ndarray:
    lo = np.clip(np.asarray(plan_cfg.joint_min_rad, dtype=float), -math.pi, math.pi)
    hi = np.clip(np.asarray(plan_cfg.joint_max_rad, dtype=float), -math.pi, math.pi)
    return np.column_stack([lo, hi])


def make_plan(cfg: Any, model: Any, cell_T_base: np.ndarray | None = None) -> list[PlannedStation]:
    """Fit stations (indices ``0 .. n_stations-1``) then validation stations.

    Parameters
    ----------
    cfg : Config
        ``[kinematics]`` (sizes, seed), ``[plan]`` (joint limits), ``[tracker] measure``.
    model : DHModel or DHParameters
        The robot's nominal kinematics.
    cell_T_base : numpy.ndarray, shape (4, 4), optional
        The active base frame, if any (the planner's line-of-sight test then uses the
        tracker at the cell origin); None: no visibility test.
    """
    k = cfg.kinematics
    nominal = solver_model(model)
    plan = plan_identification_stations(
        nominal, k.n_stations, n_validation=k.n_validation, measurement=cfg.tracker.measure,
        cell_T_base=cell_T_base, cell_p_tracker=None if cell_T_base is None else np.zeros(3),
        joint_limits_rad=_limits(cfg.plan), rng=np.random.default_rng(k.seed),
    )
    q = np.vstack([plan.q, plan.validation_q])
    return [PlannedStation(i, q[i].copy(), np.asarray(model.forward(q[i]), dtype=float).reshape(4, 4)) for i in range(len(q))]


#: The key of a kinematics run's plan that records its split (``{"n_fit": int}``).
PLAN_KEY = "identification"


def plan_extra(cfg: Any) -> dict[str, Any]:
    """What a kinematics run stores with its plan (merged into the plan's dict): the number of
    fit stations; the rest validate."""
    return {PLAN_KEY: {"n_fit": int(cfg.kinematics.n_stations)}}


def solve_run(stations: Sequence[Any], run_plan: Mapping[str, Any], cfg: Any, model: Any) -> Any:
    """Identify the arm from a run's stored stations.

    Returns
    -------
    cellcal.solver.KinematicResult

    Raises
    ------
    CalibrationError
        ``NotEnoughSamples``, ``DegenerateGeometry`` (a requested parameter the stations
        cannot determine, or the condition gate; ``.parameters`` names them).
    ValueError
        Stations without joint angles or measurements.
    """
    from cellcal.daemon.solve import declared_noise, is_point_run

    n_fit = int((run_plan.get(PLAN_KEY) or {}).get("n_fit", cfg.kinematics.n_stations))
    fit = [s for s in stations if s.plan_index < n_fit]
    val = [s for s in stations if s.plan_index >= n_fit]
    point = is_point_run(stations)
    for s in stations:
        if s.q_rad is None or len(s.q_rad) != 6:
            raise ValueError(f"station {s.plan_index}: a kinematics run needs the six joint angles")

    def meas(group: Sequence[Any]) -> np.ndarray:
        if point:
            return np.array([np.asarray(s.cell_p_target, dtype=float).reshape(3) for s in group])
        return np.array([s.cell_T_target for s in group])

    q = np.array([s.q_rad for s in fit], dtype=float)
    kw: dict[str, Any] = dict(declared_noise(fit, cfg.solve, point=point))
    key = "cell_p_target" if point else "cell_T_target"
    kw[key] = meas(fit)
    if len(val) >= 3:
        kw["validation_q"] = np.array([s.q_rad for s in val], dtype=float)
        kw["validation_" + key] = meas(val)
    k = cfg.kinematics
    return identify_kinematics(q, solver_model(model), parameters=list(k.parameters) or None,
                               max_condition=k.max_condition, **kw)


def _holdout_gate(result: Any, k: Any) -> GateCheck:
    lim = float(k.max_holdout_rms_m)
    if result.validation is None:
        return GateCheck("kinematic_holdout_rms", None, lim, "m", False,
                         "no held-out validation stations were measured")
    v = float(result.validation.after.rms_translation_m)
    b = float(result.validation.before.rms_translation_m)
    ok = v <= lim
    return GateCheck("kinematic_holdout_rms", v, lim, "m", ok,
                     f"held-out rms {v * 1e3:.3f} mm (nominal arm {b * 1e3:.3f} mm) "
                     f"{'<=' if ok else '>'} {lim * 1e3:.3f} mm")


def gates(result: Any, cfg: Any) -> GateReport:
    """The acceptance gates of a kinematics result (module docstring)."""
    k = cfg.kinematics
    c = float(result.condition_number)
    c_ok = math.isfinite(c) and c <= k.max_condition
    checks = [
        rms_translation(result, cfg.solve, GateContext(kind=P.KIND_KINEMATICS)),
        _holdout_gate(result, k),
        GateCheck("kinematic_condition", c, float(k.max_condition), "", c_ok,
                  f"condition number {c:.1f} {'<=' if c_ok else '>'} {k.max_condition:g}"),
        GateCheck("converged", 1.0 if result.converged else 0.0, 1.0, "", bool(result.converged),
                  f"identification {'converged' if result.converged else 'did not converge'} ({result.stop_reason})"),
    ]
    return GateReport(tuple(checks))


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats (e.g. rotation figures of point stations) become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _f(v: Any) -> float:
    return float(v) if v is not None and math.isfinite(float(v)) else 0.0


def gate_and_wire(result: Any, cfg: Any, check_stations: list[dict[str, Any]]) -> tuple[GateReport, dict[str, Any]]:
    """The gate report and the record the store keeps (module docstring for its keys)."""
    report = gates(result, cfg)
    transforms = {"cell_T_base": transform_to_wire("cell_T_base", result.cell_T_base)}
    points: dict[str, Any] = {}
    if result.flange_T_target is not None:
        transforms["flange_T_target"] = transform_to_wire("flange_T_target", result.flange_T_target)
    if result.flange_p_target is not None:
        points["flange_p_target"] = point_to_wire("flange", result.flange_p_target)
    rt = np.asarray(result.residuals.translation_m, dtype=float)
    rr = np.asarray(result.residuals.rotation_rad, dtype=float)
    kin = kinematic_parameters_dict(result)
    kin["unidentifiable_reasons"] = dict(kin["unidentifiable"])
    kin["unidentifiable"] = list(result.unidentifiable)
    kin["observability_o1"] = _f(result.observability_o1)
    kin["observability_o3"] = _f(result.observability_o3)
    kin["correlations"] = [[a, b, float(r)] for a, b, r in result.correlations]
    wire: dict[str, Any] = {
        "transforms": transforms, "points": points,
        "n_stations": int(result.n_stations),
        "rms_translation_m": _f(result.rms_translation_m),
        "max_translation_m": _f(rt.max()) if rt.size else 0.0,
        "rms_rotation_rad": _f(math.sqrt(float(np.mean(rr * rr)))) if rr.size else 0.0,
        "max_rotation_rad": _f(rr.max()) if rr.size else 0.0,
        "axis_spread": 1.0,  # the identification's own conditioning is in kinematics.condition_number
        "residuals": {"translation_m": [float(v) for v in rt], "rotation_rad": [float(v) for v in rr]},
        "solver": SOLVER_NAME, "frame_convention": FRAME_CONVENTION,
        "kinematics": _clean(kin),
        "gates": report.to_wire(),
        # Drift checks compare the tracker with cell_T_base, the controller's FK and the
        # target: only meaningful where that FK is the identified model (module docstring).
        "check_stations": check_stations,
    }
    return report, wire


def identified_model(result: Mapping[str, Any] | None) -> Any:
    """The identified arm of a stored kinematics result as a ``DHModel`` (None without one)."""
    if not result:
        return None
    ident = (result.get("kinematics") or {}).get("identified")
    if not ident:
        return None
    return driver_model(ident, name=f"{ident.get('name') or 'identified'}")


def _is_canopen(cfg: Any) -> bool:
    # The scheme names the backend (cellcal.drivers.robot.BACKENDS): only CiA 402 drives leave
    # the forward kinematics to cellcal.
    return str(cfg.robot.url).lower().startswith("canopen://")


def newest_identified(store: Any, limit: int = 50) -> tuple[int, Any] | None:
    """``(result id, DHModel)`` of the newest kinematics result that passed its gates and is
    not suspect, among the ``limit`` newest results; None without one."""
    from cellcal.daemon.gates import gates_passed

    for rec in store.list_results(limit=limit):
        if rec.kind == P.KIND_KINEMATICS and not rec.suspect and gates_passed(rec.result):
            model = identified_model(rec.result)
            if model is not None:
                return rec.id, model
    return None


def sync_devices_model(cfg: Any, store: Any, devices: Any) -> None:
    """Open the robot with the identified model where cellcal computes its FK (a CiA 402 arm
    with ``[kinematics] use_identified = true``), closing it first when the model changed;
    a UR's controller computes its own FK, so nothing changes there."""
    want = newest_identified(store) if cfg.kinematics.use_identified and _is_canopen(cfg) else None
    rid, model = want if want is not None else (None, None)
    if rid == devices.model_override_result:
        return
    if devices.robot is not None:
        log.info("robot reopened with the kinematic model of result %s", rid)
        devices.close()
    devices.model_override, devices.model_override_result = model, rid


def station_for_check(rec: Any, station: Any) -> Any:
    """A drift check station as a kinematics result predicts it: its flange pose from the
    identified model at the joints read (the result's ``cell_T_base`` and target belong to
    that model, not to the controller's FK); any other result's station unchanged."""
    if getattr(rec, "kind", None) != P.KIND_KINEMATICS or station.q_rad is None:
        return station
    model = identified_model(rec.result)
    if model is None:
        return station
    return dataclasses.replace(station, base_T_flange=np.asarray(model.forward(station.q_rad), dtype=float))
