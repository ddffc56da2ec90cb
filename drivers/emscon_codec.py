"""Pure codec of the Leica emScon TPI packets cellcal uses (``docs/protocols/emscon.md``).

Bytes in, typed records out; no I/O, no clocks, so the driver (host side) and the simulated
tracker (device side) share it and it can be fuzzed directly.

Wire format (the protocol document is the authority; this is a reminder). Every integer is
little-endian, 4 bytes; doubles are IEEE 754 little-endian, 8 bytes; structures are packed to
4 bytes, so no field is padded::

    header   int32 lPacketSize (whole packet, header included), uint32 type
    command  header(type 0) + uint32 command id + parameters
    answer   header(type 0) + uint32 command id + uint32 status + values
    error    header(type 1) + uint32 command id + uint32 status
    result   header(type 2 or 9) + uint32 status + measurement fields
    event    header(type 8) + uint32 system status change

TPI has no start marker and no checksum: it relies on TCP for integrity, and a packet is
delimited only by its size. Decoding is incremental (:class:`Decoder` gives the same records
and errors for every split of a stream). A header is *plausible* when its size is a multiple
of 4 in ``[12, MAX_PACKET_BYTES]`` and its type is one emScon defines (0 to 11); a plausible
packet is consumed whole, by its size, whether or not this side decodes it (an unsupported
packet or a wrong size becomes one :class:`TpiProtocolError`, and decoding goes on after it:
the size is what frames a TPI stream). Bytes that do not start a plausible header are
skipped one at a time until one does (one error per run of skipped bytes): that is the only
resynchronisation TPI allows.
"""

from __future__ import annotations

import enum
import math
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from typing import ClassVar

from cellcal.drivers.errors import ProtocolError

__all__ = [
    "DEFAULT_PORT",
    "MAX_PACKET_BYTES",
    "HEADER_BYTES",
    "DataType",
    "Command",
    "Status",
    "LengthUnit",
    "AngleUnit",
    "TemperatureUnit",
    "PressureUnit",
    "HumidityUnit",
    "CoordinateSystem",
    "MeasMode",
    "StatisticMode",
    "TrackerState",
    "TrackerProcessorStatus",
    "LaserStatus",
    "AdmStatus",
    "WeatherMonitorStatus",
    "StatusChange",
    "MeasurementStatusInfo",
    "PacketFault",
    "TpiProtocolError",
    "SimpleCommand",
    "SetUnits",
    "SetCoordinateSystemType",
    "SetMeasurementMode",
    "SetStationaryModeParams",
    "SetStatisticMode",
    "Reply",
    "SystemStatusReply",
    "TrackerStatusReply",
    "UnitsReply",
    "CoordinateSystemTypeReply",
    "MeasurementModeReply",
    "StationaryModeParamsReply",
    "StatisticModeReply",
    "MeasurementStatusInfoReply",
    "ErrorPacket",
    "SingleMeasResult",
    "SingleMeasResult2",
    "SystemStatusChange",
    "Packet",
    "COMMAND_TYPES",
    "ANSWER_TYPES",
    "SIMPLE_COMMANDS",
    "encode",
    "Decoder",
    "MAX_RANGE_M",
    "MIN_RANGE_M",
    "MAX_STD_M",
    "result_problem",
]

#: emScon's TCP port.
DEFAULT_PORT = 700
#: Largest packet accepted (and skipped if not decoded); emScon's own packets for the
#: commands cellcal sends are at most 204 bytes.
MAX_PACKET_BYTES = 65536
#: Header: int32 size, uint32 type.
HEADER_BYTES = 8
_HEADER = struct.Struct("<iI")
_U32 = struct.Struct("<I")
#: Highest ``ES_DataType`` emScon defines.
_MAX_DATA_TYPE = 11
#: How many bytes of a skipped run an error keeps for the log.
_RAW_KEEP = 64


class DataType(enum.IntEnum):
    """``type`` of the packet header (``ES_DataType``)."""

    COMMAND = 0
    ERROR = 1
    SINGLE_MEAS_RESULT = 2
    MULTI_MEAS_RESULT = 3
    STATIONARY_PROBE_MEAS_RESULT = 4
    CONTINUOUS_PROBE_MEAS_RESULT = 5
    NIVEL_RESULT = 6
    REFLECTOR_POS_RESULT = 7
    SYSTEM_STATUS_CHANGE = 8
    SINGLE_MEAS_RESULT2 = 9
    MULTI_MEAS_RESULT2 = 10
    PROBE_POS_RESULT = 11


class Command(enum.IntEnum):
    """The command ids (``ES_Command``) this codec encodes and decodes."""

    EXIT_APPLICATION = 0
    GET_SYSTEM_STATUS = 1
    GET_TRACKER_STATUS = 2
    SET_UNITS = 5
    GET_UNITS = 6
    INITIALIZE = 7
    SET_MEASUREMENT_MODE = 24
    GET_MEASUREMENT_MODE = 25
    SET_COORDINATE_SYSTEM_TYPE = 26
    GET_COORDINATE_SYSTEM_TYPE = 27
    SET_STATIONARY_MODE_PARAMS = 28
    GET_STATIONARY_MODE_PARAMS = 29
    START_MEASUREMENT = 49
    STOP_MEASUREMENT = 52
    SET_STATISTIC_MODE = 80
    GET_STATISTIC_MODE = 81
    GET_MEASUREMENT_STATUS_INFO = 122


#: Highest command id emScon defines; a plausible command packet above it is not TPI.
MAX_COMMAND_ID = 144


class Status(enum.IntEnum):
    """The ``ES_ResultStatus`` values cellcal names (any other value is kept as a number)."""

    ALL_OK = 0
    SERVER_BUSY = 1
    NOT_IMPLEMENTED = 2
    WRONG_PARAMETER = 3
    WRONG_PARAMETER_1 = 4
    WRONG_PARAMETER_2 = 5
    WRONG_PARAMETER_3 = 6
    WRONG_PARAMETER_4 = 7
    WRONG_PARAMETER_5 = 8
    WRONG_PARAMETER_6 = 9
    WRONG_PARAMETER_7 = 10
    PARAMETER_1_OUT_OF_RANGE_OK = 11
    PARAMETER_1_OUT_OF_RANGE_NOK = 12
    PARAMETER_2_OUT_OF_RANGE_OK = 13
    PARAMETER_2_OUT_OF_RANGE_NOK = 14
    PARAMETER_3_OUT_OF_RANGE_OK = 15
    PARAMETER_3_OUT_OF_RANGE_NOK = 16
    PARAMETER_4_OUT_OF_RANGE_OK = 17
    PARAMETER_4_OUT_OF_RANGE_NOK = 18
    PARAMETER_5_OUT_OF_RANGE_OK = 19
    PARAMETER_5_OUT_OF_RANGE_NOK = 20
    PARAMETER_6_OUT_OF_RANGE_OK = 21
    PARAMETER_6_OUT_OF_RANGE_NOK = 22
    USAGE_CONFLICT = 35
    UNKNOWN = 36
    NO_TRACKER_CONNECTED = 38
    TRACKER_NOT_INITIALIZED = 39
    INVALID_INPUT_DATA = 98
    MEASUREMENT_STATUS_NOT_READY = 10004
    NO_STATIONARY_RESULT = 10009
    SENSOR_NOT_LEVELED = 10010
    MULTI_CONNECTIONS_NOT_ALLOWED = 10011
    SENSOR_NOT_WARMED_UP = 10012
    SENSOR_NOT_STABLE = 10013
    SYSTEM_NOT_READY_FOR_MEASUREMENT = 10014


def status_name(status: int) -> str:
    """``Status`` name of ``status`` (``"STATUS_<n>"`` for a value cellcal does not name)."""
    try:
        return Status(status).name
    except ValueError:
        return f"STATUS_{status}"


def is_ok(status: int) -> bool:
    """True for ``ALL_OK`` and for the "parameter out of range, accepted" statuses."""
    return status == Status.ALL_OK or (11 <= status <= 21 and status % 2 == 1)


class LengthUnit(enum.IntEnum):
    METER = 0
    MILLIMETER = 1
    MICRON = 2
    FOOT = 3
    YARD = 4
    INCH = 5


class AngleUnit(enum.IntEnum):
    RADIAN = 0
    DEGREE = 1
    GON = 2


class TemperatureUnit(enum.IntEnum):
    CELSIUS = 0
    FAHRENHEIT = 1


class PressureUnit(enum.IntEnum):
    MBAR = 0
    HPASCAL = 1
    KPASCAL = 2
    MM_HG = 3
    PSI = 4
    IN_H2O = 5
    IN_HG = 6


class HumidityUnit(enum.IntEnum):
    RELATIVE_HUMIDITY = 0


class CoordinateSystem(enum.IntEnum):
    """``ES_CoordinateSystemType``: rectangular right/left-handed, cylindrical, spherical."""

    RHR = 0
    LHRX = 1
    LHRY = 2
    LHRZ = 3
    CCW = 4
    CCC = 5
    SCW = 6
    SCC = 7


class MeasMode(enum.IntEnum):
    """``ES_MeasMode``; cellcal uses stationary only."""

    STATIONARY = 0


class StatisticMode(enum.IntEnum):
    """``ES_StatisticMode``: extended results carry the covariance (type 9)."""

    STANDARD = 0
    EXTENDED = 1


class TrackerState(enum.IntEnum):
    """``ES_TrackerStatus`` (GetTrackerStatus)."""

    NOT_READY = 0
    BUSY = 1
    READY = 2


class TrackerProcessorStatus(enum.IntEnum):
    NO_TP_FOUND = 0
    TP_FOUND = 1
    NB_OPEN = 2
    BOOTED = 3
    COMPENSATION_SET = 4
    INITIALIZED = 5


class LaserStatus(enum.IntEnum):
    LCP_COMM_FAILED = 0
    LCP_NOT_AVAILABLE = 1
    LASER_HEATING_UP = 2
    LASER_READY = 3
    UNABLE_TO_STABILIZE = 4
    LASER_OFF = 5


class AdmStatus(enum.IntEnum):
    NO_ADM = 0
    ADM_COMM_FAILED = 1
    ADM_READY = 2
    ADM_BUSY = 3


class WeatherMonitorStatus(enum.IntEnum):
    NOT_CONNECTED = 0
    READ_ONLY = 1
    READ_AND_CALCULATE_REFRACTIONS = 2


class StatusChange(enum.IntEnum):
    """The ``ES_SystemStatusChange`` events cellcal names (others are kept as numbers)."""

    LASER_WARMED_UP = 1
    UNITS_CHANGED = 6
    COORDINATE_SYSTEM_TYPE_CHANGED = 12
    MEASUREMENT_MODE_CHANGED = 17
    STATIONARY_MODE_PARAMS_CHANGED = 18
    STATISTIC_MODE_CHANGED = 24
    MEAS_STATUS_NOT_READY = 25
    MEAS_STATUS_BUSY = 26
    MEAS_STATUS_READY = 27
    INITIALIZATION_STATUS_CHANGED = 151
    SERVER_CLOSING = 998
    SERVER_STARTED = 999


class MeasurementStatusInfo(enum.IntFlag):
    """Bits of GetMeasurementStatusInfo (``ES_MeasurementStatusInfo``) cellcal reads."""

    TRACKER_FOUND = 1
    TRACKER_COMPENSATION_FOUND = 2
    ADM_FOUND = 4
    ADM_COMPENSATION_FOUND = 8
    REFLECTOR_FOUND = 2048
    IN_FACE_1 = 4096
    INITIALIZED = 65536


class PacketFault(str, enum.Enum):
    """Why bytes were rejected (the ``fault`` of a :class:`TpiProtocolError`)."""

    GARBAGE = "garbage"  # bytes that do not start a plausible header, skipped one by one
    BAD_SIZE = "bad_size"  # plausible header, but not the size this packet must have
    UNSUPPORTED = "unsupported"  # a well-framed packet this side does not decode


class TpiProtocolError(ProtocolError):
    """One rejected packet or run of skipped bytes.

    Attributes
    ----------
    fault : PacketFault
    raw : bytes
        The rejected bytes (at most the first 64 for a skipped run or a long packet).
    packet_type : int or None
        The header's type when the header was plausible.
    command : int or None
        The command id of a plausible type-0 packet (so a device can refuse it by id).
    """

    def __init__(
        self,
        fault: PacketFault,
        message: str,
        raw: bytes = b"",
        *,
        packet_type: int | None = None,
        command: int | None = None,
    ) -> None:
        super().__init__(f"{fault.value}: {message}")
        self.fault = fault
        self.raw = bytes(raw)
        self.packet_type = packet_type
        self.command = command


# -- records ---------------------------------------------------------------------------------
# Each record class names its header type, its command id (type 0 and errors carry one in the
# packet; typed answers imply it) and the struct of every field after the header. The
# dataclass fields are in wire order.


class _Packet:
    TYPE: ClassVar[int]
    COMMAND: ClassVar[int | None] = None  # implied command id (typed commands and answers)
    BODY: ClassVar[struct.Struct]  # every field after the 8-byte header, in order

    @classmethod
    def size(cls) -> int:
        return HEADER_BYTES + cls.BODY.size


def _body(fmt: str) -> struct.Struct:
    return struct.Struct("<" + fmt)


# host -> device


@dataclass(frozen=True, slots=True)
class SimpleCommand(_Packet):
    """A command without parameters (Initialize, StartMeasurement, GetSystemStatus, ...)."""

    command: int
    TYPE: ClassVar[int] = DataType.COMMAND
    BODY: ClassVar[struct.Struct] = _body("I")


@dataclass(frozen=True, slots=True)
class SetUnits(_Packet):
    """SetUnits (5): the units of every value the tracker sends from now on."""

    length_unit: int
    angle_unit: int
    temperature_unit: int
    pressure_unit: int
    humidity_unit: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.SET_UNITS
    BODY: ClassVar[struct.Struct] = _body("I IIIII")


@dataclass(frozen=True, slots=True)
class SetCoordinateSystemType(_Packet):
    """SetCoordinateSystemType (26)."""

    coordinate_system: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.SET_COORDINATE_SYSTEM_TYPE
    BODY: ClassVar[struct.Struct] = _body("I I")


@dataclass(frozen=True, slots=True)
class SetMeasurementMode(_Packet):
    """SetMeasurementMode (24); 0 is stationary."""

    meas_mode: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.SET_MEASUREMENT_MODE
    BODY: ClassVar[struct.Struct] = _body("I I")


@dataclass(frozen=True, slots=True)
class SetStationaryModeParams(_Packet):
    """SetStationaryModeParams (28): measuring time (ms) and whether to use the ADM."""

    meas_time_ms: int
    use_adm: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.SET_STATIONARY_MODE_PARAMS
    BODY: ClassVar[struct.Struct] = _body("I ii")


@dataclass(frozen=True, slots=True)
class SetStatisticMode(_Packet):
    """SetStatisticMode (80): standard or extended results, stationary and continuous."""

    stationary: int
    continuous: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.SET_STATISTIC_MODE
    BODY: ClassVar[struct.Struct] = _body("I II")


# device -> host: answers


@dataclass(frozen=True, slots=True)
class Reply(_Packet):
    """An answer without values (to a set command, Initialize, StartMeasurement, ...), or the
    short answer of any command that failed."""

    command: int
    status: int
    TYPE: ClassVar[int] = DataType.COMMAND
    BODY: ClassVar[struct.Struct] = _body("II")


@dataclass(frozen=True, slots=True)
class SystemStatusReply(_Packet):
    """Answer to GetSystemStatus (1)."""

    status: int
    last_result_status: int
    tracker_processor_status: int
    laser_status: int
    adm_status: int
    es_major: int
    es_minor: int
    es_build: int
    weather_monitor_status: int
    flags: int
    tracker_serial: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_SYSTEM_STATUS
    BODY: ClassVar[struct.Struct] = _body("II IIII iii Iii")


@dataclass(frozen=True, slots=True)
class TrackerStatusReply(_Packet):
    """Answer to GetTrackerStatus (2)."""

    status: int
    tracker_status: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_TRACKER_STATUS
    BODY: ClassVar[struct.Struct] = _body("II I")


@dataclass(frozen=True, slots=True)
class UnitsReply(_Packet):
    """Answer to GetUnits (6)."""

    status: int
    length_unit: int
    angle_unit: int
    temperature_unit: int
    pressure_unit: int
    humidity_unit: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_UNITS
    BODY: ClassVar[struct.Struct] = _body("II IIIII")


@dataclass(frozen=True, slots=True)
class CoordinateSystemTypeReply(_Packet):
    """Answer to GetCoordinateSystemType (27)."""

    status: int
    coordinate_system: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_COORDINATE_SYSTEM_TYPE
    BODY: ClassVar[struct.Struct] = _body("II I")


@dataclass(frozen=True, slots=True)
class MeasurementModeReply(_Packet):
    """Answer to GetMeasurementMode (25)."""

    status: int
    meas_mode: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_MEASUREMENT_MODE
    BODY: ClassVar[struct.Struct] = _body("II I")


@dataclass(frozen=True, slots=True)
class StationaryModeParamsReply(_Packet):
    """Answer to GetStationaryModeParams (29)."""

    status: int
    meas_time_ms: int
    use_adm: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_STATIONARY_MODE_PARAMS
    BODY: ClassVar[struct.Struct] = _body("II ii")


@dataclass(frozen=True, slots=True)
class StatisticModeReply(_Packet):
    """Answer to GetStatisticMode (81)."""

    status: int
    stationary: int
    continuous: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_STATISTIC_MODE
    BODY: ClassVar[struct.Struct] = _body("II II")


@dataclass(frozen=True, slots=True)
class MeasurementStatusInfoReply(_Packet):
    """Answer to GetMeasurementStatusInfo (122): ``info`` is a :class:`MeasurementStatusInfo`."""

    status: int
    last_result_status: int
    info: int
    TYPE: ClassVar[int] = DataType.COMMAND
    COMMAND: ClassVar[int | None] = Command.GET_MEASUREMENT_STATUS_INFO
    BODY: ClassVar[struct.Struct] = _body("II Ii")


# device -> host: unsolicited


@dataclass(frozen=True, slots=True)
class ErrorPacket(_Packet):
    """An error the tracker reports outside any answer (type 1): ``command`` failed later."""

    command: int
    status: int
    TYPE: ClassVar[int] = DataType.ERROR
    BODY: ClassVar[struct.Struct] = _body("II")


@dataclass(frozen=True, slots=True)
class SingleMeasResult(_Packet):
    """A single-point measurement (type 2), in the units and coordinate system set.

    ``x, y, z`` are the point, ``std_*`` its standard deviations, ``pointing_error_*`` and
    ``apriori_std_*`` as the tracker computes them, then the air it used.
    """

    status: int
    meas_mode: int
    try_mode: int
    x: float
    y: float
    z: float
    std_x: float
    std_y: float
    std_z: float
    std_total: float
    pointing_error_1: float
    pointing_error_2: float
    pointing_error_3: float
    apriori_std_x: float
    apriori_std_y: float
    apriori_std_z: float
    apriori_std_total: float
    temperature: float
    pressure: float
    humidity: float
    TYPE: ClassVar[int] = DataType.SINGLE_MEAS_RESULT
    BODY: ClassVar[struct.Struct] = _body("I Ii " + "d" * 17)


@dataclass(frozen=True, slots=True)
class SingleMeasResult2(_Packet):
    """A single-point measurement with covariances (type 9, extended statistic mode)."""

    status: int
    meas_mode: int
    try_mode: int
    x: float
    y: float
    z: float
    std_x: float
    std_y: float
    std_z: float
    std_total: float
    covar_xy: float
    covar_xz: float
    covar_yz: float
    pointing_error_h: float
    pointing_error_v: float
    pointing_error_d: float
    apriori_std_x: float
    apriori_std_y: float
    apriori_std_z: float
    apriori_std_total: float
    apriori_covar_xy: float
    apriori_covar_xz: float
    apriori_covar_yz: float
    temperature: float
    pressure: float
    humidity: float
    TYPE: ClassVar[int] = DataType.SINGLE_MEAS_RESULT2
    BODY: ClassVar[struct.Struct] = _body("I Ii " + "d" * 23)


@dataclass(frozen=True, slots=True)
class SystemStatusChange(_Packet):
    """An event (type 8): ``change`` is a :class:`StatusChange` value (or a newer one)."""

    change: int
    TYPE: ClassVar[int] = DataType.SYSTEM_STATUS_CHANGE
    BODY: ClassVar[struct.Struct] = _body("I")


Packet = (
    SimpleCommand | SetUnits | SetCoordinateSystemType | SetMeasurementMode | SetStationaryModeParams
    | SetStatisticMode | Reply | SystemStatusReply | TrackerStatusReply | UnitsReply
    | CoordinateSystemTypeReply | MeasurementModeReply | StationaryModeParamsReply | StatisticModeReply
    | MeasurementStatusInfoReply | ErrorPacket | SingleMeasResult | SingleMeasResult2 | SystemStatusChange
)

#: Commands that take no parameters (encoded as :class:`SimpleCommand`).
SIMPLE_COMMANDS: frozenset[int] = frozenset({
    Command.EXIT_APPLICATION, Command.GET_SYSTEM_STATUS, Command.GET_TRACKER_STATUS, Command.GET_UNITS,
    Command.INITIALIZE, Command.GET_MEASUREMENT_MODE, Command.GET_COORDINATE_SYSTEM_TYPE,
    Command.GET_STATIONARY_MODE_PARAMS, Command.START_MEASUREMENT, Command.STOP_MEASUREMENT,
    Command.GET_STATISTIC_MODE, Command.GET_MEASUREMENT_STATUS_INFO,
})
_TYPED_COMMANDS = (SetUnits, SetCoordinateSystemType, SetMeasurementMode, SetStationaryModeParams, SetStatisticMode)
_TYPED_ANSWERS = (
    SystemStatusReply, TrackerStatusReply, UnitsReply, CoordinateSystemTypeReply, MeasurementModeReply,
    StationaryModeParamsReply, StatisticModeReply, MeasurementStatusInfoReply,
)
#: What a device accepts.
COMMAND_TYPES: tuple[type[_Packet], ...] = (SimpleCommand, *_TYPED_COMMANDS)
#: What a host accepts.
ANSWER_TYPES: tuple[type[_Packet], ...] = (
    Reply, *_TYPED_ANSWERS, ErrorPacket, SingleMeasResult, SingleMeasResult2, SystemStatusChange,
)


#: Farthest reflector accepted (m from the tracker): beyond the largest measuring volume a
#: laser tracker has (a few hundred metres across).
MAX_RANGE_M = 300.0
#: Nearest reflector accepted (m): closer, it would touch the tracker's head (a zero-filled
#: result reads as the origin).
MIN_RANGE_M = 0.1
#: Largest std accepted for a coordinate (m): an averaged point this uncertain is garbage.
MAX_STD_M = 1.0


def result_problem(rec: SingleMeasResult | SingleMeasResult2) -> tuple[str, str] | None:
    """Why a measurement result's point or std is not one a tracker can report, or ``None``.

    The point (in the tracker's own frame: cellcal sets no transformation) must be finite,
    at least :data:`MIN_RANGE_M` and at most :data:`MAX_RANGE_M` from the tracker; each std
    (``std_x``, ``std_y``, ``std_z``, ``std_total``) finite, >= 0 and at most
    :data:`MAX_STD_M`. Values are metres: the driver sets metres at open.

    Returns
    -------
    (field, reason) or None
    """
    p = (rec.x, rec.y, rec.z)
    if not all(math.isfinite(c) for c in p):
        return "position", f"position {p} is not finite"
    r = math.sqrt(sum(c * c for c in p))
    if not MIN_RANGE_M <= r <= MAX_RANGE_M:
        return "position", (f"position {p} is {r:.6g} m from the tracker, outside [{MIN_RANGE_M:g}, "
                            f"{MAX_RANGE_M:g}] m")
    for name in ("std_x", "std_y", "std_z", "std_total"):
        s = getattr(rec, name)
        if not (math.isfinite(s) and 0.0 <= s <= MAX_STD_M):
            return name, f"{name} {s!r} m is outside [0, {MAX_STD_M:g}] m"
    return None


def encode(packet: Packet) -> bytes:
    """The bytes of ``packet``, header included.

    Raises
    ------
    ValueError
        A field that does not fit its wire type (negative or too large an integer), or a
        :class:`SimpleCommand` whose command takes parameters.
    """
    if isinstance(packet, SimpleCommand) and packet.command not in SIMPLE_COMMANDS:
        raise ValueError(f"command {packet.command} takes parameters; use its own record")
    values = astuple(packet)
    if packet.COMMAND is not None:
        values = (packet.COMMAND, *values)
    try:
        body = packet.BODY.pack(*values)
    except struct.error as exc:
        raise ValueError(f"{type(packet).__name__}: {exc}") from None
    return _HEADER.pack(HEADER_BYTES + len(body), packet.TYPE) + body


class Decoder:
    """Incremental decoder: feed bytes, read records.

    Parameters
    ----------
    accept : {"answers", "commands"}
        ``"answers"`` for a host (:data:`ANSWER_TYPES`), ``"commands"`` for a device
        (:data:`COMMAND_TYPES`).

    Notes
    -----
    Memory is bounded: a packet in progress never exceeds :data:`MAX_PACKET_BYTES`, and a
    skipped run is counted, not stored (its first 64 bytes are kept for the error).
    """

    def __init__(self, accept: str = "answers") -> None:
        if accept not in ("answers", "commands"):
            raise ValueError(f"accept must be 'answers' or 'commands', got {accept!r}")
        self.accept = accept
        self._buf = bytearray()
        self._skipped = 0
        self._skipped_head = bytearray()
        self._out: deque[Packet | TpiProtocolError] = deque()
        # size -> class, per command id (type 0) and per type (others)
        self._by_command: dict[int, type[_Packet]] = {}
        self._by_type: dict[int, type[_Packet]] = {}
        classes: Iterable[type[_Packet]] = ANSWER_TYPES if accept == "answers" else COMMAND_TYPES
        for cls in classes:
            if cls.TYPE != DataType.COMMAND:
                self._by_type[cls.TYPE] = cls
            elif cls.COMMAND is not None:
                self._by_command[cls.COMMAND] = cls

    def feed(self, data: bytes) -> None:
        """Append bytes from the wire (any split of the stream gives the same results)."""
        self._buf += data
        buf = self._buf
        i = 0
        n = len(buf)
        while n - i >= HEADER_BYTES:
            size, ptype = _HEADER.unpack_from(buf, i)
            if not (size % 4 == 0 and 12 <= size <= MAX_PACKET_BYTES and ptype <= _MAX_DATA_TYPE):
                if len(self._skipped_head) < _RAW_KEEP:
                    self._skipped_head.append(buf[i])
                self._skipped += 1
                i += 1
                continue
            if n - i < size:
                break  # a plausible packet, not complete yet
            self._flush_skipped()
            self._out.append(self._parse(bytes(buf[i : i + size]), ptype))
            i += size
        del buf[:i]

    def read(self) -> Packet | None:
        """The next decoded record, or ``None`` when more bytes are needed.

        Raises
        ------
        TpiProtocolError
            For each rejected packet or skipped run, in stream order. Call again to go on.
        """
        if not self._out:
            return None
        item = self._out.popleft()
        if isinstance(item, TpiProtocolError):
            raise item
        return item

    def decode(self, data: bytes = b"") -> list[Packet | TpiProtocolError]:
        """Feed ``data`` and return every pending record and error, errors as values."""
        if data:
            self.feed(data)
        out = list(self._out)
        self._out.clear()
        return out

    def flush(self) -> list[TpiProtocolError]:
        """Report skipped bytes not yet followed by a packet (the end of a stream)."""
        self._flush_skipped()
        out = [x for x in self._out if isinstance(x, TpiProtocolError)]
        self._out = deque(x for x in self._out if not isinstance(x, TpiProtocolError))
        return out

    @property
    def buffered(self) -> int:
        """Bytes held for a packet not complete yet."""
        return len(self._buf)

    def reset(self) -> None:
        """Forget any partial packet and pending output (after a reconnect)."""
        self.__init__(self.accept)  # type: ignore[misc]

    # -- internals --------------------------------------------------------------------------
    def _flush_skipped(self) -> None:
        if self._skipped:
            self._out.append(TpiProtocolError(
                PacketFault.GARBAGE, f"{self._skipped} byte(s) skipped: no plausible header",
                bytes(self._skipped_head),
            ))
            self._skipped = 0
            self._skipped_head = bytearray()

    def _parse(self, pkt: bytes, ptype: int) -> Packet | TpiProtocolError:
        size = len(pkt)
        keep = pkt[: _RAW_KEEP * 4]
        if ptype == DataType.COMMAND:
            (command,) = _U32.unpack_from(pkt, HEADER_BYTES)
            if command > MAX_COMMAND_ID:
                return TpiProtocolError(PacketFault.UNSUPPORTED, f"command id {command} is not emScon's",
                                        keep, packet_type=ptype, command=command)
            typed = self._by_command.get(command)
            if self.accept == "commands":
                if typed is None and command in SIMPLE_COMMANDS:
                    typed = SimpleCommand
                if typed is None:
                    return TpiProtocolError(PacketFault.UNSUPPORTED, f"command {command} not implemented",
                                            keep, packet_type=ptype, command=command)
                return self._unpack(typed, pkt, ptype, command)
            # answers: the typed answer at its size; a bare answer of 16 bytes for commands
            # without values, or for a failed command of any kind
            if typed is not None and size == typed.size():
                return self._unpack(typed, pkt, ptype, command)
            if size == Reply.size():
                rec = self._unpack(Reply, pkt, ptype, command)
                if typed is not None and isinstance(rec, Reply) and is_ok(rec.status):
                    return TpiProtocolError(
                        PacketFault.BAD_SIZE, f"answer to command {command} without its values", keep,
                        packet_type=ptype, command=command,
                    )
                return rec
            if typed is None and command not in SIMPLE_COMMANDS:
                return TpiProtocolError(PacketFault.UNSUPPORTED, f"answer to command {command} not decoded",
                                        keep, packet_type=ptype, command=command)
            want = typed.size() if typed is not None else Reply.size()
            return TpiProtocolError(PacketFault.BAD_SIZE, f"answer to command {command}: {size} bytes, "
                                    f"expected {want}", keep, packet_type=ptype, command=command)
        cls = self._by_type.get(ptype)
        if cls is None:
            return TpiProtocolError(PacketFault.UNSUPPORTED, f"packet type {ptype} not decoded here", keep,
                                    packet_type=ptype)
        if size != cls.size():
            return TpiProtocolError(PacketFault.BAD_SIZE, f"type {ptype}: {size} bytes, expected {cls.size()}",
                                    keep, packet_type=ptype)
        return self._unpack(cls, pkt, ptype, None)

    @staticmethod
    def _unpack(cls: type[_Packet], pkt: bytes, ptype: int, command: int | None) -> Packet | TpiProtocolError:
        if len(pkt) != cls.size():
            return TpiProtocolError(PacketFault.BAD_SIZE, f"command {command}: {len(pkt)} bytes, "
                                    f"expected {cls.size()}", pkt[: _RAW_KEEP * 4], packet_type=ptype,
                                    command=command)
        values = cls.BODY.unpack_from(pkt, HEADER_BYTES)
        if cls.COMMAND is not None:
            values = values[1:]  # the implied command id
        return cls(*values)  # type: ignore[return-value]
