"""Drives and links that lie, against the CiA 402 driver (issue 24, item 1): each attack of the
simulated drives and bridge (``[[robot.faults]]`` kinds ``off_target``, ``frozen_joint``,
``drive_fault``, ``garbled_can_line``) ends as a typed fault naming the node, never as a
completed move or a sample the daemon could take a station from; a garbled SLCAN line is
dropped and reception goes on; a failed link is a ``DeviceGoneError`` with a bounded log."""

from __future__ import annotations

import itertools
import logging
import threading

import numpy as np
import pytest
from conftest import wait_until

from cellcal.drivers import connect_robot
from cellcal.drivers.canopen402 import CanLinkLost, DriveFaultDuringMove, JointNotMoving, TargetMismatch
from cellcal.drivers.errors import DeviceError, DeviceGoneError
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.settle import SettleConfig
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World

Q_HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])
HOME_FLANGE = dh_model("ur5e").forward(Q_HOME)
STEP = np.deg2rad([3.0, 3.0, -3.0, 3.0, 3.0, 3.0])
_channels = itertools.count()


def make_sim(faults=(), scale: float = 5.0, **kw):
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME_FLANGE, time_scale=scale)
    table = {"can": {"heartbeat_ms": 250}, "faults": list(faults)}
    return start_sim_robot(world, table, transport="canopen", can_channel=f"attack-{next(_channels)}", **kw)


def _open(h):
    # a loaded machine can hold a simulated drive's SDO answer past the 0.5 s default; these
    # tests are about what the drives say, not about how fast
    return connect_robot(h.url, sdo_timeout_s=2.0)


@pytest.fixture
def sims():
    made = []

    def make(*a, **kw):
        h = make_sim(*a, **kw)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_a_drive_reporting_target_reached_02_deg_off_is_a_mismatch_naming_the_node(sims):
    h = sims([{"kind": "off_target", "start_s": 0.0, "node": 2, "offset_deg": 0.2}])
    with _open(h) as robot:
        with pytest.raises(TargetMismatch) as ei:
            robot.move_to(q_rad=Q_HOME + STEP, speed=1.0, timeout_s=10)
        err = ei.value
        assert isinstance(err, DeviceError) and err.code == "TARGET_MISMATCH"  # the daemon: station rejected
        assert (err.node_id, err.joint) == (2, 2) and err.error_counts > err.window_counts
        assert "node 2 (joint 2)" in str(err)
        # the drive still says target reached; the driver never does for this move
        s = robot.read_state()
        assert s.target_reached is False
        assert robot.last_move["error"]["code"] == "TARGET_MISMATCH"
        assert robot.last_move["error_deg"][1] == pytest.approx(0.2, abs=0.01)


def test_a_frozen_joint_is_named(sims):
    h = sims([{"kind": "frozen_joint", "start_s": 0.0, "node": 5}])
    with _open(h) as robot:
        with pytest.raises(JointNotMoving) as ei:
            robot.move_to(q_rad=Q_HOME + STEP, speed=1.0, timeout_s=10)
        assert (ei.value.node_id, ei.value.joint, ei.value.code) == (5, 5, "JOINT_NOT_MOVING")
        assert robot.read_state().target_reached is False


@pytest.mark.slow
def test_fault_in_the_statusword_mid_move_stops_the_move_and_raises_with_its_code(sims):
    h = sims(scale=1.0)
    with _open(h) as robot:
        def inject_once_moving():
            wait_until(lambda: np.max(np.abs(h.robot.sample().qd_rad_s)) > 0.05, 10.0, "the arm moving")
            h.robot.inject("drive_fault", duration_s=1.5, node=3)

        t = threading.Thread(target=inject_once_moving, daemon=True)
        t.start()
        with pytest.raises(DriveFaultDuringMove) as ei:
            robot.move_to(q_rad=Q_HOME + np.deg2rad(20.0), speed=1.0, timeout_s=20)
        t.join(5.0)
        err = ei.value
        assert (err.node_id, err.joint, err.code, err.error_code) == (3, 3, "FAULT", 0x8611)
        assert err.emcy_code in (None, 0x8611) and "0x603F = 0x8611" in str(err)
        # the move was stopped: the arm comes to rest short of the target (and the driver's
        # target reached stays False, so only a detector that ignores it can see the rest)
        s, _ = robot.wait_settled(SettleConfig(require_target_reached=False), timeout_s=10)
        assert np.max(np.abs(s.q_rad - (Q_HOME + np.deg2rad(20.0)))) > np.deg2rad(1.0)
        # the drive shows its fault for 1.5 s and then carries on: the move stays failed
        wait_until(lambda: not h.robot.fault_active("drive_fault", node=3), 10.0, "the fault to end")
        assert robot.read_state().target_reached is False
        robot.move_to(q_rad=Q_HOME, speed=1.0, timeout_s=20)  # a new move is judged afresh
        assert robot.read_state().target_reached is True


def test_a_fault_after_the_move_keeps_target_reached_false_until_the_next_move(sims):
    h = sims()
    with _open(h) as robot:
        robot.move_to(q_rad=Q_HOME + STEP, speed=1.0, timeout_s=10)
        assert robot.read_state().target_reached is True
        h.robot.inject("drive_fault", duration_s=2.5, node=6)  # 0.5 s of wall time at scale 5
        wait_until(lambda: robot.last_move["fault"] is not None, 5.0, "the fault seen")
        assert robot.last_move["fault"]["node"] == 6
        wait_until(lambda: not h.robot.fault_active("drive_fault", node=6), 5.0, "the fault to end")
        first = robot.read_state().seq
        wait_until(lambda: robot.read_state().seq > first + 5, 5.0, "samples after the fault")
        assert robot.read_state().target_reached is False  # a settle detector never settles on it


def test_a_garbled_slcan_line_is_dropped_and_reception_goes_on(sims):
    h = sims(can_bridge="tcp")
    with _open(h) as robot:
        assert robot.read_state().target_reached is None
        h.robot.inject("garbled_can_line")
        wait_until(lambda: robot.link_stats.garbled >= 5, 5.0, "the garbled lines counted")
        seq = robot.read_state().seq
        wait_until(lambda: robot.read_state().seq > seq + 10, 5.0, "samples after the garbage")
        robot.move_to(q_rad=Q_HOME + STEP, speed=1.0, timeout_s=10)
        assert robot.read_state().target_reached is True
        report = robot.bus_report["link"]
        assert report["garbled"] >= 5 and report["unknown"] >= 1 and report["fault"] is None
        assert robot.sync_send_failures == 0


def test_a_failed_link_is_a_device_gone_error_and_the_sync_warnings_are_bounded(sims, caplog):
    h = sims(can_bridge="tcp")
    with _open(h) as robot, caplog.at_level(logging.WARNING, logger="cellcal"):
        robot.read_state()
        h.server.bridge.close()  # the adapter goes away under the driver

        def failed():
            try:
                robot.read_state()
            except CanLinkLost as exc:
                return exc
            return None

        err = wait_until(failed, 10.0, "the link fault")
        assert isinstance(err, DeviceGoneError)  # the daemon backs off and reopens the robot
        assert "port" in str(err) and robot.bus_report["link"]["fault"] is not None
        # python-can's receive thread did not die with a traceback: the bus recorded the failure
        assert robot.network.notifier.exception is None
        wait_until(lambda: not any(t.name == "canopen-sync" and t.is_alive() for t in threading.enumerate()),
                   5.0, "the SYNC producer to stop")
    sync = [r for r in caplog.records if "SYNC send failed" in r.getMessage()]
    assert len(sync) <= 3, [r.getMessage() for r in sync]  # at most a burst, however long it failed
    assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"
