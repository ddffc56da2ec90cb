"""The SQLite store: durability settings, records round-trip bit-exactly, typed errors.

Real SQLite files in tmp_path; the full-disk and read-only tests use a real small tmpfs
when this process may mount one (root in CI), and say in their docstrings what they fall
back to otherwise. The kill -9 tests are in test_store_crash.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sqlite3
import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from storetest_support import fill_filesystem, make_station, remount, same_station, small_tmpfs

from cellcal.daemon.bodies import result_to_wire
from cellcal.daemon.store import (
    DB_FILENAME,
    MIGRATIONS,
    SCHEMA_VERSION,
    TRANSIENT,
    DuplicateStation,
    RunClosed,
    RunStatus,
    StationRecord,
    Store,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    UnknownRecord,
    migrate,
    station_column_ddl,
    station_columns,
)
from cellcal.solver import calibrate_base_frame
from cellcal.solver.errors import CellcalError
from cellcal.solver.synthetic import base_frame_scene

SHA = "ab" * 32
DEVICES = {"robot": {"model": "UR5e", "serial": "20235500123"}, "tracker": {"model": "sim", "serial": "T-1"}}


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "state") as s:
        yield s


def new_run(store, kind="base_frame", **kw):
    return store.create_run(kind, {"stations": 20, "mode": "command"}, config_sha256=SHA, devices=DEVICES, **kw)


# ---- life cycle and settings -----------------------------------------------------------


def test_constructor_does_no_io_and_open_close_are_idempotent(tmp_path):
    d = tmp_path / "a" / "b"
    s = Store(d)
    assert not d.exists() and s.path == d / DB_FILENAME and not s.is_open
    with pytest.raises(StoreError, match="not open"):
        s.list_runs()
    assert s.open() is s and s.open() is s and s.is_open
    assert s.path.is_file()
    s.close()
    s.close()
    assert not s.is_open
    with pytest.raises(StoreError, match="not open"):
        s.get_run(1)
    with Store(d) as s2:  # reopen: same file, migrations not re-applied
        assert s2.settings()["schema_version"] == SCHEMA_VERSION
        n = sqlite3.connect(s2.path).execute("SELECT count(*) FROM schema_version").fetchone()[0]
        assert n == len(MIGRATIONS)


def test_durability_settings_as_sqlite_reports_them(store):
    st = store.settings()
    assert st["journal_mode"] == "wal"
    assert st["synchronous"] == 2  # FULL
    assert st["foreign_keys"] == 1
    assert st["integrity_check"] == "ok"
    # WAL is a property of the file: an independent connection sees it too.
    other = sqlite3.connect(store.path)
    assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    other.close()


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    d = tmp_path / "state"
    Store(d).open().close()
    conn = sqlite3.connect(d / DB_FILENAME)
    conn.execute("INSERT INTO schema_version VALUES (99, 'from the future', '2030-01-01T00:00:00+00:00')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match=r"99.*newer") as ei:
        Store(d).open()
    assert str(d) in str(ei.value)
    conn = sqlite3.connect(d / DB_FILENAME)
    assert [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")] == [*sorted(MIGRATIONS), 99]


def test_migration_steps_apply_in_order_and_atomically(tmp_path):
    d = tmp_path / "state"
    with Store(d) as s:
        new_run(s)
    conn = sqlite3.connect(d / DB_FILENAME, isolation_level=None)
    nxt = SCHEMA_VERSION + 1  # the next step after today's
    bad = {**MIGRATIONS, nxt: ("half-good step", ("ALTER TABLE runs ADD COLUMN note TEXT", "ALTER TABLE nosuch ADD x"))}
    with pytest.raises(sqlite3.OperationalError, match="nosuch"):
        migrate(conn, bad)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    assert "note" not in cols  # the good statement of the failed step was rolled back too
    assert conn.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    good = {**MIGRATIONS, nxt: ("add a note to runs", ("ALTER TABLE runs ADD COLUMN note TEXT DEFAULT ''",))}
    assert migrate(conn, good) == nxt
    assert "note" in [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 1  # data carried over
    assert migrate(conn, good) == nxt  # idempotent
    assert conn.execute("SELECT count(*) FROM schema_version").fetchone()[0] == nxt


# ---- runs ------------------------------------------------------------------------------


def test_runs_life_cycle_and_resume_list(store):
    a, b, c = new_run(store), new_run(store, "tool_point"), new_run(store, "hand_eye")
    r = store.get_run(a)
    assert (r.kind, r.status, r.config_sha256, r.devices, r.plan["stations"], r.n_stations) == (
        "base_frame", "capturing", SHA, DEVICES, 20, 0
    )
    assert r.is_open
    assert [x.id for x in store.list_runs()] == [c, b, a]
    assert [x.id for x in store.list_runs(limit=2)] == [c, b]
    store.set_run_status(b, "solving")
    store.set_run_status(c, RunStatus.ABORTED, "operator abort")
    assert [x.id for x in store.unfinished_runs()] == [a, b]
    assert store.get_run(c).status_reason == "operator abort" and not store.get_run(c).is_open
    store.set_run_status(b, "capturing")  # solving -> capturing: more stations needed
    store.set_run_status(b, "done")
    with pytest.raises(RunClosed, match=f"run {b} is done"):
        store.set_run_status(b, "capturing")
    with pytest.raises(ValueError, match="capturing, solving"):
        store.set_run_status(a, "paused")
    with pytest.raises(UnknownRecord, match="no run with id 999") as ei:
        store.set_run_status(999, "done")
    assert isinstance(ei.value, CellcalError) and isinstance(ei.value, LookupError)
    with pytest.raises(UnknownRecord):
        store.get_run(999)
    with pytest.raises(UnknownRecord):
        new_run(store, parent_result_id=42)
    with pytest.raises(ValueError, match="plan"):
        store.create_run("base_frame", {"x": float("nan")}, config_sha256=SHA, devices={})
    assert len(store.list_runs()) == 3  # the refused runs wrote nothing


# ---- stations --------------------------------------------------------------------------


def test_station_round_trip_is_bit_exact_including_awkward_floats(store):
    run = new_run(store)
    awkward = np.array([0.1, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 1 / 3, -math.pi])
    G = np.eye(4)
    G[:3, 3] = awkward[:3]
    st = StationRecord(
        plan_index=0,
        base_T_flange=G,
        q_rad=awkward,
        cell_T_target=None,
        cell_p_target=awkward[4:],
        tracker_std_translation_m=-0.0,
        tracker_std_rotation_rad=None,
        sample_count=1,
        robot_t_device_s=5e-324,
        robot_t_host_ns=2**63 - 1,
        tracker_t_device_s=-0.0,
        tracker_t_host_ns=-(2**63),
        settle={"dwell_s": 0.1, "max_qd_rad_s": np.float64(1 / 3), "n": np.int64(7), "ok": np.bool_(True)},
        raw={"samples": np.array([[0.1, 1e-300], [-0.0, 2.5]]), "note": "ü"},
        accepted_host_ns=123,
    )
    store.add_station(run, st)
    (got,) = store.stations(run)
    assert same_station(got, st)
    assert math.copysign(1.0, got.tracker_std_translation_m) == -1.0  # -0.0 kept its sign
    assert got.settle == {"dwell_s": 0.1, "max_qd_rad_s": 1 / 3, "n": 7, "ok": True}
    assert got.raw["samples"][1][0] == 0.0 and math.copysign(1.0, got.raw["samples"][1][0]) == -1.0
    # Realistic stations, and again through a fresh connection (not a cache).
    for i in (3, 1, 2):
        store.add_station(run, make_station(i))
    with Store(store.state_dir, read_only=True) as ro:
        got = ro.stations(run)
    assert [s.plan_index for s in got] == [0, 1, 2, 3]  # plan order, not insertion order
    assert all(same_station(g, make_station(g.plan_index)) for g in got[1:])
    assert store.station_indices(run) == [0, 1, 2, 3] and store.get_run(run).n_stations == 4
    # A robot-only station (tool point: no tracker measurement) keeps its Nones.
    fields = {k: getattr(make_station(4), k) for k in StationRecord.__dataclass_fields__}
    robot_only = StationRecord(**{**fields, "cell_T_target": None, "cell_p_target": None, "sample_count": 0,
                                  "tracker_std_rotation_rad": None})
    store.add_station(run, robot_only)
    got = store.stations(run)[-1]
    assert same_station(got, robot_only) and got.cell_T_target is None and got.cell_p_target is None


def test_station_record_validates_where_it_is_built():
    good = make_station(0)
    fields = {k: getattr(good, k) for k in StationRecord.__dataclass_fields__}
    cases = [
        ({"base_T_flange": np.eye(3)}, r"station 0: base_T_flange must have shape \(4, 4\)"),
        ({"q_rad": np.array([0.0, np.nan])}, "q_rad contains NaN"),
        ({"tracker_std_translation_m": -1e-6}, "must be >= 0"),
        ({"robot_t_device_s": float("inf")}, "must be finite"),
        ({"sample_count": -1}, "sample_count must be >= 0"),
        ({"robot_t_host_ns": 1.5}, "must be an integer"),
        ({"plan_index": -1}, "plan_index must be >= 0"),
        ({"raw": [1, 2]}, "raw must be a dict"),
    ]
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            StationRecord(**{**fields, **change})
    # A robot-only station (tool point: no tracker) is valid and round-trips its Nones.
    robot_only = StationRecord(**{**fields, "cell_T_target": None, "cell_p_target": None, "sample_count": 0,
                                  "tracker_std_rotation_rad": None, "raw": {}})
    assert robot_only.cell_T_target is None and robot_only.sample_count == 0
    # Arrays are private copies and read-only: the caller's buffer reuse cannot alter them.
    G = np.eye(4)
    st = StationRecord(**{**fields, "base_T_flange": G})
    G[0, 3] = 9.0
    assert st.base_T_flange[0, 3] == 0.0
    with pytest.raises(ValueError):
        st.base_T_flange[0, 0] = 2.0


def test_the_stations_table_is_the_station_record(store):
    """The table's columns (but the store's own id, run_id, stored_utc) are StationRecord's
    fields in order, with the types and NOT NULLs the codec derives from the field types:
    the INSERT and the decoder built from the fields fit the schema migration 1 created."""
    cols = station_columns()
    assert [c.name for c in cols] == [f.name for f in dataclasses.fields(StationRecord) if not f.metadata.get(TRANSIENT)]
    info = {r[1]: r for r in store._connection().execute("PRAGMA table_info(stations)")}
    assert [n for n in info if n not in ("id", "run_id", "stored_utc")] == [c.column for c in cols]
    for c in cols:
        _cid, _name, decl, notnull, _default, _pk = info[c.column]
        assert decl == {"int": "INTEGER", "float": "", "array": "BLOB", "json": "TEXT"}[c.kind], c
        assert bool(notnull) == (not c.nullable), c
    assert {c.name: c.kind for c in cols if c.kind == "json"} == {"settle": "json", "raw": "json", "camera": "json"}
    assert [c.name for c in cols if c.nullable] == ["cell_T_target", "cell_p_target", "tracker_std_rotation_rad",
                                                    "camera"]


@dataclasses.dataclass(frozen=True, eq=False)
class StationWithHumidity(StationRecord):
    """A test-only station with one more field: the edit a new field needs."""

    humidity_pct: float | None = None


def test_a_new_station_field_is_one_edit_and_a_migration(tmp_path):
    """A store written by today's code opens with a record class that has one more field and
    the one migration :func:`station_column_ddl` writes for it: old stations read back with
    the field None, new ones round-trip it, and the column keeps the float rule (typeof)."""
    d = tmp_path / "state"
    with Store(d) as s:
        run = new_run(s)
        s.add_station(run, make_station(0))
    ddl = station_column_ddl(StationWithHumidity, "humidity_pct")
    assert ddl == ("ALTER TABLE stations ADD COLUMN humidity_pct "
                   "CHECK (humidity_pct IS NULL OR typeof(humidity_pct) = 'real')")
    migrations = {**MIGRATIONS, SCHEMA_VERSION + 1: ("stations: humidity_pct", (ddl,))}
    fields = {k: getattr(make_station(1), k) for k in StationRecord.__dataclass_fields__}
    with Store(d, station_type=StationWithHumidity, migrations=migrations) as s:
        assert s.settings()["schema_version"] == SCHEMA_VERSION + 1
        s.add_station(run, StationWithHumidity(**fields, humidity_pct=41.5))
        old, new = s.stations(run)
        assert isinstance(old, StationWithHumidity) and old.humidity_pct is None
        assert same_station(old, make_station(0)) and new.humidity_pct == 41.5
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            s._connection().execute("UPDATE stations SET humidity_pct = 40 WHERE plan_index = 1")
        with pytest.raises(TypeError, match="StationWithHumidity"):
            s.add_station(run, make_station(2))
    with pytest.raises(ValueError, match="humidity_pct must be a number"):
        StationWithHumidity(**fields, humidity_pct="humid")
    with pytest.raises(StoreError, match="newer than this cellcal"):  # today's code refuses the newer store
        Store(d).open()


def test_duplicate_station_is_typed_and_writes_nothing(store):
    run = new_run(store)
    store.add_station(run, make_station(0))
    other = make_station(5)
    same_index = StationRecord(**{**{k: getattr(other, k) for k in StationRecord.__dataclass_fields__}, "plan_index": 0})
    with pytest.raises(DuplicateStation, match=f"run {run} already has station 0") as ei:
        store.add_station(run, same_index)
    assert (ei.value.run_id, ei.value.plan_index) == (run, 0) and str(store.state_dir) in str(ei.value)
    (kept,) = store.stations(run)
    assert same_station(kept, make_station(0))  # the first one, untouched
    # The same plan index in another run is fine.
    run2 = new_run(store)
    store.add_station(run2, make_station(0))
    assert store.station_indices(run2) == [0]


def test_unstorable_raw_and_closed_or_unknown_runs_write_nothing(store):
    run = new_run(store)
    bad = StationRecord(**{**{k: getattr(make_station(1), k) for k in StationRecord.__dataclass_fields__},
                           "raw": {"x": float("nan")}})
    with pytest.raises(ValueError, match="station 1 raw: not storable as JSON"):
        store.add_station(run, bad)
    with pytest.raises(ValueError, match="not storable"):
        store.add_station(run, StationRecord(**{**{k: getattr(make_station(1), k) for k in
                                                   StationRecord.__dataclass_fields__}, "settle": {"o": object()}}))
    with pytest.raises(UnknownRecord, match="no run with id 77"):
        store.add_station(77, make_station(1))
    with pytest.raises(UnknownRecord):
        store.stations(77)
    store.set_run_status(run, "failed", "robot never settled")
    with pytest.raises(RunClosed, match="is failed: cannot add station 2"):
        store.add_station(run, make_station(2))
    with pytest.raises(RunClosed):
        store.add_rejection(run, 2, "not_settled", {})
    assert store.stations(run) == [] and store.rejections(run) == []


def test_rejections_are_kept_in_order_with_their_figures(store):
    run = new_run(store)
    a = store.add_rejection(run, 3, "not_settled", {"max_qd_rad_s": 0.02, "limit_rad_s": 0.001})
    b = store.add_rejection(run, 3, "tracker_std", {"std_m": 1e-4})
    rej = store.rejections(run)
    assert [r.id for r in rej] == [a, b] and [r.reason for r in rej] == ["not_settled", "tracker_std"]
    assert rej[0].detail == {"max_qd_rad_s": 0.02, "limit_rad_s": 0.001} and rej[0].plan_index == 3
    with pytest.raises(ValueError, match="reason"):
        store.add_rejection(run, 4, "", {})


def test_a_dropped_station_leaves_the_run_with_its_reason_and_only_an_open_run_drops(store):
    run = new_run(store)
    for i in range(3):
        store.add_station(run, make_station(i))
    store.drop_station(run, 1, "consensus_outlier", {"deviation_m": 0.025})
    assert store.station_indices(run) == [0, 2] and [s.plan_index for s in store.stations(run)] == [0, 2]
    rej = store.rejections(run)
    assert [(r.plan_index, r.reason) for r in rej] == [(1, "consensus_outlier")]
    assert rej[0].detail == {"deviation_m": 0.025, "dropped": True}
    with pytest.raises(UnknownRecord, match="no station"):
        store.drop_station(run, 1, "consensus_outlier", {})  # already gone: nothing written
    assert len(store.rejections(run)) == 1
    with pytest.raises(ValueError, match="reason"):
        store.drop_station(run, 0, "", {})
    store.add_station(run, make_station(1))  # the plan index may be captured again
    store.set_run_status(run, RunStatus.DONE, "done")
    with pytest.raises(RunClosed):
        store.drop_station(run, 0, "consensus_outlier", {})
    assert store.station_indices(run) == [0, 1, 2]


# ---- results ---------------------------------------------------------------------------


def test_result_versions_activation_roll_back_and_forward(store):
    run = new_run(store)
    assert store.active_result() is None
    r1 = store.add_result(run, "base_frame", {"solver": "s1"}, {}, activate=True)
    r2 = store.add_result(run, "base_frame", {"solver": "s2"}, {}, parent_result_id=r1)
    assert store.active_result().id == r1  # adding does not activate unless asked
    store.activate_result(r2, "new calibration")
    assert store.active_result().id == r2 and not store.get_result(r1).active
    store.activate_result(r1, "roll back")
    assert store.active_result().id == r1
    with pytest.raises(UnknownRecord, match="no result with id 999"):
        store.activate_result(999)
    assert store.active_result().id == r1  # unchanged by the failed activation
    conn = sqlite3.connect(store.path)
    assert conn.execute("SELECT count(*) FROM results WHERE active = 1").fetchone()[0] == 1
    # The database itself refuses a second active row, whoever writes it.
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE results SET active = 1")
    conn.close()
    hist = store.activation_history()
    assert [(h.result_id, h.previous_result_id, h.reason) for h in hist] == [
        (r1, r2, "roll back"), (r2, r1, "new calibration"), (r1, None, "activated on creation")
    ]
    assert [r.id for r in store.list_results()] == [r2, r1] and [r.id for r in store.list_results(1)] == [r2]
    assert store.get_result(r2).parent_result_id == r1 and store.get_result(r2).provenance["parent_result_id"] == r1


def test_provenance_is_completed_from_the_run_and_validated(store):
    run = new_run(store)
    rid = store.add_result(run, "base_frame", {"solver": "quat-linear"}, {"note": "first"})
    p = store.get_result(rid).provenance
    assert p["config_sha256"] == SHA and p["devices"] == DEVICES and p["run_id"] == run
    assert p["solver"] == "quat-linear" and "a_T_b maps" in p["frame_convention"] and p["note"] == "first"
    assert p["cellcal_version"] == "0.1.0" and p["parent_result_id"] is None
    vf = datetime.fromisoformat(p["valid_from"])
    assert vf.tzinfo is not None and abs(datetime.now(UTC) - vf) < timedelta(minutes=5)
    # An explicit valid_from in another zone is stored as the same instant in UTC.
    rid = store.add_result(run, "base_frame", {}, {"valid_from": "2026-06-01T14:00:00+02:00"})
    assert store.get_result(rid).valid_from_utc == "2026-06-01T12:00:00.000000+00:00"
    with pytest.raises(ValueError, match="timezone-aware"):
        store.add_result(run, "base_frame", {}, {}, valid_from=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="parent result"):
        store.add_result(run, "base_frame", {}, {"parent_result_id": 5})
    with pytest.raises(UnknownRecord):
        store.add_result(run, "base_frame", {}, {}, parent_result_id=999)
    with pytest.raises(UnknownRecord):
        store.add_result(999, "base_frame", {}, {})
    assert len(store.list_results()) == 2  # the refused ones wrote nothing


def test_solver_result_wire_dict_round_trips_exactly(store):
    scene = base_frame_scene(12, np.random.default_rng(3), noise_mm=0.05, noise_deg=0.01)
    wire = result_to_wire(calibrate_base_frame(scene.base_T_flange, scene.measured))
    rid = store.add_result(new_run(store), "base_frame", wire, {}, activate=True)
    got = store.active_result()
    assert got.result == wire  # floats compare exactly: repr round-trips float64
    T = np.array(got.result["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
    assert T.tobytes() == np.array(wire["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4).tobytes()
    exported = got.to_export_dict()
    assert exported["result_id"] == rid and exported["provenance"]["solver"] == wire["solver"]
    assert json.loads(json.dumps(exported, allow_nan=False)) == exported


def test_suspect_flag_and_drift_checks(store):
    rid = store.add_result(new_run(store), "base_frame", {}, {}, activate=True)
    ids = [store.add_drift_check(rid, {"deviation_mm": 0.01 * i, "cusum": i}) for i in range(5)]
    recent = store.drift_checks(rid, limit=3)
    assert [d.id for d in recent] == ids[2:]  # the most recent three, oldest first
    assert [d.record["cusum"] for d in recent] == [2, 3, 4]
    assert [d.id for d in store.drift_checks(rid)] == ids
    assert not store.get_result(rid).suspect
    store.mark_suspect(rid, "drift 1.2 mm > fail 1.0 mm")
    r = store.get_result(rid)
    assert r.suspect and r.suspect_reason == "drift 1.2 mm > fail 1.0 mm" and r.suspect_utc
    assert store.active_result().suspect  # still active until a new one replaces it
    with pytest.raises(UnknownRecord):
        store.mark_suspect(999, "x")
    with pytest.raises(UnknownRecord):
        store.add_drift_check(999, {})
    with pytest.raises(UnknownRecord):
        store.drift_checks(999)
    with pytest.raises(ValueError, match="limit"):
        store.drift_checks(rid, limit=0)


# ---- threads and other processes -------------------------------------------------------


def test_safe_to_call_from_several_threads(store):
    runs = [new_run(store) for _ in range(3)]
    errors: list[BaseException] = []

    def writer(run: int) -> None:
        try:
            for i in range(40):
                store.add_station(run, make_station(i))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(60):
                for run in runs:
                    store.station_indices(run)
                store.list_runs()
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(r,)) for r in runs] + [threading.Thread(target=reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    for run in runs:
        assert store.station_indices(run) == list(range(40))
    assert store.settings()["integrity_check"] == "ok"


def test_read_only_store_reads_beside_the_writer_and_refuses_writes(store):
    """``Store(dir, read_only=True)`` (``mode=ro`` URI + ``PRAGMA query_only``): a second
    connection sees each commit at once (WAL) and every write raises StoreReadOnlyError."""
    run = new_run(store)
    with Store(store.state_dir, read_only=True) as ro:
        assert ro.station_indices(run) == []
        store.add_station(run, make_station(0))
        assert ro.station_indices(run) == [0]
        with pytest.raises(StoreReadOnlyError, match=str(store.state_dir)):
            ro.add_station(run, make_station(1))
        with pytest.raises(StoreReadOnlyError):
            ro.create_run("base_frame", {}, config_sha256=SHA, devices={})
    assert store.station_indices(run) == [0]
    with pytest.raises(StoreError, match="no cellcal database"):
        Store(store.state_dir / "elsewhere", read_only=True).open()


# ---- full disk and read-only state directory -------------------------------------------


def _seed_previous_data(store):
    run = new_run(store)
    for i in range(3):
        store.add_station(run, make_station(i))
    rid = store.add_result(run, "base_frame", {"solver": "s"}, {}, activate=True)
    return run, rid


def _assert_previous_data_intact(store, run, rid, n_stations=3):
    assert store.settings()["integrity_check"] == "ok"
    got = store.stations(run)
    assert [s.plan_index for s in got] == list(range(n_stations))
    assert all(same_station(s, make_station(s.plan_index, raw_bytes=len(s.raw.get("padding", "")))) for s in got)
    assert store.active_result().id == rid


def test_full_disk_gives_store_full_error_and_keeps_data(tmp_path):
    """Real ENOSPC when a tmpfs can be mounted (root): a 1 MiB tmpfs is filled by storing
    stations with 20 kB of raw samples until SQLite reports SQLITE_FULL; the failing station
    must raise StoreFullError naming the directory, leave every committed station and the
    active result intact, and the *same open store* must accept the station once the file
    system is grown (``remount,size=``). Then a fresh store on an already full file system
    must fail to open with StoreFullError. Without mount rights the test falls back to
    ``PRAGMA max_page_count`` on the store's connection, which makes SQLite return the same
    SQLITE_FULL code through the same translation path."""
    with small_tmpfs(tmp_path, 1024) as mnt:
        base = mnt if mnt is not None else tmp_path
        s = Store(base / "state").open()
        try:
            run, rid = _seed_previous_data(s)
            if mnt is None:
                (pages,) = s._conn.execute("PRAGMA page_count").fetchone()
                s._conn.execute(f"PRAGMA max_page_count = {pages + 40}")
            i = 3
            with pytest.raises(StoreFullError, match=r"state directory .*full") as ei:
                while i < 500:
                    s.add_station(run, make_station(i, raw_bytes=20_000))
                    i += 1
            assert str(base / "state") in str(ei.value) and isinstance(ei.value, CellcalError)
            assert ei.value.__cause__.sqlite_errorname == "SQLITE_FULL"
            assert i > 3  # some stations fitted before the disk filled
            _assert_previous_data_intact(s, run, rid, n_stations=i)
            if mnt is not None:
                remount(mnt, "size=16m")
            else:
                s._conn.execute("PRAGMA max_page_count = 1073741823")
            s.add_station(run, make_station(i, raw_bytes=20_000))
            assert s.station_indices(run)[-1] == i
        finally:
            s.close()
        with Store(base / "state") as s:
            _assert_previous_data_intact(s, run, rid, n_stations=i + 1)
        if mnt is not None:
            fill_filesystem(mnt)
            with pytest.raises(StoreFullError, match=str(mnt / "fresh")):
                Store(mnt / "fresh").open()


def test_read_only_state_directory_gives_store_read_only_error_and_keeps_data(tmp_path):
    """Real EROFS when a tmpfs can be mounted (root, where chmod stops nothing): the store
    is written, closed, and the file system remounted read-only. Opening it must raise
    StoreReadOnlyError naming the directory (the write every open makes fails with
    SQLITE_READONLY; SQLITE_CANTOPEN when the -shm file is gone is recognised as read-only
    via statvfs), creating a new state directory
    there too (mkdir EROFS), and a ``read_only=True`` store must still read every station
    and the active result. After ``remount,rw`` the data is intact and writable.

    Fallbacks: no mount rights -> chmod 0555 on the directories when that binds (not
    root; same checks, except that a reader cannot open the WAL database either). Root
    without mount rights (a container without CAP_SYS_ADMIN)
    -> the database opened with a ``mode=ro`` URI and ``PRAGMA query_only``: SQLite then
    refuses each write with SQLITE_READONLY, which must surface as StoreReadOnlyError."""
    with small_tmpfs(tmp_path, 4096) as mnt:
        base = mnt if mnt is not None else tmp_path / "dir"
        base.mkdir(exist_ok=True)
        state = base / "state"
        with Store(state) as s:
            run, rid = _seed_previous_data(s)
        if mnt is not None:
            how = "tmpfs"
            remount(mnt, "ro")
        else:
            os.chmod(state, 0o555)
            os.chmod(base, 0o555)
            how = "chmod"
            if os.access(state, os.W_OK):  # root (CAP_DAC_OVERRIDE): chmod binds nothing
                os.chmod(base, 0o755)
                os.chmod(state, 0o755)
                how = "mode=ro"
        try:
            if how != "mode=ro":
                with pytest.raises(StoreReadOnlyError, match=rf"state directory {state}.*read-only"):
                    Store(state).open()
                with pytest.raises(StoreReadOnlyError, match=str(base / "new")):
                    Store(base / "new").open()
            if how == "chmod":
                # No -shm file and no right to create one: a WAL reader cannot start, and
                # "immutable" is only safe on a read-only *mount* (another user may write).
                with pytest.raises(StoreReadOnlyError, match=str(state)):
                    Store(state, read_only=True).open()
            else:
                with Store(state, read_only=True) as ro:
                    _assert_previous_data_intact(ro, run, rid)
                    with pytest.raises(StoreReadOnlyError, match=rf"state directory {state}.*adding station 3"):
                        ro.add_station(run, make_station(3))
                    with pytest.raises(StoreReadOnlyError):
                        ro.activate_result(rid)
                    _assert_previous_data_intact(ro, run, rid)
        finally:
            if how == "tmpfs":
                remount(mnt, "rw")
            elif how == "chmod":
                os.chmod(base, 0o755)
                os.chmod(state, 0o755)
        with Store(state) as s:
            _assert_previous_data_intact(s, run, rid)
            s.add_station(run, make_station(3))  # writable again
