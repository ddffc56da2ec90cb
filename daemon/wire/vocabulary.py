"""The vocabulary of the ``cellcal/v1`` protocol: every word a client sees on the wire.

Topics, the schema name, error codes, roles, state names, run kinds, motion modes, drift
statuses and actions, device names and the bounds of inputs; each set both as constants and
as the ``Literal`` type the bodies are checked against (they are checked against each other
at import). Read through ``cellcal.daemon.protocol`` (``protocol as P``): the speakers never
spell one of these words out.
"""

from __future__ import annotations

import typing
from typing import Final, Literal

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

RunKind = Literal["base_frame", "tool_point", "hand_eye", "kinematics", "intrinsics", "eye_to_hand"]
KIND_BASE_FRAME: Final = "base_frame"
KIND_TOOL_POINT: Final = "tool_point"
KIND_HAND_EYE: Final = "hand_eye"
KIND_KINEMATICS: Final = "kinematics"  # the arm's own DH geometry (cellcal.daemon.kinematics_run)
KIND_INTRINSICS: Final = "intrinsics"  # a camera's intrinsics from views of its target (ADR 0030)
#: ``to_base frame=``: a point or pose given in the camera frame of a camera hand-eye result (ADR 0031).
FRAME_CAMERA: Final = "camera"
FRAME_CELL: Final = "cell"
TO_BASE_FRAMES: tuple[str, ...] = (FRAME_CELL, FRAME_CAMERA)
KIND_EYE_TO_HAND: Final = "eye_to_hand"  # a fixed camera in the base frame, its target on the flange (ADR 0031)
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

DeviceName = Literal["robot", "tracker", "camera"]
DEVICE_ROBOT: Final = "robot"
DEVICE_TRACKER: Final = "tracker"
DEVICE_CAMERA: Final = "camera"     # only in a cell with a [camera] section (ADR 0030)
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


