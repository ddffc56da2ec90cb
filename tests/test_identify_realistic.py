"""Kinematic identification on the realistic cell: what the DH model cannot describe is in
the uncertainty.

The cell of ``config/demo-scenario.toml`` (ADR 0015) with another arm per trial
(``cellcal.sim.offline.arm_trial_scenario``): hidden DH errors behind the factory table the
controller believes, the probe's payload sagging the arm, backlash, warm-up, the
beam-coordinate tracker. The daemon's kinematics plan (``[kinematics]`` of
``config/demo.toml``, 40 fit and 30 validation stations) is measured offline and identified
from the factory model with the noise declared as the daemon declares it. Sag is no DH
error: it leaves residuals 2.8x the declared noise (``model_error``), and about 0.11 mm of
it goes into the base frame as a drop the residuals cannot show. Before the identification
widened the base frame by what it absorbs (ADR 0004's rule, ``identify._absorbed``), the
result said 0.015 mm of sigma for that 0.11 mm (NEES about 180 on every arm).
"""

from __future__ import annotations

import math
import pathlib
import tomllib

import numpy as np
import pytest

from cellcal.daemon.config import load_config
from cellcal.daemon.runs.iso9283 import solver_params as solver_model
from cellcal.daemon.runs.kinematics import make_plan
from cellcal.sim.offline import OfflineCell, arm_trial_scenario
from cellcal.sim.robot_scenario import parse_robot_table
from cellcal.sim.scenario import parse_scenario
from cellcal.solver import identify_kinematics
from cellcal.solver.se3 import se3_inverse, se3_log

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

_ROOT = pathlib.Path(__file__).resolve().parent.parent
_ARMS = 6
_NEES_BOUND = 20.06  # chi-square, 6 dof, 99.73 %


def _identified(k: int, *, sag: bool = True):
    cfg = load_config(_ROOT / "config" / "demo.toml")
    with open(_ROOT / "config" / "demo-scenario.toml", "rb") as f:
        base = tomllib.load(f)
    if not sag:
        base["robot"].pop("compliance")
    scen = arm_trial_scenario(base, np.random.default_rng(5000 + k))
    scen["seed"] = 50 + k
    factory = parse_robot_table(scen["robot"]).factory_model
    cell = OfflineCell(parse_scenario(scen))
    sts = [cell.station(ps.q_rad, 0.2) for ps in make_plan(cfg, factory)]
    nfit = cfg.kinematics.n_stations
    q = np.array([s.q_rad for s in sts])
    M = np.array([s.cell_T_target for s in sts])
    st = np.array([s.sample.std_m for s in sts[:nfit]])
    sr = np.array([s.sample.std_rad for s in sts[:nfit]])
    noise_t = math.sqrt(float(np.mean(st * st)) + cfg.solve.robot_repeatability_m ** 2)
    noise_r = math.sqrt(float(np.mean(sr * sr)) + cfg.solve.robot_repeatability_rad ** 2)
    r = identify_kinematics(q[:nfit], solver_model(factory), cell_T_target=M[:nfit], noise_translation_m=noise_t,
                            noise_rotation_rad=noise_r, validation_q=q[nfit:], validation_cell_T_target=M[nfit:])
    est = r.transforms()["cell_T_base"]
    d = se3_log(se3_inverse(cell.world.cell_T_base()) @ est.value)
    return r, d, float(d @ np.linalg.solve(est.covariance, d))


@pytest.mark.parametrize("k", range(_ARMS))
def test_the_identified_base_frame_error_lies_inside_its_uncertainty(k):
    r, d, nees = _identified(k)
    assert any(w.code == "model_error" for w in r.warnings), r.warnings
    assert "widened by what the fit absorbed" in next(w.message for w in r.warnings if w.code == "model_error")
    assert 0.05e-3 < abs(d[2]) < 0.3e-3, d  # the sag's drop, there to be covered
    assert nees <= _NEES_BOUND, (nees, d)
    # Still a useful figure: the base frame's 1-sigma well under the base-frame calibration's
    # (about 1 mm on this cell, bench/RESULTS.md realism).
    C = r.transforms()["cell_T_base"].covariance
    assert math.sqrt(float(np.trace(C[:3, :3]))) < 0.4e-3


def test_the_widening_follows_the_excess():
    """The same arm without the payload's sag: what is left (warm-up, backlash) is a small
    excess over the declared noise, the base frame's error is a tenth of the sag's drop,
    and its sigma shrinks with the excess instead of staying at the sagging arm's."""
    r, d, nees = _identified(0)
    r0, d0, nees0 = _identified(0, sag=False)
    assert r0.chi2_per_dof < r.chi2_per_dof / 3, (r0.chi2_per_dof, r.chi2_per_dof)
    assert np.linalg.norm(d0[:3]) < 0.03e-3 and nees0 <= _NEES_BOUND, (nees0, d0)
    s, s0 = (math.sqrt(float(np.trace(x.transforms()["cell_T_base"].covariance[:3, :3]))) for x in (r, r0))
    assert s0 < s / 2, (s0, s)
