"""Robot model error (ADR 0004, "Model error"): residuals that are not noise are detected and
the covariance is widened so that it still covers the answer's error.

World (``tests/_worlds.py``): a UR5e whose truth arm is the nominal one plus joint-zero
errors (1-sigma 0.1 deg) and link errors on ``a`` and ``d`` (1-sigma 0.3 mm), seeded per
robot; the fit is given the *nominal* forward kinematics. The tracker (a 6-DoF probe)
measures with 0.02 mm / 0.01 deg per axis; 20 stations per robot, the tracker 2 m away.

Criteria and their bands:

* **Detection**, noise declared (0.02 mm / 0.01 deg): the ``"model_error"`` warning on at
  least 98 % of 150 robots (measured: all). The kinematic error leaves ~0.5 mm per axis,
  25x the noise: chi-square per degree of freedom near 600, far past any threshold.
* **Coverage**: the error of ``cell_T_base`` against the truth arm's base (as the
  controller's FK uses it: joint 1's zero and ``d1`` errors are the base frame's,
  ``ur5e_world(fk_base=True)``) within 3 reported sigmas *on every one of its 6 axes* (per
  axis, from the covariance diagonal) in at least 95 % of the robots. For a Gaussian error
  with an honest covariance that holds with probability 0.9973^6 = 98.4 % per robot, so 150
  robots fall below 95 % with probability < 1 % (binomial). Measured: 98 %, mean NEES 4.6
  (the widening is the absorbed part of an error field fitted to the residuals,
  ``solver/model_error.py``; ADR 0004, "A calibrated widening").
* **Not useless**: the mean NEES at least 0.7 (sigmas at most about 3x the errors' spread;
  a covariance inflated far beyond the error would give NEES near 0); the reported
  widening over the tracker-only sigma is reported (about 70-90x: a 1 mm arm on a 0.02 mm
  tracker).
* **False alarms**: with the truth arm equal to the nominal one, the warning on at most 5
  of 200 robots (designed for 1 % = 2 expected: each of the two tests that run at level
  0.5 %; P(6 or more | p = 0.01) = 1.6 %).
* **Without declared noise** the structure test alone decides (regression of the residual
  on a pose-linear error field, F-test, and the score test matched to the error field): at 30
  stations they fire on at least 85 % of 80 robots (measured 90 %; the rest are
  ``model_error_untested`` and carry the robot-accuracy term), the robots they fire on are
  covered at least 93 % (measured 99 %), all of them at least 85 % (measured 98 %), and they
  fire falsely on at most 5 of 200 (P(6 or more | p = 0.01) = 1.6 %). Declaring the noise is
  what makes detection certain.
* **The realistic cell** (ADR 0015: errors fixed to the base too): on 20 arms the error of
  ``cell_T_base`` under the 6-dof NEES bound on at least 19, mean NEES between 1.5 and 12
  (measured 20 of 20, mean 2.6 declared and 2.9 estimated; 4.4-4.6 with the fixed factor
  before), noise declared or estimated.
"""

import math
import pathlib

import numpy as np
import pytest
from _worlds import ur5e_world

from cellcal.solver import Workspace, calibrate_base_frame
from cellcal.solver.se3 import se3_inverse, se3_log

MM, DEG = 0.02, 0.01
DECLARED = dict(noise_translation_m=MM * 1e-3, noise_rotation_rad=math.radians(DEG))


def _robots(count, n, seed, *, model_error=True, declared=True):
    rng = np.random.default_rng(seed)
    ws = Workspace(n)
    out = []
    for _ in range(count):
        G, M, X, _ = ur5e_world(n, rng, mm=MM, deg=DEG, model_error=model_error, fk_base=True)
        r = calibrate_base_frame(G, M, holdout=False, workspace=ws, **(DECLARED if declared else {}))
        d = se3_log(se3_inverse(X) @ r.cell_T_base)
        C = r.cell_T_base_covariance
        warned = [w for w in r.warnings if w.code == "model_error"]
        out.append(dict(
            warned=bool(warned), warning=warned[0] if warned else None,
            covered=bool(np.all(np.abs(d) <= 3.0 * np.sqrt(np.diag(C)))),
            nees=float(d @ np.linalg.solve(C, d)),
            infl=(r.residual_tests.inflation_translation, r.residual_tests.inflation_rotation),
            rms_mm=r.rms_translation_m * 1e3,
        ))
    return out


@pytest.fixture(scope="module")
def declared():
    return _robots(150, 20, seed=11)


def test_model_error_is_detected_on_nearly_every_robot(declared):
    rate = np.mean([r["warned"] for r in declared])
    assert rate >= 0.98, rate
    w = next(r["warning"] for r in declared if r["warned"])
    assert "robot pose" in w.message and "kinematic" in w.message and "tracker noise" in w.message
    # value: RMS (3-D, mm) of the structured part, of the order of the residual RMS.
    ratio = np.median([r["warning"].value / r["rms_mm"] for r in declared if r["warned"]])
    assert 0.5 < ratio < 1.5, ratio


def test_the_widened_covariance_covers_the_error(declared):
    cover = np.mean([r["covered"] for r in declared])
    nees = np.mean([r["nees"] for r in declared])
    infl = np.median([r["infl"] for r in declared], axis=0)
    assert cover >= 0.95, (cover, nees, infl)
    assert 0.7 <= nees <= 12.0, nees
    # Reported. (It was bounded by 10x while the widening also scaled the declared noise by
    # the excess; now the noise part is the tracker's alone and the field carries the rest,
    # so a 1 mm arm on a 0.02 mm tracker is rightly ~50-90x: the mean NEES above is what
    # keeps the widening from being useless.)
    assert infl[0] > 1.5 and infl[1] > 1.5, infl


def test_without_the_correction_the_covariance_would_not_cover():
    # Sensitivity: the same robots solved with the model-error term and the excess removed
    # (the noise-only covariance at the estimated noise) cover far less.
    rng = np.random.default_rng(11)
    covered = 0
    for _ in range(40):
        G, M, X, _ = ur5e_world(20, rng, mm=MM, deg=DEG, fk_base=True)
        r = calibrate_base_frame(G, M, holdout=False, **DECLARED)
        d = se3_log(se3_inverse(X) @ r.cell_T_base)
        infl = np.array([r.residual_tests.inflation_translation] * 3 + [r.residual_tests.inflation_rotation] * 3)
        sig = np.sqrt(np.diag(r.cell_T_base_covariance)) / infl  # approximately the noise-only sigmas
        covered += bool(np.all(np.abs(d) <= 3.0 * sig))
    assert covered / 40 < 0.8, covered


def test_false_alarms_are_rare_without_model_error():
    robots = _robots(200, 20, seed=12, model_error=False)
    alarms = sum(r["warned"] for r in robots)
    assert alarms <= 5, alarms
    assert np.mean([r["covered"] for r in robots]) >= 0.95


def test_structure_alone_detects_it_when_no_noise_is_declared():
    robots = _robots(80, 30, seed=13, declared=False)
    rate = np.mean([r["warned"] for r in robots])
    cover = np.mean([r["covered"] for r in robots])
    cover_warned = np.mean([r["covered"] for r in robots if r["warned"]])
    assert rate >= 0.85 and cover >= 0.85 and cover_warned >= 0.93, (rate, cover, cover_warned)
    w = next(r["warning"] for r in robots if r["warned"])
    assert "follow the robot pose" in w.message
    clean = _robots(200, 30, seed=14, model_error=False, declared=False)
    assert sum(r["warned"] for r in clean) <= 5


# --------------------------------------------------------------------------------------
# The realistic cell (ADR 0015): base-fixed errors too, not only kinematic ones


_ROOT = pathlib.Path(__file__).resolve().parent.parent
_ARMS = 20
_NEES_BOUND = 20.06  # chi-square, 6 dof, 99.73 %


def _realistic_arms(declared: bool) -> list[float]:
    """NEES of ``cell_T_base`` on ``_ARMS`` arms of the realistic cell (the realism bench's
    draw, ``cellcal.sim.offline.arm_trial_scenario``: hidden DH errors at the demo's
    magnitudes behind the factory table, sag, backlash, warm-up, the beam-coordinate tracker
    with outliers), the demo's generated 20-station plan with the trial's seed; noise
    ``declared`` as the daemon declares it (the stations' tracker std with the robot's
    repeatability) or estimated."""
    import tomllib

    from cellcal.daemon.config import load_config
    from cellcal.daemon.runs.plan import generate_plan
    from cellcal.drivers.kinematics import dh_model
    from cellcal.sim.offline import OfflineCell, arm_trial_scenario
    from cellcal.sim.scenario import parse_scenario

    cfg = load_config(_ROOT / "config" / "demo.toml")
    p, rep_r = cfg.plan, cfg.solve.robot_repeatability_rad
    with open(_ROOT / "config" / "demo-scenario.toml", "rb") as f:
        base = tomllib.load(f)
    out = []
    for k in range(_ARMS):
        plan = generate_plan(dh_model("ur5e"), n=20, box_min_m=np.array(p.workspace_min_m),
                             box_max_m=np.array(p.workspace_max_m), max_tilt_rad=p.max_tilt_rad,
                             home_q_rad=np.array(p.home_q_rad), q_min_rad=np.array(p.joint_min_rad),
                             q_max_rad=np.array(p.joint_max_rad), seed=200 + k)
        scen = arm_trial_scenario(base, np.random.default_rng(3000 + k))
        scen["seed"] = 300 + k
        cell = OfflineCell(parse_scenario(scen))
        sts = [cell.station(ps.q_rad, 0.2) for ps in plan]
        G = np.array([s.base_T_flange for s in sts])
        M = np.array([s.cell_T_target for s in sts])
        kw = {}
        if declared:
            st = np.array([s.sample.std_m for s in sts])
            sr = np.array([s.sample.std_rad for s in sts])
            kw = dict(noise_translation_m=float(np.sqrt(np.mean(st * st) + cfg.solve.robot_repeatability_m ** 2)),
                      noise_rotation_rad=float(np.sqrt(np.mean(sr * sr) + rep_r * rep_r)))
        r = calibrate_base_frame(G, M, holdout=False, **kw)
        assert any(w.code == "model_error" for w in r.warnings), k
        d = se3_log(se3_inverse(cell.world.cell_T_base()) @ r.cell_T_base)
        out.append(float(d @ np.linalg.solve(r.cell_T_base_covariance, d)))
    return out


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "estimated"])
def test_the_realistic_cells_errors_lie_inside_their_reported_uncertainty(declared):
    """A real arm's errors that are fixed to its base (sag, a warming column) rotate with the
    arm, not about the stations: the fitted error field's link frames turn with the arm's
    azimuth about a shoulder on the base axis (``solver/model_error.py``), so the absorbed
    part lies where these errors put it. (The fixed-factor rule needed a twist split between
    the centroid and the base origin to cover these arms: mean NEES 4.6 declared, 4.4
    estimated; the fitted field: 2.6 and 2.9, every arm inside the bound.)"""
    nees = np.array(_realistic_arms(declared))
    assert int(np.sum(nees <= _NEES_BOUND)) >= _ARMS - 1, np.round(nees, 1)
    # Honest is a mean of 6; the data cannot say how much was absorbed, so conservative is
    # allowed, useless (a covariance far wider than the error) is not.
    assert 1.5 <= float(nees.mean()) <= 12.0, np.round(nees, 1)
