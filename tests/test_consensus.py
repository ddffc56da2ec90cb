"""The consensus gross-error test (``cellcal.daemon.consensus``, ADR 0032) on synthetic
stations: a wrong reflector on every second station (25 mm, the default rough-estimate floor),
an instrument stuck on one point, a wrong pivot pose, and good stations left alone.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from cellcal.daemon import consensus as cs
from cellcal.solver.synthetic import base_frame_scene, pivot_scene

MM, DEG = 1e-3, np.radians(1.0)


def _wrong_every_second(M: np.ndarray, offset_m: float) -> np.ndarray:
    out = M.copy()
    out[1::2, 0, 3] += offset_m  # stations 2, 4, ...: a reflector 25 mm beside the right one
    return out


@pytest.mark.parametrize("n", [5, 7, 11])
def test_a_wrong_reflector_on_every_second_station_is_outvoted(n):
    sc = base_frame_scene(n, np.random.default_rng(n), noise_mm=0.01, noise_deg=0.002)
    M = _wrong_every_second(sc.measured, 25 * MM)
    found = cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG)
    assert found is not None and found.inliers == tuple(range(0, n, 2))
    assert found.outliers() == tuple(range(1, n, 2))
    assert np.all(found.deviation_m[0::2] < 0.2 * MM) and np.all(found.deviation_m[1::2] > 20 * MM)
    # the same as points (3-DoF: the target's origin), one more station for the point model
    P = M[:, :3, 3]
    pts = cs.consensus(cs.POINT, sc.base_T_flange, P=P, max_error_m=5 * MM) if n == 7 else None
    if n == 7:  # (11 points cost a second of subset fits: the pose case covers the search)
        assert pts is not None and pts.outliers() == tuple(range(1, n, 2))


def test_a_tie_of_two_consistent_groups_is_no_consensus():
    """Four stations, two on each reflector: each pair is a consistent model of its own."""
    sc = base_frame_scene(6, np.random.default_rng(3), noise_mm=0.01, noise_deg=0.002)
    M = _wrong_every_second(sc.measured, 25 * MM)
    assert cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG) is None
    # and too few stations is none either
    assert cs.consensus(cs.POSE, sc.base_T_flange[:4], M=sc.measured[:4], max_error_m=5 * MM) is None


def test_good_stations_all_agree_and_a_stuck_instrument_is_found():
    sc = base_frame_scene(8, np.random.default_rng(11), noise_mm=0.02, noise_deg=0.003)
    good = cs.consensus(cs.POSE, sc.base_T_flange, M=sc.measured, max_error_m=5 * MM, max_error_rad=0.5 * DEG)
    assert good is not None and good.outliers() == ()
    P = sc.measured[:, :3, 3].copy()
    P[5:] = P[4] + np.random.default_rng(1).normal(scale=0.01 * MM, size=(3, 3))  # stuck on station 5's point
    stuck = cs.consensus(cs.POINT, sc.base_T_flange, P=P, max_error_m=5 * MM)
    assert stuck is not None and set(stuck.outliers()) >= {5, 6, 7}


def test_a_pivot_pose_that_is_not_the_reported_one_is_found():
    G, _tip, _pivot = pivot_scene(7, np.random.default_rng(5), noise_mm=0.01)
    G = G.copy()
    G[3, 1, 3] += 25 * MM
    found = cs.consensus(cs.PIVOT, G, max_error_m=5 * MM)
    assert found is not None and found.outliers() == (3,)


def test_many_stations_are_judged_from_a_bounded_number_of_subsets_quickly():
    sc = base_frame_scene(40, np.random.default_rng(2), noise_mm=0.01, noise_deg=0.002)
    M = sc.measured.copy()
    M[[3, 17, 29], 2, 3] -= 30 * MM
    t0 = time.perf_counter()
    found = cs.consensus(cs.POSE, sc.base_T_flange, M=M, max_error_m=5 * MM, max_error_rad=0.5 * DEG, seed=1)
    assert found is not None and found.outliers() == (3, 17, 29)
    assert time.perf_counter() - t0 < 5.0  # 200 subset fits, not C(40, 3) = 9880
