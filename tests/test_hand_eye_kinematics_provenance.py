"""A camera hand-eye run on an arm whose poses come from an identified model (a CiA 402 arm
with ``[kinematics] use_identified``; ADR 0027, amendment 2026-12-07 b), found through the
run's provenance (the robot's ``kinematics_digest``):

* the absolute accuracy it declares: the configured figure; else that kinematics result's
  held-out figures; else none (the record then warns);
* the base frame of its tracker check: in the gauge of the run's poses (the identification's
  own, or a base-frame result of the same kinematics), never one of other kinematics.

Real SQLite store, the daemon's own kinematics record (``runs.kinematics.gate_and_wire``
through ``tests/_report_kinds.py``).
"""

from __future__ import annotations

import math

import pytest
from _report_kinds import kinematics_kind

from cellcal.daemon import protocol as P
from cellcal.daemon.config import load_config_text
from cellcal.daemon.runs import RunContext
from cellcal.daemon.runs.hand_eye_camera import robot_accuracy
from cellcal.daemon.runs.kinematics import identified_accuracy
from cellcal.daemon.runs.kinematics_report import identified_model
from cellcal.daemon.store import Store
from cellcal.drivers.kinematics import dh_model, kinematics_digest
from cellcal.sim.scenario import load_scenario
from cellcal.testing.harness import FAST_SCENARIO, camera_section, daemon_config, to_toml

SHA = "ab" * 32


@pytest.fixture(scope="module")
def kinematics_body():
    body, _stations, result = kinematics_kind()
    return body, result


def _store_with(tmp_path, body):
    store = Store(tmp_path / "state").open()
    rid = store.add_result(None, P.KIND_KINEMATICS, body, {})
    return store, rid


def _cfg(tmp_path, **hand_eye):
    d = daemon_config(robot_url="canopen://virtual/0", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    section = camera_section("gige://127.0.0.2", "eye_in_hand", load_scenario(FAST_SCENARIO), tmp_path, n_views=8)
    section.setdefault("hand_eye", {}).update(hand_eye)
    d["camera"] = section
    return load_config_text(to_toml(d))


def _run(store, digest):
    devices = {"robot": {"model": "ur5e", "serial": "drives-1", "kinematics_digest": digest}}
    return store.get_run(store.create_run(P.KIND_HAND_EYE, {"stations": 8}, config_sha256=SHA, devices=devices))


def test_the_identified_models_held_out_figures_per_axis(tmp_path, kinematics_body):
    body, result = kinematics_body
    store, rid = _store_with(tmp_path, body)
    with store:
        digest = kinematics_digest(identified_model(body))
        got = identified_accuracy(store, {"kinematics_digest": digest})
        after = result.validation.after
        assert got == pytest.approx((after.rms_translation_m / math.sqrt(3), after.rms_rotation_rad / math.sqrt(3), rid))
        # another model (the nominal arm, a UR's factory table): not this result's figure
        assert identified_accuracy(store, {"kinematics_digest": kinematics_digest(dh_model("ur5e"))}) is None
        assert identified_accuracy(store, {"kinematics_digest": None}) is None
        assert identified_accuracy(store, None) is None
        store.mark_suspect(rid, "the arm was serviced")
        assert identified_accuracy(store, {"kinematics_digest": digest}) is None  # a suspect result is not used


def test_a_point_identification_takes_its_rotation_from_the_translation(tmp_path, kinematics_body):
    body, result = kinematics_body
    body = dict(body, kinematics=dict(body["kinematics"]))
    val = dict(body["kinematics"]["validation"])
    val["after"] = dict(val["after"], rms_rotation_rad=None)  # what a reflector's validation stores
    body["kinematics"]["validation"] = val
    store, _rid = _store_with(tmp_path, body)
    with store:
        m, rad, _ = identified_accuracy(store, {"kinematics_digest": kinematics_digest(identified_model(body))})
        assert m == pytest.approx(result.validation.after.rms_translation_m / math.sqrt(3))
        assert rad == pytest.approx(m / 0.4)


def test_the_run_declares_config_then_the_identified_model_then_nothing(tmp_path, kinematics_body):
    body, result = kinematics_body
    store, rid = _store_with(tmp_path, body)
    with store:
        identified = _run(store, kinematics_digest(identified_model(body)))
        nominal = _run(store, kinematics_digest(dh_model("ur5e")))

        def ctx(cfg):
            return RunContext(cfg=cfg, store=store, model_fn=lambda: dh_model("ur5e"), motion_mode=P.MOTION_COMMAND)

        default = ctx(_cfg(tmp_path))
        m, rad, source = robot_accuracy(default, identified)
        assert source == {"from": "kinematics", "result_id": rid}
        assert m == pytest.approx(result.validation.after.rms_translation_m / math.sqrt(3)) and rad > 0
        assert robot_accuracy(default, nominal) == (0.0, 0.0, {"from": "undeclared"})
        declared = ctx(_cfg(tmp_path, robot_accuracy_mm=0.3))
        m, rad, source = robot_accuracy(declared, identified)  # the integrator's figure wins
        assert (m, rad, source) == (pytest.approx(3e-4), 0.0, {"from": "config"})


def test_a_cia402_arm_opened_with_the_identified_model_names_it_in_its_identity(kinematics_body):
    # the provenance a run records (devices.robot_identity), before any I/O: a model with
    # Hayati tilts has a digest too, the one identified_accuracy looks for
    from cellcal.daemon.devices import robot_identity
    from cellcal.drivers import connect_robot

    body, _ = kinematics_body
    model = identified_model(body)
    assert not model.is_plain_dh  # the identified UR5e has tilts on its parallel axes
    robot = connect_robot("canopen://virtual/0?interface=virtual&nodes=1,2,3,4,5,6", model=model)
    ident = robot_identity(robot)
    assert ident["kinematics_digest"] == kinematics_digest(model)
    assert ident["kinematics_digest"] != kinematics_digest(dh_model("ur5e"))


def test_the_tracker_checks_base_frame_is_in_the_gauge_of_the_runs_poses(tmp_path, kinematics_body):
    # Newest first: a base-frame result of the nominal arm, then the identification. A run on
    # the identified model's poses takes the identification's cell_T_base and target (the
    # nominal one would put the closure off by the gauge and blame the camera); a run on the
    # nominal arm takes the base-frame result; a robot of other kinematics gets none, and says why.
    import numpy as np
    from _report_kinds import _body

    from cellcal.daemon.runs.hand_eye_tracker import _base_frame
    from cellcal.solver import calibrate_base_frame, synthetic

    body, _result = kinematics_body
    d_id, d_nom = kinematics_digest(identified_model(body)), kinematics_digest(dh_model("ur5e"))
    s = synthetic.base_frame_scene(12, np.random.default_rng(3), noise_mm=0.02, noise_deg=0.01)
    base = _body("base_frame", calibrate_base_frame(s.base_T_flange, s.measured))
    with Store(tmp_path / "state").open() as store:
        kid = store.add_result(None, P.KIND_KINEMATICS, body, {})
        bid = store.add_result(None, P.KIND_BASE_FRAME, base, {"devices": {"robot": {"kinematics_digest": d_nom}}})
        got, other = _base_frame(store, {"kinematics_digest": d_id})
        assert got is not None and got.result_id == kid and other == [bid]
        stored = np.array(body["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
        np.testing.assert_allclose(got.cell_T_base, stored, atol=1e-12)
        assert got.flange_p is not None and got.cell_T_base_cov is not None
        got, other = _base_frame(store, {"kinematics_digest": d_nom})
        assert got is not None and got.result_id == bid and other == []
        got, _ = _base_frame(store, None)  # a robot of unknown kinematics: the newest base frame, as before
        assert got is not None and got.result_id == bid
        got, other = _base_frame(store, {"kinematics_digest": "sha256:" + "0" * 64})
        assert got is None and other == [bid]


def test_taking_an_identified_model_marks_results_of_other_kinematics_suspect(tmp_path, kinematics_body):
    # A CiA 402 arm reopened with the identified model: results fitted to other kinematics are
    # in that model's frames, so they are marked suspect (their to_base would be off by the
    # difference); a result of unknown kinematics and the kinematics result itself are not.
    import numpy as np
    from _report_kinds import _body

    from cellcal.daemon.devices import CellDevices
    from cellcal.daemon.runs.kinematics import sync_devices_model
    from cellcal.solver import calibrate_base_frame, synthetic

    body, _ = kinematics_body
    s = synthetic.base_frame_scene(12, np.random.default_rng(3), noise_mm=0.02, noise_deg=0.01)
    base = _body("base_frame", calibrate_base_frame(s.base_T_flange, s.measured))
    d = daemon_config(robot_url="canopen://virtual/0", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    d.setdefault("kinematics", {})["use_identified"] = True
    cfg = load_config_text(to_toml(d))
    nominal = {"devices": {"robot": {"kinematics_digest": kinematics_digest(dh_model("ur5e"))}}}
    with Store(tmp_path / "state").open() as store:
        old = store.add_result(None, P.KIND_BASE_FRAME, base, nominal)
        unknown = store.add_result(None, P.KIND_BASE_FRAME, base, {"devices": {"robot": {}}})
        kid = store.add_result(None, P.KIND_KINEMATICS, body, nominal)
        devices = CellDevices(cfg)
        sync_devices_model(cfg, store, devices)
        assert devices.model_override_result == kid
        assert store.get_result(old).suspect and f"kinematics result {kid}" in store.get_result(old).suspect_reason
        assert not store.get_result(unknown).suspect and not store.get_result(kid).suspect
        marked = []
        sync_devices_model(cfg, store, devices, lambda rid, why: marked.append(rid))
        assert marked == []  # the model did not change: nothing new to mark


def test_going_back_to_the_configured_model_marks_the_identified_models_results_suspect(tmp_path, kinematics_body):
    # use_identified turned off: the arm computes its poses with the configured model again, so
    # results fitted to the identified one are in the wrong frames. Whether it is turned off
    # while the daemon runs or before a restart (a fresh CellDevices), they are marked; the
    # configured model's own results and results of unknown kinematics are not.
    import numpy as np
    from _report_kinds import _body

    from cellcal.daemon.devices import CellDevices
    from cellcal.daemon.runs.kinematics import sync_devices_model
    from cellcal.solver import calibrate_base_frame, synthetic

    body, _ = kinematics_body
    s = synthetic.base_frame_scene(12, np.random.default_rng(4), noise_mm=0.02, noise_deg=0.01)
    base = _body("base_frame", calibrate_base_frame(s.base_T_flange, s.measured))

    def cfg_with(use: bool):
        d = daemon_config(robot_url="canopen://virtual/0", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
        d.setdefault("kinematics", {})["use_identified"] = use
        return load_config_text(to_toml(d))

    nominal = {"devices": {"robot": {"kinematics_digest": kinematics_digest(dh_model("ur5e"))}}}
    with Store(tmp_path / "state").open() as store:
        kid = store.add_result(None, P.KIND_KINEMATICS, body, nominal)
        devices = CellDevices(cfg_with(True))
        sync_devices_model(cfg_with(True), store, devices)
        assert devices.model_override_result == kid
        ident = {"devices": {"robot": {"kinematics_digest": kinematics_digest(devices.model)}}}
        assert ident != nominal
        on_identified = store.add_result(None, P.KIND_BASE_FRAME, base, ident)
        unknown = store.add_result(None, P.KIND_HAND_EYE, base, {"devices": {"robot": {}}})
        # Turned off while running.
        off = cfg_with(False)
        sync_devices_model(off, store, devices)
        assert devices.model_override is None and devices.model_override_result is None
        rec = store.get_result(on_identified)
        assert rec.suspect and "use_identified is off" in rec.suspect_reason
        assert not store.get_result(unknown).suspect
        on_nominal = store.add_result(None, P.KIND_BASE_FRAME, base, nominal)
        marked: list[int] = []
        sync_devices_model(off, store, devices, lambda rid, why: marked.append(rid))
        assert marked == []  # no change since: nothing new to mark
        # Turned off before a restart: a result of the identified model found at the first open.
        later = store.add_result(None, P.KIND_EYE_TO_HAND, base, ident)
        fresh = CellDevices(off)
        sync_devices_model(off, store, fresh, lambda rid, why: marked.append(rid))
        assert marked == [later]
        assert not store.get_result(on_nominal).suspect


def test_a_check_a_store_error_cut_short_runs_again_at_the_next_open(tmp_path, kinematics_body):
    # The pass over the results is done only once it completed: a store error during it (the
    # daemon's start logs it) leaves the next job's open to run it again.
    import numpy as np
    from _report_kinds import _body

    from cellcal.daemon.devices import CellDevices
    from cellcal.daemon.runs.kinematics import sync_devices_model
    from cellcal.daemon.store import StoreError
    from cellcal.solver import calibrate_base_frame, synthetic

    s = synthetic.base_frame_scene(12, np.random.default_rng(6), noise_mm=0.02, noise_deg=0.01)
    base = _body("base_frame", calibrate_base_frame(s.base_T_flange, s.measured))
    d = daemon_config(robot_url="canopen://virtual/0", tracker_url="socket://127.0.0.1:4000", workdir=tmp_path)
    cfg = load_config_text(to_toml(d))
    with Store(tmp_path / "state").open() as store:
        other = {"devices": {"robot": {"kinematics_digest": "sha256:" + "cd" * 32}}}
        rid = store.add_result(None, P.KIND_BASE_FRAME, base, other)
        devices = CellDevices(cfg)

        def failing(result_id: int, why: str) -> None:
            raise StoreError("disk I/O error")

        with pytest.raises(StoreError):
            sync_devices_model(cfg, store, devices, failing)
        assert not devices.kinematics_checked
        marked: list[int] = []
        sync_devices_model(cfg, store, devices, lambda result_id, why: marked.append(result_id))
        assert marked == [rid] and devices.kinematics_checked
