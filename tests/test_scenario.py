"""Scenario files: every key validated, errors name the dotted path, the world matches."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from cellcal.sim.scenario import (
    FaultKind,
    ScenarioError,
    load_scenario,
    parse_scenario,
)
from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import matrix_from_quat

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "demo-scenario.toml"
DOC = ROOT / "docs" / "simulation.md"

MINIMAL = """
[time]
scale = 2.0
[truth]
cell_T_base_xyz_m = [1.0, 2.0, 3.0]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.1]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.01
noise_deg = [0.001, 0.002, 0.003]
"""

NOISE_DEG = "noise_deg = [0.001, 0.002, 0.003]"

# Every key the loader knows, each with a valid value: the doc must name all of them.
FULL = """
name = "full"
description = "every key"
seed = 7
[time]
scale = 10.0
[truth]
cell_T_base_xyz_m = [1.0, 2.0, 3.0]
cell_T_base_quat_wxyz = [0.0, 0.0, 0.0, 1.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.1]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
base_T_flange_xyz_m = [0.3, 0.1, 0.5]
base_T_flange_quat_wxyz = [0.0, 1.0, 0.0, 0.0]
[tracker]
noise_mm = [0.01, 0.01, 0.02]
noise_deg = 0.001
sample_rate_hz = 2000.0
clock_offset_s = 100.0
clock_skew_ppm = -25.0
latency_ms = 0.5
warmup_s = 1.0
min_range_m = 0.3
max_range_m = 30.0
stable_speed_m_s = 0.0002
stable_speed_rad_s = 0.002
model = "M"
serial = "S"
firmware = "F"
[[tracker.faults]]
kind = "beam_break"
start_s = 1.0
duration_s = 0.5
[[tracker.faults]]
kind = "no_target"
start_s = 2.0
duration_s = 0.5
[[tracker.faults]]
kind = "not_stable"
start_s = 3.0
duration_s = 0.5
[[tracker.faults]]
kind = "disconnect"
start_s = 4.0
duration_s = 0.5
[[tracker.faults]]
kind = "garbage"
start_s = 5.0
duration_s = 0.5
burst_bytes = 10
corrupt_probability = 0.2
[[tracker.faults]]
kind = "trickle"
start_s = 6.0
duration_s = 0.5
byte_interval_ms = 2.0
[[tracker.faults]]
kind = "frozen"
start_s = 7.0
duration_s = 0.5
[[tracker.faults]]
kind = "wild_value"
start_s = 8.0
duration_s = 0.5
value_mm = 1000000.0
[[tracker.faults]]
kind = "future_timestamp"
start_s = 9.0
duration_s = 0.5
offset_s = 12.5
[[tracker.faults]]
kind = "frozen_position"
start_s = 10.0
duration_s = 0.5
[[tracker.faults]]
kind = "fixed_reflector"
start_s = 11.0
duration_s = 0.5
[[tracker.faults]]
kind = "wrong_reflector"
start_s = 12.0
duration_s = 0.5
offset_mm = 40.0
every = 3
[[tracker.faults]]
kind = "wild_angle"
start_s = 13.0
duration_s = 0.5
value_rad = -7.5
[[drift]]
at_s = 10.0
delta_xyz_m = [0.001, 0.0, 0.0]
delta_rotvec_deg = [0.0, 0.0, 0.1]
[robot]
kind = "ur_rtde"
[robot.joints]
offsets_rad = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
"""


def test_demo_scenario_loads_and_builds_the_world():
    sc = load_scenario(DEMO)
    assert sc.name == "demo" and sc.time_scale == 5.0 and sc.source == str(DEMO)
    w = sc.make_world(clock=lambda: 0.0)
    expected = sc.truth.cell_T_base @ sc.truth.base_T_flange @ sc.truth.flange_T_target
    np.testing.assert_allclose(w.cell_T_target(0.0), expected)
    # 45 degrees about z, as the file says
    np.testing.assert_allclose(sc.truth.cell_T_base[:3, :3], matrix_from_quat([np.cos(np.pi / 8), 0, 0, np.sin(np.pi / 8)]))


def test_full_scenario_every_key():
    sc = parse_scenario(FULL)
    t = sc.tracker
    assert sc.seed == 7 and sc.time_scale == 10.0 and sc.name == "full"
    np.testing.assert_allclose(t.noise_m, [1e-5, 1e-5, 2e-5])
    np.testing.assert_allclose(t.noise_rad, np.radians([0.001] * 3))
    assert t.clock_skew_ppm == -25.0 and t.latency_ms == 0.5 and t.model == "M"
    assert [f.kind for f in t.faults] == list(FaultKind)
    assert t.faults[4].burst_bytes == 10 and t.faults[5].byte_interval_ms == 2.0
    assert t.faults[7].value_mm == 1e6 and t.faults[8].offset_s == 12.5
    assert t.faults[11].offset_mm == 40.0 and t.faults[11].every == 3 and t.faults[12].value_rad == -7.5
    assert sc.robot == {"kind": "ur_rtde", "joints": {"offsets_rad": [0.0] * 6}}
    np.testing.assert_allclose(sc.truth.base_T_flange[:3, 3], [0.3, 0.1, 0.5])


def test_minimal_scenario_defaults():
    sc = parse_scenario(MINIMAL)
    assert sc.seed == 0 and sc.robot == {} and sc.drift == () and sc.tracker.faults == ()
    np.testing.assert_allclose(sc.tracker.noise_m, [1e-5] * 3)
    np.testing.assert_allclose(np.degrees(sc.tracker.noise_rad), [0.001, 0.002, 0.003])


def test_drift_shifts_the_base_at_its_time():
    sc = parse_scenario(FULL)
    now = [0.0]
    w = sc.make_world(clock=lambda: now[0])
    before = w.cell_T_target()
    now[0] = 0.99  # wall seconds: 9.9 simulated at scale 10
    np.testing.assert_allclose(w.cell_T_target(), before)
    now[0] = 1.0
    after = w.cell_T_target()
    delta = after @ np.linalg.inv(before)
    np.testing.assert_allclose(delta[:3, 3] - (delta[:3, :3] - np.eye(3)) @ np.zeros(3), delta[:3, 3])
    assert np.degrees(np.arccos((np.trace(delta[:3, :3]) - 1) / 2)) == pytest.approx(0.1, abs=1e-9)
    np.testing.assert_allclose(
        w.cell_T_base() @ np.linalg.inv(w.cell_T_base(0.0)), sc.drift[0].cell_delta, atol=1e-12
    )


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    "edit, path",
    [
        (lambda s: "bogus = 1\n" + s, "bogus"),
        (lambda s: _replace(s, "scale = 10.0", "scale = 10.0\nspeed = 1"), "time.speed"),
        (lambda s: _replace(s, "[truth]", "[truth]\ncell_T_base_rpy_deg = [0, 0, 0]"), "truth.cell_T_base_rpy_deg"),
        (lambda s: _replace(s, 'firmware = "F"', 'firmware = "F"\nnoise_m = 1'), "tracker.noise_m"),
        (lambda s: _replace(s, "burst_bytes = 10", "burst_bytes = 10\nbyte_interval_ms = 1.0"),
         "tracker.faults[4].byte_interval_ms"),
        (lambda s: _replace(s, 'kind = "beam_break"', 'kind = "beam_break"\nburst_bytes = 3'), "tracker.faults[0].burst_bytes"),
        (lambda s: _replace(s, "at_s = 10.0", "at_s = 10.0\ndelta_xyz_mm = [1, 0, 0]"), "drift[0].delta_xyz_mm"),
    ],
)
def test_unknown_keys_name_their_dotted_path(edit, path):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(edit(FULL))
    assert str(info.value).startswith(f"{path}: unknown key")


@pytest.mark.parametrize(
    "edit, path",
    [
        (lambda s: _replace(s, "scale = 2.0", ""), "time.scale"),
        (lambda s: _replace(s, "noise_mm = 0.01", ""), "tracker.noise_mm"),
        (lambda s: _replace(s, "noise_deg = [0.001, 0.002, 0.003]", ""), "tracker.noise_deg"),
        (lambda s: _replace(s, "cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]", ""), "truth.cell_T_base_quat_wxyz"),
        (lambda s: _replace(s, "flange_T_target_xyz_m = [0.0, 0.0, 0.1]", ""), "truth.flange_T_target_xyz_m"),
        (lambda s: _replace(s, "[tracker]\nnoise_mm = 0.01\nnoise_deg = [0.001, 0.002, 0.003]", ""), "tracker"),
    ],
)
def test_missing_keys_name_their_dotted_path(edit, path):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(edit(MINIMAL))
    assert str(info.value).startswith(f"{path}: required")


@pytest.mark.parametrize(
    "old, new, path",
    [
        ("scale = 2.0", "scale = 0.0", "time.scale"),
        ("scale = 2.0", 'scale = "fast"', "time.scale"),
        ("scale = 2.0", "scale = nan", "time.scale"),
        ("noise_mm = 0.01", "noise_mm = -0.01", "tracker.noise_mm"),
        ("noise_mm = 0.01", "noise_mm = [0.01, 0.01]", "tracker.noise_mm"),
        ("noise_mm = 0.01", "noise_mm = true", "tracker.noise_mm"),
        ("cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]", "cell_T_base_quat_wxyz = [1.0, 0.1, 0.0, 0.0]",
         "truth.cell_T_base_quat_wxyz"),
        ("cell_T_base_xyz_m = [1.0, 2.0, 3.0]", "cell_T_base_xyz_m = [1.0, 2.0]", "truth.cell_T_base_xyz_m"),
        ("noise_mm = 0.01", 'noise_mm = 0.01\nmodel = "a,b"', "tracker.model"),
        ("noise_mm = 0.01", "noise_mm = 0.01\nclock_skew_ppm = 5000.0", "tracker.clock_skew_ppm"),
        (NOISE_DEG, NOISE_DEG + "\n[[tracker.faults]]\nkind = \"meteor\"\nstart_s = 0\nduration_s = 1", "tracker.faults[0].kind"),
        (NOISE_DEG, NOISE_DEG + "\n[[tracker.faults]]\nkind = \"garbage\"\nstart_s = 0\nduration_s = 0",
         "tracker.faults[0].duration_s"),
        (NOISE_DEG, NOISE_DEG + "\n[[tracker.faults]]\nkind = \"garbage\"\nstart_s = 0\nduration_s = 1\n"
         "corrupt_probability = 1.5",
         "tracker.faults[0].corrupt_probability"),
        ("[time]", "seed = -1\n[time]", "seed"),
        ("[time]", "robot = 3\n[time]", "robot"),
    ],
)
def test_bad_values_name_their_dotted_path(old, new, path):
    with pytest.raises(ScenarioError) as info:
        parse_scenario(_replace(MINIMAL, old, new))
    assert str(info.value).startswith(f"{path}:")


def test_scenario_error_is_a_value_error_and_a_cellcal_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[time\nscale = 1")
    with pytest.raises(ScenarioError) as info:
        load_scenario(bad)
    assert isinstance(info.value, ValueError) and isinstance(info.value, CellcalError)
    assert str(bad) in str(info.value)


def test_faults_activity_windows():
    sc = parse_scenario(FULL)
    beam = sc.tracker.faults[0]
    assert not beam.active(0.99) and beam.active(1.0) and beam.active(1.49) and not beam.active(1.5)
    assert beam.overlaps(0.0, 1.0) and beam.overlaps(1.2, 9.0) and not beam.overlaps(1.5, 2.0)
    assert [f.kind for f in sc.tracker.active_faults(5.2)] == [FaultKind.GARBAGE]


def _keys(table: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in table.items():
        if isinstance(v, dict) and k != "robot":
            out |= {f"{prefix}{k}"} | _keys(v, f"{prefix}{k}.")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            out.add(f"{prefix}{k}")
            for item in v:
                out |= _keys(item, f"{prefix}{k}.")
        else:
            out.add(f"{prefix}{k}")
    return out


def test_every_key_is_documented():
    import tomllib

    doc = DOC.read_text()
    documented = set(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_.]*)`", doc))
    documented |= {t.split(".")[-1] for t in re.findall(r"`\[\[?([a-z_.]+)\]\]?`", doc)}
    keys = {k.split(".")[-1] for k in _keys(tomllib.loads(FULL))}
    missing = sorted(k for k in keys if k not in documented)
    assert not missing, f"keys not documented in docs/simulation.md: {missing}"
    for kind in FaultKind:
        assert f"`{kind.value}`" in doc
