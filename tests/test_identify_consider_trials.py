"""Many trials of the consider covariance (ADR 0016 amendment): with a still or weakly
excited joint, on independently perturbed arms (``_consider_world``), the identified
parameters' z-scores, the base frame's NEES and the predictions' NEES at joints the
stations never had are honest; with the noise-only sigmas of before they were not.

``python tests/test_identify_consider_trials.py [TRIALS] [prior]`` prints the table of ADR
0016's amendment (``prior``: arms drawn from the default prior itself, the arithmetic's check).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import _consider_world
import numpy as np
import pytest
from _consider_world import identify, independent_arm, joints, measure, scores, true_positions

pytestmark = pytest.mark.slow

_TRIALS = 8
_N_STATIONS = 50
_NEES6_999 = 22.46  # chi-square, 6 dof, 99.9 %
_NEES3_999 = 16.27  # 3 dof

#: (label, 0-based joint or None, its range +- rad (0: still), measurement, noise declared)
CASES = [
    ("joint 5 still, poses", 4, 0.0, "pose", True),
    ("joint 5 +-2 mrad, poses", 4, 2e-3, "pose", True),
    ("joint 2 +-2 mrad, poses", 1, 2e-3, "pose", True),
    ("joint 3 still, poses", 2, 0.0, "pose", True),
    ("joint 5 still, points", 4, 0.0, "point", True),
    ("joint 2 +-2 mrad, poses, noise estimated", 1, 2e-3, "pose", False),
]


@dataclass
class Figures:
    z: np.ndarray
    z_noise: np.ndarray
    base_nees: np.ndarray
    base_nees_noise: np.ndarray
    pred_nees: np.ndarray
    pred_nees_noise: np.ndarray
    warned: int
    named: set


def _rms(x: np.ndarray) -> float:
    return math.sqrt(float(np.mean(x * x)))


def run_case(joint: int | None, range_rad: float, measurement: str, declared: bool, trials: int = _TRIALS,
             seed0: int = 0, draw_arm=independent_arm) -> Figures:
    z, zn, bn, bnn, pn, pnn, warned, named = [], [], [], [], [], [], 0, set()
    for t in range(trials):
        rng = np.random.default_rng(7000 + 97 * seed0 + t)
        arm = draw_arm(rng)
        q = joints(rng, _N_STATIONS, joint, range_rad)
        M = measure(rng, arm, q)
        res = identify(q, M, point=measurement == "point", declared=declared)
        old = identify(q, M, point=measurement == "point", declared=declared,
                       parameter_prior=dict.fromkeys(("zero_offset", "a", "d", "alpha", "beta"), 0.0))
        s = scores(arm, res)
        z.append(s.z)
        zn.append(s.z_noise)
        bn.append(s.base_nees)
        bnn.append(s.base_nees_noise)
        warned += any(w.code == "weak_excitation" for w in res.warnings)
        named |= set(res.weakly_excited_joints)
        # Predictions where the stations never were: every joint over its range.
        qv = joints(np.random.default_rng(8000 + t), 20)
        err = true_positions(arm, qv) - res.predict(qv)[..., :3, 3] if measurement == "pose" else \
            true_positions(arm, qv) - res.predict(qv)
        for into, r in ((pn, res), (pnn, old)):
            C = r.prediction_covariance(qv)[:, :3, :3]
            into.append(np.einsum("ni,nij,nj->n", err, np.linalg.inv(C), err))
    return Figures(z=np.concatenate(z), z_noise=np.concatenate(zn), base_nees=np.array(bn), base_nees_noise=np.array(bnn),
                   pred_nees=np.concatenate(pn), pred_nees_noise=np.concatenate(pnn), warned=warned, named=named)


@pytest.mark.parametrize(("label", "joint", "range_rad", "measurement", "declared"), CASES, ids=[c[0] for c in CASES])
def test_z_scores_stay_honest_with_a_still_or_weak_joint(label, joint, range_rad, measurement, declared):
    f = run_case(joint, range_rad, measurement, declared)
    assert f.z.size >= 100, f.z.size
    assert _rms(f.z) <= 1.5 and np.abs(f.z).max() <= 4.0, (label, _rms(f.z), np.abs(f.z).max())
    # The noise-only sigmas of before were far off on the same arms: the test has power.
    assert _rms(f.z_noise) > 3.0, (label, _rms(f.z_noise))
    assert f.warned == _TRIALS and f.named == {joint + 1}, (label, f.named)
    assert f.base_nees.max() <= _NEES6_999, (label, f.base_nees)
    assert np.mean(f.pred_nees) <= 3 * 1.5 and np.mean(f.pred_nees <= _NEES3_999) >= 0.99, (label, f.pred_nees.max())


def test_a_well_excited_arm_is_as_before():
    f = run_case(None, 0.0, "pose", True)
    assert f.warned == 0
    assert np.array_equal(f.z, f.z_noise)
    assert 0.67 <= _rms(f.z) <= 1.5 and np.abs(f.z).max() <= 4.0, (_rms(f.z), np.abs(f.z).max())


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else _TRIALS
    draw = independent_arm
    if "prior" in sys.argv[2:]:
        draw = _consider_world.prior_arm
        _consider_world.REFERENCE_TOL_M = 2e-5
    print("| case | parameters | z RMS / max: noise only -> consider | base NEES mean / max: noise only -> consider "
          "| prediction NEES(3) mean / max: noise only -> consider |")
    print("|---|---|---|---|---|")
    for label, joint, range_rad, measurement, declared in [*CASES, ("all joints moving, poses", None, 0.0, "pose", True)]:
        f = run_case(joint, range_rad, measurement, declared, trials=trials, draw_arm=draw)
        print(f"| {label} | {f.z.size} | {_rms(f.z_noise):.1f} / {np.abs(f.z_noise).max():.0f} -> "
              f"{_rms(f.z):.2f} / {np.abs(f.z).max():.1f} | {f.base_nees_noise.mean():.0f} / {f.base_nees_noise.max():.0f}"
              f" -> {f.base_nees.mean():.1f} / {f.base_nees.max():.1f} | "
              f"{f.pred_nees_noise.mean():.0f} / {f.pred_nees_noise.max():.0f} -> "
              f"{f.pred_nees.mean():.2f} / {f.pred_nees.max():.1f} |")


if __name__ == "__main__":
    main()
