"""The daemon's durable state: runs, stations, results and drift checks in SQLite.

One SQLite file, ``cellcal.sqlite3``, in the state directory (systemd's
``StateDirectory``). Promises (docs/protocols/zeromq.md; ADR 0012):

* **No accepted station is ever lost.** ``add_station`` is one ``BEGIN IMMEDIATE ...
  COMMIT`` in WAL mode with ``synchronous=FULL``: when it returns, the station is in the
  fsynced WAL and survives ``kill -9`` or power loss; when the process dies before it
  returns, the station is either wholly there or wholly absent, never half written.
* **None is duplicated.** ``(run_id, plan_index)`` is unique. After a crash the daemon may
  not know whether the station it was storing got committed; re-adding it raises the typed
  :class:`DuplicateStation` instead of writing a second row, so "resume from what I last
  saw" is safe. :meth:`Store.station_indices` says exactly what is committed.
* **A damaged store is never re-initialised.** A new database is built under a temporary
  name and linked into place complete, so ``cellcal.sqlite3`` is either absent (then
  created) or a whole cellcal database; a file that is empty, not SQLite, or SQLite without
  cellcal's schema raises :class:`StoreCorruptError` at open and is left for inspection.
* **Resources fail loudly and leave data intact.** A full disk raises
  :class:`StoreFullError`, a read-only directory or database :class:`StoreReadOnlyError`;
  the failed transaction is rolled back, committed data stays readable, and the same open
  store works again once space is freed.

Schema (version 1; ``schema_version`` records every migration applied)::

    schema_version(version PK, description, applied_utc)
    store_meta(key PK, value)                      -- created_utc, last_opened_utc
    runs(id PK, kind, status, status_reason, plan_json, config_sha256, devices_json,
         parent_result_id -> results, created_utc, updated_utc)
    stations(id PK, run_id -> runs, plan_index, UNIQUE(run_id, plan_index),
         base_T_flange BLOB(128), q_rad BLOB(8n), cell_T_target BLOB(128)?, cell_p_target BLOB(24)?,
         tracker_std_translation_m, tracker_std_rotation_rad?, sample_count,
         robot_t_device_s, robot_t_host_ns, tracker_t_device_s, tracker_t_host_ns,
         settle_json, raw_json, accepted_host_ns, stored_utc)
    rejections(id PK, run_id -> runs, plan_index, reason, detail_json, recorded_utc)
    results(id PK, run_id -> runs?, kind, result_json, provenance_json,
         parent_result_id -> results?, valid_from_utc, created_utc,
         active 0/1 (partial UNIQUE index: at most one row has active = 1),
         suspect 0/1, suspect_reason, suspect_utc)
    activations(id PK, result_id -> results, previous_result_id?, reason, activated_utc)
    drift_checks(id PK, result_id -> results, record_json, recorded_utc)

The ``stations`` columns are :class:`StationRecord`'s fields (what the capture engine
returns is what is stored): the column list, the INSERT and the row decoder are derived from
the field types by :func:`station_columns`, so a new field is one edit of the record plus a
migration (:func:`station_column_ddl`); the CREATE TABLE of migration 1 stays as released.

Storage choices, and why:

* Arrays are little-endian float64 bytes: bit-exact (NaN payloads, ``-0.0``, subnormals)
  and 128 bytes per pose.
* Scalar float columns have no declared type (BLOB affinity): a ``REAL`` column stores
  integral values as integers and gives ``-0.0`` back as ``0.0``. A ``CHECK (typeof(...))``
  keeps them floats.
* Dicts are JSON (``allow_nan=False``: NaN is not JSON, clients parse this); Python writes
  floats with ``repr``, so they round-trip exactly. Keys must be strings to round-trip.
* Wall-clock UTC stamps (``*_utc``, ISO 8601) are for people and provenance only; device
  and host times are the monotonic stamps the capture engine supplies.

Thread safety: one connection opened with ``check_same_thread=False`` and every call under
one re-entrant lock, so a second thread (the ZeroMQ command handler) may read or write.
Another process may open the same file (WAL lets readers run beside the writer), e.g. with
``Store(dir, read_only=True)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import sqlite3
import threading
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from cellcal.solver.errors import CellcalError

__all__ = [
    "DB_FILENAME",
    "SCHEMA_VERSION",
    "MIGRATIONS",
    "FRAME_CONVENTION",
    "RunStatus",
    "Store",
    "RunRecord",
    "StationRecord",
    "StationColumn",
    "station_columns",
    "station_column_ddl",
    "RejectionRecord",
    "ResultRecord",
    "DriftCheckRecord",
    "ActivationRecord",
    "StoreError",
    "StoreFullError",
    "StoreReadOnlyError",
    "StoreCorruptError",
    "DuplicateStation",
    "UnknownRecord",
    "RunClosed",
    "migrate",
]

DB_FILENAME = "cellcal.sqlite3"
_SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file

# The convention every stored transform follows (ADR 0001); a provenance default, so a result
# read years later still says what its matrices mean.
FRAME_CONVENTION = "a_T_b maps coordinates in frame b to frame a; SI units; quaternion w,x,y,z with w >= 0"

# Seconds a writer waits for another process's write lock before SQLITE_BUSY.
_BUSY_TIMEOUT_S = 10.0


# --------------------------------------------------------------------------------------
# Errors


class StoreError(CellcalError):
    """The store could not do what was asked.

    Attributes
    ----------
    state_dir : pathlib.Path or None
        The state directory the store lives in (also named in the message).
    """

    def __init__(self, message: str, *, state_dir: Path | None = None) -> None:
        self.state_dir = state_dir
        super().__init__(message)


class StoreFullError(StoreError):
    """The disk (or the database's size limit) is full; the write was rolled back."""


class StoreReadOnlyError(StoreError):
    """The state directory or the database cannot be written; nothing was changed."""


class StoreCorruptError(StoreError):
    """The file is not a cellcal database or SQLite found it damaged."""


class DuplicateStation(StoreError):
    """The run already holds a station for this plan index (committed before a crash).

    Attributes
    ----------
    run_id, plan_index : int
    """

    def __init__(self, message: str, *, run_id: int, plan_index: int, state_dir: Path | None = None) -> None:
        self.run_id = run_id
        self.plan_index = plan_index
        super().__init__(message, state_dir=state_dir)


class UnknownRecord(StoreError, LookupError):
    """No run, result or station with the id given.

    Attributes
    ----------
    table : str
        ``"run"`` or ``"result"``.
    record_id : int
    """

    def __init__(self, table: str, record_id: int, *, state_dir: Path | None = None) -> None:
        self.table = table
        self.record_id = record_id
        super().__init__(f"no {table} with id {record_id} in the store in {state_dir}", state_dir=state_dir)


class RunClosed(StoreError):
    """The run has finished (done, failed or aborted) and takes no more stations or status changes."""


# --------------------------------------------------------------------------------------
# Records


class RunStatus(StrEnum):
    """Life cycle of a run. ``capturing``/``solving`` are open (resumed after a crash)."""

    CAPTURING = "capturing"
    SOLVING = "solving"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"


_OPEN_STATUSES = (RunStatus.CAPTURING, RunStatus.SOLVING)


@dataclass(frozen=True)
class RunRecord:
    """One calibration (or check) run.

    Attributes
    ----------
    id : int
    kind : str
        ``"base_frame"``, ``"tool_point"``, ``"hand_eye"``, ...
    status : RunStatus
    status_reason : str
        Why the run ended (or "" while it is open).
    plan : dict
        The station plan as the capture engine gave it.
    config_sha256 : str
    devices : dict
        Device identities (model, serial, firmware) at the start of the run.
    parent_result_id : int or None
        The result this run recalibrates, if any.
    created_utc, updated_utc : str
        ISO 8601 UTC wall-clock stamps (for people, not for timing).
    n_stations : int
        Stations committed so far.
    """

    id: int
    kind: str
    status: RunStatus
    status_reason: str
    plan: dict[str, Any]
    config_sha256: str
    devices: dict[str, Any]
    parent_result_id: int | None
    created_utc: str
    updated_utc: str
    n_stations: int

    @property
    def is_open(self) -> bool:
        """True while capturing or solving (a run to resume after a crash)."""
        return self.status in _OPEN_STATUSES


def _frozen_array(value: Any, name: str, shape: tuple[int, ...] | None, plan_index: Any) -> np.ndarray:
    a = np.array(value, dtype=np.float64)  # a copy: the caller may reuse its buffer
    if shape is not None and a.shape != shape:
        raise ValueError(f"station {plan_index}: {name} must have shape {shape}, got {a.shape}")
    if shape is None and a.ndim != 1:
        raise ValueError(f"station {plan_index}: {name} must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"station {plan_index}: {name} contains NaN or inf")
    a.flags.writeable = False
    return a


def _finite_float(value: Any, name: str, plan_index: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"station {plan_index}: {name} must be a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"station {plan_index}: {name} must be finite, got {f!r}")
    return f


def _int(value: Any, name: str, plan_index: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"station {plan_index}: {name} must be an integer, got {value!r}")
    i = int(value)
    if not -(2**63) <= i < 2**63:
        raise ValueError(f"station {plan_index}: {name} does not fit in 64 bits: {i}")
    return i


def _field(*, shape: tuple[int, ...] | None = None, minimum: float | None = None, **kw: Any) -> Any:
    """A station field with what its codec needs: an array's ``shape`` (None: 1-D of any
    length), a number's ``minimum``."""
    return field(metadata={"shape": shape, "min": minimum}, **kw)


@dataclass(frozen=True, eq=False)
class StationRecord:
    """One accepted station: the robot state and the tracker measurement taken at rest.

    The capture engine (``cellcal.daemon.capture``) returns it, the store persists it as it
    is: this class is the one definition of a station. Its fields *are* the ``stations``
    table's columns (:func:`station_columns`): the column list, the INSERT and the row
    decoder are derived from the field types (arrays as float64 little-endian blobs, floats
    with a ``typeof = 'real'`` check, ints, JSON dicts in ``<name>_json``). Adding a field is
    one edit here plus a migration (:func:`station_column_ddl` writes its ``ALTER TABLE``).

    Arrays are copied to float64 and made read-only on construction; every field is
    validated here so a bad station fails where it is built, naming its plan index.

    Attributes
    ----------
    plan_index : int
        Position in the run's station plan (in ``observe`` mode: the capture sequence number).
    base_T_flange : numpy.ndarray, shape (4, 4)
        Flange pose from the controller's forward kinematics, metres.
    q_rad : numpy.ndarray, shape (n,)
        Joint angles, radians.
    cell_T_target : numpy.ndarray, shape (4, 4), or None
        6-DoF tracker measurement, metres (None for a 3-DoF tracker, or for a robot-only
        station such as a pivot/tool-point run).
    cell_p_target : numpy.ndarray, shape (3,), or None
        3-DoF tracker measurement, metres (None if only the pose was measured, or for a
        robot-only station).
    tracker_std_translation_m : float
    tracker_std_rotation_rad : float or None
    sample_count : int
        Tracker samples averaged into the measurement (0 for a robot-only station).
    robot_t_device_s, tracker_t_device_s : float
        Raw device clock stamps, seconds.
    robot_t_host_ns, tracker_t_host_ns : int
        The same instants mapped to host ``time.monotonic_ns()``.
    settle : dict
        Settle figures (dwell, max joint speed, TCP speed, thresholds ...), SI units.
    raw : dict
        Raw samples, JSON-serialisable (string keys, finite floats).
    accepted_host_ns : int
        Host ``time.monotonic_ns()`` when the capture engine accepted the station.
    """

    plan_index: int = _field(minimum=0)
    base_T_flange: np.ndarray = _field(shape=(4, 4))
    q_rad: np.ndarray = _field(shape=None)
    cell_T_target: np.ndarray | None = _field(shape=(4, 4))
    cell_p_target: np.ndarray | None = _field(shape=(3,))
    tracker_std_translation_m: float = _field(minimum=0.0)
    tracker_std_rotation_rad: float | None = _field(minimum=0.0)
    sample_count: int = _field(minimum=0)
    robot_t_device_s: float = _field()
    robot_t_host_ns: int = _field()
    tracker_t_device_s: float = _field()
    tracker_t_host_ns: int = _field()
    settle: dict[str, Any] = _field()
    raw: dict[str, Any] = _field()
    accepted_host_ns: int = _field()

    def __post_init__(self) -> None:
        idx = self.plan_index
        for col in station_columns(type(self)):
            object.__setattr__(self, col.name, col.validate(getattr(self, col.name), idx))


# --------------------------------------------------------------------------------------
# The station codec: field type -> column


@dataclass(frozen=True)
class StationColumn:
    """How one :class:`StationRecord` field is validated, stored and read back.

    Attributes
    ----------
    name : str
        The dataclass field.
    column : str
        The ``stations`` column (``name``, or ``name_json`` for a dict).
    kind : str
        ``"int"``, ``"float"``, ``"str"``, ``"array"`` or ``"json"``.
    nullable : bool
        The annotation is ``X | None``.
    shape : tuple or None
        Arrays: the required shape (None: 1-D of any length).
    minimum : float or None
        Numbers: the smallest value allowed.
    """

    name: str
    column: str
    kind: str
    nullable: bool
    shape: tuple[int, ...] | None = None
    minimum: float | None = None

    def validate(self, value: Any, plan_index: Any) -> Any:
        """The value as stored (arrays: read-only float64 copies); ``ValueError`` naming the station."""
        if value is None:
            if self.nullable:
                return None
            raise ValueError(f"station {plan_index}: {self.name} must not be None")
        if self.kind == "int":
            out: Any = _int(value, self.name, plan_index)
        elif self.kind == "float":
            out = _finite_float(value, self.name, plan_index)
        elif self.kind == "array":
            return _frozen_array(value, self.name, self.shape, plan_index)
        elif self.kind == "json":
            if not isinstance(value, dict):
                raise ValueError(f"station {plan_index}: {self.name} must be a dict, got {type(value).__name__}")
            return value
        else:
            if not isinstance(value, str):
                raise ValueError(f"station {plan_index}: {self.name} must be a string, got {value!r}")
            return value
        if self.minimum is not None and out < self.minimum:
            raise ValueError(f"station {plan_index}: {self.name} must be >= {self.minimum:g}, got {out!r}")
        return out

    def encode(self, value: Any, plan_index: Any) -> Any:
        """The SQLite value of an already validated field."""
        if value is None:
            return None
        if self.kind == "array":
            return _blob(value)
        if self.kind == "json":
            return _to_json(value, f"station {plan_index} {self.name}")
        return value

    def decode(self, value: Any) -> Any:
        """The field value of a column read back (validated again by the record)."""
        if value is None:
            return None
        if self.kind == "array":
            return _array(value, self.shape)
        if self.kind == "json":
            return json.loads(value)
        return value

    def ddl(self, default: Any = None) -> str:
        """The column definition (type, NOT NULL, CHECK) as migration 1 writes it."""
        c = self.column
        sql_type = {"int": "INTEGER", "float": "", "str": "TEXT", "array": "BLOB", "json": "TEXT"}[self.kind]
        checks = []
        if self.kind == "float":
            checks.append(f"typeof({c}) = 'real'")
        if self.kind == "array" and self.shape is not None:
            checks.append(f"length({c}) = {8 * math.prod(self.shape)}")
        elif self.kind == "array":
            checks.append(f"length({c}) % 8 = 0")
        parts = [c] + ([sql_type] if sql_type else [])
        if not self.nullable:
            parts.append("NOT NULL")
        if default is not None:
            parts.append(f"DEFAULT {_sql_literal(default)}")
        if checks:
            cond = " AND ".join(checks)
            parts.append(f"CHECK ({c} IS NULL OR {cond})" if self.nullable else f"CHECK ({cond})")
        return " ".join(parts)


def _sql_literal(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"no SQL literal for a default of {v!r}")
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"a float column's default must be finite, got {v!r}")
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def _column_kind(tp: Any) -> tuple[str, bool]:
    """``(kind, nullable)`` of a field annotation."""
    args = typing.get_args(tp)
    nullable = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        nullable = len(rest) < len(args)
        if len(rest) != 1:
            raise TypeError(f"no station column for {tp!r}")
        tp = rest[0]
    origin = typing.get_origin(tp) or tp
    if origin is bool:
        raise TypeError("no station column for bool (store an int)")
    kinds = {int: "int", float: "float", str: "str", np.ndarray: "array", dict: "json"}
    if origin not in kinds:
        raise TypeError(f"no station column for {tp!r}")
    return kinds[origin], nullable


_COLUMNS: dict[type, tuple[StationColumn, ...]] = {}


def station_columns(cls: type = StationRecord) -> tuple[StationColumn, ...]:
    """The ``stations`` columns of a station record class, in field order.

    Every dataclass field of ``cls`` is one column (see :class:`StationColumn`); the table
    also has ``id``, ``run_id`` and ``stored_utc``, which are the store's, not the station's.
    """
    cached = _COLUMNS.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind, nullable = _column_kind(hints[f.name])
        out.append(StationColumn(
            name=f.name, column=f"{f.name}_json" if kind == "json" else f.name, kind=kind, nullable=nullable,
            shape=f.metadata.get("shape"), minimum=f.metadata.get("min"),
        ))
    _COLUMNS[cls] = tuple(out)
    return _COLUMNS[cls]


def station_column_ddl(cls: type, name: str) -> str:
    """The ``ALTER TABLE stations ADD COLUMN ...`` that a migration adding field ``name`` runs.

    A new column must be nullable (``X | None``) or have a scalar default, so the stations
    already stored get a value.
    """
    col = next((c for c in station_columns(cls) if c.name == name), None)
    if col is None:
        raise ValueError(f"{cls.__name__} has no field {name!r}")
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    default = None if f.default is dataclasses.MISSING else f.default
    if not col.nullable and default is None:
        raise ValueError(f"{cls.__name__}.{name}: a column added to a table with rows must be nullable or have a default")
    return f"ALTER TABLE stations ADD COLUMN {col.ddl(default)}"


@dataclass(frozen=True)
class RejectionRecord:
    """A capture the engine refused, with its reason (``not_settled``, ``tracker_std``, ...)."""

    id: int
    run_id: int
    plan_index: int
    reason: str
    detail: dict[str, Any]
    recorded_utc: str


@dataclass(frozen=True)
class ResultRecord:
    """One stored calibration result (versioned by ``id``).

    Attributes
    ----------
    id : int
    run_id : int or None
    kind : str
    result : dict
        The JSON-ready wire dict (``cellcal.daemon.report.result_to_wire``).
    provenance : dict
        ``config_sha256``, ``devices``, ``cellcal_version``, ``solver``,
        ``frame_convention``, ``valid_from`` (ISO 8601 UTC), ``parent_result_id``,
        ``run_id``, plus whatever the caller added.
    parent_result_id : int or None
    valid_from_utc, created_utc : str
    active : bool
        True for the one result clients use (at most one is active).
    suspect : bool
    suspect_reason : str
    suspect_utc : str or None
    """

    id: int
    run_id: int | None
    kind: str
    result: dict[str, Any]
    provenance: dict[str, Any]
    parent_result_id: int | None
    valid_from_utc: str
    created_utc: str
    active: bool
    suspect: bool
    suspect_reason: str
    suspect_utc: str | None

    def to_export_dict(self) -> dict[str, Any]:
        """The result file's content: id, kind, the wire result, provenance and status."""
        return {
            "result_id": self.id,
            "kind": self.kind,
            **self.result,
            "provenance": self.provenance,
            "active": self.active,
            "suspect": self.suspect,
            "suspect_reason": self.suspect_reason,
        }


@dataclass(frozen=True)
class DriftCheckRecord:
    """One heartbeat drift check of a result (deviation, thresholds, CUSUM ...)."""

    id: int
    result_id: int
    record: dict[str, Any]
    recorded_utc: str


@dataclass(frozen=True)
class ActivationRecord:
    """One change of the active result (for audit and roll back)."""

    id: int
    result_id: int
    previous_result_id: int | None
    reason: str
    activated_utc: str


# --------------------------------------------------------------------------------------
# Schema and migrations

SCHEMA_VERSION = 1

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


# --------------------------------------------------------------------------------------
# Encoding


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays appear in settle figures and raw samples; write them as the
    # plain numbers they are (float(np.float64) is exact, so the round trip stays exact).
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def _to_json(obj: Any, what: str) -> str:
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":"), default=_json_default)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: not storable as JSON ({exc})") from exc


def _blob(a: np.ndarray | None) -> bytes | None:
    return None if a is None else np.ascontiguousarray(a, dtype="<f8").tobytes()


def _array(b: bytes | None, shape: tuple[int, ...] | None) -> np.ndarray | None:
    if b is None:
        return None
    a = np.frombuffer(b, dtype="<f8").astype(np.float64)  # astype: a writable native copy
    return a if shape is None else a.reshape(shape)


# --------------------------------------------------------------------------------------
# The store

_RUN_COLUMNS = (
    "id, kind, status, status_reason, plan_json, config_sha256, devices_json, parent_result_id,"
    " created_utc, updated_utc, (SELECT count(*) FROM stations s WHERE s.run_id = runs.id)"
)
_RESULT_COLUMNS = (
    "id, run_id, kind, result_json, provenance_json, parent_result_id, valid_from_utc, created_utc,"
    " active, suspect, suspect_reason, suspect_utc"
)

# Primary SQLite result codes (the low byte of an extended code).
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_AUTH, _SQLITE_NOTADB = 13, 14, 23, 26


def _cellcal_version() -> str:
    try:
        from importlib.metadata import version

        return version("cellcal")
    except Exception:  # not installed (running from a bare checkout): say so, do not fail
        return "unknown"


def _rowid(cur: sqlite3.Cursor) -> int:
    """The id of the row an INSERT just wrote."""
    if cur.lastrowid is None:  # pragma: no cover - only after a statement that inserted nothing
        raise StoreError("INSERT wrote no row")
    return int(cur.lastrowid)


def _check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive integer, got {limit!r}")
    return limit


def _check_id(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer id, got {value!r}")
    return int(value)


def _iso_utc(value: datetime | str | None) -> str:
    if value is None:
        return _utc_now()
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"valid_from must be ISO 8601 with a UTC offset, got {value!r}") from exc
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise ValueError(f"valid_from must be a timezone-aware datetime or ISO 8601 string, got {value!r}")
    return value.astimezone(UTC).isoformat(timespec="microseconds")


class Store:
    """cellcal's SQLite store in a state directory.

    Construction does no I/O; :meth:`open` creates the directory and the database, applies
    migrations and checks the store can be written (so a read-only state directory fails at
    start-up, not at the first accepted station). Use as a context manager or call
    :meth:`open`/:meth:`close` (both idempotent).

    Parameters
    ----------
    state_dir : str or pathlib.Path
        Directory holding ``cellcal.sqlite3`` (created by :meth:`open` if missing).
    read_only : bool, optional
        Open an existing database with ``mode=ro`` and ``PRAGMA query_only`` (for tools that
        read while the daemon runs); every write raises :class:`StoreReadOnlyError`.

    Examples
    --------
    >>> with Store(tmp) as store:                                       # doctest: +SKIP
    ...     run = store.create_run("base_frame", plan, config_sha256=h, devices=d)
    ...     store.add_station(run, station)
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        read_only: bool = False,
        station_type: type[StationRecord] = StationRecord,
        migrations: dict[int, tuple[str, Sequence[str]]] | None = None,
    ) -> None:
        if not (isinstance(station_type, type) and issubclass(station_type, StationRecord)):
            raise TypeError(f"station_type must be StationRecord or a subclass, got {station_type!r}")
        self.state_dir = Path(state_dir)
        self.path = self.state_dir / DB_FILENAME
        self.read_only = bool(read_only)
        self.station_type = station_type
        self._migrations: dict[int, tuple[str, Sequence[str]]] = dict(MIGRATIONS if migrations is None else migrations)
        self._station_cols = station_columns(station_type)
        names = ", ".join(c.column for c in self._station_cols)
        self._station_select = f"SELECT {names} FROM stations WHERE run_id = ? ORDER BY plan_index"
        self._station_insert = (
            f"INSERT INTO stations(run_id, {names}, stored_utc) VALUES ({', '.join('?' * (len(self._station_cols) + 2))})"
        )
        self._conn: sqlite3.Connection | None = None
        # Re-entrant: public methods call each other (add_result -> get_run) under the lock.
        self._lock = threading.RLock()
        # (SQLite data_version when read, the active result): see active_result
        self._active_cache: tuple[int, ResultRecord | None] | None = None

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"Store({str(self.state_dir)!r}, {state}{', read-only' if self.read_only else ''})"

    # ---- life cycle ------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self._conn is not None

    def open(self) -> Store:
        """Create or open the database, migrate it, and prove it is writable.

        Returns
        -------
        Store
            ``self``, so ``store = Store(d).open()`` works.

        Raises
        ------
        StoreReadOnlyError
            The directory or the database cannot be written (or, with ``read_only``, there
            is no database to read).
        StoreFullError
            No space to create or migrate the database.
        StoreCorruptError
            The file exists but is not a cellcal database: empty (0 bytes), not SQLite,
            SQLite without cellcal's schema, or damaged. It is left as it is; only a file
            that is absent is created (atomically: see the module docstring).
        StoreError
            Anything else, e.g. a schema newer than this cellcal.
        """
        with self._lock:
            if self._conn is not None:
                return self
            if self.read_only:
                if not self.path.exists():
                    raise StoreError(f"no cellcal database at {self.path}", state_dir=self.state_dir)
            else:
                try:
                    self.state_dir.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise self._os_error(exc, "creating the state directory") from exc
                if not os.path.lexists(self.path):
                    self._create()
            self._check_file()
            conn: sqlite3.Connection | None = None
            try:
                if self.read_only:
                    uri = self.path.resolve().as_uri() + "?mode=ro"
                    # On a read-only file system SQLite cannot create the -shm file a WAL
                    # reader needs. With no -wal file there is nothing beyond the main file
                    # to read and nobody can write, so "immutable" is exact; with a -wal
                    # file left by a crash, SQLite reads it read-only (3.22+) and we must not
                    # skip it.
                    wal = self.path.with_name(self.path.name + "-wal")
                    if self._fs_is_read_only() and not wal.exists():
                        uri += "&immutable=1"
                    conn = sqlite3.connect(
                        uri,
                        uri=True,
                        isolation_level=None,
                        check_same_thread=False,
                        timeout=_BUSY_TIMEOUT_S,
                    )
                    conn.execute("PRAGMA query_only = ON")
                    self._check_schema(conn)
                    (version,) = conn.execute("SELECT coalesce(max(version), 0) FROM schema_version").fetchone()
                    if version > max(self._migrations):
                        raise StoreError(
                            f"database schema version {version} is newer than this cellcal knows "
                            f"({max(self._migrations)})",
                            state_dir=self.state_dir,
                        )
                else:
                    conn = sqlite3.connect(
                        str(self.path), isolation_level=None, check_same_thread=False, timeout=_BUSY_TIMEOUT_S
                    )
                    self._check_schema(conn)  # before anything writes to the file
                    # WAL: a commit appends to one file and one fsync makes it durable;
                    # readers in other processes never block the writer.
                    (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
                    if str(mode).lower() != "wal":
                        raise StoreError(
                            f"could not switch {self.path} to WAL mode (got {mode!r}); the file "
                            "system may lack shared-memory support",
                            state_dir=self.state_dir,
                        )
                    # FULL: fsync the WAL at every commit, so a returned add_station survives
                    # power loss, not just a process crash (NORMAL would only promise the latter).
                    conn.execute("PRAGMA synchronous = FULL")
                conn.execute("PRAGMA foreign_keys = ON")
                if not self.read_only:
                    try:
                        migrate(conn, self._migrations)
                    except StoreError as exc:
                        raise StoreError(f"{exc} [state directory {self.state_dir}]", state_dir=self.state_dir) from exc
                    # A real write on every open: a read-only file or directory fails here,
                    # at start-up, with a clear error, instead of at the first station.
                    now = _utc_now()
                    conn.execute("BEGIN IMMEDIATE")
                    conn.execute("INSERT OR IGNORE INTO store_meta(key, value) VALUES ('created_utc', ?)", (now,))
                    conn.execute("INSERT OR REPLACE INTO store_meta(key, value) VALUES ('last_opened_utc', ?)", (now,))
                    conn.execute("COMMIT")
            except BaseException as exc:
                if conn is not None:
                    try:
                        conn.close()
                    except sqlite3.Error:
                        pass
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc, "opening the database") from exc
                raise
            self._conn = conn
            return self

    def _create(self) -> None:
        """Create a new, fully migrated database atomically: built under a temporary name,
        closed (checkpointed), fsynced and linked into place. So the store's file is either
        absent or a complete cellcal database, and a file that is anything else (zero bytes,
        another program's database) is damage to report, never a store to initialise."""
        tmp = self.path.with_name(self.path.name + ".creating")
        conn: sqlite3.Connection | None = None
        try:
            for leftover in (tmp, *(tmp.with_name(tmp.name + x) for x in ("-wal", "-shm", "-journal"))):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()  # a creation killed half way: never the real store
            conn = sqlite3.connect(str(tmp), isolation_level=None, timeout=_BUSY_TIMEOUT_S)
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()  # kept in the file header
            if str(mode).lower() != "wal":
                raise StoreError(
                    f"could not switch {tmp} to WAL mode (got {mode!r}); the file system may lack "
                    "shared-memory support",
                    state_dir=self.state_dir,
                )
            conn.execute("PRAGMA synchronous = FULL")
            migrate(conn, self._migrations)
            conn.close()  # the last connection checkpoints the WAL into the file and removes it
            conn = None
            if tmp.with_name(tmp.name + "-wal").exists():
                raise StoreError(f"{tmp}: the new database's WAL was not checkpointed", state_dir=self.state_dir)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.path)  # never replaces a store another process just made
                tmp.unlink()
            except FileExistsError:
                tmp.unlink()
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV):
                    raise
                os.replace(tmp, self.path)  # a file system without hard links
            dfd = os.open(self.state_dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except sqlite3.Error as exc:
            raise self._translate(exc, "creating the database") from exc
        except OSError as exc:
            raise self._os_error(exc, "creating the database") from exc
        finally:
            if conn is not None:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    def _check_file(self) -> None:
        """Refuse, untouched, a store file that cannot be a cellcal database."""
        try:
            st = os.stat(self.path)
            with open(self.path, "rb") as f:
                head = f.read(len(_SQLITE_MAGIC))
        except FileNotFoundError:
            if self.read_only:
                raise StoreError(f"no cellcal database at {self.path}", state_dir=self.state_dir) from None
            raise StoreCorruptError(
                f"state directory {self.state_dir}: {self.path.name} vanished while opening", state_dir=self.state_dir
            ) from None
        except OSError as exc:
            raise self._os_error(exc, f"reading {self.path.name}") from exc
        keep = "left as it is for inspection; move it away (or restore a backup) to start a new store"
        if st.st_size == 0:
            raise StoreCorruptError(
                f"state directory {self.state_dir}: {self.path.name} is empty (0 bytes), so it is not a cellcal "
                f"database (truncated or damaged; a new store is never created over it); {keep}",
                state_dir=self.state_dir,
            )
        if head != _SQLITE_MAGIC:
            raise StoreCorruptError(
                f"state directory {self.state_dir}: {self.path.name} is not an SQLite database "
                f"(starts with {head[:16]!r}); {keep}",
                state_dir=self.state_dir,
            )

    def _check_schema(self, conn: sqlite3.Connection) -> None:
        # Every store this code creates has schema_version from its first commit (see
        # _create): a database without it belongs to something else.
        (n,) = conn.execute(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        if not n:
            raise StoreCorruptError(
                f"state directory {self.state_dir}: {self.path.name} is an SQLite database without cellcal's "
                "schema_version table (another program's file, or damaged); left as it is for inspection",
                state_dir=self.state_dir,
            )

    def close(self) -> None:
        """Close the database (idempotent). Committed data is already durable."""
        with self._lock:
            conn, self._conn = self._conn, None
            self._active_cache = None
            if conn is None:
                return
            try:
                conn.close()
            except sqlite3.Error as exc:
                raise self._translate(exc, "closing the database") from exc

    def __enter__(self) -> Store:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def settings(self) -> dict[str, Any]:
        """The connection's durability settings and schema version, as SQLite reports them.

        Returns
        -------
        dict
            ``journal_mode`` (``"wal"``), ``synchronous`` (2 = FULL), ``foreign_keys`` (1),
            ``schema_version``, ``integrity_check`` (``"ok"``).
        """
        with self._read("reading settings") as conn:
            out: dict[str, Any] = {}
            for name in ("journal_mode", "synchronous", "foreign_keys"):
                (out[name],) = conn.execute(f"PRAGMA {name}").fetchone()
            (out["schema_version"],) = conn.execute("SELECT max(version) FROM schema_version").fetchone()
            out["integrity_check"] = "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
            return out

    def probe_write(self, nbytes: int = 16 * 1024) -> None:
        """Whether the store takes writes again (after a full disk, a read-only remount).

        Commits ``nbytes`` into ``store_meta`` (more than a station needs) and removes them
        again, two transactions like any others.

        Raises
        ------
        StoreFullError, StoreReadOnlyError, StoreError
            As any write would; nothing is left behind.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 < nbytes <= 1 << 24:
            raise ValueError(f"nbytes must be an integer in (0, 16 MiB], got {nbytes!r}")
        with self._write("probing whether the store takes writes") as conn:
            conn.execute("INSERT OR REPLACE INTO store_meta(key, value) VALUES ('write_probe', ?)", ("x" * nbytes,))
        with self._write("removing the write probe") as conn:
            conn.execute("DELETE FROM store_meta WHERE key = 'write_probe'")

    # ---- runs ------------------------------------------------------------------------

    def create_run(
        self,
        kind: str,
        plan: dict[str, Any],
        *,
        config_sha256: str,
        devices: dict[str, Any],
        parent_result_id: int | None = None,
    ) -> int:
        """Start a run in status ``capturing``.

        Parameters
        ----------
        kind : str
            ``"base_frame"``, ``"tool_point"``, ``"hand_eye"``, ...
        plan : dict
            The station plan (JSON-serialisable).
        config_sha256 : str
            Hash of the configuration file the daemon runs with.
        devices : dict
            Device identities (model, serial, firmware).
        parent_result_id : int, optional
            The result this run recalibrates.

        Returns
        -------
        int
            The new run id.
        """
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"run kind must be a non-empty string, got {kind!r}")
        if not isinstance(config_sha256, str):
            raise ValueError(f"config_sha256 must be a string, got {config_sha256!r}")
        plan_json = _to_json(plan, "run plan")
        devices_json = _to_json(devices, "run devices")
        with self._write("creating a run") as conn:
            if parent_result_id is not None:
                self._require(conn, "result", _check_id(parent_result_id, "parent_result_id"))
            now = _utc_now()
            cur = conn.execute(
                "INSERT INTO runs(kind, status, plan_json, config_sha256, devices_json, parent_result_id,"
                " created_utc, updated_utc) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (kind, RunStatus.CAPTURING.value, plan_json, config_sha256, devices_json, parent_result_id, now, now),
            )
            return _rowid(cur)

    def get_run(self, run_id: int) -> RunRecord:
        """The run with id ``run_id``; :class:`UnknownRecord` if there is none."""
        run_id = _check_id(run_id, "run_id")
        with self._read("reading a run") as conn:
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise UnknownRecord("run", run_id, state_dir=self.state_dir)
            return self._run(row)

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        """The ``limit`` most recent runs, newest first."""
        limit = _check_limit(limit)
        with self._read("listing runs") as conn:
            rows = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id DESC LIMIT ?", (limit,))
            return [self._run(r) for r in rows]

    def unfinished_runs(self) -> list[RunRecord]:
        """Runs still ``capturing`` or ``solving`` (interrupted by a crash), oldest first."""
        with self._read("listing unfinished runs") as conn:
            rows = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE status IN (?, ?) ORDER BY id",
                tuple(s.value for s in _OPEN_STATUSES),
            )
            return [self._run(r) for r in rows]

    def set_run_status(self, run_id: int, status: str | RunStatus, reason: str = "") -> None:
        """Move a run to ``status``.

        ``capturing`` and ``solving`` may follow each other freely; ``done``, ``failed`` and
        ``aborted`` are final.

        Raises
        ------
        ValueError
            ``status`` is not one of :class:`RunStatus`.
        UnknownRecord
            No such run.
        RunClosed
            The run already finished.
        """
        run_id = _check_id(run_id, "run_id")
        try:
            new = RunStatus(status)
        except ValueError:
            raise ValueError(
                f"run status must be one of {', '.join(s.value for s in RunStatus)}; got {status!r}"
            ) from None
        if not isinstance(reason, str):
            raise ValueError(f"reason must be a string, got {reason!r}")
        with self._write(f"setting the status of run {run_id}") as conn:
            self._require_open_run(conn, run_id, f"cannot set status {new.value!r}")
            conn.execute(
                "UPDATE runs SET status = ?, status_reason = ?, updated_utc = ? WHERE id = ?",
                (new.value, reason, _utc_now(), run_id),
            )

    # ---- stations --------------------------------------------------------------------

    def add_station(self, run_id: int, st: StationRecord) -> int:
        """Commit one accepted station in one transaction (durable when this returns).

        Returns
        -------
        int
            The station's row id.

        Raises
        ------
        DuplicateStation
            The run already has a station at ``st.plan_index`` (e.g. it was committed just
            before a crash); nothing was written.
        UnknownRecord, RunClosed
            No such run, or it has finished.
        StoreFullError, StoreReadOnlyError
            Nothing was written; earlier stations are intact.
        """
        run_id = _check_id(run_id, "run_id")
        if not isinstance(st, StationRecord):
            raise TypeError(f"add_station needs a StationRecord, got {type(st).__name__}")
        if not isinstance(st, self.station_type):
            raise TypeError(f"this store holds {self.station_type.__name__} stations, got {type(st).__name__}")
        # Encode before taking the write lock: a bad dict fails without touching the file.
        values = [c.encode(getattr(st, c.name), st.plan_index) for c in self._station_cols]
        with self._write(f"adding station {st.plan_index} to run {run_id}") as conn:
            self._require_open_run(conn, run_id, f"cannot add station {st.plan_index}")
            if conn.execute(
                "SELECT 1 FROM stations WHERE run_id = ? AND plan_index = ?", (run_id, st.plan_index)
            ).fetchone():
                raise DuplicateStation(
                    f"run {run_id} already has station {st.plan_index} (state directory {self.state_dir})",
                    run_id=run_id,
                    plan_index=st.plan_index,
                    state_dir=self.state_dir,
                )
            cur = conn.execute(self._station_insert, (run_id, *values, _utc_now()))
            conn.execute("UPDATE runs SET updated_utc = ? WHERE id = ?", (_utc_now(), run_id))
            return _rowid(cur)

    def stations(self, run_id: int) -> list[StationRecord]:
        """Every committed station of a run, in plan order."""
        run_id = _check_id(run_id, "run_id")
        with self._read(f"reading the stations of run {run_id}") as conn:
            self._require(conn, "run", run_id)
            rows = conn.execute(self._station_select, (run_id,)).fetchall()
        cols, cls = self._station_cols, self.station_type
        return [cls(**{c.name: c.decode(v) for c, v in zip(cols, r, strict=True)}) for r in rows]

    def station_indices(self, run_id: int) -> list[int]:
        """Plan indices committed for a run, ascending (cheap: for resuming after a crash)."""
        run_id = _check_id(run_id, "run_id")
        with self._read(f"reading the station indices of run {run_id}") as conn:
            self._require(conn, "run", run_id)
            rows = conn.execute("SELECT plan_index FROM stations WHERE run_id = ? ORDER BY plan_index", (run_id,))
            return [r[0] for r in rows]

    def add_rejection(self, run_id: int, plan_index: int, reason: str, detail: dict[str, Any]) -> int:
        """Record a refused capture and why (``detail``: the figures behind the reason).

        Raises
        ------
        UnknownRecord, RunClosed
        """
        run_id = _check_id(run_id, "run_id")
        plan_index = _check_id(plan_index, "plan_index")
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"rejection reason must be a non-empty string, got {reason!r}")
        detail_json = _to_json(detail, f"rejection detail of station {plan_index}")
        with self._write(f"recording a rejection in run {run_id}") as conn:
            self._require_open_run(conn, run_id, f"cannot record a rejection of station {plan_index}")
            cur = conn.execute(
                "INSERT INTO rejections(run_id, plan_index, reason, detail_json, recorded_utc) VALUES (?, ?, ?, ?, ?)",
                (run_id, plan_index, reason, detail_json, _utc_now()),
            )
            return _rowid(cur)

    def rejections(self, run_id: int) -> list[RejectionRecord]:
        """Every rejection of a run, in the order recorded."""
        run_id = _check_id(run_id, "run_id")
        with self._read(f"reading the rejections of run {run_id}") as conn:
            self._require(conn, "run", run_id)
            rows = conn.execute(
                "SELECT id, run_id, plan_index, reason, detail_json, recorded_utc FROM rejections"
                " WHERE run_id = ? ORDER BY id",
                (run_id,),
            ).fetchall()
        return [RejectionRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows]

    # ---- results ---------------------------------------------------------------------

    def add_result(
        self,
        run_id: int | None,
        kind: str,
        result: dict[str, Any],
        provenance: dict[str, Any],
        *,
        parent_result_id: int | None = None,
        activate: bool = False,
        valid_from: datetime | str | None = None,
    ) -> int:
        """Store a new result version, optionally making it the active one.

        Provenance keys the caller leaves out are filled in: ``run_id``,
        ``parent_result_id``, ``config_sha256`` and ``devices`` (from the run),
        ``cellcal_version``, ``solver`` and ``frame_convention`` (from ``result`` or
        :data:`FRAME_CONVENTION`), ``valid_from`` (``valid_from``, else
        ``provenance["valid_from"]``, else now, as ISO 8601 UTC).

        Parameters
        ----------
        run_id : int or None
            The run that produced it (None for a result imported from elsewhere).
        kind : str
        result : dict
            JSON-ready wire dict (``result_to_wire``).
        provenance : dict
        parent_result_id : int, optional
            The result this one supersedes.
        activate : bool, optional
            Make it the active result in the same transaction.
        valid_from : datetime or str, optional
            Timezone-aware; default now (wall clock, a human-facing stamp).

        Returns
        -------
        int
            The result id (its version).
        """
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"result kind must be a non-empty string, got {kind!r}")
        if not isinstance(result, dict) or not isinstance(provenance, dict):
            raise ValueError("result and provenance must be dicts")
        prov = dict(provenance)
        if "parent_result_id" in prov and prov["parent_result_id"] != parent_result_id:
            raise ValueError(
                f"provenance names parent result {prov['parent_result_id']!r} but parent_result_id is "
                f"{parent_result_id!r}"
            )
        vf = _iso_utc(valid_from if valid_from is not None else prov.get("valid_from"))
        result_json = _to_json(result, "result")
        with self._write("adding a result") as conn:
            if run_id is not None:
                run_id = _check_id(run_id, "run_id")
                run = conn.execute("SELECT config_sha256, devices_json FROM runs WHERE id = ?", (run_id,)).fetchone()
                if run is None:
                    raise UnknownRecord("run", run_id, state_dir=self.state_dir)
                prov.setdefault("config_sha256", run[0])
                prov.setdefault("devices", json.loads(run[1]))
            if parent_result_id is not None:
                parent_result_id = _check_id(parent_result_id, "parent_result_id")
                self._require(conn, "result", parent_result_id)
            prov["run_id"] = run_id
            prov["parent_result_id"] = parent_result_id
            prov["valid_from"] = vf
            prov.setdefault("cellcal_version", _cellcal_version())
            prov.setdefault("solver", result.get("solver", "unknown"))
            prov.setdefault("frame_convention", result.get("frame_convention", FRAME_CONVENTION))
            provenance_json = _to_json(prov, "result provenance")
            cur = conn.execute(
                "INSERT INTO results(run_id, kind, result_json, provenance_json, parent_result_id, valid_from_utc,"
                " created_utc) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (run_id, kind, result_json, provenance_json, parent_result_id, vf, _utc_now()),
            )
            result_id = _rowid(cur)
            if activate:
                self._activate(conn, result_id, "activated on creation")
            return result_id

    def get_result(self, result_id: int) -> ResultRecord:
        """The result with id ``result_id``; :class:`UnknownRecord` if there is none."""
        result_id = _check_id(result_id, "result_id")
        with self._read("reading a result") as conn:
            row = conn.execute(f"SELECT {_RESULT_COLUMNS} FROM results WHERE id = ?", (result_id,)).fetchone()
            if row is None:
                raise UnknownRecord("result", result_id, state_dir=self.state_dir)
            return self._result(row)

    def active_result(self) -> ResultRecord | None:
        """The result clients use now, or None before the first activation.

        Cached: every heartbeat, status and ``to_base`` asks for it, and it changes only by
        a write (activation, roll back, a suspect mark, a new active result). The cache is
        dropped by every write through this store and whenever SQLite's ``data_version``
        says another connection committed (another process, e.g. ``cellcal ctl`` on the
        same file), so a change is seen by the next call. The record returned is shared
        between callers: do not mutate its dicts.
        """
        with self._read("reading the active result") as conn:
            (data_version,) = conn.execute("PRAGMA data_version").fetchone()
            cached = self._active_cache
            if cached is not None and cached[0] == data_version:
                return cached[1]
            row = conn.execute(f"SELECT {_RESULT_COLUMNS} FROM results WHERE active = 1").fetchone()
            rec = None if row is None else self._result(row)
            self._active_cache = (data_version, rec)
            return rec

    def activate_result(self, result_id: int, reason: str = "") -> None:
        """Make ``result_id`` the one active result (roll back or forward) and log it.

        Raises
        ------
        UnknownRecord
            No such result; the active result is unchanged.
        """
        result_id = _check_id(result_id, "result_id")
        with self._write(f"activating result {result_id}") as conn:
            self._require(conn, "result", result_id)
            self._activate(conn, result_id, reason)

    def list_results(self, limit: int = 50) -> list[ResultRecord]:
        """The ``limit`` most recent results, newest first."""
        limit = _check_limit(limit)
        with self._read("listing results") as conn:
            rows = conn.execute(f"SELECT {_RESULT_COLUMNS} FROM results ORDER BY id DESC LIMIT ?", (limit,))
            return [self._result(r) for r in rows]

    def mark_suspect(self, result_id: int, reason: str) -> None:
        """Flag a result as suspect (a failed drift check); it stays active until replaced."""
        result_id = _check_id(result_id, "result_id")
        if not isinstance(reason, str) or not reason:
            raise ValueError(f"suspect reason must be a non-empty string, got {reason!r}")
        with self._write(f"marking result {result_id} suspect") as conn:
            self._require(conn, "result", result_id)
            conn.execute(
                "UPDATE results SET suspect = 1, suspect_reason = ?, suspect_utc = ? WHERE id = ?",
                (reason, _utc_now(), result_id),
            )

    def activation_history(self, limit: int = 50) -> list[ActivationRecord]:
        """The ``limit`` most recent changes of the active result, newest first."""
        limit = _check_limit(limit)
        with self._read("reading the activation history") as conn:
            rows = conn.execute(
                "SELECT id, result_id, previous_result_id, reason, activated_utc FROM activations"
                " ORDER BY id DESC LIMIT ?",
                (limit,),
            )
            return [ActivationRecord(*r) for r in rows]

    # ---- drift checks ----------------------------------------------------------------

    def add_drift_check(self, result_id: int, record: dict[str, Any]) -> int:
        """Store one drift check of a result (deviation, thresholds, verdict, CUSUM ...)."""
        result_id = _check_id(result_id, "result_id")
        record_json = _to_json(record, "drift check record")
        with self._write(f"adding a drift check of result {result_id}") as conn:
            self._require(conn, "result", result_id)
            cur = conn.execute(
                "INSERT INTO drift_checks(result_id, record_json, recorded_utc) VALUES (?, ?, ?)",
                (result_id, record_json, _utc_now()),
            )
            return _rowid(cur)

    def last_drift_check_id(self, result_id: int) -> int:
        """The highest ``check_id`` among the stored drift checks of a result (0 if none).

        Records without a ``check_id`` count by position, so the answer is never below the
        number of checks stored.
        """
        result_id = _check_id(result_id, "result_id")
        with self._read(f"reading the drift check ids of result {result_id}") as conn:
            self._require(conn, "result", result_id)
            rows = conn.execute("SELECT record_json FROM drift_checks WHERE result_id = ?", (result_id,)).fetchall()
        best = len(rows)
        for (text,) in rows:
            cid = json.loads(text).get("check_id")
            if isinstance(cid, int) and not isinstance(cid, bool):
                best = max(best, cid)
        return best

    def drift_checks(self, result_id: int, limit: int = 100) -> list[DriftCheckRecord]:
        """The ``limit`` most recent drift checks of a result, oldest first (CUSUM order)."""
        result_id = _check_id(result_id, "result_id")
        limit = _check_limit(limit)
        with self._read(f"reading the drift checks of result {result_id}") as conn:
            self._require(conn, "result", result_id)
            rows = conn.execute(
                "SELECT id, result_id, record_json, recorded_utc FROM drift_checks WHERE result_id = ?"
                " ORDER BY id DESC LIMIT ?",
                (result_id, limit),
            ).fetchall()
        return [DriftCheckRecord(r[0], r[1], json.loads(r[2]), r[3]) for r in reversed(rows)]

    # ---- internals -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"store in {self.state_dir} is not open (call open() first)", state_dir=self.state_dir)
        return self._conn

    @contextmanager
    def _read(self, action: str) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise self._translate(exc, action) from exc

    @contextmanager
    def _write(self, action: str) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE ... COMMIT``; rolled back on any exception."""
        with self._lock:
            conn = self._connection()
            # Any write may change the active result, and this connection's own commits do
            # not change its data_version: the cache is dropped before (and, for a read
            # inside the transaction, after) every write, committed or rolled back.
            self._active_cache = None
            try:
                # IMMEDIATE takes the write lock up front, so another process cannot make
                # this transaction fail half-way with SQLITE_BUSY.
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # SQLite already rolled back (it does on SQLITE_FULL); the cause is what matters
                if isinstance(exc, sqlite3.Error):
                    raise self._translate(exc, action) from exc
                raise
            finally:
                self._active_cache = None

    def _require(self, conn: sqlite3.Connection, table: str, record_id: int) -> None:
        sql = {"run": "SELECT 1 FROM runs WHERE id = ?", "result": "SELECT 1 FROM results WHERE id = ?"}[table]
        if conn.execute(sql, (record_id,)).fetchone() is None:
            raise UnknownRecord(table, record_id, state_dir=self.state_dir)

    def _require_open_run(self, conn: sqlite3.Connection, run_id: int, what: str) -> None:
        row = conn.execute("SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise UnknownRecord("run", run_id, state_dir=self.state_dir)
        if RunStatus(row[0]) not in _OPEN_STATUSES:
            raise RunClosed(
                f"run {run_id} is {row[0]}: {what} (state directory {self.state_dir})", state_dir=self.state_dir
            )

    def _activate(self, conn: sqlite3.Connection, result_id: int, reason: str) -> None:
        prev = conn.execute("SELECT id FROM results WHERE active = 1").fetchone()
        previous = None if prev is None else prev[0]
        # Clear first: the partial unique index forbids two active rows even for an instant.
        conn.execute("UPDATE results SET active = 0 WHERE active = 1")
        conn.execute("UPDATE results SET active = 1 WHERE id = ?", (result_id,))
        conn.execute(
            "INSERT INTO activations(result_id, previous_result_id, reason, activated_utc) VALUES (?, ?, ?, ?)",
            (result_id, previous, str(reason), _utc_now()),
        )

    @staticmethod
    def _run(r: Sequence[Any]) -> RunRecord:
        return RunRecord(
            id=r[0],
            kind=r[1],
            status=RunStatus(r[2]),
            status_reason=r[3],
            plan=json.loads(r[4]),
            config_sha256=r[5],
            devices=json.loads(r[6]),
            parent_result_id=r[7],
            created_utc=r[8],
            updated_utc=r[9],
            n_stations=r[10],
        )

    @staticmethod
    def _result(r: Sequence[Any]) -> ResultRecord:
        return ResultRecord(
            id=r[0],
            run_id=r[1],
            kind=r[2],
            result=json.loads(r[3]),
            provenance=json.loads(r[4]),
            parent_result_id=r[5],
            valid_from_utc=r[6],
            created_utc=r[7],
            active=bool(r[8]),
            suspect=bool(r[9]),
            suspect_reason=r[10],
            suspect_utc=r[11],
        )

    def _fs_is_read_only(self) -> bool:
        # Only a read-only *mount* is a promise that no process can write the file; a
        # directory we merely lack permission on may still be written by the daemon's user.
        d = self.state_dir if self.state_dir.exists() else self.state_dir.parent
        try:
            return bool(os.statvfs(d).f_flag & os.ST_RDONLY)
        except OSError:
            return False

    def _dir_is_read_only(self) -> bool:
        d = self.state_dir if self.state_dir.exists() else self.state_dir.parent
        return self._fs_is_read_only() or not os.access(d, os.W_OK)

    def _dir_is_full(self) -> bool:
        try:
            st = os.statvfs(self.state_dir)
        except OSError:
            return False
        return st.f_bavail == 0 or (st.f_files > 0 and st.f_favail == 0)

    def _translate(self, exc: sqlite3.Error, action: str) -> StoreError:
        """The typed error for a SQLite failure, naming the state directory."""
        code = getattr(exc, "sqlite_errorcode", None)
        name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
        primary = None if code is None else code & 0xFF
        where = f"state directory {self.state_dir}"
        if primary == _SQLITE_FULL or (primary == _SQLITE_IOERR and self._dir_is_full()):
            return StoreFullError(
                f"{where}: disk or database full while {action} ({name}: {exc}); the transaction was rolled "
                "back and earlier data is intact; free space and retry",
                state_dir=self.state_dir,
            )
        if primary in (_SQLITE_READONLY, _SQLITE_PERM, _SQLITE_AUTH) or (
            primary in (_SQLITE_CANTOPEN, _SQLITE_IOERR) and self._dir_is_read_only()
        ):
            return StoreReadOnlyError(
                f"{where}: cannot write while {action} ({name}: {exc}); the directory or {DB_FILENAME} is "
                "read-only (check the mount, permissions, and StateDirectory=); nothing was changed",
                state_dir=self.state_dir,
            )
        if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return StoreCorruptError(
                f"{where}: {self.path.name} is damaged or not a cellcal database while {action} ({name}: {exc})",
                state_dir=self.state_dir,
            )
        return StoreError(f"{where}: {action} failed ({name}: {exc})", state_dir=self.state_dir)

    def _os_error(self, exc: OSError, action: str) -> StoreError:
        where = f"state directory {self.state_dir}"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreFullError(f"{where}: disk full while {action} ({exc})", state_dir=self.state_dir)
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return StoreReadOnlyError(f"{where}: read-only while {action} ({exc})", state_dir=self.state_dir)
        return StoreError(f"{where}: {action} failed ({exc})", state_dir=self.state_dir)

