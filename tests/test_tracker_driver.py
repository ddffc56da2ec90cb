"""The tracker driver against scripted exchanges (PyMeasure's expected_protocol, on real I/O).

A scripted device on a real pty (or loopback socket) expects exact request bytes and
answers exact reply bytes; the script must be consumed exactly, with nothing left over.
"""

from __future__ import annotations

import math
import socket
import time

import numpy as np
import pytest
from _scripted import ScriptedDevice

from cellcal.drivers import connect_tracker
from cellcal.drivers import tracker as trk
from cellcal.drivers import tracker_codec as codec
from cellcal.drivers.errors import DeviceError, DriverError, DriverInitError, ProtocolError
from cellcal.drivers.tracker_codec import MeasKind, MeasurementFlags, StatusFlags, encode
from cellcal.solver.se3 import matrix_from_quat

HELLO_1 = encode(codec.Hello(1, "1.0"))
ID_1 = encode(codec.Ident(1, 5_000_000, "1.0", "AT-X", "SN42", "2.1.0", "MM_DEG"))
PING_2 = encode(codec.Ping(2))
PONG_2 = encode(codec.Pong(2, 5_001_000, 5_000_900))
OPEN_SCRIPT = [(HELLO_1, ID_1), (PING_2, PONG_2)]


def _driver(url, **kw):
    kw.setdefault("timeout_s", 0.5)
    kw.setdefault("clock_sync_count", 1)
    kw.setdefault("clock_resync_s", 1e9)  # no PING before MEAS unless a test asks
    return connect_tracker(url, **kw)


# -- one scripted exchange per message ---------------------------------------------------------


@pytest.mark.parametrize("transport", ["pty", "tcp"])
def test_open_hello_and_ping(transport):
    with ScriptedDevice(OPEN_SCRIPT, transport) as dev:
        drv = _driver(dev.url)
        assert not drv.is_open  # constructing did no I/O
        with drv:
            assert drv.info == trk.TrackerInfo("AT-X", "SN42", "2.1.0", "1.0", "MM_DEG")
            assert drv.clock.n_samples == 1
            # the PONG says the device clock was 5.0009 .. 5.001 s around now
            dev_now = drv.clock.to_device_s(time.monotonic_ns())
            assert 5.0009 <= dev_now < 5.0009 + 1.0
        dev.assert_done()


def test_identify():
    hello3 = encode(codec.Hello(3, "1.0"))
    id3 = encode(codec.Ident(3, 6_000_000, "1.0", "AT-X", "SN42", "2.1.1", "MM_DEG"))
    with ScriptedDevice(OPEN_SCRIPT + [(hello3, id3)]) as dev:
        with _driver(dev.url) as drv:
            info = drv.identify()
            assert info.firmware == "2.1.1" and info.protocol_version == "1.0"
        dev.assert_done()


def test_sync_clock_ping():
    steps = list(OPEN_SCRIPT)
    for s in (3, 4, 5):
        steps.append((encode(codec.Ping(s)), encode(codec.Pong(s, 5_100_000 + s, 5_100_000 + s - 50))))
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            assert drv.sync_clock(3) == 3
            assert drv.clock.n_samples == 4
        dev.assert_done()


def test_measure_pose():
    q = np.array([0.5, 0.5, -0.5, 0.5])
    reply = codec.PoseReply(
        3, 5_200_000, 5_150_000, 250, 1500.25, -200.5, 30.125, *q,
        0.0012, 0.0013, 0.0014, 0.0005, 0.0006, 0.0007, MeasurementFlags.DROPPED_SAMPLES,
    )
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POSE, 250)), encode(reply))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            m = drv.measure("pose", average_s=0.25)
        dev.assert_done()
    assert m.kind == "pose" and m.sample_count == 250 and m.average_s == 0.25
    np.testing.assert_allclose(m.cell_p_target, [1.50025, -0.2005, 0.030125], atol=1e-12)
    np.testing.assert_allclose(m.cell_T_target[:3, 3], m.cell_p_target)
    np.testing.assert_allclose(m.cell_T_target[:3, :3], matrix_from_quat(q), atol=1e-12)
    np.testing.assert_allclose(m.std_translation_m, [1.2e-6, 1.3e-6, 1.4e-6])
    np.testing.assert_allclose(m.std_rotation_rad, np.radians([0.0005, 0.0006, 0.0007]))
    assert m.t_device_s == pytest.approx(5.15)
    assert m.flags == MeasurementFlags.DROPPED_SAMPLES
    # device 5.15 s is 0.15 s before the PONG's midpoint (~5.00095 s): in host time too
    assert m.t_host_ns == drv.clock.to_host_ns(5.15)
    assert not m.cell_T_target.flags.writeable  # results are immutable


def test_measure_point():
    reply = codec.PointReply(3, 5_200_000, 5_199_000, 1, -1.0, 2.0, 3000.0, 0.01, 0.02, 0.03, 0)
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POINT, 0)), encode(reply))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            m = drv.measure("point")
        dev.assert_done()
    assert m.kind == "point" and m.cell_T_target is None and m.std_rotation_rad is None
    np.testing.assert_allclose(m.cell_p_target, [-0.001, 0.002, 3.0])
    np.testing.assert_allclose(m.std_translation_m, [1e-5, 2e-5, 3e-5])


def test_status():
    st = codec.Status(3, 5_300_000, StatusFlags.WARMED_UP | StatusFlags.STABLE)
    steps = OPEN_SCRIPT + [(encode(codec.Stat(3)), encode(st))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            s = drv.status()
        dev.assert_done()
    assert s.warmed_up and s.stable and not s.target_locked and not s.measuring
    assert s.t_device_s == pytest.approx(5.3)


def test_stop():
    steps = OPEN_SCRIPT + [(encode(codec.Stop(3)), encode(codec.Ack(3, 5_300_000)))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            assert drv.stop() is None
        dev.assert_done()


def test_measure_resyncs_the_clock_when_due():
    pose = codec.PointReply(4, 5_200_000, 5_199_000, 1, 1.0, 2.0, 3.0, 0, 0, 0, 0)
    steps = OPEN_SCRIPT + [
        (encode(codec.Ping(3)), encode(codec.Pong(3, 5_100_000, 5_099_950))),
        (encode(codec.Meas(4, MeasKind.POINT, 0)), encode(pose)),
    ]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url, clock_resync_s=0.0) as drv:
            drv.measure("point")
            assert drv.clock.n_samples == 2
        dev.assert_done()


# -- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, exc",
    [
        ("NO_TARGET", trk.NoTargetError),
        ("BEAM_BROKEN", trk.BeamBrokenError),
        ("NOT_STABLE", trk.NotStableError),
        ("NOT_WARMED_UP", trk.NotWarmedUpError),
        ("OUT_OF_RANGE", trk.OutOfRangeError),
        ("BUSY", trk.TrackerBusyError),
        ("ABORTED", trk.MeasurementAbortedError),
        ("BAD_REQUEST", trk.RequestRejectedError),
        ("UNKNOWN_COMMAND", trk.RequestRejectedError),
        ("SOMETHING_NEW", trk.TrackerDeviceError),  # a code from a newer minor version
    ],
)
def test_nak_codes_raise_typed_errors(code, exc):
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POSE, 100)), encode(codec.Nak(3, 5_050_000, code)))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            with pytest.raises(exc) as info:
                drv.measure("pose", 0.1)
        dev.assert_done()
    assert info.value.code == code
    assert isinstance(info.value, DeviceError)


def test_unsupported_version_fails_open():
    steps = [(HELLO_1, encode(codec.Nak(1, 1, "UNSUPPORTED_VERSION")))]
    with ScriptedDevice(steps) as dev:
        with pytest.raises(DriverInitError):
            _driver(dev.url).open()
        dev.assert_done()


def test_wrong_units_fail_open():
    steps = [(HELLO_1, encode(codec.Ident(1, 1, "1.0", "AT-X", "SN", "1", "M_RAD")))]
    with ScriptedDevice(steps) as dev:
        with pytest.raises(DriverInitError):
            _driver(dev.url).open()
        dev.assert_done()


def test_major_version_mismatch_in_ident_fails_open():
    steps = [(HELLO_1, encode(codec.Ident(1, 1, "2.0", "AT-X", "SN", "1", "MM_DEG")))]
    with ScriptedDevice(steps) as dev:
        with pytest.raises(DriverInitError):
            _driver(dev.url).open()
        dev.assert_done()


# -- link trouble -------------------------------------------------------------------------------------


def test_stale_replies_are_ignored():
    # A late answer to an earlier request (seq 2) arrives before ours: it must not be used.
    stale = encode(codec.PointReply(2, 5_100_000, 5_100_000, 1, 999.0, 999.0, 999.0, 0, 0, 0, 0))
    good = encode(codec.PointReply(3, 5_100_100, 5_100_100, 1, 1.0, 2.0, 3.0, 0, 0, 0, 0))
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POINT, 0)), stale + good)]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            m = drv.measure("point")
        dev.assert_done()
    np.testing.assert_allclose(m.cell_p_target, [0.001, 0.002, 0.003])


def test_corrupted_reply_is_retried_with_a_new_seq():
    good3 = encode(codec.PointReply(3, 5_100_000, 5_100_000, 1, 1.0, 2.0, 3.0, 0, 0, 0, 0))
    bad3 = good3.replace(b"1.0000", b"7.0000")  # a flipped digit: the CRC no longer fits
    good4 = encode(codec.PointReply(4, 5_100_100, 5_100_100, 1, 1.0, 2.0, 3.0, 0, 0, 0, 0))
    steps = OPEN_SCRIPT + [
        (encode(codec.Meas(3, MeasKind.POINT, 0)), b"\x00\xff" + bad3),
        (encode(codec.Meas(4, MeasKind.POINT, 0)), good4),
    ]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            m = drv.measure("point")
            assert drv.corrupt_frames >= 2  # the garbage and the bad frame
        dev.assert_done()
    np.testing.assert_allclose(m.cell_p_target, [0.001, 0.002, 0.003])


def test_device_nak_bad_crc_is_retried():
    good4 = encode(codec.PointReply(4, 5_100_100, 5_100_100, 1, 1.0, 2.0, 3.0, 0, 0, 0, 0))
    steps = OPEN_SCRIPT + [
        (encode(codec.Meas(3, MeasKind.POINT, 0)), encode(codec.Nak(0, 5_050_000, "BAD_CRC"))),
        (encode(codec.Meas(4, MeasKind.POINT, 0)), good4),
    ]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            drv.measure("point")
        dev.assert_done()


def test_retries_are_bounded():
    bad = encode(codec.Nak(0, 5_050_000, "BAD_CRC"))
    steps = OPEN_SCRIPT + [(encode(codec.Meas(s, MeasKind.POINT, 0)), bad) for s in (3, 4)]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url, retries=1) as drv:
            with pytest.raises(trk.TrackerTimeoutError):
                drv.measure("point")
        dev.assert_done()


def test_silence_times_out_within_the_deadline():
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POINT, 100)), None)]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url, timeout_s=1.0) as drv:
            t0 = time.monotonic()
            with pytest.raises(trk.TrackerTimeoutError) as info:
                drv.measure("point", 0.1)
            elapsed = time.monotonic() - t0
        dev.assert_done()
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, DriverError)
    # averaging 0.1 s + timeout 1.0 s; the slack above it is for a loaded machine, and still
    # well short of a second timeout
    assert 1.1 - 0.01 <= elapsed < 1.1 + 0.8


def test_bad_quaternion_is_a_protocol_error():
    reply = codec.PoseReply(3, 5_100_000, 5_100_000, 1, 1.0, 2.0, 3.0, 0.9, 0.0, 0.0, 0.0, 0, 0, 0, 0, 0, 0, 0)
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POSE, 0)), encode(reply))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            with pytest.raises(ProtocolError):
                drv.measure("pose")
        dev.assert_done()


def test_reply_of_the_wrong_type_is_a_protocol_error():
    steps = OPEN_SCRIPT + [(encode(codec.Stat(3)), encode(codec.Ack(3, 5_100_000)))]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url) as drv:
            with pytest.raises(ProtocolError):
                drv.status()
        dev.assert_done()


def test_device_restart_resets_the_clock():
    # ts_us jumps from ~5 s back to ~0.2 s: the device rebooted; the old mapping is void.
    steps = OPEN_SCRIPT + [
        (encode(codec.Stat(3)), encode(codec.Status(3, 200_000, StatusFlags.NONE))),
        (encode(codec.Ping(4)), encode(codec.Pong(4, 200_100, 200_050))),
        (encode(codec.Stop(5)), encode(codec.Ack(5, 200_200))),
    ]
    with ScriptedDevice(steps) as dev:
        with _driver(dev.url, clock_resync_s=1e9) as drv:
            drv.status()
            assert drv.clock.n_samples == 0  # reset: stale exchanges are gone
            drv.sync_clock(1)
            assert drv.clock.to_device_s(time.monotonic_ns()) < 1.0
            drv.stop()
        dev.assert_done()


# -- API edges ---------------------------------------------------------------------------------------


def test_connect_does_no_io_and_close_is_idempotent():
    drv = connect_tracker("/dev/this-port-does-not-exist")
    assert isinstance(drv, trk.TrackerDriver) and not drv.is_open
    drv.close()
    drv.close()
    with pytest.raises(DriverInitError):
        drv.open()
    with pytest.raises(DriverError):
        drv.measure()  # not open
    drv.close()


def test_open_on_a_dead_socket_is_an_init_error():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(DriverInitError):
        connect_tracker(f"socket://127.0.0.1:{port}", timeout_s=0.3).open()


def test_bad_arguments():
    with pytest.raises(ValueError):
        connect_tracker("x", backend="carrier-pigeon")
    with pytest.raises(ValueError):
        connect_tracker("x", timeout_s=0)
    drv = connect_tracker("x")
    with pytest.raises(ValueError):
        drv.measure("sphere")
    with pytest.raises(ValueError):
        drv.measure("pose", average_s=-1.0)
    with pytest.raises(ValueError):
        drv.measure("pose", average_s=math.inf)


def test_lazy_exports():
    import cellcal.drivers as drivers

    assert drivers.connect_tracker is connect_tracker
    assert drivers.TrackerDriver is trk.TrackerDriver
    assert drivers.TrackerInfo is trk.TrackerInfo
    assert drivers.TrackerMeasurement is trk.TrackerMeasurement


def test_error_tree():
    from cellcal.drivers.errors import DeviceGoneError, DriverTimeoutError

    for cls in (trk.NoTargetError, trk.BeamBrokenError, trk.NotStableError, trk.NotWarmedUpError,
                trk.OutOfRangeError, trk.TrackerBusyError, trk.MeasurementAbortedError):
        assert issubclass(cls, trk.TrackerDeviceError) and issubclass(cls, DeviceError)
    assert issubclass(trk.TrackerTimeoutError, DriverTimeoutError)
    assert issubclass(trk.TrackerTimeoutError, TimeoutError)
    assert issubclass(trk.TrackerGoneError, DeviceGoneError)


def _close_during(drv, fn) -> tuple[float, list[BaseException]]:
    """Run ``fn`` on a thread, close ``drv`` once it waits in its request; return how long
    close() took and what ``fn`` raised."""
    import threading

    raised: list[BaseException] = []

    def call() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            raised.append(exc)

    t = threading.Thread(target=call, daemon=True)
    t.start()
    deadline = time.monotonic() + 10.0
    while drv._lock.acquire(blocking=False):  # until the request holds the link
        drv._lock.release()
        assert time.monotonic() < deadline and t.is_alive()
        time.sleep(0.005)
    time.sleep(0.1)  # let it reach its read wait (either way close() must interrupt it)
    t0 = time.monotonic()
    drv.close()
    took = time.monotonic() - t0
    t.join(5.0)
    assert not t.is_alive()
    return took, raised


@pytest.mark.parametrize("transport", ["pty", "tcp"])
def test_close_interrupts_a_long_measurement_on_another_thread(transport):
    """An aborted run's measurement averaging 30 s on a helper thread: closing the driver
    (the daemon's shutdown) interrupts it at the next read poll instead of waiting it out."""
    steps = OPEN_SCRIPT + [(encode(codec.Meas(3, MeasKind.POINT, 30_000)), None)]
    with ScriptedDevice(steps, transport) as dev:
        drv = _driver(dev.url, timeout_s=1.0).open()
        took, raised = _close_during(drv, lambda: drv.measure("point", 30.0))
        dev.assert_done()
    assert took < 5.0, took  # not the 31 s the measurement had
    assert len(raised) == 1 and isinstance(raised[0], trk.TrackerGoneError), raised
    assert "closed while a request was in progress" in str(raised[0])
    assert not drv.is_open
