"""The configuration's schema: every section as a frozen dataclass, SI in the field names,
units and documentation in the field metadata, and the bounds that keep a value from switching
a gate off (``docs/configuration.md`` lists them all; a test keeps it complete).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeAlias, TypeVar

# The camera's section ([camera], ADR 0030) is defined beside the schema too
# (cellcal.daemon.config.camera); the schema hooks it in (a field, its choices, lists and bounds).
from cellcal.daemon.config import camera as _camera

# The plant interfaces' sections (OPC UA, MQTT, Prometheus) are defined beside the schema, in
# cellcal.daemon.config.plant (the interfaces read them as cellcal.daemon.plant.config); this
# schema only hooks them in (fields, tables, checks).
from cellcal.daemon.config import plant as _plant
from cellcal.daemon.config.errors import ConfigError
from cellcal.daemon.config.kinematics import Kinematics

_T = TypeVar("_T")

#: A device's ``[robot.options]`` / ``[tracker.options]``: TOML values forwarded as keyword
#: arguments to the driver's ``connect_robot`` / ``connect_tracker``, which check them
#: (``check_devices`` names the key): ``object``, narrowed where the daemon reads one.
DriverOptions: TypeAlias = dict[str, object]

SUPPORTED_CONFIG_VERSIONS = (1,)


_MM = 1e-3


_DEG = math.pi / 180.0


def key(name: str, scale: float = 1.0, doc: str = "") -> dict[str, str | float]:
    """Field metadata: the TOML key (with its unit) and the factor to SI."""
    return {"key": name, "scale": scale, "doc": doc}


def _f(default: _T, name: str, scale: float = 1.0, doc: str = "") -> _T:
    """A field with its TOML key: ``default``, copied for each instance when it is a list or
    a dict (frozen dataclasses share nothing mutable)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=key(name, scale, doc))
    return field(default=default, metadata=key(name, scale, doc))


@dataclass(frozen=True)
class Service:
    """``[service]``: where the daemon keeps things."""

    name: str = _f("cell", "name", doc="cell name, in every message and result")
    state_dir: str = _f("/var/lib/cellcal", "state_dir", doc="SQLite store and exports")
    runtime_dir: str = _f("/run/cellcal", "runtime_dir", doc="ipc sockets")
    log_level: str = _f("info", "log_level")
    fault_retry_min_s: float = _f(1.0, "fault_retry_min_s", doc="first retry after a device fault")
    fault_retry_max_s: float = _f(60.0, "fault_retry_max_s", doc="backoff ceiling")
    resume_within_s: float = _f(120.0, "resume_within_s",
                                doc="a run interrupted longer than this is closed as failed, never resumed")


@dataclass(frozen=True)
class RobotSettle:
    """``[robot.settle]``: when the robot counts as at rest."""

    max_joint_speed_rad_s: float = _f(math.radians(0.05), "max_joint_speed_deg_s", _DEG)
    max_flange_speed_m_s: float = _f(0.5e-3, "max_flange_speed_mm_s", _MM)
    max_flange_ang_speed_rad_s: float = _f(math.radians(0.05), "max_flange_ang_speed_deg_s", _DEG)
    dwell_s: float = _f(0.5, "dwell_s", doc="every condition holds for this long")
    max_sample_gap_s: float = _f(0.25, "max_sample_gap_s", doc="a longer gap restarts the window")
    require_target_reached: bool = _f(True, "require_target_reached", doc="CiA 402 statusword bit 10")


@dataclass(frozen=True)
class Robot:
    """``[robot]``: the controller."""

    url: str = _f("", "url", doc="rtde://host[:port] or canopen://channel?...")
    read_timeout_s: float = _f(1.0, "read_timeout_s")
    max_fk_error_m: float = _f(10e-3, "max_fk_error_mm", _MM, doc="reported pose vs FK of the joints, per station")
    max_fk_error_rad: float = _f(math.radians(1.0), "max_fk_error_deg", _DEG)
    settle: RobotSettle = field(default_factory=RobotSettle, metadata=key("settle"))
    options: DriverOptions = _f({}, "options", doc="passed to cellcal.drivers.connect_robot")


@dataclass(frozen=True)
class TrackerSettle:
    """``[tracker.settle]``: when a tracker measurement counts as settled."""

    max_std_translation_m: float = _f(0.05e-3, "max_std_mm", _MM)
    max_std_rotation_rad: float = _f(math.radians(0.01), "max_std_deg", _DEG)
    agree_translation_m: float = _f(0.05e-3, "agree_mm", _MM, doc="consecutive averages agree within")
    agree_rotation_rad: float = _f(math.radians(0.01), "agree_deg", _DEG)


@dataclass(frozen=True)
class Tracker:
    """``[tracker]``: the laser tracker."""

    url: str = _f("", "url", doc="device path, socket://host:port, pty path, emscon://host[:port] or geocom://...")
    measure: str = _f("pose", "measure", doc="pose (6-DoF target) or point (3-DoF reflector); "
                                              "emScon and GeoCOM instruments measure points only")
    average_s: float = _f(0.5, "average_s")
    max_range_m: float = _f(80.0, "max_range_mm", _MM, doc="farthest distance the instrument measures")
    gross_error_m: float = _f(25e-3, "gross_error_mm", _MM, doc="floor of the gross-disagreement bound")
    gross_error_rad: float = _f(math.radians(2.0), "gross_error_deg", _DEG)
    consensus_error_m: float = _f(5e-3, "consensus_error_mm", _MM,
                                  doc="a station farther from the run's consensus fit is re-measured, then dropped")
    consensus_error_rad: float = _f(math.radians(0.5), "consensus_error_deg", _DEG)
    settle: TrackerSettle = field(default_factory=TrackerSettle, metadata=key("settle"))
    options: DriverOptions = _f({}, "options", doc="passed to cellcal.drivers.connect_tracker")


@dataclass(frozen=True)
class Capture:
    """``[capture]``: how stations are taken."""

    motion_mode: str = _f("command", "motion_mode", doc="command (we move) or observe (cell moves)")
    move_speed: float = _f(0.25, "move_speed", doc="fraction of the robot's nominal speed, (0, 1]")
    sync_window_s: float = _f(0.2, "sync_window_s", doc="rest windows must overlap by at least this")
    station_timeout_s: float = _f(60.0, "station_timeout_s", doc="move + settle + measure budget")
    max_attempts_per_station: int = _f(3, "max_attempts_per_station")
    max_consecutive_rejections: int = _f(8, "max_consecutive_rejections", doc="then the run aborts")
    min_pose_change_m: float = _f(5e-3, "min_pose_change_mm", _MM, doc="observe mode: a new pose")
    min_pose_change_rad: float = _f(math.radians(2.0), "min_pose_change_deg", _DEG)


@dataclass(frozen=True)
class PlanStation:
    """One explicit station: joints, or a flange pose in the base frame."""

    q_rad: list[float] = _f([], "q_deg", _DEG)
    flange_xyz_m: list[float] = _f([], "flange_xyz_mm", _MM)
    flange_quat_wxyz: list[float] = _f([], "flange_quat_wxyz")


@dataclass(frozen=True)
class Plan:
    """``[plan]``: which stations a run visits."""

    kind: str = _f("generated", "kind", doc="generated or explicit")
    n_stations: int = _f(20, "n_stations")
    workspace_min_m: list[float] = _f([-0.65, -0.35, 0.2], "workspace_min_mm", _MM, doc="box in the base frame")
    workspace_max_m: list[float] = _f([-0.35, 0.15, 0.55], "workspace_max_mm", _MM)
    max_tilt_rad: float = _f(math.radians(35.0), "max_tilt_deg", _DEG, doc="from the home orientation")
    home_q_rad: list[float] = _f([0.0, -math.pi / 2, math.pi / 2, -math.pi / 2, -math.pi / 2, 0.0], "home_q_deg", _DEG)
    joint_min_rad: list[float] = _f([-2 * math.pi] * 6, "joint_min_deg", _DEG)
    joint_max_rad: list[float] = _f([2 * math.pi] * 6, "joint_max_deg", _DEG)
    max_extra_stations: int = _f(4, "max_extra_stations", doc="planner stations added when the motions are degenerate")
    seed: int = _f(0, "seed")
    stations: list[PlanStation] = _f([], "stations", doc="explicit: [[plan.stations]] tables")
    target_sigma_m: float = _f(0.0, "target_sigma_mm", _MM,
                               doc="capture until the predicted error at the task points is this (0: a fixed count)")
    max_stations: int = _f(40, "max_stations", doc="with target_sigma_mm: stations at most")
    tracker_xyz_m: list[float] = _f([], "tracker_xyz_mm", _MM, doc="rough tracker position, robot base frame ([]: unknown)")
    tracker_cell_xyz_m: list[float] = _f([0.0, 0.0, 0.0], "tracker_cell_xyz_mm", _MM, doc="tracker position, cell frame")
    target_axis: list[float] = _f([0.0, 0.0, 1.0], "target_axis", doc="direction the target faces, flange frame")
    cone_rad: float = _f(math.radians(45.0), "cone_deg", _DEG, doc="target's acceptance half-angle")


@dataclass(frozen=True)
class Solve:
    """``[solve]``: the calibration and its acceptance gates (``cellcal.daemon.gates``).

    A gate whose key is optional (``None`` here) is off until the key is given; every other
    gate is on with its default. Mixed-unit vectors keep their units in order:
    ``expected_cell_T_base_m_rad`` is ``[x, y, z]`` in m then a rotation vector in rad.
    """

    kind: str = _f("base_frame", "kind", doc="base_frame, tool_point, hand_eye, kinematics, intrinsics or eye_to_hand")
    min_axis_spread: float = _f(1e-4, "min_axis_spread")
    max_rms_translation_m: float = _f(0.5e-3, "max_rms_mm", _MM, doc="acceptance gate")
    max_rms_rotation_rad: float = _f(math.radians(0.1), "max_rms_deg", _DEG)
    declare_noise: bool = _f(True, "declare_noise",
                             doc="give the solver each station's tracker std plus the robot's repeatability")
    robot_repeatability_m: float = _f(0.01e-3, "robot_repeatability_mm", _MM, doc="1-sigma, position")
    robot_repeatability_rad: float = _f(math.radians(0.005), "robot_repeatability_deg", _DEG, doc="1-sigma, orientation")
    robot_accuracy_m: float = _f(1e-3, "robot_accuracy_mm", _MM,
                                 doc="the arm's kinematic (absolute) accuracy, RMS distance (3-D) at the flange: what "
                                     "the uncertainty carries when too few stations test for model error (0: exact)")
    max_target_offset_m: float = _f(1.0, "max_target_offset_mm", _MM,
                                    doc="refuse a fit that puts the target farther from the flange (inverted inputs)")
    task_points_m: list[list[float]] = _f([], "task_points_mm", _MM,
                             doc="[[x, y, z], ...] where the calibration is used (cell frame for a base frame)")
    max_sigma_m_at_task_points: float = _f(1e-3, "max_sigma_mm_at_task_points", _MM,
                                           doc="predicted 1-sigma position error at each task point")
    max_holdout_p90_m: float | None = _f(None, "max_holdout_p90_mm", _MM, doc="held-out closure P90 (off unless set)")
    max_holdout_p90_rad: float | None = _f(None, "max_holdout_p90_deg", _DEG)
    max_iterations: int = _f(20, "max_iterations", doc="Gauss-Newton iteration budget of the refinement")
    require_converged: bool = _f(True, "require_converged", doc="refuse a refinement that stopped early")
    allow_model_error: bool = _f(False, "allow_model_error", doc="accept a result warning model_error")
    max_model_error_m: float = _f(0.02e-3, "max_model_error_mm", _MM,
                                  doc="a model_error whose structured residual is at most this passes its gate")
    expected_cell_T_base_m_rad: list[float] | None = _f(None, "expected_cell_T_base_mm_deg",
                                                 doc="[x, y, z mm, rx, ry, rz deg rotation vector] (off unless set)")
    expected_tolerance_m_rad: list[float] = _f([50e-3, math.radians(5.0)], "expected_tolerance_mm_deg",
                                        doc="[mm, deg] of expected_cell_T_base_mm_deg")
    check_reach: bool = _f(True, "check_reach", doc="refuse robot poses beyond the robot model's reach")


@dataclass(frozen=True)
class Drift:
    """``[drift]``: heartbeat drift checks after a calibration."""

    enabled: bool = _f(True, "enabled")
    interval_s: float = _f(600.0, "interval_s")
    check_stations: int = _f(3, "check_stations")
    warn_translation_m: float = _f(0.1e-3, "warn_mm", _MM)
    fail_translation_m: float = _f(0.3e-3, "fail_mm", _MM)
    warn_rotation_rad: float = _f(math.radians(0.02), "warn_deg", _DEG)
    fail_rotation_rad: float = _f(math.radians(0.05), "fail_deg", _DEG)
    cusum_k_m: float = _f(0.05e-3, "cusum_k_mm", _MM, doc="CUSUM slack per check")
    cusum_h_m: float = _f(0.3e-3, "cusum_h_mm", _MM, doc="CUSUM alarm level")
    on_drift: str = _f("mark", "on_drift", doc="mark (suspect only) or recalibrate")


@dataclass(frozen=True)
class ZmqClient:
    """One ``[[zmq.clients]]`` entry: a CURVE public key and its role."""

    name: str = _f("", "name")
    public_key: str = _f("", "public_key", doc="Z85, 40 characters")
    role: str = _f("observer", "role", doc="observer or operator")


@dataclass(frozen=True)
class Zmq:
    """``[zmq]``: the client interface."""

    pub_endpoint: str = _f("ipc:///run/cellcal/pub.sock", "pub_endpoint")
    cmd_endpoint: str = _f("ipc:///run/cellcal/cmd.sock", "cmd_endpoint")
    heartbeat_s: float = _f(1.0, "heartbeat_s")
    republish_s: float = _f(60.0, "republish_s", doc="retained result cadence")
    sndhwm: int = _f(1000, "sndhwm")
    max_msg_bytes: int = _f(1 << 20, "max_msg_bytes")
    curve: bool = _f(False, "curve")
    null_role: str = _f("observer", "null_role", doc="role of clients without CURVE (ipc peers allowed below, "
                                                        "or anyone on loopback TCP with loopback_tcp_any_user)")
    loopback_tcp_any_user: bool = _f(False, "loopback_tcp_any_user",
                                     doc="allow a loopback tcp:// endpoint without CURVE: EVERY local user then has null_role")
    ipc_allowed_uids: list[int] = _f([], "ipc_allowed_uids", doc="without CURVE, ipc peers of these uids get null_role "
                                                            "(besides the daemon's own uid and root)")
    ipc_allowed_gids: list[int] = _f([], "ipc_allowed_gids", doc="... and peers in these groups (besides the daemon's own)")
    ipc_socket_mode: int = _f(0o660, "ipc_socket_mode", doc="mode of ipc socket files the daemon binds (no bits for others)")
    server_secret_key_file: str = _f("", "server_secret_key_file")
    clients: list[ZmqClient] = _f([], "clients", doc="[[zmq.clients]] tables")


@dataclass(frozen=True)
class Export:
    """``[export]``: the names other tools see in the exported files (URDF, xacro, ROS 2, UR).

    Each key renames one of cellcal's frames (ADR 0001 names) in the exports only; the
    stored result and the wire keep cellcal's names. ``cell_frame = "world"`` and
    ``base_frame = "base_link"`` attach a calibrated base to a ROS description's world.
    """

    cell_frame: str = _f("cell", "cell_frame", doc="the cell (tracker) frame: the parent of the base")
    base_frame: str = _f("base", "base_frame", doc="the robot base frame the controller reports poses in")
    base_frame_yaw_rad: float = _f(0.0, "base_frame_yaw_deg", _DEG,
                                   doc="the exported base frame turned about the controller base's z axis "
                                       "(180 for a ur_description base_link)")
    flange_frame: str = _f("flange", "flange_frame", doc="the robot flange (tool0 in a UR description)")
    target_frame: str = _f("target", "target_frame", doc="the tracker target (SMR or 6-DoF probe) on the flange")
    camera_frame: str = _f("camera", "camera_frame", doc="the camera of a hand-eye or eye-to-hand result")
    tip_frame: str = _f("tip", "tip_frame", doc="the tool tip of a tool-point result")
    pivot_frame: str = _f("pivot", "pivot_frame", doc="the pivot point of a tool-point result")
    robot_name: str = _f("cellcal", "robot_name", doc="the URDF <robot name>")


@dataclass(frozen=True)
class Config:
    """The whole configuration, SI units. ``sha256`` is the hash of the file's bytes."""

    config_version: int = _f(1, "config_version")
    service: Service = field(default_factory=Service, metadata=key("service"))
    robot: Robot = field(default_factory=Robot, metadata=key("robot"))
    tracker: Tracker = field(default_factory=Tracker, metadata=key("tracker"))
    capture: Capture = field(default_factory=Capture, metadata=key("capture"))
    plan: Plan = field(default_factory=Plan, metadata=key("plan"))
    solve: Solve = field(default_factory=Solve, metadata=key("solve"))
    drift: Drift = field(default_factory=Drift, metadata=key("drift"))
    zmq: Zmq = field(default_factory=Zmq, metadata=key("zmq"))
    export: Export = field(default_factory=Export, metadata=key("export"))
    kinematics: Kinematics = field(default_factory=Kinematics, metadata=key("kinematics"))
    # plant interfaces, each off by default (cellcal.daemon.config.plant)
    opcua: _plant.OpcUa = field(default_factory=_plant.OpcUa, metadata=key("opcua"))
    mqtt: _plant.Mqtt = field(default_factory=_plant.Mqtt, metadata=key("mqtt"))
    metrics: _plant.Metrics = field(default_factory=_plant.Metrics, metadata=key("metrics"))
    # the camera (cellcal.daemon.config.camera): None without a [camera] section
    camera: _camera.Camera | None = field(default=None, metadata=key("camera"))
    sha256: str = field(default="", metadata={"internal": True})
    source: str = field(default="", metadata={"internal": True})


# Element types of list fields that hold tables.
# (+ the plant sections' own tables, lists, choices and bounds: cellcal.daemon.config.plant)
_LIST_OF = {(Plan, "stations"): PlanStation, (Zmq, "clients"): ZmqClient, **_plant.LIST_OF}


# List fields of integers (every other list of scalars holds numbers with a unit).
_INT_LISTS = {(Zmq, "ipc_allowed_uids"), (Zmq, "ipc_allowed_gids"), (_camera.CameraPlan, "image_size_px")}


# List fields of points: each entry an array of this many numbers, all with the field's scale.
_POINT_LISTS: dict[tuple[type, str], int] = {(Solve, "task_points_m"): 3}


# List fields whose entries carry different units (edge -> SI factor per entry, in order):
# the list must have exactly this many entries.
_MIXED_SCALES: dict[tuple[type, str], tuple[float, ...]] = {
    (Solve, "expected_cell_T_base_m_rad"): (_MM, _MM, _MM, _DEG, _DEG, _DEG),
    (Solve, "expected_tolerance_m_rad"): (_MM, _DEG),
}


# List fields of strings.
_STR_LISTS = {(Kinematics, "parameters"), *_plant.STR_LISTS, *_camera.STR_LISTS}


_CHOICES = {
    (Tracker, "measure"): ("pose", "point"),
    (Capture, "motion_mode"): ("command", "observe"),
    (Plan, "kind"): ("generated", "explicit"),
    (Solve, "kind"): ("base_frame", "tool_point", "hand_eye", "kinematics", "intrinsics", "eye_to_hand"),
    (Drift, "on_drift"): ("mark", "recalibrate"),
    (ZmqClient, "role"): ("observer", "operator"),
    (Zmq, "null_role"): ("observer", "operator"),
    (Service, "log_level"): ("debug", "info", "warning", "error"),
    **_plant.CHOICES,
    **_camera.CHOICES,
}


# Bounds of values, in the units of the TOML key (what a user writes), by dotted key; ``[]``
# stands for every element of a list. Each bound keeps a value from switching a gate off
# (a 1e308 deg RMS limit, a zero dwell, an unbounded queue) or from meaning nothing a cell
# can be; every one is in docs/configuration.md. (lo, hi, lo_open): lo_open means lo itself
# is excluded.
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "config_version": (1, 1_000_000, False),
    "service.fault_retry_min_s": (0.0, 3600.0, True),
    "service.fault_retry_max_s": (0.0, 86400.0, True),
    "robot.read_timeout_s": (0.0, 60.0, True),
    "robot.settle.max_joint_speed_deg_s": (0.0, 5.0, True),
    "robot.settle.max_flange_speed_mm_s": (0.0, 10.0, True),
    "robot.settle.max_flange_ang_speed_deg_s": (0.0, 5.0, True),
    "robot.settle.dwell_s": (0.05, 60.0, False),
    "robot.settle.max_sample_gap_s": (0.0, 10.0, True),
    "tracker.average_s": (0.0, 60.0, False),
    # Up to 10 mm: a total station's a-priori std is about 1 mm plus its ppm (GeoCOM).
    "tracker.settle.max_std_mm": (0.0, 10.0, True),
    "tracker.settle.max_std_deg": (0.0, 1.0, True),
    "tracker.settle.agree_mm": (0.0, 10.0, True),
    "tracker.settle.agree_deg": (0.0, 1.0, True),
    "capture.move_speed": (0.0, 1.0, True),
    "capture.sync_window_s": (0.0, 60.0, False),
    "capture.station_timeout_s": (0.0, 3600.0, True),
    "capture.max_attempts_per_station": (1, 100, False),
    "capture.max_consecutive_rejections": (1, 1000, False),
    "capture.min_pose_change_mm": (0.0, 1000.0, False),
    "capture.min_pose_change_deg": (0.0, 180.0, False),
    "plan.n_stations": (3, 1000, False),
    "plan.workspace_min_mm[]": (-1e5, 1e5, False),
    "plan.workspace_max_mm[]": (-1e5, 1e5, False),
    "plan.max_tilt_deg": (0.0, 180.0, False),
    "plan.home_q_deg[]": (-3600.0, 3600.0, False),
    "plan.joint_min_deg[]": (-3600.0, 3600.0, False),
    "plan.joint_max_deg[]": (-3600.0, 3600.0, False),
    "plan.max_extra_stations": (0, 100, False),
    "plan.seed": (0, 2**63 - 1, False),
    # Below 1 um no tracker gets there; above 10 mm a calibration is not what is wanted.
    "plan.target_sigma_mm": (0.0, 10.0, False),
    "plan.max_stations": (3, 1000, False),
    "plan.tracker_xyz_mm[]": (-1e6, 1e6, False),
    "plan.tracker_cell_xyz_mm[]": (-1e6, 1e6, False),
    "plan.target_axis[]": (-1.0, 1.0, False),
    # A reflector's or probe's acceptance half-angle: nothing accepts from behind.
    "plan.cone_deg": (0.0, 90.0, True),
    "plan.stations[].q_deg[]": (-3600.0, 3600.0, False),
    "plan.stations[].flange_xyz_mm[]": (-1e5, 1e5, False),
    "plan.stations[].flange_quat_wxyz[]": (-1.001, 1.001, False),
    "solve.min_axis_spread": (1e-6, 1.0, False),
    "solve.max_rms_mm": (0.0, 5.0, True),
    "solve.max_rms_deg": (0.0, 1.0, True),
    "solve.robot_repeatability_mm": (0.0, 10.0, False),
    "solve.max_model_error_mm": (0.0, 10.0, False),
    "solve.robot_repeatability_deg": (0.0, 1.0, False),
    # A robot's absolute accuracy: a calibrated arm's 0.1 mm to an uncalibrated one's few mm.
    "solve.robot_accuracy_mm": (0.0, 50.0, False),
    # A tracker target, reflector or camera sits centimetres to a metre from the flange.
    "solve.max_target_offset_mm": (1.0, 10000.0, False),
    "solve.max_iterations": (1, 1000, False),
    "solve.task_points_mm[][]": (-1e5, 1e5, False),
    "solve.max_sigma_mm_at_task_points": (0.0, 100.0, True),
    "solve.max_holdout_p90_mm": (0.0, 50.0, True),
    "solve.max_holdout_p90_deg": (0.0, 10.0, True),
    "solve.expected_cell_T_base_mm_deg[]": (-1e5, 1e5, False),
    "solve.expected_tolerance_mm_deg[]": (0.0, 1000.0, True),
    "drift.interval_s": (1.0, 604800.0, False),
    "drift.check_stations": (1, 100, False),
    "drift.warn_mm": (0.0, 10.0, True),
    "drift.fail_mm": (0.0, 10.0, True),
    "drift.warn_deg": (0.0, 5.0, True),
    "drift.fail_deg": (0.0, 5.0, True),
    "drift.cusum_k_mm": (0.0, 10.0, False),
    "drift.cusum_h_mm": (0.0, 100.0, True),
    "zmq.heartbeat_s": (0.01, 60.0, False),
    "zmq.republish_s": (0.1, 86400.0, False),
    "zmq.sndhwm": (1, 1_000_000, False),
    "zmq.max_msg_bytes": (4096, 64 << 20, False),
    "zmq.ipc_allowed_uids[]": (0, 2**32 - 2, False),
    "zmq.ipc_allowed_gids[]": (0, 2**32 - 2, False),
    "zmq.ipc_socket_mode": (0o600, 0o770, False),
    "export.base_frame_yaw_deg": (-180.0, 180.0, False),
    **_plant.BOUNDS,
    **_camera.BOUNDS,
}


_MAX_LIST = 10_000         # entries of any array


_MAX_STRING = 4096         # characters of any string


_MAX_CONFIG_BYTES = 1 << 20


_MAX_OPTION_DEPTH = 4      # nesting of a device option's value (tables and arrays)


_MAX_POINTS = 100          # task points (each one a predicted-error evaluation per result)


def _bound_key(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


def _check_bound(path: str, value: float) -> None:
    b = _BOUNDS.get(_bound_key(path))
    if b is None:
        return
    lo, hi, lo_open = b
    if not ((lo < value) if lo_open else (lo <= value)) or not value <= hi:
        def show(v: float) -> str:
            return oct(int(v)) if path.endswith("_mode") else f"{v:g}"

        raise ConfigError(path, f"must be in {'(' if lo_open else '['}{show(lo)}, {show(hi)}], got {value!r}")


def _finite(value: object, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"expected a finite number, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise ConfigError(path, f"does not fit a float 64 ({len(str(abs(value)))} digits)") from None
    if not math.isfinite(x):
        raise ConfigError(path, f"expected a finite number, got {value!r}")
    return x


def _show(value: object) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _depth(value: object, limit: int) -> int:
    """Nesting depth of tables and arrays, counted up to ``limit + 1``."""
    if limit < 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)

def _near(k: str, known: Iterable[str]) -> str | None:
    m = difflib.get_close_matches(k, list(known), n=1, cutoff=0.6)
    return m[0] if m else None
