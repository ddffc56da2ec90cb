"""The daemon end to end: real simulated devices, real sockets, real SQLite.

In-process tests run the cell of :func:`cellcal.testing.harness.inprocess_cell`: the sim
world, the sim robot (RTDE on loopback), the sim tracker (a pty) and the daemon's
:class:`~cellcal.daemon.app.App` (store + service + ZeroMQ server), as ``cellcal demo``
does; subprocess tests run ``cellcal sim`` and ``cellcal run`` as child processes and drive
them over ZeroMQ with :class:`~cellcal.daemon.wire.client.Client`. Nothing is mocked. Every
wait has a deadline and every child process is killed in ``finally``.

The cell is ``harness.FAST_SCENARIO`` (the demo's truth at time x10) with the daemon
settings of ``harness.daemon_config``. Accuracy bound, from the noise:
the tracker's raw samples have 10/10/15 um and 0.002 deg (1 sigma) of noise; a station
averages 40 of them (``average_s`` 0.04 at 1 kHz), so 1.6-2.4 um and 0.3 mdeg per station,
and the solver propagates that into a covariance of ``cell_T_base`` (estimated from the
residuals: about 2.5 um and 3 urad per component with 6-8 stations). A result must be
within ``K_SIGMA`` = 6 of those sigmas of the truth in each of the six components of
``log(truth^-1 X)`` (false alarm below 1e-8 per component if the covariance is right),
and, in case the covariance itself were inflated, within 30 um and 3 mdeg outright
(about 12 and 16 sigma).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.service import State
from cellcal.daemon.store import Store
from cellcal.daemon.wire.client import Client
from cellcal.sim.scenario import load_scenario
from cellcal.testing.harness import (
    FAST_SCENARIO,
    FAST_TIME_SCALE,
    K_SIGMA,
    DaemonProcess,
    Recorder,
    SimProcess,
    audit_store,
    daemon_config,
    deviation_sigmas,
    free_port,
    inprocess_cell,
    nonconforming_bodies,
    scenario_with,
    transform_and_cov,
    write_config,
)

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

MAX_ERR_T_M = 30e-6
MAX_ERR_R_RAD = math.radians(0.003)


def assert_bodies_conform(events) -> None:
    """Every body the service emitted conforms to its topic's TypedDict (protocol.check_body)."""
    bad = nonconforming_bodies(events)
    assert not bad, f"{len(bad)} non-conforming bodies, e.g. {bad[:3]}"


def assert_matches(result: dict, truth_X: np.ndarray) -> None:
    """``cell_T_base`` of ``result`` within K_SIGMA of its own covariance and the caps (module doc)."""
    X, C = transform_and_cov(result)
    xi, sig = deviation_sigmas(truth_X, np.zeros((6, 6)), X, C)
    assert sig.max() <= K_SIGMA, f"error {xi} is {sig} sigma of the result's own covariance"
    assert np.linalg.norm(xi[:3]) <= MAX_ERR_T_M and np.linalg.norm(xi[3:]) <= MAX_ERR_R_RAD, xi


def _stations_of(events, run_id: int, accepted: bool | None = None) -> list[dict]:
    return [b for _t, top, b in events if top == P.TOPIC_STATION and b["run_id"] == str(run_id)
            and (accepted is None or b["accepted"] is accepted)]


# ---- 1. full stack in-process ------------------------------------------------------------------


def test_full_stack_in_process_calibrates_the_cell(tmp_path):
    """A base-frame run completes; every accepted station is stored exactly once; the result is
    active, passes its gates and matches the scenario's truth within the noise (module doc);
    a drift check follows; every body on every topic conforms to the protocol."""
    with inprocess_cell(tmp_path, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame", reason="test")
        body = cell.wait_result(run_id)
        accepted = _stations_of(cell.events, run_id, accepted=True)
        stored = cell.svc.store.stations(run_id)
        assert sorted(b["index"] for b in accepted) == [s.plan_index for s in stored] == list(range(6))
        assert audit_store(Path(cell.cfg.service.state_dir))["duplicates"] == []
        active = cell.svc.store.active_result()
        assert active is not None and str(active.id) == body["result_id"] and body["active"] is True
        assert body["gates"]["passed"] is True and body["n_stations"] == 6
        assert_matches(body, cell.world.cell_T_base())
        assert cell.svc.store.get_run(run_id).status.value == "done"
        # The drift topic too: one check against the new calibration (no drift in the cell).
        cell.svc.request_drift_check("test")
        drift = cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT, 30.0, "drift check")
        assert drift["status"] == "ok" and drift["result_id"] == body["result_id"]
        assert cell.svc.wait_idle(10.0)
        topics = {top for _t, top, _b in cell.events}
        assert {P.TOPIC_HEARTBEAT, P.TOPIC_STATE, P.TOPIC_STATION, P.TOPIC_RESULT, P.TOPIC_DRIFT} <= topics
        assert_bodies_conform(cell.events)


def test_full_stack_in_process_over_canopen(tmp_path):
    """The same cell with the robot as six CiA 402 drives on python-can's virtual bus (the
    daemon's canopen:// driver: SYNC-coherent joint vectors, target-reached bit)."""
    with inprocess_cell(tmp_path, n_stations=6, robot_transport="canopen", time_scale=FAST_TIME_SCALE) as cell:
        assert cell.cfg.robot.url.startswith("canopen://")
        run_id = cell.svc.start_run("base_frame")
        body = cell.wait_result(run_id, timeout_s=60.0)
        assert [s.plan_index for s in cell.svc.store.stations(run_id)] == list(range(6))
        assert body["gates"]["passed"] and body["active"]
        assert_matches(body, cell.world.cell_T_base())
        assert_bodies_conform(cell.events)


# ---- 2. full stack as subprocesses ------------------------------------------------------------


def test_full_stack_as_subprocesses(tmp_path):
    """``cellcal sim`` + ``cellcal run`` as child processes; the run is started and its result
    awaited over ZeroMQ (Clone-pattern subscription), and matches the scenario's truth."""
    sim = SimProcess(FAST_SCENARIO, tmp_path / "sim.log")
    daemon = None
    try:
        urls = sim.start()
        assert urls["tracker"].startswith("/dev/") and urls["robot"].startswith("rtde://")
        cfg = daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=tmp_path, n_stations=6)
        z = cfg["zmq"]
        daemon = DaemonProcess(write_config(tmp_path / "cellcal.toml", cfg), tmp_path / "daemon.log").start()
        daemon.serving(z["cmd_endpoint"])
        with Client(z["cmd_endpoint"], z["pub_endpoint"], timeout_s=3.0, retries=5) as client:
            sub = client.subscribe(silence_timeout_s=5.0)
            started = client.call("start_run", kind="base_frame")
            run_id = started["run_id"]
            assert started["planned"] == 6
            deadline = time.monotonic() + 60.0
            result = None
            while result is None:
                assert time.monotonic() < deadline, f"no result over ZeroMQ:\n{daemon.log_tail()}"
                assert daemon.alive(), daemon.log_tail()
                msg = sub.recv(timeout_s=0.5)
                if msg is not None:
                    topic, env = msg
                    assert P.check_envelope(env) is None
                    if topic == P.TOPIC_RESULT and env["body"].get("run_id") == run_id:
                        result = env["body"]
            assert P.check_body(P.TOPIC_RESULT, result) == []
            assert result["gates"]["passed"] and result["active"]
            assert client.call("get_result")["result_id"] == result["result_id"]
            status = client.call("get_status")
            assert status["active_result_id"] == result["result_id"] and status["state"] == "IDLE"
        assert_matches(result, load_scenario(FAST_SCENARIO).truth.cell_T_base)
        assert daemon.terminate() == 0
        audit = audit_store(Path(cfg["service"]["state_dir"]))
        assert audit["integrity"] == ["ok"] and len(audit["stations"]) == 6 and not audit["duplicates"]
    finally:
        if daemon is not None:
            daemon.stop()
        sim.stop()


# ---- 5. a robot that never settles ----------------------------------------------------------


def test_robot_that_never_settles_is_rejected_and_the_run_aborts(tmp_path):
    """Every station is rejected ``not_settled`` (recorded and published with the reason) and
    the run fails after ``capture.max_consecutive_rejections``; the service is in FAULT."""
    scenario = scenario_with(tmp_path / "scenario.toml", '[[robot.faults]]\nkind = "never_settles"\nstart_s = 0.0\n')
    limit = 3
    # The timeout bounds the move too: 2.5 s lets a loaded machine finish the move, so the
    # rejection is the settle wait's.
    overrides = {"capture": {"station_timeout_s": 2.5, "max_attempts_per_station": 2, "max_consecutive_rejections": limit}}
    with inprocess_cell(tmp_path, scenario=scenario, overrides=overrides, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame")
        cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and "in a row" in b["message"], 30.0, "the abort")
        assert cell.svc.wait_idle(10.0)
        rejected = _stations_of(cell.events, run_id, accepted=False)
        assert [b["reason"] for b in rejected] == ["not_settled"] * limit
        assert [(b["index"], b["attempt"]) for b in rejected] == [(0, 1), (0, 2), (1, 1)]
        assert _stations_of(cell.events, run_id, accepted=True) == []
        run = cell.svc.store.get_run(run_id)
        assert run.status.value == "failed" and f"{limit} stations in a row rejected (last: not_settled)" in run.status_reason
        assert [r.reason for r in cell.svc.store.rejections(run_id)] == ["not_settled"] * limit
        assert cell.svc.state == State.FAULT and cell.svc.store.active_result() is None
        assert cell.bodies(P.TOPIC_RESULT) == []
        assert_bodies_conform(cell.events)


# ---- 6. a beam break mid-run --------------------------------------------------------------------


def test_beam_break_mid_run_rejects_then_retries_the_station(tmp_path):
    """A beam break of 1 s (wall) timed inside the run: the station being measured is rejected
    ``beam_broken``, retried at the same plan index until the beam is back, then accepted;
    the run completes with a good result. (At x10 the run spans roughly simulated 15-50 s;
    the break covers 25-35 s, longer than a station cycle, so some measurement falls in it.)"""
    scenario = scenario_with(tmp_path / "scenario.toml",
                             '[[tracker.faults]]\nkind = "beam_break"\nstart_s = 25.0\nduration_s = 10.0\n')
    overrides = {"capture": {"max_attempts_per_station": 30, "max_consecutive_rejections": 40}}
    with inprocess_cell(tmp_path, scenario=scenario, n_stations=8, overrides=overrides, time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run("base_frame")
        body = cell.wait_result(run_id, timeout_s=60.0)
        rejected = _stations_of(cell.events, run_id, accepted=False)
        broken = [b for b in rejected if b["reason"] == "beam_broken"]
        assert broken, f"no beam_broken rejection: {rejected}"
        idx = broken[0]["index"]
        later = [b for b in _stations_of(cell.events, run_id) if b["index"] == idx]
        assert later[-1]["accepted"] and later[-1]["attempt"] == len(later) >= 2, later
        assert {r.reason for r in cell.svc.store.rejections(run_id)} >= {"beam_broken"}
        assert [s.plan_index for s in cell.svc.store.stations(run_id)] == list(range(8))
        assert body["gates"]["passed"] and body["n_stations"] == 8
        assert_matches(body, cell.world.cell_T_base())
        assert_bodies_conform(cell.events)


# ---- 7. devices offline at start --------------------------------------------------------------


def test_devices_offline_at_start_fault_with_backoff_then_recover(tmp_path):
    """``cellcal run`` starts with no robot and no tracker listening: it stays up, a run
    waits in FAULT with growing retry delays (0.2, 0.4, 0.8, 1.0 s), and once ``cellcal sim``
    appears on the configured ports the run completes."""
    ports = {"robot": free_port(), "urscript": free_port(), "tracker": free_port(), "dashboard": free_port(),
             "primary": free_port()}
    robot_url = (f"rtde://127.0.0.1:{ports['robot']}?urscript_port={ports['urscript']}&model=ur5e"
                 f"&dashboard_port={ports['dashboard']}&primary_port={ports['primary']}")
    tracker_url = f"socket://127.0.0.1:{ports['tracker']}"
    cfg = daemon_config(robot_url=robot_url, tracker_url=tracker_url, workdir=tmp_path, n_stations=6)
    daemon = DaemonProcess(write_config(tmp_path / "cellcal.toml", cfg), tmp_path / "daemon.log").start()
    sim = SimProcess(FAST_SCENARIO, tmp_path / "sim.log", "--tracker-transport", "tcp",
                     "--tracker-port", str(ports["tracker"]), "--robot-port", str(ports["robot"]),
                     "--urscript-port", str(ports["urscript"]), "--dashboard-port", str(ports["dashboard"]),
                     "--primary-port", str(ports["primary"]))
    rec = Recorder(cfg["zmq"]["pub_endpoint"])
    try:
        z = cfg["zmq"]
        with Client(z["cmd_endpoint"], timeout_s=3.0, retries=5) as client:
            run_id = client.call("start_run", kind="base_frame")["run_id"]
            faults = []
            deadline = time.monotonic() + 20.0
            while len(faults) < 4:
                assert time.monotonic() < deadline, f"faults so far {faults}:\n{daemon.log_tail()}"
                for topic, env in rec.pump(0.1):
                    if topic == P.TOPIC_FAULT:
                        assert P.check_body(topic, env["body"]) == []
                        faults.append(env["body"])
            assert all(f["state"] == "FAULT" and f["active"] and "cannot open devices" in f["message"] for f in faults)
            delays = [f["retry_in_s"] for f in faults]
            assert delays == sorted(delays) and delays[-1] > delays[0] and max(delays) <= 1.0 + 1e-9, delays
            status = client.call("get_status")
            assert status["state"] == "FAULT" and not status["devices"]["robot"]["connected"]
            assert daemon.alive()
            mark = rec.mark()
            sim.start()  # the devices appear
            # The fault topic says the fault cleared (docs/protocols/zeromq.md: "when a fault
            # is raised or cleared"), so a late joiner's snapshot does not show a stale one.
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_FAULT and b["active"] is False, 30.0,
                                   alive=daemon.alive, what="the cleared fault", since=mark)
            assert P.check_body(P.TOPIC_FAULT, env["body"]) == [] and env["body"]["state"] != "FAULT"
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b.get("run_id") == run_id, 60.0,
                                   alive=daemon.alive, what="the result after the devices appeared", since=mark)
            assert env["body"]["gates"]["passed"]
            # The result goes out just before the run's job ends: IDLE follows at once.
            deadline = time.monotonic() + 10.0
            while (status := client.call("get_status"))["state"] != "IDLE" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert status["state"] == "IDLE"
            assert status["devices"]["robot"]["connected"] and status["devices"]["tracker"]["connected"]
        assert daemon.terminate() == 0
    finally:
        rec.close()
        daemon.stop()
        sim.stop()


# ---- 8. SIGTERM during capture ------------------------------------------------------------------


def test_sigterm_during_capture_exits_0_and_the_run_resumes(tmp_path):
    """SIGTERM while capturing: the daemon finishes the current transaction and exits 0; the
    store holds whole stations only (every one it published, none twice, integrity ok) and
    the run is still open; the next start resumes it and completes it with each plan index
    once."""
    sim = SimProcess(FAST_SCENARIO, tmp_path / "sim.log")
    daemon = rec = None
    try:
        urls = sim.start()
        cfg = daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=tmp_path, n_stations=6)
        conf = write_config(tmp_path / "cellcal.toml", cfg)
        state_dir = Path(cfg["service"]["state_dir"])
        rec = Recorder(cfg["zmq"]["pub_endpoint"])
        daemon = DaemonProcess(conf, tmp_path / "daemon.log").start().serving(cfg["zmq"]["cmd_endpoint"])
        with Client(cfg["zmq"]["cmd_endpoint"], timeout_s=3.0, retries=5) as client:
            run_id = int(client.call("start_run", kind="base_frame")["run_id"])
        published = []
        deadline = time.monotonic() + 30.0
        while len(published) < 2:
            assert time.monotonic() < deadline and daemon.alive(), daemon.log_tail()
            for topic, env in rec.pump(0.05):
                if topic == P.TOPIC_STATION and env["body"]["accepted"]:
                    published.append(env["body"]["index"])
        rc = daemon.terminate(timeout_s=60.0)  # the bound: it exits, not how fast on a loaded machine
        assert rc == 0, daemon.log_tail()
        log_text = (tmp_path / "daemon.log").read_text()
        assert "Traceback" not in log_text, log_text[-3000:]
        audit = audit_store(state_dir)
        assert audit["integrity"] == ["ok"] and not audit["duplicates"]
        stored = [i for (r, i) in audit["stations"] if r == run_id]
        assert set(published) <= set(stored) and stored == list(range(len(stored))) and len(stored) < 6
        assert audit["runs"][run_id]["status"] == "capturing"
        with Store(state_dir, read_only=True) as ro:  # whole stations: every field reads back
            for st in ro.stations(run_id):
                assert st.sample_count > 0 and st.cell_T_target is not None and np.all(np.isfinite(st.base_T_flange))
        daemon = DaemonProcess(conf, tmp_path / "daemon.log").start()
        _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b.get("run_id") == str(run_id), 60.0,
                               alive=daemon.alive, what="the resumed run's result")
        assert env["body"]["n_stations"] == 6 and env["body"]["gates"]["passed"]
        assert daemon.terminate() == 0
        audit = audit_store(state_dir)
        assert [i for (r, i) in audit["stations"] if r == run_id] == list(range(6))
        assert audit["runs"][run_id]["status"] == "done"
    finally:
        if rec is not None:
            rec.close()
        if daemon is not None:
            daemon.stop()
        sim.stop()
