"""An independent CiA 402 drive model for the tests: drives as they come from the factory.

Written from CiA 301 / CiA 402 (IEC 61800-7-201) on ``canopen.LocalNode`` with its own
object dictionary, sharing no code with ``cellcal.sim.canopen_sim`` or the driver's
object dictionary, so a test against it catches assumptions the project's own simulator
shares with the driver. Each drive is one axis; positions are encoder increments on the
motor side; time is the host's ``time.monotonic()``.

What it implements:

* **NMT slave** (canopen's): boot-up message, pre-operational, heartbeat from 0x1017
  (0 at the factory by default); no SDO answers while STOPPED.
* **Power state machine** (CiA 402 figure "state machine"): transitions 2-16 on the
  controlword's device control commands, fault reset on the rising edge of bit 7.
* **Profile position mode** (6060h = 1) with the set-point handshake: a rising edge of
  new-set-point (bit 4) is taken ``ack_delay_s`` later (the drive's control cycle), the
  drive then sets set-point acknowledge (statusword bit 12) and clears it once bit 4 is
  low; change-set-immediately (bit 5), relative (bit 6), halt (bit 8, stops with 6084h).
  The motion is a trapezoid from the current position and speed with profile velocity
  6081h (clamped to 607Fh), acceleration 6083h and deceleration 6084h, in the drive's
  units; target reached (bit 10) once the profile has ended and the window time 6068h has
  passed. Every accepted move is recorded (:class:`MoveRecord`) so a test can check the
  speed and the arrival time the drive really executed.
* **Homing mode** (6060h = 6): statusword bit 12 homing attained, bit 13 homing error,
  bit 10 target reached; a new-set-point edge in homing mode references the axis.
* **TPDO1-4** from 1800h-1803h / 1A00h-1A03h: synchronous types answer every n-th SYNC
  while operational, 254/255 go out on the event timer (1800h+k:5).
* **Objects**: 1000h, 1001h, 1008h, 1017h, 1018h, 603Fh, 6040h, 6041h, 6060h, 6061h, 6064h,
  6067h, 6068h, 606Ch, 607Ah, 607Fh, 6081h, 6083h, 6084h, 6086h, 6098h, and on request 608Fh
  and 60A9h.

The factory behaviours are switches of :class:`Factory`.
"""

from __future__ import annotations

import math
import struct
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import canopen
from canopen import objectdictionary as odm
from canopen.sdo.exceptions import SdoAbortedError

# -- CiA 301 / CiA 402 constants, named here (not imported from the code under test) ---------
ABORT_READ_ONLY = 0x06010002
ABORT_NOT_MAPPABLE = 0x06040041
ABORT_VALUE_RANGE = 0x06090030
ABORT_STATE = 0x08000022

SW_READY, SW_SWITCHED_ON, SW_OP_ENABLED, SW_FAULT = 0x0001, 0x0002, 0x0004, 0x0008
SW_VOLTAGE, SW_QUICK_STOP, SW_ON_DISABLED, SW_REMOTE = 0x0010, 0x0020, 0x0040, 0x0200
SW_TARGET_REACHED, SW_BIT12, SW_BIT13 = 0x0400, 0x1000, 0x2000

CW_NEW_SET_POINT, CW_IMMEDIATE, CW_RELATIVE, CW_FAULT_RESET, CW_HALT = 0x10, 0x20, 0x40, 0x80, 0x100

NOT_READY, ON_DISABLED, READY, SWITCHED_ON, OP_ENABLED, QUICK_STOP, FAULT_REACTION, FAULT = range(8)
_STATUS_BITS = {
    NOT_READY: 0,
    ON_DISABLED: SW_ON_DISABLED,
    READY: SW_READY | SW_QUICK_STOP | SW_VOLTAGE,
    SWITCHED_ON: SW_READY | SW_SWITCHED_ON | SW_QUICK_STOP | SW_VOLTAGE,
    OP_ENABLED: SW_READY | SW_SWITCHED_ON | SW_OP_ENABLED | SW_QUICK_STOP | SW_VOLTAGE,
    QUICK_STOP: SW_READY | SW_SWITCHED_ON | SW_OP_ENABLED | SW_VOLTAGE,
    FAULT_REACTION: SW_READY | SW_SWITCHED_ON | SW_OP_ENABLED | SW_FAULT | SW_VOLTAGE,
    FAULT: SW_FAULT,
}
PP, HOMING = 1, 6
RPM_SI_UNIT = 0x00B44700  # 60A9h: rev/min, prefix 10^0
FAULT_CODE = 0x3120  # mains undervoltage, latched at power-up
EVENT_TIMER_MS = 50


@dataclass(frozen=True)
class Factory:
    """How the drives leave the factory (every switch a behaviour a driver must cope with).

    Attributes
    ----------
    heartbeat_ms : int
        1017h at power-up (0: no heartbeat).
    ack_delay_s : float
        Time from the new-set-point edge until the drive takes the set-point (and sets bit 12).
    increments_per_rev : int
        Encoder increments per motor revolution (the position unit).
    velocity_rpm : bool
        6081h/606Ch in motor rpm and 6083h/6084h in rpm/s (else increments/s and /s²).
    publish_si_unit : bool
        With ``velocity_rpm``: 60A9h says so (0x00B44700).
    publish_resolution : bool
        608Fh position encoder resolution present.
    profile_velocity, profile_acceleration, profile_deceleration : int
        6081h, 6083h, 6084h at power-up, drive units.
    max_profile_velocity : int
        607Fh (drive units; the profile velocity is clamped to it).
    fixed_mapping : bool
        TPDO mapping read-only: TPDO1 = [6041h, 6061h], TPDO2 = [6064h, 606Ch], both
        synchronous every SYNC and valid at power-up.
    factory_tpdos : bool
        (configurable mapping) TPDO1-3 valid and event-driven at power-up, as many drives
        ship: TPDO1 [6041h], TPDO2 [6041h, 6061h], TPDO3 [6064h, 606Ch], event timer 50 ms.
    power_up_fault : bool
        Power up in FAULT (603Fh = 0x3120), with an EMCY.
    homed : bool
        Homing attained at power-up (an absolute encoder, or referenced).
    target_reached_when_disabled : bool
        Statusword bit 10 outside OPERATION ENABLED (CiA 402 leaves it open; many drives
        clear it).
    window_objects : bool
        6067h and 6068h exist (false: the drive judges target reached by its profile alone,
        with no window objects to read or write: SDO abort 0x06020000).
    """

    heartbeat_ms: int = 0
    ack_delay_s: float = 0.0
    increments_per_rev: int = 131072
    velocity_rpm: bool = False
    publish_si_unit: bool = True
    publish_resolution: bool = False
    profile_velocity: int = 100_000
    profile_acceleration: int = 1_000_000
    profile_deceleration: int = 1_000_000
    max_profile_velocity: int = 2**31 - 1
    fixed_mapping: bool = False
    factory_tpdos: bool = True
    power_up_fault: bool = False
    homed: bool = True
    target_reached_when_disabled: bool = False
    window_objects: bool = True

    @property
    def velocity_unit_inc_s(self) -> float:
        """Increments per second in one velocity unit (and per s² in one acceleration unit)."""
        return self.increments_per_rev / 60.0 if self.velocity_rpm else 1.0


@dataclass(frozen=True)
class MoveRecord:
    """One trapezoid the drive executed (increments, seconds, ``time.monotonic()``)."""

    t_start: float
    t_end: float
    start: float
    target: float
    peak_speed_inc_s: float
    accel_inc_s2: float
    decel_inc_s2: float
    written_velocity: int
    written_acceleration: int
    written_deceleration: int


class _Trapezoid:
    """Position from ``x0`` with speed ``v0`` to ``x1``: accelerate/brake at ``acc``/``dec``
    toward the cruise speed ``vmax``, then brake at ``dec`` to rest at ``x1``. Piecewise
    constant acceleration segments ``(t_start, x, v, a)``."""

    def __init__(self, t0: float, x0: float, v0: float, x1: float, vmax: float, acc: float, dec: float) -> None:
        self.t0 = t0
        self.segments: list[tuple[float, float, float, float]] = []
        t, x, v = t0, float(x0), float(v0)

        def seg(duration: float, a: float) -> None:
            nonlocal t, x, v
            if duration <= 0:
                return
            self.segments.append((t, x, v, a))
            x += v * duration + 0.5 * a * duration * duration
            v += a * duration
            t += duration

        d = x1 - x
        s = 1.0 if d > 0 else -1.0
        if d == 0 and v == 0:
            self.t_end, self.x1 = t, x1
            self.segments.append((t, x, 0.0, 0.0))
            self.peak = 0.0
            return
        u = v * s  # speed toward the target
        if u < 0 or u * u / (2 * dec) > abs(d):  # moving away, or cannot stop in time: brake first
            seg(abs(v) / dec, -dec * (1.0 if v > 0 else -1.0))
            v = 0.0
            d = x1 - x
            s = 1.0 if d > 0 else -1.0
            u = 0.0
        D = abs(d)
        if u > vmax:  # slow down to the cruise speed
            seg((u - vmax) / dec, -s * dec)
            u = vmax
        peak = min(vmax, math.sqrt((2 * acc * dec * D + dec * u * u) / (acc + dec)))
        peak = max(peak, u if u <= vmax else vmax)
        t_acc = (peak - u) / acc if peak > u else 0.0
        d_acc = (peak * peak - u * u) / (2 * acc) if peak > u else 0.0
        d_dec = peak * peak / (2 * dec)
        cruise = max(0.0, (abs(x1 - x) - d_acc - d_dec) / peak) if peak > 0 else 0.0
        seg(t_acc, s * acc)
        seg(cruise, 0.0)
        seg(peak / dec if peak > 0 else 0.0, -s * dec)
        self.segments.append((t, float(x1), 0.0, 0.0))  # at rest, exactly on target
        self.t_end, self.x1 = t, x1
        self.peak = max(peak, abs(v0))

    def at(self, t: float) -> tuple[float, float]:
        seg = self.segments[0]
        for s in self.segments:
            if s[0] <= t:
                seg = s
            else:
                break
        t0, x, v, a = seg
        if seg is self.segments[-1]:
            return x, v
        dt = max(0.0, t - t0)
        return x + v * dt + 0.5 * a * dt * dt, v + a * dt


def _od(f: Factory) -> odm.ObjectDictionary:
    od = odm.ObjectDictionary()

    def var(index: int, sub: int, name: str, dtype: int, access: str, default: Any, mappable: bool = False):
        v = odm.ODVariable(name, index, sub)
        v.data_type, v.access_type, v.default, v.pdo_mappable = dtype, access, default, mappable
        return v

    def add(index: int, name: str, dtype: int, access: str, default: Any, mappable: bool = False) -> None:
        od.add_object(var(index, 0, name, dtype, access, default, mappable))

    U8, U16, U32, VS = odm.UNSIGNED8, odm.UNSIGNED16, odm.UNSIGNED32, odm.VISIBLE_STRING
    I8, I16, I32 = odm.INTEGER8, odm.INTEGER16, odm.INTEGER32
    add(0x1000, "Device type", U32, "ro", 0x00020192)  # CiA 402, servo drive
    add(0x1001, "Error register", U8, "ro", 0, True)
    add(0x1008, "Manufacturer device name", VS, "const", "Factory Servo 402")
    add(0x1017, "Producer heartbeat time", U16, "rw", f.heartbeat_ms)
    ident = odm.ODRecord("Identity", 0x1018)
    ident.add_member(var(0x1018, 0, "Highest sub-index", U8, "const", 4))
    for sub, (name, value) in enumerate((("Vendor-ID", 0x000001B9), ("Product code", 0x0000A402),
                                          ("Revision", 0x00020003), ("Serial", 0)), 1):
        ident.add_member(var(0x1018, sub, name, U32, "ro", value))
    od.add_object(ident)
    map_access = "ro" if f.fixed_mapping else "rw"
    for k in range(4):
        com = odm.ODRecord(f"TPDO{k + 1} communication", 0x1800 + k)
        com.add_member(var(0x1800 + k, 0, "Highest sub-index", U8, "const", 5))
        com.add_member(var(0x1800 + k, 1, "COB-ID", U32, "rw", 0x80000000))
        com.add_member(var(0x1800 + k, 2, "Transmission type", U8, "rw", 255))
        com.add_member(var(0x1800 + k, 3, "Inhibit time", U16, "rw", 0))
        com.add_member(var(0x1800 + k, 5, "Event timer", U16, "rw", 0))
        od.add_object(com)
        mp = odm.ODRecord(f"TPDO{k + 1} mapping", 0x1A00 + k)
        mp.add_member(var(0x1A00 + k, 0, "Number of mapped objects", U8, map_access, 0))
        for sub in range(1, 5):
            mp.add_member(var(0x1A00 + k, sub, f"Mapped object {sub}", U32, map_access, 0))
        od.add_object(mp)
    add(0x603F, "Error code", U16, "ro", 0, True)
    add(0x6040, "Controlword", U16, "rw", 0, True)
    add(0x6041, "Statusword", U16, "ro", 0, True)
    add(0x6060, "Modes of operation", I8, "rw", 0, True)
    add(0x6061, "Modes of operation display", I8, "ro", 0, True)
    add(0x6064, "Position actual value", I32, "ro", 0, True)
    if f.window_objects:
        add(0x6067, "Position window", U32, "rw", 50)
        add(0x6068, "Position window time", U16, "rw", 5)
    add(0x606C, "Velocity actual value", I32, "ro", 0, True)
    add(0x607A, "Target position", I32, "rw", 0, True)
    add(0x607F, "Max profile velocity", U32, "rw", f.max_profile_velocity)
    add(0x6081, "Profile velocity", U32, "rw", f.profile_velocity, True)
    add(0x6083, "Profile acceleration", U32, "rw", f.profile_acceleration)
    add(0x6084, "Profile deceleration", U32, "rw", f.profile_deceleration)
    add(0x6086, "Motion profile type", I16, "rw", 0)  # linear ramp (trapezoid)
    add(0x6098, "Homing method", I8, "rw", 37)
    if f.publish_resolution:
        res = odm.ODArray("Position encoder resolution", 0x608F)
        res.add_member(var(0x608F, 0, "Highest sub-index", U8, "const", 2))
        res.add_member(var(0x608F, 1, "Encoder increments", U32, "ro", f.increments_per_rev))
        res.add_member(var(0x608F, 2, "Motor revolutions", U32, "ro", 1))
        od.add_object(res)
    if f.velocity_rpm and f.publish_si_unit:
        add(0x60A9, "SI unit velocity", U32, "ro", RPM_SI_UNIT)
    return od


class FactoryDrive:
    """One CiA 402 axis on a ``canopen.LocalNode``."""

    def __init__(self, node_id: int, factory: Factory, serial: int) -> None:
        self.id = node_id
        self.f = factory
        self.node = canopen.LocalNode(node_id, _od(factory))
        self.node.data_store.setdefault(0x1018, {})[4] = struct.pack("<I", serial)
        self.lock = threading.RLock()
        self.state = FAULT if factory.power_up_fault else ON_DISABLED
        self.error_code = FAULT_CODE if factory.power_up_fault else 0
        self.mode = 0
        self.cw = 0
        self.homed = factory.homed
        self.profile = _Trapezoid(time.monotonic(), 0.0, 0.0, 0.0, 1.0, 1.0, 1.0)
        self.target = 0.0
        self.pending: tuple[float, float] | None = None  # (time taken, target)
        self.ack = False
        self.commanded = False  # a profile-position move (or halt) is what the axis executes
        self.moves: list[MoveRecord] = []
        self.sync_count = [0, 0, 0, 0]
        self.next_event = [0.0] * 4
        self.node.add_read_callback(self._read)
        self.node.add_write_callback(self._write)
        self._factory_pdos()

    # -- set-up -------------------------------------------------------------------------
    def _put(self, index: int, sub: int, fmt: str, value: int) -> None:
        self.node.data_store.setdefault(index, {})[sub] = struct.pack(fmt, value)

    def _factory_pdos(self) -> None:
        layouts: dict[int, tuple[int, int, tuple[int, ...]]] = {}
        if self.f.fixed_mapping:
            layouts = {0: (1, 0, (0x60410010, 0x60610008)), 1: (1, 0, (0x60640020, 0x606C0020))}
        elif self.f.factory_tpdos:
            layouts = {0: (255, EVENT_TIMER_MS, (0x60410010,)),
                       1: (255, EVENT_TIMER_MS, (0x60410010, 0x60610008)),
                       2: (255, EVENT_TIMER_MS, (0x60640020, 0x606C0020))}
        for k in range(4):
            self._put(0x1800 + k, 1, "<I", 0x80000000 | (0x180 + 0x100 * k + self.id))
        for k, (ttype, timer, entries) in layouts.items():
            self._put(0x1800 + k, 1, "<I", 0x180 + 0x100 * k + self.id)
            self._put(0x1800 + k, 2, "<B", ttype)
            self._put(0x1800 + k, 5, "<H", timer)
            for sub, e in enumerate(entries, 1):
                self._put(0x1A00 + k, sub, "<I", e)
            self._put(0x1A00 + k, 0, "<B", len(entries))

    def _u(self, index: int) -> int:
        fmt = {0x6081: "<I", 0x6083: "<I", 0x6084: "<I", 0x607F: "<I", 0x607A: "<i", 0x6067: "<I", 0x6068: "<H"}[index]
        raw = self.node.data_store.get(index, {}).get(0)
        if raw is None:
            return int(self.node.object_dictionary[index].default)
        return struct.unpack(fmt, raw)[0]

    # -- time evolution (lazy: every read and write brings the axis up to now) ------------
    def service(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self.lock:
            if self.pending is not None and now >= self.pending[0]:
                t_take, target = self.pending
                self.pending = None
                self._start_move(t_take, target)
                self.ack = bool(self.cw & CW_NEW_SET_POINT)

    def position(self, now: float | None = None) -> tuple[float, float]:
        now = time.monotonic() if now is None else now
        self.service(now)
        return self.profile.at(now)

    def _start_move(self, t: float, target: float) -> None:
        x, v = self.profile.at(t)
        unit = self.f.velocity_unit_inc_s
        wv, wa, wd = self._u(0x6081), self._u(0x6083), self._u(0x6084)
        vmax = min(wv, self._u(0x607F)) * unit
        acc, dec = max(wa, 1) * unit, max(wd, 1) * unit
        self.profile = _Trapezoid(t, x, v, target, max(vmax, 1e-9), acc, dec)
        self.target = target
        self.commanded = True
        self.moves.append(MoveRecord(t, self.profile.t_end, x, target, self.profile.peak, acc, dec, wv, wa, wd))

    def move_externally(self, target: float, speed_inc_s: float, accel_inc_s2: float) -> None:
        """Another controller (or a hand) moves the axis; the drive only reports it."""
        with self.lock:
            now = time.monotonic()
            x, v = self.profile.at(now)
            self.profile = _Trapezoid(now, x, v, target, speed_inc_s, accel_inc_s2, accel_inc_s2)
            self.commanded = False

    def _halt(self, now: float) -> None:
        x, v = self.profile.at(now)
        dec = max(self._u(0x6084), 1) * self.f.velocity_unit_inc_s
        stop_at = x + v * abs(v) / (2 * dec)
        self.profile = _Trapezoid(now, x, v, stop_at, max(abs(v), 1e-9), dec, dec)
        self.target = stop_at
        self.pending = None

    # -- CiA 402 ------------------------------------------------------------------------
    def statusword(self, now: float | None = None) -> int:
        now = time.monotonic() if now is None else now
        self.service(now)
        sw = _STATUS_BITS[self.state] | SW_REMOTE
        if self.mode == HOMING:
            if self.homed:
                sw |= SW_BIT12 | SW_TARGET_REACHED
            else:
                sw |= SW_TARGET_REACHED  # homing not started
            return sw
        if self.state == OP_ENABLED and self.mode == PP:
            window_s = self._u(0x6068) * 1e-3 if self.f.window_objects else 0.0
            if self.pending is None and now >= self.profile.t_end + window_s:
                sw |= SW_TARGET_REACHED
            if self.ack:
                sw |= SW_BIT12
        elif self.f.target_reached_when_disabled:
            sw |= SW_TARGET_REACHED
        return sw

    def _controlword(self, cw: int) -> None:
        now = time.monotonic()
        self.service(now)
        prev, self.cw = self.cw, cw
        st = self.state
        if cw & CW_FAULT_RESET and not prev & CW_FAULT_RESET:
            if st == FAULT:  # transition 15
                self.state, self.error_code = ON_DISABLED, 0
                self.node.network.send_message(0x80 + self.id, bytes(8))
            return
        if st in (FAULT, FAULT_REACTION, NOT_READY):
            return
        low = cw & 0x0F
        if not cw & 0x02:  # disable voltage: transitions 7, 9, 10, 12
            new = ON_DISABLED
        elif not cw & 0x04:  # quick stop: 7, 10, 11
            new = QUICK_STOP if st in (OP_ENABLED, QUICK_STOP) else ON_DISABLED
        elif low & 0x07 == 0x06:  # shutdown: 2, 6, 8
            new = READY if st in (ON_DISABLED, SWITCHED_ON, OP_ENABLED) else st
        elif low == 0x07:  # switch on (3) / disable operation (5)
            new = SWITCHED_ON if st in (READY, SWITCHED_ON, OP_ENABLED) else st
        elif low == 0x0F:  # enable operation: 4 (and 3+4 from READY), 16
            new = OP_ENABLED if st in (READY, SWITCHED_ON, OP_ENABLED, QUICK_STOP) else st
        else:
            new = st
        if new == QUICK_STOP and st == OP_ENABLED:
            self._halt(now)
        if st == OP_ENABLED and new != OP_ENABLED:
            self.ack = False
            self.pending = None
        if new == OP_ENABLED and st != OP_ENABLED:
            x, _ = self.profile.at(now)
            self.profile = _Trapezoid(now, x, 0.0, x, 1.0, 1.0, 1.0)  # hold where it is
            self.target = x
        self.state = new
        if new == OP_ENABLED:
            self._operation(prev, cw, now)
        if not cw & CW_NEW_SET_POINT and self.pending is None:
            self.ack = False

    def _operation(self, prev: int, cw: int, now: float) -> None:
        if cw & CW_HALT:
            if not prev & CW_HALT:
                self._halt(now)
            return
        if not (cw & CW_NEW_SET_POINT and not prev & CW_NEW_SET_POINT):
            return
        if self.mode == HOMING:
            self.homed = True
            return
        if self.mode != PP:
            raise SdoAbortedError(ABORT_STATE)
        target = float(self._u(0x607A))
        if cw & CW_RELATIVE:
            target += self.target
        self.pending = (now + self.f.ack_delay_s, target)
        self.service(now)

    # -- SDO callbacks ------------------------------------------------------------------
    def _read(self, index: int, subindex: int, od: Any) -> Any:
        with self.lock:
            now = time.monotonic()
            if index == 0x6041:
                return self.statusword(now)
            if index == 0x6064:
                return int(round(self.position(now)[0]))
            if index == 0x606C:
                return int(self.position(now)[1] / self.f.velocity_unit_inc_s)
            if index == 0x6061:
                return self.mode
            if index == 0x603F:
                return self.error_code
            if index == 0x1001:
                return 0x05 if self.error_code else 0
        return None

    def _write(self, index: int, subindex: int, od: Any, data: bytes) -> None:
        with self.lock:
            if 0x1A00 <= index <= 0x1A03 and subindex > 0 and not self.f.fixed_mapping:
                entry = struct.unpack("<I", bytes(data))[0]
                obj = self.node.object_dictionary.get(entry >> 16)
                if entry and (obj is None or not getattr(obj, "pdo_mappable", False)):
                    raise SdoAbortedError(ABORT_NOT_MAPPABLE)
            elif index == 0x6040:
                self._controlword(struct.unpack("<H", bytes(data))[0])
            elif index == 0x6060:
                mode = struct.unpack("<b", bytes(data))[0]
                if mode not in (0, PP, HOMING):  # 0: no mode assigned (the power-up value)
                    raise SdoAbortedError(ABORT_VALUE_RANGE)
                self.mode = mode
            elif 0x1800 <= index <= 0x1803 and subindex == 1:
                self.next_event[index - 0x1800] = 0.0

    # -- PDOs ---------------------------------------------------------------------------
    def _value(self, entry: int, now: float) -> bytes:
        index, bits = entry >> 16, entry & 0xFF
        if index == 0x6041:
            raw = struct.pack("<H", self.statusword(now))
        elif index == 0x6064:
            raw = struct.pack("<i", int(round(self.position(now)[0])))
        elif index == 0x606C:
            raw = struct.pack("<i", int(self.position(now)[1] / self.f.velocity_unit_inc_s))
        elif index == 0x6061:
            raw = struct.pack("<b", self.mode)
        else:
            raw = self.node.get_data(index, (entry >> 8) & 0xFF)
        return raw[: bits // 8]

    def tpdo_frames(self, now: float, *, sync: bool) -> list[tuple[int, bytes]]:
        out = []
        if self.node.nmt.state != "OPERATIONAL":
            return out
        with self.lock:
            for k in range(4):
                cob = struct.unpack("<I", self.node.get_data(0x1800 + k, 1))[0]
                if cob & 0x80000000:
                    continue
                ttype = self.node.get_data(0x1800 + k, 2)[0]
                if sync:
                    if not 1 <= ttype <= 240:
                        continue
                    self.sync_count[k] += 1
                    if self.sync_count[k] % ttype:
                        continue
                else:
                    timer = struct.unpack("<H", self.node.get_data(0x1800 + k, 5))[0]
                    if ttype < 254 or not timer or now < self.next_event[k]:
                        continue
                    self.next_event[k] = now + timer * 1e-3
                n = self.node.get_data(0x1A00 + k, 0)[0]
                payload = b"".join(self._value(struct.unpack("<I", self.node.get_data(0x1A00 + k, s))[0], now)
                                   for s in range(1, n + 1))
                out.append((cob & 0x7FF, payload[:8]))
        return out


@dataclass
class FactoryDrives:
    """Six :class:`FactoryDrive` axes on one python-can bus (``virtual`` by default).

    ``factory`` applies to every axis; ``per_node`` replaces fields for some of them
    (``{3: {"velocity_rpm": True}}``).
    """

    channel: str
    factory: Factory = field(default_factory=Factory)
    node_ids: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
    per_node: dict[int, dict[str, Any]] = field(default_factory=dict)
    interface: str = "virtual"

    def __post_init__(self) -> None:
        self.network: Any = None
        self.drives: list[FactoryDrive] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.silent: set[int] = set()

    def start(self) -> FactoryDrives:
        net = canopen.Network()
        net.NOTIFIER_CYCLE = 0.05
        net.connect(channel=self.channel, interface=self.interface)
        self.network = net
        for n in self.node_ids:
            f = replace(self.factory, **self.per_node.get(n, {}))
            d = FactoryDrive(n, f, serial=0x5000 + n)
            net.add_node(d.node)
            net.unsubscribe(0x600 + n, d.node.sdo.on_request)
            net.subscribe(0x600 + n, self._sdo_filter(d))
            self.drives.append(d)
            net.send_message(0x700 + n, b"\x00")  # boot-up
            d.node.nmt.send_command(0x80)  # -> pre-operational, heartbeat if 1017h > 0
            if f.power_up_fault:
                net.send_message(0x80 + n, struct.pack("<HB5x", FAULT_CODE, 0x05))
        net.subscribe(0x080, self._on_sync)
        self._thread = threading.Thread(target=self._events, name="factory-drives", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self.network is not None:
            for d in self.drives:
                d.node.nmt.stop_heartbeat()
            self.network.disconnect()
            self.network = None

    def __enter__(self) -> FactoryDrives:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getitem__(self, node_id: int) -> FactoryDrive:
        return next(d for d in self.drives if d.id == node_id)

    def _sdo_filter(self, d: FactoryDrive):
        def on_request(can_id: int, data: bytearray, timestamp: float) -> None:
            if d.id in self.silent or d.node.nmt.state == "STOPPED":
                return
            d.node.sdo.on_request(can_id, data, timestamp)

        return on_request

    def silence(self, node_id: int) -> None:
        """Node ``node_id`` stops answering anything (a cable pulled)."""
        self.silent.add(node_id)
        self[node_id].node.nmt.stop_heartbeat()

    def _send(self, frames: list[tuple[int, bytes]]) -> None:
        for cob, payload in frames:
            self.network.send_message(cob, payload)

    def _on_sync(self, can_id: int, data: bytearray, timestamp: float) -> None:
        now = time.monotonic()
        frames = []
        for d in self.drives:
            if d.id not in self.silent:
                frames += d.tpdo_frames(now, sync=True)
        self._send(frames)

    def _events(self) -> None:
        while not self._stop.wait(0.005):
            now = time.monotonic()
            frames = []
            for d in self.drives:
                if d.id not in self.silent:
                    d.service(now)
                    frames += d.tpdo_frames(now, sync=False)
            self._send(frames)
