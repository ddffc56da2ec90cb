"""A CiA 402 arm with ``[kinematics] use_identified``: cellcal computes its FK, so after a
kinematics run the robot is opened with the identified model and base-frame runs use it.

Apart from tests/test_daemon_kinematics.py (the two are the longest daemon tests: in two files
the suite's two workers run them side by side).
"""

from __future__ import annotations

import numpy as np
import pytest
from _kin_daemon import KIN, result_of, wait_run_end

from cellcal.daemon import protocol as P
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_cia402_base_frame_runs_use_the_identified_model(tmp_path):
    """A CiA 402 arm (cellcal computes its FK) with ``use_identified``: after a kinematics
    run the robot is opened with the identified model, and the same base-frame plan closes
    far better than it did with the nominal model."""
    kin = dict(KIN, use_identified=True)
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=10, robot_transport="canopen", time_scale=FAST_TIME_SCALE,
                        # CiA 402 moves are SDO by SDO: on a loaded machine (two test workers) a
                        # move may miss its deadline; the run retries rather than fails on that
                        overrides={"kinematics": kin, "solve": {"max_rms_mm": 5.0},
                                   "capture": {"max_consecutive_rejections": 40}}) as cell:
        first = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        assert wait_run_end(cell, first, 400.0) in ("done", "failed")
        before = result_of(cell, first).result["rms_translation_m"]
        run_id = cell.svc.start_run(P.KIND_KINEMATICS, reason="test")
        assert wait_run_end(cell, run_id, 900.0) == "done", cell.svc.store.get_run(run_id).status_reason
        rec = result_of(cell, run_id)
        again = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        assert wait_run_end(cell, again, 400.0) == "done"
        assert cell.svc._devices.model_override_result == rec.id
        ident = rec.result["kinematics"]["identified"]
        assert np.allclose(cell.svc._devices.robot.model.theta_offset_rad, ident["theta"], atol=1e-15)
        after = result_of(cell, again).result["rms_translation_m"]
        assert after < before / 2, (after, before)
        # the nominal arm's base frame is in the old model's frames: suspect since the reopen,
        # with its files and the store saying so; the one fitted with the identified model is not
        old = cell.svc.store.get_result(result_of(cell, first).id)
        assert old.suspect and f"kinematics result {rec.id}" in old.suspect_reason, old.suspect_reason
        assert not cell.svc.store.get_result(result_of(cell, again).id).suspect
