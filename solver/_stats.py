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
"""

from __future__ import annotations

import math

__all__ = ["chi2_sf", "chi2_ppf", "f_sf", "f_ppf"]

_EPS = 1e-15
_TINY = 1e-300
_MAX_TERMS = 500


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma ``Q(a, x) = Gamma(a, x) / Gamma(a)``."""
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    lead = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        # Series for P(a, x).
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
    # Continued fraction for Q(a, x) (modified Lentz).
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


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
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


def _invert_sf(sf, p: float, guess: float) -> float:
    """The ``x`` with ``sf(x) = p`` (``sf`` decreasing on ``[0, inf)``), by bisection."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"tail probability must be in (0, 1), got {p!r}")
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


def chi2_ppf(q: float, k: float) -> float:
    """Quantile: the ``x`` with ``P(chi2_k <= x) = q``."""
    _check_dof(k)
    return _invert_sf(lambda x: chi2_sf(x, k), 1.0 - q, k + 3.0 * math.sqrt(2.0 * k))


def f_ppf(q: float, d1: float, d2: float) -> float:
    """Quantile: the ``f`` with ``P(F(d1, d2) <= f) = q``."""
    _check_dof(d1, d2)
    return _invert_sf(lambda f: f_sf(f, d1, d2), 1.0 - q, 3.0)
