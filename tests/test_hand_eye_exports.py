"""A camera hand-eye result's files (``cellcal.daemon.report.hand_eye_exports``) read back by
the readers their tools use: the launch files by Python's own parser (``ast``: the arguments
``static_transform_publisher`` gets), the URDF, xacro and ROS 1 launch file by an XML parser,
the easy_handeye YAML by the system Python's PyYAML (what ROS's Python side reads it with).
Numbers to 1e-9, quaternions with ``w >= 0``, frame names as exported; a refused result's
files marked on their first line and disarmed.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from cellcal.daemon.config import Export
from cellcal.daemon.report.exports import matrix_from_rpy
from cellcal.daemon.report.hand_eye_exports import TRANSFORM_NAMES, hand_eye_export_texts, hand_eye_file_names
from cellcal.daemon.report.refused import REFUSED_MARK
from cellcal.solver.se3 import make_transform, matrix_from_quat, so3_exp

SYSTEM_PYTHON = "/usr/bin/python3"
TOL = 1e-9

#: Transforms whose rotations are near a half turn (3.1 rad): a quaternion's sign is easy to get wrong.
CAMERA = make_transform(so3_exp(np.array([0.3, -2.2, 2.05])), [0.041, -0.0123456789, 0.0605])
TARGET = make_transform(so3_exp(np.array([3.1, 0.0, 0.05])), [0.45, -0.1, 0.02])
COV_CAMERA = np.diag([1e-8, 4e-8, 9e-8, 1e-8, 1e-8, 4e-8])
COV_TARGET = np.diag([4e-8, 4e-8, 4e-8, 1e-6, 1e-6, 1e-6])


def _texts(setup: str, refused: str | None = None, frames=None, rid: int | None = 7) -> dict[str, str]:
    cam, tgt = TRANSFORM_NAMES[setup]
    return hand_eye_export_texts(setup, {cam: CAMERA, tgt: TARGET}, {cam: COV_CAMERA, tgt: COV_TARGET}, rid,
                                 refused, frames=frames)


def _file(setup: str, key: str, **kw) -> str:
    return _texts(setup, **kw)[hand_eye_file_names(kw.get("rid", 7))[key]]


def _q_transform(x, y, z, qx, qy, qz, qw) -> np.ndarray:
    assert qw >= 0.0
    assert abs(np.linalg.norm([qw, qx, qy, qz]) - 1.0) < 1e-12
    return make_transform(matrix_from_quat(np.array([qw, qx, qy, qz])), [x, y, z])


def _node_arguments(text: str) -> list[list[str]]:
    """The ``arguments=[...]`` of every ``Node(...)`` call in a launch file, as literals."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Node":
            kw = {k.arg: k.value for k in node.keywords}
            assert ast.literal_eval(kw["package"]) == "tf2_ros"
            assert ast.literal_eval(kw["executable"]) == "static_transform_publisher"
            out.append(ast.literal_eval(kw["arguments"]))
    return out


def _flags(args: list[str]) -> tuple[np.ndarray, str, str]:
    d = dict(zip(args[0::2], args[1::2], strict=True))
    assert set(d) == {"--x", "--y", "--z", "--qx", "--qy", "--qz", "--qw", "--frame-id", "--child-frame-id"}
    T = _q_transform(*(float(d[k]) for k in ("--x", "--y", "--z", "--qx", "--qy", "--qz", "--qw")))
    return T, d["--frame-id"], d["--child-frame-id"]


def _origin(joint: ET.Element) -> np.ndarray:
    o = joint.find("origin")
    assert o is not None
    xyz = [float(v) for v in o.get("xyz", "").split()]
    rpy = [float(v) for v in o.get("rpy", "").split()]
    return make_transform(matrix_from_rpy(*rpy), xyz)


FRAMES = {"eye_in_hand": (("flange", "camera", CAMERA), ("base", "target", TARGET)),
          "eye_to_hand": (("base", "camera", CAMERA), ("flange", "target", TARGET))}


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_every_file_reads_back_to_the_transforms(setup):
    texts = _texts(setup)
    names = hand_eye_file_names(7)
    assert sorted(texts) == sorted(names.values()) and all(n.startswith("result_7_hand_eye") for n in texts)
    (cp, cc, _), (tp, tc, _) = FRAMES[setup]
    # ROS 2 launch: both transforms, named arguments
    got = [_flags(a) for a in _node_arguments(texts[names["launch"]])]
    assert [(p, c) for _, p, c in got] == [(cp, cc), (tp, tc)]
    np.testing.assert_allclose(got[0][0], CAMERA, atol=TOL)
    np.testing.assert_allclose(got[1][0], TARGET, atol=TOL)
    # URDF: the camera's joint and its two links
    robot = ET.fromstring(texts[names["urdf"]])
    assert [link.get("name") for link in robot.findall("link")] == [cp, cc]
    (joint,) = robot.findall("joint")
    assert joint.get("type") == "fixed" and joint.find("parent").get("link") == cp  # type: ignore[union-attr]
    assert joint.find("child").get("link") == cc  # type: ignore[union-attr]
    np.testing.assert_allclose(_origin(joint), CAMERA, atol=TOL)
    # xacro: both macros, their default parent and child the exported frames
    xacro = ET.fromstring(texts[names["xacro"]])
    ns = "{http://www.ros.org/wiki/xacro}"
    macros = xacro.findall(f"{ns}macro")
    assert [m.get("name") for m in macros] == ["cellcal_camera", "cellcal_calibration_target"]
    for m, (p, c, T) in zip(macros, FRAMES[setup], strict=True):
        assert m.get("params") == f"parent:={p} child:={c} add_child_link:=true"
        np.testing.assert_allclose(_origin(m.find("joint")), T, atol=TOL)  # type: ignore[arg-type]
    # MoveIt Calibration, ROS 2: the camera only, frames first
    (args,) = _node_arguments(texts[names["moveit_launch_py"]])
    assert args[:4] == ["--frame-id", cp, "--child-frame-id", cc]
    T, p, c = _flags(args)
    np.testing.assert_allclose(T, CAMERA, atol=TOL)
    label = "EYE-IN-HAND" if setup == "eye_in_hand" else "EYE-TO-HAND"
    assert f'""" {label}: {cp} -> {cc} """' in texts[names["moveit_launch_py"]]
    # MoveIt Calibration, ROS 1: positional args x y z qx qy qz qw frame child
    launch = ET.fromstring(texts[names["moveit_launch"]])
    (node,) = launch.findall("node")
    assert (node.get("pkg"), node.get("type")) == ("tf2_ros", "static_transform_publisher")
    a = node.get("args", "").split()
    assert a[7:] == [cp, cc]
    np.testing.assert_allclose(_q_transform(*(float(v) for v in a[:7])), CAMERA, atol=TOL)


def test_frames_are_renamed_and_sigmas_stated():
    frames = {"base": "base_link", "flange": "tool0", "camera": "camera_color_optical_frame", "target": "board"}
    texts = _texts("eye_in_hand", frames=frames, rid=None)
    names = hand_eye_file_names(None)
    section = Export(base_frame="base_link", flange_frame="tool0", camera_frame="camera_color_optical_frame",
                     target_frame="board")
    assert _texts("eye_in_hand", frames=section, rid=None) == texts  # an [export] section names them alike
    assert names["urdf"] == "hand_eye.urdf"
    got = [_flags(a) for a in _node_arguments(texts[names["launch"]])]
    assert [(p, c) for _, p, c in got] == [("tool0", "camera_color_optical_frame"), ("base_link", "board")]
    sd = np.sqrt(np.diag(COV_CAMERA))
    line = (f"1 sigma: translation {sd[0] * 1e3:.3g} {sd[1] * 1e3:.3g} {sd[2] * 1e3:.3g} mm, rotation "
            f"{np.degrees(sd[3]):.3g} {np.degrees(sd[4]):.3g} {np.degrees(sd[5]):.3g} deg")
    assert line == "1 sigma: translation 0.1 0.2 0.3 mm, rotation 0.00573 0.00573 0.0115 deg"
    for name, text in texts.items():
        assert line in text, name
        assert "offline solve" in text.splitlines()[0 if name.endswith((".py", ".yaml")) else 1], name


def test_the_wire_forms_of_a_stored_body_are_taken_as_they_are():
    cam, tgt = TRANSFORM_NAMES["eye_to_hand"]
    body_transforms = {n: {"parent_frame": n.split("_T_")[0], "child_frame": n.split("_T_")[1],
                           "matrix": T.reshape(-1).tolist()} for n, T in ((cam, CAMERA), (tgt, TARGET))}
    body_cov = {n: {"shape": [6, 6], "values": C.reshape(-1).tolist()} for n, C in ((cam, COV_CAMERA), (tgt, COV_TARGET))}
    assert hand_eye_export_texts("eye_to_hand", body_transforms, body_cov, 7, None) == _texts("eye_to_hand")
    cam_i, tgt_i = TRANSFORM_NAMES["eye_in_hand"]  # the run kind's name stands for its setup
    assert hand_eye_export_texts("hand_eye", {cam_i: CAMERA, tgt_i: TARGET}, {cam_i: COV_CAMERA, tgt_i: COV_TARGET},
                                 7, None) == _texts("eye_in_hand")
    no_cov = hand_eye_export_texts("eye_to_hand", {cam: CAMERA, tgt: TARGET}, None, 7, None)
    assert "1 sigma: not given" in no_cov[hand_eye_file_names(7)["urdf"]]


def test_bad_inputs_are_value_errors():
    with pytest.raises(ValueError, match="setup"):
        hand_eye_export_texts("eye_on_knee", {}, None, 1, None)
    with pytest.raises(ValueError, match="base_T_target"):
        hand_eye_export_texts("eye_in_hand", {"flange_T_camera": CAMERA}, None, 1, None)
    bent = CAMERA.copy()
    bent[0, 0] += 0.1
    with pytest.raises(ValueError, match="flange_T_camera"):
        hand_eye_export_texts("eye_in_hand", {"flange_T_camera": bent, "base_T_target": TARGET}, None, 1, None)
    with pytest.raises(ValueError, match="frame name"):
        _texts("eye_in_hand", frames={"camera": "my camera"})


@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_a_refused_result_is_marked_on_every_first_line_and_disarmed(setup):
    why = "closure: held-out closure 3.1 mm, beyond the 1 mm gate"
    texts = _texts(setup, refused=why)
    names = hand_eye_file_names(7)
    for name, text in texts.items():
        assert REFUSED_MARK in text.splitlines()[0] and why in text.splitlines()[0], name
    for key in ("launch", "moveit_launch_py"):  # exit before a node is described (launch is not installed here)
        with pytest.raises(SystemExit) as e:
            exec(compile(texts[names[key]], names[key], "exec"), {})
        assert REFUSED_MARK in str(e.value.code)
        assert _node_arguments(texts[names[key]])  # still readable for a person
    for key in ("urdf", "xacro"):
        assert ET.fromstring(texts[names[key]]) is not None  # a comment first, no XML declaration
    group = ET.fromstring(texts[names["moveit_launch"]]).find("group")
    assert group is not None and group.get("if") == "false" and group.find("node") is not None
    assert texts[names["easy_handeye"]].splitlines()[1].startswith("GATES_FAILED: ")
    assert _texts(setup, refused="")[names["urdf"]].startswith(f"<!-- {REFUSED_MARK} -->")


@pytest.mark.slow  # runs the system Python as a process
@pytest.mark.parametrize("setup", ["eye_in_hand", "eye_to_hand"])
def test_the_easy_handeye_yaml_reads_back_with_pyyaml(setup, tmp_path):
    if shutil.which(SYSTEM_PYTHON) is None or subprocess.run([SYSTEM_PYTHON, "-c", "import yaml"]).returncode != 0:
        pytest.fail("the system Python's PyYAML (Debian python3-yaml) is not installed: run `make os-deps`")
    frames = {"base": "base_link", "flange": "tool0", "camera": "camera_link", "target": "board"}
    files = {}
    for label, refused in (("ok", None), ("refused", "a gate")):
        p = tmp_path / f"{label}.yaml"
        p.write_text(_file(setup, "easy_handeye", frames=frames, refused=refused))
        files[label] = str(p)
    code = ("import json, sys, yaml; print(json.dumps([yaml.safe_load(open(f)) for f in sys.argv[1:]]))")
    out = subprocess.run([SYSTEM_PYTHON, "-c", code, files["ok"], files["refused"]], capture_output=True, text=True,
                         timeout=60, check=True)
    ok, refused = json.loads(out.stdout)
    p = ok["parameters"]
    assert p["calibration_type"] == ("eye_in_hand" if setup == "eye_in_hand" else "eye_on_base")
    assert (p["robot_base_frame"], p["robot_effector_frame"]) == ("base_link", "tool0")
    assert (p["tracking_base_frame"], p["tracking_marker_frame"]) == ("camera_link", "board")
    tr, rot = ok["transform"]["translation"], ok["transform"]["rotation"]
    T = _q_transform(tr["x"], tr["y"], tr["z"], rot["x"], rot["y"], rot["z"], rot["w"])
    np.testing.assert_allclose(T, CAMERA, atol=TOL)
    assert list(refused)[0] == "GATES_FAILED" and REFUSED_MARK in refused["GATES_FAILED"]
    assert refused["transform"] == ok["transform"]


@pytest.mark.parametrize("kind", ["hand_eye", "eye_to_hand"])
def test_a_stored_refused_result_gets_its_hand_eye_files_marked_beside_the_common_ones(kind, tmp_path):
    # what the daemon writes for a stored result (report.exports.write_exports -> the kind's write_exports)
    from cellcal.daemon.bodies import transform_to_wire
    from cellcal.daemon.report.exports import write_exports
    from cellcal.daemon.report.refused import REFUSED_DIR

    setup = "eye_in_hand" if kind == "hand_eye" else kind
    cam, tgt = TRANSFORM_NAMES[setup]
    why = "holdout_p90: held-out views' static-target closure P90 3.1 mm > 1 mm"
    body = {"kind": kind, "transforms": {cam: transform_to_wire(cam, CAMERA), tgt: transform_to_wire(tgt, TARGET)},
            "uncertainty": {"covariance": {n: {"shape": [6, 6], "values": C.reshape(-1).tolist()}
                                           for n, C in ((cam, COV_CAMERA), (tgt, COV_TARGET))}},
            "gates": {"passed": False, "failed": [why], "checks": [
                {"name": "holdout_p90", "value": 3.1e-3, "limit": 1e-3, "unit": "m", "passed": False,
                 "message": "held-out views' static-target closure P90 3.1 mm > 1 mm"}]}}
    paths = write_exports(tmp_path, 9, body, Export(flange_frame="tool0"))
    names = hand_eye_file_names(9)
    assert {paths[f"hand_eye_{k}"].name for k in names} == set(names.values())
    assert paths["urdf"].name == "result_9.urdf" and paths["hand_eye_urdf"] != paths["urdf"]  # keys of their own
    for key in names:
        p = paths[f"hand_eye_{key}"]
        assert p.parent.name == REFUSED_DIR and why in p.read_text().splitlines()[0], key
    robot = ET.parse(paths["hand_eye_urdf"]).getroot()
    (joint,) = robot.findall("joint")
    assert joint.find("parent").get("link") == ("tool0" if setup == "eye_in_hand" else "base")  # type: ignore[union-attr]
    np.testing.assert_allclose(_origin(joint), CAMERA, atol=TOL)
    assert not list(tmp_path.glob("result_9_hand_eye*"))  # none outside the refused directory
