"""Six simulated CiA 402 joint drives on a python-can bus, driving a :class:`SimRobot`.

Each drive is a ``canopen.LocalNode`` with the object dictionary of
:func:`cellcal.drivers.canopen402.build_object_dictionary` (the SDO server, NMT slave and
heartbeat producer are canopen's own). On top of it this module adds what a drive's
firmware does:

* **SYNC**: every drive that is NMT operational and has a valid synchronous TPDO1
  (0x1800:1 valid, transmission type 1..240) answers each (N-th) SYNC with the objects
  mapped in 0x1A00, whatever mapping the master wrote, sampled once per SYNC for all six.
* **Dynamic objects**: position actual value 0x6064 (the robot's reported joints, with
  encoder noise, in counts), velocity actual value 0x606C, statusword 0x6041, mode
  display 0x6061.
* **CiA 402 power state machine** on controlword writes (shutdown, switch on, enable
  operation, disable voltage, quick stop, fault reset) and **profile position**: a rising
  new-set-point bit takes 0x607A (absolute) and acknowledges it (statusword bit 12);
  *target reached* (bit 10) is set once the position has stayed within the position
  window 0x6067 for the window time 0x6068 (simulated ms); halt (bit 8) stops.
* **Faults**: ``disconnect`` silences every drive and ``silent_node`` one drive (no
  heartbeat, PDO, SDO or NMT answers); ``protective_stop`` forces QUICK STOP ACTIVE and
  refuses set-points with SDO abort 0x08000022 (after it clears the drive is in SWITCH ON
  DISABLED and must be re-enabled).

``virtual`` works within one process; ``udp_multicast`` across processes.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
from typing import Any

import numpy as np

from cellcal.drivers.canopen402 import (
    CW_DISABLE_VOLTAGE,
    HEARTBEAT_COB_BASE,
    MODE_PROFILE_POSITION,
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

__all__ = ["CanopenSimDrives"]

log = logging.getLogger(__name__)

ABORT_INVALID_VALUE = 0x06090030
ABORT_CANNOT_MAP = 0x06040041
ABORT_DEVICE_STATE = 0x08000022

_BASE_STATUS = {
    Cia402State.SWITCH_ON_DISABLED: 0x0040,
    Cia402State.READY_TO_SWITCH_ON: 0x0031,
    Cia402State.SWITCHED_ON: 0x0033,
    Cia402State.OPERATION_ENABLED: 0x0037,
    Cia402State.QUICK_STOP_ACTIVE: 0x0017,
    Cia402State.FAULT: 0x0008,
}
_NMT_CODE = {"INITIALISING": 0, "STOPPED": 4, "OPERATIONAL": 5, "PRE-OPERATIONAL": 127}


class _Drive:
    def __init__(self, node_id: int, joint: int) -> None:
        self.node_id = node_id
        self.joint = joint
        self.node: Any = None
        self.state = Cia402State.SWITCH_ON_DISABLED
        self.mode = 0
        self.target = 0
        self.cw_prev = 0
        self.ack = False
        self.halt = False
        self.inside_since: float | None = None
        self.reached = True
        self.sync_count = 0
        self.silent = False


class CanopenSimDrives:
    """Six CiA 402 drives for one :class:`SimRobot` on a python-can bus.

    Parameters
    ----------
    robot : SimRobot
        The arm; its ``scenario.can`` gives counts per revolution, gear ratio, sign, offset,
        heartbeat period and position window.
    channel : str
        python-can channel.
    interface : str
        python-can interface (``virtual``, ``udp_multicast``, ``socketcan`` on a vcan).
    node_ids : sequence of int
        Node ids in joint order.
    """

    def __init__(
        self,
        robot: SimRobot,
        channel: str = "cellcal-sim",
        interface: str = "virtual",
        node_ids: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
    ) -> None:
        self.robot = robot
        self.channel = channel
        self.interface = interface
        can_sc = robot.scenario.can
        self.scaling = JointScaling(can_sc.counts_per_rev, can_sc.gear_ratio, can_sc.sign, can_sc.offset_counts)
        self.drives = [_Drive(n, j) for j, n in enumerate(node_ids)]
        self._by_id = {d.node_id: d for d in self.drives}
        self.network: Any = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._last_eval_t = robot.world.now_s()
        self.syncs = 0

    @property
    def url(self) -> str:
        """``canopen://channel?interface=...&nodes=...&model=...`` plus the count scaling."""
        def vec(a: np.ndarray) -> str:
            return repr(float(a[0])) if np.all(a == a[0]) else ",".join(repr(float(x)) for x in a)

        sc = self.robot.scenario.can
        ch = f"[{self.channel}]" if ":" in self.channel else self.channel
        ids = [d.node_id for d in self.drives]
        q = [
            f"interface={self.interface}",
            "nodes=" + ",".join(str(i) for i in ids),
            f"counts_per_rev={vec(sc.counts_per_rev)}",
            f"gear_ratio={vec(sc.gear_ratio)}",
            f"sign={vec(sc.sign)}",
            f"offset_counts={vec(sc.offset_counts)}",
        ]
        if self.robot.model.name in ("ur3e", "ur5e", "ur10e"):
            q.insert(2, f"model={self.robot.model.name}")
        return f"canopen://{ch}?" + "&".join(q)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> CanopenSimDrives:
        import canopen

        sc = self.robot.scenario.can
        net = canopen.Network()
        net.NOTIFIER_CYCLE = 0.05  # bounds how long close() waits for the receive thread
        net.connect(channel=self.channel, interface=self.interface)
        self.network = net
        q_counts = self.scaling.to_counts(self.robot.sample().q_ctrl_rad)
        for d in self.drives:
            node = canopen.LocalNode(d.node_id, build_object_dictionary())
            net.add_node(node)
            # route SDO and NMT through the silence filter
            net.unsubscribe(0x600 + d.node_id, node.sdo.on_request)
            net.unsubscribe(0, node.nmt.on_command)
            net.subscribe(0x600 + d.node_id, self._filtered(d, node.sdo.on_request))
            net.subscribe(0, self._filtered(d, node.nmt.on_command))
            node.add_read_callback(self._reader(d))
            node.add_write_callback(self._writer(d))
            node.data_store.setdefault(Od.PRODUCER_HEARTBEAT_TIME, {})[0] = struct.pack("<H", sc.heartbeat_ms)
            node.data_store.setdefault(Od.POSITION_WINDOW, {})[0] = struct.pack("<I", sc.position_window_counts)
            node.data_store.setdefault(Od.POSITION_WINDOW_TIME, {})[0] = struct.pack("<H", sc.position_window_time_ms)
            vel = math.radians(sc.profile_velocity_deg_s) / abs(float(self.scaling.rad_per_count[d.joint]))
            node.data_store.setdefault(Od.PROFILE_VELOCITY, {})[0] = struct.pack("<I", int(vel))
            d.node = node
            d.target = int(q_counts[d.joint])
            # boot: boot-up message, then pre-operational with heartbeats running
            net.send_message(HEARTBEAT_COB_BASE + d.node_id, bytes([0]))
            node.nmt.send_command(NmtCommand.ENTER_PRE_OPERATIONAL)
        net.subscribe(SYNC_COB_ID, self._on_sync)
        self._monitor = threading.Thread(target=self._watch_faults, name="canopen-sim-faults", daemon=True)
        self._monitor.start()
        log.info("sim CiA 402 drives %s on %s/%s", [d.node_id for d in self.drives], self.interface, self.channel)
        return self

    def close(self) -> None:
        """Stop heartbeats and threads, shut the bus down (idempotent)."""
        self._stop.set()
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

    # -- faults ----------------------------------------------------------------------------
    def _is_silent(self, d: _Drive) -> bool:
        r = self.robot
        return r.fault_active("disconnect") or r.fault_active("silent_node", node=d.node_id)

    def _watch_faults(self) -> None:
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

    def _filtered(self, d: _Drive, fn):
        def handler(can_id: int, data: bytearray, timestamp: float) -> None:
            if not d.silent and not self._is_silent(d):
                with self._lock:
                    fn(can_id, data, timestamp)

        return handler

    # -- drive firmware ---------------------------------------------------------------------
    def _position_counts(self, q_rad: np.ndarray) -> np.ndarray:
        return self.scaling.to_counts(q_rad)

    def _update_all(self, t_s: float) -> None:
        """Drive bookkeeping up to world time ``t_s``: quick stop, target following, and the
        position window checked on the noise-free track since the previous evaluation (at
        most 1 ms apart), so an oscillation through the window never counts as inside."""
        t0 = min(self._last_eval_t, t_s)
        k = int(min(200, max(2, math.ceil((t_s - t0) / 1e-3) + 1)))
        ts = np.linspace(t0, t_s, k)
        track = self._position_counts(self.robot.ctrl_track(ts))
        self._last_eval_t = t_s
        pstop = self.robot.fault_active("protective_stop", t_s)
        for d in self.drives:
            self._update(d, ts, track[:, d.joint], pstop)

    def _update(self, d: _Drive, ts: np.ndarray, counts: np.ndarray, pstop: bool) -> None:
        if pstop and d.state is not Cia402State.QUICK_STOP_ACTIVE:
            d.state = Cia402State.QUICK_STOP_ACTIVE
        elif not pstop and d.state is Cia402State.QUICK_STOP_ACTIVE:
            d.state = Cia402State.SWITCH_ON_DISABLED
        if d.state is not Cia402State.OPERATION_ENABLED:
            d.target = int(counts[-1])
            d.reached = True
            d.inside_since = None
            return
        window = struct.unpack("<I", d.node.get_data(Od.POSITION_WINDOW, 0))[0]
        window_ms = struct.unpack("<H", d.node.get_data(Od.POSITION_WINDOW_TIME, 0))[0]
        inside = np.abs(counts - d.target) <= window
        if not inside[-1]:
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
        sw = _BASE_STATUS.get(d.state, 0) | Statusword.REMOTE
        if d.reached:
            sw |= Statusword.TARGET_REACHED
        if d.ack:
            sw |= Statusword.SET_POINT_ACKNOWLEDGE
        return int(sw)

    def _reader(self, d: _Drive):
        def read(index: int, subindex: int, od: Any) -> Any:
            if index not in (Od.POSITION_ACTUAL_VALUE, Od.STATUSWORD, Od.VELOCITY_ACTUAL_VALUE,
                             Od.MODES_OF_OPERATION_DISPLAY):
                return None
            s = self.robot.sample()
            pos = int(self._position_counts(s.q_rad)[d.joint])
            self._update_all(s.t_sim_s)
            if index == Od.POSITION_ACTUAL_VALUE:
                return pos
            if index == Od.VELOCITY_ACTUAL_VALUE:
                return int(s.qd_rad_s[d.joint] / self.scaling.rad_per_count[d.joint])
            if index == Od.MODES_OF_OPERATION_DISPLAY:
                return d.mode
            return self._statusword(d)

        return read

    def _writer(self, d: _Drive):
        from canopen.sdo.exceptions import SdoAbortedError

        def write(index: int, subindex: int, od: Any, data: bytes) -> None:
            if index == Od.CONTROLWORD:
                self._controlword(d, struct.unpack("<H", bytes(data[:2]))[0])
            elif index == Od.MODES_OF_OPERATION:
                mode = struct.unpack("<b", bytes(data[:1]))[0]
                if mode != MODE_PROFILE_POSITION:
                    raise SdoAbortedError(ABORT_INVALID_VALUE)
                d.mode = mode
            elif index == Od.TPDO1_MAPPING and subindex > 0:
                entry = struct.unpack("<I", bytes(data[:4]))[0]
                idx, sub = entry >> 16, (entry >> 8) & 0xFF
                if entry and (idx not in d.node.object_dictionary or
                              not d.node.object_dictionary.get_variable(idx, sub).pdo_mappable):
                    raise SdoAbortedError(ABORT_CANNOT_MAP)

        return write

    def _controlword(self, d: _Drive, cw: int) -> None:
        from canopen.sdo.exceptions import SdoAbortedError

        s = self.robot.sample()
        pos = int(self._position_counts(s.q_ctrl_rad)[d.joint])
        self._update_all(s.t_sim_s)
        st = d.state
        # CiA 402 device control commands (bit patterns of bits 7, 3, 2, 1, 0)
        if d.state is Cia402State.QUICK_STOP_ACTIVE:
            if cw & Controlword.NEW_SET_POINT:
                raise SdoAbortedError(ABORT_DEVICE_STATE)
        elif cw & Controlword.FAULT_RESET:
            if st is Cia402State.FAULT and not d.cw_prev & Controlword.FAULT_RESET:
                d.state = Cia402State.SWITCH_ON_DISABLED
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
        if not cw & Controlword.NEW_SET_POINT:
            d.ack = False
        d.cw_prev = cw

    def _profile_position(self, d: _Drive, cw: int) -> None:
        from canopen.sdo.exceptions import SdoAbortedError

        halt = bool(cw & Controlword.HALT)
        if halt and not d.halt:
            self.robot.stop()
            d.target = int(self._position_counts(self.robot.sample().target_q_rad)[d.joint])
        d.halt = halt
        rising = cw & Controlword.NEW_SET_POINT and not d.cw_prev & Controlword.NEW_SET_POINT
        if not rising or halt:
            return
        if d.mode != MODE_PROFILE_POSITION:
            raise SdoAbortedError(ABORT_DEVICE_STATE)
        target = struct.unpack("<i", d.node.get_data(Od.TARGET_POSITION, 0))[0]
        if cw & Controlword.ABS_REL:
            target += d.target
        d.target = target
        d.ack = True
        d.reached = False
        d.inside_since = None
        targets = np.array([x.target for x in self.drives], dtype=float)
        vel_counts = np.array(
            [struct.unpack("<I", x.node.get_data(Od.PROFILE_VELOCITY, 0))[0] for x in self.drives], dtype=float
        )
        v_rad = float(np.max(vel_counts * np.abs(self.scaling.rad_per_count)))
        try:
            self.robot.command_joints(self.scaling.to_rad(targets), v_rad)
        except SimRefused as exc:
            d.ack = False
            raise SdoAbortedError(ABORT_DEVICE_STATE) from exc

    def _on_sync(self, can_id: int, data: bytearray, timestamp: float) -> None:
        s = self.robot.sample()
        counts = self._position_counts(s.q_rad)
        self.syncs += 1
        with self._lock:
            self._update_all(s.t_sim_s)
        for d in self.drives:
            if d.silent or self._is_silent(d):
                continue
            with self._lock:
                node = d.node
                if node.nmt.state != "OPERATIONAL":
                    continue
                cob = struct.unpack("<I", node.get_data(Od.TPDO1_COMMUNICATION, 1))[0]
                ttype = node.get_data(Od.TPDO1_COMMUNICATION, 2)[0]
                if cob & PDO_NOT_VALID or not 1 <= ttype <= 240:
                    continue
                d.sync_count += 1
                if d.sync_count % ttype:
                    continue
                payload = bytearray()
                n_map = node.get_data(Od.TPDO1_MAPPING, 0)[0]
                for sub in range(1, n_map + 1):
                    entry = struct.unpack("<I", node.get_data(Od.TPDO1_MAPPING, sub))[0]
                    idx, bits = entry >> 16, entry & 0xFF
                    if idx == Od.POSITION_ACTUAL_VALUE:
                        raw = struct.pack("<i", int(counts[d.joint]))
                    elif idx == Od.STATUSWORD:
                        raw = struct.pack("<H", self._statusword(d))
                    else:
                        raw = node.get_data(idx, (entry >> 8) & 0xFF)
                    payload += raw[: bits // 8]
            self.network.send_message(cob & 0x7FF, bytes(payload[:8]))

    # -- test hooks --------------------------------------------------------------------------
    def drive_state(self, node_id: int) -> Cia402State:
        """The CiA 402 state of one drive (what its statusword would show)."""
        return self._by_id[node_id].state

    def disable_all(self) -> None:
        """Put every drive in SWITCH ON DISABLED (as a power cycle of the amplifier would)."""
        for d in self.drives:
            with self._lock:
                self._controlword(d, int(CW_DISABLE_VOLTAGE))
