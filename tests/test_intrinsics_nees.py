"""Honest covariance of the intrinsics: NEES over many seeded trials (slow tier).

Each trial draws new views (random tilts and positions) and new corner noise, calibrates, and
computes the normalised error of the nine intrinsics against the truth, ``d^T C^-1 d``. For an
honest covariance its mean over trials is 9 (the number of parameters); with the noise
estimated from ``r`` degrees of freedom (here a few hundred) the plug-in covariance inflates
the mean by ``r / (r - 2)``, under 1 %. The band is the mean's 99.9 % interval under the
honest law (the NEES of one trial is chi-square with 9 dof: standard deviation sqrt(18), so
the mean of ``n`` trials has standard deviation sqrt(18 / n)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE, synthetic_views

from cellcal.solver import calibrate_intrinsics

pytestmark = pytest.mark.slow

TRIALS = 150


def _band(n: int) -> tuple[float, float]:
    half = 3.29 * math.sqrt(18.0 / n)  # 99.9 % two-sided
    return 9.0 - half, 9.0 + half


@pytest.mark.parametrize("declared", [False, True], ids=["estimated", "declared"])
def test_nees_of_the_intrinsics_is_in_band(declared):
    rng = np.random.default_rng(26)
    nees, inside = [], 0
    for _ in range(TRIALS):
        views, _ = synthetic_views(rng, 10, noise_px=0.15)
        r = calibrate_intrinsics(views, TARGET, SIZE, noise_px=0.15 if declared else None, holdout_folds=0)
        assert r.converged
        e = r.nees(TRUE)
        nees.append(e)
        # every parameter inside its own 3 sigma
        inside += bool(np.all(np.abs(r.parameters - TRUE) <= 3.0 * r.sigmas))
    lo, hi = _band(TRIALS)
    mean = float(np.mean(nees))
    assert lo < mean < hi, f"mean NEES {mean:.2f} outside [{lo:.2f}, {hi:.2f}]"
    # the chi-square's own tail: at most a few trials past its 99.9 % point (27.9)
    assert sum(e > 27.9 for e in nees) <= 3
    assert inside >= 0.95 * TRIALS
