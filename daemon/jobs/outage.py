"""A store that fails a write (disk full, read-only): FAULT, then probed until it takes writes.

What was committed stays; the job that failed ends in FAULT, and the worker, instead of
taking the next job, probes the store with backoff (``fault_retry_min_s`` ..
``fault_retry_max_s``) and leaves FAULT by itself when it takes writes again: the run the
failed write belonged to is then resumed or closed (``jobs.resume.ResumePolicy``), closed as
aborted when an abort came meanwhile, or closed as its job had decided (an abort or a
failure whose own write failed). A run resumed after an outage that fails again before any
progress keeps that outage's start and backoff: it neither flaps nor outlives
``resume_within_s``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.devices import Backoff
from cellcal.daemon.jobs.control import JOB_RUN, Job, JobControl, SetState
from cellcal.daemon.jobs.resume import ResumePolicy
from cellcal.daemon.store import RunStatus, Store, StoreError

log = logging.getLogger(__name__)

__all__ = ["StoreOutage", "StoreOutages"]


@dataclass
class StoreOutage:
    """A store that failed a write: what the worker does until (and when) it takes writes again."""

    run_id: int | None           # the run the failed write belonged to (None: no run)
    since: float                 # time.monotonic() of the first failure of this outage
    backoff: Backoff
    next_try: float = 0.0        # time.monotonic() of the next probe
    pending: bool = True         # still waiting for the store
    aborted: bool = False        # an abort came meanwhile: close the run as aborted
    close: tuple[RunStatus, str] | None = None  # close the run so, instead of deciding anew


class StoreOutages:
    """The worker's store outage, if any (module docstring)."""

    def __init__(self, cfg: Config, store: Store, control: JobControl, policy: ResumePolicy,
                 set_state: SetState) -> None:
        self.cfg = cfg
        self.store = store
        self.control = control
        self.policy = policy
        self._set_state = set_state
        self.current: StoreOutage | None = None

    @property
    def pending(self) -> bool:
        """Whether the worker is waiting for the store."""
        return self.current is not None and self.current.pending

    def wait_s(self) -> float:
        """Seconds until the next probe (0 when none is pending)."""
        out = self.current
        return max(0.0, out.next_try - time.monotonic()) if out is not None and out.pending else 0.0

    def progress(self) -> None:
        """Real progress after the store came back: the outage is over."""
        if self.current is not None and not self.current.pending:
            self.current = None

    def abort_waiting_run(self) -> bool:
        """An abort while a run waits for the store: it will be closed as aborted, never resumed."""
        out = self.current
        if out is not None and out.pending and out.run_id is not None:
            out.aborted = True
            return True
        return False

    def fault(self, job: Job | None, exc: StoreError, *, close: tuple[RunStatus, str] | None = None) -> None:
        """The store failed a write: FAULT, and probe it with backoff from the worker's loop."""
        run_id = job.run_id if job is not None and job.kind == JOB_RUN else None
        outage = self.current
        if outage is None or outage.run_id != run_id:
            outage = StoreOutage(run_id, time.monotonic(),
                                 Backoff(self.cfg.service.fault_retry_min_s, self.cfg.service.fault_retry_max_s))
        outage.pending = True
        if close is not None:
            outage.close = close
        delay = outage.backoff.next_delay()
        outage.next_try = time.monotonic() + delay
        self.current = outage
        self.control.devices.close()
        self.control.fault(f"store: {exc}", exc, code=P.E_STATE, retry_in_s=delay)

    def step(self) -> Job | None:
        """One step of waiting for the store: probe it when due. When it takes writes, the
        job that resumes the interrupted run (None: closed, no run, or not yet)."""
        outage = self.current
        assert outage is not None and outage.pending
        wait = outage.next_try - time.monotonic()
        if wait > 0:
            self.control.stop.wait(min(wait, 0.2))
            self.control.progress()
            return None
        try:
            self.store.probe_write()
            job = self._resolve(outage)
        except StoreError as exc:
            delay = outage.backoff.next_delay()
            outage.next_try = time.monotonic() + delay
            self.control.fault(f"store: {exc}", exc, code=P.E_STATE, retry_in_s=delay)
            return None
        outage.pending = False
        log.info("the store takes writes again after %.1f s", time.monotonic() - outage.since)
        if job is None:
            self.current = None
            self._set_state(P.STATE_IDLE, "the store takes writes again")
        return job

    def _resolve(self, outage: StoreOutage) -> Job | None:
        """The store is back: the job that resumes the interrupted run, or None (closed, or no run)."""
        if outage.run_id is None:
            return None
        run = self.store.get_run(outage.run_id)
        if not run.is_open:
            return None
        if outage.aborted or outage.close is not None:
            status, reason = (RunStatus.ABORTED, "aborted by request") if outage.aborted else outage.close  # type: ignore[misc]
            self.store.set_run_status(run.id, status, reason)
            self.policy.announce(run, f"run {run.id} {status.value}: {reason}")
            return None
        return self.policy.after_store_fault(run, time.monotonic() - outage.since)
