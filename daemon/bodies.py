"""Every body the daemon publishes and every command result it replies with, built in one place.

One function per wire shape, each returning the ``cellcal.daemon.protocol`` TypedDict it
promises (``HeartbeatBody``, ``StateBody``, ``StationBody``, ``FaultBody``, ``DriftBody``,
the result body of a stored record, ``ResultSummary``, and the command results), so a type
checker sees a missing field here and ``protocol.check_body`` / ``check_result`` see it in
the tests. The service and the ZeroMQ glue decide *what* to say; this module decides how
it looks on the wire. Nothing here does I/O.

A result's wire form is built here too, once for every result type
(:func:`result_to_wire`: it walks ``result.transforms()``, name ->
:class:`cellcal.solver.Estimate`, so a base frame, hand-eye, eye-to-hand, point base frame
and tool point result all publish every transform and point they estimated, each with its
covariance), and the stored record becomes the published body in :func:`result_body`. The
wire form of a transform named ``a_T_b``::

    {"parent_frame": "a", "child_frame": "b", "matrix": [16 floats, row-major],
     "translation_m": [x, y, z], "quaternion": {"w": .., "x": .., "y": .., "z": ..}}

with SI units and ``w >= 0``; of a point named ``a_p_x``: ``{"frame": "a", "position_m":
[x, y, z]}``. Covariances go under ``uncertainty.covariance`` by the same names (6x6 twist
``(rho, phi)`` in m and rad for a transform, 3x3 in m^2 for a point, row-major), and the
joint one under ``uncertainty.joint`` with the order of its blocks. Numbers that are not
finite are ``None`` on the wire. What acceptance gates read is at the top level too:
``converged``, ``stop_reason``, ``iterations``, ``dof``, ``downweighted``, ``warnings`` (a
list of ``{"code", "message", "value"}``) and ``residual_tests``;
``result_to_wire(result, task_points=...)`` adds ``task_points``: the predicted error of
each cell-frame task point (:func:`task_point_errors`).

Fields beyond the TypedDicts (``detail`` on state and heartbeat, ``type`` on faults, edge
units on drift, ...) are additions clients may ignore (``docs/protocols/zeromq.md``
section 11); they are added last, by :func:`_with`, so the contract's fields are always
there first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, SupportsFloat, SupportsInt, TypeVar, cast

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Drift
from cellcal.daemon.gates import gates_passed
from cellcal.daemon.store import ResultRecord
from cellcal.solver.calibrate import CalibrationResult, Estimate
from cellcal.solver.diagnostics import ResidualTests
from cellcal.solver.se3 import quat_from_matrix, se3_inverse, transform_from_xyz_quat

if TYPE_CHECKING:  # drift imports this module (its check stations' transforms)
    from cellcal.daemon.drift import Verdict

__all__ = [
    "iso_ns", "heartbeat", "status", "state", "settle_figures", "station", "fault", "fault_cleared",
    "drift_station", "drift", "result_body", "result_summary", "list_results", "start_run_reply",
    "abort_reply", "drift_check_reply", "activate_reply", "transform_to_wire", "transform_from_wire", "point_to_wire",
    "result_to_wire", "transforms_of", "task_point_errors", "warnings_to_wire", "FRAME_CONVENTION",
    "UNCERTAINTY_CONVENTION", "pose_from_wire", "to_base_reply", "base_T_camera_of", "as_json",
]

_T = TypeVar("_T", bound=Mapping[str, object])


def _with(body: _T, **extra: object) -> _T:
    """``body`` with fields that are not (yet) in its TypedDict added after the contract's."""
    out = dict(body)
    out.update(extra)
    # A TypedDict is a dict at runtime: the copy is one with every field of ``body``, and
    # the extra keys are additions its type does not name (module docstring).
    return cast(_T, out)


def as_json(body: Mapping[str, object]) -> P.JsonObject:
    """A body or record this module built (a wire TypedDict such as ``Transform``, or
    :func:`result_to_wire`'s record) as the JSON object it is, to store or nest in a record
    of open shape."""
    # True of what this module builds: str, bool, finite numbers or None, lists of those and
    # nested dicts and TypedDicts of the same (wire/types.py), all JSON values.
    return cast(P.JsonObject, body)


def _opt_str(v: object) -> str | None:
    return v if v is None or isinstance(v, str) else str(v)


def _map(v: object) -> Mapping[str, object]:
    """A value read from a stored record as the JSON object it should be ({} if it is not one)."""
    return v if isinstance(v, Mapping) else {}


def _int(v: object) -> int:
    if isinstance(v, (SupportsInt, str)):
        return int(v)
    raise TypeError(f"an integer was expected, got {type(v).__name__}")


def _id(value: int | str | None) -> str | None:
    """Ids travel as strings (ADR 0007)."""
    return None if value is None else str(value)


def iso_ns(text: str | None) -> int:
    """Wall-clock UTC nanoseconds of an ISO 8601 stamp (0 when missing)."""
    if not text:
        return 0
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(round(dt.timestamp() * 1e9))


# --- heartbeat and status --------------------------------------------------------------------------


def _device(status: Mapping[str, object]) -> P.DeviceStatus:
    return P.DeviceStatus(connected=bool(status["connected"]), url=str(status["url"]),
                          identity=_opt_str(status.get("identity_text")))


def heartbeat(*, cell: str, state: P.StateName, detail: str, uptime_s: float, heartbeat_s: float,
              devices: Mapping[str, Mapping[str, object]], active_result_id: int | str | None, suspect: bool,
              run_id: str | None, version: str) -> P.HeartbeatBody:
    """``cellcal/v1/heartbeat`` (and ``get_status``); ``devices``: ``CellDevices.status``."""
    listed = P.Devices(robot=_device(devices[P.DEVICE_ROBOT]), tracker=_device(devices[P.DEVICE_TRACKER]))
    if P.DEVICE_CAMERA in devices:  # a cell with a [camera] section (ADR 0030): an addition within v1
        listed[P.DEVICE_CAMERA] = _device(devices[P.DEVICE_CAMERA])
    body = P.HeartbeatBody(
        cell=cell, state=state, uptime_s=float(uptime_s), heartbeat_s=float(heartbeat_s), devices=listed,
        active_result_id=_id(active_result_id), suspect=bool(suspect), run_id=run_id, version=version,
    )
    return _with(body, detail=detail)


def status(hb: P.HeartbeatBody, *, queued_jobs: int, last_drift: Mapping[str, object] | None,
           cusum_m: float) -> P.StatusResult:
    """The heartbeat plus what an operator asks the service object for (queue, last drift)."""
    return _with(hb, queued_jobs=int(queued_jobs), last_drift=last_drift, cusum_m=float(cusum_m))


# --- state ---------------------------------------------------------------------------------------


def state(state: P.StateName, *, previous: P.StateName | None, reason: str, run_id: int | str | None,
          kind: P.RunKind | None, motion_mode: P.MotionMode) -> P.StateBody:
    """``cellcal/v1/state``: a transition, or (``state == previous``) an event of a run that
    ends without one (aborted, failed its gates), named in ``reason``."""
    body = P.StateBody(state=state, previous=previous, reason=reason, run_id=_id(run_id), kind=kind,
                       motion_mode=motion_mode)
    return _with(body, detail=reason)


# --- station -------------------------------------------------------------------------------------


def _number(v: object) -> float:
    """A figure read from a station's stored ``settle`` dict (numbers, or numeric text)."""
    if isinstance(v, (SupportsFloat, str)):
        return float(v)
    raise TypeError(f"a settle figure must be a number, got {type(v).__name__}")


def settle_figures(fig: Mapping[str, object]) -> P.SettleFigures:
    """``protocol.SettleFigures`` from the capture engine's figures (0 where not measured).

    Reads both the engine's names (``robot_quiet_s``, ...) and a robot-only station's
    (``quiet_s``, ``max_joint_speed_rad_s``).
    """
    def num(key: str) -> float:
        v = fig.get(key)
        return 0.0 if v is None else _number(v)

    rot = fig.get("tracker_std_rotation_rad")
    return P.SettleFigures(
        robot_rest_s=num("robot_quiet_s") or num("quiet_s"),
        max_joint_speed_rad_s=num("robot_max_joint_speed_rad_s") or num("max_joint_speed_rad_s"),
        max_flange_speed_m_s=num("robot_max_flange_speed_m_s"),
        tracker_std_translation_m=num("tracker_std_translation_m"),
        tracker_std_rotation_rad=None if rot is None else _number(rot),
        overlap_s=num("tracker_window_s"),
    )


def station(*, run_id: int | str, index: int, planned: int, attempt: int, accepted_count: int,
            figures: Mapping[str, object], rejected: str | None = None, message: str | None = None) -> P.StationBody:
    """``cellcal/v1/station``: one capture attempt, accepted (``rejected`` None) or rejected
    with the reason's name (``capture.RejectReason`` value) and ``message`` for people."""
    body = P.StationBody(
        run_id=str(run_id), index=int(index), planned=int(planned), attempt=int(attempt), accepted=rejected is None,
        reason=rejected, accepted_count=int(accepted_count), settle=settle_figures(figures),
    )
    # A camera station's frame (ADR 0030): an addition clients may ignore (zeromq.md, 4.4.3).
    frame = {k: figures[k] for k in _FRAME_FIGURES if figures.get(k) is not None}
    if frame:
        body = _with(body, frame=frame)
    return body if rejected is None else _with(body, message=message or rejected)


def with_outcome(body: P.StationBody, outcome: str) -> P.StationBody:
    """A rejected station's body with what follows (``outcome``: ``retrying``, ``given_up``,
    ``dropped`` or ``run_failed``; an addition within v1, zeromq.md 4.4.3)."""
    return _with(body, outcome=outcome)


#: The figures of a camera station's frame its station body carries under ``frame``.
_FRAME_FIGURES = ("n_corners", "blur_px", "exposure_s", "gain_db", "exposure_frames")


# --- fault ---------------------------------------------------------------------------------------


def fault(*, code: P.ErrorCode, device: P.DeviceName | None, message: str, retry_in_s: float | None,
          exc: BaseException | None = None) -> P.FaultBody:
    """``cellcal/v1/fault`` as raised (the service is in FAULT)."""
    body = P.FaultBody(code=code, device=device, message=message, state=P.STATE_FAULT, active=True,
                       retry_in_s=None if retry_in_s is None else float(retry_in_s))
    return _with(body, type=type(exc).__name__ if exc is not None else "")


def fault_cleared(raised: P.FaultBody, now: P.StateName) -> P.FaultBody:
    """The same fault, cleared: the service left FAULT for ``now``."""
    return _with(raised, active=False, state=now, retry_in_s=None, message=f"cleared, now {now}: {raised['message']}")


# --- drift ---------------------------------------------------------------------------------------


def drift_station(index: int, translation_m: float, rotation_rad: float | None) -> P.DriftStation:
    return P.DriftStation(index=int(index), translation_m=float(translation_m),
                          rotation_rad=None if rotation_rad is None else float(rotation_rad))


def drift(*, result_id: int | str, check_id: int, verdict: Verdict, cfg: Drift, stations: list[P.DriftStation],
          suspect: bool, reason: str) -> P.DriftBody:
    """``cellcal/v1/drift`` (also what the store keeps of the check): ``verdict`` is a
    ``drift.Verdict``, ``cfg`` the ``[drift]`` section."""
    t, r = verdict.deviation_translation_m, verdict.deviation_rotation_rad  # r None: point measurements
    body = P.DriftBody(
        result_id=str(result_id), check_id=int(check_id), deviation_translation_m=float(t),
        deviation_rotation_rad=None if r is None else float(r), warn_translation_m=cfg.warn_translation_m,
        fail_translation_m=cfg.fail_translation_m, warn_rotation_rad=cfg.warn_rotation_rad,
        fail_rotation_rad=cfg.fail_rotation_rad,
        cusum=P.Cusum(value_m=float(verdict.cusum_m), k_m=cfg.cusum_k_m, h_m=cfg.cusum_h_m, alarm=bool(verdict.alarm)),
        status=verdict.status, suspect=bool(suspect), action=verdict.action, stations=stations,
    )
    # the same in edge units, for people reading logs and `cellcal watch`
    return _with(body, reason=reason, deviation_mm=t * 1e3, deviation_deg=None if r is None else math.degrees(r))


# --- results -------------------------------------------------------------------------------------


def result_body(rec: ResultRecord, *, cell: str, retained: bool = False) -> dict[str, object]:
    """``cellcal/v1/result`` (and ``get_result``): a stored ``ResultRecord`` as ``protocol.ResultBody``.

    The solver's wire dict (``report.result_to_wire``, stored as ``rec.result``) with the
    record's identity, status and provenance.
    """
    body: dict[str, object] = dict(rec.result)
    prov: Mapping[str, object] = dict(rec.provenance)
    devices = _map(prov.get("devices") or {})

    def serial(dev: str) -> str:
        # A serial number, or "" when the device told none: never the driver's class name.
        d = _map(devices.get(dev) or {})
        return str(d.get("serial", "") or "")

    body.update(
        result_id=str(rec.id), run_id=_id(rec.run_id), kind=rec.kind,
        cell=cell, created_ns=iso_ns(rec.created_utc), active=bool(rec.active),
        suspect=bool(rec.suspect), suspect_reason=rec.suspect_reason, retained=bool(retained),
        valid_from=rec.valid_from_utc,
        provenance={
            "config_sha256": prov.get("config_sha256", ""),
            "device_serials": {k: serial(k) for k in P.DEVICES},
            "solver": prov.get("solver", ""),
            "frame_convention": prov.get("frame_convention", ""),
            "valid_from_ns": iso_ns(rec.valid_from_utc),
            "cellcal_version": prov.get("cellcal_version", ""),
            "devices": devices,
            "robot_serial": prov.get("robot_serial", _map(devices.get(P.DEVICE_ROBOT) or {}).get("serial")),
            "kinematics_digest": prov.get("kinematics_digest",
                                          _map(devices.get(P.DEVICE_ROBOT) or {}).get("kinematics_digest")),
            "parent_result_id": _id(rec.parent_result_id),
            "valid_from": rec.valid_from_utc,
            # a camera result's target file (ADR 0030); None for every other result
            "target_sha256": prov.get("target_sha256"),
        },
    )
    body.setdefault("transforms", {})
    return body


def result_summary(rec: ResultRecord) -> P.ResultSummary:
    """One row of ``list_results``."""
    r: Mapping[str, object] = rec.result
    return P.ResultSummary(
        result_id=str(rec.id), run_id=_id(rec.run_id), kind=rec.kind, created_ns=iso_ns(rec.created_utc),
        active=bool(rec.active), suspect=bool(rec.suspect), accepted=gates_passed(r),
        n_stations=_int(r.get("n_stations", 0)), rms_translation_m=_number(r.get("rms_translation_m", 0.0)),
        rms_rotation_rad=_number(r.get("rms_rotation_rad", 0.0)),
    )


def list_results(recs: Iterable[ResultRecord], active_result_id: int | str | None) -> P.ListResultsResult:
    return P.ListResultsResult(results=[result_summary(r) for r in recs], active_result_id=_id(active_result_id))


# --- command results -----------------------------------------------------------------------------


def start_run_reply(run_id: int | str, kind: P.RunKind, planned: int) -> P.StartRunResult:
    return P.StartRunResult(run_id=str(run_id), kind=kind, planned=int(planned))


def abort_reply(aborted: bool, run_id: int | str | None) -> P.AbortResult:
    return P.AbortResult(aborted=bool(aborted), run_id=_id(run_id))


def drift_check_reply(result_id: int | str, check_id: int) -> P.DriftCheckResult:
    return P.DriftCheckResult(result_id=str(result_id), check_id=int(check_id))


def activate_reply(result_id: int | str, previous_result_id: int | str | None) -> P.ActivateResult:
    return P.ActivateResult(active_result_id=str(result_id), previous_result_id=_id(previous_result_id))


# --- a result's wire form (module docstring) ---------------------------------------------------


#: The ``frame_convention`` every result carries (ADR 0001).
FRAME_CONVENTION = "a_T_b maps coordinates in frame b to frame a; SI units; quaternion w,x,y,z with w >= 0"


#: The ``uncertainty.convention`` every result carries (ADR 0004).
UNCERTAINTY_CONVENTION = (
    "right perturbation T exp(xi), xi = (rho [m], phi [rad]); 6x6 row-major per transform, "
    "3x3 [m^2] in the point's frame per point; joint: blocks in the order given"
)


def transform_to_wire(name: str, T: npt.NDArray[np.float64]) -> P.Transform:
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


def transform_from_wire(obj: Mapping[str, object]) -> npt.NDArray[np.float64]:
    """4x4 transform from its wire form (the ``matrix`` field is authoritative)."""
    m = np.array(obj["matrix"], dtype=float)
    if m.shape != (16,):
        raise ValueError(f"matrix must have 16 numbers, got {m.shape}")
    return m.reshape(4, 4)


def point_to_wire(frame: str, p: npt.NDArray[np.float64]) -> P.Point:
    """Wire form of a point given in ``frame``: ``{"frame", "position_m"}``."""
    return {"frame": frame, "position_m": [float(v) for v in np.asarray(p, dtype=float).reshape(3)]}


def transforms_of(result: CalibrationResult) -> dict[str, npt.NDArray[np.float64]]:
    """The named transforms and points a result carries: name -> (4, 4) or (3,) value.

    The values of ``result.transforms()``, for callers that need no covariance.
    """
    return {name: e.value for name, e in result.transforms().items()}


def _f(v: SupportsFloat) -> float | None:
    x = float(v)
    return x if math.isfinite(x) else None


def _matrix_to_wire(C: npt.NDArray[np.float64]) -> P.Covariance:
    C = np.asarray(C, dtype=float)
    return {"shape": list(C.shape), "values": [_f(v) for v in C.reshape(-1)]}


def warnings_to_wire(result: CalibrationResult) -> list[P.JsonObject]:
    """``[{"code", "message", "value"}]`` of a result's warnings (``value`` None if absent)."""
    return [{"code": w.code, "message": w.message, "value": None if w.value is None else _f(w.value)}
            for w in getattr(result, "warnings", ())]


def task_point_errors(result: CalibrationResult, task_points: npt.ArrayLike) -> list[P.JsonObject]:
    """Predicted error of each task point through the result (``predicted_error_at``).

    Parameters
    ----------
    result : CalibrationResult
        Any result; a tool point has one figure, its tip, whatever points are asked.
    task_points : array_like, shape (K, 3)
        Points in the frame the result's ``predicted_error_at`` takes (the cell for a base
        frame, the camera for hand-eye), metres.

    Returns
    -------
    list of dict
        ``{"point_m", "sigma_m", "sigma_max_m", "frame", "lever_arm_m"}`` per point.
    """
    pts = np.asarray(task_points, dtype=float).reshape(-1, 3)
    out: list[P.JsonObject] = []
    for p in pts:
        try:
            pe = result.predicted_error_at(p)  # type: ignore[attr-defined]
        except TypeError:  # the tool point: its tip only
            pe = result.predicted_error_at()  # type: ignore[attr-defined]
        out.append({"point_m": [float(v) for v in p], "sigma_m": _f(pe.sigma_m), "sigma_max_m": _f(pe.sigma_max_m),
                    "frame": pe.frame, "lever_arm_m": _f(pe.lever_arm_m)})
    return out


def _tests_to_wire(result: CalibrationResult) -> P.JsonObject | None:
    t: ResidualTests | None = getattr(result, "residual_tests", None)
    if t is None:
        return None
    return {
        "declared_noise": bool(t.declared_noise), "chi2_per_dof": _f(t.chi2_per_dof), "chi2_p": _f(t.chi2_p),
        "structure_f": _f(t.structure_f), "structure_p": _f(t.structure_p),
        "structure_dof": [int(v) for v in t.structure_dof],
        "redundancy_translation": _f(t.redundancy_translation), "redundancy_rotation": _f(t.redundancy_rotation),
        "variance_factor_translation": _f(t.variance_factor_translation),
        "variance_factor_rotation": _f(t.variance_factor_rotation),
        "small_sample_factor": _f(t.small_sample_factor),
        "model_error_translation_m": _f(t.model_error_translation_m),
        "model_error_rotation_rad": _f(t.model_error_rotation_rad),
        "inflation_translation": _f(t.inflation_translation), "inflation_rotation": _f(t.inflation_rotation),
        "false_alarm_rate": _f(t.false_alarm_rate),
        "field_statistic": _f(t.field_statistic), "field_p": _f(t.field_p),
        "model_error_tested": bool(t.model_error_tested),
        "model_error_detectable_m": _f(t.model_error_detectable_m), "robot_accuracy_m": _f(t.robot_accuracy_m),
        "model_error_structured_m": _f(t.model_error_structured_m), "model_error_rough_m": _f(t.model_error_rough_m),
        "pairing_ratio": _f(t.pairing_ratio), "motion_f": _f(t.motion_f), "motion_p": _f(t.motion_p),
    }


def result_to_wire(result: CalibrationResult, *, task_points: npt.ArrayLike | None = None) -> dict[str, object]:
    """JSON-ready dict of a calibration result of any type.

    Fields: ``transforms`` (name -> transform) and ``points`` (name -> point), both always
    present and together every estimate of ``result.transforms()``; the closure figures,
    ``weakest_axis``, per-station ``residuals``, ``solver``, ``frame_convention``;
    ``uncertainty`` (per-estimate and joint covariance, noise, chi2); ``holdout`` and
    ``linear_agreement`` (``None`` when the result has none); ``converged``, ``stop_reason``,
    ``iterations``, ``dof``, ``downweighted``, ``warnings``, ``residual_tests``; with
    ``task_points`` (K, 3) also ``task_points`` (:func:`task_point_errors`).
    ``docs/protocols/zeromq.md`` documents every field.
    """
    estimates = result.transforms()
    out: dict[str, object] = {
        "transforms": {k: transform_to_wire(k, e.value) for k, e in estimates.items() if not e.is_point},
        "points": {k: point_to_wire(e.frame, e.value) for k, e in estimates.items() if e.is_point},
        "n_stations": result.n_stations,
        "n_motions": result.n_motions,
        "rms_translation_m": result.rms_translation_m,
        "max_translation_m": result.max_translation_m,
        "rms_rotation_rad": result.rms_rotation_rad,
        "max_rotation_rad": result.max_rotation_rad,
        "axis_spread": result.axis_spread,
        "weakest_axis": {"frame": result.axis_frame, "unit": [float(v) for v in result.weakest_axis]},
        "max_motion_rad": result.max_motion_rad,
        "residuals": {
            "translation_m": [float(v) for v in result.residuals.translation_m],
            "rotation_rad": [float(v) for v in result.residuals.rotation_rad],
        },
        "solver": result.solver,
        "frame_convention": FRAME_CONVENTION,
        "uncertainty": _uncertainty_to_wire(result, estimates),
        "holdout": None,
        "linear_agreement": None,
        "converged": bool(getattr(result, "converged", True)),
        "stop_reason": str(getattr(result, "stop_reason", "")),
        "iterations": int(result.iterations),
        "dof": int(result.dof),
        "downweighted": [int(i) for i in np.asarray(result.downweighted, dtype=int).reshape(-1)],
        "warnings": warnings_to_wire(result),
        "residual_tests": _tests_to_wire(result),
    }
    if task_points is not None:
        out["task_points"] = task_point_errors(result, task_points)
    h = result.holdout
    if h is not None:
        holdout: P.Holdout = {
            "method": h.method, "folds": int(h.folds),
            "p50_translation_m": _f(h.p50_translation_m), "p90_translation_m": _f(h.p90_translation_m),
            "max_translation_m": _f(h.max_translation_m), "p50_rotation_rad": _f(h.p50_rotation_rad),
            "p90_rotation_rad": _f(h.p90_rotation_rad), "max_rotation_rad": _f(h.max_rotation_rad),
            "inflation": _f(h.inflation),
            "translation_m": [_f(v) for v in h.translation_m], "rotation_rad": [_f(v) for v in h.rotation_rad],
        }
        out["holdout"] = holdout
    a = result.linear_agreement
    if a is not None:
        agreement: P.LinearAgreement = {
            "translation_m": _f(a.translation_m), "rotation_rad": _f(a.rotation_rad), "sigmas": _f(a.sigmas),
        }
        out["linear_agreement"] = agreement
    return out


def _uncertainty_to_wire(result: CalibrationResult, estimates: dict[str, Estimate]) -> P.Uncertainty:
    """Covariances (per estimate and joint), the primary's 1-sigma, the noise the fit used."""
    joint = _matrix_to_wire(result.covariance)
    return {
        "convention": UNCERTAINTY_CONVENTION,
        "covariance": {name: _matrix_to_wire(e.covariance) for name, e in estimates.items()},
        "joint": {"order": list(estimates), "shape": joint["shape"], "values": joint["values"]},
        "sigma_translation_m": _f(result.sigma_translation_mm * 1e-3),
        "sigma_rotation_rad": _f(math.radians(result.sigma_rotation_deg)),
        "noise_translation_m": _f(result.noise_translation_m),
        "noise_rotation_rad": _f(result.noise_rotation_rad),
        "noise_source": result.noise_source,
        "chi2": _f(result.chi2),
        "dof": int(result.dof),
        "refined": bool(result.refined),
        "iterations": int(result.iterations),
        "downweighted_stations": [int(i) for i in np.asarray(result.downweighted, dtype=int).reshape(-1)],
    }


# --- to_base -------------------------------------------------------------------------------------


def pose_from_wire(pose: Mapping[str, object]) -> npt.NDArray[np.float64]:
    """4x4 ``numpy`` transform from a validated pose argument (``matrix`` or translation + quaternion)."""
    if "matrix" in pose:
        return np.array(pose["matrix"], dtype=float).reshape(4, 4)
    q = _map(pose["quaternion"])
    return transform_from_xyz_quat(np.array(pose["translation_m"], dtype=float),
                                   np.array([q["w"], q["x"], q["y"], q["z"]], dtype=float))


def base_T_camera_of(transforms: Mapping[str, object], args: Mapping[str, object], *,
                     result_id: str) -> npt.NDArray[np.float64]:
    """The camera in the base frame for ``to_base frame="camera"`` (``docs/protocols/zeromq.md``):
    an eye-to-hand result's ``base_T_camera``; an eye-in-hand result's ``flange_T_camera``
    through the validated ``flange_pose`` argument (``base_T_flange`` when the camera saw it).

    Raises
    ------
    CommandError
        ``E_NO_CALIBRATION``: the result has no camera transform; ``E_BAD_REQUEST``: an
        eye-in-hand result without ``flange_pose``, or an eye-to-hand one with it.
    """
    if "base_T_camera" in transforms:
        if "flange_pose" in args:
            raise P.CommandError(P.E_BAD_REQUEST, f"to_base: result {result_id}'s camera is fixed in the base frame "
                                                  "(eye to hand): give no flange_pose")
        return transform_from_wire(_map(transforms["base_T_camera"]))
    if "flange_T_camera" in transforms:
        if "flange_pose" not in args:
            raise P.CommandError(P.E_BAD_REQUEST, f"to_base: result {result_id}'s camera rides on the flange (eye in "
                                                  "hand): give flange_pose, base_T_flange when the camera saw it")
        return pose_from_wire(_map(args["flange_pose"])) @ transform_from_wire(_map(transforms["flange_T_camera"]))
    raise P.CommandError(P.E_NO_CALIBRATION, f"result {result_id} has no camera transform (flange_T_camera or "
                                             "base_T_camera)")


def to_base_reply(cell_T_base: npt.ArrayLike, args: Mapping[str, object], *, result_id: str,
                  suspect: bool) -> P.ToBasePointResult | P.ToBasePoseResult:
    """The ``to_base`` result for validated ``args``, given the calibration's ``cell_T_base``.

    A point ``cell_p`` becomes ``base_p = inv(cell_T_base) @ cell_p``; a pose ``cell_T_x``
    becomes ``base_T_x = inv(cell_T_base) @ cell_T_x``, in wire form with ``child_frame``
    named by ``args["child_frame"]``.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        base_T_cell = se3_inverse(np.asarray(cell_T_base, dtype=float))
        if "point_m" in args:
            p = base_T_cell[:3, :3] @ np.asarray(args["point_m"], dtype=float) + base_T_cell[:3, 3]
            out: P.ToBasePointResult | P.ToBasePoseResult = {
                "result_id": result_id, "suspect": bool(suspect), "frame": "base", "point_m": [float(v) for v in p]}
        else:
            base_T_x = base_T_cell @ pose_from_wire(_map(args["pose"]))
            if not np.all(np.isfinite(base_T_x)):
                raise P.CommandError(P.E_BAD_REQUEST, "to_base: the pose in the base frame is not finite "
                                                  "(an argument near the float 64 maximum)")
            child = args.get("child_frame", "pose")
            out = {"result_id": result_id, "suspect": bool(suspect), "pose": transform_to_wire(f"base_T_{child}", base_T_x)}
    bad = P.find_non_finite(out)
    if bad:
        # Refuse rather than send inf: the arguments are in range, so the calibration or the
        # point is beyond what float 64 can carry through the product.
        raise P.CommandError(P.E_BAD_REQUEST, f"to_base: {bad} would not be finite; the argument is out of range")
    return out
