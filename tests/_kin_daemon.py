"""What the daemon's kinematics-run tests share (tests/test_daemon_kinematics*.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from cellcal.testing.harness import run_status

#: ``[kinematics]`` of the daemon tests: 20 fit stations (the realistic arm's 27 parameters,
#: base and target are well determined by 20 pose stations: held-out RMS at the tracker's
#: floor) and the 30 held-out ones the planner keeps apart at least. The ISO 9283 pose test
#: has its own tests (tests/test_daemon_iso9283.py); here it would add 300 measurements.
KIN: dict[str, Any] = {"n_stations": 20, "n_validation": 30, "iso9283_cycles": 0}


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.asarray(x) ** 2)))


def wait_run_end(cell: Any, run_id: int, timeout_s: float) -> str:
    """The run's final status ("done" or "failed"), waited for on the store."""
    state_dir = Path(cell.cfg.service.state_dir)

    def ended(_topic: str, _body: dict) -> bool:
        return run_status(state_dir, run_id) in ("done", "failed")

    if not ended("", {}):
        cell.wait_for(ended, timeout_s, f"run {run_id} to end")
    status = run_status(state_dir, run_id)
    assert status is not None
    return status


def result_of(cell: Any, run_id: int) -> Any:
    """The one stored result of ``run_id``."""
    recs = [r for r in cell.svc.store.list_results(limit=20) if r.run_id == run_id]
    assert len(recs) == 1, (run_id, cell.svc.store.get_run(run_id))
    return recs[0]
