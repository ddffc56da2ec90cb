"""`cellcal solve` on good and bad files, as a user runs it (a real subprocess)."""

import csv
import json
import math
import subprocess
import sys

import numpy as np
import pytest

from cellcal.solver.se3 import quat_from_matrix, rotation_angle
from cellcal.solver.synthetic import base_frame_scene, pivot_scene

CELLCAL = [sys.executable, "-m", "cellcal.daemon.cli"]


def run(*args, timeout=60):
    return subprocess.run([*CELLCAL, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def scene():
    return base_frame_scene(20, np.random.default_rng(42), noise_mm=0.02, noise_deg=0.01)


def write_jsonl(path, G, M, key="cell_T_target"):
    with open(path, "w") as f:
        f.write("# stations for a test\n")
        for g, m in zip(G, M, strict=True):
            f.write(json.dumps({"base_T_flange": g.tolist(), key: m.tolist()}) + "\n")


def write_csv(path, G, M):
    cols = ["x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"flange_{c}" for c in cols] + [f"target_{c}" for c in cols])
        for g, m in zip(G, M, strict=True):
            row = []
            for T in (g, m):
                row += list(T[:3, 3] * 1e3) + list(quat_from_matrix(T[:3, :3]))
            w.writerow([repr(float(v)) for v in row])


def test_jsonl_report_and_json(tmp_path, scene):
    p = tmp_path / "st.jsonl"
    write_jsonl(p, scene.base_T_flange, scene.measured)
    r = run("solve", str(p))
    assert r.returncode == 0, r.stderr
    assert "cell_T_base" in r.stdout and "axis_spread" in r.stdout and "worst-fitting" in r.stdout
    assert "line " in r.stdout  # worst stations are named by their file line
    r = run("solve", str(p), "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    T = np.array(out["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
    assert np.linalg.norm(T[:3, 3] - scene.X[:3, 3]) < 1e-3
    assert rotation_angle(T[:3, :3].T @ scene.X[:3, :3]) < math.radians(0.05)
    wire = out["transforms"]["cell_T_base"]
    assert wire["parent_frame"] == "cell" and wire["child_frame"] == "base"
    assert set(wire["quaternion"]) == {"w", "x", "y", "z"} and wire["quaternion"]["w"] >= 0
    assert len(out["residuals"]["translation_m"]) == 20


def test_csv_gives_the_same_answer_as_jsonl(tmp_path, scene):
    pj, pc = tmp_path / "a.jsonl", tmp_path / "a.csv"
    write_jsonl(pj, scene.base_T_flange, scene.measured)
    write_csv(pc, scene.base_T_flange, scene.measured)
    a = json.loads(run("solve", str(pj), "--json").stdout)
    b = json.loads(run("solve", str(pc), "--json").stdout)
    Ta = np.array(a["transforms"]["cell_T_base"]["matrix"])
    Tb = np.array(b["transforms"]["cell_T_base"]["matrix"])
    assert np.allclose(Ta, Tb, atol=1e-9)


def test_tool_point_and_hand_eye_kinds(tmp_path):
    G, tip, _ = pivot_scene(12, np.random.default_rng(1))
    p = tmp_path / "pivot.jsonl"
    p.write_text("".join(json.dumps({"base_T_flange": g.tolist()}) + "\n" for g in G))
    out = json.loads(run("solve", str(p), "--kind", "tool_point", "--json").stdout)
    assert np.allclose(out["points"]["flange_p_tip"]["position_m"], tip, atol=1e-9)
    r = run("solve", "--synthetic", "15", "--kind", "hand_eye")
    assert r.returncode == 0 and "flange_T_camera" in r.stdout and "error against the synthetic truth" in r.stdout


def test_bad_json_line_is_named(tmp_path, scene):
    p = tmp_path / "bad.jsonl"
    write_jsonl(p, scene.base_T_flange[:5], scene.measured[:5])
    lines = p.read_text().splitlines()
    lines[3] = lines[3][:-5]  # truncated JSON on file line 4
    p.write_text("\n".join(lines) + "\n")
    r = run("solve", str(p))
    assert r.returncode == 2
    assert "bad.jsonl:4" in r.stderr and "not valid JSON" in r.stderr


def test_bad_matrix_is_named(tmp_path, scene):
    p = tmp_path / "bad.jsonl"
    M = scene.measured[:6].copy()
    M[2, 0, 0] = 2.0  # not a rotation, on file line 4 (line 1 is a comment)
    write_jsonl(p, scene.base_T_flange[:6], M)
    r = run("solve", str(p))
    assert r.returncode == 2 and "bad.jsonl:4" in r.stderr and "orthonormal" in r.stderr
    p.write_text(json.dumps({"base_T_flange": np.eye(4).tolist()}) + "\n")
    r = run("solve", str(p))
    assert r.returncode == 2 and "missing key 'cell_T_target'" in r.stderr


def test_bad_csv_cell_is_named(tmp_path, scene):
    p = tmp_path / "bad.csv"
    write_csv(p, scene.base_T_flange[:5], scene.measured[:5])
    lines = p.read_text().splitlines()
    fields = lines[2].split(",")
    fields[3] = "abc"  # flange_qw on file line 3
    lines[2] = ",".join(fields)
    p.write_text("\n".join(lines) + "\n")
    r = run("solve", str(p))
    assert r.returncode == 2 and "bad.csv:3" in r.stderr and "flange_qw" in r.stderr
    p.write_text("flange_x_mm,flange_y_mm\n1,2\n")
    r = run("solve", str(p))
    assert r.returncode == 2 and "header lacks" in r.stderr


def test_degenerate_file_exits_3_with_the_reason(tmp_path):
    rng = np.random.default_rng(0)
    from cellcal.solver.se3 import make_transform, so3_exp

    G = np.array([make_transform(so3_exp([0, 0, rng.uniform(-2, 2)]), rng.uniform(-0.5, 0.5, 3)) for _ in range(8)])
    p = tmp_path / "axis.jsonl"
    write_jsonl(p, G, G)
    r = run("solve", str(p))
    assert r.returncode == 3 and "same axis" in r.stderr
    r = run("solve", str(tmp_path / "missing.jsonl"))
    assert r.returncode == 2 and "cannot read" in r.stderr


# --- declared noise, refusals and input sanity (ADR 0014) --------------------------------------------


def test_help_states_the_declared_noise_defaults():
    r = run("solve", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "--noise-mm" in text and "default 0.1" in text and "tracker" in text and "robot" in text
    assert "--expect-base" in text and "--robot-model" in text and "--noise-deg" in text


def test_millimetres_are_refused_with_the_likely_causes(tmp_path, scene):
    G = scene.base_T_flange.copy()
    G[:, :3, 3] *= 1e3  # robot poses in mm, tracker in m
    p = tmp_path / "mm.jsonl"
    write_jsonl(p, G, scene.measured)
    r = run("solve", str(p))
    assert r.returncode == 3 and "units" in r.stderr and "swapped" in r.stderr and "Traceback" not in r.stderr
    r = run("solve", str(p), "--robot-model", "ur5e")
    assert r.returncode == 3 and "millimetres" in r.stderr


def test_swapped_inputs_are_caught_by_the_reach_and_the_prior(tmp_path, scene):
    p = tmp_path / "swapped.jsonl"
    write_jsonl(p, scene.measured, scene.base_T_flange)
    assert run("solve", str(p)).returncode == 0  # it fits exactly: residuals cannot tell
    r = run("solve", str(p), "--robot-model", "ur5e")
    assert r.returncode == 3 and "swapped" in r.stderr
    X = scene.X
    from cellcal.solver.se3 import so3_log

    rv = np.degrees(so3_log(X[:3, :3]))
    expect = ",".join(f"{v:.6f}" for v in list(X[:3, 3] * 1e3) + list(rv))
    good = tmp_path / "good.jsonl"
    write_jsonl(good, scene.base_T_flange, scene.measured)
    assert run("solve", str(good), "--expect-base", expect).returncode == 0
    r = run("solve", str(p), "--expect-base", expect)
    assert r.returncode == 3 and "expected" in r.stderr and "inverse matches" in r.stderr
    r = run("solve", str(good), "--expect-base", "1,2,3")
    assert r.returncode == 2 and "--expect-base" in r.stderr
    r = run("solve", str(good), "--robot-model", "nosuch")
    assert r.returncode == 2 and "unknown robot model" in r.stderr


def test_quaternions_in_xyzw_order_are_named(tmp_path, scene):
    p = tmp_path / "xyzw.csv"
    cols = ["x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz"]
    with open(p, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"flange_{c}" for c in cols] + [f"target_{c}" for c in cols])
        for g, m in zip(scene.base_T_flange, scene.measured, strict=True):
            qm = quat_from_matrix(m[:3, :3])
            row = list(g[:3, 3] * 1e3) + list(quat_from_matrix(g[:3, :3])) + list(m[:3, 3] * 1e3) + [*qm[1:], qm[0]]
            w.writerow([repr(float(v)) for v in row])
    r = run("solve", str(p))
    assert r.returncode == 3 and "x,y,z,w" in r.stderr and "target_q*" in r.stderr


def test_misaligned_rows_are_refused_but_robot_model_error_is_a_warning(tmp_path, scene):
    p = tmp_path / "shuffled.jsonl"
    write_jsonl(p, scene.base_T_flange, scene.measured[np.r_[1:20, 0]])  # rows shifted by one
    r = run("solve", str(p))
    assert r.returncode == 3 and "refused" in r.stderr and "x the declared" in r.stderr
    from _worlds import ur5e_world

    G, M, _, _ = ur5e_world(20, np.random.default_rng(3), mm=0.02, deg=0.01)
    q = tmp_path / "kinematic.jsonl"
    write_jsonl(q, G, M)
    r = run("solve", str(q))
    assert r.returncode == 0, r.stderr
    assert "[model_error]" in r.stdout and "robot kinematic error" in r.stdout and "kinematic calibration" in r.stdout
    out = json.loads(run("solve", str(q), "--json").stdout)
    w = [x for x in out["warnings"] if x["code"] == "model_error"]
    assert w and w[0]["value"] > 0.2 and out["converged"] is True and out["residual_tests"]["chi2_p"] < 1e-6


def test_no_input_gives_a_traceback(tmp_path):
    cases = {
        "strings.jsonl": json.dumps({"base_T_flange": [["a"] * 4] * 4, "cell_T_target": [[0] * 4] * 4}) + "\n",
        "nan.csv": "flange_x_mm,flange_y_mm,flange_z_mm,flange_qw,flange_qx,flange_qy,flange_qz,"
                   "target_x_mm,target_y_mm,target_z_mm,target_qw,target_qx,target_qy,target_qz\n"
                   + "nan,0,0,1,0,0,0,0,0,0,1,0,0,0\n",
        "empty.jsonl": "\n",
        "one.jsonl": json.dumps({"base_T_flange": np.eye(4).tolist(), "cell_T_target": np.eye(4).tolist()}) + "\n",
        "binary.csv": "\x00\x01\x02",
    }
    for name, text in cases.items():
        p = tmp_path / name
        p.write_text(text)
        r = run("solve", str(p))
        assert r.returncode in (2, 3), (name, r.returncode, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.startswith("cellcal solve:"), (name, r.stderr)
    r = run("solve", "--synthetic", "20", "--noise-mm", "-1")
    assert r.returncode == 2 and "--noise-mm" in r.stderr


def test_robot_accuracy_and_target_offset_options(tmp_path, scene):
    """``--robot-accuracy-mm`` is what a few stations' uncertainty carries when they cannot test
    for model error; ``--max-target-offset-mm`` refuses a target implausibly far from the
    flange; bad values are usage errors (exit 2)."""
    f = tmp_path / "few.jsonl"
    write_jsonl(f, scene.base_T_flange[:4], scene.measured[:4])
    sig = {}
    for acc in ("0", "2"):
        r = run("solve", str(f), "--estimate-noise", "--robot-accuracy-mm", acc, "--json")
        assert r.returncode == 0, r.stderr
        sig[acc] = json.loads(r.stdout)["uncertainty"]["sigma_translation_m"]
    assert sig["2"] > 2 * sig["0"], sig
    far = run("solve", str(f), "--max-target-offset-mm", "1", "--json")
    assert far.returncode == 3 and "flange" in far.stderr, far.stderr
    for bad in (("--robot-accuracy-mm", "-1"), ("--max-target-offset-mm", "0"), ("--robot-accuracy-mm", "nan")):
        r = run("solve", str(f), *bad)
        assert r.returncode == 2 and bad[0] in r.stderr, r.stderr


def test_camera_only_options_on_a_station_file_are_refused_not_ignored(tmp_path, scene):
    """``-o``, ``--export`` and the other camera-dataset options do nothing for a station file:
    given there, the command says so (exit 2) instead of printing as if it had written a file."""
    p = tmp_path / "st.jsonl"
    write_jsonl(p, scene.base_T_flange[:6], scene.measured[:6])
    for extra, flag in ((["-o", str(tmp_path / "out.json")], "-o/--output"),
                        (["--export", str(tmp_path / "x")], "--export"), (["--noise-px", "0.2"], "--noise-px")):
        r = run("solve", str(p), *extra)
        assert r.returncode == 2 and flag in r.stderr and "--setup" in r.stderr, (extra, r.stderr)
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "x").exists()
    assert run("solve", str(p)).returncode == 0  # the plain solve of the same file still works
