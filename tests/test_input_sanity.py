"""Input sanity (ADR 0014): what the residuals cannot reveal.

Swapped or inverted inputs fit exactly (the model is symmetric), so the prior, the reach
and the units are the only evidence; duplicated stations must not make the covariance
optimistic.
"""

import math

import numpy as np
import pytest

from cellcal.solver import (
    CalibrationError,
    PriorMismatch,
    UnreachableStations,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, pivot_scene

NOISE = dict(noise_translation_m=2e-5, noise_rotation_rad=math.radians(0.01))


@pytest.fixture(scope="module")
def scene():
    return base_frame_scene(20, np.random.default_rng(42), noise_mm=0.02, noise_deg=0.01)


def test_swapped_inputs_fit_exactly_so_only_a_prior_catches_them(scene):
    G, M, X = scene.base_T_flange, scene.measured, scene.X
    good = calibrate_base_frame(G, M, expected_cell_T_base=X)
    swapped = calibrate_base_frame(M, G)  # the symmetry: cell_T_base comes out inverted
    assert swapped.rms_translation_m == pytest.approx(good.rms_translation_m, rel=0.2)
    assert not {w.code for w in swapped.warnings} & {"model_error", "units"}
    with pytest.raises(PriorMismatch) as ei:
        calibrate_base_frame(M, G, expected_cell_T_base=X)
    e = ei.value
    assert isinstance(e, CalibrationError)
    T = swapped.cell_T_base
    assert e.translation_m == pytest.approx(np.linalg.norm(T[:3, 3] - X[:3, 3]), rel=1e-9)
    assert e.rotation_rad > math.radians(5) and "inverse matches" in str(e) and "swapped" in str(e)


def test_prior_tolerances(scene):
    G, M, X = scene.base_T_flange, scene.measured, scene.X
    near = X @ make_transform(so3_exp([0.0, 0.0, math.radians(2.0)]), [0.03, 0.0, 0.0])
    calibrate_base_frame(G, M, expected_cell_T_base=near)  # inside 50 mm / 5 deg
    with pytest.raises(PriorMismatch) as ei:
        calibrate_base_frame(G, M, expected_cell_T_base=near, expected_tolerance_m=0.01)
    assert ei.value.translation_m == pytest.approx(0.03, abs=1e-3) and ei.value.rotation_rad == pytest.approx(
        math.radians(2.0), abs=1e-3)
    with pytest.raises(PriorMismatch):
        calibrate_base_frame(G, M, expected_cell_T_base=near, expected_tolerance_rad=math.radians(1.0))
    with pytest.raises(ValueError, match="expected_tolerance_m"):
        calibrate_base_frame(G, M, expected_cell_T_base=X, expected_tolerance_m=0.0)
    with pytest.raises(ValueError, match="expected_cell_T_base"):
        calibrate_base_frame(G, M, expected_cell_T_base=np.ones((4, 4)))


def test_priors_on_every_problem():
    sc = hand_eye_scene(12, np.random.default_rng(3), noise_mm=0.02, noise_deg=0.01)
    calibrate_hand_eye(sc.base_T_flange, sc.measured, expected_flange_T_camera=sc.X)
    with pytest.raises(PriorMismatch, match="flange_T_camera"):
        calibrate_hand_eye(sc.base_T_flange, sc.measured, expected_flange_T_camera=np.eye(4))
    B = make_transform(so3_exp([0.1, -0.2, 0.3]), [1.0, 0.2, 0.5])
    O = np.array([se3_inverse(B) @ g @ sc.X for g in sc.base_T_flange])
    calibrate_eye_to_hand(sc.base_T_flange, O, expected_base_T_camera=B)
    with pytest.raises(PriorMismatch, match="base_T_camera"):
        calibrate_eye_to_hand(sc.base_T_flange, O, expected_base_T_camera=np.eye(4))
    G, tip, _ = pivot_scene(10, np.random.default_rng(4))
    calibrate_tool_point(G, expected_flange_p_tip=tip)
    with pytest.raises(PriorMismatch, match="flange_p_tip") as ei:
        calibrate_tool_point(G, expected_flange_p_tip=tip + [0.0, 0.0, 0.1])
    assert ei.value.translation_m == pytest.approx(0.1, abs=1e-6)
    p = (sc.base_T_flange @ np.array([0.0, 0.0, 0.1, 1.0]))[:, :3]
    cell = make_transform(so3_exp([0.3, 0.1, -0.2]), [2.0, 0.5, 0.1])
    with pytest.raises(PriorMismatch):
        calibrate_base_frame_points(sc.base_T_flange, (cell[:3, :3] @ p.T).T + cell[:3, 3], expected_cell_T_base=np.eye(4))


def test_reach_refuses_swapped_arguments_and_millimetres_naming_the_stations(scene):
    G, M = scene.base_T_flange, scene.measured
    calibrate_base_frame(G, M, max_reach_m=1.3)
    with pytest.raises(UnreachableStations) as ei:
        calibrate_base_frame(M, G, max_reach_m=1.3)
    e = ei.value
    assert isinstance(e, ValueError) and isinstance(e, CalibrationError)
    d = np.linalg.norm(M[:, :3, 3], axis=1)
    assert e.stations == tuple(int(i) for i in np.flatnonzero(d > 1.3))
    assert "swapped" in str(e) and f"base_T_flange[{e.stations[0]}" in str(e)
    Gmm = G.copy()
    Gmm[:, :3, 3] *= 1e3
    with pytest.raises(UnreachableStations, match="millimetres"):
        calibrate_base_frame(Gmm, M, max_reach_m=1.3)
    with pytest.raises(UnreachableStations):
        calibrate_tool_point(Gmm, max_reach_m=1.3)
    with pytest.raises(ValueError, match="max_reach_m"):
        calibrate_base_frame(G, M, max_reach_m=-1.0)


def test_units_warning_for_millimetres(scene):
    G, M = scene.base_T_flange, scene.measured
    Gmm, Mmm = G.copy(), M.copy()
    Gmm[:, :3, 3] *= 1e3
    Mmm[:, :3, 3] *= 1e3
    r = calibrate_base_frame(Gmm, Mmm)  # both in mm: fits exactly, in mm
    w = [x for x in r.warnings if x.code == "units"]
    assert len(w) == 2 and "millimetres" in w[0].message and w[0].value > 100
    assert not [x for x in calibrate_base_frame(G, M).warnings if x.code == "units"]
    pts = calibrate_base_frame_points(G, Mmm[:, :3, 3] * 1.0)
    assert "units" in {x.code for x in pts.warnings}
    huge = G.copy()
    huge[:, :3, 3] *= 1e6  # hundreds of km: refused as bad input, not solved
    with pytest.raises(ValueError, match=r"base_T_flange\[\d+\]: translation .* beyond any cell"):
        calibrate_base_frame(huge, M)


def test_duplicated_stations_are_reported_and_do_not_make_the_covariance_optimistic(scene):
    G, M = scene.base_T_flange, scene.measured
    idx = np.r_[np.arange(20), [3, 3, 7, 12, 12]]  # five copies of robot readings
    for kw in (NOISE, {}):
        once = calibrate_base_frame(G, M, holdout=False, **kw)
        dup = calibrate_base_frame(G[idx], M[idx], holdout=False, **kw)
        w = [x for x in dup.warnings if x.code == "duplicate_stations"]
        assert len(w) == 1 and w[0].value == 5 and "3, 20, 21" in w[0].message
        assert np.allclose(dup.cell_T_base, once.cell_T_base, atol=1e-12)
        assert np.allclose(dup.cell_T_base_covariance, once.cell_T_base_covariance, rtol=1e-6, atol=0)
        assert dup.dof == once.dof
    # A repeated robot pose with a new tracker reading counts once too (its mean).
    M2 = M[idx].copy()
    M2[20, :3, 3] += 1e-5
    r = calibrate_base_frame(G[idx], M2, holdout=False, **NOISE)
    assert "duplicate_stations" in {x.code for x in r.warnings} and r.dof == once.dof
    assert calibrate_tool_point(pivot_scene(8, np.random.default_rng(0))[0][[0, 1, 2, 3, 4, 5, 6, 7, 7]]).warnings
