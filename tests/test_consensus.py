"""The consensus gross-error test (``cellcal.daemon.consensus``, ADR 0032) on synthetic
stations: a wrong reflector on every second station (25 mm, the default rough-estimate floor),
an instrument stuck on one point, a wrong pivot pose, and good stations left alone.
"""

from __future__ import annotations

import numpy as np
import pytest

from cellcal.daemon import consensus as cs
from cellcal.solver import CalibrationError, calibrate_base_frame
from cellcal.solver.synthetic import base_frame_scene, pivot_scene

MM, DEG = 1e-3, np.radians(1.0)


def _wrong_every_second(M: np.ndarray, offset_m: float) -> np.ndarray:
    out = M.copy()
    out[1::2, 0, 3] += offset_m  # stations 2, 4, ...: a reflector 25 mm beside the right one
    return out


@pytest.mark.parametrize("n", [6, 9, 12])
def test_a_wrong_reflector_on_every_third_station_is_outvoted(n):
    sc = base_frame_scene(n, np.random.default_rng(n), noise_mm=0.01, noise_deg=0.002)
    M = sc.measured.copy()
    M[2::3, 0, 3] += 25 * MM  # stations 3, 6, ...: a reflector 25 mm beside the right one
    found = cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG)
    wrong = tuple(range(2, n, 3))
    assert found is not None and not found.split and found.outliers() == wrong
    good = [i for i in range(n) if i not in wrong]
    assert np.all(found.deviation_m[good] < 0.2 * MM) and np.all(found.deviation_m[list(wrong)] > 20 * MM)
    if n == 6:  # the same as points (3-DoF: the target's origin; 12 points cost seconds of subset fits)
        pts = cs.consensus(cs.POINT, sc.base_T_flange, P=M[:, :3, 3], max_error_m=5 * MM)
        assert pts is not None and not pts.split and pts.outliers() == wrong


@pytest.mark.parametrize("n", [6, 7, 11])
def test_a_wrong_reflector_on_every_second_station_splits_the_run_instead_of_a_guess(n):
    """Two groups, each a consistent model (the cell shifted by the offset), neither two
    thirds of the stations: which is right cannot be told, and a bare majority is no answer."""
    sc = base_frame_scene(n, np.random.default_rng(n), noise_mm=0.01, noise_deg=0.002)
    M = _wrong_every_second(sc.measured, 25 * MM)
    found = cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG)
    assert found is not None and found.split
    assert {frozenset(found.inliers), frozenset(found.split)} == {frozenset(range(0, n, 2)), frozenset(range(1, n, 2))}
    assert np.median(found.deviation_m[list(found.split)]) == pytest.approx(25 * MM, abs=1 * MM)


def test_too_few_to_tell_is_no_verdict():
    sc = base_frame_scene(5, np.random.default_rng(3), noise_mm=0.01, noise_deg=0.002)
    M = _wrong_every_second(sc.measured, 25 * MM)  # 3 against 2: the 2 are too few for a fit
    assert cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG) is None
    assert cs.consensus(cs.POSE, sc.base_T_flange[:4], M=sc.measured[:4], max_error_m=5 * MM) is None


def test_good_stations_all_agree_and_a_stuck_instrument_is_found():
    sc = base_frame_scene(8, np.random.default_rng(11), noise_mm=0.02, noise_deg=0.003)
    good = cs.consensus(cs.POSE, sc.base_T_flange, M=sc.measured, max_error_m=5 * MM, max_error_rad=0.5 * DEG)
    assert good is not None and good.outliers() == ()
    P = sc.measured[:, :3, 3].copy()
    P[6:] = P[5] + np.random.default_rng(1).normal(scale=0.01 * MM, size=(2, 3))  # stuck on station 6's point
    stuck = cs.consensus(cs.POINT, sc.base_T_flange, P=P, max_error_m=5 * MM)
    assert stuck is not None and not stuck.split and stuck.outliers() == (6, 7)


def test_a_pivot_pose_that_is_not_the_reported_one_is_found():
    G, _tip, _pivot = pivot_scene(7, np.random.default_rng(5), noise_mm=0.01)
    G = G.copy()
    G[3, 1, 3] += 25 * MM
    found = cs.consensus(cs.PIVOT, G, max_error_m=5 * MM)
    assert found is not None and found.outliers() == (3,)


def test_many_stations_are_judged_from_a_bounded_number_of_subsets(monkeypatch):
    sc = base_frame_scene(40, np.random.default_rng(2), noise_mm=0.01, noise_deg=0.002)
    M = sc.measured.copy()
    M[[3, 17, 29], 2, 3] -= 30 * MM
    fits = []

    def counted(*args, **kwargs):  # the solver itself, counted
        fits.append(kwargs["min_axis_spread"])
        return calibrate_base_frame(*args, **kwargs)

    monkeypatch.setattr(cs, "calibrate_base_frame", counted)
    found = cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG, seed=1)
    assert found is not None and found.outliers() == (3, 17, 29)
    subset_fits = sum(1 for s in fits if s == cs._MIN_SUBSET_SPREAD)
    assert subset_fits == cs.MAX_SUBSETS[cs.POSE]  # 200 subset fits, not C(40, 3) = 9880
    assert len(fits) - subset_fits <= 2  # and the joint fits


def test_a_subset_fit_skips_the_covariance_and_gives_what_the_full_fit_gives():
    # Subsets are held to an axis spread where no refusal reads the covariance: the fit
    # without it has the same deviations, bit for bit, and the same refusals.
    rng = np.random.default_rng(5)
    sc = base_frame_scene(12, rng, noise_mm=0.02, noise_deg=0.005)
    G, M = sc.base_T_flange, sc.measured.copy()
    M[4, 1, 3] += 25 * MM
    G[7] = G[6]  # a subset holding both has too little motion: refused
    fit = cs._fitter(cs.POSE, G, M, None)
    outcomes = {"fit": 0, "refused": 0}
    for _ in range(60):
        idx = np.sort(rng.choice(12, size=3, replace=False))
        try:
            r = calibrate_base_frame(G[idx], M[idx], min_axis_spread=cs._MIN_SUBSET_SPREAD, refine=False,
                                     holdout=False)
        except (CalibrationError, ValueError) as full:
            with pytest.raises(type(full)) as lean:
                fit(idx)
            assert str(lean.value) == str(full)
            outcomes["refused"] += 1
            continue
        pred = r.cell_T_base @ G @ r.flange_T_target
        dt, dr = fit(idx)
        np.testing.assert_array_equal(dt, np.linalg.norm(pred[:, :3, 3] - M[:, :3, 3], axis=1))
        assert dr is not None and dr.shape == (12,)
        outcomes["fit"] += 1
    assert outcomes["fit"] > 30 and outcomes["refused"] > 0, outcomes
