"""No zombie runs (ADR 0012): an interrupted run resumes at once or is closed, never later.

The sequence that once ended with a stale calibration active: a full disk during run 1 left
it open, the daemon stayed in FAULT, run 2 was calibrated and activated, and at the next
restart run 1 resumed by itself, moved the robot and replaced run 2's result. Here, on a
real small tmpfs filled to the last byte (or, without mount rights, SQLite's
``max_page_count`` on the store's connection):

* the daemon retries the store with backoff and leaves FAULT by itself once space is freed;
* a run interrupted for longer than ``[service] resume_within_s`` is closed as failed, one
  interrupted briefly resumes at once (logged and published: the daemon moves the robot);
* after a restart, a run older than the newest one is closed, never resumed (processes:
  ``cellcal sim`` + ``cellcal run``), as is one started in another motion mode or
  interrupted too long ago, while the newest, briefly interrupted run resumes, saying so;
* a result never replaces one that became active after its run started.

In-process cells are ``cellcal.testing.harness.inprocess_cell``; every wait has a deadline.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from storetest_support import fill_filesystem, make_station, small_tmpfs

from cellcal.daemon import protocol as P
from cellcal.daemon.config import load_config_text
from cellcal.daemon.runs.plan import PlannedStation, plan_to_dict
from cellcal.daemon.service import Service, ServiceError, State
from cellcal.daemon.store import Store
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.testing.harness import (
    FAST_SCENARIO,
    DaemonProcess,
    Recorder,
    SimProcess,
    audit_store,
    daemon_config,
    free_port,
    inprocess_cell,
    to_toml,
    write_config,
)

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

WAIT_S = 90.0


class Disk:
    """The state directory's file system, filled and freed under the running daemon."""

    def __init__(self, cell, mnt: Path | None) -> None:
        self.cell, self.mnt = cell, mnt

    def fill(self) -> None:
        if self.mnt is not None:
            fill_filesystem(self.mnt)
            return
        store = self.cell.svc.store
        with store._lock:
            (pages,) = store._conn.execute("PRAGMA page_count").fetchone()
            store._conn.execute(f"PRAGMA max_page_count = {pages}")

    def free(self) -> None:
        if self.mnt is not None:
            (self.mnt / "filler.bin").unlink()
            return
        store = self.cell.svc.store
        with store._lock:
            store._conn.execute("PRAGMA max_page_count = 4294967294")


def _after_station(index: int):
    return lambda t, b: t == P.TOPIC_STATION and b["accepted"] and b["index"] == index


def _store_faults(cell) -> list[dict]:
    return [b for b in cell.bodies(P.TOPIC_FAULT) if b["active"] and b["code"] == P.E_STATE and "full" in b["message"]]


def test_disk_full_run_1_then_run_2_and_a_restart_never_bring_run_1_back(tmp_path):
    """The issue's sequence. Disk full during run 1 -> FAULT, retried with growing delays
    (0.2, 0.4, 0.8, 1.0 s) while new runs are refused -> space freed -> the daemon leaves
    FAULT by itself; run 1, interrupted longer than resume_within_s (2 s here), is closed as
    failed -> run 2 is calibrated and activated -> restart -> nothing resumes, the robot does
    not move, run 2's result stays active."""
    with small_tmpfs(tmp_path, 16 * 1024) as mnt:
        base = mnt if mnt is not None else tmp_path / "fs"
        base.mkdir(exist_ok=True)
        state = base / "state"
        with inprocess_cell(tmp_path, state_dir=state, n_stations=6,
                            overrides={"service": {"resume_within_s": 2.0}}) as cell:
            disk = Disk(cell, mnt)
            filled = cell.on_first(_after_station(1), disk.fill)
            run1 = cell.svc.start_run("base_frame")
            cell.wait_for(lambda t, b: len(_store_faults(cell)) >= 5, WAIT_S, "five tries of the full store")
            assert filled.is_set()
            faults = _store_faults(cell)
            assert all(str(state) in f["message"] and f["state"] == "FAULT" for f in faults)
            assert [f["retry_in_s"] for f in faults[:5]] == [0.2, 0.4, 0.8, 1.0, 1.0]
            assert cell.svc.state == State.FAULT and cell.svc.wait_idle(10.0)
            assert cell.svc.store.get_run(run1).is_open
            assert [s.plan_index for s in cell.svc.store.stations(run1)] == [0, 1]
            with pytest.raises(ServiceError) as ei:
                cell.svc.start_run("base_frame")
            assert ei.value.code == P.E_STATE and "store" in str(ei.value)
            mark = cell.mark()
            disk.free()
            cleared = cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and not b["active"], WAIT_S, "the cleared fault")
            assert cleared["state"] != "FAULT"
            cell.wait_for(lambda t, b: t == P.TOPIC_STATE and b["state"] == "IDLE" and "writes again" in b["reason"],
                          WAIT_S, "IDLE after the store recovered")
            run = cell.svc.store.get_run(run1)
            assert run.status.value == "failed" and "resume_within_s = 2 s" in run.status_reason, run.status_reason
            assert not [b for b in cell.states(mark) if b["state"] == "CAPTURING"]
            closed = [b for b in cell.states(mark) if b["run_id"] == str(run1) and "not resumed" in b["reason"]]
            assert closed, cell.states(mark)
            run2 = cell.svc.start_run("base_frame")
            body = cell.wait_result(run2, WAIT_S)
            assert body["active"] and body["gates"]["passed"]
            active_id = cell.svc.store.active_result().id
            assert not [b for b in cell.bodies(P.TOPIC_RESULT) if b.get("run_id") == str(run1)]
            assert cell.nonconforming() == []
        with inprocess_cell(tmp_path / "again", state_dir=state, n_stations=6) as cell:
            assert cell.svc.wait_idle(10.0)
            assert cell.svc.store.unfinished_runs() == []
            assert not [b for b in cell.states() if b["state"] == "CAPTURING"]
            assert cell.robot.robot.moves == 0
            assert cell.svc.store.active_result().id == active_id
            assert cell.svc.store.get_run(run1).status.value == "failed"
        audit = audit_store(state)
        assert audit["integrity"] == ["ok"] and not audit["duplicates"]
        assert [r["run_id"] for r in audit["results"]] == [run2]


def test_a_brief_disk_full_resumes_the_run_at_once(tmp_path):
    """Space is freed right after the fault: the daemon leaves FAULT by itself and resumes
    the run straight from FAULT to CAPTURING, saying so (and that it moves the robot); the
    run completes with each station once and its result is activated."""
    with small_tmpfs(tmp_path, 16 * 1024) as mnt:
        base = mnt if mnt is not None else tmp_path / "fs"
        base.mkdir(exist_ok=True)
        with inprocess_cell(tmp_path, state_dir=base / "state", n_stations=6) as cell:
            disk = Disk(cell, mnt)
            cell.on_first(_after_station(1), disk.fill)
            run1 = cell.svc.start_run("base_frame")
            cell.wait_for(lambda t, b: bool(_store_faults(cell)), WAIT_S, "the disk-full fault")
            mark = cell.mark()
            disk.free()
            resumed = cell.wait_for(lambda t, b: t == P.TOPIC_STATE and "resumed after the store fault cleared"
                                    in b["reason"], WAIT_S, "the resumption")
            assert resumed["state"] == "CAPTURING" and resumed["previous"] == "FAULT" and resumed["run_id"] == str(run1)
            assert "the daemon moves the robot (command mode)" in resumed["reason"]
            body = cell.wait_result(run1, WAIT_S)
            assert body["active"] and body["gates"]["passed"] and body["n_stations"] == 6
            assert [s.plan_index for s in cell.svc.store.stations(run1)] == list(range(6))
            assert "IDLE" not in [b["state"] for b in cell.states(mark)][:-1]
            assert cell.nonconforming() == []


def test_restart_resumes_the_newest_run_and_says_it_moves_the_robot(tmp_path):
    """The daemon stops during capture (its run left open); at the next start the run, the
    newest and interrupted seconds ago, resumes: the state message says so and that the
    daemon moves the robot, and the run completes."""
    state = tmp_path / "state"
    with inprocess_cell(tmp_path, state_dir=state, n_stations=6) as cell:
        run1 = cell.svc.start_run("base_frame")
        cell.wait_for(_after_station(1), WAIT_S, "station 1")
    with Store(state, read_only=True) as ro:
        assert ro.get_run(run1).is_open and 2 <= ro.get_run(run1).n_stations < 6
    with inprocess_cell(tmp_path / "again", state_dir=state, n_stations=6) as cell:
        resumed = cell.wait_for(lambda t, b: t == P.TOPIC_STATE and b["state"] == "CAPTURING", WAIT_S, "the resumption")
        assert resumed["run_id"] == str(run1)
        assert resumed["reason"] == f"run {run1} resumed after a restart: the daemon moves the robot (command mode)"
        body = cell.wait_result(run1, WAIT_S)
        assert body["active"] and [s.plan_index for s in cell.svc.store.stations(run1)] == list(range(6))


def _plan(n: int) -> dict:
    stations = [make_station(i) for i in range(n)]
    return plan_to_dict([PlannedStation(i, np.asarray(s.q_rad), s.base_T_flange) for i, s in enumerate(stations)])


def test_restart_never_resumes_a_run_older_than_the_newest(tmp_path):
    """The zombie the issue left in the store: run 1 open with two stations, run 2 done with
    the active result. ``cellcal run`` (a process, with ``cellcal sim``) closes run 1 as
    failed, naming run 2, says so in its log, stays IDLE, and keeps run 2's result active."""
    state = tmp_path / "state"
    with Store(state) as s:
        run1 = s.create_run("base_frame", _plan(6), config_sha256="0" * 64, devices={})
        for i in range(2):
            s.add_station(run1, make_station(i))
        run2 = s.create_run("base_frame", _plan(6), config_sha256="0" * 64, devices={})
        rid2 = s.add_result(run2, "base_frame", {"solver": "seeded", "gates": {"passed": True, "failed": []}}, {},
                            activate=True)
        s.set_run_status(run2, "done")
    sim = SimProcess(FAST_SCENARIO, tmp_path / "sim.log")
    daemon = rec = None
    try:
        urls = sim.start()
        cfg = daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=tmp_path, n_stations=6)
        rec = Recorder(cfg["zmq"]["pub_endpoint"])
        daemon = DaemonProcess(write_config(tmp_path / "cellcal.toml", cfg), tmp_path / "daemon.log").start()
        beats = []
        while len(beats) < 3:  # a few heartbeats: a resumed run would be CAPTURING by then
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT, 30.0, alive=daemon.alive, what="a heartbeat")
            beats.append(env["body"])
        assert all(b["state"] == "IDLE" and b["run_id"] is None and b["active_result_id"] == str(rid2) for b in beats)
        assert not [e for t, e in rec.messages if t == P.TOPIC_STATE and e["body"]["state"] == "CAPTURING"]
        assert daemon.terminate() == 0
        audit = audit_store(state)
        assert audit["runs"][run1]["status"] == "failed"
        assert f"run {run1} closed, not resumed: run {run2} was started after it" in audit["runs"][run1]["reason"]
        assert [(r["id"], r["active"]) for r in audit["results"]] == [(rid2, True)]
        assert sorted(audit["stations"]) == [(run1, 0), (run1, 1)]
        assert "closed, not resumed" in (tmp_path / "daemon.log").read_text()
    finally:
        if rec is not None:
            rec.close()
        if daemon is not None:
            daemon.stop()
        sim.stop()


def _offline_cfg(workdir: Path, **service):
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                         tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=workdir,
                         overrides={"service": service} if service else None)
    return load_config_text(to_toml(cfgd))


def test_restart_closes_a_run_of_another_motion_mode_or_interrupted_too_long_ago(tmp_path):
    """The newest open run is still not resumed when it was started in observe mode and the
    daemon now runs in command mode (resuming would move a robot the cell's program moves),
    or when it was last updated longer than resume_within_s ago. Both are closed, named; no
    job runs (the devices are offline: a resumed run would sit in FAULT, still open)."""
    cases = {
        "mode": ({"stations": _plan(4)["stations"], "started": {"motion_mode": "observe", "last_activation_id": 0}},
                 None, "started in observe mode, the daemon now runs in command mode"),
        "late": (_plan(4), "2000-01-01T00:00:00.000000+00:00", "longer than [service] resume_within_s = 120 s"),
    }
    for name, (plan, updated, words) in cases.items():
        cfg = _offline_cfg(tmp_path / name)
        with Store(cfg.service.state_dir) as s:
            run_id = s.create_run("base_frame", plan, config_sha256="0" * 64, devices={})
            s.add_station(run_id, make_station(0))
        if updated is not None:  # the run was interrupted long ago (e.g. a power cut)
            conn = sqlite3.connect(Path(cfg.service.state_dir) / "cellcal.sqlite3")
            with conn:
                conn.execute("UPDATE runs SET updated_utc = ? WHERE id = ?", (updated, run_id))
            conn.close()
        events: list[tuple[str, dict]] = []
        svc = Service(cfg)
        svc.add_listener(lambda t, b, events=events: events.append((t, b)))
        try:
            svc.start()
            assert svc.wait_idle(10.0) and svc.state == State.IDLE
            run = svc.store.get_run(run_id)
            assert run.status.value == "failed" and words in run.status_reason, (name, run.status_reason)
            assert [b["reason"] for t, b in events if t == P.TOPIC_STATE] == [run.status_reason]
        finally:
            svc.shutdown(timeout_s=10.0)


def test_a_result_never_replaces_one_activated_after_its_run_started(tmp_path):
    """Runs A and B give results, B's active. Run C starts; while it solves, an operator rolls
    back to A. C's result passes its gates but is stored inactive: A stays active, run C is
    done with the reason, its state event says so and the result topic carries nothing of C.
    Client-supplied stations: no devices needed."""
    rng = np.random.default_rng(5)
    X = make_transform(so3_exp(np.array([0.0, 0.0, 0.8])), np.array([2.5, -0.8, 0.1]))
    Y = make_transform(np.eye(3), np.array([0.0, 0.03, 0.05]))
    given = []
    for _ in range(6):
        G = make_transform(so3_exp(rng.normal(scale=0.5, size=3)), rng.uniform(-0.5, 0.5, 3))
        given.append({"base_T_flange": G.reshape(16).tolist(), "cell_T_target": (X @ G @ Y).reshape(16).tolist()})
    svc = Service(_offline_cfg(tmp_path))
    events: list[tuple[str, dict]] = []
    svc.add_listener(lambda t, b: events.append((t, b)))
    try:
        svc.start()
        run_a = svc.start_run("base_frame", stations=given)
        assert svc.wait_idle(10.0)
        rid_a = svc.store.active_result().id
        run_b = svc.start_run("base_frame", stations=given)
        assert svc.wait_idle(10.0)
        rid_b = svc.store.active_result().id
        assert rid_b != rid_a and svc.store.get_result(rid_b).run_id == run_b
        rolled: list[int | None] = []

        def roll_back(topic: str, body: dict) -> None:
            if topic == P.TOPIC_STATE and body["state"] == "SOLVING" and body["run_id"] == str(run_c) and not rolled:
                rolled.append(svc.activate_result(rid_a, "operator roll back"))

        svc.add_listener(roll_back)
        run_c = svc.start_run("base_frame", stations=given)
        deadline = time.monotonic() + 10.0
        while not (rolled and svc.wait_idle(0.1)):
            assert time.monotonic() < deadline, "run C did not finish"
        assert rolled == [rid_b]
        active = svc.store.active_result()
        assert active.id == rid_a and active.run_id == run_a
        (rec_c,) = [r for r in svc.store.list_results() if r.run_id == run_c]
        assert not rec_c.active and rec_c.result["gates"]["passed"]
        run = svc.store.get_run(run_c)
        assert run.status.value == "done"
        assert run.status_reason == (f"result {rec_c.id} passed its gates but was not activated: result {rid_a} "
                                     f"became active after run {run_c} started")
        assert [b for t, b in events if t == P.TOPIC_STATE and run.status_reason in b["reason"]]
        assert not [b for t, b in events if t == P.TOPIC_RESULT and b.get("run_id") == str(run_c)
                    and not b.get("retained")]
    finally:
        svc.shutdown(timeout_s=10.0)
