"""Six simulated CiA 402 joint drives on a python-can bus, driving a :class:`SimRobot`.

Each drive is a ``canopen.LocalNode`` with the object dictionary of
:func:`cellcal.drivers.canopen402.build_object_dictionary` (the SDO server, NMT slave and
heartbeat producer are canopen's own). On top of it this module adds what a drive's
firmware does:

* **TPDOs**: TPDO1-4 as the communication (0x1800-0x1803) and mapping (0x1A00-0x1A03)
  objects say, whatever the master wrote: synchronous ones (type 1..240) answer every n-th
  SYNC while NMT operational, event-driven ones (254/255) go out on their event timer;
  values are sampled once per SYNC for all six.
* **Dynamic objects**: position actual value 0x6064 (the robot's reported joints, with
  encoder noise, in counts), velocity actual value 0x606C (in the drive's velocity unit),
  statusword 0x6041, mode display 0x6061.
* **CiA 402 power state machine** on controlword writes (shutdown, switch on, enable
  operation, disable voltage, quick stop, fault reset) and **profile position**: a rising
  new-set-point bit takes 0x607A (absolute) and acknowledges it (statusword bit 12), after
  ``ack_delay_ms``; the arm moves at the leading joint's profile velocity 0x6081 and the
  smaller of its acceleration 0x6083 and deceleration 0x6084; *target reached* (bit 10) is
  set once the position has stayed within the position window 0x6067 for the window time
  0x6068 (simulated ms); halt (bit 8) stops. **Homing mode** (6) shows *homing attained*
  in bit 12; a new-set-point edge in homing mode homes the drive.
* **Factory behaviours** (``[robot.can]`` keys, ``docs/simulation-robot.md``): heartbeats
  off, a late set-point acknowledge, small profile deceleration, velocity in motor rpm
  (with or without 0x60A9), a fixed read-only PDO mapping, event-driven TPDO2-4 enabled,
  power-up in FAULT, target-reached clear while disabled, not homed.
* **Faults**: ``disconnect`` silences every drive and ``silent_node`` one drive (no
  heartbeat, PDO, SDO or NMT answers); ``protective_stop`` forces QUICK STOP ACTIVE and
  refuses set-points with SDO abort 0x08000022 (after it clears the drive is in SWITCH ON
  DISABLED and must be re-enabled). Drives that lie, for the driver's checks of a move
  against the actual positions: ``off_target`` (a set-point taken while it lasts stops
  ``offset_deg`` off the target, and the drive reports target reached there),
  ``drive_fault`` (FAULT in the statusword and 0x603F, with EMCYs at its start and end,
  while the motion goes on), ``frozen_joint`` (0x6064 and 0x606C stay where they were when
  it began, while the drive believes it follows its set-points); and ``garbled_can_line``
  (damaged lines, :data:`GARBLED_LINES`, pushed once to every host of the SLCAN bridge).

The bus is python-can's in-process ``virtual`` one; other processes reach it through the
loopback SLCAN bridge (:mod:`cellcal.sim.slcan_bridge`, ``bridge="tcp"`` or ``"pty"``).
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from typing import Any

import numpy as np

from cellcal.drivers.canopen402 import (
    CW_DISABLE_VOLTAGE,
    HEARTBEAT_COB_BASE,
    MODE_HOMING,
    MODE_PROFILE_POSITION,
    N_TPDOS,
    PDO_NOT_VALID,
    SYNC_COB_ID,
    Cia402State,
    Controlword,
    NmtCommand,
    Od,
    Statusword,
    build_object_dictionary,
)
from cellcal.drivers.kinematics import JointScaling
from cellcal.sim.robot_sim import SimRefused, SimRobot

__all__ = ["CanopenSimDrives", "SI_UNIT_RPM_VALUE", "POWER_UP_FAULT_CODE", "GARBLED_LINES"]

log = logging.getLogger(__name__)

ABORT_INVALID_VALUE = 0x06090030
ABORT_CANNOT_MAP = 0x06040041
ABORT_READ_ONLY = 0x06010002
ABORT_DEVICE_STATE = 0x08000022
SI_UNIT_RPM_VALUE = 0x00B44700  # 0x60A9: revolutions per minute, prefix 0
POWER_UP_FAULT_CODE = 0x3220  # CiA 301 emergency error code: DC link undervoltage
POWER_UP_ERROR_REGISTER = 0x05  # generic error + voltage
EVENT_TIMER_MS = 100
EMCY_COB_BASE = 0x080
GENERIC_ERROR_REGISTER = 0x01
#: What a ``garbled_can_line`` fault pushes to each host of the SLCAN bridge: one line of each
#: kind of damage a serial line does (a non-hex identifier, a non-ASCII byte, a length above
#: 8, data shorter than its length, a line no adapter sends, a frame line cut by its CR).
GARBLED_LINES = b"t1G30\rt18\xff\xfe01\rt1819AA\rt18140011\rQ?\rt70\r"

_BASE_STATUS = {
    Cia402State.SWITCH_ON_DISABLED: 0x0040,
    Cia402State.READY_TO_SWITCH_ON: 0x0031,
    Cia402State.SWITCHED_ON: 0x0033,
    Cia402State.OPERATION_ENABLED: 0x0037,
    Cia402State.QUICK_STOP_ACTIVE: 0x0017,
    Cia402State.FAULT: 0x0008,
}
_MODES = (MODE_PROFILE_POSITION, MODE_HOMING)
# the fixed mapping of pdo_mapping = "fixed": TPDO number -> (transmission type, entries)
_FIXED_TPDOS = {
    1: (1, (0x60410010, 0x60640020)),  # statusword first: the driver must read the layout
    2: (1, (0x606C0020,)),
}
# the event-driven TPDOs of extra_tpdos = true (their entries, type 255, event timer 100 ms)
_EXTRA_TPDOS = {2: (0x60410010,), 3: (0x60610008,), 4: (0x60640020, 0x606C0020)}


#: Objects read on every SYNC and cached per drive (_Drive.od_cache): TPDO communication and
#: mapping parameters, and the position window the target-reached bit is judged by.
_CACHED = frozenset([*range(Od.TPDO1_COMMUNICATION, Od.TPDO1_COMMUNICATION + N_TPDOS),
                     *range(Od.TPDO1_MAPPING, Od.TPDO1_MAPPING + N_TPDOS),
                     Od.POSITION_WINDOW, Od.POSITION_WINDOW_TIME])


class _Drive:
    def __init__(self, node_id: int, joint: int) -> None:
        self.node_id = node_id
        self.joint = joint
        self.node: Any = None
        self.state = Cia402State.SWITCH_ON_DISABLED
        self.mode = 0
        self.target = 0
        self.cw_prev = 0
        self.cw = 0  # the controlword being processed (cw_prev: the one before)
        self.ack = False
        self.pending: tuple[float, int] | None = None  # (wall time it is taken, target)
        self.halt = False
        self.inside_since: float | None = None
        self.reached = True
        self.sync_count = [0] * N_TPDOS
        self.next_event = [0.0] * N_TPDOS
        self.silent = False
        self.homed = True
        self.fault_code = 0
        self.lie_counts = 0.0  # off_target: where it really stops, relative to its target
        self.frozen_counts: int | None = None  # frozen_joint: the actual position it reports
        self.glitch = False  # drive_fault active (for the EMCYs at its edges)
        # Write-through copy of the objects every SYNC reads (_CACHED): filled on first read,
        # updated by the write callback once a write is accepted. canopen's get_data costs
        # an object lookup and a read callback each, about 90 of them per SYNC otherwise.
        self.od_cache: dict[tuple[int, int], bytes] = {}


class CanopenSimDrives:
    """Six CiA 402 drives for one :class:`SimRobot` on a python-can bus.

    Parameters
    ----------
    robot : SimRobot
        The arm; its ``scenario.can`` gives the scaling, timing and factory behaviours.
    channel : str
        python-can channel of the drives' bus.
    interface : str
        python-can interface (``virtual``; ``socketcan`` on a vcan also works).
        ``udp_multicast`` is refused: it leaves the loopback.
    node_ids : sequence of int
        Node ids in joint order.
    bridge : {None, "tcp", "pty"}
        Also serve the bus as an SLCAN adapter on ``socket://127.0.0.1:PORT`` or a pty
        (:class:`~cellcal.sim.slcan_bridge.SlcanBridge`); :attr:`url` then names it.
    bridge_port : int
        TCP port of the bridge (0: a free one).
    """

    def __init__(
        self,
        robot: SimRobot,
        channel: str = "cellcal-sim",
        interface: str = "virtual",
        node_ids: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
        *,
        bridge: str | None = None,
        bridge_port: int = 0,
    ) -> None:
        if interface == "udp_multicast":
            raise ValueError("CanopenSimDrives: udp_multicast leaves the loopback; serve the virtual bus "
                             "through the SLCAN bridge instead (bridge='tcp' or 'pty')")
        if bridge not in (None, "tcp", "pty"):
            raise ValueError(f"CanopenSimDrives: bridge must be None, 'tcp' or 'pty', got {bridge!r}")
        self.robot = robot
        self.channel = channel
        self.interface = interface
        sc = robot.scenario.can
        self.can = sc
        self.scaling = JointScaling(sc.counts_per_rev, sc.gear_ratio, sc.sign, sc.offset_counts)
        counts_per_rad = np.abs(1.0 / self.scaling.rad_per_count)
        if sc.velocity_units == "rpm":
            unit_counts_s = np.asarray(sc.counts_per_rev, dtype=float) / 60.0  # one motor rpm
        else:
            unit_counts_s = np.ones(len(node_ids))
        #: joint rad/s of one velocity unit (and rad/s² of one acceleration unit)
        self.rad_s_per_unit = unit_counts_s / counts_per_rad
        self.drives = [_Drive(n, j) for j, n in enumerate(node_ids)]
        self._by_id = {d.node_id: d for d in self.drives}
        self.network: Any = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._last_eval_t = robot.world.now_s()
        self._bridge_kind = bridge
        self._bridge_port = bridge_port
        self.bridge: Any = None
        self.syncs = 0
        #: (profile velocity rad/s, acceleration rad/s²) of the last move the drives made
        self.last_move: tuple[float, float] | None = None
        #: garbled_can_line faults served so far, and how many host deliveries they made
        self.garbled_faults = 0
        self.garbled_deliveries = 0

    @property
    def url(self) -> str:
        """``canopen://channel?interface=...&nodes=...&model=...`` plus the count scaling
        (through the bridge: ``canopen://socket://127.0.0.1:PORT?interface=slcan&...``)."""
        def vec(a: np.ndarray) -> str:
            return repr(float(a[0])) if np.all(a == a[0]) else ",".join(repr(float(x)) for x in a)

        sc = self.can
        if self.bridge is not None:
            ch, interface = self.bridge.channel_url, "slcan"
        else:
            ch = f"[{self.channel}]" if ":" in self.channel else self.channel
            interface = self.interface
        ids = [d.node_id for d in self.drives]
        q = [
            f"interface={interface}",
            "nodes=" + ",".join(str(i) for i in ids),
            f"counts_per_rev={vec(sc.counts_per_rev)}",
            f"gear_ratio={vec(sc.gear_ratio)}",
            f"sign={vec(sc.sign)}",
            f"offset_counts={vec(sc.offset_counts)}",
        ]
        if self.robot.model.name in ("ur3e", "ur5e", "ur10e"):
            q.insert(2, f"model={self.robot.model.name}")
        if sc.velocity_units == "rpm" and not sc.announce_units:
            q.append("velocity_units=rpm")  # the drive does not say so itself
        if interface == "slcan":
            q.append("sleep_after_open_s=0")  # no adapter to reset: python-can waits 2 s otherwise
        return f"canopen://{ch}?" + "&".join(q)

    # -- lifecycle -------------------------------------------------------------------------
    def _object_dictionary(self) -> Any:
        from canopen import objectdictionary as odm

        od = build_object_dictionary()

        def add(name: str, index: int, dtype: int, default: Any) -> None:
            v = odm.ODVariable(name, index, 0)
            v.data_type, v.access_type, v.default = dtype, "ro", default
            od.add_object(v)

        add("Manufacturer device name", Od.DEVICE_NAME, odm.VISIBLE_STRING, "cellcal sim drive")
        add("Manufacturer software version", Od.SOFTWARE_VERSION, odm.VISIBLE_STRING, "sim 1.0")
        if self.can.velocity_units == "rpm" and self.can.announce_units:
            add("SI unit velocity", Od.SI_UNIT_VELOCITY, odm.UNSIGNED32, SI_UNIT_RPM_VALUE)
        return od

    def start(self) -> CanopenSimDrives:
        import canopen

        net = canopen.Network()
        net.NOTIFIER_CYCLE = 0.05  # bounds how long close() waits for the receive thread
        net.connect(channel=self.channel, interface=self.interface)
        self.network = net
        q_counts = self.scaling.to_counts(self.robot.sample().q_ctrl_rad)
        try:
            for d in self.drives:
                node = canopen.LocalNode(d.node_id, self._object_dictionary())
                net.add_node(node)
                # route SDO and NMT through the silence filter
                net.unsubscribe(0x600 + d.node_id, node.sdo.on_request)
                net.unsubscribe(0, node.nmt.on_command)
                net.subscribe(0x600 + d.node_id, self._filtered(d, node.sdo.on_request, sdo=True))
                net.subscribe(0, self._filtered(d, node.nmt.on_command))
                node.add_read_callback(self._reader(d))
                node.add_write_callback(self._writer(d))
                d.node = node
                self._power_up(d, int(q_counts[d.joint]))
                # boot: boot-up message, then pre-operational with heartbeats running (if any)
                net.send_message(HEARTBEAT_COB_BASE + d.node_id, bytes([0]))
                node.nmt.send_command(NmtCommand.ENTER_PRE_OPERATIONAL)
                if d.state is Cia402State.FAULT:
                    net.send_message(EMCY_COB_BASE + d.node_id,
                                     struct.pack("<HB5x", POWER_UP_FAULT_CODE, POWER_UP_ERROR_REGISTER))
            net.subscribe(SYNC_COB_ID, self._on_sync)
            self._monitor = threading.Thread(target=self._watch, name="canopen-sim", daemon=True)
            self._monitor.start()
            if self._bridge_kind is not None:
                from cellcal.sim.slcan_bridge import SlcanBridge

                self.bridge = SlcanBridge(self.channel, self.interface, transport=self._bridge_kind,
                                          port=self._bridge_port).start()
        except BaseException:
            self.close()
            raise
        log.info("sim CiA 402 drives %s on %s/%s", [d.node_id for d in self.drives], self.interface, self.channel)
        return self

    def _power_up(self, d: _Drive, counts: int) -> None:
        sc = self.can
        store = d.node.data_store

        def put(index: int, sub: int, data: bytes) -> None:
            store.setdefault(index, {})[sub] = data

        j = d.joint
        unit = float(self.rad_s_per_unit[j])
        put(Od.PRODUCER_HEARTBEAT_TIME, 0, struct.pack("<H", sc.heartbeat_ms))
        put(Od.POSITION_WINDOW, 0, struct.pack("<I", sc.position_window_counts))
        put(Od.POSITION_WINDOW_TIME, 0, struct.pack("<H", sc.position_window_time_ms))
        for index, deg in ((Od.PROFILE_VELOCITY, sc.profile_velocity_deg_s),
                           (Od.PROFILE_ACCELERATION, sc.profile_acceleration_deg_s2),
                           (Od.PROFILE_DECELERATION, sc.profile_deceleration_deg_s2)):
            put(index, 0, struct.pack("<I", max(1, int(math.radians(deg) / unit))))
        for sub, value in enumerate((sc.vendor_id, sc.product_code, sc.revision,
                                     (sc.serial_base + d.node_id) & 0xFFFFFFFF), 1):
            put(Od.IDENTITY, sub, struct.pack("<I", value))
        for k in range(N_TPDOS):
            put(Od.TPDO1_COMMUNICATION + k, 1, struct.pack("<I", PDO_NOT_VALID | (0x180 + 0x100 * k + d.node_id)))
            put(Od.TPDO1_COMMUNICATION + k, 2, b"\xff")
            put(Od.TPDO1_MAPPING + k, 0, b"\x00")
        tpdos: dict[int, tuple[int, tuple[int, ...]]] = {}
        if sc.pdo_mapping == "fixed":
            tpdos.update(_FIXED_TPDOS)
        if sc.extra_tpdos:
            tpdos.update({k: (0xFF, e) for k, e in _EXTRA_TPDOS.items() if k not in tpdos})
        for number, (ttype, entries) in tpdos.items():
            k = number - 1
            put(Od.TPDO1_COMMUNICATION + k, 1, struct.pack("<I", 0x180 + 0x100 * k + d.node_id))
            put(Od.TPDO1_COMMUNICATION + k, 2, bytes([ttype]))
            if ttype >= 254:
                put(Od.TPDO1_COMMUNICATION + k, 5, struct.pack("<H", EVENT_TIMER_MS))
            for sub, e in enumerate(entries, 1):
                put(Od.TPDO1_MAPPING + k, sub, struct.pack("<I", e))
            put(Od.TPDO1_MAPPING + k, 0, bytes([len(entries)]))
        d.target = counts
        d.homed = sc.homed
        if sc.power_up_state == "fault":
            d.state = Cia402State.FAULT
            d.fault_code = POWER_UP_FAULT_CODE

    def close(self) -> None:
        """Stop heartbeats, threads and the bridge, shut the bus down (idempotent)."""
        self._stop.set()
        if self.bridge is not None:
            self.bridge.close()
            self.bridge = None
        if self._monitor is not None:
            self._monitor.join(timeout=2.0)
            self._monitor = None
        if self.network is not None:
            for d in self.drives:
                if d.node is not None:
                    d.node.nmt.stop_heartbeat()
            try:
                self.network.disconnect()
            except Exception:  # noqa: BLE001
                log.debug("sim bus shutdown error", exc_info=True)
            self.network = None

    def __enter__(self) -> CanopenSimDrives:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- faults and timers -----------------------------------------------------------------
    def _is_silent(self, d: _Drive) -> bool:
        r = self.robot
        return r.fault_active("disconnect") or r.fault_active("silent_node", node=d.node_id)

    def _watch(self) -> None:
        while not self._stop.wait(0.002):
            for d in self.drives:
                silent = self._is_silent(d)
                if silent == d.silent:
                    continue
                with self._lock:
                    d.silent = silent
                    if silent:
                        d.node.nmt.stop_heartbeat()
                        log.info("sim drive %d: silent", d.node_id)
                    else:
                        hb = struct.unpack("<H", d.node.get_data(Od.PRODUCER_HEARTBEAT_TIME, 0))[0]
                        d.node.nmt.start_heartbeat(hb)
                        log.info("sim drive %d: back", d.node_id)
            self._fault_edges()
            now = time.monotonic()
            with self._lock:
                for d in self.drives:
                    self._take_pending(d, now)
            self._event_tpdos(now)

    def _fault_edges(self) -> None:
        """EMCYs at the start and end of a ``drive_fault``; the lines of a ``garbled_can_line``."""
        for d in self.drives:
            f = self.robot.active_fault("drive_fault", node=d.node_id)
            if (f is not None) == d.glitch or self.network is None:
                continue
            d.glitch = f is not None
            if d.silent or self._is_silent(d):
                continue
            code = f.error_code or 0 if f is not None else 0
            payload = struct.pack("<HB5x", code, GENERIC_ERROR_REGISTER) if code else bytes(8)
            self.network.send_message(EMCY_COB_BASE + d.node_id, payload)
            log.info("sim drive %d: %s", d.node_id, f"FAULT 0x{code:04X} shown" if code else "FAULT no longer shown")
        started = self.robot.faults_started("garbled_can_line")
        while self.garbled_faults < len(started):
            self.garbled_faults += 1
            if self.bridge is None:
                log.info("sim drives: garbled_can_line without an SLCAN bridge: nothing to garble")
                continue
            n = self.bridge.send_raw_to_hosts(GARBLED_LINES)
            self.garbled_deliveries += n
            log.info("sim drives: garbled lines sent to %d SLCAN host(s)", n)

    def _filtered(self, d: _Drive, fn, sdo: bool = False):
        def handler(can_id: int, data: bytearray, timestamp: float) -> None:
            if d.silent or self._is_silent(d):
                return
            if sdo and d.node.nmt.state == "STOPPED":
                return  # CiA 301: no SDO in STOPPED
            with self._lock:
                fn(can_id, data, timestamp)

        return handler

    # -- drive firmware ---------------------------------------------------------------------
    def _position_counts(self, q_rad: np.ndarray) -> np.ndarray:
        return self.scaling.to_counts(q_rad)

    def _update_all(self, t_s: float) -> None:
        """Drive bookkeeping up to world time ``t_s``: quick stop, target following, and the
        position window checked on the noise-free track since the previous evaluation (at
        most 1 ms apart), so an oscillation through the window never counts as inside.

        After a long pause (the host was busy) only the last 0.2 s are checked and the
        time inside the window restarts there: what happened before is not assumed."""
        t0 = min(self._last_eval_t, t_s)
        truncated = t_s - t0 > 0.2
        if truncated:
            t0 = t_s - 0.2
        k = int(max(2, math.ceil((t_s - t0) / 1e-3) + 1))
        ts = np.linspace(t0, t_s, k)
        track = self._position_counts(self.robot.ctrl_track(ts))
        self._last_eval_t = t_s
        pstop = self.robot.fault_active("protective_stop", t_s)
        for d in self.drives:
            if truncated:
                d.inside_since = None
            self._update(d, ts, track[:, d.joint], pstop)

    def _update(self, d: _Drive, ts: np.ndarray, counts: np.ndarray, pstop: bool) -> None:
        if pstop and d.state is not Cia402State.QUICK_STOP_ACTIVE:
            d.state = Cia402State.QUICK_STOP_ACTIVE
        elif not pstop and d.state is Cia402State.QUICK_STOP_ACTIVE:
            d.state = Cia402State.SWITCH_ON_DISABLED
        if d.state is not Cia402State.OPERATION_ENABLED:
            d.target = int(counts[-1])
            d.lie_counts = 0.0
            d.reached = self.can.target_reached_when_disabled
            d.inside_since = None
            d.pending = None
            return
        window = struct.unpack("<I", self._od(d, Od.POSITION_WINDOW, 0))[0]
        window_ms = struct.unpack("<H", self._od(d, Od.POSITION_WINDOW_TIME, 0))[0]
        # an off_target drive judges its window where it really goes, and calls that its target
        inside = np.abs(counts - (d.target + d.lie_counts)) <= window
        if not inside[-1] or d.pending is not None:
            d.inside_since = None
            d.reached = False
            return
        outside = np.flatnonzero(~inside)
        if outside.size:
            d.inside_since = float(ts[outside[-1] + 1])
        elif d.inside_since is None:
            d.inside_since = float(ts[0])
        d.reached = (ts[-1] - d.inside_since) * 1e3 >= window_ms

    def _statusword(self, d: _Drive) -> int:
        if self.robot.fault_active("drive_fault", node=d.node_id):
            return int(_BASE_STATUS[Cia402State.FAULT] | Statusword.REMOTE)  # shown; the state goes on
        sw = _BASE_STATUS.get(d.state, 0) | Statusword.REMOTE
        if d.mode == MODE_HOMING:
            sw |= Statusword.TARGET_REACHED  # homing completed, or not started
            if d.homed:
                sw |= Statusword.HOMING_ATTAINED
        else:
            if d.reached:
                sw |= Statusword.TARGET_REACHED
            if d.ack:
                sw |= Statusword.SET_POINT_ACKNOWLEDGE
        return int(sw)

    def _reader(self, d: _Drive):
        def read(index: int, subindex: int, od: Any) -> Any:
            if index == Od.ERROR_CODE:
                glitch = self.robot.active_fault("drive_fault", node=d.node_id)
                return glitch.error_code if glitch is not None else d.fault_code
            if index == Od.ERROR_REGISTER:
                return POWER_UP_ERROR_REGISTER if d.fault_code else 0
            if index not in (Od.POSITION_ACTUAL_VALUE, Od.STATUSWORD, Od.VELOCITY_ACTUAL_VALUE,
                             Od.MODES_OF_OPERATION_DISPLAY):
                return None
            s = self.robot.joints()
            self._take_pending(d, time.monotonic())
            self._update_all(s.t_sim_s)
            if index == Od.POSITION_ACTUAL_VALUE:
                return self._reported_counts(d, int(self._position_counts(s.q_rad)[d.joint]))
            if index == Od.VELOCITY_ACTUAL_VALUE:
                return 0 if self._frozen(d) else self._velocity_units(d, s.qd_rad_s)
            if index == Od.MODES_OF_OPERATION_DISPLAY:
                return d.mode
            return self._statusword(d)

        return read

    def _frozen(self, d: _Drive) -> bool:
        return self.robot.fault_active("frozen_joint", node=d.node_id)

    def _reported_counts(self, d: _Drive, counts: int) -> int:
        """What 0x6064 says: the position, or for a ``frozen_joint`` the one it had when the
        fault began (the first read after it did)."""
        if not self._frozen(d):
            d.frozen_counts = None
            return counts
        if d.frozen_counts is None:
            d.frozen_counts = counts
        return d.frozen_counts

    def _velocity_units(self, d: _Drive, qd_rad_s: np.ndarray) -> int:
        sign = float(self.scaling.sign[d.joint])
        return int(sign * qd_rad_s[d.joint] / self.rad_s_per_unit[d.joint])

    def _writer(self, d: _Drive):
        from canopen.sdo.exceptions import SdoAbortedError

        def write(index: int, subindex: int, od: Any, data: bytes) -> None:
            if index == Od.CONTROLWORD:
                self._controlword(d, struct.unpack("<H", bytes(data[:2]))[0])
            elif index == Od.MODES_OF_OPERATION:
                mode = struct.unpack("<b", bytes(data[:1]))[0]
                if mode not in _MODES:
                    raise SdoAbortedError(ABORT_INVALID_VALUE)
                d.mode = mode
            elif Od.TPDO1_MAPPING <= index < Od.TPDO1_MAPPING + N_TPDOS:
                if self.can.pdo_mapping == "fixed":
                    raise SdoAbortedError(ABORT_READ_ONLY)
                if subindex > 0:
                    entry = struct.unpack("<I", bytes(data[:4]))[0]
                    idx, sub = entry >> 16, (entry >> 8) & 0xFF
                    if entry and (idx not in d.node.object_dictionary or
                                  not d.node.object_dictionary.get_variable(idx, sub).pdo_mappable):
                        raise SdoAbortedError(ABORT_CANNOT_MAP)
            elif Od.TPDO1_COMMUNICATION <= index < Od.TPDO1_COMMUNICATION + N_TPDOS and subindex == 1:
                k = index - Od.TPDO1_COMMUNICATION
                d.next_event[k] = 0.0
            if index in _CACHED:
                d.od_cache[(index, subindex)] = bytes(data)

        return write

    def _controlword(self, d: _Drive, cw: int) -> None:
        from canopen.sdo.exceptions import SdoAbortedError

        s = self.robot.joints()
        pos = int(self._position_counts(s.q_ctrl_rad)[d.joint])
        self._update_all(s.t_sim_s)
        st = d.state
        d.cw = cw
        # CiA 402 device control commands (bit patterns of bits 7, 3, 2, 1, 0)
        if d.state is Cia402State.QUICK_STOP_ACTIVE:
            if cw & Controlword.NEW_SET_POINT:
                raise SdoAbortedError(ABORT_DEVICE_STATE)
        elif cw & Controlword.FAULT_RESET:
            if st is Cia402State.FAULT and not d.cw_prev & Controlword.FAULT_RESET:
                d.state = Cia402State.SWITCH_ON_DISABLED
                if d.fault_code:
                    d.fault_code = 0
                    self.network.send_message(EMCY_COB_BASE + d.node_id, bytes(8))  # error reset
        elif st is Cia402State.FAULT:
            pass  # only a fault reset leaves FAULT
        elif cw & 0x02 == 0x00:  # disable voltage: x x x 0 x
            d.state = Cia402State.SWITCH_ON_DISABLED
        elif cw & 0x06 == 0x02:  # quick stop: x 0 1 x
            if st is Cia402State.OPERATION_ENABLED:
                self.robot.stop()
            d.state = Cia402State.SWITCH_ON_DISABLED
        elif cw & 0x07 == 0x06:  # shutdown: x 1 1 0
            if st in (Cia402State.SWITCH_ON_DISABLED, Cia402State.SWITCHED_ON, Cia402State.OPERATION_ENABLED):
                d.state = Cia402State.READY_TO_SWITCH_ON
        elif cw & 0x0F == 0x07:  # switch on / disable operation: 0 1 1 1
            if st in (Cia402State.READY_TO_SWITCH_ON, Cia402State.OPERATION_ENABLED):
                d.state = Cia402State.SWITCHED_ON
        elif cw & 0x0F == 0x0F:  # enable operation: 1 1 1 1
            if st in (Cia402State.SWITCHED_ON, Cia402State.READY_TO_SWITCH_ON):
                d.state = Cia402State.OPERATION_ENABLED
                d.target = pos
            if d.state is Cia402State.OPERATION_ENABLED:
                self._profile_position(d, cw)
        if not cw & Controlword.NEW_SET_POINT and d.pending is None:
            d.ack = False
        d.cw_prev = cw

    def _profile_position(self, d: _Drive, cw: int) -> None:
        from canopen.sdo.exceptions import SdoAbortedError

        halt = bool(cw & Controlword.HALT)
        if halt and not d.halt:
            self.robot.stop()
            d.pending = None
            d.halt = True
            # One arm stands for all drives: a new stop moves the rest point of every drive
            # already halted too, and each halted drive comes to rest where the arm does.
            rest = self._position_counts(self.robot.sample().target_q_rad)
            for x in self.drives:
                if x.halt:
                    x.target = int(rest[x.joint])
        d.halt = halt
        rising = cw & Controlword.NEW_SET_POINT and not d.cw_prev & Controlword.NEW_SET_POINT
        if not rising or halt:
            return
        if d.mode == MODE_HOMING:
            d.homed = True  # homing start: the simulated drive references at once
            return
        if d.mode != MODE_PROFILE_POSITION:
            raise SdoAbortedError(ABORT_DEVICE_STATE)
        if self.robot.fault_active("protective_stop"):
            raise SdoAbortedError(ABORT_DEVICE_STATE)
        target = struct.unpack("<i", d.node.get_data(Od.TARGET_POSITION, 0))[0]
        if cw & Controlword.ABS_REL:
            target += d.target
        d.pending = (time.monotonic() + self.can.ack_delay_ms * 1e-3, target)
        d.reached = False
        d.inside_since = None
        self._take_pending(d, time.monotonic())

    def _take_pending(self, d: _Drive, now: float) -> None:
        """The drive's control cycle takes a pending set-point once its delay is over."""
        if d.pending is None or now < d.pending[0]:
            return
        from canopen.sdo.exceptions import SdoAbortedError

        d.target = d.pending[1]
        d.pending = None
        d.ack = bool(d.cw & Controlword.NEW_SET_POINT)  # until the master drops bit 4
        try:
            self._command_robot()
        except SdoAbortedError:
            d.ack = False

    def _unit(self, d: _Drive, index: int) -> float:
        return struct.unpack("<I", d.node.get_data(index, 0))[0] * float(self.rad_s_per_unit[d.joint])

    def _command_robot(self) -> None:
        """Move the arm to every drive's target, at the leading joint's profile."""
        from canopen.sdo.exceptions import SdoAbortedError

        targets = self.scaling.to_rad(np.array([x.target for x in self.drives], dtype=float))
        for x in self.drives:  # an off_target drive goes elsewhere than it was told
            f = self.robot.active_fault("off_target", node=x.node_id)
            off = float(f.offset_rad or 0.0) if f is not None else 0.0
            targets[x.joint] += off
            x.lie_counts = off / float(self.scaling.rad_per_count[x.joint])
        q_now = self.robot.joints().q_ctrl_rad
        lead = self.drives[int(np.argmax(np.abs(targets - q_now)))]
        v = self._unit(lead, Od.PROFILE_VELOCITY)
        a = min(self._unit(lead, Od.PROFILE_ACCELERATION), self._unit(lead, Od.PROFILE_DECELERATION))
        try:
            self.robot.command_joints(targets, v, a)
        except SimRefused as exc:
            raise SdoAbortedError(ABORT_DEVICE_STATE) from exc
        self.last_move = (v, a)

    def _tpdo_payload(self, d: _Drive, k: int, counts: np.ndarray, vel: np.ndarray) -> bytes:
        node = d.node
        payload = bytearray()
        n_map = self._od(d, Od.TPDO1_MAPPING + k, 0)[0]
        for sub in range(1, n_map + 1):
            entry = struct.unpack("<I", self._od(d, Od.TPDO1_MAPPING + k, sub))[0]
            idx, bits = entry >> 16, entry & 0xFF
            if idx == Od.POSITION_ACTUAL_VALUE:
                raw = struct.pack("<i", int(counts[d.joint]))
            elif idx == Od.STATUSWORD:
                raw = struct.pack("<H", self._statusword(d))
            elif idx == Od.VELOCITY_ACTUAL_VALUE:
                raw = struct.pack("<i", int(vel[d.joint]))
            elif idx == Od.MODES_OF_OPERATION_DISPLAY:
                raw = struct.pack("<b", d.mode)
            else:
                raw = node.get_data(idx, (entry >> 8) & 0xFF)
            payload += raw[: bits // 8]
        return bytes(payload[:8])

    def _tpdo(self, d: _Drive, k: int) -> tuple[int, int] | None:
        """(COB-ID, transmission type) of a valid TPDO ``k`` (0-based), else None."""
        cob = struct.unpack("<I", self._od(d, Od.TPDO1_COMMUNICATION + k, 1))[0]
        if cob & PDO_NOT_VALID:
            return None
        return cob & 0x7FF, self._od(d, Od.TPDO1_COMMUNICATION + k, 2)[0]

    @staticmethod
    def _od(d: _Drive, index: int, subindex: int) -> bytes:
        """``d.node.get_data`` of an object in ``_CACHED``, through the drive's write-through copy."""
        key = (index, subindex)
        raw = d.od_cache.get(key)
        if raw is None:
            # setdefault: a write accepted meanwhile (its value already in the copy) wins
            raw = d.od_cache.setdefault(key, bytes(d.node.get_data(index, subindex)))
        return raw

    def _sample_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        s = self.robot.joints()
        counts = self._position_counts(s.q_rad)
        for d in self.drives:
            counts[d.joint] = self._reported_counts(d, int(counts[d.joint]))
        vel = np.array([0 if self._frozen(d) else self._velocity_units(d, s.qd_rad_s) for d in self.drives],
                       dtype=float)
        self._update_all(s.t_sim_s)
        return counts, vel

    def _on_sync(self, can_id: int, data: bytearray, timestamp: float) -> None:
        now = time.monotonic()
        with self._lock:
            for d in self.drives:
                self._take_pending(d, now)
            counts, vel = self._sample_arrays()
        self.syncs += 1
        out = []
        for d in self.drives:
            if d.silent or self._is_silent(d):
                continue
            with self._lock:
                if d.node.nmt.state != "OPERATIONAL":
                    continue
                for k in range(N_TPDOS):
                    t = self._tpdo(d, k)
                    if t is None or not 1 <= t[1] <= 240:
                        continue
                    d.sync_count[k] += 1
                    if d.sync_count[k] % t[1]:
                        continue
                    out.append((t[0], self._tpdo_payload(d, k, counts, vel)))
        for cob, payload in out:
            self.network.send_message(cob, payload)

    def _event_tpdos(self, now: float) -> None:
        out = []
        with self._lock:
            arrays = None
            for d in self.drives:
                if d.silent or self._is_silent(d) or d.node.nmt.state != "OPERATIONAL":
                    continue
                for k in range(N_TPDOS):
                    t = self._tpdo(d, k)
                    if t is None or t[1] < 254:
                        continue
                    timer_ms = struct.unpack("<H", self._od(d, Od.TPDO1_COMMUNICATION + k, 5))[0]
                    if not timer_ms or now < d.next_event[k]:
                        continue
                    d.next_event[k] = now + timer_ms * 1e-3
                    if arrays is None:
                        arrays = self._sample_arrays()
                    out.append((t[0], self._tpdo_payload(d, k, *arrays)))
        for cob, payload in out:
            self.network.send_message(cob, payload)

    # -- test hooks --------------------------------------------------------------------------
    def drive_state(self, node_id: int) -> Cia402State:
        """The CiA 402 state of one drive (what its statusword would show)."""
        return self._by_id[node_id].state

    def disable_all(self) -> None:
        """Put every drive in SWITCH ON DISABLED (as a power cycle of the amplifier would)."""
        for d in self.drives:
            with self._lock:
                self._controlword(d, int(CW_DISABLE_VOLTAGE))
