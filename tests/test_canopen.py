"""CiA 402 driver against six simulated drives on python-can's virtual bus (and across
processes through the simulator's loopback SLCAN bridge)."""

from __future__ import annotations

import itertools
import math
import multiprocessing as mp
import struct
import threading
import time

import numpy as np
import pytest

from cellcal.drivers import connect_robot
from cellcal.drivers.canopen402 import (
    Cia402State,
    HeartbeatLost,
    NmtState,
    Od,
    SdoAbortError,
    Statusword,
    cia402_state,
    parse_nodes,
)
from cellcal.drivers.errors import DeviceError, DriverInitError, DriverTimeoutError
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.robot import ProtectiveStop, RobotMode
from cellcal.drivers.settle import SettleConfig
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

UR5E = dh_model("ur5e")
HOME_FLANGE = UR5E.forward(np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0]))
Q_HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])
# The simulated drives are threads of the test process: at a load of 9 on 2 cores one was starved
# for 200 ms (lost at 100 ms with the factor of 2), at 40 ms sooner; 250 ms rides that out.
HB_MS = 250
_channels = itertools.count()


def make_sim(table=None, scale=5.0):
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME_FLANGE, time_scale=scale)
    t = {"can": {"heartbeat_ms": HB_MS}, **(table or {})}
    return start_sim_robot(world, t, transport="canopen", can_channel=f"test-can-{next(_channels)}")


@pytest.fixture
def sim():
    h = make_sim({"encoder_noise_deg": 0.0005})
    yield h
    h.close()


def test_statusword_patterns():
    assert cia402_state(0x0250) is Cia402State.SWITCH_ON_DISABLED  # remote bit set, voltage
    assert cia402_state(0x0231) is Cia402State.READY_TO_SWITCH_ON
    assert cia402_state(0x0637) is Cia402State.OPERATION_ENABLED  # + target reached
    assert cia402_state(0x0017) is Cia402State.QUICK_STOP_ACTIVE
    assert cia402_state(0x0008) is Cia402State.FAULT
    assert parse_nodes("1-6") == (1, 2, 3, 4, 5, 6)
    assert parse_nodes("11,12,13-16") == (11, 12, 13, 14, 15, 16)
    with pytest.raises(ValueError):
        parse_nodes("1-5")


def test_open_configures_pdo_nmt_and_reads_home(sim):
    with connect_robot(sim.url) as robot:
        assert robot.using_pdo
        assert all(robot.nmt_state(n) is NmtState.OPERATIONAL for n in robot.nodes)
        # the mapping the driver wrote, read back by SDO: 0x6064 32 bit, 0x6041 16 bit
        assert struct.unpack("<I", robot.sdo_read(3, Od.TPDO1_MAPPING, 1)) == (0x60640020,)
        assert struct.unpack("<I", robot.sdo_read(3, Od.TPDO1_MAPPING, 2)) == (0x60410010,)
        assert robot.sdo_read(3, Od.TPDO1_COMMUNICATION, 2) == b"\x01"  # synchronous
        s = robot.read_state()
        np.testing.assert_allclose(s.q_rad, Q_HOME, atol=1e-4)
        np.testing.assert_allclose(s.base_T_flange, UR5E.forward(s.q_rad), atol=1e-12)
        assert s.mode is RobotMode.IDLE  # drives not enabled until a move
        assert s.target_reached is None  # cellcal commands no drive yet: settle from positions


def test_sdo_read_matches_pdo(sim):
    with connect_robot(sim.url) as robot:
        s = robot.read_state()
        # device type: CiA 402 drive profile (0x0192) in the low word
        assert struct.unpack("<I", robot.sdo_read(1, Od.DEVICE_TYPE))[0] & 0xFFFF == 402
        for j, n in enumerate(robot.nodes):
            counts = struct.unpack("<i", robot.sdo_read(n, Od.POSITION_ACTUAL_VALUE))[0]
            q = robot.scaling.to_rad(np.full(6, counts))[j]
            assert q == pytest.approx(s.q_rad[j], abs=1e-4)


def test_pdo_on_sync_gives_one_vector_per_sync(sim):
    with connect_robot(sim.url, sync_period_ms=5) as robot:
        first = robot.read_state()
        syncs0, abandoned0 = sim.server.syncs, robot.abandoned_cycles
        deadline = time.monotonic() + 20.0
        while (last := robot.read_state()).seq < first.seq + 40:
            assert time.monotonic() < deadline, "fewer than 40 joint vectors in 20 s"
            time.sleep(0.005)
        n = last.seq - first.seq
        syncs = sim.server.syncs - syncs0
        dropped = robot.abandoned_cycles - abandoned0
        # every SYNC the drives saw became exactly one vector, unless its cycle was abandoned
        # (late frames under load; one cycle may be in flight at either end of the window)
        assert syncs - dropped - 2 <= n <= syncs + 1
        assert dropped <= n
        assert last.t_host_ns - first.t_host_ns >= n * 5e6 * 0.9  # never two vectors per period
        assert last.t_host_ns > first.t_host_ns and last.t_device_s == last.t_host_ns * 1e-9
        assert 0 < robot.bus_latency_ns < 20e6


def test_sdo_fallback_when_pdo_off(sim):
    with connect_robot(sim.url, pdo="off") as robot:
        assert not robot.using_pdo
        s1 = robot.read_state()
        s2 = robot.read_state()
        assert s2.seq == s1.seq + 1
        np.testing.assert_allclose(s2.q_rad, Q_HOME, atol=1e-4)


def test_sdo_aborts_carry_the_abort_code(sim):
    with connect_robot(sim.url) as robot:
        with pytest.raises(SdoAbortError) as ei:
            robot.sdo_read(2, 0x2000)
        assert ei.value.abort_code == 0x06020000 and ei.value.node_id == 2
        assert "does not exist" in str(ei.value)
        with pytest.raises(SdoAbortError) as ei:
            robot.sdo_write(2, Od.STATUSWORD, 0, b"\x00\x00")
        assert ei.value.abort_code == 0x06010002  # read-only
        with pytest.raises(SdoAbortError) as ei:
            robot.sdo_read(2, Od.IDENTITY, 9)
        assert ei.value.abort_code == 0x06090011  # no such sub-index
        with pytest.raises(SdoAbortError) as ei:
            robot.sdo_write(2, Od.MODES_OF_OPERATION, 0, b"\x03")  # profile velocity: not here
        assert ei.value.abort_code == 0x06090030


def test_silent_drive_gives_heartbeat_lost_within_three_periods(sim):
    with connect_robot(sim.url) as robot:
        robot.read_state()
        t0 = time.monotonic()
        sim.robot.inject("silent_node", node=4, duration_s=6 * HB_MS * 1e-3 * sim.robot.world.time_scale)
        while True:
            try:
                robot.read_state(timeout_s=0.05)
            except HeartbeatLost as exc:
                elapsed = time.monotonic() - t0
                assert exc.node_id == 4
                break
            except DriverTimeoutError:
                pass  # TPDOs stopped before the heartbeat timeout
            assert time.monotonic() - t0 < 6 * HB_MS * 1e-3, "no HeartbeatLost"
            time.sleep(0.002)
        assert elapsed < 3 * HB_MS * 1e-3
        # the drive comes back after 6 periods (wall): heartbeats and PDOs resume
        deadline = time.monotonic() + 3.0 + 6 * HB_MS * 1e-3
        while True:
            try:
                s = robot.read_state(timeout_s=0.1)
                break
            except (HeartbeatLost, DriverTimeoutError):
                assert time.monotonic() < deadline, "drive did not come back"
                time.sleep(0.01)
        np.testing.assert_allclose(s.q_rad, Q_HOME, atol=1e-4)


def test_missing_node_at_open_is_named():
    h = make_sim()
    try:
        url = h.url.replace("nodes=1,2,3,4,5,6", "nodes=1,2,3,4,5,9")
        with pytest.raises(DriverInitError, match=r"\[9\]"):
            connect_robot(url, boot_timeout_s=0.3).open()
    finally:
        h.close()


def test_move_profile_position_until_target_reached(sim):
    target = Q_HOME + np.deg2rad([15.0, 10.0, -20.0, 5.0, 10.0, -30.0])
    with connect_robot(sim.url) as robot:
        robot.move_to(q_rad=target, speed=1.0, timeout_s=10)
        s = robot.read_state()
        assert s.target_reached and s.mode is RobotMode.RUNNING
        # the position window is 200 counts of 2^20 per rev: 1.2e-3 rad
        np.testing.assert_allclose(s.q_rad, target, atol=1.3e-3)
        for n in robot.nodes:
            sw = struct.unpack("<H", robot.sdo_read(n, Od.STATUSWORD))[0]
            assert cia402_state(sw) is Cia402State.OPERATION_ENABLED
            assert sw & Statusword.TARGET_REACHED
        s, status = robot.wait_settled(SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.1),
                                                    max_flange_ang_speed_rad_s=math.radians(0.1)), 10)
        np.testing.assert_allclose(s.q_rad, target, atol=1e-4)
        # a Cartesian move solved by IK from the current joints
        goal = s.base_T_flange.copy()
        goal[:3, 3] += (0.03, -0.02, 0.04)
        robot.move_to(base_T_flange=goal, speed=1.0, timeout_s=10)
        s, _ = robot.wait_settled(SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.1),
                                               max_flange_ang_speed_rad_s=math.radians(0.1)), 10)
        assert np.linalg.norm(s.base_T_flange[:3, 3] - goal[:3, 3]) < 2e-4


def test_stop_ends_a_waiting_move_and_its_target_is_not_reached(sim):
    """What the daemon's abort does: stop() from another thread while move_to waits."""
    with connect_robot(sim.url) as robot:
        failure: list[BaseException] = []

        def move():
            try:
                robot.move_to(q_rad=Q_HOME + np.deg2rad(40.0), speed=0.2, timeout_s=30)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                failure.append(exc)

        t = threading.Thread(target=move, daemon=True)
        t.start()
        deadline = time.monotonic() + 5.0
        while not robot.read_state().moving:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        robot.stop()
        t.join(5.0)
        assert not t.is_alive() and isinstance(failure[0], DeviceError) and failure[0].code == "STOPPED"
        assert robot.read_state().target_reached is False and robot.last_move["stopped"]



@pytest.mark.parametrize("delay_s", [0.0, 0.002, 0.01, 0.03, 0.06])
def test_a_stop_while_the_move_is_being_set_up_sticks(sim, delay_s):
    """stop() that lands before the move's set-points are all acknowledged (the window the
    daemon's abort can hit under load) ends the move as STOPPED: the handshake that follows
    must not lift the halt, and the halted drives' "target reached" is no mismatch."""
    with connect_robot(sim.url) as robot:
        failure: list[BaseException] = []
        start = robot.read_state().q_rad

        def move():
            try:
                robot.move_to(q_rad=start + np.deg2rad(30.0), speed=0.2, timeout_s=30)
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                failure.append(exc)

        t = threading.Thread(target=move, daemon=True)
        t.start()
        if delay_s:
            time.sleep(delay_s)  # where in the set-up the stop lands; not a wait for anything
        robot.stop()
        t.join(10.0)
        assert not t.is_alive()
        assert failure and isinstance(failure[0], DeviceError) and failure[0].code == "STOPPED", failure
        # a stopped move's target is not reached (read_state says so): at rest is what is asked
        s, _ = robot.wait_settled(SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.1),
                                               max_flange_ang_speed_rad_s=math.radians(0.1),
                                               require_target_reached=False), 10)
        assert np.max(np.abs(s.q_rad - start)) < np.deg2rad(25.0)  # halted, not carried on to the target

def test_protective_stop_is_quick_stop_and_needs_reenable(sim):
    with connect_robot(sim.url) as robot:
        robot.move_to(q_rad=Q_HOME + 0.05, speed=1.0, timeout_s=10)
        sim.robot.inject("protective_stop")
        deadline = time.monotonic() + 2.0
        while robot.read_state().mode is not RobotMode.PROTECTIVE_STOP:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        with pytest.raises(ProtectiveStop):
            robot.move_to(q_rad=Q_HOME, timeout_s=5)
        sim.robot.clear("protective_stop")
        deadline = time.monotonic() + 2.0
        while robot.read_state().mode is not RobotMode.IDLE:  # SWITCH ON DISABLED now
            assert time.monotonic() < deadline
            time.sleep(0.005)
        robot.move_to(q_rad=Q_HOME, speed=1.0, timeout_s=10)  # re-enables the drives
        np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME, atol=1.3e-3)


def test_ringing_beyond_the_window_never_reaches_target():
    h = make_sim({"faults": [{"kind": "never_settles", "start_s": 0.0}], "ringing_amplitude_deg": 0.5})
    try:
        # A 100 ms window time: with the drive's factory 20 ms, the end of the move and the
        # 4 Hz ringing can cancel and hold a joint inside the 200-count window long enough
        # for a legitimate "target reached" (about 3 % of runs); 100 ms is far beyond that.
        with connect_robot(h.url + "&position_window_time_ms=100") as robot:
            with pytest.raises(DriverTimeoutError, match="target not reached"):
                robot.move_to(q_rad=Q_HOME + 0.02, speed=1.0, timeout_s=1.0)
            t_raised = time.monotonic_ns()
            deadline = time.monotonic() + 5.0
            while (s := robot.read_state()).t_host_ns < t_raised:  # a sample from after the move
                assert time.monotonic() < deadline
                time.sleep(0.005)
            assert s.target_reached is False
    finally:
        h.close()


def test_gear_ratio_sign_and_offset_scaling():
    can = {"counts_per_rev": 2**17, "gear_ratio": 101, "sign": [1, -1, 1, -1, 1, 1],
           "offset_counts": [0, 1000, 0, 0, -5000, 0], "heartbeat_ms": HB_MS}
    h = make_sim({"can": can})
    try:
        assert "gear_ratio=101.0" in h.url and "sign=1.0,-1.0" in h.url
        with connect_robot(h.url) as robot:
            np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME, atol=1e-5)
            robot.move_to(q_rad=Q_HOME + 0.1, speed=1.0, timeout_s=10)
            np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME + 0.1, atol=1e-3)
        # the same drives read with the wrong sign give the mirrored joint
        wrong = h.url.replace("sign=1.0,-1.0,1.0,-1.0,1.0,1.0", "sign=1.0")
        with connect_robot(wrong) as robot:
            q = robot.read_state().q_rad
            assert q[1] == pytest.approx(-(Q_HOME[1] + 0.1), abs=1e-3)
            assert q[0] == pytest.approx(Q_HOME[0] + 0.1, abs=1e-3)
    finally:
        h.close()


# -- across processes through the loopback SLCAN bridge -------------------------------------
def _serve_drives(bridge: str, conn) -> None:
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME_FLANGE, time_scale=5.0)
    with start_sim_robot(world, {"can": {"heartbeat_ms": HB_MS}}, transport="canopen",
                         can_channel="drives-in-child", can_bridge=bridge) as h:
        conn.send(h.url)
        conn.poll(60.0)


@pytest.mark.parametrize("bridge", ["tcp", "pty"])
def test_slcan_bridge_across_processes(bridge):
    """The drives in another process, reached as an SLCAN adapter on 127.0.0.1 (or a pty)
    through python-can's slcan interface: open, read, move."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_drives, args=(bridge, child), daemon=True)
    proc.start()
    try:
        assert parent.poll(30.0), "drive process did not start"
        url = parent.recv()
        assert "interface=slcan" in url and "sleep_after_open_s=0" in url
        if bridge == "tcp":
            assert url.startswith("canopen://socket://127.0.0.1:")
        else:
            assert url.startswith("canopen:///dev/")
        with connect_robot(url) as robot:
            assert robot.using_pdo and robot.sampling == "sync"
            np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME, atol=1e-4)
            robot.move_to(q_rad=Q_HOME + 0.05, speed=1.0, timeout_s=20)
            s = robot.read_state()
            assert s.target_reached
            np.testing.assert_allclose(s.q_rad, Q_HOME + 0.05, atol=1.3e-3)
    finally:
        parent.send("stop")
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
