"""Every result type lists its estimates with ``transforms()``, and the wire form, the text
report and the exports carry all of them with their covariances (no per-type code)."""

import dataclasses
import json

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import result_to_wire, transform_from_wire, transforms_of
from cellcal.daemon.report import format_report
from cellcal.daemon.report.exports import write_exports
from cellcal.solver import (
    BaseFrameResult,
    CalibrationResult,
    Estimate,
    EyeToHandResult,
    HandEyeResult,
    PointBaseFrameResult,
    ToolPointResult,
    calibrate_base_frame,
    calibrate_base_frame_points,
    calibrate_eye_to_hand,
    calibrate_hand_eye,
    calibrate_tool_point,
)
from cellcal.solver.se3 import make_transform, se3_inverse
from cellcal.solver.synthetic import base_frame_scene, hand_eye_scene, perturb, pivot_scene, random_rotation

#: result type -> (transforms, points), in the order of the joint covariance's blocks
EXPECTED = {
    BaseFrameResult: (["cell_T_base", "flange_T_target"], []),
    HandEyeResult: (["flange_T_camera", "base_T_target"], []),
    EyeToHandResult: (["base_T_camera", "flange_T_target"], []),
    PointBaseFrameResult: (["cell_T_base"], ["flange_p_target"]),
    ToolPointResult: ([], ["flange_p_tip", "base_p_pivot"]),
}


def _solve(kind, **kw):
    rng = np.random.default_rng(7)
    if kind is BaseFrameResult:
        sc = base_frame_scene(12, rng, noise_mm=0.02, noise_deg=0.01)
        return calibrate_base_frame(sc.base_T_flange, sc.measured, **kw)
    if kind is HandEyeResult:
        sc = hand_eye_scene(12, rng, noise_mm=0.02, noise_deg=0.01)
        return calibrate_hand_eye(sc.base_T_flange, sc.measured, **kw)
    if kind is EyeToHandResult:
        X = make_transform(random_rotation(rng), rng.uniform(-2, 2, 3))
        Y = make_transform(random_rotation(rng), rng.uniform(-0.2, 0.2, 3))
        G = np.array([make_transform(random_rotation(rng), rng.uniform(-1, 1, 3)) for _ in range(12)])
        O = np.array([perturb(se3_inverse(X) @ g @ Y, rng, 0.02, 0.01) for g in G])
        return calibrate_eye_to_hand(G, O, **kw)
    if kind is PointBaseFrameResult:
        sc = base_frame_scene(12, rng)
        p = (sc.X @ sc.base_T_flange @ np.array([0.01, -0.02, 0.1, 1.0]))[:, :3] + rng.normal(scale=2e-5, size=(12, 3))
        kw.pop("uncertainty", None)
        return calibrate_base_frame_points(sc.base_T_flange, p, **kw)
    G, _, _ = pivot_scene(12, rng, noise_mm=0.02)
    return calibrate_tool_point(G)


@pytest.fixture(scope="module", params=list(EXPECTED), ids=lambda k: k.__name__)
def result(request):
    return _solve(request.param)


def test_transforms_lists_every_estimate_with_its_covariance_in_joint_order(result):
    names_T, names_p = EXPECTED[type(result)]
    est = result.transforms()
    assert list(est) == names_T + names_p
    assert [n for n, e in est.items() if e.is_point] == names_p
    offset = 0
    for name, e in est.items():
        assert isinstance(e, Estimate) and e.name == name
        assert e.value is getattr(result, name)  # the result's own arrays, not copies
        assert np.array_equal(e.covariance, getattr(result, f"{name}_covariance"))
        parent, sep, child = name.partition("_p_" if e.is_point else "_T_")
        assert (e.parent_frame, e.child_frame, e.frame) == (parent, child, parent)
        assert e.kind == ("point" if e.is_point else "transform")
        k = 3 if e.is_point else 6
        assert e.value.shape == ((3,) if e.is_point else (4, 4)) and e.covariance.shape == (k, k)
        # the joint covariance is blocked in the order transforms() lists the estimates
        assert np.array_equal(result.covariance[offset:offset + k, offset:offset + k], e.covariance)
        offset += k
    assert result.covariance.shape == (offset, offset)
    first = next(iter(est.values()))
    assert result.sigma_translation_mm == pytest.approx(1e3 * np.sqrt(np.trace(first.covariance[:3, :3])), rel=1e-12)


def test_wire_form_carries_every_estimate_and_conforms_to_the_result_body(result):
    wire = result_to_wire(result)
    est = result.transforms()
    assert set(wire["transforms"]) | set(wire["points"]) == set(est)
    for name, e in est.items():
        if e.is_point:
            assert wire["points"][name] == {"frame": e.frame, "position_m": [float(v) for v in e.value]}
        else:
            w = wire["transforms"][name]
            assert (w["parent_frame"], w["child_frame"]) == (e.parent_frame, e.child_frame)
            assert np.array_equal(transform_from_wire(w), e.value)
        c = wire["uncertainty"]["covariance"][name]
        assert np.array_equal(np.array(c["values"], dtype=float).reshape(c["shape"]), e.covariance)
    joint = wire["uncertainty"]["joint"]
    assert joint["order"] == list(est)
    assert np.array_equal(np.array(joint["values"], dtype=float).reshape(joint["shape"]), result.covariance)
    # Every field the result body declares beyond the daemon's own is written, and conforms
    # (but the intrinsics keys, which only an intrinsics result has: tests/test_intrinsics_outputs.py).
    assert P.ResultBody.__optional_keys__ - P.INTRINSICS_RESULT_KEYS <= wire.keys()
    assert not P.INTRINSICS_RESULT_KEYS & wire.keys()
    body = {**wire, "result_id": "r-1", "run_id": None, "kind": "base_frame", "cell": "c", "created_ns": 1,
            "active": True, "suspect": False, "retained": False,
            "provenance": {"config_sha256": "0" * 64, "device_serials": {"robot": "", "tracker": ""},
                           "solver": wire["solver"], "frame_convention": wire["frame_convention"],
                           "valid_from_ns": 1, "cellcal_version": "0"}}
    assert P.check_body(P.TOPIC_RESULT, P.unpack(P.pack(body))) == []
    assert json.loads(json.dumps(wire, allow_nan=False)) == wire  # strict JSON: no NaN anywhere


def test_report_shows_every_estimate(result):
    text = format_report(result)
    for name, e in result.transforms().items():
        assert (f"{name}_mm" if e.is_point else f"{name}:") in text
    assert text.count("sigma ") >= len(result.transforms())
    assert set(transforms_of(result)) == set(result.transforms())


def test_exports_carry_every_estimate(result, tmp_path):
    paths = write_exports(tmp_path, 1, result_to_wire(result))
    # Every estimate has a publisher and a xacro macro; the URDF holds the main tree only.
    ros2, xacro, launch = (paths[k].read_text() for k in ("ros2", "xacro", "launch"))
    for e in result.transforms().values():
        assert f"--frame-id {e.parent_frame} --child-frame-id {e.child_frame}" in ros2
        assert f'name="cellcal_{e.child_frame}"' in xacro and f"'{e.child_frame}'" in launch


@pytest.mark.parametrize("kind", [BaseFrameResult, HandEyeResult, EyeToHandResult])
def test_covariance_not_computed_is_nil_on_the_wire(kind):
    r = _solve(kind, refine=False, holdout=False, uncertainty=False)
    wire = result_to_wire(r)
    assert all(v is None for c in wire["uncertainty"]["covariance"].values() for v in c["values"])
    assert wire["holdout"] is None and wire["linear_agreement"] is None
    assert wire["uncertainty"]["sigma_translation_m"] is None
    assert "not computed" in format_report(r)
    body = {**wire, "result_id": "r-1", "run_id": None, "kind": "base_frame", "cell": "c", "created_ns": 1,
            "active": True, "suspect": False, "retained": False,
            "provenance": {"config_sha256": "", "device_serials": {}, "solver": "", "frame_convention": "",
                           "valid_from_ns": 1, "cellcal_version": "0"}}
    assert P.check_body(P.TOPIC_RESULT, body) == []


def test_results_are_frozen_keyword_only_and_need_their_estimates():
    r = _solve(BaseFrameResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.cell_T_base = np.eye(4)  # type: ignore[misc]
    fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    assert BaseFrameResult(**fields).transforms().keys() == r.transforms().keys()
    for missing in ("cell_T_base", "covariance", "downweighted", "flange_T_target_covariance"):
        with pytest.raises(TypeError, match=missing):
            BaseFrameResult(**{k: v for k, v in fields.items() if k != missing})
    with pytest.raises(TypeError):
        BaseFrameResult(*fields.values())  # type: ignore[misc]
    # only what a result may genuinely lack has a default
    optional = {f.name for f in dataclasses.fields(CalibrationResult) if f.default is not dataclasses.MISSING}
    assert optional == {"holdout", "linear_agreement"}
    with pytest.raises(TypeError):
        CalibrationResult(**{f.name: fields[f.name] for f in dataclasses.fields(CalibrationResult)})  # abstract


def test_estimate_names_and_shapes_are_checked():
    e = Estimate.of("flange_p_tip", np.zeros(3), np.eye(3))
    assert (e.parent_frame, e.child_frame, e.is_point) == ("flange", "tip", True)
    with pytest.raises(ValueError, match="parent_T_child or frame_p_point"):
        Estimate.of("tip", np.zeros(3), np.eye(3))
    with pytest.raises(ValueError, match="cell_T_base"):
        Estimate.of("cell_T_base", np.zeros(3), np.eye(3))


def test_gate_figures_are_on_the_wire_for_every_result(result):
    wire = json.loads(json.dumps(result_to_wire(result)))  # JSON-clean
    assert wire["converged"] is result.converged and wire["stop_reason"] == result.stop_reason
    assert wire["iterations"] == result.iterations and wire["dof"] == result.dof
    assert wire["downweighted"] == [int(i) for i in result.downweighted]
    assert wire["warnings"] == [{"code": w.code, "message": w.message, "value": w.value} for w in result.warnings]
    tests = wire["residual_tests"]
    assert set(tests) >= {"chi2_per_dof", "chi2_p", "structure_f", "structure_p", "structure_dof",
                          "redundancy_translation", "small_sample_factor", "model_error_translation_m",
                          "inflation_translation", "inflation_rotation", "false_alarm_rate"}
    assert wire["holdout"] is None or "p90_translation_m" in wire["holdout"]
    assert wire["uncertainty"]["sigma_translation_m"] == pytest.approx(result.sigma_translation_mm * 1e-3)


def test_task_point_errors_come_from_predicted_error_at():
    r = _solve(BaseFrameResult)
    pts = np.array([[0.5, 0.2, 0.1], [2.0, -1.0, 0.5]])
    wire = result_to_wire(r, task_points=pts)
    for got, p in zip(wire["task_points"], pts, strict=True):
        pe = r.predicted_error_at(p)
        assert got["point_m"] == pytest.approx(list(p)) and got["sigma_m"] == pytest.approx(pe.sigma_m)
        assert got["frame"] == "base" and got["lever_arm_m"] == pytest.approx(pe.lever_arm_m)
    tip = result_to_wire(_solve(ToolPointResult), task_points=[[0.0, 0.0, 0.0]])["task_points"][0]
    assert tip["frame"] == "flange" and tip["sigma_m"] > 0


def test_report_says_the_warnings_in_words():
    sc = base_frame_scene(12, np.random.default_rng(7), noise_mm=0.02, noise_deg=0.01)
    G = np.concatenate([sc.base_T_flange, sc.base_T_flange[:2]])
    M = np.concatenate([sc.measured, sc.measured[:2]])
    text = format_report(calibrate_base_frame(G, M))
    assert "WARNINGS:" in text and "[duplicate_stations]" in text and "solve: converged" in text
    assert "residual tests:" in text
