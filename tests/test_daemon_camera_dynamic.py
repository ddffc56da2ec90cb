"""The dynamic check of a camera hand-eye run (``[camera.hand_eye] dynamic_check``,
``cellcal.daemon.runs.camera_dynamic``): the camera's residual latency against the robot,
from frames taken while the robot moves both ways at two speeds.

End to end on the simulated cell three times faster than real time (the check measures
wall-clock timing: at the suite's usual x30 the robot's 500 Hz samples are 60 ms of simulated
motion apart, too coarse for a velocity; at x3, 6 ms), with a camera whose exposure starts
3 ms of wall time after the stamp it reports (``trigger_delay_s``, simulated seconds): the
daemon finds that latency within its own uncertainty and warns it in ms. The paths that
cannot make the check say so instead of staying silent.
"""

from __future__ import annotations

import dataclasses
import subprocess

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.camera_capture import MovingFrame
from cellcal.daemon.config import load_config_text
from cellcal.daemon.runs import RunContext
from cellcal.daemon.runs import camera_dynamic as cd
from cellcal.drivers.kinematics import dh_model
from cellcal.sim.camera_device import default_camera
from cellcal.sim.scenario import load_scenario
from cellcal.testing.harness import CELLCAL, FAST_SCENARIO, TARGET_FILE, daemon_config, inprocess_cell, to_toml

#: the camera's exposure starts this long after its stamp (ms): the latency to find
DELAY_MS = 3.0
#: the simulated cell's own chain (RTDE clock mapping, GigE Vision stamps) adds a little
#: latency of its own: measured 0.36 +- 0.03 ms with no delay (x3), 0.38 +- 0.08 (x1)
CHAIN_MS = 0.5
#: how much faster than the wall clock the cell runs
TIME_SCALE = 3.0


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    work = tmp_path_factory.mktemp("camera_dynamic")
    sc = load_scenario(FAST_SCENARIO)
    sc = dataclasses.replace(sc, camera=dataclasses.replace(default_camera(sc, "eye_in_hand"),
                                                            trigger_delay_s=DELAY_MS * 1e-3 * TIME_SCALE))
    over = {"camera": {"use_intrinsics": "estimate", "hand_eye": {"dynamic_check": True}}}
    with inprocess_cell(work, scenario=sc, camera="eye_in_hand", camera_views=6, time_scale=TIME_SCALE,
                        validate_bodies=True, overrides=over) as c:
        c.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["devices"].get("camera", {}).get("connected"), 60,
                   "the camera connected")
        run_id = c.svc.start_run(P.KIND_HAND_EYE)
        c.result = c.wait_result(run_id, timeout_s=300)  # type: ignore[attr-defined]
        yield c


@pytest.mark.slow
def test_a_camera_whose_stamps_are_late_is_found_and_warned_in_ms(cell):
    r = cell.result
    d = r["camera_hand_eye"]["dynamic_check"]
    assert d["made"], d
    assert d["latency_ms"] > 0.0  # the images show the robot later than the poses they were paired with
    assert abs(d["latency_ms"] - DELAY_MS) < 3.0 * d["sigma_ms"] + CHAIN_MS, d
    assert 0.0 < d["sigma_ms"] < 0.5 and d["sigma_ms"] >= d["sigma_noise_ms"]
    assert d["n_forward"] >= 3 and d["n_backward"] >= 3 and d["n_frames"] >= d["n_forward"] + d["n_backward"]
    assert d["speeds"] == [0.1, 0.3] and d["max_speed_m_s"] > 0.0
    assert d["rms_at_zero_px"] > 2.0 * d["reprojection_rms_px"]  # a latency the corners show
    (w,) = [w for w in r["warnings"] if w["code"] == "latency"]
    assert f"{d['latency_ms']:+.2f} ms" in w["message"] and w["value"] == pytest.approx(d["latency_ms"])
    assert d["warnings"] == ["latency"]
    # a warning, not a gate: the static calibration stands
    assert r["gates"]["passed"], r["gates"]
    assert not cell.nonconforming()


@pytest.mark.slow
def test_show_tells_the_latency_of_the_dynamic_check(cell):
    out = subprocess.run([*CELLCAL, "show", "--state-dir", str(cell.cfg.service.state_dir)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if "dynamic check" in ln)
    assert f"{cell.result['camera_hand_eye']['dynamic_check']['latency_ms']:+.2f} ms" in line and "BEYOND" in line


def _ctx(tmp_path, motion: str = P.MOTION_COMMAND, dynamic: bool = True) -> RunContext:
    d = daemon_config(robot_url="rtde://127.0.0.1:30004", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    d["camera"] = {"url": "gige://127.0.0.2", "target_file": str(TARGET_FILE), "mounting": "eye_in_hand",
                   "hand_eye": {"dynamic_check": dynamic}}
    d.setdefault("capture", {})["motion_mode"] = motion
    cfg = load_config_text(to_toml(d))
    return RunContext(cfg, None, lambda: dh_model("ur5e"), motion)  # type: ignore[arg-type]


def test_observe_mode_cannot_make_the_check_and_says_so(tmp_path):
    got = cd.dynamic_check(_ctx(tmp_path, P.MOTION_OBSERVE), None, None, measure=None)  # type: ignore[arg-type]
    assert got is not None
    record, warnings = got
    assert record["made"] is False and "does not move this robot" in str(record["note"])
    assert [w["code"] for w in warnings] == ["dynamic_check_not_made"]
    assert "untested" in str(warnings[0]["message"])


def test_the_check_is_absent_when_not_asked_for(tmp_path):
    assert cd.dynamic_check(_ctx(tmp_path, dynamic=False), None, None, measure=None) is None  # type: ignore[arg-type]


def _frame(v: list[float]) -> MovingFrame:
    return MovingFrame(ids=np.arange(4), image_points_px=np.zeros((4, 2)), base_T_flange=np.eye(4),
                       flange_velocity=np.array([*v, 0.0, 0.0, 0.0]), t_host_ns=0, exposure_s=0.005)


def test_frames_are_counted_by_their_direction_along_the_path():
    d = np.array([1.0, 0.0, 0.0])
    frames = [_frame([0.1, 0.0, 0.0]), _frame([0.05, 0.01, 0.0]), _frame([-0.08, 0.0, 0.0]),
              _frame([0.001, 0.0, 0.0]),  # nearly at rest: neither way
              _frame([0.0, 0.2, 0.0])]  # across the path: neither
    assert cd.moving_counts(frames, d) == (2, 1)
    assert cd.moving_counts([], d) == (0, 0)
