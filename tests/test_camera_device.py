"""The daemon's side of one camera, against a small rendered camera served as a GigE Vision
device on a loopback address of its own (no daemon, no run): ``check-config --probe``'s camera
line, the auto-exposure settling of a station's frame, and the blur figure (ADR 0030).
"""

from __future__ import annotations

import dataclasses

import cv2
import numpy as np
import pytest

from cellcal.daemon.camera_capture import SHARP_EDGE_PX, CameraCapture, edge_blur_px
from cellcal.daemon.capture import RejectReason, StationRejected
from cellcal.daemon.cli.check_config import probe
from cellcal.daemon.config import load_config_text
from cellcal.drivers.camera import connect_camera
from cellcal.sim.camera_device import default_camera, start_sim_camera
from cellcal.sim.scenario import load_scenario
from cellcal.solver.camera_model import CameraModel
from cellcal.testing.harness import FAST_SCENARIO, camera_section, daemon_config, free_port, to_toml
from cellcal.testing.simulators import camera_addresses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """A 640 x 512 camera (a quarter of the default's pixels: quick to render) with
    auto-exposure, looking at the default board; and a configuration naming it."""
    scenario = load_scenario(FAST_SCENARIO)
    world = scenario.make_world()
    base = default_camera(scenario, "eye_in_hand")
    small = CameraModel(np.array([[1300.0, 0.0, 320.4], [0.0, 1300.0, 255.6], [0.0, 0.0, 1.0]]),
                        np.array([-0.08, 0.04, 2e-4, -1e-4, 0.0]), (640, 512))
    config = dataclasses.replace(base, camera=small, auto_exposure=True, exposure_s=0.01)
    for address in camera_addresses():
        try:
            device = start_sim_camera(world, config, address)
            break
        except OSError:
            continue
    work = tmp_path_factory.mktemp("camera")
    d = daemon_config(robot_url=f"rtde://127.0.0.1:{free_port()}", tracker_url=f"socket://127.0.0.1:{free_port()}",
                      workdir=work)
    d["camera"] = {**camera_section(device.url, "eye_in_hand", scenario, work), "auto_exposure": True}
    cfg = load_config_text(to_toml(d))
    try:
        yield device, cfg
    finally:
        device.close()


def test_probe_opens_the_camera_grabs_a_frame_and_finds_the_target(sim):
    device, cfg = sim
    found = {name: (ok, text) for name, ok, text in probe(cfg)}
    ok, text = found["camera"]
    assert ok, text
    assert "SIMCAM-0001" in text and "640 x 512" in text and "24 of 24 corners found" in text, text
    assert not found["robot"][0]  # nothing listens there: the probe says so, device by device


def test_a_station_s_frame_waits_for_the_auto_exposure_to_settle(sim):
    device, cfg = sim
    cam = device.camera
    with connect_camera(device.url, **cfg.camera.options) as driver:
        capture = CameraCapture(driver, cfg)
        cam.set_auto_exposure(False)
        cam.set_exposure_s(0.0005)  # 20x too dark: the auto-exposure has far to go
        cam.set_auto_exposure(True)
        hasty = dataclasses.replace(cfg, camera=dataclasses.replace(
            cfg.camera, capture=dataclasses.replace(cfg.camera.capture, max_exposure_frames=2)))
        with pytest.raises(StationRejected) as ei:
            CameraCapture(driver, hasty).settled_frame()
        assert ei.value.reason == RejectReason.EXPOSURE_NOT_SETTLED
        frame, n = capture.settled_frame()
        assert n >= 2 and frame.exposure_s is not None and frame.exposure_s > 0.002  # the settled, brighter one
        again, n2 = capture.settled_frame()  # settled: two frames agree at once
        assert n2 == 2 and abs(again.exposure_s / frame.exposure_s - 1.0) < 0.03
        det = capture.detect(again)
        assert det.n_corners == 24


def test_the_blur_figure_grows_with_the_blur(sim):
    device, cfg = sim
    with connect_camera(device.url, **cfg.camera.options) as driver:
        capture = CameraCapture(driver, cfg)
        frame, _n = capture.settled_frame()
    det = capture.detect(frame)
    sharp = edge_blur_px(frame.image, det)
    assert SHARP_EDGE_PX * 0.9 < sharp < 2.0  # the lens's 0.7 px and the pixels' own spread
    for sigma in (1.5, 3.0):
        blurred = cv2.GaussianBlur(frame.image, (0, 0), sigma)
        b = edge_blur_px(blurred, det)
        assert abs(b - np.hypot(sharp, sigma)) < 0.25 * sigma, (sigma, b)
