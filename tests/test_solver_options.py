"""One options record for every calibration (issue 23, item 5; ``cellcal.solver.options``)."""

import dataclasses
import math

import numpy as np
import pytest

from cellcal.solver import (
    SolverOptions,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, pivot_scene


@pytest.fixture(scope="module")
def scene():
    return base_frame_scene(15, np.random.default_rng(5), noise_mm=0.02, noise_deg=0.01)


def _same(a, b):
    assert np.array_equal(a.cell_T_base, b.cell_T_base)
    assert np.array_equal(a.covariance, b.covariance)
    assert [w.code for w in a.warnings] == [w.code for w in b.warnings]


def test_a_record_and_the_same_keywords_give_the_same_result(scene):
    kw = dict(noise_translation_m=2e-5, noise_rotation_rad=math.radians(0.01), huber=3.0, max_reach_m=2.0)
    _same(calibrate_base_frame(scene.base_T_flange, scene.measured, **kw),
          calibrate_base_frame(scene.base_T_flange, scene.measured, options=SolverOptions(**kw)))


def test_keywords_override_the_record(scene):
    opts = SolverOptions(refine=False, holdout=False)
    r = calibrate_base_frame(scene.base_T_flange, scene.measured, options=opts, refine=True)
    assert r.refined and r.holdout is None
    assert not calibrate_base_frame(scene.base_T_flange, scene.measured, options=opts).refined


def test_one_record_serves_every_calibration():
    # A pose field the points cannot use (noise_rotation_rad), a robust one the pivot cannot.
    opts = SolverOptions(noise_translation_m=2e-5, noise_rotation_rad=math.radians(0.01), huber=4.0)
    sc = base_frame_scene(12, np.random.default_rng(6), noise_mm=0.02, noise_deg=0.01)
    p = (sc.X @ sc.base_T_flange @ np.array([0.0, 0.03, 0.1, 1.0]))[:, :3]
    he = hand_eye_scene(12, np.random.default_rng(7), noise_mm=0.02, noise_deg=0.01)
    G, _, _ = pivot_scene(12, np.random.default_rng(8), noise_mm=0.02)
    assert calibrate_base_frame(sc.base_T_flange, sc.measured, options=opts).noise_translation_m == 2e-5
    assert calibrate_base_frame_points(sc.base_T_flange, p, options=opts).noise_translation_m == 2e-5
    assert "Huber" in calibrate_hand_eye(he.base_T_flange, he.measured, options=opts).solver
    calibrate_eye_to_hand(he.base_T_flange, he.measured, options=opts)
    assert calibrate_tool_point(G, options=opts).noise_translation_m == 2e-5


def test_a_keyword_a_calibration_cannot_use_is_a_type_error(scene):
    G, _, _ = pivot_scene(12, np.random.default_rng(8), noise_mm=0.02)
    with pytest.raises(TypeError, match="unexpected keyword argument 'huber'"):
        calibrate_tool_point(G, huber=3.0)
    with pytest.raises(TypeError, match="'hubr'"):
        calibrate_base_frame(scene.base_T_flange, scene.measured, hubr=3.0)
    with pytest.raises(TypeError, match="'min_point_spread'"):
        calibrate_base_frame(scene.base_T_flange, scene.measured, min_point_spread=0.1)
    with pytest.raises(TypeError, match="SolverOptions"):
        calibrate_base_frame(scene.base_T_flange, scene.measured, options={"huber": 3.0})


def test_the_record_is_frozen_and_documents_every_field():
    opts = SolverOptions()
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.huber = 3.0  # type: ignore[misc]
    assert opts.replace(huber=3.0).huber == 3.0 and opts.huber is None
    doc = SolverOptions.__doc__ or ""
    missing = [f.name for f in dataclasses.fields(SolverOptions) if f.name not in doc]
    assert not missing, missing
