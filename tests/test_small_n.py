"""Honest uncertainty at small N (ADR 0004, "Honest covariance"): the mean NEES of
``cell_T_base`` under its reported 6x6 covariance, with the noise estimated from the
residuals, for every N from 4 to 10 and a spot check at 20, at two ratios of rotation
to translation noise (0.1 deg / 0.2 mm and 0.02 deg / 0.2 mm). Each cell draws T = 200
seeded scenes (a new geometry every trial, ``tests/_worlds.py``) and calls
``calibrate_base_frame(..., holdout=False, robot_accuracy_m=0.0)`` with no noise declared:
the robot of these worlds is exact, and declaring it so keeps the robot-accuracy term that
covers an untestable model error (ADR 0004, "A calibrated widening") out of a test of the
noise's small-sample law.

**The band.** For an honest covariance whose variance components are estimated from ``r``
degrees of freedom and scaled by the mean of the inverse scaled chi-square (what the
solver's correction is for one component), one trial's NEES is
``(r - 2) / r * chi2_6 / (chi2_r / r)``: mean 6, but heavy-tailed (infinite variance for
``r <= 4``), so the chi-square band of a known covariance would be wrong. The band of the
mean of T trials is computed from that law itself: 4,000 seeded replicates of T draws, each
trial's draw using that trial's reported redundancy of its *less* redundant component
(``min(r_t, r_r)``: the wider law), and their quantiles. At very large r it is the
chi-square band of 6T degrees of freedom (checked below).

**Level.** Each cell's band is at the 95 % level. With 16 cells, an exactly honest
covariance would leave some cell outside its own 95 % band 56 % of the time, so the test
that *all* cells pass uses the Sidak level ``0.95 ** (1 / 16)`` per cell (family-wise 95 %);
the 95 % per-cell verdicts are asserted for N = 4-10 in aggregate: at most 2 of those 14
cells outside (the binomial 95 % point for an honest estimator is 2). A further test pools
all cells: the grand mean NEES within its own 95 % band, which a bias of a few percent
would fail.
"""

import math

import numpy as np
import pytest
from _worlds import base_frame_scenes

from cellcal.solver import Workspace, calibrate_base_frame
from cellcal.solver.se3 import se3_inverse, se3_log

# The seeded Monte Carlo behind these tests (a module fixture) takes under a minute on an idle
# 2-core machine, several on a loaded one.
pytestmark = pytest.mark.timeout(900)

TRIALS = 200
RATIOS = {"0.1deg/0.2mm": (0.1, 0.2), "0.02deg/0.2mm": (0.02, 0.2)}
NS = [4, 5, 6, 7, 8, 9, 10, 20]
CELLS = [(n, ratio) for ratio in RATIOS for n in NS]
REPLICATES = 4000
SIDAK = 0.95 ** (1.0 / len(CELLS))


def reference_means(redundancies: np.ndarray, seed: int, replicates: int = REPLICATES) -> np.ndarray:
    """Replicate means of T honest trials' NEES (module docstring)."""
    rng = np.random.default_rng(seed)
    r = np.asarray(redundancies, dtype=float)
    chi6 = rng.chisquare(6, size=(replicates, r.size))
    chir = rng.chisquare(np.broadcast_to(r, (replicates, r.size)))
    return ((r - 2.0) / r * chi6 / (chir / r)).mean(axis=1)


def band(redundancies: np.ndarray, level: float, seed: int, replicates: int = REPLICATES) -> tuple[float, float]:
    m = reference_means(redundancies, seed, replicates)
    a = 0.5 * (1.0 - level)
    return float(np.quantile(m, a)), float(np.quantile(m, 1.0 - a))


def _cell(n: int, deg: float, mm: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(NEES, min redundancy, NEES under the uncorrected plug-in covariance)`` per trial."""
    rng = np.random.default_rng(1000 * n + int(1000 * deg))
    G, M, X, _ = base_frame_scenes(TRIALS, n, rng, mm, deg)
    ws = Workspace(n)
    nees, red, plug = np.empty(TRIALS), np.empty(TRIALS), np.empty(TRIALS)
    for k in range(TRIALS):
        # The robot is exact here (robot_accuracy_m=0): the test is of the noise law; with the
        # default accuracy a run too short to test for model error also carries a robot term.
        r = calibrate_base_frame(G[k], M[k], holdout=False, workspace=ws, robot_accuracy_m=0.0)
        d = se3_log(se3_inverse(X[k]) @ r.cell_T_base)  # right perturbation at the truth
        C = r.cell_T_base_covariance
        nees[k] = float(d @ np.linalg.solve(C, d))
        plug[k] = float(d @ np.linalg.solve(C / r.residual_tests.small_sample_factor, d))
        red[k] = min(r.residual_tests.redundancy_translation, r.residual_tests.redundancy_rotation)
    return nees, red, plug


@pytest.fixture(scope="module")
def cells():
    return {(n, ratio): _cell(n, *RATIOS[ratio]) for n, ratio in CELLS}


@pytest.mark.slow  # thousands of seeded trials (the module fixture)
@pytest.mark.parametrize("n, ratio", CELLS)
def test_mean_nees_is_inside_its_band(cells, n, ratio):
    nees, red, _ = cells[(n, ratio)]
    lo, hi = band(red, SIDAK, seed=n)
    assert lo <= nees.mean() <= hi, (n, ratio, nees.mean(), (lo, hi), float(np.median(red)))


@pytest.mark.slow  # thousands of seeded trials (the module fixture)
def test_at_most_the_expected_number_of_small_n_cells_leave_their_95_percent_band(cells):
    outside = []
    for n, ratio in CELLS:
        if n > 10:
            continue
        nees, red, _ = cells[(n, ratio)]
        lo, hi = band(red, 0.95, seed=n)
        if not lo <= nees.mean() <= hi:
            outside.append((n, ratio, round(float(nees.mean()), 2), (round(lo, 2), round(hi, 2))))
    assert len(outside) <= 2, outside


@pytest.mark.slow  # thousands of seeded trials (the module fixture)
def test_the_grand_mean_is_inside_its_band(cells):
    nees = np.concatenate([cells[c][0] for c in CELLS])
    red = np.concatenate([cells[c][1] for c in CELLS])
    lo, hi = band(red, 0.95, seed=99, replicates=1000)
    assert lo <= nees.mean() <= hi, (nees.mean(), (lo, hi))


def test_the_band_is_the_chi_square_band_at_large_redundancy():
    # With r large the law is chi2_6, and the band of the mean of T trials is the
    # chi-square band of 6T degrees of freedom over T (Wilson-Hilferty).
    lo, hi = band(np.full(TRIALS, 1e6), 0.95, seed=0)
    z = 1.959963984540054
    df = 6 * TRIALS
    wh = [df * (1 - 2 / (9 * df) + s * math.sqrt(2 / (9 * df))) ** 3 / TRIALS for s in (-z, z)]
    assert lo == pytest.approx(wh[0], rel=0.02) and hi == pytest.approx(wh[1], rel=0.02)


@pytest.mark.slow  # thousands of seeded trials (the module fixture)
def test_the_uncorrected_plug_in_covariance_would_fail(cells):
    # Sensitivity: without the small-sample correction (the reported covariance with its
    # small-sample widening taken out, about the plug-in) the small-N cells leave their
    # family-wise band: the tests above can fail.
    for n in (5, 6):  # at 4 the honest law's band is too wide for a sensitivity check
        for ratio in RATIOS:
            _, red, plug = cells[(n, ratio)]
            lo, hi = band(red, SIDAK, seed=n)
            assert plug.mean() > hi, (n, ratio, plug.mean(), hi)
