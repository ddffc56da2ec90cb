"""Daemon configuration: dotted-path errors, SI conversion, check-config."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from cellcal.daemon.config import ConfigError, load_config, load_config_text

CONFIG_DIR = Path(__file__).resolve().parents[1] / "config"


def test_units_convert_to_si():
    c = load_config_text(
        "config_version = 1\n[robot.settle]\nmax_flange_speed_mm_s = 0.2\nmax_joint_speed_deg_s = 1.0\n"
        "[tracker.settle]\nmax_std_mm = 0.03\nmax_std_deg = 0.5\n[plan]\nworkspace_min_mm=[-1000, -200, 50]\n"
    )
    assert c.robot.settle.max_flange_speed_m_s == pytest.approx(0.2e-3)
    assert c.robot.settle.max_joint_speed_rad_s == pytest.approx(math.radians(1.0))
    assert c.tracker.settle.max_std_translation_m == pytest.approx(0.03e-3)
    assert c.tracker.settle.max_std_rotation_rad == pytest.approx(math.radians(0.5))
    assert c.plan.workspace_min_m == pytest.approx([-1.0, -0.2, 0.05])
    assert len(c.sha256) == 64


@pytest.mark.parametrize(
    "text, path, expect",
    [
        ("[robot]\nurl='x'\n", "config_version", "missing"),
        ("config_version = 7\n", "config_version", "not supported"),
        ("config_version = 1\n[capture]\nsync_windw_s = 1\n", "capture.sync_windw_s", "did you mean 'sync_window_s'"),
        ("config_version = 1\n[robot.settle]\ndwell = 1\n", "robot.settle.dwell", "unknown key"),
        ("config_version = 1\nbogus = 1\n", "bogus", "unknown key"),
        ("config_version = 1\n[robot]\nread_timeout_s = 'soon'\n", "robot.read_timeout_s", "finite number"),
        ("config_version = 1\n[capture]\nmotion_mode = 'drive'\n", "capture.motion_mode", "command, observe"),
        ("config_version = 1\n[capture]\nmax_attempts_per_station = 1.5\n", "capture.max_attempts_per_station", "integer"),
        ("config_version = 1\n[drift]\nenabled = 1\n", "drift.enabled", "true or false"),
        ("config_version = 1\n[plan]\nworkspace_min_mm = [1, 2]\n", "plan.workspace_min_mm", "3 numbers"),
        ("config_version = 1\n[plan]\nworkspace_max_mm = [1, 2, 3]\n", "plan.workspace_max_mm", "exceed"),
        ("config_version = 1\n[robot]\nsettle = 3\n", "robot.settle", "table"),
        ("config_version = 1\n[drift]\nwarn_mm = 1.0\nfail_mm = 0.5\n", "drift.fail_mm", "warn_mm"),
        ("config_version = 1\n[capture]\nmove_speed = 2.0\n", "capture.move_speed", "(0, 1]"),
        ("config_version = 1\n[zmq]\ncurve = true\n", "zmq.server_secret_key_file", "required"),
        ("config_version = 1\n[[zmq.clients]]\npublic_key = 'short'\n", "zmq.clients[0].public_key", "40-character"),
        ("config_version = 1\n[[zmq.clients]]\npublic_key = 'x'\nrolle = 'operator'\n", "zmq.clients[0].rolle", "unknown key"),
        ("config_version = 1\n[plan]\nkind = 'explicit'\n[[plan.stations]]\nq_deg = [0,0,0,0,0,0]\n",
         "plan.stations", "at least 3"),
        (
            "config_version = 1\n[plan]\nkind='explicit'\n" + "[[plan.stations]]\nq_deg=[0,0,0,0,0,0]\n" * 2
            + "[[plan.stations]]\nflange_xyz_mm=[1,2,3]\n",
            "plan.stations[2]",
            "flange_xyz_mm needs 3 numbers and flange_quat_wxyz 4",
        ),
        ("config_version = 1\n[robot\n", "", "not valid TOML"),
    ],
)
def test_errors_name_the_dotted_path(text, path, expect):
    with pytest.raises(ConfigError) as ei:
        load_config_text(text, source="cell.toml")
    e = ei.value
    assert e.path == path
    assert expect in str(e) and "cell.toml" in str(e)
    assert isinstance(e, ValueError)


def test_explicit_plan_in_si():
    text = "config_version = 1\n[plan]\nkind='explicit'\n" + "".join(
        f"[[plan.stations]]\nq_deg=[{i},10,20,30,40,50]\n" for i in range(3)
    ) + "[[plan.stations]]\nflange_xyz_mm=[400,0,300]\nflange_quat_wxyz=[0,1,0,0]\n"
    c = load_config_text(text)
    assert len(c.plan.stations) == 4
    assert c.plan.stations[1].q_rad[0] == pytest.approx(math.radians(1))
    assert c.plan.stations[3].flange_xyz_m == pytest.approx([0.4, 0.0, 0.3])


@pytest.mark.parametrize("name", ["cellcal.toml", "cellcal-can.toml", "demo.toml"])
def test_example_configs_load(name):
    path = CONFIG_DIR / name
    if not path.exists():
        pytest.fail(f"config/{name} is missing")
    c = load_config(path)
    assert c.config_version == 1 and c.robot.url and c.tracker.url


def test_check_config_cli(tmp_path):
    cli = [sys.executable, "-m", "cellcal.daemon.cli", "check-config"]
    good = tmp_path / "good.toml"
    good.write_text("config_version = 1\n[robot.settle]\ndwell_s = 2\n")
    r = subprocess.run([*cli, str(good), "--no-devices", "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["robot"]["settle"]["dwell_s"] == 2.0
    # without --json: a summary for people, the gates in words
    r = subprocess.run([*cli, str(good), "--no-devices"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith(f"{good}: valid (cell 'cell'"), r.stdout
    assert "rms_translation: at most 0.5 mm" in r.stdout and "{" not in r.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("config_version = 1\n[tracker.settle]\nmax_std_um = 1\n")
    r = subprocess.run([*cli, str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "tracker.settle.max_std_um" in r.stderr and "bad.toml" in r.stderr
    opts = tmp_path / "opts.toml"
    opts.write_text(
        "config_version = 1\n[robot]\nurl='rtde://127.0.0.1'\n[tracker]\nurl='socket://127.0.0.1:4000'\n"
        "[tracker.options]\ntimeout_sec = 3\n"
    )
    r = subprocess.run([*cli, str(opts)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "tracker.options" in r.stderr and "timeout_sec" in r.stderr
