"""The daemon behind the ZeroMQ command socket: ``protocol.Handler`` over a ``Service``.

The transport (``zmq_server``) authenticates, authorises by role, validates arguments
against ``protocol.COMMANDS`` and logs every command with the caller's key id; this module
turns each command into a service call and the service's answers into the protocol's
result shapes. It never blocks for long: ``start_run`` queues the run and returns its id.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from cellcal.daemon import protocol as P
from cellcal.daemon.report import transform_from_wire
from cellcal.daemon.service import Service, ServiceError
from cellcal.daemon.store import StoreError, UnknownRecord

log = logging.getLogger(__name__)

__all__ = ["DaemonHandler", "attach"]


def _id(text: str, what: str) -> int:
    try:
        v = int(str(text))
    except ValueError:
        raise P.CommandError(P.E_NOT_FOUND, f"{what} {text!r}: ids are decimal integers") from None
    if v < 1:
        raise P.CommandError(P.E_NOT_FOUND, f"no {what} {text!r}")
    return v


class DaemonHandler:
    """Implements every command of ``protocol.COMMANDS`` but ``get_snapshot`` (the server's)."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc

    def handle(self, cmd: str, args: dict[str, Any], caller: P.Caller) -> Any:
        try:
            return getattr(self, f"_cmd_{cmd}")(args, caller)
        except ServiceError as exc:
            raise P.CommandError(exc.code, str(exc)) from None
        except UnknownRecord as exc:
            raise P.CommandError(P.E_NOT_FOUND, str(exc)) from None
        except StoreError as exc:
            raise P.CommandError(P.E_STATE, f"store: {exc}") from None

    # -- observer ---------------------------------------------------------------------------------
    def _cmd_get_status(self, args: dict, caller: P.Caller) -> dict:
        return self.svc.heartbeat()

    def _cmd_get_result(self, args: dict, caller: P.Caller) -> dict:
        if "result_id" in args:
            rec = self.svc.store.get_result(_id(args["result_id"], "result"))
        else:
            rec = self.svc.store.active_result()
            if rec is None:
                raise P.CommandError(P.E_NO_CALIBRATION, "no active calibration")
        return self.svc.result_body(rec)

    def _cmd_list_results(self, args: dict, caller: P.Caller) -> dict:
        recs = self.svc.store.list_results(limit=args.get("limit", 50))
        if "kind" in args:
            recs = [r for r in recs if r.kind == args["kind"]]
        active = self.svc.store.active_result()
        return {"results": [self.svc.result_summary(r) for r in recs],
                "active_result_id": str(active.id) if active else None}

    def _cmd_to_base(self, args: dict, caller: P.Caller) -> dict:
        if "result_id" in args:
            rec = self.svc.store.get_result(_id(args["result_id"], "result"))
        else:
            rec = self.svc.store.active_result()
            if rec is None:
                raise P.CommandError(P.E_NO_CALIBRATION, "no active calibration")
        tr = rec.result.get("transforms", {})
        if "cell_T_base" not in tr:
            raise P.CommandError(P.E_NO_CALIBRATION, f"result {rec.id} ({rec.kind}) has no cell_T_base")
        return P.to_base_reply(transform_from_wire(tr["cell_T_base"]), args, result_id=str(rec.id), suspect=bool(rec.suspect))

    # -- operator ---------------------------------------------------------------------------------
    def _cmd_start_run(self, args: dict, caller: P.Caller) -> dict:
        kind = args["kind"]
        log.info("start_run %s by %s (%s)", kind, caller.name, caller.key_id)
        if "plan" in args and args["plan"] not in ("default", "configured"):
            raise P.CommandError(P.E_NOT_FOUND, f"no plan named {args['plan']!r} (known: default)")
        if args.get("motion_mode") not in (None, self.svc.cfg.capture.motion_mode):
            raise P.CommandError(P.E_STATE, f"this cell runs in {self.svc.cfg.capture.motion_mode} mode")
        plan = None
        if "stations" in args:
            from cellcal.daemon.plan import PlannedStation

            plan = []
            for i, st in enumerate(args["stations"]):
                if "q_rad" in st:
                    plan.append(PlannedStation(i, np.asarray(st["q_rad"], dtype=float), None))
                else:
                    plan.append(PlannedStation(i, None, P.pose_from_wire(st["base_T_flange"])))
        run_id = self.svc.start_run(kind, plan=plan, reason=f"requested by {caller.name} ({caller.key_id})")
        planned = len(plan) if plan is not None else len(self.svc.store.get_run(run_id).plan.get("stations", []))
        return {"run_id": str(run_id), "kind": kind, "planned": planned}

    def _cmd_abort(self, args: dict, caller: P.Caller) -> dict:
        job = self.svc._current
        current = str(job.run_id) if job is not None and job.run_id is not None else None
        if "run_id" in args and args["run_id"] != current:
            raise P.CommandError(P.E_STATE, f"run {args['run_id']} is not the one in progress ({current})")
        busy = self.svc.abort()
        if busy and self.svc._robot is not None:
            try:
                self.svc._robot.stop()
            except Exception:  # noqa: BLE001 - the abort stands even if the stop command fails
                log.warning("stop after abort failed", exc_info=True)
        return {"aborted": busy, "run_id": current}

    def _cmd_run_drift_check(self, args: dict, caller: P.Caller) -> dict:
        self.svc.request_drift_check(f"requested by {caller.name} ({caller.key_id})")
        return {"queued": True}

    def _cmd_activate_result(self, args: dict, caller: P.Caller) -> dict:
        rid = _id(args["result_id"], "result")
        rec = self.svc.store.get_result(rid)
        if not rec.result.get("gates", {}).get("passed", True):
            raise P.CommandError(P.E_STATE, f"result {rid} failed its acceptance gates and cannot be activated")
        prev = self.svc.store.active_result()
        self.svc.store.activate_result(rid, reason=f"by {caller.name} ({caller.key_id})")
        self.svc.republish_result_now()
        return {"active_result_id": str(rid), "previous_result_id": str(prev.id) if prev else None}


def attach(svc: Service, cfg: Any) -> Any:
    """Build the ZeroMQ server for ``svc`` (not started) and route the service's events to it."""
    from cellcal.daemon.zmq_server import ZmqServer

    # The service republishes the *active* result itself (the latest message on the result
    # topic may be a failed run's), so the server's own republishing is off.
    server = ZmqServer(cfg.zmq, DaemonHandler(svc), boot_id=svc.boot_id, republish_topics=())
    svc.set_publisher(server.publish)
    return server
