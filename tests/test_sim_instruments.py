"""Our emScon and GeoCOM backends end to end against the simulated instruments, and
``cellcal sim --instrument``: one world, three protocols."""

from __future__ import annotations

import dataclasses
import json
import math
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cellcal.drivers import connect_robot, connect_tracker
from cellcal.drivers import tracker as trk
from cellcal.sim.emscon_sim import SimEmscon
from cellcal.sim.geocom_sim import SimGeocom
from cellcal.sim.scenario import FaultConfig, FaultKind, load_scenario, parse_scenario

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "config" / "demo-scenario.toml"
WAIT_S = 20.0


def scenario(extra: str = ""):
    return parse_scenario(f"""
seed = 3
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [2.5, -0.8, 0.1]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.01
noise_deg = 0.001
{extra}
""")


def _break_beam(sim, world, sc):
    sim.device.model.config = dataclasses.replace(
        sc.tracker, faults=(FaultConfig(FaultKind.BEAM_BREAK, start_s=world.now_s(), duration_s=1e6),))


def _wait_for(cond, what):
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# -- emScon ---------------------------------------------------------------------------------------


def test_emscon_measures_the_world_with_the_model_noise():
    sc = scenario()
    world = sc.make_world()
    with SimEmscon(world, sc.tracker, seed=sc.seed) as sim, connect_tracker(sim.url, timeout_s=2.0) as tr:
        assert sim.device.initialized  # the driver initialised it (it was booted)
        assert tr.info.serial == "1" and tr.info.protocol_version == "TPI 1.0"
        errs = []
        for _ in range(20):
            m = tr.measure("point", average_s=0.05)
            errs.append(m.cell_p_target - world.cell_T_target()[:3, 3])
        n = round(0.05 * sc.tracker.sample_rate_hz)
        np.testing.assert_allclose(m.std_translation_m, sc.tracker.noise_m / math.sqrt(n))
        z = np.array(errs) / m.std_translation_m
        assert np.all(np.abs(z) < 6) and 0.3 < float(np.std(z)) < 2.0
        st = tr.status()
        assert st.warmed_up and st.target_locked and not st.measuring


def test_emscon_beam_break_during_and_before_a_measurement():
    sc = scenario()
    world = sc.make_world()
    with SimEmscon(world, sc.tracker, seed=sc.seed) as sim, connect_tracker(sim.url, timeout_s=2.0) as tr:
        out: dict = {}

        def measure():
            try:
                tr.measure("point", average_s=10.0)
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                out["exc"] = exc

        t = threading.Thread(target=measure)
        t.start()
        _wait_for(lambda: sim.device.measuring, "the measurement to start")
        _break_beam(sim, world, sc)
        t.join(WAIT_S)
        assert isinstance(out.get("exc"), trk.BeamBrokenError)
        with pytest.raises(trk.NoTargetError):  # no reflector locked: refused at the start
            tr.measure("point")


def test_emscon_refusals_from_the_shared_model():
    sc = scenario("warmup_s = 1000.0")
    world = sc.make_world()
    with SimEmscon(world, sc.tracker, seed=sc.seed) as sim, connect_tracker(sim.url, timeout_s=2.0) as tr:
        with pytest.raises(trk.NotWarmedUpError):
            tr.measure("point")
        assert not tr.status().warmed_up
        sim.device.model.config = dataclasses.replace(sc.tracker, warmup_s=0.0)
        world.set_flange(world.base_T_flange(), lin_speed_m_s=0.5)  # the arm moves through the window
        with pytest.raises(trk.NoStationaryResultError):
            tr.measure("point", average_s=0.05)


def test_emscon_never_initialise_and_the_state_survives_a_reconnect():
    sc = scenario()
    world = sc.make_world()
    with SimEmscon(world, sc.tracker, seed=sc.seed) as sim:
        with connect_tracker(sim.url, timeout_s=2.0, initialize="never") as tr:
            with pytest.raises(trk.NotInitializedError):
                tr.measure("point")
        with connect_tracker(sim.url, timeout_s=2.0) as tr:
            tr.measure("point")
            tr.reconnect()  # the tracker stays initialised: no second Initialize needed
            assert sim.device.initialized
            tr.measure("point")


# -- GeoCOM ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", ["pty", "tcp"])
def test_geocom_measures_the_world(transport):
    sc = scenario()
    world = sc.make_world()
    with SimGeocom(world, sc.tracker, transport=transport, seed=sc.seed, edm_time_s=0.02) as sim, \
            connect_tracker(sim.url, timeout_s=2.0) as tr:
        assert tr.info.model == "CELLCAL-SIM-T1" and sim.device.atr
        n = round(0.02 * sc.tracker.sample_rate_hz)
        for _ in range(5):
            m = tr.measure("point")
            err = m.cell_p_target - world.cell_T_target()[:3, 3]
            assert np.all(np.abs(err) < 6 * sc.tracker.noise_m / math.sqrt(n) + 1e-12)
        assert np.all(m.std_translation_m > 0)


def test_geocom_faults_from_the_shared_model():
    sc = scenario()
    world = sc.make_world()
    with SimGeocom(world, sc.tracker, transport="tcp", seed=sc.seed, edm_time_s=0.5) as sim, \
            connect_tracker(sim.url, timeout_s=2.0) as tr:
        out: dict = {}

        def measure():
            try:
                tr.measure("point")
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                out["exc"] = exc

        t = threading.Thread(target=measure)
        t.start()
        _wait_for(lambda: sim.device._edm is not None and not sim.device._edm.done, "the EDM to start")
        _break_beam(sim, world, sc)
        t.join(WAIT_S)
        assert isinstance(out.get("exc"), trk.BeamBrokenError) and out["exc"].code == "TMC_DIST_ERROR"
        with pytest.raises(trk.NoTargetError):  # the ATR finds no prism
            tr.measure("point")
        sim.device.model.config = sc.tracker
        world.set_flange(world.base_T_flange(), lin_speed_m_s=0.5)
        with pytest.raises(trk.NotStableError):
            tr.measure("point")


def test_geocom_survives_a_trickling_line_with_checksums():
    sc = scenario("""
[[tracker.faults]]
kind = "trickle"
start_s = 0.0
duration_s = 1000.0
byte_interval_ms = 0.2
""")
    world = sc.make_world()
    with SimGeocom(world, sc.tracker, transport="pty", seed=sc.seed, edm_time_s=0.01) as sim, \
            connect_tracker(sim.url, timeout_s=3.0, checksum=True) as tr:
        m = tr.measure("point")
        assert np.linalg.norm(m.cell_p_target - world.cell_T_target()[:3, 3]) < 1e-3


# -- cellcal sim --instrument --------------------------------------------------------------------


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cellcal.daemon.cli", "sim", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.parametrize("instrument, transport, prefix", [
    ("emscon", None, "emscon://127.0.0.1:"),
    ("geocom", None, "geocom:///"),
    ("geocom", "tcp", "geocom+socket://127.0.0.1:"),
])
def test_cellcal_sim_serves_each_instrument_from_the_one_world(instrument, transport, prefix):
    args = ["--scenario", str(DEMO), "--instrument", instrument]
    if transport:
        args += ["--tracker-transport", transport]
    proc = _start(*args)
    try:
        r, _, _ = select.select([proc.stdout], [], [], WAIT_S)
        assert r, "cellcal sim printed nothing"
        urls = json.loads(proc.stdout.readline())
        assert set(urls) == {"tracker", "robot", "camera", "dashboard", "primary"} and urls["tracker"].startswith(prefix)
        with connect_tracker(urls["tracker"], timeout_s=3.0) as tracker, connect_robot(urls["robot"]) as robot:
            m = tracker.measure("point")
            st = robot.read_state(timeout_s=2.0)
        sc = load_scenario(DEMO)
        predicted = sc.truth.cell_T_base @ st.base_T_flange @ sc.truth.flange_T_target
        assert np.linalg.norm(predicted[:3, 3] - m.cell_p_target) < 5e-3
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()


def test_cellcal_sim_refuses_emscon_on_a_pty():
    proc = _start("--scenario", str(DEMO), "--instrument", "emscon", "--tracker-transport", "pty")
    out, err = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 2 and out == b"" and b"emscon is served on tcp only" in err
