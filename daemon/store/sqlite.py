"""The store itself: :class:`Store` on one SQLite file in the state directory (WAL,
``synchronous=FULL``, one transaction per accepted station)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TypeVarTuple, cast

import numpy as np

from cellcal.daemon.store import drop
from cellcal.daemon.store.errors import (
    DuplicateStation,
    RunClosed,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    UnknownRecord,
)
from cellcal.daemon.store.images import put_in_place, with_image_path, write_temporary
from cellcal.daemon.store.records import (
    _OPEN_STATUSES,
    ActivationRecord,
    DriftCheckRecord,
    RejectionRecord,
    ResultRecord,
    RunRecord,
    RunStatus,
    StationBuilder,
    StationRecord,
    _to_json,
    station_columns,
)
from cellcal.daemon.store.schema import MIGRATIONS, _utc_now, migrate

__all__ = ["DB_FILENAME", "FRAME_CONVENTION", "Store"]

DB_FILENAME = "cellcal.sqlite3"
_SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite 3 database file

# The convention every stored transform follows (ADR 0001); a provenance default, so a result
# read years later still says what its matrices mean.
FRAME_CONVENTION = "a_T_b maps coordinates in frame b to frame a; SI units; quaternion w,x,y,z with w >= 0"

# Seconds a writer waits for another process's write lock before SQLITE_BUSY.
_BUSY_TIMEOUT_S = 10.0

_RUN_COLUMNS = (
    "id, kind, status, status_reason, plan_json, config_sha256, devices_json, parent_result_id,"
    " created_utc, updated_utc, (SELECT count(*) FROM stations s WHERE s.run_id = runs.id)"
)
_RESULT_COLUMNS = (
    "id, run_id, kind, result_json, provenance_json, parent_result_id, valid_from_utc, created_utc,"
    " active, suspect, suspect_reason, suspect_utc"
)

#: The arguments of one of images.py's steps (:meth:`Store._image`).
_Ts = TypeVarTuple("_Ts")

# Primary SQLite result codes (the low byte of an extended code).
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT = 3, 8, 10, 11
_SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_AUTH, _SQLITE_NOTADB = 13, 14, 23, 26


def _cellcal_version() -> str:
    try:
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


def _check_id(value: object, name: str) -> int:
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

    def settings(self) -> dict[str, str | int]:
        """The connection's durability settings and schema version, as SQLite reports them.

        Returns
        -------
        dict
            ``journal_mode`` (``"wal"``), ``synchronous`` (2 = FULL), ``foreign_keys`` (1),
            ``schema_version``, ``integrity_check`` (``"ok"``).
        """
        with self._read("reading settings") as conn:
            out: dict[str, str | int] = {}
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
        plan: Mapping[str, object],
        *,
        config_sha256: str,
        devices: Mapping[str, object],
        parent_result_id: int | None = None,
    ) -> int:
        """Start a run in status ``capturing``.

        Parameters
        ----------
        kind : str
            ``"base_frame"``, ``"tool_point"``, ``"hand_eye"``, ...
        plan : mapping
            The station plan (JSON-serialisable; read back as ``RunRecord.plan``,
            ``protocol.RunPlan``).
        config_sha256 : str
            Hash of the configuration file the daemon runs with.
        devices : mapping
            Device identities (model, serial, firmware) by device name.
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
        st, final, image = with_image_path(st, run_id, self.state_dir)  # a camera station: images.py
        values = [c.encode(getattr(st, c.name), st.plan_index) for c in self._station_cols]  # before the lock
        tmp = None if final is None or image is None else self._image(write_temporary, final, image)
        try:
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
                if tmp is not None and final is not None:  # after the duplicate test, before the row (images.py)
                    tmp = self._image(put_in_place, tmp, final)
                cur = conn.execute(self._station_insert, (run_id, *values, _utc_now()))
                conn.execute("UPDATE runs SET updated_utc = ? WHERE id = ?", (_utc_now(), run_id))
                return _rowid(cur)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    tmp.unlink()

    def _image(self, step: Callable[[*_Ts], Path | None], *args: *_Ts) -> Path | None:
        """One of ``images``' steps, its ``OSError`` the store's typed error."""
        try:
            return step(*args)
        except OSError as exc:
            raise self._os_error(exc, "writing a station's image") from exc

    def stations(self, run_id: int) -> list[StationRecord]:
        """Every committed station of a run, in plan order."""
        run_id = _check_id(run_id, "run_id")
        with self._read(f"reading the stations of run {run_id}") as conn:
            self._require(conn, "run", run_id)
            rows = conn.execute(self._station_select, (run_id,)).fetchall()
        # The station class takes its fields by name (a subclass has more of them) and
        # validates each one as it is built (StationRecord.__post_init__).
        build = cast(StationBuilder, self.station_type)
        cols = self._station_cols
        return [build(**{c.name: c.decode(v) for c, v in zip(cols, r, strict=True)}) for r in rows]

    def station_indices(self, run_id: int) -> list[int]:
        """Plan indices committed for a run, ascending (cheap: for resuming after a crash)."""
        run_id = _check_id(run_id, "run_id")
        with self._read(f"reading the station indices of run {run_id}") as conn:
            self._require(conn, "run", run_id)
            rows = conn.execute("SELECT plan_index FROM stations WHERE run_id = ? ORDER BY plan_index", (run_id,))
            return [r[0] for r in rows]

    def drop_station(self, run_id: int, plan_index: int, reason: str, detail: Mapping[str, object]) -> None:
        """Take an accepted station out of its open run, recorded as a rejection (``store.drop``)."""
        drop.drop_station(self, run_id, plan_index, reason, detail)

    def add_rejection(self, run_id: int, plan_index: int, reason: str, detail: Mapping[str, object]) -> int:
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
        result: Mapping[str, object],
        provenance: Mapping[str, object],
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
            JSON-ready: the result's wire form, gates and check stations (read back as
            ``ResultRecord.result``, ``protocol.StoredResult``).
        provenance : dict
            Read back as ``ResultRecord.provenance`` (``protocol.StoredProvenance``).
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

    def add_drift_check(self, result_id: int, record: Mapping[str, object]) -> int:
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
    def _run(r: tuple[int, str, str, str, str, str, str, int | None, str, str, int]) -> RunRecord:
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
    def _result(r: tuple[int, int | None, str, str, str, int | None, str, str, int, int, str, str | None]) -> ResultRecord:
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
