"""Interrupted runs: resumed at once when the fault clears, or closed as failed (ADR 0012).

A run interrupted by a fault (a device, the store) or by the end of the process (a crash,
kill -9, SIGTERM) is either resumed, skipping its committed stations, or closed as failed with
the reason. :class:`ResumePolicy` decides, with the same rules at start and after a store
fault:

* a run never resumes once a newer run exists;
* nor in another motion mode than it was started in;
* nor later than ``[service] resume_within_s`` after the interruption (the wall clock at a
  restart, the monotonic clock after a store fault);
* nor when its kind says so (``RunKind.resume_refusal``: a base-frame run started measuring
  poses is not resumed measuring points);
* a run solved from client-supplied stations always may (resuming moves nothing).

At start at most the newest unfinished run resumes; every resumption is logged and says,
in command mode, that the daemon moves the robot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from cellcal.daemon import bodies, runs
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.jobs.control import JOB_RUN, Job
from cellcal.daemon.runs import RunContext
from cellcal.daemon.store import RunRecord, RunStatus, Store

log = logging.getLogger(__name__)

__all__ = ["ResumePolicy", "wall_age_s", "RunEvent"]

#: ``run_event(run_id, kind, reason)``: a state message about a run without a state change.
RunEvent = Callable[[int, str, str], None]


def wall_age_s(utc: str) -> float | None:
    """Seconds since a stored wall-clock stamp (None if unreadable). The only clock a run's
    last progress and a restart share is the wall clock; a step of it counts as a long
    interruption, which closes the run rather than resuming it."""
    try:
        return (time.time_ns() - bodies.iso_ns(utc)) * 1e-9
    except ValueError:
        return None


class ResumePolicy:
    """Whether an interrupted run resumes (module docstring)."""

    def __init__(self, cfg: Config, store: Store, ctx: RunContext, run_event: RunEvent) -> None:
        self.cfg = cfg
        self.store = store
        self.ctx = ctx
        self._run_event = run_event

    def moves_robot(self, run: RunRecord) -> bool:
        """Whether resuming ``run`` moves the robot (command mode, stations left to take)."""
        if "given" in run.plan or not self.ctx.commands_robot:
            return False
        planned = run.plan.get("stations", [])
        return run.n_stations < (len(planned) if isinstance(planned, (list, tuple)) else 0)

    def why_not(self, run: RunRecord, interrupted_s: float | None, cause: str) -> str | None:
        """Why an interrupted ``run`` must be closed instead of resumed (None: it may resume)."""
        newest = self.store.list_runs(limit=1)
        if newest and newest[0].id > run.id:
            return (f"run {run.id} closed, not resumed: run {newest[0].id} was started after it "
                    f"(interrupted by {cause})")
        if "given" in run.plan:
            return None  # solved from client-supplied stations: resuming moves nothing
        started = run.plan.get("started") or {}
        mode = started.get("motion_mode", self.ctx.motion_mode) if isinstance(started, Mapping) else self.ctx.motion_mode
        if mode != self.ctx.motion_mode:
            return (f"run {run.id} closed, not resumed: started in {mode} mode, the daemon now runs in "
                    f"{self.ctx.motion_mode} mode")
        refusal = runs.for_run(run, self.cfg.tracker.measure).resume_refusal(self.ctx, run)
        if refusal is not None:
            return refusal
        window = self.cfg.service.resume_within_s
        if interrupted_s is None or abs(interrupted_s) > window:
            ago = "an unknown time" if interrupted_s is None else f"{interrupted_s:.1f} s"
            return (f"run {run.id} closed, not resumed: interrupted by {cause} {ago} ago, longer than "
                    f"[service] resume_within_s = {window:g} s")
        return None

    def close(self, run: RunRecord, why: str) -> None:
        """Close ``run`` as failed for ``why``, logged and published."""
        log.warning("%s", why)
        self.store.set_run_status(run.id, RunStatus.FAILED, why)
        self.announce(run, why)

    def abort_queued(self, jobs: list[Job]) -> bool:
        """Close the runs of ``jobs`` (taken out of the queue before the worker began them) as
        aborted; False when there were none."""
        for job in jobs:
            if job.run_id is not None and (run := self.store.get_run(job.run_id)).is_open:
                self.store.set_run_status(run.id, RunStatus.ABORTED, "aborted by request")
                self.announce(run, f"run {run.id} aborted")
            job.done.set()
        return bool(jobs)

    def announce(self, run: RunRecord, reason: str) -> None:
        """Publish what happened to ``run`` (a ``state`` message without a state change)."""
        self._run_event(run.id, run.kind, reason)

    def at_start(self, run: RunRecord) -> Job | None:
        """The job that resumes an unfinished run found at start, or None after closing it."""
        if any(r.run_id == run.id for r in self.store.list_results(limit=10)):
            # Killed between storing the result and closing the run: closing it with that
            # result needs neither the devices nor a decision (``RunJob.execute``).
            return Job(JOB_RUN, run.id, "close after a restart")
        why = self.why_not(run, wall_age_s(run.updated_utc), "a restart")
        if why is not None:
            self.close(run, why)
            return None
        log.warning("run %d (%s) resumes after a restart with %d stations committed%s", run.id, run.kind,
                    run.n_stations, "; the daemon moves the robot (command mode)" if self.moves_robot(run) else "")
        return Job(JOB_RUN, run.id, "resume", resume="a restart")

    def after_store_fault(self, run: RunRecord, interrupted_s: float) -> Job | None:
        """The job that resumes ``run`` when the store takes writes again, or None after closing it."""
        why = self.why_not(run, interrupted_s, "a store fault")
        if why is not None:
            self.close(run, why)
            return None
        log.warning("run %d resumes: the store takes writes again%s", run.id,
                    "; the daemon moves the robot (command mode)" if self.moves_robot(run) else "")
        return Job(JOB_RUN, run.id, "resume", resume="the store fault cleared")


def motion_mode(cfg: Config) -> P.MotionMode:
    """The configured motion mode as the protocol's word."""
    return P.MOTION_OBSERVE if cfg.capture.motion_mode == P.MOTION_OBSERVE else P.MOTION_COMMAND
