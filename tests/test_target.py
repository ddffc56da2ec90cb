"""Calibration targets: geometry against OpenCV's board, the target file and its errors."""

from __future__ import annotations

import hashlib

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellcal.drivers.detect import load_target
from cellcal.solver.errors import TargetFileError
from cellcal.solver.target import CalibrationTarget, target_from_toml

CHARUCO = b"""\
[target]
type = "charuco"
squares_x = 10
squares_y = 7
square_mm = 25.0
marker_mm = 18.0
dictionary = "DICT_5X5_100"
flatness_mm = 0.05
"""


def test_target_file_reads_in_metres_with_its_hash(tmp_path):
    path = tmp_path / "target.toml"
    path.write_bytes(CHARUCO)
    t = load_target(path)
    assert (t.kind, t.squares_x, t.squares_y, t.dictionary) == ("charuco", 10, 7, "DICT_5X5_100")
    assert t.square_m == pytest.approx(0.025) and t.marker_m == pytest.approx(0.018)
    assert t.flatness_m == pytest.approx(5e-5)
    assert t.sha256 == hashlib.sha256(CHARUCO).hexdigest() and t.source == str(path)
    assert t.n_corners == 54 and t.corners_m.shape == (54, 3)
    assert t.to_dict()["sha256"] == t.sha256 and t.to_dict()["square_mm"] == pytest.approx(25.0)
    # one changed byte, another hash: provenance tells the two boards apart
    assert target_from_toml(CHARUCO.replace(b"25.0", b"25.1")).sha256 != t.sha256


@pytest.mark.parametrize("sx,sy,legacy", [(10, 7, False), (5, 4, False), (6, 8, True)])
def test_corner_ids_and_positions_are_opencvs(sx, sy, legacy):
    t = CalibrationTarget(kind="charuco", squares_x=sx, squares_y=sy, square_m=0.03, marker_m=0.022,
                          dictionary="DICT_4X4_250", legacy_pattern=legacy)
    board = cv2.aruco.CharucoBoard((sx, sy), 0.03, 0.022, cv2.aruco.getPredefinedDictionary(cv2.aruco.DICT_4X4_250))
    board.setLegacyPattern(legacy)
    np.testing.assert_allclose(t.corners_m, board.getChessboardCorners(), atol=1e-12)
    assert t.n_markers == len(board.getIds())
    with pytest.raises(ValueError, match="corner id"):
        t.corner_points(np.array([0, t.n_corners]))


@pytest.mark.parametrize("edit,key", [
    (b'type = "charuco"', "target.type"),
    (b"squares_x = 10", "target.squares_x"),
    (b"square_mm = 25.0", "target.square_mm"),
    (b"marker_mm = 18.0", "target.marker_mm"),
    (b'dictionary = "DICT_5X5_100"', "target.dictionary"),
])
def test_a_missing_key_is_named(edit, key):
    with pytest.raises(TargetFileError, match=f"^{key}: required") as exc:
        target_from_toml(CHARUCO.replace(edit + b"\n", b""))
    assert exc.value.key == key and isinstance(exc.value, ValueError)


@pytest.mark.parametrize("edit,new,key,why", [
    (b'type = "charuco"', b'type = "circles"', "target.type", "must be one of"),
    (b"squares_x = 10", b"squares_x = 1", "target.squares_x", "integer in"),
    (b"squares_x = 10", b"squares_x = 10.0", "target.squares_x", "integer in"),
    (b"square_mm = 25.0", b"square_mm = 0.025", "target.square_mm", "must be in"),  # metres given as mm
    (b"square_mm = 25.0", b'square_mm = "25"', "target.square_mm", "finite number"),
    (b"marker_mm = 18.0", b"marker_mm = 25.0", "target.marker_mm", "below target.square_mm"),
    (b'dictionary = "DICT_5X5_100"', b'dictionary = "DICT_5X5_10"', "target.dictionary", "unknown dictionary"),
    (b'dictionary = "DICT_5X5_100"', b'dictionary = "DICT_4X4_50"\nsquares_y = 7', "", ""),
    (b"flatness_mm = 0.05", b"flatness_mm = -1", "target.flatness_mm", ">= 0"),
    (b"flatness_mm = 0.05", b"flatness = 0.05", "target.flatness", "unknown key"),
])
def test_a_bad_value_is_named(edit, new, key, why):
    text = CHARUCO.replace(edit, new)
    if not key:  # a duplicate key: TOML itself refuses
        with pytest.raises(TargetFileError, match="not a valid TOML"):
            target_from_toml(text)
        return
    with pytest.raises(TargetFileError, match=f"^{key}: .*{why}"):
        target_from_toml(text)


def test_dictionary_too_small_for_the_board():
    text = CHARUCO.replace(b"DICT_5X5_100", b"DICT_4X4_50").replace(b"squares_x = 10", b"squares_x = 12")
    with pytest.raises(TargetFileError, match="DICT_4X4_50 has 50 markers, a 12x9 board needs 54"):
        target_from_toml(text.replace(b"squares_y = 7", b"squares_y = 9"))


def test_chessboard_needs_an_asymmetric_board_and_no_markers():
    ok = target_from_toml(b'[target]\ntype = "chessboard"\nsquares_x = 9\nsquares_y = 6\nsquare_mm = 30\n')
    assert ok.kind == "chessboard" and ok.n_markers == 0 and ok.inner_corners == (8, 5)
    with pytest.raises(TargetFileError, match="one even and one odd side"):
        target_from_toml(b'[target]\ntype = "chessboard"\nsquares_x = 9\nsquares_y = 7\nsquare_mm = 30\n')
    with pytest.raises(TargetFileError, match="^target.marker_mm: a chessboard has no markers"):
        target_from_toml(b'[target]\ntype = "chessboard"\nsquares_x = 9\nsquares_y = 6\nsquare_mm = 30\nmarker_mm = 20\n')


def test_the_file_itself_must_be_a_target_file():
    with pytest.raises(TargetFileError, match="required table"):
        target_from_toml(b"[board]\n")
    with pytest.raises(TargetFileError, match="^extra: unknown top-level key"):
        target_from_toml(b"extra = 1\n" + CHARUCO)
    with pytest.raises(TargetFileError, match="^target.extra: unknown key"):
        target_from_toml(CHARUCO + b"extra = 1\n")
    with pytest.raises(TargetFileError, match="not a valid TOML"):
        target_from_toml(b"\xff\xfe[target]")


KEYS = ["type", "squares_x", "squares_y", "square_mm", "marker_mm", "dictionary", "legacy_pattern", "flatness_mm"]


@settings(max_examples=150)
@given(st.binary(max_size=300))
def test_garbage_bytes_are_a_target_file_error_never_a_crash(data):
    try:
        t = target_from_toml(data)
    except TargetFileError:
        return
    assert isinstance(t, CalibrationTarget)  # only if the bytes happened to be a valid file


_values = st.one_of(st.integers(-5, 300), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.text(max_size=12), st.sampled_from(["charuco", "chessboard", "DICT_5X5_100", "DICT_4X4_50"]),
                    st.lists(st.integers(), max_size=3))


@settings(max_examples=100)
@given(st.dictionaries(st.sampled_from(KEYS + ["extra"]), _values, max_size=9))
def test_any_target_table_is_a_target_or_a_named_error(table):
    from cellcal.solver.target import parse_target

    try:
        t = parse_target(table)
    except TargetFileError as exc:
        assert str(exc).startswith("target") and exc.key.startswith("target")
        return
    assert t.n_corners >= 1 and np.all(np.isfinite(t.corners_m))
