"""Inputs that fit exactly but put the fitted target where no tool carries it are refused
(ADR 0014, amended; issue 25 item 5): ``max_target_offset_m``."""

import numpy as np
import pytest

from cellcal.solver import (
    DEFAULT_MAX_TARGET_OFFSET_M,
    CalibrationError,
    ImplausibleGeometry,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_tool_point,
)
from cellcal.solver.se3 import se3_inverse
from cellcal.solver.synthetic import base_frame_scene, pivot_scene


@pytest.fixture(scope="module")
def scene():
    return base_frame_scene(15, np.random.default_rng(11), noise_mm=0.02, noise_deg=0.01)


def test_both_inputs_inverted_are_refused_as_implausible(scene):
    # Issue 25: flange_T_base and target_T_cell fit exactly, cell_T_base' = flange_T_target^-1
    # and flange_T_target' = base_T_cell: the "target" 2 m from the flange.
    Gi = np.array([se3_inverse(g) for g in scene.base_T_flange])
    Mi = np.array([se3_inverse(m) for m in scene.measured])
    with pytest.raises(ImplausibleGeometry, match="inverted") as ei:
        calibrate_base_frame(Gi, Mi)
    assert ei.value.name == "flange_T_target" and ei.value.distance_m > 1.5
    assert ei.value.limit_m == DEFAULT_MAX_TARGET_OFFSET_M == 1.0
    assert isinstance(ei.value, CalibrationError)
    # Declared as a long mount, the same inputs answer (the check is the only thing that sees them).
    r = calibrate_base_frame(Gi, Mi, max_target_offset_m=None)
    assert np.linalg.norm(r.flange_T_target[:3, 3]) > 1.5


def test_a_target_on_a_tool_passes(scene):
    r = calibrate_base_frame(scene.base_T_flange, scene.measured)
    assert np.linalg.norm(r.flange_T_target[:3, 3]) < 0.5


def test_points_eye_to_hand_and_tool_tips_are_checked(scene):
    G = scene.base_T_flange
    far = np.array([0.0, 0.0, 1.4, 1.0])
    p = (scene.X @ G @ far)[:, :3]
    with pytest.raises(ImplausibleGeometry, match="reflector"):
        calibrate_base_frame_points(G, p)
    assert calibrate_base_frame_points(G, p, max_target_offset_m=2.0).flange_p_target[2] == pytest.approx(1.4, abs=1e-6)
    X = scene.X
    Y = np.eye(4)
    Y[:3, 3] = far[:3]
    O = np.array([se3_inverse(X) @ g @ Y for g in G])
    with pytest.raises(ImplausibleGeometry, match="target"):
        calibrate_eye_to_hand(G, O)
    Gp, _, _ = pivot_scene(12, np.random.default_rng(3), noise_mm=0.01)
    with pytest.raises(ImplausibleGeometry, match="tool tip"):
        calibrate_tool_point(Gp, max_target_offset_m=0.1)  # the scene's tip is 0.18 m out


def test_a_bad_limit_is_a_value_error(scene):
    with pytest.raises(ValueError, match="max_target_offset_m"):
        calibrate_base_frame(scene.base_T_flange, scene.measured, max_target_offset_m=-1.0)
