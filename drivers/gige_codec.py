"""Pure codec of the GigE Vision control (GVCP) and stream (GVSP) packets we use.

Bytes in, typed records out; no sockets, clocks or threads, so it is fuzzed directly
(``tests/test_gige_codec.py``) and shared by the camera driver (:mod:`cellcal.drivers.gige`)
and the simulated device (:mod:`cellcal.sim.gige_device`). ``docs/protocols/gige.md`` is the
authority on what is implemented and what is refused; this is a reminder.

GVCP (UDP, device port 3956), every field big-endian::

    command: key 0x42 | flags u8 | command u16 | length u16 | req_id u16 | payload
    ack:     status u16          | answer u16  | length u16 | ack_id u16 | payload

``length`` counts the payload only. We decode READREG, WRITEREG, READMEM, WRITEMEM (commands
and acks), PENDING_ACK, and DISCOVERY commands (so the simulated device can refuse to
broadcast while still answering a unicast one).

GVSP (UDP, host port chosen by the host), standard ids::

    status u16 | block_id u16 | EI(1 bit) format(7 bits) packet_id u24 | data

and, with the extended-id bit (EI) set (GigE Vision 2.0)::

    status u16 | flags u16 | EI format u8 reserved u24 | block_id u64 | packet_id u32 | data

``format`` 1 is a leader, 2 a trailer, 3 a payload (data) packet. Only the *image* payload
type (0x0001) is decoded; any other leader decodes as :class:`GvspLeader` with its type, and
the driver drops the frame (counted), never guesses.

Every decode error is a :class:`GigeProtocolError` (a
:class:`~cellcal.drivers.errors.ProtocolError`): garbage never crashes and never yields a
record.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from cellcal.drivers.errors import ProtocolError

__all__ = [
    "GVCP_PORT",
    "GVCP_KEY",
    "FLAG_ACK_REQUIRED",
    "MAX_GVCP_PAYLOAD",
    "MAX_READMEM_BYTES",
    "MAX_REGS_PER_PACKET",
    "Command",
    "Status",
    "Reg",
    "CCP_EXCLUSIVE",
    "CCP_CONTROL",
    "TIMESTAMP_RESET",
    "TIMESTAMP_LATCH",
    "SCPS_FIRE_TEST",
    "SCPS_DO_NOT_FRAGMENT",
    "SCPS_BIG_ENDIAN",
    "SCPS_SIZE_MASK",
    "GigeProtocolError",
    "ReadRegCmd",
    "WriteRegCmd",
    "ReadMemCmd",
    "WriteMemCmd",
    "DiscoveryCmd",
    "ReadRegAck",
    "WriteRegAck",
    "ReadMemAck",
    "WriteMemAck",
    "PendingAck",
    "StatusAck",
    "encode_cmd",
    "decode_cmd",
    "encode_ack",
    "decode_ack",
    "GvspFormat",
    "PAYLOAD_TYPE_IMAGE",
    "PAYLOAD_TYPE_IMAGE_CHUNKS",
    "IMAGE_CHUNK_ID",
    "encode_chunks",
    "parse_chunks",
    "GVSP_HEADER_BYTES",
    "GVSP_EXT_HEADER_BYTES",
    "IP_UDP_OVERHEAD",
    "GvspLeader",
    "GvspPayload",
    "GvspTrailer",
    "encode_leader",
    "encode_payload",
    "encode_trailer",
    "decode_gvsp",
    "PIXEL_FORMATS",
    "pixel_format_name",
    "pixel_format_code",
    "bits_per_pixel",
    "decode_string",
]

#: The device's GVCP port (fixed by the standard).
GVCP_PORT = 3956
#: First byte of every GVCP command.
GVCP_KEY = 0x42
#: Command flag: the device must acknowledge.
FLAG_ACK_REQUIRED = 0x01
#: Largest GVCP payload we send or accept: a 576-byte datagram less IP (20), UDP (8) and
#: GVCP (8) headers.
MAX_GVCP_PAYLOAD = 540
#: Largest READMEM/WRITEMEM data block we use (a multiple of 4 under the payload limit,
#: with the 4-byte address in front).
MAX_READMEM_BYTES = 512
#: Most registers one READREG (4 bytes each) or WRITEREG (8 bytes each) may name.
MAX_REGS_PER_PACKET = MAX_GVCP_PAYLOAD // 8
#: GVCP header bytes (command and ack alike).
GVCP_HEADER_BYTES = 8


class Command(enum.IntEnum):
    """GVCP command and acknowledge codes."""

    DISCOVERY_CMD = 0x0002
    DISCOVERY_ACK = 0x0003
    PACKETRESEND_CMD = 0x0040
    READREG_CMD = 0x0080
    READREG_ACK = 0x0081
    WRITEREG_CMD = 0x0082
    WRITEREG_ACK = 0x0083
    READMEM_CMD = 0x0084
    READMEM_ACK = 0x0085
    WRITEMEM_CMD = 0x0086
    WRITEMEM_ACK = 0x0087
    PENDING_ACK = 0x0089


class Status(enum.IntEnum):
    """GVCP status codes (``0x8000`` set: an error)."""

    SUCCESS = 0x0000
    NOT_IMPLEMENTED = 0x8001
    INVALID_PARAMETER = 0x8002
    INVALID_ADDRESS = 0x8003
    WRITE_PROTECT = 0x8004
    BAD_ALIGNMENT = 0x8005
    ACCESS_DENIED = 0x8006
    BUSY = 0x8007
    MSG_TIMEOUT = 0x800B
    INVALID_HEADER = 0x800E
    WRONG_CONFIG = 0x800F
    ERROR = 0x8FFF

    @classmethod
    def name_of(cls, code: int) -> str:
        try:
            return cls(code).name
        except ValueError:
            return f"0x{code:04X}"


class Reg(enum.IntEnum):
    """Bootstrap registers (GigE Vision 2.x) the driver and the simulated device use."""

    VERSION = 0x0000
    DEVICE_MODE = 0x0004
    MAC_HIGH = 0x0008
    MAC_LOW = 0x000C
    CURRENT_IP = 0x0024
    CURRENT_SUBNET = 0x0034
    CURRENT_GATEWAY = 0x0044
    MANUFACTURER_NAME = 0x0048  # 32 bytes
    MODEL_NAME = 0x0068  # 32 bytes
    DEVICE_VERSION = 0x0088  # 32 bytes
    MANUFACTURER_INFO = 0x00A8  # 48 bytes
    SERIAL_NUMBER = 0x00D8  # 16 bytes
    USER_DEFINED_NAME = 0x00E8  # 16 bytes
    FIRST_URL = 0x0200  # 512 bytes
    SECOND_URL = 0x0400  # 512 bytes
    N_NETWORK_INTERFACES = 0x0600
    N_MESSAGE_CHANNELS = 0x0900
    N_STREAM_CHANNELS = 0x0904
    GVCP_CAPABILITY = 0x0934
    HEARTBEAT_TIMEOUT = 0x0938  # ms
    TIMESTAMP_FREQ_HIGH = 0x093C
    TIMESTAMP_FREQ_LOW = 0x0940
    TIMESTAMP_CONTROL = 0x0944
    TIMESTAMP_VALUE_HIGH = 0x0948
    TIMESTAMP_VALUE_LOW = 0x094C
    CCP = 0x0A00  # control channel privilege
    SCP0 = 0x0D00  # stream channel 0 host port
    SCPS0 = 0x0D04  # stream channel 0 packet size
    SCPD0 = 0x0D08  # stream channel 0 packet delay
    SCDA0 = 0x0D18  # stream channel 0 destination address


#: String register lengths, by register.
STRING_LENGTHS: dict[int, int] = {
    Reg.MANUFACTURER_NAME: 32,
    Reg.MODEL_NAME: 32,
    Reg.DEVICE_VERSION: 32,
    Reg.MANUFACTURER_INFO: 48,
    Reg.SERIAL_NUMBER: 16,
    Reg.USER_DEFINED_NAME: 16,
    Reg.FIRST_URL: 512,
    Reg.SECOND_URL: 512,
}

#: CCP bits (GigE Vision numbers bits from the MSB; these are the values).
CCP_EXCLUSIVE = 0x1
CCP_CONTROL = 0x2
#: Timestamp control bits.
TIMESTAMP_RESET = 0x1
TIMESTAMP_LATCH = 0x2
#: SCPS bits and the packet-size field.
SCPS_FIRE_TEST = 1 << 31
SCPS_DO_NOT_FRAGMENT = 1 << 30
SCPS_BIG_ENDIAN = 1 << 29
SCPS_SIZE_MASK = 0xFFFF


class GigeProtocolError(ProtocolError):
    """Bytes that are not a valid GVCP or GVSP packet of the kinds we decode."""


_HDR = struct.Struct(">BBHHH")  # command: key, flags, command, length, req_id
_ACK_HDR = struct.Struct(">HHHH")  # ack: status, answer, length, ack_id


def _u32(x: int, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x <= 0xFFFFFFFF:
        raise ValueError(f"{what} must be an integer in [0, 2**32), got {x!r}")
    return x


def _u16(x: int, what: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or not 0 <= x <= 0xFFFF:
        raise ValueError(f"{what} must be an integer in [0, 65535], got {x!r}")
    return x


# -- GVCP records ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadRegCmd:
    """READREG: read 32-bit registers (each address a multiple of 4)."""

    req_id: int
    addresses: tuple[int, ...]
    flags: int = FLAG_ACK_REQUIRED


@dataclass(frozen=True)
class WriteRegCmd:
    """WRITEREG: write ``(address, value)`` pairs in order."""

    req_id: int
    writes: tuple[tuple[int, int], ...]
    flags: int = FLAG_ACK_REQUIRED


@dataclass(frozen=True)
class ReadMemCmd:
    """READMEM: ``count`` bytes (a multiple of 4) from ``address``."""

    req_id: int
    address: int
    count: int
    flags: int = FLAG_ACK_REQUIRED


@dataclass(frozen=True)
class WriteMemCmd:
    """WRITEMEM: ``data`` (a multiple of 4 bytes) at ``address``."""

    req_id: int
    address: int
    data: bytes
    flags: int = FLAG_ACK_REQUIRED


@dataclass(frozen=True)
class DiscoveryCmd:
    """DISCOVERY (decoded so the simulated device can answer it by unicast only)."""

    req_id: int
    flags: int = FLAG_ACK_REQUIRED


GvcpCmd = ReadRegCmd | WriteRegCmd | ReadMemCmd | WriteMemCmd | DiscoveryCmd


@dataclass(frozen=True)
class ReadRegAck:
    ack_id: int
    status: int
    values: tuple[int, ...]


@dataclass(frozen=True)
class WriteRegAck:
    """``index``: how many writes succeeded (on an error, the failing one's index)."""

    ack_id: int
    status: int
    index: int


@dataclass(frozen=True)
class ReadMemAck:
    ack_id: int
    status: int
    address: int
    data: bytes


@dataclass(frozen=True)
class WriteMemAck:
    ack_id: int
    status: int
    index: int


@dataclass(frozen=True)
class PendingAck:
    """The device needs ``time_ms`` more before it answers ``ack_id``."""

    ack_id: int
    status: int
    time_ms: int


@dataclass(frozen=True)
class StatusAck:
    """An acknowledge with an error status and no payload we decode (or one that is
    not any of the acks above: ``answer`` says which)."""

    ack_id: int
    status: int
    answer: int


GvcpAck = ReadRegAck | WriteRegAck | ReadMemAck | WriteMemAck | PendingAck | StatusAck


def _check_addr(address: int, what: str = "address") -> int:
    _u32(address, what)
    if address % 4:
        raise ValueError(f"{what} 0x{address:X} is not a multiple of 4")
    return address


def encode_cmd(cmd: GvcpCmd) -> bytes:
    """The datagram of ``cmd``.

    Raises
    ------
    ValueError
        A field out of range (address not aligned, too many registers, too much data).
    """
    _u16(cmd.req_id, "req_id")
    if cmd.req_id == 0:
        raise ValueError("req_id 0 is reserved")
    if isinstance(cmd, ReadRegCmd):
        if not 1 <= len(cmd.addresses) <= MAX_GVCP_PAYLOAD // 4:
            raise ValueError(f"READREG names 1..{MAX_GVCP_PAYLOAD // 4} registers, got {len(cmd.addresses)}")
        payload = b"".join(struct.pack(">I", _check_addr(a, f"address[{i}]")) for i, a in enumerate(cmd.addresses))
        code = Command.READREG_CMD
    elif isinstance(cmd, WriteRegCmd):
        if not 1 <= len(cmd.writes) <= MAX_REGS_PER_PACKET:
            raise ValueError(f"WRITEREG names 1..{MAX_REGS_PER_PACKET} registers, got {len(cmd.writes)}")
        payload = b"".join(
            struct.pack(">II", _check_addr(a, f"address[{i}]"), _u32(v, f"value[{i}]"))
            for i, (a, v) in enumerate(cmd.writes)
        )
        code = Command.WRITEREG_CMD
    elif isinstance(cmd, ReadMemCmd):
        _check_addr(cmd.address)
        if not 4 <= cmd.count <= MAX_READMEM_BYTES or cmd.count % 4:
            raise ValueError(f"READMEM count must be a multiple of 4 in [4, {MAX_READMEM_BYTES}], got {cmd.count}")
        payload = struct.pack(">IHH", cmd.address, 0, cmd.count)
        code = Command.READMEM_CMD
    elif isinstance(cmd, WriteMemCmd):
        _check_addr(cmd.address)
        n = len(cmd.data)
        if not 4 <= n <= MAX_READMEM_BYTES or n % 4:
            raise ValueError(f"WRITEMEM data must be a multiple of 4 bytes in [4, {MAX_READMEM_BYTES}], got {n}")
        payload = struct.pack(">I", cmd.address) + bytes(cmd.data)
        code = Command.WRITEMEM_CMD
    elif isinstance(cmd, DiscoveryCmd):
        payload = b""
        code = Command.DISCOVERY_CMD
    else:
        raise TypeError(f"not a GVCP command: {cmd!r}")
    return _HDR.pack(GVCP_KEY, cmd.flags & 0xFF, code, len(payload), cmd.req_id) + payload


def decode_cmd(data: bytes) -> GvcpCmd:
    """The command in one GVCP datagram (the device side).

    Raises
    ------
    GigeProtocolError
        Not a GVCP command, a length that disagrees with the datagram, a command we do not
        decode (the message names its code: a device answers NOT_IMPLEMENTED).
    """
    data = bytes(data)
    if len(data) < GVCP_HEADER_BYTES:
        raise GigeProtocolError(f"GVCP command of {len(data)} bytes is shorter than its 8-byte header")
    key, flags, code, length, req_id = _HDR.unpack_from(data)
    if key != GVCP_KEY:
        raise GigeProtocolError(f"GVCP command key 0x{key:02X} at byte 0 is not 0x42")
    payload = data[GVCP_HEADER_BYTES:]
    if length != len(payload) or length > MAX_GVCP_PAYLOAD:
        raise GigeProtocolError(f"GVCP length field {length} at byte 4 disagrees with {len(payload)} payload bytes")
    if req_id == 0:
        raise GigeProtocolError("GVCP req_id 0 at byte 6 is reserved")
    if code == Command.READREG_CMD:
        if not length or length % 4:
            raise GigeProtocolError(f"READREG payload of {length} bytes is not a multiple of 4")
        addrs = struct.unpack(f">{length // 4}I", payload)
        return ReadRegCmd(req_id, addrs, flags)
    if code == Command.WRITEREG_CMD:
        if not length or length % 8:
            raise GigeProtocolError(f"WRITEREG payload of {length} bytes is not a multiple of 8")
        vals = struct.unpack(f">{length // 4}I", payload)
        return WriteRegCmd(req_id, tuple(zip(vals[0::2], vals[1::2], strict=True)), flags)
    if code == Command.READMEM_CMD:
        if length != 8:
            raise GigeProtocolError(f"READMEM payload of {length} bytes, expected 8")
        address, _, count = struct.unpack(">IHH", payload)
        return ReadMemCmd(req_id, address, count, flags)
    if code == Command.WRITEMEM_CMD:
        if length < 8 or length % 4:
            raise GigeProtocolError(f"WRITEMEM payload of {length} bytes: expected an address and 4-byte words")
        (address,) = struct.unpack_from(">I", payload)
        return WriteMemCmd(req_id, address, payload[4:], flags)
    if code == Command.DISCOVERY_CMD:
        return DiscoveryCmd(req_id, flags)
    raise GigeProtocolError(f"GVCP command 0x{code:04X} at byte 2 is not one we decode")


def encode_ack(ack: GvcpAck) -> bytes:
    """The datagram of ``ack`` (the device side)."""
    _u16(ack.ack_id, "ack_id")
    _u16(ack.status, "status")
    if isinstance(ack, ReadRegAck):
        payload = b"".join(struct.pack(">I", _u32(v, f"value[{i}]")) for i, v in enumerate(ack.values))
        code: int = Command.READREG_ACK
    elif isinstance(ack, WriteRegAck):
        payload = struct.pack(">HH", 0, _u16(ack.index, "index"))
        code = Command.WRITEREG_ACK
    elif isinstance(ack, ReadMemAck):
        payload = struct.pack(">I", _u32(ack.address, "address")) + bytes(ack.data)
        code = Command.READMEM_ACK
    elif isinstance(ack, WriteMemAck):
        payload = struct.pack(">HH", 0, _u16(ack.index, "index"))
        code = Command.WRITEMEM_ACK
    elif isinstance(ack, PendingAck):
        payload = struct.pack(">HH", 0, _u16(ack.time_ms, "time_ms"))
        code = Command.PENDING_ACK
    elif isinstance(ack, StatusAck):
        payload = b""
        code = _u16(ack.answer, "answer")
    else:
        raise TypeError(f"not a GVCP acknowledge: {ack!r}")
    if len(payload) > MAX_GVCP_PAYLOAD:
        raise ValueError(f"acknowledge payload of {len(payload)} bytes exceeds {MAX_GVCP_PAYLOAD}")
    return _ACK_HDR.pack(ack.status, code, len(payload), ack.ack_id) + payload


def decode_ack(data: bytes) -> GvcpAck:
    """The acknowledge in one GVCP datagram (the host side).

    An error status decodes as :class:`StatusAck` whatever follows it (devices differ in
    what they append to an error). A success whose payload does not fit its answer code is
    a :class:`GigeProtocolError`.
    """
    data = bytes(data)
    if len(data) < GVCP_HEADER_BYTES:
        raise GigeProtocolError(f"GVCP acknowledge of {len(data)} bytes is shorter than its 8-byte header")
    status, answer, length, ack_id = _ACK_HDR.unpack_from(data)
    payload = data[GVCP_HEADER_BYTES:]
    if length > len(payload) or length > MAX_GVCP_PAYLOAD:
        raise GigeProtocolError(f"GVCP length field {length} at byte 4 exceeds {len(payload)} payload bytes")
    payload = payload[:length]  # a device may pad its datagram
    if ack_id == 0:
        raise GigeProtocolError("GVCP ack_id 0 at byte 6 is reserved")
    if answer == Command.PENDING_ACK:
        if length < 4:
            raise GigeProtocolError(f"PENDING_ACK payload of {length} bytes, expected 4")
        return PendingAck(ack_id, status, struct.unpack_from(">H", payload, 2)[0])
    if status & 0x8000:
        return StatusAck(ack_id, status, answer)
    if answer == Command.READREG_ACK:
        if length % 4:
            raise GigeProtocolError(f"READREG_ACK payload of {length} bytes is not a multiple of 4")
        return ReadRegAck(ack_id, status, struct.unpack(f">{length // 4}I", payload))
    if answer in (Command.WRITEREG_ACK, Command.WRITEMEM_ACK):
        if length < 4:
            raise GigeProtocolError(f"{Command(answer).name} payload of {length} bytes, expected 4")
        index = struct.unpack_from(">H", payload, 2)[0]
        cls = WriteRegAck if answer == Command.WRITEREG_ACK else WriteMemAck
        return cls(ack_id, status, index)
    if answer == Command.READMEM_ACK:
        if length < 4:
            raise GigeProtocolError(f"READMEM_ACK payload of {length} bytes has no address")
        return ReadMemAck(ack_id, status, struct.unpack_from(">I", payload)[0], payload[4:])
    return StatusAck(ack_id, status, answer)


def decode_string(raw: bytes) -> str:
    """A bootstrap or GenICam string register: up to the first NUL, ASCII (UTF-8 tolerated)."""
    return bytes(raw).split(b"\0", 1)[0].decode("utf-8", errors="replace").strip()


# -- GVSP ------------------------------------------------------------------------------------


class GvspFormat(enum.IntEnum):
    LEADER = 1
    TRAILER = 2
    PAYLOAD = 3
    ALL_IN = 4
    H264 = 5
    MULTIZONE = 6
    MULTIPART = 7
    GENDC = 8


#: GVSP payload type of an uncompressed image.
PAYLOAD_TYPE_IMAGE = 0x0001
#: An image with chunk data after it (GigE Vision 2.0 "extended chunk" mode, bit 14 set).
PAYLOAD_TYPE_IMAGE_CHUNKS = 0x4001
#: Chunk id our simulated camera wraps the image in (the parser finds the image as the
#: first chunk whatever its id).
IMAGE_CHUNK_ID = 0x00000001
_IMAGE_TYPES = (PAYLOAD_TYPE_IMAGE, PAYLOAD_TYPE_IMAGE_CHUNKS)
#: GVSP header bytes: standard ids, extended ids.
GVSP_HEADER_BYTES = 8
GVSP_EXT_HEADER_BYTES = 20
#: IP (20) and UDP (8) headers: the packet-size register counts them.
IP_UDP_OVERHEAD = 28
_EI = 0x80
_IMAGE_LEADER = struct.Struct(">HHIIIIIIIHH")  # field flags, type, ts hi, ts lo, pf, x, y, ox, oy, px, py
_TRAILER = struct.Struct(">HHI")  # reserved, payload type, size_y


@dataclass(frozen=True)
class GvspLeader:
    """The first packet of a block: what the image is and when (device ticks) it was taken."""

    block_id: int
    packet_id: int
    payload_type: int
    timestamp: int
    pixel_format: int = 0
    width: int = 0
    height: int = 0
    offset_x: int = 0
    offset_y: int = 0
    padding_x: int = 0
    padding_y: int = 0
    status: int = 0
    extended: bool = False


@dataclass(frozen=True)
class GvspPayload:
    block_id: int
    packet_id: int
    data: bytes
    status: int = 0
    extended: bool = False


@dataclass(frozen=True)
class GvspTrailer:
    block_id: int
    packet_id: int
    payload_type: int
    size_y: int
    status: int = 0
    extended: bool = False


GvspPacket = GvspLeader | GvspPayload | GvspTrailer


def _gvsp_header(status: int, block_id: int, fmt: int, packet_id: int, extended: bool) -> bytes:
    _u16(status, "status")
    if extended:
        if not 0 <= block_id < 2**64 or not 0 <= packet_id <= 0xFFFFFFFF:
            raise ValueError(f"extended block_id {block_id} or packet_id {packet_id} out of range")
        return struct.pack(">HHIQI", status, 0, (_EI | fmt) << 24, block_id, packet_id)
    _u16(block_id, "block_id")
    if not 0 <= packet_id <= 0xFFFFFF:
        raise ValueError(f"packet_id must be in [0, 2**24), got {packet_id}")
    return struct.pack(">HHI", status, block_id, (fmt << 24) | packet_id)


def encode_leader(leader: GvspLeader) -> bytes:
    """An image leader packet (payload type must be :data:`PAYLOAD_TYPE_IMAGE`)."""
    if leader.payload_type not in _IMAGE_TYPES:
        raise ValueError(f"only image leaders are encoded, not payload type 0x{leader.payload_type:04X}")
    if not 0 <= leader.timestamp < 2**64:
        raise ValueError(f"timestamp {leader.timestamp} out of range")
    head = _gvsp_header(leader.status, leader.block_id, GvspFormat.LEADER, leader.packet_id, leader.extended)
    body = _IMAGE_LEADER.pack(
        0, leader.payload_type, leader.timestamp >> 32, leader.timestamp & 0xFFFFFFFF,
        _u32(leader.pixel_format, "pixel_format"), _u32(leader.width, "width"), _u32(leader.height, "height"),
        _u32(leader.offset_x, "offset_x"), _u32(leader.offset_y, "offset_y"),
        _u16(leader.padding_x, "padding_x"), _u16(leader.padding_y, "padding_y"),
    )
    return head + body


def encode_payload(payload: GvspPayload) -> bytes:
    return _gvsp_header(payload.status, payload.block_id, GvspFormat.PAYLOAD, payload.packet_id,
                        payload.extended) + bytes(payload.data)


def encode_trailer(trailer: GvspTrailer) -> bytes:
    head = _gvsp_header(trailer.status, trailer.block_id, GvspFormat.TRAILER, trailer.packet_id, trailer.extended)
    return head + _TRAILER.pack(0, _u16(trailer.payload_type, "payload_type"), _u32(trailer.size_y, "size_y"))


def decode_gvsp(data: bytes | memoryview) -> GvspPacket:
    """One GVSP datagram as a leader, payload or trailer record.

    Raises
    ------
    GigeProtocolError
        Too short for its header or its kind, a format we do not decode (all-in, H.264,
        multi-zone, multi-part, GenDC), an error status (a device's resend refusal).
    """
    data = bytes(data)
    if len(data) < GVSP_HEADER_BYTES:
        raise GigeProtocolError(f"GVSP packet of {len(data)} bytes is shorter than its 8-byte header")
    status, block16, infos = struct.unpack_from(">HHI", data)
    extended = bool(infos >> 31)
    fmt = (infos >> 24) & 0x7F
    if extended:
        if len(data) < GVSP_EXT_HEADER_BYTES:
            raise GigeProtocolError(f"extended-id GVSP packet of {len(data)} bytes is shorter than its 20-byte header")
        block_id, packet_id = struct.unpack_from(">QI", data, 8)
        body = data[GVSP_EXT_HEADER_BYTES:]
    else:
        block_id, packet_id = block16, infos & 0xFFFFFF
        body = data[GVSP_HEADER_BYTES:]
    if status & 0x8000:
        raise GigeProtocolError(f"GVSP packet with error status {Status.name_of(status)} (block {block_id})")
    if fmt == GvspFormat.LEADER:
        if len(body) < 12:
            raise GigeProtocolError(f"GVSP leader of {len(body)} bytes after its header is too short")
        _, ptype, ts_hi, ts_lo = struct.unpack_from(">HHII", body)
        ts = (ts_hi << 32) | ts_lo
        if ptype in _IMAGE_TYPES:
            if len(body) < _IMAGE_LEADER.size:
                raise GigeProtocolError(f"GVSP image leader of {len(body)} bytes, expected {_IMAGE_LEADER.size}")
            _, _, _, _, pf, w, h, ox, oy, px, py = _IMAGE_LEADER.unpack_from(body)
            return GvspLeader(block_id, packet_id, ptype, ts, pf, w, h, ox, oy, px, py, status, extended)
        return GvspLeader(block_id, packet_id, ptype, ts, status=status, extended=extended)
    if fmt == GvspFormat.TRAILER:
        if len(body) < 4:
            raise GigeProtocolError(f"GVSP trailer of {len(body)} bytes after its header is too short")
        ptype = struct.unpack_from(">H", body, 2)[0]
        size_y = struct.unpack_from(">I", body, 4)[0] if len(body) >= 8 else 0
        return GvspTrailer(block_id, packet_id, ptype, size_y, status, extended)
    if fmt == GvspFormat.PAYLOAD:
        return GvspPayload(block_id, packet_id, body, status, extended)
    try:
        name = GvspFormat(fmt).name
    except ValueError:
        name = f"0x{fmt:02X}"
    raise GigeProtocolError(f"GVSP packet format {name} (block {block_id}) is not one we decode")


# -- chunk data -------------------------------------------------------------------------------
_CHUNK_TAIL = struct.Struct(">II")  # chunk id, length: after each chunk's data


def encode_chunks(image: bytes, chunks: list[tuple[int, bytes]], image_id: int = IMAGE_CHUNK_ID) -> bytes:
    """The payload of an image with chunk data: the image, then each chunk, every one
    followed by its id and length (u32, big-endian) so a reader walks them from the end."""
    out = [bytes(image), _CHUNK_TAIL.pack(_u32(image_id, "image_id"), len(image))]
    for cid, data in chunks:
        if len(data) % 4:
            raise ValueError(f"chunk 0x{cid:X}: {len(data)} bytes is not a multiple of 4")
        out += [bytes(data), _CHUNK_TAIL.pack(_u32(cid, "chunk id"), len(data))]
    return b"".join(out)


def parse_chunks(payload: bytes, image_bytes: int) -> tuple[bytes, dict[int, bytes]]:
    """Split a chunk payload into ``(image, {chunk id: data})``, walking from the end.

    Raises
    ------
    GigeProtocolError
        The walk does not land exactly on the start, or the first chunk (the image) is not
        ``image_bytes`` long: a torn or foreign payload, never a frame.
    """
    payload = bytes(payload)
    end = len(payload)
    found: list[tuple[int, int, int]] = []  # (start, id, length)
    while end > 0:
        if end < _CHUNK_TAIL.size or len(found) > 4096:
            raise GigeProtocolError(f"chunk data: {end} bytes left before a chunk's id and length")
        cid, length = _CHUNK_TAIL.unpack_from(payload, end - _CHUNK_TAIL.size)
        start = end - _CHUNK_TAIL.size - length
        if start < 0:
            raise GigeProtocolError(f"chunk 0x{cid:X} of {length} bytes runs past the payload's start")
        found.append((start, cid, length))
        end = start
    if not found or found[-1][2] != image_bytes:
        raise GigeProtocolError(f"chunk data: the first chunk is not the {image_bytes}-byte image")
    image = payload[:image_bytes]
    return image, {cid: payload[start:start + length] for start, cid, length in found[:-1]}


# -- pixel formats (GenICam PFNC codes) ------------------------------------------------------

#: Pixel formats the driver turns into arrays: name -> PFNC code. Bits per pixel are in bits
#: 16..23 of the code. Multi-byte pixels are little-endian on the wire (SCPS big-endian off).
PIXEL_FORMATS: dict[str, int] = {
    "Mono8": 0x01080001,
    "Mono10": 0x01100003,
    "Mono12": 0x01100005,
    "Mono16": 0x01100007,
    "BayerGR8": 0x01080008,
    "BayerRG8": 0x01080009,
    "BayerGB8": 0x0108000A,
    "BayerBG8": 0x0108000B,
    "RGB8": 0x02180014,
    "BGR8": 0x02180015,
}
_PF_NAMES = {v: k for k, v in PIXEL_FORMATS.items()}


def pixel_format_name(code: int) -> str | None:
    """The PFNC name of ``code``, or None for a format we do not turn into an array."""
    return _PF_NAMES.get(code)


def pixel_format_code(name: str) -> int:
    try:
        return PIXEL_FORMATS[name]
    except KeyError:
        raise ValueError(f"pixel format {name!r} unknown; known: {', '.join(PIXEL_FORMATS)}") from None


def bits_per_pixel(code: int) -> int:
    """Bits per pixel a PFNC code declares (bits 16..23)."""
    return (code >> 16) & 0xFF
