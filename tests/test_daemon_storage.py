"""A full disk or a read-only state directory under the running daemon.

Real file systems where this process may mount them (root): a small tmpfs filled to the
last byte (ENOSPC), or remounted read-only (EROFS), as in ``tests/test_store.py``. The
promise: a clear fault (FAULT state and a ``cellcal/v1/fault`` body naming the state
directory, or a start-up error naming it) and the previous result intact and active.

Without mount rights: the full disk falls back to ``PRAGMA max_page_count`` on the store's
connection (SQLite then fails the write with the same SQLITE_FULL), and the read-only
directory to chmod 0555 (binding for a non-root user only; root without mount rights skips).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from storetest_support import fill_filesystem, make_station, remount, small_tmpfs

from cellcal.daemon import protocol as P
from cellcal.daemon.config import load_config_text
from cellcal.daemon.service import Service, State
from cellcal.daemon.store import Store, StoreReadOnlyError
from cellcal.testing.harness import (
    FAST_TIME_SCALE,
    DaemonProcess,
    HarnessError,
    audit_store,
    daemon_config,
    free_port,
    inprocess_cell,
    nonconforming_bodies,
    to_toml,
    write_config,
)

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow


def _exports(state: Path) -> dict[str, bytes]:
    d = state / "exports"
    # Files only: ``active`` is a symlink to a directory of links to these same files.
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()} if d.is_dir() else {}


def test_full_disk_during_a_run_faults_and_keeps_the_previous_result(tmp_path):
    """Run 1 gives the active result. During run 2 the state directory's file system fills up
    right after station 0 is committed: the next station's transaction fails, the service
    goes to FAULT with a fault body naming the directory and "full", result 1 stays active
    and byte-for-byte the same (store and exported files), station 0 of run 2 stays
    committed and the run open. With space again, the next start resumes run 2 to its end."""
    with small_tmpfs(tmp_path, 16 * 1024) as mnt:
        base = mnt if mnt is not None else tmp_path / "fs"
        base.mkdir(exist_ok=True)
        state = base / "state"
        run2 = None
        with inprocess_cell(tmp_path, state_dir=state, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
            run1 = cell.svc.start_run("base_frame")
            cell.wait_result(run1)
            prev = cell.svc.store.active_result()
            exports_before = _exports(state)
            assert f"result_{prev.id}.json" in exports_before
            filled = threading.Event()

            def fill_after_first_station(topic: str, body: dict) -> None:
                # Called by the worker right after station 0 of run 2 was committed and
                # published, before it moves on: the disk is full for the next station.
                if topic == P.TOPIC_STATION and body["accepted"] and body["run_id"] != str(run1) and not filled.is_set():
                    if mnt is not None:
                        fill_filesystem(mnt)
                    else:
                        conn = cell.svc.store._conn
                        (pages,) = conn.execute("PRAGMA page_count").fetchone()
                        conn.execute(f"PRAGMA max_page_count = {pages}")
                    filled.set()

            cell.svc.add_listener(fill_after_first_station)
            run2 = cell.svc.start_run("base_frame")
            fault = cell.wait_for(lambda t, b: t == P.TOPIC_FAULT and "full" in b["message"], 40.0, "the disk-full fault")
            assert filled.is_set()
            assert str(state) in fault["message"] and fault["code"] == "E_STATE" and fault["state"] == "FAULT", fault
            assert cell.svc.wait_idle(10.0) and cell.svc.state == State.FAULT
            status = cell.svc.status()
            assert status["state"] == "FAULT" and "full" in status["detail"]
            active = cell.svc.store.active_result()
            assert active.id == prev.id and active.result == prev.result and active.active
            assert status["active_result_id"] == str(prev.id)
            assert [s.plan_index for s in cell.svc.store.stations(run2)] == [0]
            assert cell.svc.store.get_run(run2).status.value == "capturing"
            assert _exports(state) == exports_before
            assert not [b for b in cell.bodies(P.TOPIC_RESULT) if b.get("run_id") == str(run2)]
            assert nonconforming_bodies(cell.events) == []
        if mnt is not None:
            (mnt / "filler.bin").unlink()
        audit = audit_store(state)
        assert audit["integrity"] == ["ok"] and not audit["duplicates"]
        assert [r["id"] for r in audit["results"] if r["active"]] == [prev.id]
        # Space again: the run resumes on the next start and completes.
        with inprocess_cell(tmp_path / "again", state_dir=state, n_stations=6, time_scale=FAST_TIME_SCALE) as cell:
            body = cell.wait_result(run2)
            assert body["gates"]["passed"] and body["active"]
            assert [s.plan_index for s in cell.svc.store.stations(run2)] == list(range(6))
            assert cell.svc.store.active_result().parent_result_id is None


def _seed(state: Path) -> tuple[int, dict]:
    with Store(state) as s:
        run = s.create_run("base_frame", {"stations": []}, config_sha256="0" * 64, devices={})
        for i in range(3):
            s.add_station(run, make_station(i))
        rid = s.add_result(run, "base_frame", {"solver": "seeded", "gates": {"passed": True, "failed": []}}, {},
                           activate=True)
        s.set_run_status(run, "done")
        return rid, s.get_result(rid).result


def _start_fails(conf: Path, log: Path, *words: str) -> None:
    """``cellcal run`` exits 1 at start-up with a message containing every word."""
    daemon = DaemonProcess(conf, log).start()
    try:
        rc = daemon.wait(20.0)
    finally:
        daemon.stop()
    text = log.read_text()
    assert rc == 1, text
    line = [ln for ln in text.splitlines() if "cannot start" in ln]
    assert line and all(w in line[-1] for w in words), text


def test_read_only_or_full_state_directory_refuses_to_start_and_keeps_the_previous_result(tmp_path):
    """A store with an active result on a file system remounted read-only: ``Service.start``
    raises StoreReadOnlyError and ``cellcal run`` exits 1 saying it cannot start, naming the
    state directory; readers still see the result. The same file system full to the last
    byte: exit 1 naming the directory and "full". Afterwards the result is intact and active."""
    with small_tmpfs(tmp_path, 4096) as mnt:
        if mnt is None and os.geteuid() == 0:
            pytest.skip("root without mount rights: chmod binds nothing and no tmpfs can be remounted read-only")
        base = mnt if mnt is not None else tmp_path / "fs"
        base.mkdir(exist_ok=True)
        state = base / "state"
        rid, result = _seed(state)
        cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                             tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path)
        cfgd["service"]["state_dir"] = str(state)
        conf = write_config(tmp_path / "cellcal.toml", cfgd)
        cfg = load_config_text(to_toml(cfgd))
        if mnt is not None:
            remount(mnt, "ro")
        else:
            os.chmod(state, 0o555)
            os.chmod(base, 0o555)
        try:
            svc = Service(cfg)
            with pytest.raises(StoreReadOnlyError, match=rf"state directory {state}.*read-only"):
                svc.start()
            svc.shutdown(timeout_s=5.0)
            _start_fails(conf, tmp_path / "ro.log", str(state), "read-only")
            if mnt is not None:  # a read-only mount can still be read (chmod 0555 cannot, by SQLite's WAL rules)
                with Store(state, read_only=True) as ro:
                    assert ro.active_result().id == rid and ro.active_result().result == result
        finally:
            if mnt is not None:
                remount(mnt, "rw")
            else:
                os.chmod(base, 0o755)
                os.chmod(state, 0o755)
        if mnt is not None:
            fill_filesystem(mnt)
            t0 = time.monotonic()
            _start_fails(conf, tmp_path / "full.log", str(state), "full")
            assert time.monotonic() - t0 < 20.0
            (mnt / "filler.bin").unlink()
        with Store(state) as s:
            assert s.settings()["integrity_check"] == "ok"
            assert s.active_result().id == rid and s.active_result().result == result


def test_serving_says_the_daemon_exited_before_it_answered(tmp_path):
    """``DaemonProcess.serving`` waits for the first answer to ``get_status``; a daemon that
    cannot start (its state directory is a file) ends the wait at once with a HarnessError
    naming the exit and quoting the daemon's log, not after the whole deadline."""
    state = tmp_path / "state"
    state.write_text("not a directory\n")
    cfgd = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                         tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path)
    cfgd["service"]["state_dir"] = str(state)
    conf = write_config(tmp_path / "cellcal.toml", cfgd)
    daemon = DaemonProcess(conf, tmp_path / "run.log").start()
    try:  # the deadline's error would say "did not answer"
        with pytest.raises(HarnessError, match=r"exited \(1\) before serving:(.|\n)*cannot start"):
            daemon.serving(cfgd["zmq"]["cmd_endpoint"], timeout_s=300.0)
    finally:
        daemon.stop()
