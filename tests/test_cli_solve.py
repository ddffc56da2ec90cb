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
        for g, m in zip(G, M):
            f.write(json.dumps({"base_T_flange": g.tolist(), key: m.tolist()}) + "\n")


def write_csv(path, G, M):
    cols = ["x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"flange_{c}" for c in cols] + [f"target_{c}" for c in cols])
        for g, m in zip(G, M):
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
