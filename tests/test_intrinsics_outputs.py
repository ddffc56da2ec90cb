"""What an intrinsics result is outside the solver (ADR 0030): the stored record and the wire body
(``protocol.ResultBody`` with the intrinsics keys), ``cellcal show``'s lines, the report's
section and figures, the ROS ``camera_info`` and OpenCV FileStorage exports read back by
their own readers (OpenCV's FileStorage; the system Python's PyYAML, what ROS's Python side
reads them with), and ``cellcal solve --setup intrinsics`` on bad dataset folders.

The result is solved from synthetic detections (``tests/_camera_views.py``: the board
projected by a known camera with Gaussian noise), so nothing here renders or opens a device.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import cv2
import numpy as np
import pytest
from _camera_views import SIZE, TARGET, synthetic_views

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import result_body
from cellcal.daemon.cli import solve
from cellcal.daemon.cli.dataset import COLUMNS, DatasetError, read_dataset, write_dataset
from cellcal.daemon.cli.show import show_lines
from cellcal.daemon.config import Camera, Export
from cellcal.daemon.report.exports import write_exports
from cellcal.daemon.report.html import render_report
from cellcal.daemon.runs import intrinsics_report as ir
from cellcal.daemon.runs.intrinsics import intrinsics_record, stored_intrinsics
from cellcal.daemon.store import Store
from cellcal.solver import CalibrationError, calibrate_intrinsics

SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """An intrinsics result stored as the daemon stores one: ``(store dir, record, body)``."""
    views, _poses = synthetic_views(np.random.default_rng(3), 10, noise_px=0.1)
    r = calibrate_intrinsics(views, TARGET, SIZE)
    record = intrinsics_record(r, [10 + i for i in range(len(views))])  # stations 10, 11, ...
    record["gates"] = {"passed": True, "failed": [], "checks": []}
    record["check_stations"] = []
    d = tmp_path_factory.mktemp("intrinsics") / "state"
    with Store(d) as store:
        run = store.create_run(P.KIND_INTRINSICS, {"stations": []}, config_sha256="0" * 64, devices={})
        rid = store.add_result(run, P.KIND_INTRINSICS, record, {"target_sha256": "ab" * 32}, activate=True)
        rec = store.get_result(rid)
    return d, rec, result_body(rec, cell="test"), r


def test_the_result_body_conforms_and_carries_the_camera(stored):
    _d, _rec, body, r = stored
    assert not P.check_body(P.TOPIC_RESULT, {**body, "retained": False})
    np.testing.assert_array_equal(np.array(body["camera_matrix"]), r.camera_matrix)
    assert body["dist_coeffs"] == [float(v) for v in r.dist_coeffs] and body["image_size"] == list(SIZE)
    assert body["reprojection_rms_px"] == r.reprojection_rms_px and body["transforms"] == {}
    ii = body["intrinsics"]
    assert ii["views"] == [10 + i for i in r.views]  # stations, not solver indices
    assert len(ii["corners"]["ids"]) == r.n_corners == len(ii["corners"]["residuals_px"])
    C = np.array(ii["covariance"]["values"], dtype=float).reshape(9, 9)
    np.testing.assert_array_equal(C, r.covariance)
    assert body["provenance"]["target_sha256"] == "ab" * 32


def test_show_prints_the_intrinsics_with_their_sigmas(stored):
    d, rec, _body, r = stored
    text = "\n".join(show_lines(rec, d))
    for name, v, s in zip(r.parameter_names, r.parameters, r.sigmas, strict=True):
        digits = 3 if name in ("fx", "fy", "cx", "cy") else 6
        assert f"{name:<4} {v:.{digits}f} +- {s:.{digits}f}" in text, name
    assert "reprojection     RMS" in text and "translation RMS" not in text


def test_the_report_has_the_intrinsics_section_and_its_four_figures(stored):
    _d, _rec, body, _r = stored
    html = render_report(body)
    root = ET.fromstring(html.split("\n", 2)[2])  # well-formed XHTML after the declaration and doctype
    ns = {"h": "http://www.w3.org/1999/xhtml"}
    section = root.find(".//h:section[@id='intrinsics']", ns)
    assert section is not None
    ids = [f.get("id") for f in section.iter(f"{{{ns['h']}}}figure")]
    assert ids == list(ir.FIGURES)
    vectors = section.find(".//h:figure[@id='fig-intrinsics-residuals']", ns)
    assert vectors is not None
    n_lines = sum(1 for e in vectors.iter() if e.tag.endswith("line"))
    assert n_lines == len(body["intrinsics"]["corners"]["ids"])  # one residual vector per corner
    assert render_report(body) == html  # deterministic


def test_the_opencv_export_reads_back_in_opencv_filestorage(stored, tmp_path):
    _d, rec, body, _r = stored
    files = write_exports(tmp_path, rec.id, body, Export())
    # the camera's own files and its JSON; no frame file (an intrinsics result has no frame)
    assert set(files) == {"json", "camera_info", "opencv"}, set(files)
    assert not [p.name for p in tmp_path.iterdir() if p.suffix in (".urdf", ".xacro", ".script", ".sh")]
    fs = cv2.FileStorage(str(files["opencv"]), cv2.FILE_STORAGE_READ)
    try:
        K, D = fs.getNode("camera_matrix").mat(), fs.getNode("distortion_coefficients").mat()
        w, h = int(fs.getNode("image_width").real()), int(fs.getNode("image_height").real())
    finally:
        fs.release()
    np.testing.assert_array_equal(K, np.array(body["camera_matrix"]))  # repr floats: bit for bit
    np.testing.assert_array_equal(D.reshape(-1), np.array(body["dist_coeffs"]))
    assert (w, h) == tuple(body["image_size"])


@pytest.mark.slow  # runs the system Python as a process
def test_the_ros_camera_info_export_reads_back_with_pyyaml(stored, tmp_path):
    _d, rec, body, _r = stored
    if shutil.which(SYSTEM_PYTHON) is None or subprocess.run([SYSTEM_PYTHON, "-c", "import yaml"]).returncode != 0:
        pytest.fail("the system Python's PyYAML (Debian python3-yaml) is not installed: run `make os-deps`")
    files = write_exports(tmp_path, rec.id, body, Export(camera_frame="arm_camera"))
    out = subprocess.run([SYSTEM_PYTHON, "-c", "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
                          str(files["camera_info"])], capture_output=True, text=True, timeout=60, check=True)
    info = json.loads(out.stdout)
    K = np.array(body["camera_matrix"])
    assert (info["image_width"], info["image_height"]) == tuple(body["image_size"])
    assert info["camera_name"] == "arm_camera" and info["distortion_model"] == "plumb_bob"
    assert info["camera_matrix"]["rows"] == 3 and info["camera_matrix"]["data"] == K.reshape(-1).tolist()
    assert info["distortion_coefficients"]["data"] == body["dist_coeffs"]
    assert info["rectification_matrix"]["data"] == np.eye(3).reshape(-1).tolist()
    assert info["projection_matrix"]["data"] == np.hstack([K, np.zeros((3, 1))]).reshape(-1).tolist()


def _solve(*argv: str) -> int:
    p = argparse.ArgumentParser()
    solve.add_arguments(p)
    return solve.run(p.parse_args(list(argv)))


def _dataset(folder: Path, rows: list[list[str]], images: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).resolve().parents[1] / "config" / "charuco-7x5.toml", folder / "target.toml")
    for name, img in images.items():
        cv2.imwrite(str(folder / name), img)
    (folder / "stations.csv").write_text("\n".join(",".join(r) for r in [list(COLUMNS), *rows]) + "\n")
    return folder


def test_dataset_errors_name_the_line_and_the_column(tmp_path):
    blank = {f"{i}.png": np.full((48, 64), 200, np.uint8) for i in range(2)}
    cases = [
        ([["0.png", "1", "2", "3", "1", "0", "0", "0"], ["1.png", "1", "2", "", "", "", "", ""]], "stations.csv:3",
         "z_mm, qw, qx, qy, qz empty"),
        ([["0.png", "1", "2", "3", "0.9", "0", "0", "0"]], "stations.csv:2", "norm 0.9"),
        ([["2.png", "", "", "", "", "", "", ""]], "stations.csv:2", "image 2.png is not in"),
        ([["../0.png", "", "", "", "", "", "", ""]], "stations.csv:2", "not a file name"),
        ([["0.png", "x", "2", "3", "1", "0", "0", "0"]], "stations.csv:2", "x_mm 'x' is not a number"),
    ]
    for k, (rows, where, words) in enumerate(cases):
        with pytest.raises(DatasetError) as ei:
            read_dataset(_dataset(tmp_path / f"d{k}", rows, blank))
        assert where in str(ei.value) and words in str(ei.value), str(ei.value)
    d = _dataset(tmp_path / "cols", [["0.png", "", "", "", "", "", "", ""]], blank)
    (d / "stations.csv").write_text("image,x_mm,y_mm,z_mm,qw,qx,qy,qz,exposure\n0.png,,,,,,,,1\n")
    with pytest.raises(DatasetError, match="unknown column.*exposure"):
        read_dataset(d)
    ok = read_dataset(_dataset(tmp_path / "ok", [["0.png", "400", "0", "400", "0", "1", "0", "0"],
                                                 ["1.png", "", "", "", "", "", "", ""]], blank))
    np.testing.assert_allclose(ok.stations[0].base_T_flange[:3, 3], [0.4, 0.0, 0.4])
    assert ok.stations[1].base_T_flange is None and not ok.has_poses


def test_a_dataset_round_trips_through_its_writer(tmp_path):
    T = np.eye(4)
    T[:3, 3] = [0.4, -0.1, 0.3]
    T[:3, :3] = np.diag([1.0, -1.0, -1.0])
    png = cv2.imencode(".png", np.zeros((8, 8), np.uint8))[1].tobytes()
    target = (Path(__file__).resolve().parents[1] / "config" / "charuco-7x5.toml").read_text()
    d = write_dataset(tmp_path / "ds", target, [("a.png", png, T), ("b.png", png, None)], comments=["made here"])
    ds = read_dataset(d)
    np.testing.assert_allclose(ds.stations[0].base_T_flange, T, atol=1e-15)
    assert ds.stations[1].base_T_flange is None and (d / "a.png").read_bytes() == png
    with pytest.raises(DatasetError, match="already holds a dataset"):
        write_dataset(d, target, [])


def test_solve_setup_exit_codes(tmp_path, capsys):
    blank = {f"{i}.png": np.full((48, 64), 200, np.uint8) for i in range(3)}
    rows = [[f"{i}.png", "", "", "", "", "", "", ""] for i in range(3)]
    assert _solve(str(tmp_path / "nowhere"), "--setup", "intrinsics") == 2
    d = _dataset(tmp_path / "blank", rows, blank)
    assert _solve(str(d), "--setup", "intrinsics", "--json") == 3  # no target in any image: cannot determine
    assert "cannot calibrate" in capsys.readouterr().err
    (d / "target.toml").unlink()
    assert _solve(str(d), "--setup", "intrinsics") == 2
    assert "target.toml" in capsys.readouterr().err
    assert _solve(str(d), "--setup", "intrinsics", "--noise-px", "-1") == 2



def test_use_intrinsics_finds_the_stored_result_later_kinds_take(stored):
    d, rec, _body, _r = stored
    with Store(d, read_only=True) as store:
        assert stored_intrinsics(store, Camera(use_intrinsics="latest")).id == rec.id
        assert stored_intrinsics(store, Camera(use_intrinsics=f"result:{rec.id}")).id == rec.id
        assert stored_intrinsics(store, Camera(use_intrinsics="estimate")) is None
        with pytest.raises(CalibrationError, match="does not hold"):
            stored_intrinsics(store, Camera(use_intrinsics="result:999"))
