"""Daemon configuration: TOML (``tomllib``) into frozen dataclasses.

Rules:

* Unknown keys are rejected; every error is a :class:`ConfigError` naming the dotted path
  (``capture.sync_window_s``) and what was expected.
* Keys carry their unit in the name (``_mm``, ``_deg``, ``_s``, ``_mm_s``, ``_deg_s``); values
  are converted to SI on load, and the dataclass fields carry the SI unit in *their* name
  (``settle.max_flange_speed_mm_s`` -> ``RobotSettle.max_flange_speed_m_s``).
* ``config_version`` is required and must be a version this build understands.
* Device options (``[robot.options]``, ``[tracker.options]``) are passed to the drivers'
  ``connect_*`` functions; :func:`check_devices` builds the drivers (constructors do no I/O)
  so a misspelt option is reported at load time with its dotted path.

Every key, its default, unit and bounds: ``docs/configuration.md`` (a test keeps it complete);
the example files in ``config/`` are complete configurations. Bounds (``_BOUNDS``) keep a value
from switching a gate off. ``load_config`` makes every check that needs no file or device,
the ``[zmq]`` security rules included; :func:`preflight` adds the drivers and the key file.
``cellcal run`` and ``cellcal check-config`` both call exactly these two.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from cellcal.daemon.config.kinematics import Kinematics, validate_kinematics

# The plant interfaces' sections (OPC UA, MQTT, Prometheus) live with them in
# cellcal.daemon.plant.config; this schema only hooks them in (fields, tables, checks).
from cellcal.daemon.plant import config as _plant
from cellcal.solver.errors import CellcalError

__all__ = [
    "ConfigError",
    "Config",
    "load_config",
    "load_config_text",
    "check_devices",
    "check_tracker_url",
    "check_can_interface",
    "check_measure_kind",
    "preflight",
    "SUPPORTED_CONFIG_VERSIONS",
    "DEFAULT_CONFIG_PATH",
    "CONFIG_ENV",
    "find_config",
]

SUPPORTED_CONFIG_VERSIONS = (1,)

_MM = 1e-3
_DEG = math.pi / 180.0


class ConfigError(CellcalError, ValueError):
    """A configuration file that cannot be used; ``.path`` is the dotted key path.

    Attributes
    ----------
    path : str
        The dotted key (``capture.sync_window_s``, ``tracker.options.timeout_s``,
        ``zmq.clients[0].public_key``); empty for the file as a whole (not TOML, too big).
    message : str
        What is wrong, without the file and the path.
    file : str or None
    """

    def __init__(self, path: str, message: str, *, file: str | None = None) -> None:
        self.path = path
        self.message = message
        self.file = file
        where = f"{file}: " if file else ""
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")

    def with_file(self, file: str | None) -> ConfigError:
        """The same error (same class) naming ``file``."""
        exc = type(self).__new__(type(self))
        ConfigError.__init__(exc, self.path, self.message, file=file)
        return exc


def key(name: str, scale: float = 1.0, doc: str = "") -> dict[str, Any]:
    """Field metadata: the TOML key (with its unit) and the factor to SI."""
    return {"key": name, "scale": scale, "doc": doc}


def _f(default: Any, name: str, scale: float = 1.0, doc: str = "", **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=key(name, scale, doc), **kw)
    return field(default=default, metadata=key(name, scale, doc), **kw)


# --- the schema ----------------------------------------------------------------------------------


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
    options: dict = _f({}, "options", doc="passed to cellcal.drivers.connect_robot")


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
    settle: TrackerSettle = field(default_factory=TrackerSettle, metadata=key("settle"))
    options: dict = _f({}, "options", doc="passed to cellcal.drivers.connect_tracker")


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

    q_rad: list = _f([], "q_deg", _DEG)
    flange_xyz_m: list = _f([], "flange_xyz_mm", _MM)
    flange_quat_wxyz: list = _f([], "flange_quat_wxyz")


@dataclass(frozen=True)
class Plan:
    """``[plan]``: which stations a run visits."""

    kind: str = _f("generated", "kind", doc="generated or explicit")
    n_stations: int = _f(20, "n_stations")
    workspace_min_m: list = _f([-0.65, -0.35, 0.2], "workspace_min_mm", _MM, doc="box in the base frame")
    workspace_max_m: list = _f([-0.35, 0.15, 0.55], "workspace_max_mm", _MM)
    max_tilt_rad: float = _f(math.radians(35.0), "max_tilt_deg", _DEG, doc="from the home orientation")
    home_q_rad: list = _f([0.0, -math.pi / 2, math.pi / 2, -math.pi / 2, -math.pi / 2, 0.0], "home_q_deg", _DEG)
    joint_min_rad: list = _f([-2 * math.pi] * 6, "joint_min_deg", _DEG)
    joint_max_rad: list = _f([2 * math.pi] * 6, "joint_max_deg", _DEG)
    max_extra_stations: int = _f(4, "max_extra_stations", doc="planner stations added when the motions are degenerate")
    seed: int = _f(0, "seed")
    stations: list = _f([], "stations", doc="explicit: [[plan.stations]] tables")
    target_sigma_m: float = _f(0.0, "target_sigma_mm", _MM,
                               doc="capture until the predicted error at the task points is this (0: a fixed count)")
    max_stations: int = _f(40, "max_stations", doc="with target_sigma_mm: stations at most")
    tracker_xyz_m: list = _f([], "tracker_xyz_mm", _MM, doc="rough tracker position, robot base frame ([]: unknown)")
    tracker_cell_xyz_m: list = _f([0.0, 0.0, 0.0], "tracker_cell_xyz_mm", _MM, doc="tracker position, cell frame")
    target_axis: list = _f([0.0, 0.0, 1.0], "target_axis", doc="direction the target faces, flange frame")
    cone_rad: float = _f(math.radians(45.0), "cone_deg", _DEG, doc="target's acceptance half-angle")


@dataclass(frozen=True)
class Solve:
    """``[solve]``: the calibration and its acceptance gates (``cellcal.daemon.gates``).

    A gate whose key is optional (``None`` here) is off until the key is given; every other
    gate is on with its default. Mixed-unit vectors keep their units in order:
    ``expected_cell_T_base_m_rad`` is ``[x, y, z]`` in m then a rotation vector in rad.
    """

    kind: str = _f("base_frame", "kind", doc="base_frame, tool_point, hand_eye or kinematics")
    min_axis_spread: float = _f(1e-4, "min_axis_spread")
    max_rms_translation_m: float = _f(0.5e-3, "max_rms_mm", _MM, doc="acceptance gate")
    max_rms_rotation_rad: float = _f(math.radians(0.1), "max_rms_deg", _DEG)
    declare_noise: bool = _f(True, "declare_noise",
                             doc="give the solver each station's tracker std plus the robot's repeatability")
    robot_repeatability_m: float = _f(0.01e-3, "robot_repeatability_mm", _MM, doc="1-sigma, position")
    robot_repeatability_rad: float = _f(math.radians(0.005), "robot_repeatability_deg", _DEG, doc="1-sigma, orientation")
    task_points_m: list = _f([], "task_points_mm", _MM,
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
    expected_cell_T_base_m_rad: list | None = _f(None, "expected_cell_T_base_mm_deg",
                                                 doc="[x, y, z mm, rx, ry, rz deg rotation vector] (off unless set)")
    expected_tolerance_m_rad: list = _f([50e-3, math.radians(5.0)], "expected_tolerance_mm_deg",
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
    ipc_allowed_uids: list = _f([], "ipc_allowed_uids", doc="without CURVE, ipc peers of these uids get null_role "
                                                            "(besides the daemon's own uid and root)")
    ipc_allowed_gids: list = _f([], "ipc_allowed_gids", doc="... and peers in these groups (besides the daemon's own)")
    ipc_socket_mode: int = _f(0o660, "ipc_socket_mode", doc="mode of ipc socket files the daemon binds (no bits for others)")
    server_secret_key_file: str = _f("", "server_secret_key_file")
    clients: list = _f([], "clients", doc="[[zmq.clients]] tables")


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
    # plant interfaces, each off by default (cellcal.daemon.plant.config)
    opcua: _plant.OpcUa = field(default_factory=_plant.OpcUa, metadata=key("opcua"))
    mqtt: _plant.Mqtt = field(default_factory=_plant.Mqtt, metadata=key("mqtt"))
    metrics: _plant.Metrics = field(default_factory=_plant.Metrics, metadata=key("metrics"))
    sha256: str = field(default="", metadata={"internal": True})
    source: str = field(default="", metadata={"internal": True})


# Element types of list fields that hold tables.
# (+ the plant sections' own tables, lists, choices and bounds: cellcal.daemon.plant.config)
_LIST_OF = {(Plan, "stations"): PlanStation, (Zmq, "clients"): ZmqClient, **_plant.LIST_OF}
# List fields of integers (every other list of scalars holds numbers with a unit).
_INT_LISTS = {(Zmq, "ipc_allowed_uids"), (Zmq, "ipc_allowed_gids")}
# List fields of points: each entry an array of this many numbers, all with the field's scale.
_POINT_LISTS: dict[tuple[type, str], int] = {(Solve, "task_points_m"): 3}
# List fields whose entries carry different units (edge -> SI factor per entry, in order):
# the list must have exactly this many entries.
_MIXED_SCALES: dict[tuple[type, str], tuple[float, ...]] = {
    (Solve, "expected_cell_T_base_m_rad"): (_MM, _MM, _MM, _DEG, _DEG, _DEG),
    (Solve, "expected_tolerance_m_rad"): (_MM, _DEG),
}
# List fields of strings.
_STR_LISTS = {(Kinematics, "parameters"), *_plant.STR_LISTS}
_CHOICES = {
    (Tracker, "measure"): ("pose", "point"),
    (Capture, "motion_mode"): ("command", "observe"),
    (Plan, "kind"): ("generated", "explicit"),
    (Solve, "kind"): ("base_frame", "tool_point", "hand_eye", "kinematics"),
    (Drift, "on_drift"): ("mark", "recalibrate"),
    (ZmqClient, "role"): ("observer", "operator"),
    (Zmq, "null_role"): ("observer", "operator"),
    (Service, "log_level"): ("debug", "info", "warning", "error"),
    **_plant.CHOICES,
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


def _finite(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(path, f"expected a finite number, got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise ConfigError(path, f"does not fit a float 64 ({len(str(abs(value)))} digits)") from None
    if not math.isfinite(x):
        raise ConfigError(path, f"expected a finite number, got {value!r}")
    return x


def _show(value: Any) -> str:
    r = repr(value)
    return r if len(r) <= 60 else r[:57] + "..."


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of tables and arrays, counted up to ``limit + 1``."""
    if limit < 0 or not isinstance(value, (dict, list)):
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(v, limit - 1) for v in items), default=0)


# --- loading -------------------------------------------------------------------------------------


def _typename(t: Any) -> str:
    return {float: "a number", int: "an integer", str: "a string", bool: "true or false",
            list: "an array", dict: "a table"}.get(t, getattr(t, "__name__", str(t)))


def _convert(cls: type, fname: str, ftype: Any, value: Any, scale: float, path: str) -> Any:
    if typing.get_origin(ftype) in (typing.Union, types.UnionType):
        # ``X | None``: an optional key (TOML has no null, so a value given is an X)
        ftype = next(a for a in typing.get_args(ftype) if a is not type(None))
    if dataclasses.is_dataclass(ftype):
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a table, got {type(value).__name__}")
        return _build(typing.cast(type, ftype), value, path)
    if ftype is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {_show(value)}")
        return value
    if ftype is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, f"expected an integer, got {_show(value)}")
        if not -(2**63) <= value < 2**63:
            raise ConfigError(path, f"does not fit a 64-bit integer ({len(str(abs(value)))} digits)")
        _check_bound(path, value)
        return value
    if ftype is float:
        x = _finite(value, path)
        _check_bound(path, x)
        return x * scale
    if ftype is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"expected a string, got {_show(value)}")
        if len(value) > _MAX_STRING:
            raise ConfigError(path, f"at most {_MAX_STRING} characters, got {len(value)}")
        choices = _CHOICES.get((cls, fname))
        if choices and value not in choices:
            raise ConfigError(path, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return value
    if ftype is dict:
        if not isinstance(value, dict):
            raise ConfigError(path, f"expected a table, got {_show(value)}")
        for k, v in value.items():
            if _depth(v, _MAX_OPTION_DEPTH) > _MAX_OPTION_DEPTH:
                raise ConfigError(f"{path}.{k}", f"nested deeper than {_MAX_OPTION_DEPTH} tables/arrays")
        return dict(value)
    if ftype is list:
        if not isinstance(value, list):
            raise ConfigError(path, f"expected an array, got {_show(value)}")
        if len(value) > _MAX_LIST:
            raise ConfigError(path, f"at most {_MAX_LIST} entries, got {len(value)}")
        elem = _LIST_OF.get((cls, fname))
        if elem is not None:
            return [_convert(cls, fname, elem, v, 1.0, f"{path}[{i}]") for i, v in enumerate(value)]
        if (cls, fname) in _INT_LISTS:
            return [_convert(cls, fname, int, v, 1.0, f"{path}[{i}]") for i, v in enumerate(value)]
        width = _POINT_LISTS.get((cls, fname))
        if width is not None:
            if len(value) > _MAX_POINTS:
                raise ConfigError(path, f"at most {_MAX_POINTS} points, got {len(value)}")
            points = []
            for i, pt in enumerate(value):
                if not isinstance(pt, list) or len(pt) != width:
                    raise ConfigError(f"{path}[{i}]", f"expected an array of {width} numbers, got {_show(pt)}")
                points.append(_convert(cls, "", list, pt, scale, f"{path}[{i}]"))
            return points
        scales = _MIXED_SCALES.get((cls, fname))
        if scales is not None:
            if len(value) != len(scales):
                raise ConfigError(path, f"expected {len(scales)} numbers, got {len(value)}")
            return [x * k for x, k in zip(_convert(cls, "", list, value, 1.0, path), scales, strict=True)]
        if (cls, fname) in _STR_LISTS:
            return [_convert(cls, fname, str, v, 1.0, f"{path}[{i}]") for i, v in enumerate(value)]
        out = []
        for i, v in enumerate(value):
            x = _finite(v, f"{path}[{i}]")
            _check_bound(f"{path}[{i}]", x)
            out.append(x * scale)
        return out
    raise ConfigError(path, f"unsupported type {ftype!r}")  # a schema bug, not a user error


def _build(cls: type, table: dict, prefix: str) -> Any:
    hints = get_type_hints(cls)
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    kwargs = {}
    for k, v in table.items():
        path = f"{prefix}.{k}" if prefix else k
        f = by_key.get(k)
        if f is None:
            hint = _near(k, by_key)
            raise ConfigError(path, "unknown key" + (f" (did you mean {hint!r}?)" if hint else ""))
        kwargs[f.name] = _convert(cls, f.name, hints[f.name], v, f.metadata.get("scale", 1.0), path)
    return cls(**kwargs)


def _near(k: str, known: dict) -> str | None:
    import difflib

    m = difflib.get_close_matches(k, list(known), n=1, cutoff=0.6)
    return m[0] if m else None


def load_config_text(text: str, *, source: str = "<string>", overrides: Mapping[str, Any] | None = None) -> Config:
    """Parse and validate TOML text into a :class:`Config` (SI units).

    Every check that needs no file, device or socket is made here, the ``[zmq]`` security
    rules included (:func:`cellcal.daemon.wire.zmq_server.check_security`), and the measurement
    kind against the instrument the tracker URL names (:func:`check_measure_kind`);
    :func:`preflight` adds the rest of what ``cellcal run`` checks before it starts.

    Parameters
    ----------
    overrides : mapping, optional
        TOML keys (nested tables, the file's units) merged over the file's before anything
        is checked, so they are checked exactly as if the file said them (``cellcal demo``
        sets its simulated instrument's ``[tracker]`` keys this way). ``sha256`` then covers
        the text and the overrides.

    Raises
    ------
    ConfigError
        Naming ``source`` and the dotted key (empty for the file as a whole: not TOML, too
        big, nested too deep), never another exception.
    """
    if len(text) > _MAX_CONFIG_BYTES:
        raise ConfigError("", f"larger than {_MAX_CONFIG_BYTES} bytes; this is not a cellcal configuration", file=source)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", file=source) from exc
    except RecursionError:
        raise ConfigError("", "not valid TOML for cellcal: tables or arrays nested too deep", file=source) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (int() refuses it)
        raise ConfigError("", f"not valid TOML: {str(exc)[:200]}", file=source) from None
    if overrides:
        raw = _merged(raw, overrides)
    if "config_version" not in raw:
        raise ConfigError("config_version", f"missing (this build reads {SUPPORTED_CONFIG_VERSIONS})", file=source)
    try:
        cfg = _build(Config, raw, "")
        _validate(cfg)
        check_measure_kind(cfg.tracker)
        _check_zmq(cfg)
    except ConfigError as exc:
        raise exc.with_file(source) from None
    data = text.encode("utf-8", "surrogatepass")
    if overrides:
        data += b"\n# overrides " + json.dumps(overrides, sort_keys=True, default=str).encode()
    digest = hashlib.sha256(data).hexdigest()
    return dataclasses.replace(cfg, sha256=digest, source=source)


def _merged(base: dict, over: Mapping[str, Any]) -> dict:
    """``base`` with ``over`` merged in, table by table (a scalar or array replaces)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def check_measure_kind(tracker: Tracker) -> None:
    """``[tracker] measure`` must be a kind the instrument the URL names can measure.

    The backend is the one ``cellcal.drivers.connect_tracker`` picks (the URL's protocol
    scheme, ``emscon://`` or ``geocom://``, else ``tracker.options.backend``, else the
    cellcal tracker protocol); its ``measure_kinds`` say what the instrument measures. An
    emScon tracker or a GeoCOM total station measures points (a reflector) only, so
    ``measure = "pose"`` with one is refused here, naming the key, not at the first station.
    A URL or backend that names nothing is left to :func:`check_devices` (``tracker.url``).

    Raises
    ------
    ConfigError
        Under ``tracker.measure``.
    """
    if not tracker.url:
        return
    from cellcal.drivers.base import load_backend
    from cellcal.drivers.tracker import BACKENDS, backend_for_url

    name = backend_for_url(tracker.url) or tracker.options.get("backend") or "serial"
    if not isinstance(name, str):
        return
    try:
        cls = load_backend(BACKENDS, name, "tracker backend")
    except (ValueError, ImportError, AttributeError):
        return  # check_devices reports the URL or the option
    kinds = frozenset(getattr(cls, "measure_kinds", ()))
    if kinds and tracker.measure not in kinds:
        only = " and ".join(repr(k) for k in sorted(kinds))
        raise ConfigError("tracker.measure", f"{tracker.measure!r}, but the {name} instrument of tracker.url "
                                             f"{_show(tracker.url)} measures {only} only: set measure = "
                                             f"{sorted(kinds)[0]!r}")


def load_config(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> Config:
    """Read a TOML file; errors name the file and the dotted key path (``overrides``: as
    :func:`load_config_text`)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_CONFIG_BYTES + 1)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read: {exc}", file=str(path)) from exc
    return load_config_text(text, source=str(path), overrides=overrides)


#: Where ``cellcal run`` (and ``ctl``, ``watch``) look for the configuration when neither
#: ``--config`` nor ``$CELLCAL_CONFIG`` names one (the systemd unit's path).
DEFAULT_CONFIG_PATH = "/etc/cellcal/cellcal.toml"
#: The environment variable naming the configuration file.
CONFIG_ENV = "CELLCAL_CONFIG"


def find_config(explicit: str | None, *, environ: Mapping[str, str] | None = None,
                default: str = DEFAULT_CONFIG_PATH) -> tuple[str | None, list[str]]:
    """The configuration file a command uses, the way ``cellcal run`` finds it.

    In order: ``explicit`` (``--config``), then ``$CELLCAL_CONFIG``, then ``default`` if
    that file exists. A path given explicitly or by the environment is returned whether or
    not it exists (loading it then says why it cannot be read).

    Returns
    -------
    (path or None, tried)
        ``tried``: what was looked at, in order, for people ("--config not given", ...);
        ``path`` None when nothing named a file and ``default`` does not exist.
    """
    env = os.environ if environ is None else environ
    if explicit:
        return explicit, [f"--config {explicit}"]
    tried = ["--config not given"]
    named = env.get(CONFIG_ENV, "")
    if named:
        return named, [*tried, f"${CONFIG_ENV}={named}"]
    tried.append(f"${CONFIG_ENV} not set")
    if Path(default).is_file():
        return default, [*tried, default]
    tried.append(f"{default} (no such file)")
    return None, tried


def _check_zmq(cfg: Config) -> None:
    # The transport owns what "local" means; its check needs no socket and no file.
    from cellcal.daemon.wire.zmq_server import check_security

    check_security(cfg.zmq)


def preflight(cfg: Config, *, devices: bool = True) -> None:
    """Everything ``cellcal run`` checks of a loaded configuration before it opens a store,
    a device or a socket; ``cellcal check-config`` runs exactly this, so the two agree.

    Beyond :func:`load_config`: the drivers are built from the device URLs and options
    (constructors do no I/O, so a bad URL or option is found without touching a device;
    each error names its own key, ``tracker.options.timeout_s``), and with CURVE the server
    key file is read (so run check-config as the daemon's user).

    Parameters
    ----------
    devices : bool
        Build the drivers (``cellcal check-config --no-devices`` skips it, e.g. for a
        config whose devices are set elsewhere; ``cellcal run`` never does).

    Raises
    ------
    ConfigError
        Naming the file (``cfg.source``) and the dotted key.
    """
    try:
        if devices:
            check_devices(cfg)
        if cfg.zmq.curve:
            from cellcal.daemon.wire.zmq_server import load_server_key

            load_server_key(cfg.zmq)
        # an enabled plant interface: its optional package installed, its files readable
        _plant.preflight_plant(cfg.opcua, cfg.mqtt, cfg.metrics)
    except ConfigError as exc:
        raise exc.with_file(cfg.source or None) from None


# A frame name ROS (tf2: no leading "/"), URDF and xacro all take as is: no spaces, quotes,
# "$" or "{" (xacro would expand them); "/" only between segments (robot1/base_link).
_FRAME_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*")
_EXPORT_FRAMES = ("cell_frame", "base_frame", "flange_frame", "target_frame", "camera_frame", "tip_frame", "pivot_frame")


def _validate_export(e: Export) -> None:
    for name in (*_EXPORT_FRAMES, "robot_name"):
        v = getattr(e, name)
        if not _FRAME_NAME.fullmatch(v) or len(v) > 128:
            raise ConfigError(f"export.{name}", f"expected a frame name (letters, digits, _ and / between "
                                                f"segments, at most 128 characters), got {_show(v)}")
    seen: dict[str, str] = {}
    for name in _EXPORT_FRAMES:
        v = getattr(e, name)
        if v in seen:
            raise ConfigError(f"export.{name}", f"{v!r} is already export.{seen[v]}: two frames cannot share a name")
        seen[v] = name


def _positive(path: str, v: float) -> None:
    if not v > 0:
        raise ConfigError(path, f"must be > 0, got {v!r}")


def _validate(c: Config) -> None:
    """Cross-field and range checks that the types alone do not express."""
    if c.config_version not in SUPPORTED_CONFIG_VERSIONS:
        raise ConfigError("config_version",
                          f"version {c.config_version} not supported (this build reads {SUPPORTED_CONFIG_VERSIONS})")
    for path, v in (
        ("robot.read_timeout_s", c.robot.read_timeout_s),
        ("robot.settle.max_flange_ang_speed_deg_s", c.robot.settle.max_flange_ang_speed_rad_s),
        ("robot.settle.max_sample_gap_s", c.robot.settle.max_sample_gap_s),
        ("robot.settle.max_joint_speed_deg_s", c.robot.settle.max_joint_speed_rad_s),
        ("robot.settle.max_flange_speed_mm_s", c.robot.settle.max_flange_speed_m_s),
        ("tracker.settle.max_std_mm", c.tracker.settle.max_std_translation_m),
        ("tracker.settle.agree_mm", c.tracker.settle.agree_translation_m),
        ("capture.station_timeout_s", c.capture.station_timeout_s),
        ("zmq.heartbeat_s", c.zmq.heartbeat_s),
        ("zmq.republish_s", c.zmq.republish_s),
        ("drift.interval_s", c.drift.interval_s),
        ("service.fault_retry_min_s", c.service.fault_retry_min_s),
    ):
        _positive(path, v)
    if c.robot.settle.dwell_s < 0:
        raise ConfigError("robot.settle.dwell_s", "must be >= 0")
    if not 0 < c.capture.move_speed <= 1:
        raise ConfigError("capture.move_speed", f"must be in (0, 1], got {c.capture.move_speed}")
    if not 0 <= c.tracker.average_s <= 60:
        raise ConfigError("tracker.average_s", f"must be in [0, 60], got {c.tracker.average_s}")
    if c.capture.sync_window_s < 0:
        raise ConfigError("capture.sync_window_s", "must be >= 0")
    if c.capture.max_attempts_per_station < 1:
        raise ConfigError("capture.max_attempts_per_station", "must be >= 1")
    if c.capture.max_consecutive_rejections < 1:
        raise ConfigError("capture.max_consecutive_rejections", "must be >= 1")
    if c.service.fault_retry_max_s < c.service.fault_retry_min_s:
        raise ConfigError("service.fault_retry_max_s", "must be >= fault_retry_min_s")
    # The consistency checks of every station: each bound keeps its check switched on.
    for path, v, lo, hi in (
        ("service.resume_within_s", c.service.resume_within_s, 0.0, 86400.0),
        ("robot.max_fk_error_mm", c.robot.max_fk_error_m / _MM, 1e-3, 100.0),
        ("robot.max_fk_error_deg", c.robot.max_fk_error_rad / _DEG, 1e-3, 10.0),
        ("tracker.max_range_mm", c.tracker.max_range_m / _MM, 1.0, 1e6),
        ("tracker.gross_error_mm", c.tracker.gross_error_m / _MM, 1e-3, 1000.0),
        ("tracker.gross_error_deg", c.tracker.gross_error_rad / _DEG, 1e-3, 45.0),
    ):
        if not lo <= v <= hi:
            raise ConfigError(path, f"must be in [{lo:g}, {hi:g}], got {v:g}")
    p = c.plan
    for name, vec in (("workspace_min_mm", p.workspace_min_m), ("workspace_max_mm", p.workspace_max_m)):
        if len(vec) != 3:
            raise ConfigError(f"plan.{name}", f"expected 3 numbers (x, y, z), got {len(vec)}")
    for name, vec in (("home_q_deg", p.home_q_rad), ("joint_min_deg", p.joint_min_rad), ("joint_max_deg", p.joint_max_rad)):
        if len(vec) != 6:
            raise ConfigError(f"plan.{name}", f"expected 6 numbers (one per joint), got {len(vec)}")
    if any(lo >= hi for lo, hi in zip(p.joint_min_rad, p.joint_max_rad, strict=True)):
        raise ConfigError("plan.joint_max_deg", "every joint's maximum must exceed its minimum")
    if any(not lo <= h <= hi for lo, h, hi in zip(p.joint_min_rad, p.home_q_rad, p.joint_max_rad, strict=True)):
        raise ConfigError("plan.home_q_deg", "the home configuration is outside the joint limits")
    if any(lo >= hi for lo, hi in zip(p.workspace_min_m, p.workspace_max_m, strict=True)):
        raise ConfigError("plan.workspace_max_mm", "every component must exceed workspace_min_mm")
    for name, vec in (("tracker_cell_xyz_mm", p.tracker_cell_xyz_m), ("target_axis", p.target_axis)):
        if len(vec) != 3:
            raise ConfigError(f"plan.{name}", f"expected 3 numbers (x, y, z), got {len(vec)}")
    if len(p.tracker_xyz_m) not in (0, 3):
        raise ConfigError("plan.tracker_xyz_mm", f"expected 3 numbers (x, y, z) or [] (unknown), got {len(p.tracker_xyz_m)}")
    if math.sqrt(sum(x * x for x in p.target_axis)) < 0.5:
        raise ConfigError("plan.target_axis", "must be a direction (a unit vector, e.g. [0, 0, 1])")
    if p.target_sigma_m > 0.0:
        if not c.solve.task_points_m:
            raise ConfigError("solve.task_points_mm", "[plan] target_sigma_mm needs at least one task point (cell frame)")
        if p.kind != "generated":
            raise ConfigError("plan.target_sigma_mm",
                              "needs a generated plan (kind = \"generated\"): the planner chooses the stations")
        if c.solve.kind != "base_frame":
            raise ConfigError("plan.target_sigma_mm", "applies to a base-frame calibration ([solve] kind = \"base_frame\") only")
    if p.kind == "generated" and p.n_stations < 3:
        raise ConfigError("plan.n_stations", f"at least 3 stations are needed, got {p.n_stations}")
    if p.kind == "explicit":
        if len(p.stations) < 3:
            raise ConfigError("plan.stations", f"an explicit plan needs at least 3 stations, got {len(p.stations)}")
        for i, st in enumerate(p.stations):
            where = f"plan.stations[{i}]"
            has_q = bool(st.q_rad)
            has_pose = bool(st.flange_xyz_m) or bool(st.flange_quat_wxyz)
            if has_q == has_pose:
                raise ConfigError(where, "give either q_deg or flange_xyz_mm + flange_quat_wxyz")
            if has_pose and (len(st.flange_xyz_m) != 3 or len(st.flange_quat_wxyz) != 4):
                raise ConfigError(where, "flange_xyz_mm needs 3 numbers and flange_quat_wxyz 4")
            if has_pose and abs(math.sqrt(sum(x * x for x in st.flange_quat_wxyz)) - 1) > 1e-3:
                raise ConfigError(f"{where}.flange_quat_wxyz", "quaternion must have unit norm")
    if c.tracker.measure == "point" and c.solve.kind == "base_frame":
        from cellcal.solver.points import MIN_POINT_STATIONS

        n, where = (p.n_stations, "plan.n_stations") if p.kind == "generated" else (len(p.stations), "plan.stations")
        if n < MIN_POINT_STATIONS:
            raise ConfigError(where, f"a point base-frame calibration ([tracker] measure = \"point\") needs at least "
                                     f"{MIN_POINT_STATIONS} stations (three points admit several exact fits), got {n}")
    e = c.solve.expected_cell_T_base_m_rad
    if e is not None and math.sqrt(sum(x * x for x in e[3:])) > math.pi * (1 + 1e-9):
        raise ConfigError("solve.expected_cell_T_base_mm_deg",
                          f"rx, ry, rz is a rotation vector in degrees with a length of at most 180, got "
                          f"{math.degrees(math.sqrt(sum(x * x for x in e[3:]))):g}")
    if c.solve.expected_tolerance_m_rad[1] > math.pi:
        raise ConfigError("solve.expected_tolerance_mm_deg", "the rotation tolerance must be at most 180 deg, got "
                                                            f"{math.degrees(c.solve.expected_tolerance_m_rad[1]):g}")
    d = c.drift
    if d.fail_translation_m < d.warn_translation_m:
        raise ConfigError("drift.fail_mm", "must be >= warn_mm")
    if d.fail_rotation_rad < d.warn_rotation_rad:
        raise ConfigError("drift.fail_deg", "must be >= warn_deg")
    if d.check_stations < 1:
        raise ConfigError("drift.check_stations", "must be >= 1")
    for i, cl in enumerate(c.zmq.clients):
        if len(cl.public_key) != 40:
            raise ConfigError(f"zmq.clients[{i}].public_key", "expected a 40-character Z85 CURVE public key")
    if c.zmq.curve and not c.zmq.server_secret_key_file:
        raise ConfigError("zmq.server_secret_key_file", "required when curve = true")
    for name in ("pub_endpoint", "cmd_endpoint"):
        ep = getattr(c.zmq, name)
        if not ep.startswith(("tcp://", "ipc://", "inproc://")):
            raise ConfigError(f"zmq.{name}", f"expected tcp://, ipc:// or inproc://, got {ep!r}")
    _validate_export(c.export)
    validate_kinematics(c.kinematics)
    _plant.validate_plant(c.opcua, c.mqtt, c.metrics, cell=c.service.name)  # URLs and security rules


def check_devices(cfg: Config) -> None:
    """Build (but do not open) the configured drivers, so bad URLs or options are reported
    with their own dotted path. Constructors do no I/O, so this touches no device.

    The URL alone is tried first (an error is the URL's: ``robot.url``, including its query
    keys), then every option alone (an error is that option's: ``robot.options.timeout_s``),
    then all together (an error of the combination: ``robot.options``). A tracker URL is
    also checked the way pyserial will open it (:func:`check_tracker_url`), and a CiA 402
    robot's python-can interface against python-can's (:func:`check_can_interface`).
    """
    from cellcal.drivers import connect_robot, connect_tracker

    for section, url, options, connect in (
        ("robot", cfg.robot.url, cfg.robot.options, connect_robot),
        ("tracker", cfg.tracker.url, cfg.tracker.options, connect_tracker),
    ):
        if not url:
            raise ConfigError(f"{section}.url", "missing")
        if section == "tracker":
            check_tracker_url(url)
        _try_build(connect, url, {}, f"{section}.url")
        for k, v in options.items():
            _try_build(connect, url, {k: v}, f"{section}.options.{k}")
        _try_build(connect, url, options, f"{section}.options")
        if section == "robot":
            check_can_interface(url, options)


def check_can_interface(url: str, options: Mapping[str, Any]) -> None:
    """A ``canopen://`` robot's python-can ``interface`` must be one python-can knows
    (``socketcan``, ``virtual``, ``slcan``, ...): a typo (``sockcan``) would otherwise pass
    here and fail at every reconnection. Named under ``robot.options.interface`` when the
    option gives it, else ``robot.url`` (its query)."""
    from urllib.parse import parse_qs, urlsplit

    if not url.lower().startswith("canopen://"):
        return
    if "interface" in options:
        value, path = options["interface"], "robot.options.interface"
    else:
        query = parse_qs(urlsplit(url).query)
        if "interface" not in query:
            return  # the driver's default
        value, path = query["interface"][-1], "robot.url"
    try:
        from can.interfaces import VALID_INTERFACES
    except ImportError:  # python-can missing: the driver says so when it is built
        return
    if value not in VALID_INTERFACES:
        near = _near(str(value), {k: None for k in VALID_INTERFACES})
        hint = f"; did you mean {near!r}?" if near else ""
        raise ConfigError(path, f"unknown python-can interface {value!r}{hint} (python-can knows: "
                                f"{', '.join(sorted(VALID_INTERFACES))})")


def _try_build(connect: Any, url: str, options: dict, path: str) -> None:
    try:
        driver = connect(url, **options)
    except TypeError as exc:
        raise ConfigError(path, f"not accepted by the driver: {exc}") from None
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise ConfigError(path, str(exc) or type(exc).__name__) from None
    close = getattr(driver, "close", None)
    if callable(close):
        close()  # never opened: a no-op, but leaves nothing behind


def check_tracker_url(url: str) -> None:
    """A tracker URL checked without opening it.

    * A protocol URL: ``emscon://host[:port]`` (a Leica emScon tracker over TCP; its host and
      port are the driver's to check, :func:`check_devices` builds it), or
      ``geocom://<device>[?baud=N]`` / ``geocom+<transport>://...`` (a Leica GeoCOM
      instrument), whose serial part is checked as below.
    * Otherwise what ``serial.serial_for_url`` will take: an absolute device path
      (``/dev/ttyUSB0``, a pty, ``/dev/serial/by-id/...``), or a pyserial URL whose scheme
      pyserial knows and, for ``socket://`` and ``rfc2217://``, a host and a port in 1..65535.

    Raises
    ------
    ConfigError
        Under ``tracker.url``.
    """
    from urllib.parse import urlsplit

    from cellcal.drivers.tracker import backend_for_url

    named = backend_for_url(url)
    if named == "emscon":
        return
    if named == "geocom":
        from cellcal.drivers.geocom import serial_url

        try:
            port_url, _options = serial_url(url)
        except ValueError as exc:
            raise ConfigError("tracker.url", str(exc)) from None
        try:
            check_tracker_url(port_url)
        except ConfigError as exc:
            raise ConfigError("tracker.url", f"{exc.message} (the serial part of {_show(url)})") from None
        return
    if "://" not in url:
        if not url.startswith("/"):
            raise ConfigError("tracker.url", f"expected an absolute device path (/dev/ttyUSB0) or a URL "
                                             f"(socket://host:port), got {_show(url)}")
        return
    scheme = url.split("://", 1)[0].lower()
    try:
        import serial

        serial.serial_for_url(url, do_not_open=True)
    except (ValueError, OSError) as exc:
        raise ConfigError("tracker.url", f"pyserial cannot open {_show(url)}: {exc} (cellcal's own protocol "
                                         "URLs: emscon://host[:port], geocom://<device>, geocom+socket://host:port)") from None
    except Exception as exc:  # noqa: BLE001 - a URL handler pyserial loads may raise anything
        raise ConfigError("tracker.url", f"pyserial cannot open {_show(url)}: {type(exc).__name__}: {exc}") from None
    if scheme in ("socket", "rfc2217"):
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or not 0 < port < 65536:
            raise ConfigError("tracker.url", f"expected {scheme}://host:port with a port in 1..65535, got {_show(url)}")


def as_toml_dict(obj: Any) -> dict:
    """The dataclass as a plain dict of SI values (for ``check-config`` to print)."""
    out = {}
    for f in dataclasses.fields(obj):
        if f.metadata.get("internal"):
            continue
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            v = as_toml_dict(v)
        elif isinstance(v, list):
            v = [as_toml_dict(x) if dataclasses.is_dataclass(x) else x for x in v]
        out[f.name] = v
    return out
