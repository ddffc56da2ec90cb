"""The simulated camera: rendered corners where the model puts them, sensor noise as EMVA 1288
says, exposure timing and the camera's clock, motion blur, rolling shutter, auto-exposure,
and the scenario's [camera] table."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, TRUE, board_pose

from cellcal.drivers.detect import TargetDetector
from cellcal.sim.camera import CameraConfig, SimCamera
from cellcal.sim.errors import ScenarioError
from cellcal.sim.scenario import parse_scenario
from cellcal.sim.world import World
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.solver.target import CalibrationTarget

ROOT = Path(__file__).resolve().parents[1]
CAMERA = CameraModel.from_parameters(TRUE, SIZE)
CHESS = CalibrationTarget(kind="chessboard", squares_x=10, squares_y=7, square_m=0.025)


class FakeClock:
    """A world clock the test moves (seconds)."""

    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _cell(target=TARGET, clock=None, camera=CAMERA, **kw):
    """Eye-to-hand with the camera at the cell origin and the board on the flange, base = cell:
    ``camera_T_target`` is the flange pose, which the test sets."""
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), clock=clock or FakeClock())
    cfg = CameraConfig(camera=camera, target=target, mounting="eye_to_hand", cell_T_camera=np.eye(4),
                       flange_T_target=np.eye(4), **kw)
    return world, SimCamera(world, cfg, seed=3)


def _errors(det, frame, target=TARGET):
    d = det.detect(frame.image)
    truth = CAMERA.project(frame.camera_T_target, target.corner_points(d.ids)).uv
    return d, d.image_points_px - truth


POSES = [([0.0, 0.0, 0.0], [0.0, 0.0, 0.45]), ([0.45, -0.3, 0.2], [0.02, -0.01, 0.42]),
         ([-0.3, 0.5, -2.0], [-0.03, 0.02, 0.5])]


@pytest.mark.parametrize("target", [TARGET, CHESS], ids=["charuco", "chessboard"])
@pytest.mark.parametrize("pixel_format", ["Mono8", "Mono16"])
def test_rendered_corners_are_detected_where_the_model_projects_them(target, pixel_format):
    world, cam = _cell(target, pixel_format=pixel_format, read_noise_e=1.0)
    det = TargetDetector(target)
    for rv, c in POSES:
        world.set_flange(board_pose(rv, c, target))
        frame = cam.frame()
        assert frame.image.dtype == (np.uint8 if pixel_format == "Mono8" else np.uint16)
        assert frame.image.shape == (SIZE[1], SIZE[0]) and frame.pixel_format == pixel_format
        d, e = _errors(det, frame, target)
        assert d.n_corners == target.n_corners
        rms = float(np.sqrt(np.mean(np.sum(e * e, axis=1))))
        assert rms < 0.1 and np.abs(e).max() < 0.3, f"{rv}: rms {rms:.3f} px"


def test_a_board_partly_outside_the_image_gives_the_corners_seen_with_their_ids():
    world, cam = _cell()
    world.set_flange(board_pose([0.2, 0.3, 0.1], [0.19, 0.08, 0.45]))
    d, e = _errors(TargetDetector(TARGET), cam.frame())
    assert 10 < d.n_corners < TARGET.n_corners
    assert np.abs(e).max() < 0.3
    # and the chessboard turned upside down is still numbered from its black corner
    world, cam = _cell(CHESS)
    world.set_flange(board_pose([0.1, -0.2, np.pi], [0.0, 0.0, 0.45], CHESS))
    d, e = _errors(TargetDetector(CHESS), cam.frame(), CHESS)
    assert d.n_corners == CHESS.n_corners and np.abs(e).max() < 0.3


def test_nothing_seen_is_an_empty_detection():
    world, cam = _cell()
    world.set_flange(board_pose([0.0, 0.0, 0.0], [0.0, 0.0, -0.5]))  # behind the camera
    d = TargetDetector(TARGET).detect(cam.frame().image)
    assert not d.found and d.ids.shape == (0,) and d.image_points_px.shape == (0, 2)


def test_sensor_noise_follows_the_emva_1288_linear_model():
    world, cam = _cell(pixel_format="Mono16", blur_sigma_px=0.0, exposure_s=0.004)
    world.set_flange(board_pose([0.0, 0.0, 0.0], [0.0, 0.0, -0.5]))  # a uniform background
    c = cam.config
    frames = np.stack([cam.frame().image.astype(float) / 16.0 for _ in range(4)])  # 12-bit values
    mu_e = c.background_reflectance * c.white_e_per_s * c.exposure_s + c.dark_current_e_per_s * c.exposure_s
    K = c.system_gain_dn_per_e
    assert frames.mean() == pytest.approx(K * mu_e + c.black_level_dn, rel=0.01)
    # temporal variance from frame differences: K^2 (mu_e + read^2) + quantisation 1/12
    var = np.var(frames[1:] - frames[:-1]) / 2.0
    assert var == pytest.approx(K * K * (mu_e + c.read_noise_e**2) + 1.0 / 12.0, rel=0.05)
    # 6 dB more gain doubles the signal above black
    cam.set_gain_db(6.0206)
    assert cam.frame().image.astype(float).mean() / 16.0 - c.black_level_dn == pytest.approx(2 * K * mu_e, rel=0.01)


def test_exposure_time_and_the_cameras_own_clock():
    clock = FakeClock(100.0)
    world, cam = _cell(clock=clock, clock_offset_s=5000.0, clock_drift_ppm=40.0, exposure_s=0.008,
                       trigger_delay_s=1e-4, readout_s=0.02)
    world.set_flange(board_pose([0.1, 0.1, 0.0], [0.0, 0.0, 0.45]))
    clock.t = 130.0  # the world started at 100: 30 s in
    f = cam.frame(t_request_ns=int(130.5e9))
    t_mid = 30.5 + 1e-4 + 0.004
    assert f.t_mid_s == pytest.approx(t_mid, abs=1e-9)
    assert f.t_mid_device_ns == round((5000.0 + (1 + 40e-6) * t_mid) * 1e9)
    assert f.t_request_clock_ns == int(130.5e9)
    assert f.t_ready_clock_ns == pytest.approx((130.5 + 1e-4 + 0.008 + 0.02) * 1e9, abs=2)
    assert f.exposure_s == 0.008 and f.line_time_s == 0.0 and f.frame_id == 1
    assert cam.frame().frame_id == 2


def _moving(world, v_m_s, rv=(0.2, -0.3, 0.0)):
    """The board slides along the camera's x at v_m_s."""
    base = board_pose(list(rv), [0.0, 0.0, 0.45])

    def at(t):
        T = base.copy()
        T[0, 3] += v_m_s * (t - 1.0)
        return T

    world.set_flange_trajectory(at)
    return at


def test_motion_during_the_exposure_blurs_about_the_mid_exposure_pose():
    world, cam = _cell(exposure_s=0.01)
    at = _moving(world, 0.2)  # 2 mm in 10 ms: about 4 px in the image
    f = cam.frame(t_request_ns=int(world.clock_s_at(1.0) * 1e9))
    np.testing.assert_allclose(f.camera_T_target, at(f.t_mid_s))
    d, e = _errors(TargetDetector(TARGET), f)
    assert d.n_corners > 40
    assert np.sqrt(np.mean(np.sum(e * e, axis=1))) < 0.25  # the smear is symmetric about mid-exposure
    start = CAMERA.project(at(f.t_mid_s - 0.005), TARGET.corner_points(d.ids)).uv
    assert np.median(np.abs(d.image_points_px[:, 0] - start[:, 0])) > 1.5
    # the same pose at rest is sharper: steeper steps across the square edges along x
    world.set_flange_trajectory(None)
    world.set_flange(at(f.t_mid_s))
    still = cam.frame()

    def steep(img):
        return np.percentile(np.abs(np.diff(img.astype(float), axis=1)), 99.5)

    assert steep(still.image) > 1.5 * steep(f.image)


def test_rolling_shutter_sees_each_row_at_its_own_time():
    world, cam = _cell(shutter="rolling", line_time_s=3e-5, exposure_s=0.001,  # 18 ms readout
                       white_e_per_s=6e6)  # brighter light for the short exposure
    at = _moving(world, 0.1)  # 1.8 mm over the readout: ~3.5 px between top and bottom rows
    f = cam.frame(t_request_ns=int(world.clock_s_at(1.0) * 1e9))
    assert f.line_time_s == 3e-5
    d = TargetDetector(TARGET).detect(f.image)
    P = TARGET.corner_points(d.ids)
    mid = CAMERA.project(f.camera_T_target, P).uv
    # each corner at the pose of its row's mid-exposure
    rows = d.image_points_px[:, 1]
    t_row = f.t_mid_s + (rows - (SIZE[1] - 1) / 2.0) * f.line_time_s
    per_row = np.array([CAMERA.project(at(t), p[None]).uv[0] for t, p in zip(t_row, P, strict=True)])
    e_row = np.linalg.norm(d.image_points_px - per_row, axis=1)
    e_mid = np.linalg.norm(d.image_points_px - mid, axis=1)
    assert np.sqrt(np.mean(e_row**2)) < 0.2
    assert np.sqrt(np.mean(e_mid**2)) > 5 * np.sqrt(np.mean(e_row**2))


def test_auto_exposure_settles_on_its_level():
    # (a level the white squares reach before the full well: a mean-level auto-exposure
    # aiming higher saturates them and crawls, as real ones do; saturated_fraction tells)
    small = CameraModel.from_parameters(np.r_[TRUE[:4] / 4.0, TRUE[4:]], (200, 150))  # 30 frames: keep them cheap
    world, cam = _cell(auto_exposure=True, exposure_s=0.0005, auto_exposure_time_constant_s=0.1,
                       auto_exposure_level=0.3, camera=small)
    world.set_flange(board_pose([0.1, 0.2, 0.0], [0.0, 0.0, 0.45]))
    t0 = world.clock_s_at(0.0)
    levels, settled = [], []
    for k in range(30):  # 30 frames per second
        f = cam.frame(t_request_ns=int((t0 + k / 30.0) * 1e9))
        levels.append(float(f.image.mean()) / 255.0)
        settled.append(f.exposure_settled)
    assert levels[0] < 0.1 and not settled[0]
    assert abs(levels[-1] - 0.3) < 0.02 and settled[-1] and f.saturated_fraction < 0.01
    first = settled.index(True)
    assert 5 < first < 25 and all(settled[first:])  # a few time constants, then it stays
    # switched off, the exposure stays where it was put
    cam.set_auto_exposure(False)
    assert cam.set_exposure_s(0.002) == 0.002 and cam.frame().exposure_s == 0.002


def test_defocus_blurs_away_from_the_focus_distance():
    # 10 um pixels: a 9 mm lens at f/1.4 (a 3 mm one has too much depth of field to show it)
    world, cam = _cell(focus_distance_m=0.45, f_number=1.4, blur_sigma_px=0.3, pixel_size_m=10e-6)
    world.set_flange(board_pose([0.1, 0.2, 0.0], [0.0, 0.0, 0.45]))
    sharp = cam.frame().image.astype(float)
    assert cam._defocus_sigma_px(0.0) < 1e-9
    world.set_flange(board_pose([0.1, 0.2, 0.0], [0.0, 0.0, 0.30]))
    sigma = cam._defocus_sigma_px(0.0)
    # thin lens: f = 900 px * 10 um = 9 mm; disk f^2 / (N (d_f - f)) |d - d_f| / d
    f_m = 900.0 * 10e-6
    assert sigma == pytest.approx(0.25 * f_m**2 / (1.4 * (0.45 - f_m)) * 0.15 / 0.30 / 10e-6, rel=1e-9)
    assert sigma > 1.5
    near = cam.frame().image.astype(float)
    # nearer, the squares are larger in the image, so sharp edges would be as steep: blurred, less
    assert np.percentile(np.abs(np.diff(sharp, axis=1)), 99.5) > 1.5 * np.percentile(np.abs(np.diff(near, axis=1)), 99.5)


SCENARIO = """
name = "camera"
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [0.0, 0.0, 0.0]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.0]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
noise_mm = 0.01
noise_deg = 0.001
[camera]
mounting = "eye_in_hand"
width_px = 800
height_px = 600
fx_px = 900.0
fy_px = 905.0
cx_px = 410.0
cy_px = 295.0
dist_coeffs = [-0.25, 0.08, 0.0005, -0.0003, 0.01]
flange_T_camera_xyz_m = [0.0, 0.0, 0.05]
flange_T_camera_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
cell_T_target_xyz_m = [0.275, 0.0875, -0.1]
cell_T_target_quat_wxyz = [0.0, 1.0, 0.0, 0.0]
pixel_format = "Mono16"
exposure_us = 8000
auto_exposure = true
shutter = "rolling"
line_time_us = 20
clock_drift_ppm = -12.5
serial = "CAM-42"
[camera.target]
type = "charuco"
squares_x = 10
squares_y = 7
square_mm = 25
marker_mm = 18
dictionary = "DICT_5X5_100"
"""


def test_scenario_camera_table_and_the_rest_pose_sees_the_board():
    sc = parse_scenario(SCENARIO)
    c = sc.camera
    assert c is not None and c.mounting == "eye_in_hand" and c.pixel_format == "Mono16"
    np.testing.assert_allclose(c.camera.parameters, TRUE)
    assert c.exposure_s == pytest.approx(0.008) and c.line_time_s == pytest.approx(2e-5)
    assert c.auto_exposure and c.shutter == "rolling" and c.clock_drift_ppm == -12.5 and c.serial == "CAM-42"
    assert c.target.describe() == "charuco 10x7, 25 mm squares, 18 mm DICT_5X5_100 markers"
    # the flange's default rest pose (0.4 m out, 0.4 m up, facing down) looks at the board below
    world = sc.make_world()
    cam = SimCamera(world, c, seed=sc.seed)
    world.set_flange(make_transform(so3_exp([np.pi, 0, 0]), [0.4, 0.0, 0.4]))
    frame = cam.frame()
    assert frame.image.dtype == np.uint16
    assert TargetDetector(c.target).detect(frame.image).n_corners == c.target.n_corners


def test_scenario_target_file_is_read_beside_the_scenario(tmp_path):
    (tmp_path / "board.toml").write_text('[target]\ntype = "chessboard"\nsquares_x = 9\nsquares_y = 6\nsquare_mm = 30\n')
    text = SCENARIO.split("[camera.target]")[0] + 'target_file = "board.toml"\n'
    sc = parse_scenario(text, source=str(tmp_path / "cell.toml"))
    assert sc.camera.target.kind == "chessboard" and sc.camera.target.sha256 is not None


@pytest.mark.parametrize("edit,message", [
    (("fx_px = 900.0\n", ""), r"^camera.fx_px: required key missing"),
    (('pixel_format = "Mono16"', 'pixel_format = "RGB8"'), r"^camera.pixel_format: must be one of"),
    (('mounting = "eye_in_hand"', 'mounting = "eye_to_hand"'), r"^camera.cell_T_camera_xyz_m: required"),
    (("flange_T_camera_xyz_m", "cell_T_camera_xyz_m"), r"^camera.flange_T_camera_xyz_m: required"),
    (("square_mm = 25", "square_mm = 0"), r"^camera.target.square_mm: must be in"),
    (("exposure_us = 8000", "exposure_us = 8000\nexposure_max_us = 100"), r"^camera: exposure must satisfy"),
    (("serial = ", "seriall = "), r"^camera.seriall: unknown key"),
])
def test_scenario_camera_errors_name_the_key(edit, message):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(SCENARIO.replace(*edit))


def test_every_camera_key_is_documented():
    import tomllib

    doc = (ROOT / "docs" / "simulation.md").read_text()
    section = doc[doc.index("### `[camera]`"):doc.index("## Simulated camera")]
    documented = set(re.findall(r"`([a-zA-Z_][a-zA-Z0-9_]*)`", section))
    keys = set(tomllib.loads(SCENARIO)["camera"]) | {"cell_T_camera_xyz_m", "flange_T_target_xyz_m", "target_file"}
    keys |= {"adc_bits", "pixel_size_um", "full_well_e", "read_noise_e", "dark_current_e_per_s", "white_e_per_ms",
             "black_level_dn", "gain_db", "exposure_min_us", "exposure_max_us", "auto_exposure_level",
             "auto_exposure_time_constant_ms", "blur_sigma_px", "f_number", "focus_distance_m", "trigger_delay_us",
             "readout_ms", "clock_offset_s", "supersample", "black_reflectance", "white_reflectance",
             "background_reflectance", "vendor", "model"}
    from cellcal.sim.scenario import _CAMERA_SCALARS

    assert {k for k, *_ in _CAMERA_SCALARS} <= keys  # the list above is the parser's
    missing = sorted(k for k in keys if k not in documented and k != "target")
    assert not missing, f"camera keys not documented in docs/simulation.md: {missing}"


def test_the_documented_example_sees_its_board():
    doc = (ROOT / "docs" / "simulation.md").read_text()
    block = doc[doc.index("Example: eye-in-hand"):]
    toml = block[block.index("```toml\n") + 8:block.index("```\n", block.index("```toml") + 7)]
    sc = parse_scenario(SCENARIO.split("[camera]")[0] + toml)
    world = sc.make_world()
    cam = SimCamera(world, sc.camera, seed=0)
    assert TargetDetector(sc.camera.target).detect(cam.frame().image).n_corners == sc.camera.target.n_corners
