"""Results: stored with their provenance, activated when their gates pass, exported, published.

:class:`ResultKeeper` is the one place a result changes state:

* :meth:`ResultKeeper.keep` stores what a run kind finished (``runs.Finished``: the gate report
  and the record) with its provenance; it becomes active only when every gate passed **and**
  no result became active after its run started (another run's, or one an operator
  activated: then it is stored, not activated, and the run's ``state`` event says so);
* :meth:`ResultKeeper.activate` is the operator's ``activate_result``;
* every change rewrites the result's export files and its report (:meth:`export`), then
  points ``exports/active`` at the active result's (a kill between activating and switching
  is repaired at start: :meth:`export_active_if_stale`);
* an activated result goes out on the result topic; :meth:`republish` repeats the active
  one, marked ``retained``.

Deciding whether a result may become active and activating it are one step against an
operator's ``activate_result`` (one lock).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from cellcal.daemon import bodies, solve
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.gates import gates_failed, gates_passed
from cellcal.daemon.jobs.control import Emit, JobControl, narrative
from cellcal.daemon.report import human
from cellcal.daemon.report.exports import active_result_id, remove_stale_temporaries, sync_active, write_exports
from cellcal.daemon.report.html import export_report
from cellcal.daemon.runs import Finished
from cellcal.daemon.store import ResultRecord, RunRecord, RunStatus, Store, StoreError
from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)

__all__ = ["ResultKeeper", "ActivationRefused", "provenance", "cellcal_version"]


@cache
def cellcal_version() -> str:
    """The installed cellcal's version, read once per process (every heartbeat and status
    names it, and ``importlib.metadata`` scans the installed distributions on each call)."""
    try:
        return version("cellcal")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


class ActivationRefused(CellcalError):
    """``activate_result`` of a result that failed its acceptance gates."""


def known_devices(run: RunRecord, devices: Mapping[str, P.JsonObject] | None) -> dict[str, P.JsonObject]:
    """The identities of a run's devices as its stations saw them: each one's from
    ``devices`` (``CellDevices.identities``, as they are now) when it is known, else from the
    run's record. A run is stored before its devices open (often empty then), and a CiA 402
    arm may reopen with an identified model between the two (``sync_devices_model``): the
    run's record would name the model before, the stations were taken with the one after."""
    known: dict[str, P.JsonObject] = dict(run.devices or {})
    for name, ident in (devices or {}).items():
        if ident:
            known[name] = dict(ident)
    return known


def provenance(cfg: Config, run: RunRecord, record: Mapping[str, object],
               devices: Mapping[str, P.JsonObject] | None = None) -> P.JsonObject:
    """Where a result came from (the store fills in run id, parent, valid_from).

    ``record``: the result's stored record (its ``solver``). ``devices``: the identities of
    the devices as they are now (``CellDevices.identities``), merged with the run's record by
    :func:`known_devices`. ``robot_serial`` and ``kinematics_digest`` name
    the arm and the kinematic table its poses were computed with
    (``cellcal.daemon.devices.robot_identity``; None when the robot did not say, e.g. a run
    solved from given stations). ``solve_settings``: the ``[solve]`` settings its stations
    were solved with (``solve.solve_settings``), which ``cellcal stations`` writes into the
    station file so ``cellcal solve FILE`` repeats the solve. A camera result's record names
    its target file's sha256 (``target_sha256``), which the provenance keeps."""
    known = known_devices(run, devices)
    robot = known.get(P.DEVICE_ROBOT) or {}
    robot = robot if isinstance(robot, dict) else {}
    out: P.JsonObject = {
        "config_sha256": cfg.sha256, "devices": dict(known), "cellcal_version": cellcal_version(),
        "solver": str(record.get("solver") or "unknown"), "cell": cfg.service.name,
        "robot_serial": robot.get("serial"), "kinematics_digest": robot.get("kinematics_digest"),
        "solve_settings": dict(solve.solve_settings(cfg.solve)),
    }
    target = record.get("target_sha256")
    if isinstance(target, str) and target:  # a camera result: the target file it was solved with (ADR 0030)
        out["target_sha256"] = target
    return out


class ResultKeeper:
    """Stores, activates, exports and publishes results (module docstring).

    Parameters
    ----------
    cfg : Config
    store : Store
    control : JobControl
        Progress after a result is stored; the devices' identities for provenance.
    emit : callable(topic, body, retained=False)
    run_event : callable(run_id, kind, reason)
        A ``state`` message about a run.
    """

    def __init__(self, cfg: Config, store: Store, control: JobControl, emit: Emit,
                 run_event: Callable[[int, str, str], None]) -> None:
        self.cfg = cfg
        self.store = store
        self.control = control
        self._emit = emit
        self._run_event = run_event
        self._lock = threading.Lock()
        self.exports = Path(cfg.service.state_dir) / "exports"
        #: Called with the result id after a result became active by a run (the drift
        #: schedule and CUSUM start over).
        self.on_activated: Callable[[int], None] = lambda rid: None

    # ---- reading ------------------------------------------------------------------------------
    def active(self) -> ResultRecord | None:
        """The active result, or None (also when the store cannot be read now)."""
        try:
            return self.store.active_result()
        except StoreError:
            return None

    def body(self, rec: ResultRecord, *, retained: bool = False) -> dict[str, object]:
        """The ``cellcal/v1/result`` body (``protocol.ResultBody``) of a stored result."""
        return bodies.result_body(rec, cell=self.cfg.service.name, retained=retained)

    # ---- storing ------------------------------------------------------------------------------
    def newer_active(self, run: RunRecord) -> ResultRecord | None:
        """The active result if it became active after ``run`` started (its result must not
        replace it), else None. Runs stored before the start record: by run id."""
        active = self.store.active_result()
        if active is None:
            return None
        started = run.plan.get("started") or {}
        last = started.get("last_activation_id") if isinstance(started, Mapping) else None
        if isinstance(last, int) and not isinstance(last, bool):
            hist = self.store.activation_history(limit=1)
            return active if hist and hist[0].id > last else None
        return active if active.run_id is not None and active.run_id > run.id else None

    def keep(self, run: RunRecord, finished: Finished) -> int:
        """Store a run's result, activate it when it may be, close the run, export and publish."""
        report = finished.report
        prov = provenance(self.cfg, run, finished.record, devices=self.control.devices.identities())
        with self._lock:
            before = self.active()
            newer = self.newer_active(run) if report.passed else None
            rid = self.store.add_result(run.id, run.kind, finished.record, prov, parent_result_id=run.parent_result_id,
                                        activate=report.passed and newer is None)
        kept = "" if newer is None else (f"result {rid} passed its gates but was not activated: result {newer.id} "
                                         f"became active after run {run.id} started")
        self.store.set_run_status(run.id, RunStatus.DONE if report.passed else RunStatus.FAILED,
                                  report.reason() or kept)
        self.control.made_progress()
        self.export(rid)
        if before is not None and report.passed and newer is None:
            self.export(before.id)  # no longer active: its files say so
        rec = self.store.get_result(rid)
        self._log(rec)
        if not report.passed:
            self._run_event(run.id, run.kind, f"run {run.id}: result {rid} failed its acceptance gates "
                                              f"({report.reason()}); not activated")
            return rid
        if newer is not None:
            log.warning("run %d: %s", run.id, kept)
            self._run_event(run.id, run.kind, f"run {run.id}: {kept}")
            return rid
        self._emit(P.TOPIC_RESULT, self.body(rec))
        self.on_activated(rid)
        return rid

    def close_with(self, run: RunRecord, prior: ResultRecord) -> None:
        """A run killed between storing its result and closing the run (two transactions):
        close it with that result instead of solving and storing a second one."""
        failed = gates_failed(prior.result)
        self.store.set_run_status(run.id, RunStatus.FAILED if failed else RunStatus.DONE, "; ".join(failed))
        self.export(prior.id)
        if not failed:
            self._emit(P.TOPIC_RESULT, self.body(prior))

    def _log(self, rec: ResultRecord) -> None:
        """One info line per stored result: the pose with its 1-sigma, the gates, where the
        exports and the report went."""
        failed = gates_failed(rec.result)
        gates = "gates passed" if not failed else f"gates FAILED: {'; '.join(failed)}"
        narrative.info("%s; %s", human.result_line(self.body(rec), exports=str(self.exports),
                                             report=str(self.exports / f"result_{rec.id}_report.html")), gates)

    # ---- activation ----------------------------------------------------------------------------
    def activate(self, result_id: int, reason: str = "") -> int | None:
        """Make a stored result that passed its gates the active one; returns the previous id.

        Raises
        ------
        ActivationRefused
            The result failed its acceptance gates.
        UnknownRecord
            No such result.
        """
        with self._lock:
            rec = self.store.get_result(result_id)
            if not gates_passed(rec.result):
                raise ActivationRefused(f"result {result_id} failed its acceptance gates and cannot be activated")
            prev = self.store.active_result()
            self.store.activate_result(result_id, reason=reason)
        for rid in (result_id, *((prev.id,) if prev is not None and prev.id != result_id else ())):
            self.export(rid)  # both files' "active" change; exports/active follows (rollback too)
        self.publish_active()
        return prev.id if prev is not None else None

    def mark_suspect(self, rid: int, reason: str) -> None:
        """Mark a result suspect, with its files rewritten to say so and, when it is the
        active one, the result topic told (a drift check's verdict does the same in its job)."""
        self.store.mark_suspect(rid, reason)
        self.export(rid)
        active = self.active()
        if active is not None and active.id == rid:
            self.publish_active()

    def publish_active(self, *, retained: bool = False) -> None:
        """The active result on the result topic (``retained``: the periodic repetition)."""
        rec = self.active()
        if rec is not None:
            self._emit(P.TOPIC_RESULT, self.body(rec, retained=retained), retained=retained)

    # ---- exports -------------------------------------------------------------------------------
    def export(self, rid: int) -> None:
        """(Re)write a result's export files, then point ``exports/active`` at the active result's.

        Called whenever a result's state changes (stored, activated, deactivated, suspect),
        so ``active`` and ``suspect`` in its files are the store's.
        """
        try:
            rec = self.store.get_result(rid)
            write_exports(self.exports, rid, self.body(rec), self.cfg.export)
        except (OSError, CellcalError, ValueError) as exc:
            log.warning("exports of result %d failed: %s", rid, exc)
        # The HTML report beside them (it logs its own failure), before ``active`` is
        # switched, so the active directory carries the report of the same state.
        export_report(self.store, rid, self.exports, cell=self.cfg.service.name)
        try:
            sync_active(self.exports, lambda: (a.id if (a := self.active()) is not None else None))
        except (OSError, CellcalError, ValueError) as exc:
            log.warning("exports/active not switched after result %d: %s", rid, exc)

    def export_active_if_stale(self) -> None:
        """At start: no half-written export survives (a kill mid-write leaves a temp file,
        never a torn one), and ``exports/active`` names the active result (a kill between
        activating and switching it, or a state directory older than ``active``, leaves it
        behind)."""
        if self.exports.is_dir():
            remove_stale_temporaries(self.exports)
        active = self.active()
        if active is not None and active_result_id(self.exports) != active.id:
            self.export(active.id)
