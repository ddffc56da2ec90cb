"""The realistic simulator's scenario keys: defaults off, units, and bad values named by dotted path."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellcal.sim.robot_scenario import parse_robot_table
from cellcal.sim.scenario import ScenarioError, load_scenario, parse_scenario

BASE = """
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [2.0, 0, 0]
cell_T_base_quat_wxyz = [1, 0, 0, 0]
flange_T_target_xyz_m = [0, 0, 0]
flange_T_target_quat_wxyz = [1, 0, 0, 0]
[tracker]
"""


def test_everything_is_off_by_default():
    sc = parse_robot_table({})
    assert not sc.factory.any and not sc.residual.any and not sc.compliance.active and not sc.thermal.active
    assert not np.any(sc.backlash_rad) and sc.remote_control and sc.initial_robot_mode == "running"
    tr = parse_scenario(BASE + "noise_mm = 0.01\nnoise_deg = 0.001\n").tracker
    assert not tr.has_beam_noise and tr.outlier_probability == 0 and tr.air_temperature_k_per_h == 0
    assert tr.reacquire_s == 0 and tr.beam_breaks_per_h == 0 and tr.clock_step_s == 0 and tr.timestamp_at == "middle"


def test_units_are_converted_to_si():
    sc = parse_robot_table({"factory": {"a_delta_mm": [0, 1, 0, 0, 0, 0], "theta_delta_deg": 0.1},
                            "residual": {"parallel_tilt_deg": [0.01, 0.02]}, "backlash_deg": 0.01,
                            "compliance": {"payload_com_mm": [0, 0, 50], "payload_kg": 1.0},
                            "thermal": {"zero_drift_deg_per_k": 0.001}})
    assert sc.factory.a_m[1] == pytest.approx(1e-3) and sc.factory.theta_rad[3] == pytest.approx(math.radians(0.1))
    np.testing.assert_allclose(sc.residual.beta_rad, np.radians([0, 0.01, 0.02, 0, 0, 0]))
    assert sc.compliance.payload_com_m[2] == pytest.approx(0.05) and sc.backlash_rad[0] == pytest.approx(math.radians(0.01))
    tr = parse_scenario(BASE + "noise_deg = 0.0\nradial_noise_um = 5\ntransverse_noise_um_per_m = 3\noutlier_mm = 0.5\n"
                        "noise_correlation_ms = 20\n").tracker
    assert tr.radial_noise_m == pytest.approx(5e-6) and tr.transverse_noise_per_m == pytest.approx(3e-6)
    assert tr.outlier_m == pytest.approx(5e-4) and tr.noise_correlation_s == pytest.approx(0.02)
    assert np.all(tr.noise_m == 0)  # with beam noise, noise_mm is optional


def test_random_deltas_are_seeded_and_independent_per_parameter():
    a = parse_robot_table({"residual": {"theta_std_deg": 0.05, "seed": 9}}).residual
    b = parse_robot_table({"residual": {"theta_std_deg": 0.05, "a_std_mm": 0.3, "seed": 9}}).residual
    c = parse_robot_table({"residual": {"theta_std_deg": 0.05, "seed": 10}}).residual
    np.testing.assert_array_equal(a.theta_rad, b.theta_rad)  # adding a std key leaves the others' draws
    assert not np.allclose(a.theta_rad, c.theta_rad) and np.any(b.a_m) and not np.any(a.a_m)


@pytest.mark.parametrize("table, path", [
    ({"factory": {"a_delta_mm": [1, 2]}}, r"robot\.factory\.a_delta_mm"),
    ({"factory": {"parallel_tilt_deg": [0, 0]}}, r"robot\.factory\.parallel_tilt_deg"),
    ({"residual": {"theta_std_deg": -1}}, r"robot\.residual\.theta_std_deg"),
    ({"compliance": {"stiffness_nm_per_rad": [-1, 0, 0, 0, 0, 0]}}, r"robot\.compliance\.stiffness_nm_per_rad"),
    ({"compliance": {"payload": 1}}, r"robot\.compliance\.payload"),
    ({"backlash_deg": [-0.1] * 6}, r"robot\.backlash_deg"),
    ({"thermal": {"time_constant_s": 0}}, r"robot\.thermal\.time_constant_s"),
    ({"thermal": {"expansion_per_k": 0.5}}, r"robot\.thermal\.expansion_per_k"),
    ({"serial_number": "UR-1"}, r"robot\.serial_number"),
    ({"remote_control": "yes"}, r"robot\.remote_control"),
    ({"initial_robot_mode": "asleep"}, r"robot\.initial_robot_mode"),
    ({"latency_jitter_ms": -1}, r"robot\.latency_jitter_ms"),
    ({"faults": [{"kind": "local_control", "start_s": 1, "node": 2}]}, r"robot\.faults\[0\]\.node"),
])
def test_bad_robot_keys_are_named(table, path):
    with pytest.raises(ScenarioError, match=path):
        parse_robot_table(table)


@pytest.mark.parametrize("extra, path", [
    ("noise_deg = 0.0\n", "tracker.noise_mm"),
    ("noise_deg = 0.0\nradial_noise_um = -1\n", "tracker.radial_noise_um"),
    ("noise_mm = 0\nnoise_deg = 0\noutlier_probability = 2\n", "tracker.outlier_probability"),
    ("noise_mm = 0\nnoise_deg = 0\ntimestamp_at = \"late\"\n", "tracker.timestamp_at"),
    ("noise_mm = 0\nnoise_deg = 0\ninstrument_xyz_m = [0, 0]\n", "tracker.instrument_xyz_m"),
    ("noise_mm = 0\nnoise_deg = 0\nbeam_break_s = 0\n", "tracker.beam_break_s"),
])
def test_bad_tracker_keys_are_named(extra, path):
    with pytest.raises(ScenarioError, match=path.replace(".", r"\.")):
        parse_scenario(BASE + extra)


def test_the_demo_scenario_turns_every_source_on():
    sc = load_scenario(__import__("pathlib").Path(__file__).resolve().parents[1] / "config" / "demo-scenario.toml")
    r = parse_robot_table(sc.robot)
    assert r.factory.any and r.residual.any and np.any(r.residual.beta_rad) and r.compliance.active
    assert np.any(r.backlash_rad) and r.thermal.active and r.serial_number == "20235500042"
    t = sc.tracker
    assert t.has_beam_noise and t.outlier_probability > 0 and t.air_temperature_k_per_h > 0 and t.reacquire_s > 0
    assert t.beam_breaks_per_h > 0 and t.latency_jitter_ms > 0 and t.clock_skew_drift_ppm_per_h > 0
