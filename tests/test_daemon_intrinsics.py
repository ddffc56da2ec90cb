"""An ``intrinsics`` run end to end through the daemon: the simulated robot carries a rendered
camera (eye-in-hand) reached through GigE Vision on a loopback address of its own
(``cellcal.testing.harness.inprocess_cell(camera=...)``), and the daemon plans the views,
captures camera stations, solves, gates, stores, exports and publishes (ADR 0030).

One run (the module's fixture) is then read every way a client or an integrator reads it:
the result against the simulator's truth within its sigmas, its stations' images against
their rows, the heartbeat's camera, the offline path (``cellcal stations RUN -o DIR`` then
``cellcal solve DIR --setup intrinsics``, which must give the daemon's answer bit for bit),
``cellcal show``. Then, with the cell idle, the refusals of a camera station on the live
camera and robot (no target in view, too few corners, blur, the robot moved during the
exposure), and a camera that goes away during a run: a fault naming the camera, ridden out
until it is back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_until

from cellcal.daemon import protocol as P
from cellcal.daemon.camera_capture import CameraCapture
from cellcal.daemon.capture import RejectReason, StationRejected
from cellcal.daemon.runs.plan import PlannedStation
from cellcal.sim.camera_device import default_camera, start_sim_camera
from cellcal.testing.harness import CELLCAL, FAST_TIME_SCALE, inprocess_cell

pytestmark = pytest.mark.slow

N_VIEWS = 10


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    work = tmp_path_factory.mktemp("intrinsics")
    with inprocess_cell(work, camera="eye_in_hand", camera_views=N_VIEWS, validate_bodies=True,
                        time_scale=FAST_TIME_SCALE) as c:
        c.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["devices"].get("camera", {}).get("connected"), 60,
                   "the camera connected")
        run_id = c.svc.start_run(P.KIND_INTRINSICS)
        c.result = c.wait_result(run_id, timeout_s=240)  # type: ignore[attr-defined]
        c.run_id = run_id  # type: ignore[attr-defined]
        yield c


def test_the_intrinsics_agree_with_the_simulators_truth_within_their_sigmas(cell):
    r = cell.result
    assert r["kind"] == P.KIND_INTRINSICS and r["active"] and r["gates"]["passed"], r["gates"]
    truth = default_camera(cell.scenario, "eye_in_hand").camera
    ii = r["intrinsics"]
    p, s = np.array(ii["parameters"]), np.array(ii["sigmas"], dtype=float)
    z = (p - truth.parameters) / s
    assert np.all(np.abs(z) < 4.0), dict(zip(ii["parameter_names"], np.round(z, 2), strict=True))
    C = np.array(ii["covariance"]["values"], dtype=float).reshape(9, 9)
    d = p - truth.parameters
    assert float(d @ np.linalg.solve(C, d)) < 27.9  # chi-square 9 dof, 99.9 %
    assert r["image_size"] == list(truth.image_size) and r["reprojection_rms_px"] < 0.2
    assert r["n_stations"] >= N_VIEWS - 1 and ii["holdout"]["method"] == "k-fold refit"
    names = {c["name"] for c in r["gates"]["checks"]}
    assert {"reprojection_rms", "image_coverage", "sigma_focal", "converged"} <= names
    assert r["provenance"]["target_sha256"] == cell.cfg.camera.target_sha256
    assert r["provenance"]["devices"]["camera"]["serial"] == "SIMCAM-0001"
    assert not cell.nonconforming()


def test_every_station_row_has_its_image_and_its_detection(cell):
    state = Path(cell.cfg.service.state_dir)
    stations = cell.svc.store.stations(cell.run_id)
    assert len(stations) >= N_VIEWS - 1
    for s in stations:
        cam = s.camera
        assert cam is not None and cam["image"] == f"images/run_{cell.run_id}/station_{s.plan_index}.png"
        assert hashlib.sha256((state / cam["image"]).read_bytes()).hexdigest() == cam["image_sha256"]
        det = cam["detection"]
        assert len(det["ids"]) == len(det["image_points_px"]) >= 12
        f = cam["frame"]
        assert f["exposure_s"] > 0 and f["t_host_uncertainty_ns"] is not None and f["t_host_ns"] == s.robot_t_host_ns
        assert cam["robot_at_mid_exposure"]["method"].startswith("linear")  # two samples bracketed mid-exposure
        assert cam["target_sha256"] == cell.cfg.camera.target_sha256
        assert s.cell_T_target is None and s.sample_count == 0  # no tracker in a camera station
    bodies = [b for b in cell.bodies(P.TOPIC_STATION) if b["run_id"] == str(cell.run_id) and b["accepted"]]
    assert bodies and all(b["frame"]["n_corners"] >= 12 for b in bodies)


def test_the_heartbeat_names_the_camera(cell):
    hb = cell.bodies(P.TOPIC_HEARTBEAT)[-1]
    cam = hb["devices"]["camera"]
    assert cam["connected"] and cam["url"] == cell.camera.url and "SIMCAM-0001" in cam["identity"]


def test_the_run_written_as_a_dataset_solves_offline_to_the_daemons_answer(cell, tmp_path):
    state = Path(cell.cfg.service.state_dir)
    out = tmp_path / "dataset"
    r = subprocess.run([*CELLCAL, "stations", str(cell.run_id), "-o", str(out), "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (out / "target.toml").read_text() == cell.cfg.camera.target_toml
    r = subprocess.run([*CELLCAL, "solve", str(out), "--setup", "intrinsics", "--json"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    offline = json.loads(r.stdout)
    for key in ("camera_matrix", "dist_coeffs", "image_size", "reprojection_rms_px"):
        assert offline[key] == cell.result[key], key  # the same images, detections and solver: bit for bit
    assert offline["intrinsics"]["sigmas"] == cell.result["intrinsics"]["sigmas"]
    r = subprocess.run([*CELLCAL, "show", cell.result["result_id"], "--state-dir", str(state)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "fx" in r.stdout and "+-" in r.stdout and "camera_info.yaml" in r.stdout, r.stdout


# ---- refusals of a camera station, on the live camera (the cell is idle) --------------------------


def _capture(cell, **changes) -> CameraCapture:
    """The open camera's station path with ``[camera.capture]`` / ``[camera]`` changes."""
    devices = cell.svc.control.devices
    cc = cell.cfg.camera
    capture = dataclasses.replace(cc.capture, **{k: v for k, v in changes.items() if hasattr(cc.capture, k)})
    camera = dataclasses.replace(cc, capture=capture, **{k: v for k, v in changes.items() if not hasattr(cc.capture, k)})
    return CameraCapture(devices.camera, dataclasses.replace(cell.cfg, camera=camera))


def _refused(cell, capture: CameraCapture, *, about_motion: bool = False) -> StationRejected:
    """The station's refusal. A test about the image (corners, blur, no target) takes up to
    three attempts: on a loaded machine the resting robot's RTDE samples can arrive late enough
    to restart its rest window during the exposure (a correct "moved during exposure" refusal of
    a frame whose timing the daemon cannot vouch for, not what such a test is about)."""
    assert cell.svc.wait_idle(30)
    engine = cell.svc.control.devices.engine
    for _attempt in range(1 if about_motion else 3):
        with pytest.raises(StationRejected) as ei:
            capture.station(engine, 999, [], None)
        if ei.value.reason != RejectReason.MOVED_DURING_EXPOSURE:
            break
    return ei.value


def test_too_few_corners_and_a_blurred_target_are_refused(cell):
    rej = _refused(cell, _capture(cell, min_corners=100))
    assert rej.reason == RejectReason.TOO_FEW_CORNERS and rej.detail["n_corners"] < 100
    rej = _refused(cell, _capture(cell, max_blur_px=0.3))
    assert rej.reason == RejectReason.BLURRED and rej.detail["blur_px"] > 0.3


def test_a_robot_that_moves_during_the_exposure_is_refused(cell):
    engine = cell.svc.control.devices.engine
    robot = engine.robot
    q = np.asarray(engine.monitor.status()[0].q_rad, dtype=float)
    asked = threading.Event()

    class MovingWhileExposed(CameraCapture):
        """Asks for the frame only once the monitor sees the robot move, on a move long
        enough to outlast the grab: the exposure falls inside the motion however loaded the
        machine is (a thread nudging the robot when the station began measuring could run
        after the frame had been judged, and a move of milliseconds could end before the
        exposure began)."""

        def settled_frame(self):
            mark = time.monotonic_ns()
            robot.move_to(q_rad=q + np.radians([0.0, 0.0, 0.0, 0.0, 0.0, 6.0]), speed=0.05, wait=False)
            wait_until(lambda: (st := engine.monitor.status()[1]) is not None and st.window_start_ns > mark, 30.0,
                       "the monitor seeing the robot move")
            asked.set()
            return super().settled_frame()

    base = _capture(cell)
    rej = _refused(cell, MovingWhileExposed(base.camera, base.cfg), about_motion=True)
    assert asked.is_set() and rej.reason == RejectReason.MOVED_DURING_EXPOSURE, rej
    engine.monitor.wait_settled(60.0)  # the later tests start from rest


def test_a_camera_resending_its_last_image_is_refused_at_another_pose(cell):
    """The simulator's ``stuck_image`` fault: the camera resends its last image, bit for bit,
    with fresh stamps and frame ids. One station is taken here (its image remembered), the
    robot moves on (the board still in view), and the next station is refused
    ``camera_image_repeated``; the run above, on a live camera, passed the same check."""
    engine = cell.svc.control.devices.engine
    capture = cell.svc.control.devices.camera_capture
    assert cell.svc.wait_idle(30)
    taken = None
    for _attempt in range(3):  # as _refused: a late RTDE sample may restart the rest window
        try:
            taken = capture.station(engine, 998, [], None)
            break
        except StationRejected as exc:
            if exc.reason != RejectReason.MOVED_DURING_EXPOSURE:
                raise
    assert taken is not None
    cell.camera.camera.stick()
    try:
        q = np.asarray(engine.monitor.status()[0].q_rad, dtype=float)
        engine.move_to(PlannedStation(0, q + np.radians([0.0, 0.0, 0.0, 0.0, 3.0, 0.0]), None), threading.Event())
        rej = _refused(cell, capture)
    finally:
        cell.camera.camera.stick(False)
    assert rej.reason == RejectReason.IMAGE_REPEATED, (rej, rej.detail)
    assert rej.detail["repeated_stations_back"] == 1 and rej.detail["robot_moved_m"] > 1e-3, rej.detail
    # healed: the camera's next image is a new one, and the station is taken
    for _attempt in range(3):
        try:
            capture.station(engine, 997, [], None)
            break
        except StationRejected as exc:
            assert exc.reason == RejectReason.MOVED_DURING_EXPOSURE, (exc, exc.detail)


def test_no_target_in_view_is_refused(cell):
    engine = cell.svc.control.devices.engine
    q = np.asarray(engine.monitor.status()[0].q_rad, dtype=float)
    away = q + np.radians([0.0, 0.0, 0.0, 0.0, 50.0, 0.0])  # the wrist turns the camera off the board
    engine.move_to(PlannedStation(0, away, None), threading.Event())
    rej = _refused(cell, cell.svc.control.devices.camera_capture)
    assert rej.reason == RejectReason.NO_TARGET and rej.detail["n_corners"] == 0, (rej, rej.detail)


def _since(cell, mark: int, topic: str, pred, what: str, timeout_s: float = 90.0) -> dict:
    """The first ``topic`` body emitted since ``mark`` with ``pred(body)`` (waits, with a deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for b in cell.since(mark, topic):
            if pred(b):
                return b
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s; state {cell.svc.state_detail!r}"
        time.sleep(0.05)


def test_a_camera_that_goes_away_is_a_fault_naming_the_camera_ridden_out(cell):
    """The last test of the module: the run it starts is aborted."""
    assert cell.svc.wait_idle(30)
    address = cell.camera.device.address
    config = cell.camera.camera.config
    cell.camera.close()
    mark = cell.mark()
    run_id = cell.svc.start_run(P.KIND_INTRINSICS)
    fault = _since(cell, mark, P.TOPIC_FAULT, lambda b: b["active"], "a fault")
    assert fault["device"] == P.DEVICE_CAMERA and fault["code"] == P.E_DEVICE, fault
    back = start_sim_camera(cell.world, config, address)
    try:
        _since(cell, mark, P.TOPIC_STATE, lambda b: b["state"] == P.STATE_CAPTURING and "camera fault cleared" in
               b["reason"], "the run resumed")
        _since(cell, mark, P.TOPIC_STATION, lambda b: b["run_id"] == str(run_id) and b["accepted"],
               "a station after the camera came back")
    finally:
        cell.svc.abort()
        cell.svc.wait_idle(30)
        back.close()
