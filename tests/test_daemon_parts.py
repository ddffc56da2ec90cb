"""The service's parts on their own: acceptance gates, drift statistics, check ids, devices.

The gates and the drift judge are pure functions of a result (or deviations) and the
configuration; the check ids read a real store; the device test opens a real simulated
robot over RTDE on loopback and a tracker URL nobody listens on.
"""

from __future__ import annotations

import logging
import math
import types

import numpy as np
import pytest
from storetest_support import make_station

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Drift, Solve, load_config_text
from cellcal.daemon.devices import Backoff, CellDevices, DeviceOpenError
from cellcal.daemon.drift import CheckIds, Cusum, choose_check_stations, deviation, judge
from cellcal.daemon.gates import GATES, check_gates, gates_failed, gates_passed
from cellcal.daemon.store import Store
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.testing.harness import FAST_SCENARIO, daemon_config, free_port, to_toml


def _result(rms_t_m: float, rms_r_rad: float):
    return types.SimpleNamespace(rms_translation_m=rms_t_m, rms_rotation_rad=rms_r_rad)


def test_gates_name_each_check_and_keep_the_failure_sentences():
    solve = Solve(max_rms_translation_m=0.5e-3, max_rms_rotation_rad=math.radians(0.1))
    rms = GATES[:2]  # the RMS gates read the closure alone (the others: tests/test_daemon_gates.py)
    ok = check_gates(_result(0.1e-3, math.radians(0.01)), solve, rms)
    assert ok.passed and ok.failed == [] and ok.reason() == ""
    assert [c.name for c in ok.checks] == ["rms_translation", "rms_rotation"]
    bad = check_gates(_result(0.612e-3, math.radians(0.2)), solve, rms)
    assert not bad.passed and [c.name for c in bad.failed] == ["rms_translation", "rms_rotation"]
    assert bad.reason() == ("rms_translation: rms translation 0.612 mm > 0.500 mm; "
                            "rms_rotation: rms rotation 0.2000 deg > 0.1000 deg")
    wire = bad.to_wire()
    assert wire["passed"] is False and wire["failed"] == [c.message for c in bad.failed]
    assert wire["checks"][0] == {"name": "rms_translation", "value": 0.612e-3, "limit": 0.5e-3, "unit": "m",
                                 "passed": False, "message": "rms translation 0.612 mm > 0.500 mm"}
    assert not gates_passed({"gates": wire}) and gates_failed({"gates": wire}) == bad.reason().split("; ")
    assert gates_failed({"gates": {"passed": False, "failed": ["rms too high"]}}) == ["rms too high"]  # older store
    assert gates_passed({}) and gates_failed({}) == []  # a result stored without gates (imported)
    # One more gate is one more function.
    extra = check_gates(_result(0.1e-3, 0.0), solve, (*GATES[:2], lambda r, s, ctx: None))
    assert len(extra.checks) == 2


def test_drift_judge_thresholds_and_cusum():
    cfg = Drift(warn_translation_m=0.1e-3, fail_translation_m=0.3e-3, warn_rotation_rad=1e-3, fail_rotation_rad=2e-3,
                cusum_k_m=0.05e-3, cusum_h_m=0.3e-3, on_drift="mark")
    c = Cusum()
    v = judge([0.02e-3, 0.04e-3], [1e-4, 2e-4], c, cfg)
    assert (v.status, v.action, v.cusum_m, v.alarm) == (P.DRIFT_OK, P.ACTION_NONE, 0.0, False)
    assert v.deviation_translation_m == 0.04e-3 and v.deviation_rotation_rad == 2e-4
    assert judge([0.15e-3], [0.0], c, cfg).status == P.DRIFT_WARN
    assert c.value_m == pytest.approx(0.1e-3)
    # Small persistent deviations accumulate until the CUSUM alarm fails the check.
    statuses = [judge([0.12e-3], [0.0], c, cfg).status for _ in range(4)]
    assert statuses[-1] == P.DRIFT_FAIL and c.value_m > cfg.cusum_h_m
    v = judge([0.5e-3], [0.0], Cusum(), Drift(on_drift="recalibrate"))
    assert v.failed and v.action == P.ACTION_RECALIBRATING
    assert judge([0.0], [3e-3], Cusum(), cfg).action == P.ACTION_MARKED_SUSPECT
    with pytest.raises(ValueError):
        judge([], [], Cusum(), cfg)


def test_check_stations_spread_over_the_workspace_and_deviation_against_the_model():
    stations = [make_station(i) for i in range(8)]
    chosen = choose_check_stations(stations, {"stations": []}, 3)
    assert len(chosen) == 3 and len({c["plan_index"] for c in chosen}) == 3
    P_m = np.array([s.base_T_flange[:3, 3] for s in stations])
    first = int(np.argmax(np.linalg.norm(P_m - P_m.mean(axis=0), axis=1)))
    assert chosen[0]["plan_index"] == first
    assert chosen[0]["q_rad"] == [float(v) for v in stations[first].q_rad]  # no plan: the measured joints
    assert choose_check_stations([], {}, 3) == [] and len(choose_check_stations(stations, {}, 20)) == 8
    X = make_transform(so3_exp(np.array([0.0, 0.0, 0.5])), np.array([2.0, -1.0, 0.1]))
    Y = make_transform(np.eye(3), np.array([0.0, 0.03, 0.05]))
    s = stations[0]
    M = X @ s.base_T_flange @ Y
    exact = types.SimpleNamespace(base_T_flange=s.base_T_flange, cell_T_target=M, cell_p_target=M[:3, 3])
    assert deviation(X, Y, exact) == pytest.approx((0.0, 0.0), abs=1e-9)
    moved = types.SimpleNamespace(base_T_flange=s.base_T_flange, cell_T_target=None,
                                  cell_p_target=M[:3, 3] + [0.0, 2e-4, 0.0])
    t, r = deviation(X, Y, moved)
    assert t == pytest.approx(2e-4) and r is None  # a point measurement has no rotation to compare (zeromq.md)


def test_check_ids_are_allocated_per_result_and_continue_after_a_restart(tmp_path):
    with Store(tmp_path) as store:
        run = store.create_run("base_frame", {"stations": []}, config_sha256="0", devices={})
        r1 = store.add_result(run, "base_frame", {"solver": "t"}, {})
        r2 = store.add_result(run, "base_frame", {"solver": "t"}, {})
        ids = CheckIds(store)
        assert [ids.allocate(r1), ids.allocate(r1), ids.allocate(r2)] == [1, 2, 1]
        store.add_drift_check(r1, {"check_id": 1})
        store.add_drift_check(r1, {"check_id": 2})
        store.add_drift_check(r1, {"old record": "no id"})  # counts by position
        assert store.last_drift_check_id(r1) == 3
        again = CheckIds(store)  # a restarted daemon
        assert again.allocate(r1) == 4 and again.allocate(r2) == 1


def test_backoff_doubles_up_to_its_ceiling():
    b = Backoff(0.2, 1.0)
    assert [b.next_delay() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next_delay() == 0.2


def test_a_device_that_fails_to_open_is_named_by_which_one_raised(tmp_path, caplog):
    """Opening goes robot first, then tracker, each wrapped in DeviceOpenError(device=...)."""
    from cellcal.sim.robot_sim import start_sim_robot
    from cellcal.sim.scenario import load_scenario
    from cellcal.testing.simulators import simulated_devices

    nobody = f"socket://127.0.0.1:{free_port()}"
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e", tracker_url=nobody, workdir=tmp_path)
    devs = CellDevices(load_config_text(to_toml(cfgd)))
    with pytest.raises(DeviceOpenError) as ei:
        devs.open(need_tracker=True)
    assert ei.value.device == P.DEVICE_ROBOT and ei.value.__cause__ is ei.value.cause
    assert devs.robot is None and devs.status[P.DEVICE_ROBOT]["connected"] is False
    sc = load_scenario(FAST_SCENARIO)
    with start_sim_robot(sc.make_world(), sc.robot, transport="rtde") as sim:
        cfgd = daemon_config(robot_url=sim.url, tracker_url=nobody, workdir=tmp_path)
        devs = CellDevices(load_config_text(to_toml(cfgd)))
        try:
            with pytest.raises(DeviceOpenError) as ei:
                devs.open(need_tracker=True)
            assert ei.value.device == P.DEVICE_TRACKER
            assert devs.status[P.DEVICE_ROBOT]["connected"] and not devs.status[P.DEVICE_TRACKER]["connected"]
            devs.open(need_tracker=False)  # the robot alone is enough for a tool-point run
            assert devs.engine is not None and devs.stop_robot()
            # a job that wants the tracker without needing it (an eye-to-hand run's tracker
            # check): a tracker that cannot be opened is logged, not raised, and the job goes on
            with caplog.at_level(logging.WARNING, logger="cellcal"):
                devs.open(need_tracker=False, want_tracker=True)
            assert devs.tracker is None and devs.engine is not None and devs.engine.tracker is None
            assert any("tracker could not be opened for this job" in r.getMessage() for r in caplog.records)
        finally:
            devs.close()
        assert devs.robot is None and not devs.status[P.DEVICE_ROBOT]["connected"] and not devs.stop_robot()
        # ... and one that can be opened is, and the engine measures with it
        with simulated_devices(sc) as sims:
            cfgd = daemon_config(robot_url=sims.robot.url, tracker_url=sims.tracker.url, workdir=tmp_path)
            devs = CellDevices(load_config_text(to_toml(cfgd)))
            try:
                devs.open(need_tracker=False, want_tracker=True)
                assert devs.tracker is not None and devs.engine is not None and devs.engine.tracker is devs.tracker
            finally:
                devs.close()


def test_a_result_that_fails_its_gates_is_stored_not_activated_and_its_gates_named(tmp_path):
    """Client-supplied stations with 0.1 mm of noise against a 0.001 mm gate: the result is
    stored with every gate's outcome, not activated, not published on the result topic; the
    run fails with the failed gates by name, told on the state topic (state == previous)."""
    from cellcal.daemon.service import Service
    from cellcal.daemon.store import RunStatus
    from cellcal.testing.harness import nonconforming_bodies

    rng = np.random.default_rng(3)
    X = make_transform(so3_exp(np.array([0.0, 0.0, 0.8])), np.array([2.5, -0.8, 0.1]))
    Y = make_transform(np.eye(3), np.array([0.0, 0.03, 0.05]))
    given = []
    for _ in range(8):
        G = make_transform(so3_exp(rng.normal(scale=0.5, size=3)), rng.uniform(-0.5, 0.5, 3))
        M = X @ G @ Y
        M[:3, 3] += rng.normal(scale=1e-4, size=3)
        given.append({"base_T_flange": G.reshape(16).tolist(), "cell_T_target": M.reshape(16).tolist()})
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                         tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path,
                         overrides={"solve": {"max_rms_mm": 0.001}})
    svc = Service(load_config_text(to_toml(cfgd)))
    events: list = []
    svc.add_listener(lambda topic, body: events.append((0.0, topic, body)))
    try:
        svc.start()
        run_id = svc.start_run(P.KIND_BASE_FRAME, stations=given)
        assert svc.wait_idle(30.0)
        run = svc.store.get_run(run_id)
        assert run.status == RunStatus.FAILED and run.status_reason.startswith("rms_translation: rms translation")
        (rec,) = svc.store.list_results()
        assert not rec.active and svc.store.active_result() is None
        assert [c["name"] for c in rec.result["gates"]["checks"] if not c["passed"]] == ["rms_translation"]
        assert not svc.result_summary(rec)["accepted"]
        told = [b for _t, topic, b in events if topic == P.TOPIC_STATE and "acceptance gates" in b["reason"]]
        assert len(told) == 1 and told[0]["state"] == told[0]["previous"] and told[0]["run_id"] == str(run_id)
        assert "rms_translation:" in told[0]["reason"] and "not activated" in told[0]["reason"]
        assert not [b for _t, topic, b in events if topic == P.TOPIC_RESULT]
        assert nonconforming_bodies(events) == []
    finally:
        svc.shutdown(timeout_s=10.0)


def test_a_run_queued_but_not_begun_is_in_progress_and_an_abort_closes_it(tmp_path):
    # start_run returns the run's id before the worker takes it: in that gap a second start_run
    # must be refused (two runs would both move the robot) and an abort must close the queued
    # run (it used to answer "nothing to abort", and the run then started).
    from cellcal.daemon.service import Service, ServiceError
    from cellcal.daemon.store import RunStatus

    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                         tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path)
    svc = Service(load_config_text(to_toml(cfgd)))
    svc.store.open()  # no worker: every run stays queued
    try:
        run_id = svc.start_run(P.KIND_BASE_FRAME)
        assert svc.current_run_id() == run_id
        with pytest.raises(ServiceError) as busy:
            svc.start_run(P.KIND_BASE_FRAME)
        assert busy.value.code == P.E_BUSY and f"run {run_id}" in str(busy.value)
        assert svc.abort() is True
        run = svc.store.get_run(run_id)
        assert run.status == RunStatus.ABORTED and not run.is_open
        assert svc.current_run_id() is None and svc.abort() is False
        assert svc.start_run(P.KIND_BASE_FRAME) == run_id + 1  # nothing in progress any more
    finally:
        svc.store.close()
