"""A calibration run as the worker executes it: capture the stations, solve, keep the result.

What the run *does* is its kind's (``cellcal.daemon.runs``); this job is the loop around it,
the same for every kind:

1. A run closed by an earlier process between storing its result and closing the run is
   closed with that result (``ResultKeeper.close_with``); a run of client-supplied stations
   is solved at once (``RunKind.solve_given``).
2. Before its first station the kind may refuse the plan (``RunKind.check_plan``).
3. **Capture**, station by station (``RunKind.visit``: the plan's stations not yet committed,
   or in ``observe`` mode whatever pose the cell's program rests at): in command mode the robot
   is moved, then the kind captures (``RunKind.capture``) against its rough estimate
   (``RunKind.estimate``), and the captured station is judged with the accepted ones by the
   run's consensus (``RunKind.screen``, ADR 0032: accepted stations beyond it are dropped
   from the store). A station is committed in one transaction the moment it is accepted; a
   rejection is stored and published with its ``outcome``, retried up to ``[capture]
   max_attempts_per_station`` times (a consensus outlier: twice), then given up, and
   ``max_consecutive_rejections`` in a row end the run; a device fault is ridden out with
   backoff (``JobControl``), and a drive that faulted during the move is both (its station
   rejected, its link reopened); a change of the controller's TCP or payload ends the run.
4. **Solve** (``RunKind.solve``, interruptible): a ``DegenerateGeometry`` in command mode gets
   the kind's extra station (``RunKind.extra_station``), up to ``[plan] max_extra_stations``,
   captured and judged by the consensus as a planned station is (its rejections published
   with their ``outcome``); any other refusal fails the run with its reason.
5. **Finish** (``RunKind.finish``, which may measure more through :meth:`RunJob.measure_for`:
   each measurement judged by the consensus of the run's fit stations, a drive fault counted
   as a rejection) and keep the result (``ResultKeeper.keep``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from cellcal.daemon import bodies, runs
from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.camera_capture import MovingFrame
from cellcal.daemon.config import Config
from cellcal.daemon.jobs.control import Emit, Job, JobControl, narrative
from cellcal.daemon.jobs.results import ResultKeeper, known_devices
from cellcal.daemon.jobs.resume import ResumePolicy
from cellcal.daemon.report import human
from cellcal.daemon.runs import RunContext, RunKind
from cellcal.daemon.runs.plan import PlannedStation, plan_from_dict
from cellcal.daemon.store import RunRecord, RunStatus, StationRecord, Store
from cellcal.drivers.errors import DriverError
from cellcal.solver import CalibrationError, DegenerateGeometry

log = logging.getLogger(__name__)

__all__ = ["RunJob", "OUTCOME_RETRY", "OUTCOME_GIVEN_UP", "OUTCOME_DROPPED", "OUTCOME_RUN_FAILED"]

#: What follows a rejected station (its event's ``outcome``, docs/protocols/zeromq.md 4.4.3):
#: it is measured again, given up (the run goes on without it), dropped from the run after
#: it was accepted (the consensus test), or the run fails (too many rejections in a row).
OUTCOME_RETRY = "retrying"
OUTCOME_GIVEN_UP = "given_up"
OUTCOME_DROPPED = "dropped"
OUTCOME_RUN_FAILED = "run_failed"


def _attempts_for(rej: cap.StationRejected, configured: int) -> int:
    """Attempts a station gets after ``rej``: a station beyond the run's consensus is
    measured once more, then given up (a wrong reflector stays locked at one pose)."""
    return min(configured, CONSENSUS_ATTEMPTS) if rej.reason is cap.RejectReason.CONSENSUS_OUTLIER else configured


#: Attempts at a station the consensus test rejects (ADR 0032): the first, and one re-measurement.
CONSENSUS_ATTEMPTS = 2


def _fault_and_rejection(exc: cap.StationRejected | cap.DeviceFault) -> tuple[cap.DeviceFault | None,
                                                                             cap.StationRejected | None]:
    """A capture's failure as (the device fault, the station rejection): a drive fault is
    both (its ``rejection``), a plain link failure only the first, a rejection only the second."""
    if isinstance(exc, cap.DeviceFault):
        return exc, exc.rejection
    return None, exc


class RunJob:
    """Executes run jobs (module docstring). One per service; used by the worker thread only."""

    def __init__(self, cfg: Config, store: Store, ctx: RunContext, control: JobControl, keeper: ResultKeeper,
                 policy: ResumePolicy, emit: Emit, run_event: Callable[[int, str, str], None]) -> None:
        self.cfg = cfg
        self.store = store
        self.ctx = ctx
        self.control = control
        self.keeper = keeper
        self.policy = policy
        self._emit = emit
        self._run_event = run_event
        #: The kind of the run being executed (the state messages name it).
        self.kind: RunKind | None = None

    def _kind(self, run: RunRecord) -> RunKind:
        return runs.for_run(run, self.cfg.tracker.measure)

    def _station_event(self, body: P.StationBody) -> None:
        """A station body, logged in words at info (the journal reads like ``cellcal watch``)."""
        narrative.info("%s", human.station_line(body))
        self._emit(P.TOPIC_STATION, body)

    # ---- the run ----------------------------------------------------------------------------
    def execute(self, job: Job) -> None:
        run_id = job.run_id
        assert run_id is not None
        run = self.store.get_run(run_id)
        if not run.is_open:
            return  # closed while it waited in the queue (an abort before it began)
        kind = self.kind = self._kind(run)
        prior = next((r for r in self.store.list_results(limit=10) if r.run_id == run_id), None)
        if prior is not None:
            self.keeper.close_with(run, prior)
            return
        if "given" in run.plan:
            self._solve_given(run, kind)
            return
        if not self.store.station_indices(run_id):
            try:  # a plan that cannot determine the kind: refused before the first move
                kind.check_plan(self.ctx, run)
            except CalibrationError as exc:
                self._failed(run_id, exc)
                return
        if not self._capture(job, run, kind):
            return
        self.control.check_abort()
        self._solve(run_id, kind)

    def _capture(self, job: Job, run: RunRecord, kind: RunKind) -> bool:
        """Capture the run's stations; False when the run ended (failed, named)."""
        run_id = run.id
        plan = plan_from_dict(run.plan)
        what = f"run {run_id}"
        detail = what
        if job.resume is not None:
            detail = f"{what} resumed after {job.resume}"
            if self.policy.moves_robot(run):
                detail += ": the daemon moves the robot (command mode)"
        self.control.set_state(P.STATE_CAPTURING, detail)
        c = self.cfg.capture
        committed = {s.plan_index: s for s in self.store.stations(run_id)}
        records = [committed[i] for i in sorted(committed)]
        expected = kind.estimate(self.ctx, records)
        consecutive = 0
        observe = not self.ctx.commands_robot
        todo = [ps for ps in plan if ps.index not in committed]
        n_planned = kind.planned_count(self.ctx, len(plan))
        if observe:
            n_target = max(len(plan), self.cfg.plan.n_stations)
            next_index = max(committed, default=-1) + 1
            todo = [PlannedStation(i, None, None) for i in range(next_index, n_target)]
            n_planned = n_target
        stations = kind.visit(self.ctx, todo, records)
        first = next(stations, None)
        if first is None:
            return True  # a run resumed after its last station is solved without the devices
        engine = self.control.ensure_devices(kind.needs_tracker, P.STATE_CAPTURING, detail, **self._wants(kind))
        ps: PlannedStation | None = first
        while ps is not None:
            n_planned = max(n_planned, ps.index + 1)
            attempts = 0
            while True:
                self.control.check_abort()
                try:
                    if not observe:
                        engine.move_to(ps, self.control.abort)
                    rec = kind.capture(engine, ps, records, self.control.abort, expected)
                    n_before = len(records)
                    try:
                        if not self._screen(run_id, kind, records, rec, ps.index, attempt=attempts + 1,
                                            planned=n_planned):
                            return False
                    finally:
                        if len(records) != n_before:  # stations dropped: the rough estimate without them
                            expected = kind.estimate(self.ctx, records)
                except (cap.StationRejected, cap.DeviceFault) as exc:
                    df, rej = _fault_and_rejection(exc)
                    if df is not None and df.ends_job:
                        self._invalidated(run_id, df)
                        return False
                    if rej is not None:
                        self.control.check_abort()
                        attempts += 1
                        consecutive += 1
                        ends_run = consecutive >= c.max_consecutive_rejections
                        given_up = attempts >= _attempts_for(rej, c.max_attempts_per_station) and not observe
                        self._rejected(run_id, ps.index, rej, attempt=attempts, planned=n_planned,
                                       accepted=len(records), outcome=(OUTCOME_RUN_FAILED if ends_run else
                                                                       OUTCOME_GIVEN_UP if given_up else OUTCOME_RETRY))
                        if ends_run:
                            msg = f"{consecutive} stations in a row rejected (last: {rej.reason.value})"
                            self.store.set_run_status(run_id, RunStatus.FAILED, msg)
                            self.control.fault(msg)
                            return False
                    if df is not None:  # the link is reopened (a drive fault: after its rejection)
                        engine = self._reopened(df, what, kind)
                    if rej is not None and attempts >= _attempts_for(rej, c.max_attempts_per_station) and not observe:
                        break  # give this station up, go on with the plan
                    continue
                self.store.add_station(run_id, rec)  # one transaction: the station is safe now
                records.append(rec)
                consecutive = 0
                self.control.made_progress()
                self._station_event(bodies.station(
                    run_id=run_id, index=ps.index, planned=n_planned, attempt=attempts + 1,
                    accepted_count=len(records), figures=rec.settle,
                ))
                expected = kind.estimate(self.ctx, records)
                break
            ps = next(stations, None)
        return True

    def _screen(self, run_id: int, kind: RunKind, records: list[StationRecord], rec: StationRecord, index: int, *,
                attempt: int, planned: int) -> bool:
        """Judge a captured station ``rec`` with the run's accepted ``records`` by their
        consensus (``RunKind.screen``, ADR 0032), whatever captured it (a planned station, one
        the planner added after the first solve): accepted stations beyond the consensus are
        dropped (from the store and ``records``, announced); the new station's rejection is
        raised. False when the stations split into two consistent groups: the run failed,
        named (``consensus_split``)."""
        screened = kind.screen(self.ctx, records, rec)
        if screened is None:
            return True
        if screened.drop:
            self._drop(run_id, screened.drop, records, planned)
        if screened.ends_run and screened.rejection is not None:
            split = screened.rejection  # two consistent groups: no honest result
            self._rejected(run_id, index, split, attempt=attempt, planned=planned, accepted=len(records),
                           outcome=OUTCOME_RUN_FAILED)
            self.store.set_run_status(run_id, RunStatus.FAILED, str(split))
            self.control.fault(f"run {run_id} failed: {split}", split, device=P.DEVICE_TRACKER)
            return False
        if screened.rejection is not None:
            raise screened.rejection
        return True

    def _rejected(self, run_id: int, index: int, rej: cap.StationRejected, *, attempt: int, planned: int,
                  accepted: int, outcome: str) -> None:
        """A rejected capture: stored with its figures, and published (and logged) with what
        happens next (``outcome``: the station is retried, given up, or the run fails)."""
        self.store.add_rejection(run_id, index, rej.reason.value, cap.json_object(rej.detail))
        self._station_event(bodies.with_outcome(bodies.station(
            run_id=run_id, index=index, planned=planned, attempt=attempt, accepted_count=accepted,
            figures=rej.detail, rejected=rej.reason.value, message=str(rej),
        ), outcome))
        self.control.progress()

    def _drop(self, run_id: int, drop: Sequence[tuple[StationRecord, cap.StationRejected]],
              records: list[StationRecord], planned: int) -> None:
        """Accepted stations the run's consensus finds beyond it: out of the store (recorded
        as rejections), out of ``records``, and announced (``outcome`` ``dropped``)."""
        for st, rej in drop:
            self.store.drop_station(run_id, st.plan_index, rej.reason.value, cap.json_object(rej.detail))
            records.remove(st)
            self._station_event(bodies.with_outcome(bodies.station(
                run_id=run_id, index=st.plan_index, planned=planned, attempt=1, accepted_count=len(records),
                figures=rej.detail, rejected=rej.reason.value, message=str(rej),
            ), OUTCOME_DROPPED))

    def _invalidated(self, run_id: int, inv: cap.DeviceFault) -> None:
        """The controller's TCP or payload changed: the run cannot go on; it fails, named."""
        self.control.devices.close()
        self.store.set_run_status(run_id, RunStatus.FAILED, str(inv.cause))
        self.control.fault(f"run {run_id} failed: {inv.cause}", inv.cause, device=inv.device)

    def _failed(self, run_id: int, exc: BaseException) -> None:
        msg = f"{type(exc).__name__}: {exc}"
        self.store.set_run_status(run_id, RunStatus.FAILED, msg)
        # The result topic carries only calibrations a client may use; a failed run is told
        # on the state and fault topics (and stays visible in list_results / the store).
        self.control.fault(f"run {run_id} failed: {msg}", exc, code=P.E_STATE)

    # ---- solving ------------------------------------------------------------------------------
    def _solve(self, run_id: int, kind: RunKind) -> int | None:
        extra = 0
        while True:
            self.control.set_state(P.STATE_SOLVING, f"run {run_id}")
            stations = self.store.stations(run_id)
            # The kind reads the devices its stations were taken with (a robot reopened with an
            # identified model since the run was stored names that model), as the provenance will.
            run = self.store.get_run(run_id)
            run = dataclasses.replace(run, devices=known_devices(run, self.control.devices.identities()))
            try:
                result = self.control.interruptible(kind.solve, self.ctx, run, stations)
                break
            except DegenerateGeometry as exc:
                # The kind names the pose that best fixes the weakest direction; in command
                # mode we go and measure it instead of ending the run.
                engine = self.control.devices.engine
                ps = None
                if extra < self.cfg.plan.max_extra_stations and engine is not None:
                    ps = kind.extra_station(self.ctx, stations, exc)
                if ps is None:
                    self._failed(run_id, exc)
                    return None
                extra += 1
                log.info("run %d: %s; measuring a suggested station %d", run_id, exc, ps.index)
                self.control.set_state(P.STATE_CAPTURING, f"run {run_id} (extra station for {exc.frame} axis)")
                if not self._capture_extra(run_id, kind, ps, stations):
                    return None
            except (CalibrationError, ValueError) as exc:
                self._failed(run_id, exc)
                return None
        finished = kind.finish(self.ctx, run, result, stations, self.measure_for(run_id, kind))
        return self.keeper.keep(run, finished)

    def _solve_given(self, run: RunRecord, kind: RunKind) -> None:
        """A run whose stations the client supplied (hand-eye, or any kind from elsewhere)."""
        self.control.set_state(P.STATE_SOLVING, f"run {run.id}")
        try:
            result = self.control.interruptible(kind.solve_given, self.ctx, run.plan["given"])
        except (KeyError, TypeError, ValueError, CalibrationError) as exc:
            self._failed(run.id, exc)
            return
        self.keeper.keep(run, kind.finish(self.ctx, run, result, [], None))

    def _wants(self, kind: RunKind) -> dict[str, bool]:
        """What ``kind``'s stations open beside the robot (``need_camera``, ``want_tracker``)."""
        return {"need_camera": kind.needs_camera, "want_tracker": kind.wants_tracker(self.cfg)}

    def _reopened(self, df: cap.DeviceFault, detail: str, kind: RunKind) -> cap.CaptureEngine:
        """The engine after a link failed mid-station: ridden out and reopened for ``kind``."""
        return self.control.after_device_fault(df, detail, kind.needs_tracker, P.STATE_CAPTURING, **self._wants(kind))

    # ---- stations beyond the plan -------------------------------------------------------------
    def _capture_extra(self, run_id: int, kind: RunKind, ps: PlannedStation, stations: list[StationRecord]) -> bool:
        """Measure one kind-suggested station with the same checks as every station: the
        capture's, then the run's consensus (:meth:`_screen`: a wrong reflector on the
        planner's station is rejected as on a planned one, and an accepted station beyond
        the consensus is dropped from ``stations`` and the store). Rejections are published
        with their ``outcome`` and count towards ``[capture] max_attempts_per_station`` (a
        consensus outlier: :data:`CONSENSUS_ATTEMPTS`), a drive fault's too; then the station
        is given up (True: the solve goes on). False when the run ended (its controller
        settings changed, or its stations split into two groups)."""
        detail = self.control.detail
        engine = self.control.devices.engine
        assert engine is not None
        expected = kind.estimate(self.ctx, stations)
        planned = ps.index + 1
        configured = self.cfg.capture.max_attempts_per_station
        attempts = 0
        while True:
            self.control.check_abort()
            try:
                engine.move_to(ps, self.control.abort)
                got = kind.capture(engine, ps, stations, self.control.abort, expected)
                if not self._screen(run_id, kind, stations, got, ps.index, attempt=attempts + 1, planned=planned):
                    return False
            except (cap.StationRejected, cap.DeviceFault) as exc:
                df, rej = _fault_and_rejection(exc)
                if df is not None and df.ends_job:
                    self._invalidated(run_id, df)
                    return False
                given_up = False
                if rej is not None:
                    self.control.check_abort()
                    attempts += 1
                    given_up = attempts >= _attempts_for(rej, configured)
                    self._rejected(run_id, ps.index, rej, attempt=attempts, planned=planned, accepted=len(stations),
                                   outcome=OUTCOME_GIVEN_UP if given_up else OUTCOME_RETRY)
                if df is not None:
                    engine = self._reopened(df, detail, kind)
                if given_up:
                    return True
                continue
            self.store.add_station(run_id, got)
            stations.append(got)
            self.control.made_progress()
            self._station_event(bodies.station(
                run_id=run_id, index=ps.index, planned=planned, attempt=attempts + 1, accepted_count=len(stations),
                figures=got.settle,
            ))
            return True

    def measure_for(self, run_id: int, kind: RunKind) -> runs.Measure:
        """The ``Measure`` a kind's finish uses: moved to and captured like a station (no
        duplicate-pose test, no rough estimate: a test may revisit its poses), then judged by
        the consensus of the stations the run's fit used (``RunKind.screen`` with
        ``RunKind.fit_stations``; nothing is dropped: the result is solved already, so only
        the new measurement can be rejected), tagged (``raw`` merged into the station's) and
        stored with the run. A rejection is recorded and retried up to ``[capture]
        max_attempts_per_station`` times (a consensus outlier: :data:`CONSENSUS_ATTEMPTS`),
        then raised; a drive fault during the move (``drive_fault``, a ``DeviceFault``
        carrying a rejection) counts as one too: its link is reopened for the next attempt,
        and closed when it is the last (the next job reopens it), so a drive faulting on
        every move ends the measurement named instead of looping. Any other device fault is
        ridden out like a station's (one that ends the job is raised); an abort ends the job."""

        def measure(ps: PlannedStation, raw: P.JsonObject, what: str) -> StationRecord:
            detail = f"run {run_id}: {what}"
            engine = self.control.engine_for(kind.needs_tracker, P.STATE_CAPTURING, detail, **self._wants(kind))
            configured = self.cfg.capture.max_attempts_per_station
            attempts = 0
            while True:
                self.control.check_abort()
                try:
                    engine.move_to(ps, self.control.abort)
                    rec = kind.capture(engine, ps, [], self.control.abort, None)
                    judged = kind.screen(self.ctx, kind.fit_stations(self.store.stations(run_id)), rec)
                    if judged is not None and judged.rejection is not None:
                        raise judged.rejection
                except (cap.StationRejected, cap.DeviceFault) as exc:
                    df, rej = _fault_and_rejection(exc)
                    if df is not None and df.ends_job:
                        raise
                    last = False
                    if rej is not None:
                        self.control.check_abort()
                        attempts += 1
                        last = attempts >= _attempts_for(rej, configured)
                        self.store.add_rejection(run_id, ps.index, rej.reason.value, cap.json_object(rej.detail))
                        self.control.progress()
                    if df is not None:
                        if last:
                            self.control.devices.close()  # the fault is cleared when the next job reopens it
                        else:
                            engine = self._reopened(df, detail, kind)
                    if last and df is None:
                        raise
                    if last:
                        assert rej is not None
                        raise rej from df
                    continue
                rec = dataclasses.replace(rec, raw={**rec.raw, **raw})
                self.store.add_station(run_id, rec)  # one transaction: the measurement is safe now
                self.control.made_progress()
                return rec

        def sweep(start: PlannedStation, path: Sequence[npt.NDArray[np.float64]], speed: float,
                  what: str) -> list[MovingFrame]:
            engine = self.control.engine_for(kind.needs_tracker, P.STATE_CAPTURING, f"run {run_id}: {what}",
                                             **self._wants(kind))
            if engine.camera is None:
                raise cap.DeviceFault(P.DEVICE_CAMERA, DriverError("no camera is open"))
            frames: list[MovingFrame] = []
            try:
                engine.move_to(start, self.control.abort)
                for T in path:
                    self.control.check_abort()
                    frames += engine.camera.moving_frames(engine, T, speed, self.control.abort)
            except cap.StationRejected:
                self.control.check_abort()  # an abort ends the job, not just the sweep
                raise
            self.control.made_progress()
            return frames

        return _Measurements(measure, sweep)


class _Measurements:
    """A job's :class:`runs.Measure`: one more station (a call) or the frames of a sweep."""

    def __init__(self, station: Callable[[PlannedStation, P.JsonObject, str], StationRecord],
                 sweep: Callable[[PlannedStation, Sequence[npt.NDArray[np.float64]], float, str], list[MovingFrame]]
                 ) -> None:
        self._station, self._sweep = station, sweep

    def __call__(self, planned: PlannedStation, raw: P.JsonObject, what: str, /) -> StationRecord:
        return self._station(planned, raw, what)

    def sweep(self, start: PlannedStation, path: Sequence[npt.NDArray[np.float64]], speed: float, what: str, /
              ) -> list[MovingFrame]:
        return self._sweep(start, path, speed, what)
