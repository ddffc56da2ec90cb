"""The ISO 9283 pose test of a kinematics run: P1-P5 measured before and after identification.

After an identification that passed its gates, the test (``[kinematics] iso9283_cycles``):
P1-P5 of ``iso9283_test_poses`` in the ``[plan]`` workspace box, commanded as cell poses of
the target through the identified ``cell_T_base`` and target, reached "before" with joint
targets from the nominal arm's inverse kinematics (with its own best rigid base and target)
and "after" from the identified arm's, cycle by cycle in the order P1..P5; each measurement
moved to, settled and captured like a station and stored with the run at plan index
:data:`ISO9283_INDEX_BASE` and up, tagged ``raw["iso9283"]`` (:func:`is_iso9283_station`:
never part of a fit, a validation or a drift check). AP and RP by ``iso9283_pose_test`` go
into ``kinematics.iso9283``; a pose test that cannot be made (disabled, refused
identification, IK, a move or capture that fails) leaves the reason in
``kinematics.iso9283_not_measured`` and the identification stands.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.runs.base import Measure
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.daemon.store import StationRecord
from cellcal.drivers.kinematics import DHModel
from cellcal.solver import (
    DHParameters,
    ISO9283Result,
    KinematicResult,
    iso9283_commanded,
    iso9283_joint_targets,
    iso9283_pose_test,
    iso9283_test_poses,
)
from cellcal.solver.errors import CellcalError
from cellcal.solver.iso9283 import ISO9283_POSE_NAMES, point_tool

log = logging.getLogger(__name__)

__all__ = ["iso9283_phase", "plan_iso9283", "ISO9283Plan", "is_iso9283_station", "without_iso9283",
           "solver_params", "ISO9283_INDEX_BASE", "ISO9283_TAG", "ISO9283_PHASES"]


def solver_params(model: DHModel | DHParameters) -> DHParameters:
    """The drivers' ``DHModel`` (six joints) as the solver's :class:`DHParameters` (m, rad)."""
    if isinstance(model, DHParameters):
        return model
    if model.n_joints != 6:
        raise ValueError(f"kinematic identification needs a six-joint arm, the model has {model.n_joints}")
    return DHParameters(a=model.a_m, d=model.d_m, alpha=model.alpha_rad, theta=model.theta_offset_rad,
                        beta=model.beta_rad, name=str(model.name or "custom"))


#: Plan index of the pose test's first measurement; a run's own plan (``[kinematics]
#: n_stations + n_validation``, at most 2000) never reaches it.
ISO9283_INDEX_BASE = 1_000_000
#: The key of a pose-test station's ``raw`` dict: ``{"phase", "cycle", "pose"}``.
ISO9283_TAG = "iso9283"
#: The two halves of the test: joint targets from the nominal arm, then the identified one.
ISO9283_PHASES = ("before", "after")


def is_iso9283_station(station: StationRecord | Mapping[str, object]) -> bool:
    """True for a measurement of the ISO 9283 pose test (never a fit or validation station)."""
    raw = getattr(station, "raw", None)
    tagged = isinstance(raw, Mapping) and ISO9283_TAG in raw
    return tagged or int(getattr(station, "plan_index", 0)) >= ISO9283_INDEX_BASE


def without_iso9283(stations: Sequence[StationRecord]) -> list[StationRecord]:
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

    commanded: npt.NDArray[np.float64]
    q: dict[str, npt.NDArray[np.float64]]
    cube_centre_m: npt.NDArray[np.float64]
    cube_side_m: float
    point: bool


def _cube(cfg: Config) -> tuple[npt.NDArray[np.float64], float | None, float]:
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


def _tool(result: KinematicResult) -> npt.NDArray[np.float64]:
    """A result's target as a tool frame on the flange (a point: with the flange's orientation)."""
    if result.flange_T_target is not None:
        return np.asarray(result.flange_T_target, dtype=float)
    if result.flange_p_target is None:
        raise ValueError("the identification has no target on the flange")
    return point_tool(result.flange_p_target)


def plan_iso9283(result: KinematicResult, cfg: Config, nominal: DHParameters, rigid: KinematicResult) -> ISO9283Plan:
    """P1-P5 and the joint targets of both phases for an identification ``result``.

    The test poses are planned on the nominal arm (flange down, the largest reachable cube
    about ``[kinematics] iso9283_cube_centre_mm`` inside the ``[plan]`` workspace box) and
    commanded in the cell through the identified base frame and target. "before": the
    nominal arm's inverse kinematics with its own best rigid base and target, fitted on the
    run's fit stations (what a base-frame calibration of the nominal arm commands);
    "after": the identified arm's with the identified base and target. ``nominal``: the
    nominal arm; ``rigid``: its fit (``kinematics.nominal_fit``).

    Raises
    ------
    ValueError
        Naming why the poses cannot be commanded (outside the box, out of reach, outside
        the ``[plan]`` joint limits).
    """
    centre, side, room = _cube(cfg)
    poses = iso9283_test_poses(nominal, cube_centre_m=centre, cube_side_m=side, max_side_m=room)
    point = result.flange_T_target is None
    tool = _tool(result)
    commanded = iso9283_commanded(poses.base_T_flange, result.cell_T_base, tool)
    rigid_tool = _tool(rigid)
    targets: dict[str, npt.NDArray[np.float64]] = {}
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


def _figures(r: ISO9283Result, point: bool) -> P.JsonObject:
    out: P.JsonObject = {"max_ap_m": float(r.max_ap_m), "max_rp_m": float(r.max_rp_m),
                           "ap_m": [float(v) for v in r.ap_m], "rp_m": [float(v) for v in r.rp_m]}
    if not point:
        out["ap_abc_rad"] = [[float(v) for v in row] for row in r.ap_abc_rad]
        out["rp_abc_rad"] = [[float(v) for v in row] for row in r.rp_abc_rad]
    return out


def iso9283_phase(result: KinematicResult, cfg: Config, model: DHModel, stations: Sequence[StationRecord],
                  measure: Measure | None, *, can_move: bool, refused: str, rigid: KinematicResult | None
                  ) -> P.JsonObject | str:
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
    measure : Measure or None
        The capture path (``runs.base.Measure``); None: the daemon cannot measure.
    can_move : bool
        False in ``observe`` motion mode: the daemon commands no pose, so no test.
    refused : str
        Why the identification failed its gates ("" when it passed): its model is then not tested.
    rigid : cellcal.solver.KinematicResult or None
        The nominal arm's own best rigid fit of these stations (``kinematics.nominal_fit``);
        None when it could not be made.

    Returns
    -------
    dict or str
        The ``kinematics.iso9283`` block, or why the test was not measured. Abort
        propagates from ``measure``. A test not measured is logged with
        its reason.
    """
    out = _iso9283_phase(result, cfg, model, stations, measure, can_move=can_move, refused=refused, rigid=rigid)
    if isinstance(out, str):
        (log.info if int(cfg.kinematics.iso9283_cycles) == 0 else log.warning)("ISO 9283 not measured: %s", out)
    else:
        log.info("ISO 9283 pose test, %d cycles: max AP %.4f mm before, %.4f mm after identification", out["cycles"],
                 _max_ap_m(out, "before") * 1e3, _max_ap_m(out, "after") * 1e3)
    return out


def _max_ap_m(block: P.JsonObject, phase: str) -> float:
    """The worst AP of one phase of the block :func:`_iso9283_phase` built (m)."""
    figures = block.get(phase)
    v = figures.get("max_ap_m") if isinstance(figures, dict) else None
    return float(v) if isinstance(v, (int, float)) else math.nan


def _iso9283_phase(result: KinematicResult, cfg: Config, model: DHModel, stations: Sequence[StationRecord],
                   measure: Measure | None, *, can_move: bool, refused: str, rigid: KinematicResult | None
                   ) -> P.JsonObject | str:
    k = cfg.kinematics
    cycles = int(k.iso9283_cycles)
    if cycles == 0:
        return "disabled ([kinematics] iso9283_cycles = 0)"
    if not can_move or measure is None:
        return "the daemon does not move the robot in observe mode, so it cannot command the test poses"
    if refused:
        return f"the identification failed its gates ({refused}); its model was not tested"
    if rigid is None:
        return "the nominal arm's own rigid fit of these stations could not be made (no \"before\" to command)"
    try:
        plan = plan_iso9283(result, cfg, solver_params(model), rigid)
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
                tag: P.JsonObject = {"phase": phase, "cycle": c + 1, "pose": name}
                if rec is not None and (rec.raw or {}).get(ISO9283_TAG) != tag:
                    # Stored before a restart with another iso9283_cycles: not this test's.
                    return (f"station {idx} of this run was measured as {(rec.raw or {}).get(ISO9283_TAG)}, not "
                            f"{tag}: [kinematics] iso9283_cycles changed while the run was interrupted")
                if rec is None:
                    q = plan.q[phase][j]
                    ps = PlannedStation(idx, q.copy(), np.asarray(model.forward(q), dtype=float).reshape(4, 4))
                    try:
                        rec = measure(ps, {ISO9283_TAG: tag}, "ISO 9283 pose test")
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
    block: P.JsonObject = {
        "cycles": cycles, "cube_side_m": plan.cube_side_m,
        "cube_centre_m": [float(v) for v in plan.cube_centre_m],
        "measurement": "point" if plan.point else "pose", "poses": list(ISO9283_POSE_NAMES),
        "commanded_cell_m": [[float(v) for v in T[:3, 3]] for T in plan.commanded],
        "plan_indices": {ph: list(ix) for ph, ix in indices.items()},
    }
    for phase in ISO9283_PHASES:
        block[phase] = dict(_figures(iso9283_pose_test(commanded, attained[phase]), plan.point),
                            model="nominal" if phase == "before" else "identified")
    return block
