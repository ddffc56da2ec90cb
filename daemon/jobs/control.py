"""What every job of the worker runs under: abort and stop, faults with backoff, the devices.

:class:`JobControl` is the worker's side of the state machine, shared by the run job
(``jobs.run``), the drift check (``jobs.drift``) and the store's recovery (``jobs.outage``):

* **abort and stop**: :meth:`JobControl.check_abort` raises :class:`Abort` once an abort or a
  stop was asked for; the long waits check it too (:meth:`wait_retry`, :meth:`interruptible`
  for a solve), so an abort ends a job within a second in every state;
* **device faults** (ADR 0012): a device that fails puts the service in FAULT; the job waits
  and reopens the devices with one exponential backoff per job (``fault_retry_min_s`` ..
  ``fault_retry_max_s``) that only real progress (:meth:`made_progress`: an accepted station)
  resets, and gives the job up (:class:`GiveUp`) when the outage outlasts
  ``resume_within_s``. When the devices are back the state goes from FAULT straight back to
  the job's state (never through IDLE) and the job goes on where it was;
* **progress**: :meth:`progress` feeds the systemd watchdog (``Service.serve``).

It never decides what a job does; the jobs do, and the service runs them one at a time.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, TypeVarTuple, cast

from cellcal.daemon import bodies
from cellcal.daemon import protocol as P
from cellcal.daemon.capture import CaptureEngine, DeviceFault
from cellcal.daemon.config import Config
from cellcal.daemon.devices import Backoff, CellDevices, DeviceOpenError
from cellcal.daemon.protocol import StateName
from cellcal.solver.errors import CellcalError

log = logging.getLogger(__name__)
#: The service's narrative, in words, one line per station, result and drift check: the jobs
#: write it under the service's logger name, so the journal reads like ``cellcal watch``
#: whatever module of the worker took the step.
narrative = logging.getLogger("cellcal.daemon.service")

__all__ = ["JobControl", "JobQueue", "narrative", "Job", "Abort", "GiveUp", "JOB_RUN", "JOB_DRIFT", "SetState", "Emit"]

T = TypeVar("T")
_Ts = TypeVarTuple("_Ts")

#: What a job is: a calibration run, or a drift check.
JOB_RUN, JOB_DRIFT = "run", "drift"

#: ``set_state(state, detail)``: the service's state machine (publishes a change).
SetState = Callable[[StateName, str], None]


class Emit(Protocol):
    """``emit(topic, body, retained=False)``: publish an event to every listener and the
    ZeroMQ server (whose ``publish`` has this form too)."""

    def __call__(self, topic: str, body: Mapping[str, object], *, retained: bool = False) -> None: ...


class Abort(CellcalError):
    """Control flow: the current job was aborted or the service is stopping.

    Raised by :meth:`JobControl.check_abort` inside the worker and caught by the worker's job
    loop (``Service._run_job``), never outside it.
    """


class GiveUp(CellcalError):
    """Control flow: a fault did not clear within ``resume_within_s``; the job ends (a run is
    closed as failed). Caught by the worker's job loop."""

    def __init__(self, message: str, cause: BaseException | None, device: P.DeviceName | None) -> None:
        self.cause = cause
        self.device = device
        super().__init__(message)


@dataclass
class Job:
    """One job of the worker's queue."""

    kind: str  # JOB_RUN | JOB_DRIFT
    run_id: int | None = None
    reason: str = ""
    result_id: int | None = None  # drift: the result to check, fixed when it was requested
    check_id: int | None = None   # drift: its id, promised in the run_drift_check reply
    resume: str | None = None     # run: what it resumes after ("a restart", "the store fault cleared")
    done: threading.Event = field(default_factory=threading.Event)


class JobQueue:
    """The worker's queue of jobs, which (unlike ``queue.Queue``) says what it holds: a run
    that is queued is already a run in progress for a client (``start_run`` returned its id),
    so a second ``start_run`` is refused and an ``abort`` takes it out of the queue."""

    def __init__(self) -> None:
        self._jobs: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()

    def put(self, job: Job) -> None:
        with self._cond:
            self._jobs.append(job)
            self._cond.notify()

    def get(self, timeout_s: float) -> Job | None:
        """The next job, or None after ``timeout_s``."""
        with self._cond:
            if not self._jobs:
                self._cond.wait(timeout_s)
            return self._jobs.popleft() if self._jobs else None

    def runs(self) -> list[Job]:
        """The queued run jobs, oldest first."""
        with self._cond:
            return [j for j in self._jobs if j.kind == JOB_RUN]

    def take_runs(self) -> list[Job]:
        """Remove the queued run jobs and return them (an abort before the worker took them)."""
        with self._cond:
            taken = [j for j in self._jobs if j.kind == JOB_RUN]
            self._jobs = collections.deque(j for j in self._jobs if j.kind != JOB_RUN)
            return taken

    def qsize(self) -> int:
        with self._cond:
            return len(self._jobs)

    def empty(self) -> bool:
        return self.qsize() == 0


class JobControl:
    """Abort, faults, backoff and the devices of the worker's jobs (module docstring).

    Parameters
    ----------
    cfg : Config
    devices : CellDevices
        Opened, used and closed by the worker thread only.
    set_state : callable(state, detail)
        The service's state machine.
    emit : callable(topic, body)
        Where fault bodies go.
    """

    def __init__(self, cfg: Config, devices: CellDevices, set_state: SetState, emit: Emit) -> None:
        self.cfg = cfg
        self.devices = devices
        #: The service's state machine: ``set_state(state, detail)``.
        self.set_state = set_state
        self._emit = emit
        self.abort = threading.Event()
        self.stop = threading.Event()
        #: ``time.monotonic_ns()`` of the worker's last progress (the watchdog's evidence).
        self.progress_ns = time.monotonic_ns()
        #: The fault body to clear when FAULT ends (``Service._set_state`` reads and clears it).
        self.last_fault: P.FaultBody | None = None
        # The current job's fault backoff and when its current outage began (monotonic):
        # both reset only by progress, so a device that fails right after reopening backs off.
        self._backoff = Backoff(cfg.service.fault_retry_min_s, cfg.service.fault_retry_max_s)
        self._outage_since: float | None = None
        #: Called after every real progress (the store outage it ends is the outage's business).
        self.on_progress: Callable[[], None] = lambda: None
        #: Called before the devices open for a job (a kinematic model to open the robot with).
        self.before_open: Callable[[], None] = lambda: None
        #: The state and detail the service is in now (kept by ``Service._set_state``).
        self.state: StateName = P.STATE_IDLE
        self.detail = ""

    # ---- progress and abort -----------------------------------------------------------------
    def progress(self) -> None:
        self.progress_ns = time.monotonic_ns()

    def begin_job(self) -> None:
        """A new job: a fresh backoff and outage, and a fresh baseline of the controller's settings."""
        self.abort.clear()
        self._backoff.reset()
        self._outage_since = None
        self.devices.begin_job()

    def made_progress(self) -> None:
        """Real progress (a station committed, a result stored): faults start over."""
        self._backoff.reset()
        self._outage_since = None
        self.on_progress()
        self.progress()

    def check_abort(self) -> None:
        if self.abort.is_set() or self.stop.is_set():
            raise Abort()

    def interruptible(self, fn: Callable[[*_Ts], T], *args: *_Ts) -> T:
        """``fn(*args)`` (a pure computation: a solve) in a helper thread, so that an abort
        ends the job at once instead of after the solve; an aborted solve's result is
        dropped when it comes. Its exception is raised here."""
        out: list[T] = []
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
            self.check_abort()
            helper.join(0.05)
        self.check_abort()
        if failure:
            raise failure[0]
        return out[0]

    # ---- faults -------------------------------------------------------------------------------
    def fault(self, message: str, exc: BaseException | None = None, *, device: P.DeviceName | None = None,
              code: str = P.E_DEVICE, retry_in_s: float | None = None) -> None:
        """FAULT with ``message``, and the fault body published (cleared when FAULT ends)."""
        self.set_state(P.STATE_FAULT, message)
        # ``code`` is one of the protocol's E_* constants, the ErrorCode literals (typed str there).
        body = bodies.fault(code=cast(P.ErrorCode, code), device=device, message=message, retry_in_s=retry_in_s,
                            exc=exc)
        self.last_fault = body
        self._emit(P.TOPIC_FAULT, body)

    def retry_delay(self) -> float:
        """The job backoff's next delay, at most what is left of ``resume_within_s`` (so the
        last attempt falls inside the window), at least ``fault_retry_min_s``."""
        delay = self._backoff.next_delay()
        if self._outage_since is not None:
            left = self.cfg.service.resume_within_s - (time.monotonic() - self._outage_since)
            delay = min(delay, max(left, self.cfg.service.fault_retry_min_s))
        return delay

    def check_window(self, message: str, cause: BaseException | None, device: P.DeviceName | None) -> None:
        """Give the job up when its outage has lasted longer than ``resume_within_s``."""
        if self._outage_since is None:
            self._outage_since = time.monotonic()
            return
        lasted = time.monotonic() - self._outage_since
        window = self.cfg.service.resume_within_s
        if lasted > window:
            raise GiveUp(f"{message}; not cleared within [service] resume_within_s = {window:g} s "
                         f"({lasted:.1f} s)", cause, device)

    def wait_retry(self, delay: float) -> None:
        """Wait ``delay`` seconds for the next attempt; an abort or a stop ends the wait (and the job)."""
        deadline = time.monotonic() + delay
        while not (self.stop.is_set() or self.abort.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.stop.wait(min(left, 0.1))
            self.progress()
        self.check_abort()

    # ---- the devices ---------------------------------------------------------------------------
    def before_open_at_start(self) -> None:
        """:attr:`before_open` at the daemon's start, before the idle loop opens the robot: so
        the robot is opened with the model in use from the start (the heartbeat and a run's
        record name it) and results of other kinematics are suspect before anyone asks them.
        A failure is logged, not raised: nothing waits on it, and every job runs it again."""
        try:
            self.before_open()
        except CellcalError as exc:
            log.warning("kinematic model not checked at start (%s): the first job checks it", exc)

    def ensure_devices(self, need_tracker: bool, state: StateName, detail: str, *, need_camera: bool = False,
                       want_tracker: bool = False) -> CaptureEngine:
        """Open the devices (the camera too with ``need_camera``; the tracker if it can be,
        with ``want_tracker``); in FAULT retry with the job's backoff until ``resume_within_s``.

        When they are open the service is in ``state`` (with ``detail``): from FAULT it goes
        there directly, never through IDLE.
        """
        self.before_open()
        while True:
            self.check_abort()
            try:
                self.devices.open(need_tracker, need_camera, want_tracker)
            except DeviceOpenError as exc:
                self.devices.close()
                message = f"cannot open devices: {exc.cause}"
                self.check_window(message, exc.cause, exc.device)
                delay = self.retry_delay()
                self.fault(message, exc.cause, device=exc.device, retry_in_s=delay)
                self.wait_retry(delay)
                continue
            if self._outage_since is not None:
                self.check_window("the devices came back too late", None, None)
            if self.state != state or self.detail != detail:
                self.set_state(state, detail)
            engine = self.devices.engine
            assert engine is not None  # open() made it with the robot
            return engine

    def after_device_fault(self, df: DeviceFault, what: str, need_tracker: bool, state: StateName, *,
                           need_camera: bool = False, want_tracker: bool = False) -> CaptureEngine:
        """A link failed mid-job: close everything, say so, back off, reopen and carry on."""
        self.devices.close()
        self.check_window(str(df), df.cause, df.device)
        delay = self.retry_delay()
        self.fault(str(df), df.cause, device=df.device, retry_in_s=delay)
        self.wait_retry(delay)
        return self.ensure_devices(need_tracker, state, f"{what}: resumed after the {df.device} fault cleared",
                                   need_camera=need_camera, want_tracker=want_tracker)

    def engine_for(self, need_tracker: bool, state: StateName, detail: str, *, need_camera: bool = False,
                   want_tracker: bool = False) -> CaptureEngine:
        """The open engine if the job is already in ``state`` with what it needs, else
        :meth:`ensure_devices`."""
        engine = self.devices.engine
        if engine is None or self.state != state or (need_tracker and self.devices.tracker is None) or (
                need_camera and engine.camera is None):
            return self.ensure_devices(need_tracker, state, detail, need_camera=need_camera, want_tracker=want_tracker)
        # A wanted tracker missing here was tried when the job opened its devices (and after
        # each fault): not again per measurement, where a tracker that is down would cost a
        # connect timeout every time.
        return engine
