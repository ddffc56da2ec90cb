"""Hostile station files for ``cellcal solve``: every one a typed error naming the line, exit 2,
never a traceback, and memory bounded per line (real subprocesses, as a user runs them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cellcal.daemon.stations_io import MAX_LINE_BYTES, StationFileError, read_stations

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
