"""What the store keeps: runs, stations, rejections, results, drift checks, activations.

``StationRecord`` is the one definition of a station: its fields *are* the ``stations``
table's columns (:func:`station_columns` derives the column list, the INSERT and the row
decoder from the field types).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from cellcal.daemon.wire.types import (
    DriftRecord,
    JsonObject,
    JsonValue,  # noqa: F401 - get_type_hints resolves JsonObject's values here
    RunPlan,
    StoredProvenance,
    StoredResult,
)

__all__ = ["RunStatus", "RunRecord", "StationRecord", "StationColumn", "station_columns", "station_column_ddl", "TRANSIENT",
           "RejectionRecord", "ResultRecord", "DriftCheckRecord", "ActivationRecord", "StationBuilder"]


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
    plan : protocol.RunPlan
        The station plan as the run kind gave it, and what the run remembers of its start.
    config_sha256 : str
    devices : dict of str to JsonObject
        Device identities (model, serial, firmware) at the start of the run, by device name.
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
    plan: RunPlan
    config_sha256: str
    devices: dict[str, JsonObject]
    parent_result_id: int | None
    created_utc: str
    updated_utc: str
    n_stations: int

    @property
    def is_open(self) -> bool:
        """True while capturing or solving (a run to resume after a crash)."""
        return self.status in _OPEN_STATUSES


def _frozen_array(value: object, name: str, shape: tuple[int, ...] | None, plan_index: object) -> npt.NDArray[np.float64]:
    a = np.array(value, dtype=np.float64)  # a copy: the caller may reuse its buffer
    if shape is not None and a.shape != shape:
        raise ValueError(f"station {plan_index}: {name} must have shape {shape}, got {a.shape}")
    if shape is None and a.ndim != 1:
        raise ValueError(f"station {plan_index}: {name} must be 1-D, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"station {plan_index}: {name} contains NaN or inf")
    a.flags.writeable = False
    return a


def _finite_float(value: object, name: str, plan_index: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"station {plan_index}: {name} must be a number, got {value!r}")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"station {plan_index}: {name} must be finite, got {f!r}")
    return f


def _int(value: object, name: str, plan_index: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"station {plan_index}: {name} must be an integer, got {value!r}")
    i = int(value)
    if not -(2**63) <= i < 2**63:
        raise ValueError(f"station {plan_index}: {name} does not fit in 64 bits: {i}")
    return i


#: Field metadata of a :class:`StationRecord` field that is no column (what the record carries
#: to the store, never stored in the row: a camera station's image).
TRANSIENT = "transient"


def _meta(*, shape: tuple[int, ...] | None = None, minimum: float | None = None) -> dict[str, tuple[int, ...] | float | None]:
    """A station field's metadata, what its codec needs: an array's ``shape`` (None: 1-D of
    any length), a number's ``minimum``."""
    return {"shape": shape, "min": minimum}


class StationBuilder(typing.Protocol):
    """A station class as the store calls it: every field by keyword, as read back from its
    column; the record validates each one (:meth:`StationRecord.__post_init__`)."""

    def __call__(self, **fields: object) -> StationRecord: ...


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
    settle : JsonObject
        Settle figures (dwell, max joint speed, TCP speed, thresholds ...), SI units.
    raw : JsonObject
        Raw samples, JSON-serialisable (string keys, finite floats).
    accepted_host_ns : int
        Host ``time.monotonic_ns()`` when the capture engine accepted the station.
    camera : JsonObject or None
        A camera station's frame and detection (``cellcal.daemon.camera_capture``, ADR
        0030): the image's path (relative to the state directory) and sha256, the frame's
        stamps and exposure, the target's corner ids and image points, the robot state's
        interpolation to mid-exposure. None for a station without a camera.
    image_png : bytes or None
        Not a column: the PNG a camera station was captured with, on its way to the store,
        which writes it beside the database (``<state_dir>/images/run_<id>/station_<index>.png``)
        before the row commits and fills in ``camera["image"]`` and ``camera["image_sha256"]``
        (``Store.add_station``). None in every station read back (the image is on disk).
    """

    plan_index: int = field(metadata=_meta(minimum=0))
    base_T_flange: npt.NDArray[np.float64] = field(metadata=_meta(shape=(4, 4)))
    q_rad: npt.NDArray[np.float64] = field(metadata=_meta(shape=None))
    cell_T_target: npt.NDArray[np.float64] | None = field(metadata=_meta(shape=(4, 4)))
    cell_p_target: npt.NDArray[np.float64] | None = field(metadata=_meta(shape=(3,)))
    tracker_std_translation_m: float = field(metadata=_meta(minimum=0.0))
    tracker_std_rotation_rad: float | None = field(metadata=_meta(minimum=0.0))
    sample_count: int = field(metadata=_meta(minimum=0))
    robot_t_device_s: float = field(metadata=_meta())
    robot_t_host_ns: int = field(metadata=_meta())
    tracker_t_device_s: float = field(metadata=_meta())
    tracker_t_host_ns: int = field(metadata=_meta())
    settle: JsonObject = field(metadata=_meta())
    raw: JsonObject = field(metadata=_meta())
    accepted_host_ns: int = field(metadata=_meta())
    # Added by migration 2 (a camera station's, ADR 0030): None for every other station.
    camera: JsonObject | None = field(default=None, metadata={"shape": None, "min": None})
    # Not a column (``TRANSIENT``): the image travels with the record to the store.
    image_png: bytes | None = field(default=None, repr=False, metadata={TRANSIENT: True})

    def __post_init__(self) -> None:
        idx = self.plan_index
        for col in station_columns(type(self)):
            object.__setattr__(self, col.name, col.validate(getattr(self, col.name), idx))
        if self.image_png is not None and not isinstance(self.image_png, bytes):
            raise ValueError(f"station {idx}: image_png must be bytes, got {type(self.image_png).__name__}")


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

    def validate(self, value: object, plan_index: object) -> object:
        """The value as stored (arrays: read-only float64 copies); ``ValueError`` naming the station."""
        if value is None:
            if self.nullable:
                return None
            raise ValueError(f"station {plan_index}: {self.name} must not be None")
        out: int | float
        if self.kind == "int":
            out = _int(value, self.name, plan_index)
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

    def encode(self, value: object, plan_index: object) -> object:
        """The SQLite value of an already validated field."""
        if value is None:
            return None
        if self.kind == "array":
            # validate() made it a float64 array
            return _blob(typing.cast(npt.NDArray[np.float64], value))
        if self.kind == "json":
            return _to_json(value, f"station {plan_index} {self.name}")
        return value

    def decode(self, value: object) -> object:
        """The field value of a column read back (validated again by the record)."""
        if value is None:
            return None
        if self.kind == "array":
            # an array column holds BLOBs (its CHECK: a length of 8 bytes per element)
            return _array(typing.cast(bytes, value), self.shape)
        if self.kind == "json":
            # a JSON column holds the TEXT encode() wrote
            return json.loads(typing.cast(str, value))
        return value

    def ddl(self, default: object = None) -> str:
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


def _sql_literal(v: object) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"no SQL literal for a default of {v!r}")
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"a float column's default must be finite, got {v!r}")
    return repr(float(v)) if isinstance(v, float) else str(int(v))


def _column_kind(tp: object) -> tuple[str, bool]:
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
    kinds: dict[object, str] = {int: "int", float: "float", str: "str", np.ndarray: "array", dict: "json"}
    if origin not in kinds:
        raise TypeError(f"no station column for {tp!r}")
    return kinds[origin], nullable


_COLUMNS: dict[type[StationRecord], tuple[StationColumn, ...]] = {}


def station_columns(cls: type[StationRecord] = StationRecord) -> tuple[StationColumn, ...]:
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
        if f.metadata.get(TRANSIENT):
            continue
        kind, nullable = _column_kind(hints[f.name])
        out.append(StationColumn(
            name=f.name, column=f"{f.name}_json" if kind == "json" else f.name, kind=kind, nullable=nullable,
            shape=f.metadata.get("shape"), minimum=f.metadata.get("min"),
        ))
    _COLUMNS[cls] = tuple(out)
    return _COLUMNS[cls]


def station_column_ddl(cls: type[StationRecord], name: str) -> str:
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
    detail: JsonObject
    recorded_utc: str


@dataclass(frozen=True)
class ResultRecord:
    """One stored calibration result (versioned by ``id``).

    Attributes
    ----------
    id : int
    run_id : int or None
    kind : str
    result : protocol.StoredResult
        The result's wire form, its gates and check stations (``RunKind.finish``).
    provenance : protocol.StoredProvenance
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
    result: StoredResult
    provenance: StoredProvenance
    parent_result_id: int | None
    valid_from_utc: str
    created_utc: str
    active: bool
    suspect: bool
    suspect_reason: str
    suspect_utc: str | None

    def to_export_dict(self) -> dict[str, object]:
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
    record: DriftRecord
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
# Encoding


def _json_default(obj: object) -> object:
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


def _to_json(obj: object, what: str) -> str:
    try:
        return json.dumps(obj, allow_nan=False, separators=(",", ":"), default=_json_default)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what}: not storable as JSON ({exc})") from exc


def _blob(a: npt.NDArray[np.float64] | None) -> bytes | None:
    return None if a is None else np.ascontiguousarray(a, dtype="<f8").tobytes()


def _array(b: bytes | None, shape: tuple[int, ...] | None) -> npt.NDArray[np.float64] | None:
    if b is None:
        return None
    a = np.frombuffer(b, dtype="<f8").astype(np.float64)  # astype: a writable native copy
    return a if shape is None else a.reshape(shape)
