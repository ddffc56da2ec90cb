"""A store file that is not a whole cellcal database is a typed fault, left as it is; only an
absent file is created, and atomically (real SQLite, and ``cellcal run`` as a process)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest
from storetest_support import make_station

from cellcal.daemon.store import DB_FILENAME, SCHEMA_VERSION, Store, StoreCorruptError, StoreError
from cellcal.testing.harness import DaemonProcess, daemon_config, free_port, write_config


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _siblings(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def _populated(d: Path) -> int:
    with Store(d) as s:
        run = s.create_run("base_frame", {}, config_sha256="0" * 64, devices={})
        for i in range(50):
            s.add_station(run, make_station(i, raw_bytes=2000))
    return run


def _damaged_files(tmp_path: Path) -> dict[str, bytes]:
    good = tmp_path / "good"
    _populated(good)
    whole = (good / DB_FILENAME).read_bytes()
    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers(name) VALUES ('someone else''s data')")
    conn.commit()
    conn.close()
    return {
        "zero-length": b"",
        "garbage": os.urandom(8192),
        "text": b"this is not a database\n" * 100,
        "another program's database": other.read_bytes(),
        "truncated to half": whole[: len(whole) // 2],
        "header only": whole[:100],
    }


@pytest.mark.parametrize("read_only", [False, True])
def test_damaged_store_files_are_typed_faults_left_untouched(tmp_path, read_only):
    for what, data in _damaged_files(tmp_path).items():
        d = tmp_path / f"s-{read_only}-{what.replace(' ', '_')}"
        d.mkdir()
        f = d / DB_FILENAME
        f.write_bytes(data)
        before = _digest(f)
        with pytest.raises(StoreCorruptError) as ei:
            Store(d, read_only=read_only).open()
        assert str(d) in str(ei.value), what
        if what == "zero-length":
            assert "empty (0 bytes)" in str(ei.value) and "inspection" in str(ei.value)
        assert f.stat().st_size == len(data) and _digest(f) == before, f"{what}: the file was changed"
        assert not (d / (DB_FILENAME + "-wal")).exists() or (d / (DB_FILENAME + "-wal")).stat().st_size == 0, what
        # and again: a second start sees the same fault (nothing was "repaired" in between)
        with pytest.raises(StoreCorruptError):
            Store(d, read_only=read_only).open()
        assert _digest(f) == before


def test_absent_file_is_created_whole_and_a_half_made_one_is_cleaned(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    # what a creation killed half way leaves behind: never taken for the store
    (d / (DB_FILENAME + ".creating")).write_bytes(b"")
    (d / (DB_FILENAME + ".creating-wal")).write_bytes(b"x" * 100)
    with Store(d) as s:
        assert s.settings()["schema_version"] == SCHEMA_VERSION and s.settings()["journal_mode"] == "wal"
        s.create_run("base_frame", {}, config_sha256="0" * 64, devices={})
    assert not any(n.startswith(DB_FILENAME + ".creating") for n in _siblings(d))
    with Store(d, read_only=True) as ro:
        assert len(ro.list_runs()) == 1
    with pytest.raises(StoreError, match="no cellcal database"):
        Store(tmp_path / "nothing", read_only=True).open()


def test_cellcal_run_refuses_a_zero_length_store_and_leaves_it(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_FILENAME).write_bytes(b"")
    cfg = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}?model=ur5e",
                        tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path)
    cfg["service"]["state_dir"] = str(state)
    conf = write_config(tmp_path / "cellcal.toml", cfg)
    log = tmp_path / "run.log"
    daemon = DaemonProcess(conf, log).start()
    try:
        rc = daemon.wait(30.0)
    finally:
        daemon.stop()
    text = log.read_text()
    assert rc == 1, text
    assert "Traceback" not in text
    line = [ln for ln in text.splitlines() if "cannot start" in ln]
    assert line and "empty (0 bytes)" in line[-1] and str(state) in line[-1], text
    assert (state / DB_FILENAME).stat().st_size == 0
