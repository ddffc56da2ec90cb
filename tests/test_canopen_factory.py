"""The CiA 402 driver against drives it was not written with: the independent drive model
of ``tests/cia402_drive.py`` (CiA 402 on ``canopen.LocalNode``, own object dictionary),
one factory behaviour per test, always through ``connect_robot("canopen://...")``.

Every wait is on a condition with a deadline; nothing asserts on timing except what the
drive model computed itself (its recorded trapezoids).
"""

from __future__ import annotations

import itertools
import logging
import math
import struct
import threading
import time

import can
import canopen
import numpy as np
import pytest
from cia402_drive import FAULT_CODE, Factory, FactoryDrives

from cellcal.drivers import connect_robot
from cellcal.drivers.canopen402 import HeartbeatLost, Od
from cellcal.drivers.errors import DeviceError, DriverInitError
from cellcal.drivers.robot import RobotMode
from cellcal.drivers.settle import SettleConfig

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

INC_PER_REV = 131072
GEAR = 101.0
_channels = itertools.count()
NODES = (1, 2, 3, 4, 5, 6)
RAD_PER_INC = 2 * math.pi / (INC_PER_REV * GEAR)


def _url(channel: str, **keys: object) -> str:
    q = {"interface": "virtual", "counts_per_rev": INC_PER_REV, "gear_ratio": GEAR, **keys}
    return f"canopen://{channel}?" + "&".join(f"{k}={v}" for k, v in q.items())


@pytest.fixture
def factory_drives():
    """``factory_drives(Factory(...), per_node=...)`` -> (started FactoryDrives, url builder)."""
    started = []

    def make(factory: Factory | None = None, **kw):
        ch = f"factory-{next(_channels)}"
        fd = FactoryDrives(ch, factory or Factory(increments_per_rev=INC_PER_REV), **kw).start()
        started.append(fd)
        return fd, lambda **keys: _url(ch, **keys)

    yield make
    for fd in started:
        fd.close()


def _wait(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _u16(robot, n, index):
    return struct.unpack("<H", robot.sdo_read(n, index)[:2])[0]


def _u32(robot, n, index, sub=0):
    return struct.unpack("<I", robot.sdo_read(n, index, sub)[:4])[0]


def _arrivals_together(fd: FactoryDrives, move_index: int = -1) -> None:
    """Every joint's last trapezoid ends at the same time and shares its phase durations."""
    recs = [d.moves[move_index] for d in fd.drives if d.moves[move_index].target != d.moves[move_index].start]
    ends = np.array([r.t_end for r in recs])
    durations = ends - np.array([r.t_start for r in recs])
    t_acc = np.array([r.peak_speed_inc_s / r.accel_inc_s2 for r in recs])
    t_dec = np.array([r.peak_speed_inc_s / r.decel_inc_s2 for r in recs])
    # the set-points are taken one SDO round trip apart: compare durations, not start times
    assert np.ptp(durations) <= 0.02 * durations.max() + 1e-3, durations
    assert np.ptp(t_acc) <= 0.02 * t_acc.max() + 1e-3 and np.ptp(t_dec) <= 0.02 * t_dec.max() + 1e-3


# -- 1. open and supervision ------------------------------------------------------------------
def test_heartbeat_off_opens_with_sdo_supervision_and_reads_identity(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, heartbeat_ms=0))
    with connect_robot(url()) as robot:
        assert robot.supervision == {n: "sdo" for n in NODES}
        s = robot.read_state()
        np.testing.assert_allclose(s.q_rad, 0.0, atol=1e-9)
        ident = robot.identity
        assert [d["serial"] for d in ident["drives"]] == [0x5000 + n for n in NODES]
        assert ident["drives"][0]["vendor_id"] == 0x1B9 and ident["drives"][0]["product_code"] == 0xA402
        assert ident["drives"][0]["device_type"] & 0xFFFF == 402
        assert ident["drives"][0]["device_name"] == "Factory Servo 402"
        assert ident["serials"] == [0x5000 + n for n in NODES] and ident["model"] == "ur5e"
        # a drive that stops answering is reported (the liveness SDO reads fail)
        fd.silence(4)
        exc = _wait(lambda: _raises(robot, HeartbeatLost), 5.0, "HeartbeatLost via SDO")
        assert exc.node_id == 4 and exc.via == "sdo"


def _raises(robot, cls):
    try:
        robot.read_state(timeout_s=0.05)
    except cls as exc:
        return exc
    except Exception:  # noqa: BLE001 - e.g. a timeout while the TPDOs stopped
        return None
    return None


def test_heartbeat_ms_is_written_before_the_driver_waits_for_heartbeats(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, heartbeat_ms=0))
    with connect_robot(url(heartbeat_ms=100)) as robot:
        assert robot.supervision == {n: "heartbeat" for n in NODES}
        assert all(_u16(robot, n, Od.PRODUCER_HEARTBEAT_TIME) == 100 for n in NODES)
        robot.read_state()
        fd.silence(2)
        exc = _wait(lambda: _raises(robot, HeartbeatLost), 5.0, "HeartbeatLost")
        assert exc.node_id == 2 and exc.via == "heartbeat"


def test_a_node_that_does_not_answer_is_named(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV))
    with pytest.raises(DriverInitError, match=r"no SDO answer from node\(s\) \[9\]"):
        connect_robot(url(nodes="1,2,3,4,5,9", boot_timeout_s=0.3)).open()


def test_unhomed_joint_is_refused_with_a_clear_message(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV), per_node={3: {"homed": False}})
    with connect_robot(url(homing_required="true")) as robot:
        assert robot.homed == (True, True, False, True, True, True)
        assert robot.identity["homed"] == [True, True, False, True, True, True]
        # bit 12 is read in homing mode and the mode is put back
        assert all(fd[n].mode != 6 for n in NODES)
        with pytest.raises(DeviceError, match=r"joint 3 \(node 3: not homed\)") as ei:
            robot.move_to(q_rad=np.full(6, 0.05), speed=1.0, timeout_s=10)
        assert ei.value.code == "NOT_HOMED"
        assert not fd[3].moves
        fd[3].homed = True  # the operator homes the axis with the drive's own tools
        robot.move_to(q_rad=np.full(6, 0.05), speed=1.0, timeout_s=10)
        np.testing.assert_allclose(robot.read_state().q_rad, 0.05, atol=1e-5)
    # without homing_required the state is not read (absolute encoders assumed)
    with connect_robot(url()) as robot:
        assert robot.homed == (None,) * 6


# -- 2. motion ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ack_delay_s", [0.001, 0.003, 0.005])
def test_late_setpoint_acknowledge_is_polled(factory_drives, ack_delay_s):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, ack_delay_s=ack_delay_s))
    with connect_robot(url()) as robot:
        robot.move_to(q_rad=np.full(6, 0.1), speed=1.0, timeout_s=10)
        s = robot.read_state()
        assert s.target_reached is True
        np.testing.assert_allclose(s.q_rad, 0.1, atol=1e-5)
        assert all(len(d.moves) == 1 for d in fd.drives)


def test_setpoint_never_acknowledged_is_a_device_error(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, ack_delay_s=30.0))
    with connect_robot(url(setpoint_timeout_s=0.1)) as robot:
        with pytest.raises(DeviceError, match="set-point not acknowledged within 0.1 s") as ei:
            robot.move_to(q_rad=np.full(6, 0.1), timeout_s=10)
        assert ei.value.code == "SETPOINT"


def test_small_factory_deceleration_is_overwritten_and_joints_arrive_together(factory_drives):
    # 6084h = 100 increments/s² from the factory: a 0.3 rad joint move would take minutes
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, profile_deceleration=100))
    target = np.array([0.3, -0.2, 0.1, 0.05, -0.3, 0.25])
    with connect_robot(url()) as robot:
        robot.move_to(q_rad=target, speed=1.0, timeout_s=20)
        np.testing.assert_allclose(robot.read_state().q_rad, target, atol=1e-5)
        for n in NODES:
            rec = fd[n].moves[-1]
            assert rec.written_deceleration > 1000 * 100  # the driver wrote 6084h
            # deceleration = acceleration (max_joint_decel defaults to max_joint_accel), both scaled by |dq|
            assert rec.written_deceleration == pytest.approx(rec.written_acceleration, rel=1e-3)
            assert _u32(robot, n, Od.PROFILE_DECELERATION) == rec.written_deceleration
        _arrivals_together(fd)
        durations = [d.moves[-1].t_end - d.moves[-1].t_start for d in fd.drives]
        # the leading joint (0.3 rad) at 1.4 rad/s² both ways: a triangle of 2 sqrt(0.3/1.4) s
        assert max(durations) == pytest.approx(2 * math.sqrt(0.3 / 1.4), rel=0.02)


@pytest.mark.parametrize("announce", [True, False])
def test_rpm_drive_never_exceeds_the_configured_joint_speed(factory_drives, announce):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, velocity_rpm=True, publish_si_unit=announce))
    keys = {} if announce else {"velocity_units": "rpm"}
    limit = 0.8
    target = np.array([1.0, -0.6, 0.4, 0.2, -1.0, 0.7])
    with connect_robot(url(max_joint_speed_rad_s=limit, **keys)) as robot:
        assert "rpm" in robot.units[0].velocity_source
        assert "rpm/s" in robot.units[0].accel_source  # acceleration: the velocity unit per second
        robot.move_to(q_rad=target, speed=1.0, timeout_s=30)
        np.testing.assert_allclose(robot.read_state().q_rad, target, atol=1e-5)
        peaks = np.array([d.moves[-1].peak_speed_inc_s * RAD_PER_INC for d in fd.drives])
        assert np.all(peaks <= limit * (1 + 1e-9)), peaks
        assert peaks.max() > 0.98 * limit  # and uses it (a long move cruises at the limit)
        # profile velocity in rpm: 0.8 rad/s at the joint is 0.8 * 101 * 60 / 2 pi motor rpm
        assert fd[1].moves[-1].written_velocity == math.floor(limit * GEAR * 60 / (2 * math.pi))
        _arrivals_together(fd)
        robot.move_to(q_rad=np.zeros(6), speed=0.5, timeout_s=30)
        peaks = np.array([d.moves[-1].peak_speed_inc_s * RAD_PER_INC for d in fd.drives])
        assert np.all(peaks <= 0.5 * limit * (1 + 1e-9))


def test_units_contradicting_the_drive_are_refused_at_open(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, velocity_rpm=True, publish_resolution=True))
    with pytest.raises(DriverInitError, match=r"velocity_units=counts_per_s but the drive reports 0x60A9 = 0x00B44700"):
        connect_robot(url(velocity_units="counts_per_s")).open()
    with pytest.raises(DriverInitError, match=r"counts_per_rev=4096 but the drive counts 131072"):
        connect_robot(url(counts_per_rev=4096)).open()
    # a unit too coarse for the configured speed: 1 rpm at gear 1 is 0.105 rad/s
    with pytest.raises(DriverInitError, match="too coarse"):
        connect_robot(url(gear_ratio=1, max_joint_speed_rad_s=0.05)).open()


def test_per_joint_units(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV), per_node={5: {"velocity_rpm": True,
                                                                                   "publish_si_unit": False}})
    units = "counts_per_s,counts_per_s,counts_per_s,counts_per_s,rpm,counts_per_s"
    with connect_robot(url(velocity_units=units, max_joint_speed_rad_s=0.5)) as robot:
        robot.move_to(q_rad=np.full(6, 0.8), speed=1.0, timeout_s=30)
        peaks = np.array([d.moves[-1].peak_speed_inc_s * RAD_PER_INC for d in fd.drives])
        assert np.all(peaks <= 0.5 * (1 + 1e-9)) and np.ptp(peaks) < 0.01 * 0.5


def test_drive_max_profile_velocity_lowers_the_limit(factory_drives):
    # 607Fh = 100000 increments/s = 0.0475 rad/s at the joint on node 2
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV), per_node={2: {"max_profile_velocity": 100_000}})
    with connect_robot(url()) as robot:
        assert robot.limits.speed_rad_s[1] == pytest.approx(100_000 * RAD_PER_INC)
        robot.move_to(q_rad=np.full(6, 0.02), speed=1.0, timeout_s=30)
        _arrivals_together(fd)


# -- 3. bus etiquette ---------------------------------------------------------------------------
class _Listener:
    """Every frame on the bus, from a bus handle of its own."""

    def __init__(self, channel: str) -> None:
        self.bus = can.Bus(interface="virtual", channel=channel)
        self.frames: list[can.Message] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            m = self.bus.recv(0.05)
            if m is not None:
                self.frames.append(m)

    def ids(self) -> list[int]:
        return [m.arbitration_id for m in list(self.frames)]

    def close(self) -> None:
        self._stop.set()
        self._t.join(2)
        self.bus.shutdown()


def test_remapping_disables_the_factory_event_tpdos(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, factory_tpdos=True))
    with connect_robot(url()) as robot:
        assert robot.sampling == "sync"
        for n in NODES:
            assert not _u32(robot, n, Od.TPDO1_COMMUNICATION, 1) & 0x80000000
            for k in (1, 2):  # TPDO2, TPDO3 were valid at power-up
                assert _u32(robot, n, Od.TPDO1_COMMUNICATION + k, 1) & 0x80000000
        listener = _Listener(fd.channel)
        try:
            # 0.3 s is six event periods of the factory TPDOs: none may come
            _wait(lambda: sum(1 for i in listener.ids() if 0x181 <= i <= 0x186) >= 60, 5.0, "TPDO1 traffic")
            assert not [i for i in listener.ids() if 0x281 <= i <= 0x286 or 0x381 <= i <= 0x386]
        finally:
            listener.close()


def test_fixed_mapping_is_used_as_found(factory_drives, caplog):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, fixed_mapping=True))
    caplog.set_level(logging.INFO, logger="cellcal.drivers.canopen402")
    for keys in ({}, {"remap_pdos": "false"}):
        caplog.clear()
        with connect_robot(url(**keys)) as robot:
            assert robot.sampling == "sync"  # both TPDOs are synchronous: still one vector per SYNC
            layout = robot.tpdo_layout[3]
            assert [(u.number, [f[0] for f in u.fields]) for u in layout] == [
                (1, ["statusword"]), (2, ["position", "velocity"])]
            assert "the drives' own mapping" in caplog.text
            if not keys:
                assert "TPDO1 mapping refused" in caplog.text
            robot.move_to(q_rad=np.full(6, 0.1), speed=1.0, timeout_s=10)
            s = robot.read_state()
            np.testing.assert_allclose(s.q_rad, 0.1, atol=1e-5)
            assert s.target_reached is True
            # the mapping is untouched
            assert _u32(robot, 3, Od.TPDO1_MAPPING, 1) == 0x60410010
            robot.move_to(q_rad=np.zeros(6), speed=1.0, timeout_s=10)


def test_event_driven_mapping_says_joints_are_not_sampled_together(factory_drives, caplog):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, factory_tpdos=True))
    caplog.set_level(logging.INFO, logger="cellcal.drivers.canopen402")
    with connect_robot(url(remap_pdos="false")) as robot:
        assert robot.sampling == "event"
        assert "NOT sampled together" in caplog.text
        s1 = robot.read_state()
        s2 = _wait(lambda: (lambda s: s if s.seq > s1.seq else None)(robot.read_state()), 5.0, "next sample")
        np.testing.assert_allclose(s2.q_rad, 0.0, atol=1e-9)


def test_no_usable_tpdo_falls_back_to_sdo_polling_and_says_so(factory_drives, caplog):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, factory_tpdos=False))
    caplog.set_level(logging.INFO, logger="cellcal.drivers.canopen402")
    with connect_robot(url(remap_pdos="false")) as robot:
        assert robot.sampling == "sdo" and not robot.using_pdo
        assert "sampling by SDO polling" in caplog.text
        s1, s2 = robot.read_state(), robot.read_state()
        assert s2.seq == s1.seq + 1


def test_sharing_a_bus_with_another_master(factory_drives):
    """Another master started the nodes and produces SYNC (with a counter byte, which this
    driver never sends); cellcal sends no NMT and no SYNC and touches no PDO object."""
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, fixed_mapping=True))
    other = canopen.Network()
    other.NOTIFIER_CYCLE = 0.05
    other.connect(channel=fd.channel, interface="virtual")
    listener = _Listener(fd.channel)
    counter = itertools.count()
    stop = threading.Event()

    def sync_master() -> None:
        while not stop.wait(0.01):
            other.send_message(0x080, bytes([next(counter) % 240 + 1]))

    try:
        other.send_message(0x000, bytes([0x01, 0x00]))  # NMT start, all nodes
        _wait(lambda: all(d.node.nmt.state == "OPERATIONAL" for d in fd.drives), 5.0, "operational")
        t = threading.Thread(target=sync_master, daemon=True)
        t.start()
        n_before = len(listener.frames)
        keys = {"nmt_master": "false", "sync_producer": "false", "remap_pdos": "false", "enable": "never"}
        with connect_robot(url(**keys)) as robot:
            assert robot.sampling == "sync"
            s1 = robot.read_state()
            _wait(lambda: robot.read_state().seq >= s1.seq + 20, 5.0, "samples on the foreign SYNC")
            assert all(d.node.nmt.state == "OPERATIONAL" for d in fd.drives)
        frames = listener.frames[n_before:]
        assert not [m for m in frames if m.arbitration_id == 0x000], "cellcal sent NMT"
        syncs = [m for m in frames if m.arbitration_id == 0x080]
        assert syncs and all(len(m.data) == 1 for m in syncs), "cellcal sent SYNC"
        assert all(d.node.data_store[0x1800][1] == struct.pack("<I", 0x180 + d.id) for d in fd.drives)
    finally:
        stop.set()
        listener.close()
        other.disconnect()


def test_remap_without_nmt_master_is_refused():
    with pytest.raises(ValueError, match="remap_pdos=true needs nmt_master=true"):
        connect_robot("canopen://x?interface=virtual&nmt_master=false")


# -- 4. power-up fault ------------------------------------------------------------------------
def test_power_up_fault_is_reported_then_reset_on_move(factory_drives):
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, power_up_fault=True))
    with connect_robot(url(fault_reset="false")) as robot:
        assert robot.read_state().mode is RobotMode.FAULT
        with pytest.raises(DeviceError, match=f"0x{FAULT_CODE:04X}") as ei:
            robot.move_to(q_rad=np.full(6, 0.05), timeout_s=10)
        assert ei.value.code == "FAULT"
    with connect_robot(url()) as robot:
        robot.move_to(q_rad=np.full(6, 0.05), speed=1.0, timeout_s=10)
        s = robot.read_state()
        assert s.mode is RobotMode.RUNNING and s.target_reached is True
        # the fault reset's EMCY ("error reset", code 0) was seen
        _wait(lambda: any(code == 0 for _, code, _ in robot.emergencies), 2.0, "EMCY error reset")


# -- 5. observe mode with disabled drives -----------------------------------------------------
def test_observe_mode_settles_from_positions_with_disabled_drives(factory_drives):
    """The cell's own controller moves the arm; the drives are not OPERATION ENABLED for
    cellcal (target reached stays clear): settling is judged from position and velocity."""
    fd, url = factory_drives(Factory(increments_per_rev=INC_PER_REV, fixed_mapping=True))
    cfg = SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.05))
    with connect_robot(url(enable="never")) as robot:
        s = robot.read_state()
        assert s.target_reached is None and s.mode is RobotMode.IDLE
        speed = 0.4 / RAD_PER_INC  # 0.4 rad/s at the joints
        for d in fd.drives:
            d.move_externally(0.3 / RAD_PER_INC, speed, 2 * speed)
        t_end = max(d.profile.t_end for d in fd.drives)
        _wait(lambda: robot.read_state().moving, 5.0, "motion seen")
        state, status = robot.wait_settled(cfg, timeout_s=20)
        assert status.settled and state.target_reached is None
        assert status.window_start_ns >= (t_end - 0.005) * 1e9  # not before the arm stopped
        np.testing.assert_allclose(state.q_rad, 0.3, atol=1e-4)
        with pytest.raises(DriverInitError, match="enable=never"):
            robot.move_to(q_rad=np.zeros(6))
        robot.stop()  # nothing commanded: nothing written
        assert all(d.cw == 0 for d in fd.drives)


# -- 6. position windows ---------------------------------------------------------------------
def test_the_position_window_is_read_from_each_drive_and_moves_complete_inside_it(factory_drives):
    fd, url = factory_drives()
    with connect_robot(url(position_window_time_ms=8)) as robot:
        assert [(w.counts, w.time_s, w.source) for w in robot.windows] == [(50, 0.008, "drive")] * 6
        q0 = robot.read_state().q_rad
        robot.move_to(q_rad=q0 + 0.05, speed=1.0, timeout_s=10)
        move = robot.last_move
        assert move["complete"] and all(abs(e) <= 50 for e in move["error_counts"])


def test_a_drive_without_window_objects_is_judged_with_the_configured_window_or_the_fallback(factory_drives, caplog):
    factory = Factory(increments_per_rev=INC_PER_REV, window_objects=False)
    fd, url = factory_drives(factory)
    with caplog.at_level(logging.WARNING), connect_robot(url()) as robot:
        fallback = math.floor(math.radians(0.01) / RAD_PER_INC)
        assert [(w.counts, w.source) for w in robot.windows] == [(fallback, "fallback")] * 6
        assert "0x6067 missing, 0x6068 missing" in caplog.text and "position_window_counts" in caplog.text
        q0 = robot.read_state().q_rad
        robot.move_to(q_rad=q0 + 0.05, speed=1.0, timeout_s=10)
        assert robot.read_state().target_reached
    fd2, url2 = factory_drives(factory)
    with connect_robot(url2(position_window_counts=80, position_window_time_ms=4)) as robot:  # written: aborted
        assert [(w.counts, w.time_s, w.source) for w in robot.windows] == [(80, 0.004, "configured")] * 6
