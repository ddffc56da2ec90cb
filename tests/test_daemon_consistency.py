"""Wrong data never becomes an accepted station: the consistency checks of every station.

Each test runs the in-process cell (``cellcal.testing.harness.inprocess_cell``: the simulated
robot over RTDE on loopback, the simulated tracker on a pty, the real store, service and
ZeroMQ server) and injects one fault into a simulator right after a station was committed
(``InProcessCell.on_first``, inside the service's emit, before the worker moves on), so
every station after it is taken under the fault:

* the controller's TCP changes (the pendant's, 20 mm): on a controller that reports
  ``tcp_offset`` the run fails at once, named; on older software (no ``tcp_offset`` output)
  every station after the change is rejected ``fk_mismatch``;
* the controller's payload changes: the run fails, named;
* the tracker reports x = 999999999 mm (about 1e9 mm, legal on the wire): rejected
  ``tracker_out_of_range``;
* the tracker freezes (the same value bit for bit, freshly stamped): ``tracker_frozen``;
* the tracker reports a pose 1 m from where the run's own estimate predicts it, within
  range and with noise on the other axes: ``gross_disagreement``.

In every case no station taken under the fault is in the store, nothing wrong is
activated, and a clean run of the same cell rejects nothing for these reasons (a good
station is never rejected).
"""

from __future__ import annotations

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.capture import RejectReason
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell, scenario_with

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

WAIT_S = 90.0  # deadlines only
NEW_REASONS = {RejectReason.FK_MISMATCH.value, RejectReason.TRACKER_OUT_OF_RANGE.value,
               RejectReason.TRACKER_FROZEN.value, RejectReason.GROSS_DISAGREEMENT.value}
#: Rejections a loaded machine may add to any run (a station taken while the arm still rang):
#: allowed beside the reason a test is about, never instead of it.
ORDINARY = {RejectReason.NOT_SETTLED.value, RejectReason.TRACKER_STD.value, RejectReason.TRACKER_DISAGREE.value,
            RejectReason.SYNC_WINDOW.value}
# Few attempts, so a run under a lasting fault ends soon; enough that a short one is ridden out.
SHORT = {"capture": {"max_attempts_per_station": 2, "max_consecutive_rejections": 4}}
PATIENT = {"capture": {"max_attempts_per_station": 40, "max_consecutive_rejections": 40}}


def _after_station(run_index: int):
    return lambda t, b: t == P.TOPIC_STATION and b["accepted"] and b["index"] == run_index


def _rejections(cell, run_id) -> list[str]:
    return [r.reason for r in cell.svc.store.rejections(run_id)]


def _run_failed(cell, run_id, words: str) -> None:
    assert cell.svc.wait_idle(WAIT_S)
    run = cell.svc.store.get_run(run_id)
    assert run.status.value == "failed" and words in run.status_reason, run.status_reason
    assert cell.svc.store.active_result() is None
    assert not [b for b in cell.bodies(P.TOPIC_RESULT) if b.get("run_id") == str(run_id)]


def test_a_clean_run_rejects_no_station_as_inconsistent(tmp_path):
    """The checks never reject a good station: a clean run has no rejection of the new
    kinds, every accepted station carries the FK figures it was judged by, and the result
    is activated."""
    with inprocess_cell(tmp_path, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame")
        body = cell.wait_result(run_id, WAIT_S)
        assert body["active"] and body["gates"]["passed"]
        assert not NEW_REASONS & set(_rejections(cell, run_id))
        stations = cell.svc.store.stations(run_id)
        assert len(stations) == 6
        # The robot's pose agreed with its joints to float precision in the simulation, and
        # the later stations were judged against the run's own estimate (within microns).
        assert all(s.settle["fk_error_m"] < 1e-9 for s in stations)
        judged = [s.settle["expected_deviation_m"] for s in stations if "expected_deviation_m" in s.settle]
        assert len(judged) == 3 and max(judged) < 1e-3, judged


def test_tcp_changed_on_the_controller_mid_run_fails_the_run(tmp_path):
    """The pendant's TCP becomes a 20 mm tool after station 1: the controller reports its new
    ``tcp_offset``, the run fails with the change named (the robot, E_DEVICE), and no station
    taken after the change is stored."""
    with inprocess_cell(tmp_path, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
        cell.on_first(_after_station(1), lambda: cell.robot.robot.inject("tcp_change"))
        run_id = cell.svc.start_run("base_frame")
        fault = cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and "tcp_offset changed" in b["message"], WAIT_S,
                              "the TCP fault")
        assert fault["device"] == P.DEVICE_ROBOT and fault["code"] == P.E_DEVICE and fault["state"] == "FAULT"
        assert "p[0, 0, 0.02, 0, 0, 0]" in fault["message"]
        _run_failed(cell, run_id, "tcp_offset changed")
        assert [s.plan_index for s in cell.svc.store.stations(run_id)] == [0, 1]
        assert cell.nonconforming() == []


def test_tcp_changed_on_an_older_controller_is_caught_by_forward_kinematics(tmp_path):
    """The same change on controller software without the ``tcp_offset`` output: only the
    TCP pose shows it, 20 mm from forward kinematics of the joints. Every station after it is
    rejected ``fk_mismatch`` with the figures; none is stored; the run fails."""
    scenario = scenario_with(tmp_path / "scenario.toml", 'rtde_missing_outputs = ["tcp_offset", "payload"]\n')
    with inprocess_cell(tmp_path, scenario=scenario, n_stations=6, overrides=SHORT, time_scale=FAST_TIME_SCALE) as cell:
        cell.on_first(_after_station(1), lambda: cell.robot.robot.inject("tcp_change"))
        run_id = cell.svc.start_run("base_frame")
        cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and "in a row" in b["message"], WAIT_S, "the failed run")
        _run_failed(cell, run_id, "4 stations in a row rejected")
        reasons = _rejections(cell, run_id)
        assert reasons.count("fk_mismatch") >= 2 and set(reasons) <= ORDINARY | {"fk_mismatch"}, reasons
        rejected = [b for b in cell.bodies(P.TOPIC_STATION) if not b["accepted"] and b["reason"] == "fk_mismatch"]
        assert "forward kinematics" in rejected[0]["message"]
        errors = [r.detail["fk_error_m"] for r in cell.svc.store.rejections(run_id) if r.reason == "fk_mismatch"]
        assert all(abs(e - 0.02) < 1e-6 for e in errors), errors
        assert [s.plan_index for s in cell.svc.store.stations(run_id)] == [0, 1]


def test_payload_changed_mid_run_fails_the_run(tmp_path):
    """The controller's payload goes from 0 to 1.5 kg after station 1: the run fails, the
    payload named; no later station is stored."""
    with inprocess_cell(tmp_path, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
        cell.on_first(_after_station(1), lambda: cell.robot.robot.inject("payload_change"))
        run_id = cell.svc.start_run("base_frame")
        fault = cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and "payload changed" in b["message"], WAIT_S,
                              "the payload fault")
        assert fault["device"] == P.DEVICE_ROBOT and "from 0 kg to 1.5 kg" in fault["message"]
        _run_failed(cell, run_id, "payload changed")
        assert [s.plan_index for s in cell.svc.store.stations(run_id)] == [0, 1]


def test_tracker_value_of_1e9_mm_is_rejected_out_of_range(tmp_path):
    """For 20 simulated seconds after station 1 the tracker reports x = 999999999 mm: those
    stations are rejected ``tracker_out_of_range`` (the instrument's documented 80 m); once
    the tracker is sane again the run completes. No stored station is beyond the range."""
    with inprocess_cell(tmp_path, n_stations=6, overrides=PATIENT, time_scale=FAST_TIME_SCALE) as cell:
        cell.on_first(_after_station(1), lambda: cell.tracker.inject("wild_value", 20.0))
        run_id = cell.svc.start_run("base_frame")
        body = cell.wait_result(run_id, WAIT_S)
        assert body["active"] and body["gates"]["passed"]
        reasons = _rejections(cell, run_id)
        assert "tracker_out_of_range" in reasons and set(reasons) <= ORDINARY | {"tracker_out_of_range"}, reasons
        far = [r.detail["distance_m"] for r in cell.svc.store.rejections(run_id) if r.reason == "tracker_out_of_range"]
        assert min(far) > 9.9e5
        stations = cell.svc.store.stations(run_id)
        assert len(stations) == 6 and max(float(np.linalg.norm(s.cell_p_target)) for s in stations) < 10.0


def test_frozen_tracker_is_rejected(tmp_path):
    """For 20 simulated seconds after station 1 the tracker repeats its last value bit for
    bit with fresh timestamps: rejected ``tracker_frozen``; no two stored stations share a
    tracker value; the run completes when the tracker thaws."""
    with inprocess_cell(tmp_path, n_stations=6, overrides=PATIENT, time_scale=FAST_TIME_SCALE) as cell:
        cell.on_first(_after_station(1), lambda: cell.tracker.inject("frozen", 20.0))
        run_id = cell.svc.start_run("base_frame")
        body = cell.wait_result(run_id, WAIT_S)
        assert body["active"] and body["gates"]["passed"]
        reasons = _rejections(cell, run_id)
        assert "tracker_frozen" in reasons and set(reasons) <= ORDINARY | {"tracker_frozen"}, reasons
        values = {s.cell_T_target.tobytes() for s in cell.svc.store.stations(run_id)}
        assert len(values) == 6


def test_frozen_tracker_from_the_start_never_gives_a_station(tmp_path):
    """A tracker frozen before the run: even its first measurement repeats the half before
    it, so not one station is accepted and the run fails."""
    with inprocess_cell(tmp_path, n_stations=6, overrides=SHORT, time_scale=FAST_TIME_SCALE) as cell:
        cell.tracker.inject("frozen")
        run_id = cell.svc.start_run("base_frame")
        cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and "in a row" in b["message"], WAIT_S, "the failed run")
        _run_failed(cell, run_id, "stations in a row rejected")
        reasons = _rejections(cell, run_id)
        assert "tracker_frozen" in reasons and set(reasons) <= ORDINARY | {"tracker_frozen"}, reasons
        assert cell.svc.store.stations(run_id) == []


def test_tracker_pose_far_from_the_runs_estimate_is_a_gross_disagreement(tmp_path):
    """After station 2 (three accepted: the run's own estimate exists) the tracker reports
    x = 1000 mm, in range and with noise on y and z, about a metre from where the estimate
    predicts the target: rejected ``gross_disagreement`` with the deviation and bound; after
    the fault the run completes with a good result."""
    with inprocess_cell(tmp_path, n_stations=6, overrides=PATIENT, time_scale=FAST_TIME_SCALE) as cell:
        cell.on_first(_after_station(2), lambda: cell.tracker.inject("wild_value", 20.0, value_mm=1000.0))
        run_id = cell.svc.start_run("base_frame")
        body = cell.wait_result(run_id, WAIT_S)
        assert body["active"] and body["gates"]["passed"]
        reasons = _rejections(cell, run_id)
        assert "gross_disagreement" in reasons and set(reasons) <= ORDINARY | {"gross_disagreement"}, reasons
        rej = [r for r in cell.svc.store.rejections(run_id) if r.reason == "gross_disagreement"]
        assert all(r.detail["expected_deviation_m"] > 0.5 and r.detail["expected_bound_m"] == 0.025 for r in rej)
        assert min(abs(s.cell_p_target[0] - 1.0) for s in cell.svc.store.stations(run_id)) > 0.5


def test_every_reject_reason_is_documented():
    """Each ``RejectReason`` is a row of the reject-reason table of docs/protocols/zeromq.md."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "protocols" / "zeromq.md").read_text(encoding="utf-8")
    missing = [r.value for r in RejectReason if f"| `{r.value}` |" not in doc]
    assert not missing, f"reject reasons not in docs/protocols/zeromq.md: {missing}"


def test_a_robot_reopened_as_another_during_a_job_is_named():
    """``capture.Session.check_robot``: the job's robot is the one open when it began (or its
    first open); a reopen with another kinematics table or serial number is refused with a
    reason naming both; outside a job, and after a deliberate model change, anything goes."""
    from cellcal.daemon.capture import RobotKey, Session

    factory = RobotKey(serial="2023", source="factory", digest="sha256:aa")
    sheet = RobotKey(serial="2023", source="nominal", digest="sha256:bb")
    s = Session()
    assert s.check_robot(sheet) is None  # no job: the idle loop opens what it finds
    s.new_job(factory)
    assert s.check_robot(factory) is None
    why = s.check_robot(sheet)
    assert why is not None and "nominal sha256:bb" in why and "factory sha256:aa" in why, why
    assert "serial number (2024)" in (s.check_robot(factory._replace(serial="2024")) or "")
    assert s.check_robot(factory._replace(serial=None)) is None  # a serial not read is no evidence
    s.robot_replaced()  # the identified model, on purpose: the next open is the baseline
    assert s.check_robot(sheet) is None and s.check_robot(factory) is not None
    s.end_job()
    assert s.check_robot(factory) is None
    s.new_job()  # nothing open at the start: the first open is the baseline
    assert s.check_robot(sheet) is None and s.check_robot(factory) is not None
