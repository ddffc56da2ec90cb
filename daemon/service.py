"""The calibration service: the state machine, its job queue and its supervising loop.

Threads: the **supervising loop** (the caller of :meth:`Service.serve`, normally the main
thread) publishes the heartbeat, republishes the active result, sends systemd STATUS and
WATCHDOG (only while the worker shows progress or is idle and healthy), starts the scheduled
drift checks and turns SIGTERM into an orderly stop. The **worker** runs one job at a time
from the queue (``jobs.control.JobQueue``): a run (``jobs.run``), a drift check
(``jobs.drift``); it owns the devices (``cellcal.daemon.devices``). Between steps it checks
``abort`` (end the job) and ``stop`` (end the process): a station being committed is always
committed whole first (one SQLite transaction per station), and the long waits check them
too (``jobs.control``), so an abort ends the job within a second in every state. A run that
is queued but not begun is already in progress for a client: a second ``start_run`` is
refused and an ``abort`` closes it before it moves anything.

States (``State``, the protocol's ``StateName``): IDLE, CAPTURING, SOLVING, CHECKING,
FAULT. The worker connects the devices when it starts and, while idle, retries one that is
down with backoff (``CellDevices.connect_idle``): a device down while idle is not a FAULT.
One daemon per state directory (``store.lock.StateDirLock``).

What a run does is its kind's (``cellcal.daemon.runs``: one module per kind, never a branch
here). Faults and interrupted runs (ADR 0012): device faults are ridden out with backoff
(``jobs.control``), a store that fails a write is probed until it takes writes
(``jobs.outage``), an interrupted run resumes at once or is closed (``jobs.resume``); a
result is stored, gated, activated and exported in one place (``jobs.results``).
"""

from __future__ import annotations

import enum
import logging
import math
import signal
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeAlias, cast

from cellcal.daemon import bodies, drift, runs
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.devices import CellDevices, DeviceState
from cellcal.daemon.jobs.control import JOB_DRIFT, JOB_RUN, Abort, Emit, GiveUp, Job, JobControl, JobQueue
from cellcal.daemon.jobs.drift import DriftJob
from cellcal.daemon.jobs.outage import StoreOutages
from cellcal.daemon.jobs.results import ActivationRefused, ResultKeeper, cellcal_version
from cellcal.daemon.jobs.resume import ResumePolicy, motion_mode
from cellcal.daemon.jobs.run import RunJob
from cellcal.daemon.runs import RunContext
from cellcal.daemon.runs.kinematics import sync_devices_model
from cellcal.daemon.runs.plan import PlannedStation, plan_from_dict
from cellcal.daemon.sdnotify import Notifier
from cellcal.daemon.store import ResultRecord, RunStatus, Store, StoreError
from cellcal.daemon.store.lock import StateDirLock, StateDirLocked
from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)

__all__ = ["State", "Service", "ServiceError", "StateDirLock", "StateDirLocked", "cellcal_version", "next_deadline", "Listener"]

#: ``fn(topic, body)`` for every event; the body is a dict (the wire TypedDicts are), not to be changed.
Listener: TypeAlias = Callable[[str, dict[str, object]], None]


def next_deadline(deadline: float, period_s: float, now: float) -> float:
    """The next deadline on the grid ``deadline + k * period_s`` (k >= 1) after a turn that
    was due at ``deadline`` and finished at ``now``.

    Periodic work is scheduled on absolute monotonic time: the period does not stretch by
    however late each turn ran. After a stall longer than a period, the latest grid point
    not after ``now`` is returned (due at once): one late turn, then the grid again; the
    other missed turns are skipped, never sent in a burst.
    """
    nxt = deadline + period_s
    if nxt <= now:
        nxt += math.floor((now - nxt) / period_s) * period_s
    return nxt


#: The supervising loop's longest sleep (s): how often it looks at the stop predicate, the
#: worker's liveness and the drift schedule between deadlines.
_TICK_S = 0.05


class State(str, enum.Enum):
    """The service's state; the values are the protocol's ``StateName``."""

    IDLE = P.STATE_IDLE
    CAPTURING = P.STATE_CAPTURING
    SOLVING = P.STATE_SOLVING
    CHECKING = P.STATE_CHECKING
    FAULT = P.STATE_FAULT

    @property
    def wire(self) -> P.StateName:
        return self.value


class ServiceError(CellcalError):
    """A request the service cannot honour now (``code`` is the ZeroMQ error code)."""

    def __init__(self, code: str, message: str) -> None:
        if code not in P.ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        self.code = cast(P.ErrorCode, code)  # checked against ERROR_CODES, the ErrorCode literals, above
        super().__init__(message)


class Service:
    """The daemon. Construct (no I/O), :meth:`start`, then :meth:`serve` until stopped.

    ``cellcal.daemon.app.App`` builds it with its store and ZeroMQ server; constructed
    alone (tests) it makes, opens and closes a store of its own.

    Parameters
    ----------
    cfg : Config
        Loaded configuration.
    store : Store, optional
        The store (the caller opens and closes it). Default: one in
        ``[service] state_dir`` that :meth:`start` opens and :meth:`shutdown` closes.
    notifier : Notifier, optional
        systemd's ``sd_notify`` (``ready``, ``status``, ``watchdog``, ``stopping``).
    publish : callable(topic, body, retained=False), optional
        Where events go (the ZeroMQ server's ``publish``); also see :meth:`add_listener`.
    """

    def __init__(self, cfg: Config, *, store: Store | None = None, notifier: Notifier | None = None,
                 publish: Emit | None = None) -> None:
        self.cfg = cfg
        self.notifier = notifier
        self._publish_fn = publish
        self._listeners: list[Listener] = []
        self._owns_store = store is None
        self.lock = StateDirLock(cfg.service.state_dir)
        self.store = store if store is not None else Store(cfg.service.state_dir)
        self.state = State.IDLE
        self.state_detail = ""
        self.boot_id = uuid.uuid4().hex
        self._t_start = time.monotonic()
        self._jobs = JobQueue()
        self._current: Job | None = None
        self._lock = threading.RLock()
        self._worker: threading.Thread | None = None
        self.fatal: BaseException | None = None
        self._devices = CellDevices(cfg)
        self._motion_mode = motion_mode(cfg)
        self.control = JobControl(cfg, self._devices, self._to_state, self._emit)
        self.control.before_open = lambda: sync_devices_model(self.cfg, self.store, self._devices, self.results.mark_suspect)
        self.ctx = RunContext(cfg, self.store, lambda: self._devices.model, self._motion_mode, self.control.abort)
        self.results = ResultKeeper(cfg, self.store, self.control, self._emit, self._run_event)
        self.policy = ResumePolicy(cfg, self.store, self.ctx, self._run_event)
        self.outages = StoreOutages(cfg, self.store, self.control, self.policy, self._to_state)
        self.control.on_progress = self.outages.progress
        self.runs = RunJob(cfg, self.store, self.ctx, self.control, self.results, self.policy, self._emit,
                           self._run_event)
        self.drift = DriftJob(cfg, self.store, self.control, self.results, self._emit, self._recalibrate)
        self.results.on_activated = self.drift.activated

    @property
    def devices(self) -> dict[str, DeviceState]:
        """Per device: connected, url, identity (``CellDevices.status``)."""
        return self._devices.status

    # ---- events ----------------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(topic, body)`` for every event (the demo prints progress from it)."""
        self._listeners.append(fn)

    def set_publisher(self, publish: Emit) -> None:
        self._publish_fn = publish

    def _emit(self, topic: str, body: Mapping[str, object], *, retained: bool = False) -> None:
        # Every body is built as a dict (bodies.py: TypedDicts are dicts at runtime).
        as_dict = cast(dict[str, object], body)
        for fn in list(self._listeners):
            try:
                fn(topic, as_dict)
            except Exception:  # noqa: BLE001 - a listener must not break the daemon
                log.exception("event listener failed")
        if self._publish_fn is not None:
            try:
                self._publish_fn(topic, body, retained=retained)
            except Exception:  # noqa: BLE001
                log.exception("publish failed")

    @property
    def phase(self) -> str:
        """What the current job does now: "moving", "settling", "measuring", "solving", or
        "" (idle, or between steps). For people (``get_status`` detail) and tests."""
        if self._current is None:
            return ""
        if self.state == State.SOLVING:
            return "solving"
        engine = self._devices.engine
        return engine.phase if engine is not None else ""

    def _kind_name(self) -> P.RunKind | None:
        kind = self.runs.kind if self._current is not None and self._current.kind == JOB_RUN else None
        return kind.name if kind is not None else None

    def _to_state(self, state: P.StateName, detail: str = "") -> None:
        self._set_state(State(state), detail)

    def _set_state(self, state: State, detail: str = "") -> None:
        with self._lock:
            previous = self.state
            changed = state != self.state or detail != self.state_detail
            self.state, self.state_detail = state, detail
            self.control.state, self.control.detail = state.wire, detail
        if not changed:
            return
        log.info("state %s %s", state.value, detail)
        job = self._current
        self._emit(P.TOPIC_STATE, bodies.state(
            state.wire, previous=previous.wire, reason=detail, run_id=job.run_id if job is not None else None,
            kind=self._kind_name() if state in (State.CAPTURING, State.SOLVING) else None,
            motion_mode=self._motion_mode,
        ))
        if self.notifier is not None:
            self.notifier.status(f"{state.value} {detail}".strip())
        fault = self.control.last_fault
        if previous == State.FAULT and state != State.FAULT and fault is not None:
            # The fault topic is raised *and cleared* (protocol.FaultBody.active): without
            # this, its latest message (what a late joiner's snapshot shows) stays an
            # active fault after the service recovered.
            self.control.last_fault = None
            self._emit(P.TOPIC_FAULT, bodies.fault_cleared(fault, state.wire))

    def _run_event(self, run_id: int, kind: str | None, reason: str) -> None:
        """A state message for something that happened to a run without a state change."""
        known = cast(P.RunKind, kind) if kind in P.RUN_KINDS else None  # RUN_KINDS: the RunKind literals
        self._emit(P.TOPIC_STATE, bodies.state(self.state.wire, previous=self.state.wire, reason=reason, run_id=run_id,
                                               kind=known, motion_mode=self._motion_mode))

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Open and replay the store, resume or close unfinished runs, start the worker.

        At most the newest unfinished run resumes (ADR 0012, ``jobs.resume``).
        """
        self.lock.acquire()  # App.open took it before opening the store; alone, we take it here
        Path(self.cfg.service.runtime_dir).mkdir(parents=True, exist_ok=True)
        if self._owns_store:
            self.store.open()
        self.results.export_active_if_stale()
        for run in self.store.unfinished_runs():
            job = self.policy.at_start(run)
            if job is not None:
                self._jobs.put(job)
        self._worker = threading.Thread(target=self._work, name="cellcal-worker", daemon=True)
        self._worker.start()

    def ready(self) -> None:
        """Tell systemd the service is up (after the sockets are bound)."""
        if self.notifier is not None:
            self.notifier.ready()
            self.notifier.status(self.state.value)

    def request_stop(self, *_: object) -> None:
        """Finish the current transaction and stop (signal-handler safe)."""
        self.control.stop.set()
        self.control.abort.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def serve(self, *, until: Callable[[], bool] | None = None) -> None:
        """The supervising loop: heartbeat, retained result, STATUS/WATCHDOG, until stopped."""
        z = self.cfg.zmq
        stop = self.control.stop
        next_hb = time.monotonic()
        next_retain = time.monotonic() + z.republish_s
        wd = self.notifier.watchdog_interval_s() if self.notifier is not None else None
        next_wd = time.monotonic()
        last_wd_progress = self.control.progress_ns
        while not stop.is_set() and not (until is not None and until()):
            now = time.monotonic()
            if now >= next_hb:
                self._emit(P.TOPIC_HEARTBEAT, self.heartbeat())
                next_hb = next_deadline(next_hb, z.heartbeat_s, time.monotonic())
            if now >= next_retain:
                self.results.publish_active(retained=True)
                next_retain = next_deadline(next_retain, z.republish_s, time.monotonic())
            if wd and self.notifier is not None and now >= next_wd:
                # WATCHDOG only after real progress: the worker moved on since the last ping,
                # or it is idle waiting for work (its liveness is then the queue wait itself).
                worker_ok = self._worker is not None and self._worker.is_alive()
                if worker_ok and (self.control.progress_ns != last_wd_progress or self._current is None):
                    self.notifier.watchdog()
                    last_wd_progress = self.control.progress_ns
                next_wd = now + wd / 2.0
            due = self.drift.next_due_s
            if due is not None and now >= due and self._current is None:
                self.drift.next_due_s = None
                try:
                    self.request_drift_check("schedule")
                except ServiceError as exc:
                    log.info("scheduled drift check not started: %s", exc)
            if self._worker is not None and not self._worker.is_alive() and not stop.is_set():
                log.error("worker thread died; stopping")
                break
            # Sleep until the next deadline (at most one tick: the stop predicate and the
            # worker's liveness are checked every tick), so a beat is sent when it is due
            # rather than on the next tick after it.
            due_next = min(next_hb, next_retain, next_wd if wd else math.inf)
            stop.wait(max(0.0, min(_TICK_S, due_next - time.monotonic())))
        if self.notifier is not None:
            self.notifier.stopping()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the worker (after its current transaction), close devices (and an own store)."""
        self.request_stop()
        if self._worker is not None:
            self._worker.join(timeout=timeout_s)
        self._devices.close()
        if self._owns_store:
            self.store.close()
            self.lock.release()  # with App, App releases it after closing the store

    # ---- public requests (thread-safe) -----------------------------------------------------------
    def heartbeat(self) -> P.HeartbeatBody:
        """The ``cellcal/v1/heartbeat`` body (``protocol.HeartbeatBody``)."""
        active = self.results.active()
        job = self._current
        run_id = None
        if job is not None:
            run_id = str(job.run_id) if job.run_id is not None else f"check-{id(job):x}"
        return bodies.heartbeat(
            cell=self.cfg.service.name, state=self.state.wire, detail=self.state_detail,
            uptime_s=time.monotonic() - self._t_start, heartbeat_s=self.cfg.zmq.heartbeat_s,
            devices=self._devices.status, active_result_id=active.id if active else None,
            suspect=bool(active.suspect) if active else False, run_id=run_id, version=cellcal_version(),
        )

    def status(self) -> P.StatusResult:
        """The heartbeat plus the job queue, the last drift check and the CUSUM."""
        return bodies.status(self.heartbeat(), queued_jobs=self._jobs.qsize(), last_drift=self.drift.last,
                             cusum_m=self.drift.cusum.value_m)

    def current_run_id(self) -> int | None:
        """The run the worker is on now, else the run queued next (None when there is none)."""
        job = self._current
        if job is not None:
            return job.run_id
        queued = self._jobs.runs()
        return queued[0].run_id if queued else None

    def _run_in_progress(self) -> int | None:
        """The open run being worked on, if any (``-1`` for a run job without an id yet).

        A run closed in the store is over (its result is already published); only its job
        is winding down, and a client reacting to the result must not be told it is busy.
        """
        current = self._current
        if current is None or current.kind != JOB_RUN:
            queued = self._jobs.runs()  # started, not yet taken by the worker: in progress too
            return next((j.run_id for j in queued if j.run_id is not None), -1) if queued else None
        if current.run_id is None:
            return -1
        return current.run_id if self.store.get_run(current.run_id).is_open else None

    def start_run(self, kind: str | None = None, *, plan: list[PlannedStation] | None = None,
                  stations: list[P.JsonObject] | None = None, parent_result_id: int | None = None,
                  reason: str = "") -> int:
        """Queue a calibration run; returns its id (the run is stored before this returns)."""
        name = kind or self.cfg.solve.kind
        if name not in runs.names():
            raise ServiceError(P.E_BAD_REQUEST, f"kind must be {', '.join(runs.names())}, got {name!r}")
        self._refuse_during_store_fault()
        self._refuse_busy()
        run_kind = runs.for_new_run(name, self.cfg.tracker.measure)
        if stations is None:
            refusal = run_kind.refuse_start(self.ctx)
            if refusal is not None:
                raise ServiceError(P.E_STATE, refusal)
        plan_dict: P.JsonObject = ({"stations": [], "given": list(stations)} if stations is not None
                                   else run_kind.plan(self.ctx, plan))
        run_id = self._create_run(name, plan_dict, parent_result_id)
        self._jobs.put(Job(JOB_RUN, run_id, reason or "requested"))
        return run_id

    def _create_run(self, kind: str, plan_dict: P.JsonObject, parent_result_id: int | None) -> int:
        """Store a run with its plan and what it remembers of its start: the motion mode it
        may resume in, what its stations measure, and the newest activation then (a result
        activated later is newer than the run, and the run's result will not replace it)."""
        hist = self.store.activation_history(limit=1)
        plan_dict["started"] = {"motion_mode": self._motion_mode, "measure": self.cfg.tracker.measure,
                                "last_activation_id": hist[0].id if hist else 0}
        return self.store.create_run(kind, plan_dict, config_sha256=self.cfg.sha256,
                                     devices=self._devices.identities(), parent_result_id=parent_result_id)

    def _recalibrate(self, result_id: int) -> None:
        """A recalibration after a failed drift check: a run of the configured kind and plan."""
        kind = runs.for_new_run(self.cfg.solve.kind, self.cfg.tracker.measure)
        run_id = self._create_run(self.cfg.solve.kind, kind.plan(self.ctx), result_id)
        self._jobs.put(Job(JOB_RUN, run_id, "recalibrate after drift"))

    def _refuse_busy(self) -> None:
        """E_BUSY while a run is in progress; E_STATE when that run is held in FAULT (its
        devices are being retried: waiting will not help, an abort or the fault's end will;
        docs/protocols/zeromq.md)."""
        busy = self._run_in_progress()
        if busy is None:
            return
        which = "a run" if busy < 0 else f"run {busy}"
        if self.state == State.FAULT:
            raise ServiceError(P.E_STATE, f"the daemon is in FAULT ({self.state_detail}); {which} waits for the "
                                          "fault to clear: abort it, or wait for it to resume")
        raise ServiceError(P.E_BUSY, f"{which} is in progress")

    def _refuse_during_store_fault(self) -> None:
        if self.outages.pending:
            raise ServiceError(P.E_STATE, f"the store failed a write and is being retried (next in "
                                          f"{self.outages.wait_s():.1f} s): {self.state_detail}")

    def abort(self) -> bool:
        """Abort the current job and stop the robot; False when nothing was running.

        The current station finishes its transaction first; the stop command goes to the
        robot at once (from the caller's thread, so it never waits for the worker).
        """
        if self._current is None and self.outages.abort_waiting_run():
            return True  # the run waits for the store: it will be closed as aborted, never resumed
        if self._current is None and self.policy.abort_queued(self._jobs.take_runs()):
            return True  # started but not yet begun: closed before they move anything
        busy = self._current is not None
        if busy:
            self.control.abort.set()
            self._devices.stop_robot()
        return busy

    def request_drift_check(self, reason: str = "requested") -> tuple[int, int]:
        """Queue a drift check of the active result; returns ``(result_id, check_id)``.

        The check id is allocated now (ADR 0009): the ``cellcal/v1/drift`` message of this
        check carries it.

        Raises
        ------
        ServiceError
            ``E_NO_CALIBRATION``: no active result, or one without ``cell_T_base`` and
            ``flange_T_target`` (a point calibration: ``flange_p_target``);
            ``E_BUSY``: a calibration run is in progress (its result will replace the one
            the check would measure).
        """
        rec = self.results.active()
        if rec is None:
            raise ServiceError(P.E_NO_CALIBRATION, "no active calibration to check")
        if drift.model_of(rec.result) is None:
            # The model X G Y a tracker measurement is compared with needs cell_T_base and
            # the target on the flange (its pose, or a point calibration's reflector point).
            raise ServiceError(P.E_NO_CALIBRATION,
                               f"result {rec.id} ({rec.kind}) has no cell_T_base with flange_T_target or "
                               "flange_p_target to check")
        self._refuse_during_store_fault()
        self._refuse_busy()
        check_id = self.drift.check_ids.allocate(rec.id)
        self._jobs.put(Job(JOB_DRIFT, None, reason, result_id=rec.id, check_id=check_id))
        return rec.id, check_id

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no job is queued or running (tests and the demo)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._current is None and self._jobs.empty():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def make_plan(self, kind: str | None = None) -> list[PlannedStation]:
        """The stations a new run of ``kind`` (default: the configured one) would plan."""
        name = kind or self.cfg.solve.kind
        return plan_from_dict(runs.for_new_run(name, self.cfg.tracker.measure).plan(self.ctx))

    # ---- results for clients -----------------------------------------------------------------------
    def result_body(self, rec: ResultRecord, *, retained: bool = False) -> dict[str, object]:
        """The ``cellcal/v1/result`` body (``protocol.ResultBody``) of a stored result."""
        return self.results.body(rec, retained=retained)

    def result_summary(self, rec: ResultRecord) -> P.ResultSummary:
        return bodies.result_summary(rec)

    def republish_result(self) -> None:
        """The active result again, marked ``retained`` (every ``[zmq] republish_s``)."""
        self.results.publish_active(retained=True)

    def activate_result(self, result_id: int, reason: str = "") -> int | None:
        """Make a stored result that passed its gates the active one; returns the previous id.

        Raises
        ------
        ServiceError
            ``E_STATE``: the result failed its acceptance gates.
        UnknownRecord
            No such result.
        """
        try:
            return self.results.activate(result_id, reason)
        except ActivationRefused as exc:
            raise ServiceError(P.E_STATE, str(exc)) from None

    # ---- the worker ------------------------------------------------------------------------------------
    def _work(self) -> None:
        if self._jobs.empty():
            self.control.before_open_at_start()  # the robot's model (and suspects) before the idle open
            self._devices.connect_idle(self.control.stop)  # at start: the heartbeat and the first run know the devices
        while not self.control.stop.is_set():
            if self.outages.pending:
                resumed = self.outages.step()
                if resumed is not None:
                    self._run_job(resumed)
                continue
            job = self._jobs.get(timeout_s=0.2)
            if job is None:
                self.control.progress()
                self._devices.connect_idle(self.control.stop)
                continue
            self._run_job(job)
        self._devices.close()

    def _run_job(self, job: Job) -> None:
        self._current = job
        self.control.begin_job()
        try:
            if job.kind == JOB_RUN:
                self.runs.execute(job)
            else:
                self.drift.execute(job)
        except Abort:
            self._aborted(job)
        except GiveUp as exc:
            self._give_up(job, exc)
        except StoreError as exc:
            # The store cannot take writes (disk full, read-only): a fault, never a crash;
            # what was committed stays, and the worker probes the store until it recovers.
            self.outages.fault(job, exc)
        except Exception as exc:  # noqa: BLE001 - the worker must survive any job
            log.exception("job %s failed", job.kind)
            self._internal_failure(job, exc)
        finally:
            self._devices.end_job()
            self._current = None
            self.runs.kind = None
            job.done.set()
            self.control.progress()
            if self.state != State.FAULT:
                self._set_state(State.IDLE)

    def _aborted(self, job: Job) -> None:
        engine = self._devices.engine
        if engine is not None and engine.pending_move is not None and engine.pending_move.is_alive():
            # The driver's move wait outlives the abort (it waits for a target the stop made
            # unreachable): closing the robot ends it; the idle loop reconnects.
            self._devices.close()
        if job.kind != JOB_RUN or job.run_id is None or self.control.stop.is_set():
            return  # stopping leaves the run open so it resumes on the next start
        try:  # an abort closes it (unless it already ended, e.g. in the same instant)
            if self.store.get_run(job.run_id).is_open:
                self.store.set_run_status(job.run_id, RunStatus.ABORTED, "aborted by request")
            self._run_event(job.run_id, self._kind_name(), f"run {job.run_id} aborted")
        except StoreError as exc:
            self.outages.fault(job, exc, close=(RunStatus.ABORTED, "aborted by request"))

    def _close_failed(self, job: Job, reason: str) -> bool:
        """Close ``job``'s run (if open) as failed; False when the store could not write it
        (the store's outage then closes it when it comes back)."""
        if job.kind != JOB_RUN or job.run_id is None:
            return True
        try:
            if self.store.get_run(job.run_id).is_open:
                self.store.set_run_status(job.run_id, RunStatus.FAILED, reason)
        except StoreError as store_exc:
            self.outages.fault(job, store_exc, close=(RunStatus.FAILED, reason))
            return False
        return True

    def _internal_failure(self, job: Job, exc: Exception) -> None:
        """An exception nobody expected (a programming error) ended a job: the run is closed
        as failed with the exception named, so its waiters and ``list_results`` see why
        instead of an open run nothing works on (resumed at the next start as if
        interrupted); its stations stay stored. FAULT with ``E_INTERNAL``; the daemon
        keeps serving and the next run starts as usual."""
        what = f"internal error: {type(exc).__name__}: {exc}"
        if not self._close_failed(job, what):
            return
        where = f"run {job.run_id}" if job.kind == JOB_RUN and job.run_id is not None else job.kind
        self.control.fault(f"{where} failed: {what}", exc, code=P.E_INTERNAL)

    def _give_up(self, job: Job, exc: GiveUp) -> None:
        """A fault outlasted ``resume_within_s``: the run is closed as failed, never resumed later."""
        self._devices.close()
        if not self._close_failed(job, str(exc)):
            return
        reason = (f"run {job.run_id} failed: {exc}" if job.kind == JOB_RUN and job.run_id is not None
                  else f"{job.kind} abandoned: {exc}")
        self.control.fault(reason, exc.cause, device=exc.device)
