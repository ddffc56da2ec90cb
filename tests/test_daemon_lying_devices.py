"""Lying devices against the daemon (issue 24 items 1, 2): each attack ends as a typed
station rejection (or a station dropped from the run), never as an accepted wrong station or
an active result.

The in-process cell (``cellcal.testing.harness.inprocess_cell``) with a fault injected into
a simulator (``sim/`` value faults, ``docs/simulation.md``):

* CiA 402 drives: one stopping 0.2 deg off its target while it reports target reached
  (``drive_target_mismatch``), one whose joint does not move (``joint_not_moving``), one
  showing FAULT during a move (``drive_fault``: the robot link is reopened, the station
  measured again);
* trackers: a position repeated bit for bit while the std changes
  (``tracker_position_repeated``), a GeoCOM Hz angle 100 rad beyond its circle
  (``tracker_value_implausible``).

Each case is short: few stations, and a run that fails after a few rejections in a row.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.store import RunStatus
from cellcal.testing.harness import inprocess_cell, scenario_with

# The slow tier (make test, not make check): this file runs simulated devices in real time.
pytestmark = pytest.mark.slow

WAIT_S = 120.0
#: A run that meets a lying device fails after this many rejections in a row (short tests).
FAIL_FAST = {"capture": {"max_consecutive_rejections": 3, "max_attempts_per_station": 2}}


#: The GeoCOM instrument reports its Hz angle 100 rad beyond the one it measured, throughout.
WILD_ANGLE = """
[[tracker.faults]]
kind = "wild_angle"
start_s = 0.0
duration_s = 1e6
value_rad = 100.0
"""


def _rejections(cell, run_id) -> list[dict]:
    return [b for b in cell.bodies(P.TOPIC_STATION) if b["run_id"] == str(run_id) and not b["accepted"]]


def _accepted(cell, run_id) -> list[dict]:
    return [b for b in cell.bodies(P.TOPIC_STATION) if b["run_id"] == str(run_id) and b["accepted"]]


def _wait_end(cell, run_id, timeout_s: float = WAIT_S) -> str:
    """The run's status once it is closed (the store is the truth; the events say why)."""
    cell.wait_for(lambda t, b: (t == P.TOPIC_RESULT and b.get("run_id") == str(run_id))
                  or (t == P.TOPIC_FAULT and b.get("active") and f"run {run_id}" in str(b.get("message"))
                      and cell.svc.store.get_run(int(run_id)).status != RunStatus.OPEN)
                  or (t == P.TOPIC_FAULT and "in a row rejected" in str(b.get("message"))),
                  timeout_s, f"run {run_id} to end")
    return cell.svc.store.get_run(int(run_id)).status.value


def _no_active_result_of(cell, run_id) -> None:
    for r in cell.svc.store.list_results(limit=20):
        if r.run_id == int(run_id):
            assert not r.active, f"result {r.id} of run {run_id} was activated"


@pytest.mark.parametrize(("fault", "reason"), [
    ({"kind": "off_target", "node": 2, "offset_deg": 0.2}, "drive_target_mismatch"),
    ({"kind": "frozen_joint", "node": 4}, "joint_not_moving"),
])
def test_a_drive_lying_about_its_move_is_a_typed_rejection_and_no_station(tmp_path, fault, reason):
    with inprocess_cell(tmp_path, n_stations=4, robot_transport="canopen", overrides=FAIL_FAST) as cell:
        kind = fault.pop("kind")
        cell.robot.robot.inject(kind, **fault)
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        assert _wait_end(cell, run_id) == RunStatus.FAILED.value
        rejected = _rejections(cell, run_id)
        # The first move is judged as the drive lied; a retry of the same target finds the
        # joint already parked off it, and not moving towards it (both the drive's lie).
        assert rejected and rejected[0]["reason"] == reason, rejected
        assert {b["reason"] for b in rejected} <= {"drive_target_mismatch", "joint_not_moving"}, rejected
        node = fault["node"]
        assert all(f"node {node}" in b["message"] for b in rejected), rejected[0]["message"]
        assert rejected[-1]["outcome"] == "run_failed" and rejected[0]["outcome"] == "retrying"
        assert _accepted(cell, run_id) == [] and cell.svc.store.stations(int(run_id)) == []
        stored = cell.svc.store.rejections(int(run_id))
        assert stored[0].reason == reason and all(r.detail["node_id"] == node for r in stored)
        _no_active_result_of(cell, run_id)


def test_a_drive_fault_during_a_move_rejects_the_station_and_reopens_the_robot(tmp_path):
    with inprocess_cell(tmp_path, n_stations=4, robot_transport="canopen") as cell:
        injected = threading.Event()

        def inject_on_next_move() -> None:
            # The second station's move: a drive shows FAULT (0x603F 0x8611) for a while.
            deadline = time.monotonic() + 30.0
            while time.monotonic() < deadline:
                if float(np.max(np.abs(cell.robot.robot.sample().qd_rad_s))) > 0.05:  # mid-move
                    cell.robot.robot.inject("drive_fault", duration_s=5.0, node=3)
                    injected.set()
                    return
                time.sleep(0.002)

        cell.on_first(lambda t, b: t == P.TOPIC_STATION and b["accepted"] and b["index"] == 0,
                      lambda: threading.Thread(target=inject_on_next_move, daemon=True).start())
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        body = cell.wait_result(run_id, WAIT_S)
        assert injected.is_set()
        rejected = [b for b in _rejections(cell, run_id) if b["reason"] == "drive_fault"]
        assert rejected, _rejections(cell, run_id)
        assert "node 3" in rejected[0]["message"] and rejected[0]["outcome"] == "retrying"
        # the robot link was reopened as for any device fault (backoff), then the station retaken
        faults = [b for b in cell.bodies(P.TOPIC_FAULT) if b["active"]]
        assert any(f["device"] == P.DEVICE_ROBOT and f["type"] == "DriveFaultDuringMove" for f in faults), faults
        assert [s.plan_index for s in cell.svc.store.stations(int(run_id))] == [0, 1, 2, 3]
        assert any(r.reason == "drive_fault" and r.detail["error_code"] == 0x8611
                   for r in cell.svc.store.rejections(int(run_id)))
        assert body["gates"]["passed"]


def test_a_tracker_repeating_its_position_with_a_fresh_std_is_rejected(tmp_path):
    with inprocess_cell(tmp_path, n_stations=6, overrides=FAIL_FAST) as cell:
        cell.on_first(lambda t, b: t == P.TOPIC_STATION and b["accepted"] and b["index"] == 1,
                      lambda: cell.tracker.inject("frozen_position", 1e6))
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        assert _wait_end(cell, run_id) == RunStatus.FAILED.value
        assert [s.plan_index for s in cell.svc.store.stations(int(run_id))] == [0, 1]
        rejected = _rejections(cell, run_id)
        assert rejected and {b["reason"] for b in rejected} == {"tracker_position_repeated"}, rejected
        # the std changed (so the whole-value frozen check could not see it)
        stored = cell.svc.store.rejections(int(run_id))
        assert all(r.detail["robot_moved_m"] > 1e-3 for r in stored)
        _no_active_result_of(cell, run_id)


def test_a_geocom_hz_angle_beyond_its_circle_is_an_implausible_value(tmp_path):
    scenario = scenario_with(tmp_path / "wild.toml", WILD_ANGLE)
    with inprocess_cell(tmp_path, scenario=scenario, n_stations=6, instrument="geocom", overrides=FAIL_FAST) as cell:
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        assert _wait_end(cell, run_id) == RunStatus.FAILED.value
        rejected = _rejections(cell, run_id)
        assert rejected and {b["reason"] for b in rejected} == {"tracker_value_implausible"}, rejected
        assert cell.svc.store.stations(int(run_id)) == []
        assert all(r.detail["code"] == "IMPLAUSIBLE" for r in cell.svc.store.rejections(int(run_id)))
        _no_active_result_of(cell, run_id)


def test_station_positions_are_never_repeated_by_a_live_tracker(tmp_path):
    """The repeated-position check passes a healthy run (a live instrument's noise)."""
    with inprocess_cell(tmp_path, n_stations=5) as cell:
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        body = cell.wait_result(run_id, WAIT_S)
        assert body["active"]
        assert not any(b["reason"] == "tracker_position_repeated" for b in _rejections(cell, run_id))
        pts = np.array([s.cell_p_target for s in cell.svc.store.stations(int(run_id))])
        assert len({p.tobytes() for p in pts}) == len(pts)
