"""Hostile station files for ``cellcal solve``: every one a typed error naming the line, exit 2,
never a traceback, and memory bounded per line (real subprocesses, as a user runs them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hypothesis.strategies as hs
import numpy as np
import pytest
from hypothesis import given, settings

from cellcal.daemon.cli.stations_io import MAX_LINE_BYTES, StationFileError, read_stations

# The child reports its own peak memory, so other tests' children do not count.
_RUN = (
    "import resource, sys\n"
    "from cellcal.daemon.cli import main\n"
    "rc = main(sys.argv[1:])\n"
    "sys.stderr.write('MAXRSS_KB %d\\n' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    "sys.exit(rc)\n"
)

EYE = np.eye(4).tolist()


def solve(path: Path, *args: str) -> tuple[int, str, int]:
    r = subprocess.run([sys.executable, "-c", _RUN, "solve", str(path), *args],
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("MAXRSS_KB ")]
    rss = int(lines[-1].split()[1]) if lines else 0
    return r.returncode, r.stderr, rss


def solve_here(capsys, path: Path) -> tuple[int, str]:
    """``cellcal solve`` in this process: an exception escaping it fails the test."""
    from cellcal.daemon.cli import main

    rc = main(["solve", str(path)])
    return rc, capsys.readouterr().err


def _station(g=None, m=None) -> str:
    return json.dumps({"base_T_flange": g if g is not None else EYE, "cell_T_target": m if m is not None else EYE})


def _with_line(tmp_path: Path, name: str, bad: str, good_before: int = 2) -> Path:
    p = tmp_path / name
    p.write_text("".join(_station() + "\n" for _ in range(good_before)) + bad + "\n" + _station() + "\n")
    return p


def _jsonl_cases() -> list[tuple[str, str, str]]:
    row = [1.0, 0.0, 0.0, 0.0]
    huge_int = "1" + "0" * 5000
    return [
        ("huge integer", f'{{"base_T_flange": [[{huge_int}, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], '
                         f'"cell_T_target": {json.dumps(EYE)}}}', "finite"),
        ("deep nesting", "[" * 100_000 + "]" * 100_000, "longer than"),
        ("deep nesting within the line limit", "[" * 20_000 + "]" * 20_000, "nested more than"),
        ("string entry", _station([[*row[:3], "0.1"], *EYE[1:]]), "must be a number"),
        ("true entry", json.dumps({"base_T_flange": [[True, 0, 0, 0], *EYE[1:]], "cell_T_target": EYE}),
         "must be a number"),
        ("null entry", json.dumps({"base_T_flange": [[None, 0, 0, 0], *EYE[1:]], "cell_T_target": EYE}),
         "must be a number"),
        ("NaN literal", '{"base_T_flange": [[NaN, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], '
                        f'"cell_T_target": {json.dumps(EYE)}}}', "not a number"),
        ("overflowing float", '{"base_T_flange": [[1, 0, 0, 1e999], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]], '
                              f'"cell_T_target": {json.dumps(EYE)}}}', "finite"),
        ("absurd translation", _station([[1, 0, 0, 1e300], *EYE[1:]]), "beyond"),
        ("ragged matrix", _station([[1, 0, 0], *EYE[1:]]), "4x4"),
        ("matrix as a map", _station({"a": 1}), "4x4"),
        ("array line", "[1, 2, 3]", "object per line"),
    ]


@pytest.mark.parametrize("what, line, needle", _jsonl_cases(), ids=[c[0] for c in _jsonl_cases()])
def test_hostile_jsonl_lines_are_typed_errors_naming_the_line(tmp_path, capsys, what, line, needle):
    p = _with_line(tmp_path, "st.jsonl", line)
    rc, err = solve_here(capsys, p)
    assert rc == 2, err
    assert f"{p.name}:3" in err and needle in err, err[-500:]


def test_invalid_utf8_and_empty_files(tmp_path):
    p = tmp_path / "bin.jsonl"
    p.write_bytes(_station().encode() + b"\n\xff\xfe\x00garbage\n")
    rc, err, _ = solve(p)
    assert rc == 2 and "bin.jsonl:2" in err and "UTF-8" in err
    e = tmp_path / "empty.jsonl"
    e.write_bytes(b"")
    rc, err, _ = solve(e)
    assert rc == 2 and "no stations" in err


def test_a_50_mb_row_is_refused_early_with_bounded_memory(tmp_path):
    small = tmp_path / "small.jsonl"
    small.write_text(_station() + "\n")
    _, _, base_kb = solve(small)  # exit 3 or 2 (too few stations), what matters is its memory
    for name, head in (("big.jsonl", b'{"base_T_flange": [[1.0'), ("big.csv", b"flange_x_mm,")):
        p = tmp_path / name
        with open(p, "wb") as f:
            f.write(head)
            chunk = b"0" * (1 << 20)
            for _ in range(50):
                f.write(chunk)
            f.write(b"\n")
        rc, err, rss_kb = solve(p)
        assert rc == 2 and f"{name}:1" in err and "longer than" in err, err[-500:]
        assert base_kb > 0 and rss_kb - base_kb < 20 * 1024, (rss_kb, base_kb)  # 50 MB never in memory


def _csv(tmp_path: Path, name: str, body: str) -> Path:
    cols = [f"{p}_{c}" for p in ("flange", "target") for c in ("x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz")]
    good = ",".join(["0", "0", "0", "1", "0", "0", "0"] * 2)
    p = tmp_path / name
    p.write_text(",".join(cols) + "\n" + good + "\n" + body)
    return p


@pytest.mark.parametrize("what, body, needle", [
    ("field over 128 KiB", "1" * (130 * 1024) + ",0,0,1,0,0,0,0,0,0,1,0,0,0\n", "longer than"),
    ("quoted field never closed", '"' + "1\n" * 40_000, "longer than"),
    ("NUL byte", "0,0,\x00,1,0,0,0,0,0,0,1,0,0,0\n", "not a number"),
    ("huge number", "1" + "0" * 400 + ",0,0,1,0,0,0,0,0,0,1,0,0,0\n", "not finite"),
    ("absurd position", "1e12,0,0,1,0,0,0,0,0,0,1,0,0,0\n", "beyond"),
    ("word", "0,0,0,true,0,0,0,0,0,0,1,0,0,0\n", "not a number"),
])
def test_hostile_csv_is_a_typed_error(tmp_path, capsys, what, body, needle):
    p = _csv(tmp_path, "st.csv", body)
    rc, err = solve_here(capsys, p)
    assert rc == 2, err
    assert "st.csv:3" in err and needle in err, err[-500:]


def test_reader_api_raises_station_file_error_only(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(b"{" * (MAX_LINE_BYTES + 10))
    with pytest.raises(StationFileError, match="x.jsonl:1"):
        read_stations(p)
    with pytest.raises(StationFileError, match="cannot read"):
        read_stations(tmp_path)  # a directory
    with pytest.raises(ValueError):
        read_stations(p, kind="nope")


# --- 3-DoF point stations (a base frame measured by a reflector) ---------------------------------


def _point_scene(n: int = 8, seed: int = 3):
    from cellcal.solver.synthetic import base_frame_scene

    sc = base_frame_scene(n, np.random.default_rng(seed), noise_mm=0.01, noise_deg=0.0)
    return sc, sc.measured[:, :3, 3].copy()


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_point_stations_are_written_and_read_back_as_points(tmp_path, suffix):
    from cellcal.daemon.cli.stations_io import write_stations

    sc, pts = _point_scene()
    p = write_stations(tmp_path / f"p{suffix}", sc.base_T_flange, pts, "base_frame", comments=("from a test",))
    st = read_stations(p, "base_frame")
    assert st.measured is None and st.points is not None and st.points.shape == (8, 3)
    tol = 0.0 if suffix == ".jsonl" else 1e-15
    np.testing.assert_allclose(st.points, pts, rtol=0, atol=tol)
    np.testing.assert_allclose(st.base_T_flange, sc.base_T_flange, rtol=0, atol=1e-15)
    assert st.lines[0] == (2 if suffix == ".jsonl" else 3)  # the comment line (and the CSV header) first


def test_cellcal_solve_of_a_point_file_uses_the_point_model(tmp_path, capsys):
    from cellcal.daemon.cli import main
    from cellcal.daemon.cli.stations_io import write_stations

    sc, pts = _point_scene(12)
    p = write_stations(tmp_path / "p.jsonl", sc.base_T_flange, pts, "base_frame")
    rc = main(["solve", str(p), "--noise-mm", "0.01", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    got = json.loads(out.out)
    assert set(got["transforms"]) == {"cell_T_base"} and set(got["points"]) == {"flange_p_target"}
    X = np.asarray(got["transforms"]["cell_T_base"]["matrix"], dtype=float).reshape(4, 4)
    assert np.linalg.norm(X[:3, 3] - sc.X[:3, 3]) < 1e-4
    assert np.linalg.norm(np.asarray(got["points"]["flange_p_target"]["position_m"]) - sc.Y[:3, 3]) < 1e-4
    assert got["uncertainty"]["noise_rotation_rad"] is None


@pytest.mark.parametrize("what, line, needle", [
    ("a pose after points", _station(), "cell_T_target where the first station has cell_p_target"),
    ("two numbers", json.dumps({"base_T_flange": EYE, "cell_p_target": [0.1, 0.2]}), "list of three numbers"),
    ("a string", json.dumps({"base_T_flange": EYE, "cell_p_target": [0.1, "0.2", 0.3]}),
     "cell_p_target[1] must be a number"),
    ("absurd", json.dumps({"base_T_flange": EYE, "cell_p_target": [0.1, 1e300, 0.3]}), "beyond"),
    ("neither", json.dumps({"base_T_flange": EYE}), "missing key 'cell_p_target'"),
])
def test_bad_point_lines_are_named(tmp_path, what, line, needle):
    good = json.dumps({"base_T_flange": EYE, "cell_p_target": [0.1, 0.2, 0.3]})
    p = tmp_path / "p.jsonl"
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(StationFileError) as ei:
        read_stations(p, "base_frame")
    assert "p.jsonl:2" in str(ei.value) and needle in str(ei.value), str(ei.value)


def test_points_after_poses_and_points_of_a_kind_without_them_are_refused(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(_station() + "\n" + json.dumps({"base_T_flange": EYE, "cell_p_target": [0.1, 0.2, 0.3]}) + "\n")
    with pytest.raises(StationFileError, match="p.jsonl:2: cell_p_target where the first station has cell_T_target"):
        read_stations(p, "base_frame")
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"base_T_flange": EYE, "cell_p_target": [0.1, 0.2, 0.3]}) + "\n")
    with pytest.raises(StationFileError, match="missing key 'camera_T_target'"):
        read_stations(q, "hand_eye")  # hand-eye has no point form
    with pytest.raises(StationFileError, match="missing key 'cell_T_target' or 'cell_p_target'"):
        r = tmp_path / "r.jsonl"
        r.write_text(json.dumps({"base_T_flange": EYE}) + "\n")
        read_stations(r, "base_frame")


def test_a_csv_with_half_a_target_quaternion_is_a_pose_file_missing_columns(tmp_path):
    cols = [f"flange_{c}" for c in ("x_mm", "y_mm", "z_mm", "qw", "qx", "qy", "qz")] + \
           ["target_x_mm", "target_y_mm", "target_z_mm", "target_qw"]
    p = tmp_path / "h.csv"
    p.write_text(",".join(cols) + "\n" + ",".join(["0", "0", "0", "1", "0", "0", "0", "1", "2", "3", "1"]) + "\n")
    with pytest.raises(StationFileError, match="header lacks column"):
        read_stations(p, "base_frame")


_finite_mm = hs.floats(min_value=-5e3, max_value=5e3, allow_nan=False, allow_infinity=False)


@given(hs.lists(hs.tuples(_finite_mm, _finite_mm, _finite_mm), min_size=1, max_size=20))
@settings(max_examples=60, deadline=None)
def test_any_points_round_trip_bit_for_bit_in_jsonl(tmp_path_factory, pts):
    from cellcal.daemon.cli.stations_io import write_stations

    P = np.asarray(pts, dtype=float) * 1e-3
    G = np.repeat(np.eye(4)[None], len(P), axis=0)
    p = write_stations(tmp_path_factory.mktemp("pts") / "p.jsonl", G, P, "base_frame")
    got = read_stations(p, "base_frame")
    assert got.points is not None and np.array_equal(got.points, P)
