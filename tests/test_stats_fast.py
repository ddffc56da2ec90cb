"""The fast distribution functions and the detectable-size search against their textbook forms.

``cellcal.solver._stats`` replays its quantile bisection from a Newton root and runs its
incomplete gamma / beta loops without ``abs()``; ``model_error.detectable_size`` takes its
cumulants as polynomials of ``sum lam^k``. All of it claims the figures of the plain
implementations kept here (the code before that change), bit for bit where the claim is
exact (quantiles, tails, the detectable size) and to 1e-13 relative everywhere.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellcal.solver import _stats
from cellcal.solver import model_error as me

# --- the reference: the plain implementations (Numerical Recipes 6.2, 6.4) -----------------

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 500


def ref_gamma_q(a: float, x: float) -> float:
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    lead = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = 1.0 / a
        total = term
        ap = a
        for _ in range(_MAX_TERMS):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return max(0.0, 1.0 - total * math.exp(lead))
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < _TINY:
            d = _TINY
        c = b + an / c
        if abs(c) < _TINY:
            c = _TINY
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return min(1.0, math.exp(lead) * h)


def ref_beta_cf(a: float, b: float, x: float) -> float:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    if abs(d) < _TINY:
        d = _TINY
    d = 1.0 / d
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        if abs(d) < _TINY:
            d = _TINY
        c = 1.0 + aa / c
        if abs(c) < _TINY:
            c = _TINY
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        if abs(d) < _TINY:
            d = _TINY
        c = 1.0 + aa / c
        if abs(c) < _TINY:
            c = _TINY
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def ref_beta_reg(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lead = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(lead)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * ref_beta_cf(a, b, x) / a
    return 1.0 - front * ref_beta_cf(b, a, 1.0 - x) / b


def ref_chi2_sf(x: float, k: float) -> float:
    return ref_gamma_q(0.5 * k, 0.5 * x)


def ref_f_sf(f: float, d1: float, d2: float) -> float:
    if f <= 0.0:
        return 1.0
    if math.isinf(f):
        return 0.0
    return ref_beta_reg(0.5 * d2, 0.5 * d1, d2 / (d2 + d1 * f))


def ref_invert_sf(sf, p: float, guess: float) -> float:
    lo, hi = 0.0, max(guess, 1.0)
    while sf(hi) > p:
        lo, hi = hi, 2.0 * hi
        if hi > 1e300:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if sf(mid) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    return 0.5 * (lo + hi)


def ref_chi2_ppf(q: float, k: float) -> float:
    return ref_invert_sf(lambda x: ref_chi2_sf(x, k), 1.0 - q, k + 3.0 * math.sqrt(2.0 * k))


def ref_f_ppf(q: float, d1: float, d2: float) -> float:
    return ref_invert_sf(lambda f: ref_f_sf(f, d1, d2), 1.0 - q, 3.0)


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


# --- the grid ---------------------------------------------------------------------------------

DOFS = [0.5, 0.73, 1.0, 1.5, 2.0, 3.0, 4.4, 6.0, 9.37, 12.0, 17.3, 33.0, 57.5, 114.0, 333.3, 1000.0,
        2500.5, 4999.9, 5000.0]
#: Points of each tail relative to the dof: deep lower tail to deep upper tail.
SCALES = [1e-6, 1e-3, 0.05, 0.3, 0.7, 0.95, 1.0, 1.05, 1.3, 2.0, 3.0, 6.0]
LEVELS = [1e-9, 1e-4, 0.01, 0.1, 0.5, 0.9, 0.99, 1.0 - 0.01 / 3, 0.999, 1.0 - 1e-6, 1.0 - 1e-10]


@pytest.mark.parametrize("k", DOFS)
def test_chi2_sf_is_the_reference_on_both_tails(k):
    for s in SCALES:
        for x in (s * k, s * k + 3.0 * math.sqrt(2.0 * k) * (s - 1.0) if s > 1.0 else s * k):
            fast, ref = _stats.chi2_sf(x, k), ref_chi2_sf(x, k)
            assert _rel(fast, ref) <= 1e-13, (x, k, fast, ref)
            assert _rel(1.0 - fast, 1.0 - ref) <= 1e-13, (x, k, fast, ref)  # the lower tail
            assert fast == ref  # the same iterations: the same float


@pytest.mark.parametrize("k", DOFS)
def test_chi2_ppf_is_the_reference_bisection(k):
    for q in LEVELS:
        fast, ref = _stats.chi2_ppf(q, k), ref_chi2_ppf(q, k)
        assert _rel(fast, ref) <= 1e-13, (q, k, fast, ref)
        assert fast == ref, (q, k, fast, ref)  # the replayed bisection's bracket is the plain one's


@pytest.mark.parametrize("d1", [0.5, 1.0, 2.5, 6.0, 13.7, 18.0])
@pytest.mark.parametrize("d2", [1.0, 3.0, 10.0, 42.5, 114.0, 1000.0, 5000.0])
def test_f_sf_and_ppf_are_the_reference(d1, d2):
    for f in (1e-4, 0.1, 0.5, 1.0, 2.0, 4.0, 20.0, 300.0):
        fast, ref = _stats.f_sf(f, d1, d2), ref_f_sf(f, d1, d2)
        assert _rel(fast, ref) <= 1e-13 and fast == ref, (f, d1, d2, fast, ref)
    for q in (0.01, 0.5, 0.9, 0.99, 1.0 - 0.01 / 3):
        fast, ref = _stats.f_ppf(q, d1, d2), ref_f_ppf(q, d1, d2)
        assert _rel(fast, ref) <= 1e-13 and fast == ref, (q, d1, d2, fast, ref)


def test_the_quantile_inverts_the_tail():
    # The tail itself is good to ~1e-12 at large dof (lgamma and exp of a lead of ~1e4), the
    # module's stated accuracy; the quantile is where that tail crosses q.
    for k in (0.5, 3.0, 114.0, 5000.0):
        for q in (0.01, 0.5, 0.999):
            x = _stats.chi2_ppf(q, k)
            assert abs((1.0 - _stats.chi2_sf(x, k)) - q) <= 1e-11 * min(q, 1.0 - q)


@settings(max_examples=150, deadline=None)
@given(k=st.floats(0.5, 5000.0), x1=st.floats(0.0, 20000.0), x2=st.floats(0.0, 20000.0))
def test_chi2_sf_is_a_tail(k, x1, x2):
    lo, hi = min(x1, x2), max(x1, x2)
    a, b = _stats.chi2_sf(lo, k), _stats.chi2_sf(hi, k)
    assert 0.0 <= b <= a <= 1.0


@settings(max_examples=100, deadline=None)
@given(d1=st.floats(0.5, 50.0), d2=st.floats(0.5, 5000.0), f1=st.floats(0.0, 1e4), f2=st.floats(0.0, 1e4))
def test_f_sf_is_a_tail(d1, d2, f1, f2):
    lo, hi = min(f1, f2), max(f1, f2)
    a, b = _stats.f_sf(lo, d1, d2), _stats.f_sf(hi, d1, d2)
    assert 0.0 <= b <= a + 1e-15 and a <= 1.0


@settings(max_examples=60, deadline=None)
@given(k=st.floats(0.5, 5000.0), q1=st.floats(1e-6, 1.0 - 1e-6), q2=st.floats(1e-6, 1.0 - 1e-6))
def test_chi2_ppf_is_monotone_and_the_reference(k, q1, q2):
    lo, hi = min(q1, q2), max(q1, q2)
    a, b = _stats.chi2_ppf(lo, k), _stats.chi2_ppf(hi, k)
    assert 0.0 <= a <= b
    assert a == ref_chi2_ppf(lo, k)


# --- the detectable size: moments against array sums ------------------------------------------


def ref_pearson(lam: np.ndarray, th: float = 0.0) -> tuple[float, float, float]:
    w = lam * (1.0 + th * lam)
    c1, c2, c3 = float(w.sum()), float((w * w).sum()), float((w * w * w).sum())
    return c1, c2, c2 ** 3 / c3 ** 2 if c3 > 0.0 else 1.0


def ref_detectable_size(t: me.FieldTerms, declared: bool, alpha: float) -> float:
    """``model_error.detectable_size`` before the moments (array sums at every step)."""
    M = t.Szz - t.Q.T @ t.Hinv @ t.Q
    lam = np.linalg.eigvalsh(0.5 * (M + M.T))
    lam = lam[lam > 1e-12 * max(float(lam[-1]), 1e-300)]
    if lam.size == 0:
        return math.inf
    c1, c2, h = ref_pearson(lam)
    d2 = max(t.nu - h, 1.0)
    xc = ref_chi2_ppf(1.0 - alpha, h) if declared or d2 >= 50.0 else h * ref_f_ppf(1.0 - alpha, h, d2)
    Tc = c1 + (xc - h) * math.sqrt(c2 / h)

    def power(th: float) -> float:
        a1, a2, ha = ref_pearson(lam, th)
        return ref_chi2_sf(max(ha + (Tc - a1) * math.sqrt(ha / a2), 0.0), ha)

    if power(0.0) >= me.DETECTION_POWER:
        return 0.0
    hi = 1e-14
    while power(hi) < me.DETECTION_POWER:
        hi *= 4.0
        if hi > 1e6:
            return math.inf
    lo = hi / 4.0
    for _ in range(20):
        mid = math.sqrt(lo * hi)
        if power(mid) < me.DETECTION_POWER:
            lo = mid
        else:
            hi = mid
    best = math.sqrt(2.0 * hi)
    if declared and t.nu > 0.0:
        best = min(best, me._chi2_detectable(t, alpha))
    return best


def _terms(rng: np.random.Generator, n: int, scale: float) -> me.FieldTerms:
    """FieldTerms of a random whitened Jacobian X (6n x 12) and field columns Z (6n x 18)."""
    X = rng.normal(size=(6 * n, 12))
    Z = scale * rng.normal(size=(6 * n, 18)) * rng.uniform(0.01, 1.0, size=18)
    Hinv = np.linalg.inv(X.T @ X)
    W = np.eye(6 * n)
    nu = float(6 * n - 12)
    z18, z12 = np.zeros(18), np.zeros((12, 12))
    return me.FieldTerms(p=12, nu=nu, yy=nu, Q=X.T @ Z, Szz=Z.T @ Z, zy=z18, Xw=X.T @ W @ X, Xw2=z12,
                         XwZ=np.zeros((12, 18)), Zw=np.zeros((18, 18)), trW=float(6 * n), trW2=float(6 * n),
                         ywy=0.0, Qi=np.zeros((12, 30)), trZi=0.0, rot2=(0.0, 0.0), Hinv=Hinv)


@pytest.mark.parametrize("declared", [True, False])
def test_detectable_size_is_the_array_search(declared):
    rng = np.random.default_rng(2026)
    found = set()
    for trial in range(40):
        n = int(rng.choice([4, 6, 8, 12, 20, 60]))  # nu - h below and above 50: the F and chi2 paths
        t = _terms(rng, n, float(10.0 ** rng.uniform(1.0, 6.0)))
        for alpha in (0.01 / 3, 0.005, 0.01):
            fast, ref = me.detectable_size(t, declared, alpha), ref_detectable_size(t, declared, alpha)
            assert fast == ref, (trial, n, alpha, fast, ref)
            found.add(math.isfinite(fast) and fast > 0.0)
    assert True in found  # the search ran to a size, not only its shortcuts


def _plain_bracket(power, target):
    return _stats.size_bisection(lambda th: power(th) < target)


def test_replayed_size_bisection_is_the_bisection_in_fewer_evaluations():
    """The replay (root by Illinois, decisions read off it) gives the plain bisection's
    bracket bit for bit, on sigmoid powers of every steepness and position, in at most about
    half its evaluations."""
    rng = np.random.default_rng(7)
    target = me.DETECTION_POWER
    used = 0
    for _ in range(300):
        mid, width = 10.0 ** rng.uniform(-13.0, 5.5), rng.uniform(0.05, 6.0)

        def power(th, mid=mid, width=width):
            return 0.05 + 0.95 / (1.0 + (mid / th) ** (1.0 / width)) if th > 0.0 else 0.05

        calls = [0]

        def counted(th, power=power, calls=calls):
            calls[0] += 1
            return power(th)

        got = _stats.replayed_size_bisection(counted, target, me._POWER_GUARD)
        ref = _plain_bracket(power, target)
        if got is not None:
            used += 1
            assert got == ref
            assert calls[0] <= 20
    assert used >= 250  # the replay ran, not only its fall-back


def test_replayed_size_bisection_gives_way_where_a_step_is_close_to_the_target():
    """A power within _POWER_GUARD of the target just below its crossing (the rounding of the
    moments could decide such a step either way): the plain search would flag it and
    detectable_size takes the pinned path, so the replay must return None there, and only
    there."""
    target = me.DETECTION_POWER

    def sigmoid(th):
        return 0.05 + 0.95 / (1.0 + (1e-6 / th) ** 0.5) if th > 0.0 else 0.05

    lo, hi = _plain_bracket(sigmoid, target)
    assert _stats.replayed_size_bisection(sigmoid, target, me._POWER_GUARD) == (lo, hi)
    for shelf in (0.5 * me._POWER_GUARD, 10.0 * me._POWER_GUARD):
        def power(th, shelf=shelf):
            # the final bracket's low end sits on a shelf just under the target
            return target - shelf - 1e-13 if lo * (1 - 1e-3) < th <= lo else sigmoid(th)

        got = _stats.replayed_size_bisection(power, target, me._POWER_GUARD)
        assert (got is None) == (shelf < me._POWER_GUARD)
        assert got is None or got == _plain_bracket(power, target)
