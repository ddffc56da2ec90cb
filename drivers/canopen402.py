"""Six CiA 402 joint drives over CANopen (the ``canopen`` package on python-can).

``canopen://<channel>?interface=socketcan&nodes=1-6&model=ur5e[&...]``

What the driver does (``docs/protocols/robot.md`` has every key and object):

* **Open**: connect the bus; wait for each node's heartbeat (a node that never beats is
  a :class:`~cellcal.drivers.errors.DriverInitError` naming it); NMT pre-operational;
  configure TPDO1 of every drive by SDO to carry position actual value ``0x6064`` and
  statusword ``0x6041``, transmission type 1 (synchronous, every SYNC); optionally write
  the heartbeat time ``0x1017`` and the position window ``0x6067`` / ``0x6068``; NMT start.
* **Sampling**: a thread sends SYNC every ``sync_period_ms`` and stamps it with
  ``time.monotonic_ns()`` just before sending; the six TPDOs answering one SYNC form one
  coherent joint vector sampled at that instant. If the TPDOs do not come (``pdo=auto``),
  the driver falls back to SDO reads of ``0x6064``/``0x6041`` (not coherent: the joints
  are read one after another; ``RobotState.t_host_ns`` is the middle of the reads).
* **Clock**: drives carry no clock in their PDOs; the sample instant *is* the SYNC, which
  the host stamps. ``t_device_s`` is that stamp in seconds and ``t_host_ns`` the same in
  ns. A :class:`~cellcal.drivers.clock.StreamClockModel` fed with (SYNC stamp, arrival of
  the cycle's last TPDO) measures the bus latency (:attr:`Cia402Driver.bus_latency_ns`).
* **Counts to radians** per joint with :class:`~cellcal.drivers.kinematics.JointScaling`,
  then standard-DH forward kinematics to ``base_T_flange``; joint speeds are the slope of
  a line fitted to the last ``velocity_window`` samples.
* **Heartbeat supervision**: a node silent for ``heartbeat_timeout_factor`` (default 2)
  heartbeat periods makes :meth:`read_state` raise :class:`HeartbeatLost` (so within 3
  periods of going silent); a boot-up message after open (the drive rebooted and lost its
  configuration) raises :class:`NodeRebooted`.
* **Moves** (profile position, mode 1): enable each drive through the CiA 402 state
  machine (fault reset, shutdown, switch on, enable operation), set the profile velocity
  ``0x6081`` so all joints arrive together, write the target ``0x607A`` and toggle the
  controlword's new-set-point bit (with change-set-immediately), check the set-point
  acknowledge, then wait for *target reached* (statusword bit 10, which the drive sets when
  within ``0x6067`` counts for ``0x6068`` ms) on every drive.
* **Errors**: SDO aborts raise :class:`SdoAbortError` carrying the 32-bit abort code;
  quick stop active raises :class:`~cellcal.drivers.robot.ProtectiveStop`; a drive in
  FAULT a :class:`~cellcal.drivers.errors.DeviceError`.
"""

from __future__ import annotations

import enum
import logging
import math
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from cellcal.drivers.clock import StreamClockModel
from cellcal.drivers.errors import (
    DeviceError,
    DeviceGoneError,
    DriverInitError,
    DriverTimeoutError,
)
from cellcal.drivers.kinematics import DHModel, JointScaling, UnreachablePose, dh_model, dh_model_from_table
from cellcal.drivers.robot import (
    N_JOINTS,
    OptionSpec,
    ProtectiveStop,
    RobotDriver,
    RobotMode,
    RobotState,
    RobotUrl,
    merge_options,
    opt_bool,
    opt_float,
    opt_int,
    opt_str,
    opt_vector,
)

__all__ = [
    "Cia402Driver",
    "SdoAbortError",
    "HeartbeatLost",
    "NodeRebooted",
    "Od",
    "Statusword",
    "Controlword",
    "Cia402State",
    "NmtState",
    "NmtCommand",
    "cia402_state",
    "build_object_dictionary",
    "parse_nodes",
    "SYNC_COB_ID",
    "TPDO1_COB_BASE",
    "HEARTBEAT_COB_BASE",
    "SDO_ABORT_CODES",
]

log = logging.getLogger(__name__)

SYNC_COB_ID = 0x080
TPDO1_COB_BASE = 0x180
HEARTBEAT_COB_BASE = 0x700
PDO_NOT_VALID = 1 << 31
TRANSMISSION_SYNC_EVERY = 1  # TPDO transmission type: synchronous, every SYNC
_TPDO1 = struct.Struct("<iH")  # position actual value (INT32), statusword (UINT16)


class Od(enum.IntEnum):
    """Object dictionary indices used (CiA 301 communication, CiA 402 drive profile)."""

    DEVICE_TYPE = 0x1000
    ERROR_REGISTER = 0x1001
    PRODUCER_HEARTBEAT_TIME = 0x1017
    IDENTITY = 0x1018
    TPDO1_COMMUNICATION = 0x1800
    TPDO1_MAPPING = 0x1A00
    CONTROLWORD = 0x6040
    STATUSWORD = 0x6041
    MODES_OF_OPERATION = 0x6060
    MODES_OF_OPERATION_DISPLAY = 0x6061
    POSITION_ACTUAL_VALUE = 0x6064
    POSITION_WINDOW = 0x6067
    POSITION_WINDOW_TIME = 0x6068
    VELOCITY_ACTUAL_VALUE = 0x606C
    TARGET_POSITION = 0x607A
    PROFILE_VELOCITY = 0x6081
    PROFILE_ACCELERATION = 0x6083
    PROFILE_DECELERATION = 0x6084


class Statusword(enum.IntFlag):
    """CiA 402 statusword (0x6041) bits."""

    READY_TO_SWITCH_ON = 1 << 0
    SWITCHED_ON = 1 << 1
    OPERATION_ENABLED = 1 << 2
    FAULT = 1 << 3
    VOLTAGE_ENABLED = 1 << 4
    QUICK_STOP = 1 << 5  # active low: 0 = quick stop in progress
    SWITCH_ON_DISABLED = 1 << 6
    WARNING = 1 << 7
    REMOTE = 1 << 9
    TARGET_REACHED = 1 << 10
    INTERNAL_LIMIT_ACTIVE = 1 << 11
    SET_POINT_ACKNOWLEDGE = 1 << 12
    FOLLOWING_ERROR = 1 << 13


class Controlword(enum.IntFlag):
    """CiA 402 controlword (0x6040) bits."""

    SWITCH_ON = 1 << 0
    ENABLE_VOLTAGE = 1 << 1
    QUICK_STOP = 1 << 2  # active low
    ENABLE_OPERATION = 1 << 3
    NEW_SET_POINT = 1 << 4
    CHANGE_SET_IMMEDIATELY = 1 << 5
    ABS_REL = 1 << 6
    FAULT_RESET = 1 << 7
    HALT = 1 << 8


# device control commands (controlword values)
CW_SHUTDOWN = Controlword.QUICK_STOP | Controlword.ENABLE_VOLTAGE  # 0x06
CW_SWITCH_ON = CW_SHUTDOWN | Controlword.SWITCH_ON  # 0x07
CW_ENABLE_OPERATION = CW_SWITCH_ON | Controlword.ENABLE_OPERATION  # 0x0F
CW_DISABLE_VOLTAGE = Controlword(0)  # 0x00
CW_QUICK_STOP = Controlword.ENABLE_VOLTAGE  # 0x02
CW_FAULT_RESET = Controlword.FAULT_RESET  # 0x80


class Cia402State(enum.Enum):
    """CiA 402 power state machine states (from the statusword)."""

    NOT_READY_TO_SWITCH_ON = "not ready to switch on"
    SWITCH_ON_DISABLED = "switch on disabled"
    READY_TO_SWITCH_ON = "ready to switch on"
    SWITCHED_ON = "switched on"
    OPERATION_ENABLED = "operation enabled"
    QUICK_STOP_ACTIVE = "quick stop active"
    FAULT_REACTION_ACTIVE = "fault reaction active"
    FAULT = "fault"


# (mask, value, state), checked in order (CiA 402 table of statusword patterns)
_STATE_PATTERNS = (
    (0x4F, 0x00, Cia402State.NOT_READY_TO_SWITCH_ON),
    (0x4F, 0x40, Cia402State.SWITCH_ON_DISABLED),
    (0x6F, 0x21, Cia402State.READY_TO_SWITCH_ON),
    (0x6F, 0x23, Cia402State.SWITCHED_ON),
    (0x6F, 0x27, Cia402State.OPERATION_ENABLED),
    (0x6F, 0x07, Cia402State.QUICK_STOP_ACTIVE),
    (0x4F, 0x0F, Cia402State.FAULT_REACTION_ACTIVE),
    (0x4F, 0x08, Cia402State.FAULT),
)


def cia402_state(statusword: int) -> Cia402State | None:
    """The power state a statusword shows (``None`` for a pattern outside the table)."""
    for mask, value, state in _STATE_PATTERNS:
        if statusword & mask == value:
            return state
    return None


class NmtState(enum.IntEnum):
    """NMT states as heartbeats report them."""

    BOOT_UP = 0x00
    STOPPED = 0x04
    OPERATIONAL = 0x05
    PRE_OPERATIONAL = 0x7F


class NmtCommand(enum.IntEnum):
    """NMT command specifiers (COB-ID 0x000)."""

    START = 0x01
    STOP = 0x02
    ENTER_PRE_OPERATIONAL = 0x80
    RESET_NODE = 0x81
    RESET_COMMUNICATION = 0x82


MODE_PROFILE_POSITION = 1

#: CiA 301 SDO abort codes by value (the names in error messages).
SDO_ABORT_CODES: Mapping[int, str] = {
    0x05030000: "toggle bit not alternated",
    0x05040000: "SDO protocol timed out",
    0x05040001: "command specifier not valid or unknown",
    0x06010000: "unsupported access to an object",
    0x06010001: "attempt to read a write only object",
    0x06010002: "attempt to write a read only object",
    0x06020000: "object does not exist in the object dictionary",
    0x06040041: "object cannot be mapped to the PDO",
    0x06040042: "number and length of objects to be mapped exceeds PDO length",
    0x06060000: "access failed due to a hardware error",
    0x06070010: "data type does not match, length of service parameter does not match",
    0x06090011: "sub-index does not exist",
    0x06090030: "invalid value for parameter",
    0x060A0023: "resource not available",
    0x08000000: "general error",
    0x08000020: "data cannot be transferred or stored to the application",
    0x08000021: "data cannot be transferred or stored because of local control",
    0x08000022: "data cannot be transferred or stored because of the present device state",
}


class SdoAbortError(DeviceError):
    """A drive aborted an SDO transfer.

    Attributes
    ----------
    abort_code : int
        The CiA 301 32-bit abort code (e.g. ``0x06020000``: object does not exist).
    node_id, index, subindex : int
        Where.
    """

    def __init__(self, node_id: int, index: int, subindex: int, abort_code: int, op: str) -> None:
        self.abort_code = int(abort_code)
        self.node_id = node_id
        self.index = index
        self.subindex = subindex
        text = SDO_ABORT_CODES.get(self.abort_code, "unknown abort code")
        super().__init__(
            f"node {node_id}: SDO {op} 0x{index:04X}:{subindex:02X} aborted with 0x{self.abort_code:08X} ({text})",
            code=f"0x{self.abort_code:08X}",
        )


class HeartbeatLost(DeviceGoneError):
    """A drive's heartbeat stopped (node ``node_id``, silent for ``silent_s``)."""

    def __init__(self, node_id: int, silent_s: float, period_s: float) -> None:
        self.node_id = node_id
        self.silent_s = silent_s
        super().__init__(
            f"node {node_id}: no heartbeat for {silent_s * 1e3:.0f} ms "
            f"(period {period_s * 1e3:.0f} ms)"
        )


class NodeRebooted(DeviceGoneError):
    """A drive sent a boot-up message after the driver configured it."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        super().__init__(f"node {node_id}: rebooted (boot-up message); reopen the driver")


# -- object dictionary ----------------------------------------------------------------------
def build_object_dictionary() -> Any:
    """The object dictionary of one of our CiA 402 joint drives (master and simulator).

    Only the objects this driver uses; a real drive's EDS is a superset of it.
    """
    from canopen import objectdictionary as odm

    od = odm.ObjectDictionary()

    def var(name: str, index: int, dtype: int, access: str, default: Any = None, sub: int = 0):
        v = odm.ODVariable(name, index, sub)
        v.data_type = dtype
        v.access_type = access
        v.default = default
        v.pdo_mappable = index >= 0x6000
        return v

    od.add_object(var("Device type", Od.DEVICE_TYPE, odm.UNSIGNED32, "ro", 0x00020192))
    od.add_object(var("Error register", Od.ERROR_REGISTER, odm.UNSIGNED8, "ro", 0))
    od.add_object(var("Producer heartbeat time", Od.PRODUCER_HEARTBEAT_TIME, odm.UNSIGNED16, "rw", 0))
    ident = odm.ODRecord("Identity object", Od.IDENTITY)
    ident.add_member(var("Number of entries", Od.IDENTITY, odm.UNSIGNED8, "ro", 4, 0))
    for sub, name in enumerate(("Vendor-ID", "Product code", "Revision number", "Serial number"), 1):
        ident.add_member(var(name, Od.IDENTITY, odm.UNSIGNED32, "ro", 0, sub))
    od.add_object(ident)
    com = odm.ODRecord("Transmit PDO 1 communication parameter", Od.TPDO1_COMMUNICATION)
    com.add_member(var("Highest sub-index supported", Od.TPDO1_COMMUNICATION, odm.UNSIGNED8, "const", 6, 0))
    com.add_member(var("COB-ID", Od.TPDO1_COMMUNICATION, odm.UNSIGNED32, "rw", PDO_NOT_VALID, 1))
    com.add_member(var("Transmission type", Od.TPDO1_COMMUNICATION, odm.UNSIGNED8, "rw", 0xFF, 2))
    com.add_member(var("Inhibit time", Od.TPDO1_COMMUNICATION, odm.UNSIGNED16, "rw", 0, 3))
    com.add_member(var("Event timer", Od.TPDO1_COMMUNICATION, odm.UNSIGNED16, "rw", 0, 5))
    com.add_member(var("SYNC start value", Od.TPDO1_COMMUNICATION, odm.UNSIGNED8, "rw", 0, 6))
    od.add_object(com)
    mapping = odm.ODRecord("Transmit PDO 1 mapping parameter", Od.TPDO1_MAPPING)
    mapping.add_member(var("Number of mapped objects", Od.TPDO1_MAPPING, odm.UNSIGNED8, "rw", 0, 0))
    for sub in range(1, 9):
        mapping.add_member(var(f"Mapped object {sub}", Od.TPDO1_MAPPING, odm.UNSIGNED32, "rw", 0, sub))
    od.add_object(mapping)
    od.add_object(var("Controlword", Od.CONTROLWORD, odm.UNSIGNED16, "rw", 0))
    od.add_object(var("Statusword", Od.STATUSWORD, odm.UNSIGNED16, "ro", 0))
    od.add_object(var("Modes of operation", Od.MODES_OF_OPERATION, odm.INTEGER8, "rw", 0))
    od.add_object(var("Modes of operation display", Od.MODES_OF_OPERATION_DISPLAY, odm.INTEGER8, "ro", 0))
    od.add_object(var("Position actual value", Od.POSITION_ACTUAL_VALUE, odm.INTEGER32, "ro", 0))
    od.add_object(var("Position window", Od.POSITION_WINDOW, odm.UNSIGNED32, "rw", 100))
    od.add_object(var("Position window time", Od.POSITION_WINDOW_TIME, odm.UNSIGNED16, "rw", 10))
    od.add_object(var("Velocity actual value", Od.VELOCITY_ACTUAL_VALUE, odm.INTEGER32, "ro", 0))
    od.add_object(var("Target position", Od.TARGET_POSITION, odm.INTEGER32, "rw", 0))
    od.add_object(var("Profile velocity", Od.PROFILE_VELOCITY, odm.UNSIGNED32, "rw", 100000))
    od.add_object(var("Profile acceleration", Od.PROFILE_ACCELERATION, odm.UNSIGNED32, "rw", 1000000))
    od.add_object(var("Profile deceleration", Od.PROFILE_DECELERATION, odm.UNSIGNED32, "rw", 1000000))
    return od


def parse_nodes(text: Any) -> tuple[int, ...]:
    """``"1-6"``, ``"11,12,13,14,15,16"`` or a sequence: node ids in joint order (1..127)."""
    if isinstance(text, str):
        ids: list[int] = []
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                if b < a:
                    raise ValueError(f"node range {part!r} runs backwards")
                ids.extend(range(a, b + 1))
            elif part:
                ids.append(int(part))
    else:
        ids = [int(x) for x in text]
    if len(ids) != N_JOINTS or len(set(ids)) != N_JOINTS or not all(1 <= i <= 127 for i in ids):
        raise ValueError(f"expected {N_JOINTS} distinct node ids in 1..127, got {ids}")
    return tuple(ids)


def _opt_pdo(v: Any) -> str:
    s = str(v).lower()
    if s in ("true", "1", "on"):
        return "on"
    if s in ("false", "0", "off"):
        return "off"
    if s != "auto":
        raise ValueError("expected auto, on or off")
    return s


def _opt_enable(v: Any) -> str:
    if v not in ("on_move", "open", "never"):
        raise ValueError("expected on_move, open or never")
    return v


def _opt_model(v: Any) -> DHModel:
    if isinstance(v, DHModel):
        return v
    if isinstance(v, Mapping):
        return dh_model_from_table(v, "dh")
    return dh_model(opt_str(v))


OPTIONS: dict[str, OptionSpec] = {
    "interface": OptionSpec(opt_str, "socketcan", "python-can interface"),
    "bitrate": OptionSpec(opt_int(0, 8_000_000), 0, "bus bitrate (0: the interface's)"),
    "nodes": OptionSpec(parse_nodes, (1, 2, 3, 4, 5, 6), "node ids in joint order"),
    "model": OptionSpec(_opt_model, dh_model("ur5e"), "DH model name, or a DHModel / dh table"),
    "counts_per_rev": OptionSpec(opt_vector(N_JOINTS, positive=True), np.full(N_JOINTS, 2.0**20), ""),
    "gear_ratio": OptionSpec(opt_vector(N_JOINTS, positive=True), np.ones(N_JOINTS), ""),
    "sign": OptionSpec(opt_vector(N_JOINTS), np.ones(N_JOINTS), "+1/-1 per joint"),
    "offset_counts": OptionSpec(opt_vector(N_JOINTS), np.zeros(N_JOINTS), "counts at q = 0"),
    "heartbeat_ms": OptionSpec(opt_int(0, 65535), 0, "write 0x1017 (0: use the drives' value)"),
    "heartbeat_timeout_factor": OptionSpec(opt_float(1.0, 2.9), 2.0, "silent periods = lost"),
    "sync_period_ms": OptionSpec(opt_float(1.0, 1000.0), 10.0, "SYNC period (ms)"),
    "pdo": OptionSpec(_opt_pdo, "auto", "auto: SDO fallback if TPDOs fail; on; off"),
    "sdo_timeout_s": OptionSpec(opt_float(positive=True), 0.3, "per SDO response"),
    "position_window_counts": OptionSpec(opt_int(-1, 2**32 - 1), -1, "write 0x6067 (-1: keep)"),
    "position_window_time_ms": OptionSpec(opt_int(-1, 65535), -1, "write 0x6068 (-1: keep)"),
    "max_joint_speed_rad_s": OptionSpec(opt_float(positive=True), 1.05, "profile velocity at speed=1"),
    "max_joint_accel_rad_s2": OptionSpec(opt_float(positive=True), 1.4, "profile acceleration"),
    "enable": OptionSpec(_opt_enable, "on_move", "when to enable the drives"),
    "velocity_window": OptionSpec(opt_int(2, 100), 10, "samples in the joint-speed fit"),
    "moving_threshold_rad_s": OptionSpec(opt_float(positive=True), 0.005, "max|qd| above = moving"),
    "timeout_s": OptionSpec(opt_float(positive=True), 1.0, "read_state timeout"),
    "max_age_s": OptionSpec(opt_float(positive=True), 0.1, "newest sample accepted if this fresh"),
    "move_timeout_s": OptionSpec(opt_float(positive=True), 120.0, "move_to(wait=True) timeout"),
    "boot_timeout_s": OptionSpec(opt_float(positive=True), 3.0, "wait for first heartbeats"),
    "receive_own_messages": OptionSpec(opt_bool, False, "python-can bus option"),
}


class _Cycle:
    __slots__ = ("stamp_ns", "got", "last_recv_ns")

    def __init__(self, stamp_ns: int) -> None:
        self.stamp_ns = stamp_ns
        self.got: dict[int, tuple[int, int]] = {}
        self.last_recv_ns = 0


class Cia402Driver(RobotDriver):
    """CiA 402 backend; build with :func:`~cellcal.drivers.robot.connect_robot`.

    Parameters
    ----------
    channel : str
        python-can channel (``can0``, a ``virtual`` channel name, a multicast group).
    **options
        See :data:`OPTIONS` / ``docs/protocols/robot.md``.
    """

    scheme = "canopen"

    def __init__(self, channel: str, **options: Any) -> None:
        opts = merge_options(OPTIONS, {}, options, "canopen")
        super().__init__(
            model=opts["model"],
            timeout_s=opts["timeout_s"],
            max_age_s=opts["max_age_s"],
            move_timeout_s=opts["move_timeout_s"],
        )
        if self.model.n_joints != N_JOINTS:
            raise ValueError(f"canopen: model has {self.model.n_joints} joints, expected {N_JOINTS}")
        self.channel = channel
        self.opts = opts
        self.nodes: tuple[int, ...] = opts["nodes"]
        self.scaling = JointScaling(
            opts["counts_per_rev"], opts["gear_ratio"], opts["sign"], opts["offset_counts"]
        )
        # SYNC stamp and TPDO arrival are both host monotonic_ns, so the rate is 1 by
        # construction and the model must never fit one (infinite span): a fitted rate let
        # load-jittered arrivals tilt the envelope until the bus latency came out negative.
        self.clock = StreamClockModel(window=256, min_skew_span_s=math.inf)
        self._last_clock_feed_ns = 0
        self.network: Any = None
        self._remote: dict[int, Any] = {}
        self._lock = threading.Condition()
        self._cycle: _Cycle | None = None
        self._latest: RobotState | None = None
        self._history: deque[tuple[float, np.ndarray]] = deque(maxlen=opts["velocity_window"])
        self._hb_ns: dict[int, int] = {}
        self._nmt: dict[int, int] = {}
        self._rebooted: set[int] = set()
        self._hb_period_s = 0.0
        self._configured = False
        self._use_pdo = opts["pdo"] != "off"
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self.incomplete_cycles = 0
        self.bad_frames = 0
        self._statuswords = np.zeros(N_JOINTS, dtype=np.int64)
        self._halted = False

    @classmethod
    def from_url(cls, url: RobotUrl, options: Mapping[str, Any]) -> Cia402Driver:
        channel = url.target
        if channel.startswith("[") and channel.endswith("]"):
            channel = channel[1:-1]
        opts = merge_options(OPTIONS, url.query, options, f"canopen://{url.target}")
        return cls(channel, **opts)

    def __repr__(self) -> str:
        return f"Cia402Driver(canopen://{self.channel}?interface={self.opts['interface']})"

    @property
    def bus_latency_ns(self) -> float:
        """Smallest SYNC-to-last-TPDO delay seen in the clock window (ns); nan before data."""
        if not self.clock.n_samples:
            return math.nan
        return float(self.clock.offset_ns)

    @property
    def using_pdo(self) -> bool:
        """Whether samples come from TPDOs on SYNC (else SDO polling)."""
        return self._use_pdo

    # -- SDO helpers ---------------------------------------------------------------------
    def sdo_read(self, node_id: int, index: int, subindex: int = 0) -> bytes:
        """Raw SDO upload. Raises :class:`SdoAbortError` or ``DriverTimeoutError``."""
        from canopen.sdo.exceptions import SdoAbortedError, SdoCommunicationError

        node = self._remote[node_id]
        try:
            return bytes(node.sdo.upload(index, subindex))
        except SdoAbortedError as exc:
            raise SdoAbortError(node_id, index, subindex, exc.code, "read") from exc
        except SdoCommunicationError as exc:
            raise DriverTimeoutError(f"node {node_id}: SDO read 0x{index:04X}:{subindex:02X}: {exc}") from exc

    def sdo_write(self, node_id: int, index: int, subindex: int, data: bytes) -> None:
        """Raw SDO download (expedited for up to 4 bytes)."""
        from canopen.sdo.exceptions import SdoAbortedError, SdoCommunicationError

        node = self._remote[node_id]
        try:
            node.sdo.download(index, subindex, bytes(data))
        except SdoAbortedError as exc:
            raise SdoAbortError(node_id, index, subindex, exc.code, "write") from exc
        except SdoCommunicationError as exc:
            raise DriverTimeoutError(f"node {node_id}: SDO write 0x{index:04X}:{subindex:02X}: {exc}") from exc

    def _read_u16(self, node_id: int, index: int) -> int:
        return struct.unpack("<H", self.sdo_read(node_id, index)[:2])[0]

    def _read_i32(self, node_id: int, index: int) -> int:
        return struct.unpack("<i", self.sdo_read(node_id, index)[:4])[0]

    def nmt_state(self, node_id: int) -> NmtState | None:
        """NMT state from the node's latest heartbeat (``None`` before one)."""
        with self._lock:
            s = self._nmt.get(node_id)
        try:
            return None if s is None else NmtState(s)
        except ValueError:
            return None

    # -- open / close ---------------------------------------------------------------------
    def _open_internal(self) -> None:
        import can
        import canopen

        o = self.opts
        net = canopen.Network()
        net.NOTIFIER_CYCLE = 0.05  # bounds how long close() waits for the receive thread
        bus_kwargs: dict[str, Any] = {"channel": self.channel, "interface": o["interface"]}
        if o["bitrate"]:
            bus_kwargs["bitrate"] = o["bitrate"]
        if o["receive_own_messages"]:
            bus_kwargs["receive_own_messages"] = True
        for node_id in self.nodes:
            node = canopen.RemoteNode(node_id, build_object_dictionary())
            node.sdo.RESPONSE_TIMEOUT = o["sdo_timeout_s"]
            net.add_node(node)
            self._remote[node_id] = node
            net.subscribe(HEARTBEAT_COB_BASE + node_id, self._on_heartbeat)
            net.subscribe(TPDO1_COB_BASE + node_id, self._on_tpdo)
        try:
            net.connect(**bus_kwargs)
        except (can.CanError, OSError, ValueError, ImportError) as exc:
            raise DriverInitError(f"{self!r}: cannot open the CAN bus: {exc}") from exc
        self.network = net
        try:
            self._configure()
        except (SdoAbortError, DriverTimeoutError) as exc:
            raise DriverInitError(f"{self!r}: configuration failed: {exc}") from exc
        self._thread = threading.Thread(target=self._sync_loop, name="canopen-sync", daemon=True)
        self._thread.start()
        if self._use_pdo and not self._wait_first_cycle():
            if o["pdo"] == "on":
                raise DriverInitError(f"{self!r}: no TPDO answered SYNC (pdo=on)")
            log.warning("%r: no TPDO answered SYNC; falling back to SDO reads", self)
            self._use_pdo = False
        if o["enable"] == "open":
            self._enable_all(time.monotonic_ns() + int(o["boot_timeout_s"] * 1e9))

    def _configure(self) -> None:
        o = self.opts
        # 1. every node alive?
        deadline = time.monotonic() + o["boot_timeout_s"]
        while time.monotonic() < deadline:
            with self._lock:
                missing = [n for n in self.nodes if n not in self._hb_ns]
            if not missing:
                break
            time.sleep(0.005)
        else:
            raise DriverInitError(
                f"{self!r}: no heartbeat from node(s) {missing} within {o['boot_timeout_s']} s"
            )
        # 2. heartbeat period: configure or read
        periods = []
        for n in self.nodes:
            if o["heartbeat_ms"]:
                self.sdo_write(n, Od.PRODUCER_HEARTBEAT_TIME, 0, struct.pack("<H", o["heartbeat_ms"]))
                periods.append(o["heartbeat_ms"])
            else:
                periods.append(self._read_u16(n, Od.PRODUCER_HEARTBEAT_TIME))
        if min(periods) == 0:
            raise DriverInitError(f"{self!r}: a drive has heartbeats off (0x1017 = 0); set heartbeat_ms")
        self._hb_period_s = max(periods) * 1e-3
        # 3. PDO mapping in pre-operational
        for n in self.nodes:
            self._remote[n].nmt.send_command(NmtCommand.ENTER_PRE_OPERATIONAL)
        if self._use_pdo:
            for n in self.nodes:
                try:
                    self._map_tpdo1(n)
                except SdoAbortError as exc:
                    if o["pdo"] == "on":
                        raise
                    log.warning("%r: TPDO mapping refused (%s); using SDO reads", self, exc)
                    self._use_pdo = False
                    break
        for n in self.nodes:
            if o["position_window_counts"] >= 0:
                self.sdo_write(n, Od.POSITION_WINDOW, 0, struct.pack("<I", o["position_window_counts"]))
            if o["position_window_time_ms"] >= 0:
                self.sdo_write(n, Od.POSITION_WINDOW_TIME, 0, struct.pack("<H", o["position_window_time_ms"]))
        # 4. operational, confirmed by each node's next heartbeat
        with self._lock:
            for n in self.nodes:
                self._nmt.pop(n, None)
        for n in self.nodes:
            self._remote[n].nmt.send_command(NmtCommand.START)
        deadline = time.monotonic() + 3 * self._hb_period_s + 0.05
        with self._lock:
            while True:
                pending = [n for n in self.nodes if self._nmt.get(n) != NmtState.OPERATIONAL]
                if not pending:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    states = {n: self._nmt.get(n) for n in pending}
                    raise DriverInitError(f"{self!r}: node(s) did not enter OPERATIONAL: {states}")
                self._lock.wait(remaining)
            self._configured = True

    def _map_tpdo1(self, n: int) -> None:
        """TPDO1 := [0x6064 (32 bit), 0x6041 (16 bit)], synchronous every SYNC, by SDO."""
        cob = TPDO1_COB_BASE + n
        w = self.sdo_write
        w(n, Od.TPDO1_COMMUNICATION, 1, struct.pack("<I", cob | PDO_NOT_VALID))
        w(n, Od.TPDO1_COMMUNICATION, 2, struct.pack("<B", TRANSMISSION_SYNC_EVERY))
        w(n, Od.TPDO1_MAPPING, 0, b"\x00")
        w(n, Od.TPDO1_MAPPING, 1, struct.pack("<I", (Od.POSITION_ACTUAL_VALUE << 16) | 32))
        w(n, Od.TPDO1_MAPPING, 2, struct.pack("<I", (Od.STATUSWORD << 16) | 16))
        w(n, Od.TPDO1_MAPPING, 0, b"\x02")
        w(n, Od.TPDO1_COMMUNICATION, 1, struct.pack("<I", cob))

    def _wait_first_cycle(self) -> bool:
        deadline = time.monotonic() + max(0.2, 10 * self.opts["sync_period_ms"] * 1e-3)
        with self._lock:
            while self._latest is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def _close_internal(self) -> None:
        self._stop_evt.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        with self._lock:
            self._lock.notify_all()
        if self.network is not None:
            try:
                self.network.disconnect()
            except Exception:  # noqa: BLE001 - closing must go on
                log.debug("%r: bus shutdown error", self, exc_info=True)
            self.network = None

    # -- receiving ----------------------------------------------------------------------
    def _on_heartbeat(self, can_id: int, data: bytearray, timestamp: float) -> None:
        if not data:
            return
        node = can_id - HEARTBEAT_COB_BASE
        state = data[0] & 0x7F
        with self._lock:
            self._hb_ns[node] = time.monotonic_ns()
            self._nmt[node] = state
            if state == NmtState.BOOT_UP and self._configured:
                self._rebooted.add(node)
            self._lock.notify_all()

    def _on_tpdo(self, can_id: int, data: bytearray, timestamp: float) -> None:
        recv_ns = time.monotonic_ns()
        node = can_id - TPDO1_COB_BASE
        if len(data) < _TPDO1.size:
            self.bad_frames += 1
            return
        pos, sw = _TPDO1.unpack_from(data)
        with self._lock:
            cyc = self._cycle
            if cyc is None or node in cyc.got:
                return
            cyc.got[node] = (pos, sw)
            cyc.last_recv_ns = recv_ns
            if len(cyc.got) == N_JOINTS:
                self._cycle = None
                counts = np.array([cyc.got[n][0] for n in self.nodes], dtype=float)
                sws = np.array([cyc.got[n][1] for n in self.nodes], dtype=np.int64)
                if cyc.stamp_ns - self._last_clock_feed_ns >= 20_000_000:  # 50 Hz: refits are costly
                    self.clock.add(cyc.stamp_ns * 1e-9, recv_ns)
                    self._last_clock_feed_ns = cyc.stamp_ns
                self._publish(counts, sws, cyc.stamp_ns, recv_ns)

    def _publish(self, counts: np.ndarray, sws: np.ndarray, t_ns: int, recv_ns: int) -> None:
        # caller holds self._lock
        q = self.scaling.to_rad(counts)
        t_s = t_ns * 1e-9
        self._history.append((t_s, q))
        qd = np.zeros(N_JOINTS)
        if len(self._history) >= 2:
            ts = np.array([h[0] for h in self._history])
            qs = np.array([h[1] for h in self._history])
            dt = ts - ts.mean()
            denom = float(dt @ dt)
            if denom > 0:
                qd = dt @ (qs - qs.mean(axis=0)) / denom
        self._statuswords = sws
        reached = bool(np.all(sws & Statusword.TARGET_REACHED))
        lin, ang = self.model.flange_speed(q, qd)
        self._seq += 1
        self._latest = RobotState(
            q_rad=q,
            qd_rad_s=qd,
            base_T_flange=self.model.forward(q),
            t_device_s=t_s,
            t_host_ns=t_ns,
            moving=bool(np.max(np.abs(qd)) > self.opts["moving_threshold_rad_s"]) or not reached,
            mode=self._mode(sws),
            flange_speed_m_s=lin,
            flange_ang_speed_rad_s=ang,
            target_reached=reached,
            t_recv_host_ns=recv_ns,
            seq=self._seq,
        )
        self._lock.notify_all()

    def _mode(self, sws: np.ndarray) -> RobotMode:
        states = [cia402_state(int(s)) for s in sws]
        nmt = [self._nmt.get(n) for n in self.nodes]
        if any(s in (Cia402State.FAULT, Cia402State.FAULT_REACTION_ACTIVE) for s in states):
            return RobotMode.FAULT
        if any(s is Cia402State.QUICK_STOP_ACTIVE for s in states):
            return RobotMode.PROTECTIVE_STOP
        if any(x != NmtState.OPERATIONAL for x in nmt):
            return RobotMode.BOOTING
        if all(s is Cia402State.OPERATION_ENABLED for s in states):
            return RobotMode.RUNNING
        if any(s is None or s is Cia402State.NOT_READY_TO_SWITCH_ON for s in states):
            return RobotMode.UNKNOWN
        return RobotMode.IDLE

    def _sync_loop(self) -> None:
        """SYNC, collect the six TPDOs, repeat.

        The next SYNC goes out only once the current cycle is complete or its period is
        over, so a TPDO can never be counted in a later cycle than the SYNC it answers.
        After an incomplete cycle the loop stays silent for one more period and drops
        whatever arrives in it (late frames of the abandoned cycle).
        """
        period_ns = int(self.opts["sync_period_ms"] * 1e6)
        while not self._stop_evt.is_set():
            tick = time.monotonic_ns()
            complete = True
            if self._use_pdo:
                cyc = _Cycle(time.monotonic_ns())
                with self._lock:
                    self._cycle = cyc
                try:
                    self.network.sync.transmit()
                except Exception as exc:  # noqa: BLE001 - a send error must not kill sampling
                    log.warning("%r: SYNC send failed: %s", self, exc)
                deadline = tick + period_ns
                with self._lock:
                    while self._cycle is cyc and not self._stop_evt.is_set():
                        now = time.monotonic_ns()
                        if now >= deadline:
                            break
                        self._lock.wait((deadline - now) * 1e-9)
                    if self._cycle is cyc:
                        complete = False
                        self._cycle = None
                        if cyc.got:
                            self.incomplete_cycles += 1
            self._check_heartbeats()
            wait_ns = tick + period_ns * (1 if complete else 2) - time.monotonic_ns()
            if wait_ns > 0:
                self._stop_evt.wait(wait_ns * 1e-9)

    def _heartbeat_fault(self) -> DeviceGoneError | None:
        with self._lock:
            if not self._configured:
                return None
            for n in self.nodes:
                if n in self._rebooted:
                    return NodeRebooted(n)
            limit = self.opts["heartbeat_timeout_factor"] * self._hb_period_s
            now = time.monotonic_ns()
            for n in self.nodes:
                silent = (now - self._hb_ns.get(n, now)) * 1e-9
                if silent > limit:
                    return HeartbeatLost(n, silent, self._hb_period_s)
        return None

    def _check_heartbeats(self) -> None:
        fault = self._heartbeat_fault()
        if fault is not None and not getattr(self, "_hb_logged", False):
            log.error("%r: %s", self, fault)
            self._hb_logged = True
        elif fault is None:
            self._hb_logged = False

    def _read_state_internal(self, deadline_ns: int) -> RobotState | None:
        fault = self._heartbeat_fault()
        if fault is not None:
            raise fault
        if not self._use_pdo:
            return self._read_state_sdo()
        max_age_ns = int(self.max_age_s * 1e9)
        with self._lock:
            while True:
                now = time.monotonic_ns()
                s = self._latest
                if s is not None and now - s.t_recv_host_ns <= max_age_ns:
                    return s
                if now >= deadline_ns or self._closed:
                    return None
                self._lock.wait(min((deadline_ns - now) * 1e-9, self._hb_period_s or 0.1))
                if self._heartbeat_fault() is not None:
                    break
        fault = self._heartbeat_fault()
        if fault is not None:
            raise fault
        return None

    def _read_state_sdo(self) -> RobotState:
        t0 = time.monotonic_ns()
        counts = np.array([self._read_i32(n, Od.POSITION_ACTUAL_VALUE) for n in self.nodes], dtype=float)
        sws = np.array([self._read_u16(n, Od.STATUSWORD) for n in self.nodes], dtype=np.int64)
        t1 = time.monotonic_ns()
        with self._lock:
            self._publish(counts, sws, (t0 + t1) // 2, t1)
            return self._latest  # type: ignore[return-value]

    # -- CiA 402 control ------------------------------------------------------------------
    def _controlword(self, n: int, cw: int) -> None:
        self.sdo_write(n, Od.CONTROLWORD, 0, struct.pack("<H", int(cw)))

    def _enable(self, n: int, deadline_ns: int) -> None:
        """Walk node ``n`` to OPERATION ENABLED in profile-position mode by ``deadline_ns``."""
        self.sdo_write(n, Od.MODES_OF_OPERATION, 0, struct.pack("<b", MODE_PROFILE_POSITION))
        while True:
            sw = self._read_u16(n, Od.STATUSWORD)
            state = cia402_state(sw)
            if state is Cia402State.OPERATION_ENABLED:
                return
            if time.monotonic_ns() > deadline_ns:
                raise DeviceError(f"node {n}: stuck in CiA 402 state {state} (statusword 0x{sw:04X})", "ENABLE")
            if state is Cia402State.QUICK_STOP_ACTIVE:
                raise ProtectiveStop(f"node {n}: quick stop active; acknowledge it before moving")
            if state in (Cia402State.FAULT, Cia402State.FAULT_REACTION_ACTIVE):
                self._controlword(n, CW_DISABLE_VOLTAGE)
                self._controlword(n, CW_FAULT_RESET)
            elif state is Cia402State.SWITCH_ON_DISABLED:
                self._controlword(n, CW_SHUTDOWN)
            elif state is Cia402State.READY_TO_SWITCH_ON:
                self._controlword(n, CW_SWITCH_ON)
            elif state is Cia402State.SWITCHED_ON:
                self._controlword(n, CW_ENABLE_OPERATION)
            else:
                time.sleep(0.005)

    def _enable_all(self, deadline_ns: int) -> None:
        # The caller's deadline, not a fixed second per drive: on a busy bus or host the
        # SDO exchanges of the state walk can take longer than that, and the move allowed it.
        for n in self.nodes:
            self._enable(n, deadline_ns)

    def _move_internal(self, q_rad, base_T_flange, speed, wait, deadline_ns) -> None:
        o = self.opts
        if self.opts["enable"] == "never":
            raise DriverInitError(f"{self!r}: enable=never; this driver may not move the robot")
        now = self.read_state()
        if now.mode is RobotMode.PROTECTIVE_STOP:
            raise ProtectiveStop(f"{self!r}: a drive is in quick stop; not moving")
        if q_rad is None:
            try:
                q_rad = self.model.inverse(base_T_flange, now.q_rad)
            except UnreachablePose as exc:
                raise ValueError(f"move_to: {exc}") from exc
        self._enable_all(deadline_ns)
        counts = self.scaling.to_counts(q_rad)
        dq = np.abs(np.asarray(q_rad) - now.q_rad)
        h = float(np.max(dq)) or 1.0
        v_max = speed * o["max_joint_speed_rad_s"]
        a_max = speed * o["max_joint_accel_rad_s2"]
        rad_per_count = np.abs(self.scaling.rad_per_count)
        for j, n in enumerate(self.nodes):
            v = max(v_max * dq[j] / h, 1e-3 * v_max) / rad_per_count[j]  # counts/s, joints in step
            a = a_max / rad_per_count[j]
            self.sdo_write(n, Od.PROFILE_VELOCITY, 0, struct.pack("<I", min(int(v) + 1, 2**32 - 1)))
            self.sdo_write(n, Od.PROFILE_ACCELERATION, 0, struct.pack("<I", min(int(a) + 1, 2**32 - 1)))
            self.sdo_write(n, Od.TARGET_POSITION, 0, struct.pack("<i", int(counts[j])))
        cw = CW_ENABLE_OPERATION | Controlword.CHANGE_SET_IMMEDIATELY
        for n in self.nodes:
            self._controlword(n, cw | Controlword.NEW_SET_POINT)
        for n in self.nodes:
            sw = self._read_u16(n, Od.STATUSWORD)
            if not sw & Statusword.SET_POINT_ACKNOWLEDGE:
                raise DeviceError(f"node {n}: set-point not acknowledged (statusword 0x{sw:04X})", "SETPOINT")
            self._controlword(n, cw)
        self._halted = False
        acked_ns = time.monotonic_ns()
        if wait:
            self._wait_target(acked_ns, deadline_ns)

    def _wait_target(self, acked_ns: int, deadline_ns: int) -> None:
        """Wait for a sample taken after every set-point was acknowledged with all drives
        reporting target reached."""
        seq = -1
        while True:
            remaining = (deadline_ns - time.monotonic_ns()) * 1e-9
            if remaining <= 0:
                raise DriverTimeoutError(f"{self!r}: target not reached in time")
            s = self.read_state(timeout_s=min(remaining, max(self.timeout_s, 0.1)))
            if s.seq == seq:
                time.sleep(self.opts["sync_period_ms"] * 1e-3 / 2)
                continue
            seq = s.seq
            if s.mode is RobotMode.PROTECTIVE_STOP:
                raise ProtectiveStop(f"{self!r}: quick stop during the move")
            if s.mode is RobotMode.FAULT:
                raise DeviceError(f"{self!r}: drive fault during the move", "FAULT")
            if s.target_reached and s.t_host_ns > acked_ns:
                return

    def _stop_internal(self) -> None:
        for n in self.nodes:
            self._controlword(n, CW_ENABLE_OPERATION | Controlword.HALT)
        self._halted = True
