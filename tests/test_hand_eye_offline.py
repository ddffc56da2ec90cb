"""``cellcal solve DIR --setup eye_in_hand|eye_to_hand``: the hand-eye chain offline, on a folder
of rendered images (``tests/_hand_eye_dataset.py``: the simulated camera's images of the tests'
board, written once per module by the dataset writer), against the simulator's truth.

The JSON's transforms lie inside their own reported 3 sigma of the truth (6-dof NEES under the
chi-square's 99.73 % point), with intrinsics estimated jointly or taken from the intrinsics JSON
``--setup intrinsics --json`` printed for the same folder; the exit codes are ``cellcal
solve``'s (2 a bad folder or argument, naming the file and line; 3 undetermined); ``-o`` and
``--export`` keep the output rules (no overwrite without ``--force``, never through a symlink).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _camera_views import SIZE, TARGET, synthetic_views
from _hand_eye_dataset import RenderedDataset, render_dataset

from cellcal.daemon import protocol as P
from cellcal.daemon.bodies import result_body
from cellcal.daemon.cli import solve
from cellcal.daemon.cli.dataset import STATIONS_FILE
from cellcal.daemon.cli.solve_camera import read_intrinsics_file
from cellcal.daemon.config import Export
from cellcal.daemon.report.exports import write_exports
from cellcal.daemon.report.hand_eye_exports import hand_eye_file_names
from cellcal.daemon.runs.intrinsics import intrinsics_record
from cellcal.daemon.store import Store
from cellcal.solver import calibrate_intrinsics
from cellcal.solver._camera_chain import log_batch
from cellcal.solver.se3 import se3_inverse

#: 6-dof NEES below this is "inside 3 sigma" (chi-square with 6 dof, 99.73 %).
CHI2_6_3SIGMA = 20.06
N_VIEWS = 12


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, RenderedDataset]:
    root = tmp_path_factory.mktemp("hand_eye_datasets")
    return {setup: render_dataset(root / setup, setup, N_VIEWS, seed=seed)
            for setup, seed in (("eye_in_hand", 31), ("eye_to_hand", 32))}


def _solve(*argv: str) -> int:
    p = argparse.ArgumentParser()
    solve.add_arguments(p)
    return solve.run(p.parse_args(list(argv)))


def _json(capsys, *argv: str) -> dict:
    capsys.readouterr()
    assert _solve(*argv, "--json") == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _nees(out: dict, name: str, truth: np.ndarray) -> float:
    T = np.array(out[name], dtype=float)
    C = np.array(out[f"{name}_covariance"], dtype=float)
    xi = log_batch((se3_inverse(T) @ truth)[None])[0]  # right perturbation (ADR 0004)
    return float(xi @ np.linalg.solve(C, xi))


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_the_json_transforms_lie_inside_their_3_sigma_of_the_truth(datasets, capsys, setup):
    ds = datasets[setup]
    out = _json(capsys, str(ds.folder), "--setup", setup)
    assert out["setup"] == setup and out["converged"] is True
    assert np.array(out["camera_matrix"]).shape == (3, 3) and len(out["dist_coeffs"]) == 5
    assert out["image_size"] == [800, 600] and 0 < out["reprojection_rms_px"] < 0.2
    assert out["camera"]["intrinsics_mode"] == "joint"
    np.testing.assert_allclose(out["camera"]["parameters"][:4], ds.params[:4], atol=3.0)  # px: fx, fy, cx, cy
    assert set(out["transforms"]) == set(ds.truth)
    for name, truth in ds.truth.items():
        C = np.array(out[f"{name}_covariance"])
        assert C.shape == (6, 6) and np.allclose(C, C.T) and np.all(np.linalg.eigvalsh(C) > 0)
        np.testing.assert_array_equal(np.array(out[name]).reshape(-1), out["transforms"][name]["matrix"])
        err_mm = np.linalg.norm(np.array(out[name])[:3, 3] - truth[:3, 3]) * 1e3
        assert err_mm < 0.5, (name, err_mm)
        nees = _nees(out, name, truth)
        assert nees < CHI2_6_3SIGMA, (name, nees)
    assert out["dataset"]["images"] == [f"view_{i:02d}.png" for i in range(N_VIEWS)]


def test_intrinsics_from_the_file_setup_intrinsics_prints(datasets, capsys, tmp_path):
    ds = datasets["eye_in_hand"]
    ifile = tmp_path / "intrinsics.json"
    assert _solve(str(ds.folder), "--setup", "intrinsics", "--json", "-o", str(ifile)) == 0
    assert capsys.readouterr().out == ""  # -o: to the file, not stdout
    capsys.readouterr()
    assert _solve(str(ds.folder), "--setup", "eye_in_hand", "--intrinsics", str(ifile), "--json") == 0
    io = capsys.readouterr()
    assert "solved from these same images" in io.err  # a prior from the same corners counts them twice
    out = json.loads(io.out)
    assert out["camera"]["intrinsics_mode"] == "prior" and out["camera"]["intrinsics_file"] == str(ifile)
    for name, truth in ds.truth.items():
        assert _nees(out, name, truth) < CHI2_6_3SIGMA, name
    # the wrong image size for the dataset is named
    doc = json.loads(ifile.read_text())
    doc["image_size"] = [640, 480]
    ifile.write_text(json.dumps(doc))
    assert _solve(str(ds.folder), "--setup", "eye_in_hand", "--intrinsics", str(ifile)) == 2
    assert "640 x 480" in capsys.readouterr().err


def test_a_stored_intrinsics_results_exported_json_is_an_intrinsics_file(tmp_path):
    views, _ = synthetic_views(np.random.default_rng(3), 10, noise_px=0.1)
    r = calibrate_intrinsics(views, TARGET, SIZE)
    record = intrinsics_record(r, list(range(len(views))))
    record["gates"] = {"passed": True, "failed": [], "checks": []}
    record["check_stations"] = []
    with Store(tmp_path / "state") as store:
        run = store.create_run(P.KIND_INTRINSICS, {"stations": []}, config_sha256="0" * 64, devices={})
        rec = store.get_result(store.add_result(run, P.KIND_INTRINSICS, record, {}, activate=True))
    files = write_exports(tmp_path / "exports", rec.id, result_body(rec, cell="test"), Export())
    cam, C = read_intrinsics_file(files["json"])
    np.testing.assert_array_equal(cam.camera_matrix, r.camera_matrix)
    np.testing.assert_array_equal(cam.dist_coeffs, r.dist_coeffs)
    assert cam.image_size == SIZE and C is not None
    np.testing.assert_allclose(C, r.covariance, rtol=0, atol=1e-9 * np.abs(r.covariance).max())


def test_the_summary_names_each_transform_with_its_sigma(datasets, capsys):
    ds = datasets["eye_to_hand"]
    capsys.readouterr()
    assert _solve(str(ds.folder), "--setup", "eye_to_hand") == 0
    text = capsys.readouterr().out
    assert text.startswith(f"eye_to_hand of {N_VIEWS} images in {ds.folder}")
    for name in ("base_T_camera", "flange_T_target"):
        assert f"  {name}: xyz " in text
    assert text.count("1 sigma: ") == 2 and "reprojection RMS" in text and "estimated jointly" in text


def _copy(ds: RenderedDataset, dest: Path, edit=None) -> Path:
    shutil.copytree(ds.folder, dest)
    if edit is not None:
        lines = (dest / STATIONS_FILE).read_text().splitlines()
        (dest / STATIONS_FILE).write_text("\n".join(edit(lines)) + "\n")
    return dest


def _header_index(ds: RenderedDataset) -> int:
    """0-based index of the header among stations.csv's lines (comments come first): row k
    is at index ``h + 1 + k``, on line ``h + 2 + k``."""
    lines = (ds.folder / STATIONS_FILE).read_text().splitlines()
    return next(i for i, line in enumerate(lines) if line.startswith("image,"))


def test_bad_folders_and_arguments_exit_2_naming_the_file_and_line(datasets, capsys, tmp_path):
    ds = datasets["eye_in_hand"]
    h = _header_index(ds)

    def drop_pose(lines):  # row 2 (view_02.png) keeps its image, loses its pose
        lines[h + 3] = lines[h + 3].split(",")[0] + ",,,,,,,"
        return lines

    d = _copy(ds, tmp_path / "nopose", drop_pose)
    capsys.readouterr()
    assert _solve(str(d), "--setup", "eye_in_hand") == 2
    err = capsys.readouterr().err
    assert f"{d / STATIONS_FILE}:{h + 4}: image view_02.png has no flange pose" in err, err
    assert _solve(str(d), "--setup", "intrinsics", "--json") == 0  # the intrinsics need no pose
    capsys.readouterr()

    def bad_quaternion(lines):  # row 0's qz a typo: the norm is far from 1
        lines[h + 1] = lines[h + 1].rsplit(",", 1)[0] + ",7"
        return lines

    d = _copy(ds, tmp_path / "badq", bad_quaternion)
    assert _solve(str(d), "--setup", "eye_to_hand") == 2
    assert f"{d / STATIONS_FILE}:{h + 2}: quaternion" in capsys.readouterr().err

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"camera_matrix": np.eye(3).tolist(), "image_size": [800, 600]}))
    assert _solve(str(ds.folder), "--setup", "eye_in_hand", "--intrinsics", str(bad)) == 2
    assert f"--intrinsics {bad}: no 'dist_coeffs'" in capsys.readouterr().err
    bad.write_text("{not json")
    assert _solve(str(ds.folder), "--setup", "eye_in_hand", "--intrinsics", str(bad)) == 2
    assert "not a JSON file" in capsys.readouterr().err
    assert _solve(str(ds.folder), "--setup", "eye_in_hand", "--fix", "k3") == 2
    assert _solve(str(ds.folder), "--setup", "intrinsics", "--intrinsics", str(bad)) == 2
    assert _solve(str(ds.folder), "--setup", "eye_in_hand", "--robot-accuracy-deg", "-1") == 2
    assert _solve(str(tmp_path / "nowhere"), "--setup", "eye_to_hand") == 2


def test_views_that_cannot_determine_the_chain_exit_3(datasets, capsys, tmp_path):
    ds = datasets["eye_in_hand"]
    h = _header_index(ds)
    same_pose = (ds.folder / STATIONS_FILE).read_text().splitlines()[h + 1].split(",", 1)[1]

    def frozen(ls):  # every image paired with the first row's flange pose: no robot motion
        return [*ls[:h + 1], *(r.split(",", 1)[0] + "," + same_pose for r in ls[h + 1:])]

    d = _copy(ds, tmp_path / "frozen", frozen)
    capsys.readouterr()
    assert _solve(str(d), "--setup", "eye_in_hand", "--json") == 3
    err = capsys.readouterr().err
    assert err.startswith("cellcal solve: cannot calibrate: ")
    d2 = _copy(ds, tmp_path / "two", lambda ls: ls[:h + 3])  # two images: too few
    assert _solve(str(d2), "--setup", "eye_to_hand") == 3


def test_output_and_export_keep_the_output_rules(datasets, capsys, tmp_path):
    ds = datasets["eye_to_hand"]
    out = tmp_path / "result.json"
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--json", "-o", str(out), "--export",
                  str(tmp_path / "exp")) == 0
    doc = json.loads(out.read_text())
    assert doc["setup"] == "eye_to_hand"
    files = sorted(p.name for p in (tmp_path / "exp").iterdir())
    assert files == sorted(hand_eye_file_names(None).values())
    capsys.readouterr()
    # again without --force: refused before any work, nothing changed
    out.write_text("mine")
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--json", "-o", str(out)) == 2
    assert "exists" in capsys.readouterr().err and out.read_text() == "mine"
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--export", str(tmp_path / "exp")) == 2
    assert "exists" in capsys.readouterr().err
    # a symlink is not written through; --force replaces the link itself
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    link = tmp_path / "link.json"
    link.symlink_to(victim)
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--json", "-o", str(link)) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--json", "-o", str(link), "--force") == 0
    assert victim.read_text() == "keep" and not link.is_symlink()
    assert json.loads(link.read_text())["setup"] == "eye_to_hand"
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--export", str(tmp_path / "exp"), "--force") == 0
    (tmp_path / "exp_link").symlink_to(tmp_path / "exp")  # a linked directory: never written through
    assert _solve(str(ds.folder), "--setup", "eye_to_hand", "--export", str(tmp_path / "exp_link"), "--force") == 2
    assert "symbolic link" in capsys.readouterr().err


def test_a_camera_runs_stations_folder_names_the_setup_that_solves_it_again():
    # `cellcal stations` of a hand_eye run wrote "--setup intrinsics" into its folder once:
    # every camera kind maps to the offline setup that solves it as the daemon did.
    from cellcal.daemon.cli.solve_camera import SETUPS
    from cellcal.daemon.cli.stations import _SETUP_OF_KIND
    from cellcal.daemon.wire.vocabulary import KIND_EYE_TO_HAND, KIND_HAND_EYE, KIND_INTRINSICS

    assert _SETUP_OF_KIND[KIND_INTRINSICS] == "intrinsics"
    assert _SETUP_OF_KIND[KIND_HAND_EYE] == "eye_in_hand"
    assert _SETUP_OF_KIND[KIND_EYE_TO_HAND] == "eye_to_hand"
    assert set(_SETUP_OF_KIND.values()) == set(SETUPS)
