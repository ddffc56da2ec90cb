"""Pure codec of Leica GeoCOM ASCII RPC lines (``docs/protocols/geocom.md``), and the
polar-to-Cartesian convention cellcal uses for a total station's Hz, V and slope distance.

Bytes in, records out; no I/O, no clocks. The driver (host side) and the simulated total
station (device side) share it, and it is fuzzed directly.

Wire format (the protocol document is the authority; this is a reminder)::

    request  %R1Q,<rpc>[,<trid>[,<crc>]]:<p0>,<p1>,...\\r\\n
    reply    %R1P,<com rc>[,<trid>[,<crc>]]:<rc>[,<v0>,<v1>,...]\\r\\n

``rpc``, ``trid`` (transaction id), ``com rc`` (the communication layer's return code) and
``rc`` (the procedure's) are decimal integers. A parameter or value is an integer, a decimal
double (angles in radians, distances in metres), a string in double quotes or a byte as two
hex digits in single quotes. The optional ``crc`` is CRC-16/ARC, in decimal, of the whole
line without ``,<crc>`` and without the line end (the checksum extension geocompy
implements). A blank line is not a request: the instrument ignores it (clients send one to
clear its input), and so does :class:`Decoder`.

Decoding is incremental: any split of a stream gives the same records and errors. A line is
at most :data:`MAX_LINE_BYTES` bytes; a longer one, a line with a non-printable byte, or one
that is not a request or reply becomes one :class:`GeocomProtocolError`, and decoding resumes
at the next line: the line end is GeoCOM's resynchronisation point.
"""

from __future__ import annotations

import enum
import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.drivers.errors import ProtocolError

__all__ = [
    "DEFAULT_BAUDRATE",
    "MAX_LINE_BYTES",
    "MAX_TRID",
    "RC",
    "Rpc",
    "MeasureProgram",
    "Inclination",
    "LineFault",
    "GeocomProtocolError",
    "Request",
    "Reply",
    "crc16_arc",
    "encode",
    "format_value",
    "parse_int",
    "parse_double",
    "parse_string",
    "parse_bool",
    "Decoder",
    "rc_name",
    "MAX_SLOPE_DISTANCE_M",
    "simple_measurement_problem",
    "cartesian_from_polar",
    "polar_from_cartesian",
    "polar_jacobian",
]

#: GeoCOM's serial default (8N1).
DEFAULT_BAUDRATE = 9600
#: Longest line accepted, line end included.
MAX_LINE_BYTES = 1024
#: Transaction ids are 0..MAX_TRID.
MAX_TRID = 32767
#: Longest decimal integer field (a 32-bit value and its sign).
_MAX_INT_DIGITS = 10
_KEEP = 128


class RC(enum.IntEnum):
    """The GeoCOM return codes (``GRC_*``) cellcal names; any other is kept as a number."""

    OK = 0
    UNDEFINED = 1
    IVPARAM = 2
    IVRESULT = 3
    FATAL = 4
    NOT_IMPL = 5
    TIME_OUT = 6
    SET_INCOMPL = 7
    ABORT = 8
    NOMEMORY = 9
    NOTINIT = 10
    SHUT_DOWN = 12
    SYSBUSY = 13
    HWFAILURE = 14
    ABORT_APPL = 15
    LOW_POWER = 16
    IVVERSION = 17
    BATT_EMPTY = 18
    NO_EVENT = 20
    OUT_OF_TEMP = 21
    INSTRUMENT_TILT = 22
    TMC_NO_FULL_CORRECTION = 1283
    TMC_ACCURACY_GUARANTEE = 1284
    TMC_ANGLE_OK = 1285
    TMC_ANGLE_NO_FULL_CORRECTION = 1288
    TMC_ANGLE_NO_ACC_GUARANTY = 1289
    TMC_ANGLE_ERROR = 1290
    TMC_DIST_PPM = 1291
    TMC_DIST_ERROR = 1292
    TMC_BUSY = 1293
    TMC_SIGNAL_ERROR = 1294
    COM_ERO = 3072
    COM_CANT_ENCODE = 3073
    COM_CANT_DECODE = 3074
    COM_CANT_SEND = 3075
    COM_CANT_RECV = 3076
    COM_TIMEDOUT = 3077
    COM_WRONG_FORMAT = 3078
    COM_VER_MISMATCH = 3079
    COM_CANT_DECODE_REQ = 3080
    COM_PROC_UNAVAIL = 3081
    COM_CANT_ENCODE_REP = 3082
    COM_SYSTEM_ERR = 3083
    COM_FAILED = 3085
    COM_SRVR_RX_CHECKSUM_ERROR = 3101
    COM_CLNT_RX_CHECKSUM_ERROR = 3102
    AUT_TIMEOUT = 8704
    AUT_DETENT_ERROR = 8705
    AUT_ANGLE_ERROR = 8706
    AUT_MOTOR_ERROR = 8707
    AUT_INCACC = 8708
    AUT_DEV_ERROR = 8709
    AUT_NO_TARGET = 8710
    AUT_MULTIPLE_TARGETS = 8711
    AUT_BAD_ENVIRONMENT = 8712
    AUT_DETECTOR_ERROR = 8713
    AUT_NOT_ENABLED = 8714
    AUT_CALACC = 8715
    AUT_ACCURACY = 8716


def rc_name(rc: int) -> str:
    """``RC`` name of ``rc`` (``"GRC_<n>"`` for a number cellcal does not name)."""
    try:
        return RC(rc).name
    except ValueError:
        return f"GRC_{rc}"


class Rpc(enum.IntEnum):
    """The remote procedures cellcal calls or the simulator serves."""

    COM_NULL_PROC = 0
    COM_SET_DOUBLE_PRECISION = 107
    COM_GET_DOUBLE_PRECISION = 108
    COM_GET_SW_VERSION = 110
    TMC_DO_MEASURE = 2008
    TMC_GET_COORDINATE = 2082
    TMC_GET_ANGLE5 = 2107
    TMC_GET_SIMPLE_MEA = 2108
    TMC_GET_SIMPLE_COORD = 2116
    CSV_GET_INSTRUMENT_NO = 5003
    CSV_GET_INSTRUMENT_NAME = 5004
    CSV_GET_SW_VERSION = 5034
    AUT_FINE_ADJUST = 9037
    AUS_SET_USER_ATR_STATE = 18005
    AUS_GET_USER_ATR_STATE = 18006


class MeasureProgram(enum.IntEnum):
    """``TMC_MEASURE_PRG`` of TMC_DoMeasure."""

    STOP = 0
    DEF_DIST = 1
    CLEAR = 3
    SIGNAL = 4
    DO_MEASURE = 6
    RTRK_DIST = 8
    RED_TRK_DIST = 10
    FREQUENCY = 11


class Inclination(enum.IntEnum):
    """``TMC_INCLINE_PRG``: how the instrument corrects for its tilt."""

    MEASURE = 0
    AUTO = 1
    MODEL = 2


class LineFault(str, enum.Enum):
    """Why a line was rejected (the ``fault`` of a :class:`GeocomProtocolError`)."""

    OVERLONG = "overlong"  # no line end within MAX_LINE_BYTES
    MALFORMED = "malformed"  # not a request (device side) or reply (host side)
    BAD_CRC = "bad_crc"  # well formed, but its checksum does not match


class GeocomProtocolError(ProtocolError):
    """One rejected line.

    Attributes
    ----------
    fault : LineFault
    raw : bytes
        The line (at most its first 128 bytes).
    trid : int or None
        Its transaction id when the line was well formed (a bad checksum), so the other end
        can be told which exchange failed.
    """

    def __init__(self, fault: LineFault, message: str, raw: bytes = b"", *, trid: int | None = None) -> None:
        super().__init__(f"{fault.value}: {message}")
        self.fault = fault
        self.raw = bytes(raw)
        self.trid = trid


# -- values ------------------------------------------------------------------------------------
# Tokens stay as they appear on the wire in the records; parse_* turn them into Python values
# with a strict grammar (Python's int() and float() accept "1_0", " 1", "nan" and "inf").

_INT = r"-?[0-9]{1,10}"
_DOUBLE = r"-?(?:[0-9]{1,20}(?:\.[0-9]{0,20})?|\.[0-9]{1,20})(?:[eE][-+]?[0-9]{1,3})?"
_STRING = r'"[\x20\x21\x23-\x7e]{0,255}"'
_BYTE = r"'[0-9A-Fa-f]{2}'"
_TOKEN = f"(?:{_STRING}|{_BYTE}|{_DOUBLE})"
_INT_RE = re.compile(_INT)
_DOUBLE_RE = re.compile(_DOUBLE)
_STRING_RE = re.compile(_STRING)
_TOKEN_RE = re.compile(_TOKEN)
_TOKENS_RE = re.compile(f"(?:{_TOKEN}(?:,{_TOKEN})*)?")
_SPLIT_RE = re.compile(_TOKEN)

_REQUEST_RE = re.compile(r"%R1Q,([0-9]{1,5})(?:,([0-9]{1,5})(?:,([0-9]{1,5}))?)?:(.*)")
_REPLY_RE = re.compile(r"%R1P,([0-9]{1,5})(?:,([0-9]{1,5})(?:,([0-9]{1,5}))?)?:([0-9]{1,5})(?:,(.*))?")


def parse_int(token: str) -> int:
    """A GeoCOM integer (``ValueError`` naming the token otherwise)."""
    if not _INT_RE.fullmatch(token):
        raise ValueError(f"not a GeoCOM integer: {token!r}")
    return int(token)


def parse_double(token: str) -> float:
    """A GeoCOM double: a finite decimal (``ValueError`` naming the token otherwise)."""
    if not _DOUBLE_RE.fullmatch(token):
        raise ValueError(f"not a GeoCOM double: {token!r}")
    value = float(token)
    if not math.isfinite(value):
        raise ValueError(f"GeoCOM double out of range: {token!r}")
    return value


def parse_string(token: str) -> str:
    """A GeoCOM string, its quotes removed."""
    if not _STRING_RE.fullmatch(token):
        raise ValueError(f"not a GeoCOM string: {token!r}")
    return token[1:-1]


def parse_bool(token: str) -> bool:
    """A GeoCOM boolean: ``0`` or ``1``."""
    if token not in ("0", "1"):
        raise ValueError(f"not a GeoCOM boolean: {token!r}")
    return token == "1"


def format_value(value: Any, *, precision: int = 15) -> str:
    """The token of a Python value: ``bool`` -> 0/1, ``int``, ``float`` (``precision``
    decimals, trailing zeros dropped), ``str`` -> quoted.

    Raises
    ------
    ValueError
        A value GeoCOM cannot carry (a non-finite float, a string with a quote or a control
        character, another type).
    """
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, np.integer)):
        token = str(int(value))
        if not _INT_RE.fullmatch(token):
            raise ValueError(f"integer out of range for GeoCOM: {value!r}")
        return token
    if isinstance(value, (float, np.floating)):
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"not finite: {value!r}")
        token = f"{v:.{int(precision)}f}"
        if "." in token:
            token = token.rstrip("0")
            if token.endswith("."):
                token += "0"
        if token.startswith("-") and float(token) == 0.0:
            token = token[1:]
        return token
    if isinstance(value, str):
        token = f'"{value}"'
        if not _STRING_RE.fullmatch(token):
            raise ValueError(f"string GeoCOM cannot carry: {value!r}")
        return token
    raise ValueError(f"no GeoCOM form for {type(value).__name__}: {value!r}")


def _split(tokens: str) -> tuple[str, ...]:
    return tuple(_SPLIT_RE.findall(tokens)) if tokens else ()


def crc16_arc(data: bytes) -> int:
    """CRC-16/ARC (poly 0x8005 reflected, init 0, no final xor; check 0xBB3D for
    ``b"123456789"``)."""
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


_CRC_TABLE = [crc16_arc(bytes([i])) for i in range(256)]


def _crc(data: bytes) -> int:
    crc = 0
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """``%R1Q``: call ``rpc`` with ``params`` (wire tokens).

    Build one from Python values with :meth:`of`. ``trid`` is the transaction id (``None``:
    none sent); ``crc`` whether the line carries (and, decoded, carried a valid) checksum.
    """

    rpc: int
    params: tuple[str, ...] = ()
    trid: int | None = None
    crc: bool = False

    @classmethod
    def of(cls, rpc: int, *values: Any, trid: int | None = None, crc: bool = False) -> Request:
        return cls(int(rpc), tuple(format_value(v) for v in values), trid, crc)


@dataclass(frozen=True, slots=True)
class Reply:
    """``%R1P``: the answer to one request; ``values`` are wire tokens (see ``parse_*``)."""

    com_rc: int
    rc: int
    values: tuple[str, ...] = ()
    trid: int | None = None
    crc: bool = False

    @classmethod
    def of(cls, rc: int, *values: Any, trid: int | None = None, com_rc: int = RC.OK,
           crc: bool = False, precision: int = 15) -> Reply:
        return cls(int(com_rc), int(rc), tuple(format_value(v, precision=precision) for v in values), trid, crc)


def _head(prefix: str, first: int, trid: int | None, crc: int | None) -> str:
    out = f"{prefix},{first}"
    if trid is not None:
        out += f",{trid}"
        if crc is not None:
            out += f",{crc}"
    return out


def encode(record: Request | Reply) -> bytes:
    """The line of ``record``, ``\\r\\n`` included.

    Raises
    ------
    ValueError
        A field out of range (rpc, trid, codes), a token that is not GeoCOM's, a checksum
        asked for without a transaction id, or a line over :data:`MAX_LINE_BYTES`.
    """
    for tok in record.params if isinstance(record, Request) else record.values:
        if not _TOKEN_RE.fullmatch(tok):
            raise ValueError(f"not a GeoCOM token: {tok!r}")
    if record.trid is not None and not 0 <= record.trid <= MAX_TRID:
        raise ValueError(f"transaction id {record.trid} outside 0..{MAX_TRID}")
    if record.crc and record.trid is None:
        raise ValueError("a checksum needs a transaction id")
    if isinstance(record, Request):
        if not 0 <= record.rpc <= 99999:
            raise ValueError(f"rpc {record.rpc} outside 0..99999")
        prefix, first, tail = "%R1Q", record.rpc, ":" + ",".join(record.params)
    else:
        for name, v in (("com rc", record.com_rc), ("rc", record.rc)):
            if not 0 <= v <= 99999:
                raise ValueError(f"{name} {v} outside 0..99999")
        prefix, first = "%R1P", record.com_rc
        tail = f":{record.rc}" + "".join("," + v for v in record.values)
    crc = _crc((_head(prefix, first, record.trid, None) + tail).encode("ascii")) if record.crc else None
    line = (_head(prefix, first, record.trid, crc) + tail + "\r\n").encode("ascii")
    if len(line) > MAX_LINE_BYTES:
        raise ValueError(f"line of {len(line)} bytes exceeds {MAX_LINE_BYTES}")
    return line


class Decoder:
    """Incremental line decoder: feed bytes, read records.

    Parameters
    ----------
    accept : {"replies", "requests"}
        What this side receives: a host reads replies, an instrument requests.

    Notes
    -----
    Memory is bounded: a line in progress never exceeds :data:`MAX_LINE_BYTES`, and the
    rest of an overlong line is dropped until its end.
    """

    def __init__(self, accept: str = "replies") -> None:
        if accept not in ("replies", "requests"):
            raise ValueError(f"accept must be 'replies' or 'requests', got {accept!r}")
        self.accept = accept
        self._line = bytearray()
        self._skipping = False
        self._out: deque[Request | Reply | GeocomProtocolError] = deque()

    def feed(self, data: bytes) -> None:
        """Append bytes from the wire (any split of the stream gives the same results)."""
        data = bytes(data)
        i, n = 0, len(data)
        while i < n:
            nl = data.find(b"\n", i)
            end = n if nl < 0 else nl
            if self._skipping:
                if nl < 0:
                    return
                self._skipping = False
                i = nl + 1
                continue
            room = MAX_LINE_BYTES - len(self._line)
            if end - i + (1 if nl >= 0 else 0) > room:
                self._out.append(GeocomProtocolError(
                    LineFault.OVERLONG, f"no line end within {MAX_LINE_BYTES} bytes",
                    bytes((self._line + data[i : i + room])[:_KEEP]),
                ))
                self._line = bytearray()
                self._skipping = True
                i += room
                continue
            self._line += data[i:end]
            if nl < 0:
                return
            line, self._line = bytes(self._line), bytearray()
            i = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if line.strip(b"\r") == b"":
                continue  # a blank line clears the receiver: not a message
            self._out.append(self._parse(line))

    def read(self) -> Request | Reply | None:
        """The next record, or ``None`` when more bytes are needed.

        Raises
        ------
        GeocomProtocolError
            For each rejected line, in stream order. Call again to go on.
        """
        if not self._out:
            return None
        item = self._out.popleft()
        if isinstance(item, GeocomProtocolError):
            raise item
        return item

    def decode(self, data: bytes = b"") -> list[Request | Reply | GeocomProtocolError]:
        """Feed ``data`` and return every pending record and error, errors as values."""
        if data:
            self.feed(data)
        out = list(self._out)
        self._out.clear()
        return out

    def reset(self) -> None:
        """Forget any partial line and pending output."""
        self.__init__(self.accept)  # type: ignore[misc]

    def _parse(self, line: bytes) -> Request | Reply | GeocomProtocolError:
        raw = line[:_KEEP]
        if any(b < 0x20 or b > 0x7E for b in line):
            return GeocomProtocolError(LineFault.MALFORMED, "non-printable byte in line", raw)
        text = line.decode("ascii")
        if self.accept == "requests":
            m = _REQUEST_RE.fullmatch(text)
            if m is None or not _TOKENS_RE.fullmatch(m.group(4)):
                return GeocomProtocolError(LineFault.MALFORMED, "not %R1Q,rpc[,trid[,crc]]:params", raw)
            first_s, trid_s, crc_s, tail = m.group(1), m.group(2), m.group(3), m.group(4)
            body_tail = ":" + tail
        else:
            m = _REPLY_RE.fullmatch(text)
            if m is None or (m.group(5) is not None and not _TOKENS_RE.fullmatch(m.group(5))):
                return GeocomProtocolError(LineFault.MALFORMED, "not %R1P,com_rc[,trid[,crc]]:rc[,values]", raw)
            first_s, trid_s, crc_s = m.group(1), m.group(2), m.group(3)
            body_tail = ":" + m.group(4) + ("," + m.group(5) if m.group(5) is not None else "")
        first = int(first_s)
        trid = int(trid_s) if trid_s is not None else None
        if trid is not None and trid > MAX_TRID:
            return GeocomProtocolError(LineFault.MALFORMED, f"transaction id {trid} outside 0..{MAX_TRID}", raw)
        if crc_s is not None:
            prefix = "%R1Q" if self.accept == "requests" else "%R1P"
            want = _crc((_head(prefix, first, trid, None) + body_tail).encode("ascii"))
            if int(crc_s) != want:
                return GeocomProtocolError(LineFault.BAD_CRC, f"checksum {crc_s} != computed {want}", raw, trid=trid)
        if self.accept == "requests":
            return Request(first, _split(m.group(4)), trid, crc_s is not None)
        return Reply(first, int(m.group(4)), _split(m.group(5) or ""), trid, crc_s is not None)


# -- angles and coordinates ----------------------------------------------------------------------
#: Longest slope distance accepted (m): beyond any total station's distance meter to a prism.
MAX_SLOPE_DISTANCE_M = 12_000.0


def simple_measurement_problem(hz_rad: float, v_rad: float, slope_m: float) -> tuple[str, str] | None:
    """Why Hz, V and a slope distance are not a face I measurement, or ``None`` if they are.

    Hz is a direction on the horizontal circle, in [0, 2 pi) (2 pi itself is accepted as
    the rounding of a value just below it: the same direction as 0); V the zenith angle in
    face I, [0, pi]. A V in (pi, 2 pi) is a face II reading: refused too, because the
    instrument's collimation and trunnion-axis errors change sign between faces, so a
    station measured in the other face is not comparable with the rest of the run. The
    distance must be finite and at most :data:`MAX_SLOPE_DISTANCE_M` (a distance <= 0 means
    "no distance" and is the caller's to report).

    Returns
    -------
    (field, reason) or None
        ``field`` is ``hz``, ``v`` or ``slope_distance``; ``reason`` a sentence naming the
        value and its range.
    """
    for name, value in (("hz", hz_rad), ("v", v_rad), ("slope_distance", slope_m)):
        if not math.isfinite(value):
            return name, f"{name} {value!r} is not finite"
    if not 0.0 <= hz_rad <= 2 * math.pi:
        return "hz", f"Hz {hz_rad!r} rad is outside the horizontal circle [0, 2 pi)"
    if math.pi < v_rad < 2 * math.pi:
        return "v", f"V {v_rad!r} rad is a face II reading (cellcal measures in face I, V in [0, pi])"
    if not 0.0 <= v_rad <= math.pi:
        return "v", f"V {v_rad!r} rad is outside the vertical circle (face I: [0, pi])"
    if slope_m > MAX_SLOPE_DISTANCE_M:
        return "slope_distance", (f"slope distance {slope_m!r} m is beyond any instrument's range "
                                  f"({MAX_SLOPE_DISTANCE_M:g} m)")
    return None


def cartesian_from_polar(hz_rad: float, v_rad: float, slope_m: float) -> np.ndarray:
    """``(x, y, z)`` metres of the point at Hz ``hz_rad``, zenith angle ``v_rad``, slope
    distance ``slope_m``: ``x = d sin V sin Hz, y = d sin V cos Hz, z = d cos V``."""
    horiz = slope_m * math.sin(v_rad)
    return np.array([horiz * math.sin(hz_rad), horiz * math.cos(hz_rad), slope_m * math.cos(v_rad)])


def polar_from_cartesian(p: Any) -> tuple[float, float, float]:
    """``(Hz in [0, 2 pi), V in [0, pi], slope distance)`` of the point ``p`` (3,), metres."""
    x, y, z = (float(c) for c in np.asarray(p, dtype=float).reshape(3))
    hz = math.atan2(x, y) % (2 * math.pi)
    if hz >= 2 * math.pi:  # -0.0 % 2pi can round to 2pi
        hz = 0.0
    return hz, math.atan2(math.hypot(x, y), z), math.sqrt(x * x + y * y + z * z)


def polar_jacobian(hz_rad: float, v_rad: float, slope_m: float) -> np.ndarray:
    """``d(x, y, z) / d(Hz, V, d)``, shape (3, 3), of :func:`cartesian_from_polar`."""
    sh, ch, sv, cv = math.sin(hz_rad), math.cos(hz_rad), math.sin(v_rad), math.cos(v_rad)
    d = slope_m
    return np.array([
        [d * sv * ch, d * cv * sh, sv * sh],
        [-d * sv * sh, d * cv * ch, sv * ch],
        [0.0, -d * sv, cv],
    ])
