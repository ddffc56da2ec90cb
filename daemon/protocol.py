"""The cellcal ZeroMQ protocol, schema ``cellcal/v1``: the one module that defines it.

Everything a client sees on the wire is named here: topics, the envelope, requests and
replies, error codes, the command catalogue with roles and argument types, and the body of
every topic. ``docs/protocols/zeromq.md`` is the same contract written for C++ and C#
developers; the two must agree (``tests/test_zmq_protocol.py`` checks the examples).

Wire format
-----------
Encoding
    MessagePack. Strings are the msgpack ``str`` family (UTF-8), never ``bin``; map keys are
    always strings; floats are float 64; integers fit int64 (``seq``, ``ts_ns``). No msgpack
    extension types. All quantities are SI with the unit in the field name (``_m``,
    ``_rad``, ``_s``, ``_ns``). Transforms follow ADR 0001 (``a_T_b`` maps frame ``b`` to
    frame ``a``; quaternions ``{w, x, y, z}`` with ``w >= 0``).

PUB socket (``[zmq] pub_endpoint``)
    Every message has two frames::

        frame 0: topic, ASCII, e.g. b"cellcal/v1/heartbeat"
        frame 1: msgpack envelope
            {"schema": "cellcal/v1", "v": 1, "seq": int, "boot_id": str, "ts_ns": int,
             "body": map}

    ``seq`` counts every published message across all topics (1, 2, 3, ... per daemon
    start); ``boot_id`` is 16 random hex characters chosen at each daemon start, and ``seq``
    restarts at 1 with it. ``ts_ns`` is wall-clock UTC in nanoseconds since the Unix epoch
    (``time.time_ns()``) when the daemon produced the message: a human-facing stamp, subject
    to clock steps; order and loss are judged by ``seq`` only. Topics: ``TOPICS`` below. Subscribe
    to the prefix ``cellcal/v1/`` to see every message: ``seq`` is global, so a client that
    subscribes to a subset sees jumps that are not losses and cannot detect gaps.

ROUTER socket (``[zmq] cmd_endpoint``)
    A client sends one frame (DEALER) or an empty delimiter and one frame (REQ)::

        request  {"id": str | int, "cmd": str, "args": map}          ("args" may be omitted)
        reply    {"id": <same>, "ok": true,  "result": any}
                 {"id": <same>, "ok": false, "error": {"code": str, "message": str}}

    ``id`` is a string of 1..128 characters or an integer in [0, 2**63); a reply echoes it
    (``null`` when the request was too broken to have one). The same ``id`` from the same
    client (CURVE key and ZeroMQ routing id) within the dedup window gets the stored reply
    and is not executed again, so a retry after a timeout is safe; ids must therefore be
    unique per client (a UUID). Unknown top-level keys, unknown commands, unknown or
    mistyped arguments: ``E_BAD_REQUEST`` naming the field and the type expected. A message
    larger than ``[zmq] max_msg_bytes`` is dropped by ZeroMQ and the connection reset.

Snapshot (Clone pattern)
    ``get_snapshot`` returns ``{"seq": S, "boot_id": str, "messages": {topic: envelope}}``,
    the latest envelope of every topic published so far with ``S`` the seq of the last
    message published before the reply. A joining client subscribes first, then asks for the
    snapshot, applies it, then drops live messages with ``seq <= S`` (same ``boot_id``); a
    live message with ``seq > last + 1`` is a gap, and a new ``boot_id`` a restart: both are
    repaired by a fresh snapshot.

Roles
    ``observer`` may read (``get_status``, ``get_snapshot``, ``get_result``,
    ``list_results``, ``to_base``); ``operator`` may also move the robot or change the
    active calibration (``start_run``, ``abort``, ``run_drift_check``,
    ``activate_result``). Under CURVE the role comes from the allow-listed client key;
    without CURVE an admitted local peer (``zmq_server.check_security``) has ``[zmq]
    null_role`` (default ``observer``).

Inputs
    Arguments are bounded here, before any command runs (``v_record_id``, ``v_name``,
    ``MAX_POSITION_M``, ``MAX_JOINT_RAD``), and a reply never holds a non-finite number
    (``find_non_finite``; ``to_base`` refuses instead).

Bodies of topics and results of commands are the TypedDicts below (``HeartbeatBody``,
``ResultBody``, ...). Within ``v = 1`` fields may be added, never removed or retyped, so
clients must ignore fields they do not know.
"""

from __future__ import annotations

import math
import secrets
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, TypedDict, Union

import msgpack

from cellcal.solver.errors import CellcalError

__all__ = [
    "SCHEMA", "V", "TOPIC_PREFIX", "TOPIC_HEARTBEAT", "TOPIC_STATE", "TOPIC_STATION",
    "TOPIC_RESULT", "TOPIC_DRIFT", "TOPIC_FAULT", "TOPICS",
    "E_BAD_REQUEST", "E_FORBIDDEN", "E_NOT_FOUND", "E_BUSY", "E_STATE", "E_NO_CALIBRATION",
    "E_DEVICE", "E_UNAVAILABLE", "E_INTERNAL", "ERROR_CODES",
    "ROLE_OBSERVER", "ROLE_OPERATOR", "ROLES", "role_allows",
    "STATES", "RUN_KINDS", "DRIFT_STATUSES", "DEVICES",
    "StateName", "RunKind", "MotionMode", "DriftStatus", "DriftAction", "DeviceName", "ErrorCode",
    "STATE_IDLE", "STATE_CAPTURING", "STATE_SOLVING", "STATE_CHECKING", "STATE_FAULT",
    "KIND_BASE_FRAME", "KIND_TOOL_POINT", "KIND_HAND_EYE", "KIND_KINEMATICS", "MOTION_COMMAND", "MOTION_OBSERVE",
    "DRIFT_OK", "DRIFT_WARN", "DRIFT_FAIL", "ACTION_NONE", "ACTION_MARKED_SUSPECT", "ACTION_RECALIBRATING",
    "DEVICE_ROBOT", "DEVICE_TRACKER", "check_reply", "Devices",
    "Caller", "CommandError", "Handler", "Arg", "Command", "COMMANDS",
    "Request", "BadRequest", "parse_request", "validate_args", "MOTION_MODES", "DRIFT_ACTIONS",
    "pack", "unpack", "new_boot_id", "make_envelope", "pack_envelope", "packed_map", "check_envelope",
    "ok_reply", "error_reply", "pack_ok", "pack_error",
    "check_body", "check_result", "BODY_TYPES", "RESULT_TYPES",
    "pose_from_wire", "to_base_reply", "find_non_finite", "v_record_id", "v_name",
    "MAX_POSITION_M", "MAX_JOINT_RAD",
    "HeartbeatBody", "DeviceStatus", "StateBody", "StationBody", "SettleFigures", "ResultBody", "Transform",
    "Quaternion", "Residuals", "Provenance", "DriftBody", "DriftStation", "Cusum", "FaultBody",
    "StatusResult", "SnapshotResult", "ResultSummary", "ListResultsResult", "ToBasePointResult",
    "ToBasePoseResult", "StartRunResult", "AbortResult", "DriftCheckResult", "ActivateResult",
    "Point", "WeakestAxis", "Covariance", "JointCovariance", "Uncertainty", "Holdout", "LinearAgreement",
]

# --- schema, topics ------------------------------------------------------------------------------

SCHEMA = "cellcal/v1"
V = 1
TOPIC_PREFIX = "cellcal/v1/"
TOPIC_HEARTBEAT = "cellcal/v1/heartbeat"
TOPIC_STATE = "cellcal/v1/state"
TOPIC_STATION = "cellcal/v1/station"
TOPIC_RESULT = "cellcal/v1/result"
TOPIC_DRIFT = "cellcal/v1/drift"
TOPIC_FAULT = "cellcal/v1/fault"
TOPICS = (TOPIC_HEARTBEAT, TOPIC_STATE, TOPIC_STATION, TOPIC_RESULT, TOPIC_DRIFT, TOPIC_FAULT)

# Size bounds of what we decode. ZeroMQ's MAXMSGSIZE bounds the message; these bound its
# shape, so a small message cannot declare a huge container (and the C unpacker's nesting
# limit refuses deep nesting with StackError).
MAX_ID_CHARS = 128
MAX_REQUEST_ARRAY = 100_000
MAX_REQUEST_MAP = 1_000
MAX_STATIONS = 1_000
# Number bounds of arguments: a cell is not kilometres wide and a joint does not turn 16
# times, and inside these bounds every reply stays finite (no product of a calibration and an
# argument overflows float 64).
MAX_POSITION_M = 1e6
MAX_JOINT_RAD = 100.0
MAX_RECORD_ID_CHARS = 64
MAX_NAME_CHARS = 64

# --- error codes ---------------------------------------------------------------------------------
# The value on the wire is the name itself: readable in a packet capture and in a log.

E_BAD_REQUEST = "E_BAD_REQUEST"        # malformed msgpack, not a map, unknown command/argument, wrong type
E_FORBIDDEN = "E_FORBIDDEN"            # the caller's role may not run this command
E_NOT_FOUND = "E_NOT_FOUND"            # a result id, run id or plan name that does not exist
E_BUSY = "E_BUSY"                      # transient: a run/check in progress or too many queued commands
E_STATE = "E_STATE"                    # not possible in the current state (e.g. FAULT, result failed its gates)
E_NO_CALIBRATION = "E_NO_CALIBRATION"  # needs an active calibration (of the right kind) and there is none
E_DEVICE = "E_DEVICE"                  # robot or tracker offline or refusing
E_UNAVAILABLE = "E_UNAVAILABLE"        # the daemon is starting or stopping; retry
E_INTERNAL = "E_INTERNAL"              # a bug: the daemon logged the exception
ERROR_CODES = (E_BAD_REQUEST, E_FORBIDDEN, E_NOT_FOUND, E_BUSY, E_STATE, E_NO_CALIBRATION,
               E_DEVICE, E_UNAVAILABLE, E_INTERNAL)

# --- roles, states, kinds, modes ----------------------------------------------------------------
# Each vocabulary is written once, as the ``Literal`` type the bodies below use; the tuple
# of its values and one named constant per value (what the daemon's code uses instead of
# string literals) are derived from it and checked against it at import.

ROLE_OBSERVER = "observer"
ROLE_OPERATOR = "operator"
ROLES = (ROLE_OBSERVER, ROLE_OPERATOR)
_ROLE_RANK = {ROLE_OBSERVER: 0, ROLE_OPERATOR: 1}

StateName = Literal["IDLE", "CAPTURING", "SOLVING", "CHECKING", "FAULT"]
STATE_IDLE: Final = "IDLE"
STATE_CAPTURING: Final = "CAPTURING"
STATE_SOLVING: Final = "SOLVING"
STATE_CHECKING: Final = "CHECKING"
STATE_FAULT: Final = "FAULT"
STATES: tuple[str, ...] = typing.get_args(StateName)

RunKind = Literal["base_frame", "tool_point", "hand_eye", "kinematics"]
KIND_BASE_FRAME: Final = "base_frame"
KIND_TOOL_POINT: Final = "tool_point"
KIND_HAND_EYE: Final = "hand_eye"
KIND_KINEMATICS: Final = "kinematics"  # the arm's own DH geometry (cellcal.daemon.kinematics_run)
RUN_KINDS: tuple[str, ...] = typing.get_args(RunKind)

MotionMode = Literal["command", "observe"]
MOTION_COMMAND: Final = "command"   # the daemon moves the robot through the plan
MOTION_OBSERVE: Final = "observe"   # the cell's own program moves it; the daemon captures at rest
MOTION_MODES: tuple[str, ...] = typing.get_args(MotionMode)

DriftStatus = Literal["ok", "warn", "fail"]
DRIFT_OK: Final = "ok"
DRIFT_WARN: Final = "warn"
DRIFT_FAIL: Final = "fail"
DRIFT_STATUSES: tuple[str, ...] = typing.get_args(DriftStatus)

DriftAction = Literal["none", "marked_suspect", "recalibrating"]
ACTION_NONE: Final = "none"
ACTION_MARKED_SUSPECT: Final = "marked_suspect"
ACTION_RECALIBRATING: Final = "recalibrating"
DRIFT_ACTIONS: tuple[str, ...] = typing.get_args(DriftAction)

DeviceName = Literal["robot", "tracker"]
DEVICE_ROBOT: Final = "robot"
DEVICE_TRACKER: Final = "tracker"
DEVICES: tuple[str, ...] = typing.get_args(DeviceName)

ErrorCode = Literal["E_BAD_REQUEST", "E_FORBIDDEN", "E_NOT_FOUND", "E_BUSY", "E_STATE", "E_NO_CALIBRATION",
                    "E_DEVICE", "E_UNAVAILABLE", "E_INTERNAL"]


def _check_vocabularies() -> None:
    # A constant that drifts from its Literal would make the daemon publish what the schema
    # refuses (or the reverse); fail at import, where the mistake is made.
    g = globals()
    for prefix, values in (("STATE_", STATES), ("KIND_", RUN_KINDS), ("MOTION_", MOTION_MODES),
                           ("DRIFT_", DRIFT_STATUSES), ("ACTION_", DRIFT_ACTIONS), ("DEVICE_", DEVICES)):
        named = {v for k, v in g.items() if k.startswith(prefix) and k.isupper() and isinstance(v, str)}
        if named != set(values):
            raise AssertionError(f"protocol: {prefix}* constants {sorted(named)} != Literal values {sorted(values)}")
    if set(typing.get_args(ErrorCode)) != set(ERROR_CODES):
        raise AssertionError("protocol: ErrorCode and ERROR_CODES disagree")


_check_vocabularies()


def role_allows(role: str, required: str) -> bool:
    """True if ``role`` may run a command that needs ``required`` (unknown roles: never)."""
    return role in _ROLE_RANK and _ROLE_RANK[role] >= _ROLE_RANK[required]


# --- the handler interface -----------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """Who sent a command, as authenticated by the transport.

    Attributes
    ----------
    key_id : str
        First 8 characters of the client's Z85 CURVE public key; without CURVE ``"uid:N"``
        for an ipc peer (its kernel-reported uid) or ``"null"`` on loopback TCP. This is
        what the logs show.
    role : str
        ``"observer"`` or ``"operator"``.
    name : str
        The client's name from ``[[zmq.clients]]``, or ``"anonymous"`` without CURVE.
    """

    key_id: str
    role: str
    name: str


class CommandError(CellcalError):
    """A command refused with a protocol error code; the handler raises it, the client sees it.

    Parameters
    ----------
    code : str
        One of ``ERROR_CODES``.
    message : str
        For people: says what was wrong and, where it helps, what would be accepted.
    """

    def __init__(self, code: str, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class Handler(Protocol):
    """What the daemon implements for the command socket.

    ``handle`` is called on the server's single command thread, one command at a time, with
    ``args`` already validated against ``COMMANDS[cmd]`` (defaults filled in) and the caller
    already authorised. It returns the ``result`` (msgpack-able: dicts, lists, str, int,
    float, bool, None; numpy arrays and scalars are converted) or raises
    :class:`CommandError`. Any other exception becomes ``E_INTERNAL`` and is logged. It must
    not block for long (start a run, do not wait for it): commands queue behind it.
    ``get_snapshot`` never reaches the handler.
    """

    def handle(self, cmd: str, args: dict[str, Any], caller: Caller) -> Any: ...


# --- argument validation -------------------------------------------------------------------------


class _ArgError(ValueError):
    """Private: a validator's complaint, turned into ``CommandError(E_BAD_REQUEST)`` naming
    the argument by :func:`validate_args`; never leaves this module."""


def _what(v: Any) -> str:
    if v is None:
        return "nil"
    if isinstance(v, bool):
        return f"boolean {v!r}".lower()
    if isinstance(v, (int, float)):
        return f"{type(v).__name__} {v!r}"
    if isinstance(v, str):
        return f"string {v[:40]!r}"
    if isinstance(v, (list, tuple)):
        return f"array of {len(v)}"
    if isinstance(v, dict):
        return f"map of {len(v)}"
    return type(v).__name__


def _names(keys: Any, limit: int = 5) -> str:
    """Some keys for a message, each shortened: a request's keys are the client's, any size."""
    keys = list(keys)
    shown = ", ".join(repr(k[:40] if isinstance(k, str) else k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def v_string(max_len: int = 256) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or not 1 <= len(v) <= max_len:
            raise _ArgError(f"expected a string of 1..{max_len} characters, got {_what(v)}")
        return v
    check.type_name = f"string (1..{max_len} chars)"  # type: ignore[attr-defined]
    return check


_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-")


def v_record_id(v: Any) -> str:
    """A record id (``result_id``, ``run_id``): 1..64 of ``[A-Za-z0-9._:-]``; a decimal id
    fits int64, as the store's ids do (a longer number names nothing and must not reach it)."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_RECORD_ID_CHARS or not set(v) <= _ID_CHARS:
        raise _ArgError(f"expected an id of 1..{MAX_RECORD_ID_CHARS} characters [A-Za-z0-9._:-], got {_what(v)}")
    if v.isdigit() and (len(v) > 19 or int(v) >= 2**63):
        raise _ArgError(f"a numeric id must be below 2**63, got {len(v)} digits")
    return v


v_record_id.type_name = f"id (1..{MAX_RECORD_ID_CHARS} chars [A-Za-z0-9._:-])"  # type: ignore[attr-defined]


def v_name(v: Any) -> str:
    """A frame or plan name: 1..64 of ``[A-Za-z0-9._:-]`` (it ends up in names on the wire)."""
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_NAME_CHARS or not set(v) <= _ID_CHARS:
        raise _ArgError(f"expected a name of 1..{MAX_NAME_CHARS} characters [A-Za-z0-9._:-], got {_what(v)}")
    return v


v_name.type_name = f"name (1..{MAX_NAME_CHARS} chars [A-Za-z0-9._:-])"  # type: ignore[attr-defined]


def v_choice(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or v not in choices:
            raise _ArgError(f"expected one of {', '.join(choices)}, got {_what(v)}")
        return v
    check.type_name = "string: " + " | ".join(choices)  # type: ignore[attr-defined]
    return check


def v_int(lo: int, hi: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _ArgError(f"expected an integer in [{lo}, {hi}], got {_what(v)}")
        return v
    check.type_name = f"integer in [{lo}, {hi}]"  # type: ignore[attr-defined]
    return check


def _numbers(v: Any, n: int | tuple[int, int], what: str, bound: float | None = None) -> list[float]:
    lo, hi = (n, n) if isinstance(n, int) else n
    count = f"{lo}" if lo == hi else f"{lo}..{hi}"
    within = f" within +-{bound:g}" if bound is not None else ""
    if not isinstance(v, (list, tuple)) or not lo <= len(v) <= hi:
        raise _ArgError(f"expected {what}: an array of {count} finite numbers{within}, got {_what(v)}")
    for i, x in enumerate(v):
        if not _is_number(x):
            raise _ArgError(f"expected {what}: an array of {count} finite numbers{within}, element {i} is {_what(x)}")
        if bound is not None and not -bound <= x <= bound:
            raise _ArgError(f"{what}: element {i} is {_what(x)}, beyond +-{bound:g}")
    return [float(x) for x in v]


def v_vec3(v: Any) -> list[float]:
    return _numbers(v, 3, "[x, y, z] in metres", MAX_POSITION_M)


v_vec3.type_name = f"array of 3 numbers within +-{MAX_POSITION_M:g} m"  # type: ignore[attr-defined]


def _quat(v: Any) -> dict[str, float]:
    if not isinstance(v, dict) or set(v) != {"w", "x", "y", "z"} or not all(_is_number(v[k]) for k in "wxyz"):
        raise _ArgError(f"quaternion: expected a map {{w, x, y, z}} of finite numbers, got {_what(v)}")
    n = math.sqrt(sum(v[k] ** 2 for k in "wxyz"))
    if abs(n - 1.0) > 1e-6:
        raise _ArgError(f"quaternion: expected unit norm, got norm {n:.9g}")
    return {k: float(v[k]) for k in "wxyz"}


def v_pose(v: Any) -> dict[str, Any]:
    """A pose: ``{matrix: [16]}`` or ``{translation_m: [3], quaternion: {w,x,y,z}}``."""
    if not isinstance(v, dict):
        raise _ArgError(f"expected a map with matrix, or translation_m and quaternion, got {_what(v)}")
    keys = set(v)
    if keys == {"matrix"}:
        m = _numbers(v["matrix"], 16, "matrix (16 numbers, row-major)", MAX_POSITION_M)
        if any(abs(a - b) > 1e-9 for a, b in zip(m[12:], (0.0, 0.0, 0.0, 1.0), strict=True)):
            raise _ArgError("matrix: the last row must be 0, 0, 0, 1")
        r = [m[0:3], m[4:7], m[8:11]]
        for i in range(3):
            for j in range(3):
                dot = sum(r[i][k] * r[j][k] for k in range(3))
                if abs(dot - (1.0 if i == j else 0.0)) > 1e-6:
                    raise _ArgError("matrix: the rotation part must be orthonormal (within 1e-6)")
        det = (r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1]) - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
               + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0]))
        if det < 0:
            raise _ArgError("matrix: the rotation part is a reflection (determinant -1)")
        return {"matrix": m}
    if keys == {"translation_m", "quaternion"}:
        return {"translation_m": _numbers(v["translation_m"], 3, "translation_m", MAX_POSITION_M),
                "quaternion": _quat(v["quaternion"])}
    raise _ArgError(f"expected keys matrix, or translation_m and quaternion, got {_names(sorted(keys))}")


v_pose.type_name = "pose map"  # type: ignore[attr-defined]


def v_stations(v: Any) -> list[dict[str, Any]]:
    """Explicit stations: ``[{q_rad: [n]}]`` or ``[{base_T_flange: pose}]``."""
    if not isinstance(v, (list, tuple)) or not 1 <= len(v) <= MAX_STATIONS:
        raise _ArgError(f"expected an array of 1..{MAX_STATIONS} stations, got {_what(v)}")
    out: list[dict[str, Any]] = []
    for i, st in enumerate(v):
        try:
            if isinstance(st, dict) and set(st) == {"q_rad"}:
                out.append({"q_rad": _numbers(st["q_rad"], (1, 12), "q_rad (joint angles, rad)", MAX_JOINT_RAD)})
            elif isinstance(st, dict) and set(st) == {"base_T_flange"}:
                out.append({"base_T_flange": v_pose(st["base_T_flange"])})
            else:
                raise _ArgError(f"expected a map with q_rad or base_T_flange, got {_what(st)}")
        except _ArgError as exc:
            raise _ArgError(f"[{i}]: {exc}") from None
    return out


v_stations.type_name = "array of station maps"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Arg:
    """One command argument: its validator, whether it is required, and its default."""

    name: str
    check: Callable[[Any], Any]
    required: bool = False
    default: Any = None
    doc: str = ""

    @property
    def type_name(self) -> str:
        return getattr(self.check, "type_name", "value")


@dataclass(frozen=True)
class Command:
    """One command of the catalogue: the role it needs and its arguments."""

    name: str
    role: str
    args: tuple[Arg, ...] = ()
    doc: str = ""
    exclusive: tuple[tuple[str, ...], ...] = field(default=())  # at most one of each group
    one_of: tuple[str, ...] = ()  # exactly one of these must be given


COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("get_status", ROLE_OBSERVER, doc="the daemon's status (same fields as the heartbeat body)"),
    Command("get_snapshot", ROLE_OBSERVER, doc="latest envelope of every topic and the seq it is current to"),
    Command("get_result", ROLE_OBSERVER, (
        Arg("result_id", v_record_id, doc="a result id; omitted: the active result"),
    ), doc="one calibration result (the active one by default)"),
    Command("list_results", ROLE_OBSERVER, (
        Arg("limit", v_int(1, 1000), default=50, doc="newest first, at most this many"),
        Arg("kind", v_choice(*RUN_KINDS), doc="only results of this kind"),
    ), doc="summaries of stored results, newest first"),
    Command("to_base", ROLE_OBSERVER, (
        Arg("point_m", v_vec3, doc="a point in the cell frame, metres"),
        Arg("pose", v_pose, doc="a pose cell_T_x: {matrix} or {translation_m, quaternion}"),
        Arg("child_frame", v_name, doc='name of frame x in the reply (pose only; default "pose")'),
        Arg("result_id", v_record_id, doc="use this result instead of the active one"),
    ), doc="express a cell-frame point or pose in the robot base frame", one_of=("point_m", "pose")),
    Command("start_run", ROLE_OPERATOR, (
        Arg("kind", v_choice(*RUN_KINDS), required=True, doc="what to calibrate"),
        Arg("plan", v_name, doc="a named station plan; omitted: the configured [plan]"),
        Arg("stations", v_stations, doc="explicit stations instead of a plan"),
        Arg("motion_mode", v_choice(*MOTION_MODES), doc="omitted: [capture] motion_mode"),
    ), doc="start a calibration run (returns at once; progress on station/state/result)",
        exclusive=(("plan", "stations"),)),
    Command("abort", ROLE_OPERATOR, (
        Arg("run_id", v_record_id, doc="abort only if this run is the one in progress"),
    ), doc="abort the run or drift check in progress (the robot stops)"),
    Command("run_drift_check", ROLE_OPERATOR, doc="revisit the check stations now"),
    Command("activate_result", ROLE_OPERATOR, (
        Arg("result_id", v_record_id, required=True, doc="the result to make active"),
    ), doc="make a stored result the active calibration (roll back or forward)"),
)}


def validate_args(cmd: str, args: Any) -> dict[str, Any]:
    """Check ``args`` against the catalogue entry of ``cmd``; return them with defaults filled.

    Raises
    ------
    CommandError
        ``E_BAD_REQUEST`` naming the argument, the type expected and what was given.
    """
    spec = COMMANDS.get(cmd)
    if spec is None:
        raise CommandError(E_BAD_REQUEST, f"unknown command {cmd!r} (known: {', '.join(COMMANDS)})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise CommandError(E_BAD_REQUEST, f"args: expected a map, got {_what(args)}")
    known = {a.name: a for a in spec.args}
    unknown = [k for k in args if k not in known]
    if unknown:
        accepted = ", ".join(known) if known else "none"
        raise CommandError(E_BAD_REQUEST, f"{cmd}: unknown argument(s) {_names(unknown)} (accepted: {accepted})")
    out: dict[str, Any] = {}
    for a in spec.args:
        if a.name in args:
            try:
                out[a.name] = a.check(args[a.name])
            except _ArgError as exc:
                raise CommandError(E_BAD_REQUEST, f"{cmd}: args.{a.name}: {exc}") from None
        elif a.required:
            raise CommandError(E_BAD_REQUEST, f"{cmd}: args.{a.name} is required ({a.type_name})")
        elif a.default is not None:
            out[a.name] = a.default
    for group in spec.exclusive:
        given = [k for k in group if k in args]
        if len(given) > 1:
            raise CommandError(E_BAD_REQUEST, f"{cmd}: give at most one of {', '.join(group)}")
    if spec.one_of and sum(k in args for k in spec.one_of) != 1:
        raise CommandError(E_BAD_REQUEST, f"{cmd}: give exactly one of {', '.join(spec.one_of)}")
    return out


# --- msgpack -------------------------------------------------------------------------------------


def _default(obj: Any) -> Any:
    # numpy arrays and scalars (duck-typed so this module does not need numpy): their exact
    # Python values. Anything else is a bug in the caller, reported as such.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot encode {type(obj).__name__} on the cellcal wire")


def pack(obj: Any) -> bytes:
    """msgpack bytes of ``obj`` (str as msgpack str, bytes as bin, floats as float 64)."""
    return msgpack.packb(obj, use_bin_type=True, default=_default)


def _no_ext(code: int, data: bytes) -> Any:
    # (msgpack's timestamp, type -1, is decoded before this hook; as an argument it fails
    # the type checks like any other wrong value.)
    raise ValueError(f"msgpack extension type {code} is not used by cellcal")


def unpack(data: bytes, *, max_array: int = MAX_REQUEST_ARRAY, max_map: int = MAX_REQUEST_MAP) -> Any:
    """Decode msgpack strictly: UTF-8 strings, string map keys, no extension types, bounded.

    Raises
    ------
    ValueError
        Any malformed input (msgpack's own errors are ``ValueError`` subclasses).
    """
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext,
            max_str_len=len(data), max_bin_len=len(data), max_array_len=max_array,
            max_map_len=max_map, max_ext_len=len(data),
        )
    except ValueError:
        raise
    except Exception as exc:  # TypeError for unhashable keys, etc.: still malformed input
        raise ValueError(str(exc)) from exc


# --- requests and replies ------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A decoded, well-formed request (``args`` not yet validated against the command)."""

    id: str | int
    cmd: str
    args: dict[str, Any]


class BadRequest(CommandError):
    """``E_BAD_REQUEST`` carrying the request id if one could be read (``None`` otherwise)."""

    def __init__(self, message: str, request_id: str | int | None = None) -> None:
        super().__init__(E_BAD_REQUEST, message)
        self.request_id = request_id


def _valid_id(rid: Any) -> bool:
    if isinstance(rid, bool):
        return False
    if isinstance(rid, int):
        return 0 <= rid < 2**63
    return isinstance(rid, str) and 1 <= len(rid) <= MAX_ID_CHARS


def parse_request(data: bytes) -> Request:
    """Decode one request frame: msgpack map with ``id``, ``cmd`` and optional ``args``.

    The command name is checked against the catalogue; its arguments are not (authorise
    first, then :func:`validate_args`).

    Raises
    ------
    BadRequest
        With a message for people and the request id when one was readable.
    """
    try:
        obj = unpack(data)
    except ValueError as exc:
        raise BadRequest(f"not valid msgpack: {str(exc)[:200] or type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"a request must be a map {{id, cmd, args}}, got {_what(obj)}")
    rid = obj.get("id")
    if not _valid_id(rid):
        raise BadRequest(f"id: expected a string of 1..{MAX_ID_CHARS} characters or an integer in [0, 2**63), got {_what(rid)}")
    extra = [k for k in obj if k not in ("id", "cmd", "args")]
    if extra:
        raise BadRequest(f"unknown request field(s) {_names(extra)} (a request has id, cmd, args)", rid)
    cmd = obj.get("cmd")
    if not isinstance(cmd, str):
        raise BadRequest(f"cmd: expected a string, got {_what(cmd)}", rid)
    if cmd not in COMMANDS:
        raise BadRequest(f"unknown command {cmd[:64]!r} (known: {', '.join(COMMANDS)})", rid)
    args = obj.get("args")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise BadRequest(f"args: expected a map, got {_what(args)}", rid)
    return Request(typing.cast("str | int", rid), cmd, args)


def ok_reply(request_id: str | int | None, result: Any) -> dict[str, Any]:
    return {"id": request_id, "ok": True, "result": result}


def error_reply(request_id: str | int | None, code: str, message: str) -> dict[str, Any]:
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message}}


def pack_ok(request_id: str | int | None, result: Any) -> bytes:
    return pack(ok_reply(request_id, result))


def pack_error(request_id: str | int | None, code: str, message: str) -> bytes:
    return pack(error_reply(request_id, code, message))


# --- envelope ------------------------------------------------------------------------------------


def new_boot_id() -> str:
    """16 random hex characters, chosen once per daemon start."""
    return secrets.token_hex(8)


def make_envelope(seq: int, boot_id: str, body: Mapping[str, Any], ts_ns: int | None = None) -> dict[str, Any]:
    """The envelope as a dict (``ts_ns`` defaults to now, wall-clock UTC ns)."""
    return {"schema": SCHEMA, "v": V, "seq": int(seq), "boot_id": boot_id,
            "ts_ns": time.time_ns() if ts_ns is None else int(ts_ns), "body": dict(body)}


_P_HEAD = b"\x86" + pack("schema") + pack(SCHEMA) + pack("v") + pack(V)  # fixmap of 6 entries
_P_SEQ, _P_BOOT, _P_TS, _P_BODY = pack("seq"), pack("boot_id"), pack("ts_ns"), pack("body")


def pack_envelope(seq: int, boot_id: str, ts_ns: int, body_packed: bytes) -> bytes:
    """Envelope bytes around an already-packed body.

    The body is packed in the publisher's thread (so a body that cannot be encoded fails
    there, at the caller) while ``seq`` is assigned in the I/O thread (so it follows the
    order on the wire). A msgpack map is a header and its key/value encodings in a row, so
    the two parts are joined without re-encoding. Equal to ``pack(make_envelope(...))``.
    """
    return b"".join((_P_HEAD, _P_SEQ, pack(int(seq)), _P_BOOT, pack(boot_id), _P_TS, pack(int(ts_ns)),
                     _P_BODY, body_packed))


def packed_map(items: list[tuple[str, bytes]]) -> bytes:
    """A msgpack map from keys and already-packed values (see :func:`pack_envelope`)."""
    n = len(items)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
    return head + b"".join(pack(k) + v for k, v in items)


def check_envelope(env: Any) -> str | None:
    """``None`` if ``env`` is a well-formed v1 envelope, else what is wrong."""
    if not isinstance(env, dict):
        return f"envelope must be a map, got {_what(env)}"
    if env.get("schema") != SCHEMA or env.get("v") != V:
        return f"schema {env.get('schema')!r} v {env.get('v')!r} is not {SCHEMA} v {V}"
    seq, boot, ts, body = env.get("seq"), env.get("boot_id"), env.get("ts_ns"), env.get("body")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        return f"seq must be a positive integer, got {_what(seq)}"
    if not isinstance(boot, str) or not boot:
        return f"boot_id must be a non-empty string, got {_what(boot)}"
    if isinstance(ts, bool) or not isinstance(ts, int):
        return f"ts_ns must be an integer, got {_what(ts)}"
    if not isinstance(body, dict):
        return f"body must be a map, got {_what(body)}"
    return None


# --- bodies of topics and results of commands ----------------------------------------------------
# These TypedDicts are the contract the daemon produces and clients read (the doc repeats
# them with units). Optional values are ``X | None`` and always present; the checker below
# lets the daemon's tests assert what it publishes.


class DeviceStatus(TypedDict):
    connected: bool
    url: str                      # as configured (robot.url / tracker.url)
    identity: str | None          # model and serial the device reported; None if never connected


class Devices(TypedDict):
    robot: DeviceStatus
    tracker: DeviceStatus


class HeartbeatBody(TypedDict):
    cell: str                     # [service] name
    state: StateName
    uptime_s: float               # since the daemon started (monotonic)
    heartbeat_s: float            # the heartbeat period; silence for 3 periods means trouble
    devices: Devices              # "robot" and "tracker"
    active_result_id: str | None
    suspect: bool                 # the active result failed a drift check
    run_id: str | None            # run or drift check in progress
    version: str                  # cellcal version


StatusResult = HeartbeatBody  # get_status returns the heartbeat body, fresh


class StateBody(TypedDict):
    state: StateName
    previous: StateName | None    # state before this transition (None at start)
    reason: str                   # why, for people ("run r-12 started by ops (3f9a1c2e)")
    run_id: str | None
    kind: RunKind | None          # run kind while CAPTURING/SOLVING
    motion_mode: MotionMode


class SettleFigures(TypedDict):
    robot_rest_s: float           # how long the robot had been at rest at capture
    max_joint_speed_rad_s: float  # over the rest window
    max_flange_speed_m_s: float
    tracker_std_translation_m: float
    tracker_std_rotation_rad: float | None  # None for point (3-DoF) measurements
    overlap_s: float              # overlap of the robot and tracker rest windows


class StationBody(TypedDict):
    run_id: str
    index: int                    # 0-based station index in the plan (observe mode: capture number)
    planned: int                  # stations in the plan (observe mode: stations wanted)
    attempt: int                  # 1-based attempt at this station
    accepted: bool
    reason: str | None            # why rejected; None when accepted
    accepted_count: int           # accepted stations so far in this run
    settle: SettleFigures


class Quaternion(TypedDict):
    w: float
    x: float
    y: float
    z: float


class Transform(TypedDict):
    parent_frame: str
    child_frame: str
    matrix: list[float]           # 16, row-major, translation in metres
    translation_m: list[float]    # 3
    quaternion: Quaternion        # w >= 0


class Point(TypedDict):
    frame: str                    # the frame the coordinates are in (a of a_p_x)
    position_m: list[float]       # 3


class Residuals(TypedDict):
    translation_m: list[float]    # per station
    rotation_rad: list[float]


class Provenance(TypedDict):
    config_sha256: str
    device_serials: dict[str, str]  # "robot", "tracker"
    solver: str
    frame_convention: str
    valid_from_ns: int            # wall-clock UTC ns from which the result describes the cell
    cellcal_version: str


class WeakestAxis(TypedDict):
    frame: str                    # frame of the unit vector
    unit: list[float]             # 3, the direction the data determine least well


class Covariance(TypedDict):
    shape: list[int]              # [6, 6] for a transform, [3, 3] for a point
    values: list[float | None]    # row-major; None where not computed


class JointCovariance(TypedDict):
    order: list[str]              # estimate names, one block each (6 per transform, 3 per point)
    shape: list[int]              # [k, k]
    values: list[float | None]    # row-major


class Uncertainty(TypedDict):
    convention: str               # right perturbation T exp(xi), xi = (rho [m], phi [rad]); points m^2
    covariance: dict[str, Covariance]  # every transform and point of the result, by name
    joint: JointCovariance
    sigma_translation_m: float | None   # 1-sigma (root of the trace) of the first estimate
    sigma_rotation_rad: float | None
    noise_translation_m: float | None   # per-axis measurement 1-sigma the fit used
    noise_rotation_rad: float | None    # None for point measurements
    noise_source: str
    chi2: float | None
    dof: int
    refined: bool                 # maximum-likelihood refinement (False: the linear answer)
    iterations: int
    downweighted_stations: list[int]


class Holdout(TypedDict):
    method: str                   # "linearised leave-one-out", "k-fold refit", ...
    folds: int
    p50_translation_m: float | None     # None: not determinable without some station
    p90_translation_m: float | None
    max_translation_m: float | None
    p50_rotation_rad: float | None
    p90_rotation_rad: float | None
    max_rotation_rad: float | None
    inflation: float | None       # RMS held-out over RMS in-sample closure
    translation_m: list[float | None]   # per station
    rotation_rad: list[float | None]


class LinearAgreement(TypedDict):
    translation_m: float | None
    rotation_rad: float | None
    sigmas: float | None          # Mahalanobis length under the refined covariance


class _ResultBodyV1(TypedDict):
    result_id: str
    run_id: str | None
    kind: RunKind
    cell: str
    created_ns: int               # wall-clock UTC ns
    active: bool
    suspect: bool
    retained: bool                # True when republished unchanged (every [zmq] republish_s)
    transforms: dict[str, Transform]  # every transform the result estimated, by name
    n_stations: int
    rms_translation_m: float
    max_translation_m: float
    rms_rotation_rad: float
    max_rotation_rad: float
    axis_spread: float            # 0 = parallel rotation axes ... 1 = isotropic
    residuals: Residuals
    provenance: Provenance


class ResultBody(_ResultBodyV1, total=False):
    """A calibration result (``cellcal/v1/result``, ``get_result``).

    The keys declared here were added within v1: every result this version solves has them
    (``cellcal.daemon.report.result_to_wire`` writes them for every result type), results
    stored by earlier versions may lack them. ``holdout`` and ``linear_agreement`` are
    ``None`` when the result has none.
    """

    points: dict[str, Point]      # every point the result estimated, by name (may be empty)
    n_motions: int
    weakest_axis: WeakestAxis
    max_motion_rad: float
    solver: str
    frame_convention: str
    uncertainty: Uncertainty
    holdout: Holdout | None
    linear_agreement: LinearAgreement | None


class DriftStation(TypedDict):
    index: int                    # check station index
    translation_m: float
    rotation_rad: float | None    # None for point measurements


class Cusum(TypedDict):
    value_m: float                # current CUSUM statistic
    k_m: float                    # slack per check
    h_m: float                    # alarm level
    alarm: bool


class DriftBody(TypedDict):
    result_id: str
    check_id: int                 # 1-based count of checks of this result
    deviation_translation_m: float  # worst over the check stations
    deviation_rotation_rad: float | None
    warn_translation_m: float
    fail_translation_m: float
    warn_rotation_rad: float
    fail_rotation_rad: float
    cusum: Cusum
    status: DriftStatus
    suspect: bool                 # the result is now marked suspect
    action: DriftAction
    stations: list[DriftStation]


class FaultBody(TypedDict):
    code: ErrorCode               # an error code (E_DEVICE, E_INTERNAL, ...)
    device: DeviceName | None     # "robot", "tracker" or None (the daemon itself)
    message: str
    state: StateName              # daemon state after the fault
    active: bool                  # True when raised, False when cleared
    retry_in_s: float | None      # next reconnection attempt


class SnapshotResult(TypedDict):
    seq: int
    boot_id: str
    messages: dict[str, dict[str, Any]]  # topic -> envelope


class ResultSummary(TypedDict):
    result_id: str
    run_id: str | None
    kind: str
    created_ns: int
    active: bool
    suspect: bool
    accepted: bool                # passed its acceptance gates (only accepted results can be activated)
    n_stations: int
    rms_translation_m: float
    rms_rotation_rad: float


class ListResultsResult(TypedDict):
    results: list[ResultSummary]
    active_result_id: str | None


class ToBasePointResult(TypedDict):
    result_id: str
    suspect: bool
    frame: str                    # "base"
    point_m: list[float]


class ToBasePoseResult(TypedDict):
    result_id: str
    suspect: bool
    pose: Transform               # base_T_<child_frame>


class StartRunResult(TypedDict):
    run_id: str
    kind: RunKind
    planned: int


class AbortResult(TypedDict):
    aborted: bool
    run_id: str | None


class DriftCheckResult(TypedDict):
    result_id: str                # the calibration the queued check will measure
    check_id: int                 # the check_id its cellcal/v1/drift message will carry (ADR 0009)


class ActivateResult(TypedDict):
    active_result_id: str
    previous_result_id: str | None


BODY_TYPES: dict[str, type] = {
    TOPIC_HEARTBEAT: HeartbeatBody, TOPIC_STATE: StateBody, TOPIC_STATION: StationBody,
    TOPIC_RESULT: ResultBody, TOPIC_DRIFT: DriftBody, TOPIC_FAULT: FaultBody,
}
RESULT_TYPES: dict[str, Any] = {
    "get_status": StatusResult, "get_snapshot": SnapshotResult, "get_result": ResultBody,
    "list_results": ListResultsResult, "to_base": ToBasePointResult | ToBasePoseResult,
    "start_run": StartRunResult, "abort": AbortResult, "run_drift_check": DriftCheckResult,
    "activate_result": ActivateResult,
}


def _problems(value: Any, tp: Any, path: str) -> list[str]:
    origin = typing.get_origin(tp)
    if tp is Any:
        return []
    if tp is type(None):
        return [] if value is None else [f"{path}: expected nil, got {_what(value)}"]
    if origin is Union or origin is types.UnionType:
        options = typing.get_args(tp)
        attempts = [_problems(value, o, path) for o in options]
        return [] if any(not a for a in attempts) else min(attempts, key=len)
    if origin is Literal:
        return [] if value in typing.get_args(tp) else [f"{path}: expected one of {typing.get_args(tp)}, got {_what(value)}"]
    if tp is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected a boolean, got {_what(value)}"]
    if tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer, got {_what(value)}"]
    if tp is float:
        return [] if _is_number(value) else [f"{path}: expected a finite number, got {_what(value)}"]
    if tp is str:
        return [] if isinstance(value, str) else [f"{path}: expected a string, got {_what(value)}"]
    if origin is list:
        if not isinstance(value, list):
            return [f"{path}: expected an array, got {_what(value)}"]
        (et,) = typing.get_args(tp)
        return [p for i, x in enumerate(value) for p in _problems(x, et, f"{path}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {_what(value)}"]
        _kt, vt = typing.get_args(tp)
        return [p for k, x in value.items() for p in _problems(x, vt, f"{path}.{k}")]
    if typing.is_typeddict(tp):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {_what(value)}"]
        hints = typing.get_type_hints(tp)
        out = []
        for k, t in hints.items():
            if k not in value:
                if k in tp.__required_keys__:
                    out.append(f"{path}.{k}: missing")
            else:
                out += _problems(value[k], t, f"{path}.{k}" if path else k)
        return out
    raise TypeError(f"no checker for {tp!r}")  # a schema bug


def check_body(topic: str, body: Any) -> list[str]:
    """What is wrong with ``body`` for ``topic`` (empty list: it conforms; extra fields are allowed)."""
    if topic not in BODY_TYPES:
        return [f"unknown topic {topic!r}"]
    return _problems(body, BODY_TYPES[topic], "body")


def check_result(cmd: str, result: Any) -> list[str]:
    """What is wrong with the ``result`` of command ``cmd`` (empty list: it conforms)."""
    if cmd not in RESULT_TYPES:
        return [f"unknown command {cmd!r}"]
    return _problems(result, RESULT_TYPES[cmd], "result")


def check_reply(cmd: str, reply: Any, request_id: str | int | None = None) -> list[str]:
    """What is wrong with a whole reply to ``cmd``: ``{id, ok, result}`` or ``{id, ok: false, error}``.

    ``request_id``, when given, must be echoed. An ``ok`` reply's ``result`` is checked with
    :func:`check_result`; an error's ``code`` must be one of ``ERROR_CODES``.
    """
    if not isinstance(reply, dict):
        return [f"reply: expected a map, got {_what(reply)}"]
    out = []
    if request_id is not None and (reply.get("id") != request_id or type(reply.get("id")) is not type(request_id)):
        out.append(f"reply.id: expected {request_id!r}, got {reply.get('id')!r}")
    ok = reply.get("ok")
    if not isinstance(ok, bool):
        return out + [f"reply.ok: expected a boolean, got {_what(ok)}"]
    if ok:
        if "result" not in reply:
            return out + ["reply.result: missing"]
        return out + check_result(cmd, reply["result"])
    err = reply.get("error")
    if not isinstance(err, dict):
        return out + [f"reply.error: expected a map, got {_what(err)}"]
    if err.get("code") not in ERROR_CODES:
        out.append(f"reply.error.code: expected one of {ERROR_CODES}, got {_what(err.get('code'))}")
    if not isinstance(err.get("message"), str) or not err.get("message"):
        out.append(f"reply.error.message: expected a non-empty string, got {_what(err.get('message'))}")
    return out


def find_non_finite(obj: Any, path: str = "result", _depth: int = 0) -> str | None:
    """The path of the first NaN or infinity in ``obj`` (dicts, lists, numbers), or ``None``.

    Replies never carry non-finite numbers (msgpack would, JSON and many clients would not);
    the server refuses a result holding one. Numpy arrays count like lists.
    """
    if isinstance(obj, float):
        return None if math.isfinite(obj) else path
    if _depth > 64:
        return None  # results are shallow; deeper is no number of ours
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            bad = find_non_finite(v, f"{path}.{k}", _depth + 1)
            if bad:
                return bad
        return None
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            bad = find_non_finite(v, f"{path}[{i}]", _depth + 1)
            if bad:
                return bad
        return None
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return find_non_finite(obj.tolist(), path, _depth + 1)
    return None


# --- to_base -------------------------------------------------------------------------------------


def pose_from_wire(pose: Mapping[str, Any]):
    """4x4 ``numpy`` transform from a validated pose argument (``matrix`` or translation + quaternion)."""
    import numpy as np

    if "matrix" in pose:
        return np.array(pose["matrix"], dtype=float).reshape(4, 4)
    from cellcal.solver.se3 import transform_from_xyz_quat

    q = pose["quaternion"]
    return transform_from_xyz_quat(np.array(pose["translation_m"], dtype=float),
                                   np.array([q["w"], q["x"], q["y"], q["z"]], dtype=float))


def to_base_reply(cell_T_base: Any, args: Mapping[str, Any], *, result_id: str, suspect: bool) -> dict[str, Any]:
    """The ``to_base`` result for validated ``args``, given the calibration's ``cell_T_base``.

    A point ``cell_p`` becomes ``base_p = inv(cell_T_base) @ cell_p``; a pose ``cell_T_x``
    becomes ``base_T_x = inv(cell_T_base) @ cell_T_x``, in wire form with ``child_frame``
    named by ``args["child_frame"]``.
    """
    import numpy as np

    from cellcal.daemon.report import transform_to_wire
    from cellcal.solver.se3 import se3_inverse

    with np.errstate(over="ignore", invalid="ignore"):
        base_T_cell = se3_inverse(np.asarray(cell_T_base, dtype=float))
        if "point_m" in args:
            p = base_T_cell[:3, :3] @ np.asarray(args["point_m"], dtype=float) + base_T_cell[:3, 3]
            out: dict[str, Any] = {"result_id": result_id, "suspect": bool(suspect), "frame": "base",
                                   "point_m": [float(v) for v in p]}
        else:
            base_T_x = base_T_cell @ pose_from_wire(args["pose"])
            if not np.all(np.isfinite(base_T_x)):
                raise CommandError(E_BAD_REQUEST, "to_base: the pose in the base frame is not finite "
                                                  "(an argument near the float 64 maximum)")
            child = args.get("child_frame", "pose")
            out = {"result_id": result_id, "suspect": bool(suspect), "pose": transform_to_wire(f"base_T_{child}", base_T_x)}
    bad = find_non_finite(out)
    if bad:
        # Refuse rather than send inf: the arguments are in range, so the calibration or the
        # point is beyond what float 64 can carry through the product.
        raise CommandError(E_BAD_REQUEST, f"to_base: {bad} would not be finite; the argument is out of range")
    return out
