"""The detector's edges: OpenCV missing, colour and 16-bit images, bad shapes."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from _camera_views import TARGET, TRUE, board_pose
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_camera import _cell

from cellcal.drivers import detect
from cellcal.drivers.detect import OpenCVUnavailable, TargetDetector
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.target import CalibrationTarget


def test_a_missing_opencv_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cv2", None)  # what `import cv2` meets when it is not installed
    with pytest.raises(OpenCVUnavailable, match=r"pip install 'opencv-python-headless>=4\.8,<5'") as exc:
        TargetDetector(TARGET)
    assert isinstance(exc.value, ImportError)
    # the line named is the core dependency the package installs
    deps = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    assert detect.OPENCV_REQUIREMENT in deps


def test_colour_and_scaled_16_bit_images_detect_the_same_corners():
    # a quarter of the pixels of the other tests' camera, the board nearer: same squares in px
    small = CameraModel.from_parameters(np.r_[TRUE[:4] / 2.0, TRUE[4:]], (400, 300))
    world, cam = _cell(pixel_format="Mono16", read_noise_e=1.0, camera=small)
    world.set_flange(board_pose([0.3, -0.2, 0.4], [0.0, 0.0, 0.38]))
    mono16 = cam.frame().image
    det = TargetDetector(TARGET)
    a = det.detect(mono16)
    lsb = det.detect(mono16 >> 4)  # a 12-bit camera's values at the bottom of 16 bits
    bgr = det.detect(np.repeat((mono16 >> 8).astype(np.uint8)[..., None], 3, axis=2))
    assert a.n_corners == TARGET.n_corners
    for other, tol in ((lsb, 0.01), (bgr, 0.05)):
        # (markers of 23 px are near the detector's limit: a corner or two may go missing)
        assert other.n_corners >= 0.9 * TARGET.n_corners
        common = np.isin(a.ids, other.ids)
        np.testing.assert_allclose(other.image_points_px, a.image_points_px[common], atol=tol)
    assert a.image_size == (400, 300) and a.kind == "charuco" and a.marker_ids.size == TARGET.n_markers


def test_bad_images_are_refused():
    det = TargetDetector(TARGET)
    with pytest.raises(ValueError, match=r"image must be \(H, W\) or \(H, W, 3\)"):
        det.detect(np.zeros((4, 4, 4, 4), dtype=np.uint8))
    assert not det.detect(np.zeros((60, 80), dtype=np.uint8)).found


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.sampled_from([np.uint8, np.uint16, np.float32]),
       st.integers(8, 120), st.integers(8, 120))
def test_noise_images_never_crash_and_never_yield_a_board(seed, dtype, h, w):
    rng = np.random.default_rng(seed)
    img = (rng.random((h, w)) * (255 if dtype is np.uint8 else 65535)).astype(dtype)
    for det in (_CHARUCO, _CHESS):
        d = det.detect(img)
        assert d.image_size == (w, h)
        assert d.ids.shape[0] == d.image_points_px.shape[0]
        assert not d.found  # noise is never a board


_CHARUCO = TargetDetector(TARGET)
_CHESS = TargetDetector(CalibrationTarget(kind="chessboard", squares_x=9, squares_y=6, square_m=0.03))
