"""The daemon's durable state: runs, stations, results and drift checks in SQLite.

One SQLite file, ``cellcal.sqlite3``, in the state directory (systemd's
``StateDirectory``). Promises (docs/protocols/zeromq.md; ADR 0012):

* **No accepted station is ever lost.** ``add_station`` is one ``BEGIN IMMEDIATE ...
  COMMIT`` in WAL mode with ``synchronous=FULL``: when it returns, the station is in the
  fsynced WAL and survives ``kill -9`` or power loss; when the process dies before it
  returns, the station is either wholly there or wholly absent, never half written.
* **No camera station without its image.** A station carrying an image
  (``StationRecord.image_png``) has it written beside the database first
  (``images/run_<id>/station_<index>.png``: a temporary file, fsynced, renamed, the folder
  fsynced) and its row, which holds the image's path and sha256, committed after: a
  ``kill -9`` at any moment leaves at most an image without a row (written again when the
  station is captured again), never a row without its image or a torn image.
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

Schema (version 2; ``schema_version`` records every migration applied)::

    schema_version(version PK, description, applied_utc)
    store_meta(key PK, value)                      -- created_utc, last_opened_utc
    runs(id PK, kind, status, status_reason, plan_json, config_sha256, devices_json,
         parent_result_id -> results, created_utc, updated_utc)
    stations(id PK, run_id -> runs, plan_index, UNIQUE(run_id, plan_index),
         base_T_flange BLOB(128), q_rad BLOB(8n), cell_T_target BLOB(128)?, cell_p_target BLOB(24)?,
         tracker_std_translation_m, tracker_std_rotation_rad?, sample_count,
         robot_t_device_s, robot_t_host_ns, tracker_t_device_s, tracker_t_host_ns,
         settle_json, raw_json, accepted_host_ns, stored_utc,
         camera_json?)                                -- migration 2: a camera station's
    images/run_<id>/station_<index>.png             -- a camera station's image, beside the file
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

from cellcal.daemon.store.errors import (  # noqa: F401 - the store's public names
    DuplicateStation,
    RunClosed,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    UnknownRecord,
)
from cellcal.daemon.store.images import IMAGES_DIR, station_image_path  # noqa: F401 - the store's public names
from cellcal.daemon.store.records import (  # noqa: F401 - the store's public names
    TRANSIENT,
    ActivationRecord,
    DriftCheckRecord,
    RejectionRecord,
    ResultRecord,
    RunRecord,
    RunStatus,
    StationColumn,
    StationRecord,
    station_column_ddl,
    station_columns,
)
from cellcal.daemon.store.schema import (  # noqa: F401 - the store's public names
    MIGRATIONS,
    SCHEMA_VERSION,
    migrate,
)
from cellcal.daemon.store.sqlite import (  # noqa: F401 - the store's public names
    DB_FILENAME,
    FRAME_CONVENTION,
    Store,
)

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
    "TRANSIENT",
    "IMAGES_DIR",
    "station_image_path",
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
