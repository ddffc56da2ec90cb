"""What the daemon's API caches (the version, the active result) and that a change is seen at once."""

from __future__ import annotations

import math
import sqlite3

import pytest

from cellcal.daemon.jobs import results as service_mod  # cellcal_version is read there
from cellcal.daemon.service import cellcal_version, next_deadline
from cellcal.daemon.store import Store

SHA = "ab" * 32
DEVICES = {"robot": {"model": "UR5e", "serial": "1"}, "tracker": {"model": "sim", "serial": "T-1"}}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "state") as s:
        yield s


def _run(store):
    return store.create_run("base_frame", {"stations": 3, "mode": "command"}, config_sha256=SHA, devices=DEVICES)


def test_active_result_is_cached_until_a_write_changes_it(store):
    run = _run(store)
    assert store.active_result() is None
    r1 = store.add_result(run, "base_frame", {"solver": "s1"}, {}, activate=True)
    a = store.active_result()
    assert a.id == r1
    assert store.active_result() is a  # nothing changed: the same record, no re-read
    r2 = store.add_result(run, "base_frame", {"solver": "s2"}, {}, parent_result_id=r1)
    assert store.active_result().id == r1  # a write that leaves it active: still r1 (re-read)
    store.activate_result(r2, "new calibration")  # activation
    assert store.active_result().id == r2
    store.activate_result(r1, "roll back")  # roll back
    assert store.active_result().id == r1 and not store.active_result().suspect
    store.mark_suspect(r1, "drift check failed")  # suspect marking
    b = store.active_result()
    assert b.id == r1 and b.suspect and b.suspect_reason == "drift check failed"
    with pytest.raises(Exception):  # noqa: B017 - any failure: a rolled-back write must not leave a stale cache
        store.activate_result(999)
    assert store.active_result().id == r1 and store.active_result().suspect


def test_active_result_cache_sees_another_connections_commit(store, tmp_path):
    run = _run(store)
    r1 = store.add_result(run, "base_frame", {"solver": "s1"}, {}, activate=True)
    r2 = store.add_result(run, "base_frame", {"solver": "s2"}, {})
    assert store.active_result().id == r1
    # another process's tool on the same file (here: another connection) rolls forward
    with Store(tmp_path / "state") as other:
        other.activate_result(r2, "by another process")
    assert store.active_result().id == r2
    conn = sqlite3.connect(store.path)  # a plain SQLite writer, not a Store
    conn.execute("UPDATE results SET suspect = 1, suspect_reason = 'x' WHERE id = ?", (r2,))
    conn.commit()
    conn.close()
    assert store.active_result().suspect


def test_version_is_read_once_per_process(monkeypatch):
    cellcal_version.cache_clear()
    calls = []

    def counting(name):
        calls.append(name)
        return "1.2.3"

    monkeypatch.setattr(service_mod, "version", counting)
    try:
        assert [cellcal_version() for _ in range(5)] == ["1.2.3"] * 5
        assert calls == ["cellcal"]
    finally:
        cellcal_version.cache_clear()


def test_periodic_deadlines_stay_on_their_grid():
    # on time or a little late: the next beat is one period after the previous *deadline*
    assert next_deadline(10.0, 1.0, 10.0) == 11.0
    assert next_deadline(10.0, 1.0, 10.04) == 11.0
    # hundreds of late turns do not add up: beat k is still at 10 + k
    d = 10.0
    for k in range(1, 500):
        d = next_deadline(d, 1.0, d + 0.049)
        assert d == pytest.approx(10.0 + k, abs=1e-9)
    # a stall of 3.5 periods: one late beat at once (the latest grid point passed), then the
    # grid again; the other missed beats are skipped, not sent in a burst
    late = next_deadline(10.0, 1.0, 13.5)
    assert late == 13.0
    assert next_deadline(late, 1.0, 13.52) == 14.0
    assert math.isclose(next_deadline(10.0, 0.5, 11.0), 11.0)  # exactly on a grid point: due now
