"""The solver's own DH arm (solver/kinematics.py) and its small distribution functions."""

import math

import numpy as np
import pytest

from cellcal.solver import _stats
from cellcal.solver.kinematics import UR5E, DHParameters
from cellcal.solver.se3 import make_transform


def _rz(t):
    c, s = math.cos(t), math.sin(t)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _rx(t):
    c, s = math.cos(t), math.sin(t)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def test_forward_is_the_product_of_standard_dh_links():
    rng = np.random.default_rng(0)
    q = rng.uniform(-math.pi, math.pi, size=(5, 6))
    T = UR5E.forward(q)
    assert T.shape == (5, 4, 4)
    for k in range(5):
        ref = np.eye(4)
        for i in range(6):
            th = q[k, i] + UR5E.theta[i]
            link = make_transform(_rz(th), [0.0, 0.0, UR5E.d[i]]) @ make_transform(_rx(UR5E.alpha[i]), [UR5E.a[i], 0, 0])
            ref = ref @ link
        assert np.allclose(T[k], ref, atol=1e-14)


def test_ur5e_zero_pose_and_reach():
    # All joints at zero: the UR arm lies stretched along -x of the base.
    T = UR5E.forward(np.zeros(6))[0]
    assert T[0, 3] == pytest.approx(-(0.425 + 0.3922), abs=1e-12)
    assert T[1, 3] == pytest.approx(-(0.1333 + 0.0996), abs=1e-12)
    assert T[2, 3] == pytest.approx(0.1625 - 0.0997, abs=1e-12)
    assert UR5E.reach_m == pytest.approx(0.425 + 0.3922 + 0.1625 + 0.1333 + 0.0997 + 0.0996)


def test_errors_add_to_the_nominal_parameters_and_shapes_are_checked():
    err = UR5E.with_errors(delta_theta=np.full(6, 1e-3), delta_a=np.full(6, 1e-4))
    assert np.allclose(err.theta, 1e-3) and np.allclose(err.a, UR5E.a + 1e-4) and np.array_equal(err.d, UR5E.d)
    assert err.name == "ur5e + errors"
    q = np.full(6, 0.3)
    assert not np.allclose(err.forward(q), UR5E.forward(q))
    with pytest.raises(ValueError, match="delta_d"):
        UR5E.with_errors(delta_d=np.zeros(5))
    with pytest.raises(ValueError, match="q_rad"):
        UR5E.forward(np.zeros((3, 5)))
    with pytest.raises(ValueError, match="NaN"):
        UR5E.forward(np.full(6, np.nan))
    with pytest.raises(ValueError, match="theta"):
        DHParameters(a=np.zeros(6), d=np.zeros(6), alpha=np.zeros(6), theta=np.zeros(7))


@pytest.mark.parametrize(
    "fn, args, expected",
    [
        # Reference values from standard statistical tables.
        (_stats.chi2_ppf, (0.975, 6), 14.4494),
        (_stats.chi2_ppf, (0.025, 6), 1.2373),
        (_stats.chi2_ppf, (0.99, 100), 135.807),
        (_stats.chi2_ppf, (0.5, 2), 2 * math.log(2)),
        (_stats.f_ppf, (0.95, 3, 12), 3.4903),
        (_stats.f_ppf, (0.99, 10, 20), 3.3682),
        (_stats.f_ppf, (0.95, 5, 10), 3.3258),
    ],
)
def test_quantiles_match_tables(fn, args, expected):
    assert fn(*args) == pytest.approx(expected, rel=2e-4)


def test_tails_are_monotone_and_consistent():
    assert _stats.chi2_sf(0.0, 3) == 1.0 and _stats.chi2_sf(math.inf, 3) == 0.0
    assert _stats.f_sf(0.0, 2, 5) == 1.0 and _stats.f_sf(math.inf, 2, 5) == 0.0
    xs = np.linspace(0.01, 40, 60)
    sf = [_stats.chi2_sf(x, 7.5) for x in xs]  # non-integer degrees of freedom (a redundancy)
    assert all(a >= b for a, b in zip(sf[:-1], sf[1:], strict=True))
    # F(1, d) is t^2: P(F > t^2) = 2 P(T > t); t(0.975, 10) = 2.2281.
    assert _stats.f_sf(2.2281**2, 1, 10) == pytest.approx(0.05, rel=1e-3)
    with pytest.raises(ValueError):
        _stats.chi2_sf(1.0, 0.0)
