"""What the daemon declares to the solver per station, and what a station file carries of it.

* ``solve.beam_covariance``: the per-axis variances an instrument reports, read as a laser
  tracker's noise along and across its beam, give back that beam covariance;
* ``solve.station_covariance``: a stored station's two halves, its orientation rotated into
  the cell, the robot's repeatability added; none without figures;
* ``solve.solve_settings`` / ``settings_solve`` round trip and refuse wrong types;
* station files carry covariances, capture times and the settings line, all or none, and
  refuse a covariance that is not one (naming the line).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from storetest_support import make_station

from cellcal.daemon import solve
from cellcal.daemon.cli.stations_io import SETTINGS_PREFIX, StationFileError, read_stations, write_stations
from cellcal.daemon.config import Solve
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.solver.tracker_noise import TrackerNoiseModel


def test_beam_covariance_recovers_a_trackers_radial_and_transverse_noise():
    model = TrackerNoiseModel(cell_p_instrument=np.zeros(3), radial_std_m=5e-6, transverse_std_m=40e-6)
    p = np.array([2.0, -1.3, 0.4])
    C = model.point_covariance(p)[0]
    got = solve.beam_covariance(p, np.diag(C))
    np.testing.assert_allclose(got, C, rtol=1e-9, atol=1e-20)
    # isotropic figures (an instrument that states one number per axis alike) stay isotropic
    iso = solve.beam_covariance(p, np.full(3, 1e-8))
    np.testing.assert_allclose(iso, 1e-8 * np.eye(3), rtol=1e-9, atol=1e-22)


def _halves(std_t, std_r=None):
    return [{"std_translation_m": list(std_t), "std_rotation_rad": None if std_r is None else list(std_r)}] * 2


def test_station_covariance_from_the_halves_with_the_robots_repeatability():
    st = make_station(0)
    R = so3_exp(np.array([0.3, -0.2, 1.1]))
    st = dataclasses.replace(st, cell_T_target=make_transform(R, st.cell_T_target[:3, 3]),
                             raw={"tracker_halves": _halves([2e-5, 3e-5, 1e-5], [1e-5, 2e-5, 4e-5])})
    cfg = Solve()
    C = solve.station_covariance(st, cfg, point=False)
    assert C is not None and C.shape == (6, 6)
    np.testing.assert_array_equal(C, C.T)
    np.linalg.cholesky(C)
    # each half's std; the station is their mean: variance (v1 + v2) / 4 = v / 2
    var_t = np.array([2e-5, 3e-5, 1e-5]) ** 2 / 2
    np.testing.assert_allclose(np.trace(C[:3, :3]), var_t.sum() + 3 * cfg.robot_repeatability_m ** 2, rtol=1e-6)
    # the orientation's, about the target's axes, rotated into the cell's
    var_r = np.array([1e-5, 2e-5, 4e-5]) ** 2 / 2
    expect = R @ np.diag(var_r) @ R.T + cfg.robot_repeatability_rad ** 2 * np.eye(3)
    np.testing.assert_allclose(C[3:, 3:], expect, rtol=1e-9, atol=1e-24)
    # a point station: the translation block only
    Cp = solve.station_covariance(st, cfg, point=True)
    np.testing.assert_allclose(Cp, C[:3, :3])


def test_a_station_without_figures_declares_nothing():
    st = dataclasses.replace(make_station(1), raw={}, tracker_std_translation_m=0.0)
    assert solve.station_covariance(st, Solve(), point=True) is None
    assert solve.declared_noise([make_station(2), st], Solve(), point=True) == {}
    assert solve.declared_noise([make_station(2)], dataclasses.replace(Solve(), declare_noise=False), point=True) == {}


def test_solve_settings_round_trip_and_refuse_wrong_types():
    cfg = dataclasses.replace(Solve(), robot_accuracy_m=0.3e-3, max_iterations=7, declare_noise=False)
    s = solve.solve_settings(cfg)
    assert json.loads(json.dumps(s)) == s
    back = solve.settings_solve(s)
    assert all(getattr(back, k) == getattr(cfg, k) for k in solve.SOLVE_SETTING_KEYS)
    assert solve.solver_options(back).robot_accuracy_m == 0.3e-3
    for key, bad in (("max_iterations", 2.5), ("robot_accuracy_m", "1"), ("declare_noise", 1), ("min_axis_spread", None)):
        with pytest.raises(ValueError, match=key):
            solve.settings_solve({**s, key: bad})


def _stations(n=5, seed=0):
    rng = np.random.default_rng(seed)
    G = np.array([make_transform(so3_exp(rng.normal(size=3)), rng.normal(size=3)) for _ in range(n)])
    M = np.array([make_transform(so3_exp(rng.normal(size=3)), rng.normal(size=3)) for _ in range(n)])
    A = rng.normal(size=(n, 6, 6)) * 1e-5
    C = A @ A.transpose(0, 2, 1) + 1e-12 * np.eye(6)
    return G, M, C


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_station_files_carry_covariances_capture_and_settings(tmp_path, suffix):
    G, M, C = _stations()
    t = np.array([0.0, 1.5, 3.25, 4.0, 7.5])
    v = np.array([0.0, 1e-4, 2e-5, 0.0, 3e-6])
    settings = {"solve": solve.solve_settings(Solve()), "noise": "declared per station", "result": {"id": 3}}
    f = write_stations(tmp_path / f"s{suffix}", G, M, covariances=C, capture_time_s=t, capture_speed_m_s=v,
                       settings=settings)
    st = read_stations(f)
    assert st.settings == settings
    np.testing.assert_allclose(st.covariances, C, rtol=1e-15 if suffix == ".jsonl" else 1e-15, atol=0)
    np.testing.assert_array_equal(st.capture_time_s, t)
    np.testing.assert_array_equal(st.capture_speed_m_s, v)
    # points: 3x3
    P = M[:, :3, 3]
    fp = write_stations(tmp_path / f"p{suffix}", G, P, covariances=C[:, :3, :3])
    sp = read_stations(fp)
    assert sp.points is not None and sp.covariances.shape == (5, 3, 3) and sp.settings is None
    # no extras: none read
    plain = read_stations(write_stations(tmp_path / f"plain{suffix}", G, M))
    assert plain.covariances is None and plain.capture_time_s is None and plain.settings is None


def test_a_covariance_that_is_not_one_names_the_line(tmp_path):
    G, M, C = _stations(3)
    lines = [json.dumps({"base_T_flange": g.tolist(), "cell_T_target": m.tolist(), "cell_T_target_cov": c.tolist()})
             for g, m, c in zip(G, M, C, strict=True)]
    bad = C[1].copy()
    bad[0, 1] += 1e-6
    cases = {
        "not symmetric": json.dumps({"base_T_flange": G[1].tolist(), "cell_T_target": M[1].tolist(),
                                     "cell_T_target_cov": bad.tolist()}),
        "not positive definite": json.dumps({"base_T_flange": G[1].tolist(), "cell_T_target": M[1].tolist(),
                                             "cell_T_target_cov": (-C[1]).tolist()}),
        "6x6 list": json.dumps({"base_T_flange": G[1].tolist(), "cell_T_target": M[1].tolist(),
                                "cell_T_target_cov": C[1][:3].tolist()}),
        "lacks cell_T_target_cov": json.dumps({"base_T_flange": G[1].tolist(), "cell_T_target": M[1].tolist()}),
    }
    for needle, line in cases.items():
        f = tmp_path / "bad.jsonl"
        f.write_text("\n".join([lines[0], line, lines[2]]) + "\n")
        with pytest.raises(StationFileError, match=needle) as exc:
            read_stations(f)
        assert ":2:" in str(exc.value), exc.value


def test_a_settings_line_that_is_not_json_is_named(tmp_path):
    G, M, _ = _stations(3)
    f = write_stations(tmp_path / "s.jsonl", G, M)
    f.write_text(SETTINGS_PREFIX + "{oops\n" + f.read_text())
    with pytest.raises(StationFileError, match=r"s.jsonl:1: the cellcal-settings line"):
        read_stations(f)


def test_model_error_untested_passes_the_gate_and_says_the_sigma_gate_judges(tmp_path):
    from cellcal.daemon.gates import GateContext, model_error
    from cellcal.solver import calibrate_base_frame, synthetic

    scene = synthetic.base_frame_scene(4, np.random.default_rng(3), noise_mm=0.02, noise_deg=0.01)
    res = calibrate_base_frame(scene.base_T_flange, scene.measured)
    assert "model_error_untested" in {w.code for w in res.warnings}, [w.code for w in res.warnings]
    cfg = dataclasses.replace(Solve(), allow_model_error=False)
    g = model_error(res, cfg, GateContext())
    assert g is not None and g.passed and "untested" in g.message and "robot_accuracy_mm = 1" in g.message
    assert not math.isfinite(g.value)
