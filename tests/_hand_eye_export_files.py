"""A stored camera hand-eye result's integrator files, read back from the daemon's exports
directory by their tools' readers (an XML parser for the URDF and the ROS 1 launch file, the
system Python's PyYAML for easy_handeye's file) and compared with the result body's transforms:
what the hand-eye daemon tests assert of their run."""

from __future__ import annotations

import json
import math
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.report.exports import frame_names, matrix_from_rpy
from cellcal.daemon.report.hand_eye_exports import TRANSFORM_NAMES, hand_eye_file_names
from cellcal.solver.se3 import make_transform, matrix_from_quat

SYSTEM_PYTHON = "/usr/bin/python3"
TOL = 1e-9


def _urdf_origin(el: ET.Element) -> np.ndarray:
    o = el.find("origin")
    assert o is not None
    return make_transform(matrix_from_rpy(*[float(v) for v in o.get("rpy", "").split()]),
                          [float(v) for v in o.get("xyz", "").split()])


def _q_transform(x: float, y: float, z: float, qx: float, qy: float, qz: float, qw: float) -> np.ndarray:
    assert qw >= 0.0
    return make_transform(matrix_from_quat(np.array([qw, qx, qy, qz])), [x, y, z])


def check_hand_eye_exports(exports: Path, result: dict, setup: str, export_cfg: object) -> None:
    """Assert that ``exports`` holds ``result``'s hand-eye files (named with its id), each
    reading back to the body's transforms to 1e-9 with ``[export]``'s frame names, and that
    ``exports/active`` names them too (the result is active). A transform from the base is
    exported from the base turned by ``[export] base_frame_yaw_deg``, as the common files turn it."""
    rid = int(result["result_id"])
    names = hand_eye_file_names(rid)
    for name in names.values():
        assert (exports / name).is_file(), (name, sorted(p.name for p in exports.iterdir()))
        assert "GATES FAILED" not in (exports / name).read_text().splitlines()[0]  # the result passed its gates
    frames = frame_names(export_cfg)  # type: ignore[arg-type]  # the cell's Export section
    cam, tgt = TRANSFORM_NAMES[setup]
    X = {n: transform_from_wire(result["transforms"][n]) for n in (cam, tgt)}
    yaw = float(getattr(export_cfg, "base_frame_yaw_rad", 0.0))
    E_T_B = make_transform(np.array([[math.cos(yaw), math.sin(yaw), 0.0], [-math.sin(yaw), math.cos(yaw), 0.0],
                                     [0.0, 0.0, 1.0]]), [0.0, 0.0, 0.0])
    X = {n: (E_T_B @ T if n.startswith("base_T_") else T) for n, T in X.items()}
    cp, cc = (frames[f] for f in cam.split("_T_"))
    tp, tc = (frames[f] for f in tgt.split("_T_"))
    # URDF: the camera's fixed joint, parent and child as exported, its origin the body's transform
    robot = ET.parse(exports / names["urdf"]).getroot()
    (joint,) = robot.findall("joint")
    assert (joint.find("parent").get("link"), joint.find("child").get("link")) == (cp, cc)  # type: ignore[union-attr]
    np.testing.assert_allclose(_urdf_origin(joint), X[cam], atol=TOL)
    # xacro: the board's macro carries the other transform
    xacro = ET.parse(exports / names["xacro"]).getroot()
    macros = {m.get("name"): m for m in xacro.findall("{http://www.ros.org/wiki/xacro}macro")}
    target_macro = macros["cellcal_calibration_target"]
    assert target_macro.get("params") == f"parent:={tp} child:={tc} add_child_link:=true"
    np.testing.assert_allclose(_urdf_origin(target_macro.find("joint")), X[tgt], atol=TOL)  # type: ignore[arg-type]
    # MoveIt Calibration, ROS 1: x y z qx qy qz qw frame child
    (node,) = ET.parse(exports / names["moveit_launch"]).getroot().findall("node")
    a = node.get("args", "").split()
    assert a[7:] == [cp, cc]
    np.testing.assert_allclose(_q_transform(*(float(v) for v in a[:7])), X[cam], atol=TOL)
    # easy_handeye2's YAML, by PyYAML
    code = "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))"
    out = subprocess.run([SYSTEM_PYTHON, "-c", code, str(exports / names["easy_handeye"])], capture_output=True,
                         text=True, timeout=60, check=True)
    doc = json.loads(out.stdout)
    assert "GATES_FAILED" not in doc
    p = doc["parameters"]
    assert p["calibration_type"] == ("eye_in_hand" if setup == "eye_in_hand" else "eye_on_base")
    assert (p["robot_base_frame"], p["robot_effector_frame"]) == (frames["base"], frames["flange"])
    assert (p["tracking_base_frame"], p["tracking_marker_frame"]) == (frames["camera"], frames["target"])
    tr, rot = doc["transform"]["translation"], doc["transform"]["rotation"]
    np.testing.assert_allclose(_q_transform(tr["x"], tr["y"], tr["z"], rot["x"], rot["y"], rot["z"], rot["w"]),
                               X[cam], atol=TOL)
    # the active result's files under stable names
    assert (exports / "active" / "result_hand_eye.urdf").read_text() == (exports / names["urdf"]).read_text()
