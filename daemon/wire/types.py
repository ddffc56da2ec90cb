"""The bodies of the ``cellcal/v1`` topics and the results of its commands, as TypedDicts.

These are the contract the daemon produces and clients read (``docs/protocols/zeromq.md``
repeats them with units); :func:`check_body`, :func:`check_result` and :func:`check_reply`
let the daemon's tests assert what it publishes. Read through ``cellcal.daemon.protocol``.
"""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Mapping
from typing import Literal, TypeAlias, TypedDict, Union

from cellcal.daemon.wire.commands import _is_number, _what
from cellcal.daemon.wire.vocabulary import (
    ERROR_CODES,
    TOPIC_DRIFT,
    TOPIC_FAULT,
    TOPIC_HEARTBEAT,
    TOPIC_RESULT,
    TOPIC_STATE,
    TOPIC_STATION,
    DeviceName,
    DriftAction,
    DriftStatus,
    ErrorCode,
    MotionMode,
    RunKind,
    StateName,
)

# --- bodies of topics and results of commands ----------------------------------------------------
# These TypedDicts are the contract the daemon produces and clients read (the doc repeats
# them with units). Optional values are ``X | None`` and always present; the checker below
# lets the daemon's tests assert what it publishes.


#: A JSON value as the daemon stores and sends it (what ``json`` and msgpack carry both ways):
#: the type of records whose shape is open (a result's stored record, a station's settle
#: figures and raw samples). Code that reads one narrows it (``isinstance``) or reads it
#: through the TypedDicts below; code that writes one builds it from these cases only.
JsonValue: TypeAlias = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]
#: A JSON object (a map with string keys).
JsonObject: TypeAlias = dict[str, JsonValue]


class DeviceStatus(TypedDict):
    connected: bool
    url: str                      # as configured (robot.url / tracker.url)
    identity: str | None          # model and serial the device reported; None if never connected


class _DevicesV1(TypedDict):
    robot: DeviceStatus
    tracker: DeviceStatus


class Devices(_DevicesV1, total=False):
    """The heartbeat's devices: ``robot`` and ``tracker`` always; ``camera`` (added within v1)
    only in a cell configured with a ``[camera]`` section (ADR 0030)."""

    camera: DeviceStatus


class HeartbeatBody(TypedDict):
    cell: str                     # [service] name
    state: StateName
    uptime_s: float               # since the daemon started (monotonic)
    heartbeat_s: float            # the heartbeat period; silence for 3 periods means trouble
    devices: Devices              # "robot" and "tracker" (and "camera" in a cell with one)
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
    device_serials: dict[str, str]  # "robot", "tracker", "camera" ("" when none)
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


class CornerResidualsWire(TypedDict):
    """Every corner an intrinsics fit used (``ResultBody.intrinsics.corners``), one entry per corner."""

    view: list[int]               # index into intrinsics.views
    ids: list[int]                # the target's corner id
    image_points_px: list[list[float]]  # detected (u, v), px; (0, 0) the centre of the first pixel
    residuals_px: list[list[float]]     # detected minus reprojected, px


class ImageCoverageWire(TypedDict):
    fraction: float               # share of the grid's cells holding a corner of some view
    grid: list[int]               # [columns, rows]
    occupied: list[list[bool]]    # rows x columns, row 0 at the image's top
    max_radius_fraction: float    # the farthest corner from the image centre, over the half-diagonal


class IntrinsicsHoldoutWire(TypedDict):
    method: str                   # "k-fold refit" or "none"
    folds: int
    rms_px: float | None          # RMS reprojection of the held-out views, px (None: method "none")
    inflation: float | None       # rms_px over the fit's RMS
    view_rms_px: list[float | None]  # per view (intrinsics.views order)


class TargetWire(TypedDict):
    type: str                     # "charuco" or "chessboard"
    squares_x: int
    squares_y: int
    square_m: float
    marker_m: float | None        # ChArUco only
    dictionary: str | None        # ChArUco only, OpenCV's name
    sha256: str | None            # of the target file's bytes


class Intrinsics(TypedDict):
    """An intrinsics result's detail (``ResultBody.intrinsics``, ADR 0022 and 0030); the
    camera itself is at the body's top (``camera_matrix``, ``dist_coeffs``, ``image_size``)."""

    parameter_names: list[str]    # fx, fy, cx, cy, k1, k2, p1, p2, k3: the order below
    parameters: list[float]       # px for fx..cy, unitless for the distortion
    sigmas: list[float | None]    # 1-sigma of each
    covariance: Covariance        # 9 x 9, parameter_names order
    fixed: list[str]              # parameters held at their start value
    view_rms_px: list[float]      # per view
    views: list[int]              # the run's station (plan index) of each view used
    views_dropped: list[int]      # stations with too few corners
    view_tilt_deg: list[float]    # the target normal's angle to the optical axis, per view
    tilt_deg: float               # the tilt figure the refusal reads (weakest image direction)
    holdout: IntrinsicsHoldoutWire
    coverage: ImageCoverageWire
    corners: CornerResidualsWire
    noise_px: float               # corner noise the covariance used, 1-sigma per image axis
    noise_source: str             # "estimated" or "declared"
    chi2: float
    dof: int
    n_views: int
    n_corners: int
    target: TargetWire


class ResultBody(_ResultBodyV1, total=False):
    """A calibration result (``cellcal/v1/result``, ``get_result``).

    The keys declared here were added within v1: every result this version solves has them
    (``cellcal.daemon.report.result_to_wire`` writes them for every result type), results
    stored by earlier versions may lack them. ``holdout`` and ``linear_agreement`` are
    ``None`` when the result has none. ``camera_matrix``, ``dist_coeffs``, ``image_size``,
    ``reprojection_rms_px`` and ``intrinsics`` are an intrinsics result's (kind
    ``intrinsics``, ADR 0030); a camera hand-eye result (``hand_eye`` with the cell's camera,
    ``eye_to_hand``, ADR 0031) has the first four too, and its chain's figures under
    ``camera_hand_eye`` (``docs/protocols/zeromq.md``); no pose result has any of them.
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
    camera_matrix: list[list[float]]  # 3 x 3, px: [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]
    dist_coeffs: list[float]      # k1, k2, p1, p2, k3 (OpenCV's order)
    image_size: list[int]         # [width, height], px
    reprojection_rms_px: float
    intrinsics: Intrinsics


#: The keys of ``ResultBody`` only camera results have (intrinsics; a camera hand-eye result
#: all but ``intrinsics``): every other key declared there beyond ``_ResultBodyV1`` is every result's.
INTRINSICS_RESULT_KEYS = frozenset({"camera_matrix", "dist_coeffs", "image_size", "reprojection_rms_px", "intrinsics"})


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


class Envelope(TypedDict):
    """One PUB message's frame 1 (``codec.make_envelope``, ``codec.check_envelope``): the body
    is the topic's TypedDict (``BODY_TYPES``), read here as the map it is on the wire."""

    schema: str                   # "cellcal/v1"
    v: int                        # 1
    seq: int                      # 1, 2, ... per daemon start, across all topics
    boot_id: str                  # 16 hex characters, new at each daemon start
    ts_ns: int                    # wall-clock UTC ns when the daemon produced the message
    body: dict[str, object]


class SnapshotResult(TypedDict):
    seq: int
    boot_id: str
    messages: dict[str, Envelope]  # topic -> envelope


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


# --- what the store keeps (``cellcal.daemon.store``) --------------------------------------------------
# The records below are JSON the store writes and reads back as it was written; every key is
# optional (``total=False``): a record stored by an earlier version, or by a kind with less to
# say, may lack some. Code that reads one takes ``Mapping[str, object]`` and narrows, or reads
# the keys declared here; code that writes one builds these shapes.


class PlanStationRecord(TypedDict):
    """One station of a run's stored plan (``runs.plan.plan_to_dict``)."""

    index: int
    q_rad: list[float] | None         # joint targets, rad (None: a flange pose target)
    base_T_flange: list[float] | None  # 16, row-major, metres (None: a joint target)


class RunStart(TypedDict, total=False):
    """What a run remembers of its start (``RunPlan.started``)."""

    motion_mode: str                  # protocol.MotionMode it may resume in
    measure: str                      # [tracker] measure: what its stations measure
    last_activation_id: int           # the newest activation then (0: none)


class Identification(TypedDict, total=False):
    """A kinematics run's split of its stations (``RunPlan.identification``)."""

    n_fit: int                        # the first n_fit stations are fitted, the rest validate


class RunPlan(TypedDict, total=False):
    """``RunRecord.plan``: a run's station plan and what it remembers of its start."""

    stations: list[PlanStationRecord]  # the planned stations (empty for given stations)
    given: list[JsonObject]            # stations a client supplied (start_run stations=...)
    started: RunStart
    identification: Identification    # kinematics runs only
    camera_view: JsonObject            # camera runs: the view pose planned from (q_rad, base_T_flange)
    camera_target: JsonObject          # camera runs: the target file captured with (sha256, toml, mounting)


class CheckStationRecord(TypedDict):
    """One check station of a result (``drift.choose_check_stations``)."""

    plan_index: int
    q_rad: list[float]
    base_T_flange: list[float]        # 16, row-major, metres


class StoredGates(TypedDict, total=False):
    """A result's acceptance gates (``gates.GateReport.to_wire``)."""

    passed: bool
    failed: list[str]                 # the failed gates' messages
    checks: list[JsonObject]          # {name, value, limit, unit, passed, message[, applies]}


class StoredResult(TypedDict, total=False):
    """``ResultRecord.result``: what a run stores of its result (the result's wire form, its
    gates and check stations); the published ``ResultBody`` is built from it.

    A calibration's record (``bodies.result_to_wire``) has the ``ResultBody`` keys and the
    gate readers' (``converged`` ... ``task_points``); a kinematics record
    (``runs.kinematics``) has its own ``uncertainty`` and ``holdout`` and the identification
    under ``kinematics``, and may give ``None`` for a closure figure that is not finite.
    """

    transforms: dict[str, Transform]
    points: dict[str, Point]
    n_stations: int
    n_motions: int
    rms_translation_m: float | None
    max_translation_m: float | None
    rms_rotation_rad: float | None
    max_rotation_rad: float | None
    axis_spread: float
    weakest_axis: WeakestAxis
    max_motion_rad: float
    residuals: Residuals
    solver: str
    frame_convention: str
    uncertainty: JsonObject           # a calibration's: the shape of Uncertainty
    holdout: JsonObject | None        # a calibration's: the shape of Holdout
    linear_agreement: LinearAgreement | None
    converged: bool
    stop_reason: str
    iterations: int
    dof: int
    downweighted: list[int]
    warnings: list[JsonObject]        # {code, message, value}
    residual_tests: JsonObject | None
    task_points: list[JsonObject]     # {point_m, sigma_m, sigma_max_m, frame, lever_arm_m}
    kinematics: JsonObject            # kinematics results: the identified parameters and their tests
    camera_matrix: list[list[float]]  # intrinsics results (ResultBody's keys of the same names)
    dist_coeffs: list[float]
    image_size: list[int]
    reprojection_rms_px: float
    intrinsics: JsonObject
    target_sha256: str | None         # camera results: the target file's (provenance)
    gates: StoredGates
    check_stations: list[CheckStationRecord]


class StoredProvenance(TypedDict, total=False):
    """``ResultRecord.provenance``: where a result came from (the store fills in the ids,
    ``valid_from``, ``cellcal_version``, ``solver`` and ``frame_convention`` it is not given)."""

    config_sha256: str
    devices: dict[str, JsonObject]    # device name -> identity (model, serial, firmware, ...)
    cellcal_version: str
    solver: str
    frame_convention: str
    valid_from: str                   # ISO 8601 UTC
    run_id: int | None
    parent_result_id: int | None
    cell: str
    robot_serial: str | None
    kinematics_digest: str | None
    solve_settings: JsonObject        # the [solve] settings the stations were solved with (SI)
    target_sha256: str            # a camera result's target file (ADR 0030)


class DriftRecord(TypedDict, total=False):
    """``DriftCheckRecord.record``: one drift check as stored (the ``DriftBody`` it published,
    with the same figures in edge units)."""

    result_id: str
    check_id: int
    deviation_translation_m: float
    deviation_rotation_rad: float | None
    warn_translation_m: float
    fail_translation_m: float
    warn_rotation_rad: float
    fail_rotation_rad: float
    cusum: Cusum
    status: DriftStatus
    suspect: bool
    action: DriftAction
    stations: list[DriftStation]
    reason: str
    deviation_mm: float
    deviation_deg: float | None


BODY_TYPES: dict[str, type] = {
    TOPIC_HEARTBEAT: HeartbeatBody, TOPIC_STATE: StateBody, TOPIC_STATION: StationBody,
    TOPIC_RESULT: ResultBody, TOPIC_DRIFT: DriftBody, TOPIC_FAULT: FaultBody,
}
#: Command -> the type its result conforms to (a TypedDict, or a union of them for ``to_base``).
RESULT_TYPES: dict[str, object] = {
    "get_status": StatusResult, "get_snapshot": SnapshotResult, "get_result": ResultBody,
    "list_results": ListResultsResult, "to_base": ToBasePointResult | ToBasePoseResult,
    "start_run": StartRunResult, "abort": AbortResult, "run_drift_check": DriftCheckResult,
    "activate_result": ActivateResult,
}


def _problems(value: object, tp: object, path: str) -> list[str]:
    origin = typing.get_origin(tp)
    if tp is object:
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
        required: frozenset[str] = getattr(tp, "__required_keys__", frozenset())
        out = []
        for k, t in hints.items():
            if k not in value:
                if k in required:
                    out.append(f"{path}.{k}: missing")
            else:
                out += _problems(value[k], t, f"{path}.{k}" if path else k)
        return out
    raise TypeError(f"no checker for {tp!r}")  # a schema bug


def check_body(topic: str, body: object) -> list[str]:
    """What is wrong with ``body`` for ``topic`` (empty list: it conforms; extra fields are allowed)."""
    if topic not in BODY_TYPES:
        return [f"unknown topic {topic!r}"]
    return _problems(body, BODY_TYPES[topic], "body")


def check_result(cmd: str, result: object) -> list[str]:
    """What is wrong with the ``result`` of command ``cmd`` (empty list: it conforms)."""
    if cmd not in RESULT_TYPES:
        return [f"unknown command {cmd!r}"]
    return _problems(result, RESULT_TYPES[cmd], "result")


def check_reply(cmd: str, reply: object, request_id: str | int | None = None) -> list[str]:
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


def find_non_finite(obj: object, path: str = "result", _depth: int = 0) -> str | None:
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
