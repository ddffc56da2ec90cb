"""The cellcal ZeroMQ protocol, schema ``cellcal/v1``: the one name every speaker imports.

Everything a client sees on the wire is named here (defined, by seam, in
``cellcal.daemon.wire``: ``vocabulary``, ``commands``, ``codec``, ``types``): topics, the envelope, requests and
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
    without CURVE an admitted local peer (``config.security.check_security``) has ``[zmq]
    null_role`` (default ``observer``).

Inputs
    Arguments are bounded here, before any command runs (``v_record_id``, ``v_name``,
    ``MAX_POSITION_M``, ``MAX_JOINT_RAD``), and a reply never holds a non-finite number
    (``find_non_finite``; ``to_base`` refuses instead).

Bodies of topics and results of commands are the TypedDicts below (``HeartbeatBody``,
``ResultBody``, ..., and ``Envelope`` around them). Within ``v = 1`` fields may be added,
never removed or retyped, so clients must ignore fields they do not know.

What the store keeps of runs and results is JSON of the shapes ``RunPlan``, ``StoredResult``,
``StoredProvenance`` and ``DriftRecord`` (every key optional: records of earlier versions
may lack some); records of open shape are ``JsonObject``.
"""


from __future__ import annotations

from cellcal.daemon.wire.codec import (  # noqa: F401 - re-exported
    BadRequest,
    Request,
    check_envelope,
    error_reply,
    make_envelope,
    new_boot_id,
    ok_reply,
    pack,
    pack_envelope,
    pack_error,
    pack_ok,
    packed_map,
    parse_request,
    unpack,
)
from cellcal.daemon.wire.commands import (  # noqa: F401 - re-exported
    COMMANDS,
    Arg,
    Caller,
    Command,
    CommandError,
    Handler,
    PoseArg,
    StationArg,
    Validator,
    v_name,
    v_record_id,
    validate_args,
)
from cellcal.daemon.wire.types import (  # noqa: F401 - re-exported
    BODY_TYPES,
    INTRINSICS_RESULT_KEYS,
    RESULT_TYPES,
    AbortResult,
    ActivateResult,
    CheckStationRecord,
    CornerResidualsWire,
    Covariance,
    Cusum,
    Devices,
    DeviceStatus,
    DriftBody,
    DriftCheckResult,
    DriftRecord,
    DriftStation,
    Envelope,
    FaultBody,
    HeartbeatBody,
    Holdout,
    Identification,
    ImageCoverageWire,
    Intrinsics,
    IntrinsicsHoldoutWire,
    JointCovariance,
    JsonObject,
    JsonValue,
    LinearAgreement,
    ListResultsResult,
    PlanStationRecord,
    Point,
    Provenance,
    Quaternion,
    Residuals,
    ResultBody,
    ResultSummary,
    RunPlan,
    RunStart,
    SettleFigures,
    SnapshotResult,
    StartRunResult,
    StateBody,
    StationBody,
    StatusResult,
    StoredGates,
    StoredProvenance,
    StoredResult,
    TargetWire,
    ToBasePointResult,
    ToBasePoseResult,
    Transform,
    Uncertainty,
    WeakestAxis,
    check_body,
    check_reply,
    check_result,
    find_non_finite,
)
from cellcal.daemon.wire.vocabulary import (  # noqa: F401 - re-exported
    ACTION_MARKED_SUSPECT,
    ACTION_NONE,
    ACTION_RECALIBRATING,
    DEVICE_CAMERA,
    DEVICE_ROBOT,
    DEVICE_TRACKER,
    DEVICES,
    DRIFT_ACTIONS,
    DRIFT_FAIL,
    DRIFT_OK,
    DRIFT_STATUSES,
    DRIFT_WARN,
    E_BAD_REQUEST,
    E_BUSY,
    E_DEVICE,
    E_FORBIDDEN,
    E_INTERNAL,
    E_NO_CALIBRATION,
    E_NOT_FOUND,
    E_STATE,
    E_UNAVAILABLE,
    ERROR_CODES,
    FRAME_CAMERA,
    FRAME_CELL,
    KIND_BASE_FRAME,
    KIND_EYE_TO_HAND,
    KIND_HAND_EYE,
    KIND_INTRINSICS,
    KIND_KINEMATICS,
    KIND_TOOL_POINT,
    MAX_JOINT_RAD,
    MAX_POSITION_M,
    MOTION_COMMAND,
    MOTION_MODES,
    MOTION_OBSERVE,
    ROLE_OBSERVER,
    ROLE_OPERATOR,
    ROLES,
    RUN_KINDS,
    SCHEMA,
    STATE_CAPTURING,
    STATE_CHECKING,
    STATE_FAULT,
    STATE_IDLE,
    STATE_SOLVING,
    STATES,
    TO_BASE_FRAMES,
    TOPIC_DRIFT,
    TOPIC_FAULT,
    TOPIC_HEARTBEAT,
    TOPIC_PREFIX,
    TOPIC_RESULT,
    TOPIC_STATE,
    TOPIC_STATION,
    TOPICS,
    DeviceName,
    DriftAction,
    DriftStatus,
    ErrorCode,
    MotionMode,
    RunKind,
    StateName,
    V,
    role_allows,
)

__all__ = [
    "SCHEMA", "V", "TOPIC_PREFIX", "TOPIC_HEARTBEAT", "TOPIC_STATE", "TOPIC_STATION",
    "TOPIC_RESULT", "TOPIC_DRIFT", "TOPIC_FAULT", "TOPICS",
    "E_BAD_REQUEST", "E_FORBIDDEN", "E_NOT_FOUND", "E_BUSY", "E_STATE", "E_NO_CALIBRATION",
    "E_DEVICE", "E_UNAVAILABLE", "E_INTERNAL", "ERROR_CODES",
    "ROLE_OBSERVER", "ROLE_OPERATOR", "ROLES", "role_allows",
    "STATES", "RUN_KINDS", "DRIFT_STATUSES", "DEVICES",
    "StateName", "RunKind", "MotionMode", "DriftStatus", "DriftAction", "DeviceName", "ErrorCode",
    "STATE_IDLE", "STATE_CAPTURING", "STATE_SOLVING", "STATE_CHECKING", "STATE_FAULT",
    "KIND_BASE_FRAME", "KIND_TOOL_POINT", "KIND_HAND_EYE", "KIND_KINEMATICS", "KIND_INTRINSICS", "KIND_EYE_TO_HAND",
    "MOTION_COMMAND", "MOTION_OBSERVE", "FRAME_CAMERA", "FRAME_CELL", "TO_BASE_FRAMES",
    "DRIFT_OK", "DRIFT_WARN", "DRIFT_FAIL", "ACTION_NONE", "ACTION_MARKED_SUSPECT", "ACTION_RECALIBRATING",
    "DEVICE_ROBOT", "DEVICE_TRACKER", "DEVICE_CAMERA", "check_reply", "Devices",
    "Caller", "CommandError", "Handler", "Arg", "Command", "COMMANDS",
    "Request", "BadRequest", "parse_request", "validate_args", "MOTION_MODES", "DRIFT_ACTIONS",
    "pack", "unpack", "new_boot_id", "make_envelope", "pack_envelope", "packed_map", "check_envelope",
    "ok_reply", "error_reply", "pack_ok", "pack_error",
    "check_body", "check_result", "BODY_TYPES", "RESULT_TYPES",
    "find_non_finite", "v_record_id", "v_name",
    "MAX_POSITION_M", "MAX_JOINT_RAD",
    "HeartbeatBody", "DeviceStatus", "StateBody", "StationBody", "SettleFigures", "ResultBody", "Transform",
    "Quaternion", "Residuals", "Provenance", "DriftBody", "DriftStation", "Cusum", "FaultBody",
    "StatusResult", "SnapshotResult", "ResultSummary", "ListResultsResult", "ToBasePointResult",
    "ToBasePoseResult", "StartRunResult", "AbortResult", "DriftCheckResult", "ActivateResult",
    "JsonValue", "JsonObject", "Point", "WeakestAxis", "Covariance", "JointCovariance", "Uncertainty", "Holdout",
    "LinearAgreement", "Envelope", "PoseArg", "StationArg", "Validator",
    "RunPlan", "PlanStationRecord", "RunStart", "Identification", "CheckStationRecord", "StoredGates", "StoredResult",
    "StoredProvenance", "DriftRecord", "INTRINSICS_RESULT_KEYS", "Intrinsics", "CornerResidualsWire",
    "ImageCoverageWire", "IntrinsicsHoldoutWire", "TargetWire",
]
