"""A run of kind ``kinematics``: the arm's own DH geometry identified from tracker stations.

``cellcal.solver`` does the mathematics (``plan_identification_stations``,
``identify_kinematics``; ``docs/kinematics.md``, ADR 0016); :class:`Kinematics` is the
daemon's side:

* **plan**: fit stations then held-out validation stations (``[kinematics] n_stations`` +
  ``n_validation``), planned on the robot's own model (the driver's ``DHModel``) and
  captured like a base-frame run (pose or point, ``[tracker] measure``); the plan records
  how many are fit stations (``plan["identification"]``). A ``[kinematics] parameters``
  request the planned stations cannot determine is refused before the first station
  (:meth:`Kinematics.check_plan`: the identification's own rank test on the nominal
  predictions at the planned joints). Each station (and each ISO 9283 measurement) is
  judged by the run's consensus of a rigid fit with the nominal arm, at twice the
  base-frame bounds (:data:`CONSENSUS_FACTOR`, ADR 0032): a wrong reflector is dropped.
* **solve**: the stored stations -> ``identify_kinematics`` with the run's declared noise
  (``solve.declared_noise``), the parameter set and condition gate; a request the stations
  cannot determine raises ``DegenerateGeometry`` naming the parameters.
* **finish**: the ISO 9283 pose test (``cellcal.daemon.runs.iso9283``), the acceptance gates
  (held-out RMS after identification at most ``[kinematics] max_holdout_rms_mm``, the fit's
  RMS at most ``[solve] max_rms_mm``, the condition number, convergence) and the stored
  record: the base-frame keys every result has (``transforms``, closure figures,
  ``residuals``) plus ``kinematics``: the identified parameters with values, deltas and
  sigmas, the unidentifiable ones with reasons, the condition number, observability, the
  nominal and identified DH arrays and the held-out figures before (nominal arm) and after
  (``cellcal.solver.kinematic_export``'s dictionary).
* **outputs**: ``cellcal show`` lines, the report's identification section and "before"
  residual map (``cellcal.daemon.runs.kinematics_report``), the parameter, URDF and UR
  calibration exports; drift checks predict a station through the identified arm.

Use of the result: for a CiA 402 arm cellcal computes the forward kinematics itself, so with
``[kinematics] use_identified = true`` the active kinematics result's model replaces the
configured one when the robot is opened (:func:`sync_devices_model`): later base-frame runs
and drift checks use it. A UR's controller computes its own FK: the result is reported and
exported (parameters JSON, URDF, the ROS driver's calibration YAML) only.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import SupportsFloat, TypedDict, cast

import numpy as np
import numpy.typing as npt

from cellcal.daemon import consensus, drift, solve
from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import FRAME_CONVENTION, UNCERTAINTY_CONVENTION, as_json, point_to_wire, transform_to_wire
from cellcal.daemon.capture import CaptureEngine, Expected
from cellcal.daemon.config import Config, Export, Plan
from cellcal.daemon.config import Kinematics as KinematicsSection
from cellcal.daemon.consensus import Screened
from cellcal.daemon.devices import CellDevices
from cellcal.daemon.gates import GateCheck, GateContext, GateReport, gates_passed, rms_translation
from cellcal.daemon.runs import iso9283
from cellcal.daemon.runs import kinematics_report as kr
from cellcal.daemon.runs.base import (
    Finished,
    Measure,
    ReportParts,
    ResultBody,
    RunContext,
    RunKind,
    SolverResult,
    as_kinematic,
)
from cellcal.daemon.runs.iso9283 import solver_params, without_iso9283
from cellcal.daemon.runs.kinematics_report import driver_model, identified_model
from cellcal.daemon.runs.plan import PlannedStation, plan_to_dict
from cellcal.daemon.store import ResultRecord, RunRecord, StationRecord, Store
from cellcal.drivers.kinematics import DHModel, kinematics_digest
from cellcal.solver import CalibrationError, DHParameters, KinematicResult, identify_kinematics, plan_identification_stations
from cellcal.solver.kinematic_export import kinematic_parameters_dict
from cellcal.solver.se3 import make_transform

log = logging.getLogger(__name__)

__all__ = ["Kinematics", "driver_model", "identified_model", "newest_identified", "sync_devices_model", "nominal_fit",
           "SOLVER_NAME", "PLAN_KEY", "CONSENSUS_FACTOR"]

#: ``solver`` of a kinematics result (provenance and wire).
SOLVER_NAME = "identify_kinematics"
#: The kinematics run's consensus bounds are this many times ``[tracker] consensus_error_mm``
#: / ``_deg`` (ADR 0032): its stations spread over the whole joint space, and the nominal
#: arm's model error is in their deviations from a rigid fit (the realistic simulated arm:
#: up to 1.4 mm / 0.14 deg over its 70 planned stations; an arm before identification, a
#: few mm), where a base-frame run's stations sit within a few tenths of a millimetre.
CONSENSUS_FACTOR = 2.0


def _limits(plan_cfg: Plan) -> npt.NDArray[np.float64]:
    lo = np.clip(np.asarray(plan_cfg.joint_min_rad, dtype=float), -math.pi, math.pi)
    hi = np.clip(np.asarray(plan_cfg.joint_max_rad, dtype=float), -math.pi, math.pi)
    return np.column_stack([lo, hi])


def make_plan(cfg: Config, model: DHModel | DHParameters,
              cell_T_base: npt.NDArray[np.float64] | None = None) -> list[PlannedStation]:
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
    nominal = solver_params(model)
    plan = plan_identification_stations(
        nominal, k.n_stations, n_validation=k.n_validation, measurement=cfg.tracker.measure,
        cell_T_base=cell_T_base, cell_p_tracker=None if cell_T_base is None else np.zeros(3),
        joint_limits_rad=_limits(cfg.plan), rng=np.random.default_rng(k.seed),
    )
    q = np.vstack([plan.q, plan.validation_q])
    return [PlannedStation(i, q[i].copy(), np.asarray(model.forward(q[i]), dtype=float).reshape(4, 4)) for i in range(len(q))]


#: The key of a kinematics run's plan that records its split (``{"n_fit": int}``).
PLAN_KEY = "identification"


def plan_extra(cfg: Config) -> P.JsonObject:
    """What a kinematics run stores with its plan (merged into the plan's dict): the number of
    fit stations; the rest validate."""
    return {PLAN_KEY: {"n_fit": int(cfg.kinematics.n_stations)}}


#: A target offset on the flange (m) for :func:`check_requested`: off every joint axis, so
#: no parameter is hidden by where the real target sits (that is judged when it is measured).
_GENERIC_TARGET_M = np.array([0.031, 0.047, 0.083])
#: A tracker's noise (m, rad): only the weighting of positions against orientations.
_TRACKER_M, _TRACKER_RAD = 20e-6, math.radians(0.01)


def _map(v: object) -> Mapping[str, object]:
    """A part of a stored plan or record that should be a JSON object (``{}`` when it is not)."""
    return v if isinstance(v, Mapping) else {}


def _n_fit(run_plan: Mapping[str, object], cfg: Config) -> int:
    """How many of a run's planned stations are fit stations (:data:`PLAN_KEY`)."""
    n = _map(run_plan.get(PLAN_KEY) or {}).get("n_fit", cfg.kinematics.n_stations)
    if isinstance(n, (int, float, str)):
        return int(n)
    raise TypeError(f"plan[{PLAN_KEY!r}]['n_fit'] must be a number, got {type(n).__name__}")


def check_requested(run_plan: Mapping[str, object], cfg: Config, model: DHModel) -> None:
    """Refuse, before any station is measured, a ``[kinematics] parameters`` request the
    planned fit stations cannot determine whatever they measure: the identification's own
    rank test (``identify_kinematics``) on what the nominal arm predicts at the planned
    joints, with a generic target offset and no condition gate (both depend on the
    measurements, and are judged on them after the capture).

    Raises
    ------
    DegenerateGeometry
        Naming the requested parameters that are folded into the base or the target,
        redundant, or not excited by the planned stations (as the solve would, 40 stations
        later).
    """
    k = cfg.kinematics
    if not k.parameters:
        return
    n_fit = _n_fit(run_plan, cfg)
    planned = run_plan.get("stations") or []
    fit = [_map(st) for st in (planned if isinstance(planned, (list, tuple)) else [])[:n_fit]]
    q = np.array([st["q_rad"] for st in fit if st.get("q_rad") is not None], dtype=float).reshape(-1, 6)
    if len(q) == 0:
        return
    nominal = solver_params(model)
    pred = nominal.forward(q) @ make_transform(np.eye(3), _GENERIC_TARGET_M)
    if cfg.tracker.measure == "point":
        identify_kinematics(q, nominal, cell_p_target=pred[:, :3, 3], parameters=list(k.parameters),
                            noise_translation_m=_TRACKER_M, max_condition=math.inf)
    else:
        identify_kinematics(q, nominal, cell_T_target=pred, parameters=list(k.parameters),
                            noise_translation_m=_TRACKER_M, noise_rotation_rad=_TRACKER_RAD, max_condition=math.inf)


def solve_run(stations: Sequence[StationRecord], run_plan: Mapping[str, object], cfg: Config,
              model: DHModel) -> KinematicResult:
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
    q, kw = _fit_inputs(stations, run_plan, cfg, validation=True)
    k = cfg.kinematics
    return identify_kinematics(q, solver_params(model), parameters=list(k.parameters) or None,
                               max_condition=k.max_condition, **kw)


class _FitKeywords(TypedDict, total=False):
    """The measurements, declared noise and held-out stations ``identify_kinematics`` takes."""

    cell_T_target_cov: npt.NDArray[np.float64]
    cell_p_target_cov: npt.NDArray[np.float64]
    cell_T_target: npt.NDArray[np.float64]
    cell_p_target: npt.NDArray[np.float64]
    validation_q: npt.NDArray[np.float64]
    validation_cell_T_target: npt.NDArray[np.float64]
    validation_cell_p_target: npt.NDArray[np.float64]


def _fit_inputs(stations: Sequence[StationRecord], run_plan: Mapping[str, object], cfg: Config, *,
                validation: bool) -> tuple[npt.NDArray[np.float64], _FitKeywords]:
    """The fit stations' joints (N, 6) and the keywords of ``identify_kinematics`` (their
    measurements, the declared noise and, with ``validation``, the held-out stations). The
    ISO 9283 pose test's stations are none of them."""
    stations = without_iso9283(stations)
    n_fit = _n_fit(run_plan, cfg)
    fit = [s for s in stations if s.plan_index < n_fit]
    val = [s for s in stations if s.plan_index >= n_fit]
    point = solve.is_point_run(stations)
    for s in stations:
        if s.q_rad is None or len(s.q_rad) != 6:
            raise ValueError(f"station {s.plan_index}: a kinematics run needs the six joint angles")

    def meas(group: Sequence[StationRecord]) -> npt.NDArray[np.float64]:
        if point:
            return np.array([np.asarray(s.cell_p_target, dtype=float).reshape(3) for s in group])
        return np.array([s.cell_T_target for s in group])

    q = np.array([s.q_rad for s in fit], dtype=float)
    kw: _FitKeywords = {**solve.declared_noise(fit, cfg.solve, point=point)}
    if point:
        kw["cell_p_target"] = meas(fit)
    else:
        kw["cell_T_target"] = meas(fit)
    if validation and len(val) >= 3:
        kw["validation_q"] = np.array([s.q_rad for s in val], dtype=float)
        if point:
            kw["validation_cell_p_target"] = meas(val)
        else:
            kw["validation_cell_T_target"] = meas(val)
    return q, kw


def _holdout_gate(result: KinematicResult, k: KinematicsSection) -> GateCheck:
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


def gates(result: KinematicResult, cfg: Config) -> GateReport:
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


def _clean(obj: object) -> P.JsonValue:
    """JSON-safe: non-finite floats (e.g. rotation figures of point stations) become None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    # Strings, ints, bools and None as they are; numpy integers too (kinematic_export writes
    # plain numbers), which the store's JSON encoder writes as the numbers they are.
    return cast(P.JsonValue, obj)


def _clean_object(obj: Mapping[str, object]) -> P.JsonObject:
    """:func:`_clean` of a JSON object."""
    return {str(k): _clean(v) for k, v in obj.items()}


def _f(v: SupportsFloat | None) -> float:
    return float(v) if v is not None and math.isfinite(float(v)) else 0.0


def _matrix(C: npt.NDArray[np.float64]) -> P.JsonObject:
    C = np.asarray(C, dtype=float)
    return {"shape": list(C.shape), "values": [_clean(float(v)) for v in C.reshape(-1)]}


def _root_trace(C: npt.NDArray[np.float64]) -> float | None:
    t = float(np.trace(C))
    return math.sqrt(max(t, 0.0)) if math.isfinite(t) else None


def _uncertainty(result: KinematicResult) -> P.JsonObject:
    """``uncertainty`` in the shape every result has (``protocol.Uncertainty``): covariance of
    ``cell_T_base`` and the target from the identification (the parameters' block under
    ``parameters``, their 1-sigmas in ``kinematics.parameters``); 1-sigma of ``cell_T_base``."""
    est = result.transforms()
    P_ = len(result.estimated)
    base = np.asarray(est["cell_T_base"].covariance, dtype=float)
    return {
        "convention": UNCERTAINTY_CONVENTION,
        "covariance": {name: _matrix(e.covariance) for name, e in est.items()},
        "joint": {"order": list(est), **_matrix(np.asarray(result.covariance, dtype=float)[P_:, P_:])},
        "parameters": {"order": list(result.estimated),
                       **_matrix(np.asarray(result.covariance, dtype=float)[:P_, :P_])},
        "sigma_translation_m": _root_trace(base[:3, :3]),
        "sigma_rotation_rad": _root_trace(base[3:, 3:]),
        "noise_translation_m": None, "noise_rotation_rad": None,  # per station, declared (docs/kinematics.md)
        "noise_source": str(result.noise_source),
        "chi2": _clean(float(result.chi2_per_dof) * int(result.dof)),
        "dof": int(result.dof), "refined": True, "iterations": int(result.iterations),
        "downweighted_stations": [int(i) for i in np.asarray(result.downweighted, dtype=int).reshape(-1)],
    }


def _holdout(result: KinematicResult) -> P.JsonObject | None:
    """``holdout`` in the shape every result has (``protocol.Holdout``): the fit stations'
    linearised leave-one-out closure (the held-out *validation* stations are in
    ``kinematics.validation``)."""
    h = result.holdout
    if h is None:
        return None
    out: P.JsonObject = {"method": str(h.method), "folds": int(h.folds), "inflation": float(h.inflation),
           "translation_m": [float(v) for v in h.translation_m], "rotation_rad": [float(v) for v in h.rotation_rad]}
    for key in ("p50_translation_m", "p90_translation_m", "max_translation_m", "p50_rotation_rad",
                "p90_rotation_rad", "max_rotation_rad"):
        out[key] = float(getattr(h, key))
    return _clean_object(out)


def gate_and_wire(result: KinematicResult, cfg: Config, check_stations: list[P.JsonObject], *,
                  iso9283: Mapping[str, object] | str | None = None,
                  nominal: KinematicResult | None = None) -> tuple[GateReport, P.JsonObject]:
    """The gate report and the record the store keeps (module docstring for its keys).

    ``iso9283``: the pose test's block (``iso9283.iso9283_phase``), stored as
    ``kinematics.iso9283``, or why it was not measured (``kinematics.iso9283_not_measured``);
    None (no pose test was tried): neither key. ``nominal``: :func:`nominal_fit`, stored as
    ``kinematics.nominal_fit`` (its ``transforms`` and ``points``, the report's "before" map).
    """
    report = gates(result, cfg)
    frames = _frames_to_wire(result)
    transforms, points = frames["transforms"], frames["points"]
    rt = np.asarray(result.residuals.translation_m, dtype=float)
    rr = np.asarray(result.residuals.rotation_rad, dtype=float)
    kin: dict[str, object] = kinematic_parameters_dict(result)
    kin["unidentifiable_reasons"] = dict(_map(kin["unidentifiable"]))
    kin["unidentifiable"] = list(result.unidentifiable)
    kin["observability_o1"] = _f(result.observability_o1)
    kin["observability_o3"] = _f(result.observability_o3)
    kin["correlations"] = [[a, b, float(r)] for a, b, r in result.correlations]
    if nominal is not None:
        kin["nominal_fit"] = _frames_to_wire(nominal)
    if isinstance(iso9283, str):
        kin["iso9283_not_measured"] = iso9283
    elif iso9283 is not None:
        kin["iso9283"] = dict(iso9283)
    wire: P.JsonObject = {
        "transforms": transforms, "points": points,
        "n_stations": int(result.n_stations),
        "rms_translation_m": _f(result.rms_translation_m),
        "max_translation_m": _f(rt.max()) if rt.size else 0.0,
        "rms_rotation_rad": _f(math.sqrt(float(np.mean(rr * rr)))) if rr.size else 0.0,
        "max_rotation_rad": _f(rr.max()) if rr.size else 0.0,
        "axis_spread": 1.0,  # the identification's own conditioning is in kinematics.condition_number
        "residuals": {"translation_m": [float(v) for v in rt], "rotation_rad": [float(v) for v in rr]},
        "solver": SOLVER_NAME, "frame_convention": FRAME_CONVENTION,
        # What every result has at the top (the report's summary, ``cellcal show``, the
        # model_error gate's readers): the identification's convergence and warnings.
        "converged": bool(result.converged), "stop_reason": str(result.stop_reason),
        "warnings": _clean(kin.get("warnings") or []),
        "uncertainty": _uncertainty(result), "holdout": _holdout(result),
        "kinematics": _clean_object(kin),
        "gates": report.to_wire(),
        # Drift checks compare the tracker with cell_T_base, the controller's FK and the
        # target: only meaningful where that FK is the identified model (module docstring).
        "check_stations": list[P.JsonValue](check_stations),
    }
    return report, wire


def _is_canopen(cfg: Config) -> bool:
    # The scheme names the backend (cellcal.drivers.robot.BACKENDS): only CiA 402 drives leave
    # the forward kinematics to cellcal.
    return str(cfg.robot.url).lower().startswith("canopen://")


def newest_identified(store: Store, limit: int = 50) -> tuple[int, DHModel] | None:
    """``(result id, DHModel)`` of the newest kinematics result that passed its gates and is
    not suspect, among the ``limit`` newest results; None without one."""
    for rec in store.list_results(limit=limit):
        if rec.kind == P.KIND_KINEMATICS and not rec.suspect and gates_passed(rec.result):
            model = identified_model(rec.result)
            if model is not None:
                return rec.id, model
    return None


#: A point identification measures no orientation: the rotation accuracy is its translation
#: over this lever (m per rad; the solver's model-error link length, ``model_error.LINK_LENGTH_M``).
POINT_ROTATION_LEVER_M = 0.4


def robot_digest(identity: object) -> str | None:
    """The ``kinematics_digest`` of a robot identity (a run's ``devices["robot"]``, a result's
    provenance), or None when it does not tell."""
    d = _map(identity).get("kinematics_digest")
    return d if isinstance(d, str) and d else None


def identified_result(store: Store, robot: object, limit: int = 50) -> ResultRecord | None:
    """The kinematics result whose identified model the robot's forward kinematics is: the
    newest (among the ``limit`` newest results) that passed its gates, is not suspect and
    whose identified model has the ``kinematics_digest`` of ``robot`` (a robot identity, as
    :func:`robot_digest` reads it); None for a robot on other kinematics or of unknown ones."""
    digest = robot_digest(robot)
    if digest is None:
        return None
    for rec in store.list_results(limit=limit):
        if rec.kind != P.KIND_KINEMATICS or rec.suspect or not gates_passed(rec.result):
            continue
        model = identified_model(rec.result)
        if model is not None and kinematics_digest(model) == digest:
            return rec
    return None


def identified_accuracy(store: Store, robot: object, limit: int = 50) -> tuple[float, float, int] | None:
    """The absolute accuracy of an arm whose forward kinematics is an identified model:
    ``(1-sigma per axis m, rad, kinematics result id)`` from that result's held-out
    validation (3-D RMS over sqrt(3); a point identification's rotation from its translation
    over :data:`POINT_ROTATION_LEVER_M`), or None.

    ``robot`` is a run's robot identity (``RunRecord.devices["robot"]``); the result is
    :func:`identified_result`'s, so the figure is the one of the model the run's poses came
    from, never of another arm or an older model."""
    rec = identified_result(store, robot, limit)
    if rec is None:
        return None
    after = _map(_map(_map(rec.result.get("kinematics")).get("validation")).get("after"))
    t, r = after.get("rms_translation_m"), after.get("rms_rotation_rad")
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0.0:
        return None  # no held-out figure: nothing measured to declare
    t_axis = float(t) / math.sqrt(3.0)
    if isinstance(r, (int, float)) and math.isfinite(r) and r > 0.0:
        r_axis = float(r) / math.sqrt(3.0)
    else:
        r_axis = t_axis / POINT_ROTATION_LEVER_M
    return t_axis, r_axis, rec.id


#: Result kinds whose transforms were fitted to the robot's forward kinematics (their poses
#: came from it): a change of the model leaves them in another model's frames.
FK_KINDS = (P.KIND_BASE_FRAME, P.KIND_TOOL_POINT, P.KIND_HAND_EYE, P.KIND_EYE_TO_HAND)


def sync_devices_model(cfg: Config, store: Store, devices: CellDevices,
                       mark_suspect: Callable[[int, str], None] | None = None) -> None:
    """Open the robot with the identified model where cellcal computes its FK (a CiA 402 arm
    with ``[kinematics] use_identified = true``), closing it first when the model changed;
    a UR's controller computes its own FK, so nothing changes there.

    Where cellcal computes the FK, the results fitted to other kinematics than the model in
    use (:data:`FK_KINDS` whose provenance names another ``kinematics_digest``) are marked
    suspect with ``mark_suspect(result_id, reason)`` (default: the store's), at the daemon's
    start (``JobControl.before_open_at_start``) and at every change of model: when the robot
    takes an identified model, and when it goes back to the configured one (``use_identified`` turned off, then or before a
    restart). Their frames are the other model's (the base frame, the target, a camera's
    hand-eye all absorb its errors) and the robot's poses are this one's, so a ``to_base``
    through them would be off by the difference without saying so."""
    want = newest_identified(store) if cfg.kinematics.use_identified and _is_canopen(cfg) else None
    rid, model = want if want is not None else (None, None)
    if rid == devices.model_override_result and devices.kinematics_checked:
        return
    if rid != devices.model_override_result:
        if devices.robot is not None:
            log.info("robot reopened with the kinematic model of result %s", rid)
            devices.close()
        devices.model_override, devices.model_override_result = model, rid
        devices.session.robot_replaced()
    if _is_canopen(cfg):  # a UR's controller computes its own FK
        if model is not None and rid is not None:
            which = f"the identified model of kinematics result {rid}"
            digest = kinematics_digest(model)
        else:
            which = "its configured model: [kinematics] use_identified is off"
            digest = kinematics_digest(devices.configured_model())
        _suspect_other_kinematics(store, which, digest, mark_suspect or store.mark_suspect)
    devices.kinematics_checked = True  # only once the pass is done: a store error repeats it


def _suspect_other_kinematics(store: Store, which: str, digest: str, mark: Callable[[int, str], None],
                              limit: int = 50) -> None:
    for rec in store.list_results(limit=limit):
        if rec.kind not in FK_KINDS or rec.suspect:
            continue
        have = robot_digest(_map(_map(rec.provenance).get("devices")).get(P.DEVICE_ROBOT))
        if have is None or have == digest:
            continue  # unknown kinematics is no evidence; the same model's results stand
        log.warning("result %d was fitted to other kinematics (%s) than the robot now uses (%s): marked suspect",
                    rec.id, have, which)
        mark(rec.id, f"fitted to other kinematics ({have}) than the robot now computes its poses with ({which}): "
                     "recalibrate")




def nominal_fit(stations: Sequence[StationRecord], run_plan: Mapping[str, object], cfg: Config,
                model: DHModel) -> KinematicResult:
    """The nominal arm with its own best rigid base frame and target, fitted on the run's fit
    stations (no kinematic parameter estimated): what a base-frame calibration of the
    nominal arm gives, the "before" of the held-out figures, the pose test and the report."""
    q, kw = _fit_inputs(stations, run_plan, cfg, validation=False)
    return identify_kinematics(q, solver_params(model), parameters=[], max_condition=math.inf, **kw)


def _frames_to_wire(result: KinematicResult) -> P.JsonObject:
    """A fit's base frame and target as the result body carries them."""
    transforms: P.JsonObject = {"cell_T_base": as_json(transform_to_wire("cell_T_base", result.cell_T_base))}
    points: P.JsonObject = {}
    out: P.JsonObject = {"transforms": transforms, "points": points}
    if result.flange_T_target is not None:
        transforms["flange_T_target"] = as_json(transform_to_wire("flange_T_target", result.flange_T_target))
    if result.flange_p_target is not None:
        points["flange_p_target"] = as_json(point_to_wire("flange", result.flange_p_target))
    return out


class Kinematics(RunKind):
    """The arm's DH parameters, ``cell_T_base`` and the target (module docstring)."""

    name = P.KIND_KINEMATICS

    def plan(self, ctx: RunContext, stations: list[PlannedStation] | None = None) -> P.JsonObject:
        return {**plan_to_dict(stations if stations is not None else make_plan(ctx.cfg, ctx.model)), **plan_extra(ctx.cfg)}

    def check_plan(self, ctx: RunContext, run: RunRecord) -> None:
        check_requested(run.plan, ctx.cfg, ctx.model)

    def capture(self, engine: CaptureEngine, planned: PlannedStation, accepted: Sequence[StationRecord],
                abort: threading.Event, expected: Expected | None) -> StationRecord:
        return engine.capture(planned.index, [s.base_T_flange for s in accepted], abort, expected=expected)

    def screen(self, ctx: RunContext, records: Sequence[StationRecord], new: StationRecord) -> Screened | None:
        # The arm's kinematic model is what the run identifies, but a rigid base frame and
        # target fitted with the nominal arm (the base-frame consensus) still describes its
        # stations to within the arm's model error: a coarse screen, its bounds widened by
        # CONSENSUS_FACTOR so that the model error never reaches them (ADR 0032).
        tc = ctx.cfg.tracker
        model = consensus.POINT if new.cell_T_target is None else consensus.POSE
        return consensus.screen(model, records, new, max_error_m=CONSENSUS_FACTOR * tc.consensus_error_m,
                                max_error_rad=CONSENSUS_FACTOR * tc.consensus_error_rad)

    def solve(self, ctx: RunContext, run: RunRecord, stations: Sequence[StationRecord]) -> KinematicResult:
        return solve_run(stations, run.plan, ctx.cfg, ctx.model)

    def finish(self, ctx: RunContext, run: RunRecord, solved: SolverResult, stations: Sequence[StationRecord],
               measure: Measure | None) -> Finished:
        result = as_kinematic(solved)
        # The ISO 9283 pose test measures the identified arm before its result is stored;
        # its stations are stored with the run and are never check stations.
        try:  # the "before" of the pose test and of the report's residual maps
            nominal = nominal_fit(stations, run.plan, ctx.cfg, ctx.model)
        except (CalibrationError, ValueError, np.linalg.LinAlgError) as exc:
            log.warning("run %d: no fit of the nominal arm (%s)", run.id, exc)
            nominal = None
        report = gates(result, ctx.cfg)
        iso = iso9283.iso9283_phase(result, ctx.cfg, ctx.model, stations, measure, can_move=ctx.commands_robot,
                                    refused=report.reason() if not report.passed else "", rigid=nominal)
        checks = drift.choose_check_stations(without_iso9283(stations), run.plan, ctx.cfg.drift.check_stations)
        report, wire = gate_and_wire(result, ctx.cfg, checks, iso9283=iso, nominal=nominal)
        return Finished(report, wire)

    def fit_stations(self, stations: Sequence[StationRecord]) -> list[StationRecord]:
        return without_iso9283(stations)

    def drift_station(self, body: ResultBody, station: StationRecord) -> StationRecord:
        # Its cell_T_base and target belong to the identified arm, not to the controller's FK.
        if station.q_rad is None:
            return station
        model = identified_model(body)
        if model is None:
            return station
        return dataclasses.replace(station, base_T_flange=np.asarray(model.forward(station.q_rad), dtype=float))

    def stations_refusal(self, run: RunRecord) -> str | None:
        return ("its stations need the arm's joint angles and model, and its identified parameters are exported with "
                "its result (result_<id>_kinematics.json)")

    def warnings(self, body: ResultBody) -> list[Mapping[str, object]]:
        # Results stored before the warnings were copied to the top keep them in their block.
        out = super().warnings(body)
        block = body.get("kinematics")
        more = block.get("warnings") if isinstance(block, Mapping) else None
        listed = more if isinstance(more, (list, tuple)) else []
        return out + [w for w in listed if isinstance(w, Mapping) and w not in out]

    def show_lines(self, body: ResultBody) -> list[str]:
        return kr.show_lines(body)

    def report_sections(self, body: ResultBody, stations: Sequence[StationRecord] | None) -> ReportParts:
        return kr.report_parts(body, stations)

    def write_exports(self, directory: Path, result_id: int, body: ResultBody, export: Export) -> dict[str, Path]:
        return kr.write_exports(directory, result_id, body, export)
