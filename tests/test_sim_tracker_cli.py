"""``cellcal sim``: one JSON line with the URLs, serve until SIGTERM/SIGINT, exit 0."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cellcal.drivers import connect_robot, connect_tracker
from cellcal.sim.scenario import load_scenario

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "demo-scenario.toml"
START_TIMEOUT_S = 60.0  # a fresh interpreter on a loaded machine
STOP_TIMEOUT_S = 10.0


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "cellcal.daemon.cli", "sim", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _first_line(proc: subprocess.Popen) -> str:
    r, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    if not r:
        proc.kill()
        pytest.fail("cellcal sim printed nothing")
    return proc.stdout.readline().decode()


@pytest.mark.parametrize(
    "transport, sig", [("pty", signal.SIGTERM), ("tcp", signal.SIGINT)]
)
def test_sim_prints_urls_serves_and_stops(transport, sig):
    proc = _start("--scenario", str(DEMO), "--tracker-transport", transport)
    try:
        urls = json.loads(_first_line(proc))
        assert set(urls) == {"tracker", "robot", "camera", "dashboard", "primary"} and urls["robot"].startswith("rtde://127.0.0.1:")
        assert urls["camera"] is None  # no --camera: none served
        with connect_tracker(urls["tracker"], timeout_s=2.0) as tracker:
            assert tracker.identify().model == "CELLCAL-SIM-T1"
            m = tracker.measure("pose", average_s=0.01)
            assert m.cell_T_target.shape == (4, 4)
        with connect_robot(urls["robot"]) as robot:
            st = robot.read_state(timeout_s=2.0)
            # The robot and the tracker share one world: the tracker sees the flange the robot
            # reports, through the scenario's hidden cell_T_base and flange_T_target.
            scenario = load_scenario(DEMO)
            predicted = scenario.truth.cell_T_base @ st.base_T_flange @ scenario.truth.flange_T_target
            assert np.linalg.norm(predicted[:3, 3] - m.cell_p_target) < 2e-3
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out == b""  # exactly one line in all


def test_sim_rejects_a_bad_scenario(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[time]\nscale = 1\nwarp = 9\n")
    proc = _start("--scenario", str(bad))
    out, err = proc.communicate(timeout=START_TIMEOUT_S)
    assert proc.returncode == 2 and out == b""
    assert b"time.warp: unknown key" in err
