"""The few distribution functions the residual tests need, on Python floats (no scipy).

* :func:`chi2_sf` / :func:`chi2_ppf`: chi-square tail and quantile, through the regularised
  incomplete gamma function (series below ``a + 1``, Lentz's continued fraction above, as
  in Numerical Recipes, section 6.2).
* :func:`f_sf` / :func:`f_ppf`: Fisher's F tail and quantile, through the regularised
  incomplete beta function (Lentz's continued fraction, Numerical Recipes section 6.4):
  ``P(F > f) = I_x(d2/2, d1/2)`` with ``x = d2 / (d2 + d1 f)``.

Degrees of freedom may be non-integer (a redundancy number is). Accuracy is about 1e-12
relative in the tails the tests use; quantiles are found by bisection on the tail (60
halvings of a bracket, so to rounding), which is plenty for a test threshold computed once
per solve.

* :func:`size_bisection` / :func:`replayed_size_bisection`: the search that defines the
  smallest detectable model error (``model_error.detectable_size``), and its replay from the
  power's root (the same bracket, bit for bit, in under half the tail evaluations).
"""

from __future__ import annotations

import math

__all__ = ["chi2_sf", "chi2_ppf", "f_sf", "f_ppf", "size_bisection", "replayed_size_bisection"]

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 500


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma ``Q(a, x) = Gamma(a, x) / Gamma(a)``.

    The loops avoid ``abs()`` (a builtin call per test, a third of the time): the series'
    terms are positive, and ``-t < d < t`` is the same test as ``abs(d) < t``, so every
    iteration, and the figure, is the one the textbook form gives, bit for bit.
    """
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    lead = a * math.log(x) - x - math.lgamma(a)
    eps, tiny = _EPS, _TINY
    if x < a + 1.0:
        # Series for P(a, x) (terms and sum positive).
        term = 1.0 / a
        total = term
        ap = a
        for _ in range(_MAX_TERMS):
            ap += 1.0
            term *= x / ap
            total += term
            if term < total * eps:
                break
        return max(0.0, 1.0 - total * math.exp(lead))
    # Continued fraction for Q(a, x) (modified Lentz).
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_TERMS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if -tiny < d < tiny:
            d = tiny
        c = b + an / c
        if -tiny < c < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if -eps < delta - 1.0 < eps:
            break
    return min(1.0, math.exp(lead) * h)


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz; ``abs()``-free
    tests as in :func:`_gamma_q`, the same iterations)."""
    eps, tiny = _EPS, _TINY
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    if -tiny < d < tiny:
        d = tiny
    d = 1.0 / d
    h = d
    for m in range(1, _MAX_TERMS):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        if -tiny < d < tiny:
            d = tiny
        c = 1.0 + aa / c
        if -tiny < c < tiny:
            c = tiny
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        if -tiny < d < tiny:
            d = tiny
        c = 1.0 + aa / c
        if -tiny < c < tiny:
            c = tiny
        d = 1.0 / d
        delta = d * c
        h *= delta
        if -eps < delta - 1.0 < eps:
            break
    return h


def _beta_reg(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lead = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(lead)
    # The fraction converges fast for x < (a + 1) / (a + b + 2); use the symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def _check_dof(*dofs: float) -> None:
    for k in dofs:
        if not (k > 0.0 and math.isfinite(k)):
            raise ValueError(f"degrees of freedom must be positive and finite, got {k!r}")


def chi2_sf(x: float, k: float) -> float:
    """``P(chi2_k > x)`` for ``k > 0`` degrees of freedom."""
    _check_dof(k)
    if math.isnan(x):
        return math.nan
    return _gamma_q(0.5 * k, 0.5 * x)


def f_sf(f: float, d1: float, d2: float) -> float:
    """``P(F(d1, d2) > f)``."""
    _check_dof(d1, d2)
    if math.isnan(f):
        return math.nan
    if f <= 0.0:
        return 1.0
    if math.isinf(f):
        return 0.0
    return _beta_reg(0.5 * d2, 0.5 * d1, d2 / (d2 + d1 * f))


def _invert_sf(sf, p: float, guess: float, logpdf=None) -> float:
    """The ``x`` with ``sf(x) = p`` (``sf`` decreasing on ``[0, inf)``), by bisection.

    The bisection (doubling from ``max(guess, 1)``, then halving to ``1e-14`` relative) is
    the definition of the figure. With ``logpdf`` (the density's log) it is *replayed*: a
    safeguarded Newton iteration finds the root ``r`` in a few tail evaluations, and each
    bisection step's decision ``sf(mid) > p`` is read off ``mid < r`` except within
    :data:`_REPLAY_GUARD` of ``r``, where ``sf`` is evaluated. ``sf`` is monotone, so a
    replayed decision agrees with the evaluated one whenever the final bracket does (every
    ``mid`` that became ``lo`` lies below the final ``lo``, every other above the final
    ``hi``): both ends are checked by evaluation, and if either disagrees the plain
    bisection runs. The result is the plain bisection's, bit for bit, for 6-10 tail
    evaluations instead of 50-60.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"tail probability must be in (0, 1), got {p!r}")
    if logpdf is not None:
        r = _newton_root(sf, logpdf, p, max(guess, 1.0))
        if r is not None:
            out = _bisect(sf, p, guess, r)
            if out is not None:
                return out
    out = _bisect(sf, p, guess, None)
    assert out is not None
    return out


#: Relative distance from the Newton root within which a replayed bisection step evaluates
#: the tail instead of reading the decision off the root (:func:`_invert_sf`).
_REPLAY_GUARD = 1e-13


def _bisect(sf, p: float, guess: float, r: float | None) -> float | None:
    """The bisection of :func:`_invert_sf`; with a root ``r``, replayed (None: the check of
    the final bracket failed)."""
    known: dict[float, bool] = {}

    def above(x: float) -> bool:  # sf(x) > p
        if r is not None and abs(x - r) > _REPLAY_GUARD * r:
            return x < r
        v = known.get(x)
        if v is None:
            v = known[x] = sf(x) > p
        return v

    lo, hi = 0.0, max(guess, 1.0)
    while above(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 1e300:
            return math.inf if r is None else None
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if above(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-14 * hi:
            break
    if r is not None:
        # The final bracket, by evaluation (module of the argument in _invert_sf).
        if lo > 0.0 and not known.get(lo, None) and not sf(lo) > p:
            return None
        if known.get(hi, True) and sf(hi) > p:
            return None
    return 0.5 * (lo + hi)


def _newton_root(sf, logpdf, p: float, x: float) -> float | None:
    """Root of ``sf(x) = p`` by Newton's method (``sf' = -pdf``), kept inside the bracket
    the evaluations establish (bisecting it when a step leaves it); None if it fails."""
    lo, hi = 0.0, math.inf
    for _ in range(100):
        g = sf(x) - p
        if g > 0.0:
            lo = max(lo, x)
        else:
            hi = min(hi, x)
        if g == 0.0:
            return x
        try:
            step = g / math.exp(logpdf(x))
        except (OverflowError, ValueError, ZeroDivisionError):
            step = math.nan
        if abs(step) <= 1e-15 * x:  # converged (before the bracket test: x + step may be x)
            return x + step
        nx = x + step
        if not (lo < nx < hi) or not math.isfinite(nx):
            nx = 0.5 * (lo + hi) if math.isfinite(hi) else 2.0 * x
        if math.isfinite(hi) and hi - lo <= 1e-15 * hi:
            return nx
        x = nx
    return None


def _chi2_logpdf(x: float, k: float) -> float:
    h = 0.5 * k
    return (h - 1.0) * math.log(x) - 0.5 * x - math.lgamma(h) - h * math.log(2.0)


def _f_logpdf(f: float, d1: float, d2: float) -> float:
    a, b = 0.5 * d1, 0.5 * d2
    return (a * math.log(d1) + b * math.log(d2) + (a - 1.0) * math.log(f) - (a + b) * math.log(d2 + d1 * f)
            - math.lgamma(a) - math.lgamma(b) + math.lgamma(a + b))


def chi2_ppf(q: float, k: float) -> float:
    """Quantile: the ``x`` with ``P(chi2_k <= x) = q``."""
    _check_dof(k)
    return _invert_sf(lambda x: chi2_sf(x, k), 1.0 - q, k + 3.0 * math.sqrt(2.0 * k),
                      lambda x: _chi2_logpdf(x, k))


def f_ppf(q: float, d1: float, d2: float) -> float:
    """Quantile: the ``f`` with ``P(F(d1, d2) <= f) = q``."""
    _check_dof(d1, d2)
    return _invert_sf(lambda f: f_sf(f, d1, d2), 1.0 - q, 3.0, lambda f: _f_logpdf(f, d1, d2))


# --- the detectable size's search (model_error.detectable_size) ------------------------------


def size_bisection(below) -> tuple[float, float] | None:
    """The search that defines ``model_error.detectable_size``: ``th`` from ``1e-14`` up by factors
    of 4 until ``below(th)`` (power under the target) is false, then 20 geometric halvings
    of the last factor (to 0.1 % of the size: plenty for a threshold). ``(lo, hi)``, or None
    past ``1e6`` (no field the test would find)."""
    hi = 1e-14
    while below(hi):
        hi *= 4.0
        if hi > 1e6:
            return None
    lo = hi / 4.0
    for _ in range(20):
        mid = math.sqrt(lo * hi)
        if below(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


#: Relative distance from the power's root within which a replayed bisection step evaluates
#: the power instead of reading its decision off the root (:func:`replayed_size_bisection`).
_ROOT_GUARD = 1e-9


def replayed_size_bisection(power, target: float, guard: float) -> tuple[float, float] | None:
    """:func:`size_bisection`'s bracket for a ``power`` that is increasing in ``th``, from
    about 12 power evaluations instead of about 33 (None: run the bisection itself).

    The root ``r`` of ``power(th) = target`` is found by the Illinois method on ``log th``;
    each bisection step's decision ``power(th) < target`` is read off ``th < r``, except
    within :data:`_ROOT_GUARD` of ``r``, where the power is evaluated. Every step that
    became ``lo`` lies at or below the final ``lo`` and every other at or above the final
    ``hi``, so by monotony the replayed decisions are the evaluated ones, and no step's power
    is within ``guard`` of the target, whenever the final ends' evaluated powers
    say so; otherwise None, and the plain bisection runs. The result is the bisection's,
    bit for bit.
    """
    # The bisection's first factor of 4 that reaches the target, by a binary search over its
    # doubling steps th_j = 1e-14 4^j (j <= 33; th_34 is past 1e6).
    lo_j, hi_j = -1, 34
    g_lo = g_hi = 0.0
    while hi_j - lo_j > 1:
        j = (lo_j + hi_j) // 2
        g = power(1e-14 * 4.0 ** j) - target
        if g < 0.0:
            lo_j, g_lo = j, g
        else:
            hi_j, g_hi = j, g
    if hi_j == 34 or lo_j < 0:
        return None  # no size the test would find, or the very first step: nothing to save
    lo_u = math.log(1e-14 * 4.0 ** lo_j)
    hi_u = math.log(1e-14 * 4.0 ** hi_j)
    # Illinois (regula falsi with the stale end's value halved) to 1e-12 in log th, or a
    # power within 1e-14 of the target.
    side = 0
    for _ in range(60):
        if hi_u - lo_u <= 1e-12 or min(g_hi, -g_lo) < 1e-14:
            break
        u = hi_u - g_hi * (hi_u - lo_u) / (g_hi - g_lo)
        if not lo_u < u < hi_u:
            u = 0.5 * (lo_u + hi_u)
        g = power(math.exp(u)) - target
        if g >= 0.0:
            hi_u, g_hi = u, g
            if side == 1:
                g_lo *= 0.5
            side = 1
        else:
            lo_u, g_lo = u, g
            if side == -1:
                g_hi *= 0.5
            side = -1
    else:
        return None
    r = math.exp(hi_u if g_hi < -g_lo else lo_u)

    def replay(th: float) -> bool:
        if abs(th - r) > _ROOT_GUARD * r:
            return th < r
        return power(th) < target

    bracket = size_bisection(replay)
    if bracket is None:
        return None
    lo, hi = bracket
    if not (power(lo) <= target - guard and power(hi) >= target + guard):
        return None
    return bracket
