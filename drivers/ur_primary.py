"""Universal Robots primary interface (port 30001): codec and a small client.

What a calibration client needs from it is the controller's *factory calibration*: the DH
table the controller itself computes ``actual_TCP_pose`` with, in the ``KinematicsInfo``
sub-package of its robot-state messages. The layout (``docs/protocols/robot.md``), checked
against public client code (the UR ROS driver's primary-interface parsers and the UR client
library's test server):

* Every message: ``int32 size`` (bytes, header included), ``uint8 type``, body; big-endian.
* ``type 20`` robot message: ``uint64 timestamp, uint8 source, uint8 robot_message_type``,
  then its payload. ``robot_message_type 3`` is the version message, sent first on every
  connection: ``int8 n, n chars project name, uint8 major, uint8 minor, int32 bugfix,
  int32 build, the build date (the rest)``. ``0`` is a text message (the rest is text).
* ``type 16`` robot state (10 Hz): a sequence of sub-packages ``uint32 size`` (header
  included), ``uint8 type``, body. ``0`` robot mode data: ``uint64 timestamp, 7 x bool
  (real robot connected, enabled, power on, emergency stopped, protective stopped, program
  running, program paused), int8 robot mode, uint8 control mode, 3 x double (target speed
  fraction, speed scaling, target speed fraction limit)``. ``5`` kinematics info:
  ``6 x uint32 checksums, 6 x double theta, 6 x double a, 6 x double d, 6 x double alpha,
  uint32 calibration status``. Other sub-packages are kept as raw bytes.

The codec is pure (bytes in, records out; :class:`PrimaryReader`). A message whose header
no controller sends (a size below 5 or above :data:`MAX_MESSAGE_BYTES`) means the framing is
lost: :class:`~cellcal.drivers.errors.ProtocolError`, and the connection is dropped (the
primary interface is a byte stream with no resynchronisation marker). A sub-package that
does not fit its message, or a known one of the wrong size, is a ``ProtocolError`` for that
message only; decoding goes on with the next message.

:func:`read_controller_info` connects, reads the version message and the first
``KinematicsInfo``, and closes: the driver calls it when it opens
(:class:`~cellcal.drivers.ur_rtde.UrRtdeDriver`).
"""

from __future__ import annotations

import binascii
import socket
import struct
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from cellcal.drivers.errors import DeviceGoneError, DriverTimeoutError, ProtocolError
from cellcal.drivers.kinematics import DHModel, dh_model_from_ur_table, kinematics_digest

__all__ = [
    "DEFAULT_PRIMARY_PORT",
    "MAX_MESSAGE_BYTES",
    "MessageType",
    "StatePackage",
    "RobotMessageType",
    "VersionMessage",
    "TextMessage",
    "RobotModeData",
    "KinematicsInfo",
    "RawPackage",
    "RobotStateMessage",
    "PrimaryReader",
    "encode_version_message",
    "encode_text_message",
    "encode_robot_state",
    "encode_robot_mode_data",
    "encode_kinematics_info",
    "decode_message",
    "joint_checksums",
    "ControllerInfo",
    "read_controller_info",
]

DEFAULT_PRIMARY_PORT = 30001
#: Largest message accepted (real robot-state messages are a few kB).
MAX_MESSAGE_BYTES = 1 << 16


class MessageType:
    """Message types of the primary interface."""

    ROBOT_STATE = 16
    ROBOT_MESSAGE = 20
    PROGRAM_STATE_MESSAGE = 25


class StatePackage:
    """Sub-package types of a robot-state message."""

    ROBOT_MODE_DATA = 0
    JOINT_DATA = 1
    TOOL_DATA = 2
    MASTERBOARD_DATA = 3
    CARTESIAN_INFO = 4
    KINEMATICS_INFO = 5
    CONFIGURATION_DATA = 6


class RobotMessageType:
    """Robot message subtypes."""

    TEXT = 0
    VERSION = 3


_HEADER = struct.Struct(">iB")
_SUB_HEADER = struct.Struct(">IB")
_ROBOT_MSG = struct.Struct(">QBB")
_VERSION_TAIL = struct.Struct(">BBii")
_MODE = struct.Struct(">Q7?bB3d")
_KIN = struct.Struct(">6I24dI")


@dataclass(frozen=True)
class VersionMessage:
    """The version message a controller sends first on every connection."""

    project_name: str
    major: int
    minor: int
    bugfix: int
    build: int
    build_date: str = ""
    timestamp: int = 0
    source: int = 0

    @property
    def version(self) -> tuple[int, int, int, int]:
        return (self.major, self.minor, self.bugfix, self.build)


@dataclass(frozen=True)
class TextMessage:
    """A text robot message (the controller's log line)."""

    text: str
    timestamp: int = 0
    source: int = 0


@dataclass(frozen=True)
class RobotModeData:
    """Sub-package 0 of a robot-state message."""

    timestamp: int
    is_real_robot_connected: bool
    is_real_robot_enabled: bool
    is_robot_power_on: bool
    is_emergency_stopped: bool
    is_protective_stopped: bool
    is_program_running: bool
    is_program_paused: bool
    robot_mode: int
    control_mode: int
    target_speed_fraction: float
    speed_scaling: float
    target_speed_fraction_limit: float


@dataclass(frozen=True)
class KinematicsInfo:
    """Sub-package 5: the controller's DH table (its factory calibration).

    Attributes
    ----------
    checksums : tuple of 6 int
        Per-joint checksums of the calibration stored in the joint.
    theta_rad, a_m, d_m, alpha_rad : tuple of 6 float
        Joint zero offsets, link lengths, link offsets, twists (UR's order and units).
    calibration_status : int
    """

    checksums: tuple[int, ...]
    theta_rad: tuple[float, ...]
    a_m: tuple[float, ...]
    d_m: tuple[float, ...]
    alpha_rad: tuple[float, ...]
    calibration_status: int = 0

    def model(self, name: str = "ur-factory") -> DHModel:
        """The table as a :class:`~cellcal.drivers.kinematics.DHModel`.

        Raises
        ------
        ValueError
            Values that are not finite.
        """
        return dh_model_from_ur_table(self.theta_rad, self.a_m, self.d_m, self.alpha_rad, name)

    @property
    def digest(self) -> str:
        """:func:`~cellcal.drivers.kinematics.kinematics_digest` of the table."""
        return kinematics_digest(self.model())


@dataclass(frozen=True)
class RawPackage:
    """A sub-package (or message) this codec does not interpret: its type and body bytes."""

    type: int
    body: bytes


@dataclass(frozen=True)
class RobotStateMessage:
    """A robot-state message: its sub-packages in order."""

    packages: tuple[Any, ...] = field(default_factory=tuple)

    def find(self, cls: type) -> Any:
        """The first sub-package of type ``cls``, or None."""
        return next((p for p in self.packages if isinstance(p, cls)), None)


# -- encoding ----------------------------------------------------------------------------------
def _message(mtype: int, body: bytes) -> bytes:
    return _HEADER.pack(_HEADER.size + len(body), mtype) + body


def _sub(ptype: int, body: bytes) -> bytes:
    return _SUB_HEADER.pack(_SUB_HEADER.size + len(body), ptype) + body


def _ascii(text: str, what: str) -> bytes:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(f"{what}: not latin-1 text: {text!r}") from None


def encode_version_message(v: VersionMessage) -> bytes:
    """The version message (robot message, subtype 3)."""
    name = _ascii(v.project_name, "project name")
    if len(name) > 127:
        raise ValueError("project name: at most 127 bytes")
    body = (_ROBOT_MSG.pack(v.timestamp, v.source, RobotMessageType.VERSION) + struct.pack(">b", len(name)) + name
            + _VERSION_TAIL.pack(v.major, v.minor, v.bugfix, v.build) + _ascii(v.build_date, "build date"))
    return _message(MessageType.ROBOT_MESSAGE, body)


def encode_text_message(m: TextMessage) -> bytes:
    """A text robot message (subtype 0)."""
    return _message(MessageType.ROBOT_MESSAGE,
                    _ROBOT_MSG.pack(m.timestamp, m.source, RobotMessageType.TEXT) + _ascii(m.text, "text"))


def encode_robot_mode_data(m: RobotModeData) -> bytes:
    """Sub-package 0 (to pass to :func:`encode_robot_state`)."""
    return _sub(StatePackage.ROBOT_MODE_DATA, _MODE.pack(
        m.timestamp, m.is_real_robot_connected, m.is_real_robot_enabled, m.is_robot_power_on,
        m.is_emergency_stopped, m.is_protective_stopped, m.is_program_running, m.is_program_paused,
        m.robot_mode, m.control_mode, m.target_speed_fraction, m.speed_scaling, m.target_speed_fraction_limit))


def encode_kinematics_info(k: KinematicsInfo) -> bytes:
    """Sub-package 5 (to pass to :func:`encode_robot_state`)."""
    for key in ("checksums", "theta_rad", "a_m", "d_m", "alpha_rad"):
        if len(getattr(k, key)) != 6:
            raise ValueError(f"kinematics info {key}: expected 6 values")
    return _sub(StatePackage.KINEMATICS_INFO, _KIN.pack(
        *k.checksums, *k.theta_rad, *k.a_m, *k.d_m, *k.alpha_rad, k.calibration_status))


def encode_robot_state(sub_packages: Sequence[bytes]) -> bytes:
    """A robot-state message of already encoded sub-packages (``encode_*`` above, or raw ones
    built as ``uint32 size, uint8 type, body``)."""
    return _message(MessageType.ROBOT_STATE, b"".join(sub_packages))


def joint_checksums(theta_rad: Sequence[float], a_m: Sequence[float], d_m: Sequence[float],
                    alpha_rad: Sequence[float]) -> tuple[int, ...]:
    """Per-joint CRC-32 of each joint's four DH values (big-endian doubles): what the
    simulator serves as ``KinematicsInfo.checksums`` (a real controller's come from the
    joints' own memory; clients only compare them)."""
    return tuple(binascii.crc32(struct.pack(">4d", theta_rad[i], a_m[i], d_m[i], alpha_rad[i])) for i in range(6))


# -- decoding --------------------------------------------------------------------------------
def _decode_sub(ptype: int, body: bytes) -> Any:
    if ptype == StatePackage.KINEMATICS_INFO:
        if len(body) != _KIN.size:
            raise ProtocolError(f"UR primary: kinematics info of {len(body)} bytes, expected {_KIN.size}")
        v = _KIN.unpack(body)
        return KinematicsInfo(tuple(v[0:6]), tuple(v[6:12]), tuple(v[12:18]), tuple(v[18:24]), tuple(v[24:30]), v[30])
    if ptype == StatePackage.ROBOT_MODE_DATA and len(body) == _MODE.size:
        # other controller versions append fields: those are kept raw
        return RobotModeData(*_MODE.unpack(body))
    return RawPackage(ptype, bytes(body))


def _decode_robot_message(body: bytes) -> Any:
    if len(body) < _ROBOT_MSG.size:
        raise ProtocolError(f"UR primary: robot message of {len(body)} bytes, shorter than its header")
    ts, source, subtype = _ROBOT_MSG.unpack_from(body)
    rest = body[_ROBOT_MSG.size:]
    if subtype == RobotMessageType.VERSION:
        if len(rest) < 1:
            raise ProtocolError("UR primary: version message without a project name length")
        n = struct.unpack_from(">b", rest)[0]
        if n < 0 or len(rest) < 1 + n + _VERSION_TAIL.size:
            raise ProtocolError(f"UR primary: version message of {len(rest)} bytes cannot hold a {n}-byte name")
        name = rest[1:1 + n].decode("latin-1")
        major, minor, bugfix, build = _VERSION_TAIL.unpack_from(rest, 1 + n)
        date = rest[1 + n + _VERSION_TAIL.size:].decode("latin-1")
        return VersionMessage(name, major, minor, bugfix, build, date, ts, source)
    if subtype == RobotMessageType.TEXT:
        return TextMessage(rest.decode("latin-1"), ts, source)
    return RawPackage(subtype, bytes(rest))


def decode_message(mtype: int, body: bytes) -> Any:
    """One message's record: :class:`RobotStateMessage`, :class:`VersionMessage`,
    :class:`TextMessage`, or :class:`RawPackage` for anything else.

    Raises
    ------
    ProtocolError
        A body that does not hold what its type says.
    """
    if mtype == MessageType.ROBOT_STATE:
        packages = []
        pos = 0
        while pos < len(body):
            if len(body) - pos < _SUB_HEADER.size:
                raise ProtocolError(f"UR primary: {len(body) - pos} stray bytes after the last sub-package")
            size, ptype = _SUB_HEADER.unpack_from(body, pos)
            if size < _SUB_HEADER.size or pos + size > len(body):
                raise ProtocolError(f"UR primary: sub-package type {ptype} of size {size} does not fit its message")
            packages.append(_decode_sub(ptype, body[pos + _SUB_HEADER.size:pos + size]))
            pos += size
        return RobotStateMessage(tuple(packages))
    if mtype == MessageType.ROBOT_MESSAGE:
        return _decode_robot_message(body)
    return RawPackage(mtype, bytes(body))


class PrimaryReader:
    """Messages out of a primary-interface byte stream (no I/O).

    ``feed(bytes)`` then iterate :meth:`messages`: each item is a record or, for a message
    that does not decode, the :class:`~cellcal.drivers.errors.ProtocolError` (decoding goes
    on). A header no controller sends raises ``ProtocolError`` from :meth:`messages`: the
    framing is lost for good (reconnect).
    """

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self._buf = bytearray()
        self.max_message_bytes = int(max_message_bytes)
        self.lost = False

    def feed(self, data: bytes) -> None:
        self._buf += data

    def messages(self) -> Iterator[Any]:
        while True:
            if self.lost:
                raise ProtocolError("UR primary: framing lost earlier on this stream")
            if len(self._buf) < _HEADER.size:
                return
            size, mtype = _HEADER.unpack_from(self._buf)
            if size < _HEADER.size or size > self.max_message_bytes:
                self.lost = True
                raise ProtocolError(f"UR primary: message header with size {size} (type {mtype}): framing lost")
            if len(self._buf) < size:
                return
            body = bytes(self._buf[_HEADER.size:size])
            del self._buf[:size]
            try:
                yield decode_message(mtype, body)
            except ProtocolError as exc:
                yield exc


# -- the client -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ControllerInfo:
    """What :func:`read_controller_info` learnt: the version message and the factory table."""

    version: VersionMessage
    kinematics: KinematicsInfo
    robot_mode: RobotModeData | None = None


def read_controller_info(host: str, port: int = DEFAULT_PRIMARY_PORT, timeout_s: float = 3.0) -> ControllerInfo:
    """Connect to the primary interface, read the version message and the first
    ``KinematicsInfo``, disconnect.

    Raises
    ------
    DeviceGoneError
        The connection could not be made or closed early.
    DriverTimeoutError
        No version message and kinematics info within ``timeout_s``.
    ProtocolError
        The stream's framing is lost.
    """
    deadline = time.monotonic() + float(timeout_s)
    try:
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    except OSError as exc:
        raise DeviceGoneError(f"UR primary interface {host}:{port}: {exc}") from exc
    version: VersionMessage | None = None
    mode: RobotModeData | None = None
    reader = PrimaryReader()
    with sock:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DriverTimeoutError(
                    f"UR primary interface {host}:{port}: no {'version message' if version is None else 'kinematics info'}"
                    f" within {timeout_s:.3g} s")
            sock.settimeout(remaining)
            try:
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                raise DeviceGoneError(f"UR primary interface {host}:{port}: {exc}") from exc
            if not data:
                raise DeviceGoneError(f"UR primary interface {host}:{port}: closed by the controller")
            reader.feed(data)
            for item in reader.messages():
                if isinstance(item, VersionMessage):
                    version = item
                elif isinstance(item, RobotStateMessage):
                    mode = item.find(RobotModeData) or mode
                    kin = item.find(KinematicsInfo)
                    if kin is not None and version is not None:
                        return ControllerInfo(version, kin, mode)
