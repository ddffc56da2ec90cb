"""``[camera]`` (ADR 0030): read and checked at load, every error under its own key; off without it.

The URL goes through the driver's own parser and the options through building the driver
(no device is touched); the target file is read when the configuration is, its sha256 kept;
a cell without the section has no camera anywhere (the heartbeat, the devices, the kinds).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from cellcal.daemon import bodies, runs
from cellcal.daemon import protocol as P
from cellcal.daemon.config import ConfigError, load_config, load_config_text
from cellcal.daemon.devices import CellDevices
from cellcal.daemon.runs import RunContext
from cellcal.drivers.kinematics import dh_model
from cellcal.testing.harness import CELLCAL, TARGET_FILE, daemon_config, to_toml

ROOT = Path(__file__).resolve().parents[1]


def _cfg(tmp_path: Path, camera: dict | None) -> dict:
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    if camera is not None:
        d["camera"] = camera
    return d


CAMERA = {"url": "gige://127.0.0.2", "target_file": str(TARGET_FILE), "mounting": "eye_in_hand"}


def _error(tmp_path: Path, camera: dict) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        load_config_text(to_toml(_cfg(tmp_path, camera)))
    return ei.value


def test_a_camera_section_is_read_with_its_target_file_hashed(tmp_path):
    cfg = load_config_text(to_toml(_cfg(tmp_path, {**CAMERA, "exposure_ms": 8.0, "plan": {"max_tilt_deg": 20.0}})))
    c = cfg.camera
    assert c is not None and c.target is not None
    assert c.target_sha256 == hashlib.sha256(TARGET_FILE.read_bytes()).hexdigest() == c.target.sha256
    assert (c.target.kind, c.target.squares_x, c.target.squares_y) == ("charuco", 7, 5)
    assert c.exposure_ms == 8.0 and abs(c.plan.max_tilt_rad - 0.3490658503988659) < 1e-15  # SI inside
    assert c.target_toml == TARGET_FILE.read_text()


def test_a_relative_target_file_is_read_from_the_configuration_s_folder(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "board.toml").write_bytes(TARGET_FILE.read_bytes())
    path = tmp_path / "conf" / "cellcal.toml"
    path.write_text(to_toml(_cfg(tmp_path, {**CAMERA, "target_file": "board.toml"})))
    cfg = load_config(path)
    assert cfg.camera is not None and cfg.camera.target_path == str(tmp_path / "conf" / "board.toml")


@pytest.mark.parametrize("change,key,words", [
    ({"url": "gige://camera.local"}, "camera.url", "not an IPv4 address"),
    ({"url": "gige://255.255.255.255"}, "camera.url", "not one device's address"),
    ({"url": "usb://0"}, "camera.url", "scheme 'usb' unknown"),
    ({"url": ""}, "camera.url", "missing"),
    ({"options": {"retries": 99}}, "camera.options.retries", "retries"),
    ({"options": {"colour": True}}, "camera.options.colour", "colour"),
    ({"target_file": ""}, "camera.target_file", "missing"),
    ({"mounting": "on_the_wall"}, "camera.mounting", "eye_in_hand, eye_to_hand"),
    ({"mounting": None}, "camera.mounting", "missing"),
    ({"use_intrinsics": "newest"}, "camera.use_intrinsics", "latest, estimate or result:<id>"),
    ({"auto_exposure": True, "exposure_ms": 5.0}, "camera.exposure_ms", "auto_exposure"),
    ({"exposure_ms": 0.0}, "camera.exposure_ms", "(0, 60000]"),
    ({"trigger": "hardware"}, "camera.trigger", "off, software"),
    ({"intrinsics": {"fix": ["fx"]}}, "camera.intrinsics.fix[0]", "only distortion terms"),
    ({"intrinsics": {"fix": ["k4"]}}, "camera.intrinsics.fix[0]", "unknown parameter"),
    ({"intrinsics": {"max_rms_px": 0.0}}, "camera.intrinsics.max_rms_px", "(0, 10]"),
    ({"plan": {"n_views": 2}}, "camera.plan.n_views", "[3, 500]"),
    ({"plan": {"pivot_mm": [0.0, 500.0]}}, "camera.plan.pivot_mm", "3 numbers"),
    ({"plan": {"view_q_deg": [0.0] * 5}}, "camera.plan.view_q_deg", "6 numbers"),
    ({"plan": {"view_flange_xyz_mm": [1.0, 2.0, 3.0], "view_flange_quat_wxyz": [1.0, 1.0, 0.0, 0.0]}},
     "camera.plan.view_flange_quat_wxyz", "unit norm"),
    ({"plan": {"view_q_deg": [0.0] * 6, "view_flange_xyz_mm": [1.0, 2.0, 3.0]}}, "camera.plan.view_q_deg", "not both"),
    ({"capture": {"min_corner": 3}}, "camera.capture.min_corner", "did you mean 'min_corners'"),
    ({"hand_eye": {"dynamic_speeds": [0.2]}}, "camera.hand_eye.dynamic_speeds", "two different speeds"),
    ({"hand_eye": {"dynamic_speeds": [0.2, 0.2]}}, "camera.hand_eye.dynamic_speeds", "two different speeds"),
    ({"hand_eye": {"dynamic_speeds": [0.2, 1.5]}}, "camera.hand_eye.dynamic_speeds[1]", "(0, 1]"),
    ({"hand_eye": {"dynamic_path_mm": 0.0}}, "camera.hand_eye.dynamic_path_mm", "(0, 2000]"),
    ({"hand_eye": {"dynamic_min_frames": 1}}, "camera.hand_eye.dynamic_min_frames", "[2, 100]"),
    ({"hand_eye": {"max_latency_ms": -1.0}}, "camera.hand_eye.max_latency_ms", "(0, 1000]"),
    ({"hand_eye": {"dynamic_check": "yes"}}, "camera.hand_eye.dynamic_check", "true or false"),
])
def test_every_camera_error_names_its_key(tmp_path, change, key, words):
    camera = {k: v for k, v in {**CAMERA, **change}.items() if v is not None}  # None: the key left out
    exc = _error(tmp_path, camera)
    assert exc.path == key, str(exc)
    assert words in exc.message, str(exc)


def test_a_bad_target_file_is_an_error_of_the_camera_section_naming_its_own_key(tmp_path):
    bad = tmp_path / "bent.toml"
    bad.write_text('[target]\ntype = "charuco"\nsquares_x = 7\nsquares_y = 5\nsquare_mm = 30.0\nmarker_mm = 40.0\n'
                   'dictionary = "DICT_5X5_100"\n')
    exc = _error(tmp_path, {**CAMERA, "target_file": str(bad)})
    assert exc.path == "camera.target_file" and "target.marker_mm" in exc.message, str(exc)
    exc = _error(tmp_path, {**CAMERA, "target_file": str(tmp_path / "nope.toml")})
    assert exc.path == "camera.target_file" and "cannot read" in exc.message


def test_without_a_camera_section_there_is_no_camera_anywhere(tmp_path):
    cfg = load_config_text(to_toml(_cfg(tmp_path, None)))
    assert cfg.camera is None
    devices = CellDevices(cfg)
    assert P.DEVICE_CAMERA not in devices.status
    hb = bodies.heartbeat(cell="c", state=P.STATE_IDLE, detail="", uptime_s=1.0, heartbeat_s=1.0,
                          devices=devices.status, active_result_id=None, suspect=False, run_id=None, version="0")
    assert set(hb["devices"]) == {"robot", "tracker"} and not P.check_body(P.TOPIC_HEARTBEAT, hb)
    assert "camera" in (runs.get(P.KIND_INTRINSICS).refuse_start(_ctx(cfg)) or "")
    with_camera = load_config_text(to_toml(_cfg(tmp_path, CAMERA)))
    hb = bodies.heartbeat(cell="c", state=P.STATE_IDLE, detail="", uptime_s=1.0, heartbeat_s=1.0,
                          devices=CellDevices(with_camera).status, active_result_id=None, suspect=False, run_id=None,
                          version="0")
    assert hb["devices"]["camera"] == {"connected": False, "url": "gige://127.0.0.2", "identity": None}
    assert not P.check_body(P.TOPIC_HEARTBEAT, hb)


def _ctx(cfg):
    return RunContext(cfg, None, lambda: dh_model("ur5e"), P.MOTION_COMMAND)


@pytest.mark.slow  # runs `cellcal check-config` as a process
def test_check_config_refuses_a_bad_camera_url_naming_the_key(tmp_path):
    path = tmp_path / "cellcal.toml"
    path.write_text(to_toml(_cfg(tmp_path, {**CAMERA, "url": "gige://10.0.0.300"})))
    r = subprocess.run([*CELLCAL, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "camera.url" in r.stderr, r.stderr
    path.write_text(to_toml(_cfg(tmp_path, CAMERA)))
    r = subprocess.run([*CELLCAL, "check-config", str(path), "--quiet"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_camera_keys_are_in_the_configuration_reference():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    for key in ("camera.url", "camera.target_file", "camera.mounting", "camera.use_intrinsics", "camera.options",
                "camera.capture.max_blur_px", "camera.plan.pivot_mm", "camera.intrinsics.max_sigma_focal_px",
                "camera.hand_eye.dynamic_check", "camera.hand_eye.dynamic_speeds", "camera.hand_eye.max_latency_ms"):
        assert f"`{key}`" in doc, key
