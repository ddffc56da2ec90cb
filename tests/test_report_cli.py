"""``cellcal report``, ``cellcal show`` and ``cellcal stations`` on a real daemon's state.

A hand-eye run from given stations and two base-frame calibrations of the simulated cell go
through the daemon (in this process: simulated robot on RTDE over loopback, tracker on a
pty, the real store), and one drift check; then the commands run as a user runs them, as
subprocesses reading that state directory, beside the still running daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_until

from cellcal.daemon import protocol as P
from cellcal.daemon.report.html import FIGURES, report_path
from cellcal.solver.synthetic import hand_eye_scene
from cellcal.testing.harness import inprocess_cell

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

CELLCAL = [sys.executable, "-m", "cellcal.daemon.cli"]
WAIT_S = 90.0


def cellcal(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CELLCAL, *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def _hand_eye_stations() -> list[dict]:
    s = hand_eye_scene(10, np.random.default_rng(5), noise_mm=0.02, noise_deg=0.01)
    return [{"base_T_flange": g.reshape(16).tolist(), "camera_T_target": o.reshape(16).tolist()}
            for g, o in zip(s.base_T_flange, s.measured, strict=True)]


@pytest.fixture(scope="module")
def cell_state(tmp_path_factory):
    """The daemon after run 1 (hand-eye from given stations, result 1), runs 2 and 3 (base
    frame, results 2 and 3, 3 active) and one drift check of result 3."""
    tmp = tmp_path_factory.mktemp("report_cli")
    with inprocess_cell(tmp, n_stations=6) as cell:
        run_id = cell.svc.start_run("hand_eye", stations=_hand_eye_stations())
        hand_eye = cell.wait_result(run_id, WAIT_S)
        wait_until(lambda: cell.svc.wait_idle(0.0), WAIT_S, "the daemon idle after the hand-eye run")
        bodies = []
        for _ in range(2):
            run_id = cell.svc.start_run("base_frame")
            bodies.append(cell.wait_result(run_id, WAIT_S))
            wait_until(lambda: cell.svc.wait_idle(0.0), WAIT_S, "the daemon idle after its run")
        cell.svc.request_drift_check("test")
        cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT, WAIT_S, "the drift check")
        wait_until(lambda: cell.svc.wait_idle(0.0), WAIT_S, "the daemon idle after the drift check")
        state = Path(cell.svc.cfg.service.state_dir)
        assert [b["result_id"] for b in [hand_eye, *bodies]] == ["1", "2", "3"]
        yield {"state": state, "bodies": bodies, "hand_eye": hand_eye}


def test_the_daemon_writes_the_report_next_to_the_exports(cell_state):
    exports = cell_state["state"] / "exports"
    for body in [cell_state["hand_eye"], *cell_state["bodies"]]:
        rid = int(body["result_id"])
        p = report_path(exports, rid)
        assert p.exists() and (exports / f"result_{rid}.json").exists()
        root = ET.fromstring(p.read_bytes())
        figs = [f.get("id") for f in root.iter("{http://www.w3.org/1999/xhtml}figure")]
        assert figs == list(FIGURES)
        assert f"cellcal result {rid}" in p.read_text()
        # every figure that needs stations has them: the run's, or the ones given with it
        assert 'id="fig-residuals" class="figure"' in p.read_text()


def test_report_command_writes_the_active_result_with_its_drift_checks(cell_state, tmp_path):
    state = str(cell_state["state"])
    out = tmp_path / "r.html"
    r = cellcal("report", "-o", str(out), "--state-dir", state)
    assert r.returncode == 0, r.stderr
    assert str(out.resolve()) in r.stdout and "result 3" in r.stdout
    text = out.read_text()
    assert "cellcal result 3" in text
    assert "1 drift checks" in text  # the check made after the result was stored
    # the same bytes again (and for the result named as a person types it)
    again = tmp_path / "again.html"
    assert cellcal("report", "result_3", "-o", str(again), "--state-dir", state).returncode == 0
    assert again.read_bytes() == out.read_bytes()
    # default file name in the working directory; result 2 by id
    r = cellcal("report", "2", "--state-dir", state, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cellcal-result-2.html").exists()


def test_report_finds_the_state_through_cellcal_config(cell_state, tmp_path):
    conf = tmp_path / "c.toml"
    conf.write_text(f'config_version = 1\n[service]\nstate_dir = "{cell_state["state"]}"\n')
    env = {**os.environ, "CELLCAL_CONFIG": str(conf)}
    r = cellcal("report", "-o", "-", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("<?xml") and "cellcal result 3" in r.stdout
    r = cellcal("show", "--config", str(conf))
    assert r.returncode == 0 and r.stdout.startswith("result 3:"), r.stderr


def test_show_gives_mm_deg_with_sigma_gates_warnings_and_export_paths(cell_state):
    r = cellcal("show", "--state-dir", str(cell_state["state"]))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("result 3: base_frame, active")
    body = cell_state["bodies"][1]
    t = np.array(body["transforms"]["cell_T_base"]["translation_m"]) * 1e3
    assert f"x {t[0]:.3f} +- " in out and "translation mm" in out and "rotation deg" in out
    assert "gates            passed" in out and "rms_translation" in out
    assert "warnings" in out
    exports = cell_state["state"] / "exports"
    for name in ("result_3.json", "result_3.urdf", "result_3_report.html"):
        assert str(exports / name) in out
    r2 = cellcal("show", "2", "--state-dir", str(cell_state["state"]))
    assert r2.returncode == 0 and r2.stdout.startswith("result 2: base_frame, not active"), r2.stderr
    r1 = cellcal("show", "1", "--state-dir", str(cell_state["state"]))
    assert r1.returncode == 0 and r1.stdout.startswith("result 1: hand_eye"), r1.stderr
    assert "flange_T_camera" in r1.stdout


def test_show_diff_says_how_the_base_moved_in_mm_deg_and_sigmas(cell_state):
    r = cellcal("show", "--diff", "2", "3", "--state-dir", str(cell_state["state"]))
    assert r.returncode == 0, r.stderr
    a, b = (np.array(x["transforms"]["cell_T_base"]["translation_m"]) for x in cell_state["bodies"])
    d_mm = (b - a) * 1e3
    assert "result 2 -> result 3: cell_T_base" in r.stdout
    assert f"x {d_mm[0]:.4f}, y {d_mm[1]:.4f}, z {d_mm[2]:.4f}" in r.stdout
    assert "deg" in r.stdout and "sigma" in r.stdout
    same = cellcal("show", "--diff", "3", "3", "--state-dir", str(cell_state["state"]))
    assert "0.00 sigma" in same.stdout
    other = cellcal("show", "--diff", "1", "3", "--state-dir", str(cell_state["state"]))
    assert other.returncode == 2 and "nothing in common" in other.stderr


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_stations_round_trip_through_cellcal_solve(cell_state, tmp_path, suffix):
    """The exported stations carry the daemon's settings and covariances: ``cellcal solve``
    of the file, with no option, gives the stored result to 1e-9 m and says so."""
    state = str(cell_state["state"])
    body = cell_state["bodies"][0]
    f = tmp_path / f"run1{suffix}"
    r = cellcal("stations", body["run_id"], "-o", str(f), "--state-dir", state)
    assert r.returncode == 0, r.stderr
    assert "6 stations" in r.stdout and "with the settings it was solved with" in r.stdout
    text = f.read_text()
    assert f"# solve again with: cellcal solve {f.name} --kind base_frame (" in text
    # The daemon declared each station's covariance (the tracker's figures with the robot's
    # repeatability, ``[solve] declare_noise``): the file carries them.
    assert body["uncertainty"]["noise_source"] != "estimated", body["uncertainty"]
    s = cellcal("solve", str(f), "--kind", "base_frame", "--json")
    assert s.returncode == 0, s.stderr
    got = json.loads(s.stdout)
    for name in ("cell_T_base", "flange_T_target"):
        np.testing.assert_allclose(got["transforms"][name]["matrix"], body["transforms"][name]["matrix"],
                                   rtol=0, atol=1e-9, err_msg=name)
        np.testing.assert_allclose(got["uncertainty"]["covariance"][name]["values"],
                                   body["uncertainty"]["covariance"][name]["values"], rtol=1e-6, atol=1e-18,
                                   err_msg=name)
    assert got["rms_translation_m"] == pytest.approx(body["rms_translation_m"], abs=1e-9)
    again = got["reproduces"]
    assert again["result_id"] == int(body["result_id"]) and again["same"] is True
    assert again["differences"]["cell_T_base"]["translation_m"] <= 1e-9
    human = cellcal("solve", str(f), "--kind", "base_frame")
    assert human.returncode == 0 and f"against stored result {body['result_id']}" in human.stdout
    assert "the same solve" in human.stdout
    # Declaring another noise is a different solve, and the command says so.
    other = cellcal("solve", str(f), "--kind", "base_frame", "--noise-mm", "0.5", "--json")
    assert other.returncode == 0, other.stderr
    assert "reproduces" not in json.loads(other.stdout)


def test_hand_eye_stations_given_with_a_run_round_trip_through_cellcal_solve(cell_state, tmp_path):
    body = cell_state["hand_eye"]
    f = tmp_path / "he.jsonl"
    r = cellcal("stations", body["run_id"], "-o", str(f), "--state-dir", str(cell_state["state"]))
    assert r.returncode == 0 and "10 stations" in r.stdout, r.stderr
    s = cellcal("solve", str(f), "--kind", "hand_eye", "--json")
    assert s.returncode == 0, s.stderr
    got = json.loads(s.stdout)
    for name in ("flange_T_camera", "base_T_target"):
        np.testing.assert_allclose(got["transforms"][name]["matrix"], body["transforms"][name]["matrix"],
                                   rtol=0, atol=1e-9, err_msg=name)
    assert got["reproduces"]["same"] is True


def test_commands_refuse_what_is_not_there_clearly(cell_state, tmp_path):
    state = str(cell_state["state"])
    cases = [
        (("show", "99", "--state-dir", state), "no result 99"),
        (("report", "x7", "--state-dir", state), "RESULT_ID must be a positive integer"),
        (("stations", "42", "-o", str(tmp_path / "s.jsonl"), "--state-dir", state), "no run 42"),
        (("show", "--state-dir", str(tmp_path)), "no cellcal store in"),
        (("show", "--config", str(tmp_path / "missing.toml")), "missing.toml"),
        (("show", "--diff", "1", "--state-dir", state), "expected 2 arguments"),
    ]
    for args, want in cases:
        r = cellcal(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr)
        assert want in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr


def test_demo_prints_the_report_path_and_keeps_it(tmp_path):
    """``cellcal demo`` (what ``make demo`` runs): the report and its state directory survive it."""
    r = subprocess.run([*CELLCAL, "demo", "--stations", "5", "--no-drift-check", "--time-scale", "20"],
                       capture_output=True, text=True,
                       timeout=180, stdin=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("report: ")]
    report = Path(line.split("report: ", 1)[1])
    assert report.is_file() and report.is_relative_to(tmp_path) and report.name == "result_1_report.html"
    ET.fromstring(report.read_bytes())
    kept = [ln for ln in r.stdout.splitlines() if ln.strip().startswith("kept: ")]
    assert kept and str(report.parents[2]) in kept[0]
    # the kept state is what `cellcal show` reads
    s = cellcal("show", "--state-dir", str(report.parents[1]))
    assert s.returncode == 0 and s.stdout.startswith("result 1: base_frame, active"), s.stderr
