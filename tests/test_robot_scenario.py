"""The scenario's [robot] table, and the simulated robot moving the world's true flange."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellcal.drivers import connect_robot
from cellcal.drivers.kinematics import dh_model
from cellcal.sim.robot_scenario import parse_robot_table
from cellcal.sim.robot_sim import SimRobot, start_sim_robot
from cellcal.sim.scenario import parse_scenario
from cellcal.sim.world import World

SCENARIO = """
name = "robot-test"
seed = 3
[time]
scale = 10.0
[truth]
cell_T_base_xyz_m = [2.0, -0.5, 0.1]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = [0.0, 0.0, 0.0]
noise_deg = 0.0
[robot]
model = "ur5e"
encoder_noise_deg = 0.0
joint_zero_offsets_deg = [0.02, -0.01, 0.0, 0.03, 0.0, 0.0]
ringing_amplitude_deg = 0.01
[robot.can]
heartbeat_ms = 50
gear_ratio = 101
[[robot.faults]]
kind = "protective_stop"
start_s = 100.0
duration_s = 2.0
[[robot.faults]]
kind = "silent_node"
start_s = 50.0
node = 3
"""


def test_defaults_and_units():
    sc = parse_robot_table({})
    assert sc.model.name == "ur5e" and sc.initial_q_rad is None
    assert sc.rtde_max_protocol == 2 and sc.faults == () and sc.can.heartbeat_ms == 100
    sc = parse_robot_table({"ringing_amplitude_deg": 0.5, "max_joint_speed_deg_s": 90,
                            "initial_q_deg": [0, -90, 90, -90, -90, 0], "controller_version": "5.11.2.7"})
    assert sc.ringing_amplitude_rad == pytest.approx(math.radians(0.5))
    assert sc.max_joint_speed_rad_s == pytest.approx(math.pi / 2)
    np.testing.assert_allclose(sc.initial_q_rad, np.deg2rad([0, -90, 90, -90, -90, 0]))
    assert sc.controller_version == (5, 11, 2, 7)


@pytest.mark.parametrize(
    "table, path",
    [
        ({"bogus": 1}, r"robot\.bogus"),
        ({"can": {"heartbeat": 1}}, r"robot\.can\.heartbeat"),
        ({"can": {"sign": [1, 1, 1, 1, 1, 0.5]}}, r"robot\.can\.sign"),
        ({"faults": [{"kind": "disconnect", "start_s": 1}, {"kind": "meltdown", "start_s": 2}]}, r"robot\.faults\[1\]\.kind"),
        ({"faults": [{"kind": "disconnect"}]}, r"robot\.faults\[0\]\.start_s"),
        ({"faults": [{"kind": "disconnect", "start_s": 1, "node": 2}]}, r"robot\.faults\[0\]\.node"),
        ({"faults": [{"kind": "silent_node", "start_s": 1}]}, r"robot\.faults\[0\]\.node"),
        ({"faults": [{"kind": "frozen_joint", "start_s": 1}]}, r"robot\.faults\[0\]\.node"),
        ({"faults": [{"kind": "off_target", "start_s": 1, "node": 2, "offset_deg": 0}]},
         r"robot\.faults\[0\]\.offset_deg"),
        ({"faults": [{"kind": "drive_fault", "start_s": 1, "node": 2, "offset_deg": 1}]},
         r"robot\.faults\[0\]\.offset_deg"),
        ({"faults": [{"kind": "drive_fault", "start_s": 1, "node": 2, "error_code": 0x10000}]},
         r"robot\.faults\[0\]\.error_code"),
        ({"faults": [{"kind": "garbled_can_line", "start_s": 1, "node": 2}]}, r"robot\.faults\[0\]\.node"),
        ({"initial_q_deg": [0, 0, 0]}, r"robot\.initial_q_deg"),
        ({"encoder_noise_deg": -1}, r"robot\.encoder_noise_deg"),
        ({"model": "ur99"}, r"robot\.model"),
        ({"model": "ur5e", "dh": {"d_m": [0] * 6, "a_m": [0] * 6, "alpha_rad": [0] * 6}}, r"robot\.dh"),
        ({"dh": {"d_m": [0] * 6, "a_m": [0] * 6, "alpha_rad": [0] * 6, "x": 1}}, r"robot\.dh\.x"),
        ({"rtde_max_protocol": 3}, r"robot\.rtde_max_protocol"),
        ({"controller_version": "5.11"}, r"robot\.controller_version"),
    ],
)
def test_bad_keys_are_named_by_dotted_path(table, path):
    with pytest.raises(ValueError, match=path):
        parse_robot_table(table)


def test_lying_drive_faults_parse_with_their_defaults():
    faults = parse_robot_table({"faults": [
        {"kind": "off_target", "start_s": 0, "node": 2},
        {"kind": "drive_fault", "start_s": 5, "duration_s": 1.5, "node": 3},
        {"kind": "frozen_joint", "start_s": 1, "node": 4},
        {"kind": "garbled_can_line", "start_s": 2},
        {"kind": "off_target", "start_s": 0, "node": 1, "offset_deg": -0.5},
        {"kind": "drive_fault", "start_s": 0, "node": 1, "error_code": 0x2310},
    ]}).faults
    assert faults[0].offset_rad == pytest.approx(math.radians(0.2)) and faults[0].node == 2
    assert (faults[1].error_code, faults[1].duration_s) == (0x8611, 1.5)
    assert faults[2].node == 4 and faults[3].node == 0 and faults[3].offset_rad is None
    assert faults[4].offset_rad == pytest.approx(math.radians(-0.5)) and faults[5].error_code == 0x2310


def test_user_dh_model():
    ur = dh_model("ur10e")
    sc = parse_robot_table({"dh": {"d_m": list(ur.d_m), "a_m": list(ur.a_m),
                                   "alpha_deg": list(np.degrees(ur.alpha_rad))}})
    q = np.array([0.1, -1.0, 1.2, -1.5, -1.4, 0.3])
    np.testing.assert_allclose(sc.model.forward(q), ur.forward(q), atol=1e-12)


def test_scenario_file_to_moving_world():
    scenario = parse_scenario(SCENARIO)
    sc = parse_robot_table(scenario.robot)
    assert sc.can.gear_ratio[0] == 101 and sc.faults[1].node == 3
    world = scenario.make_world()
    rest = world.base_T_flange()
    with start_sim_robot(world, scenario.robot) as h, connect_robot(h.url) as robot:
        # started where the scenario put the flange: no jump when the robot appears
        np.testing.assert_allclose(world.base_T_flange(), rest, atol=1e-9)
        q_target = robot.read_state().q_rad + np.deg2rad([20, -10, 15, 10, -20, 30])
        robot.move_to(q_rad=q_target, speed=1.0, timeout_s=10)
        robot.wait_settled(timeout_s=10)
        true_q = q_target + np.deg2rad([0.02, -0.01, 0.0, 0.03, 0.0, 0.0])
        truth = dh_model("ur5e").forward(true_q)
        # settled with the default 0.05 deg/s: residual ringing below 0.05 / (2 pi 4 Hz) deg
        tol = math.radians(0.05) / (2 * math.pi * 4.0)
        np.testing.assert_allclose(world.base_T_flange(), truth, atol=tol)
        # the tracker sees the target where the true flange is
        np.testing.assert_allclose(
            world.cell_T_target(), world.cell_T_base() @ truth @ world.flange_T_target(), atol=tol
        )
        # and the controller's FK is off by the zero offsets (here ~0.25 mm)
        err = np.linalg.norm(robot.read_state().base_T_flange[:3, 3] - truth[:3, 3])
        assert 1e-4 < err < 2e-3


def test_scheduled_fault_windows():
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), time_scale=1.0)
    robot = SimRobot(world, {"faults": [{"kind": "protective_stop", "start_s": 1.0, "duration_s": 2.0}]})
    assert not robot.fault_active("protective_stop", 0.5)
    assert robot.fault_active("protective_stop", 1.0) and robot.fault_active("protective_stop", 2.9)
    assert not robot.fault_active("protective_stop", 3.0)
    robot.inject("disconnect", duration_s=5.0)
    assert robot.fault_active("disconnect")
    robot.clear("disconnect")
    assert not robot.fault_active("disconnect")
    with pytest.raises(ValueError, match="unknown fault"):
        robot.inject("meltdown")


def test_sim_motion_is_smooth_and_reaches_target():
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), time_scale=1.0,
                  clock=lambda: 0.0)  # frozen clock: sample at explicit times
    robot = SimRobot(world, {"ringing_amplitude_deg": 0.0, "initial_q_deg": [0, -90, 90, -90, -90, 0]})
    q0 = robot.sample(0.0).q_rad
    T = robot.command_joints(q0 + 0.5, max_speed_rad_s=1.0)
    assert T == pytest.approx(max(0.2, 1.875 * 0.5 / 1.0, math.sqrt(5.774 * 0.5 / robot.scenario.max_joint_accel_rad_s2)))
    ts = np.linspace(0, T, 200)
    qd = np.array([robot.sample(t).qd_rad_s for t in ts])
    assert np.max(np.abs(qd)) <= 1.0 + 1e-9  # the peak joint speed honours v
    np.testing.assert_allclose(robot.sample(T).q_rad, q0 + 0.5, atol=1e-12)
    assert robot.sample(T / 2).moving and not robot.sample(T + 0.01).moving


def test_bad_transport():
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4))
    with pytest.raises(ValueError, match="transport"):
        start_sim_robot(world, {}, transport="profibus")
