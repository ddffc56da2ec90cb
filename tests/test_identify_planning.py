"""Station planning for kinematic identification (solver/kinematic_planning.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _kin_world import CELL_P_TRACKER, CELL_T_BASE, FLANGE_T_TARGET, random_q

from cellcal.solver import UR5E, identify_kinematics, plan_identification_stations


def _o1_cond_of(q):
    """O1 and condition number that identification reports for stations ``q`` (noise-free
    data, the planner's default noise as declared weights)."""
    T = CELL_T_BASE @ UR5E.forward(q) @ FLANGE_T_TARGET
    res = identify_kinematics(q, UR5E, cell_T_target=T, noise_translation_m=20e-6,
                              noise_rotation_rad=math.radians(0.005), max_condition=1e9)
    return res.observability_o1, res.condition_number


def test_plan_is_better_observed_than_random_stations_and_keeps_validation_apart():
    plan = plan_identification_stations(UR5E, 20, cell_T_base=CELL_T_BASE, flange_T_target=FLANGE_T_TARGET,
                                        cell_p_tracker=CELL_P_TRACKER, rng=np.random.default_rng(2), n_candidates=1500)
    assert plan.q.shape == (20, 6) and plan.validation_q.shape == (30, 6)
    assert plan.measurement == "pose" and plan.n_feasible <= plan.n_candidates
    # Validation stations are never fit stations.
    d = np.abs(plan.q[:, None, :] - plan.validation_q[None, :, :]).max(axis=2)
    assert d.min() > 0
    assert plan.o1 > 0 and plan.o3 > 0 and 1 <= plan.condition_number < 100
    o1_plan, cond_plan = _o1_cond_of(plan.q)
    assert o1_plan == pytest.approx(plan.o1, rel=0.05)  # the same figure as identification's
    worse = [_o1_cond_of(random_q(np.random.default_rng(s), 20)) for s in range(3)]
    assert all(o1_plan > o1 for o1, _ in worse), (o1_plan, worse)
    assert all(cond_plan < cond for _, cond in worse), (cond_plan, worse)
    # Line of sight: every planned target faces the tracker within the cone.
    T = CELL_T_BASE @ UR5E.forward(np.vstack([plan.q, plan.validation_q])) @ FLANGE_T_TARGET
    to = CELL_P_TRACKER - T[:, :3, 3]
    cosang = np.einsum("ni,ni->n", T[:, :3, 2], to / np.linalg.norm(to, axis=1, keepdims=True))
    assert np.all(cosang >= math.cos(math.radians(60)) - 1e-12)


def test_plan_arguments_are_checked():
    with pytest.raises(ValueError, match="n_validation"):
        plan_identification_stations(UR5E, 20, n_validation=10)
    with pytest.raises(ValueError, match="measurement"):
        plan_identification_stations(UR5E, 20, measurement="laser")
    with pytest.raises(ValueError, match="joint_limits_rad"):
        plan_identification_stations(UR5E, 20, joint_limits_rad=np.zeros((5, 2)))
    with pytest.raises(ValueError, match="line of sight"):
        plan_identification_stations(UR5E, 20, cell_p_tracker=[0.0, 0.0, -50.0], cone_deg=5.0, n_candidates=200)
    point = plan_identification_stations(UR5E, 25, measurement="point", flange_p_target=[0.0, 0.03, 0.08],
                                         n_candidates=500)
    assert point.measurement == "point" and "joint1.zero_offset" in point.unidentifiable
    assert "base frame" in point.unidentifiable_reasons["joint1.zero_offset"]
