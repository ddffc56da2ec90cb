"""The tracker check of a camera hand-eye result: an independent instrument in the same run (ADR 0031).

With ``[camera.hand_eye] tracker_target_mm`` (the tracker's target, a reflector or a 6-DoF
target, where it sits on the camera's calibration target: the target's frame) and the
tracker open, each camera station of an ``eye_to_hand`` run also measures the tracker while
the robot still rests (:func:`with_tracker`: the capture engine's own tracker station, its
windows and consistency checks; the robot must not have moved between the frame and the
measurement). The finished result then predicts each measured point through the camera
chain alone, ``cell_T_base @ base_T_camera @ camera_T_target_v @ target_p`` (the view's own
PnP pose, not the robot's), with ``cell_T_base`` from the newest base-frame result that
passed its gates and is not suspect (its covariance carried), and compares it with the
tracker (``cellcal.solver.camera_checks.tracker_check``: a chi-square over all points at 0.1 %
and per point, with the result's, ``cell_T_base``'s, the PnP's and the tracker's covariance).

Eye-in-hand, with ``[camera.hand_eye] tracker_flange_target = true``, each camera station
measures the tracker's target on the flange (the one a base-frame run measures), and the
result predicts it where the camera's view of the static board puts the flange,
``cell_T_base @ base_T_target @ camera_T_target_v^-1 @ flange_T_camera^-1 @ flange_p``
(``via="flange"``: the view's PnP, not the robot's pose), with ``cell_T_base`` and the flange
point (``flange_T_target``'s origin, or a point calibration's ``flange_p_target``) from the
same base-frame result, both covariances carried.

The base frame must be in the gauge of the run's poses: a base-frame result computed with the
same kinematics as the run's robot (its provenance's ``kinematics_digest``), or, when the
robot's poses come from an identified model (a CiA 402 arm with ``[kinematics]
use_identified``), the kinematics result that identified it (its ``cell_T_base`` and target
are that model's). A base-frame result of other kinematics (the nominal arm before the
identification, another table) would put the check's closure off by the difference and blame
the camera for it: it is not used.

The check is a gate of its own (``tracker_check``); without such a result, tracker
points or a configured target it does not run, and the record says why.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon import solve
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.capture import CaptureEngine
from cellcal.daemon.config import Config
from cellcal.daemon.config.camera import MOUNTING_EYE_IN_HAND, MOUNTING_EYE_TO_HAND
from cellcal.daemon.consistency import StationRejected
from cellcal.daemon.gates import GateCheck, gates_passed
from cellcal.daemon.runs.kinematics import identified_result, robot_digest
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.daemon.store import StationRecord, Store
from cellcal.solver.camera_checks import tracker_check
from cellcal.solver.camera_results import CameraChainResult

log = logging.getLogger(__name__)

__all__ = ["with_tracker", "tracker_point", "check_record", "tracker_gate", "TRACKER_KEY"]

#: The key of a camera station's ``raw`` telling how its tracker point went.
TRACKER_KEY = "tracker_check"


def _map(v: object) -> Mapping[str, object]:
    return v if isinstance(v, Mapping) else {}


def wanted(cfg: Config, setup: str) -> bool:
    """Whether the run's camera stations measure the tracker too."""
    if cfg.camera is None:
        return False
    if setup == MOUNTING_EYE_IN_HAND:
        return bool(cfg.camera.hand_eye.tracker_flange_target)
    return setup == MOUNTING_EYE_TO_HAND and len(cfg.camera.hand_eye.tracker_target_m) == 3


def with_tracker(engine: CaptureEngine, station: StationRecord, planned: PlannedStation,
                 abort: threading.Event) -> StationRecord:
    """The camera ``station`` with the tracker's measurement of its target at the same rest
    (module docstring). A tracker that refuses (beam broken, target not seen) or is not open
    leaves the station without a tracker point, said in its ``raw``; a tracker link failure
    is the tracker's ``DeviceFault`` as for every station."""
    if engine.tracker is None:
        return dataclasses.replace(station, raw={**station.raw, TRACKER_KEY: "no tracker open"})
    try:
        trk = engine.capture(planned.index, [], abort)
    except StationRejected as rej:
        log.info("station %d: no tracker point (%s)", planned.index, rej)
        return dataclasses.replace(station, raw={**station.raw, TRACKER_KEY: f"tracker refused: {rej}"})
    c = engine.cfg.capture
    moved = float(np.linalg.norm(trk.base_T_flange[:3, 3] - station.base_T_flange[:3, 3]))
    if moved > c.min_pose_change_m:
        return dataclasses.replace(station, raw={**station.raw, TRACKER_KEY: (
            f"the robot moved {moved * 1e3:.3f} mm between the frame and the tracker's measurement")})
    p = trk.cell_p_target if trk.cell_p_target is not None else None
    if p is None and trk.cell_T_target is not None:
        p = np.asarray(trk.cell_T_target, dtype=float)[:3, 3]
    return dataclasses.replace(
        station, cell_T_target=trk.cell_T_target, cell_p_target=p,
        tracker_std_translation_m=trk.tracker_std_translation_m, tracker_std_rotation_rad=trk.tracker_std_rotation_rad,
        sample_count=trk.sample_count, tracker_t_device_s=trk.tracker_t_device_s, tracker_t_host_ns=trk.tracker_t_host_ns,
        raw={**trk.raw, **station.raw, TRACKER_KEY: "measured"})


def tracker_point(station: StationRecord) -> npt.NDArray[np.float64] | None:
    """The station's tracker point (cell frame, m), or None."""
    if station.cell_p_target is not None:
        return np.asarray(station.cell_p_target, dtype=float).reshape(3)
    if station.cell_T_target is not None:
        return np.asarray(station.cell_T_target, dtype=float)[:3, 3]
    return None


@dataclasses.dataclass(frozen=True)
class _BaseFrame:
    """What the check takes of a base-frame result: its id, ``cell_T_base`` with its 6x6
    covariance, and the tracker's target on the flange (flange frame, m: ``flange_T_target``'s
    origin or a point calibration's ``flange_p_target``; None: not in it) with its 3x3
    covariance (None: not given)."""

    result_id: int
    cell_T_base: npt.NDArray[np.float64]
    cell_T_base_cov: npt.NDArray[np.float64] | None
    flange_p: npt.NDArray[np.float64] | None
    flange_p_cov: npt.NDArray[np.float64] | None
    #: cross-covariance (6, 3) of ``cell_T_base``'s right perturbation and ``flange_p`` from
    #: the fit's joint covariance (None: not on the wire)
    cross_cov: npt.NDArray[np.float64] | None = None


def _base_frame(store: Store, robot: Mapping[str, object] | None = None,
                limit: int = 50) -> tuple[_BaseFrame | None, list[int]]:
    """The newest result that passed its gates, is not suspect and gives ``cell_T_base`` in the
    gauge of ``robot`` (the run's robot identity; module docstring): a base-frame result of
    the same kinematics digest (either digest unknown: taken), or a kinematics result whose
    identified model has the robot's digest. Also the ids of base-frame results passed over
    for other kinematics."""
    want = robot_digest(robot)
    identified = identified_result(store, robot, limit)
    other: list[int] = []
    for rec in store.list_results(limit=limit):
        if rec.suspect or not gates_passed(rec.result):
            continue
        if rec.kind == P.KIND_BASE_FRAME:
            have = robot_digest(_map(_map(rec.provenance).get("devices")).get(P.DEVICE_ROBOT))
            if want is not None and have is not None and have != want:
                other.append(int(rec.id))
                continue
        elif identified is None or rec.id != identified.id:
            continue
        tr = _map(rec.result.get("transforms"))
        if "cell_T_base" not in tr:
            continue
        covs = _map(_map(rec.result.get("uncertainty")).get("covariance"))
        p: npt.NDArray[np.float64] | None = None
        Cp: npt.NDArray[np.float64] | None = None
        cross: npt.NDArray[np.float64] | None = None
        joint = _map(_map(rec.result.get("uncertainty")).get("joint"))
        if "flange_T_target" in tr:
            Y = transform_from_wire(_map(tr["flange_T_target"]))
            p = Y[:3, 3]
            C6 = _cov(covs, "flange_T_target", 6)
            # a right perturbation's translation, turned into the flange frame
            Cp = None if C6 is None else Y[:3, :3] @ C6[:3, :3] @ Y[:3, :3].T
            B = _cross(joint, covs, "cell_T_base", "flange_T_target")
            cross = None if B is None else B @ Y[:3, :3].T
        else:
            pt = _map(_map(rec.result.get("points")).get("flange_p_target")).get("position_m")
            if isinstance(pt, list) and len(pt) == 3:
                p, Cp = np.asarray(pt, dtype=float), _cov(covs, "flange_p_target", 3)
                cross = _cross(joint, covs, "cell_T_base", "flange_p_target")
        Cb = _cov(covs, "cell_T_base", 6)
        if Cb is None or Cp is None:
            cross = None
        return _BaseFrame(int(rec.id), transform_from_wire(_map(tr["cell_T_base"])), Cb, p, Cp, cross), other
    return None, other


def _cross(joint: Mapping[str, object], covs: Mapping[str, object], a: str,
           b: str) -> npt.NDArray[np.float64] | None:
    """The (6, 3) block of a result's joint covariance between ``a``'s 6 components and
    ``b``'s first 3 (its translation), or None when the wire does not carry it."""
    order, shape, vals = joint.get("order"), joint.get("shape"), joint.get("values")
    if not (isinstance(order, list) and isinstance(shape, list) and isinstance(vals, list) and a in order
            and b in order and len(shape) == 2 and shape[0] == shape[1] and len(vals) == shape[0] * shape[1]):
        return None
    offsets: dict[str, int] = {}
    at = 0
    for name in order:
        dims = _map(covs.get(name)).get("shape")
        if not (isinstance(dims, list) and dims):
            return None
        offsets[str(name)], at = at, at + int(dims[0])
    if at != shape[0]:
        return None
    J = np.asarray(vals, dtype=float).reshape(at, at)
    i, j = offsets[a], offsets[b]
    B = J[i:i + 6, j:j + 3].copy()
    return B if B.shape == (6, 3) and bool(np.all(np.isfinite(B))) else None  # nil on the wire: not known


def _cov(covs: Mapping[str, object], name: str, n: int) -> npt.NDArray[np.float64] | None:
    """A result's ``n`` x ``n`` covariance of ``name`` on the wire, or None."""
    vals = _map(covs.get(name)).get("values")
    return np.asarray(vals, dtype=float).reshape(n, n) if isinstance(vals, list) and len(vals) == n * n else None


def check_record(result: CameraChainResult, stations: Sequence[StationRecord], cfg: Config,
                 store: Store, robot: Mapping[str, object] | None = None) -> tuple[P.JsonObject | None, str]:
    """The tracker check of ``result`` fitted on ``stations`` (module docstring): ``(its wire
    form, "")``, or ``(None, why it did not run)``. ``robot``: the run's robot identity
    (``RunRecord.devices["robot"]``), whose kinematics the base frame must share."""
    if not wanted(cfg, result.setup):
        return None, ("no tracker check: [camera.hand_eye] tracker_target_mm (the tracker's target on the board) "
                      "is not set" if result.setup == MOUNTING_EYE_TO_HAND else "no tracker check: [camera.hand_eye] "
                      "tracker_flange_target (the tracker measures its flange target at every view) is off")
    assert cfg.camera is not None
    pairs = [(j, tracker_point(stations[i]), stations[i]) for j, i in enumerate(result.views)]
    pairs = [(j, p, s) for j, p, s in pairs if p is not None]
    if not pairs:
        return None, "no tracker check: no station has a tracker point (see the stations' raw tracker_check)"
    base, other = _base_frame(store, robot)
    if base is None:
        if other:
            return None, (f"no tracker check: the base-frame results that passed ({', '.join(map(str, other))}) were "
                          f"computed with other kinematics than this run's robot (kinematics_digest {robot_digest(robot)}): "
                          "run a base frame with it first")
        return None, "no tracker check: no base-frame result that passed its gates gives cell_T_base"
    if result.setup == MOUNTING_EYE_IN_HAND and base.flange_p is None:
        return None, (f"no tracker check: base-frame result {base.result_id} gives no flange_T_target or "
                      "flange_p_target (the tracker's target on the flange)")
    noise = []
    for _j, _p, s in pairs:
        cov = solve.station_covariance(s, cfg.solve, point=True)
        noise.append(cov if cov is not None else np.eye(3) * max(float(s.tracker_std_translation_m), 1e-6) ** 2)
    views = np.array([j for j, _p, _s in pairs])
    measured = np.array([p for _j, p, _s in pairs])
    if result.setup == MOUNTING_EYE_IN_HAND:
        assert base.flange_p is not None
        check = tracker_check(result, measured, target_p=base.flange_p, cell_T_base=base.cell_T_base,
                              tracker_noise_m=np.array(noise), cell_T_base_covariance=base.cell_T_base_cov,
                              via="flange", views=views, target_p_covariance=base.flange_p_cov,
                              cell_T_base_target_p_covariance=base.cross_cov)
    else:
        check = tracker_check(result, measured, target_p=np.asarray(cfg.camera.hand_eye.tracker_target_m, dtype=float),
                              cell_T_base=base.cell_T_base, tracker_noise_m=np.array(noise),
                              cell_T_base_covariance=base.cell_T_base_cov, via="camera", views=views)
    return {
        "via": check.via, "n": len(pairs), "cell_T_base_result_id": base.result_id,
        "plan_indices": [int(s.plan_index) for _j, _p, s in pairs],
        "distances_m": [float(v) for v in check.distances_m], "sigma_m": [float(v) for v in check.sigma_m],
        "rms_m": float(check.rms_m), "max_m": float(check.max_m), "nees": float(check.nees), "dof": int(check.dof),
        "p_value": float(check.p_value), "alpha": float(check.alpha), "passed": bool(check.passed),
    }, ""


def tracker_gate(check: Mapping[str, object] | None, why: str) -> GateCheck:
    """Gate ``tracker_check``: the camera chain's prediction of the tracker's points within
    their covariance (not applicable when the check did not run)."""
    if check is None:
        return GateCheck.not_applicable("tracker_check", 1e-3, "p", why)
    p = float(str(check.get("p_value")))
    ok = bool(check.get("passed"))
    rms = float(str(check.get("rms_m"))) * 1e3
    return GateCheck("tracker_check", p if math.isfinite(p) else 0.0, float(str(check.get("alpha"))), "p", ok,
                     f"the camera chain predicts the tracker's {check.get('n')} points to {rms:.3f} mm RMS "
                     f"(p {p:.3g}{', and every point within its own bound' if ok else ''}): "
                     f"{'consistent' if ok else 'INCONSISTENT'} with their covariance")
