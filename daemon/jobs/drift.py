"""A heartbeat drift check as the worker executes it, and the schedule of the next one.

After a calibration the active result's check stations (``drift.choose_check_stations``) are
revisited on a schedule (``[drift] interval_s``, command mode only) or on request
(``run_drift_check``): each is moved to (command mode), captured like a station, and its
tracker measurement compared with ``X G Y`` of the result as its kind predicts the station
(``RunKind.drift_station``: a kinematics result through its identified arm). A station the
capture's plausibility checks reject (a frozen or repeated tracker value, one beyond the
instrument's range or its angles' circle, a lying drive) is retried, then left out: a lying
device is never counted as drift (ADR 0032); with every station rejected the check ends in a
fault naming the reasons, and stores no verdict. The worst
deviation is judged against the warn/fail thresholds and a CUSUM (``drift.judge``), stored,
logged and published; a failed check marks the result suspect (its exports say so) and, with
``on_drift = "recalibrate"``, queues a recalibration run of the configured kind.

A check requested for a result that is no longer active when it starts is skipped (ADR
0009): its figures would describe a calibration nobody uses.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping

from cellcal.daemon import bodies, drift, runs
from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.jobs.control import Emit, Job, JobControl, narrative
from cellcal.daemon.jobs.results import ResultKeeper
from cellcal.daemon.report import human
from cellcal.daemon.store import Store

log = logging.getLogger(__name__)

__all__ = ["DriftJob"]


class DriftJob:
    """Executes drift checks and keeps their schedule and CUSUM (module docstring)."""

    def __init__(self, cfg: Config, store: Store, control: JobControl, keeper: ResultKeeper, emit: Emit,
                 recalibrate: Callable[[int], None]) -> None:
        self.cfg = cfg
        self.store = store
        self.control = control
        self.keeper = keeper
        self._emit = emit
        self._recalibrate = recalibrate
        self.cusum = drift.Cusum()
        self.check_ids = drift.CheckIds(store)
        #: The last drift record (``get_status``).
        self.last: dict[str, object] | None = None
        #: ``time.monotonic()`` when the next scheduled check is due (None: none scheduled).
        self.next_due_s: float | None = None

    def schedule(self) -> None:
        """The next scheduled check, ``[drift] interval_s`` from now (command mode only: in
        observe mode the daemon cannot go to the check stations)."""
        if self.cfg.drift.enabled and self.cfg.capture.motion_mode == P.MOTION_COMMAND:
            self.next_due_s = time.monotonic() + self.cfg.drift.interval_s

    def activated(self, result_id: int) -> None:
        """A new result became active: its CUSUM starts at zero, its first check is scheduled."""
        self.cusum.reset()
        self.schedule()

    def execute(self, job: Job) -> None:
        assert job.result_id is not None and job.check_id is not None
        rec = self.store.get_result(job.result_id)
        active = self.keeper.active()
        if active is None or active.id != rec.id:
            log.warning("drift check %d of result %d skipped: result %s is active now", job.check_id, rec.id,
                        active.id if active else None)
            return
        d = self.cfg.drift
        what = f"result {rec.id}"
        self.control.set_state(P.STATE_CHECKING, what)
        engine = self.control.ensure_devices(True, P.STATE_CHECKING, what)
        model = drift.model_of(rec.result)
        assert model is not None  # request_drift_check refused a result without one
        X, Y = model  # Y: flange_T_target (4, 4), or a point calibration's flange_p_target (3,)
        kind = runs.for_body({**rec.result, "kind": rec.kind})
        dev_t: list[float] = []
        dev_r: list[float | None] = []
        per = []
        rejected: list[str] = []
        checks = rec.result.get("check_stations", [])
        for cs in checks if isinstance(checks, list) else []:
            self.control.check_abort()
            ps = drift.check_station_plan(cs if isinstance(cs, Mapping) else {})
            got = None
            for _attempt in range(self.cfg.capture.max_attempts_per_station):
                try:
                    if self.cfg.capture.motion_mode == P.MOTION_COMMAND:
                        engine.move_to(ps, self.control.abort)
                    # The capture's own plausibility checks (range, frozen or repeated values,
                    # implausible angles, a lying drive) reject a lying station here as in a
                    # run: it is not measured, so it is never counted as drift.
                    got = engine.capture(ps.index, [], self.control.abort)
                    break
                except cap.StationRejected as rej:
                    self.control.check_abort()
                    rejected.append(f"station {ps.index}: {rej.reason.value}")
                    log.warning("drift check %d: check station %d rejected (%s): %s", job.check_id, ps.index,
                                rej.reason.value, rej)
                except cap.DeviceFault as df:
                    if df.ends_job:
                        self.control.devices.close()
                        self.control.fault(f"drift check {job.check_id} of result {rec.id} abandoned: {df.cause}",
                                           df.cause, device=df.device)
                        return
                    engine = self.control.after_device_fault(df, what, True, P.STATE_CHECKING)
            if got is None:
                continue
            et, er = drift.deviation(X, Y, kind.drift_station(rec.result, got))
            dev_t.append(et)
            dev_r.append(er)
            per.append(bodies.drift_station(ps.index, et, er))
            self.control.progress()
        if not dev_t:
            why = f" (rejected: {', '.join(rejected)})" if rejected else ""
            self.control.fault(f"drift check {job.check_id} of result {rec.id}: no check station could be measured{why}")
            return
        verdict = drift.judge(dev_t, dev_r, self.cusum, d)
        record = bodies.drift(result_id=rec.id, check_id=job.check_id, verdict=verdict, cfg=d, stations=per,
                              suspect=verdict.failed or bool(rec.suspect), reason=job.reason)
        self.store.add_drift_check(rec.id, dict(record))
        self.last = dict(record)
        if verdict.failed:
            t, r = verdict.deviation_translation_m, verdict.deviation_rotation_rad
            rot = "" if r is None else f" / {math.degrees(r):.4f} deg"
            self.store.mark_suspect(rec.id, f"drift check: {t * 1e3:.3f} mm{rot}")
            self.keeper.export(rec.id)  # the files say suspect too
        narrative.info("%s", human.drift_line(record))
        self._emit(P.TOPIC_DRIFT, record)
        if verdict.failed:
            self.keeper.publish_active()
            if verdict.action == P.ACTION_RECALIBRATING:
                self._recalibrate(rec.id)
                return
        self.schedule()
