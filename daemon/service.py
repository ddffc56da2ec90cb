"""The calibration service: the state machine, its job worker and its supervising loop.

Threads
-------
* The **supervising loop** (the caller of :meth:`Service.serve`, normally the main
  thread) publishes the heartbeat, republishes the active result, sends systemd STATUS and
  WATCHDOG (only while the worker shows progress or is idle and healthy), starts the
  scheduled drift checks and turns SIGTERM into an orderly stop.
* The **worker** runs one job at a time from a queue: a calibration run, a drift check. It
  owns the devices (``cellcal.daemon.devices``). Between steps it checks ``abort`` (end the
  job) and ``stop`` (end the process): a station being committed is always committed whole
  before either takes effect (one SQLite transaction per station). The long waits inside a
  step check them too -- the move (``CaptureEngine.move_to`` with the abort event), the
  settle and window waits, a tracker measurement, the solve (:meth:`Service._interruptible`),
  the reconnection backoff -- so an abort ends the job within a second in every state.

States (``State``, the protocol's ``StateName``): IDLE, CAPTURING, SOLVING, CHECKING,
FAULT. The worker connects the devices when it starts and, while idle, retries one that is
down with backoff (:meth:`Service._connect_idle`): the heartbeat tells the truth and a run's
record names its devices from its start. A device down while idle is not a FAULT.
One daemon per state directory: :class:`StateDirLock` (``<state_dir>/cellcal.lock``).

Every station, result and drift check is logged at info in words (``cellcal.daemon.human``).

Faults and interrupted runs (ADR 0012)
--------------------------------------
* A **device** that fails during a job puts the service in FAULT; the worker waits, then
  reopens the devices, with one exponential backoff per job (``fault_retry_min_s`` ..
  ``fault_retry_max_s``) that only real progress (an accepted station) resets, so a device
  that reopens at once and fails again backs off instead of flapping. When the devices are
  back the state goes from FAULT straight back to the job's state (never through IDLE) and
  the job goes on where it was.
* A **store** that fails a write (disk full, read-only) ends the job in FAULT; the worker
  probes the store with the same kind of backoff and leaves FAULT by itself when it takes
  writes again.
* A run interrupted by a fault is either **resumed at once when the fault clears**, within
  ``[service] resume_within_s`` of the interruption, or **closed as failed**; a run never
  resumes once a newer run exists, nor in another motion mode than it was started in, nor
  (a base-frame run) with another ``[tracker] measure`` (pose and point stations). On
  start the same rule is applied to every run the store says is open (a crash, kill -9 or
  SIGTERM interrupted it): at most the newest one resumes, skipping its committed stations.
  Every resumption is logged and published (``state``) and, in command mode, says that the
  daemon moves the robot.
* A result **never replaces an active one that became active after its run started**
  (another run's, or one an operator activated): it is stored, not activated, and the run's
  ``state`` event says so.
* A change of the controller's TCP offset or payload during a job ends it
  (a ``capture.DeviceFault`` with ``ends_job``): a run is closed as failed.

What the worker delegates: stations are taken by ``capture``, stored by ``store``, solved
by ``solve`` (gates: ``gates``), drift is judged by ``drift``, and every body it emits is
built by ``bodies``; this module decides what happens when.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import math
import queue
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, cast

import numpy as np

from cellcal.daemon import bodies, drift, human, kinematics_run, solve
from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.devices import Backoff, CellDevices, DeviceOpenError
from cellcal.daemon.gates import check_gates, gates_failed, gates_passed
from cellcal.daemon.plan import PlannedStation, plan_from_config, plan_from_dict, plan_to_dict, stations_to_visit, to_target
from cellcal.daemon.store import ResultRecord, RunStatus, StationRecord, Store, StoreError
from cellcal.solver import CalibrationError, DegenerateGeometry
from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)

__all__ = ["State", "Service", "ServiceError", "StateDirLock", "StateDirLocked", "cellcal_version", "next_deadline"]


@functools.cache
def cellcal_version() -> str:
    """The installed cellcal's version, read once per process (every heartbeat and status
    names it, and ``importlib.metadata`` scans the installed distributions on each call)."""
    try:
        return version("cellcal")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


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
        self.code = cast(P.ErrorCode, code)
        super().__init__(message)


class StateDirLocked(CellcalError):
    """Another daemon holds the state directory's lock file (the message names its pid)."""


class StateDirLock:
    """``<state_dir>/cellcal.lock``: one daemon per state directory.

    An exclusive ``flock`` on the file, held while the daemon runs; the holder's pid is
    written into it so a refused second daemon can name it. The kernel drops the lock when
    its process dies (kill -9 included), so a stale file never blocks a restart.
    """

    NAME = "cellcal.lock"

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / self.NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock (idempotent).

        Raises
        ------
        StateDirLocked
            Another process (or another daemon in this one) holds it.
        OSError
            The state directory cannot be created or the file opened.
        """
        import fcntl
        import os

        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            # A state directory nobody can write (read-only, full, not ours): no daemon can
            # run on it, and the store's own error says why in its words.
            log.debug("no lock file in %s: %s", self.path.parent, exc)
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise StateDirLocked(f"state directory {self.path.parent} is in use by another cellcal daemon "
                                 f"(pid {holder}, lock file {self.path}); stop it, or give this one another "
                                 "[service] state_dir") from None
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        except OSError as exc:  # a full disk: the lock holds all the same; the store says what is wrong
            log.debug("cannot write the pid into %s: %s", self.path, exc)

    def release(self) -> None:
        """Drop the lock (idempotent); the file stays (removing it would race a new holder)."""
        import os

        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor releases the flock


class _Abort(CellcalError):
    """Private control flow: the current job was aborted or the service is stopping.

    Raised by :meth:`Service._check_abort` inside the worker and caught by the worker's job
    loop, never outside it.
    """


class _GiveUp(CellcalError):
    """Private control flow: a fault did not clear within ``resume_within_s``; the job ends
    (a run is closed as failed). Caught by the worker's job loop."""

    def __init__(self, message: str, cause: BaseException | None, device: P.DeviceName | None) -> None:
        self.cause = cause
        self.device = device
        super().__init__(message)


@dataclass
class _Job:
    kind: str  # "run" | "drift"
    run_id: int | None = None
    reason: str = ""
    result_id: int | None = None  # drift: the result to check, fixed when it was requested
    check_id: int | None = None   # drift: its id, promised in the run_drift_check reply
    resume: str | None = None     # run: what it resumes after ("a restart", "the store fault cleared")
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _StoreOutage:
    """A store that failed a write: what the worker does until (and when) it takes writes again."""

    run_id: int | None           # the run the failed write belonged to (None: no run)
    since: float                 # time.monotonic() of the first failure of this outage
    backoff: Backoff
    next_try: float = 0.0        # time.monotonic() of the next probe
    pending: bool = True         # still waiting for the store
    aborted: bool = False        # an abort came meanwhile: close the run as aborted
    close: tuple[RunStatus, str] | None = None  # close the run so, instead of deciding anew


_RUN, _DRIFT = "run", "drift"


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
    notifier : object, optional
        ``cellcal.daemon.sdnotify.Notifier``-like (``ready``, ``status``, ``watchdog``,
        ``stopping``, ``watchdog_interval_s``).
    publish : callable(topic, body, retained=False), optional
        Where events go (the ZeroMQ server's ``publish``); also see :meth:`add_listener`.
    """

    def __init__(self, cfg: Config, *, store: Store | None = None, notifier: Any = None,
                 publish: Callable[..., None] | None = None) -> None:
        self.cfg = cfg
        self.notifier = notifier
        self._publish_fn = publish
        self._listeners: list[Callable[[str, dict], None]] = []
        self._owns_store = store is None
        self.lock = StateDirLock(cfg.service.state_dir)
        self.store = store if store is not None else Store(cfg.service.state_dir)
        self.state = State.IDLE
        self.state_detail = ""
        self.boot_id = uuid.uuid4().hex
        self._t_start = time.monotonic()
        self._jobs: queue.Queue[_Job] = queue.Queue()
        self._current: _Job | None = None
        self._abort = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.RLock()
        self._worker: threading.Thread | None = None
        self._progress_ns = time.monotonic_ns()
        self._devices = CellDevices(cfg)
        self._cusum = drift.Cusum()
        self._check_ids = drift.CheckIds(self.store)
        self._current_kind: str | None = None
        self._last_drift: dict | None = None
        self._next_drift_s: float | None = None
        self.fatal: BaseException | None = None
        self._last_fault: P.FaultBody | None = None  # the fault body to clear when FAULT ends
        # The current job's fault backoff and when its current outage began (monotonic):
        # both reset only by progress, so a device that fails right after reopening backs off.
        self._backoff = Backoff(cfg.service.fault_retry_min_s, cfg.service.fault_retry_max_s)
        self._outage_since: float | None = None
        self._store_outage: _StoreOutage | None = None
        # Deciding whether a result may become active and activating it are one step
        # against an operator's activate_result.
        self._activation_lock = threading.Lock()
        # The idle loop's connection attempts (:meth:`_connect_idle`).
        self._idle_backoff = Backoff(cfg.service.fault_retry_min_s, cfg.service.fault_retry_max_s)
        self._idle_next_try = 0.0
        self._idle_failures: dict[str, str] = {}

    @property
    def devices(self) -> dict[str, dict[str, Any]]:
        """Per device: connected, url, identity (``CellDevices.status``)."""
        return self._devices.status

    @property
    def _motion_mode(self) -> P.MotionMode:
        return cast(P.MotionMode, self.cfg.capture.motion_mode)

    # ---- events ----------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[str, dict], None]) -> None:
        """Call ``fn(topic, body)`` for every event (the demo prints progress from it)."""
        self._listeners.append(fn)

    def _emit(self, topic: str, body: Any, *, retained: bool = False) -> None:
        for fn in list(self._listeners):
            try:
                fn(topic, body)
            except Exception:  # noqa: BLE001 - a listener must not break the daemon
                log.exception("event listener failed")
        if self._publish_fn is not None:
            try:
                self._publish_fn(topic, body, retained=retained)
            except Exception:  # noqa: BLE001
                log.exception("publish failed")

    def _emit_logged(self, topic: str, body: Any) -> None:
        """Emit a station or drift body and log it in words, at info (one line each: the
        journal reads like ``cellcal watch``)."""
        log.info("%s", human.station_line(body) if topic == P.TOPIC_STATION else human.drift_line(body))
        self._emit(topic, body)

    def _log_result(self, rid: int) -> None:
        """One info line per stored result: the pose with its 1-sigma, the gates, where the
        exports and the report went."""
        try:
            rec = self.store.get_result(rid)
        except StoreError as exc:
            log.warning("result %d stored; it cannot be read back to log it: %s", rid, exc)
            return
        body = self.result_body(rec)
        exports = Path(self.cfg.service.state_dir) / "exports"
        failed = gates_failed(rec.result)
        gates = "gates passed" if not failed else f"gates FAILED: {'; '.join(failed)}"
        log.info("%s; %s", human.result_line(body, exports=str(exports),
                                             report=str(exports / f"result_{rid}_report.html")), gates)

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

    def _kind_of(self, kind: str | None) -> P.RunKind | None:
        return cast(P.RunKind, kind) if kind in P.RUN_KINDS else None

    def _set_state(self, state: State, detail: str = "") -> None:
        with self._lock:
            previous = self.state
            changed = state != self.state or detail != self.state_detail
            self.state, self.state_detail = state, detail
        if changed:
            log.info("state %s %s", state.value, detail)
            job = self._current
            self._emit(P.TOPIC_STATE, bodies.state(
                state.wire, previous=previous.wire, reason=detail,
                run_id=job.run_id if job is not None else None,
                kind=self._kind_of(self._current_kind) if state in (State.CAPTURING, State.SOLVING) else None,
                motion_mode=self._motion_mode,
            ))
            if self.notifier is not None:
                self.notifier.status(f"{state.value} {detail}".strip())
            fault = self._last_fault
            if previous == State.FAULT and state != State.FAULT and fault is not None:
                # The fault topic is raised *and cleared* (protocol.FaultBody.active): without
                # this, its latest message (what a late joiner's snapshot shows) stays an
                # active fault after the service recovered.
                self._last_fault = None
                self._emit(P.TOPIC_FAULT, bodies.fault_cleared(fault, state.wire))

    def _run_event(self, run_id: int, kind: str | None, reason: str) -> None:
        """A state message for something that happened to a run without a state change."""
        self._emit(P.TOPIC_STATE, bodies.state(self.state.wire, previous=self.state.wire, reason=reason, run_id=run_id,
                                               kind=self._kind_of(kind), motion_mode=self._motion_mode))

    def _progress(self) -> None:
        self._progress_ns = time.monotonic_ns()

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Open and replay the store, resume or close unfinished runs, start the worker.

        At most the newest unfinished run resumes (ADR 0012): an older one, one started in
        another motion mode, or one interrupted longer than ``resume_within_s`` ago is
        closed as failed, and that is logged and published.
        """
        self.lock.acquire()  # App.open took it before opening the store; alone, we take it here
        Path(self.cfg.service.runtime_dir).mkdir(parents=True, exist_ok=True)
        if self._owns_store:
            self.store.open()
        from cellcal.daemon.exports import remove_stale_temporaries

        exports = Path(self.cfg.service.state_dir) / "exports"
        if exports.is_dir():
            remove_stale_temporaries(exports)  # a kill mid-write leaves a temp file, never a torn one
        self._export_active_if_stale(exports)
        for run in self.store.unfinished_runs():
            job = self._startup_job(run)
            if job is not None:
                self._jobs.put(job)
        self._worker = threading.Thread(target=self._work, name="cellcal-worker", daemon=True)
        self._worker.start()

    def _startup_job(self, run: Any) -> _Job | None:
        """The job that resumes an unfinished run found at start, or None after closing it."""
        if any(r.run_id == run.id for r in self.store.list_results(limit=10)):
            # Killed between storing the result and closing the run: closing it with that
            # result needs neither the devices nor a decision (``_execute_run``).
            return _Job(_RUN, run.id, "close after a restart")
        why = self._why_not_resume(run, self._wall_age_s(run.updated_utc), "a restart")
        if why is not None:
            log.warning("%s", why)
            self.store.set_run_status(run.id, RunStatus.FAILED, why)
            self._run_event(run.id, run.kind, why)
            return None
        moves = self._moves_robot(run)
        log.warning("run %d (%s) resumes after a restart with %d stations committed%s", run.id, run.kind,
                    run.n_stations, "; the daemon moves the robot (command mode)" if moves else "")
        return _Job(_RUN, run.id, "resume", resume="a restart")

    @staticmethod
    def _wall_age_s(utc: str) -> float | None:
        """Seconds since a stored wall-clock stamp (None if unreadable). The only clock a
        run's last progress and a restart share is the wall clock; a step of it counts as
        a long interruption, which closes the run rather than resuming it."""
        try:
            return (time.time_ns() - bodies.iso_ns(utc)) * 1e-9
        except ValueError:
            return None

    def _moves_robot(self, run: Any) -> bool:
        """Whether resuming ``run`` moves the robot (command mode, stations left to take)."""
        if "given" in run.plan or self._motion_mode != P.MOTION_COMMAND:
            return False
        return run.n_stations < len(run.plan.get("stations", []))

    def _why_not_resume(self, run: Any, interrupted_s: float | None, cause: str) -> str | None:
        """Why an interrupted ``run`` must be closed instead of resumed (None: it may resume)."""
        newest = self.store.list_runs(limit=1)
        if newest and newest[0].id > run.id:
            return (f"run {run.id} closed, not resumed: run {newest[0].id} was started after it "
                    f"(interrupted by {cause})")
        if "given" in run.plan:
            return None  # solved from client-supplied stations: resuming moves nothing
        started = run.plan.get("started") or {}
        mode = started.get("motion_mode", self._motion_mode)
        if mode != self._motion_mode:
            return (f"run {run.id} closed, not resumed: started in {mode} mode, the daemon now runs in "
                    f"{self._motion_mode} mode")
        measure = started.get("measure", self.cfg.tracker.measure)
        if measure != self.cfg.tracker.measure and run.kind == P.KIND_BASE_FRAME:
            # Pose and point stations are different models; one run's stations are one kind.
            return (f"run {run.id} closed, not resumed: started measuring {measure}s, the daemon now measures "
                    f"{self.cfg.tracker.measure}s ([tracker] measure)")
        window = self.cfg.service.resume_within_s
        if interrupted_s is None or abs(interrupted_s) > window:
            ago = "an unknown time" if interrupted_s is None else f"{interrupted_s:.1f} s"
            return (f"run {run.id} closed, not resumed: interrupted by {cause} {ago} ago, longer than "
                    f"[service] resume_within_s = {window:g} s")
        return None

    def ready(self) -> None:
        """Tell systemd the service is up (after the sockets are bound)."""
        if self.notifier is not None:
            self.notifier.ready()
            self.notifier.status(f"{self.state.value}")

    def request_stop(self, *_: Any) -> None:
        """Finish the current transaction and stop (signal-handler safe)."""
        self._stop.set()
        self._abort.set()

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)

    def serve(self, *, until: Callable[[], bool] | None = None) -> None:
        """The supervising loop: heartbeat, retained result, STATUS/WATCHDOG, until stopped."""
        z = self.cfg.zmq
        next_hb = time.monotonic()
        next_retain = time.monotonic() + z.republish_s
        wd = self.notifier.watchdog_interval_s() if self.notifier is not None else None
        next_wd = time.monotonic()
        last_wd_progress = self._progress_ns
        while not self._stop.is_set() and not (until is not None and until()):
            now = time.monotonic()
            if now >= next_hb:
                self._emit(P.TOPIC_HEARTBEAT, self.heartbeat())
                next_hb = next_deadline(next_hb, z.heartbeat_s, time.monotonic())
            if now >= next_retain:
                self.republish_result()
                next_retain = next_deadline(next_retain, z.republish_s, time.monotonic())
            if wd and now >= next_wd:
                # WATCHDOG only after real progress: the worker moved on since the last ping,
                # or it is idle waiting for work (its liveness is then the queue wait itself).
                worker_ok = self._worker is not None and self._worker.is_alive()
                if worker_ok and (self._progress_ns != last_wd_progress or self._current is None):
                    self.notifier.watchdog()
                    last_wd_progress = self._progress_ns
                next_wd = now + wd / 2.0
            if self._next_drift_s is not None and now >= self._next_drift_s and self._current is None:
                self._next_drift_s = None
                try:
                    self.request_drift_check("schedule")
                except ServiceError as exc:
                    log.info("scheduled drift check not started: %s", exc)
            if self._worker is not None and not self._worker.is_alive() and not self._stop.is_set():
                log.error("worker thread died; stopping")
                break
            # Sleep until the next deadline (at most one tick: the stop predicate and the
            # worker's liveness are checked every tick), so a beat is sent when it is due
            # rather than on the next tick after it.
            due = min(next_hb, next_retain, next_wd if wd else math.inf)
            self._stop.wait(max(0.0, min(_TICK_S, due - time.monotonic())))
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
        active = self._active_result_safe()
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
        return bodies.status(self.heartbeat(), queued_jobs=self._jobs.qsize(), last_drift=self._last_drift,
                             cusum_m=self._cusum.value_m)

    def current_run_id(self) -> int | None:
        """The run the worker is on now (None when idle or on a drift check)."""
        job = self._current
        return job.run_id if job is not None else None

    def _run_in_progress(self) -> int | None:
        """The open run being worked on, if any (``-1`` for a run job without an id yet).

        A run closed in the store is over (its result is already published); only its job
        is winding down, and a client reacting to the result must not be told it is busy.
        """
        current = self._current
        if current is None or current.kind != _RUN:
            return None
        if current.run_id is None:
            return -1
        return current.run_id if self.store.get_run(current.run_id).is_open else None

    def start_run(self, kind: str | None = None, *, plan: list[PlannedStation] | None = None,
                  stations: list[dict] | None = None, parent_result_id: int | None = None, reason: str = "") -> int:
        """Queue a calibration run; returns its id (the run is stored before this returns)."""
        kind = kind or self.cfg.solve.kind
        if kind not in P.RUN_KINDS:
            raise ServiceError(P.E_BAD_REQUEST, f"kind must be {', '.join(P.RUN_KINDS)}, got {kind!r}")
        self._refuse_during_store_fault()
        self._refuse_busy()
        if kind == P.KIND_HAND_EYE and stations is None:
            # Hand-eye needs camera views of a target; this daemon drives a robot and a tracker.
            raise ServiceError(
                P.E_STATE, "hand_eye needs camera observations, and this cell has no camera device: "
                "solve them with `cellcal solve --kind hand_eye` (or the solver API)",
            )
        if stations is not None:
            plan_dict: dict[str, Any] = {"stations": [], "given": stations}
        else:
            plan_dict = plan_to_dict(plan if plan is not None else self.make_plan(kind))
            if kind == P.KIND_KINEMATICS:
                plan_dict.update(kinematics_run.plan_extra(self.cfg))
        plan_dict["started"] = self._start_record()
        run_id = self.store.create_run(
            kind, plan_dict, config_sha256=self.cfg.sha256, devices=self._devices.identities(),
            parent_result_id=parent_result_id,
        )
        self._jobs.put(_Job(_RUN, run_id, reason or "requested"))
        return run_id

    def start_run_internal(self, parent_result_id: int) -> int:
        """Store a recalibration run of the configured kind and plan (the caller queues it)."""
        plan_dict = plan_to_dict(self.make_plan())
        if self.cfg.solve.kind == P.KIND_KINEMATICS:
            plan_dict.update(kinematics_run.plan_extra(self.cfg))
        plan_dict["started"] = self._start_record()
        return self.store.create_run(
            self.cfg.solve.kind, plan_dict, config_sha256=self.cfg.sha256,
            devices=self._devices.identities(), parent_result_id=parent_result_id,
        )

    def _start_record(self) -> dict[str, Any]:
        """What a run remembers of its start (stored with its plan): the motion mode it may
        resume in, and the newest activation then (a result activated later is newer than
        the run, and the run's result will not replace it)."""
        hist = self.store.activation_history(limit=1)
        return {"motion_mode": self._motion_mode, "measure": self.cfg.tracker.measure,
                "last_activation_id": hist[0].id if hist else 0}

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
        outage = self._store_outage
        if outage is not None and outage.pending:
            wait = max(0.0, outage.next_try - time.monotonic())
            raise ServiceError(P.E_STATE, f"the store failed a write and is being retried (next in {wait:.1f} s): "
                                          f"{self.state_detail}")

    def abort(self) -> bool:
        """Abort the current job and stop the robot; False when nothing was running.

        The current station finishes its transaction first; the stop command goes to the
        robot at once (from the caller's thread, so it never waits for the worker).
        """
        outage = self._store_outage
        if self._current is None and outage is not None and outage.pending and outage.run_id is not None:
            # The run waits for the store: it will be closed as aborted, never resumed.
            outage.aborted = True
            return True
        busy = self._current is not None
        if busy:
            self._abort.set()
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
        rec = self._active_result_safe()
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
        check_id = self._check_ids.allocate(rec.id)
        self._jobs.put(_Job(_DRIFT, None, reason, result_id=rec.id, check_id=check_id))
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
        if (kind or self.cfg.solve.kind) == P.KIND_KINEMATICS:
            return kinematics_run.make_plan(self.cfg, self._devices.model)
        return plan_from_config(self.cfg, self._devices.model)

    # ---- results for clients -----------------------------------------------------------------------
    def _active_result_safe(self) -> ResultRecord | None:
        try:
            return self.store.active_result()
        except StoreError:
            return None

    def result_body(self, rec: ResultRecord, *, retained: bool = False) -> dict[str, Any]:
        """The ``cellcal/v1/result`` body (``protocol.ResultBody``) of a stored result."""
        return bodies.result_body(rec, cell=self.cfg.service.name, retained=retained)

    def result_summary(self, rec: ResultRecord) -> P.ResultSummary:
        return bodies.result_summary(rec)

    def republish_result(self) -> None:
        """The active result again, marked ``retained`` (every ``[zmq] republish_s``)."""
        rec = self._active_result_safe()
        if rec is not None:
            self._emit(P.TOPIC_RESULT, self.result_body(rec, retained=True), retained=True)

    def activate_result(self, result_id: int, reason: str = "") -> int | None:
        """Make a stored result that passed its gates the active one; returns the previous id.

        Raises
        ------
        ServiceError
            ``E_STATE``: the result failed its acceptance gates.
        UnknownRecord
            No such result.
        """
        with self._activation_lock:
            rec = self.store.get_result(result_id)
            if not gates_passed(rec.result):
                raise ServiceError(P.E_STATE, f"result {result_id} failed its acceptance gates and cannot be activated")
            prev = self.store.active_result()
            self.store.activate_result(result_id, reason=reason)
        for rid in (result_id, *((prev.id,) if prev is not None and prev.id != result_id else ())):
            self._export(rid)  # both files' "active" change; exports/active follows (rollback too)
        self.republish_result_now()
        return prev.id if prev is not None else None

    def republish_result_now(self) -> None:
        """The active result after it changed (activation, suspect): not ``retained``."""
        rec = self._active_result_safe()
        if rec is not None:
            self._emit(P.TOPIC_RESULT, self.result_body(rec))

    def set_publisher(self, publish: Callable[..., None]) -> None:
        self._publish_fn = publish

    # ---- devices -----------------------------------------------------------------------------------
    def _begin_job(self) -> None:
        """A new job: a fresh backoff and outage, and a fresh baseline of the controller's settings."""
        self._backoff.reset()
        self._outage_since = None
        self._devices.begin_job()

    def _made_progress(self) -> None:
        """Real progress (a station committed, a result stored): faults start over."""
        self._backoff.reset()
        self._outage_since = None
        outage = self._store_outage
        if outage is not None and not outage.pending:
            self._store_outage = None
        self._progress()

    def _retry_delay(self) -> float:
        """The job backoff's next delay, at most what is left of ``resume_within_s`` (so the
        last attempt falls inside the window), at least ``fault_retry_min_s``."""
        delay = self._backoff.next_delay()
        if self._outage_since is not None:
            left = self.cfg.service.resume_within_s - (time.monotonic() - self._outage_since)
            delay = min(delay, max(left, self.cfg.service.fault_retry_min_s))
        return delay

    def _check_window(self, message: str, cause: BaseException | None, device: P.DeviceName | None) -> None:
        """Give the job up when its outage has lasted longer than ``resume_within_s``."""
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            return
        lasted = time.monotonic() - self._outage_since
        window = self.cfg.service.resume_within_s
        if lasted > window:
            raise _GiveUp(f"{message}; not cleared within [service] resume_within_s = {window:g} s "
                          f"({lasted:.1f} s)", cause, device)

    def _wait_retry(self, delay: float) -> None:
        """Wait ``delay`` seconds for the next attempt; an abort or a stop ends the wait (and the job)."""
        deadline = time.monotonic() + delay
        while not (self._stop.is_set() or self._abort.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._stop.wait(min(left, 0.1))
            self._progress()
        self._check_abort()

    def _ensure_devices(self, need_tracker: bool, state: State, detail: str) -> cap.CaptureEngine:
        """Open the devices; in FAULT retry with the job's backoff until ``resume_within_s``.

        When they are open the service is in ``state`` (with ``detail``): from FAULT it goes
        there directly, never through IDLE.
        """
        kinematics_run.sync_devices_model(self.cfg, self.store, self._devices)
        while True:
            self._check_abort()
            try:
                self._devices.open(need_tracker)
            except DeviceOpenError as exc:
                self._devices.close()
                message = f"cannot open devices: {exc.cause}"
                self._check_window(message, exc.cause, exc.device)
                delay = self._retry_delay()
                self._fault(message, exc.cause, device=exc.device, retry_in_s=delay)
                self._wait_retry(delay)
                continue
            if self._outage_since is not None:
                self._check_window("the devices came back too late", None, None)
            if self.state != state or self.state_detail != detail:
                self._set_state(state, detail)
            assert self._devices.engine is not None  # open() made it with the robot
            return self._devices.engine

    def _after_device_fault(self, df: cap.DeviceFault, what: str, need_tracker: bool, state: State) -> cap.CaptureEngine:
        """A link failed mid-job: close everything, say so, back off, reopen and carry on."""
        self._devices.close()
        self._check_window(str(df), df.cause, df.device)
        delay = self._retry_delay()
        self._fault(str(df), df.cause, device=df.device, retry_in_s=delay)
        self._wait_retry(delay)
        return self._ensure_devices(need_tracker, state, f"{what}: resumed after the {df.device} fault cleared")

    def _fault(self, message: str, exc: BaseException | None = None, *, device: P.DeviceName | None = None,
               code: str = P.E_DEVICE, retry_in_s: float | None = None) -> None:
        self._set_state(State.FAULT, message)
        body = bodies.fault(code=cast(P.ErrorCode, code), device=device, message=message, retry_in_s=retry_in_s,
                            exc=exc)
        self._last_fault = body
        self._emit(P.TOPIC_FAULT, body)

    def _check_abort(self) -> None:
        if self._abort.is_set() or self._stop.is_set():
            raise _Abort()

    def _interruptible(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a pure computation: a solve) in a helper thread, so that an abort
        ends the job at once instead of after the solve; an aborted solve's result is
        dropped when it comes. Its exception is raised here."""
        out: list[Any] = []
        failure: list[BaseException] = []

        def call() -> None:
            try:
                out.append(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the worker
                failure.append(exc)

        helper = threading.Thread(target=call, name="cellcal-solve", daemon=True)
        helper.start()
        while helper.is_alive():
            # No progress ping here: a solve that hangs must still starve the watchdog.
            self._check_abort()
            helper.join(0.05)
        self._check_abort()
        if failure:
            raise failure[0]
        return out[0]

    # ---- the worker ------------------------------------------------------------------------------------
    def _work(self) -> None:
        if self._jobs.empty():
            self._connect_idle()  # at start: the heartbeat and the first run know the devices
        while not self._stop.is_set():
            outage = self._store_outage
            if outage is not None and outage.pending:
                self._recover_store(outage)
                continue
            try:
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                self._progress()
                self._connect_idle()
                continue
            self._run_job(job)
        self._devices.close()

    def _connect_idle(self) -> None:
        """While idle, keep the devices open: connect at start and retry with backoff
        (``fault_retry_min_s`` .. ``fault_retry_max_s``), so the heartbeat says what is
        connected and a run's record names its devices from its start. Idle devices that
        are down are not a FAULT (nothing waits for them); a job that needs them is."""
        if self._stop.is_set() or self._devices.all_open or time.monotonic() < self._idle_next_try:
            return
        failed = self._devices.open_available()
        if not failed:
            self._idle_backoff.reset()
            self._idle_failures.clear()
            log.info("devices connected: %s", "; ".join(
                f"{name} {d.get('identity_text') or '?'}" for name, d in self._devices.status.items()))
            return
        delay = self._idle_backoff.next_delay()
        self._idle_next_try = time.monotonic() + delay
        for name, exc in failed.items():
            text = f"{type(exc).__name__}: {exc}"
            # Said once per distinct failure, not at every retry.
            if self._idle_failures.get(name) != text:
                log.warning("%s (%s) not connected: %s; retrying with backoff (next in %.1f s)",
                            name, self._devices.status[name]["url"], text, delay)
                self._idle_failures[name] = text

    def _run_job(self, job: _Job) -> None:
        self._current = job
        self._abort.clear()
        self._begin_job()
        try:
            if job.kind == _RUN:
                assert job.run_id is not None
                self._execute_run(job)
            else:
                self._execute_drift(job)
        except _Abort:
            engine = self._devices.engine
            if engine is not None and engine.pending_move is not None and engine.pending_move.is_alive():
                # The driver's move wait outlives the abort (it waits for a target the stop
                # made unreachable): closing the robot ends it; the idle loop reconnects.
                self._devices.close()
            if job.kind == _RUN and job.run_id is not None and not self._stop.is_set():
                # Stopping leaves the run open so it resumes on the next start; an abort
                # closes it (unless it already ended, e.g. in the same instant).
                try:
                    if self.store.get_run(job.run_id).is_open:
                        self.store.set_run_status(job.run_id, RunStatus.ABORTED, "aborted by request")
                    self._run_event(job.run_id, self._current_kind, f"run {job.run_id} aborted")
                except StoreError as exc:
                    self._store_fault(job, exc, close=(RunStatus.ABORTED, "aborted by request"))
        except _GiveUp as exc:
            self._give_up(job, exc)
        except StoreError as exc:
            # The store cannot take writes (disk full, read-only): a fault, never a crash;
            # what was committed stays, and the worker probes the store until it recovers.
            self._store_fault(job, exc)
        except Exception as exc:  # noqa: BLE001 - the worker must survive any job
            log.exception("job %s failed", job.kind)
            self._internal_failure(job, exc)
        finally:
            self._devices.end_job()
            self._current = None
            job.done.set()
            self._progress()
            if self.state != State.FAULT:
                self._set_state(State.IDLE)

    def _internal_failure(self, job: _Job, exc: Exception) -> None:
        """An exception nobody expected (a programming error) ended a job: the run is closed
        as failed with the exception named, so its waiters and ``list_results`` see why
        instead of an open run nothing works on (resumed at the next start as if
        interrupted); its stations stay stored. FAULT with ``E_INTERNAL``; the daemon
        keeps serving and the next run starts as usual."""
        what = f"internal error: {type(exc).__name__}: {exc}"
        if job.kind == _RUN and job.run_id is not None:
            try:
                if self.store.get_run(job.run_id).is_open:
                    self.store.set_run_status(job.run_id, RunStatus.FAILED, what)
            except StoreError as store_exc:
                self._store_fault(job, store_exc, close=(RunStatus.FAILED, what))
                return
            self._fault(f"run {job.run_id} failed: {what}", exc, code=P.E_INTERNAL)
            return
        self._fault(f"{job.kind} failed: {what}", exc, code=P.E_INTERNAL)

    def _give_up(self, job: _Job, exc: _GiveUp) -> None:
        """A fault outlasted ``resume_within_s``: the run is closed as failed, never resumed later."""
        self._devices.close()
        if job.kind == _RUN and job.run_id is not None:
            reason = f"run {job.run_id} failed: {exc}"
            try:
                if self.store.get_run(job.run_id).is_open:
                    self.store.set_run_status(job.run_id, RunStatus.FAILED, str(exc))
            except StoreError as store_exc:
                self._store_fault(job, store_exc, close=(RunStatus.FAILED, str(exc)))
                return
        else:
            reason = f"{job.kind} abandoned: {exc}"
        self._fault(reason, exc.cause, device=exc.device)

    # ---- the store's faults ------------------------------------------------------------------------------
    def _store_fault(self, job: _Job | None, exc: StoreError, *,
                     close: tuple[RunStatus, str] | None = None) -> None:
        """The store failed a write: FAULT, and probe it with backoff from the worker's loop.

        A run resumed after an earlier outage that fails again before any progress keeps
        that outage's start and backoff: it neither flaps nor outlives ``resume_within_s``.
        """
        run_id = job.run_id if job is not None and job.kind == _RUN else None
        outage = self._store_outage
        if outage is None or outage.run_id != run_id:
            outage = _StoreOutage(run_id, time.monotonic(),
                                  Backoff(self.cfg.service.fault_retry_min_s, self.cfg.service.fault_retry_max_s))
        outage.pending = True
        if close is not None:
            outage.close = close
        delay = outage.backoff.next_delay()
        outage.next_try = time.monotonic() + delay
        self._store_outage = outage
        self._devices.close()
        self._fault(f"store: {exc}", exc, code=P.E_STATE, retry_in_s=delay)

    def _recover_store(self, outage: _StoreOutage) -> None:
        """One step of waiting for the store: probe it when due; when it takes writes, resume
        the interrupted run or close it (:meth:`_resolve_interrupted`), or go IDLE."""
        wait = outage.next_try - time.monotonic()
        if wait > 0:
            self._stop.wait(min(wait, 0.2))
            self._progress()
            return
        try:
            self.store.probe_write()
            job = self._resolve_interrupted(outage)
        except StoreError as exc:
            delay = outage.backoff.next_delay()
            outage.next_try = time.monotonic() + delay
            self._fault(f"store: {exc}", exc, code=P.E_STATE, retry_in_s=delay)
            return
        outage.pending = False
        log.info("the store takes writes again after %.1f s", time.monotonic() - outage.since)
        if job is None:
            self._store_outage = None
            self._set_state(State.IDLE, "the store takes writes again")
        else:
            self._run_job(job)

    def _resolve_interrupted(self, outage: _StoreOutage) -> _Job | None:
        """The store is back: the job that resumes the interrupted run, or None (closed, or no run)."""
        if outage.run_id is None:
            return None
        run = self.store.get_run(outage.run_id)
        if not run.is_open:
            return None
        if outage.aborted or outage.close is not None:
            status, reason = (RunStatus.ABORTED, "aborted by request") if outage.aborted else outage.close  # type: ignore[misc]
            self.store.set_run_status(run.id, status, reason)
            self._run_event(run.id, run.kind, f"run {run.id} {status.value}: {reason}")
            return None
        why = self._why_not_resume(run, time.monotonic() - outage.since, "a store fault")
        if why is not None:
            log.warning("%s", why)
            self.store.set_run_status(run.id, RunStatus.FAILED, why)
            self._run_event(run.id, run.kind, why)
            return None
        moves = self._moves_robot(run)
        log.warning("run %d resumes: the store takes writes again%s", run.id,
                    "; the daemon moves the robot (command mode)" if moves else "")
        return _Job(_RUN, run.id, "resume", resume="the store fault cleared")

    def _execute_run(self, job: _Job) -> None:
        run_id = job.run_id
        assert run_id is not None
        run = self.store.get_run(run_id)
        self._current_kind = run.kind
        # Killed between storing the result and closing the run (two transactions): the run
        # is complete; close it with that result instead of solving and storing a second one.
        prior = next((r for r in self.store.list_results(limit=10) if r.run_id == run_id), None)
        if prior is not None:
            failed = gates_failed(prior.result)
            self.store.set_run_status(run_id, RunStatus.FAILED if failed else RunStatus.DONE, "; ".join(failed))
            self._export(prior.id)
            if not failed:
                self._emit(P.TOPIC_RESULT, self.result_body(prior))
            return
        if "given" in run.plan:
            self._solve_given(run)
            return
        if run.kind == P.KIND_KINEMATICS and not self.store.stations(run_id):
            try:  # a requested set the planned stations cannot determine: refused before measuring
                kinematics_run.check_requested(run.plan, self.cfg, self._devices.model)
            except CalibrationError as exc:
                self._solve_failed(run_id, exc)
                return
        plan = plan_from_dict(run.plan)
        robot_only = run.kind == P.KIND_TOOL_POINT
        what = f"run {run_id}"
        detail = what
        if job.resume is not None:
            detail = f"{what} resumed after {job.resume}"
            if self._moves_robot(run):
                detail += ": the daemon moves the robot (command mode)"
        self._set_state(State.CAPTURING, detail)
        c = self.cfg.capture
        committed = {s.plan_index: s for s in self.store.stations(run_id)}
        records = [committed[i] for i in sorted(committed)]
        accepted = [s.base_T_flange for s in records]
        expected = self._estimate(run.kind, records)
        consecutive = 0
        observe = self._motion_mode == P.MOTION_OBSERVE
        todo = [ps for ps in plan if ps.index not in committed]
        n_planned = len(plan)
        if observe:
            n_target = max(len(plan), self.cfg.plan.n_stations)
            next_index = max(committed, default=-1) + 1
            todo = [PlannedStation(i, None, None) for i in range(next_index, n_target)]
            n_planned = n_target
        engine = None
        adaptive = to_target(self.cfg.plan) and run.kind == P.KIND_BASE_FRAME and not observe
        if todo or adaptive:  # a run resumed after its last station is solved without the devices
            engine = self._ensure_devices(not robot_only, State.CAPTURING, detail)
        if adaptive:  # a run to a target: at most max_stations, fewer when the target is reached
            n_planned = max(n_planned, int(self.cfg.plan.max_stations))
        for ps in stations_to_visit(todo, records, self.cfg, self._devices.model, adaptive=adaptive):
            n_planned = max(n_planned, ps.index + 1)
            attempts = 0
            while True:
                self._check_abort()
                try:
                    assert engine is not None
                    if not observe:
                        engine.move_to(ps, self._abort)
                    if robot_only:
                        rec = engine.capture_robot_only(ps.index, accepted, self._abort)
                    else:
                        rec = engine.capture(ps.index, accepted, self._abort, expected=expected)
                except cap.StationRejected as rej:
                    self._check_abort()
                    attempts += 1
                    consecutive += 1
                    self.store.add_rejection(run_id, ps.index, rej.reason.value, cap.jsonable(rej.detail))
                    self._emit_logged(P.TOPIC_STATION, bodies.station(
                        run_id=run_id, index=ps.index, planned=n_planned, attempt=attempts,
                        accepted_count=len(accepted), figures=rej.detail, rejected=rej.reason.value, message=str(rej),
                    ))
                    self._progress()
                    if consecutive >= c.max_consecutive_rejections:
                        msg = f"{consecutive} stations in a row rejected (last: {rej.reason.value})"
                        self.store.set_run_status(run_id, RunStatus.FAILED, msg)
                        self._fault(msg)
                        return
                    if attempts >= c.max_attempts_per_station and not observe:
                        break  # give this station up, go on with the plan
                    continue
                except cap.DeviceFault as df:
                    if df.ends_job:
                        self._invalidated(run_id, df)
                        return
                    engine = self._after_device_fault(df, what, not robot_only, State.CAPTURING)
                    continue
                self.store.add_station(run_id, rec)  # one transaction: the station is safe now
                records.append(rec)
                accepted.append(rec.base_T_flange)
                consecutive = 0
                self._made_progress()
                self._emit_logged(P.TOPIC_STATION, bodies.station(
                    run_id=run_id, index=ps.index, planned=n_planned, attempt=attempts + 1,
                    accepted_count=len(accepted), figures=rec.settle,
                ))
                expected = self._estimate(run.kind, records)
                break
        self._check_abort()
        self._solve_run(run_id, run.kind)

    def _estimate(self, kind: str, records: list[StationRecord]) -> cap.Expected | None:
        """The run's rough estimate that the next measurement (pose or point) must agree with (or None)."""
        if kind != P.KIND_BASE_FRAME:
            return None
        tc = self.cfg.tracker
        return solve.rough_estimate(records, tc.gross_error_m, tc.gross_error_rad)

    def _invalidated(self, run_id: int, inv: cap.DeviceFault) -> None:
        """The controller's TCP or payload changed: the run cannot go on; it fails, named."""
        self._devices.close()
        self.store.set_run_status(run_id, RunStatus.FAILED, str(inv.cause))
        self._fault(f"run {run_id} failed: {inv.cause}", inv.cause, device=inv.device)

    # ---- solving -----------------------------------------------------------------------------------------
    def _solve_run(self, run_id: int, kind: str) -> int | None:
        extra = 0
        while True:
            self._set_state(State.SOLVING, f"run {run_id}")
            stations = self.store.stations(run_id)
            try:
                result = (self._interruptible(kinematics_run.solve_run, stations, self.store.get_run(run_id).plan,
                                              self.cfg, self._devices.model)
                          if kind == P.KIND_KINEMATICS
                          else self._interruptible(solve.solve_stations, kind, stations, self.cfg.solve))
                break
            except DegenerateGeometry as exc:
                # The planner names the pose that best fixes the weakest direction; in command
                # mode we go and measure it instead of ending the run.
                engine = self._devices.engine
                if (kind != P.KIND_BASE_FRAME or self._motion_mode != P.MOTION_COMMAND
                        or extra >= self.cfg.plan.max_extra_stations or engine is None):
                    self._solve_failed(run_id, exc)
                    return None
                extra += 1
                nxt = solve.suggest_for_stations(stations, self._devices.model, self.cfg.plan)
                if nxt is None:
                    self._solve_failed(run_id, exc)
                    return None
                index = max((s.plan_index for s in stations), default=-1) + 1
                log.info("run %d: %s; measuring a suggested station %d", run_id, exc, index)
                self._set_state(State.CAPTURING, f"run {run_id} (extra station for {exc.frame} axis)")
                if not self._capture_extra(engine, run_id, PlannedStation(index, nxt.q_rad, nxt.base_T_flange), stations):
                    return None
            except CalibrationError as exc:
                self._solve_failed(run_id, exc)
                return None
        return self._store_result(run_id, kind, result, stations)

    def _capture_extra(self, engine: cap.CaptureEngine, run_id: int, ps: PlannedStation,
                       stations: list[StationRecord]) -> bool:
        """Measure one planner-suggested station (the same checks as every station); False
        when the run ended (its controller settings changed)."""
        accepted = [s.base_T_flange for s in stations]
        expected = self._estimate(P.KIND_BASE_FRAME, list(stations))
        detail = self.state_detail
        attempt = 0
        while attempt < self.cfg.capture.max_attempts_per_station:
            self._check_abort()
            try:
                engine.move_to(ps, self._abort)
                got = engine.capture(ps.index, accepted, self._abort, expected=expected)
            except cap.StationRejected as rej:
                self._check_abort()
                attempt += 1
                self.store.add_rejection(run_id, ps.index, rej.reason.value, cap.jsonable(rej.detail))
                continue
            except cap.DeviceFault as df:
                if df.ends_job:
                    self._invalidated(run_id, df)
                    return False
                engine = self._after_device_fault(df, detail, True, State.CAPTURING)
                continue
            self.store.add_station(run_id, got)
            self._made_progress()
            return True
        return True

    def _iso9283_station(self, run_id: int, ps: PlannedStation, tag: dict[str, Any]) -> StationRecord:
        """One measurement of a kinematics run's ISO 9283 pose test
        (``kinematics_run.iso9283_phase``): moved to and captured like a station, without the
        duplicate-pose and rough-estimate tests (the test revisits its poses), tagged and
        stored with the run. A rejection is recorded and retried up to ``[capture]
        max_attempts_per_station`` times, then raised; a device fault is ridden out like a
        station's (one that ends the job is raised); an abort ends the job."""
        detail = f"run {run_id}: ISO 9283 pose test"
        engine = self._devices.engine
        if engine is None or self.state != State.CAPTURING:
            engine = self._ensure_devices(True, State.CAPTURING, detail)
        attempts = 0
        while True:
            self._check_abort()
            try:
                engine.move_to(ps, self._abort)
                rec = engine.capture(ps.index, [], self._abort)
            except cap.StationRejected as rej:
                self._check_abort()
                attempts += 1
                self.store.add_rejection(run_id, ps.index, rej.reason.value, cap.jsonable(rej.detail))
                self._progress()
                if attempts >= self.cfg.capture.max_attempts_per_station:
                    raise
                continue
            except cap.DeviceFault as df:
                if df.ends_job:
                    raise
                engine = self._after_device_fault(df, detail, True, State.CAPTURING)
                continue
            rec = dataclasses.replace(rec, raw={**rec.raw, kinematics_run.ISO9283_TAG: tag})
            self.store.add_station(run_id, rec)  # one transaction: the measurement is safe now
            self._made_progress()
            return rec

    def _solve_failed(self, run_id: int, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}"
        self.store.set_run_status(run_id, RunStatus.FAILED, msg)
        # The result topic carries only calibrations a client may use; a failed run is told
        # on the state and fault topics (and stays visible in list_results / the store).
        self._fault(f"run {run_id} failed: {msg}", exc, code=P.E_STATE)

    def _newer_active(self, run: Any) -> ResultRecord | None:
        """The active result if it became active after ``run`` started (its result must not
        replace it), else None. Runs stored before the start record: by run id."""
        active = self.store.active_result()
        if active is None:
            return None
        last = (run.plan.get("started") or {}).get("last_activation_id")
        if isinstance(last, int) and not isinstance(last, bool):
            hist = self.store.activation_history(limit=1)
            return active if hist and hist[0].id > last else None
        return active if active.run_id is not None and active.run_id > run.id else None

    def _store_result(self, run_id: int, kind: str, result: Any, stations: list[StationRecord],
                      base_T_flange: np.ndarray | None = None) -> int:
        """Gate, store and (when every gate passed) activate a result. ``base_T_flange``:
        the robot poses of client-supplied stations (else those of ``stations``)."""
        run = self.store.get_run(run_id)
        if kind == P.KIND_KINEMATICS:
            # The ISO 9283 pose test measures the identified arm before its result is stored;
            # its stations are stored with the run and are never check stations.
            try:  # the "before" of the pose test and of the report's residual maps
                nominal = kinematics_run.nominal_fit(stations, run.plan, self.cfg, self._devices.model)
            except (CalibrationError, ValueError, np.linalg.LinAlgError) as exc:
                log.warning("run %d: no fit of the nominal arm (%s)", run_id, exc)
                nominal = None
            iso = kinematics_run.iso9283_phase(result, self.cfg, self._devices.model, stations, run.plan,
                                               functools.partial(self._iso9283_station, run_id),
                                               can_move=self._motion_mode == P.MOTION_COMMAND, nominal=nominal)
            report, wire = kinematics_run.gate_and_wire(
                result, self.cfg, drift.choose_check_stations(kinematics_run.without_iso9283(stations), run.plan,
                                                              self.cfg.drift.check_stations), iso9283=iso,
                nominal=nominal)
        else:
            G = solve.station_arrays(stations)[0] if stations else base_T_flange
            report = check_gates(result, self.cfg.solve, context=solve.gate_context(kind, G, self._robot_model()))
            wire = solve.wire_result(result, report, drift.choose_check_stations(stations, run.plan,
                                                                                 self.cfg.drift.check_stations),
                                     task_points=self.cfg.solve.task_points_m if kind == self.cfg.solve.kind else None)
        provenance = solve.provenance(self.cfg, run, result, cellcal_version(), devices=self._devices.identities())
        with self._activation_lock:
            before = self._active_result_safe()
            newer = self._newer_active(run) if report.passed else None
            rid = self.store.add_result(run_id, kind, wire, provenance, parent_result_id=run.parent_result_id,
                                        activate=report.passed and newer is None)
        kept = "" if newer is None else (f"result {rid} passed its gates but was not activated: result {newer.id} "
                                         f"became active after run {run_id} started")
        self.store.set_run_status(run_id, RunStatus.DONE if report.passed else RunStatus.FAILED,
                                  report.reason() or kept)
        self._made_progress()
        self._export(rid)
        if before is not None and report.passed and newer is None:
            self._export(before.id)  # no longer active: its files say so
        self._log_result(rid)
        rec = self.store.get_result(rid)
        if not report.passed:
            self._run_event(run_id, kind, f"run {run_id}: result {rid} failed its acceptance gates "
                                          f"({report.reason()}); not activated")
            return rid
        if newer is not None:
            log.warning("run %d: %s", run_id, kept)
            self._run_event(run_id, kind, f"run {run_id}: {kept}")
            return rid
        self._emit(P.TOPIC_RESULT, self.result_body(rec))
        self._cusum.reset()
        self._schedule_drift()
        return rid

    def _schedule_drift(self) -> None:
        if self.cfg.drift.enabled and self._motion_mode == P.MOTION_COMMAND:
            self._next_drift_s = time.monotonic() + self.cfg.drift.interval_s

    def _export_active_if_stale(self, exports: Path) -> None:
        """At start: ``exports/active`` names the active result (a kill between activating and
        switching it, or a state directory older than ``active``, leaves it behind)."""
        from cellcal.daemon.exports import active_result_id

        active = self._active_result_safe()
        if active is not None and active_result_id(exports) != active.id:
            self._export(active.id)

    def _export(self, rid: int) -> None:
        """(Re)write a result's export files, then point ``exports/active`` at the active result's.

        Called whenever a result's state changes (stored, activated, deactivated, suspect),
        so ``active`` and ``suspect`` in its files are the store's.
        """
        from cellcal.daemon.exports import sync_active, write_exports
        from cellcal.daemon.report_html import export_report

        exports = Path(self.cfg.service.state_dir) / "exports"
        try:
            rec = self.store.get_result(rid)
            write_exports(exports, rid, self.result_body(rec), self.cfg.export)
        except (OSError, CellcalError, ValueError) as exc:
            log.warning("exports of result %d failed: %s", rid, exc)
        # The HTML report beside them (it logs its own failure), before ``active`` is
        # switched, so the active directory carries the report of the same state.
        export_report(self.store, rid, exports, cell=self.cfg.service.name)
        try:
            sync_active(exports, lambda: (a.id if (a := self._active_result_safe()) is not None else None))
        except (OSError, CellcalError, ValueError) as exc:
            log.warning("exports/active not switched after result %d: %s", rid, exc)

    def _solve_given(self, run: Any) -> None:
        """A run whose stations the client supplied (hand-eye, or any kind from elsewhere)."""
        self._set_state(State.SOLVING, f"run {run.id}")
        try:
            result = self._interruptible(solve.solve_given, run.kind, run.plan["given"], self.cfg.solve)
        except (KeyError, TypeError, ValueError, CalibrationError) as exc:
            self._solve_failed(run.id, exc)
            return
        self._store_result(run.id, run.kind, result, [], solve.given_base_T_flange(run.plan["given"]))

    def _robot_model(self) -> Any:
        """The arm's kinematics for the reach gate (the open driver's, else the configured
        model), or None when neither is known."""
        try:
            return self._devices.model
        except (CellcalError, ValueError, KeyError, AttributeError) as exc:
            log.warning("no robot model for the reach gate: %s", exc)
            return None

    # ---- drift checks ---------------------------------------------------------------------------------------
    def _execute_drift(self, job: _Job) -> None:
        assert job.result_id is not None and job.check_id is not None
        rec = self.store.get_result(job.result_id)
        active = self._active_result_safe()
        if active is None or active.id != rec.id:
            # Another result became active after this check was requested: its figures
            # would describe a calibration nobody uses (ADR 0009).
            log.warning("drift check %d of result %d skipped: result %s is active now", job.check_id, rec.id,
                        active.id if active else None)
            return
        d = self.cfg.drift
        what = f"result {rec.id}"
        self._set_state(State.CHECKING, what)
        engine = self._ensure_devices(True, State.CHECKING, what)
        model = drift.model_of(rec.result)
        assert model is not None  # request_drift_check refused a result without one
        X, Y = model  # Y: flange_T_target (4, 4), or a point calibration's flange_p_target (3,)
        dev_t: list[float] = []
        dev_r: list[float | None] = []
        per = []
        for cs in rec.result.get("check_stations", []):
            self._check_abort()
            ps = drift.check_station_plan(cs)
            got = None
            for _attempt in range(self.cfg.capture.max_attempts_per_station):
                try:
                    if self._motion_mode == P.MOTION_COMMAND:
                        engine.move_to(ps, self._abort)
                    got = engine.capture(ps.index, [], self._abort)
                    break
                except cap.StationRejected as rej:
                    self._check_abort()
                    log.info("drift station %d rejected: %s", ps.index, rej)
                except cap.DeviceFault as df:
                    if df.ends_job:
                        self._devices.close()
                        self._fault(f"drift check {job.check_id} of result {rec.id} abandoned: {df.cause}", df.cause,
                                    device=df.device)
                        return
                    engine = self._after_device_fault(df, what, True, State.CHECKING)
            if got is None:
                continue
            et, er = drift.deviation(X, Y, kinematics_run.station_for_check(rec, got))
            dev_t.append(et)
            dev_r.append(er)
            per.append(bodies.drift_station(ps.index, et, er))
            self._progress()
        if not dev_t:
            self._fault("drift check: no check station could be measured")
            return
        verdict = drift.judge(dev_t, dev_r, self._cusum, d)
        record = bodies.drift(result_id=rec.id, check_id=job.check_id, verdict=verdict, cfg=d, stations=per,
                              suspect=verdict.failed or bool(rec.suspect), reason=job.reason)
        self.store.add_drift_check(rec.id, dict(record))
        self._last_drift = dict(record)
        if verdict.failed:
            t, r = verdict.deviation_translation_m, verdict.deviation_rotation_rad
            rot = "" if r is None else f" / {math.degrees(r):.4f} deg"
            self.store.mark_suspect(rec.id, f"drift check: {t * 1e3:.3f} mm{rot}")
            self._export(rec.id)  # the files say suspect too
        self._emit_logged(P.TOPIC_DRIFT, record)
        if verdict.failed:
            self.republish_result_now()
            if verdict.action == P.ACTION_RECALIBRATING:
                self._jobs.put(_Job(_RUN, self.start_run_internal(rec.id), "recalibrate after drift"))
                return
        self._schedule_drift()
