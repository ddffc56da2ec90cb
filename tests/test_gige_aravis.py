"""Our GigE Vision driver against Aravis's fake camera (``arv-fake-gv-camera-0.8``).

An implementation nobody here wrote, on 127.0.0.1 only, opened by address (no discovery).
The fake camera's image is a documented ramp: pixel ``(x, y)`` of frame ``id`` is
``((x + y + id) % 255) * scale`` (Mono8) or ``(256 (x + y + id) % 65535) * scale`` (Mono16),
``scale = 1 + GainRaw + log10(ExposureTimeAbs / 10000 us)``, so with 10 ms and no gain every
pixel of every frame can be checked: no torn frame, no wrong byte order. Its frame ids start
at 65401, so the 16-bit block id wraps (to 1, skipping 0) within the first frames.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from _gige import fake_camera

from cellcal.drivers.camera import FeatureUnavailableError, TriggerMode, connect_camera

pytestmark = pytest.mark.slow


def fake_pattern(frame_id: int, width: int, height: int, mono16: bool = False) -> np.ndarray:
    y, x = np.mgrid[0:height, 0:width]
    if mono16:
        return ((256 * (x + y + frame_id)) % 65535).astype(np.uint16)
    return ((x + y + frame_id) % 255).astype(np.uint8)


@pytest.fixture
def fake():
    with fake_camera("CELLCAL01") as proc:
        yield proc


def test_identity_xml_and_features(fake):
    with connect_camera("gige://127.0.0.1") as cam:
        info = cam.info()
        assert (info.vendor, info.model, info.serial) == ("Aravis", "Fake", "CELLCAL01")
        assert info.firmware.startswith("0.8")
        assert cam.nodes is not None and cam.nodes.vendor == "Aravis"
        assert {"Width", "Height", "PixelFormat", "ExposureTimeAbs", "GainRaw", "TriggerSoftware"} <= set(cam.nodes.names())
        assert cam.get_feature("SensorWidth") == 2048 and cam.get_feature("Width") == 512
        assert cam.set_exposure_s(0.0123) == pytest.approx(0.0123)  # ExposureTimeAbs, integer microseconds
        assert cam.get_feature("ExposureTimeAbs") == pytest.approx(12300)
        cam.set_feature("GainRaw", 4)
        assert cam.get_feature("GainRaw") == 4
        cam.set_feature("GainRaw", 0)
        with pytest.raises(FeatureUnavailableError, match="Gain"):
            cam.set_gain_db(3.0)  # the fake camera has a raw gain only, no dB
        assert cam.get_feature("PayloadSize") == 512 * 512
        # node kinds of an XML we did not write: a Converter over an Integer, a Boolean with
        # its own on/off values, big-endian StructReg fields (bit 0 the most significant)
        assert cam.get_feature("AcquisitionFrameRate") == pytest.approx(25.0)
        cam.set_feature("AcquisitionFrameRate", 10.0)
        assert cam.get_feature("AcquisitionFramePeriod") == 100000
        cam.set_feature("AcquisitionFrameRate", 25.0)
        cam.set_feature("TestBoolean", True)
        assert cam.get_feature("TestRegister") == 321
        cam.set_feature("TestRegister", 0x12345678)
        assert (cam.get_feature("StructEntry_0_15"), cam.get_feature("StructEntry_16_31")) == (0x1234, 0x5678)
        cam.set_feature("StructEntry_16_31", -2)  # signed 16-bit field: the other half kept
        assert cam.get_feature("TestRegister") == 0x1234FFFE
        assert cam.tick_frequency_hz == 1e9
        # its timestamp latch does not move: the stream's lower envelope maps the clock
        assert cam.clock_source == "stream"


def test_frames_size_format_ids_timestamps_and_every_pixel(fake):
    with connect_camera("gige://127.0.0.1") as cam:
        cam.set_exposure_s(0.010)
        cam.set_feature("GainRaw", 0)
        cam.set_feature("Width", 320)
        cam.set_feature("Height", 200)
        frames = [cam.grab(timeout_s=3.0) for _ in range(8)]
        for f in frames:
            assert (f.width, f.height, f.pixel_format, f.image.dtype) == (320, 200, "Mono8", np.uint8)
            np.testing.assert_array_equal(f.image, fake_pattern(f.frame_id, 320, 200))
            assert f.exposure_s == pytest.approx(0.010) and f.gain_db is None
        ids = [f.frame_id for f in frames]
        steps = [(b - a) % 65535 for a, b in zip(ids, ids[1:], strict=False)]
        assert all(s >= 1 for s in steps) and 0 not in ids
        ticks = [f.device_timestamp for f in frames]
        assert all(b > a for a, b in zip(ticks, ticks[1:], strict=False))
        # the fake camera's ticks are its host's wall clock in nanoseconds (docs/protocols/gige.md)
        assert abs(ticks[-1] / 1e9 - time.time()) < 60.0
        hosts = [f.t_host_ns for f in frames]
        assert all(b > a for a, b in zip(hosts, hosts[1:], strict=False))

        cam.stop()
        cam.set_pixel_format("Mono16")
        f = cam.grab(timeout_s=3.0)
        assert f.pixel_format == "Mono16" and f.image.dtype == np.uint16
        np.testing.assert_array_equal(f.image, fake_pattern(f.frame_id, 320, 200, mono16=True))
        cam.stop()
        cam.set_pixel_format("Mono8")
        cam.set_feature("Width", 512)
        cam.set_feature("Height", 512)


def test_software_trigger(fake):
    with connect_camera("gige://127.0.0.1") as cam:
        cam.set_trigger_mode(TriggerMode.SOFTWARE)
        assert cam.get_feature("TriggerMode") == "On" and cam.get_feature("TriggerSource") == "Software"
        ids = [cam.grab(timeout_s=3.0).frame_id for _ in range(3)]
        assert len(set(ids)) == 3
        cam.stop()
        cam.set_trigger_mode(TriggerMode.OFF)
        assert cam.get_feature("TriggerMode") == "Off"


def test_lost_packets_drop_frames_never_tear_them():
    # a fake camera of its own, losing 1 packet in 100
    with fake_camera("CELLCAL02", lost_per_thousand=10), connect_camera("gige://127.0.0.1") as cam:
        assert cam.info().serial == "CELLCAL02"
        cam.set_exposure_s(0.010)
        cam.set_feature("GainRaw", 0)
        frames = [cam.grab(timeout_s=10.0) for _ in range(5)]
        for f in frames:
            np.testing.assert_array_equal(f.image, fake_pattern(f.frame_id, f.width, f.height))
        assert cam.frames_incomplete > 0  # 190 packets a frame: most frames lose one
