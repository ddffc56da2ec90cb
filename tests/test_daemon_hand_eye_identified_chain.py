"""The chain end to end in the daemon: a kinematic identification of a CiA 402 arm with
``[kinematics] use_identified``, then an eye-in-hand camera run on the arm the identified
model now drives (ADR 0027 and 0031, amendments 2026-12-07 b).

The camera run's record is stored before the robot reopens with the identified model, so
what it records of the robot names the model before; its stations were taken with the one
after. The run must read the latter (``jobs.results.known_devices``): the identified
model's held-out accuracy as the arm's declared accuracy, and the kinematics result's own
``cell_T_base`` for the tracker check (the base frame in the gauge of the run's poses).
Reading the record alone, the run declared the arm exact and found no base frame for its
tracker check on the realistic cell.
"""

from __future__ import annotations

import pytest
from _kin_daemon import KIN, result_of, wait_run_end

from cellcal.daemon import protocol as P
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell

pytestmark = pytest.mark.slow

#: chi-square 99.9 % points, by degrees of freedom (the tracker check's: 3 per view)
CHI2_999 = {24: 51.18, 27: 55.48, 30: 59.70, 33: 63.87, 36: 67.99}


@pytest.mark.timeout(900)
def test_a_camera_run_after_an_identification_declares_its_accuracy_and_checks_against_its_base(tmp_path):
    kin = dict(KIN, use_identified=True)
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=10, robot_transport="canopen",
                        time_scale=FAST_TIME_SCALE, camera="eye_in_hand", camera_views=10,
                        # CiA 402 moves are SDO by SDO: a loaded machine may miss a move's deadline
                        overrides={"kinematics": kin, "capture": {"max_consecutive_rejections": 40},
                                   "camera": {"use_intrinsics": "estimate",
                                              "hand_eye": {"tracker_flange_target": True}}}) as cell:
        kid_run = cell.svc.start_run(P.KIND_KINEMATICS, reason="test")
        assert wait_run_end(cell, kid_run, 600.0) == "done", cell.svc.store.get_run(kid_run).status_reason
        kid = result_of(cell, kid_run).id
        he_run = cell.svc.start_run(P.KIND_HAND_EYE, reason="test")
        assert wait_run_end(cell, he_run, 600.0) == "done", cell.svc.store.get_run(he_run).status_reason
        assert cell.svc._devices.model_override_result == kid
        rec = result_of(cell, he_run)
        r = rec.result
        # the run was stored naming the nominal model; its stations and result are the identified one's
        stored = cell.svc.store.get_run(he_run).devices["robot"]["kinematics_digest"]
        assert rec.provenance["kinematics_digest"] != stored
        robot = r["camera_hand_eye"]["robot"]
        assert robot["accuracy_source"] == {"from": "kinematics", "result_id": kid}, robot
        assert 0.0 < robot["accuracy_m"] < 2e-4 and robot["accuracy_rad"] > 0.0, robot
        assert r["gates"]["passed"], [c for c in r["gates"]["checks"] if not c.get("passed", True)]
        codes = {w["code"] for w in r["warnings"]}
        assert "robot_accuracy_undeclared" not in codes and "model_error" not in codes, codes
        tc = r["camera_hand_eye"]["tracker_check"]
        assert tc is not None, r["camera_hand_eye"].get("tracker_check_note")
        assert tc["via"] == "flange" and tc["cell_T_base_result_id"] == kid and tc["passed"], tc
        assert tc["n"] >= 8 and tc["rms_m"] < 5e-4 and tc["nees"] < CHI2_999[tc["dof"]], tc
        assert not cell.nonconforming()


@pytest.mark.timeout(300)
def test_a_daemon_started_on_the_configured_model_marks_results_of_the_identified_one_before_any_job(tmp_path):
    # use_identified turned off before a restart: the daemon's start checks the results against
    # the model it opens the robot with, before its idle loop opens it and before any job, so a
    # to_base through a result of the identified model says suspect from the first request.
    import numpy as np
    from _report_kinds import _body

    from cellcal.daemon.store import Store
    from cellcal.drivers.kinematics import dh_model, kinematics_digest
    from cellcal.solver import calibrate_base_frame, synthetic

    s = synthetic.base_frame_scene(12, np.random.default_rng(5), noise_mm=0.02, noise_deg=0.01)
    base = _body("base_frame", calibrate_base_frame(s.base_T_flange, s.measured))
    with Store(tmp_path / "state").open() as store:
        ident = {"devices": {"robot": {"kinematics_digest": "sha256:" + "ab" * 32}}}  # an identified model's
        other = store.add_result(None, P.KIND_BASE_FRAME, base, ident)
        same = store.add_result(None, P.KIND_BASE_FRAME, base,
                                {"devices": {"robot": {"kinematics_digest": kinematics_digest(dh_model("ur5e"))}}})
    with inprocess_cell(tmp_path, robot_transport="canopen", time_scale=FAST_TIME_SCALE) as cell:
        cell.wait_for(lambda t, b: cell.svc.store.get_result(other).suspect, 60, "the other kinematics' result suspect")
        assert "use_identified is off" in cell.svc.store.get_result(other).suspect_reason
        assert not cell.svc.store.get_result(same).suspect
        assert cell.svc.store.list_runs(limit=5) == []  # no job ran


@pytest.mark.timeout(300)
def test_a_daemon_started_with_use_identified_opens_the_idle_robot_with_the_identified_model(tmp_path):
    # ... and the other way: the idle robot, the heartbeat and the first run's record name the
    # identified model from the start, not the configured one until a job reopens it.
    from _report_kinds import kinematics_kind

    from cellcal.daemon.runs.kinematics_report import identified_model
    from cellcal.daemon.store import Store
    from cellcal.drivers.kinematics import kinematics_digest

    body, _stations, _result = kinematics_kind()
    with Store(tmp_path / "state").open() as store:
        kid = store.add_result(None, P.KIND_KINEMATICS, body, {})
        model = identified_model(store.get_result(kid).result)
    assert model is not None
    want = kinematics_digest(model)
    with inprocess_cell(tmp_path, robot_transport="canopen", time_scale=FAST_TIME_SCALE,
                        overrides={"kinematics": {"use_identified": True}}) as cell:
        cell.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["devices"]["robot"].get("connected"), 60,
                      "the robot connected")
        assert cell.svc._devices.model_override_result == kid
        ident = cell.svc._devices.identities()["robot"]  # what the next run's record will name
        assert ident["kinematics_digest"] == want, ident
