"""Robust fits (ADR 0004, "Robust options"): ``huber=`` with a robust scale and ``reject_k=``.

World: 20 stations of the synthetic cell with 0.2 mm / 0.1 deg tracker noise (noise not
declared: the scale must come from the data), 1 or 2 of them displaced by a gross error of
5-50 mm in a random direction. Reference: the same solve with those stations dropped (the
best a robust fit could do). Criterion: over 60 seeded trials, the RMS error of
``cell_T_base`` (translation and rotation separately) at most 1.5x the reference's, and
every outlier listed in ``downweighted``.

Why it can fail: with the contaminated residual RMS as the scale, a 50 mm outlier inflates
the noise estimate ~10x, so Huber's threshold of k sigmas lets the outlier pull with ~10x the
weight (measured: the plain fit 11-14x the reference; that is the sensitivity check). With a
robust scale the pull is bounded at k true sigmas: Huber (k = 3) 1.11 / 1.28x, hard rejection
1.02x (measured).
"""

import math

import numpy as np
import pytest
from _worlds import base_frame_scenes

from cellcal.solver import Workspace, calibrate_base_frame
from cellcal.solver.se3 import se3_inverse, se3_log
from cellcal.solver.synthetic import base_frame_scene

TRIALS = 60


def _data(n_bad, seed):
    """Seeded trials: stations, contaminated measurements, truth, outliers, refit errors."""
    rng = np.random.default_rng(seed)
    G, M, X, _ = base_frame_scenes(TRIALS, 20, rng, 0.2, 0.1)
    ws = Workspace(20)
    bads, ref = [], []
    for k in range(TRIALS):
        bad = rng.choice(20, n_bad, replace=False)
        for i in bad:
            v = rng.normal(size=3)
            M[k, i, :3, 3] += v * rng.uniform(5e-3, 50e-3) / np.linalg.norm(v)
        keep = np.setdiff1d(np.arange(20), bad)
        clean = calibrate_base_frame(G[k, keep], M[k, keep], holdout=False, workspace=ws)
        ref.append(se3_log(se3_inverse(X[k]) @ clean.cell_T_base))
        bads.append(bad)
    return G, M, X, bads, np.array(ref)


@pytest.fixture(scope="module", params=[1, 2], ids=["1 outlier", "2 outliers"])
def data(request):
    return _data(request.param, seed=50 + request.param)


def _ratios(data, kw):
    G, M, X, bads, ref = data
    ws = Workspace(20)
    err, flagged = [], 0
    for k in range(TRIALS):
        r = calibrate_base_frame(G[k], M[k], holdout=False, workspace=ws, **kw)
        assert r.converged, r.stop_reason
        err.append(se3_log(se3_inverse(X[k]) @ r.cell_T_base))
        flagged += set(bads[k].tolist()) <= set(np.asarray(r.downweighted).tolist())
    err = np.array(err)

    def ratio(a):
        return math.sqrt(np.mean(np.sum(err[:, a] ** 2, axis=1)) / np.mean(np.sum(ref[:, a] ** 2, axis=1)))

    return ratio(slice(0, 3)), ratio(slice(3, 6)), flagged


@pytest.mark.parametrize("kw", [dict(huber=3.0), dict(reject_k=4.1), dict(huber=3.0, reject_k=5.0)],
                         ids=["huber", "reject", "huber+reject"])
def test_gross_outliers_cost_at_most_half_again_the_refit_error(data, kw):
    rt, rr, flagged = _ratios(data, kw)
    assert rt <= 1.5 and rr <= 1.5, (rt, rr)
    assert flagged == TRIALS


def test_the_plain_fit_is_what_the_robust_options_fix(data):
    rt, rr, flagged = _ratios(data, {})
    assert rt > 3.0 and flagged == 0, (rt, rr)


def test_the_robust_scale_is_not_the_contaminated_rms():
    sc = base_frame_scene(20, np.random.default_rng(3), noise_mm=0.2, noise_deg=0.1)
    M = sc.measured.copy()
    M[5, :3, 3] += [0.03, -0.02, 0.01]
    plain = calibrate_base_frame(sc.base_T_flange, M, holdout=False)
    robust = calibrate_base_frame(sc.base_T_flange, M, holdout=False, huber=3.0)
    assert plain.noise_translation_m > 3 * 0.2e-3  # the blunder inflates the plain estimate
    assert robust.noise_translation_m == pytest.approx(0.2e-3, rel=0.3)
    assert 5 in robust.downweighted.tolist()
    assert {"outliers"} <= {w.code for w in robust.warnings}
    dropped = calibrate_base_frame(sc.base_T_flange, M, holdout=False, reject_k=4.1)
    assert dropped.downweighted.tolist() == [5] and dropped.dof == 6 * 19 - 12
    with pytest.raises(ValueError, match="reject_k"):
        calibrate_base_frame(sc.base_T_flange, M, reject_k=-1.0)
