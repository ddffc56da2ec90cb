"""The leave-one-out closure's batched elimination against the LAPACK route it replaced.

``validation.loo_linearised`` solves ``(I - P_i) b_i = e_i`` per station. Up to
``LOO_BATCHED_MIN`` stations it still goes through ``_chunked_solve`` (LAPACK); from there
on through ``_ldl_solve`` (one batched LDL^T elimination). The reference here is the old
route, copied as it was (``_ref_*`` below: chunked ``np.linalg.solve`` with the elimination
fallback, and the closure's pre- and post-processing around it), so the comparison does not
move with the module.

The inputs are the solver's own: a seeded scene of ``cellcal.solver.synthetic`` is solved
with a workspace, which then holds the whitened (Huber-weighted) Jacobian, the whitened
residual and the whitening at the answer; both closures are evaluated from those with
``H^-1`` of that Jacobian. Regular stations agree to 1e-12 relative (below the threshold
bit for bit); a station made to carry almost all of some direction (leverage ~1) to
``64 eps cond(I - P_i)``; an exactly singular one (alone in a parameter) is infinite in both.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _alloc import peak_bytes

from cellcal.solver import Workspace, calibrate_base_frame, calibrate_base_frame_points
from cellcal.solver import validation as V
from cellcal.solver.refine_models import PointModel, PoseModel
from cellcal.solver.synthetic import base_frame_scene

EPS = np.finfo(np.float64).eps
REL = 1e-12

# --- reference: the route before the batched elimination, copied ----------------------------

_REF_CHUNK = 32
_BELOW = {r: [np.diag([0.0] * (j + 1) + [1.0] * (r - j - 1)) for j in range(r)] for r in (3, 6)}


def _ref_batched_solve(S, b, n, r, ws):
    f = ws.f6[: n * r].reshape(n, r)
    T = ws.T36[: n * r * r].reshape(n, r, r)
    tb = ws.tb6[: n * r].reshape(n, r)
    rp = ws.rs[0, :n]
    col = ws.b6b[: n * r].reshape(n, r)
    for j in range(r - 1):
        np.divide(1.0, S[:, j, j], out=rp)
        np.matmul(_BELOW[r][j], S[:, :, j : j + 1], out=col[:, :, None])
        np.matmul(col[:, :, None], rp[:, None, None], out=f[:, :, None])
        np.matmul(f[:, :, None], S[:, j : j + 1, :], out=T)
        np.subtract(S, T, out=S)
        np.matmul(f[:, :, None], b[:, j, None, None], out=tb[:, :, None])
        np.subtract(b, tb, out=b)
    s = ws.rs[1, :n]
    for j in range(r - 1, -1, -1):
        if j < r - 1:
            np.matmul(S[:, j : j + 1, j + 1 :], b[:, j + 1 :, None], out=s[:, None, None])
            np.subtract(b[:, j], s, out=b[:, j])
        np.divide(b[:, j], S[:, j, j], out=b[:, j])


def _ref_chunked_solve(S, e, out, n, r, ws):
    for a in range(0, n, _REF_CHUNK):
        b = min(n, a + _REF_CHUNK)
        try:
            x = np.linalg.solve(S[a:b], e[a:b, :, None])
            np.copyto(out[a:b], x[:, :, 0])
        except np.linalg.LinAlgError:
            np.copyto(out[a:b], e[a:b])
            _ref_batched_solve(S[a:b], out[a:b], b - a, r, ws)


def _ref_loo(Jw, ew, Hinv, Winv=None, wsig=None):
    """The old ``loo_linearised`` (operation for operation) on plain arrays in a workspace of
    its own: (translation, rotation) closure per station, and the systems ``I - P_i``."""
    n, r, p = Jw.shape
    ws = Workspace(n)
    K = ws.KJ[: n * r * p].reshape(n, r, p)
    np.matmul(Jw, Hinv, out=K)
    S = ws.L36[: n * r * r].reshape(n, r, r)
    np.matmul(K, Jw.transpose(0, 2, 1), out=S)
    np.negative(S, out=S)
    for i in range(r):
        np.add(S[:, i, i], 1.0, out=S[:, i, i])
    S_out = S.copy()
    b = ws.b6[: n * r].reshape(n, r)
    amp = ws.rs[2, :n]
    ne = ws.rs[3, :n]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _ref_chunked_solve(S, ew, b, n, r, ws)
        np.matmul(b[:, None, :], b[:, :, None], out=amp[:, None, None])
        np.matmul(ew[:, None, :], ew[:, :, None], out=ne[:, None, None])
        np.add(ne, 1e-300, out=ne)
        np.divide(amp, ne, out=amp)
        if Winv is not None:
            tb = ws.tb6[: n * r].reshape(n, r)
            np.matmul(Winv, b[:, :, None], out=tb[:, :, None])
            np.copyto(b, tb)
        else:
            np.divide(b, wsig, out=b)
    ht, hr = ws.ho_t[:n], ws.ho_r[:n]
    np.matmul(b[:, None, :3], b[:, :3, None], out=ht[:, None, None])
    np.sqrt(ht, out=ht)
    if r == 6:
        np.matmul(b[:, None, 3:], b[:, 3:, None], out=hr[:, None, None])
        np.sqrt(hr, out=hr)
    else:
        hr.fill(0.0)
    for a in (ht, hr):
        a[np.isnan(a)] = np.inf
        a[amp > 1e16] = np.inf
    return ht.copy(), hr.copy(), S_out


# --- the corpus -------------------------------------------------------------------------------


def _station_cov(n, rng):
    """Full, correlated per-station pose covariances (translation ~20 um, rotation ~0.1 mrad)."""
    sig = np.array([2e-5] * 3 + [1e-4] * 3)
    Q, _ = np.linalg.qr(rng.normal(size=(n, 6, 6)))
    lam = rng.uniform(0.3, 2.0, size=(n, 6))
    C = np.einsum("nij,nj,nkj->nik", Q, lam, Q) * np.outer(sig, sig)
    return 0.5 * (C + C.transpose(0, 2, 1))


def _with_outliers(M, rng, k):
    M = M.copy()
    for i in rng.choice(M.shape[0], size=k, replace=False):
        M[i, :3, 3] += rng.normal(scale=3e-3, size=3)  # millimetres off: Huber down-weights them
    return M


def _solve(kind, n, seed):
    """Solve a seeded scene with a workspace; returns (model over that workspace, ws, result)."""
    rng = np.random.default_rng(seed)
    sc = base_frame_scene(n, rng, noise_mm=0.02, noise_deg=0.01)
    ws = Workspace(n)
    M = _with_outliers(sc.measured, rng, max(1, n // 25))
    if kind == "pose":
        res = calibrate_base_frame(sc.base_T_flange, M, cell_T_target_cov=_station_cov(n, rng), huber=3.0,
                                   workspace=ws)
        model = PoseModel(M, sc.base_T_flange, n, ws)
        model.whitening_full = True  # what refine.prepare_noise sets for a full covariance
    else:
        p = M[:, :3, 3]
        res = calibrate_base_frame_points(sc.base_T_flange, p, huber=3.4, workspace=ws)
        model = PointModel(p, sc.base_T_flange, n, ws)
        model.whitening_full = False
    return model, ws, res


def _inputs(model, n, ws):
    Jw, ew, _ = model.views()
    Jw, ew = Jw.copy(), ew.copy()
    r = model.rows
    H = np.einsum("nij,nik->jk", Jw, Jw)
    Hinv = np.linalg.inv(H)
    Winv = ws.Winv[: n * r * r].reshape(n, r, r).copy() if model.whitening_full else None
    wsig = ws.wsig[: n * r].reshape(n, r).copy()
    return Jw, ew, Hinv, Winv, wsig


def _new(model, n, ws, Jw, ew, Hinv):
    """The module's closure from (Jw, ew) written into the model's workspace views."""
    J, e, _ = model.views()
    np.copyto(J, Jw)
    np.copyto(e, ew)
    V.loo_linearised(model, n, ws, Hinv)
    return ws.ho_t[:n].copy(), ws.ho_r[:n].copy()


def _cond(S):
    with np.errstate(all="ignore"):
        return np.linalg.cond(S)


CASES = [(kind, n) for kind in ("pose", "point") for n in (5, 12, 40, 127, 128, 300, 1000, 2000)]


@pytest.mark.parametrize(("kind", "n"), CASES)
def test_closure_matches_the_lapack_route(kind, n):
    model, ws, res = _solve(kind, n, seed=1000 + n)
    if kind == "pose":
        assert res.downweighted.size > 0  # the Huber weights are in play
    Jw, ew, Hinv, Winv, wsig = _inputs(model, n, ws)
    ref_t, ref_r, _ = _ref_loo(Jw, ew, Hinv, Winv, wsig)
    new_t, new_r = _new(model, n, ws, Jw, ew, Hinv)
    assert np.all(np.isfinite(ref_t)) and np.all(ref_t > 0)
    if n < V.LOO_BATCHED_MIN:
        # Below the threshold the route is LAPACK's, unchanged: bit for bit.
        assert np.array_equal(new_t, ref_t) and np.array_equal(new_r, ref_r)
    else:
        np.testing.assert_allclose(new_t, ref_t, rtol=REL, atol=0)
        np.testing.assert_allclose(new_r, ref_r, rtol=REL, atol=0)
    # The elimination itself at every N (below the threshold it is not what the solver uses).
    r = model.rows
    S = np.eye(r) - (Jw @ Hinv) @ Jw.transpose(0, 2, 1)
    S0 = S.copy()
    x_ref = np.empty((n, r))
    _ref_chunked_solve(S.copy(), ew, x_ref, n, r, Workspace(n))
    x_new = np.empty((n, r))
    V._ldl_solve(S, ew, x_new, n, r, ws)
    assert np.array_equal(S, S0)  # only read
    scale = np.linalg.norm(x_ref, axis=1, keepdims=True)
    assert np.all(np.abs(x_new - x_ref) <= REL * scale)


def _dominant_station(Jw, k, factor):
    """Station k's sensitivity to parameter 0 scaled up: it carries that direction almost alone
    (one eigenvalue of ``I - P_k`` near 0, the others not: ``cond(I - P_k)`` large)."""
    Jw = Jw.copy()
    Jw[k, :, 0] *= factor
    return Jw


@pytest.mark.parametrize(("kind", "n"), [("pose", 300), ("pose", 1000), ("point", 300), ("point", 2000)])
def test_near_leverage_one_station_agrees_to_its_condition(kind, n):
    model, ws, _ = _solve(kind, n, seed=7 * n)
    Jw, ew, _, Winv, wsig = _inputs(model, n, ws)
    k = n // 3
    for factor in (1e3, 1e4, 1e5, 1e7):  # 1e7: leverage 1 to rounding, infinite in both
        J = _dominant_station(Jw, k, factor)
        Hinv = np.linalg.inv(np.einsum("nij,nik->jk", J, J))
        ref_t, ref_r, S = _ref_loo(J, ew, Hinv, Winv, wsig)
        new_t, new_r = _new(model, n, ws, J, ew, Hinv)
        cond = _cond(S)
        assert cond[k] > 1e3 > 10 * np.median(cond)  # the station really is near leverage 1
        bound = np.maximum(REL, 64 * EPS * cond)
        for new, ref in ((new_t, ref_t), (new_r, ref_r)):
            fin = np.isfinite(ref)
            assert np.array_equal(fin, np.isfinite(new))
            assert np.all(np.abs(new[fin] - ref[fin]) <= bound[fin] * ref[fin])


@pytest.mark.parametrize(("kind", "n"), [("pose", 12), ("pose", 500), ("point", 40), ("point", 500)])
def test_station_alone_in_a_parameter_is_infinite_in_both(kind, n):
    model, ws, _ = _solve(kind, n, seed=11 * n)
    Jw, ew, _, Winv, wsig = _inputs(model, n, ws)
    k, c = 2, Jw.shape[2] - 1
    J = Jw.copy()
    keep = J[k, :, c].copy()
    J[:, :, c] = 0.0
    J[k, :, c] = keep  # only station k sees parameter c: its leverage is exactly 1 there
    Hinv = np.linalg.inv(np.einsum("nij,nik->jk", J, J))
    ref_t, ref_r, _ = _ref_loo(J, ew, Hinv, Winv, wsig)
    new_t, new_r = _new(model, n, ws, J, ew, Hinv)
    assert math.isinf(ref_t[k]) and math.isinf(new_t[k])
    if kind == "pose":
        assert math.isinf(ref_r[k]) and math.isinf(new_r[k])
    others = np.arange(n) != k
    assert np.all(np.isfinite(new_t[others]))
    np.testing.assert_allclose(new_t[others], ref_t[others], rtol=1e-9 if n >= V.LOO_BATCHED_MIN else 0)


def test_nonpositive_pivot_is_infinite_and_leaves_the_others_alone():
    n, r = 300, 6
    rng = np.random.default_rng(3)
    Q, _ = np.linalg.qr(rng.normal(size=(n, r, r)))
    lev = rng.uniform(0.0, 0.6, size=(n, r))
    S = np.eye(r) - np.einsum("nij,nj,nkj->nik", Q, lev, Q)
    S[5] = 0.0  # a zero first pivot
    S[9, 2, 2] = -1.0  # indefinite
    e = rng.normal(size=(n, r))
    out = np.empty((n, r))
    with np.errstate(all="ignore"):
        V._ldl_solve(S, e, out, n, r, Workspace(n))
    assert np.all(np.isinf(out[5])) and np.all(np.isinf(out[9]))
    ok = np.ones(n, bool)
    ok[[5, 9]] = False
    expect = np.linalg.solve(S[ok], e[ok, :, None])[:, :, 0]
    assert np.all(np.abs(out[ok] - expect) <= REL * np.linalg.norm(expect, axis=1, keepdims=True))


@pytest.mark.parametrize("r", [3, 6])
def test_batched_elimination_allocates_nothing_that_grows_with_n(r):
    # n = 1,000 is where numpy's ufunc buffers (of up to 8,192 elements) would show.
    peaks = {}
    for n in (200, 1000, 3000):
        rng = np.random.default_rng(n)
        ws = Workspace(n)
        S = ws.L36[: n * r * r].reshape(n, r, r)
        S[:] = np.eye(r) + 0.01 * rng.normal(size=(n, r, r))
        e = ws.ew[: n * r].reshape(n, r)
        e[:] = rng.normal(size=(n, r))
        out = ws.b6[: n * r].reshape(n, r)
        peaks[n] = peak_bytes(lambda S=S, e=e, out=out, n=n, ws=ws: V._ldl_solve(S, e, out, n, r, ws))
    assert max(peaks.values()) < 8 * 1024, peaks


def test_public_holdout_at_n1000_equals_the_reference():
    n = 1000
    sc = base_frame_scene(n, np.random.default_rng(2026), noise_mm=0.02, noise_deg=0.01)
    ws = Workspace(n)
    res = calibrate_base_frame(sc.base_T_flange, sc.measured, workspace=ws)
    assert res.holdout is not None and res.holdout.method == "linearised leave-one-out"
    # The workspace still holds the answer's whitened Jacobian, residual and whitening.
    model = PoseModel(sc.measured, sc.base_T_flange, n, ws)
    Jw, ew, _ = model.views()
    Hinv = np.linalg.inv(np.einsum("nij,nik->jk", Jw, Jw))
    ref_t, ref_r, _ = _ref_loo(Jw.copy(), ew.copy(), Hinv, None, ws.wsig[: n * 6].reshape(n, 6).copy())
    ho = res.holdout
    np.testing.assert_allclose(ho.translation_m, ref_t, rtol=REL, atol=0)
    np.testing.assert_allclose(ho.rotation_rad, ref_r, rtol=REL, atol=0)
    st = np.sort(ref_t)
    assert ho.p50_translation_m == pytest.approx(float(np.percentile(st, 50)), rel=REL)
    assert ho.p90_translation_m == pytest.approx(float(np.percentile(st, 90)), rel=REL)
    assert ho.max_translation_m == pytest.approx(float(st[-1]), rel=REL)
