"""Our GigE Vision driver against our simulated camera, both over real loopback sockets.

What only a simulator whose truth we know can show: the mid-exposure host time a frame
carries against the instant its exposure really began (a device clock with an offset and a
200 ppm drift in between), every pixel of every frame returned (no torn frame when packets
are lost), control privilege and heartbeat expiry as the device sees them, and a recording
of the frames replayed by ``dir://``.
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from _gige import start_sim
from conftest import wait_until

from cellcal.drivers import gige_codec as gc
from cellcal.drivers.camera import TriggerMode, connect_camera
from cellcal.drivers.camera_dir import write_recording
from cellcal.drivers.errors import DriverInitError
from cellcal.sim.gige_device import DeviceClock, FrameRequest, RenderedFrame, TestPatternSource

pytestmark = pytest.mark.slow


class RecordingSource(TestPatternSource):
    """The test pattern, remembering when each frame's exposure began (the truth)."""

    def __init__(self) -> None:
        self.starts: dict[int, int] = {}
        self.lock = threading.Lock()

    def frame(self, request: FrameRequest) -> RenderedFrame:
        with self.lock:
            self.starts[request.index] = request.t_start_ns
        return super().frame(request)


def check_pattern(frame, index=None):
    index = frame.frame_id - 1 if index is None else index
    expected = TestPatternSource.expected(index, frame.width, frame.height, frame.pixel_format)
    np.testing.assert_array_equal(frame.image, expected)


def test_frames_carry_mid_exposure_time_through_a_drifting_device_clock():
    source = RecordingSource()
    dev = start_sim(source=source, sensor=(160, 120), frame_rate_hz=30.0,
                    clock=DeviceClock(125_000_000, offset_s=5000.0, drift_ppm=200.0))
    try:
        with connect_camera(f"gige://{dev.address}", heartbeat_timeout_s=0.6) as cam:
            info = cam.info()
            assert (info.vendor, info.model, info.serial, info.firmware) == ("cellcal", "SimCam", "SIM0001", "1.0.0")
            assert cam.clock_source == "latch" and cam.tick_frequency_hz == 125e6
            assert cam.set_exposure_s(0.00234) == pytest.approx(0.00234)
            assert cam.set_gain_db(3.33) == pytest.approx(3.3)  # the device applies 0.1 dB steps
            assert cam.get_pixel_format() == "Mono8"
            # the heartbeat keeps latching: wait until the drift has been fitted
            wait_until(lambda: cam.clock.rate_fitted and cam.clock.n_samples >= 6, 20.0, "a fitted clock rate")
            # the fitted drift is inside the rate bound the driver states for it
            assert abs(cam.clock.skew - 200e-6) <= cam.clock_rate_bound, (cam.clock.skew_ppm, cam.clock_rate_bound)
            frames = [cam.grab(timeout_s=2.0) for _ in range(6)]
        for f in frames:
            check_pattern(f)
            assert (f.width, f.height, f.exposure_s, f.gain_db) == (160, 120, pytest.approx(0.00234), pytest.approx(3.3))
            assert f.tick_frequency_hz == 125e6
            truth = source.starts[f.frame_id - 1] + round(0.00234 / 2 * 1e9)
            # inside the stated bound: the model's, plus the rate bound times the time since the
            # last exchange (the simulator stamps exactly the instant it reports as the truth)
            assert abs(f.t_host_ns - truth) <= f.t_host_uncertainty_ns, (f.t_host_ns - truth, f.t_host_uncertainty_ns)
            assert f.t_received_ns > f.t_host_ns  # a frame arrives after its exposure
            assert f.t_device_s == pytest.approx(f.device_timestamp / 125e6 + 0.00117, abs=1e-8)
        ids = [f.frame_id for f in frames]
        assert ids == sorted(ids) and len(set(ids)) == 6
    finally:
        dev.stop()


class SettlingSource(RecordingSource):
    """An auto-exposure that has not settled: every frame's exposure differs from the last."""

    def frame(self, request: FrameRequest) -> RenderedFrame:
        out = super().frame(request)
        return RenderedFrame(out.image, request.exposure_s * (1.0 + 0.25 * request.index), request.gain_db + 0.5)


def test_each_frame_carries_the_exposure_and_gain_applied_to_it():
    source = SettlingSource()
    dev = start_sim(source=source, sensor=(64, 48), frame_rate_hz=20.0, exposure_s=0.004)
    try:
        with connect_camera(f"gige://{dev.address}") as cam:
            assert cam.clock_source == "latch"
            frames = [cam.grab(timeout_s=3.0) for _ in range(3)]
            assert cam.get_exposure_s() == pytest.approx(0.004)  # the register: what was asked
        starts = dict(source.starts)  # the next acquisition counts its frames from 0 again
        with connect_camera(f"gige://{dev.address}", chunks=False) as plain:
            without = plain.grab(timeout_s=3.0)
    finally:
        dev.stop()
    for f in frames:
        applied = 0.004 * (1.0 + 0.25 * (f.frame_id - 1))
        assert f.exposure_s == pytest.approx(applied) and f.gain_db == pytest.approx(0.5)  # from its chunk data
        truth = starts[f.frame_id - 1] + round(applied / 2 * 1e9)  # mid of the exposure applied
        assert abs(f.t_host_ns - truth) <= f.t_host_uncertainty_ns
    assert without.exposure_s == pytest.approx(0.004) and without.gain_db == 0.0  # without chunks: the registers


def test_software_trigger_mono16_and_fresh_frames():
    dev = start_sim(sensor=(64, 48), frame_rate_hz=50.0)
    try:
        with connect_camera(f"gige://{dev.address}") as cam:
            t_before = time.monotonic_ns()
            free = cam.grab(timeout_s=2.0)  # after_ns defaults to the call: exposed after it
            assert free.t_exposure_start_ns >= t_before - free.t_host_uncertainty_ns
            cam.stop()
            cam.set_pixel_format("Mono16")
            cam.set_trigger_mode(TriggerMode.SOFTWARE)
            ids = []
            for index in range(3):  # the pattern's index restarts with the acquisition
                f = cam.grab(timeout_s=2.0)
                assert f.pixel_format == "Mono16" and f.image.dtype == np.uint16
                check_pattern(f, index)
                ids.append(f.frame_id)
            assert ids == [ids[0], ids[0] + 1, ids[0] + 2]  # one frame per trigger, none in between
            with pytest.raises(ValueError, match="stop acquisition"):
                cam.set_pixel_format("Mono8")
    finally:
        dev.stop()


def test_torn_frames_are_counted_and_never_returned():
    dev = start_sim(sensor=(160, 120), frame_rate_hz=60.0, lost_packet_ratio=0.03, seed=1)
    try:
        with connect_camera(f"gige://{dev.address}") as cam:
            frames = [cam.grab(timeout_s=5.0) for _ in range(8)]
            for f in frames:
                check_pattern(f)
            wait_until(lambda: cam.frames_incomplete > 0, 10.0, "an incomplete frame counted")
            assert cam.frames_completed >= 8
    finally:
        dev.stop()


def test_garbage_on_the_stream_never_yields_a_frame():
    dev = start_sim(sensor=(64, 48), frame_rate_hz=40.0)
    rng = np.random.default_rng(0)
    spray = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    spray.bind((dev.address, 0))  # from the device's own address: past the driver's source check
    try:
        with connect_camera(f"gige://{dev.address}") as cam:
            cam.start()
            port = cam._stream.getsockname()[1]
            fakes = [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(0, 120, 300)]
            # well-formed packets of blocks that never complete, and leaders that lie about the size
            fakes += [gc.encode_leader(gc.GvspLeader(int(b), 0, 1, 0, gc.PIXEL_FORMATS["Mono8"], 64, 48))
                      for b in rng.integers(1, 65535, 50)]
            fakes += [gc.encode_trailer(gc.GvspTrailer(int(b), 3, 1, 48)) for b in rng.integers(1, 65535, 50)]
            for data in fakes:
                spray.sendto(data, (cam._client.local_ip, port))
            frames = [cam.grab(timeout_s=3.0) for _ in range(4)]
            for f in frames:
                check_pattern(f)
            wait_until(lambda: cam.bad_packets > 0, 5.0, "garbage counted")
    finally:
        spray.close()
        dev.stop()


def test_control_privilege_heartbeat_and_release():
    dev = start_sim(sensor=(32, 32))
    try:
        url = f"gige://{dev.address}?heartbeat_timeout_s=1.0&ack_timeout_s=0.05&retries=1"
        first = connect_camera(url).open()
        held_by = dev.controller
        assert held_by is not None
        t0, seen0 = time.monotonic(), dev.commands
        # the session outlives two heartbeat timeouts with nothing but the driver's own traffic
        wait_until(lambda: time.monotonic() - t0 > 2.2 and dev.commands > seen0 + 6, 10.0, "two heartbeat timeouts")
        assert dev.controller == held_by
        with pytest.raises(DriverInitError, match="another application"):
            connect_camera(url).open()
        first.close()
        assert dev.controller is None  # released on close, not by timeout
        second = connect_camera(url).open()
        # a driver that stops beating without releasing (a crash) loses control to the timeout
        second._stop_threads.set()
        for t in second._threads:
            t.join()
        wait_until(lambda: dev.controller is None, 5.0, "the device's heartbeat timeout")
        third = connect_camera(url).open()
        assert dev.controller is not None
        third.close()
        second.close()
    finally:
        dev.stop()


def test_a_recording_replays_what_was_grabbed(tmp_path):
    dev = start_sim(sensor=(48, 32))
    try:
        with connect_camera(f"gige://{dev.address}") as cam:
            cam.set_gain_db(6.0)
            frames = [cam.grab(timeout_s=2.0) for _ in range(3)]
            info = cam.info()
    finally:
        dev.stop()
    assert write_recording(tmp_path / "rec", frames, info) == 3
    with connect_camera(f"dir://{tmp_path / 'rec'}") as replay:
        assert replay.info().serial == info.serial and replay.info().model == "SimCam"
        for f in frames:
            r = replay.grab()
            np.testing.assert_array_equal(r.image, f.image)
            for key in ("frame_id", "pixel_format", "device_timestamp", "tick_frequency_hz", "t_device_s",
                        "t_host_ns", "t_host_uncertainty_ns", "t_received_ns", "exposure_s", "gain_db"):
                assert getattr(r, key) == getattr(f, key), key
