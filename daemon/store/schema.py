"""The store's SQLite schema, its version, and the migrations that bring an older file up to it."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from cellcal.daemon.store.errors import StoreError

__all__ = ["SCHEMA_VERSION", "MIGRATIONS", "migrate"]


# --------------------------------------------------------------------------------------
# Schema and migrations

SCHEMA_VERSION = 2

# version -> (description, statements). A migration runs in one transaction with the
# version row it inserts, so a crash mid-migration leaves the previous version intact.
# Never edit a released step: add the next one.
MIGRATIONS: dict[int, tuple[str, Sequence[str]]] = {
    1: (
        "initial schema: runs, stations, rejections, results, activations, drift checks",
        (
            """CREATE TABLE store_meta (
                key   TEXT PRIMARY KEY,
                value TEXT NOT NULL
            )""",
            """CREATE TABLE runs (
                id               INTEGER PRIMARY KEY,
                kind             TEXT NOT NULL CHECK (kind <> ''),
                status           TEXT NOT NULL
                                 CHECK (status IN ('capturing', 'solving', 'done', 'failed', 'aborted')),
                status_reason    TEXT NOT NULL DEFAULT '',
                plan_json        TEXT NOT NULL,
                config_sha256    TEXT NOT NULL,
                devices_json     TEXT NOT NULL,
                parent_result_id INTEGER REFERENCES results(id),
                created_utc      TEXT NOT NULL,
                updated_utc      TEXT NOT NULL
            )""",
            # Scalar floats have no declared type on purpose: see the module docstring.
            """CREATE TABLE stations (
                id                        INTEGER PRIMARY KEY,
                run_id                    INTEGER NOT NULL REFERENCES runs(id),
                plan_index                INTEGER NOT NULL CHECK (plan_index >= 0),
                base_T_flange             BLOB NOT NULL CHECK (length(base_T_flange) = 128),
                q_rad                     BLOB NOT NULL CHECK (length(q_rad) % 8 = 0),
                cell_T_target             BLOB CHECK (cell_T_target IS NULL OR length(cell_T_target) = 128),
                cell_p_target             BLOB CHECK (cell_p_target IS NULL OR length(cell_p_target) = 24),
                tracker_std_translation_m NOT NULL CHECK (typeof(tracker_std_translation_m) = 'real'),
                tracker_std_rotation_rad  CHECK (tracker_std_rotation_rad IS NULL
                                                 OR typeof(tracker_std_rotation_rad) = 'real'),
                sample_count              INTEGER NOT NULL,
                robot_t_device_s          NOT NULL CHECK (typeof(robot_t_device_s) = 'real'),
                robot_t_host_ns           INTEGER NOT NULL,
                tracker_t_device_s        NOT NULL CHECK (typeof(tracker_t_device_s) = 'real'),
                tracker_t_host_ns         INTEGER NOT NULL,
                settle_json               TEXT NOT NULL,
                raw_json                  TEXT NOT NULL,
                accepted_host_ns          INTEGER NOT NULL,
                stored_utc                TEXT NOT NULL,
                UNIQUE (run_id, plan_index)
            )""",
            """CREATE TABLE rejections (
                id           INTEGER PRIMARY KEY,
                run_id       INTEGER NOT NULL REFERENCES runs(id),
                plan_index   INTEGER NOT NULL,
                reason       TEXT NOT NULL CHECK (reason <> ''),
                detail_json  TEXT NOT NULL,
                recorded_utc TEXT NOT NULL
            )""",
            "CREATE INDEX rejections_by_run ON rejections(run_id, id)",
            """CREATE TABLE results (
                id               INTEGER PRIMARY KEY,
                run_id           INTEGER REFERENCES runs(id),
                kind             TEXT NOT NULL CHECK (kind <> ''),
                result_json      TEXT NOT NULL,
                provenance_json  TEXT NOT NULL,
                parent_result_id INTEGER REFERENCES results(id),
                valid_from_utc   TEXT NOT NULL,
                created_utc      TEXT NOT NULL,
                active           INTEGER NOT NULL DEFAULT 0 CHECK (active IN (0, 1)),
                suspect          INTEGER NOT NULL DEFAULT 0 CHECK (suspect IN (0, 1)),
                suspect_reason   TEXT NOT NULL DEFAULT '',
                suspect_utc      TEXT
            )""",
            # At most one active result, enforced by the database, not by care.
            "CREATE UNIQUE INDEX results_one_active ON results(active) WHERE active = 1",
            """CREATE TABLE activations (
                id                 INTEGER PRIMARY KEY,
                result_id          INTEGER NOT NULL REFERENCES results(id),
                previous_result_id INTEGER REFERENCES results(id),
                reason             TEXT NOT NULL DEFAULT '',
                activated_utc      TEXT NOT NULL
            )""",
            """CREATE TABLE drift_checks (
                id           INTEGER PRIMARY KEY,
                result_id    INTEGER NOT NULL REFERENCES results(id),
                record_json  TEXT NOT NULL,
                recorded_utc TEXT NOT NULL
            )""",
            "CREATE INDEX drift_checks_by_result ON drift_checks(result_id, id)",
        ),
    ),
    # A camera station's frame and detection (StationRecord.camera, ADR 0030); what
    # station_column_ddl(StationRecord, "camera") writes (tests/test_camera_store.py checks).
    2: (
        "stations: camera_json (a camera station's frame, detection and image)",
        ("ALTER TABLE stations ADD COLUMN camera_json TEXT",),
    ),
}


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def migrate(conn: sqlite3.Connection, migrations: dict[int, tuple[str, Sequence[str]]] | None = None) -> int:
    """Bring the schema of an open connection up to the newest of ``migrations``.

    All missing steps run in one ``BEGIN IMMEDIATE`` transaction together with their
    ``schema_version`` rows: a failure or a crash leaves the database at its old version.

    Parameters
    ----------
    conn : sqlite3.Connection
        Opened with ``isolation_level=None`` (explicit transactions).
    migrations : dict, optional
        ``version -> (description, statements)``; default :data:`MIGRATIONS`.

    Returns
    -------
    int
        The schema version now in the database.

    Raises
    ------
    StoreError
        The database is newer than every migration known here (a downgrade).
    sqlite3.Error
        From a failing statement (the transaction is rolled back first).
    """
    steps: Mapping[int, tuple[str, Sequence[str]]] = MIGRATIONS if migrations is None else migrations
    target = max(steps)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_utc TEXT NOT NULL)"
        )
        (current,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
        if current > target:
            raise StoreError(
                f"database schema version {current} is newer than this cellcal knows ({target}); "
                "refusing to use it (install the newer cellcal, or restore a backup)"
            )
        for version in sorted(v for v in steps if v > current):
            description, statements = steps[version]
            for sql in statements:
                conn.execute(sql)
            conn.execute(
                "INSERT INTO schema_version(version, description, applied_utc) VALUES (?, ?, ?)",
                (version, description, _utc_now()),
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return max(current, target)
