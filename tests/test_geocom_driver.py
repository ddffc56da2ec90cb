"""The GeoCOM backend against scripted exchanges on a real pty and a loopback socket.

Each test scripts the exact lines the driver must send and the instrument's answers; the
script must be consumed exactly, with nothing left over (PyMeasure's expected_protocol).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _scripted import ScriptedDevice

from cellcal.drivers import connect_tracker
from cellcal.drivers import geocom_codec as gc
from cellcal.drivers import tracker as trk
from cellcal.drivers.errors import DriverInitError
from cellcal.drivers.geocom import GeocomTrackerDriver, serial_url
from cellcal.drivers.geocom_codec import RC, Rpc


def q(rpc: int, trid: int, *params, crc: bool = False) -> bytes:
    return gc.encode(gc.Request.of(rpc, *params, trid=trid, crc=crc))


def p(trid: int, rc: int = RC.OK, *values, crc: bool = False, com_rc: int = RC.OK) -> bytes:
    return gc.encode(gc.Reply.of(rc, *values, trid=trid, crc=crc, com_rc=com_rc))


OPEN = [
    (b"\r\n", None),  # the blank line that clears the instrument's receiver: no answer
    (q(Rpc.COM_NULL_PROC, 1), p(1)),
    (q(Rpc.AUS_SET_USER_ATR_STATE, 2, True), p(2)),
    (q(Rpc.CSV_GET_INSTRUMENT_NAME, 3), p(3, RC.OK, "TS30")),
    (q(Rpc.CSV_GET_INSTRUMENT_NO, 4), p(4, RC.OK, 366012)),
    (q(Rpc.CSV_GET_SW_VERSION, 5), p(5, RC.OK, 7, 2, 1)),
    (q(Rpc.COM_GET_SW_VERSION, 6), p(6, RC.OK, 1, 50, 0)),
    (q(Rpc.COM_NULL_PROC, 7), p(7)),  # the clock exchange
]
HZ, V, D = 0.75, 1.4, 12.5


def measure_steps(first_trid: int, mea_reply: bytes | None = None, *, atr: bool = True):
    t = first_trid
    steps = []
    if atr:
        steps.append((q(Rpc.AUT_FINE_ADJUST, t, 0.0175, 0.0175, 0), p(t)))
        t += 1
    steps.append((q(Rpc.TMC_DO_MEASURE, t, 1, 1), p(t)))
    steps.append((q(Rpc.TMC_GET_SIMPLE_MEA, t + 1, 5000, 1), mea_reply or p(t + 1, RC.OK, HZ, V, D)))
    return steps


def _url(dev: ScriptedDevice) -> str:
    return f"geocom://{dev.url}" if dev.transport == "pty" else dev.url.replace("socket://", "geocom+socket://")


def _driver(url, **kw):
    kw.setdefault("timeout_s", 0.5)
    kw.setdefault("clock_sync_count", 1)
    kw.setdefault("clock_resync_s", 1e9)
    return connect_tracker(url, **kw)


@pytest.mark.parametrize("transport", ["pty", "tcp"])
def test_open_identify_and_measure_a_point(transport):
    with ScriptedDevice([*OPEN, *measure_steps(8)], transport) as dev:
        drv = _driver(_url(dev), angle_std_rad=2e-6, distance_std_m=1e-3, distance_ppm=2.0)
        assert isinstance(drv, GeocomTrackerDriver) and not drv.is_open
        with drv:
            assert drv.info == trk.TrackerInfo("TS30", "366012", "7.2.1", "GeoCOM 1.50.0", "M_RAD")
            m = drv.measure("point")
        dev.assert_done()
    # x east, y north, z up; Hz clockwise from +y, V from +z
    want = [D * math.sin(V) * math.sin(HZ), D * math.sin(V) * math.cos(HZ), D * math.cos(V)]
    np.testing.assert_allclose(m.cell_p_target, want, rtol=1e-12)
    J = gc.polar_jacobian(HZ, V, D)
    sd = 1e-3 + 2e-6 * D
    np.testing.assert_allclose(m.std_translation_m ** 2, (J ** 2) @ [4e-12, 4e-12, sd**2], rtol=1e-9)
    assert m.kind == "point" and m.sample_count == 1 and m.flags == trk.MeasurementFlags.NONE


def test_without_atr_nothing_is_switched_or_fine_adjusted():
    script = [OPEN[0], OPEN[1], *[(q(r, t - 1), a.replace(f",{t}:".encode(), f",{t - 1}:".encode()))
                                  for (r, t), (_, a) in zip(
                                      [(Rpc.CSV_GET_INSTRUMENT_NAME, 3), (Rpc.CSV_GET_INSTRUMENT_NO, 4),
                                       (Rpc.CSV_GET_SW_VERSION, 5), (Rpc.COM_GET_SW_VERSION, 6),
                                       (Rpc.COM_NULL_PROC, 7)], OPEN[3:], strict=True)],
              *measure_steps(7, atr=False)]
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev), atr=False) as drv:
            drv.measure("point")
        dev.assert_done()


@pytest.mark.parametrize("step, rc, exc", [
    ("fine", RC.AUT_NO_TARGET, trk.NoTargetError),
    ("fine", RC.AUT_NOT_ENABLED, trk.NotInitializedError),
    ("mea", RC.TMC_DIST_ERROR, trk.BeamBrokenError),
    ("mea", RC.TMC_ANGLE_OK, trk.BeamBrokenError),
    ("mea", RC.TMC_ANGLE_ERROR, trk.NotStableError),
    ("mea", RC.TMC_BUSY, trk.TrackerBusyError),
    ("mea", RC.ABORT, trk.MeasurementAbortedError),
    ("mea", 4242, trk.TrackerDeviceError),
])
def test_return_codes_raise_typed_errors(step, rc, exc):
    if step == "fine":
        steps = [(q(Rpc.AUT_FINE_ADJUST, 8, 0.0175, 0.0175, 0), p(8, rc))]
    else:
        steps = measure_steps(8, p(10, rc, HZ, V, 0.0))
    with ScriptedDevice([*OPEN, *steps], "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(exc) as ei:
            drv.measure("point")
        assert type(ei.value) is exc and ei.value.code == gc.rc_name(rc)
        dev.assert_done()


def test_a_warning_code_keeps_the_values_and_flags_them():
    with ScriptedDevice([*OPEN, *measure_steps(8, p(10, RC.TMC_NO_FULL_CORRECTION, HZ, V, D))], "tcp") as dev:
        with _driver(_url(dev)) as drv:
            m = drv.measure("point")
        assert m.flags == trk.MeasurementFlags.UNCOMPENSATED and np.linalg.norm(m.cell_p_target) == pytest.approx(D)
        dev.assert_done()


def test_a_late_reply_to_another_transaction_is_dropped():
    steps = measure_steps(8, p(9) + p(10, RC.OK, HZ, V, D))  # DoMeasure's answer twice: the first is stale
    with ScriptedDevice([*OPEN, *steps], "tcp") as dev:
        with _driver(_url(dev)) as drv:
            drv.measure("point")
            assert drv.discarded == 1
        dev.assert_done()


def test_checksums_both_ways_and_a_damaged_reply_is_repeated():
    script = [(b"\r\n", None)] + [(q(r, t, *a, crc=True), p(t, RC.OK, *v, crc=True)) for r, t, a, v in [
        (Rpc.COM_NULL_PROC, 1, (), ()), (Rpc.AUS_SET_USER_ATR_STATE, 2, (True,), ()),
        (Rpc.CSV_GET_INSTRUMENT_NAME, 3, (), ("TS30",)), (Rpc.CSV_GET_INSTRUMENT_NO, 4, (), (1,)),
        (Rpc.CSV_GET_SW_VERSION, 5, (), (1, 0, 0)), (Rpc.COM_GET_SW_VERSION, 6, (), (1, 50, 0)),
        (Rpc.COM_NULL_PROC, 7, (), ()),
    ]]
    crc = gc.crc16_arc(b"%R1P,0,8:0")
    damaged = f"%R1P,0,8,{(crc + 1) % 65536}:0\r\n".encode()  # a wrong checksum
    script += [(q(Rpc.AUT_FINE_ADJUST, 8, 0.0175, 0.0175, 0, crc=True), damaged),
               (q(Rpc.AUT_FINE_ADJUST, 9, 0.0175, 0.0175, 0, crc=True), p(9, crc=True)),
               (q(Rpc.TMC_DO_MEASURE, 10, 1, 1, crc=True), p(10, crc=True)),
               (q(Rpc.TMC_GET_SIMPLE_MEA, 11, 5000, 1, crc=True), p(11, RC.OK, HZ, V, D, crc=True))]
    with ScriptedDevice(script, "pty") as dev:
        with _driver(_url(dev), checksum=True) as drv:
            drv.measure("point")
        dev.assert_done()


def test_a_reply_garbled_beyond_parsing_is_repeated_at_once_not_waited_for():
    """Noise glued in front of a reply on the serial line makes a line that is no reply at
    all: the call is repeated at once (new transaction id), not after the deadline."""
    garbled = b"\x93\x07zq" + p(8)  # noise before the line: not a reply
    steps = [(q(Rpc.AUT_FINE_ADJUST, 8, 0.0175, 0.0175, 0), garbled), *measure_steps(9)]
    with ScriptedDevice([*OPEN, *steps], "pty") as dev:
        # Waiting for the reply instead would end in TrackerTimeoutError at the deadline.
        with _driver(_url(dev)) as drv:
            drv.measure("point")
            assert drv.discarded == 1
        dev.assert_done()


def test_the_instrument_saying_it_got_a_damaged_request_is_repeated():
    steps = [(q(Rpc.AUT_FINE_ADJUST, 8, 0.0175, 0.0175, 0), p(8, com_rc=RC.COM_SRVR_RX_CHECKSUM_ERROR)),
             *measure_steps(9)]
    with ScriptedDevice([*OPEN, *steps], "tcp") as dev:
        with _driver(_url(dev)) as drv:
            drv.measure("point")
        dev.assert_done()


def test_an_instrument_without_atr_fails_open_with_a_hint():
    script = [OPEN[0], OPEN[1], (q(Rpc.AUS_SET_USER_ATR_STATE, 2, True), p(2, RC.NOT_IMPL))]
    with ScriptedDevice(script, "tcp") as dev:
        with pytest.raises(DriverInitError, match="atr=False"):
            _driver(_url(dev)).open()
        dev.assert_done()


def test_silence_times_out():
    with ScriptedDevice([*OPEN, (q(Rpc.AUT_FINE_ADJUST, 8, 0.0175, 0.0175, 0), None)], "tcp") as dev:
        with _driver(_url(dev), fine_adjust_timeout_s=0.2, edm_wait_s=0.1) as drv:
            with pytest.raises(trk.TrackerTimeoutError):
                drv.measure("point")
        dev.assert_done()


def test_stop_and_status():
    script = [*OPEN, (q(Rpc.TMC_DO_MEASURE, 8, 0, 1), p(8)), (q(Rpc.COM_NULL_PROC, 9), p(9))]
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev)) as drv:
            drv.stop()
            assert drv.status().warmed_up
        dev.assert_done()


@pytest.mark.parametrize("url, port_url, opts", [
    ("geocom:///dev/ttyUSB0", "/dev/ttyUSB0", {}),
    ("geocom:///dev/ttyUSB0?baud=19200", "/dev/ttyUSB0", {"baudrate": 19200}),
    ("geocom://COM3", "COM3", {}),
    ("geocom+socket://127.0.0.1:5000", "socket://127.0.0.1:5000", {}),
    ("geocom+socket://127.0.0.1:5000?logging=debug", "socket://127.0.0.1:5000?logging=debug", {}),
    ("geocom+spy:///dev/ttyUSB0?baud=9600", "spy:///dev/ttyUSB0", {"baudrate": 9600}),
])
def test_urls(url, port_url, opts):
    assert serial_url(url) == (port_url, opts)
    drv = connect_tracker(url)
    assert isinstance(drv, GeocomTrackerDriver) and drv.url == port_url
    assert drv.baudrate == opts.get("baudrate", gc.DEFAULT_BAUDRATE)


@pytest.mark.parametrize("url", ["geocom://", "geocom:///dev/x?parity=E", "geocom:///dev/x?baud=fast",
                                 "geocom+socket://"])
def test_bad_urls(url):
    with pytest.raises(ValueError):
        connect_tracker(url)


def test_options_are_checked_and_must_agree_with_the_url():
    with pytest.raises(ValueError, match="contradicts"):
        connect_tracker("geocom:///dev/x?baud=9600", baudrate=19200)
    for bad in ({"edm_wait_s": 0}, {"angle_std_rad": -1.0}, {"inclination": 7}, {"search_hz_rad": math.nan}):
        with pytest.raises(ValueError):
            connect_tracker("geocom:///dev/x", **bad)
    with pytest.raises(ValueError, match="point only"):
        connect_tracker("geocom:///dev/x").measure("pose")


@pytest.mark.parametrize("hz, v, d, field", [
    (100.0, V, D, "hz"),  # +100 rad: the attack that was accepted
    (-0.01, V, D, "hz"),
    (2 * math.pi + 1e-6, V, D, "hz"),
    (HZ, 3.5, D, "v"),  # a face II zenith angle
    (HZ, -0.2, D, "v"),
    (HZ, 7.0, D, "v"),
    (HZ, V, 1.0e5, "slope_distance"),
])
def test_angles_and_distances_no_instrument_reports_are_refused(hz, v, d, field):
    with ScriptedDevice([*OPEN, *measure_steps(8, p(10, RC.OK, hz, v, d))], "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(trk.ImplausibleMeasurementError) as ei:
            drv.measure("point")
        assert ei.value.field == field and ei.value.code == "IMPLAUSIBLE"
        assert isinstance(ei.value, trk.TrackerDeviceError)  # a refused station, not a link fault
        dev.assert_done()
