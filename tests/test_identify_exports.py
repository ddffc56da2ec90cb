"""Exports of an identified arm (solver/kinematic_export.py) and the ISO 9283 pose test
(solver/iso9283.py)."""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from _kin_world import CELL_T_BASE, FLANGE_T_TARGET, measure, random_q, truth_arm

from cellcal.solver import (
    UR5E,
    identify_kinematics,
    inverse_kinematics,
    iso9283_pose_test,
    iso9283_test_poses,
    kinematic_parameters_json,
    simulate_iso9283_cycles,
    ur_calibration_yaml,
    urdf_from_model,
)
from cellcal.solver.kinematic_export import joint_origins, rpy_from_matrix
from cellcal.solver.se3 import make_transform


def _rpy_matrix(r, p, y):
    def rot(axis, t):
        c, s = math.cos(t), math.sin(t)
        R = np.eye(3)
        i, j = [(1, 2), (0, 2), (0, 1)][axis]
        R[i, i], R[i, j], R[j, i], R[j, j] = c, -s, s, c
        if axis == 1:
            R[0, 2], R[2, 0] = s, -s
        return R

    return rot(2, y) @ rot(1, p) @ rot(0, r)


def _origin(x, y, z, r, p, yaw):
    return make_transform(_rpy_matrix(r, p, yaw), [x, y, z])


def _rz(t):
    return make_transform(_rpy_matrix(0, 0, t), [0, 0, 0])


@pytest.fixture(scope="module")
def identified():
    rng = np.random.default_rng(21)
    truth = truth_arm(rng)
    st, val = measure(truth, random_q(rng, 50), rng), measure(truth, random_q(rng, 30), rng)
    return identify_kinematics(st.q, UR5E, cell_T_target=st.cell_T_target, cell_T_target_cov=st.pose_cov,
                               validation_q=val.q, validation_cell_T_target=val.cell_T_target), truth


def test_rpy_round_trip_including_gimbal_lock():
    rng = np.random.default_rng(0)
    for r, p, y in list(rng.uniform(-3, 3, (20, 3))) + [(0.3, math.pi / 2, 0.2), (0.0, -math.pi / 2, 1.0)]:
        R = _rpy_matrix(r, p, y)
        assert np.allclose(_rpy_matrix(*rpy_from_matrix(R)), R, atol=1e-12)


def test_urdf_chain_forward_kinematics_equals_the_model(identified):
    res, _ = identified
    text = urdf_from_model(res.model, robot_name="ur5e_cal")
    root = ET.fromstring(text)
    assert root.tag == "robot" and root.get("name") == "ur5e_cal"
    joints = root.findall("joint")
    assert [j.get("name") for j in joints] == [f"joint{i}" for i in range(1, 7)] + ["flange_joint"]
    assert [j.get("type") for j in joints] == ["revolute"] * 6 + ["fixed"]
    q = np.random.default_rng(3).uniform(-math.pi, math.pi, (10, 6))
    for k in range(len(q)):
        T = np.eye(4)
        for i, j in enumerate(joints):
            o = j.find("origin")
            xyz = [float(v) for v in o.get("xyz").split()]
            rpy = [float(v) for v in o.get("rpy").split()]
            T = T @ _origin(*xyz, *rpy)
            if j.get("type") == "revolute":
                assert j.find("axis").get("xyz") == "0 0 1"
                T = T @ _rz(q[k, i])
        assert np.abs(T - res.model.forward(q[k])).max() < 1e-9


def test_ur_calibration_yaml_matches_urs_layout_and_the_model(identified):
    # The nominal UR5e gives the numbers of UR's default_kinematics.yaml.
    text = ur_calibration_yaml(UR5E, hash_value="calib_123")
    parsed = _parse_yaml(text)
    assert parsed["hash"] == "calib_123"
    sh, ua, fa, w1, w2, w3 = (parsed[s] for s in ("shoulder", "upper_arm", "forearm", "wrist_1", "wrist_2", "wrist_3"))
    assert sh["z"] == pytest.approx(0.1625) and ua["roll"] == pytest.approx(math.pi / 2)
    assert fa["x"] == pytest.approx(-0.425) and (w1["x"], w1["z"]) == pytest.approx((-0.3922, 0.1333))
    assert w2["y"] == pytest.approx(-0.0997) and w2["roll"] == pytest.approx(math.pi / 2)
    assert w3["y"] == pytest.approx(0.0996)
    assert np.allclose(_rpy_matrix(w3["roll"], w3["pitch"], w3["yaw"]), _rpy_matrix(-math.pi / 2, 0, 0), atol=1e-12)
    # The identified arm: the chain of the YAML's origins is the model's FK.
    res, _ = identified
    parsed = _parse_yaml(ur_calibration_yaml(res.model))
    assert str(parsed["hash"]).startswith("calib_")
    q = np.random.default_rng(4).uniform(-math.pi, math.pi, (5, 6))
    for k in range(len(q)):
        T = np.eye(4)
        for i, seg in enumerate(("shoulder", "upper_arm", "forearm", "wrist_1", "wrist_2", "wrist_3")):
            s = parsed[seg]
            T = T @ _origin(s["x"], s["y"], s["z"], s["roll"], s["pitch"], s["yaw"]) @ _rz(q[k, i])
        assert np.abs(T - res.model.forward(q[k])).max() < 1e-9
    with pytest.raises(ValueError, match="row 6"):
        ur_calibration_yaml(UR5E.with_errors(delta_a=[0, 0, 0, 0, 0, 1e-3]))


def _parse_yaml(text):
    lines = text.splitlines()
    assert lines[0] == "kinematics:"
    out, seg = {}, None
    for line in lines[1:]:
        if line.startswith("  hash: "):
            out["hash"] = line.split(": ", 1)[1]
        elif line.startswith("    "):
            key, val = line.strip().split(": ")
            out[seg][key] = float(val)
        elif line.startswith("  "):
            seg = line.strip().rstrip(":")
            out[seg] = {}
    return out


def test_parameters_json_carries_values_deltas_sigmas_and_reasons(identified):
    res, _ = identified
    data = json.loads(kinematic_parameters_json(res))
    assert data["units"] == "m, rad" and data["measurement"] == "pose"
    assert set(data["parameters"]) == set(res.estimated)
    p = data["parameters"]["link2.a"]
    assert p["value"] == res.parameters["link2.a"] and p["sigma"] == res.sigmas["link2.a"]
    assert p["delta"] == pytest.approx(p["value"] - UR5E.a[1])
    assert "base frame" in data["unidentifiable"]["joint1.zero_offset"]
    assert np.allclose(data["identified"]["a"], res.model.a) and np.allclose(data["nominal"]["d"], UR5E.d)
    assert np.allclose(data["cell_T_base"], res.cell_T_base)
    assert data["validation"]["after"]["rms_translation_m"] < data["validation"]["before"]["rms_translation_m"]


def test_joint_origins_of_classical_dh_rows():
    O = joint_origins(UR5E)
    assert O.shape == (7, 4, 4)
    assert np.allclose(O[0][:3, 3], [0, 0, 0.1625]) and np.allclose(O[6], np.eye(4))


def test_iso9283_figures_as_the_standard_defines_them():
    commanded = np.array([[0.0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    rng = np.random.default_rng(0)
    offset = np.array([1e-4, -2e-4, 0.0])
    scatter = rng.normal(0, 1e-5, (30, 5, 3))
    attained = commanded[None] + offset + scatter
    res = iso9283_pose_test(commanded, attained)
    xbar = attained.mean(axis=0)
    assert res.ap_m == pytest.approx(np.linalg.norm(xbar - commanded, axis=1))
    assert res.ap_m == pytest.approx(np.full(5, np.linalg.norm(offset)), abs=1e-5)
    l_i = np.linalg.norm(attained - xbar, axis=2)
    assert res.rp_m == pytest.approx(l_i.mean(axis=0) + 3 * l_i.std(axis=0, ddof=1))
    assert res.cycles == 30 and res.max_ap_m == res.ap_m.max()
    assert np.all(np.isnan(res.ap_abc_rad))
    with pytest.raises(ValueError, match="two cycles"):
        iso9283_pose_test(commanded, attained[:1])
    with pytest.raises(ValueError, match="attained"):
        iso9283_pose_test(commanded, attained[:, :4])


def test_iso9283_poses_on_the_diagonal_plane_and_identification_improves_ap():
    poses = iso9283_test_poses(UR5E, cube_centre_m=[-0.45, -0.15, 0.35])
    P = poses.base_T_flange[:, :3, 3]
    c, h = poses.cube_centre_m, poses.cube_side_m / 2
    assert 0.1 < poses.cube_side_m < 1.0
    assert np.allclose(P[0], c)
    corners = c + h * np.array([[-1, -1, -1], [1, 1, -1], [1, 1, 1], [-1, -1, 1]])
    diag = np.linalg.norm(corners[2] - corners[0])
    for k in range(4):
        assert np.linalg.norm(P[k + 1] - corners[k]) == pytest.approx(0.1 * diag)
    assert np.allclose(UR5E.forward(poses.q), poses.base_T_flange, atol=1e-9)
    # A slightly bigger cube is out of reach: this one is the largest (to 1 mm).
    with pytest.raises(ValueError):
        iso9283_test_poses(UR5E, cube_centre_m=c, cube_side_m=poses.cube_side_m + 0.05)
    rng = np.random.default_rng(31)
    truth = truth_arm(rng)
    st = measure(truth, random_q(rng, 60), rng)
    res = identify_kinematics(st.q, UR5E, cell_T_target=st.cell_T_target, cell_T_target_cov=st.pose_cov)
    rigid = identify_kinematics(st.q, UR5E, cell_T_target=st.cell_T_target, cell_T_target_cov=st.pose_cov,
                                parameters=[])
    commanded = np.einsum("ij,njk->nik", CELL_T_BASE, poses.base_T_flange) @ FLANGE_T_TARGET
    common = dict(true_model=truth, true_cell_T_base=CELL_T_BASE, true_flange_T_tool=FLANGE_T_TARGET,
                  q_seed=poses.q, joint_repeatability_rad=2e-5, measure_std_m=5e-6)
    before = iso9283_pose_test(commanded, simulate_iso9283_cycles(
        commanded, controller_model=rigid.model, controller_cell_T_base=rigid.cell_T_base,
        controller_flange_T_tool=rigid.flange_T_target, rng=np.random.default_rng(1), **common))
    after = iso9283_pose_test(commanded, simulate_iso9283_cycles(
        commanded, controller_model=res.model, controller_cell_T_base=res.cell_T_base,
        controller_flange_T_tool=res.flange_T_target, rng=np.random.default_rng(1), **common))
    assert after.max_ap_m < 0.2 * before.max_ap_m, (after.max_ap_m, before.max_ap_m)
    # Repeatability is the arm's, not the model's: the same within sampling.
    assert after.max_rp_m == pytest.approx(before.max_rp_m, rel=0.3)
    assert np.all(np.isfinite(after.ap_abc_rad))


def test_inverse_kinematics_reaches_and_refuses():
    q0 = np.array([0.3, -1.0, 1.2, -1.5, -1.4, 0.2])
    T = UR5E.forward(q0)[0]
    q = inverse_kinematics(UR5E, T, q0 + 0.05)
    assert np.allclose(UR5E.forward(q)[0], T, atol=1e-9)
    with pytest.raises(ValueError, match="not reached"):
        inverse_kinematics(UR5E, make_transform(np.eye(3), [3.0, 0, 0]), q0)


def test_the_daemons_kinematics_exports_carry_sigmas_and_a_refused_one_says_so(tmp_path):
    """The daemon's kinematics files (``runs.kinematics_report.write_kinematics_exports``): each
    joint origin's 1-sigma beside it in the arm URDF and the UR calibration YAML; a result that
    failed its gates gets the refused marks in every file's first line (and the JSON's first
    key), as the generic exports of a refused result do."""
    import json as _json

    from _report_kinds import kinematics_kind

    from cellcal.daemon.report.refused import REFUSED_MARK
    from cellcal.daemon.runs.kinematics_report import kinematics_export_file_names, write_kinematics_exports

    body, _stations, _result = kinematics_kind()
    body = {**body, "provenance": {**body.get("provenance", {}), "devices": {"robot": {"model": "UR5e"}}}}
    names = kinematics_export_file_names(9)
    (tmp_path / "ok").mkdir()
    (tmp_path / "bad").mkdir()
    out = write_kinematics_exports(tmp_path / "ok", 9, body)
    urdf = out["arm_urdf"].read_text()
    assert "1-sigma: xyz" in urdf and REFUSED_MARK not in urdf
    if "ur_calibration" in out:
        assert "1-sigma" in out["ur_calibration"].read_text()
    refused = {**body, "gates": {**body["gates"], "passed": False,
                                 "failed": ["kinematic_holdout_rms: held-out rms 0.900 mm > 0.100 mm"]}}
    bad = write_kinematics_exports(tmp_path / "bad", 9, refused)
    for key, path in bad.items():
        if key != "kinematics":  # the JSON says it in its first key
            first = path.read_text().splitlines()[0]
            assert REFUSED_MARK in first, (key, first)
    assert next(iter(_json.loads(bad["kinematics"].read_text()))) == "GATES_FAILED"
    assert set(names) >= set(bad)


def test_show_and_the_report_name_what_was_held_at_nominal_and_the_weak_joints():
    """The parameters held at nominal whose prior every sigma carries (consider covariance),
    and the ``weak_excitation`` joints, are in ``cellcal show``'s lines and the report."""
    from _report_kinds import kinematics_kind

    from cellcal.daemon.runs.kinematics_report import identification_section, kinematics_lines

    body, _stations, _result = kinematics_kind()
    k = {**body["kinematics"],
         "considered": {"joint2.zero_offset": {"value": 0.0, "prior_sigma": 1.7e-3, "reason": "joint 2 barely moved"}},
         "weak_excitation": {"joints": [2], "parameters": ["joint2.zero_offset"]}}
    text = "\n".join(kinematics_lines(k))
    assert "held at nominal" in text and "joint2.zero_offset: 1-sigma 0.09740 deg (joint 2 barely moved)" in text
    assert "weakly excited: joint2 moved too little to identify joint2.zero_offset" in text
    html = identification_section({**body, "kinematics": k})
    assert 'class="considered"' in html and "joint 2 barely moved" in html and "weakly excited: joint2" in html
