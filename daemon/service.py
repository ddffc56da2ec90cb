"""The calibration service: state machine, job worker, supervising loop.

Threads
-------
* The **supervising loop** (the caller of :meth:`Service.serve`, normally the main
  thread) publishes the heartbeat, republishes the active result, sends systemd STATUS and
  WATCHDOG (only while the worker shows progress or is idle and healthy), and turns SIGTERM
  into an orderly stop.
* The **worker** runs one job at a time from a queue: a calibration run, a drift check. It
  owns the devices. Between steps it checks ``abort`` (end the job) and ``stop`` (end the
  process): a station being committed is always committed whole before either takes
  effect (one SQLite transaction per station).

States (``State``): IDLE, CAPTURING, SOLVING, CHECKING, FAULT. A device that fails puts
the service in FAULT; the worker reconnects with exponential backoff
(``fault_retry_min_s`` .. ``fault_retry_max_s``) and resumes the job where it was. Devices
may be offline while the service is up and idle.

Crash safety: every accepted station is committed before the next move; on start the
service resumes every run the store says is unfinished, skipping committed stations.
"""

from __future__ import annotations

import enum
import logging
import math
import queue
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

import numpy as np

from cellcal.daemon import capture as cap
from cellcal.daemon.config import Config
from cellcal.daemon.plan import PlannedStation, explicit_plan, generate_plan, plan_from_dict, plan_to_dict
from cellcal.daemon.report import result_to_wire, transform_from_wire, transform_to_wire
from cellcal.daemon.store import StationRecord, Store, StoreError
from cellcal.solver import CalibrationError, DegenerateGeometry, calibrate_base_frame, calibrate_tool_point
from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import rotation_angle, se3_inverse

log = logging.getLogger(__name__)

__all__ = ["State", "Service", "ServiceError", "cellcal_version"]


def cellcal_version() -> str:
    try:
        return version("cellcal")
    except PackageNotFoundError:  # running from a source tree
        return "0+unknown"


class State(str, enum.Enum):
    IDLE = "IDLE"
    CAPTURING = "CAPTURING"
    SOLVING = "SOLVING"
    CHECKING = "CHECKING"
    FAULT = "FAULT"


class ServiceError(CellcalError):
    """A request the service cannot honour now (``code`` is the ZeroMQ error code)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(message)


class _Abort(Exception):
    """Internal: the current job was aborted or the service is stopping."""


@dataclass
class _Job:
    kind: str  # "run" | "drift"
    run_id: int | None = None
    reason: str = ""
    done: threading.Event = field(default_factory=threading.Event)


class Service:
    """The daemon. Construct (no I/O), :meth:`start`, then :meth:`serve` until stopped.

    Parameters
    ----------
    cfg : Config
        Loaded configuration.
    notifier : object, optional
        ``cellcal.daemon.sdnotify.Notifier``-like (``ready``, ``status``, ``watchdog``,
        ``stopping``, ``watchdog_interval_s``).
    publish : callable(topic, body, retained=False), optional
        Where events go (the ZeroMQ server's ``publish``); also see :meth:`add_listener`.
    """

    def __init__(self, cfg: Config, *, notifier: Any = None, publish: Callable[..., None] | None = None) -> None:
        self.cfg = cfg
        self.notifier = notifier
        self._publish_fn = publish
        self._listeners: list[Callable[[str, dict], None]] = []
        self.store = Store(cfg.service.state_dir)
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
        self._robot: Any = None
        self._tracker: Any = None
        self._monitor: cap.RobotMonitor | None = None
        self._engine: cap.CaptureEngine | None = None
        self.devices: dict[str, dict] = {
            "robot": {"connected": False, "url": cfg.robot.url, "identity": {}},
            "tracker": {"connected": False, "url": cfg.tracker.url, "identity": {}},
        }
        self._cusum = 0.0
        self._current_kind: str | None = None
        self._checks_of: dict[int, int] = {}
        self._last_drift: dict | None = None
        self._next_drift_s: float | None = None
        self.fatal: BaseException | None = None
        self._last_fault: dict | None = None  # the fault body to clear when FAULT ends

    # ---- events ----------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[str, dict], None]) -> None:
        """Call ``fn(topic, body)`` for every event (the demo prints progress from it)."""
        self._listeners.append(fn)

    def _emit(self, topic: str, body: dict, *, retained: bool = False) -> None:
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

    def _set_state(self, state: State, detail: str = "") -> None:
        with self._lock:
            previous = self.state
            changed = state != self.state or detail != self.state_detail
            self.state, self.state_detail = state, detail
        if changed:
            log.info("state %s %s", state.value, detail)
            job = self._current
            self._emit("cellcal/v1/state", {
                "state": state.value, "previous": previous.value, "reason": detail,
                "run_id": str(job.run_id) if job is not None and job.run_id is not None else None,
                "kind": self._current_kind if state in (State.CAPTURING, State.SOLVING) else None,
                "motion_mode": self.cfg.capture.motion_mode, "detail": detail,
            })
            if self.notifier is not None:
                self.notifier.status(f"{state.value} {detail}".strip())
            fault = self._last_fault
            if previous == State.FAULT and state != State.FAULT and fault is not None:
                # The fault topic is raised *and cleared* (protocol.FaultBody.active): without
                # this, its latest message (what a late joiner's snapshot shows) stays an
                # active fault after the service recovered.
                self._last_fault = None
                self._emit("cellcal/v1/fault", dict(
                    fault, active=False, state=state.value, retry_in_s=None,
                    message=f"cleared, now {state.value}: {fault['message']}"))

    def _progress(self) -> None:
        self._progress_ns = time.monotonic_ns()

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        """Open and replay the store, queue unfinished runs, start the worker."""
        Path(self.cfg.service.runtime_dir).mkdir(parents=True, exist_ok=True)
        self.store.open()
        from cellcal.daemon.exports import remove_stale_temporaries

        exports = Path(self.cfg.service.state_dir) / "exports"
        if exports.is_dir():
            remove_stale_temporaries(exports)  # a kill mid-write leaves a temp file, never a torn one
        for run in self.store.unfinished_runs():
            log.info("resuming run %d (%s), %d stations committed", run.id, run.kind, run.n_stations)
            self._jobs.put(_Job("run", run.id, "resume"))
        self._worker = threading.Thread(target=self._work, name="cellcal-worker", daemon=True)
        self._worker.start()

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
                self._emit("cellcal/v1/heartbeat", self.heartbeat())
                next_hb = now + z.heartbeat_s
            if now >= next_retain:
                self.republish_result()
                next_retain = now + z.republish_s
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
                self.request_drift_check("schedule")
            if self._worker is not None and not self._worker.is_alive() and not self._stop.is_set():
                log.error("worker thread died; stopping")
                break
            self._stop.wait(0.05)
        if self.notifier is not None:
            self.notifier.stopping()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the worker (after its current transaction), close devices and the store."""
        self.request_stop()
        if self._worker is not None:
            self._worker.join(timeout=timeout_s)
        self._close_devices()
        self.store.close()

    # ---- public requests (thread-safe) -----------------------------------------------------------
    def heartbeat(self) -> dict:
        """The ``cellcal/v1/heartbeat`` body (``protocol.HeartbeatBody``)."""
        active = self._active_result_safe()
        job = self._current
        return {
            "cell": self.cfg.service.name,
            "state": self.state.value,
            "detail": self.state_detail,
            "uptime_s": time.monotonic() - self._t_start,
            "heartbeat_s": self.cfg.zmq.heartbeat_s,
            "devices": {k: {"connected": bool(v["connected"]), "url": v["url"], "identity": v.get("identity_text")}
                        for k, v in self.devices.items()},
            "active_result_id": str(active.id) if active else None,
            "suspect": bool(active.suspect) if active else False,
            "run_id": (str(job.run_id) if job.run_id is not None else f"check-{id(job):x}") if job else None,
            "version": cellcal_version(),
        }

    def status(self) -> dict:
        hb = self.heartbeat()
        hb["queued_jobs"] = self._jobs.qsize()
        hb["last_drift"] = self._last_drift
        hb["cusum_m"] = self._cusum
        return hb

    def start_run(self, kind: str | None = None, *, plan: list[PlannedStation] | None = None,
                  stations: list[dict] | None = None, parent_result_id: int | None = None, reason: str = "") -> int:
        """Queue a calibration run; returns its id (the run is stored before this returns)."""
        kind = kind or self.cfg.solve.kind
        if kind not in ("base_frame", "tool_point", "hand_eye"):
            raise ServiceError("E_BAD_REQUEST", f"kind must be base_frame, tool_point or hand_eye, got {kind!r}")
        current = self._current
        # A run closed in the store is over (its result is already published); only its job
        # is winding down, and a client reacting to the result must not be told it is busy.
        if current is not None and current.kind == "run" and (
                current.run_id is None or self.store.get_run(current.run_id).is_open):
            raise ServiceError("E_BUSY", f"run {current.run_id} is in progress")
        if kind == "hand_eye" and stations is None:
            # Hand-eye needs camera views of a target; this daemon drives a robot and a tracker.
            raise ServiceError(
                "E_STATE", "hand_eye needs camera observations, and this cell has no camera device: "
                "solve them with `cellcal solve --kind hand_eye` (or the solver API)",
            )
        if stations is not None:
            plan_dict = {"stations": [], "given": stations}
        else:
            plan_dict = plan_to_dict(plan if plan is not None else self.make_plan())
        run_id = self.store.create_run(
            kind, plan_dict, config_sha256=self.cfg.sha256,
            devices={k: v.get("identity", {}) for k, v in self.devices.items()},
            parent_result_id=parent_result_id,
        )
        self._jobs.put(_Job("run", run_id, reason or "requested"))
        return run_id

    def abort(self) -> bool:
        """Abort the current job (the current station finishes its transaction first)."""
        busy = self._current is not None
        if busy:
            self._abort.set()
        return busy

    def request_drift_check(self, reason: str = "requested") -> None:
        if self._active_result_safe() is None:
            raise ServiceError("E_NO_CALIBRATION", "no active calibration to check")
        self._jobs.put(_Job("drift", None, reason))

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no job is queued or running (tests and the demo)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self._current is None and self._jobs.empty():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def make_plan(self) -> list[PlannedStation]:
        p = self.cfg.plan
        if p.kind == "explicit":
            return explicit_plan(p.stations, self._model())
        return generate_plan(
            self._model(), n=p.n_stations, box_min_m=np.array(p.workspace_min_m), box_max_m=np.array(p.workspace_max_m),
            max_tilt_rad=p.max_tilt_rad, home_q_rad=np.array(p.home_q_rad), q_min_rad=np.array(p.joint_min_rad),
            q_max_rad=np.array(p.joint_max_rad), seed=p.seed,
        )

    def _model(self) -> Any:
        if self._robot is not None:
            return self._robot.model
        from cellcal.drivers.kinematics import dh_model

        name = str(self.cfg.robot.options.get("model", "ur5e")) if isinstance(self.cfg.robot.options.get("model", "ur5e"), str) else "ur5e"
        return dh_model(name)

    # ---- results for clients -----------------------------------------------------------------------
    def _active_result_safe(self):
        try:
            return self.store.active_result()
        except (StoreError, AttributeError):
            return None

    def result_body(self, rec: Any, *, retained: bool = False) -> dict:
        """The ``cellcal/v1/result`` body (``protocol.ResultBody``) of a stored result."""
        body = dict(rec.result)
        prov = dict(rec.provenance)
        devices = prov.get("devices") or {}
        body.update(
            result_id=str(rec.id), run_id=None if rec.run_id is None else str(rec.run_id), kind=rec.kind,
            cell=self.cfg.service.name, created_ns=_iso_ns(rec.created_utc), active=bool(rec.active),
            suspect=bool(rec.suspect), suspect_reason=rec.suspect_reason, retained=retained,
            valid_from=rec.valid_from_utc,
            provenance={
                "config_sha256": prov.get("config_sha256", ""),
                "device_serials": {k: str((devices.get(k) or {}).get("serial", "") or (devices.get(k) or {}).get("driver", ""))
                                   for k in ("robot", "tracker")},
                "solver": prov.get("solver", ""),
                "frame_convention": prov.get("frame_convention", ""),
                "valid_from_ns": _iso_ns(rec.valid_from_utc),
                "cellcal_version": prov.get("cellcal_version", ""),
                "devices": devices,
                "parent_result_id": None if rec.parent_result_id is None else str(rec.parent_result_id),
                "valid_from": rec.valid_from_utc,
            },
        )
        body.setdefault("transforms", {})
        return body

    def result_summary(self, rec: Any) -> dict:
        r = rec.result
        return {
            "result_id": str(rec.id), "run_id": None if rec.run_id is None else str(rec.run_id), "kind": rec.kind,
            "created_ns": _iso_ns(rec.created_utc), "active": bool(rec.active), "suspect": bool(rec.suspect),
            "accepted": bool(r.get("gates", {}).get("passed", True)), "n_stations": int(r.get("n_stations", 0)),
            "rms_translation_m": float(r.get("rms_translation_m", 0.0)), "rms_rotation_rad": float(r.get("rms_rotation_rad", 0.0)),
        }

    def republish_result(self) -> None:
        """The active result again, marked ``retained`` (every ``[zmq] republish_s``)."""
        rec = self._active_result_safe()
        if rec is not None:
            self._emit("cellcal/v1/result", self.result_body(rec, retained=True), retained=True)

    def republish_result_now(self) -> None:
        """The active result after it changed (activation, suspect): not ``retained``."""
        rec = self._active_result_safe()
        if rec is not None:
            self._emit("cellcal/v1/result", self.result_body(rec))

    def set_publisher(self, publish: Callable[..., None]) -> None:
        self._publish_fn = publish

    def to_base(self, *, point_m: Any = None, matrix: Any = None, result_id: int | None = None) -> dict:
        """Express a cell-frame point or pose in the base frame with a calibration."""
        rec = self.store.get_result(result_id) if result_id is not None else self._active_result_safe()
        if rec is None:
            raise ServiceError("E_NO_CALIBRATION", "no active calibration")
        tr = rec.result.get("transforms", {})
        if "cell_T_base" not in tr:
            raise ServiceError("E_STATE", f"result {rec.id} ({rec.kind}) has no cell_T_base")
        base_T_cell = se3_inverse(transform_from_wire(tr["cell_T_base"]))
        out: dict = {"result_id": rec.id, "suspect": rec.suspect}
        if point_m is not None:
            p = np.asarray(point_m, dtype=float)
            if p.shape != (3,) or not np.all(np.isfinite(p)):
                raise ServiceError("E_BAD_REQUEST", "point_m must be 3 finite numbers (m)")
            out["base_p_m"] = [float(v) for v in base_T_cell[:3, :3] @ p + base_T_cell[:3, 3]]
        if matrix is not None:
            from cellcal.solver.se3 import check_transform

            try:
                T = check_transform(np.asarray(matrix, dtype=float).reshape(4, 4), "pose")
            except ValueError as exc:
                raise ServiceError("E_BAD_REQUEST", str(exc)) from None
            out["base_T_pose"] = transform_to_wire("base_T_pose", base_T_cell @ T)
        return out

    # ---- devices -----------------------------------------------------------------------------------
    def _open_devices(self, need_tracker: bool) -> None:
        from cellcal.drivers import connect_robot, connect_tracker

        if self._robot is None:
            robot = connect_robot(self.cfg.robot.url, **self.cfg.robot.options)
            try:
                robot.open()
            except BaseException:
                robot.close()
                raise
            self._robot = robot
            self._monitor = cap.RobotMonitor(robot, cap.settle_config(self.cfg.robot.settle)).start()
            ident = {"driver": type(robot).__name__, "model": getattr(robot.model, "name", "")}
            self.devices["robot"].update(connected=True, identity=ident, identity_text=f"{ident['driver']} {ident['model']}")
        if need_tracker and self._tracker is None:
            tracker = connect_tracker(self.cfg.tracker.url, **self.cfg.tracker.options)
            try:
                tracker.open()
                info = tracker.identify()
            except BaseException:
                tracker.close()
                raise
            self._tracker = tracker
            self.devices["tracker"].update(connected=True, identity={
                "model": info.model, "serial": info.serial, "firmware": info.firmware,
                "protocol": str(getattr(info, "protocol_version", "")),
            }, identity_text=f"{info.model} {info.serial} fw {info.firmware}")
        self._engine = cap.CaptureEngine(self._monitor, self._tracker, self.cfg) if self._monitor else None

    def _close_devices(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None
        for name in ("_robot", "_tracker"):
            dev = getattr(self, name)
            if dev is not None:
                try:
                    dev.close()
                except Exception:  # noqa: BLE001 - closing a broken device must not raise
                    log.warning("closing %s failed", name, exc_info=True)
                setattr(self, name, None)
        for d in self.devices.values():
            d["connected"] = False
        self._engine = None

    def _ensure_devices(self, need_tracker: bool = True) -> None:
        """Open the devices, retrying with exponential backoff in FAULT (interruptible)."""
        delay = self.cfg.service.fault_retry_min_s
        prev_state = self.state
        while True:
            self._check_abort()
            try:
                self._open_devices(need_tracker)
                if self.state == State.FAULT:
                    self._set_state(prev_state if prev_state != State.FAULT else State.IDLE)
                return
            except (CellcalError, OSError, ValueError) as exc:
                self._close_devices()
                dev = "tracker" if self._robot is not None or "tracker" in str(exc).lower() else "robot"
                self._fault(f"cannot open devices: {exc}", exc, device=dev, retry_in_s=delay)
                if self._stop.wait(delay) or self._abort.is_set():
                    self._check_abort()
                delay = min(delay * 2.0, self.cfg.service.fault_retry_max_s)

    def _fault(self, message: str, exc: BaseException | None = None, *, device: str | None = None,
               code: str = "E_DEVICE", retry_in_s: float | None = None) -> None:
        self._set_state(State.FAULT, message)
        body = {
            "code": code, "device": device, "message": message, "state": State.FAULT.value, "active": True,
            "retry_in_s": retry_in_s, "type": type(exc).__name__ if exc else "",
        }
        self._last_fault = body
        self._emit("cellcal/v1/fault", body)

    def _check_abort(self) -> None:
        if self._abort.is_set() or self._stop.is_set():
            raise _Abort()

    # ---- the worker ------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                job = self._jobs.get(timeout=0.2)
            except queue.Empty:
                self._progress()
                continue
            self._current = job
            self._abort.clear()
            try:
                if job.kind == "run":
                    self._execute_run(job.run_id)
                else:
                    self._execute_drift(job.reason)
            except _Abort:
                if job.kind == "run" and not self._stop.is_set():
                    # Stopping leaves the run open so it resumes on the next start; an abort
                    # closes it (unless it already ended, e.g. in the same instant).
                    if self.store.get_run(job.run_id).status.value in ("capturing", "solving"):
                        self.store.set_run_status(job.run_id, "aborted", "aborted by request")
                    self._emit("cellcal/v1/state", {"state": self.state.value, "detail": f"run {job.run_id} aborted"})
            except StoreError as exc:
                # The store cannot take writes (disk full, read-only): a fault, never a crash;
                # what was committed stays, the run stays resumable.
                self._fault(f"store: {exc}", exc, code="E_STATE")
            except Exception as exc:  # noqa: BLE001 - the worker must survive any job
                log.exception("job %s failed", job.kind)
                self._fault(f"{job.kind} failed: {exc}", exc, code="E_INTERNAL")
            finally:
                self._current = None
                job.done.set()
                self._progress()
                if self.state != State.FAULT:
                    self._set_state(State.IDLE)
        self._close_devices()

    def _execute_run(self, run_id: int) -> None:
        run = self.store.get_run(run_id)
        self._current_kind = run.kind
        # Killed between storing the result and closing the run (two transactions): the run
        # is complete; close it with that result instead of solving and storing a second one.
        prior = next((r for r in self.store.list_results(limit=10) if r.run_id == run_id), None)
        if prior is not None:
            failed = prior.result.get("gates", {}).get("failed", [])
            self.store.set_run_status(run_id, "failed" if failed else "done", "; ".join(failed))
            self._export(prior.id)
            if not failed:
                self._emit("cellcal/v1/result", self.result_body(prior))
            return None
        if "given" in run.plan:
            return self._solve_given(run)
        plan = plan_from_dict(run.plan)
        need_tracker = run.kind == "base_frame"
        self._set_state(State.CAPTURING, f"run {run_id}")
        c = self.cfg.capture
        committed = {s.plan_index: s for s in self.store.stations(run_id)}
        accepted = [s.base_T_flange for s in committed.values()]
        consecutive = 0
        observe = c.motion_mode == "observe"
        todo = [ps for ps in plan if ps.index not in committed]
        n_planned = len(plan)
        if observe:
            n_target = max(len(plan), self.cfg.plan.n_stations)
            next_index = max(committed, default=-1) + 1
            todo = [PlannedStation(i, None, None) for i in range(next_index, n_target)]
            n_planned = n_target
        if todo:  # a run resumed after its last station is solved without the devices
            self._ensure_devices(need_tracker)
            self._set_state(State.CAPTURING, f"run {run_id}")
        for ps in todo:
            attempts = 0
            while True:
                self._check_abort()
                try:
                    if not observe:
                        self._engine.move_to(ps)
                    if run.kind == "tool_point":
                        rec = self._robot_only_station(ps.index, accepted)
                    else:
                        got = self._engine.capture(accepted, self._abort)
                        rec = self._station_record(ps.index, got)
                except cap.StationRejected as rej:
                    self._check_abort()
                    attempts += 1
                    consecutive += 1
                    self.store.add_rejection(run_id, ps.index, rej.reason.value, _jsonable(rej.detail))
                    self._emit("cellcal/v1/station", {
                        "run_id": str(run_id), "index": ps.index, "planned": n_planned, "attempt": attempts,
                        "accepted": False, "reason": rej.reason.value, "message": str(rej),
                        "accepted_count": len(accepted), "settle": _settle_body(rej.detail),
                    })
                    self._progress()
                    if consecutive >= c.max_consecutive_rejections:
                        msg = f"{consecutive} stations in a row rejected (last: {rej.reason.value})"
                        self.store.set_run_status(run_id, "failed", msg)
                        self._fault(msg)
                        return
                    if attempts >= c.max_attempts_per_station and not observe:
                        break  # give this station up, go on with the plan
                    continue
                except cap.DeviceFault as df:
                    self._close_devices()
                    self._fault(str(df), df.cause, device=df.device)
                    self._ensure_devices(need_tracker)
                    self._set_state(State.CAPTURING, f"run {run_id}")
                    continue
                self.store.add_station(run_id, rec)  # one transaction: the station is safe now
                accepted.append(rec.base_T_flange)
                consecutive = 0
                self._progress()
                self._emit("cellcal/v1/station", {
                    "run_id": str(run_id), "index": ps.index, "planned": n_planned, "attempt": attempts + 1,
                    "accepted": True, "reason": None, "accepted_count": len(accepted), "settle": _settle_body(rec.settle),
                })
                break
        self._check_abort()
        self._solve_run(run_id, run.kind)

    def _station_record(self, index: int, got: cap.Capture) -> StationRecord:
        return StationRecord(
            plan_index=index, base_T_flange=got.base_T_flange, q_rad=got.q_rad, cell_T_target=got.cell_T_target,
            cell_p_target=got.cell_p_target, tracker_std_translation_m=got.tracker_std_translation_m,
            tracker_std_rotation_rad=got.tracker_std_rotation_rad, sample_count=got.sample_count,
            robot_t_device_s=got.robot_t_device_s, robot_t_host_ns=got.robot_t_host_ns,
            tracker_t_device_s=got.tracker_t_device_s, tracker_t_host_ns=got.tracker_t_host_ns,
            settle=_jsonable(got.settle), raw=_jsonable(got.raw), accepted_host_ns=time.monotonic_ns(),
        )

    def _robot_only_station(self, index: int, accepted: list) -> StationRecord:
        state, status = self._monitor.wait_settled(self.cfg.capture.station_timeout_s, self._abort)
        for j, Ga in enumerate(accepted):
            if (np.linalg.norm(Ga[:3, 3] - state.base_T_flange[:3, 3]) < self.cfg.capture.min_pose_change_m
                    and rotation_angle(Ga[:3, :3].T @ state.base_T_flange[:3, :3]) < self.cfg.capture.min_pose_change_rad):
                raise cap.StationRejected(cap.RejectReason.DUPLICATE_POSE, f"same pose as accepted station {j}")
        return StationRecord(
            plan_index=index, base_T_flange=state.base_T_flange, q_rad=state.q_rad, cell_T_target=None,
            cell_p_target=None, tracker_std_translation_m=0.0, tracker_std_rotation_rad=None, sample_count=0,
            robot_t_device_s=state.t_device_s, robot_t_host_ns=state.t_host_ns, tracker_t_device_s=0.0,
            tracker_t_host_ns=0, settle={"quiet_s": status.quiet_s, "max_joint_speed_rad_s": status.max_joint_speed_rad_s},
            raw={}, accepted_host_ns=time.monotonic_ns(),
        )

    # ---- solving -----------------------------------------------------------------------------------------
    def _solve_run(self, run_id: int, kind: str) -> int | None:
        extra = 0
        while True:
            self._set_state(State.SOLVING, f"run {run_id}")
            stations = self.store.stations(run_id)
            G = np.array([s.base_T_flange for s in stations]) if stations else np.zeros((0, 4, 4))
            M = np.array([s.cell_T_target for s in stations]) if kind == "base_frame" and stations else None
            try:
                if kind == "base_frame":
                    result = calibrate_base_frame(G, M if M is not None else np.zeros((0, 4, 4)),
                                                  min_axis_spread=self.cfg.solve.min_axis_spread)
                else:
                    result = calibrate_tool_point(G, min_axis_spread=self.cfg.solve.min_axis_spread)
                break
            except DegenerateGeometry as exc:
                # Issue 7's planner names the pose that best fixes the weakest direction; in
                # command mode we go and measure it instead of ending the run.
                if (kind != "base_frame" or self.cfg.capture.motion_mode != "command"
                        or extra >= self.cfg.plan.max_extra_stations or self._engine is None):
                    return self._solve_failed(run_id, kind, exc)
                extra += 1
                nxt = self._suggest_station(G, M)
                if nxt is None:
                    return self._solve_failed(run_id, kind, exc)
                index = max((s.plan_index for s in stations), default=-1) + 1
                log.info("run %d: %s; measuring a suggested station %d", run_id, exc, index)
                self._set_state(State.CAPTURING, f"run {run_id} (extra station for {exc.frame} axis)")
                self._capture_extra(run_id, PlannedStation(index, nxt.q_rad, nxt.base_T_flange), G)
            except CalibrationError as exc:
                return self._solve_failed(run_id, kind, exc)
        return self._store_result(run_id, kind, result, stations)

    def _suggest_station(self, G: np.ndarray, M: np.ndarray | None) -> Any:
        from cellcal.solver.planning import suggest_next_station

        p = self.cfg.plan
        try:
            # A rough cell_T_base for the line-of-sight test: the degenerate data still fix it
            # but for one rotation; the tracker sits at the cell origin.
            X0 = calibrate_base_frame(G, M, min_axis_spread=0.0, refine=False, holdout=False).cell_T_base
        except (CalibrationError, ValueError):
            X0 = np.eye(4)
        try:
            return suggest_next_station(
                G, self._model().forward, np.column_stack([p.joint_min_rad, p.joint_max_rad]),
                (np.array(p.workspace_min_m), np.array(p.workspace_max_m)), np.zeros(3), X0, rng=p.seed,
            )
        except ValueError as exc:
            log.warning("no station suggestion: %s", exc)
            return None

    def _capture_extra(self, run_id: int, ps: PlannedStation, G: np.ndarray) -> None:
        accepted = list(G)
        for _attempt in range(self.cfg.capture.max_attempts_per_station):
            self._check_abort()
            try:
                self._engine.move_to(ps)
                got = self._engine.capture(accepted, self._abort)
            except cap.StationRejected as rej:
                self.store.add_rejection(run_id, ps.index, rej.reason.value, _jsonable(rej.detail))
                continue
            self.store.add_station(run_id, self._station_record(ps.index, got))
            self._progress()
            return

    def _solve_failed(self, run_id: int, kind: str, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}"
        self.store.set_run_status(run_id, "failed", msg)
        # The result topic carries only calibrations a client may use; a failed run is told
        # on the state and fault topics (and stays visible in list_results / the store).
        self._fault(f"run {run_id} failed: {msg}", exc, code="E_STATE")
        return None

    def _gates(self, result: Any) -> list[str]:
        s = self.cfg.solve
        failed = []
        if result.rms_translation_m > s.max_rms_translation_m:
            failed.append(f"rms translation {result.rms_translation_m * 1e3:.3f} mm > {s.max_rms_translation_m * 1e3:.3f} mm")
        if result.rms_rotation_rad > s.max_rms_rotation_rad:
            failed.append(f"rms rotation {math.degrees(result.rms_rotation_rad):.4f} deg > {math.degrees(s.max_rms_rotation_rad):.4f} deg")
        return failed

    def _store_result(self, run_id: int, kind: str, result: Any, stations: list) -> int:
        run = self.store.get_run(run_id)
        wire = result_to_wire(result)
        failed = self._gates(result)
        wire["gates"] = {"passed": not failed, "failed": failed}
        wire["check_stations"] = self._choose_check_stations(stations, run)
        provenance = {
            "config_sha256": self.cfg.sha256, "devices": run.devices, "cellcal_version": cellcal_version(),
            "solver": result.solver, "cell": self.cfg.service.name,
        }
        parent = run.parent_result_id
        rid = self.store.add_result(run_id, kind, wire, provenance, parent_result_id=parent, activate=not failed)
        self.store.set_run_status(run_id, "done" if not failed else "failed", "; ".join(failed))
        self._export(rid)
        rec = self.store.get_result(rid)
        if failed:
            self._emit("cellcal/v1/state", {
                "state": self.state.value, "previous": self.state.value, "run_id": str(run_id), "kind": kind,
                "motion_mode": self.cfg.capture.motion_mode,
                "reason": f"run {run_id}: result {rid} failed its acceptance gates ({'; '.join(failed)}); not activated",
            })
        else:
            self._emit("cellcal/v1/result", self.result_body(rec))
        if not failed:
            self._cusum = 0.0
            if self.cfg.drift.enabled and self.cfg.capture.motion_mode == "command":
                self._next_drift_s = time.monotonic() + self.cfg.drift.interval_s
        return rid

    def _export(self, rid: int) -> None:
        try:
            from cellcal.daemon.exports import write_exports

            rec = self.store.get_result(rid)
            write_exports(Path(self.cfg.service.state_dir) / "exports", rid, self.result_body(rec))
        except (OSError, CellcalError, ValueError) as exc:
            log.warning("exports of result %d failed: %s", rid, exc)

    def _choose_check_stations(self, stations: list, run: Any) -> list[dict]:
        """Farthest-point choice of ``drift.check_stations`` stations over the workspace."""
        if not stations:
            return []
        k = min(self.cfg.drift.check_stations, len(stations))
        P = np.array([s.base_T_flange[:3, 3] for s in stations])
        chosen = [int(np.argmax(np.linalg.norm(P - P.mean(axis=0), axis=1)))]
        while len(chosen) < k:
            d = np.min(np.linalg.norm(P[:, None, :] - P[None, chosen, :], axis=2), axis=1)
            chosen.append(int(np.argmax(d)))
        planned = {ps.index: ps for ps in plan_from_dict(run.plan)} if run.plan.get("stations") else {}
        out = []
        for i in chosen:
            s = stations[i]
            ps = planned.get(s.plan_index)
            q = ps.q_rad if ps is not None and ps.q_rad is not None else s.q_rad
            out.append({"plan_index": s.plan_index, "q_rad": [float(v) for v in q],
                        "base_T_flange": [float(v) for v in np.asarray(s.base_T_flange).reshape(16)]})
        return out

    def _solve_given(self, run: Any) -> None:
        """A run whose stations the client supplied (hand-eye, or any kind from elsewhere)."""
        from cellcal.solver import calibrate_hand_eye

        self._set_state(State.SOLVING, f"run {run.id}")
        given = run.plan["given"]
        try:
            G = np.array([np.asarray(s["base_T_flange"], dtype=float).reshape(4, 4) for s in given])
            if run.kind == "hand_eye":
                O = np.array([np.asarray(s["camera_T_target"], dtype=float).reshape(4, 4) for s in given])
                result = calibrate_hand_eye(G, O, min_axis_spread=self.cfg.solve.min_axis_spread)
            elif run.kind == "base_frame":
                M = np.array([np.asarray(s["cell_T_target"], dtype=float).reshape(4, 4) for s in given])
                result = calibrate_base_frame(G, M, min_axis_spread=self.cfg.solve.min_axis_spread)
            else:
                result = calibrate_tool_point(G, min_axis_spread=self.cfg.solve.min_axis_spread)
        except (KeyError, TypeError, ValueError, CalibrationError) as exc:
            self._solve_failed(run.id, run.kind, exc)
            return
        self._store_result(run.id, run.kind, result, [])

    # ---- drift checks ---------------------------------------------------------------------------------------
    def _execute_drift(self, reason: str) -> None:
        rec = self._active_result_safe()
        if rec is None or "cell_T_base" not in rec.result.get("transforms", {}):
            return
        d = self.cfg.drift
        self._set_state(State.CHECKING, f"result {rec.id}")
        self._ensure_devices(True)
        self._set_state(State.CHECKING, f"result {rec.id}")
        X = transform_from_wire(rec.result["transforms"]["cell_T_base"])
        Y = transform_from_wire(rec.result["transforms"]["flange_T_target"])
        dev_t, dev_r, per = [], [], []
        for cs in rec.result.get("check_stations", []):
            self._check_abort()
            ps = PlannedStation(int(cs["plan_index"]), np.asarray(cs["q_rad"]), np.asarray(cs["base_T_flange"]).reshape(4, 4))
            for _attempt in range(self.cfg.capture.max_attempts_per_station):
                try:
                    if self.cfg.capture.motion_mode == "command":
                        self._engine.move_to(ps)
                    got = self._engine.capture([], self._abort)
                    break
                except cap.StationRejected as rej:
                    self._check_abort()
                    log.info("drift station %d rejected: %s", ps.index, rej)
                except cap.DeviceFault as df:
                    self._close_devices()
                    self._fault(str(df), df.cause, device=df.device)
                    self._ensure_devices(True)
                    self._set_state(State.CHECKING, f"result {rec.id}")
            else:
                continue
            model = X @ got.base_T_flange @ Y
            et = float(np.linalg.norm(model[:3, 3] - got.cell_p_target))
            er = rotation_angle(model[:3, :3].T @ got.cell_T_target[:3, :3]) if got.cell_T_target is not None else 0.0
            dev_t.append(et)
            dev_r.append(er)
            per.append({"index": ps.index, "translation_m": et, "rotation_rad": er})
            self._progress()
        if not dev_t:
            self._fault("drift check: no check station could be measured")
            return
        t, r = max(dev_t), max(dev_r)
        self._cusum = max(0.0, self._cusum + t - d.cusum_k_m)
        status = "ok"
        if t > d.warn_translation_m or r > d.warn_rotation_rad:
            status = "warn"
        if t > d.fail_translation_m or r > d.fail_rotation_rad or self._cusum > d.cusum_h_m:
            status = "fail"
        self._checks_of[rec.id] = self._checks_of.get(rec.id, 0) + 1
        alarm = self._cusum > d.cusum_h_m
        action = "none"
        if status == "fail":
            action = "recalibrating" if d.on_drift == "recalibrate" else "marked_suspect"
        record = {
            "result_id": str(rec.id), "check_id": self._checks_of[rec.id],
            "deviation_translation_m": t, "deviation_rotation_rad": r,
            "warn_translation_m": d.warn_translation_m, "fail_translation_m": d.fail_translation_m,
            "warn_rotation_rad": d.warn_rotation_rad, "fail_rotation_rad": d.fail_rotation_rad,
            "cusum": {"value_m": self._cusum, "k_m": d.cusum_k_m, "h_m": d.cusum_h_m, "alarm": alarm},
            "status": status, "suspect": status == "fail" or bool(rec.suspect), "action": action,
            "stations": per, "reason": reason,
            # the same in edge units, for people reading logs and `cellcal watch`
            "deviation_mm": t * 1e3, "deviation_deg": math.degrees(r),
        }
        self.store.add_drift_check(rec.id, record)
        self._last_drift = record
        if status == "fail":
            self.store.mark_suspect(rec.id, f"drift check: {t * 1e3:.3f} mm / {math.degrees(r):.4f} deg")
        self._emit("cellcal/v1/drift", record)
        if status == "fail":
            self.republish_result_now()
            if d.on_drift == "recalibrate":
                self._jobs.put(_Job("run", self.start_run_internal(rec.id), "recalibrate after drift"))
                return
        if self.cfg.drift.enabled and self.cfg.capture.motion_mode == "command":
            self._next_drift_s = time.monotonic() + d.interval_s

    def start_run_internal(self, parent_result_id: int) -> int:
        return self.store.create_run(
            self.cfg.solve.kind, plan_to_dict(self.make_plan()), config_sha256=self.cfg.sha256,
            devices={k: v.get("identity", {}) for k, v in self.devices.items()}, parent_result_id=parent_result_id,
        )


def _iso_ns(text: str | None) -> int:
    """Wall-clock UTC nanoseconds of an ISO 8601 stamp (0 when missing)."""
    if not text:
        return 0
    from datetime import datetime

    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(round(dt.timestamp() * 1e9))


def _settle_body(fig: dict) -> dict:
    """``protocol.SettleFigures`` from the capture engine's figures (0 where not measured)."""
    def num(key: str, default: float | None = 0.0) -> float | None:
        v = fig.get(key)
        return default if v is None else float(v)

    return {
        "robot_rest_s": num("robot_quiet_s") or num("quiet_s"),
        "max_joint_speed_rad_s": num("robot_max_joint_speed_rad_s") or num("max_joint_speed_rad_s"),
        "max_flange_speed_m_s": num("robot_max_flange_speed_m_s"),
        "tracker_std_translation_m": num("tracker_std_translation_m"),
        "tracker_std_rotation_rad": num("tracker_std_rotation_rad", None),
        "overlap_s": num("tracker_window_s"),
    }


def _jsonable(obj: Any) -> Any:
    """Plain JSON types (numpy scalars and arrays become floats and lists; NaN/inf -> None)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        return v if math.isfinite(v) else None
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    return obj
