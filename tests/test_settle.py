"""Settle detection on ringing trajectories: never early, and the captured pose is at rest."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from cellcal.drivers import connect_robot
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.robot import RobotMode, RobotState
from cellcal.drivers.settle import SettleConfig, SettleDetector
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World
from cellcal.solver.se3 import se3_inverse, so3_log

UR5E = dh_model("ur5e")
HOME_FLANGE = UR5E.forward(np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0]))
Q_REST = np.deg2rad([10.0, -80.0, 95.0, -100.0, -90.0, 20.0])
DIRECTION = np.array([1.0, -0.6, 0.8, 0.5, -0.3, 0.2])  # ringing share per joint


def ringing(t: float, amp_rad: float, tau_s: float, f_hz: float):
    """q, qd of a damped oscillation about Q_REST (all joints in phase)."""
    w = 2 * math.pi * f_hz
    e = math.exp(-t / tau_s)
    q = Q_REST + DIRECTION * amp_rad * e * math.sin(w * t)
    qd = DIRECTION * amp_rad * e * (w * math.cos(w * t) - math.sin(w * t) / tau_s)
    return q, qd


def state_at(t: float, q, qd, **kw) -> RobotState:
    lin, ang = UR5E.flange_speed(q, qd)
    return RobotState(
        q_rad=q, qd_rad_s=qd, base_T_flange=UR5E.forward(q), t_device_s=t, t_host_ns=int(t * 1e9),
        moving=False, mode=kw.get("mode", RobotMode.RUNNING), flange_speed_m_s=lin,
        flange_ang_speed_rad_s=ang, target_reached=kw.get("target_reached"), seq=int(t * 500),
    )


def pose_error(T: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    d = se3_inverse(ref) @ T
    return float(np.linalg.norm(d[:3, 3])), float(np.linalg.norm(so3_log(d[:3, :3])))


AMP, TAU, F = math.radians(0.2), 0.4, 3.0
CFG = SettleConfig(
    max_joint_speed_rad_s=math.radians(0.05),
    max_flange_speed_m_s=0.5e-3,
    max_flange_ang_speed_rad_s=math.radians(0.05),
    dwell_s=0.25,  # longer than half the 3 Hz period (0.167 s)
)


def run(cfg: SettleConfig, rate_hz: float = 500.0, t_end: float = 4.0):
    det = SettleDetector(cfg)
    for i in range(int(t_end * rate_hz)):
        t = i / rate_hz
        q, qd = ringing(t, AMP, TAU, F)
        s = state_at(t, q, qd)
        if det.update(s).settled:
            return t, s
    return None, None


def test_ringing_robot_is_not_settled_early_and_capture_is_at_rest():
    t_settle, s = run(CFG)
    assert t_settle is not None
    # Independent bound: the window can only complete once the peak joint speed of the
    # oscillation, ~ 2 pi f A exp(-t / tau) on the largest joint, is under the threshold.
    t_quiet = TAU * math.log(2 * math.pi * F * AMP * np.max(np.abs(DIRECTION)) / CFG.max_joint_speed_rad_s)
    assert t_settle >= t_quiet - 1 / (2 * F)
    # the remaining amplitude is at most threshold / (2 pi f): a few tens of micrometres
    dp, dr = pose_error(s.base_T_flange, UR5E.forward(Q_REST))
    residual_rad = CFG.max_joint_speed_rad_s / (2 * math.pi * F)
    assert dp < 0.9 * np.sum(np.abs(DIRECTION)) * residual_rad  # reach < 0.9 m
    assert dp < 50e-6 and dr < 1e-4


def test_lucky_quiet_instants_early_in_the_ringing_are_rejected():
    # At every extreme of the oscillation the speed passes zero: early on, such instants are
    # "quiet" but the arm is far from rest. A dwell longer than half a period rejects them.
    det = SettleDetector(CFG)
    lucky = []
    for i in range(int(1.0 * 500)):
        t = i / 500
        q, qd = ringing(t, AMP, TAU, F)
        s = state_at(t, q, qd)
        status = det.update(s)
        if np.max(np.abs(qd)) < CFG.max_joint_speed_rad_s:
            lucky.append((t, s))
        assert not status.settled
    assert lucky, "the trajectory should pass through zero speed early on"
    assert max(pose_error(s.base_T_flange, UR5E.forward(Q_REST))[0] for _, s in lucky) > 1e-3
    # the same detector without a dwell is fooled at the first of them: the dwell matters
    t_fooled, s = run(SettleConfig(dwell_s=1e-9, max_joint_speed_rad_s=CFG.max_joint_speed_rad_s,
                                   max_flange_speed_m_s=1.0, max_flange_ang_speed_rad_s=1.0))
    assert t_fooled is not None and t_fooled < 1.0  # long before the ~2 s of the real settle
    assert pose_error(s.base_T_flange, UR5E.forward(Q_REST))[0] > 1e-4


def test_gap_target_and_mode_restart_the_window():
    det = SettleDetector(SettleConfig(dwell_s=0.1, max_sample_gap_s=0.05))
    still = np.zeros(6)
    for i in range(40):  # 0..0.39 s at 100 Hz, but a 0.2 s hole at 0.1 s
        t = i * 0.01 + (0.2 if i >= 10 else 0.0)
        st = det.update(state_at(t, Q_REST, still))
    assert st.settled and st.window_start_ns == int(0.3 * 1e9)  # restarted after the hole
    det.reset()
    for i in range(30):
        st = det.update(state_at(i * 0.01, Q_REST, still, target_reached=(i != 25)))
    assert not st.settled and st.quiet_s == pytest.approx(0.03)
    det.reset()
    for i in range(30):
        mode = RobotMode.PROTECTIVE_STOP if i == 20 else RobotMode.RUNNING
        st = det.update(state_at(i * 0.01, Q_REST, still, mode=mode))
    assert not st.settled
    assert det.update(state_at(0.5, Q_REST, np.full(6, np.nan))).reason.startswith("joint speed")


def test_require_target_reached_can_be_turned_off():
    det = SettleDetector(SettleConfig(dwell_s=0.05, require_target_reached=False))
    for i in range(10):
        st = det.update(state_at(i * 0.01, Q_REST, np.zeros(6), target_reached=False))
    assert st.settled


def test_config_from_table_converts_units_and_names_bad_keys():
    cfg = SettleConfig.from_table(
        {"max_joint_speed_deg_s": 0.1, "max_flange_speed_mm_s": 0.2, "dwell_s": 0.4,
         "max_flange_ang_speed_deg_s": 0.3, "require_target_reached": False}
    )
    assert cfg.max_joint_speed_rad_s == pytest.approx(math.radians(0.1))
    assert cfg.max_flange_speed_m_s == pytest.approx(0.2e-3)
    assert cfg.max_flange_ang_speed_rad_s == pytest.approx(math.radians(0.3))
    assert cfg.dwell_s == 0.4 and cfg.require_target_reached is False
    with pytest.raises(ValueError, match=r"capture\.settle\.max_speed"):
        SettleConfig.from_table({"max_speed": 1}, "capture.settle")
    with pytest.raises(ValueError, match=r"capture\.settle\.dwell_s"):
        SettleConfig.from_table({"dwell_s": -1}, "capture.settle")
    with pytest.raises(ValueError, match="true or false"):
        SettleConfig.from_table({"require_target_reached": "yes"})


def test_simulated_ringing_robot_settles_at_its_rest_pose():
    # Over RTDE: a big ringing (0.3 deg, tau 0.3 s) after a move; the capture must be at the
    # rest pose, both as the controller reports it and as the world truly is.
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=HOME_FLANGE, time_scale=2.0)
    table = {"ringing_amplitude_deg": 0.3, "settle_time_constant_s": 0.3, "ringing_frequency_hz": 4.0}
    cfg = SettleConfig(max_joint_speed_rad_s=math.radians(0.02), max_flange_speed_m_s=0.2e-3,
                       max_flange_ang_speed_rad_s=math.radians(0.02), dwell_s=0.15)
    with start_sim_robot(world, table) as h, connect_robot(h.url, frequency_hz=250) as robot:
        robot.move_to(q_rad=Q_REST, speed=1.0, timeout_s=10)
        # how far it swings in the next 0.1 s (more than half a ringing period, wall time)
        dp0, seq = 0.0, -1
        t_end = time.monotonic() + 0.1
        while time.monotonic() < t_end:
            st = robot.wait_for_sample_after(seq, 1.0)
            seq = st.seq
            dp0 = max(dp0, pose_error(st.base_T_flange, UR5E.forward(Q_REST))[0])
        s, status = robot.wait_settled(cfg, timeout_s=10)
        true_now = world.base_T_flange()
        dp, dr = pose_error(s.base_T_flange, UR5E.forward(Q_REST))
        dpt, _ = pose_error(true_now, UR5E.forward(Q_REST))
    bound = 0.9 * np.sqrt(6) * cfg.max_joint_speed_rad_s / (2 * math.pi * 4.0)
    assert dp0 > 20 * bound  # it really rang after the move "finished"
    assert dp < bound and dpt < bound
    assert status.max_joint_speed_rad_s <= cfg.max_joint_speed_rad_s
