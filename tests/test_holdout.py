"""Held-out station closure and linear/refined agreement."""

import math

import numpy as np
import pytest

from cellcal.solver import (
    HoldoutClosure,
    Workspace,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.se3 import rotation_angle, se3_exp, se3_inverse
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, pivot_scene
from cellcal.solver.validation import MAX_FOLDS, _percentile_sorted

KW = dict(noise_translation_m=0.2e-3, noise_rotation_rad=math.radians(0.1))


def closure(M, G, X, Y):
    P = X @ G @ Y
    return (np.linalg.norm(M[:, :3, 3] - P[:, :3, 3], axis=1),
            np.array([rotation_angle(p[:3, :3].T @ m[:3, :3]) for p, m in zip(P, M, strict=True)]))


def test_linearised_leave_one_out_matches_true_refits():
    sc = base_frame_scene(14, np.random.default_rng(21), noise_mm=0.2, noise_deg=0.1)
    G, M = sc.base_T_flange, sc.measured
    r = calibrate_base_frame(G, M, **KW)
    ho = r.holdout
    assert ho.method == "linearised leave-one-out" and ho.folds == 14
    for i in range(14):
        keep = np.arange(14) != i
        ri = calibrate_base_frame(G[keep], M[keep], holdout=False, **KW)
        t, a = closure(M[i:i + 1], G[i:i + 1], ri.cell_T_base, ri.flange_T_target)
        # First-order exact: agreement to a few percent of the closure (micrometres).
        assert ho.translation_m[i] == pytest.approx(t[0], rel=0.03, abs=2e-6)
        assert ho.rotation_rad[i] == pytest.approx(a[0], rel=0.03, abs=2e-6)
        # Held-out closure exceeds the in-sample residual (the station no longer pulls the fit).
        assert ho.translation_m[i] >= r.residuals.translation_m[i] * 0.999


def _linear_loo_truth(G, M):
    n = G.shape[0]
    t = np.empty(n)
    for i in range(n):
        keep = np.arange(n) != i
        rf = calibrate_base_frame(G[keep], M[keep], refine=False, holdout=False)
        t[i] = closure(M[i:i + 1], G[i:i + 1], rf.cell_T_base, rf.flange_T_target)[0][0]
    return t


def test_linear_answers_get_the_linearised_update_at_the_linear_answer():
    sc = base_frame_scene(23, np.random.default_rng(22), noise_mm=0.2, noise_deg=0.1)
    G, M = sc.base_T_flange, sc.measured
    r = calibrate_base_frame(G, M, refine=False)
    ho = r.holdout
    assert ho.method == "linearised leave-one-out" and ho.folds == 23
    # Against true leave-one-out refits of the linear solve: close per station, closer in P50.
    truth = _linear_loo_truth(G, M)
    assert np.all(np.abs(ho.translation_m - truth) <= 0.35 * truth + 2e-6), np.c_[ho.translation_m, truth]
    assert ho.p50_translation_m == pytest.approx(float(np.median(truth)), rel=0.12)
    # It is the linear answer's closure, not the refined one's (that would be tighter here).
    ref = calibrate_base_frame(G, M)
    assert ho.p50_translation_m != pytest.approx(ref.holdout.p50_translation_m, rel=0.05)
    # Held out, a station closes no better than in the fit (to rounding).
    assert np.all(ho.translation_m >= r.residuals.translation_m * 0.999)
    # The same closure without the covariance, and the answer's own residuals untouched.
    bare = calibrate_base_frame(G, M, refine=False, uncertainty=False)
    assert bare.holdout.method == "linearised leave-one-out"
    assert np.allclose(bare.holdout.translation_m, ho.translation_m, rtol=1e-9, atol=1e-12)
    assert not np.isfinite(bare.sigma_translation_mm)
    plain = calibrate_base_frame(G, M, refine=False, holdout=False)
    assert np.array_equal(plain.residuals.translation_m, r.residuals.translation_m)
    assert plain.noise_translation_m == r.noise_translation_m
    assert np.array_equal(calibrate_base_frame(G, M, refine=False, holdout=False, uncertainty=False)
                          .residuals.translation_m, bare.residuals.translation_m)


def test_k_fold_refits_remain_for_a_singular_information_matrix():
    from cellcal.solver import Workspace
    from cellcal.solver._pose_solve import _holdout
    from cellcal.solver.refine import Fit, PoseModel
    from cellcal.solver.validation import kfold_indices

    sc = base_frame_scene(23, np.random.default_rng(22), noise_mm=0.2, noise_deg=0.1)
    G, M = sc.base_T_flange, sc.measured
    lin = calibrate_base_frame(G, M, refine=False, holdout=False)
    ws = Workspace(23)
    model = PoseModel(M, G, 23, ws)
    fit = Fit((lin.cell_T_base, lin.flange_T_target), np.full((12, 12), np.inf), 0.0, 0.0, 0, 0, True,
              ws.down[:0], None, ok=False)
    calls = []

    def fit_subset(idx, m):
        calls.append(m)
        keep = np.zeros(23, bool)
        keep[idx] = True
        rf = calibrate_base_frame(G[keep], M[keep], refine=False, holdout=False)
        return rf.cell_T_base, rf.flange_T_target

    ho = _holdout(model, fit, False, True, fit_subset, 23, ws, True, lin.rms_translation_m)
    assert ho.method == "k-fold refit" and ho.folds == MAX_FOLDS and len(calls) == MAX_FOLDS
    for f in (0, 4):
        m = kfold_indices(23, MAX_FOLDS, f, ws)
        held = np.ones(23, bool)
        held[ws.kidx[:m]] = False
        rf = calibrate_base_frame(G[~held], M[~held], refine=False, holdout=False)
        t, a = closure(M[held], G[held], rf.cell_T_base, rf.flange_T_target)
        assert np.allclose(ho.translation_m[held], t, rtol=1e-9, atol=1e-12)
        assert np.allclose(ho.rotation_rad[held], a, rtol=1e-9, atol=1e-12)


def test_statistics_are_numpys_percentiles_and_the_max():
    sc = base_frame_scene(31, np.random.default_rng(23), noise_mm=0.2, noise_deg=0.1)
    r = calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=Workspace(40))
    ho = r.holdout
    t, a = np.array(ho.translation_m), np.array(ho.rotation_rad)
    assert ho.p50_translation_m == pytest.approx(np.percentile(t, 50), rel=1e-12)
    assert ho.p90_translation_m == pytest.approx(np.percentile(t, 90), rel=1e-12)
    assert ho.max_translation_m == t.max()
    assert ho.p50_rotation_rad == pytest.approx(np.percentile(a, 50), rel=1e-12)
    assert ho.p90_rotation_rad == pytest.approx(np.percentile(a, 90), rel=1e-12)
    assert ho.max_rotation_rad == a.max()
    assert ho.p50_translation_m <= ho.p90_translation_m <= ho.max_translation_m
    # Read-only views into the caller's workspace, like the residuals.
    with pytest.raises(ValueError):
        ho.translation_m[0] = 0.0
    # Inflation of the order sqrt(n_obs / dof) for a sound fit.
    assert 1.0 < ho.inflation < 1.6


def test_percentile_helper_handles_infinities():
    x = np.array([0.1, 0.2, 0.3, np.inf])
    assert _percentile_sorted(x, 0.5) == pytest.approx(0.25)
    assert _percentile_sorted(x, 0.9) == math.inf
    assert _percentile_sorted(np.array([2.0]), 0.9) == 2.0


def test_an_outlier_station_stands_out_held_out_more_than_in_sample():
    sc = base_frame_scene(20, np.random.default_rng(24), noise_mm=0.05, noise_deg=0.02)
    M = sc.measured.copy()
    M[7] = M[7] @ se3_exp(np.r_[2e-3, 0.0, -1e-3, 0.0, 0.0, 0.0])
    kw = dict(noise_translation_m=0.05e-3, noise_rotation_rad=math.radians(0.02))
    r = calibrate_base_frame(sc.base_T_flange, M, **kw)
    assert int(np.argmax(r.holdout.translation_m)) == 7
    assert r.holdout.translation_m[7] > 1.05 * r.residuals.translation_m[7]
    assert r.holdout.max_translation_m > 5 * r.holdout.p50_translation_m
    # Against the given noise the blunder is not noise: the residual test says so (and the
    # covariance is widened for it, so the linear/refined distance in sigmas is no longer
    # the measure of the blunder), while the clean stations pass.
    clean = calibrate_base_frame(sc.base_T_flange, sc.measured, **kw)
    assert "model_error" in {w.code for w in r.warnings}
    assert "model_error" not in {w.code for w in clean.warnings}
    assert r.residual_tests.chi2_p < 1e-6 < clean.residual_tests.chi2_p


def test_holdout_can_be_disabled_and_needs_four_stations():
    sc = base_frame_scene(6, np.random.default_rng(25), noise_mm=0.1, noise_deg=0.05)
    assert calibrate_base_frame(sc.base_T_flange, sc.measured, holdout=False).holdout is None
    assert calibrate_base_frame(sc.base_T_flange[:3], sc.measured[:3]).holdout is None
    assert isinstance(calibrate_base_frame(sc.base_T_flange[:4], sc.measured[:4]).holdout, HoldoutClosure)


def test_a_station_nothing_else_vouches_for_gets_an_unbounded_closure():
    # 4 stations, one of which alone supplies the second rotation axis: without it the rest
    # rotate about one axis, so its leave-one-out closure is undetermined (infinite, or
    # with noise far beyond the others).
    from cellcal.solver.se3 import make_transform, so3_exp

    X = make_transform(so3_exp([0.2, 0.1, -0.3]), [2.0, 0.1, 0.2])
    Y = make_transform(so3_exp([0.1, 0.0, 0.2]), [0.01, 0.02, 0.1])
    G = np.array([make_transform(so3_exp([0, 0, a]), [0.5, 0.1 * k, 0.3]) for k, a in enumerate((0.0, 0.7, 1.5))]
                 + [make_transform(so3_exp([0.9, 0, 0]), [0.4, 0.0, 0.5])])
    rng = np.random.default_rng(0)
    M = np.array([X @ g @ Y @ se3_exp(rng.normal(scale=1e-5, size=6)) for g in G])
    lin = calibrate_base_frame(G, M, refine=False)
    # The linear answer's update, like the refined one's: noise keeps the leverage just
    # below 1, so the closure is finite but beyond anything the other stations show.
    assert lin.holdout.translation_m[3] > 100 * lin.holdout.p50_translation_m
    assert np.all(np.isfinite(lin.holdout.translation_m[:3]))
    assert lin.holdout.translation_m[3] > 1e3 * max(lin.holdout.translation_m[:3])
    ref = calibrate_base_frame(G, M)
    assert ref.holdout.translation_m[3] > 100 * ref.holdout.p50_translation_m
    # Noise-free, that station's leverage is 1 to rounding: reported as infinite.
    exact = calibrate_base_frame(G, np.array([X @ g @ Y for g in G]))
    assert math.isinf(exact.holdout.translation_m[3])


def test_every_problem_reports_holdout():
    rng = np.random.default_rng(26)
    sc = hand_eye_scene(12, rng, noise_mm=0.1, noise_deg=0.05)
    he = calibrate_hand_eye(sc.base_T_flange, sc.measured)
    assert he.holdout.folds == 12 and he.holdout.p90_translation_m > 0
    Xc = se3_inverse(sc.Y)  # any fixed camera pose
    O = np.array([se3_inverse(Xc) @ g @ sc.X for g in sc.base_T_flange])
    e2h = calibrate_eye_to_hand(sc.base_T_flange, O)
    assert e2h.holdout is not None
    G, _, _ = pivot_scene(12, rng, noise_mm=0.05)
    tp = calibrate_tool_point(G)
    assert tp.holdout.method.startswith("leave-one-out (exact")
    # Exact LOO of the pivot: compare with a refit.
    ri = calibrate_tool_point(G[1:], holdout=False)
    d = G[0, :3, :3] @ ri.flange_p_tip + G[0, :3, 3] - ri.base_p_pivot
    assert tp.holdout.translation_m[0] == pytest.approx(np.linalg.norm(d), rel=1e-9)
    bs = base_frame_scene(12, rng)
    p = (bs.X @ bs.base_T_flange @ np.array([0.0, 0.0, 0.1, 1.0]))[:, :3] + rng.normal(scale=3e-5, size=(12, 3))
    pt = calibrate_base_frame_points(bs.base_T_flange, p)
    assert pt.holdout.p50_translation_m > 0 and np.all(pt.holdout.rotation_rad == 0)


def test_singular_leave_one_out_systems_give_infinite_closure_not_an_error():
    from cellcal.solver.validation import LOO_CHUNK, _chunked_solve

    n, r = LOO_CHUNK + 5, 6
    ws = Workspace(n)
    rng = np.random.default_rng(27)
    S = np.empty((n, r, r))
    for i in range(n):
        Q, _ = np.linalg.qr(rng.normal(size=(r, r)))
        lev = rng.uniform(0.0, 0.6, r)
        if i == 3:
            lev[2] = 1.0  # station 3 alone determines one direction
        S[i] = np.eye(r) - Q @ np.diag(lev) @ Q.T
    e = rng.normal(size=(n, r))
    expect = np.array([np.linalg.solve(S[i], e[i]) if i != 3 else np.full(r, np.nan) for i in range(n)])
    out = np.empty((n, r))
    with np.errstate(all="ignore"):
        _chunked_solve(S.copy(), e, out, n, r, ws)
    ok = np.arange(n) != 3
    assert np.allclose(out[ok], expect[ok], rtol=1e-9, atol=1e-9)
    # Exactly singular in exact arithmetic: LAPACK may or may not notice, but the solution
    # is amplified far beyond any real leverage (1 / (1 - 0.6) here), which the closure
    # reports as infinite.
    amp = np.linalg.norm(out, axis=1) / np.linalg.norm(e, axis=1)
    assert amp[3] > 1e8 and np.all(amp[ok] < 1 / (1 - 0.6) + 1e-9)
