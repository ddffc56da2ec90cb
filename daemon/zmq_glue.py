"""The daemon behind the ZeroMQ command socket: ``protocol.Handler`` over a ``Service``.

The transport (``zmq_server``) authenticates, authorises by role, validates arguments
against ``protocol.COMMANDS`` and logs every command with the caller's key id; this module
turns each command into a service call and the service's answers into the protocol's
result shapes. It never blocks for long: ``start_run`` queues the run and returns its id.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

import numpy as np

from cellcal.daemon import bodies
from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.config import Config
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.daemon.service import Service, ServiceError
from cellcal.daemon.store import ResultRecord, StoreError, UnknownRecord
from cellcal.daemon.wire.zmq_server import ZmqServer

log = logging.getLogger(__name__)

__all__ = ["DaemonHandler", "attach"]


def _id(text: object, what: str) -> int:
    # The protocol edge has bounded the id (v_record_id: a decimal id fits int64); this
    # daemon's ids are decimal only, so anything else names nothing here. int() alone would
    # also take " 7", "+7" and "1_0".
    if not (isinstance(text, str) and text.isascii() and text.isdigit() and len(text) <= 19):
        raise P.CommandError(P.E_NOT_FOUND, f"{what} {str(text)[:64]!r}: this daemon's ids are decimal integers")
    v = int(text)
    if not 1 <= v < 2**63:
        raise P.CommandError(P.E_NOT_FOUND, f"no {what} {text!r}")
    return v


def _map(v: object) -> Mapping[str, object]:
    """An argument the protocol edge has validated as an object (``{}`` stands for none)."""
    return v if isinstance(v, Mapping) else {}


def _run_kind(v: object) -> P.RunKind:
    """``start_run``'s ``kind``, which the protocol edge has checked against ``RUN_KINDS``."""
    if isinstance(v, str) and v in P.RUN_KINDS:
        return cast(P.RunKind, v)  # RUN_KINDS holds exactly the RunKind literals
    raise P.CommandError(P.E_BAD_REQUEST, f"kind must be one of {', '.join(P.RUN_KINDS)}, got {v!r}")


def _list(v: object) -> list[object]:
    """An argument the protocol edge has validated as an array."""
    return v if isinstance(v, list) else []


class DaemonHandler:
    """Implements every command of ``protocol.COMMANDS`` but ``get_snapshot`` (the server's).

    It reads the service only through its public methods and its store; every result is
    built by ``cellcal.daemon.bodies``.
    """

    def __init__(self, svc: Service) -> None:
        self.svc = svc

    def handle(self, cmd: str, args: dict[str, object], caller: P.Caller) -> object:
        try:
            result: object = getattr(self, f"_cmd_{cmd}")(args, caller)
            return result
        except ServiceError as exc:
            raise P.CommandError(exc.code, str(exc)) from None
        except UnknownRecord as exc:
            raise P.CommandError(P.E_NOT_FOUND, str(exc)) from None
        except StoreError as exc:
            raise P.CommandError(P.E_STATE, f"store: {exc}") from None

    def _result(self, args: dict[str, object]) -> ResultRecord:
        """The result named by ``args["result_id"]``, else the active one."""
        if "result_id" in args:
            return self.svc.store.get_result(_id(args["result_id"], "result"))
        rec = self.svc.store.active_result()
        if rec is None:
            raise P.CommandError(P.E_NO_CALIBRATION, "no active calibration")
        return rec

    # -- observer ---------------------------------------------------------------------------------
    def _cmd_get_status(self, args: dict[str, object], caller: P.Caller) -> P.StatusResult:
        return self.svc.heartbeat()

    def _cmd_get_result(self, args: dict[str, object], caller: P.Caller) -> dict[str, object]:
        return self.svc.result_body(self._result(args))

    def _cmd_list_results(self, args: dict[str, object], caller: P.Caller) -> P.ListResultsResult:
        limit = args.get("limit", 50)
        recs = self.svc.store.list_results(limit=limit if isinstance(limit, int) else 50)
        if "kind" in args:
            recs = [r for r in recs if r.kind == args["kind"]]
        active = self.svc.store.active_result()
        return bodies.list_results(recs, active.id if active else None)

    def _cmd_to_base(self, args: dict[str, object],
                     caller: P.Caller) -> P.ToBasePointResult | P.ToBasePoseResult:
        rec = self._result(args)
        tr = _map(rec.result.get("transforms", {}))
        if args.get("frame") == P.FRAME_CAMERA:
            base_T_camera = bodies.base_T_camera_of(tr, args, result_id=str(rec.id))
            # inverse(cell_T_base) is what to_base_reply applies: hand it inverse(base_T_camera)
            return bodies.to_base_reply(np.linalg.inv(base_T_camera), args, result_id=str(rec.id),
                                        suspect=bool(rec.suspect))
        if "flange_pose" in args:
            raise P.CommandError(P.E_BAD_REQUEST, "to_base: flange_pose is for frame \"camera\" only")
        if "cell_T_base" not in tr:
            raise P.CommandError(P.E_NO_CALIBRATION, f"result {rec.id} ({rec.kind}) has no cell_T_base")
        return bodies.to_base_reply(transform_from_wire(_map(tr["cell_T_base"])), args, result_id=str(rec.id),
                                    suspect=bool(rec.suspect))

    # -- operator ---------------------------------------------------------------------------------
    def _cmd_start_run(self, args: dict[str, object], caller: P.Caller) -> P.StartRunResult:
        kind = _run_kind(args["kind"])
        log.info("start_run %s by %s (%s)", kind, caller.name, caller.key_id)
        if "plan" in args and args["plan"] not in ("default", "configured"):
            raise P.CommandError(P.E_NOT_FOUND, f"no plan named {args['plan']!r} (known: default)")
        if args.get("motion_mode") not in (None, self.svc.cfg.capture.motion_mode):
            raise P.CommandError(P.E_STATE, f"this cell runs in {self.svc.cfg.capture.motion_mode} mode")
        plan = None
        if "stations" in args:
            plan = []
            for i, item in enumerate(_list(args["stations"])):
                st = _map(item)
                if "q_rad" in st:
                    plan.append(PlannedStation(i, np.asarray(st["q_rad"], dtype=float), None))
                else:
                    plan.append(PlannedStation(i, None, bodies.pose_from_wire(_map(st["base_T_flange"]))))
        run_id = self.svc.start_run(kind, plan=plan, reason=f"requested by {caller.name} ({caller.key_id})")
        planned = len(plan) if plan is not None else len(self.svc.store.get_run(run_id).plan.get("stations", []))
        return bodies.start_run_reply(run_id, kind, planned)

    def _cmd_abort(self, args: dict[str, object], caller: P.Caller) -> P.AbortResult:
        current = self.svc.current_run_id()
        if "run_id" in args and args["run_id"] != (None if current is None else str(current)):
            raise P.CommandError(P.E_STATE, f"run {args['run_id']} is not the one in progress ({current})")
        log.info("abort by %s (%s): run %s", caller.name, caller.key_id, current)
        return bodies.abort_reply(self.svc.abort(), current)

    def _cmd_run_drift_check(self, args: dict[str, object], caller: P.Caller) -> P.DriftCheckResult:
        result_id, check_id = self.svc.request_drift_check(f"requested by {caller.name} ({caller.key_id})")
        return bodies.drift_check_reply(result_id, check_id)

    def _cmd_activate_result(self, args: dict[str, object], caller: P.Caller) -> P.ActivateResult:
        rid = _id(args["result_id"], "result")
        # Through the service: deciding whether a run's result may become active and
        # activating it are one step against this command (ADR 0012).
        prev = self.svc.activate_result(rid, reason=f"by {caller.name} ({caller.key_id})")
        return bodies.activate_reply(rid, prev)


def attach(svc: Service, cfg: Config, *, validate_bodies: bool = False) -> ZmqServer:
    """Build the ZeroMQ server for ``svc`` (not started) and route the service's events to it.

    ``validate_bodies``: the server checks every published body against the protocol and
    raises at the publisher (tests of the daemon).
    """
    # The service republishes the *active* result itself (the latest message on the result
    # topic may be a failed run's), so the server's own republishing is off.
    server = ZmqServer(cfg.zmq, DaemonHandler(svc), boot_id=svc.boot_id, republish_topics=(),
                       validate_bodies=validate_bodies)
    svc.set_publisher(server.publish)
    return server
