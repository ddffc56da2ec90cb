"""Six CiA 402 joint drives over CANopen (the ``canopen`` package on python-can).

``canopen://<channel>?interface=socketcan&nodes=1-6&model=ur5e[&...]``

The driver is written against CiA 301 and CiA 402, not against one drive family: it works
with drives as they come from the factory (heartbeat off, their own units and PDO mapping,
a late set-point acknowledge, powered up in FAULT) and can share a bus with another master.
``docs/protocols/robot.md`` section 3 lists what it requires of a drive, every object it
writes at open in order, and every URL key; ADR 0011 says why the defaults are what they are.

* **Open**: connect the bus; as NMT master (``nmt_master=true``) put the nodes in
  pre-operational; every node must answer an SDO read of its device type 0x1000 (the
  liveness probe; a node that does not is named in the
  :class:`~cellcal.drivers.errors.DriverInitError`); read the identity 0x1018 (and the
  optional name and versions 0x1008-0x100A) into :attr:`Cia402Driver.drives`; write the
  heartbeat time 0x1017 when ``heartbeat_ms`` is set, *then* wait for the heartbeats;
  resolve each drive's units (0x60A9, factor group) and check the configured limits against
  them (:mod:`cellcal.drivers.cia402_units`); with ``homing_required`` read the homing
  state; set up sampling (remap TPDO1 to 0x6064 + 0x6041 on SYNC and disable TPDO2-4, or
  with ``remap_pdos=false`` use the drive's own mapping); write the position window if
  configured, then read back every drive's window 0x6067 / 0x6068 (:attr:`Cia402Driver.windows`);
  NMT start.
* **Supervision**: a drive with heartbeats is lost when silent for
  ``heartbeat_timeout_factor`` periods; a drive without (0x1017 = 0 and no ``heartbeat_ms``)
  is supervised by SDO: polled (statusword) whenever nothing was heard from it for
  ``liveness_period_ms``. Either way :meth:`read_state` then raises :class:`HeartbeatLost`;
  a boot-up message after open raises :class:`NodeRebooted`.
* **Sampling**: on SYNC (this driver's, or another master's with ``sync_producer=false``)
  the drives' synchronous TPDOs form one coherent joint vector stamped at the SYNC; with
  event-driven TPDOs the joints are not sampled together; without usable TPDOs the driver
  polls by SDO. The log says which, and :attr:`Cia402Driver.sampling` tells.
* **Counts to radians** per joint with :class:`~cellcal.drivers.kinematics.JointScaling`,
  then standard-DH forward kinematics; joint speeds are the slope of a line through the last
  ``velocity_window`` samples (and where the drive's velocity actual value 0x606C is sampled
  and fine enough, the larger of the two).
* **Moves** (profile position): enable through the CiA 402 power state machine; plan a
  synchronised trapezoid (every joint arrives together) and write profile velocity 0x6081,
  acceleration 0x6083 and deceleration 0x6084 in the drive's units, never above the
  configured limits; write 0x607A, raise new-set-point and poll the set-point acknowledge
  (statusword bit 12) until ``setpoint_timeout_s``; wait until the move is *verified*
  (:mod:`cellcal.drivers.cia402_motion`): every joint's actual position 0x6064 inside its
  position window of the target for the window time, with target reached (bit 10) -- bit 10
  alone never completes a move. Bit 10 outside the window for ``target_mismatch_s`` raises
  :class:`TargetMismatch`, a commanded joint that stays put :class:`JointNotMoving`, and
  FAULT in any statusword :class:`DriveFaultDuringMove`; each halts the drives first.
  ``RobotState.target_reached`` is that verdict (a fault seen keeps it ``False`` until the
  next move).
* **Link**: an SLCAN adapter is read through :class:`~cellcal.drivers.can_link.SlcanLinkBus`:
  garbled and unknown lines are counted (:attr:`Cia402Driver.link_stats`) and dropped.
  ``sync_fail_limit`` SYNC sends failing in a row, or python-can's receive thread ending
  (the port failed), make :meth:`read_state` raise :class:`CanLinkLost`; SYNC failures are
  logged at most 3 times per 10 s.
* **Observe**: for drives cellcal does not command (``enable=never``, or not moved yet, or
  no longer OPERATION ENABLED) ``RobotState.target_reached`` is ``None``, so settling is
  judged from positions and velocities alone.
* **Errors**: SDO aborts raise :class:`SdoAbortError` with the 32-bit abort code; quick
  stop :class:`~cellcal.drivers.robot.ProtectiveStop`; a drive fault, a refused or
  unacknowledged set-point, an unhomed joint with ``homing_required`` a
  :class:`~cellcal.drivers.errors.DeviceError` with its ``code`` (``TARGET_MISMATCH``,
  ``JOINT_NOT_MOVING``, ``FAULT``, ``SETPOINT``, ``NOT_HOMED``, ...); a failed link a
  :class:`~cellcal.drivers.errors.DeviceGoneError` (:class:`HeartbeatLost`,
  :class:`NodeRebooted`, :class:`CanLinkLost`).
"""

from __future__ import annotations

import enum
import logging
import math
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Self

import numpy as np
from canopen.sdo.exceptions import SdoAbortedError, SdoCommunicationError

from cellcal.drivers.base import remaining_s
from cellcal.drivers.can_link import CanLinkLost, LinkStats, RateLimitedLog, make_bus
from cellcal.drivers.cia402_motion import (
    DriveFaultDuringMove,
    JointNotMoving,
    MoveVerificationError,
    MoveWatch,
    PositionWindow,
    TargetMismatch,
    resolve_window,
)
from cellcal.drivers.cia402_units import (
    ACCEL_UNITS,
    VELOCITY_UNITS,
    DriveUnitObjects,
    JointLimits,
    JointUnits,
    check_joint_limits,
    parse_unit_tokens,
    plan_sync_move,
    resolve_joint_units,
    to_drive_units,
)
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
    "DriveIdentity",
    "TpdoConfig",
    "TpdoUse",
    "SdoAbortError",
    "HeartbeatLost",
    "NodeRebooted",
    "CanLinkLost",
    "TargetMismatch",
    "JointNotMoving",
    "MoveVerificationError",
    "DriveFaultDuringMove",
    "Od",
    "Statusword",
    "Controlword",
    "Cia402State",
    "NmtState",
    "NmtCommand",
    "cia402_state",
    "build_object_dictionary",
    "parse_nodes",
    "find_tpdo_layout",
    "SYNC_COB_ID",
    "TPDO1_COB_BASE",
    "HEARTBEAT_COB_BASE",
    "SDO_ABORT_CODES",
    "sdo_abort_text",
    "OPTIONS",
]

log = logging.getLogger(__name__)

SYNC_COB_ID = 0x080
EMCY_COB_BASE = 0x080
TPDO1_COB_BASE = 0x180
SDO_TX_COB_BASE = 0x580
HEARTBEAT_COB_BASE = 0x700
PDO_NOT_VALID = 1 << 31
PDO_EXTENDED_ID = 1 << 29
TRANSMISSION_SYNC_EVERY = 1  # TPDO transmission type: synchronous, every SYNC
N_TPDOS = 4  # TPDO1..4: the predefined connection set

# sampling modes (Cia402Driver.sampling)
SAMPLING_SYNC = "sync"  # synchronous TPDOs: one coherent vector per SYNC
SAMPLING_EVENT = "event"  # event-driven TPDOs: per-joint values as they come
SAMPLING_SDO = "sdo"  # SDO polling on read_state

ABORT_OBJECT_MISSING = 0x06020000


class Od(enum.IntEnum):
    """Object dictionary indices used (CiA 301 communication, CiA 402 drive profile)."""

    DEVICE_TYPE = 0x1000
    ERROR_REGISTER = 0x1001
    COB_ID_SYNC = 0x1005
    DEVICE_NAME = 0x1008
    HARDWARE_VERSION = 0x1009
    SOFTWARE_VERSION = 0x100A
    PRODUCER_HEARTBEAT_TIME = 0x1017
    IDENTITY = 0x1018
    TPDO1_COMMUNICATION = 0x1800
    TPDO2_COMMUNICATION = 0x1801
    TPDO3_COMMUNICATION = 0x1802
    TPDO4_COMMUNICATION = 0x1803
    TPDO1_MAPPING = 0x1A00
    TPDO2_MAPPING = 0x1A01
    TPDO3_MAPPING = 0x1A02
    TPDO4_MAPPING = 0x1A03
    ERROR_CODE = 0x603F
    CONTROLWORD = 0x6040
    STATUSWORD = 0x6041
    MODES_OF_OPERATION = 0x6060
    MODES_OF_OPERATION_DISPLAY = 0x6061
    POSITION_ACTUAL_VALUE = 0x6064
    POSITION_WINDOW = 0x6067
    POSITION_WINDOW_TIME = 0x6068
    VELOCITY_ACTUAL_VALUE = 0x606C
    TARGET_POSITION = 0x607A
    MAX_PROFILE_VELOCITY = 0x607F
    PROFILE_VELOCITY = 0x6081
    PROFILE_ACCELERATION = 0x6083
    PROFILE_DECELERATION = 0x6084
    MOTION_PROFILE_TYPE = 0x6086
    POSITION_ENCODER_RESOLUTION = 0x608F
    GEAR_RATIO = 0x6091
    POSITION_FACTOR = 0x6093
    VELOCITY_ENCODER_FACTOR = 0x6094
    ACCELERATION_FACTOR = 0x6097
    HOMING_METHOD = 0x6098
    SI_UNIT_VELOCITY = 0x60A9
    MAX_ACCELERATION = 0x60C5
    MAX_DECELERATION = 0x60C6


class Statusword(enum.IntFlag):
    """CiA 402 statusword (0x6041) bits.

    Bits 12 and 13 mean what the mode of operation says: in profile position mode set-point
    acknowledge and following error, in homing mode homing attained and homing error.
    """

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
    HOMING_ATTAINED = 1 << 12  # homing mode
    HOMING_ERROR = 1 << 13  # homing mode


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
MODE_HOMING = 6

#: CiA 301 SDO abort code -> its meaning: ``canopen``'s own table.
SDO_ABORT_CODES: Mapping[int, str] = SdoAbortedError.CODES


def sdo_abort_text(abort_code: int) -> str:
    """The CiA 301 meaning of an SDO abort code, from ``canopen``'s table
    (``canopen.sdo.exceptions.SdoAbortedError.CODES``, also :data:`SDO_ABORT_CODES`)."""
    return SDO_ABORT_CODES.get(int(abort_code), "unknown abort code")


class SdoAbortError(DeviceError):
    """A drive aborted an SDO transfer.

    Attributes
    ----------
    abort_code : int
        The CiA 301 32-bit abort code (e.g. ``0x06020000``: object does not exist); the
        message gives its meaning from ``canopen``'s table (:func:`sdo_abort_text`).
    node_id, index, subindex : int
        Where.
    """

    def __init__(self, node_id: int, index: int, subindex: int, abort_code: int, op: str) -> None:
        self.abort_code = int(abort_code)
        self.node_id = node_id
        self.index = index
        self.subindex = subindex
        text = sdo_abort_text(self.abort_code)
        super().__init__(
            f"node {node_id}: SDO {op} 0x{index:04X}:{subindex:02X} aborted with 0x{self.abort_code:08X} ({text})",
            code=f"0x{self.abort_code:08X}",
        )


class HeartbeatLost(DeviceGoneError):
    """A drive stopped answering its supervision (node ``node_id``, silent for ``silent_s``).

    ``via`` is ``"heartbeat"`` (its heartbeats stopped) or ``"sdo"`` (a drive without
    heartbeats stopped answering the liveness SDO reads).
    """

    def __init__(self, node_id: int, silent_s: float, period_s: float, via: str = "heartbeat") -> None:
        self.node_id = node_id
        self.silent_s = silent_s
        self.via = via
        what = "no heartbeat" if via == "heartbeat" else "no answer to SDO liveness reads (heartbeats off)"
        super().__init__(
            f"node {node_id}: {what} for {silent_s * 1e3:.0f} ms (period {period_s * 1e3:.0f} ms)"
        )


class NodeRebooted(DeviceGoneError):
    """A drive sent a boot-up message after the driver configured it."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        super().__init__(f"node {node_id}: rebooted (boot-up message); reopen the driver")


# -- identity and PDO layout ------------------------------------------------------------------
@dataclass(frozen=True)
class DriveIdentity:
    """What a drive says it is (CiA 301 0x1000, 0x1018, 0x1008-0x100A).

    Attributes
    ----------
    node_id : int
    device_type : int
        0x1000: the low 16 bits are the device profile (402), the high 16 bits its details.
    vendor_id, product_code, revision, serial : int or None
        0x1018:1..4 (sub-indices 2-4 are optional in CiA 301: ``None`` when absent).
    device_name, hardware_version, software_version : str or None
        0x1008, 0x1009, 0x100A (optional).
    """

    node_id: int
    device_type: int
    vendor_id: int | None = None
    product_code: int | None = None
    revision: int | None = None
    serial: int | None = None
    device_name: str | None = None
    hardware_version: str | None = None
    software_version: str | None = None

    @property
    def profile(self) -> int:
        """The device profile number (402 for a drive)."""
        return self.device_type & 0xFFFF

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: integers stay integers, absent values ``None``."""
        return asdict(self)


@dataclass(frozen=True)
class TpdoConfig:
    """One TPDO as a drive has it configured (read at open).

    Attributes
    ----------
    number : int
        1..4.
    cob_id : int
        0x1800+k:1 raw (bit 31: not valid, bit 29: 29-bit id).
    transmission_type : int
        0x1800+k:2 (1..240 synchronous every n-th SYNC, 0 acyclic synchronous, 252/253 on
        request only, 254/255 event-driven).
    mapping : tuple of int
        0x1A00+k:1..n entries (``index << 16 | subindex << 8 | bits``).
    """

    number: int
    cob_id: int
    transmission_type: int
    mapping: tuple[int, ...]

    @property
    def valid(self) -> bool:
        return not self.cob_id & PDO_NOT_VALID and not self.cob_id & PDO_EXTENDED_ID

    @property
    def can_id(self) -> int:
        return self.cob_id & 0x7FF

    def describe(self) -> str:
        objs = ", ".join(f"0x{e >> 16:04X}:{(e >> 8) & 0xFF:02X}/{e & 0xFF}" for e in self.mapping) or "empty"
        state = f"COB-ID 0x{self.can_id:03X}, type {self.transmission_type}" if self.valid else "disabled"
        return f"TPDO{self.number} ({state}): {objs}"


#: the objects the driver decodes from a TPDO: name -> (index, bits, signed)
_FIELDS = {
    "position": (Od.POSITION_ACTUAL_VALUE, 32, True),
    "statusword": (Od.STATUSWORD, 16, False),
    "velocity": (Od.VELOCITY_ACTUAL_VALUE, 32, True),
}


@dataclass(frozen=True)
class TpdoUse:
    """A TPDO the driver decodes: where in its data each wanted object sits.

    Attributes
    ----------
    number, can_id, transmission_type : int
    fields : tuple of (name, byte offset, byte size, signed)
        ``name`` is ``position`` (0x6064), ``statusword`` (0x6041) or ``velocity`` (0x606C).
    """

    number: int
    can_id: int
    transmission_type: int
    fields: tuple[tuple[str, int, int, bool], ...]

    @property
    def synchronous(self) -> bool:
        return 1 <= self.transmission_type <= 240

    def decode(self, data: bytes) -> dict[str, int] | None:
        """The fields of one frame (``None`` if the frame is too short)."""
        out = {}
        for name, off, size, signed in self.fields:
            if off + size > len(data):
                return None
            out[name] = int.from_bytes(data[off : off + size], "little", signed=signed)
        return out


def _tpdo_use(cfg: TpdoConfig) -> TpdoUse | None:
    """Which wanted objects a TPDO carries (``None`` if none, or if not byte-aligned)."""
    if not cfg.valid or cfg.transmission_type in (252, 253):
        return None  # disabled, 29-bit, or only on request (this driver sends no RTR)
    fields = []
    bit = 0
    for entry in cfg.mapping:
        index, bits = entry >> 16, entry & 0xFF
        for name, (want, want_bits, signed) in _FIELDS.items():
            if index == want and (entry >> 8) & 0xFF == 0 and bits == want_bits and bit % 8 == 0:
                fields.append((name, bit // 8, bits // 8, signed))
        bit += bits
    if bit > 64 or not fields:
        return None
    return TpdoUse(cfg.number, cfg.can_id, cfg.transmission_type, tuple(fields))


def find_tpdo_layout(configs: Iterable[TpdoConfig]) -> tuple[TpdoUse, ...] | None:
    """The TPDOs of one drive that together carry 0x6064 and 0x6041 (and 0x606C if mapped).

    Synchronous TPDOs are preferred; each object is taken from the first TPDO that has it.
    ``None`` when position and statusword are not both available.
    """
    uses = [u for u in (_tpdo_use(c) for c in configs) if u is not None]
    uses.sort(key=lambda u: (not u.synchronous, u.number))
    chosen: list[TpdoUse] = []
    have: set[str] = set()
    for u in uses:
        new = {f[0] for f in u.fields} - have
        if new:
            keep = tuple(f for f in u.fields if f[0] in new)
            chosen.append(TpdoUse(u.number, u.can_id, u.transmission_type, keep))
            have |= new
    if not {"position", "statusword"} <= have:
        return None
    return tuple(sorted(chosen, key=lambda u: u.number))


# -- object dictionary ----------------------------------------------------------------------
def build_object_dictionary() -> Any:
    """The object dictionary of one of the project's simulated CiA 402 joint drives.

    Only the objects this driver uses; a real drive's EDS is a superset of it. The driver
    itself reads and writes by index (raw SDO) and needs no EDS.
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
    for k in range(N_TPDOS):
        com = odm.ODRecord(f"Transmit PDO {k + 1} communication parameter", Od.TPDO1_COMMUNICATION + k)
        idx = Od.TPDO1_COMMUNICATION + k
        com.add_member(var("Highest sub-index supported", idx, odm.UNSIGNED8, "const", 6, 0))
        com.add_member(var("COB-ID", idx, odm.UNSIGNED32, "rw", PDO_NOT_VALID | (0x180 + 0x100 * k), 1))
        com.add_member(var("Transmission type", idx, odm.UNSIGNED8, "rw", 0xFF, 2))
        com.add_member(var("Inhibit time", idx, odm.UNSIGNED16, "rw", 0, 3))
        com.add_member(var("Event timer", idx, odm.UNSIGNED16, "rw", 0, 5))
        com.add_member(var("SYNC start value", idx, odm.UNSIGNED8, "rw", 0, 6))
        od.add_object(com)
        midx = Od.TPDO1_MAPPING + k
        mapping = odm.ODRecord(f"Transmit PDO {k + 1} mapping parameter", midx)
        mapping.add_member(var("Number of mapped objects", midx, odm.UNSIGNED8, "rw", 0, 0))
        for sub in range(1, 9):
            mapping.add_member(var(f"Mapped object {sub}", midx, odm.UNSIGNED32, "rw", 0, sub))
        od.add_object(mapping)
    od.add_object(var("Error code", Od.ERROR_CODE, odm.UNSIGNED16, "ro", 0))
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
    od.add_object(var("Homing method", Od.HOMING_METHOD, odm.INTEGER8, "rw", 35))
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


def _opt_choice(*choices: str):
    def parse(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"expected {', '.join(choices)}")
        return str(v)

    return parse


def _opt_model(v: Any) -> DHModel:
    if isinstance(v, DHModel):
        return v
    if isinstance(v, Mapping):
        return dh_model_from_table(v, "dh")
    return dh_model(opt_str(v))


def _opt_optional_float(v: Any) -> float | None:
    if v is None or (isinstance(v, str) and v.lower() in ("", "none", "default")):
        return None
    return opt_float(lo=0.0)(v)


_POSITIVE6 = opt_vector(N_JOINTS, positive=True)

OPTIONS: dict[str, OptionSpec] = {
    "interface": OptionSpec(opt_str, "socketcan", "python-can interface"),
    "bitrate": OptionSpec(opt_int(0, 8_000_000), 0, "bus bitrate (0: the interface's)"),
    "sleep_after_open_s": OptionSpec(_opt_optional_float, None, "slcan: wait after opening the port"),
    "nodes": OptionSpec(parse_nodes, (1, 2, 3, 4, 5, 6), "node ids in joint order"),
    "model": OptionSpec(_opt_model, dh_model("ur5e"), "DH model name, or a DHModel / dh table"),
    "counts_per_rev": OptionSpec(_POSITIVE6, np.full(N_JOINTS, 2.0**20), "position units per motor rev"),
    "gear_ratio": OptionSpec(_POSITIVE6, np.ones(N_JOINTS), "motor revs per joint rev"),
    "sign": OptionSpec(opt_vector(N_JOINTS), np.ones(N_JOINTS), "+1/-1 per joint"),
    "offset_counts": OptionSpec(opt_vector(N_JOINTS), np.zeros(N_JOINTS), "counts at q = 0"),
    "velocity_units": OptionSpec(parse_unit_tokens(VELOCITY_UNITS, N_JOINTS), ("auto",) * N_JOINTS,
                                 "0x6081/0x606C units"),
    "velocity_factor": OptionSpec(_POSITIVE6, np.ones(N_JOINTS), "multiplier of velocity_units"),
    "accel_units": OptionSpec(parse_unit_tokens(ACCEL_UNITS, N_JOINTS), ("auto",) * N_JOINTS,
                              "0x6083/0x6084 units"),
    "accel_factor": OptionSpec(_POSITIVE6, np.ones(N_JOINTS), "multiplier of accel_units"),
    "heartbeat_ms": OptionSpec(opt_int(0, 65535), 0, "write 0x1017 (0: keep the drives' value)"),
    "heartbeat_timeout_factor": OptionSpec(opt_float(1.0, 2.9), 2.0, "silent periods = lost"),
    "liveness_period_ms": OptionSpec(opt_float(5.0, 10000.0), 100.0, "SDO liveness poll (no heartbeat)"),
    "nmt_master": OptionSpec(opt_bool, True, "send NMT pre-operational/start"),
    "sync_producer": OptionSpec(opt_bool, True, "send SYNC (false: consume another master's)"),
    "remap_pdos": OptionSpec(opt_bool, True, "map TPDO1 (false: use the drive's mapping)"),
    "sync_period_ms": OptionSpec(opt_float(1.0, 1000.0), 10.0, "SYNC period (ms)"),
    "pdo": OptionSpec(_opt_pdo, "auto", "auto: SDO fallback if TPDOs fail; on; off"),
    "sdo_timeout_s": OptionSpec(opt_float(positive=True), 0.5, "per SDO response"),
    "position_window_counts": OptionSpec(opt_int(-1, 2**32 - 1), -1, "write 0x6067 (-1: keep)"),
    "position_window_time_ms": OptionSpec(opt_int(-1, 65535), -1, "write 0x6068 (-1: keep)"),
    "target_mismatch_s": OptionSpec(opt_float(0.01, 10.0), 0.2, "bit 10 set outside the window this long: fault"),
    "stall_timeout_s": OptionSpec(opt_float(0.05, 60.0), 0.5, "a commanded joint still this long: not moving"),
    "sync_fail_limit": OptionSpec(opt_int(1, 10000), 10, "SYNC sends failing in a row: link fault"),
    "max_joint_speed_rad_s": OptionSpec(_POSITIVE6, np.full(N_JOINTS, 1.05), "joint speed at speed=1"),
    "max_joint_accel_rad_s2": OptionSpec(_POSITIVE6, np.full(N_JOINTS, 1.4), "joint acceleration at speed=1"),
    "max_joint_decel_rad_s2": OptionSpec(lambda v: None if v is None else _POSITIVE6(v), None,
                                         "joint deceleration at speed=1 (default: the acceleration)"),
    "setpoint_timeout_s": OptionSpec(opt_float(positive=True), 0.5, "wait for set-point acknowledge"),
    "enable": OptionSpec(_opt_choice("on_move", "open", "never"), "on_move", "when to enable the drives"),
    "fault_reset": OptionSpec(opt_bool, True, "reset a drive fault when enabling"),
    "homing_required": OptionSpec(opt_bool, False, "refuse to move an unhomed joint"),
    "check_device_type": OptionSpec(opt_bool, True, "0x1000 must say CiA 402"),
    "velocity_window": OptionSpec(opt_int(2, 100), 10, "samples in the joint-speed fit"),
    "moving_threshold_rad_s": OptionSpec(opt_float(positive=True), 0.005, "max|qd| above = moving"),
    "timeout_s": OptionSpec(opt_float(positive=True), 1.0, "read_state timeout"),
    "max_age_s": OptionSpec(opt_float(positive=True), 0.1, "newest sample accepted if this fresh"),
    "move_timeout_s": OptionSpec(opt_float(positive=True), 120.0, "move_to(wait=True) timeout"),
    "boot_timeout_s": OptionSpec(opt_float(positive=True), 3.0, "wait for every node at open"),
    "receive_own_messages": OptionSpec(opt_bool, False, "python-can bus option"),
}


class _Cycle:
    """The TPDO values answering one SYNC."""

    __slots__ = ("stamp_ns", "got", "last_recv_ns")

    def __init__(self, stamp_ns: int) -> None:
        self.stamp_ns = stamp_ns
        self.got: dict[int, dict[str, int]] = {}
        self.last_recv_ns = 0


@dataclass
class _NodeRuntime:
    """Per-node bookkeeping shared by the receive, supervision and caller threads."""

    seen_ns: int = 0  # last frame of any kind from the node
    hb_ns: int = 0  # last heartbeat
    nmt: int | None = None  # from heartbeats, our own commands, or PDO traffic
    supervision: str = "heartbeat"
    hb_period_s: float = 0.0
    liveness_fail_since_ns: int = 0
    sdo_lock: threading.Lock = field(default_factory=threading.Lock)
    written: dict[int, bytes] = field(default_factory=dict)  # profile objects last written


class Cia402Driver(RobotDriver):
    """CiA 402 backend; build with :func:`~cellcal.drivers.robot.connect_robot`.

    Parameters
    ----------
    channel : str
        python-can channel (``can0``, a ``virtual`` channel name, an slcan port such as
        ``socket://127.0.0.1:PORT`` or ``/dev/ttyACM0``).
    **options
        See :data:`OPTIONS` / ``docs/protocols/robot.md``.

    Attributes (after :meth:`open`)
    -------------------------------
    drives : tuple of DriveIdentity
        What each node reported (joint order).
    units : tuple of JointUnits
        Each drive's resolved units.
    limits : JointLimits
        The joint limits moves are planned with.
    homed : tuple of (bool or None)
        Homing state per joint (``None``: not checked or not known).
    sampling : str
        ``"sync"``, ``"event"`` or ``"sdo"``.
    tpdo_layout : dict
        node -> the :class:`TpdoUse` decoded.
    """

    backend = "canopen"

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
        if opts["remap_pdos"] and not opts["nmt_master"] and opts["pdo"] != "off":
            raise ValueError(
                "canopen: remap_pdos=true needs nmt_master=true (a PDO mapping is changed in "
                "pre-operational); on a bus with another master use remap_pdos=false"
            )
        if opts["sleep_after_open_s"] is not None and opts["interface"] != "slcan":
            raise ValueError("canopen: sleep_after_open_s is an option of interface=slcan only")
        if opts["max_joint_decel_rad_s2"] is None:
            opts["max_joint_decel_rad_s2"] = np.array(opts["max_joint_accel_rad_s2"], dtype=float)
        for key in ("velocity_units", "accel_units"):
            for j, (unit, fac) in enumerate(zip(opts[key], opts[key.replace("units", "factor")], strict=True)):
                if unit == "auto" and fac != 1.0:
                    raise ValueError(f"canopen: joint {j + 1}: {key.replace('units', 'factor')} needs an "
                                     f"explicit {key}")
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
        self._rt: dict[int, _NodeRuntime] = {n: _NodeRuntime() for n in self.nodes}
        self._lock = threading.Condition()
        self._halt_lock = threading.RLock()  # stop() against a move's set-up controlwords
        self._cycle: _Cycle | None = None
        self._async: dict[int, dict[str, int]] = {}
        self._async_recv: dict[int, int] = {}
        self._latest: RobotState | None = None
        self._history: deque[tuple[float, np.ndarray]] = deque(maxlen=opts["velocity_window"])
        self._rebooted: set[int] = set()
        self._configured = False
        self._stop_evt = threading.Event()
        self._threads: list[threading.Thread] = []
        self._seq = 0
        self._commanded: set[int] = set()
        self._left_enabled: set[int] = set()
        self._foreign_sync_logged = False
        self._sync_cob = SYNC_COB_ID
        self._cob_uses: dict[int, tuple[int, TpdoUse]] = {}
        self._sdo_velocity: bool | None = None  # does the drive have 0x606C?
        self._use_drive_velocity = np.zeros(N_JOINTS, dtype=bool)
        self._hb_logged = False
        #: what the receive path saw (frames, garbled and unknown lines dropped)
        self.link_stats = LinkStats()
        self._link_fault: CanLinkLost | None = None
        self._link_logged = False
        #: SYNC frames that could not be sent (all of them; in a row: the link fault)
        self.sync_send_failures = 0
        self._sync_failures_in_row = 0
        self._sync_log = RateLimitedLog(log, logging.WARNING, interval_s=10.0, burst=3)
        #: each drive's position window the moves are judged with (joint order), after open
        self.windows: tuple[PositionWindow, ...] = ()
        self._watch: MoveWatch | None = None
        # monotonic_ns of the last stop() since the current move began (0: none): a stop while a
        # move is still being set up (no watch yet) must stick: the move does not start, or its
        # watch starts stopped and no later controlword lifts the halt
        self._stop_ns = 0
        self._last_counts: np.ndarray | None = None
        self._emcy_since_move: dict[int, int] = {}
        #: SYNC cycles given up without a complete vector (all of them / those with some frames)
        self.abandoned_cycles = 0
        self.incomplete_cycles = 0
        self.bad_frames = 0
        self.emergencies: deque[tuple[int, int, int]] = deque(maxlen=64)  # (node, code, register)
        self.drives: tuple[DriveIdentity, ...] = ()
        self.units: tuple[JointUnits, ...] = ()
        self.limits: JointLimits | None = None
        self.homed: tuple[bool | None, ...] = (None,) * N_JOINTS
        self.sampling = SAMPLING_SDO if opts["pdo"] == "off" else SAMPLING_SYNC
        self.tpdo_layout: dict[int, tuple[TpdoUse, ...]] = {}
        self.tpdo_configs: dict[int, tuple[TpdoConfig, ...]] = {}
        self._statuswords = np.zeros(N_JOINTS, dtype=np.int64)

    @classmethod
    def _from_url_internal(cls, url: RobotUrl, options: Mapping[str, Any]) -> Self:
        channel = url.target
        if channel.startswith("[") and channel.endswith("]"):
            channel = channel[1:-1]
        opts = merge_options(OPTIONS, url.query, options, f"canopen://{url.target}")
        return cls(channel, **opts)

    def __repr__(self) -> str:
        return f"Cia402Driver(canopen://{self.channel}?interface={self.opts['interface']})"

    # -- what the driver found --------------------------------------------------------------
    @property
    def bus_latency_ns(self) -> float:
        """Smallest SYNC-to-last-TPDO delay seen in the clock window (ns); nan before data."""
        if not self.clock.n_samples:
            return math.nan
        return float(self.clock.offset_ns)

    @property
    def using_pdo(self) -> bool:
        """Whether samples come from TPDOs (else SDO polling)."""
        return self.sampling != SAMPLING_SDO

    @property
    def supervision(self) -> dict[int, str]:
        """node -> ``"heartbeat"`` or ``"sdo"`` (how the driver knows the node is alive)."""
        return {n: self._rt[n].supervision for n in self.nodes}

    @property
    def identity(self) -> dict[str, Any]:
        """The drives' identity for provenance (JSON-ready).

        ``{"driver", "backend", "model", "bus", "drives": [DriveIdentity.as_dict()...],
        "serials": [...], "homed": [...]}``; empty ``drives`` before :meth:`open`.
        """
        return {
            "driver": type(self).__name__,
            "backend": self.backend,
            "model": self.model.name,
            "bus": f"canopen://{self.channel}?interface={self.opts['interface']}",
            "drives": [d.as_dict() for d in self.drives],
            "serials": [d.serial for d in self.drives],
            "homed": list(self.homed),
        }

    @property
    def bus_report(self) -> dict[str, Any]:
        """How the driver uses the bus (sampling, supervision, mapping, units, the position
        windows moves are judged with, and the link's counters), JSON-ready."""
        return {
            "nmt_master": self.opts["nmt_master"],
            "sync_producer": self.opts["sync_producer"],
            "remap_pdos": self.opts["remap_pdos"],
            "sampling": self.sampling,
            "supervision": {str(n): s for n, s in self.supervision.items()},
            "tpdos": {str(n): [f"TPDO{u.number} 0x{u.can_id:03X} type {u.transmission_type}: "
                               + ", ".join(f[0] for f in u.fields) for u in uses]
                      for n, uses in self.tpdo_layout.items()},
            "units": [{"velocity": u.velocity_source, "accel": u.accel_source} for u in self.units],
            "windows": [w.as_dict() for w in self.windows],
            "link": {**self.link_stats.as_dict(), "sync_send_failures": self.sync_send_failures,
                     "fault": None if self._link_fault is None else str(self._link_fault)},
        }

    # -- SDO helpers ---------------------------------------------------------------------
    def sdo_read(self, node_id: int, index: int, subindex: int = 0) -> bytes:
        """Raw SDO upload. Raises :class:`SdoAbortError` or ``DriverTimeoutError``."""
        node = self._remote[node_id]
        rt = self._rt[node_id]
        with rt.sdo_lock:
            try:
                data = bytes(node.sdo.upload(index, subindex))
            except SdoAbortedError as exc:
                rt.seen_ns = time.monotonic_ns()
                raise SdoAbortError(node_id, index, subindex, exc.code, "read") from exc
            except SdoCommunicationError as exc:
                raise DriverTimeoutError(
                    f"node {node_id}: SDO read 0x{index:04X}:{subindex:02X}: {exc}"
                ) from exc
            except Exception as exc:
                raise self._sdo_link_error(exc, node_id, index, subindex, "read") from exc
        rt.seen_ns = time.monotonic_ns()
        return data

    def sdo_write(self, node_id: int, index: int, subindex: int, data: bytes) -> None:
        """Raw SDO download (expedited for up to 4 bytes)."""
        node = self._remote[node_id]
        rt = self._rt[node_id]
        with rt.sdo_lock:
            try:
                node.sdo.download(index, subindex, bytes(data))
            except SdoAbortedError as exc:
                rt.seen_ns = time.monotonic_ns()
                raise SdoAbortError(node_id, index, subindex, exc.code, "write") from exc
            except SdoCommunicationError as exc:
                raise DriverTimeoutError(
                    f"node {node_id}: SDO write 0x{index:04X}:{subindex:02X}: {exc}"
                ) from exc
            except Exception as exc:
                raise self._sdo_link_error(exc, node_id, index, subindex, "write") from exc
        rt.seen_ns = time.monotonic_ns()

    def _sdo_link_error(self, exc: Exception, node_id: int, index: int, subindex: int, op: str) -> Exception:
        """What an unexpected exception from an SDO transfer means: the link failed (a send
        refused by python-can, or canopen re-raising why its receive thread ended), or
        else a bug, raised as it is."""
        import can

        link = self._link_check()
        if link is None and not isinstance(exc, (can.CanError, OSError)):
            return exc
        if link is None:
            self._fail_link(CanLinkLost(f"{self!r}: the CAN link failed: SDO {op} of node {node_id} "
                                        f"0x{index:04X}:{subindex:02X}: {exc}", cause=str(exc)))
            link = self._link_fault
        assert link is not None
        return CanLinkLost(f"node {node_id}: SDO {op} 0x{index:04X}:{subindex:02X}: {link}", cause=link.cause)

    def _read_u8(self, node_id: int, index: int, sub: int = 0) -> int:
        return self.sdo_read(node_id, index, sub)[0]

    def _read_u16(self, node_id: int, index: int, sub: int = 0) -> int:
        return struct.unpack("<H", self.sdo_read(node_id, index, sub)[:2])[0]

    def _read_u32(self, node_id: int, index: int, sub: int = 0) -> int:
        return struct.unpack("<I", self.sdo_read(node_id, index, sub)[:4].ljust(4, b"\0"))[0]

    def _read_i32(self, node_id: int, index: int, sub: int = 0) -> int:
        return struct.unpack("<i", self.sdo_read(node_id, index, sub)[:4])[0]

    def _read_i8(self, node_id: int, index: int, sub: int = 0) -> int:
        return struct.unpack("<b", self.sdo_read(node_id, index, sub)[:1])[0]

    def _try(self, fn, *args: Any) -> Any:
        """``fn(*args)``, or ``None`` when the drive aborts (an optional object it lacks)."""
        try:
            return fn(*args)
        except SdoAbortError:
            return None

    def _write_u32(self, n: int, index: int, sub: int, value: int) -> None:
        self.sdo_write(n, index, sub, struct.pack("<I", int(value) & 0xFFFFFFFF))

    def nmt_state(self, node_id: int) -> NmtState | None:
        """NMT state from the node's latest heartbeat (or, without heartbeats, what the
        driver commanded or PDO traffic shows); ``None`` when unknown."""
        with self._lock:
            s = self._rt[node_id].nmt
        try:
            return None if s is None else NmtState(s)
        except ValueError:
            return None

    # -- open / close ---------------------------------------------------------------------
    def _open_internal(self) -> None:
        import can
        import canopen

        o = self.opts
        bus_kwargs: dict[str, Any] = {}
        if o["bitrate"]:
            bus_kwargs["bitrate"] = o["bitrate"]
        if o["receive_own_messages"]:
            bus_kwargs["receive_own_messages"] = True
        if o["sleep_after_open_s"] is not None:
            bus_kwargs["sleep_after_open"] = o["sleep_after_open_s"]
        try:
            # an SLCAN link gets a receive path that drops garbled lines (cellcal.drivers.can_link)
            bus = make_bus(o["interface"], self.channel, self.link_stats, **bus_kwargs)
        except (can.CanError, OSError, ValueError, ImportError) as exc:
            raise DriverInitError(f"{self!r}: cannot open the CAN bus: {exc}") from exc
        net = canopen.Network(bus)
        net.NOTIFIER_CYCLE = 0.05  # bounds how long close() waits for the receive thread
        for node_id in self.nodes:
            node = canopen.RemoteNode(node_id, build_object_dictionary())
            node.sdo.RESPONSE_TIMEOUT = o["sdo_timeout_s"]
            net.add_node(node)
            self._remote[node_id] = node
            net.subscribe(HEARTBEAT_COB_BASE + node_id, self._on_heartbeat)
            net.subscribe(EMCY_COB_BASE + node_id, self._on_emcy)
        net.subscribe(SYNC_COB_ID, self._on_sync_frame)
        try:
            net.connect()
        except (can.CanError, OSError, ValueError) as exc:
            bus.shutdown()
            raise DriverInitError(f"{self!r}: cannot open the CAN bus: {exc}") from exc
        self.network = net
        try:
            try:
                self._configure()
            except (SdoAbortError, DriverTimeoutError, CanLinkLost) as exc:
                raise DriverInitError(f"{self!r}: configuration failed: {exc}") from exc
            self._start_threads()
            if self.sampling != SAMPLING_SDO and not self._wait_first_sample():
                if o["pdo"] == "on":
                    raise DriverInitError(f"{self!r}: no TPDO sample within "
                                          f"{self._first_sample_timeout_s():.2g} s (pdo=on)")
                log.warning("%r: no TPDO sample came (%s sampling, %s); falling back to SDO polling: "
                            "joints read one after another, not sampled together", self, self.sampling,
                            "SYNC from another master" if not o["sync_producer"] else "our SYNC")
                self.sampling = SAMPLING_SDO
            if o["enable"] == "open":
                self._enable_all(time.monotonic() + o["boot_timeout_s"])
        except BaseException:
            self._close_internal()
            raise

    def _configure(self) -> None:
        o = self.opts
        # 0. pre-operational: SDO and PDO set-up allowed; a STOPPED node answers no SDO
        if o["nmt_master"]:
            for n in self.nodes:
                self._nmt_command(n, NmtCommand.ENTER_PRE_OPERATIONAL)
        # 1. every node answers (liveness probe), 2. identity
        self._probe_nodes()
        self.drives = tuple(self._read_identity(n) for n in self.nodes)
        for d in self.drives:
            log.info("%r: node %d: profile %d, vendor 0x%s, product 0x%s, revision 0x%s, serial %s%s",
                     self, d.node_id, d.profile, _hex(d.vendor_id), _hex(d.product_code), _hex(d.revision),
                     d.serial, f", {d.device_name!r}" if d.device_name else "")
        # 3. heartbeat time: configured ones written *before* any heartbeat is awaited
        self._setup_supervision()
        # 4. units and limits
        self._setup_units()
        # 5. homing state
        if o["homing_required"]:
            self.homed = tuple(self._homing_state(n) for n in self.nodes)
            missing = [j + 1 for j, h in enumerate(self.homed) if not h]
            if missing:
                log.warning("%r: joint(s) %s not homed (homing_required=true): moves will be refused", self, missing)
        # 6. sampling: PDOs
        if o["pdo"] != "off":
            self._setup_pdos()
        self._setup_windows()
        # 7. operational, confirmed by the next heartbeat of every beating node
        if o["nmt_master"]:
            with self._lock:
                for n in self.nodes:
                    if self._rt[n].supervision == "heartbeat":
                        self._rt[n].nmt = None
            for n in self.nodes:
                self._nmt_command(n, NmtCommand.START)
            beating = [n for n in self.nodes if self._rt[n].supervision == "heartbeat"]
            period = max((self._rt[n].hb_period_s for n in beating), default=0.0)
            deadline = time.monotonic() + 3 * period + 0.05
            with self._lock:
                while True:
                    pending = [n for n in beating if self._rt[n].nmt != NmtState.OPERATIONAL]
                    if not pending:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        states = {n: self._rt[n].nmt for n in pending}
                        raise DriverInitError(f"{self!r}: node(s) did not enter OPERATIONAL: {states}")
                    self._lock.wait(remaining)
        with self._lock:
            self._configured = True
            now = time.monotonic_ns()
            for rt in self._rt.values():
                rt.seen_ns = max(rt.seen_ns, now)  # supervision starts now

    def _setup_windows(self) -> None:
        """Write the configured position windows, then read back what every drive uses: a
        move is complete only inside them (``cellcal.drivers.cia402_motion``). A drive
        without 0x6067 / 0x6068 is judged with the configured values, else the fallback."""
        o = self.opts
        counts_per_rad = 1.0 / self.scaling.rad_per_count
        windows = []
        for j, n in enumerate(self.nodes):
            for index, key, pack in ((Od.POSITION_WINDOW, "position_window_counts", "<I"),
                                     (Od.POSITION_WINDOW_TIME, "position_window_time_ms", "<H")):
                if o[key] < 0:
                    continue
                try:
                    self.sdo_write(n, index, 0, struct.pack(pack, o[key]))
                except SdoAbortError as exc:
                    if exc.abort_code != ABORT_OBJECT_MISSING:
                        raise
            read_counts = self._try(self._read_u32, n, Od.POSITION_WINDOW, 0)
            read_ms = self._try(self._read_u16, n, Od.POSITION_WINDOW_TIME, 0)
            w = resolve_window(read_counts, read_ms, configured_counts=o["position_window_counts"],
                               configured_time_ms=o["position_window_time_ms"],
                               counts_per_rad=float(counts_per_rad[j]))
            windows.append(w)
            deg = w.counts * abs(math.degrees(float(self.scaling.rad_per_count[j])))
            if w.source != "drive":
                lacks = [f"0x6067 {'switched off' if read_counts is not None else 'missing'}"
                         if read_counts is None or read_counts == 0xFFFFFFFF else "",
                         "0x6068 missing" if read_ms is None else ""]
                log.warning("%r: joint %d (node %d): %s: its moves are judged with %d counts (%.3g deg) for "
                            "%.0f ms (%s); set position_window_counts and position_window_time_ms to the drive's "
                            "own window", self, j + 1, n, ", ".join(x for x in lacks if x), w.counts, deg,
                            w.time_s * 1e3, w.source)
            else:
                log.info("%r: joint %d (node %d): position window %d counts (%.3g deg) for %.0f ms", self, j + 1, n,
                         w.counts, deg, w.time_s * 1e3)
        self.windows = tuple(windows)

    def _nmt_command(self, n: int, cmd: NmtCommand) -> None:
        self._remote[n].nmt.send_command(int(cmd))
        with self._lock:
            rt = self._rt[n]
            if rt.supervision != "heartbeat" or not rt.hb_period_s:
                rt.nmt = {NmtCommand.START: NmtState.OPERATIONAL, NmtCommand.STOP: NmtState.STOPPED,
                          NmtCommand.ENTER_PRE_OPERATIONAL: NmtState.PRE_OPERATIONAL}.get(cmd)

    def _probe_nodes(self) -> None:
        """Every node must answer an SDO read of 0x1000 within ``boot_timeout_s``."""
        o = self.opts
        deadline = time.monotonic() + o["boot_timeout_s"]
        pending = list(self.nodes)
        while True:
            for n in list(pending):
                try:
                    self.sdo_read(n, Od.DEVICE_TYPE)
                    pending.remove(n)
                except DriverTimeoutError:
                    pass
                except SdoAbortError:
                    pending.remove(n)  # it answered: alive (0x1000 is mandatory; say so below)
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise DriverInitError(
                    f"{self!r}: no SDO answer from node(s) {pending} within {o['boot_timeout_s']} s "
                    "(not powered, wrong node id or bitrate, or NMT stopped)"
                )
            time.sleep(0.01)

    def _read_identity(self, n: int) -> DriveIdentity:
        try:
            device_type = self._read_u32(n, Od.DEVICE_TYPE)
        except SdoAbortError as exc:
            raise DriverInitError(f"{self!r}: node {n}: no device type 0x1000 (mandatory in CiA 301): {exc}") from exc
        if self.opts["check_device_type"] and device_type & 0xFFFF != 402:
            raise DriverInitError(
                f"{self!r}: node {n}: device type 0x1000 = 0x{device_type:08X} is profile "
                f"{device_type & 0xFFFF}, not a CiA 402 drive (wrong node id? check_device_type=false skips this)"
            )
        vals = [self._try(self._read_u32, n, Od.IDENTITY, sub) for sub in (1, 2, 3, 4)]
        strings = []
        for idx in (Od.DEVICE_NAME, Od.HARDWARE_VERSION, Od.SOFTWARE_VERSION):
            raw = self._try(self.sdo_read, n, idx, 0)
            strings.append(None if raw is None else raw.rstrip(b"\0").decode("latin-1", "replace").strip())
        return DriveIdentity(n, device_type, *vals, *strings)

    def _setup_supervision(self) -> None:
        o = self.opts
        t_written = time.monotonic_ns()
        for n in self.nodes:
            if o["heartbeat_ms"]:
                self.sdo_write(n, Od.PRODUCER_HEARTBEAT_TIME, 0, struct.pack("<H", o["heartbeat_ms"]))
        for n in self.nodes:
            period_ms = self._read_u16(n, Od.PRODUCER_HEARTBEAT_TIME)
            rt = self._rt[n]
            rt.hb_period_s = period_ms * 1e-3
            rt.supervision = "heartbeat" if period_ms else "sdo"
        silent = [n for n in self.nodes if self._rt[n].supervision == "sdo"]
        if silent:
            log.info("%r: node(s) %s have heartbeats off (0x1017 = 0) and heartbeat_ms is not set: "
                     "supervising them by SDO (statusword read when silent for %.0f ms)",
                     self, silent, o["liveness_period_ms"])
        beating = [n for n in self.nodes if n not in silent]
        if not beating:
            return
        longest = max(self._rt[n].hb_period_s for n in beating)
        deadline = time.monotonic() + 2.5 * longest + 0.1
        with self._lock:
            while True:
                missing = [n for n in beating if self._rt[n].hb_ns <= t_written]
                if not missing:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    periods = {n: int(self._rt[n].hb_period_s * 1e3) for n in missing}
                    raise DriverInitError(f"{self!r}: node(s) {missing}: heartbeat time (ms) {periods} "
                                          f"but no heartbeat within {(2.5 * longest + 0.1) * 1e3:.0f} ms")
                self._lock.wait(remaining)

    def _read_pair(self, n: int, index: int) -> tuple[int, int] | None:
        a = self._try(self._read_u32, n, index, 1)
        if a is None:
            return None
        b = self._try(self._read_u32, n, index, 2)
        return None if b is None else (a, b)

    def _setup_units(self) -> None:
        o = self.opts
        units, vmax, amax, dmax, profile_types = [], [], [], [], []
        for j, n in enumerate(self.nodes):
            objs = DriveUnitObjects(
                si_velocity=self._try(self._read_u32, n, Od.SI_UNIT_VELOCITY, 0),
                position_factor=self._read_pair(n, Od.POSITION_FACTOR),
                velocity_encoder_factor=self._read_pair(n, Od.VELOCITY_ENCODER_FACTOR),
                acceleration_factor=self._read_pair(n, Od.ACCELERATION_FACTOR),
                encoder_resolution=self._read_pair(n, Od.POSITION_ENCODER_RESOLUTION),
            )
            try:
                u = resolve_joint_units(
                    counts_per_rev=float(o["counts_per_rev"][j]), gear_ratio=float(o["gear_ratio"][j]),
                    velocity_units=o["velocity_units"][j], velocity_factor=float(o["velocity_factor"][j]),
                    accel_units=o["accel_units"][j], accel_factor=float(o["accel_factor"][j]), drive=objs,
                )
            except ValueError as exc:
                raise DriverInitError(f"{self!r}: joint {j + 1} (node {n}): {exc}") from None
            units.append(u)
            vmax.append(self._try(self._read_u32, n, Od.MAX_PROFILE_VELOCITY, 0))
            amax.append(self._try(self._read_u32, n, Od.MAX_ACCELERATION, 0))
            dmax.append(self._try(self._read_u32, n, Od.MAX_DECELERATION, 0))
            profile_types.append(self._try(self._read_u16, n, Od.MOTION_PROFILE_TYPE, 0))
        try:
            self.limits = check_joint_limits(
                units, o["max_joint_speed_rad_s"], o["max_joint_accel_rad_s2"], o["max_joint_decel_rad_s2"],
                drive_max_velocity=vmax, drive_max_accel=amax, drive_max_decel=dmax,
                names=[f"joint {j + 1} (node {n})" for j, n in enumerate(self.nodes)],
            )
        except ValueError as exc:
            raise DriverInitError(f"{self!r}: {exc}") from None
        self.units = tuple(units)
        for j, u in enumerate(units):
            log.info("%r: joint %d (node %d): velocity unit %s, acceleration unit %s", self, j + 1,
                     self.nodes[j], u.velocity_source, u.accel_source)
        for note in self.limits.notes:
            log.warning("%r: %s", self, note)
        known = {p for p in profile_types if p is not None}
        if len(known) > 1:
            log.warning("%r: the drives use different motion profile types 0x6086 %s: joints will not "
                        "arrive together", self, profile_types)
        # the drive's own velocity estimate is worth reading only if one unit resolves motion
        self._use_drive_velocity = np.array(
            [u.rad_s_per_velocity_unit <= o["moving_threshold_rad_s"] for u in units], dtype=bool
        )

    def _homing_state(self, n: int) -> bool | None:
        """Homed? Statusword bit 12 is *homing attained* only in homing mode (6), so read it
        there, restoring the mode afterwards; ``None`` if the drive cannot tell."""
        display = self._try(self._read_i8, n, Od.MODES_OF_OPERATION_DISPLAY, 0)
        if display != MODE_HOMING:
            if self.opts["enable"] == "never":
                return None  # switching modes would disturb whoever commands the drive
            requested = self._try(self._read_i8, n, Od.MODES_OF_OPERATION, 0)
            try:
                self.sdo_write(n, Od.MODES_OF_OPERATION, 0, struct.pack("<b", MODE_HOMING))
            except SdoAbortError as exc:
                log.warning("%r: node %d has no homing mode (%s): homing state unknown", self, n, exc)
                return None
            try:
                if not self._wait_mode(n, MODE_HOMING, 0.5):
                    return None
                sw = self._read_u16(n, Od.STATUSWORD)
            finally:
                restore = requested if requested not in (None, MODE_HOMING) else MODE_PROFILE_POSITION
                try:
                    self.sdo_write(n, Od.MODES_OF_OPERATION, 0, struct.pack("<b", restore))
                except SdoAbortError:
                    self._try(self.sdo_write, n, Od.MODES_OF_OPERATION, 0, struct.pack("<b", MODE_PROFILE_POSITION))
        else:
            sw = self._read_u16(n, Od.STATUSWORD)
        if sw & Statusword.HOMING_ERROR:
            log.warning("%r: node %d reports a homing error (statusword 0x%04X)", self, n, sw)
            return False
        return bool(sw & Statusword.HOMING_ATTAINED)

    def _wait_mode(self, n: int, mode: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if self._try(self._read_i8, n, Od.MODES_OF_OPERATION_DISPLAY, 0) == mode:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)

    def _read_tpdos(self, n: int) -> tuple[TpdoConfig, ...]:
        out = []
        for k in range(N_TPDOS):
            cob = self._try(self._read_u32, n, Od.TPDO1_COMMUNICATION + k, 1)
            if cob is None:
                continue  # the drive has fewer TPDOs
            ttype = self._try(self._read_u8, n, Od.TPDO1_COMMUNICATION + k, 2)
            count = self._try(self._read_u8, n, Od.TPDO1_MAPPING + k, 0) or 0
            entries = []
            for sub in range(1, min(count, 8) + 1):
                e = self._try(self._read_u32, n, Od.TPDO1_MAPPING + k, sub)
                if e is not None:
                    entries.append(e)
            out.append(TpdoConfig(k + 1, cob, 0xFF if ttype is None else ttype, tuple(entries)))
        return tuple(out)

    def _setup_pdos(self) -> None:
        o = self.opts
        self.tpdo_configs = {n: self._read_tpdos(n) for n in self.nodes}
        for n, cfgs in self.tpdo_configs.items():
            log.debug("%r: node %d as found: %s", self, n, "; ".join(c.describe() for c in cfgs))
        layout: dict[int, tuple[TpdoUse, ...]] = {}
        refused: SdoAbortError | None = None
        if o["remap_pdos"]:
            for n in self.nodes:
                try:
                    self._map_tpdo1(n)
                except SdoAbortError as exc:
                    refused = exc
                    first = next((c for c in self.tpdo_configs[n] if c.number == 1), None)
                    if first is not None:  # put TPDO1 back as it was
                        self._try(self._write_u32, n, Od.TPDO1_COMMUNICATION, 1, first.cob_id)
                    break
                layout[n] = (TpdoUse(1, TPDO1_COB_BASE + n, TRANSMISSION_SYNC_EVERY,
                                     (("position", 0, 4, True), ("statusword", 4, 2, False))),)
            if refused is not None:
                if o["pdo"] == "on" and not self._existing_layout():
                    raise refused
                log.warning("%r: TPDO1 mapping refused (%s); looking at the drives' own mapping", self, refused)
                layout = self._existing_layout() or {}
                if layout:
                    self._restore_tpdo1_others(refused.node_id)
        else:
            layout = self._existing_layout() or {}
        if o["remap_pdos"]:
            self._disable_unused_tpdos(layout)
        if len(layout) != len(self.nodes):
            missing = [n for n in self.nodes if n not in layout]
            if o["pdo"] == "on":
                raise DriverInitError(f"{self!r}: node(s) {missing}: no TPDO carries 0x6064 and 0x6041 (pdo=on); "
                                      + "; ".join(c.describe() for n in missing for c in self.tpdo_configs[n]))
            log.warning(
                "%r: node(s) %s: no usable TPDO carries 0x6064 and 0x6041 (%s); sampling by SDO polling: "
                "joints read one after another (2-3 SDO round trips per joint per sample), not together",
                self, missing, "; ".join(c.describe() for c in self.tpdo_configs.get(missing[0], ())) or "no TPDOs")
            self.sampling = SAMPLING_SDO
            self.tpdo_layout = {}
            return
        self.tpdo_layout = layout
        self._cob_uses = {u.can_id: (n, u) for n, uses in layout.items() for u in uses}
        synchronous = all(u.synchronous for uses in layout.values() for u in uses)
        self.sampling = SAMPLING_SYNC if synchronous else SAMPLING_EVENT
        for can_id in self._cob_uses:
            self.network.subscribe(can_id, self._on_tpdo)
        where = "remapped TPDO1" if o["remap_pdos"] and refused is None else "the drives' own mapping"
        desc = "; ".join(f"node {n}: " + ", ".join(
            f"TPDO{u.number} 0x{u.can_id:03X} type {u.transmission_type} [{', '.join(f[0] for f in u.fields)}]"
            for u in uses) for n, uses in layout.items())
        if synchronous:
            log.info("%r: sampling on SYNC (%s, %s): one coherent joint vector per SYNC; %s", self, where,
                     "our SYNC" if o["sync_producer"] else "another master's SYNC", desc)
        else:
            log.warning("%r: sampling from event-driven TPDOs (%s): joints are NOT sampled together (each "
                        "joint's value is as of its own frame; t_host_ns is the mean arrival); %s", self, where, desc)
        if not o["sync_producer"]:
            cob = self._try(self._read_u32, self.nodes[0], Od.COB_ID_SYNC, 0)
            if cob is not None and cob & 0x7FF != SYNC_COB_ID:
                self.network.unsubscribe(SYNC_COB_ID, self._on_sync_frame)
                self._sync_cob = cob & 0x7FF
                self.network.subscribe(self._sync_cob, self._on_sync_frame)
                log.info("%r: SYNC COB-ID 0x%03X (0x1005 of node %d)", self, self._sync_cob, self.nodes[0])

    def _existing_layout(self) -> dict[int, tuple[TpdoUse, ...]] | None:
        out = {}
        for n in self.nodes:
            found = find_tpdo_layout(self.tpdo_configs.get(n, ()))
            if found is None:
                return None
            out[n] = found
        return out

    def _restore_tpdo1_others(self, refused_node: int) -> None:
        """TPDO1 was remapped on the nodes before the one that refused: give them back the
        mapping they had (they are used as found)."""
        for n in self.nodes:
            if n == refused_node:
                break
            first = next((c for c in self.tpdo_configs[n] if c.number == 1), None)
            if first is None:
                continue
            self._try(self._write_u32, n, Od.TPDO1_COMMUNICATION, 1, first.cob_id | PDO_NOT_VALID)
            self._try(self.sdo_write, n, Od.TPDO1_COMMUNICATION, 2, bytes([first.transmission_type]))
            self._try(self.sdo_write, n, Od.TPDO1_MAPPING, 0, b"\x00")
            for sub, e in enumerate(first.mapping, 1):
                self._try(self._write_u32, n, Od.TPDO1_MAPPING, sub, e)
            self._try(self.sdo_write, n, Od.TPDO1_MAPPING, 0, bytes([len(first.mapping)]))
            self._try(self._write_u32, n, Od.TPDO1_COMMUNICATION, 1, first.cob_id)

    def _disable_unused_tpdos(self, layout: Mapping[int, tuple[TpdoUse, ...]]) -> None:
        """Set bit 31 (not valid) of every valid TPDO the driver does not decode, so factory
        event-driven TPDOs stop loading the bus."""
        for n in self.nodes:
            used = {u.number for u in layout.get(n, ())}
            for cfg in self.tpdo_configs.get(n, ()):
                if cfg.number in used or not cfg.valid:
                    continue
                try:
                    self._write_u32(n, Od.TPDO1_COMMUNICATION + cfg.number - 1, 1, cfg.cob_id | PDO_NOT_VALID)
                    log.info("%r: node %d: TPDO%d disabled (unused)", self, n, cfg.number)
                except SdoAbortError as exc:
                    log.warning("%r: node %d: TPDO%d cannot be disabled: %s", self, n, cfg.number, exc)

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

    def _start_threads(self) -> None:
        if self.sampling != SAMPLING_SDO and self.opts["sync_producer"]:
            self._threads.append(threading.Thread(target=self._sync_loop, name="canopen-sync", daemon=True))
        self._threads.append(threading.Thread(target=self._supervise_loop, name="canopen-supervise", daemon=True))
        for t in self._threads:
            t.start()

    def _first_sample_timeout_s(self) -> float:
        period = self.opts["sync_period_ms"] * 1e-3
        if not self.opts["sync_producer"] or self.sampling == SAMPLING_EVENT:
            period = max(period, 0.1)  # someone else's rate
        return max(1.0, 10 * period)  # a busy host or a slow adapter must not force SDO polling for good

    def _wait_first_sample(self) -> bool:
        deadline = time.monotonic() + self._first_sample_timeout_s()
        with self._lock:
            while self._latest is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
        return True

    def _close_internal(self) -> None:
        self._stop_evt.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self._threads = []
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
        now = time.monotonic_ns()
        with self._lock:
            rt = self._rt[node]
            rt.hb_ns = rt.seen_ns = now
            rt.nmt = state
            if state == NmtState.BOOT_UP and self._configured:
                self._rebooted.add(node)
            self._lock.notify_all()

    def _on_emcy(self, can_id: int, data: bytearray, timestamp: float) -> None:
        node = can_id - EMCY_COB_BASE
        if len(data) < 3:
            return
        code, register = struct.unpack_from("<HB", data)
        self._rt[node].seen_ns = time.monotonic_ns()
        self.emergencies.append((node, code, register))
        if code:
            with self._lock:
                self._emcy_since_move[node] = code  # named in a fault during the move
            log.warning("%r: node %d EMCY: error code 0x%04X, error register 0x%02X", self, node, code, register)
        else:
            log.info("%r: node %d EMCY: error reset", self, node)

    def _on_sync_frame(self, can_id: int, data: bytearray, timestamp: float) -> None:
        """A SYNC on the bus that this driver did not send."""
        if self.opts["sync_producer"]:
            if self.opts["receive_own_messages"]:
                return  # our own SYNC, echoed
            if not self._foreign_sync_logged:
                self._foreign_sync_logged = True
                log.warning("%r: another SYNC producer is on the bus (COB-ID 0x%03X); with two the "
                            "samples are not coherent -- set sync_producer=false", self, can_id)
            return
        stamp = time.monotonic_ns()
        with self._lock:
            cyc = self._cycle
            if cyc is not None:
                self.abandoned_cycles += 1
                if cyc.got:
                    self.incomplete_cycles += 1
            self._cycle = _Cycle(stamp)

    def _on_tpdo(self, can_id: int, data: bytearray, timestamp: float) -> None:
        recv_ns = time.monotonic_ns()
        entry = self._cob_uses.get(can_id)
        if entry is None:
            return
        node, use = entry
        values = use.decode(bytes(data))
        if values is None:
            self.bad_frames += 1
            return
        with self._lock:
            rt = self._rt[node]
            rt.seen_ns = recv_ns
            rt.nmt = NmtState.OPERATIONAL  # CiA 301: only an operational node sends PDOs
            if self._watch is not None and "statusword" in values:
                # every statusword, not only those of complete cycles: a fault must not slip by
                self._watch.note_statusword(node, values["statusword"], recv_ns)
            if self.sampling == SAMPLING_EVENT:
                self._async.setdefault(node, {}).update(values)
                self._async_recv[node] = recv_ns
                self._publish_async()
                return
            cyc = self._cycle
            if cyc is None:
                return
            got = cyc.got.setdefault(node, {})
            if any(k in got for k in values):
                return  # a second frame of the same TPDO in one cycle
            got.update(values)
            cyc.last_recv_ns = recv_ns
            if len(cyc.got) == N_JOINTS and all(self._node_complete(n, cyc.got[n]) for n in self.nodes):
                self._cycle = None
                if cyc.stamp_ns - self._last_clock_feed_ns >= 20_000_000:  # 50 Hz: refits are costly
                    self.clock.add(cyc.stamp_ns * 1e-9, recv_ns)
                    self._last_clock_feed_ns = cyc.stamp_ns
                self._publish_values(cyc.got, cyc.stamp_ns, recv_ns)

    def _node_complete(self, n: int, got: Mapping[str, int]) -> bool:
        want = {f[0] for u in self.tpdo_layout.get(n, ()) for f in u.fields}
        return want <= got.keys()

    def _publish_async(self) -> None:
        # caller holds self._lock; a vector once every node has sent since the last one
        if len(self._async_recv) < N_JOINTS or not all(
            {"position", "statusword"} <= self._async.get(n, {}).keys() for n in self.nodes
        ):
            return
        arrivals = np.array([self._async_recv[n] for n in self.nodes], dtype=np.int64)
        got = {n: dict(self._async[n]) for n in self.nodes}
        self._async_recv.clear()
        self._publish_values(got, int(arrivals.mean()), int(arrivals.max()))

    def _publish_values(self, got: Mapping[int, Mapping[str, int]], t_ns: int, recv_ns: int) -> None:
        counts = np.array([got[n]["position"] for n in self.nodes], dtype=float)
        sws = np.array([got[n]["statusword"] for n in self.nodes], dtype=np.int64)
        vel = None
        if all("velocity" in got[n] for n in self.nodes):
            vel = np.array([got[n]["velocity"] for n in self.nodes], dtype=float)
        self._publish(counts, sws, vel, t_ns, recv_ns)

    def _drive_velocity_rad_s(self, vel_units: np.ndarray) -> np.ndarray:
        per_unit = np.array([u.velocity_unit_counts_s for u in self.units]) if self.units else np.ones(N_JOINTS)
        return vel_units * per_unit * self.scaling.rad_per_count

    def _publish(self, counts: np.ndarray, sws: np.ndarray, vel: np.ndarray | None, t_ns: int,
                 recv_ns: int) -> None:
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
        if vel is not None and np.any(self._use_drive_velocity):
            # the drive's own estimate at the sample instant (the fit lags by half its window)
            v_drive = self._drive_velocity_rad_s(vel)
            take = self._use_drive_velocity & (np.abs(v_drive) > np.abs(qd))
            qd = np.where(take, v_drive, qd)
        self._statuswords = sws
        self._last_counts = counts
        states = [cia402_state(int(s)) for s in sws]
        for j, n in enumerate(self.nodes):
            if n in self._commanded and states[j] is not Cia402State.OPERATION_ENABLED:
                self._commanded.discard(n)  # no longer executing what cellcal commanded
                self._left_enabled.add(n)
        reached: bool | None = None
        watch = self._watch
        if watch is not None:
            # target reached is the driver's verdict on the actual positions, not bit 10 alone
            mask = np.array([n in self._commanded for n in self.nodes])
            verdict = watch.update(t_ns, counts, sws, mask)
            if watch.fault is not None or watch.error is not None:
                reached = False  # latched until the next move
            elif mask.any():
                reached = verdict
        lin, ang = self.model.flange_speed(q, qd)
        self._seq += 1
        self._latest = RobotState(
            q_rad=q,
            qd_rad_s=qd,
            base_T_flange=self.model.forward(q),
            t_device_s=t_s,
            t_host_ns=t_ns,
            moving=bool(np.max(np.abs(qd)) > self.opts["moving_threshold_rad_s"]) or reached is False,
            mode=self._mode(states),
            flange_speed_m_s=lin,
            flange_ang_speed_rad_s=ang,
            target_reached=reached,
            t_recv_host_ns=recv_ns,
            seq=self._seq,
        )
        self._lock.notify_all()

    def _mode(self, states: Sequence[Cia402State | None]) -> RobotMode:
        nmt = [self._rt[n].nmt for n in self.nodes]
        if any(s in (Cia402State.FAULT, Cia402State.FAULT_REACTION_ACTIVE) for s in states):
            return RobotMode.FAULT
        if any(s is Cia402State.QUICK_STOP_ACTIVE for s in states):
            return RobotMode.PROTECTIVE_STOP
        if any(x is not None and x != NmtState.OPERATIONAL for x in nmt) and self.sampling != SAMPLING_SDO:
            return RobotMode.BOOTING
        if any(x in (NmtState.BOOT_UP, NmtState.STOPPED) for x in nmt):
            return RobotMode.BOOTING
        if all(s is Cia402State.OPERATION_ENABLED for s in states):
            return RobotMode.RUNNING
        if any(s is None or s is Cia402State.NOT_READY_TO_SWITCH_ON for s in states):
            return RobotMode.UNKNOWN
        return RobotMode.IDLE

    # -- SYNC production and supervision ------------------------------------------------
    def _sync_loop(self) -> None:
        """SYNC, collect the six nodes' TPDOs, repeat.

        The next SYNC goes out only once the current cycle is complete or its period is
        over, so a TPDO can never be counted in a later cycle than the SYNC it answers.
        After an incomplete cycle the loop stays silent for one more period and drops
        whatever arrives in it (late frames of the abandoned cycle).
        """
        period_ns = int(self.opts["sync_period_ms"] * 1e6)
        while not self._stop_evt.is_set():
            if self._link_check() is not None:
                return  # the link is down: no SYNC until the driver is reopened
            tick = time.monotonic_ns()
            complete = True
            cyc = _Cycle(time.monotonic_ns())
            with self._lock:
                self._cycle = cyc if self.sampling == SAMPLING_SYNC else None
            try:
                self.network.send_message(SYNC_COB_ID, b"")
                self._sync_failures_in_row = 0
            except Exception as exc:  # noqa: BLE001 - a send error must not kill sampling
                if self._sync_failed(exc):
                    return  # the link is down: no SYNC until the driver is reopened
            if self.sampling == SAMPLING_SYNC:
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
                        self.abandoned_cycles += 1
                        if cyc.got:
                            self.incomplete_cycles += 1
            elif self.sampling == SAMPLING_SDO:
                return
            wait_ns = tick + period_ns * (1 if complete else 2) - time.monotonic_ns()
            if wait_ns > 0:
                self._stop_evt.wait(wait_ns * 1e-9)

    def _sync_failed(self, exc: Exception) -> bool:
        """Count a failed SYNC send; log it rate-limited; after ``sync_fail_limit`` in a row
        the link is failed (``True``: stop producing SYNC)."""
        self.sync_send_failures += 1
        self._sync_failures_in_row += 1
        self._sync_log("%r: SYNC send failed (%d in a row, %d in all): %s", self, self._sync_failures_in_row,
                       self.sync_send_failures, exc)
        if self._link_check() is not None:
            return True  # the receive path is gone already: SYNC cannot help
        if self._sync_failures_in_row < self.opts["sync_fail_limit"]:
            return False
        self._fail_link(CanLinkLost(
            f"{self!r}: the CAN link failed: {self._sync_failures_in_row} SYNC sends in a row failed ({exc}); "
            "reopen the driver", failures=self._sync_failures_in_row, cause=str(exc)))
        return True

    def _fail_link(self, fault: CanLinkLost) -> None:
        with self._lock:
            if self._link_fault is None:
                self._link_fault = fault
            self._lock.notify_all()

    def _link_check(self) -> CanLinkLost | None:
        """The link fault, if any: SYNC could not be sent, or python-can's receive thread
        ended (the adapter's port failed: nothing more is received until a reopen)."""
        if self._link_fault is not None:
            return self._link_fault
        if self.link_stats.port_error:
            self._fail_link(CanLinkLost(f"{self!r}: the CAN link failed: the adapter's port: "
                                        f"{self.link_stats.port_error}; reopen the driver",
                                        cause=self.link_stats.port_error))
            return self._link_fault
        net = self.network
        notifier = getattr(net, "notifier", None)
        exc = getattr(notifier, "exception", None)
        if exc is not None:
            self._fail_link(CanLinkLost(f"{self!r}: the CAN link failed: the receive path stopped ({exc!r}); "
                                        "reopen the driver", cause=repr(exc)))
        return self._link_fault

    def _supervise_loop(self) -> None:
        """Log a lost node once; poll silent heartbeat-less nodes by SDO."""
        period_s = self.opts["liveness_period_ms"] * 1e-3
        tick = min(period_s, 0.05)
        while not self._stop_evt.wait(tick):
            now = time.monotonic_ns()
            for n in self.nodes:
                rt = self._rt[n]
                if rt.supervision != "sdo" or (now - rt.seen_ns) * 1e-9 < period_s:
                    continue
                try:
                    self.sdo_read(n, Od.STATUSWORD)
                    rt.liveness_fail_since_ns = 0
                except (DriverTimeoutError, SdoAbortError):
                    if not rt.liveness_fail_since_ns:
                        rt.liveness_fail_since_ns = now
                except Exception:  # noqa: BLE001 - e.g. closing: the loop ends at the next wait
                    pass
            link = self._link_check()
            if link is not None and not self._link_logged:
                log.error("%s", link)
                self._link_logged = True
            fault = self._heartbeat_fault()
            if fault is not None and not self._hb_logged:
                log.error("%r: %s", self, fault)
                self._hb_logged = True
            elif fault is None:
                self._hb_logged = False

    def _heartbeat_fault(self) -> DeviceGoneError | None:
        with self._lock:
            if not self._configured:
                return None
            for n in self.nodes:
                if n in self._rebooted:
                    return NodeRebooted(n)
            now = time.monotonic_ns()
            factor = self.opts["heartbeat_timeout_factor"]
            for n in self.nodes:
                rt = self._rt[n]
                if rt.supervision == "heartbeat":
                    silent = (now - rt.hb_ns) * 1e-9 if rt.hb_ns else 0.0
                    if silent > factor * rt.hb_period_s:
                        return HeartbeatLost(n, silent, rt.hb_period_s)
                else:
                    period = self.opts["liveness_period_ms"] * 1e-3
                    silent = (now - rt.seen_ns) * 1e-9
                    limit = factor * period + self.opts["sdo_timeout_s"]
                    if rt.liveness_fail_since_ns and silent > limit:
                        return HeartbeatLost(n, silent, period, via="sdo")
        return None

    def _read_state_internal(self, deadline: float) -> RobotState | None:
        link = self._link_check()
        if link is not None:
            raise link
        fault = self._heartbeat_fault()
        if fault is not None:
            raise fault
        if self.sampling == SAMPLING_SDO:
            return self._read_state_sdo()
        max_age_ns = int(self.max_age_s * 1e9)
        with self._lock:
            while True:
                s = self._latest
                if s is not None and time.monotonic_ns() - s.t_recv_host_ns <= max_age_ns:
                    return s
                remaining = remaining_s(deadline)
                if remaining <= 0 or self._closed:
                    return None
                self._lock.wait(min(remaining, 0.05))
                if self._link_fault is not None or self._heartbeat_fault() is not None:
                    break
        fault = self._link_check() or self._heartbeat_fault()
        if fault is not None:
            raise fault
        return None

    def _read_state_sdo(self) -> RobotState:
        t0 = time.monotonic_ns()
        got: dict[int, dict[str, int]] = {}
        read_vel = bool(np.any(self._use_drive_velocity)) and self._sdo_velocity is not False
        for n in self.nodes:
            got[n] = {"position": self._read_i32(n, Od.POSITION_ACTUAL_VALUE),
                      "statusword": self._read_u16(n, Od.STATUSWORD)}
            if read_vel:
                try:
                    got[n]["velocity"] = self._read_i32(n, Od.VELOCITY_ACTUAL_VALUE)
                    self._sdo_velocity = True
                except SdoAbortError:
                    self._sdo_velocity = read_vel = False  # the drive has no 0x606C
        t1 = time.monotonic_ns()
        if not read_vel:
            for g in got.values():
                g.pop("velocity", None)
        with self._lock:
            self._publish_values(got, (t0 + t1) // 2, t1)
            return self._latest  # type: ignore[return-value]

    # -- CiA 402 control ------------------------------------------------------------------
    def _controlword(self, n: int, cw: int) -> None:
        self.sdo_write(n, Od.CONTROLWORD, 0, struct.pack("<H", int(cw)))

    def _setup_controlword(self, n: int, cw: int) -> None:
        """A controlword of a move being set up, with HALT once stop() has come: stop() and
        these writes take turns (``_halt_lock``), so a stop can never land between reading
        the stop flag and a write that would lift its halt on one node while the others stay
        halted (each halted drive would keep the target of its own halt)."""
        with self._halt_lock:
            with self._lock:
                stopped = self._stop_ns
            self._controlword(n, cw | Controlword.HALT if stopped else cw)

    def _fault_text(self, n: int) -> str:
        code = self._try(self._read_u16, n, Od.ERROR_CODE, 0)
        return "" if code is None else f" (error code 0x603F = 0x{code:04X})"

    def _enable(self, n: int, deadline: float) -> None:
        """Walk node ``n`` to OPERATION ENABLED in profile-position mode by ``deadline`` (monotonic s)."""
        if self._try(self._read_i8, n, Od.MODES_OF_OPERATION_DISPLAY, 0) != MODE_PROFILE_POSITION:
            self.sdo_write(n, Od.MODES_OF_OPERATION, 0, struct.pack("<b", MODE_PROFILE_POSITION))
            if not self._wait_mode(n, MODE_PROFILE_POSITION, max(deadline - time.monotonic(), 0.0)):
                raise DeviceError(f"node {n}: did not switch to profile position mode (0x6061 != 1)", "MODE")
        reset_sent = False
        while True:
            sw = self._read_u16(n, Od.STATUSWORD)
            state = cia402_state(sw)
            if state is Cia402State.OPERATION_ENABLED:
                return
            if time.monotonic() > deadline:
                raise DeviceError(f"node {n}: stuck in CiA 402 state {state} (statusword 0x{sw:04X})"
                                  f"{self._fault_text(n) if state is Cia402State.FAULT else ''}", "ENABLE")
            if state is Cia402State.QUICK_STOP_ACTIVE:
                raise ProtectiveStop(f"node {n}: quick stop active; acknowledge it before moving")
            if state in (Cia402State.FAULT, Cia402State.FAULT_REACTION_ACTIVE):
                if not self.opts["fault_reset"]:
                    raise DeviceError(f"node {n}: drive in FAULT{self._fault_text(n)}; fault_reset=false", "FAULT")
                if state is Cia402State.FAULT:
                    if not reset_sent:
                        log.warning("%r: node %d in FAULT%s: fault reset", self, n, self._fault_text(n))
                    self._controlword(n, CW_DISABLE_VOLTAGE)
                    self._controlword(n, CW_FAULT_RESET)  # the rising edge of bit 7
                    reset_sent = True
                time.sleep(0.002)
            elif state is Cia402State.SWITCH_ON_DISABLED:
                self._controlword(n, CW_SHUTDOWN)
            elif state is Cia402State.READY_TO_SWITCH_ON:
                self._controlword(n, CW_SWITCH_ON)
            elif state is Cia402State.SWITCHED_ON:
                self._controlword(n, CW_ENABLE_OPERATION)
            else:
                time.sleep(0.005)

    def _enable_all(self, deadline: float) -> None:
        # The caller's deadline, not a fixed second per drive: on a busy bus or host the
        # SDO exchanges of the state walk can take longer than that, and the move allowed it.
        for n in self.nodes:
            self._enable(n, deadline)

    def _check_homed(self) -> None:
        if not self.opts["homing_required"]:
            return
        if not all(self.homed):
            self.homed = tuple(h if h else self._homing_state(n) for h, n in zip(self.homed, self.nodes, strict=True))
        bad = [(j + 1, n) for j, (h, n) in enumerate(zip(self.homed, self.nodes, strict=True)) if not h]
        if bad:
            joints = ", ".join(f"joint {j} (node {n}: {'not homed' if self.homed[j - 1] is False else 'homing state unknown'})"
                               for j, n in bad)
            raise DeviceError(
                f"{self!r}: refusing to move: {joints}; home the joint(s) with the drive's own tools "
                "(homing mode 6), or set homing_required=false for drives with absolute encoders",
                "NOT_HOMED",
            )

    def _write_profile(self, n: int, index: int, value: int) -> None:
        data = struct.pack("<I", value)
        rt = self._rt[n]
        if rt.written.get(index) == data:
            return
        self.sdo_write(n, index, 0, data)
        rt.written[index] = data

    def _move_internal(self, q_rad, base_T_flange, speed, wait, deadline: float) -> None:
        if self.opts["enable"] == "never":
            raise DriverInitError(f"{self!r}: enable=never; this driver may not move the robot")
        with self._lock:
            self._stop_ns = 0
        now = self.read_state()
        if now.mode is RobotMode.PROTECTIVE_STOP:
            raise ProtectiveStop(f"{self!r}: a drive is in quick stop; not moving")
        if q_rad is None:
            try:
                q_rad = self.model.inverse(base_T_flange, now.q_rad)
            except UnreachablePose as exc:
                raise UnreachablePose(f"move_to: {exc}") from exc
        self._check_homed()
        self._enable_all(deadline)
        assert self.limits is not None
        counts = self.scaling.to_counts(q_rad)
        dq = np.asarray(q_rad, dtype=float) - now.q_rad
        plan = plan_sync_move(dq, speed * self.limits.speed_rad_s, speed * self.limits.accel_rad_s2,
                              speed * self.limits.decel_rad_s2)
        profile = to_drive_units(plan, self.units)
        log.debug("%r: move %.3g s (accel %.3g s, decel %.3g s); profile %s", self, plan.duration_s,
                  plan.t_accel_s, plan.t_decel_s, profile)
        for j, n in enumerate(self.nodes):
            v, a, d = profile[j]
            self._write_profile(n, Od.PROFILE_VELOCITY, v)
            self._write_profile(n, Od.PROFILE_ACCELERATION, a)
            self._write_profile(n, Od.PROFILE_DECELERATION, d)
            self.sdo_write(n, Od.TARGET_POSITION, 0, struct.pack("<i", int(counts[j])))
        cw = CW_ENABLE_OPERATION | Controlword.CHANGE_SET_IMMEDIATELY
        with self._lock:
            self._left_enabled.clear()
            self._watch = None  # the previous move's verdict ends with the new set-point
            self._emcy_since_move.clear()
            start = self._last_counts if self._last_counts is not None else self.scaling.to_counts(now.q_rad)
        with self._lock:
            if self._stop_ns:
                raise DeviceError(f"{self!r}: the move was stopped before it started", "STOPPED")
        for n in self.nodes:
            self._setup_controlword(n, cw | Controlword.NEW_SET_POINT)
        ack_deadline = time.monotonic() + self.opts["setpoint_timeout_s"]
        for n in self.nodes:
            with self._lock:
                stopped = self._stop_ns
            if not stopped:  # a halted drive need not take its set-point; the move ends STOPPED
                self._await_ack(n, ack_deadline)
            self._setup_controlword(n, cw)
        acked_ns = time.monotonic_ns()
        with self._lock:
            self._commanded = set(self.nodes)
            self._watch = MoveWatch(
                nodes=self.nodes, target_counts=counts, start_counts=start, windows=self.windows, plan=plan,
                acked_ns=acked_ns, deg_per_count=np.degrees(self.scaling.rad_per_count),
                mismatch_s=self.opts["target_mismatch_s"], stall_timeout_s=self.opts["stall_timeout_s"])
            if self._stop_ns:
                self._watch.stop(self._stop_ns)
        if wait:
            self._wait_target(deadline)

    def _await_ack(self, n: int, deadline: float) -> None:
        """Poll the statusword until set-point acknowledge (bit 12) or the deadline: a drive
        takes its set-point in its next control cycle, which may be milliseconds away."""
        while True:
            sw = self._read_u16(n, Od.STATUSWORD)
            state = cia402_state(sw)
            if state is Cia402State.QUICK_STOP_ACTIVE:
                raise ProtectiveStop(f"node {n}: quick stop while taking the set-point")
            if sw & Statusword.FAULT:
                self._halt_quietly()
                raise self._fault_during_move(n, sw, "while taking the set-point")
            if sw & Statusword.SET_POINT_ACKNOWLEDGE:
                return
            if time.monotonic() > deadline:
                raise DeviceError(
                    f"node {n}: set-point not acknowledged within {self.opts['setpoint_timeout_s']:.3g} s "
                    f"(statusword 0x{sw:04X})", "SETPOINT")
            time.sleep(0.001)

    def _fault_during_move(self, n: int, statusword: int, when: str) -> DriveFaultDuringMove:
        """The typed fault of node ``n``, with its error code 0x603F and last EMCY if known."""
        try:
            code = self._read_u16(n, Od.ERROR_CODE)
        except (DeviceError, DriverTimeoutError, DeviceGoneError):
            code = None  # a drive that faulted may not answer: the statusword says enough
        with self._lock:
            emcy = self._emcy_since_move.get(n)
        joint = self.nodes.index(n) + 1
        what = [f"statusword 0x{statusword:04X}"]
        if code is not None:
            what.append(f"error code 0x603F = 0x{code:04X}")
        if emcy is not None:
            what.append(f"EMCY 0x{emcy:04X}")
        state = cia402_state(statusword)
        name = state.value.upper() if state in (Cia402State.FAULT, Cia402State.FAULT_REACTION_ACTIVE) else "FAULT bit"
        return DriveFaultDuringMove(
            f"{self!r}: node {n} (joint {joint}): {name} {when} ({', '.join(what)}); the move was stopped and no "
            "station is taken", node_id=n, joint=joint, statusword=statusword, error_code=code, emcy_code=emcy)

    def _halt_quietly(self) -> None:
        """Stop the move on every drive (halt); a drive that cannot take it is not waited for."""
        try:
            self._stop_internal()
        except Exception:  # noqa: BLE001 - the fault being raised is what matters
            log.warning("%r: halting after a fault failed", self, exc_info=True)

    def _wait_target(self, deadline: float) -> None:
        """Wait until the move's watch says complete (every commanded joint inside its
        position window for the window time, in samples after the acknowledge, with target
        reached); raise what it found instead (a fault, a mismatch, a joint not moving),
        after halting the drives."""
        seq = -1
        while True:
            with self._lock:
                watch = self._watch
                left = sorted(self._left_enabled)
                sws = [int(v) for v in self._statuswords]
            assert watch is not None
            # A drive that left OPERATION ENABLED because it faulted (its statusword seen on a
            # sample before this move's watch existed, e.g. between two set-points) is a
            # fault during the move, not a drive that was merely disabled.
            faulted = [(n, sws[self.nodes.index(n)]) for n in left
                       if sws[self.nodes.index(n)] & Statusword.FAULT]
            if watch.fault is None and faulted:
                self._halt_quietly()
                raise self._fault_during_move(faulted[0][0], faulted[0][1], "during the move")
            if watch.fault is not None:
                f = watch.fault
                self._halt_quietly()
                raise self._fault_during_move(f.node_id, f.statusword, "during the move")
            if watch.error is not None:
                self._halt_quietly()
                raise watch.error
            if watch.complete_ns:
                return
            if watch.stopped_ns:
                raise DeviceError(f"{self!r}: the move was stopped before it completed", "STOPPED")
            if left:
                raise DeviceError(f"{self!r}: node(s) {left} left OPERATION ENABLED during the move", "DISABLED")
            remaining = remaining_s(deadline)
            if remaining <= 0:
                self._halt_quietly()
                raise DriverTimeoutError(f"{self!r}: target not reached in time ({self._move_summary(watch)})")
            s = self.read_state(timeout_s=min(remaining, max(self.timeout_s, 0.1)))
            if s.mode is RobotMode.PROTECTIVE_STOP:
                raise ProtectiveStop(f"{self!r}: quick stop during the move")
            if s.seq == seq:
                with self._lock:
                    if self._watch is watch and not (watch.fault or watch.error or watch.complete_ns
                                                     or watch.stopped_ns):
                        self._lock.wait(self.opts["sync_period_ms"] * 1e-3)
                continue
            seq = s.seq

    def _move_summary(self, watch: MoveWatch) -> str:
        r = watch.report()
        far = int(np.argmax(np.abs(r["error_deg"])))
        return (f"joint {far + 1} (node {self.nodes[far]}) {r['error_deg'][far]:+.3g} deg from its target, window "
                f"{r['windows'][far]['counts']} counts, held {r['held'][far]}")

    @property
    def last_move(self) -> dict[str, Any] | None:
        """The newest move as the driver judged it (JSON-ready; ``None`` before the first):
        per joint the target 0x607A, the last actual position 0x6064, the error in counts and
        degrees, the position window used and whether it is held; ``complete``; the ``fault``
        (node, joint, statusword) or ``error`` (code, node, joint, message) found."""
        with self._lock:
            return None if self._watch is None else self._watch.report()

    def _stop_internal(self) -> None:
        with self._halt_lock:  # not between a move's reading of the flag and its write
            with self._lock:
                commanded = [n for n in self.nodes if n in self._commanded]
                self._stop_ns = time.monotonic_ns()  # also for a move still being set up (_move_internal)
                if self._watch is not None:
                    self._watch.stop(self._stop_ns)
                    self._lock.notify_all()
            if self.opts["enable"] == "never":
                log.info("%r: stop: enable=never, cellcal commands no drive", self)
                return
            for n in commanded or self.nodes:
                self._controlword(n, CW_ENABLE_OPERATION | Controlword.HALT)


def _hex(v: int | None) -> str:
    return "?" if v is None else f"{v:08X}"
