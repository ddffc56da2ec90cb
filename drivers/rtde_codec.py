"""Universal Robots RTDE wire codec: bytes <-> messages, no I/O.

One codec for both ends: :mod:`cellcal.drivers.ur_rtde` (client) and
:mod:`cellcal.sim.rtde_server` (simulated controller) encode and decode with these
functions, so a round trip through both is a test of the codec against itself *and* the
ur-rtde peer test checks it against an independent implementation.

Wire format (see ``docs/protocols/robot.md``)
---------------------------------------------
Every packet is ``uint16 size, uint8 type, payload`` big-endian, where ``size`` counts the
3 header bytes too. Types are ASCII letters (:class:`PacketType`). Payloads:

======  ============================  ====================================================
type    client -> controller           controller -> client
======  ============================  ====================================================
``V``   ``uint16 protocol_version``    ``uint8 accepted``
``v``   (empty)                        ``uint32 major, minor, bugfix, build``
``O``   v2: ``double frequency_hz``    v2: ``uint8 recipe_id`` + types;  v1: types
        + names; v1: names             (comma-separated; ``NOT_FOUND`` for unknown names)
``I``   names                          ``uint8 recipe_id`` + types
``S``   (empty)                        ``uint8 accepted``
``P``   (empty)                        ``uint8 accepted``
``U``   ``uint8 recipe_id`` + fields   v2: ``uint8 recipe_id`` + fields; v1: fields
``M``   v2: ``uint8 len, message, uint8 len, source, uint8 level``;
        v1: ``uint8 level, message`` (rest of the packet)
======  ============================  ====================================================

Decoding errors raise :class:`~cellcal.drivers.errors.ProtocolError` for that packet only;
the caller decides whether to skip it (a malformed data package) or drop the stream. Two
framers: :class:`PacketReader` trusts every header (the handshake, the simulator's side) and
raises on a header whose size is below 3; :class:`StreamReader` frames a started output
stream, recognises lost framing (a header no honest controller sends) and hunts for the next
intact data package, so garbage costs the packets it hit and never the stream after it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

from cellcal.drivers.errors import ProtocolError

__all__ = [
    "PacketType",
    "FieldType",
    "TextLevel",
    "ControllerVersion",
    "TextMessage",
    "Recipe",
    "PacketReader",
    "StreamReader",
    "MAX_SKIP_BYTES",
    "OUTPUT_FIELDS",
    "NOT_FOUND",
    "IN_USE",
    "HEADER",
    "MAX_PACKET_SIZE",
    "PROTOCOL_V1",
    "PROTOCOL_V2",
    "encode_packet",
    "parse_names",
    "encode_protocol_version_request",
    "decode_protocol_version_request",
    "encode_accepted",
    "decode_accepted",
    "encode_controller_version",
    "decode_controller_version",
    "encode_setup_outputs_request",
    "decode_setup_outputs_request",
    "encode_setup_reply",
    "decode_setup_reply",
    "encode_setup_inputs_request",
    "decode_setup_inputs_request",
    "encode_text_message",
    "decode_text_message",
]

HEADER = struct.Struct(">HB")
#: The size field is a uint16 and includes the 3 header bytes.
MAX_PACKET_SIZE = 0xFFFF
PROTOCOL_V1 = 1
PROTOCOL_V2 = 2
#: Answer in a setup reply's type list for a name the controller does not know.
NOT_FOUND = "NOT_FOUND"
#: Answer in an input setup reply for a register another client already writes.
IN_USE = "IN_USE"


class PacketType(IntEnum):
    """RTDE packet types (the ASCII letter of each)."""

    REQUEST_PROTOCOL_VERSION = ord("V")  # 86
    GET_URCONTROL_VERSION = ord("v")  # 118
    TEXT_MESSAGE = ord("M")  # 77
    DATA_PACKAGE = ord("U")  # 85
    CONTROL_PACKAGE_SETUP_OUTPUTS = ord("O")  # 79
    CONTROL_PACKAGE_SETUP_INPUTS = ord("I")  # 73
    CONTROL_PACKAGE_START = ord("S")  # 83
    CONTROL_PACKAGE_PAUSE = ord("P")  # 80


class FieldType(Enum):
    """RTDE field types with their struct format (big-endian, no padding)."""

    BOOL = "?"
    UINT8 = "B"
    UINT32 = "I"
    UINT64 = "Q"
    INT32 = "i"
    DOUBLE = "d"
    VECTOR3D = "3d"
    VECTOR6D = "6d"
    VECTOR6INT32 = "6i"
    VECTOR6UINT32 = "6I"

    @property
    def count(self) -> int:
        """Number of scalars the field holds (1 for scalars)."""
        return int(self.value[0]) if self.value[0].isdigit() else 1

    @property
    def is_float(self) -> bool:
        return self.value.endswith("d")


class TextLevel(IntEnum):
    """Severity of a text message."""

    EXCEPTION = 0
    ERROR = 1
    WARNING = 2
    INFO = 3


def _standard_outputs() -> dict[str, FieldType]:
    F = FieldType
    table = {
        "timestamp": F.DOUBLE,
        "target_q": F.VECTOR6D,
        "target_qd": F.VECTOR6D,
        "target_qdd": F.VECTOR6D,
        "target_current": F.VECTOR6D,
        "target_moment": F.VECTOR6D,
        "actual_q": F.VECTOR6D,
        "actual_qd": F.VECTOR6D,
        "actual_qdd": F.VECTOR6D,
        "actual_current": F.VECTOR6D,
        "actual_current_window": F.VECTOR6D,
        "joint_control_output": F.VECTOR6D,
        "actual_TCP_pose": F.VECTOR6D,
        "actual_TCP_speed": F.VECTOR6D,
        "actual_TCP_force": F.VECTOR6D,
        "target_TCP_pose": F.VECTOR6D,
        "target_TCP_speed": F.VECTOR6D,
        "actual_digital_input_bits": F.UINT64,
        "joint_temperatures": F.VECTOR6D,
        "actual_execution_time": F.DOUBLE,
        "robot_mode": F.INT32,
        "joint_mode": F.VECTOR6INT32,
        "safety_mode": F.INT32,
        "safety_status": F.INT32,
        "actual_tool_accelerometer": F.VECTOR3D,
        "speed_scaling": F.DOUBLE,
        "target_speed_fraction": F.DOUBLE,
        "actual_momentum": F.DOUBLE,
        "actual_main_voltage": F.DOUBLE,
        "actual_robot_voltage": F.DOUBLE,
        "actual_robot_current": F.DOUBLE,
        "actual_joint_voltage": F.VECTOR6D,
        "actual_digital_output_bits": F.UINT64,
        "runtime_state": F.UINT32,
        "elbow_position": F.VECTOR3D,
        "elbow_velocity": F.VECTOR3D,
        "robot_status_bits": F.UINT32,
        "safety_status_bits": F.UINT32,
        "analog_io_types": F.UINT32,
        "standard_analog_input0": F.DOUBLE,
        "standard_analog_input1": F.DOUBLE,
        "standard_analog_output0": F.DOUBLE,
        "standard_analog_output1": F.DOUBLE,
        "io_current": F.DOUBLE,
        "euromap67_input_bits": F.UINT32,
        "euromap67_output_bits": F.UINT32,
        "euromap67_24V_voltage": F.DOUBLE,
        "euromap67_24V_current": F.DOUBLE,
        "tool_mode": F.UINT32,
        "tool_analog_input_types": F.UINT32,
        "tool_analog_input0": F.DOUBLE,
        "tool_analog_input1": F.DOUBLE,
        "tool_output_voltage": F.INT32,
        "tool_output_current": F.DOUBLE,
        "tool_temperature": F.DOUBLE,
        "tcp_force_scalar": F.DOUBLE,
        "output_bit_registers0_to_31": F.UINT32,
        "output_bit_registers32_to_63": F.UINT32,
        "input_bit_registers0_to_31": F.UINT32,
        "input_bit_registers32_to_63": F.UINT32,
        "actual_current_as_torque": F.VECTOR6D,
        "ft_raw_wrench": F.VECTOR6D,
        "tcp_offset": F.VECTOR6D,
        "payload": F.DOUBLE,
        "payload_cog": F.VECTOR3D,
        "payload_inertia": F.VECTOR6D,
        "script_control_line": F.UINT32,
        "joint_position_deviation_ratio": F.VECTOR6D,
        "collision_detection_ratio": F.DOUBLE,
        "time_scale_source": F.UINT32,
        "tool_output_mode": F.UINT8,
        "tool_digital_output0_mode": F.UINT8,
        "tool_digital_output1_mode": F.UINT8,
    }
    for i in range(64, 128):
        table[f"output_bit_register_{i}"] = F.BOOL
        table[f"input_bit_register_{i}"] = F.BOOL
    for i in range(48):
        table[f"output_int_register_{i}"] = F.INT32
        table[f"output_double_register_{i}"] = F.DOUBLE
        table[f"input_int_register_{i}"] = F.INT32
        table[f"input_double_register_{i}"] = F.DOUBLE
    return table


#: Controller output fields by name (UR RTDE guide, e-series 5.x), with their types.
OUTPUT_FIELDS: Mapping[str, FieldType] = _standard_outputs()


@dataclass(frozen=True)
class ControllerVersion:
    """URControl version reported by the ``v`` reply."""

    major: int
    minor: int
    bugfix: int
    build: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.bugfix}.{self.build}"


@dataclass(frozen=True)
class TextMessage:
    """A text message (``M``): log text from either side, never data."""

    message: str
    source: str = ""
    level: TextLevel = TextLevel.INFO


# -- framing ----------------------------------------------------------------------------
def encode_packet(ptype: PacketType | int, payload: bytes = b"") -> bytes:
    """One packet: header (size including itself, type) followed by ``payload``."""
    size = HEADER.size + len(payload)
    if size > MAX_PACKET_SIZE:
        raise ValueError(f"RTDE payload of {len(payload)} bytes exceeds the uint16 size field")
    return HEADER.pack(size, int(ptype)) + payload


class PacketReader:
    """Stream framer: feed received bytes, iterate complete ``(type, payload)`` packets.

    The type is returned as a plain ``int`` because unknown types are legal on the wire
    (the caller skips them by their size). A header announcing fewer than 3 bytes cannot
    be framed past: :meth:`packets` raises :class:`ProtocolError` and the buffer is
    cleared, so the caller must drop the connection.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes buffered that do not yet form a complete packet."""
        return len(self._buf)

    def take(self) -> bytes:
        """The buffered bytes, removed from the reader (to hand them to another framer)."""
        data = bytes(self._buf)
        self._buf.clear()
        return data

    def packets(self) -> Iterator[tuple[int, bytes]]:
        """Yield every complete packet in the buffer, in order."""
        while len(self._buf) >= HEADER.size:
            size, ptype = HEADER.unpack_from(self._buf)
            if size < HEADER.size:
                self._buf.clear()
                raise ProtocolError(f"RTDE header announces {size} bytes (< 3): stream lost")
            if len(self._buf) < size:
                return
            payload = bytes(self._buf[HEADER.size : size])
            del self._buf[:size]
            yield ptype, payload


#: Largest packet other than a data package that :class:`StreamReader` frames by its size
#: while in sync (text messages, replies, unknown types): anything bigger is taken as lost
#: framing, so one garbage header can swallow at most this many bytes of good stream.
MAX_SKIP_BYTES = 4096


class StreamReader:
    """Framer for a started output stream that finds its way back after garbage (no I/O).

    :class:`PacketReader` trusts every header, which is right during the handshake but not
    on a stream that garbage can hit: one bad header announcing 60 kB would swallow the next
    few seconds of data, and the packet boundaries after it are chance. This reader knows
    the one data package the stream carries (its exact size, type ``U`` and, in v2, its
    recipe id byte) and keeps two states:

    *in sync*
        A header is trusted if it is plausible: a data package of exactly the recipe's size,
        or any other type of at most :data:`MAX_SKIP_BYTES`. Anything else (a size below 3,
        a data package of another size, a longer packet) means the framing is lost: the
        packet is counted in :attr:`bad_headers` and the reader starts hunting from the byte
        after the bad header's first byte.
    *hunting*
        Bytes are discarded (counted in :attr:`garbage_bytes`) up to the next position that
        starts with the data package's exact header (and recipe id) and whose payload
        ``validate`` accepts; that package is yielded and the reader is in sync again
        (:attr:`resyncs` counts these). The pattern is 3 (v1) or 4 (v2) bytes plus a payload
        that must decode, so garbage passes for a data package with probability ~2^-32 per
        position.

    So the first intact data package after garbage is found at once, and at most
    :data:`MAX_SKIP_BYTES` of good stream are lost to a garbage header that looked like a
    short packet. Memory is bounded by ``max(MAX_SKIP_BYTES, data package size)`` plus the
    bytes of one :meth:`feed`.

    Parameters
    ----------
    data_size : int
        Size of one data package on the wire, header included (``3 + payload_size``).
    recipe_id : int or None
        The recipe id byte that starts every v2 data payload; ``None`` for v1.
    validate : callable(payload) -> bool, optional
        Whether a candidate payload is a real data package (the caller decodes it and
        checks its values); used only while hunting. Default: accept.
    """

    def __init__(
        self,
        data_size: int,
        recipe_id: int | None = None,
        validate: Any = None,
        *,
        max_skip: int = MAX_SKIP_BYTES,
    ) -> None:
        if not HEADER.size < data_size <= MAX_PACKET_SIZE:
            raise ValueError(f"data_size must be in ({HEADER.size}, {MAX_PACKET_SIZE}], got {data_size}")
        self.data_size = int(data_size)
        self._pattern = HEADER.pack(self.data_size, PacketType.DATA_PACKAGE)
        if recipe_id is not None:
            self._pattern += _U8.pack(recipe_id)
        self._validate = validate if validate is not None else (lambda payload: True)
        self.max_skip = int(max_skip)
        self._buf = bytearray()
        self.in_sync = True
        self.bad_headers = 0
        self.garbage_bytes = 0
        self.resyncs = 0

    def feed(self, data: bytes) -> None:
        """Append received bytes."""
        self._buf += data

    @property
    def pending(self) -> int:
        """Bytes buffered that are not yet a packet (or discarded)."""
        return len(self._buf)

    def _lose_sync(self) -> None:
        self.bad_headers += 1
        self.in_sync = False
        del self._buf[:1]
        self.garbage_bytes += 1

    def packets(self) -> Iterator[tuple[int, bytes]]:
        """Yield every complete packet in the buffer, in order; never raises."""
        buf = self._buf
        while True:
            if not self.in_sync:
                i = buf.find(self._pattern)
                if i < 0:
                    keep = len(self._pattern) - 1  # a pattern may straddle two feeds
                    drop = max(0, len(buf) - keep)
                    self.garbage_bytes += drop
                    del buf[:drop]
                    return
                self.garbage_bytes += i
                del buf[:i]
                if len(buf) < self.data_size:
                    return
                payload = bytes(buf[HEADER.size : self.data_size])
                if not self._validate(payload):
                    del buf[:1]
                    self.garbage_bytes += 1
                    continue
                del buf[: self.data_size]
                self.in_sync = True
                self.resyncs += 1
                yield PacketType.DATA_PACKAGE, payload
                continue
            if len(buf) < HEADER.size:
                return
            size, ptype = HEADER.unpack_from(buf)
            if size < HEADER.size or (ptype == PacketType.DATA_PACKAGE and size != self.data_size) or (
                ptype != PacketType.DATA_PACKAGE and size > self.max_skip
            ):
                self._lose_sync()
                continue
            if len(buf) < size:
                return
            payload = bytes(buf[HEADER.size : size])
            del buf[:size]
            yield ptype, payload


# -- small message bodies -----------------------------------------------------------------
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_F64 = struct.Struct(">d")
_VERSION = struct.Struct(">IIII")


def _need(payload: bytes, n: int, what: str) -> None:
    if len(payload) < n:
        raise ProtocolError(f"RTDE {what}: {len(payload)} bytes, need {n}")


def parse_names(text: str) -> list[str]:
    """Comma-separated names, whitespace stripped, empty entries (a trailing comma) dropped."""
    return [n.strip() for n in text.split(",") if n.strip()]


def _text(payload: bytes, what: str) -> str:
    try:
        return payload.decode("ascii")
    except UnicodeDecodeError:
        raise ProtocolError(f"RTDE {what}: text is not ASCII") from None


def encode_protocol_version_request(version: int) -> bytes:
    return encode_packet(PacketType.REQUEST_PROTOCOL_VERSION, _U16.pack(version))


def decode_protocol_version_request(payload: bytes) -> int:
    _need(payload, 2, "protocol version request")
    return _U16.unpack_from(payload)[0]


def encode_accepted(ptype: PacketType, accepted: bool) -> bytes:
    """Reply to ``V``, ``S`` or ``P``: one byte, 1 if accepted."""
    return encode_packet(ptype, _U8.pack(1 if accepted else 0))


def decode_accepted(payload: bytes, what: str = "reply") -> bool:
    _need(payload, 1, what)
    return payload[0] != 0


def encode_controller_version(v: ControllerVersion) -> bytes:
    return encode_packet(
        PacketType.GET_URCONTROL_VERSION, _VERSION.pack(v.major, v.minor, v.bugfix, v.build)
    )


def decode_controller_version(payload: bytes) -> ControllerVersion:
    _need(payload, _VERSION.size, "controller version")
    return ControllerVersion(*_VERSION.unpack_from(payload))


def encode_setup_outputs_request(
    names: Sequence[str], frequency_hz: float, protocol: int = PROTOCOL_V2
) -> bytes:
    body = ",".join(names).encode("ascii")
    if protocol >= PROTOCOL_V2:
        body = _F64.pack(float(frequency_hz)) + body
    return encode_packet(PacketType.CONTROL_PACKAGE_SETUP_OUTPUTS, body)


def decode_setup_outputs_request(payload: bytes, protocol: int = PROTOCOL_V2) -> tuple[float, list[str]]:
    """``(frequency_hz, names)``; v1 has no frequency (returned as 0.0: controller default)."""
    freq = 0.0
    if protocol >= PROTOCOL_V2:
        _need(payload, _F64.size, "setup outputs request")
        freq = _F64.unpack_from(payload)[0]
        payload = payload[_F64.size :]
        if not math.isfinite(freq) or freq < 0:
            raise ProtocolError(f"RTDE setup outputs request: bad frequency {freq!r}")
    return freq, parse_names(_text(payload, "setup outputs request"))


def encode_setup_inputs_request(names: Sequence[str]) -> bytes:
    return encode_packet(PacketType.CONTROL_PACKAGE_SETUP_INPUTS, ",".join(names).encode("ascii"))


def decode_setup_inputs_request(payload: bytes) -> list[str]:
    return parse_names(_text(payload, "setup inputs request"))


def encode_setup_reply(
    ptype: PacketType, recipe_id: int, types: Sequence[str], protocol: int = PROTOCOL_V2
) -> bytes:
    """Reply to ``O`` or ``I``: recipe id (v2, and always for ``I``) and the type names."""
    body = ",".join(types).encode("ascii")
    if protocol >= PROTOCOL_V2 or ptype == PacketType.CONTROL_PACKAGE_SETUP_INPUTS:
        body = _U8.pack(recipe_id) + body
    return encode_packet(ptype, body)


def decode_setup_reply(
    payload: bytes, ptype: PacketType, protocol: int = PROTOCOL_V2
) -> tuple[int, list[str]]:
    """``(recipe_id, type_names)``; v1 output replies carry no id (returned as 0)."""
    recipe_id = 0
    if protocol >= PROTOCOL_V2 or ptype == PacketType.CONTROL_PACKAGE_SETUP_INPUTS:
        _need(payload, 1, "setup reply")
        recipe_id = payload[0]
        payload = payload[1:]
    return recipe_id, [t.strip() for t in _text(payload, "setup reply").split(",")]


def encode_text_message(msg: TextMessage, protocol: int = PROTOCOL_V2) -> bytes:
    text = msg.message.encode("ascii", "replace")
    if protocol >= PROTOCOL_V2:
        src = msg.source.encode("ascii", "replace")[:255]
        text = text[:255]
        body = _U8.pack(len(text)) + text + _U8.pack(len(src)) + src + _U8.pack(int(msg.level))
    else:
        body = _U8.pack(int(msg.level)) + text
    return encode_packet(PacketType.TEXT_MESSAGE, body)


def decode_text_message(payload: bytes, protocol: int = PROTOCOL_V2) -> TextMessage:
    def level(b: int) -> TextLevel:
        try:
            return TextLevel(b)
        except ValueError:
            raise ProtocolError(f"RTDE text message: unknown level {b}") from None

    if protocol < PROTOCOL_V2:
        _need(payload, 1, "text message")
        return TextMessage(payload[1:].decode("ascii", "replace"), "", level(payload[0]))
    _need(payload, 1, "text message")
    n = payload[0]
    _need(payload, 1 + n + 1, "text message")
    message = payload[1 : 1 + n].decode("ascii", "replace")
    m = payload[1 + n]
    _need(payload, 2 + n + m + 1, "text message")
    source = payload[2 + n : 2 + n + m].decode("ascii", "replace")
    return TextMessage(message, source, level(payload[2 + n + m]))


# -- recipes and data packages ------------------------------------------------------------
class Recipe:
    """An agreed output (or input) recipe: names, types and the data package layout.

    Parameters
    ----------
    names : sequence of str
        Field names, in order.
    types : sequence of FieldType or str
        Their types (type names as the setup reply spells them are accepted).
    recipe_id : int
        The id the controller assigned (v2; 0 in v1).
    protocol : int
        1 or 2. In v2 every data package starts with the recipe id byte.
    """

    def __init__(
        self,
        names: Sequence[str],
        types: Sequence[FieldType | str],
        recipe_id: int = 1,
        protocol: int = PROTOCOL_V2,
    ) -> None:
        if len(names) != len(types):
            raise ValueError(f"recipe: {len(names)} names but {len(types)} types")
        ftypes = []
        for name, t in zip(names, types, strict=True):
            try:
                ftypes.append(t if isinstance(t, FieldType) else FieldType[t])
            except KeyError:
                raise ProtocolError(f"RTDE recipe: field {name!r} has unknown type {t!r}") from None
        self.names: tuple[str, ...] = tuple(names)
        self.types: tuple[FieldType, ...] = tuple(ftypes)
        self.recipe_id = int(recipe_id)
        self.protocol = int(protocol)
        self._with_id = self.protocol >= PROTOCOL_V2
        fmt = ">" + ("B" if self._with_id else "") + "".join(t.value for t in self.types)
        self._struct = struct.Struct(fmt)
        # (name, start, stop or None for a scalar) into the unpacked tuple, computed once:
        # decode runs for every data package (500 Hz), enum property lookups per field do not belong there
        layout: list[tuple[str, int, int | None]] = []
        i = 1 if self._with_id else 0
        for name, t in zip(self.names, self.types, strict=True):
            layout.append((name, i, None if t.count == 1 else i + t.count))
            i += t.count
        self._layout = tuple(layout)

    @property
    def payload_size(self) -> int:
        """Bytes of a data package payload for this recipe."""
        return self._struct.size

    def encode(self, values: Mapping[str, Any]) -> bytes:
        """A complete ``U`` packet from ``values`` (a missing name encodes as zero)."""
        flat: list[Any] = [self.recipe_id] if self._with_id else []
        for name, t in zip(self.names, self.types, strict=True):
            v = values.get(name)
            if v is None:
                flat.extend([0.0 if t.is_float else 0] * t.count)
            elif t.count == 1:
                flat.append(bool(v) if t is FieldType.BOOL else (float(v) if t.is_float else int(v)))
            else:
                seq = [float(x) if t.is_float else int(x) for x in v]
                if len(seq) != t.count:
                    raise ValueError(f"recipe field {name!r}: expected {t.count} values")
                flat.extend(seq)
        return encode_packet(PacketType.DATA_PACKAGE, self._struct.pack(*flat))

    def decode(self, payload: bytes) -> dict[str, Any]:
        """Field values of a ``U`` payload; vectors as tuples.

        Raises
        ------
        ProtocolError
            If the size or the recipe id does not match this recipe.
        """
        if len(payload) != self._struct.size:
            raise ProtocolError(
                f"RTDE data package: {len(payload)} bytes, recipe {self.recipe_id} has "
                f"{self._struct.size}"
            )
        flat = self._struct.unpack(payload)
        if self._with_id and flat[0] != self.recipe_id:
            raise ProtocolError(f"RTDE data package for recipe {flat[0]}, expected {self.recipe_id}")
        return {name: flat[start] if stop is None else flat[start:stop] for name, start, stop in self._layout}

