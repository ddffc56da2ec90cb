"""`cellcal init`: a commented starting configuration that `cellcal check-config` accepts."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cellcal.daemon.cli.init import ROBOTS, SIM_PORTS, render
from cellcal.daemon.config import load_config_text

CLI = [sys.executable, "-m", "cellcal.daemon.cli"]


def _cli(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=60, cwd=cwd, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("robot", ["ur", "cia402", "sim"])
def test_each_robot_gives_a_commented_file_check_config_accepts(robot, tmp_path):
    out = tmp_path / "cellcal.toml"
    r = _cli("init", "--robot", robot, "-o", str(out))
    assert r.returncode == 0 and f"wrote {out}" in r.stderr, r.stderr
    text = out.read_text()
    header = text.split("\nconfig_version")[0]
    assert text.startswith("# cellcal starting configuration") and "# Check it with:  cellcal check-config FILE" in header
    assert sum(ln.lstrip().startswith("#") or " # " in ln for ln in text.splitlines()) > 20  # commented throughout
    r = _cli("check-config", str(out))
    assert r.returncode == 0, r.stderr
    cfg = load_config_text(text)
    expected = {"ur": "rtde://", "cia402": "canopen://", "sim": "rtde://127.0.0.1:"}[robot]
    assert cfg.robot.url.startswith(expected) and cfg.export.cell_frame == "cell"


def test_default_is_ur_on_standard_output():
    r = _cli("init")
    assert r.returncode == 0 and r.stdout == render("ur")
    assert tomllib.loads(r.stdout)["robot"]["url"].startswith("rtde://")
    assert set(ROBOTS) == {"ur", "cia402", "sim"}


def test_an_existing_file_is_kept_unless_forced(tmp_path):
    out = tmp_path / "mine.toml"
    out.write_text("# my own\n")
    r = _cli("init", "--robot", "sim", "-o", str(out))
    assert r.returncode == 2 and "exists" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    assert out.read_text() == "# my own\n"
    r = _cli("init", "--robot", "sim", "-o", str(out), "--force")
    assert r.returncode == 0 and out.read_text() == render("sim")
    r = _cli("init", "-o", str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr
    r = _cli("init", "-o", str(tmp_path / "no" / "such" / "dir.toml"))
    assert r.returncode == 2 and "cannot write" in r.stderr and "Traceback" not in r.stderr
    r = _cli("init", "--robot", "kuka")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_the_sim_header_starts_the_simulator_the_config_points_at():
    text = render("sim")
    cmd = " ".join(ln.lstrip("# ").rstrip("\\ ") for ln in text.splitlines()
                   if re.match(r"#\s+(cellcal sim|--)", ln))
    argv = shlex.split(cmd)
    assert argv[:2] == ["cellcal", "sim"]
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    cfg = load_config_text(text)
    robot, tracker = urlsplit(cfg.robot.url), urlsplit(cfg.tracker.url)
    assert robot.hostname == "127.0.0.1" and robot.port == int(opts["--robot-port"]) == SIM_PORTS["robot"]
    assert tracker.hostname == "127.0.0.1" and tracker.port == int(opts["--tracker-port"])
    assert opts["--tracker-transport"] == "tcp"
    # The URScript, dashboard and primary ports are the RTDE driver's defaults (not in the URL).
    from cellcal.drivers.ur_dashboard import DEFAULT_DASHBOARD_PORT
    from cellcal.drivers.ur_primary import DEFAULT_PRIMARY_PORT
    from cellcal.drivers.ur_rtde import DEFAULT_URSCRIPT_PORT

    assert int(opts["--urscript-port"]) == DEFAULT_URSCRIPT_PORT and int(opts["--dashboard-port"]) == DEFAULT_DASHBOARD_PORT
    assert int(opts["--primary-port"]) == DEFAULT_PRIMARY_PORT
    assert Path(opts["--scenario"]).is_file()  # the packaged scenario, an absolute path
    assert cfg.zmq.pub_endpoint.startswith("tcp://127.0.0.1:") and cfg.service.state_dir == ".cellcal-sim/state"
