"""Forward kinematics against poses computed by hand, Jacobian by finite differences, IK."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from cellcal.drivers.kinematics import (
    UR_MODELS,
    DHModel,
    JointScaling,
    UnreachablePose,
    dh_model,
    dh_model_from_table,
)
from cellcal.solver.se3 import se3_exp, so3_log

UR5E = dh_model("ur5e")
HP = math.pi / 2

# Rx(+90 deg): y -> z, z -> -y
RX90 = np.array([[1.0, 0, 0], [0, 0, -1], [0, 1, 0]])


def test_ur5e_zero_joints_by_hand():
    # Standard DH, q = 0: each link is Tz(d) Tx(a) Rx(alpha).
    #   T1: R = Rx90, p = (0, 0, d1=0.1625)
    #   T2, T3: R = I, p = (a2, 0, 0), (a3, 0, 0)  -> p = (a2+a3, 0, d1) = (-0.8172, 0, 0.1625)
    #   T4: R = Rx90, p = (0, 0, d4); Rx90 maps z to -y -> p += (0, -0.1333, 0), R = Rx180
    #   T5: R = Rx(-90), p = (0, 0, d5); Rx180 maps z to -z -> p += (0, 0, -0.0997), R = Rx90
    #   T6: p = (0, 0, d6); Rx90 maps z to -y -> p += (0, -0.0996, 0)
    # flange: p = (-0.8172, -0.2329, 0.0628), R = Rx90.
    T = UR5E.forward(np.zeros(6))
    np.testing.assert_allclose(T[:3, 3], [-0.8172, -0.2329, 0.0628], atol=1e-12)
    np.testing.assert_allclose(T[:3, :3], RX90, atol=1e-12)
    np.testing.assert_allclose(T[3], [0, 0, 0, 1])


def test_ur5e_base_joint_rotates_whole_arm():
    # q1 = +90 deg turns the q = 0 pose about base z: (x, y, z) -> (-y, x, z)
    # p = (0.2329, -0.8172, 0.0628), R = Rz90 @ Rx90.
    T = UR5E.forward([HP, 0, 0, 0, 0, 0])
    np.testing.assert_allclose(T[:3, 3], [0.2329, -0.8172, 0.0628], atol=1e-12)
    Rz90 = np.array([[0.0, -1, 0], [1, 0, 0], [0, 0, 1]])
    np.testing.assert_allclose(T[:3, :3], Rz90 @ RX90, atol=1e-12)


def test_ur5e_shoulder_up_by_hand():
    # q = (0, -90, 0, 0, 0, 0) deg, the arm pointing straight up.
    #   T2 = Rz(-90) Tx(a2): R = Rz(-90), p = Rz(-90) (a2, 0, 0) = (0, 0.425, 0)
    #   T2 T3: p = (0, 0.425 + 0.3922, 0) = (0, 0.8172, 0), R = Rz(-90)
    #   T4 T5 T6 at zero: R = Rx90 Rx(-90) = I, p = (0, 0, d4) + Rx90 (0,0,d5) + (0,0,d6)
    #                     = (0, -0.0997, 0.2329)
    #   T2..T6: p = (0, 0.8172, 0) + Rz(-90) (0, -0.0997, 0.2329) = (-0.0997, 0.8172, 0.2329)
    #   with T1 (Rx90, d1): p = (0, 0, 0.1625) + Rx90 (-0.0997, 0.8172, 0.2329)
    #                         = (-0.0997, -0.2329, 0.9797)
    #   R = Rx90 Rz(-90) = [[0, 1, 0], [0, 0, -1], [-1, 0, 0]]
    T = UR5E.forward([0, -HP, 0, 0, 0, 0])
    np.testing.assert_allclose(T[:3, 3], [-0.0997, -0.2329, 0.9797], atol=1e-12)
    np.testing.assert_allclose(T[:3, :3], [[0, 1, 0], [0, 0, -1], [-1, 0, 0]], atol=1e-12)


@pytest.mark.parametrize(
    "name, reach",
    [("ur3e", (-0.45675, -0.22315, 0.0665)), ("ur10e", (-1.18425, -0.2907, 0.06085))],
)
def test_other_ur_models_at_zero(name, reach):
    # Same derivation as UR5e: p = (a2 + a3, -(d4 + d6), d1 - d5).
    T = UR_MODELS[name].forward(np.zeros(6))
    np.testing.assert_allclose(T[:3, 3], reach, atol=1e-12)


def test_jacobian_matches_finite_differences():
    rng = np.random.default_rng(0)
    for _ in range(5):
        q = rng.uniform(-math.pi, math.pi, 6)
        J = UR5E.jacobian(q)
        T0 = UR5E.forward(q)
        h = 1e-7
        for i in range(6):
            dq = np.zeros(6)
            dq[i] = h
            T1 = UR5E.forward(q + dq)
            v = (T1[:3, 3] - T0[:3, 3]) / h
            w = so3_log(T1[:3, :3] @ T0[:3, :3].T) / h
            np.testing.assert_allclose(J[:3, i], v, atol=1e-6)
            np.testing.assert_allclose(J[3:, i], w, atol=1e-6)


def test_flange_speed_of_base_joint():
    # Turning only joint 1 at 1 rad/s at q = 0 moves the flange on a circle of radius
    # sqrt(0.8172^2 + 0.2329^2) about base z.
    lin, ang = UR5E.flange_speed(np.zeros(6), [1.0, 0, 0, 0, 0, 0])
    assert lin == pytest.approx(math.hypot(0.8172, 0.2329), abs=1e-12)
    assert ang == pytest.approx(1.0)


def test_flange_speed_closed_form_equals_jacobian_twist():
    # The closed form must be |J(q) qd| exactly (to rounding) on plain DH and on Hayati-tilted
    # arms, for speeds from encoder noise to a fast move.
    rng = np.random.default_rng(7)
    for trial in range(300):
        base = UR_MODELS[("ur3e", "ur5e", "ur10e")[trial % 3]]
        model = base if trial % 2 else base.with_deltas(beta_rad=rng.normal(0, 0.01, 6),
                                                         alpha_rad=rng.normal(0, 0.01, 6),
                                                         theta_rad=rng.normal(0, 0.01, 6))
        q = rng.uniform(-2 * math.pi, 2 * math.pi, 6)
        qd = rng.normal(0, 1, 6) * 10 ** rng.uniform(-6, 0.5)
        twist = model.jacobian(q) @ qd
        lin, ang = model.flange_speed(q, qd)
        scale = float(np.sum(np.abs(qd)))
        assert lin == pytest.approx(float(np.linalg.norm(twist[:3])), rel=1e-12, abs=1e-14 * scale)
        assert ang == pytest.approx(float(np.linalg.norm(twist[3:])), rel=1e-12, abs=1e-14 * scale)


def test_flange_speed_rejects_bad_input():
    with pytest.raises(ValueError, match="qd_rad_s"):
        UR5E.flange_speed(np.zeros(6), np.zeros(5))
    # a NaN speed gives NaN (not an exception): settle detection rejects that sample
    assert all(math.isnan(v) for v in UR5E.flange_speed(np.zeros(6), [0, 0, math.nan, 0, 0, 0]))
    with pytest.raises(ValueError, match="q_rad"):
        UR5E.flange_speed([0, 0, math.inf, 0, 0, 0], np.zeros(6))


def test_inverse_recovers_pose_near_seed():
    rng = np.random.default_rng(1)
    q_true = np.array([0.3, -1.2, 1.4, -1.8, -1.5, 0.4])
    target = UR5E.forward(q_true)
    q = UR5E.inverse(target, q_true + rng.normal(0, 0.05, 6))
    np.testing.assert_allclose(UR5E.forward(q), target, atol=1e-9)
    np.testing.assert_allclose(q, q_true, atol=1e-6)


def test_inverse_rejects_unreachable_pose():
    far = np.eye(4)
    far[:3, 3] = (3.0, 0.0, 0.0)  # beyond the 0.85 m reach of a UR5e
    with pytest.raises(UnreachablePose):
        UR5E.inverse(far, np.array([0, -1.2, 1.4, -1.8, -1.5, 0.4]), max_iter=60)


def test_inverse_gives_up_early_on_a_pose_inside_the_reach_bound_the_links_cannot_reach():
    # 1.0 m out: inside the crude reach bound (sum of |a| and |d|), outside the arm's 0.85 m;
    # the iteration settles on the nearest pose and stops there, long before max_iter
    near = np.eye(4)
    near[:3, 3] = (1.0, 0.0, 0.1)
    with pytest.raises(UnreachablePose, match=r"stalled at pose error .* \(iteration (\d+);") as info:
        UR5E.inverse(near, np.array([0, -1.2, 1.4, -1.8, -1.5, 0.4]), max_iter=200)
    iteration = int(re.search(r"iteration (\d+)", str(info.value)).group(1))
    assert 40 < iteration < 200


def test_inverse_from_a_distant_seed_still_converges_past_the_stall_check():
    rng = np.random.default_rng(3)
    for _ in range(20):
        q_true = np.array([0.3, -1.2, 1.4, -1.8, -1.5, 0.4]) + rng.normal(0, 0.3, 6)
        target = UR5E.forward(q_true)
        q = UR5E.inverse(target, q_true + rng.normal(0, 0.4, 6))
        np.testing.assert_allclose(UR5E.forward(q), target, atol=1e-8)


def test_joint_offsets_perturb_fk():
    off = np.deg2rad([0.1, 0, 0, 0, 0, 0])
    model = UR5E.with_joint_offsets(off)
    q = np.array([0.1, -1.0, 1.0, -1.5, -1.5, 0.0])
    # A zero offset on joint 1 is the same as turning joint 1 by it.
    np.testing.assert_allclose(model.forward(q), UR5E.forward(q + off), atol=1e-15)
    assert not np.allclose(model.forward(q), UR5E.forward(q), atol=1e-6)


def test_user_dh_table_and_errors():
    # A planar two-link arm: a = (1, 0.5), q = (90 deg, -90 deg) -> flange at (0.5, 1, 0).
    model = dh_model_from_table({"d_m": [0, 0], "a_m": [1.0, 0.5], "alpha_deg": [0, 0]})
    T = model.forward([HP, -HP])
    np.testing.assert_allclose(T[:3, 3], [0.5, 1.0, 0.0], atol=1e-12)
    with pytest.raises(ValueError, match=r"robot\.dh\.bogus"):
        dh_model_from_table({"d_m": [0], "a_m": [0], "alpha_rad": [0], "bogus": 1}, "robot.dh")
    with pytest.raises(ValueError, match="alpha"):
        dh_model_from_table({"d_m": [0], "a_m": [0]})
    with pytest.raises(ValueError, match="expected 2"):
        DHModel("x", [0, 0], [0], [0, 0])
    with pytest.raises(ValueError, match="unknown robot model"):
        dh_model("ur99")


def test_joint_scaling_counts_to_rad_and_back():
    # 2^17 counts per motor rev, 101:1 gear, joint 2 reversed, joint 3 zero at 1000 counts.
    n = 3
    s = JointScaling(
        counts_per_rev=[2**17] * n,
        gear_ratio=[101] * n,
        sign=[1, -1, 1],
        offset_counts=[0, 0, 1000],
    )
    one_rev = 2**17 * 101
    q = s.to_rad([one_rev // 4, one_rev // 4, 1000 + one_rev // 2])
    np.testing.assert_allclose(q, [HP, -HP, math.pi], atol=1e-12)
    np.testing.assert_array_equal(s.to_counts(q), [one_rev // 4, one_rev // 4, 1000 + one_rev // 2])
    with pytest.raises(ValueError, match="sign"):
        JointScaling.uniform(2, 1000, sign=0.5)
    with pytest.raises(ValueError, match="> 0"):
        JointScaling.uniform(2, 0)


def test_forward_validates_input():
    with pytest.raises(ValueError, match="shape"):
        UR5E.forward(np.zeros(5))
    with pytest.raises(ValueError, match="NaN"):
        UR5E.forward([0, 0, 0, math.nan, 0, 0])


def test_se3_exp_consistency_with_fk():
    # A small joint-6 turn is a rotation about the flange z axis (the last DH z).
    q = np.array([0.2, -1.0, 1.2, -1.4, -1.6, 0.0])
    dq = 1e-3
    T0 = UR5E.forward(q)
    T1 = UR5E.forward(q + [0, 0, 0, 0, 0, dq])
    np.testing.assert_allclose(T1, T0 @ se3_exp([0, 0, 0, 0, 0, dq]), atol=1e-12)
