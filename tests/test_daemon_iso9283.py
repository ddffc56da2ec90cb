"""The ISO 9283 pose test of a kinematics run, measured by the devices (``runs.iso9283.iso9283_phase``).

On the realistic simulated cell (hidden kinematic errors behind the controller's factory
table, ``harness.REALISTIC_SCENARIO``), through the real drivers and the real daemon: a
kinematics run with ``[kinematics] iso9283_cycles = 3`` stores P1-P5 AP and RP before (joint
targets from the nominal arm) and after (from the identified arm); the identification shrinks
AP by a wide margin and leaves RP (the arm's repeatability) alone. The pose test's stations
are stored with the run, tagged, and are in no fit, validation or drift check. The report
shows the table; a disabled test stores no block and the report says why. One run serves
every assertion (the kinematics run is what costs time).
"""

from __future__ import annotations

import copy
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from cellcal.daemon import capture as cap
from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config, ConfigError, load_config_text
from cellcal.daemon.report import html as R
from cellcal.daemon.runs import iso9283 as ISO
from cellcal.daemon.runs import kinematics as K
from cellcal.daemon.runs import kinematics_report as KR
from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell, nonconforming_bodies, run_status

_CYCLES = 3
# The fewest fit stations a run may plan: the identification still passes its gates, and the
# nominal arm's AP (about 0.5 mm here) is more than three times the identified arm's.
_KIN = {"n_stations": 10, "n_validation": 30, "iso9283_cycles": _CYCLES}
_XHTML = "{http://www.w3.org/1999/xhtml}"


@pytest.fixture(scope="module")
def iso_run(tmp_path_factory):
    """(result body, the run's stations, the stored report's text, the solver's result) of
    one kinematics run with the pose test."""
    tmp = tmp_path_factory.mktemp("iso9283")
    with inprocess_cell(tmp, scenario="realistic", n_stations=10, overrides={"kinematics": _KIN},
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run(P.KIND_KINEMATICS, reason="test")
        body = cell.wait_result(run_id, timeout_s=600.0)
        stations = cell.svc.store.stations(run_id)
        rid = int(str(body["result_id"]).removeprefix("r-"))
        text = R.report_from_store(cell.svc.store, rid)
        solved = K.solve_run(stations, cell.svc.store.get_run(run_id).plan, cell.cfg, cell.svc._devices.model)
        # every body the run published conforms to the protocol (the result's new keys too)
        assert nonconforming_bodies(cell.events) == []
        state_dir = Path(cell.cfg.service.state_dir)
        yield body, stations, text, solved, state_dir


def _rows(root: ET.Element, cls: str) -> list[list[str]]:
    table = next(t for t in root.iter(_XHTML + "table") if t.get("class") == cls)
    return [["".join(td.itertext()).strip() for td in tr.findall(_XHTML + "td")] for tr in table.findall(_XHTML + "tr")
            if tr.findall(_XHTML + "td")]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_pose_test_is_stored_and_identification_shrinks_ap(iso_run):
    body, _, _, _, _ = iso_run
    assert body["kind"] == P.KIND_KINEMATICS and body["gates"]["passed"] is True
    iso = body["kinematics"]["iso9283"]
    assert iso["cycles"] == _CYCLES and iso["poses"] == ["P1", "P2", "P3", "P4", "P5"]
    assert iso["measurement"] == "pose" and len(iso["cube_centre_m"]) == 3 and 0.05 < iso["cube_side_m"] <= 0.3
    before, after = iso["before"], iso["after"]
    for d in (before, after):
        assert len(d["ap_m"]) == len(d["rp_m"]) == 5 and len(d["ap_abc_rad"]) == 5
        assert d["max_ap_m"] == max(d["ap_m"]) and d["max_rp_m"] == max(d["rp_m"])
        # repeatability is the arm's and the tracker's (tens of micrometres), not the model's
        assert all(math.isfinite(v) and 0.0 < v < 0.3e-3 for v in d["rp_m"]), d["rp_m"]
    # the hidden kinematic errors cost the nominal arm about half a millimetre at the worst
    # pose; the identified arm (from ten stations) about 0.15 mm: half is a wide margin
    assert after["max_ap_m"] < before["max_ap_m"] / 2, (after["max_ap_m"], before["max_ap_m"])
    assert before["max_ap_m"] > 0.3e-3
    assert sum(after["ap_m"]) < sum(before["ap_m"]) / 2


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_pose_test_stations_are_stored_and_never_fitted(iso_run):
    body, stations, _, solved, _ = iso_run
    iso_st = [s for s in stations if ISO.is_iso9283_station(s)]
    assert len(iso_st) == 2 * _CYCLES * 5
    iso = body["kinematics"]["iso9283"]
    assert [s.plan_index for s in iso_st] == iso["plan_indices"]["before"] + iso["plan_indices"]["after"]
    tags = [s.raw[ISO.ISO9283_TAG] for s in iso_st]
    assert [t["phase"] for t in tags] == ["before"] * 15 + ["after"] * 15
    assert [t["pose"] for t in tags[:10]] == ["P1", "P2", "P3", "P4", "P5"] * 2  # cycle order P1..P5
    assert all(s.cell_T_target is not None for s in iso_st)
    # the fit and the validation are the run's own stations only
    assert body["n_stations"] == _KIN["n_stations"] == solved.n_stations
    assert body["kinematics"]["validation"]["after"]["n_stations"] == _KIN["n_validation"]
    assert math.isclose(solved.rms_translation_m, body["rms_translation_m"], rel_tol=1e-9)
    assert all(cs["plan_index"] < ISO.ISO9283_INDEX_BASE for cs in body["check_stations"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_wire_body_has_uncertainty_and_holdout(iso_run):
    body, _, text, _, _ = iso_run
    u = body["uncertainty"]
    assert set(u["covariance"]) == {"cell_T_base", "flange_T_target"}
    assert u["covariance"]["cell_T_base"]["shape"] == [6, 6]
    assert 0.0 < u["sigma_translation_m"] < 2e-3 and 0.0 < u["sigma_rotation_rad"] < 0.01
    h = body["holdout"]
    assert len(h["translation_m"]) == body["n_stations"] and h["method"]
    assert 0.0 < h["p50_translation_m"] <= h["max_translation_m"] < 2e-3
    # the report's figures read them: no "n/a" sigma, a held-out method, the covariance drawn
    root = ET.fromstring(text)
    row = next(r for r in _rows(root, "summary") if r[0] == "uncertainty (1 sigma)")
    assert "n/a" not in row[1] and f"{u['sigma_translation_m'] * 1e3:.4f} mm" in row[1], row
    assert f"held-out method: {h['method']}" in text and "no held-out closure for this result" not in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_report_shows_the_iso_table(iso_run):
    body, _, text, _, _ = iso_run
    root = ET.fromstring(text)
    worst = _rows(root, "iso9283")
    assert [r[0] for r in worst] == ["before", "after"]
    iso = body["kinematics"]["iso9283"]
    for row, key in zip(worst, ("before", "after"), strict=True):
        assert float(row[1]) == pytest.approx(iso[key]["max_ap_m"] * 1e3, abs=0.6e-4)
        assert float(row[2]) == pytest.approx(iso[key]["max_rp_m"] * 1e3, abs=0.6e-4)
    per_pose = _rows(root, "iso9283-poses")
    assert [r[0] for r in per_pose] == ["P1", "P2", "P3", "P4", "P5"]
    for j, row in enumerate(per_pose):
        assert float(row[1]) == pytest.approx(iso["before"]["ap_m"][j] * 1e3, abs=0.6e-4)
        assert float(row[2]) == pytest.approx(iso["after"]["ap_m"][j] * 1e3, abs=0.6e-4)
    assert "not part of this result" not in text and "not measured" not in text
    # The daemon keeps the nominal arm's rigid fit: the section draws the residuals before too.
    assert body["kinematics"]["nominal_fit"]["transforms"]["cell_T_base"]
    figs = [f.get("id") for f in root.iter("{http://www.w3.org/1999/xhtml}figure")]
    assert figs[0] == KR.KINEMATICS_FIGURE and "fig-residuals" in figs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_show_tells_the_identification_and_the_pose_test(iso_run):
    """``cellcal show`` of the kinematics result, run as a user runs it on the daemon's state:
    every identified parameter against nominal with its 1-sigma, what was fixed and why,
    the held-out validation and the pose test's worst AP and RP, before -> after."""
    body, _, _, _, state_dir = iso_run
    rid = str(body["result_id"]).removeprefix("r-")
    r = subprocess.run([sys.executable, "-m", "cellcal.daemon.cli", "show", rid, "--state-dir",
                        str(state_dir)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    kin = body["kinematics"]
    rows = {ln.split()[0]: ln.split() for ln in out.splitlines() if ln.startswith("    ") and ln.split()
            and ln.split()[0] in kin["parameters"]}
    assert list(rows) == list(kin["parameters"])
    for name, cols in rows.items():
        p = kin["parameters"][name]
        f = 1e3 if cols[1] == "mm" else math.degrees(1.0)
        assert cols[1] == ("mm" if name.endswith((".a", ".d")) else "deg")
        assert float(cols[3]) == pytest.approx(p["value"] * f, abs=1e-4)
        assert float(cols[5]) == pytest.approx(p["sigma"] * f, abs=1e-4)
    for name in kin["unidentifiable"]:
        assert f"      {name}: {kin['unidentifiable_reasons'][name]}" in out
    after = kin["validation"]["after"]
    assert f"{after['n_stations']} validation stations never fitted" in out
    iso = kin["iso9283"]
    line = next(ln for ln in out.splitlines() if ln.startswith("  ISO 9283"))
    assert f"{iso['cycles']} cycles" in line
    assert (f"worst AP {iso['before']['max_ap_m'] * 1e3:.4f} -> {iso['after']['max_ap_m'] * 1e3:.4f} mm"
            in line), line


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_disabled_pose_test_stores_no_block_and_the_report_says_why(iso_run):
    """``iso9283_cycles = 0``: the phase measures nothing (``measure`` is never called) and
    the stored record and its report say why."""
    body, stations, _, solved, _ = iso_run
    cfg = load_config_text('config_version = 1\n[kinematics]\niso9283_cycles = 0\n')
    calls: list[int] = []
    got = _phase(solved, cfg, _model(), stations, {}, lambda ps, tag: calls.append(ps.index))
    assert calls == [] and isinstance(got, str) and "iso9283_cycles = 0" in got
    _, wire = K.gate_and_wire(solved, cfg, [], iso9283=got)
    assert "iso9283" not in wire["kinematics"] and wire["kinematics"]["iso9283_not_measured"] == got
    shown = copy.deepcopy(body)
    shown["kinematics"] = wire["kinematics"]
    html = R.render_report(shown)
    assert "ISO 9283 not measured: disabled ([kinematics] iso9283_cycles = 0)" in html
    assert 'class="iso9283"' not in html


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_abort_during_the_pose_test_ends_the_run(tmp_path):
    """The pose test's moves go through the capture path: an abort stops the robot and
    closes the run as aborted, with no result; what was measured stays stored."""
    kin = dict(_KIN, iso9283_cycles=2)
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=10, overrides={"kinematics": kin},
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run(P.KIND_KINEMATICS, reason="test")
        cell.wait_for(lambda topic, body: topic == P.TOPIC_STATE and str(body.get("state")).lower() == "capturing"
                      and "ISO 9283" in str(body.get("reason")), 500.0, "the pose test to start")
        assert cell.svc.abort() is True

        def ended(_topic: str, _body: dict) -> bool:
            return run_status(Path(cell.cfg.service.state_dir), run_id) == "aborted"

        if not ended("", {}):
            cell.wait_for(ended, 60.0, f"run {run_id} to be aborted")
        assert cell.svc.wait_idle(60.0)
        assert not [r for r in cell.svc.store.list_results() if r.run_id == run_id]
        stored = cell.svc.store.stations(run_id)
        assert len(ISO.without_iso9283(stored)) == _KIN["n_stations"] + _KIN["n_validation"]
        assert len([s for s in stored if ISO.is_iso9283_station(s)]) < 2 * 2 * 5


def _model():
    from cellcal.drivers.kinematics import dh_model

    return dh_model("ur5e")


def test_iso9283_keys_are_typed_and_bounded():
    base = 'config_version = 1\n[kinematics]\n'
    k = load_config_text(base + "iso9283_cycles = 3\niso9283_cube_centre_mm = [-500, -100, 375]\n"
                                "iso9283_cube_side_mm = 200\n").kinematics
    assert k.iso9283_cycles == 3 and np.allclose(k.iso9283_cube_centre_m, [-0.5, -0.1, 0.375])
    assert math.isclose(k.iso9283_cube_side_m, 0.2)
    d = Config().kinematics
    assert d.iso9283_cycles == 30 and d.iso9283_cube_centre_m == [] and d.iso9283_cube_side_m == 0.0
    for text, path in (
        ("iso9283_cycles = 1", "kinematics.iso9283_cycles"),
        ("iso9283_cycles = -1", "kinematics.iso9283_cycles"),
        ("iso9283_cycles = 1001", "kinematics.iso9283_cycles"),
        ("iso9283_cycles = 2.5", "kinematics.iso9283_cycles"),
        ("iso9283_cube_centre_mm = [1, 2]", "kinematics.iso9283_cube_centre_mm"),
        ('iso9283_cube_centre_mm = ["a", 1, 2]', "kinematics.iso9283_cube_centre_mm[0]"),
        ("iso9283_cube_side_mm = -1", "kinematics.iso9283_cube_side_mm"),
        ("iso9283_cube_side_mm = 6000", "kinematics.iso9283_cube_side_mm"),
    ):
        with pytest.raises(ConfigError) as ei:
            load_config_text(base + text + "\n")
        assert ei.value.path == path, (text, ei.value)


def test_the_cube_stays_inside_the_workspace_box():
    cfg = load_config_text('config_version = 1\n[kinematics]\niso9283_cube_centre_mm = [0, 0, 2000]\n')
    with pytest.raises(ValueError, match="outside the \\[plan\\] workspace box"):
        ISO._cube(cfg)
    cfg = load_config_text('config_version = 1\n[kinematics]\niso9283_cube_side_mm = 400\n')
    with pytest.raises(ValueError, match="leaves the \\[plan\\] workspace box"):
        ISO._cube(cfg)
    centre, side, room = ISO._cube(Config())
    assert side is None and np.allclose(centre, [-0.5, -0.1, 0.375]) and math.isclose(room, 0.3)


def test_stations_of_the_pose_test_are_told_apart():
    from cellcal.daemon.store import StationRecord

    def st(i: int, raw: dict) -> StationRecord:
        return StationRecord(plan_index=i, base_T_flange=np.eye(4), q_rad=np.zeros(6), cell_T_target=np.eye(4),
                             cell_p_target=None, tracker_std_translation_m=1e-5, tracker_std_rotation_rad=1e-5,
                             sample_count=1, robot_t_device_s=0.0, tracker_t_device_s=0.0, robot_t_host_ns=0,
                             tracker_t_host_ns=0, settle={}, raw=raw, accepted_host_ns=0)

    fit, iso = st(3, {}), st(ISO.ISO9283_INDEX_BASE + 2, {ISO.ISO9283_TAG: {"phase": "before", "cycle": 1, "pose": "P3"}})
    assert not ISO.is_iso9283_station(fit) and ISO.is_iso9283_station(iso)
    assert ISO.without_iso9283([fit, iso]) == [fit]



@pytest.mark.parametrize("measurement", ["point", "pose"])
def test_the_phase_commands_p1_to_p5_per_cycle_and_reads_points_or_poses(measurement):
    """``iso9283_phase`` on a simulated UR5e with hidden errors (``tests/_kin_world``), its
    ``measure`` the truth arm at the commanded joints plus tracker noise: the cycles visit
    P1..P5 in order, before then after; identification shrinks AP; 3-DoF points give
    positions only."""
    import dataclasses

    from _kin_world import measure, random_q, truth_arm

    from cellcal.daemon.store import StationRecord
    from cellcal.solver import UR5E, identify_kinematics

    rng = np.random.default_rng(3)
    truth = truth_arm(rng)
    point = measurement == "point"

    def record(i: int, q: np.ndarray) -> StationRecord:
        m = measure(truth, q[None, :], rng)
        return StationRecord(plan_index=i, base_T_flange=UR5E.forward(q)[0], q_rad=q,
                             cell_T_target=None if point else m.cell_T_target[0], cell_p_target=m.cell_p_target[0],
                             tracker_std_translation_m=1e-5, tracker_std_rotation_rad=None if point else 1e-4,
                             sample_count=10, robot_t_device_s=0.0, tracker_t_device_s=0.0, robot_t_host_ns=0,
                             tracker_t_host_ns=0, settle={}, raw={}, accepted_host_ns=0)

    stations = [record(i, q) for i, q in enumerate(random_q(rng, 70))]
    run_plan = {"identification": {"n_fit": 40}}
    cfg = load_config_text('config_version = 1\n[kinematics]\niso9283_cycles = 2\nmax_holdout_rms_mm = 5\n'
                           '[solve]\nmax_rms_mm = 5\nmax_rms_deg = 1\n')
    q, kw = K._fit_inputs(stations, run_plan, cfg, validation=True)
    result = identify_kinematics(q, UR5E, **kw)
    assert K.gates(result, cfg).passed
    seen: list[tuple[str, int, str]] = []

    def take(ps, tag):
        seen.append((tag["phase"], tag["cycle"], tag["pose"]))
        return dataclasses.replace(record(ps.index, ps.q_rad), raw={ISO.ISO9283_TAG: tag})

    got = _phase(result, cfg, UR5E, stations, run_plan, take)
    assert isinstance(got, dict), got
    names = ["P1", "P2", "P3", "P4", "P5"]
    assert seen == [(ph, c, n) for ph in ("before", "after") for c in (1, 2) for n in names]
    assert got["measurement"] == measurement and got["cycles"] == 2
    assert ("ap_abc_rad" in got["after"]) is (not point)
    assert got["after"]["max_ap_m"] < got["before"]["max_ap_m"] / 2, (got["after"]["max_ap_m"],
                                                                       got["before"]["max_ap_m"])
    # a refused measurement leaves the reason, and the stations measured so far are counted
    def refuse(ps, tag):
        if tag["pose"] == "P3":
            raise cap.StationRejected(cap.RejectReason.MOVE_FAILED, "protective stop")
        return take(ps, tag)

    why = _phase(result, cfg, UR5E, stations, run_plan, refuse)
    assert why == "before cycle 1 of 2, P3: move_failed: protective stop (2 pose-test measurements were stored with the run)"
    # resumed: what is stored is used, not measured again; stored under another cycle count it is refused
    plan = ISO.plan_iso9283(result, cfg, ISO.solver_params(UR5E), K.nominal_fit(stations, run_plan, cfg, UR5E))
    stored = [take(ps, tag) for ps, tag in _planned(plan, UR5E, 2)]
    seen.clear()
    again = _phase(result, cfg, UR5E, stations + stored[:7], run_plan, take)
    assert isinstance(again, dict) and len(seen) == 20 - 7
    cfg3 = load_config_text('config_version = 1\n[kinematics]\niso9283_cycles = 3\nmax_holdout_rms_mm = 5\n'
                            '[solve]\nmax_rms_mm = 5\nmax_rms_deg = 1\n')
    why = _phase(result, cfg3, UR5E, stations + stored, run_plan, take)
    assert isinstance(why, str) and "iso9283_cycles changed" in why, why


def _phase(result, cfg, model, stations, run_plan, measure):
    """``iso9283_phase`` as the kinematics kind calls it, with ``measure(planned, tag)``."""
    report = K.gates(result, cfg)
    return ISO.iso9283_phase(result, cfg, model, stations, lambda ps, raw, what: measure(ps, raw[ISO.ISO9283_TAG]),
                             can_move=True, refused="" if report.passed else report.reason(),
                             rigid=K.nominal_fit(stations, run_plan, cfg, model))


def _planned(plan, model, cycles):
    """The pose test's planned stations and tags, in the order the phase measures them."""
    from cellcal.daemon.runs.plan import PlannedStation

    out = []
    for p_i, phase in enumerate(ISO.ISO9283_PHASES):
        for c in range(cycles):
            for j, name in enumerate(["P1", "P2", "P3", "P4", "P5"]):
                idx = ISO.ISO9283_INDEX_BASE + (p_i * cycles + c) * 5 + j
                q = plan.q[phase][j]
                out.append((PlannedStation(idx, q, model.forward(q)[0]), {"phase": phase, "cycle": c + 1, "pose": name}))
    return out
