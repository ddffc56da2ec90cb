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

* :func:`iso9283_phase`: after an identification that passed its gates, the ISO 9283 pose
  test measured by the devices (``[kinematics] iso9283_cycles``): P1-P5 of
  ``iso9283_test_poses`` in the ``[plan]`` workspace box, commanded as cell poses of the
  target through the identified ``cell_T_base`` and target, reached "before" with joint
  targets from the nominal arm's inverse kinematics (with its own best rigid base and
  target) and "after" from the identified arm's, cycle by cycle in the order P1..P5; each
  measurement moved to, settled and captured like a station and stored with the run at
  plan index :data:`ISO9283_INDEX_BASE` and up, tagged ``raw["iso9283"]``
  (:func:`is_iso9283_station`: never part of a fit, a validation or a drift check). AP and
  RP by ``iso9283_pose_test`` go into ``kinematics.iso9283``; a pose test that cannot be
  made (disabled, refused identification, IK, a move or capture that fails) leaves the
  reason in ``kinematics.iso9283_not_measured`` and the identification stands.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.gates import GateCheck, GateContext, GateReport, rms_translation
from cellcal.daemon.plan import PlannedStation
from cellcal.daemon.report import FRAME_CONVENTION, UNCERTAINTY_CONVENTION, point_to_wire, transform_to_wire
from cellcal.solver import (
    DHParameters,
    identify_kinematics,
    iso9283_commanded,
    iso9283_joint_targets,
    iso9283_pose_test,
    iso9283_test_poses,
    plan_identification_stations,
)
from cellcal.solver.errors import CellcalError
from cellcal.solver.iso9283 import ISO9283_POSE_NAMES, point_tool
from cellcal.solver.kinematic_export import kinematic_parameters_dict
from cellcal.solver.se3 import make_transform

log = logging.getLogger(__name__)

__all__ = ["solver_model", "driver_model", "make_plan", "plan_extra", "solve_run", "gate_and_wire",
           "identified_model", "newest_identified", "sync_devices_model", "station_for_check", "SOLVER_NAME", "PLAN_KEY",
           "iso9283_phase", "plan_iso9283", "ISO9283Plan", "is_iso9283_station", "without_iso9283",
           "ISO9283_INDEX_BASE", "ISO9283_TAG", "ISO9283_PHASES"]

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


#: A target offset on the flange (m) for :func:`check_requested`: off every joint axis, so
#: no parameter is hidden by where the real target sits (that is judged when it is measured).
_GENERIC_TARGET_M = np.array([0.031, 0.047, 0.083])
#: A tracker's noise (m, rad): only the weighting of positions against orientations.
_TRACKER_M, _TRACKER_RAD = 20e-6, math.radians(0.01)


def check_requested(run_plan: Mapping[str, Any], cfg: Any, model: Any) -> None:
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
    n_fit = int((run_plan.get(PLAN_KEY) or {}).get("n_fit", k.n_stations))
    q = np.array([st["q_rad"] for st in (run_plan.get("stations") or [])[:n_fit] if st.get("q_rad") is not None],
                 dtype=float).reshape(-1, 6)
    if len(q) == 0:
        return
    nominal = solver_model(model)
    pred = nominal.forward(q) @ make_transform(np.eye(3), _GENERIC_TARGET_M)
    if cfg.tracker.measure == "point":
        identify_kinematics(q, nominal, cell_p_target=pred[:, :3, 3], parameters=list(k.parameters),
                            noise_translation_m=_TRACKER_M, max_condition=math.inf)
    else:
        identify_kinematics(q, nominal, cell_T_target=pred, parameters=list(k.parameters),
                            noise_translation_m=_TRACKER_M, noise_rotation_rad=_TRACKER_RAD, max_condition=math.inf)


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
    q, kw = _fit_inputs(stations, run_plan, cfg, validation=True)
    k = cfg.kinematics
    return identify_kinematics(q, solver_model(model), parameters=list(k.parameters) or None,
                               max_condition=k.max_condition, **kw)


def _fit_inputs(stations: Sequence[Any], run_plan: Mapping[str, Any], cfg: Any, *,
                validation: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """The fit stations' joints (N, 6) and the keywords of ``identify_kinematics`` (their
    measurements, the declared noise and, with ``validation``, the held-out stations). The
    ISO 9283 pose test's stations are none of them."""
    from cellcal.daemon.solve import declared_noise, is_point_run

    stations = without_iso9283(stations)
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
    if validation and len(val) >= 3:
        kw["validation_q"] = np.array([s.q_rad for s in val], dtype=float)
        kw["validation_" + key] = meas(val)
    return q, kw


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


def _matrix(C: np.ndarray) -> dict[str, Any]:
    C = np.asarray(C, dtype=float)
    return {"shape": list(C.shape), "values": [_clean(float(v)) for v in C.reshape(-1)]}


def _root_trace(C: np.ndarray) -> float | None:
    t = float(np.trace(C))
    return math.sqrt(max(t, 0.0)) if math.isfinite(t) else None


def _uncertainty(result: Any) -> dict[str, Any]:
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


def _holdout(result: Any) -> dict[str, Any] | None:
    """``holdout`` in the shape every result has (``protocol.Holdout``): the fit stations'
    linearised leave-one-out closure (the held-out *validation* stations are in
    ``kinematics.validation``)."""
    h = result.holdout
    if h is None:
        return None
    out = {"method": str(h.method), "folds": int(h.folds), "inflation": float(h.inflation),
           "translation_m": [float(v) for v in h.translation_m], "rotation_rad": [float(v) for v in h.rotation_rad]}
    for key in ("p50_translation_m", "p90_translation_m", "max_translation_m", "p50_rotation_rad",
                "p90_rotation_rad", "max_rotation_rad"):
        out[key] = float(getattr(h, key))
    return _clean(out)


def gate_and_wire(result: Any, cfg: Any, check_stations: list[dict[str, Any]], *,
                  iso9283: Mapping[str, Any] | str | None = None,
                  nominal: Any = None) -> tuple[GateReport, dict[str, Any]]:
    """The gate report and the record the store keeps (module docstring for its keys).

    ``iso9283``: the pose test's block (:func:`iso9283_phase`), stored as
    ``kinematics.iso9283``, or why it was not measured (``kinematics.iso9283_not_measured``);
    None (no pose test was tried): neither key. ``nominal``: :func:`nominal_fit`, stored as
    ``kinematics.nominal_fit`` (its ``transforms`` and ``points``, the report's "before" map).
    """
    report = gates(result, cfg)
    frames = _frames_to_wire(result)
    transforms, points = frames["transforms"], frames["points"]
    rt = np.asarray(result.residuals.translation_m, dtype=float)
    rr = np.asarray(result.residuals.rotation_rad, dtype=float)
    kin = kinematic_parameters_dict(result)
    kin["unidentifiable_reasons"] = dict(kin["unidentifiable"])
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
        "uncertainty": _uncertainty(result), "holdout": _holdout(result),
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
    devices.session.robot_replaced()


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


# ---- the ISO 9283 pose test (module docstring) ----------------------------------------------

#: Plan index of the pose test's first measurement; a run's own plan (``[kinematics]
#: n_stations + n_validation``, at most 2000) never reaches it.
ISO9283_INDEX_BASE = 1_000_000
#: The key of a pose-test station's ``raw`` dict: ``{"phase", "cycle", "pose"}``.
ISO9283_TAG = "iso9283"
#: The two halves of the test: joint targets from the nominal arm, then the identified one.
ISO9283_PHASES = ("before", "after")


def is_iso9283_station(station: Any) -> bool:
    """True for a measurement of the ISO 9283 pose test (never a fit or validation station)."""
    raw = getattr(station, "raw", None)
    tagged = isinstance(raw, Mapping) and ISO9283_TAG in raw
    return tagged or int(getattr(station, "plan_index", 0)) >= ISO9283_INDEX_BASE


def without_iso9283(stations: Sequence[Any]) -> list[Any]:
    """A run's stations without the pose test's: those a fit, a report's residuals and a
    drift check's choice are made of."""
    return [s for s in stations if not is_iso9283_station(s)]


def _iso_index(phase: int, cycle: int, pose: int, cycles: int) -> int:
    return ISO9283_INDEX_BASE + (phase * cycles + cycle) * len(ISO9283_POSE_NAMES) + pose


@dataclasses.dataclass(frozen=True)
class ISO9283Plan:
    """What the pose test commands (:func:`plan_iso9283`).

    Attributes
    ----------
    commanded : numpy.ndarray, shape (5, 4, 4)
        P1-P5 as poses of the target in the cell (point targets: the point with the
        flange's orientation), through the identified ``cell_T_base`` and target.
    q : dict of str to numpy.ndarray, shape (5, 6)
        Joint targets per phase (:data:`ISO9283_PHASES`), rad.
    cube_centre_m : numpy.ndarray, shape (3,)
        Base frame, m.
    cube_side_m : float
    point : bool
        3-DoF measurements: positions only.
    """

    commanded: np.ndarray
    q: dict[str, np.ndarray]
    cube_centre_m: np.ndarray
    cube_side_m: float
    point: bool


def _cube(cfg: Any) -> tuple[np.ndarray, float | None, float]:
    """The cube's centre (base frame), its configured side (None: the largest) and the largest
    side that keeps it inside the ``[plan]`` workspace box, m."""
    lo = np.asarray(cfg.plan.workspace_min_m, dtype=float)
    hi = np.asarray(cfg.plan.workspace_max_m, dtype=float)
    k = cfg.kinematics
    centre = np.asarray(k.iso9283_cube_centre_m, dtype=float) if len(k.iso9283_cube_centre_m) else 0.5 * (lo + hi)
    room = 2.0 * float(np.min(np.minimum(centre - lo, hi - centre)))
    if room <= 0.0:
        raise ValueError(f"the cube centre {np.round(centre * 1e3, 1).tolist()} mm is outside the [plan] workspace box")
    side = float(k.iso9283_cube_side_m) or None
    if side is not None and side > room + 1e-12:
        raise ValueError(f"a cube of side {side * 1e3:g} mm about {np.round(centre * 1e3, 1).tolist()} mm leaves the "
                         f"[plan] workspace box (at most {room * 1e3:.1f} mm there)")
    return centre, side, room


def _tool(result: Any) -> np.ndarray:
    """A result's target as a tool frame on the flange (a point: with the flange's orientation)."""
    if result.flange_T_target is not None:
        return np.asarray(result.flange_T_target, dtype=float)
    if result.flange_p_target is None:
        raise ValueError("the identification has no target on the flange")
    return point_tool(result.flange_p_target)


def nominal_fit(stations: Sequence[Any], run_plan: Mapping[str, Any], cfg: Any, model: Any) -> Any:
    """The nominal arm with its own best rigid base frame and target, fitted on the run's fit
    stations (no kinematic parameter estimated): what a base-frame calibration of the
    nominal arm gives, the "before" of the held-out figures, the pose test and the report."""
    q, kw = _fit_inputs(stations, run_plan, cfg, validation=False)
    return identify_kinematics(q, solver_model(model), parameters=[], max_condition=math.inf, **kw)


def _frames_to_wire(result: Any) -> dict[str, Any]:
    """A fit's base frame and target as the result body carries them."""
    out: dict[str, Any] = {"transforms": {"cell_T_base": transform_to_wire("cell_T_base", result.cell_T_base)},
                           "points": {}}
    if result.flange_T_target is not None:
        out["transforms"]["flange_T_target"] = transform_to_wire("flange_T_target", result.flange_T_target)
    if result.flange_p_target is not None:
        out["points"]["flange_p_target"] = point_to_wire("flange", result.flange_p_target)
    return out


def plan_iso9283(result: Any, stations: Sequence[Any], run_plan: Mapping[str, Any], cfg: Any,
                 model: Any, *, rigid: Any = None) -> ISO9283Plan:
    """P1-P5 and the joint targets of both phases for an identification ``result``.

    The test poses are planned on the nominal arm (flange down, the largest reachable cube
    about ``[kinematics] iso9283_cube_centre_mm`` inside the ``[plan]`` workspace box) and
    commanded in the cell through the identified base frame and target. "before": the
    nominal arm's inverse kinematics with its own best rigid base and target, fitted on the
    run's fit stations (what a base-frame calibration of the nominal arm commands);
    "after": the identified arm's with the identified base and target. ``rigid``: that
    fit (:func:`nominal_fit`) if the caller has it, else fitted here.

    Raises
    ------
    ValueError
        Naming why the poses cannot be commanded (outside the box, out of reach, outside
        the ``[plan]`` joint limits).
    """
    nominal = solver_model(model)
    centre, side, room = _cube(cfg)
    poses = iso9283_test_poses(nominal, cube_centre_m=centre, cube_side_m=side, max_side_m=room)
    point = result.flange_T_target is None
    tool = _tool(result)
    commanded = iso9283_commanded(poses.base_T_flange, result.cell_T_base, tool)
    if rigid is None:
        rigid = nominal_fit(stations, run_plan, cfg, model)
    rigid_tool = _tool(rigid)
    targets: dict[str, np.ndarray] = {}
    for phase, (m, base, t) in zip(ISO9283_PHASES, ((nominal, rigid.cell_T_base, rigid_tool),
                                                    (result.model, result.cell_T_base, tool)), strict=True):
        try:
            targets[phase] = iso9283_joint_targets(commanded, m, base, t, poses.q)
        except ValueError as exc:
            raise ValueError(f"{phase}: inverse kinematics failed ({exc})") from None
        lo, hi = np.asarray(cfg.plan.joint_min_rad, float), np.asarray(cfg.plan.joint_max_rad, float)
        bad = np.argwhere((targets[phase] < lo) | (targets[phase] > hi))
        if bad.size:
            j, i = bad[0]
            raise ValueError(f"{phase}: {ISO9283_POSE_NAMES[j]} needs joint {i + 1} at "
                             f"{math.degrees(targets[phase][j, i]):.1f} deg, outside the [plan] joint limits")
    return ISO9283Plan(commanded=commanded, q=targets, cube_centre_m=np.asarray(poses.cube_centre_m, dtype=float),
                       cube_side_m=float(poses.cube_side_m), point=point)


#: ``measure(planned, tag)``: move to a planned station, capture and store it tagged; raise
#: ``StationRejected`` / ``DeviceFault`` when it cannot (the service's retries are inside).
Measure = Callable[[PlannedStation, dict[str, Any]], Any]


def _figures(r: Any, point: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"max_ap_m": float(r.max_ap_m), "max_rp_m": float(r.max_rp_m),
                           "ap_m": [float(v) for v in r.ap_m], "rp_m": [float(v) for v in r.rp_m]}
    if not point:
        out["ap_abc_rad"] = [[float(v) for v in row] for row in r.ap_abc_rad]
        out["rp_abc_rad"] = [[float(v) for v in row] for row in r.rp_abc_rad]
    return out


def iso9283_phase(result: Any, cfg: Any, model: Any, stations: Sequence[Any], run_plan: Mapping[str, Any],
                  measure: Measure, *, can_move: bool = True, nominal: Any = None) -> dict[str, Any] | str:
    """The ISO 9283 pose test of a kinematics run, measured (module docstring).

    Parameters
    ----------
    result : cellcal.solver.KinematicResult
    cfg : Config
    model : DHModel
        The robot's nominal kinematics (the controller's).
    stations : sequence of StationRecord
        The run's stored stations: pose-test measurements already among them (a resumed
        run) are used, not measured again.
    run_plan : dict
        The run's stored plan (its fit/validation split).
    measure : callable
        ``measure(planned, tag) -> StationRecord`` (the service's capture path).
    can_move : bool
        False in ``observe`` motion mode: the daemon commands no pose, so no test.
    nominal : cellcal.solver.KinematicResult, optional
        :func:`nominal_fit` of these stations, if the caller has it (else fitted here).

    Returns
    -------
    dict or str
        The ``kinematics.iso9283`` block, or why the test was not measured. Abort
        propagates from ``measure``. A test not measured is logged with
        its reason.
    """
    out = _iso9283_phase(result, cfg, model, stations, run_plan, measure, can_move=can_move, nominal=nominal)
    if isinstance(out, str):
        (log.info if int(cfg.kinematics.iso9283_cycles) == 0 else log.warning)("ISO 9283 not measured: %s", out)
    else:
        log.info("ISO 9283 pose test, %d cycles: max AP %.4f mm before, %.4f mm after identification", out["cycles"],
                 out["before"]["max_ap_m"] * 1e3, out["after"]["max_ap_m"] * 1e3)
    return out


def _iso9283_phase(result: Any, cfg: Any, model: Any, stations: Sequence[Any], run_plan: Mapping[str, Any],
                   measure: Measure, *, can_move: bool = True, nominal: Any = None) -> dict[str, Any] | str:
    k = cfg.kinematics
    cycles = int(k.iso9283_cycles)
    if cycles == 0:
        return "disabled ([kinematics] iso9283_cycles = 0)"
    if not can_move:
        return "the daemon does not move the robot in observe mode, so it cannot command the test poses"
    report = gates(result, cfg)
    if not report.passed:
        return f"the identification failed its gates ({report.reason()}); its model was not tested"
    try:
        plan = plan_iso9283(result, stations, run_plan, cfg, model, rigid=nominal)
    except (ValueError, CellcalError) as exc:
        return f"the test poses cannot be commanded: {exc}"
    done = {s.plan_index: s for s in stations if is_iso9283_station(s)}
    n_pose = len(ISO9283_POSE_NAMES)
    attained = {ph: np.empty((cycles, n_pose) + ((3,) if plan.point else (4, 4))) for ph in ISO9283_PHASES}
    indices: dict[str, list[int]] = {ph: [] for ph in ISO9283_PHASES}
    stored = 0
    for p_i, phase in enumerate(ISO9283_PHASES):
        for c in range(cycles):
            for j, name in enumerate(ISO9283_POSE_NAMES):  # the standard's order, every cycle
                idx = _iso_index(p_i, c, j, cycles)
                rec = done.get(idx)
                tag = {"phase": phase, "cycle": c + 1, "pose": name}
                if rec is not None and (rec.raw or {}).get(ISO9283_TAG) != tag:
                    # Stored before a restart with another iso9283_cycles: not this test's.
                    return (f"station {idx} of this run was measured as {(rec.raw or {}).get(ISO9283_TAG)}, not "
                            f"{tag}: [kinematics] iso9283_cycles changed while the run was interrupted")
                if rec is None:
                    q = plan.q[phase][j]
                    ps = PlannedStation(idx, q.copy(), np.asarray(model.forward(q), dtype=float).reshape(4, 4))
                    try:
                        rec = measure(ps, tag)
                    except (cap.StationRejected, cap.DeviceFault) as exc:
                        return (f"{phase} cycle {c + 1} of {cycles}, {name}: {exc} ({stored} pose-test measurements "
                                "were stored with the run)")
                stored += 1
                indices[phase].append(idx)
                m = rec.cell_p_target if plan.point else rec.cell_T_target
                if m is None:
                    return f"{phase} cycle {c + 1}, {name}: station {idx} has no {'point' if plan.point else 'pose'}"
                attained[phase][c, j] = np.asarray(m, dtype=float)
    commanded = plan.commanded[:, :3, 3] if plan.point else plan.commanded
    block: dict[str, Any] = {
        "cycles": cycles, "cube_side_m": plan.cube_side_m,
        "cube_centre_m": [float(v) for v in plan.cube_centre_m],
        "measurement": "point" if plan.point else "pose", "poses": list(ISO9283_POSE_NAMES),
        "commanded_cell_m": [[float(v) for v in T[:3, 3]] for T in plan.commanded],
        "plan_indices": indices,
    }
    for phase in ISO9283_PHASES:
        block[phase] = dict(_figures(iso9283_pose_test(commanded, attained[phase]), plan.point),
                            model="nominal" if phase == "before" else "identified")
    return block
