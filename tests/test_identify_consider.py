"""Consider covariance of a kinematic identification (solver/kinematic_consider.py, ADR 0016
amendment): parameters fixed at nominal carry their prior into the sigmas, the frames and the
predictions; a ``weak_excitation`` warning names the joints and parameters; exports carry the
sigmas. The many-trial z-scores are in test_identify_consider_trials.py (slow tier)."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from _consider_world import identify, independent_arm, joints, measure, scores, true_positions

from cellcal.solver import UR5E, kinematic_parameters_json, ur_calibration_yaml, urdf_from_model
from cellcal.solver.identify import DEFAULT_PARAMETER_PRIOR, parameter_names
from cellcal.solver.kinematic_consider import PRIOR_KINDS
from cellcal.solver.kinematic_export import (
    joint_origin_covariances,
    joint_origin_sigmas,
    joint_origins,
    origin_sigmas_from_parameters,
)

_NO_PRIOR = {k: 0.0 for k in PRIOR_KINDS}


@pytest.fixture(scope="module")
def still5():
    """50 pose stations on an independent arm with joint 5 never moving."""
    rng = np.random.default_rng(40)
    arm = independent_arm(rng)
    q = joints(rng, 50, joint=4)
    M = measure(rng, arm, q)
    return arm, q, M, identify(q, M)


def test_a_still_joint_is_named_with_what_it_leaves_undetermined(still5):
    arm, q, M, res = still5
    w = [x for x in res.warnings if x.code == "weak_excitation"]
    assert len(w) == 1
    assert res.weakly_excited_joints == (5,)
    assert res.weakly_excited and set(res.weakly_excited) <= set(res.considered)
    assert "joint 5 does not move enough" in w[0].message and "plan stations that move joint 5" in w[0].message
    for p in res.weakly_excited:
        assert p in w[0].message and "joint 5 never moves" in res.unidentifiable_reasons[p]
    # The value is how much the priors widened the most affected parameter.
    ratio = max(res.sigmas[p] / res.noise_sigmas[p] for p in res.estimated)
    assert w[0].value == pytest.approx(ratio) and ratio > 10
    # Structural parameters are a reparametrisation, never considered.
    assert not {"joint1.zero_offset", "link1.d", "joint6.zero_offset", "link6.a", "link6.d"} & set(res.considered)
    assert res.prior_sigmas == {p: DEFAULT_PARAMETER_PRIOR[p.split(".")[1]] for p in res.considered}


def test_the_estimate_is_the_same_only_its_uncertainty_changes(still5):
    arm, q, M, res = still5
    old = identify(q, M, parameter_prior=_NO_PRIOR)
    assert old.considered == () and old.sigmas == old.noise_sigmas
    assert not any(w.code == "weak_excitation" for w in old.warnings)
    for p in res.estimated:
        assert res.parameters[p] == old.parameters[p]
        assert res.noise_sigmas[p] == pytest.approx(old.sigmas[p], rel=1e-12)
        assert res.sigmas[p] >= res.noise_sigmas[p]
    # What the old sigmas said against what they say now, on this arm: the noise alone
    # claims errors far beyond any plausible z, the consider covariance covers them.
    s = scores(arm, res)
    assert np.abs(s.z_noise).max() > 10, np.abs(s.z_noise).max()
    assert np.abs(s.z).max() < 4, np.abs(s.z).max()


def test_predictions_are_certain_where_the_joint_stood_and_not_elsewhere(still5):
    arm, q, M, res = still5
    rng = np.random.default_rng(41)
    moved = joints(rng, 20)
    kept = moved.copy()
    kept[:, 4] = q[0, 4]  # joint 5 where the stations had it
    C_moved, C_kept = res.prediction_covariance(moved), res.prediction_covariance(kept)
    assert C_moved.shape == (20, 6, 6) and np.allclose(C_moved, np.swapaxes(C_moved, 1, 2))
    s_moved = np.sqrt(np.trace(C_moved[:, :3, :3], axis1=1, axis2=2))
    s_kept = np.sqrt(np.trace(C_kept[:, :3, :3], axis1=1, axis2=2))
    # At the still joint's angle the fit absorbed the fixed parameters' errors exactly; with
    # the joint elsewhere their prior shows.
    assert np.median(s_moved) > 5 * np.median(s_kept), (np.median(s_moved), np.median(s_kept))
    # And the true errors there lie inside it.
    err = true_positions(arm, moved) - res.predict(moved)[:, :3, 3]
    nees = np.einsum("ni,nij,nj->n", err, np.linalg.inv(C_moved[:, :3, :3]), err)
    assert np.mean(nees) < 3 * 1.5 and nees.max() < 16.3, nees  # chi-square 3 dof, 99.9 %
    # A single joint vector gives one (6, 6).
    assert res.prediction_covariance(moved[0]).shape == (1, 6, 6)


def test_a_well_excited_arm_considers_nothing():
    rng = np.random.default_rng(42)
    arm = independent_arm(rng)
    q = joints(rng, 50)
    res = identify(q, measure(rng, arm, q))
    assert res.considered == () and res.weakly_excited == () and res.weakly_excited_joints == ()
    assert res.sigmas == res.noise_sigmas
    assert not any(w.code == "weak_excitation" for w in res.warnings)
    assert res.full_covariance.shape == res.covariance.shape and np.array_equal(res.full_covariance, res.covariance)


def test_a_weakly_moving_joint_is_named_too():
    rng = np.random.default_rng(43)
    arm = independent_arm(rng)
    q = joints(rng, 50, joint=1, range_rad=2e-3)  # the shoulder moves +-2 mrad
    res = identify(q, measure(rng, arm, q))
    assert res.weakly_excited_joints == (2,)
    assert all("weakly determined" in res.unidentifiable_reasons[p] for p in res.weakly_excited)
    assert np.abs(scores(arm, res).z).max() < 4


def test_the_prior_is_declared_by_kind_or_name_and_zero_means_known():
    rng = np.random.default_rng(44)
    arm = independent_arm(rng)
    q = joints(rng, 40, joint=4)
    M = measure(rng, arm, q)
    base = identify(q, M)
    name = base.considered[0]
    kind = name.split(".")[1]
    wider = identify(q, M, parameter_prior={kind: 2 * DEFAULT_PARAMETER_PRIOR[kind], name: 1e-3})
    assert wider.prior_sigmas[name] == 1e-3
    others = [p for p in wider.considered if p.endswith("." + kind) and p != name]
    assert all(wider.prior_sigmas[p] == 2 * DEFAULT_PARAMETER_PRIOR[kind] for p in others)
    known = identify(q, M, parameter_prior={name: 0.0})
    assert name not in known.considered and set(known.considered) == set(base.considered) - {name}
    for bad, match in (({"link9.a": 1e-3}, "link9.a"), ({"a": -1.0}, "finite"), ({"link4.beta": 1e-3}, "link4.beta"),
                       ({"d": math.nan}, "finite")):
        with pytest.raises(ValueError, match=re.escape(match)):
            identify(q, M, parameter_prior=bad)


def test_parameters_left_out_by_the_caller_are_considered_without_a_warning():
    rng = np.random.default_rng(45)
    arm = independent_arm(rng)
    q = joints(rng, 40)
    M = measure(rng, arm, q)
    res = identify(q, M, parameters=["link2.a", "link3.a"])
    structural = {"joint1.zero_offset", "link1.d", "joint6.zero_offset", "link6.a", "link6.alpha", "link6.d"}
    assert set(res.considered) == set(parameter_names(UR5E)) - {"link2.a", "link3.a"} - structural
    assert not any(w.code == "weak_excitation" for w in res.warnings)
    # With 16 parameters of the arm left at nominal, two lengths cannot be known to microns.
    assert all(res.sigmas[p] > 50e-6 for p in res.estimated)
    assert np.abs(scores(arm, res).z).max() < 4


def test_origin_covariance_propagates_the_parameter_covariance():
    rng = np.random.default_rng(46)
    names = ["joint3.zero_offset", "link2.a", "link3.alpha", "link2.beta", "link4.d"]
    A = rng.normal(size=(5, 5)) * np.array([1e-4, 1e-4, 1e-4, 1e-4, 1e-4])
    C = A @ A.T
    cov = joint_origin_covariances(UR5E, names, C)
    assert cov.shape == (7, 6, 6)
    # Monte Carlo through the exact origins: the linearisation holds at these magnitudes.
    from cellcal.solver.kinematic_parameters import _apply

    samples = rng.multivariate_normal(np.zeros(5), C, 4000)
    O0 = joint_origins(UR5E)
    errs = np.empty((4000, 7, 6))
    for k, x in enumerate(samples):
        O = joint_origins(_apply(UR5E, names, x, "mc"))
        errs[k, :, :3] = O[:, :3, 3] - O0[:, :3, 3]
        for i in range(7):
            R = O[i, :3, :3] @ O0[i, :3, :3].T
            errs[k, i, 3:] = 0.5 * np.array([R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1]])
    emp = np.einsum("kia,kib->iab", errs, errs) / len(samples)
    scale = np.sqrt(np.einsum("iaa->ia", cov))
    for i in range(7):
        big = scale[i] > 1e-9
        assert np.allclose(np.sqrt(np.diag(emp[i]))[big], scale[i][big], rtol=0.08), i
    # Only the rows a parameter belongs to move: origin 1 (d1, theta1) takes none of these.
    assert np.allclose(cov[0], 0.0)
    with pytest.raises(ValueError, match="covariance"):
        joint_origin_covariances(UR5E, names, C[:4, :4])


def test_exports_carry_the_sigmas(still5):
    arm, q, M, res = still5
    data = json.loads(kinematic_parameters_json(res))
    for p in res.estimated:
        assert data["parameters"][p]["sigma"] == res.sigmas[p]
        assert data["parameters"][p]["noise_sigma"] == res.noise_sigmas[p]
    assert list(data["considered"]) == list(res.considered)
    for p, c in data["considered"].items():
        assert c["prior_sigma"] == res.prior_sigmas[p] and c["reason"]
    assert data["weak_excitation"] == {"joints": [5], "parameters": list(res.weakly_excited)}
    cov = data["covariance"]
    assert cov["names"] == list(res.full_covariance_names)
    assert np.allclose(np.array(cov["values"]).reshape(cov["shape"]), res.full_covariance)
    sig = joint_origin_sigmas(res)
    assert np.allclose(data["joint_origins"]["sigma_translation_m"], sig[:, :3])
    # What a writer that only has the stored dict (the daemon) passes to the URDF and YAML.
    assert np.array_equal(origin_sigmas_from_parameters(data), sig)
    assert origin_sigmas_from_parameters({"format": "cellcal.kinematics/1"}) is None
    # Joint 5 never moved: its origin carries its fixed neighbours' priors, far beyond what
    # the noise alone says; joint 1's origin (d1 and its zero: the base frame's) is exact.
    noise_only = joint_origin_sigmas(identify(q, M, parameter_prior=_NO_PRIOR))
    assert sig[4].max() > 10 * noise_only[4].max() and sig[4, :3].max() > 0.1e-3, (sig[4], noise_only[4])
    assert np.all(sig[0] == 0.0) and np.all(sig >= noise_only * (1 - 1e-9))

    # URDF: one comment per origin, the chain unchanged.
    urdf = urdf_from_model(res.model, origin_sigmas=sig)
    plain = urdf_from_model(res.model)
    root = ET.fromstring(urdf)
    assert [o.attrib for o in root.iter("origin")] == [o.attrib for o in ET.fromstring(plain).iter("origin")]
    comments = re.findall(r"<!-- 1-sigma: xyz (\S+) (\S+) (\S+) m, rotation about xyz (\S+) (\S+) (\S+) rad", urdf)
    assert len(comments) == 7
    assert np.allclose(np.array(comments, dtype=float), sig, rtol=1e-2)
    # YAML: the same per segment, as comments the UR driver's reader ignores.
    yaml = ur_calibration_yaml(res.model, origin_sigmas=sig, hash_value="calib_1")
    bare = ur_calibration_yaml(res.model, hash_value="calib_1")
    assert [ln for ln in yaml.splitlines() if not ln.lstrip().startswith("#")] == bare.splitlines()
    seg = re.findall(r"    # 1-sigma: xyz (\S+) (\S+) (\S+) m, rotation about xyz (\S+) (\S+) (\S+) rad", yaml)
    assert np.allclose(np.array(seg, dtype=float), sig[:6], rtol=1e-2)
    with pytest.raises(ValueError, match="origin_sigmas"):
        urdf_from_model(res.model, origin_sigmas=sig[:3])


def test_a_joint_that_moves_but_not_enough_is_named_for_points():
    # A reflector with joint 5 over +-0.3 rad: the wrist's twist is barely seen (the
    # condition gate fixes it); moving joint 5 over its range would show it, no other joint.
    rng = np.random.default_rng(47)
    arm = independent_arm(rng)
    q = joints(rng, 50, joint=4, range_rad=0.3)
    res = identify(q, measure(rng, arm, q), point=True)
    assert res.weakly_excited == ("link5.alpha",) and res.weakly_excited_joints == (5,)
    assert "joint 5 does not move enough to identify link5.alpha" in next(
        w.message for w in res.warnings if w.code == "weak_excitation")
