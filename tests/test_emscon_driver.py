"""The emScon backend against scripted TPI exchanges on a real loopback socket.

Each test scripts the exact packets the driver must send and the tracker's answers; the
script must be consumed exactly, with nothing left over (PyMeasure's expected_protocol).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from _scripted import ScriptedDevice

from cellcal.drivers import connect_tracker
from cellcal.drivers import emscon_codec as tpi
from cellcal.drivers import tracker as trk
from cellcal.drivers.emscon import EmsconTrackerDriver
from cellcal.drivers.emscon_codec import Command, Status, StatusChange, encode
from cellcal.drivers.errors import DriverInitError

OK = Status.ALL_OK


def cmd(c: int) -> bytes:
    return encode(tpi.SimpleCommand(c))


def ans(c: int, status: int = OK) -> bytes:
    return encode(tpi.Reply(c, status))


def sysstat(tps: int = tpi.TrackerProcessorStatus.INITIALIZED, laser: int = tpi.LaserStatus.LASER_READY) -> bytes:
    return encode(tpi.SystemStatusReply(OK, OK, tps, laser, tpi.AdmStatus.ADM_READY, 3, 8, 900,
                                        tpi.WeatherMonitorStatus.READ_ONLY, 0, 390793))


def result(x=1.25, y=-0.5, z=0.75, std=(1e-6, 2e-6, 3e-6), status=OK) -> bytes:
    return encode(tpi.SingleMeasResult(status, 0, 0, x, y, z, *std, float(np.linalg.norm(std)),
                                       0.0, 0.0, 0.0, 1e-5, 1e-5, 1e-5, 2e-5, 20.0, 1013.25, 50.0))


SETUP = [
    (encode(tpi.SetUnits(0, 0, 0, 0, 0)), ans(Command.SET_UNITS) + encode(tpi.SystemStatusChange(StatusChange.UNITS_CHANGED))),
    (encode(tpi.SetCoordinateSystemType(0)), ans(Command.SET_COORDINATE_SYSTEM_TYPE)),
    (encode(tpi.SetMeasurementMode(0)), ans(Command.SET_MEASUREMENT_MODE)),
]
IDENTIFY_AND_PING = [
    (cmd(Command.GET_SYSTEM_STATUS), sysstat()),
    (cmd(Command.GET_TRACKER_STATUS), encode(tpi.TrackerStatusReply(OK, tpi.TrackerState.READY))),
]
OPEN_INITIALISED = [(cmd(Command.GET_SYSTEM_STATUS), sysstat()), *SETUP, *IDENTIFY_AND_PING]


def _url(dev: ScriptedDevice) -> str:
    return dev.url.replace("socket://", "emscon://")


def _driver(url, **kw):
    kw.setdefault("timeout_s", 0.5)
    kw.setdefault("clock_sync_count", 1)
    kw.setdefault("clock_resync_s", 1e9)
    return connect_tracker(url, **kw)


def test_open_initialises_a_booted_tracker_then_sets_units_frame_and_mode():
    script = [
        (cmd(Command.GET_SYSTEM_STATUS), sysstat(tpi.TrackerProcessorStatus.BOOTED)),
        (cmd(Command.INITIALIZE), ans(Command.INITIALIZE)
         + encode(tpi.SystemStatusChange(StatusChange.INITIALIZATION_STATUS_CHANGED))),
        *SETUP, *IDENTIFY_AND_PING,
    ]
    with ScriptedDevice(script, "tcp") as dev:
        drv = _driver(_url(dev))
        assert isinstance(drv, EmsconTrackerDriver) and not drv.is_open  # no I/O yet
        with drv:
            assert drv.info == trk.TrackerInfo("Leica emScon tracker", "390793", "emScon 3.8.900", "TPI 3.8", "M_RAD")
            assert drv.clock.n_samples == 1
        dev.assert_done()


@pytest.mark.parametrize("mode, booted, initializes", [
    ("auto", False, False), ("always", False, True), ("never", True, False),
])
def test_initialize_option(mode, booted, initializes):
    tps = tpi.TrackerProcessorStatus.BOOTED if booted else tpi.TrackerProcessorStatus.INITIALIZED
    script = [(cmd(Command.GET_SYSTEM_STATUS), sysstat(tps))]
    if initializes:
        script.append((cmd(Command.INITIALIZE), ans(Command.INITIALIZE)))
    script += SETUP + IDENTIFY_AND_PING
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev), initialize=mode):
            pass
        dev.assert_done()


def test_measure_point_sets_the_averaging_time_only_when_it_changes():
    script = [
        *OPEN_INITIALISED,
        (encode(tpi.SetStationaryModeParams(250, 0)), ans(Command.SET_STATIONARY_MODE_PARAMS)),
        (cmd(Command.START_MEASUREMENT), ans(Command.START_MEASUREMENT) + result()),
        (cmd(Command.START_MEASUREMENT), ans(Command.START_MEASUREMENT)
         + encode(tpi.SystemStatusChange(StatusChange.MEAS_STATUS_BUSY)) + result(x=1.5)),
    ]
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev)) as drv:
            t0 = time.monotonic_ns()
            m = drv.measure("point", average_s=0.25)
            assert m.kind == "point" and m.cell_T_target is None and m.std_rotation_rad is None
            np.testing.assert_array_equal(m.cell_p_target, [1.25, -0.5, 0.75])  # metres, as set
            np.testing.assert_array_equal(m.std_translation_m, [1e-6, 2e-6, 3e-6])
            assert m.sample_count == 1 and m.average_s == 0.25
            # the host clock stands in for the device's: the window's centre is just behind us
            assert t0 - 300_000_000 <= m.t_host_ns <= time.monotonic_ns()
            assert drv.measure("point", average_s=0.25).cell_p_target[0] == 1.5
        dev.assert_done()


def test_a_result_with_covariance_is_read_too():
    r2 = encode(tpi.SingleMeasResult2(OK, 0, 0, 2.0, 3.0, 4.0, 1e-6, 1e-6, 1e-6, 2e-6, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                                      0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 20.0, 1013.25, 50.0))
    script = [*OPEN_INITIALISED, (encode(tpi.SetStationaryModeParams(0, 1)), ans(Command.SET_STATIONARY_MODE_PARAMS)),
              (cmd(Command.START_MEASUREMENT), ans(Command.START_MEASUREMENT) + r2)]
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev), use_adm=True) as drv:
            np.testing.assert_array_equal(drv.measure("point").cell_p_target, [2.0, 3.0, 4.0])
        dev.assert_done()


def _measure_script(*reply: bytes):
    return [*OPEN_INITIALISED, (encode(tpi.SetStationaryModeParams(0, 0)), ans(Command.SET_STATIONARY_MODE_PARAMS)),
            (cmd(Command.START_MEASUREMENT), b"".join(reply))]


def test_beam_broken_during_the_measurement():
    # accepted, then the tracker reports losing the reflector, then the measurement fails
    script = _measure_script(ans(Command.START_MEASUREMENT),
                             encode(tpi.SystemStatusChange(StatusChange.MEAS_STATUS_NOT_READY)),
                             encode(tpi.ErrorPacket(Command.START_MEASUREMENT, Status.NO_STATIONARY_RESULT)))
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(trk.BeamBrokenError) as ei:
            drv.measure("point")
        assert ei.value.code == "NO_STATIONARY_RESULT"
        dev.assert_done()


def test_no_stationary_result_with_the_target_locked_is_not_stable():
    script = _measure_script(ans(Command.START_MEASUREMENT),
                             encode(tpi.ErrorPacket(Command.START_MEASUREMENT, Status.NO_STATIONARY_RESULT)))
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(trk.NoStationaryResultError) as ei:
            drv.measure("point")
        assert isinstance(ei.value, trk.NotStableError)  # the daemon waits for the arm and asks again
        dev.assert_done()


@pytest.mark.parametrize("status, exc, code", [
    (Status.MEASUREMENT_STATUS_NOT_READY, trk.NoTargetError, "MEASUREMENT_STATUS_NOT_READY"),
    (Status.TRACKER_NOT_INITIALIZED, trk.NotInitializedError, "TRACKER_NOT_INITIALIZED"),
    (Status.SERVER_BUSY, trk.TrackerBusyError, "SERVER_BUSY"),
    (Status.SENSOR_NOT_WARMED_UP, trk.NotWarmedUpError, "SENSOR_NOT_WARMED_UP"),
    (Status.SENSOR_NOT_STABLE, trk.NotStableError, "SENSOR_NOT_STABLE"),
    (Status.NOT_IMPLEMENTED, trk.RequestRejectedError, "NOT_IMPLEMENTED"),
    (Status.PARAMETER_1_OUT_OF_RANGE_NOK, trk.RequestRejectedError, "PARAMETER_1_OUT_OF_RANGE_NOK"),
    (4242, trk.TrackerDeviceError, "STATUS_4242"),
])
def test_start_statuses_raise_typed_errors(status, exc, code):
    with ScriptedDevice(_measure_script(ans(Command.START_MEASUREMENT, status)), "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(exc) as ei:
            drv.measure("point")
        assert type(ei.value) is exc and ei.value.code == code
        dev.assert_done()


def test_a_failed_result_status_raises_too():
    with ScriptedDevice(_measure_script(ans(Command.START_MEASUREMENT), result(status=Status.SENSOR_NOT_STABLE)),
                        "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(trk.NotStableError):
            drv.measure("point")
        dev.assert_done()


def test_a_timeout_drops_the_link_so_no_late_answer_is_mistaken():
    script = _measure_script(ans(Command.START_MEASUREMENT))  # ... and the result never comes
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev), timeout_s=0.3) as drv:
            t0 = time.monotonic()
            with pytest.raises(trk.TrackerTimeoutError):
                drv.measure("point")
            assert time.monotonic() - t0 < 0.3 + 2.0
            # the next call reconnects; the scripted tracker takes no second client
            with pytest.raises(trk.TrackerGoneError):
                drv.measure("point")
        dev.assert_done()


def test_status_and_stop():
    script = [
        *OPEN_INITIALISED,
        (cmd(Command.GET_SYSTEM_STATUS), sysstat(laser=tpi.LaserStatus.LASER_HEATING_UP)),
        (cmd(Command.GET_TRACKER_STATUS), encode(tpi.TrackerStatusReply(OK, tpi.TrackerState.BUSY))),
        (cmd(Command.GET_MEASUREMENT_STATUS_INFO), encode(tpi.MeasurementStatusInfoReply(OK, OK, 2048 | 65536))),
        (cmd(Command.STOP_MEASUREMENT), ans(Command.STOP_MEASUREMENT)),
    ]
    with ScriptedDevice(script, "tcp") as dev:
        with _driver(_url(dev)) as drv:
            st = drv.status()
            assert st.target_locked and st.measuring and not st.warmed_up and not st.stable
            drv.stop()
        dev.assert_done()


def test_a_set_up_refusal_fails_open():
    script = [(cmd(Command.GET_SYSTEM_STATUS), sysstat()),
              (encode(tpi.SetUnits(0, 0, 0, 0, 0)), ans(Command.SET_UNITS, Status.WRONG_PARAMETER_1))]
    with ScriptedDevice(script, "tcp") as dev:
        with pytest.raises(DriverInitError, match="WRONG_PARAMETER_1"):
            _driver(_url(dev)).open()
        dev.assert_done()


def test_pose_is_refused_before_any_io():
    drv = connect_tracker("emscon://127.0.0.1:1")
    with pytest.raises(ValueError, match="point only"):
        drv.measure("pose")


@pytest.mark.parametrize("url, host, port", [
    ("emscon://192.0.2.10", "192.0.2.10", 700), ("emscon://tracker.local:7000", "tracker.local", 7000),
    ("EMSCON://127.0.0.1:700/", "127.0.0.1", 700),
])
def test_urls(url, host, port):
    drv = connect_tracker(url)
    assert isinstance(drv, EmsconTrackerDriver) and (drv.host, drv.port) == (host, port)


@pytest.mark.parametrize("url", ["emscon://", "emscon://h/path", "emscon://h?initialize=never", "emscon://h:99999"])
def test_bad_urls(url):
    with pytest.raises(ValueError):
        connect_tracker(url)


def test_backend_must_agree_with_the_scheme_and_options_are_checked():
    with pytest.raises(ValueError, match="names the 'emscon' backend"):
        connect_tracker("emscon://127.0.0.1", backend="serial")
    assert isinstance(connect_tracker("emscon://127.0.0.1", backend="emscon"), EmsconTrackerDriver)
    with pytest.raises(ValueError):
        connect_tracker("emscon://127.0.0.1", initialize="sometimes")
    with pytest.raises(TypeError):
        connect_tracker("emscon://127.0.0.1", baudrate=9600)  # not an emScon option


@pytest.mark.parametrize("kw, field", [
    ({"x": 1e6}, "position"),  # a kilometre away: beyond any tracker
    ({"x": 0.0, "y": 0.0, "z": 0.0}, "position"),  # a zero-filled result
    ({"std": (1e-6, 5.0, 3e-6)}, "std_y"),
    ({"std": (-1e-6, 2e-6, 3e-6)}, "std_x"),
])
def test_values_outside_the_trackers_range_are_refused(kw, field):
    with ScriptedDevice(_measure_script(ans(Command.START_MEASUREMENT), result(**kw)), "tcp") as dev:
        with _driver(_url(dev)) as drv, pytest.raises(trk.ImplausibleMeasurementError) as ei:
            drv.measure("point")
        assert ei.value.field == field and ei.value.code == "IMPLAUSIBLE"
        dev.assert_done()


def test_close_interrupts_a_measurement_on_another_thread():
    """The daemon's shutdown after an abort: the measurement the aborted run left waiting
    for its result raises TrackerGoneError at the next poll; close() does not wait it out."""
    from test_tracker_driver import _close_during

    script = _measure_script(ans(Command.START_MEASUREMENT))  # ... and the result never comes
    with ScriptedDevice(script, "tcp") as dev:
        drv = _driver(_url(dev), timeout_s=30.0).open()
        took, raised = _close_during(drv, lambda: drv.measure("point"))
        dev.assert_done()
    assert took < 5.0, took
    assert len(raised) == 1 and isinstance(raised[0], trk.TrackerGoneError), raised
