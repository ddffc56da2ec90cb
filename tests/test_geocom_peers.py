"""The simulated total station against independent GeoCOM clients: ``geocompy`` and ``pygeocom``.

Each client runs in its own process against the simulator on a pty (the client opens the
slave path as a serial port) or on loopback TCP. The simulator copes with their quirks:

* geocompy writes a lone ``"\\n"`` (sent as ``"\\n\\r\\n"``) before its first request, and its
  socket connection's ``is_open()`` writes ``"\\r\\n"``: blank lines, which the simulator
  never answers (an answer would be read as the reply to the next request);
* geocompy always sends a transaction id and rejects a reply without the same one: the
  simulator echoes it;
* geocompy sleeps 1 s after its first COM_NullProc, then reads the double precision, name,
  serial number and versions before handing over: the simulator serves all of them;
* pygeocom sends no transaction id and polls its port every 0.5 s: the simulator answers
  transaction id 0, as an instrument does, and pygeocom ignores it; pygeocom parses every
  return code into its own enum, so the simulator returns only codes that exist there on
  the paths it uses.
"""

from __future__ import annotations

import math
import multiprocessing as mp

import numpy as np
import pytest

from cellcal.drivers import geocom_codec as gc
from cellcal.sim.geocom_sim import SimGeocom
from cellcal.sim.scenario import parse_scenario

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

PEER_TIMEOUT_S = 60.0
SCENARIO = """
seed = 9
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [6.0, 4.0, -0.6]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.2
noise_deg = 0.001
model = "TS30"
serial = "366012"
firmware = "7.2.1"
"""


def _require(module: str, package: str) -> None:
    try:
        __import__(module)
    except ImportError:
        pytest.fail(f"the GeoCOM peer test needs the test dependency {package} (pip install '{package}')",
                    pytrace=False)


def _geocompy_client(where: str, transport: str, conn) -> None:
    from geocompy.communication import open_serial, open_socket
    from geocompy.geo import GeoCom

    try:
        if transport == "pty":
            line = open_serial(where, speed=9600, timeout=10)
        else:
            host, port = where.rsplit(":", 1)
            line = open_socket(host, int(port), "tcp", timeout=10)
        with line:
            tps = GeoCom(line)
            out = {
                "name": tps.csv.get_instrument_name().params,
                "serial": tps.csv.get_serial_number().params,
                "firmware": tps.csv.get_firmware_version().params,
                "precision": tps.precision,
            }
            out["atr"] = tps.aus.switch_user_atr(True).error.name
            out["atr_state"] = tps.aus.get_user_atr_state().params
            out["fine"] = tps.aut.fine_adjust(0.01, 0.01).error.name
            out["measure"] = tps.tmc.do_measurement().error.name
            mea = tps.tmc.get_simple_measurement()
            out["mea_error"] = mea.error.name
            hz, v, d = mea.params
            out["hzvd"] = (float(hz), float(v), float(d))
            coord = tps.tmc.get_coordinate()
            out["coord_error"] = coord.error.name
            c, _, _, _ = coord.params
            out["coord"] = (c.x, c.y, c.z)
            # geocompy's own polar conversion of what it read
            from geocompy.data import Angle, Coordinate

            p = Coordinate.from_polar(Angle(hz), Angle(v), d)
            out["from_polar"] = (p.x, p.y, p.z)
            out["unknown"] = tps.request(2003, [1]).error.name  # an RPC the simulator does not serve
        conn.send(("ok", out))
    except Exception as exc:  # noqa: BLE001 - report whatever went wrong to the test
        conn.send(("failed", repr(exc)))


def _pygeocom_client(path: str, conn) -> None:
    from geocom import TotalStation
    from geocom.enums import OnOffType, TMCInclinationSensorMeasurementProgram, TMCMeasurementMode
    from surveytools import Angle

    try:
        ts = TotalStation(path)
        out = {
            "name": ts.get_instrument_name(),
            "number": ts.get_instrument_number(),
            "atr": ts.set_user_atr_state(OnOffType.ON).name,
            "fine": ts.fine_adjust(Angle(0.01), Angle(0.01)).name,
            "measure": ts.do_measure(TMCMeasurementMode.TMC_DEF_DIST,
                                     TMCInclinationSensorMeasurementProgram.TMC_AUTO_INC).name,
        }
        m = ts.get_simple_measurement(5000, TMCInclinationSensorMeasurementProgram.TMC_AUTO_INC, "P1", None, None)
        out["hzvd"] = (m.direction.value_rad, m.zenith.value_rad, m.slope_distances)
        ts.serialPort.close()
        conn.send(("ok", out))
    except Exception as exc:  # noqa: BLE001 - report whatever went wrong to the test
        conn.send(("failed", repr(exc)))


def _run(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    try:
        assert parent.poll(PEER_TIMEOUT_S), "the client process sent nothing"
        status, out = parent.recv()
        assert status == "ok", f"the client failed: {out}"
        return out
    finally:
        proc.join(timeout=PEER_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def _check_point(world, hzvd, noise_m):
    truth = world.cell_T_target()[:3, 3]
    hz, v, d = hzvd
    assert 0 <= hz < 2 * math.pi and 0 <= v <= math.pi
    p = gc.cartesian_from_polar(hz, v, d)
    assert np.linalg.norm(p - truth) < 6 * float(np.linalg.norm(noise_m)) + 1e-9
    return p


@pytest.mark.parametrize("transport", ["pty", "tcp"])
def test_geocompy_connects_identifies_switches_atr_measures_and_gets_coordinates(transport):
    _require("geocompy", "geocompy==1.0.0")
    sc = parse_scenario(SCENARIO)
    world = sc.make_world()
    with SimGeocom(world, sc.tracker, transport=transport, seed=sc.seed, edm_time_s=0.1) as sim:
        where = sim.path if transport == "pty" else sim.url.split("://", 1)[1]
        out = _run(_geocompy_client, where, transport)
        assert sim.lines_ignored == 0  # the blank lines were not even errors
    assert out["name"] == "TS30" and out["serial"] == 366012 and tuple(out["firmware"]) == (7, 2, 1)
    assert out["precision"] == 15
    assert out["atr"] == out["fine"] == out["measure"] == out["mea_error"] == out["coord_error"] == "OK"
    assert out["atr_state"] is True
    n = round(0.1 * sc.tracker.sample_rate_hz)
    p = _check_point(world, out["hzvd"], sc.tracker.noise_m / math.sqrt(n))
    # the instrument's E, N, H (station at the origin) are cellcal's x, y, z
    np.testing.assert_allclose(out["coord"], p, atol=1e-9)
    # geocompy's own polar conversion agrees with cellcal's convention
    np.testing.assert_allclose(out["from_polar"], p, atol=1e-12)
    assert out["unknown"] == "COM_PROC_UNAVAIL"


def test_pygeocom_connects_identifies_switches_atr_and_measures():
    _require("geocom", "pygeocom==0.2.0")
    sc = parse_scenario(SCENARIO)
    world = sc.make_world()
    with SimGeocom(world, sc.tracker, transport="pty", seed=sc.seed, edm_time_s=0.1) as sim:
        out = _run(_pygeocom_client, sim.path)
    assert out["name"] == '"TS30"' and out["number"] == 366012  # pygeocom keeps the quotes
    assert out["atr"] == out["fine"] == out["measure"] == "GRC_OK"
    n = round(0.1 * sc.tracker.sample_rate_hz)
    _check_point(world, out["hzvd"], sc.tracker.noise_m / math.sqrt(n))
