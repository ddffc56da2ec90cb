"""Runs of kind ``kinematics`` through the real daemon (``cellcal.daemon.runs.kinematics``).

On the realistic simulated cell (hidden kinematic errors behind the controller's factory
table, ``harness.REALISTIC_SCENARIO``): a kinematics run started over ZeroMQ ends with a
stored, active result whose held-out RMS is below what the base-frame calibration of the same
cell leaves on the same held-out stations; the exports beside it (parameters JSON, the arm's
URDF, the UR ROS driver's calibration YAML) exist and parse. A request for a parameter the
stations cannot determine fails the run with ``DegenerateGeometry`` naming it. The
``[kinematics]`` section is checked like every other one.
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from _kin_daemon import KIN as _KIN
from _kin_daemon import rms as _rms
from _kin_daemon import wait_run_end as _wait_run_end

from cellcal.daemon import protocol as P
from cellcal.daemon import runs
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.config import ConfigError, load_config_text
from cellcal.daemon.runs.iso9283 import solver_params as solver_model
from cellcal.daemon.runs.kinematics_report import driver_model
from cellcal.daemon.wire.client import Client
from cellcal.drivers.kinematics import dh_model
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kinematics_run_beats_the_base_frame_and_exports(tmp_path):
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=10, overrides={"kinematics": _KIN},
                        time_scale=FAST_TIME_SCALE) as cell:
        base_id = cell.svc.start_run(P.KIND_BASE_FRAME, reason="test")
        base = cell.wait_result(base_id, timeout_s=300.0)
        with Client(cell.cfg.zmq.cmd_endpoint, timeout_s=5.0, retries=2) as c:
            reply = c.call("start_run", kind=P.KIND_KINEMATICS)
        assert reply["kind"] == P.KIND_KINEMATICS and reply["planned"] == _KIN["n_stations"] + _KIN["n_validation"]
        run_id = int(str(reply["run_id"]).removeprefix("run-"))
        body = cell.wait_result(run_id, timeout_s=800.0)
        assert body["kind"] == P.KIND_KINEMATICS and body["active"] is True and body["gates"]["passed"] is True
        kin = body["kinematics"]
        val = kin["validation"]
        assert val["after"]["n_stations"] == 30
        after = val["after"]["rms_translation_m"]
        # The base-frame calibration on the same held-out stations (the controller's FK).
        stations = [s for s in cell.svc.store.stations(run_id) if s.plan_index >= _KIN["n_stations"]]
        X = transform_from_wire(base["transforms"]["cell_T_base"])
        Y = transform_from_wire(base["transforms"]["flange_T_target"])
        err = [np.linalg.norm((X @ s.base_T_flange @ Y)[:3, 3] - s.cell_T_target[:3, 3]) for s in stations]
        base_holdout = _rms(np.array(err))
        assert after < base_holdout / 2, (after, base_holdout)
        assert after < val["before"]["rms_translation_m"] / 2
        # Parameters with sigmas and deltas; what was fixed, with its reason.
        assert kin["parameters"] and all({"value", "delta", "sigma"} <= set(v) for v in kin["parameters"].values())
        assert "joint1.zero_offset" in kin["unidentifiable"]
        assert kin["unidentifiable_reasons"]["joint1.zero_offset"]
        assert 1.0 <= kin["condition_number"] <= 100.0
        # Exports beside the others.
        exports = Path(cell.cfg.service.state_dir) / "exports"
        rid = int(str(body["result_id"]).removeprefix("r-"))
        doc = json.loads((exports / f"result_{rid}_kinematics.json").read_text())
        assert doc["format"] == "cellcal.kinematics/1" and doc["parameters"] == kin["parameters"]
        root = ET.parse(exports / f"result_{rid}_arm.urdf").getroot()
        assert root.tag == "robot" and len(root.findall("joint[@type='revolute']")) == 6
        yaml_text = (exports / f"result_{rid}_ur_calibration.yaml").read_text()
        lines = yaml_text.splitlines()
        assert lines[0] == "kinematics:" and any(ln.strip().startswith("hash: calib_") for ln in lines)
        segs = [ln.strip()[:-1] for ln in lines if ln.startswith("  ") and not ln.startswith("    ")
                and ln.strip().endswith(":")]
        assert segs == ["shoulder", "upper_arm", "forearm", "wrist_1", "wrist_2", "wrist_3"]
        assert (exports / "active" / "result_kinematics.json").is_file()


def test_refused_identification_fails_the_run_naming_the_parameters(tmp_path):
    kin = {"n_stations": 10, "n_validation": 30, "parameters": ["joint2.zero_offset", "joint1.zero_offset"]}
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=10, overrides={"kinematics": kin},
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run(P.KIND_KINEMATICS, reason="test")
        assert _wait_run_end(cell, run_id, 500.0) == "failed"
        reason = cell.svc.store.get_run(run_id).status_reason
        assert "DegenerateGeometry" in reason and "joint1.zero_offset" in reason, reason
        assert not [r for r in cell.svc.store.list_results() if r.run_id == run_id]
        # Refused from the plan, before the robot measured anything: no station was wasted.
        assert cell.svc.store.stations(run_id) == []


def test_driver_and_solver_models_agree():
    m = dh_model("ur5e").with_deltas(theta_rad=[0, 1e-3, -2e-3, 0, 5e-4, 0], a_m=[0, 3e-4, 0, 0, 0, 0],
                                     beta_rad=[0, 2e-4, 0, 0, 0, 0])
    q = np.array([0.3, -1.2, 1.1, -0.4, 0.9, 0.2])
    s = solver_model(m)
    assert np.allclose(s.forward(q)[0], m.forward(q), atol=1e-12)
    back = driver_model(s)
    assert np.allclose(back.forward(q), m.forward(q), atol=1e-12)


def test_drift_station_of_a_kinematics_result_uses_the_identified_model():
    from cellcal.daemon.store import StationRecord

    ident = dh_model("ur5e").with_deltas(theta_rad=[0, 2e-3, 0, 0, 0, 0])
    s = solver_model(ident)
    q = np.array([0.1, -1.0, 1.2, -0.5, 1.0, 0.0])
    st = StationRecord(plan_index=0, base_T_flange=dh_model("ur5e").forward(q), q_rad=q, cell_T_target=np.eye(4),
                       cell_p_target=np.zeros(3), tracker_std_translation_m=1e-5, tracker_std_rotation_rad=1e-5,
                       sample_count=1, robot_t_device_s=0.0, tracker_t_device_s=0.0, robot_t_host_ns=0,
                       tracker_t_host_ns=0, settle={}, raw={}, accepted_host_ns=0)

    class Rec:
        kind = "kinematics"
        result = {"kinematics": {"identified": {"name": "x", **{k: list(getattr(s, k)) for k in
                                                               ("a", "d", "alpha", "theta", "beta")}}}}

    got = runs.for_body({**Rec.result, "kind": Rec.kind}).drift_station(Rec.result, st)
    assert np.allclose(got.base_T_flange, ident.forward(q), atol=1e-12)
    assert not np.allclose(got.base_T_flange, st.base_T_flange, atol=1e-6)
    # every other kind predicts the station as measured
    assert runs.for_body({**Rec.result, "kind": "base_frame"}).drift_station(Rec.result, st) is st


_BASE = 'config_version = 1\n[solve]\nkind = "kinematics"\n'


def test_kinematics_section_is_typed_and_bounded():
    c = load_config_text(_BASE + '[kinematics]\nn_stations = 60\nparameters = ["joint2.zero_offset", "link2.beta"]\n'
                                 'max_holdout_rms_mm = 0.2\nuse_identified = true\n')
    k = c.kinematics
    assert c.solve.kind == "kinematics" and k.n_stations == 60 and k.n_validation == 30
    assert k.parameters == ["joint2.zero_offset", "link2.beta"] and math.isclose(k.max_holdout_rms_m, 0.2e-3)
    assert k.use_identified is True and k.max_condition == 100.0
    for text, path in (
        ("n_validation = 29", "kinematics.n_validation"),
        ("n_stations = 5", "kinematics.n_stations"),
        ("max_condition = 1.0", "kinematics.max_condition"),
        ("max_holdout_rms_mm = 0", "kinematics.max_holdout_rms_mm"),
        ('parameters = ["joint7.zero_offset"]', "kinematics.parameters[0]"),
        ('parameters = ["link2.a", "link2.a"]', "kinematics.parameters[1]"),
        ("parameters = [1]", "kinematics.parameters[0]"),
        ("n_station = 40", "kinematics.n_station"),
    ):
        with pytest.raises(ConfigError) as ei:
            load_config_text(_BASE + "[kinematics]\n" + text + "\n")
        assert ei.value.path == path, (text, ei.value)
