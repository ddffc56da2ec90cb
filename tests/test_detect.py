"""The detector's edges: OpenCV missing, colour and 16-bit images, bad shapes."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from _camera_views import TARGET, board_pose
from test_sim_camera import _cell

from cellcal.drivers import detect
from cellcal.drivers.detect import OpenCVUnavailable, TargetDetector


def test_a_missing_opencv_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # what `import cv2` meets when it is not installed
    with pytest.raises(OpenCVUnavailable, match=r"pip install 'opencv-python-headless>=4\.8,<5'") as exc:
        TargetDetector(TARGET)
    assert isinstance(exc.value, ImportError)
    # the line named is the core dependency the package installs
    deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert detect.OPENCV_REQUIREMENT in deps


def test_colour_and_scaled_16_bit_images_detect_the_same_corners():
    world, cam = _cell(pixel_format="Mono16", read_noise_e=1.0)
    world.set_flange(board_pose([0.3, -0.2, 0.4], [0.0, 0.0, 0.45]))
    mono16 = cam.frame().image
    det = TargetDetector(TARGET)
    a = det.detect(mono16)
    lsb = det.detect(mono16 >> 4)  # a 12-bit camera's values at the bottom of 16 bits
    bgr = det.detect(np.repeat((mono16 >> 8).astype(np.uint8)[..., None], 3, axis=2))
    assert a.n_corners == lsb.n_corners == bgr.n_corners == TARGET.n_corners
    np.testing.assert_allclose(lsb.image_points_px, a.image_points_px, atol=0.01)
    np.testing.assert_allclose(bgr.image_points_px, a.image_points_px, atol=0.05)
    assert a.image_size == (800, 600) and a.kind == "charuco" and a.marker_ids.size == TARGET.n_markers


def test_bad_images_are_refused():
    det = TargetDetector(TARGET)
    with pytest.raises(ValueError, match=r"image must be \(H, W\) or \(H, W, 3\)"):
        det.detect(np.zeros((4, 4, 4, 4), dtype=np.uint8))
    assert not det.detect(np.zeros((60, 80), dtype=np.uint8)).found
