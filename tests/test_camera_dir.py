"""``dir://``: recorded frames replayed with their metadata; the folder format's refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellcal.drivers.camera import CameraInfo, FeatureUnavailableError, Frame, connect_camera
from cellcal.drivers.camera_dir import COLUMNS, RecordingExhausted, write_recording
from cellcal.drivers.errors import DriverError, DriverInitError


def make_frame(i: int, image: np.ndarray, fmt: str, **kw) -> Frame:
    base = dict(frame_id=100 + i, device_timestamp=125_000_000 * (10 + i), tick_frequency_hz=125e6,
                t_device_s=10.0 + i + 0.001, t_host_ns=5_000_000_000 + i * 50_000_000, t_host_uncertainty_ns=12.5,
                t_received_ns=5_010_000_000 + i * 50_000_000, exposure_s=0.002, gain_db=1.5)
    base.update(kw)
    return Frame(image=image, pixel_format=fmt, **base)


@pytest.fixture
def recording(tmp_path):
    rng = np.random.default_rng(0)
    frames = [
        make_frame(0, rng.integers(0, 256, (24, 32), dtype=np.uint8), "Mono8"),
        make_frame(1, rng.integers(0, 65536, (24, 32), dtype=np.uint16), "Mono16", gain_db=None),
        make_frame(2, rng.integers(0, 256, (24, 32, 3), dtype=np.uint8), "RGB8", t_host_uncertainty_ns=math.inf),
        make_frame(3, rng.integers(0, 256, (24, 32), dtype=np.uint8), "BayerRG8", exposure_s=0.004),
    ]
    info = CameraInfo("cellcal", "SimCam", "SIM0001", "1.0.0", address="127.0.0.2:3956", backend="gige")
    folder = tmp_path / "rec"
    assert write_recording(folder, frames, info) == 4
    return folder, frames


def test_replay_gives_back_every_frame_and_its_metadata(recording):
    folder, frames = recording
    with connect_camera(f"dir://{folder}") as cam:
        info = cam.info()
        assert (info.vendor, info.model, info.serial, info.firmware, info.backend) == (
            "cellcal", "SimCam", "SIM0001", "1.0.0", "dir")
        assert cam.get_exposure_s() == 0.002 and cam.get_pixel_format() == "Mono8"
        for f in frames:
            r = cam.grab(after_ns=10**19)  # a recording's stamps are history: after_ns does not apply
            np.testing.assert_array_equal(r.image, f.image)
            assert r.image.dtype == f.image.dtype and not r.image.flags.writeable
            for key in ("frame_id", "pixel_format", "device_timestamp", "tick_frequency_hz", "t_device_s",
                        "t_host_ns", "t_host_uncertainty_ns", "t_received_ns", "exposure_s", "gain_db"):
                assert getattr(r, key) == getattr(f, key), key
        with pytest.raises(RecordingExhausted, match="4 frames"):
            cam.grab()


def test_settings_of_a_recording_are_fixed_and_loop_starts_again(recording):
    folder, frames = recording
    with connect_camera(f"dir://{folder}?loop=true") as cam:
        with pytest.raises(FeatureUnavailableError, match="exposure"):
            cam.set_exposure_s(0.01)
        with pytest.raises(FeatureUnavailableError, match="gain"):
            cam.set_gain_db(0.0)
        cam.set_pixel_format("Mono8")  # what it is: accepted
        ids = [cam.grab().frame_id for _ in range(6)]
        assert ids == [100, 101, 102, 103, 100, 101]


def test_a_minimal_folder_needs_only_image_names(tmp_path):
    import cv2

    img = np.arange(48, dtype=np.uint8).reshape(6, 8)
    cv2.imwrite(str(tmp_path / "a.png"), img)
    (tmp_path / "frames.csv").write_text("image\na.png\n")
    with connect_camera(f"dir://{tmp_path}") as cam:
        f = cam.grab()
        np.testing.assert_array_equal(f.image, img)
        assert (f.frame_id, f.pixel_format, f.exposure_s, f.t_host_ns) == (1, "Mono8", None, 0)
        assert f.t_host_uncertainty_ns == math.inf  # no host time: not usable for timing
        assert cam.info().serial == ""


@pytest.mark.parametrize("csv_text, message", [
    ("name\na.png\n", "'image' column"),
    ("image,colour\na.png,red\n", "unknown column 'colour'"),
    ("image\nmissing.png\n", "row 1: image 'missing.png' does not exist"),
    ("image\n../a.png\n", "row 1: image '../a.png' must be a file name"),
    ("image,exposure_s\na.png,0.001\na.png,fast\n", "row 2: exposure_s 'fast' is not a number"),
    ("image,exposure_s\na.png,-1\n", "must be > 0"),
    ("image,t_host_ns\na.png,1.5\n", "t_host_ns '1.5' is not an integer"),
    ("image\n", "no frames"),
])
def test_bad_metadata_is_refused_naming_the_row_and_column(tmp_path, csv_text, message):
    import cv2

    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((4, 4), np.uint8))
    (tmp_path / "frames.csv").write_text(csv_text)
    cam = connect_camera(f"dir://{tmp_path}")
    with pytest.raises(DriverInitError, match=message):
        cam.open()


def test_camera_toml_keys_and_pixel_formats_are_checked(tmp_path):
    import cv2

    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((4, 4), np.uint16))
    (tmp_path / "frames.csv").write_text("image,pixel_format\na.png,Mono8\n")
    (tmp_path / "camera.toml").write_text('[camera]\nvendor = "x"\nlens = "8mm"\n')
    with pytest.raises(DriverInitError, match="unknown key 'lens'"):
        connect_camera(f"dir://{tmp_path}").open()
    (tmp_path / "camera.toml").write_text('[camera]\nvendor = "x"\n')
    with connect_camera(f"dir://{tmp_path}") as cam, pytest.raises(DriverError, match="Mono8.*uint16"):
        cam.grab()


def test_a_folder_is_not_overwritten_and_the_header_is_fixed(recording):
    folder, frames = recording
    with pytest.raises(ValueError, match="already holds"):
        write_recording(folder, frames)
    assert (folder / "frames.csv").read_text().splitlines()[0] == ",".join(COLUMNS)
    assert not (folder / "frames.csv.tmp").exists()
