"""Universal Robots controller over RTDE (state) and URScript on port 30002 (moves), with
the dashboard server (29999) and the primary interface (30001) for what RTDE does not say.

``rtde://host[:port]?frequency_hz=125&model=ur5e&urscript_port=30002&dashboard_port=29999&primary_port=30001&tcp_offset=...``

Identity and kinematics (``docs/protocols/robot.md``): at open the driver reads the
controller's factory calibration from the primary interface (``KinematicsInfo``,
:mod:`cellcal.drivers.ur_primary`) and makes :attr:`UrRtdeDriver.model` that table (with
``kinematics=auto``, the default; ``factory`` refuses to open without it, ``nominal`` keeps
the data-sheet model of ``model=``), so forward kinematics of the reported joints matches
the controller's own pose; it records :attr:`UrRtdeDriver.kinematics_digest` and, from the
dashboard server, :attr:`UrRtdeDriver.serial_number`. Before every move it asks the
dashboard for the robot mode, the safety status and remote control, and refuses
(:class:`~cellcal.drivers.errors.DeviceError` with ``code`` ``NOT_IN_REMOTE_CONTROL`` or
``ROBOT_NOT_READY``, :class:`~cellcal.drivers.robot.ProtectiveStop` in a protective stop,
``DASHBOARD_UNAVAILABLE`` when it cannot ask) with the dashboard's own words. A controller
without a dashboard (``dashboard_port=0``, stated by the user) is moved without the check.

Connection (see ``docs/protocols/robot.md``): request protocol version 2, fall back to 1;
read the controller version; set up the output recipe :data:`RECIPE` plus
:data:`OPTIONAL_RECIPE` (a ``NOT_FOUND`` answer for a field of :data:`RECIPE` raises
:class:`RecipeFieldNotFound` naming the field; for an optional field, as older controller
software answers, the recipe is set up again without it); start. A receiver thread
decodes data packages and stamps each (controller clock, host time via the clock model,
sequence number); the :class:`~cellcal.drivers.robot.RobotState` of a sample (arrays, flange
pose, flange speed) is built when it is first read, so samples superseded unread cost only
their decode. With no read for a second the receiver lets the kernel wake it once per
~100 ms of stream (``SO_RCVLOWAT``) instead of once per package; the next read ends that at
once (of such a batch only the last package becomes a sample, the others are counted). Text messages are
logged (never data); unknown packet types are skipped by their size; a malformed data
package is counted and dropped; after garbage the stream hunts for the next intact data
package (:class:`RtdeStream`). If the link drops (EOF, reset, no *valid data package* for
``stream_timeout_s`` whatever else arrives) :meth:`read_state` raises
:class:`~cellcal.drivers.errors.DeviceGoneError` while the thread reconnects with
exponential backoff and repeats the handshake. A drop is always reported once, to the next
``read_state`` call, even when the link is already back by then: a consumer never misses
that the stream had a hole.

TCP offset rule: ``actual_TCP_pose`` is the pose of the controller's *TCP*. The flange is
``base_T_tcp @ inv(flange_T_tcp)`` with ``flange_T_tcp`` from the ``tcp_offset`` option
(UR's ``p[x, y, z, rx, ry, rz]``, m and rad). Leave the pendant's TCP at zero, or set
``tcp_offset`` to exactly what the pendant has. At open, the driver compares forward
kinematics of ``actual_q`` (nominal model) with the reported flange and refuses to start if
they differ by more than ``tcp_check_mm`` (a forgotten TCP, or the wrong ``model``); on a
controller that reports its ``tcp_offset``, it also refuses to start when that differs from
the ``tcp_offset`` option. Every sample carries the reported ``tcp_offset`` and ``payload``
(:attr:`RobotState.tcp_offset`, :attr:`RobotState.payload_kg`; ``None`` on controllers
without them) so a consumer can notice a change during a session.
"""

from __future__ import annotations

import enum
import logging
import math
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, Self

import numpy as np

from cellcal.drivers import rtde_codec as rc
from cellcal.drivers import ur_dashboard as udb
from cellcal.drivers import ur_primary as upr
from cellcal.drivers.base import remaining_s
from cellcal.drivers.clock import StreamClockModel
from cellcal.drivers.errors import (
    DeviceError,
    DeviceGoneError,
    DriverInitError,
    DriverTimeoutError,
    ProtocolError,
)
from cellcal.drivers.kinematics import DHModel, dh_model, kinematics_digest
from cellcal.drivers.robot import (
    OptionSpec,
    ProtectiveStop,
    RobotDriver,
    RobotMode,
    RobotState,
    RobotUrl,
    merge_options,
    opt_float,
    opt_int,
    opt_str,
    opt_vector,
)
from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp, so3_log

__all__ = [
    "UrRtdeDriver",
    "KINEMATICS_CHOICES",
    "RecipeFieldNotFound",
    "UrRobotMode",
    "UrSafetyMode",
    "UrRuntimeState",
    "RECIPE",
    "RECIPE_TYPES",
    "OPTIONAL_RECIPE",
    "RtdeStream",
    "DEFAULT_RTDE_PORT",
    "DEFAULT_URSCRIPT_PORT",
    "pose_to_transform",
    "transform_to_pose",
    "ur_mode",
]

log = logging.getLogger(__name__)

DEFAULT_RTDE_PORT = 30004
_RESYNC_LOG_EVERY_S = 10.0
DEFAULT_URSCRIPT_PORT = 30002

#: The output recipe this driver subscribes to.
RECIPE = (
    "timestamp",
    "actual_q",
    "actual_qd",
    "actual_TCP_pose",
    "robot_mode",
    "safety_mode",
    "runtime_state",
)
RECIPE_TYPES = tuple(rc.OUTPUT_FIELDS[n] for n in RECIPE)
#: Outputs subscribed to when the controller has them: the TCP offset and the payload it
#: applies (UR software older than these outputs answers ``NOT_FOUND``; the driver then
#: sets up :data:`RECIPE` alone and the samples carry ``None`` for them).
OPTIONAL_RECIPE = ("tcp_offset", "payload")
#: Tolerance of the ``tcp_offset`` comparison at open (m and rad: the controller reports
#: the value it was given, so anything beyond float formatting is a different TCP).
_TCP_MATCH_TOL = 1e-6
#: A package stamped this much (s) before the last one means the controller's clock started
#: again (a restart: its timestamp counts from power-on); less is a package out of order.
_CLOCK_RESTART_S = 0.5


class RecipeFieldNotFound(DriverInitError):
    """The controller answered ``NOT_FOUND`` for output fields this driver needs.

    Attributes
    ----------
    fields : tuple of str
        The names the controller does not know.
    """

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.fields = tuple(fields)
        super().__init__(
            f"RTDE controller does not provide output field(s) {', '.join(self.fields)} "
            "(NOT_FOUND): controller software too old for this recipe?"
        )


class UrRobotMode(enum.IntEnum):
    """UR ``robot_mode`` values."""

    NO_CONTROLLER = -1
    DISCONNECTED = 0
    CONFIRM_SAFETY = 1
    BOOTING = 2
    POWER_OFF = 3
    POWER_ON = 4
    IDLE = 5
    BACKDRIVE = 6
    RUNNING = 7
    UPDATING_FIRMWARE = 8


class UrSafetyMode(enum.IntEnum):
    """UR ``safety_mode`` values."""

    NORMAL = 1
    REDUCED = 2
    PROTECTIVE_STOP = 3
    RECOVERY = 4
    SAFEGUARD_STOP = 5
    SYSTEM_EMERGENCY_STOP = 6
    ROBOT_EMERGENCY_STOP = 7
    VIOLATION = 8
    FAULT = 9
    VALIDATE_JOINT_ID = 10
    UNDEFINED_SAFETY_MODE = 11
    AUTOMATIC_MODE_SAFEGUARD_STOP = 12
    SYSTEM_THREE_POSITION_ENABLING_STOP = 13


class UrRuntimeState(enum.IntEnum):
    """UR ``runtime_state`` values (program execution)."""

    STOPPING = 0
    STOPPED = 1
    PLAYING = 2
    PAUSING = 3
    PAUSED = 4
    RESUMING = 5


_SAFETY_TO_MODE = {
    UrSafetyMode.PROTECTIVE_STOP: RobotMode.PROTECTIVE_STOP,
    UrSafetyMode.SAFEGUARD_STOP: RobotMode.PROTECTIVE_STOP,
    UrSafetyMode.AUTOMATIC_MODE_SAFEGUARD_STOP: RobotMode.PROTECTIVE_STOP,
    UrSafetyMode.SYSTEM_THREE_POSITION_ENABLING_STOP: RobotMode.PROTECTIVE_STOP,
    UrSafetyMode.SYSTEM_EMERGENCY_STOP: RobotMode.EMERGENCY_STOP,
    UrSafetyMode.ROBOT_EMERGENCY_STOP: RobotMode.EMERGENCY_STOP,
    UrSafetyMode.VIOLATION: RobotMode.FAULT,
    UrSafetyMode.FAULT: RobotMode.FAULT,
}
_ROBOT_TO_MODE = {
    UrRobotMode.NO_CONTROLLER: RobotMode.DISCONNECTED,
    UrRobotMode.DISCONNECTED: RobotMode.DISCONNECTED,
    UrRobotMode.CONFIRM_SAFETY: RobotMode.IDLE,
    UrRobotMode.BOOTING: RobotMode.BOOTING,
    UrRobotMode.POWER_OFF: RobotMode.POWER_OFF,
    UrRobotMode.POWER_ON: RobotMode.IDLE,
    UrRobotMode.IDLE: RobotMode.IDLE,
    UrRobotMode.BACKDRIVE: RobotMode.IDLE,
    UrRobotMode.RUNNING: RobotMode.RUNNING,
    UrRobotMode.UPDATING_FIRMWARE: RobotMode.BOOTING,
}


def ur_mode(robot_mode: int, safety_mode: int) -> RobotMode:
    """Our :class:`RobotMode` from UR ``robot_mode`` and ``safety_mode`` codes."""
    try:
        m = _SAFETY_TO_MODE.get(UrSafetyMode(safety_mode))
    except ValueError:
        m = None
    if m is not None:
        return m
    try:
        return _ROBOT_TO_MODE[UrRobotMode(robot_mode)]
    except ValueError:
        return RobotMode.UNKNOWN


def pose_to_transform(pose: Any) -> np.ndarray:
    """4x4 transform of a UR pose ``(x, y, z, rx, ry, rz)`` (m, rotation vector in rad)."""
    p = np.asarray(pose, dtype=float)
    return make_transform(so3_exp(p[3:6]), p[:3])


def _pose_to_transform_floats(pose: Any) -> np.ndarray:
    """:func:`pose_to_transform` of six finite floats, in Python floats and one array: it
    runs for every robot sample read, where numpy's per-call cost on a 3x3 is most of the
    work. The same Rodrigues formula as ``so3_exp`` (equal to rounding, tested)."""
    x, y, z, wx, wy, wz = (float(v) for v in pose)
    theta2 = wx * wx + wy * wy + wz * wz
    if theta2 < 1e-8:
        a = 1.0 - theta2 / 6.0
        b = 0.5 - theta2 / 24.0
    else:
        theta = math.sqrt(theta2)
        a = math.sin(theta) / theta
        b = (1.0 - math.cos(theta)) / theta2
    # R = I + a K + b K^2 with K = hat(w); K^2 = w w^T - theta2 I
    bxx, byy, bzz = b * (wx * wx - theta2), b * (wy * wy - theta2), b * (wz * wz - theta2)
    bxy, bxz, byz = b * wx * wy, b * wx * wz, b * wy * wz
    return np.array([
        [1.0 + bxx, bxy - a * wz, bxz + a * wy, x],
        [bxy + a * wz, 1.0 + byy, byz - a * wx, y],
        [bxz - a * wy, byz + a * wx, 1.0 + bzz, z],
        [0.0, 0.0, 0.0, 1.0],
    ])


def transform_to_pose(T: np.ndarray) -> np.ndarray:
    """UR pose ``(x, y, z, rx, ry, rz)`` (6,) of a 4x4 transform."""
    return np.concatenate([T[:3, 3], so3_log(T[:3, :3])])


class RtdeStream:
    """Data packages out of an RTDE byte stream, after the handshake (no I/O).

    ``feed(bytes)`` returns the field dicts of every well-formed data package for
    ``recipe``, in order; it never raises. Text messages are logged, other and unknown
    packet types skipped by their size, and malformed data packages (wrong recipe id,
    non-finite values) counted in :attr:`bad_packets` and dropped. A header no controller
    sends (a size below 3, a data package of another size, a packet longer than
    :data:`~cellcal.drivers.rtde_codec.MAX_SKIP_BYTES`) means the framing is lost: the
    stream hunts for the next intact data package (:class:`~cellcal.drivers.rtde_codec.StreamReader`)
    and counts the bytes it discards in :attr:`garbage_bytes`. Whether the link is alive is
    judged by :attr:`valid_packages`, never by bytes.
    """

    def __init__(self, recipe: rc.Recipe, protocol: int) -> None:
        self.recipe = recipe
        self.protocol = protocol
        self._reader = rc.StreamReader(
            rc.HEADER.size + recipe.payload_size,
            recipe.recipe_id if protocol >= rc.PROTOCOL_V2 else None,
            self._decodes,
        )
        self._bad = 0
        self.valid_packages = 0
        self.text_messages = 0
        self.skipped_packets = 0

    @property
    def bad_packets(self) -> int:
        """Data packages dropped: malformed ones in sync plus headers that lost the framing."""
        return self._bad + self._reader.bad_headers

    @property
    def garbage_bytes(self) -> int:
        """Bytes discarded while hunting for the framing."""
        return self._reader.garbage_bytes

    @property
    def resyncs(self) -> int:
        """Times the framing was found again after it was lost."""
        return self._reader.resyncs

    def _decode(self, payload: bytes) -> dict[str, Any]:
        fields = self.recipe.decode(payload)
        _check_finite(fields)
        return fields

    def _decodes(self, payload: bytes) -> bool:
        # Only while hunting: a candidate must decode *and* hold plausible mode codes, so
        # garbage that happens to start with the data header (2^-24 per byte in v1) is not
        # taken for a package.
        try:
            fields = self._decode(payload)
        except ProtocolError:
            return False
        return all(lo <= int(fields[k]) <= hi for k, (lo, hi) in _MODE_RANGES.items() if k in fields)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._reader.feed(data)
        out: list[dict[str, Any]] = []
        for ptype, payload in self._reader.packets():
            if ptype == rc.PacketType.DATA_PACKAGE:
                try:
                    fields = self._decode(payload)
                except ProtocolError as exc:
                    self._bad += 1
                    log.debug("RTDE: dropped data package: %s", exc)
                    continue
                out.append(fields)
            elif ptype == rc.PacketType.TEXT_MESSAGE:
                self.text_messages += 1
                _log_text(payload, self.protocol)
            else:
                self.skipped_packets += 1
                log.debug("RTDE: skipped packet type %d (%d bytes)", ptype, len(payload))
        self.valid_packages += len(out)
        return out


#: Codes a controller sends (UR RTDE guide); used to recognise a data package after garbage.
_MODE_RANGES = {
    "robot_mode": (min(UrRobotMode), max(UrRobotMode)),
    "safety_mode": (min(UrSafetyMode), max(UrSafetyMode)),
    "runtime_state": (min(UrRuntimeState), max(UrRuntimeState)),
}


#: With no sample read for this long (s), the stream is taken in batches: nobody waits for
#: the next sample, and one wake-up per package is most of an idle daemon's cost at 500 Hz.
_BATCH_AFTER_S = 1.0
#: A batch is about this much of the stream (s): the kernel wakes the reader once per batch
#: (``SO_RCVLOWAT``, a condition in the kernel, not a poll). A reader ends batching at once.
#: Each wake-up costs far more than the packages it decodes (about 0.25 ms of CPU against
#: 4 us a package here: bench/idle_bench.py), so the batch is long; at most a tenth of
#: ``stream_timeout_s``, so packages held back in the kernel cannot starve the watchdog.
_BATCH_S = 0.1
#: The receive timeout (s) between packages, and while batched the least one (a batch is
#: awaited whole: a timeout per 50 ms would wake the idle receiver more often than its batches).
_RECV_TIMEOUT_S = 0.05


class _Raw(NamedTuple):
    """One received data package: its fields and the stamps the stream gave it."""

    fields: Mapping[str, Any]
    t_device_s: float
    t_host_ns: int
    t_recv_host_ns: int
    seq: int


def _check_finite(fields: Mapping[str, Any]) -> None:
    # One sum first (every data package pays this): a NaN or an infinity anywhere makes it
    # non-finite; only then are the fields walked to name the culprit (a sum can also
    # overflow on huge finite values, which then pass).
    total = 0.0
    for v in fields.values():
        total += sum(v) if isinstance(v, tuple) else v
    if math.isfinite(total):
        return
    for name, v in fields.items():
        vals = v if isinstance(v, tuple) else (v,)
        for x in vals:
            if isinstance(x, float) and not math.isfinite(x):
                raise ProtocolError(f"RTDE data package: {name} is not finite")


def _log_text(payload: bytes, protocol: int) -> None:
    try:
        msg = rc.decode_text_message(payload, protocol)
    except ProtocolError as exc:
        log.warning("RTDE: malformed text message: %s", exc)
        return
    level = {
        rc.TextLevel.EXCEPTION: logging.ERROR,
        rc.TextLevel.ERROR: logging.ERROR,
        rc.TextLevel.WARNING: logging.WARNING,
    }.get(msg.level, logging.INFO)
    log.log(level, "RTDE controller message [%s]: %s", msg.source or "-", msg.message)


def _opt_host_port(target: str) -> tuple[str, int]:
    host, port = target, DEFAULT_RTDE_PORT
    if target.startswith("["):  # [ipv6]:port
        host, _, rest = target[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif target.count(":") == 1:
        host, p = target.split(":")
        port = int(p)
    if not host or not 0 < port < 65536:
        raise ValueError(f"rtde URL target {target!r}: expected host[:port]")
    return host, port


#: ``kinematics=`` values.
KINEMATICS_CHOICES = ("auto", "factory", "nominal")


def _opt_choice(v: Any, choices: tuple[str, ...]) -> str:
    s = opt_str(v).strip().lower()
    if s not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}")
    return s


OPTIONS: dict[str, OptionSpec] = {
    "frequency_hz": OptionSpec(opt_float(1.0, 500.0), 125.0, "output stream rate requested (Hz)"),
    "model": OptionSpec(opt_str, "ur5e", "nominal DH model for flange speed and the TCP check"),
    "urscript_port": OptionSpec(opt_int(1, 65535), DEFAULT_URSCRIPT_PORT, "URScript port"),
    "tcp_offset": OptionSpec(opt_vector(6), np.zeros(6), "controller TCP p[x,y,z,rx,ry,rz] (m, rad)"),
    "tcp_check_mm": OptionSpec(opt_float(0.0), 20.0, "max |FK - reported flange| at open; 0 off"),
    "timeout_s": OptionSpec(opt_float(positive=True), 1.0, "read_state timeout (s)"),
    "connect_timeout_s": OptionSpec(opt_float(positive=True), 3.0, "TCP connect + handshake (s)"),
    "stream_timeout_s": OptionSpec(opt_float(positive=True), 1.0, "no valid data package this long = link lost"),
    "max_age_s": OptionSpec(opt_float(positive=True), 0.1, "newest sample accepted if this fresh"),
    "reconnect_max_s": OptionSpec(opt_float(positive=True), 2.0, "backoff ceiling (s)"),
    "max_joint_speed_rad_s": OptionSpec(opt_float(positive=True), 1.05, "movej v at speed=1"),
    "max_joint_accel_rad_s2": OptionSpec(opt_float(positive=True), 1.4, "movej a at speed=1"),
    "max_tcp_speed_m_s": OptionSpec(opt_float(positive=True), 0.25, "movel v at speed=1"),
    "max_tcp_accel_m_s2": OptionSpec(opt_float(positive=True), 1.2, "movel a at speed=1"),
    "moving_threshold_rad_s": OptionSpec(opt_float(positive=True), 0.005, "max|qd| above = moving"),
    "move_timeout_s": OptionSpec(opt_float(positive=True), 120.0, "move_to(wait=True) timeout"),
    "protocol_version": OptionSpec(opt_int(1, 2), 2, "highest RTDE protocol version to request"),
    "clock_feed_hz": OptionSpec(opt_float(positive=True), 50.0, "samples/s fed to the clock model"),
    "dashboard_port": OptionSpec(opt_int(0, 65535), udb.DEFAULT_DASHBOARD_PORT,
                                 "dashboard server port; 0: none (moves then go without the remote-control check)"),
    "primary_port": OptionSpec(opt_int(0, 65535), upr.DEFAULT_PRIMARY_PORT,
                               "primary interface port (factory calibration); 0: none"),
    "kinematics": OptionSpec(lambda v: _opt_choice(v, KINEMATICS_CHOICES), "auto",
                             "auto: the controller's factory table when it serves one; factory: required; nominal"),
}


class UrRtdeDriver(RobotDriver):
    """RTDE client backend; build with :func:`~cellcal.drivers.robot.connect_robot`.

    Parameters
    ----------
    host : str
        Controller address.
    port : int
        RTDE port (30004 on a real controller).
    options : mapping
        Parsed :data:`OPTIONS` (see ``docs/protocols/robot.md``).
    """

    backend = "rtde"

    def __init__(self, host: str, port: int = DEFAULT_RTDE_PORT, **options: Any) -> None:
        opts = merge_options(OPTIONS, {}, options, "rtde")
        model = opts["model"] if isinstance(opts["model"], DHModel) else dh_model(opts["model"])
        super().__init__(
            model=model,
            timeout_s=opts["timeout_s"],
            max_age_s=opts["max_age_s"],
            move_timeout_s=opts["move_timeout_s"],
        )
        self.host = host
        self.port = int(port)
        self.opts = opts
        #: the data-sheet model of ``model=`` (``model`` becomes the factory table at open)
        self.nominal_model = model
        #: the controller's serial number (dashboard ``get serial number``), None if unknown
        self.serial_number: str | None = None
        #: :func:`~cellcal.drivers.kinematics.kinematics_digest` of :attr:`model`'s table
        self.kinematics_digest: str | None = None
        #: ``"factory"`` (the controller's KinematicsInfo) or ``"nominal"`` (the data sheet)
        self.kinematics_source = "nominal"
        #: the factory table as served (None until read)
        self.kinematics_info: upr.KinematicsInfo | None = None
        #: the primary interface's version message (None until read)
        self.primary_version: upr.VersionMessage | None = None
        #: PolyScope version from the dashboard (None until read)
        self.polyscope_version: tuple[int, int, int, int] | None = None
        self._dashboard: udb.DashboardClient | None = None
        self._dashboard_lock = threading.Lock()
        self.flange_T_tcp = pose_to_transform(opts["tcp_offset"])
        self._tcp_T_flange = se3_inverse(self.flange_T_tcp)
        self._tcp_applied = not np.array_equal(self._tcp_T_flange, np.eye(4))
        self.protocol: int = 0
        self.controller_version: rc.ControllerVersion | None = None
        self._cond = threading.Condition()
        # the newest sample as received, and its RobotState once someone has read it
        self._latest_raw: _Raw | None = None
        self._last_read = time.monotonic()  # when a sample was last asked for
        self._lowat = 1  # the socket's SO_RCVLOWAT in bytes (1: every package wakes the reader)
        self._latest: RobotState | None = None
        self._link_error: DeviceGoneError | None = None
        self._unreported_loss: DeviceGoneError | None = None
        self._sock: socket.socket | None = None
        self._stream: RtdeStream | None = None
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._pending: list[dict[str, Any]] = []  # data packages that came with the start reply
        self._runtime: UrRuntimeState | None = None
        self.reconnects = 0
        #: The :data:`OPTIONAL_RECIPE` outputs the controller provides (set at each handshake).
        self.optional_outputs: tuple[str, ...] = ()
        #: controller clock (RTDE ``timestamp``) -> host ``monotonic_ns``
        self.clock = StreamClockModel(window=256)
        self._last_t_dev = -math.inf
        self._out_of_order = 0
        self._last_clock_feed = -math.inf
        self._resync_logged = -math.inf

    @classmethod
    def _from_url_internal(cls, url: RobotUrl, options: Mapping[str, Any]) -> Self:
        host, port = _opt_host_port(url.target)
        opts = merge_options(OPTIONS, url.query, options, f"rtde://{url.target}")
        return cls(host, port, **opts)

    def __repr__(self) -> str:
        return f"UrRtdeDriver(rtde://{self.host}:{self.port})"

    @property
    def bad_packets(self) -> int:
        """Malformed data packages dropped on the current connection."""
        return self._stream.bad_packets if self._stream else 0

    @property
    def garbage_bytes(self) -> int:
        """Bytes discarded while hunting for lost framing, on the current connection."""
        return self._stream.garbage_bytes if self._stream else 0

    @property
    def resyncs(self) -> int:
        """Times the framing was lost and found again on the current connection."""
        return self._stream.resyncs if self._stream else 0

    # -- connection -----------------------------------------------------------------------
    def _open_internal(self) -> None:
        self._read_factory_kinematics()
        self._open_dashboard()
        sock, stream = self._connect()
        try:
            first = self._first_samples(sock, stream)
            now = time.monotonic_ns()
            raws = [self._sample(f, now) for f in first]
            last = self._build(raws[-1])
            self._check_tcp(last)
        except BaseException:
            sock.close()
            self._close_dashboard()
            raise
        with self._cond:
            self._sock, self._stream = sock, stream
            for raw in raws:
                self._publish(raw, last if raw is raws[-1] else None, int(raw.fields["runtime_state"]))
        self._thread = threading.Thread(target=self._run, name=f"rtde-{self.host}", daemon=True)
        self._thread.start()

    # -- identity and kinematics ------------------------------------------------------------
    def _read_factory_kinematics(self) -> None:
        """The controller's factory DH table from the primary interface -> :attr:`model`."""
        mode = self.opts["kinematics"]
        port = self.opts["primary_port"]
        nominal = self.nominal_model
        self.model, self.kinematics_source = nominal, "nominal"
        self.kinematics_digest = kinematics_digest(nominal)
        if mode == "nominal":
            return
        if port == 0:
            if mode == "factory":
                raise DriverInitError(f"{self!r}: kinematics=factory needs the primary interface (primary_port=0)")
            return
        try:
            info = upr.read_controller_info(self.host, port, self.opts["connect_timeout_s"])
            model = info.kinematics.model(f"{nominal.name}-factory")
        except (DeviceGoneError, DriverTimeoutError, ProtocolError, ValueError) as exc:
            if mode == "factory":
                raise DriverInitError(f"{self!r}: no factory calibration from the primary interface: {exc}") from exc
            log.warning("%r: no factory calibration from the primary interface (%s); forward kinematics uses the "
                        "data-sheet model %s, which a UR's own pose differs from by millimetres", self, exc, nominal.name)
            return
        self.kinematics_info, self.primary_version = info.kinematics, info.version
        self.model, self.kinematics_source = model, "factory"
        self.kinematics_digest = info.kinematics.digest
        log.info("%r: factory calibration %s from the primary interface (controller %s)", self, self.kinematics_digest,
                 ".".join(str(v) for v in info.version.version))

    def _open_dashboard(self) -> None:
        port = self.opts["dashboard_port"]
        if port == 0:
            return
        client = udb.DashboardClient(self.host, port, timeout_s=self.opts["connect_timeout_s"])
        try:
            client.connect()
            self.polyscope_version = client.polyscope_version()
        except (DeviceGoneError, DriverTimeoutError, ProtocolError) as exc:
            client.close()
            log.warning("%r: dashboard server %s:%d not reachable (%s): moves are refused until it is", self,
                        self.host, port, exc)
            return
        try:
            self.serial_number = client.serial_number()
        except ProtocolError as exc:  # PolyScope before 5.6 has no 'get serial number'
            log.info("%r: no serial number from the dashboard: %s", self, exc)
        except (DeviceGoneError, DriverTimeoutError) as exc:
            log.warning("%r: dashboard lost while asking the serial number: %s", self, exc)
        with self._dashboard_lock:
            self._dashboard = client

    def _close_dashboard(self) -> None:
        with self._dashboard_lock:
            client, self._dashboard = self._dashboard, None
        if client is not None:
            client.close()

    def dashboard_status(self) -> udb.DashboardStatus:
        """Robot mode, safety status and remote control, asked of the dashboard now.

        Raises
        ------
        DeviceError
            ``DASHBOARD_UNAVAILABLE``: no dashboard configured, or it cannot be reached.
        """
        port = self.opts["dashboard_port"]
        if port == 0:
            raise DeviceError(f"{self!r}: no dashboard server (dashboard_port=0)", "DASHBOARD_UNAVAILABLE")
        with self._dashboard_lock:
            if self._dashboard is None:
                self._dashboard = udb.DashboardClient(self.host, port, timeout_s=self.opts["connect_timeout_s"])
            client = self._dashboard
        try:
            return client.status()
        except (DeviceGoneError, DriverTimeoutError, ProtocolError) as exc:
            raise DeviceError(
                f"{self!r}: cannot ask the dashboard server {self.host}:{port} whether the robot may move ({exc}); "
                "not moving", "DASHBOARD_UNAVAILABLE") from exc

    def _check_motion_allowed(self) -> None:
        """Refuse a move the controller would refuse or should not get (dashboard state)."""
        if self.opts["dashboard_port"] == 0:
            return
        st = self.dashboard_status()
        if st.motion_allowed:
            return
        if st.safety_status in ("PROTECTIVE_STOP", "SAFEGUARD_STOP", "AUTOMATIC_MODE_SAFEGUARD_STOP"):
            raise ProtectiveStop(f"{self!r}: robot is in a protective stop (dashboard: {st.describe()}); not moving")
        if not st.remote_control:
            raise DeviceError(
                f"{self!r}: the robot is not in remote control (dashboard: {st.describe()}): switch the pendant to "
                "Remote Control to let cellcal move it; not moving", "NOT_IN_REMOTE_CONTROL")
        raise DeviceError(
            f"{self!r}: the robot is not ready to move (dashboard: {st.describe()}): it must be RUNNING with "
            f"safety status {' or '.join(udb.MOTION_SAFETY_STATUSES)} (power on and release the brakes); not moving",
            "ROBOT_NOT_READY")

    def _connect(self) -> tuple[socket.socket, RtdeStream]:
        timeout = self.opts["connect_timeout_s"]
        try:
            sock = socket.create_connection((self.host, self.port), timeout=timeout)
        except OSError as exc:
            raise DriverInitError(f"{self!r}: cannot connect: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock, self._handshake(sock, time.monotonic() + timeout)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, sock: socket.socket, deadline: float) -> RtdeStream:
        reader = rc.PacketReader()
        P = rc.PacketType

        def request(packet: bytes, expect: rc.PacketType) -> bytes:
            sock.sendall(packet)
            while True:
                for ptype, payload in reader.packets():
                    if ptype == expect:
                        return payload
                    if ptype == P.TEXT_MESSAGE:
                        _log_text(payload, self.protocol or rc.PROTOCOL_V2)
                    else:
                        log.debug("RTDE handshake: skipped packet type %d", ptype)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DriverInitError(f"{self!r}: no {expect.name} reply in time")
                sock.settimeout(remaining)
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    raise DriverInitError(f"{self!r}: no {expect.name} reply in time") from None
                if not data:
                    raise DriverInitError(f"{self!r}: controller closed the connection during setup")
                reader.feed(data)

        try:
            protocol = 0
            for version in range(self.opts["protocol_version"], 0, -1):
                reply = request(rc.encode_protocol_version_request(version), P.REQUEST_PROTOCOL_VERSION)
                if rc.decode_accepted(reply, "protocol version reply"):
                    protocol = version
                    break
                log.info("%r: protocol version %d refused", self, version)
            if not protocol:
                raise DriverInitError(f"{self!r}: controller accepts neither RTDE protocol 2 nor 1")
            self.protocol = protocol
            reply = request(rc.encode_packet(P.GET_URCONTROL_VERSION), P.GET_URCONTROL_VERSION)
            self.controller_version = rc.decode_controller_version(reply)
            names: tuple[str, ...] = RECIPE + OPTIONAL_RECIPE

            def setup(names: tuple[str, ...]) -> tuple[int, list[str]]:
                reply = request(
                    rc.encode_setup_outputs_request(names, self.opts["frequency_hz"], protocol),
                    P.CONTROL_PACKAGE_SETUP_OUTPUTS,
                )
                rid, types = rc.decode_setup_reply(reply, P.CONTROL_PACKAGE_SETUP_OUTPUTS, protocol)
                if len(types) != len(names):
                    raise DriverInitError(f"{self!r}: controller typed {len(types)} of {len(names)} recipe fields")
                required = tuple(n for n, t in zip(names, types, strict=True) if t == rc.NOT_FOUND and n in RECIPE)
                if required:
                    raise RecipeFieldNotFound(required)
                return rid, types

            recipe_id, types = setup(names)
            missing = tuple(n for n, t in zip(names, types, strict=True) if t == rc.NOT_FOUND)
            if missing:
                # Older controller software: the recipe is refused as a whole, so ask again
                # without what it lacks. A TCP or payload change then goes unnoticed by the
                # driver (the daemon still compares every station with forward kinematics).
                log.info("%r: controller has no output(s) %s; not watched this session", self, ", ".join(missing))
                names = tuple(n for n in names if n not in missing)
                recipe_id, types = setup(names)
            expected = [rc.OUTPUT_FIELDS[n].name for n in names]
            if types != expected:
                raise DriverInitError(
                    f"{self!r}: controller typed the recipe {types}, expected {expected}"
                )
            recipe = rc.Recipe(names, tuple(rc.OUTPUT_FIELDS[n] for n in names), recipe_id, protocol)
            self.optional_outputs = tuple(n for n in OPTIONAL_RECIPE if n in names)
            reply = request(rc.encode_packet(P.CONTROL_PACKAGE_START), P.CONTROL_PACKAGE_START)
            if not rc.decode_accepted(reply, "start reply"):
                raise DriverInitError(f"{self!r}: controller refused to start the stream")
        except ProtocolError as exc:
            raise DriverInitError(f"{self!r}: bad reply during setup: {exc}") from exc
        except OSError as exc:
            raise DriverInitError(f"{self!r}: connection failed during setup: {exc}") from exc
        stream = RtdeStream(recipe, protocol)
        # bytes that arrived behind the start reply are the stream already (garbage included)
        self._pending = stream.feed(reader.take())
        log.info(
            "%r: RTDE v%d, controller %s, recipe %d at %.0f Hz",
            self, protocol, self.controller_version, recipe_id, self.opts["frequency_hz"],
        )
        return stream

    def _first_samples(self, sock: socket.socket, stream: RtdeStream) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.opts["connect_timeout_s"]
        pending = self._pending
        while not pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DriverInitError(
                    f"{self!r}: no valid data package after start ({stream.garbage_bytes} garbage bytes)"
                )
            sock.settimeout(remaining)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                raise DriverInitError(f"{self!r}: {exc}") from exc
            if not data:
                raise DriverInitError(f"{self!r}: controller closed the stream after start")
            pending = stream.feed(data)
        return pending

    def _check_tcp(self, state: RobotState) -> None:
        limit_m = self.opts["tcp_check_mm"] * 1e-3
        if limit_m <= 0:
            return
        reported = state.tcp_offset
        if reported is not None and float(np.max(np.abs(reported - self.opts["tcp_offset"]))) > _TCP_MATCH_TOL:
            raise DriverInitError(
                f"{self!r}: the controller's TCP offset is p{[round(float(v), 6) for v in reported]} but "
                f"tcp_offset= is p{[round(float(v), 6) for v in self.opts['tcp_offset']]}: set tcp_offset= to "
                "what the pendant has, or zero the pendant's TCP (see docs/protocols/robot.md)"
            )
        fk = self.model.forward(state.q_rad)
        err = float(np.linalg.norm(fk[:3, 3] - state.base_T_flange[:3, 3]))
        if err > limit_m:
            raise DriverInitError(
                f"{self!r}: flange from actual_TCP_pose is {err * 1e3:.1f} mm from "
                f"{self.model.name} FK of actual_q: the controller's TCP offset is not zero "
                "and not given as tcp_offset=, or model= is wrong (see docs/protocols/robot.md)"
            )

    # -- receiving ---------------------------------------------------------------------
    def _to_state(self, f: Mapping[str, Any], recv_ns: int) -> RobotState:
        return self._build(self._sample(f, recv_ns))

    def _sample(self, f: Mapping[str, Any], recv_ns: int) -> _Raw:
        """What a data package that becomes a sample costs: the clock model and its stamps."""
        t_dev = float(f["timestamp"])
        if t_dev < self._last_t_dev - _CLOCK_RESTART_S:
            log.warning("%r: controller clock went back %.3f s (controller restarted?): clock model reset",
                        self, self._last_t_dev - t_dev)
            self.clock.reset()
            self._last_clock_feed = -math.inf
        elif t_dev < self._last_t_dev:
            # An older stamp than the last by less than a restart: a package out of order. Its
            # mapping is still good; it is not fed to the clock model (the model wants time order).
            self._out_of_order += 1
            log.debug("%r: package stamped %.6f s before the last one (%d so far)", self,
                      self._last_t_dev - t_dev, self._out_of_order)
            t_host = int(self.clock.to_host_ns(t_dev)) if self.clock.ready else recv_ns
            self._seq += 1
            return _Raw(f, t_dev, t_host, recv_ns, self._seq)
        self._last_t_dev = t_dev
        # A refit of the envelope costs milliseconds at a full window: feed the model at
        # most clock_feed_hz (the mapping itself is cheap and applies to every sample).
        if t_dev - self._last_clock_feed >= 1.0 / self.opts["clock_feed_hz"]:
            self.clock.add(t_dev, recv_ns)
            self._last_clock_feed = t_dev
        t_host = int(self.clock.to_host_ns(t_dev)) if self.clock.ready else recv_ns
        self._seq += 1
        return _Raw(f, t_dev, t_host, recv_ns, self._seq)

    def _build(self, raw: _Raw) -> RobotState:
        """The :class:`RobotState` of a sample: built only when someone reads it (at 500 Hz
        most samples of an idle daemon are superseded unread, and the arrays, the pose and
        the flange speed are most of a sample's cost)."""
        f = raw.fields
        q = np.array(f["actual_q"], dtype=float)
        qd = np.array(f["actual_qd"], dtype=float)
        base_T_flange = _pose_to_transform_floats(f["actual_TCP_pose"])
        if self._tcp_applied:
            base_T_flange = base_T_flange @ self._tcp_T_flange
        # the fields are finite floats already (RtdeStream): the unchecked closed form
        lin, ang = self.model._flange_speed_floats(f["actual_q"], f["actual_qd"])
        return RobotState(
            q_rad=q,
            qd_rad_s=qd,
            base_T_flange=base_T_flange,
            t_device_s=raw.t_device_s,
            t_host_ns=raw.t_host_ns,
            moving=max(abs(v) for v in f["actual_qd"]) > self.opts["moving_threshold_rad_s"],
            mode=ur_mode(int(f["robot_mode"]), int(f["safety_mode"])),
            flange_speed_m_s=lin,
            flange_ang_speed_rad_s=ang,
            target_reached=None,
            t_recv_host_ns=raw.t_recv_host_ns,
            seq=raw.seq,
            tcp_offset=np.array(f["tcp_offset"], dtype=float) if "tcp_offset" in f else None,
            payload_kg=float(f["payload"]) if "payload" in f else None,
        )

    def _latest_state(self) -> RobotState | None:
        # caller holds self._cond
        if self._latest is None and self._latest_raw is not None:
            self._latest = self._build(self._latest_raw)
        return self._latest

    def runtime_state(self) -> UrRuntimeState | None:
        """Program state of the latest sample (``None`` before the first)."""
        with self._cond:
            return self._runtime

    def _publish(self, raw: _Raw, state: RobotState | None = None, runtime: int | None = None) -> None:
        # caller holds self._cond
        self._latest_raw, self._latest = raw, state
        self._link_error = None
        if runtime is not None:
            try:
                self._runtime = UrRuntimeState(runtime)
            except ValueError:
                self._runtime = None
        self._cond.notify_all()

    def _run(self) -> None:
        backoff0 = 0.05
        backoff = backoff0
        while not self._stop_evt.is_set():
            sock = self._sock
            if sock is None:
                try:
                    sock, stream = self._connect()
                except DriverInitError as exc:
                    self._set_link_error(exc, reconnecting=True)
                    self._stop_evt.wait(backoff)
                    backoff = min(2 * backoff, self.opts["reconnect_max_s"])
                    continue
                with self._cond:
                    if self._stop_evt.is_set():
                        sock.close()
                        return
                    self._sock, self._stream = sock, stream
                    self.reconnects += 1
                for f in self._pending:
                    self._deliver(f, time.monotonic_ns())
                log.info("%r: reconnected", self)
                backoff = backoff0
            try:
                self._pump(sock)
            except (OSError, ProtocolError, DeviceGoneError) as exc:
                if self._stop_evt.is_set():
                    return
                log.warning("%r: link lost: %s", self, exc)
                gone = exc if isinstance(exc, DeviceGoneError) else DeviceGoneError(
                    f"{self!r}: link lost ({exc}); reconnecting"
                )
                self._set_link_error(gone, reconnecting=False)
                with self._cond:
                    self._sock = None
                try:
                    sock.close()
                except OSError:
                    pass

    def _set_link_error(self, exc: Exception, reconnecting: bool) -> None:
        if not isinstance(exc, DeviceGoneError):
            exc = DeviceGoneError(f"{self!r}: reconnect failed ({exc}); retrying")
        with self._cond:
            self._link_error = exc
            if not reconnecting:
                # a drop is reported to the next reader even if the link is back by then
                self._unreported_loss = exc
            self._cond.notify_all()

    def _deliver(self, fields: Mapping[str, Any], recv_ns: int) -> None:
        raw = self._sample(fields, recv_ns)
        with self._cond:
            self._publish(raw, None, int(fields["runtime_state"]))

    def _reading(self) -> None:
        """A sample is asked for: every package wakes the reader again (caller holds _cond)."""
        self._last_read = time.monotonic()
        if self._lowat > 1 and self._sock is not None:
            self._set_lowat(self._sock, 1)

    def _set_lowat(self, sock: socket.socket, nbytes: int) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        except OSError as exc:  # a socket being closed; the next connection starts at 1
            log.debug("%r: SO_RCVLOWAT %d: %s", self, nbytes, exc)
            return
        self._lowat = nbytes

    def _pump(self, sock: socket.socket) -> None:
        stream = self._stream
        assert stream is not None
        timeout = _RECV_TIMEOUT_S
        sock.settimeout(timeout)
        # The watchdog counts valid data packages, not bytes: a stream of garbage (or of text
        # messages, or of packages that do not decode) is as dead as a silent one.
        last_valid = time.monotonic()
        limit = self.opts["stream_timeout_s"]
        resyncs = stream.resyncs
        batch_s = min(_BATCH_S, 0.1 * limit)
        per_batch = int(self.opts["frequency_hz"] * batch_s)
        batch_bytes = (rc.HEADER.size + stream.recipe.payload_size) * per_batch if per_batch > 1 else 1
        with self._cond:
            self._lowat = 1  # a new socket
        while not self._stop_evt.is_set():
            want = batch_bytes if time.monotonic() - self._last_read > _BATCH_AFTER_S else 1
            if want != self._lowat:
                with self._cond:
                    if want == 1 or time.monotonic() - self._last_read > _BATCH_AFTER_S:
                        self._set_lowat(sock, want)
            # (a reader may have ended the batching from its thread: then back to the short timeout)
            want_timeout = max(_RECV_TIMEOUT_S, 2.0 * batch_s) if self._lowat > 1 else _RECV_TIMEOUT_S
            if want_timeout != timeout:
                timeout = want_timeout
                sock.settimeout(timeout)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                data = None
            now = time.monotonic()
            if data is not None:
                recv_ns = time.monotonic_ns()
                if not data:
                    raise DeviceGoneError(f"{self!r}: controller closed the connection")
                fields_list = stream.feed(data)
                if fields_list:
                    last_valid = now
                    if stream.resyncs != resyncs and now - self._resync_logged >= _RESYNC_LOG_EVERY_S:
                        # said once per period: a stream that keeps losing its framing must
                        # not become a flood of log lines
                        log.warning("%r: RTDE framing lost and found again (%d time(s), %d garbage bytes "
                                    "on this link)", self, stream.resyncs, stream.garbage_bytes)
                        resyncs = stream.resyncs
                        self._resync_logged = now
                    # several packages in one read: all but the last are already superseded,
                    # but each one is a sample for the clock model and the settle detector
                    if self._lowat > 1:
                        # batched (nobody reads): the superseded packages are counted, not
                        # kept; the last one is the sample, and its stamp the clock model's
                        self._seq += len(fields_list) - 1
                        self._deliver(fields_list[-1], recv_ns)
                    else:
                        for fields in fields_list:
                            self._deliver(fields, recv_ns)
            if now - last_valid > limit:
                raise DeviceGoneError(
                    f"{self!r}: no valid RTDE data package for {limit:.3g} s "
                    f"({stream.garbage_bytes} garbage bytes, {stream.bad_packets} bad packages on this link)"
                ) from None

    def _close_internal(self) -> None:
        self._close_dashboard()
        self._stop_evt.set()
        with self._cond:
            sock = self._sock
            self._sock = None
            self._link_error = DeviceGoneError(f"{self!r}: closed")
            self._cond.notify_all()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _read_state_internal(self, deadline: float) -> RobotState | None:
        max_age_ns = int(self.max_age_s * 1e9)
        with self._cond:
            self._reading()
            while True:
                if self._unreported_loss is not None:
                    exc, self._unreported_loss = self._unreported_loss, None
                    raise exc
                if self._link_error is not None:
                    raise self._link_error
                raw = self._latest_raw
                if raw is not None and time.monotonic_ns() - raw.t_recv_host_ns <= max_age_ns:
                    return self._latest_state()
                remaining = remaining_s(deadline)
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)

    def wait_for_sample_after(self, seq: int, timeout_s: float) -> RobotState:
        """Block until a sample with ``seq`` greater than the given one arrives."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._reading()
            while True:
                if self._link_error is not None:
                    raise self._link_error
                raw = self._latest_raw
                if raw is not None and raw.seq > seq:
                    state = self._latest_state()
                    assert state is not None
                    return state
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DriverTimeoutError(f"{self!r}: no new sample within {timeout_s:.3g} s")
                self._cond.wait(remaining)

    # -- moves (URScript on the secondary interface) -------------------------------------
    def send_script(self, script: str) -> None:
        """Send URScript text to ``urscript_port`` (a fresh connection per script)."""
        if not script.endswith("\n"):
            script += "\n"
        try:
            with socket.create_connection(
                (self.host, self.opts["urscript_port"]), timeout=self.opts["connect_timeout_s"]
            ) as s:
                s.sendall(script.encode("ascii"))
                s.shutdown(socket.SHUT_WR)
        except OSError as exc:
            raise DeviceGoneError(f"{self!r}: URScript port {self.opts['urscript_port']}: {exc}") from exc

    def _move_internal(self, q_rad, base_T_flange, speed, wait, deadline: float) -> None:
        o = self.opts
        if q_rad is not None:
            args = ", ".join(f"{x:.9f}" for x in q_rad)
            script = (
                f"movej([{args}], a={speed * o['max_joint_accel_rad_s2']:.6g}, "
                f"v={speed * o['max_joint_speed_rad_s']:.6g})"
            )
        else:
            pose = transform_to_pose(base_T_flange @ self.flange_T_tcp)
            args = ", ".join(f"{x:.9f}" for x in pose)
            script = (
                f"movel(p[{args}], a={speed * o['max_tcp_accel_m_s2']:.6g}, "
                f"v={speed * o['max_tcp_speed_m_s']:.6g})"
            )
        before = self.read_state()
        if before.mode == RobotMode.PROTECTIVE_STOP:
            raise ProtectiveStop(f"{self!r}: robot is in a protective stop; not moving")
        self._check_motion_allowed()
        self.send_script(script)
        if wait:
            self._wait_move(q_rad, base_T_flange, before.seq, deadline)

    def _wait_move(self, q_target, pose_target, seq0, deadline: float) -> None:
        """Wait until the program has run and the robot is at the target."""
        seq = seq0
        saw_playing = False
        while True:
            remaining = remaining_s(deadline)
            if remaining <= 0:
                raise DriverTimeoutError(f"{self!r}: move did not finish in time")
            s = self.wait_for_sample_after(seq, min(remaining, max(self.timeout_s, 0.1)))
            seq = s.seq
            if s.mode == RobotMode.PROTECTIVE_STOP:
                raise ProtectiveStop(f"{self!r}: protective stop during the move")
            if s.mode in (RobotMode.EMERGENCY_STOP, RobotMode.FAULT):
                raise DeviceError(f"{self!r}: robot {s.mode.name} during the move", s.mode.name)
            runtime = self.runtime_state()
            if runtime == UrRuntimeState.PLAYING:
                saw_playing = True
                continue
            if q_target is not None:
                at = float(np.max(np.abs(s.q_rad - q_target))) < 2e-3
            else:
                d = se3_inverse(pose_target) @ s.base_T_flange
                at = float(np.linalg.norm(d[:3, 3])) < 2e-3 and float(
                    np.linalg.norm(so3_log(d[:3, :3]))
                ) < 2e-3
            if at and (saw_playing or not s.moving):
                return

    def _stop_internal(self) -> None:
        self.send_script(f"stopj({self.opts['max_joint_accel_rad_s2']:.6g})")
