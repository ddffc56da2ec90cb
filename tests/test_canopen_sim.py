"""The project's simulated CiA 402 drives with the factory behaviours as ``[robot.can]``
scenario keys, through the public driver; and ``cellcal sim --robot-transport canopen``
serving them through the loopback SLCAN bridge."""

from __future__ import annotations

import itertools
import json
import math
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cellcal.drivers import connect_robot
from cellcal.drivers.canopen402 import Od
from cellcal.drivers.errors import DeviceError
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.robot import RobotMode
from cellcal.drivers.settle import SettleConfig
from cellcal.sim.errors import ScenarioError
from cellcal.sim.robot_scenario import parse_robot_table
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

Q_HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])
HOME_FLANGE = dh_model("ur5e").forward(Q_HOME)
ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "demo-scenario.toml"
_channels = itertools.count()


def make_sim(can: dict, scale: float = 5.0, **robot):
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME_FLANGE, time_scale=scale)
    # 250 ms: these tests are not about heartbeat loss, and a busy host delays heartbeats
    table = {"can": {"heartbeat_ms": 250, **can}, **robot}
    return start_sim_robot(world, table, transport="canopen", can_channel=f"sim-factory-{next(_channels)}")


@pytest.fixture
def sims():
    made = []

    def make(can: dict, **robot):
        h = make_sim(can, **robot)
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def test_new_can_keys_are_validated():
    sc = parse_robot_table({"can": {"heartbeat_ms": 0, "velocity_units": "rpm", "pdo_mapping": "fixed",
                                    "ack_delay_ms": 2.5, "power_up_state": "fault", "homed": False}}).can
    assert sc.heartbeat_ms == 0 and sc.velocity_units == "rpm" and sc.ack_delay_ms == 2.5 and not sc.homed
    for bad, where in (({"velocity_units": "rps"}, "velocity_units"), ({"pdo_mapping": 1}, "pdo_mapping"),
                       ({"homed": "yes"}, "homed"), ({"ack_delay_ms": -1}, "ack_delay_ms"),
                       ({"serial_base": -1}, "serial_base")):
        with pytest.raises(ScenarioError, match=rf"robot\.can\.{where}"):
            parse_robot_table({"can": bad})


def test_sim_heartbeat_off_and_identity(sims):
    h = sims({"heartbeat_ms": 0, "vendor_id": 0x1234, "product_code": 0x42, "serial_base": 7000})
    with connect_robot(h.url) as robot:
        assert set(robot.supervision.values()) == {"sdo"}
        ident = robot.identity
        assert [d["serial"] for d in ident["drives"]] == [7001, 7002, 7003, 7004, 7005, 7006]
        assert ident["drives"][0]["vendor_id"] == 0x1234 and ident["drives"][0]["device_name"] == "cellcal sim drive"
        np.testing.assert_allclose(robot.read_state().q_rad, Q_HOME, atol=1e-4)
    with connect_robot(h.url, heartbeat_ms=100) as robot:
        assert set(robot.supervision.values()) == {"heartbeat"}


def test_sim_late_ack_and_small_deceleration(sims):
    h = sims({"ack_delay_ms": 4.0, "profile_deceleration_deg_s2": 0.5})
    with connect_robot(h.url) as robot:
        robot.move_to(q_rad=Q_HOME + 0.1, speed=1.0, timeout_s=10)
        assert robot.read_state().target_reached
        v, a = h.server.last_move
        assert a == pytest.approx(1.4, rel=1e-3)  # 6084h written: the move used the driver's deceleration
        for n in robot.nodes:
            assert robot.sdo_read(n, Od.PROFILE_DECELERATION) == robot.sdo_read(n, Od.PROFILE_ACCELERATION)


@pytest.mark.parametrize("announce", [True, False])
def test_sim_rpm_units_never_exceed_the_joint_speed(sims, announce):
    h = sims({"velocity_units": "rpm", "announce_units": announce, "gear_ratio": 101, "counts_per_rev": 2**17})
    assert ("velocity_units=rpm" in h.url) is not announce
    with connect_robot(h.url, max_joint_speed_rad_s=0.6) as robot:
        robot.move_to(q_rad=Q_HOME + np.array([0.8, 0.3, -0.2, 0.1, 0.0, 0.4]), speed=1.0, timeout_s=20)
        v, _ = h.server.last_move
        assert 0.59 < v <= 0.6


def test_sim_fixed_mapping_and_extra_tpdos(sims):
    h = sims({"pdo_mapping": "fixed"})
    with connect_robot(h.url) as robot:
        assert robot.sampling == "sync"
        assert [u.number for u in robot.tpdo_layout[1]] == [1, 2]
        robot.move_to(q_rad=Q_HOME + 0.05, speed=1.0, timeout_s=10)
        assert robot.read_state().target_reached
    h = sims({"extra_tpdos": True})
    with connect_robot(h.url) as robot:
        for n in robot.nodes:
            for k in (1, 2, 3):
                cob = int.from_bytes(robot.sdo_read(n, Od.TPDO1_COMMUNICATION + k, 1), "little")
                assert cob & 0x80000000, f"node {n} TPDO{k + 1} still valid"
    # a fresh set (the drives keep what a driver wrote): used as shipped, event-driven
    h = sims({"extra_tpdos": True})
    with connect_robot(h.url, remap_pdos=False) as robot:
        assert robot.sampling == "event"
        assert robot.read_state(timeout_s=2.0).mode is RobotMode.IDLE


def test_sim_power_up_fault_and_homing(sims):
    h = sims({"power_up_state": "fault", "homed": False})
    with connect_robot(h.url, homing_required=True) as robot:
        assert robot.read_state().mode is RobotMode.FAULT
        assert robot.homed == (False,) * 6
        with pytest.raises(DeviceError) as ei:
            robot.move_to(q_rad=Q_HOME + 0.05, timeout_s=10)
        assert ei.value.code == "NOT_HOMED"
    with connect_robot(h.url) as robot:  # absolute encoders assumed: the fault is reset and it moves
        robot.move_to(q_rad=Q_HOME + 0.05, speed=1.0, timeout_s=10)
        assert robot.read_state().mode is RobotMode.RUNNING


def test_sim_observe_with_disabled_drives(sims):
    h = sims({"target_reached_when_disabled": False})
    cfg = SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.05))
    with connect_robot(h.url, enable="never") as robot:
        assert robot.read_state().target_reached is None
        t_move = h.robot.command_joints(Q_HOME + 0.1)  # the cell's own controller
        t_end_wall = time.monotonic() + t_move / h.robot.world.time_scale
        state, status = robot.wait_settled(cfg, timeout_s=20)
        assert status.window_start_ns >= (t_end_wall - 0.05) * 1e9
        np.testing.assert_allclose(state.q_rad, Q_HOME + 0.1, atol=1e-3)


# -- cellcal sim ------------------------------------------------------------------------------
def test_cellcal_sim_serves_canopen_through_the_slcan_bridge():
    proc = subprocess.Popen(
        [sys.executable, "-m", "cellcal.daemon.cli", "sim", "--scenario", str(DEMO), "--robot-transport", "canopen"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        r, _, _ = select.select([proc.stdout], [], [], 30.0)
        assert r, "cellcal sim printed nothing"
        urls = json.loads(proc.stdout.readline().decode())
        assert urls["robot"].startswith("canopen://socket://127.0.0.1:")
        assert "interface=slcan" in urls["robot"]
        with connect_robot(urls["robot"]) as robot:
            assert robot.sampling == "sync"
            s = robot.read_state(timeout_s=2.0)
            assert s.mode is RobotMode.IDLE and np.all(np.isfinite(s.q_rad))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
