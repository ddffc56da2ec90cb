"""A wrong reflector either side of ``[tracker] gross_error_mm`` (issue 25 audit).

The floor of the per-station gross-disagreement bound (25 mm) equals the simulator's default
wrong-reflector offset, which the attack tests of ``test_daemon_lying_devices.py`` also use:
a check that passed only because the two coincide would prove nothing. Every fourth station
(plan indices 3 and 7 of 8) sees a reflector ``offset_mm`` from the right one:

* 15 mm, inside the floor: the station checks pass it, the run's consensus (``consensus_error_mm``
  = 5, ADR 0032) drops station 3 once it can judge and gives station 7 up;
* 40 mm, beyond the floor: the per-station check refuses both as ``gross_disagreement``
  against the run's rough estimate (the consensus never sees them).

Either way the result is the right stations' and near the truth. Slow: simulated devices in
real time.
"""

from __future__ import annotations

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import transform_from_wire
from cellcal.testing.harness import inprocess_cell, scenario_with

pytestmark = pytest.mark.slow

WAIT_S = 120.0


def _wrong_reflector(offset_mm: float) -> str:
    return f"""
[[tracker.faults]]
kind = "wrong_reflector"
start_s = 0.0
duration_s = 1e6
offset_mm = {offset_mm!r}
every = 4
"""


@pytest.mark.parametrize(("offset_mm", "reason"), [(15.0, "consensus_outlier"), (40.0, "gross_disagreement")])
def test_a_wrong_reflector_inside_or_beyond_the_gross_floor_is_caught(tmp_path, offset_mm, reason):
    scenario = scenario_with(tmp_path / "wrong.toml", _wrong_reflector(offset_mm))
    with inprocess_cell(tmp_path, scenario=scenario, n_stations=8) as cell:
        assert cell.cfg.tracker.gross_error_m == pytest.approx(25e-3)  # the default under test
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        body = cell.wait_result(run_id, WAIT_S)
        stations = cell.svc.store.stations(int(run_id))
        rejections = cell.svc.store.rejections(int(run_id))
        assert [s.plan_index for s in stations] == [0, 1, 2, 4, 5, 6], [(r.plan_index, r.reason) for r in rejections]
        assert {r.plan_index for r in rejections} == {3, 7}
        assert {r.reason for r in rejections} == {reason}, [(r.plan_index, r.reason) for r in rejections]
        for r in rejections:
            dev = r.detail["expected_deviation_m" if reason == "gross_disagreement" else "consensus_deviation_m"]
            assert dev == pytest.approx(offset_mm * 1e-3, abs=0.5e-3), r.detail
        assert body["active"] and body["n_stations"] == 6
        X = transform_from_wire(body["transforms"]["cell_T_base"])
        assert np.linalg.norm(X[:3, 3] - cell.world.cell_T_base()[:3, 3]) < 0.5e-3
