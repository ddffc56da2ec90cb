"""The simulated emScon tracker against an independent TPI client: the ``cesapi`` package.

cesapi (PyPI ``cesapi==1.1.3``, imported as ``CESAPI``) runs in its own process: its command
loop polls its packet buffer without sleeping, which would starve the simulator's thread of
the GIL in one process. The simulator copes with cesapi's quirks:

* its reader takes a 12-byte prefix, sleeps 0.2 s, then reads the rest of the packet in one
  ``recv`` sized from the header (and asks for that full size again if the first read came
  short, reading into the next packet): the simulator writes every packet in one piece, so
  on loopback each arrives whole;
* it unpacks every answer at the size of that command's answer structure: the simulator
  always answers with the full structure, even for a failed command;
* it sleeps 0.2 s per packet received, so every event the simulator sends (units changed,
  measurement status) costs it time: the waits below allow for that.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time

import numpy as np
import pytest

from cellcal.sim.emscon_sim import SimEmscon
from cellcal.sim.scenario import FaultConfig, FaultKind, parse_scenario

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

PACKAGE = "cesapi==1.1.3"
PEER_TIMEOUT_S = 60.0

SCENARIO = """
seed = 5
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [2.5, -0.8, 0.1]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.005
noise_deg = 0.001
serial = "390793"
firmware = "3.8.900"
"""


@pytest.fixture(autouse=True)
def _cesapi_installed():
    try:
        import CESAPI.connection  # noqa: F401
    except ImportError:
        pytest.fail(f"the emScon peer test needs the test dependency {PACKAGE} (pip install '{PACKAGE}')",
                    pytrace=False)


def _client(port: int, conn) -> None:
    """Child process: cesapi drives the tracker; each step's outcome goes back on ``conn``."""
    from CESAPI.command import CommandSync
    from CESAPI.connection import Connection
    from CESAPI.packet import (
        ES_CS_RHR,
        ES_HU_RH,
        ES_AU_Radian,
        ES_LU_Millimeter,
        ES_MM_Stationary,
        ES_PU_Mbar,
        ES_TU_Celsius,
        StationaryModeDataT,
        SystemUnitsDataT,
    )

    c = Connection()
    try:
        c.connect(host="127.0.0.1", port=port)
        cmd = CommandSync(c)
        st = cmd.GetSystemStatus()
        conn.send(("status", st.trackerProcessorStatus, st.lTrackerSerialNumber,
                   (st.esVersionNumber.iMajorVersionNumber, st.esVersionNumber.iMinorVersionNumber)))
        cmd.Initialize()
        units = SystemUnitsDataT()
        units.lenUnitType, units.angUnitType, units.tempUnitType = ES_LU_Millimeter, ES_AU_Radian, ES_TU_Celsius
        units.pressUnitType, units.humUnitType = ES_PU_Mbar, ES_HU_RH
        cmd.SetUnits(units)
        cmd.SetCoordinateSystemType(ES_CS_RHR)
        cmd.SetMeasurementMode(ES_MM_Stationary)
        smd = StationaryModeDataT()
        smd.lMeasTime, smd.bUseADM = 200, 0
        cmd.SetStationaryModeParams(smd)
        got = cmd.GetUnits()
        conn.send(("units", got.unitsSettings.lenUnitType))
        res = cmd.StartMeasurement()
        conn.send(("point", res.dVal1, res.dVal2, res.dVal3, res.dStd1, res.dStd2, res.dStd3, res.dTemperature))
        # a long measurement, during which the parent breaks the beam
        smd.lMeasTime = 20_000
        cmd.SetStationaryModeParams(smd)
        conn.send(("measuring",))
        try:
            cmd.StartMeasurement()
            conn.send(("no error",))
        except Exception as exc:  # noqa: BLE001 - cesapi raises a bare Exception with the status
            conn.send(("error", str(exc)))
    except Exception as exc:  # noqa: BLE001 - report whatever went wrong to the test
        conn.send(("failed", repr(exc)))
    finally:
        c.disconnect()


def _recv(conn, what: str):
    assert conn.poll(PEER_TIMEOUT_S), f"cesapi sent nothing while {what}"
    msg = conn.recv()
    assert msg[0] != "failed", f"cesapi failed while {what}: {msg[1]}"
    return msg


def test_cesapi_initialises_sets_units_measures_and_sees_the_beam_break():
    sc = parse_scenario(SCENARIO)
    world = sc.make_world()
    with SimEmscon(world, sc.tracker, seed=sc.seed) as sim:
        port = int(sim.url.rsplit(":", 1)[1])
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_client, args=(port, child), daemon=True)
        proc.start()
        try:
            _, tps, serial, version = _recv(parent, "asking the system status")
            assert tps == 3 and serial == 390793 and version == (3, 8)  # booted, not initialised yet
            assert _recv(parent, "setting up")[1] == 1  # millimetres, as it asked
            assert sim.device.initialized and sim.device.meas_time_ms == 200
            _, x, y, z, sx, sy, sz, temp = _recv(parent, "measuring")
            truth_mm = world.cell_T_target()[:3, 3] * 1e3
            assert np.linalg.norm(np.array([x, y, z]) - truth_mm) < 0.05  # 5 um noise, averaged
            n = round(0.2 * sc.tracker.sample_rate_hz)
            np.testing.assert_allclose([sx, sy, sz], sc.tracker.noise_m * 1e3 / np.sqrt(n))
            assert temp == 20.0
            _recv(parent, "starting the long measurement")
            deadline = time.monotonic() + PEER_TIMEOUT_S
            while not sim.device.measuring:
                assert time.monotonic() < deadline, "the long measurement never started"
                time.sleep(0.01)
            # the beam breaks now, for good
            broken = FaultConfig(FaultKind.BEAM_BREAK, start_s=world.now_s(), duration_s=1e6)
            sim.device.model.config = dataclasses.replace(sc.tracker, faults=(broken,))
            kind, message = _recv(parent, "measuring through the beam break")
            assert kind == "error" and "Command 49 failed with status 10009" in message  # NoStationaryResult
        finally:
            proc.join(timeout=10)  # it disconnects as soon as it has reported
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
