"""The RobotDriver contract, the same for both backends, and connect_robot's URL handling."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import numpy as np
import pytest

import cellcal.drivers as drivers
from cellcal.drivers import RobotDriver, RobotMode, RobotState, connect_robot
from cellcal.drivers.errors import DriverError
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.robot import OptionSpec, merge_options, opt_float, opt_vector, parse_robot_url
from cellcal.drivers.settle import SettleConfig
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

UR5E = dh_model("ur5e")
Q_HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])
_ch = itertools.count()


@pytest.fixture(params=["rtde", "canopen"])
def sim(request):
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), time_scale=5.0)
    # 500 ms heartbeats (and a 5 s SDO timeout below): a loaded machine can hold a simulated
    # drive's threads back for hundreds of ms, past the 0.3 s SDO default
    table = {"initial_q_deg": [0, -90, 90, -90, -90, 0], "encoder_noise_deg": 0.0002,
             "can": {"heartbeat_ms": 500}}
    h = start_sim_robot(world, table, transport=request.param, can_channel=f"test-robot-{next(_ch)}")
    yield h
    h.close()


def test_contract_read_move_settle_stop(sim):
    robot = connect_robot(sim.url + ("&sdo_timeout_s=5" if sim.url.startswith("canopen:") else ""))
    with robot:
        assert isinstance(robot, RobotDriver)
        s = robot.read_state()
        assert isinstance(s, RobotState)
        assert s.q_rad.shape == (6,) and s.qd_rad_s.shape == (6,) and s.base_T_flange.shape == (4, 4)
        assert isinstance(s.mode, RobotMode) and isinstance(s.moving, bool)
        assert isinstance(s.t_host_ns, int) and isinstance(s.t_device_s, float)
        np.testing.assert_allclose(s.q_rad, Q_HOME, atol=1e-4)

        target = Q_HOME + np.deg2rad([10, -5, 5, 10, -10, 20])
        robot.move_to(q_rad=target, speed=1.0, timeout_s=10)
        s, status = robot.wait_settled(SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.1),
                                                    max_flange_ang_speed_rad_s=math.radians(0.1)), 10)
        np.testing.assert_allclose(s.q_rad, target, atol=1e-4)
        assert status.settled and status.window_end_ns - status.window_start_ns >= 0.2e9

        goal = s.base_T_flange.copy()
        goal[:3, 3] += (0.02, 0.02, -0.03)
        robot.move_to(base_T_flange=goal, speed=1.0, timeout_s=10)
        s, _ = robot.wait_settled(SettleConfig(dwell_s=0.2, max_joint_speed_rad_s=math.radians(0.1),
                                               max_flange_ang_speed_rad_s=math.radians(0.1)), 10)
        assert np.linalg.norm(s.base_T_flange[:3, 3] - goal[:3, 3]) < 2e-4

        robot.move_to(q_rad=Q_HOME, speed=0.1, wait=False)
        robot.stop()
        robot.wait_settled(SettleConfig(dwell_s=0.1, max_joint_speed_rad_s=math.radians(0.2),
                                        max_flange_speed_m_s=2e-3, max_flange_ang_speed_rad_s=math.radians(0.2),
                                        require_target_reached=False), 10)
    robot.close()  # idempotent
    with pytest.raises(DriverError, match="closed"):
        robot.read_state()


def test_move_to_validates_arguments(sim):
    with connect_robot(sim.url) as robot:
        with pytest.raises(ValueError, match="exactly one"):
            robot.move_to()
        with pytest.raises(ValueError, match="exactly one"):
            robot.move_to(q_rad=Q_HOME, base_T_flange=np.eye(4))
        with pytest.raises(ValueError, match="speed"):
            robot.move_to(q_rad=Q_HOME, speed=1.5)
        with pytest.raises(ValueError, match="q_rad"):
            robot.move_to(q_rad=[0, 0, 0])
        with pytest.raises(ValueError, match="orthonormal"):
            robot.move_to(base_T_flange=np.diag([2.0, 1, 1, 1]))


def test_lazy_exports_resolve():
    assert drivers.connect_robot is connect_robot
    assert drivers.RobotMode.RUNNING.value == "running"
    with pytest.raises(AttributeError):
        drivers.nonexistent  # noqa: B018


def test_rtde_does_not_import_canopen():
    code = (
        "import sys, cellcal.drivers.ur_rtde, cellcal.drivers.robot;"
        "assert 'canopen' not in sys.modules and 'can' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_url_parsing_and_option_precedence():
    u = parse_robot_url("rtde://10.0.0.5:30010?frequency_hz=500&model=ur10e")
    assert (u.scheme, u.target) == ("rtde", "10.0.0.5:30010")
    assert u.query == {"frequency_hz": "500", "model": "ur10e"}
    u = parse_robot_url("canopen://can0?interface=socketcan&nodes=1-6")
    assert u.target == "can0"
    with pytest.raises(ValueError, match="twice"):
        parse_robot_url("rtde://h?model=a&model=b")
    with pytest.raises(ValueError, match="scheme://"):
        parse_robot_url("192.168.1.10")
    specs = {"x": OptionSpec(opt_float(), 0.0), "v": OptionSpec(opt_vector(3), np.zeros(3))}
    merged = merge_options(specs, {"x": "1.5", "v": "1,2,3"}, {"x": 2.5}, "test")
    assert merged["x"] == 2.5  # keyword option wins over the URL
    np.testing.assert_array_equal(merged["v"], [1, 2, 3])
    with pytest.raises(ValueError, match=r"test: URL query v='1,2': expected 1 or 3 numbers"):
        merge_options(specs, {"v": "1,2"}, {}, "test")
