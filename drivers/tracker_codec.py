"""Pure codec of the cellcal tracker wire protocol 1.0 (``docs/protocols/tracker.md``).

Bytes in, typed records out; no I/O, no clocks, no threads, so it can be fuzzed directly and
shared by the driver (host side) and the simulated tracker (device side).

Wire format (the spec is the authority; this is a reminder)::

    $TYPE,seq,field,...*CCCC\\r\\n

``CCCC`` is CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no final xor) of
the bytes strictly between ``$`` and ``*``, as four upper-case hex digits. A frame is at
most :data:`MAX_FRAME_BYTES` bytes from ``$`` to ``\\n`` inclusive and contains only
printable ASCII between ``$`` and ``\\r``.

Decoding is incremental: :class:`Decoder` accepts any split of a byte stream and yields the
same records and the same errors for every split. After garbage it resynchronises on the
next ``$``. Every bad frame (or run of garbage) becomes exactly one
:class:`TrackerProtocolError` and decoding carries on with the next byte.
"""

from __future__ import annotations

import binascii
import enum
import re
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar, dataclass_transform

from cellcal.drivers.errors import ProtocolError

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_FRAME_BYTES",
    "SEQ_MAX",
    "SEQ_UNKNOWN",
    "MAX_AVERAGE_MS",
    "UNITS_MM_DEG",
    "crc16",
    "MeasKind",
    "NakCode",
    "FrameFault",
    "MeasurementFlags",
    "StatusFlags",
    "TrackerProtocolError",
    "Hello",
    "Ping",
    "Meas",
    "Stat",
    "Stop",
    "Ident",
    "Pong",
    "PointReply",
    "PoseReply",
    "Status",
    "Ack",
    "Nak",
    "Record",
    "REQUEST_TYPES",
    "REPLY_TYPES",
    "encode",
    "Decoder",
]

#: Protocol version this codec implements, ``(major, minor)``.
PROTOCOL_VERSION: tuple[int, int] = (1, 0)
#: Longest legal frame, ``$`` to ``\n`` inclusive.
MAX_FRAME_BYTES = 256
#: Sequence numbers are 0..SEQ_MAX; hosts use 1..SEQ_MAX and wrap to 1.
SEQ_MAX = 65535
#: Sequence number a device uses when it cannot attribute a reply (a frame with a bad CRC).
SEQ_UNKNOWN = 0
#: Longest averaging time a MEAS may ask for.
MAX_AVERAGE_MS = 60_000
#: Largest sample count a reply may carry.
MAX_SAMPLE_COUNT = 10_000_000
#: Device timestamps are microseconds in [0, 2**53): exact in a float64.
MAX_TS_US = 2**53 - 1
#: The only units string of protocol 1.0: positions and their std in mm, angle std in deg.
UNITS_MM_DEG = "MM_DEG"
#: Longest text field (model, serial, firmware).
MAX_TEXT_CHARS = 32

_START = 0x24  # '$'
_NL = 0x0A
#: How many bytes of a bad frame or garbage run an error keeps for the log.
_RAW_KEEP = 64


def crc16(data: bytes) -> int:
    """CRC-16/CCITT-FALSE of ``data`` (check value 0x29B1 for ``b"123456789"``)."""
    return binascii.crc_hqx(data, 0xFFFF)


class MeasKind(str, enum.Enum):
    """What a MEAS asks for: a 3-DoF point or a 6-DoF pose."""

    POINT = "POINT"
    POSE = "POSE"


class NakCode(str, enum.Enum):
    """Reason codes a device puts in a NAK (spec section "Error codes")."""

    BAD_CRC = "BAD_CRC"
    BAD_REQUEST = "BAD_REQUEST"
    UNKNOWN_COMMAND = "UNKNOWN_COMMAND"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    BUSY = "BUSY"
    ABORTED = "ABORTED"
    NO_TARGET = "NO_TARGET"
    BEAM_BROKEN = "BEAM_BROKEN"
    NOT_STABLE = "NOT_STABLE"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    NOT_WARMED_UP = "NOT_WARMED_UP"


class FrameFault(str, enum.Enum):
    """Why bytes were rejected (the ``fault`` of a :class:`TrackerProtocolError`)."""

    GARBAGE = "garbage"  # bytes outside any frame
    UNTERMINATED = "unterminated"  # a new '$' arrived before the frame's '\n'
    OVERLONG = "overlong"  # more than MAX_FRAME_BYTES without '\n'
    MALFORMED = "malformed"  # not '$' printable-body '*' 4-hex '\r\n'
    BAD_CRC = "bad_crc"
    UNKNOWN_TYPE = "unknown_type"  # CRC fine, TYPE not one this decoder accepts
    BAD_FIELDS = "bad_fields"  # CRC fine, wrong field count or a field that does not parse


class MeasurementFlags(enum.IntFlag):
    """Informational bits of a measurement reply (unknown bits must be ignored)."""

    NONE = 0
    #: Some samples of the averaging window were discarded (fewer than rate x time).
    DROPPED_SAMPLES = 0x0001
    #: The target is within 2 % of the device's range limits.
    NEAR_RANGE_LIMIT = 0x0002
    #: Environmental (air) compensation is not active.
    UNCOMPENSATED = 0x0004


class StatusFlags(enum.IntFlag):
    """Bits of a STAT reply."""

    NONE = 0
    WARMED_UP = 0x0001
    TARGET_LOCKED = 0x0002
    STABLE = 0x0004
    MEASURING = 0x0008


class TrackerProtocolError(ProtocolError):
    """One rejected frame or run of garbage.

    Attributes
    ----------
    fault : FrameFault
        Why the bytes were rejected.
    raw : bytes
        The rejected bytes (at most the first 64 for garbage runs).
    seq : int or None
        The frame's sequence number when its CRC was valid (so a device can NAK it by
        number), else ``None``.
    msg_type : str or None
        The frame's TYPE when its CRC was valid.
    """

    def __init__(
        self,
        fault: FrameFault,
        message: str,
        raw: bytes = b"",
        *,
        seq: int | None = None,
        msg_type: str | None = None,
    ) -> None:
        super().__init__(f"{fault.value}: {message}")
        self.fault = fault
        self.raw = bytes(raw)
        self.seq = seq
        self.msg_type = msg_type


# -- field kinds ---------------------------------------------------------------------------
# Each wire field has a kind: a parser (str -> value, ValueError on bad input) and a
# formatter (value -> str). Numbers use a strict grammar, not Python's int()/float(),
# which would accept "1_0", " 1", "nan", "inf" and "1e9".

_UINT_RE = re.compile(r"0|[1-9][0-9]{0,15}")
_DEC_RE = re.compile(r"-?(0|[1-9][0-9]{0,8})(\.[0-9]{1,12})?")
_UDEC_RE = re.compile(r"(0|[1-9][0-9]{0,8})(\.[0-9]{1,12})?")
_TEXT_RE = re.compile(rf"[\x20-\x7e]{{1,{MAX_TEXT_CHARS}}}")
_VERSION_RE = re.compile(r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]{0,2})")
_CODE_RE = re.compile(r"[A-Z][A-Z0-9_]{0,23}")
_FLAGS_RE = re.compile(r"[0-9A-F]{4}")


def _uint(lo: int, hi: int):
    def parse(s: str) -> int:
        if not _UINT_RE.fullmatch(s):
            raise ValueError(f"not an unsigned integer: {s!r}")
        v = int(s)
        if not lo <= v <= hi:
            raise ValueError(f"{v} outside [{lo}, {hi}]")
        return v

    def fmt(v: int) -> str:
        v = int(v)
        if not lo <= v <= hi:
            raise ValueError(f"{v} outside [{lo}, {hi}]")
        return str(v)

    def fast(s: str) -> int:
        v = int(s)
        if not lo <= v <= hi:
            raise ValueError
        return v

    return parse, fmt, r"(0|[1-9][0-9]{0,15})", fast


def _decimal(places: int, signed: bool):
    regex = _DEC_RE if signed else _UDEC_RE

    def parse(s: str) -> float:
        if not regex.fullmatch(s):
            raise ValueError(f"not a {'signed ' if signed else 'non-negative '}decimal: {s!r}")
        return float(s)

    def fmt(v: float) -> str:
        v = float(v)
        if v != v or v in (float("inf"), float("-inf")):
            raise ValueError(f"not finite: {v!r}")
        if not signed and v < 0:
            raise ValueError(f"negative: {v!r}")
        out = f"{v:.{places}f}"
        if out.startswith("-") and float(out) == 0.0:
            out = out[1:]  # "-0.0000" is not canonical
        if not regex.fullmatch(out):
            raise ValueError(f"{v!r} does not fit the wire format")
        return out

    pattern = r"(-?(?:0|[1-9][0-9]{0,8})(?:\.[0-9]{1,12})?)" if signed else \
        r"((?:0|[1-9][0-9]{0,8})(?:\.[0-9]{1,12})?)"
    return parse, fmt, pattern, float


def _regex_text(regex: re.Pattern[str], what: str):
    def parse(s: str) -> str:
        if not regex.fullmatch(s) or s != s.strip():
            raise ValueError(f"bad {what}: {s!r}")
        return s

    def fmt(v: str) -> str:
        return parse(str(v))

    # inner groups made non-capturing so the body regex has one group per field
    return parse, fmt, "(" + regex.pattern.replace("(", "(?:") + ")", str


def _text():
    def parse(s: str) -> str:
        if not _TEXT_RE.fullmatch(s) or s != s.strip() or "," in s:
            raise ValueError(f"bad text field: {s!r}")
        return s

    # 1-32 printable characters, no ',' and no space at either end
    return parse, lambda v: parse(str(v)), r"([!-+\--~](?:[ -+\--~]{0,30}[!-+\--~])?)", str


def _enum(cls):
    def parse(s: str):
        try:
            return cls(s)
        except ValueError:
            raise ValueError(f"bad {cls.__name__}: {s!r}") from None

    pattern = "(" + "|".join(re.escape(m.value) for m in cls) + ")"
    return parse, lambda v: cls(v).value, pattern, cls


def _flags(cls):
    def parse(s: str):
        if not _FLAGS_RE.fullmatch(s):
            raise ValueError(f"bad flags: {s!r}")
        return cls(int(s, 16))

    def fmt(v) -> str:
        v = int(v)
        if not 0 <= v <= 0xFFFF:
            raise ValueError(f"flags out of range: {v}")
        return f"{v:04X}"

    return parse, fmt, r"([0-9A-F]{4})", lambda s: cls(int(s, 16))


_K_SEQ = _uint(0, SEQ_MAX)
_K_TS = _uint(0, MAX_TS_US)
_K_AVG = _uint(0, MAX_AVERAGE_MS)
_K_COUNT = _uint(1, MAX_SAMPLE_COUNT)
_K_MM = _decimal(4, signed=True)  # 0.1 um resolution
_K_STD_MM = _decimal(4, signed=False)
_K_QUAT = _decimal(9, signed=True)
_K_STD_DEG = _decimal(6, signed=False)  # 1 micro-degree
_K_VERSION = _regex_text(_VERSION_RE, "version")
_K_CODE = _regex_text(_CODE_RE, "code")
_K_TEXT = _text()
_K_KIND = _enum(MeasKind)
_K_MFLAGS = _flags(MeasurementFlags)
_K_SFLAGS = _flags(StatusFlags)


# -- records -------------------------------------------------------------------------------


class _Record:
    """Base of every message: ``TYPE`` on the wire, ``KINDS`` one field kind per field.

    Dataclass fields are in wire order, starting with ``seq``.
    """

    TYPE: ClassVar[str]
    KINDS: ClassVar[tuple]
    _BODY_RE: ClassVar[re.Pattern[str]]
    _FAST: ClassVar[tuple]
    seq: int


_R = TypeVar("_R", bound=type)


@dataclass_transform(frozen_default=True)
def _record(type_: str, *kinds: tuple) -> Callable[[_R], _R]:
    def wrap(cls: Any) -> Any:
        cls = dataclass(frozen=True, slots=True)(cls)
        names = [f.name for f in fields(cls)]
        assert len(names) == len(kinds) + 1 and names[0] == "seq", cls
        cls.TYPE = type_
        cls.KINDS = (_K_SEQ, *kinds)
        # Fast path: one regex for the whole body checks every field's syntax at once;
        # the per-field parsers run only to name what is wrong in a rejected frame.
        cls._BODY_RE = re.compile(
            re.escape(type_) + "".join("," + k[2] for k in cls.KINDS)
        )
        cls._FAST = tuple(k[3] for k in cls.KINDS)
        return cls

    return wrap


# host -> device


@_record("HELLO", _K_VERSION)
class Hello(_Record):
    """Host's highest protocol version, ``"major.minor"``; the device answers :class:`Ident`."""

    seq: int
    version: str


@_record("PING")
class Ping(_Record):
    """Clock exchange; the device answers :class:`Pong` at once."""

    seq: int


@_record("MEAS", _K_KIND, _K_AVG)
class Meas(_Record):
    """Measure a point or pose averaged over ``average_ms`` (0: one sample)."""

    seq: int
    kind: MeasKind
    average_ms: int


@_record("STAT")
class Stat(_Record):
    """Ask for the device status; the device answers :class:`Status`."""

    seq: int


@_record("STOP")
class Stop(_Record):
    """Abort a measurement in progress; the device answers :class:`Ack`."""

    seq: int


# device -> host (every one carries ts_us: the device clock when the reply was sent)


@_record("ID", _K_TS, _K_VERSION, _K_TEXT, _K_TEXT, _K_TEXT, _K_TEXT)
class Ident(_Record):
    """Answer to HELLO: agreed version, model, serial, firmware, units."""

    seq: int
    ts_us: int
    version: str
    model: str
    serial: str
    firmware: str
    units: str


@_record("PONG", _K_TS, _K_TS)
class Pong(_Record):
    """Answer to PING: ``rx_us`` when the PING's '\\n' arrived, ``ts_us`` when PONG left."""

    seq: int
    ts_us: int
    rx_us: int


@_record(
    "PT", _K_TS, _K_TS, _K_COUNT, _K_MM, _K_MM, _K_MM, _K_STD_MM, _K_STD_MM, _K_STD_MM, _K_MFLAGS
)
class PointReply(_Record):
    """A 3-DoF point in the tracker frame (mm) with its per-axis standard uncertainty."""

    seq: int
    ts_us: int
    t_us: int  # centre of the averaging window, device clock
    sample_count: int
    x_mm: float
    y_mm: float
    z_mm: float
    std_x_mm: float
    std_y_mm: float
    std_z_mm: float
    flags: MeasurementFlags


@_record(
    "PS",
    _K_TS,
    _K_TS,
    _K_COUNT,
    _K_MM,
    _K_MM,
    _K_MM,
    _K_QUAT,
    _K_QUAT,
    _K_QUAT,
    _K_QUAT,
    _K_STD_MM,
    _K_STD_MM,
    _K_STD_MM,
    _K_STD_DEG,
    _K_STD_DEG,
    _K_STD_DEG,
    _K_MFLAGS,
)
class PoseReply(_Record):
    """A 6-DoF pose ``tracker_T_target``: position (mm), quaternion (w, x, y, z), stds."""

    seq: int
    ts_us: int
    t_us: int
    sample_count: int
    x_mm: float
    y_mm: float
    z_mm: float
    qw: float
    qx: float
    qy: float
    qz: float
    std_x_mm: float
    std_y_mm: float
    std_z_mm: float
    std_rx_deg: float  # about the target's own axes
    std_ry_deg: float
    std_rz_deg: float
    flags: MeasurementFlags


@_record("ST", _K_TS, _K_SFLAGS)
class Status(_Record):
    """Answer to STAT."""

    seq: int
    ts_us: int
    flags: StatusFlags


@_record("ACK", _K_TS)
class Ack(_Record):
    """Positive acknowledgement (of STOP)."""

    seq: int
    ts_us: int


@_record("NAK", _K_TS, _K_CODE)
class Nak(_Record):
    """Negative acknowledgement: the request ``seq`` failed for ``code`` (a NakCode name).

    ``code`` stays a string so a host can report codes from a newer minor version.
    """

    seq: int
    ts_us: int
    code: str


Record = Hello | Ping | Meas | Stat | Stop | Ident | Pong | PointReply | PoseReply | Status | Ack | Nak

REQUEST_TYPES: tuple[type[_Record], ...] = (Hello, Ping, Meas, Stat, Stop)
REPLY_TYPES: tuple[type[_Record], ...] = (Ident, Pong, PointReply, PoseReply, Status, Ack, Nak)


def encode(record: Record) -> bytes:
    """The canonical frame of ``record``.

    Raises
    ------
    ValueError
        If a field does not fit the wire format (out of range, not finite, too long) or
        the frame would exceed :data:`MAX_FRAME_BYTES`.
    """
    values = [getattr(record, f.name) for f in fields(record)]
    parts = [record.TYPE]
    for kind, v in zip(record.KINDS, values, strict=True):
        parts.append(kind[1](v))
    body = ",".join(parts).encode("ascii")
    frame = b"$" + body + b"*%04X\r\n" % crc16(body)
    if len(frame) > MAX_FRAME_BYTES:
        raise ValueError(f"{record.TYPE} frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    return frame


# '$' body '*' CCCC '\r\n'; the body is printable ASCII without '*' ('$' cannot occur: the
# framer starts a new frame at every '$').
_FRAME_RE = re.compile(rb"\$([\x20-\x29\x2b-\x7e]*)\*([0-9A-Fa-f]{4})\r\n")


class Decoder:
    """Incremental decoder: feed bytes, read records.

    Parameters
    ----------
    accept : iterable of record classes
        Message types this side accepts (a host accepts :data:`REPLY_TYPES`, a device
        :data:`REQUEST_TYPES`). Frames of other types are ``UNKNOWN_TYPE`` errors.

    Notes
    -----
    Memory is bounded: a partial frame never exceeds :data:`MAX_FRAME_BYTES` and garbage is
    counted, not stored (only its first 64 bytes are kept for the error).
    """

    def __init__(self, accept: Iterable[type[_Record]] = REQUEST_TYPES + REPLY_TYPES) -> None:
        self._types = {cls.TYPE: cls for cls in accept}
        self._frame = bytearray()  # the frame in progress, starting with '$'
        self._in_frame = False
        self._skipping = False  # after an overlong frame: drop bytes until the next '$'
        self._garbage_n = 0
        self._garbage_head = bytearray()
        self._out: deque[Record | TrackerProtocolError] = deque()

    # -- public -----------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        """Append bytes from the wire (any split of the stream gives the same results)."""
        data = bytes(data)
        n = len(data)
        i = 0
        while i < n:
            if not self._in_frame:
                j = data.find(b"$", i)
                end = n if j < 0 else j
                if not self._skipping and end > i:
                    self._garbage_n += end - i
                    room = _RAW_KEEP - len(self._garbage_head)
                    if room > 0:
                        self._garbage_head += data[i : min(end, i + room)]
                if j < 0:
                    return
                self._flush_garbage()
                self._skipping = False
                self._in_frame = True
                self._frame = bytearray(b"$")
                i = j + 1
                continue
            # Inside a frame: it ends at '\n', is cut short by '$', or grows too long.
            nl = data.find(b"\n", i)
            dl = data.find(b"$", i)
            stop = min(x for x in (nl, dl, n) if x >= 0)
            room = MAX_FRAME_BYTES - len(self._frame)
            take = stop - i + (1 if stop == nl else 0)
            if take > room:
                self._frame += data[i : i + room]
                self._emit_error(
                    FrameFault.OVERLONG, f"no end of frame within {MAX_FRAME_BYTES} bytes"
                )
                self._in_frame = False
                self._skipping = True
                i += room
                continue
            if stop == nl:
                self._frame += data[i : nl + 1]
                self._out.append(self._parse(bytes(self._frame)))
                self._in_frame = False
                i = nl + 1
            elif stop == dl:
                self._frame += data[i:dl]
                self._emit_error(FrameFault.UNTERMINATED, "new '$' before end of frame")
                self._in_frame = False
                i = dl  # the '$' starts the next frame
            else:
                self._frame += data[i:n]
                i = n

    def read(self) -> Record | None:
        """The next decoded record, or ``None`` when more bytes are needed.

        Raises
        ------
        TrackerProtocolError
            For each rejected frame or garbage run, in stream order. Call again to go on.
        """
        if not self._out:
            return None
        item = self._out.popleft()
        if isinstance(item, TrackerProtocolError):
            raise item
        return item

    def decode(self, data: bytes = b"") -> list[Record | TrackerProtocolError]:
        """Feed ``data`` and return every pending record and error, errors as values."""
        if data:
            self.feed(data)
        out = list(self._out)
        self._out.clear()
        return out

    @property
    def pending(self) -> int:
        """Records and errors decoded but not yet read."""
        return len(self._out)

    def reset(self) -> None:
        """Forget any partial frame and pending output (after a reconnect)."""
        self.__init__(self._types.values())  # type: ignore[misc]

    # -- internals --------------------------------------------------------------------
    def _flush_garbage(self) -> None:
        if self._garbage_n:
            self._out.append(
                TrackerProtocolError(
                    FrameFault.GARBAGE,
                    f"{self._garbage_n} byte(s) outside any frame",
                    bytes(self._garbage_head),
                )
            )
            self._garbage_n = 0
            self._garbage_head = bytearray()

    def _emit_error(self, fault: FrameFault, message: str) -> None:
        self._out.append(TrackerProtocolError(fault, message, bytes(self._frame[:_RAW_KEEP * 4])))

    def _parse(self, frame: bytes) -> Record | TrackerProtocolError:
        m = _FRAME_RE.fullmatch(frame)
        if m is None:
            why = "non-printable byte" if not frame[1:-2].isascii() or any(
                b < 0x20 or b > 0x7E for b in frame[1:-2]
            ) else "not $BODY*CCCC\\r\\n"
            return TrackerProtocolError(FrameFault.MALFORMED, why, frame)
        body, crc_hex = m.group(1), m.group(2)
        got = int(crc_hex, 16)
        want = crc16(body)
        if got != want:
            return TrackerProtocolError(
                FrameFault.BAD_CRC, f"CRC {got:04X} != computed {want:04X}", frame
            )
        text = body.decode("ascii")
        type_ = text.split(",", 1)[0]
        cls = self._types.get(type_)
        if cls is not None:
            mt = cls._BODY_RE.fullmatch(text)
            if mt is not None:
                try:
                    return cls(*[conv(g) for conv, g in zip(cls._FAST, mt.groups(), strict=True)])  # type: ignore[return-value]
                except ValueError:
                    pass  # a range check failed: the slow path below says which
        parts = text.split(",")
        seq = None
        if len(parts) > 1:
            try:
                seq = _K_SEQ[0](parts[1])  # (parse, fmt, pattern, fast)
            except ValueError:
                seq = None
        cls = self._types.get(type_)
        if cls is None:
            return TrackerProtocolError(
                FrameFault.UNKNOWN_TYPE, f"unknown message type {type_!r}", frame,
                seq=seq, msg_type=type_,
            )
        if len(parts) - 1 != len(cls.KINDS):
            return TrackerProtocolError(
                FrameFault.BAD_FIELDS,
                f"{type_} needs {len(cls.KINDS)} fields after the type, got {len(parts) - 1}",
                frame, seq=seq, msg_type=type_,
            )
        try:
            values = [k[0](s) for k, s in zip(cls.KINDS, parts[1:], strict=True)]
        except ValueError as exc:
            return TrackerProtocolError(
                FrameFault.BAD_FIELDS, f"{type_}: {exc}", frame, seq=seq, msg_type=type_
            )
        return cls(*values)  # type: ignore[return-value]
