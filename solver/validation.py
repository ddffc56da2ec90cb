"""Held-out station closure and linear/refined agreement (ADR 0004).

Every result reports how well the fitted model predicts stations that were *not* used to
fit it, as P50 / P90 / max of the translation and rotation closure. Two ways, by estimator:

* **Refined (maximum-likelihood) fits: linearised leave-one-out** through the block hat
  matrix. For weighted least squares with whitened Jacobian ``J`` (station blocks ``J_i``),
  ``H = J^T J`` and residual ``e_i``, deleting station i moves the estimate by
  ``-H^-1 J_i^T (I - P_i)^-1 e_i`` with ``P_i = J_i H^-1 J_i^T``, so the residual of
  station i under the fit without it is exactly ``(I - P_i)^-1 e_i`` (Sherman-Morrison-
  Woodbury). For the non-linear model it is the first Gauss-Newton step of the refit from
  the full solution: exact to first order, its error is second order in the residuals
  (micrometres at tracker noise; the tests compare it with true refits). Cost: one batch
  of N small (6x6) solves, O(N) and allocation-free, instead of N refits (O(N^2)).
* **Linear answers** (``refine=False``): the same update at the linear answer, with the
  Jacobian and residual of the measurement model there (the covariance the result
  reports is evaluated at that point anyway): the closure of the station against the
  linear answer moved by what deleting the station changes in the model's least-squares
  fit. The linear solve is not that fit, so this is no longer exact to first order (it
  leaves out the full-data Gauss-Newton step, common to every station); against true
  leave-one-out refits of the linear solve it agrees to tens of percent per station and
  to about 10 % in P50 (``tests/test_holdout.py``), for one batch of small solves
  instead of k linear solves. Only where the information matrix at the linear answer is
  singular do **k-fold refits** of the linear solve remain, ``k = min(N, 10)``
  interleaved folds (station i in fold ``i mod k``; leave-one-out when N <= 10).

A station whose removal leaves the rest unable to determine the fit (leverage 1, or a fold
whose remainder is degenerate) gets an infinite closure: no other station vouches for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver.se3 import rotation_angle, se3_log
from cellcal.solver.workspace import Workspace

__all__ = ["HoldoutClosure", "Agreement", "MIN_HOLDOUT_STATIONS", "MAX_FOLDS", "agreement"]

#: Holding a station out of a 3-station fit leaves 2: nothing to fit. From 4 stations on.
MIN_HOLDOUT_STATIONS = 4
#: Folds of the k-fold refit for linear answers.
MAX_FOLDS = 10


@dataclass(frozen=True, kw_only=True)
class HoldoutClosure:
    """Closure of each station against the model fitted *without* it.

    Attributes
    ----------
    method : str
        ``"linearised leave-one-out"`` (refined and linear answers), ``"k-fold refit"``
        (a linear answer whose information matrix is singular).
    folds : int
        Number of folds (N for leave-one-out).
    translation_m : numpy.ndarray, shape (N,)
        Held-out translation closure per station, metres (``inf``: not determinable
        without that station).
    rotation_rad : numpy.ndarray, shape (N,)
        Held-out rotation closure per station, radians (zeros for point problems).
    p50_translation_m, p90_translation_m, max_translation_m : float
        Median, 90th percentile (linear interpolation) and worst translation closure, m.
    p50_rotation_rad, p90_rotation_rad, max_rotation_rad : float
        The same for rotation, radians.
    inflation : float
        RMS held-out translation closure over RMS in-sample closure. Near 1 (about
        ``sqrt(n_obs / dof)``) for a sound fit; much larger means the fit leans on single
        stations (over-fitting, outliers, an unmodelled error).

    Notes
    -----
    With a ``workspace`` the per-station arrays are read-only views into it, valid until
    its next solve, like ``residuals``.
    """

    method: str
    folds: int
    translation_m: np.ndarray
    rotation_rad: np.ndarray
    p50_translation_m: float
    p90_translation_m: float
    max_translation_m: float
    p50_rotation_rad: float
    p90_rotation_rad: float
    max_rotation_rad: float
    inflation: float


@dataclass(frozen=True, kw_only=True)
class Agreement:
    """How far the linear answer lies from the refined one (validation ladder level 3).

    Attributes
    ----------
    translation_m : float
        ``|t_linear - t_refined|`` of the primary transform, metres.
    rotation_rad : float
        Angle of ``R_refined^T R_linear``, radians.
    sigmas : float
        Mahalanobis length of ``log(X_refined^-1 X_linear)`` under the refined covariance.
        The linear estimate is noisier than the refined one, so a few sigmas are normal;
        tens or more mean the two disagree beyond noise (outliers, a model error, a
        near-degenerate motion set).
    """

    translation_m: float
    rotation_rad: float
    sigmas: float


def agreement(X_lin: np.ndarray, X_ref: np.ndarray, cov6: np.ndarray) -> Agreement:
    """:class:`Agreement` of two estimates of one transform under ``cov6`` (right, (rho, phi))."""
    dt = float(np.linalg.norm(X_lin[:3, 3] - X_ref[:3, 3]))
    dr = rotation_angle(X_ref[:3, :3].T @ X_lin[:3, :3])
    Rt = X_ref[:3, :3].T
    rel = np.eye(4)
    rel[:3, :3] = Rt @ X_lin[:3, :3]
    rel[:3, 3] = Rt @ (X_lin[:3, 3] - X_ref[:3, 3])
    xi = se3_log(rel)
    try:
        m2 = float(xi @ np.linalg.solve(cov6, xi))
        sig = math.sqrt(max(m2, 0.0)) if math.isfinite(m2) else math.inf
    except np.linalg.LinAlgError:
        sig = math.inf
    return Agreement(translation_m=dt, rotation_rad=dr, sigmas=sig)


# --- kernels --------------------------------------------------------------------------------------

#: ``diag(0, ..., 0, 1, ..., 1)`` selecting the rows below pivot j.
_BELOW = {r: [np.diag([0.0] * (j + 1) + [1.0] * (r - j - 1)) for j in range(r)] for r in (3, 6)}


def batched_solve(S: np.ndarray, b: np.ndarray, n: int, r: int, ws: Workspace) -> None:
    """Solve ``S_i x_i = b_i`` for N small systems (n, r, r), in place in ``b`` (n, r).

    Gaussian elimination without pivoting, vectorised over the stations: the systems here
    are ``I - P_i`` (symmetric positive definite, eigenvalues in (0, 1]), for which no
    pivoting is needed. Every update runs on whole contiguous blocks (binary ufuncs on
    strided views would buffer); ``S`` is overwritten. A singular system (leverage 1)
    yields inf/nan in its row of ``b``.
    """
    f = ws.f6[: n * r].reshape(n, r)
    T = ws.T36[: n * r * r].reshape(n, r, r)
    tb = ws.tb6[: n * r].reshape(n, r)
    rp = ws.rs[0, :n]
    col = ws.b6b[: n * r].reshape(n, r)
    for j in range(r - 1):
        np.divide(1.0, S[:, j, j], out=rp)
        # Multipliers below the pivot; matmul, not a broadcasting ufunc (those buffer).
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


def loo_linearised(model, n: int, ws: Workspace, Hinv: np.ndarray) -> None:
    """Linearised leave-one-out closure of a fitted model into ``ws.ho_t`` / ``ws.ho_r``.

    Needs the model's whitened, weighted Jacobian in ``ws.Jw`` and whitened residual in
    ``ws.ew`` at the fit (as :func:`cellcal.solver.refine.refine` leaves them). With Huber
    weights ``w_i`` the held-out residual is ``(I - w_i P_i)^-1 e_i`` with the unweighted
    ``e_i``: the station's own weight leaves with it.
    """
    r, p = model.rows, model.nparam
    Jw, ew, _ = model.views()
    K = ws.KJ[: n * r * p].reshape(n, r, p)
    np.matmul(Jw, Hinv, out=K)
    S = ws.L36[: n * r * r].reshape(n, r, r)
    np.matmul(K, Jw.transpose(0, 2, 1), out=S)
    np.negative(S, out=S)
    with np.errstate():
        # I - P: the r diagonals of every station in one step, on their strided (n, r) view
        # (the small buffer size keeps numpy from copying it through buffers).
        np.setbufsize(_LDL_BUFSIZE)
        d = S.reshape(n, r * r)[:, :: r + 1]
        np.add(d, 1.0, out=d)
    b = ws.b6[: n * r].reshape(n, r)
    amp = ws.rs[2, :n]
    ne = ws.rs[3, :n]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _loo_solve(S, ew, b, n, r, ws)
        # |(I - P)^-1 e| / |e| <= 1 / (1 - leverage): beyond 1e8 the station's leverage is 1
        # to rounding (nothing else determines some direction), reported as infinite.
        np.matmul(b[:, None, :], b[:, :, None], out=amp[:, None, None])
        np.matmul(ew[:, None, :], ew[:, :, None], out=ne[:, None, None])
        np.add(ne, 1e-300, out=ne)
        np.divide(amp, ne, out=amp)
        if getattr(model, "whitening_full", False):
            # Full per-station covariances: back through W_i^-1 (refine.prepare_noise).
            tb = ws.tb6[: n * r].reshape(n, r)
            np.matmul(ws.Winv[: n * r * r].reshape(n, r, r), b[:, :, None], out=tb[:, :, None])
            np.copyto(b, tb)
        else:
            np.divide(b, ws.wsig[: n * r].reshape(n, r), out=b)  # back to metres / radians
    ht, hr = ws.ho_t[:n], ws.ho_r[:n]
    np.matmul(b[:, None, :3], b[:, :3, None], out=ht[:, None, None])
    np.sqrt(ht, out=ht)
    if r == 6:
        np.matmul(b[:, None, 3:], b[:, 3:, None], out=hr[:, None, None])
        np.sqrt(hr, out=hr)
    else:
        hr.fill(0.0)
    # NaN (a singular system LAPACK or the elimination ran through) and amplification beyond
    # 1e8 are infinite: one mask of both per closure array.
    singular, m = ws.ball[:n], ws.ball2[:n]
    np.greater(amp, 1e16, out=singular)
    for a in (ht, hr):
        np.isnan(a, out=m)
        np.logical_or(m, singular, out=m)
        if m.any():
            np.copyto(a, np.inf, where=m)


#: Stations per LAPACK call in the leave-one-out solves: ``np.linalg.solve`` allocates its
#: output and per-call scratch, so it runs on fixed-size chunks (bounded scratch, ~2 KiB,
#: whatever N is) and the result is copied into the workspace.
LOO_CHUNK = 32


def _chunked_solve(S: np.ndarray, e: np.ndarray, out: np.ndarray, n: int, r: int, ws: Workspace) -> None:
    """``out_i = S_i^-1 e_i`` for the (n, r, r) systems ``I - P_i``.

    LAPACK in fixed chunks; a chunk holding an exactly singular system (leverage 1: the
    station is the only one determining some direction) falls back to the in-place
    elimination of :func:`batched_solve`, which leaves inf/nan there (reported as inf).
    """
    for a in range(0, n, LOO_CHUNK):
        b = min(n, a + LOO_CHUNK)
        try:
            x = np.linalg.solve(S[a:b], e[a:b, :, None])
            np.copyto(out[a:b], x[:, :, 0])
        except np.linalg.LinAlgError:
            np.copyto(out[a:b], e[a:b])
            batched_solve(S[a:b], out[a:b], b - a, r, ws)  # scratch from the start of ws buffers


#: From this many stations on the leave-one-out systems are solved by :func:`_ldl_solve` (one
#: batched elimination over all of them), below it by :func:`_chunked_solve` (LAPACK), so that
#: small fits keep their results bit for bit. The elimination is about 40 vectorised steps
#: whatever N is, LAPACK one call per LOO_CHUNK stations: measured interleaved with
#: ``bench/loo_bench.py`` (2 cores under load) they break even near 115 stations for poses
#: (r = 6; 0.12 ms each) and near 85 for points (r = 3); at 1,000 the elimination is 4-15x
#: faster.
LOO_BATCHED_MIN = 128

#: A pivot of ``I - P_i`` at or below this is zero to rounding: the eigenvalues are
#: ``1 - leverage`` in [0, 1] and forming ``I - P_i`` from ``P_i`` (norm <= 1) costs a few
#: eps, so such a station alone determines some direction (leverage 1).
_PIVOT_FLOOR = 64 * np.finfo(np.float64).eps


#: ufunc buffer size (elements) inside :func:`_ldl_solve`: well below LOO_BATCHED_MIN, so that
#: the elimination's (n,)-long rows are never copied through buffers.
_LDL_BUFSIZE = 16


def _loo_solve(S: np.ndarray, e: np.ndarray, out: np.ndarray, n: int, r: int, ws: Workspace) -> None:
    """``out_i = S_i^-1 e_i`` for the (n, r, r) systems ``I - P_i``: LAPACK below
    :data:`LOO_BATCHED_MIN` stations (``S`` overwritten), the batched elimination from there."""
    if n < LOO_BATCHED_MIN:
        _chunked_solve(S, e, out, n, r, ws)
    else:
        _ldl_solve(S, e, out, n, r, ws)


def _ldl_solve(S: np.ndarray, e: np.ndarray, out: np.ndarray, n: int, r: int, ws: Workspace) -> None:
    """``out_i = S_i^-1 e_i`` by one batched LDL^T elimination over all n stations.

    ``S_i = I - P_i`` is symmetric positive definite unless the station's leverage is 1, so
    elimination without pivoting is stable (the pivots are Schur complements, in
    [lambda_min, 1]). ``[S_i | e_i]`` is transposed once into station-last order (``ws.KJ``
    as (r, r + 1, n)), so that every step of the loop over the r pivots is one vectorised
    operation on (n,)-long contiguous rows of all stations at once, and no operand of a
    ufunc overlaps its output other than identically (numpy would copy such an operand: an
    allocation that grows with n); ``ws.T36`` is the product scratch. ``S`` and ``e`` are
    only read. A station with a pivot at or below :data:`_PIVOT_FLOOR` (leverage 1 to
    rounding) gets ``inf`` in its row of ``out`` (reported as an infinite closure); the
    other stations are unaffected. The arithmetic is that of :func:`batched_solve` (Gaussian
    elimination without pivoting, the symmetric half of it), not LAPACK's: results agree
    with :func:`_chunked_solve` to rounding, about ``cond(S_i) * eps`` relative.
    """
    with np.errstate():  # restores the ufunc buffer size on exit (numpy >= 2.0)
        # The steps below run on (m, n) views whose rows are contiguous but not adjacent, or
        # broadcast an (n,) row over m: numpy's iterator then copies the operands through
        # buffers of up to getbufsize() elements whenever n is below about half of that
        # (measured: ~40-120 KiB per call at n = 1,000, none at n = 5,000), where a buffer
        # size below n lets the inner loop run on the rows directly.
        np.setbufsize(_LDL_BUFSIZE)
        _ldl_steps(S, e, out, n, r, ws)


def _ldl_steps(S: np.ndarray, e: np.ndarray, out: np.ndarray, n: int, r: int, ws: Workspace) -> None:
    # [S_i | e_i] station-last, (r, r + 1, n), in ws.KJ (K = Jw H^-1 is spent once S is
    # formed): the trailing update of the augmented column is the forward substitution.
    c = r + 1
    A = ws.KJ[: r * c * n].reshape(r, c, n)
    np.copyto(A[:, :r], S.transpose(1, 2, 0))
    np.copyto(A[:, r], e.T)
    tmp = ws.T36[: (r - 1) * r * n].reshape(r - 1, r, n)
    rp = ws.rs[0, :n]
    pmin = ws.rs[1, :n]
    np.copyto(pmin, A[0, 0])
    for j in range(r - 1):
        # Multipliers l = A[j+1:, j] / pivot into the strict lower triangle; row j keeps its
        # unscaled values (by symmetry column j's) for the trailing update of the rows below.
        np.reciprocal(A[j, j], out=rp)
        lj = A[j + 1 :, j]
        np.multiply(lj, rp, out=lj)
        m = r - j - 1
        t = tmp[:m, : m + 1]
        np.multiply(lj[:, None, :], A[j, None, j + 1 :], out=t)
        trail = A[j + 1 :, j + 1 :]
        np.subtract(trail, t, out=trail)
        np.minimum(pmin, A[j + 1, j + 1], out=pmin)
    # y = z / D (D: the pivots, on the diagonal), then back substitution L^T x = y column by
    # column from the last.
    y = A[:, r]
    np.divide(y, A.reshape(r * c, n)[:: c + 1], out=y)
    ty = tmp[0, :r]
    for j in range(r - 1, 0, -1):
        np.multiply(A[j, :j], y[j], out=ty[:j])
        np.subtract(y[:j], ty[:j], out=y[:j])
    np.copyto(out, y.T)
    bad = ws.ball[:n]
    np.greater(pmin, _PIVOT_FLOOR, out=bad)
    np.logical_not(bad, out=bad)  # NaN pivots (from inf/nan input) count as bad too
    if bad.any():
        np.copyto(out, np.inf, where=bad[:, None])


def _nan_to_inf(a: np.ndarray, n: int, ws: Workspace) -> None:
    m = ws.ball[:n]
    np.isnan(a, out=m)
    if m.any():
        np.copyto(a, np.inf, where=m)


def _percentile_sorted(x: np.ndarray, q: float) -> float:
    """numpy's default ('linear') percentile of an ascending array, inf-safe."""
    n = x.shape[0]
    h = (n - 1) * q
    lo = int(math.floor(h))
    hi = min(lo + 1, n - 1)
    a, b = float(x[lo]), float(x[hi])
    if math.isinf(b) or math.isinf(a):
        return b if h > lo else a
    return a + (h - lo) * (b - a)


def _stats(ht: np.ndarray, hr: np.ndarray, n: int, ws: Workspace) -> tuple[float, ...]:
    """P50, P90 and max of the translation closure, then of the rotation closure.

    Both are sorted in one call as the rows of one stacked (2, n) copy (``ws.rs[4:6]``,
    scratch: the k-fold refit is done with it by now).
    """
    s = ws.rs[4:6, :n]
    np.copyto(s[0], ht)
    np.copyto(s[1], hr)
    s.sort(axis=1)
    st, sr = s[0], s[1]
    return (_percentile_sorted(st, 0.5), _percentile_sorted(st, 0.9), float(st[n - 1]),
            _percentile_sorted(sr, 0.5), _percentile_sorted(sr, 0.9), float(sr[n - 1]))


def closure_from_buffers(
    method: str, folds: int, n: int, ws: Workspace, owned: bool, fit_rms_t: float
) -> HoldoutClosure:
    """Package ``ws.ho_t`` / ``ws.ho_r`` as a :class:`HoldoutClosure`."""
    ht, hr = ws.ho_t[:n], ws.ho_r[:n]
    t50, t90, tmax, r50, r90, rmax = _stats(ht, hr, n, ws)
    rms_ho = math.sqrt(float(np.vdot(ht, ht)) / n) if math.isfinite(tmax) else math.inf
    inflation = rms_ho / fit_rms_t if fit_rms_t > 0.0 else (1.0 if rms_ho == 0.0 else math.inf)
    if owned:
        ht, hr = ht.copy(), hr.copy()  # out of the solve's transient workspace
    else:
        ht, hr = ht.view(), hr.view()
        ht.flags.writeable = False
        hr.flags.writeable = False
    return HoldoutClosure(
        method=method, folds=folds, translation_m=ht, rotation_rad=hr,
        p50_translation_m=t50, p90_translation_m=t90, max_translation_m=tmax,
        p50_rotation_rad=r50, p90_rotation_rad=r90, max_rotation_rad=rmax, inflation=inflation,
    )


def kfold_indices(n: int, k: int, f: int, ws: Workspace) -> int:
    """Training stations of fold ``f`` (those with ``i mod k != f``) into ``ws.kidx``;
    returns their count. Station order is kept."""
    idx = ws.kidx
    pos = 0
    for r in range(k):
        if r == f:
            continue
        src = ws.iota[r:n:k]
        c = src.shape[0]
        idx[pos : pos + c] = src
        pos += c
    # Interleaved residue classes are not in station order; order matters to nobody
    # (the solves are order-independent), but a sorted set is easier to reason about.
    idx[:pos].sort()
    return pos


def kfold_refit(model, fit_subset, n: int, ws: Workspace) -> int:
    """k-fold closure of a linear estimator into ``ws.ho_t`` / ``ws.ho_r``; returns k.

    ``fit_subset(idx, m)`` fits the training stations ``idx`` (m,) and returns the model
    state, or ``None`` if they cannot determine it. ``model`` evaluates the closure of
    every station under that state; the held-out ones are kept.
    """
    k = min(n, MAX_FOLDS)
    rt, rr = ws.rs[4, :n], ws.rs[5, :n]
    for f in range(k):
        m = kfold_indices(n, k, f, ws)
        state = fit_subset(ws.kidx[:m], m)
        if state is None:
            ws.ho_t[f:n:k] = np.inf
            ws.ho_r[f:n:k] = np.inf
            continue
        model.residuals(state)
        model.norms(rt, rr)
        np.copyto(ws.ho_t[f:n:k], rt[f:n:k])
        np.copyto(ws.ho_r[f:n:k], rr[f:n:k])
    return k
