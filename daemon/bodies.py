"""Every body the daemon publishes and every command result it replies with, built in one place.

One function per wire shape, each returning the ``cellcal.daemon.protocol`` TypedDict it
promises (``HeartbeatBody``, ``StateBody``, ``StationBody``, ``FaultBody``, ``DriftBody``,
the result body of a stored record, ``ResultSummary``, and the command results), so a type
checker sees a missing field here and ``protocol.check_body`` / ``check_result`` see it in
the tests. The service and the ZeroMQ glue decide *what* to say; this module decides how
it looks on the wire. Nothing here does I/O.

Fields beyond the TypedDicts (``detail`` on state and heartbeat, ``type`` on faults, edge
units on drift, ...) are additions clients may ignore (``docs/protocols/zeromq.md``
section 11); they are added last, by :func:`_with`, so the contract's fields are always
there first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar, cast

from cellcal.daemon import protocol as P

__all__ = [
    "iso_ns", "heartbeat", "status", "state", "settle_figures", "station", "fault", "fault_cleared",
    "drift_station", "drift", "result_body", "result_summary", "list_results", "start_run_reply",
    "abort_reply", "drift_check_reply", "activate_reply",
]

_T = TypeVar("_T", bound=Mapping[str, Any])


def _with(body: _T, **extra: Any) -> _T:
    """``body`` with fields that are not (yet) in its TypedDict added after the contract's."""
    out = dict(body)
    out.update(extra)
    return cast(_T, out)


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


def _device(status: Mapping[str, Any]) -> P.DeviceStatus:
    return P.DeviceStatus(connected=bool(status["connected"]), url=str(status["url"]),
                          identity=status.get("identity_text"))


def heartbeat(*, cell: str, state: P.StateName, detail: str, uptime_s: float, heartbeat_s: float,
              devices: Mapping[str, Mapping[str, Any]], active_result_id: int | str | None, suspect: bool,
              run_id: str | None, version: str) -> P.HeartbeatBody:
    """``cellcal/v1/heartbeat`` (and ``get_status``); ``devices``: ``CellDevices.status``."""
    body = P.HeartbeatBody(
        cell=cell, state=state, uptime_s=float(uptime_s), heartbeat_s=float(heartbeat_s),
        devices=P.Devices(robot=_device(devices[P.DEVICE_ROBOT]), tracker=_device(devices[P.DEVICE_TRACKER])),
        active_result_id=_id(active_result_id), suspect=bool(suspect), run_id=run_id, version=version,
    )
    return _with(body, detail=detail)


def status(hb: P.HeartbeatBody, *, queued_jobs: int, last_drift: Mapping[str, Any] | None,
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


def settle_figures(fig: Mapping[str, Any]) -> P.SettleFigures:
    """``protocol.SettleFigures`` from the capture engine's figures (0 where not measured).

    Reads both the engine's names (``robot_quiet_s``, ...) and a robot-only station's
    (``quiet_s``, ``max_joint_speed_rad_s``).
    """
    def num(key: str) -> float:
        v = fig.get(key)
        return 0.0 if v is None else float(v)

    rot = fig.get("tracker_std_rotation_rad")
    return P.SettleFigures(
        robot_rest_s=num("robot_quiet_s") or num("quiet_s"),
        max_joint_speed_rad_s=num("robot_max_joint_speed_rad_s") or num("max_joint_speed_rad_s"),
        max_flange_speed_m_s=num("robot_max_flange_speed_m_s"),
        tracker_std_translation_m=num("tracker_std_translation_m"),
        tracker_std_rotation_rad=None if rot is None else float(rot),
        overlap_s=num("tracker_window_s"),
    )


def station(*, run_id: int | str, index: int, planned: int, attempt: int, accepted_count: int,
            figures: Mapping[str, Any], rejected: str | None = None, message: str | None = None) -> P.StationBody:
    """``cellcal/v1/station``: one capture attempt, accepted (``rejected`` None) or rejected
    with the reason's name (``capture.RejectReason`` value) and ``message`` for people."""
    body = P.StationBody(
        run_id=str(run_id), index=int(index), planned=int(planned), attempt=int(attempt), accepted=rejected is None,
        reason=rejected, accepted_count=int(accepted_count), settle=settle_figures(figures),
    )
    return body if rejected is None else _with(body, message=message or rejected)


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


def drift(*, result_id: int | str, check_id: int, verdict: Any, cfg: Any, stations: list[P.DriftStation],
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


def result_body(rec: Any, *, cell: str, retained: bool = False) -> dict[str, Any]:
    """``cellcal/v1/result`` (and ``get_result``): a stored ``ResultRecord`` as ``protocol.ResultBody``.

    The solver's wire dict (``report.result_to_wire``, stored as ``rec.result``) with the
    record's identity, status and provenance.
    """
    body = dict(rec.result)
    prov = dict(rec.provenance)
    devices = prov.get("devices") or {}

    def serial(dev: str) -> str:
        # A serial number, or "" when the device told none: never the driver's class name.
        d = devices.get(dev) or {}
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
            "robot_serial": prov.get("robot_serial", (devices.get(P.DEVICE_ROBOT) or {}).get("serial")),
            "kinematics_digest": prov.get("kinematics_digest",
                                          (devices.get(P.DEVICE_ROBOT) or {}).get("kinematics_digest")),
            "parent_result_id": _id(rec.parent_result_id),
            "valid_from": rec.valid_from_utc,
        },
    )
    body.setdefault("transforms", {})
    return body


def result_summary(rec: Any) -> P.ResultSummary:
    """One row of ``list_results``."""
    from cellcal.daemon.gates import gates_passed

    r = rec.result
    return P.ResultSummary(
        result_id=str(rec.id), run_id=_id(rec.run_id), kind=rec.kind, created_ns=iso_ns(rec.created_utc),
        active=bool(rec.active), suspect=bool(rec.suspect), accepted=gates_passed(r),
        n_stations=int(r.get("n_stations", 0)), rms_translation_m=float(r.get("rms_translation_m", 0.0)),
        rms_rotation_rad=float(r.get("rms_rotation_rad", 0.0)),
    )


def list_results(recs: Iterable[Any], active_result_id: int | str | None) -> P.ListResultsResult:
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
