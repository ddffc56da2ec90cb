"""A run whose plan cannot determine its kind is refused before the first move, naming why
(issue 24 item 5, ``RunKind.check_plan``): a tool-point run on the generated base-frame plan
(no pivot motion), a tool-point run whose planned rotations share one axis, and a base-frame
run whose planned rotations share one axis when the planner may add no station.

Through the daemon: the run fails with ``PlanRefused`` in its status and its fault, no
station is attempted and the robot never moves.
"""

from __future__ import annotations

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.store import RunStatus
from cellcal.testing.harness import inprocess_cell

# The slow tier (make test, not make check): this file runs simulated devices in real time.
pytestmark = pytest.mark.slow

WAIT_S = 60.0
HOME_DEG = [0.0, -90.0, 90.0, -90.0, -90.0]
#: Every station turns only the wrist's last joint: all motions about one axis.
ONE_AXIS = {"kind": "explicit", "stations": [{"q_deg": HOME_DEG + [a]} for a in (-40.0, -10.0, 20.0, 50.0)]}


def _refused(cell, run_id) -> str:
    """The run's failure reason once its fault says it failed."""
    cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and b.get("active") and f"run {run_id} failed" in str(b["message"]),
                  WAIT_S, f"run {run_id} to fail")
    run = cell.svc.store.get_run(int(run_id))
    assert run.status == RunStatus.FAILED
    assert not [b for b in cell.bodies(P.TOPIC_STATION) if b["run_id"] == str(run_id)]  # no station attempted
    assert cell.svc.store.stations(int(run_id)) == [] and cell.svc.store.rejections(int(run_id)) == []
    return run.status_reason or ""


@pytest.mark.parametrize(("plan", "words"), [
    (None, "hold no point fixed"),  # the generated base-frame plan
    (ONE_AXIS, "same axis"),
])
def test_a_tool_point_plan_without_pivot_motion_is_refused_before_the_robot_moves(tmp_path, plan, words):
    overrides = {"plan": plan} if plan is not None else None
    with inprocess_cell(tmp_path, n_stations=None if plan is not None else 6, overrides=overrides) as cell:
        q0 = np.array(cell.robot.robot.sample().q_rad)
        run_id = cell.svc.start_run(P.KIND_TOOL_POINT, reason="test")
        reason = _refused(cell, run_id)
        assert reason.startswith("PlanRefused: ") and "refused before the first move" in reason, reason
        assert words in reason, reason
        faults = [b for b in cell.bodies(P.TOPIC_FAULT) if b["active"]]
        assert faults[-1]["type"] == "PlanRefused" and words in faults[-1]["message"]
        assert np.max(np.abs(np.array(cell.robot.robot.sample().q_rad) - q0)) < 1e-9  # never moved
        assert not [r for r in cell.svc.store.list_results(limit=5) if r.run_id == int(run_id)]


def test_a_base_frame_plan_about_one_axis_is_refused_when_no_station_may_be_added(tmp_path):
    with inprocess_cell(tmp_path, n_stations=None,
                        overrides={"plan": {**ONE_AXIS, "max_extra_stations": 0}}) as cell:
        q0 = np.array(cell.robot.robot.sample().q_rad)
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        reason = _refused(cell, run_id)
        assert reason.startswith("PlanRefused: ") and "max_extra_stations = 0" in reason and "same axis" in reason
        assert np.max(np.abs(np.array(cell.robot.robot.sample().q_rad) - q0)) < 1e-9


def test_a_plan_for_another_arm_is_refused_naming_the_station(tmp_path):
    """A plan of 12 joints for the 6-joint robot (the wire fuzz found it as an internal error
    with a traceback): refused before the first move, the station and the shape named."""
    from cellcal.daemon.runs.plan import PlannedStation
    with inprocess_cell(tmp_path, n_stations=None) as cell:
        q0 = np.array(cell.robot.robot.sample().q_rad)
        plan = [PlannedStation(i, np.full(12, 0.1 * i), None) for i in range(4)]
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, plan=plan, reason="test")
        reason = _refused(cell, run_id)
        assert reason.startswith("PlanRefused: plan station 0: "), reason
        assert "(12,)" in reason and "internal error" not in reason
        assert np.max(np.abs(np.array(cell.robot.robot.sample().q_rad) - q0)) < 1e-9
