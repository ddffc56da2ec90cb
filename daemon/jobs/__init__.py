"""The worker's jobs: what the service's worker thread executes, one at a time.

:mod:`control` (abort, faults with backoff, the devices), :mod:`run` (a calibration run:
capture, solve, keep), :mod:`drift` (a heartbeat drift check and its schedule), :mod:`resume`
(whether an interrupted run resumes), :mod:`outage` (a store that fails a write), and
:mod:`results` (storing, gating, activating, exporting and publishing a result). The
service (``cellcal.daemon.service``) is the state machine and queue around them; what a run
does is its kind's (``cellcal.daemon.runs``).
"""
