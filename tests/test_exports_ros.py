"""Exports as ROS and UR read them: a complete URDF, a xacro macro, static TF, a launch file,
UR pose lines, configurable frame names, ``exports/active`` and the suspect flag.

Every matrix is rebuilt here from first principles (elementary rotations, the quaternion
and Rodrigues formulas), not with the module's inverses, so a convention slip shows.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import shlex
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from cellcal.daemon.bodies import result_to_wire
from cellcal.daemon.config import ConfigError, Export, load_config_text
from cellcal.daemon.report.exports import (
    ACTIVE_KEEP_MAX,
    active_result_id,
    ros2_launch_file,
    ros2_static_tf_args,
    sync_active,
    update_active,
    ur_pose,
    write_exports,
)
from cellcal.solver import calibrate_base_frame, calibrate_tool_point
from cellcal.solver.se3 import make_transform, so3_exp
from cellcal.solver.synthetic import base_frame_scene, pivot_scene

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

ROS_NAMES = Export(cell_frame="world", base_frame="base_link", flange_frame="tool0", target_frame="smr",
                   robot_name="cell_7")


def Rx(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def Ry(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def Rz(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def urdf_matrix(origin: ET.Element) -> np.ndarray:
    """URDF origin -> parent_T_child: fixed-axis roll about X, then pitch about Y, then yaw about Z."""
    r, p, y = (float(v) for v in origin.get("rpy").split())
    return make_transform(Rz(y) @ Ry(p) @ Rx(r), [float(v) for v in origin.get("xyz").split()])


def quat_matrix(qx, qy, qz, qw) -> np.ndarray:
    n = math.sqrt(qx * qx + qy * qy + qz * qz + qw * qw)
    x, y, z, w = qx / n, qy / n, qz / n, qw / n
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def rodrigues(rv) -> np.ndarray:
    rv = np.asarray(rv, dtype=float)
    th = float(np.linalg.norm(rv))
    if th == 0.0:
        return np.eye(3)
    k = rv / th
    K = np.array([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]])
    return np.eye(3) + math.sin(th) * K + (1 - math.cos(th)) * K @ K


def parse_static_tf(args: list[str]) -> tuple[str, str, np.ndarray]:
    """static_transform_publisher's named arguments -> (frame_id, child_frame_id, matrix)."""
    assert len(args) % 2 == 0
    flags = args[::2]
    assert flags == ["--x", "--y", "--z", "--qx", "--qy", "--qz", "--qw", "--frame-id", "--child-frame-id"]
    a = dict(zip(flags, args[1::2], strict=True))
    n = {k: float(a[f"--{k}"]) for k in ("x", "y", "z", "qx", "qy", "qz", "qw")}
    assert n["qw"] >= 0
    T = make_transform(quat_matrix(n["qx"], n["qy"], n["qz"], n["qw"]), [n["x"], n["y"], n["z"]])
    return a["--frame-id"], a["--child-frame-id"], T


def parse_ur_pose(text: str) -> np.ndarray:
    m = re.fullmatch(r"p\[([^\]]*)\]", text.strip())
    assert m, text
    v = [float(x) for x in m.group(1).split(",")]
    assert len(v) == 6
    return make_transform(rodrigues(v[3:]), v[:3])


@pytest.fixture(scope="module")
def base_result():
    scene = base_frame_scene(12, np.random.default_rng(5), noise_mm=0.02, noise_deg=0.01)
    res = calibrate_base_frame(scene.base_T_flange, scene.measured)
    wire = result_to_wire(res)
    wire.update(kind="base_frame", result_id="7", active=True, suspect=False, suspect_reason=None)
    return res, wire


# ---- [export] configuration -------------------------------------------------------------


def test_export_section_is_typed_and_checked():
    cfg = load_config_text('config_version = 1\n[export]\ncell_frame = "world"\nbase_frame = "base_link"\n')
    assert (cfg.export.cell_frame, cfg.export.base_frame, cfg.export.flange_frame) == ("world", "base_link", "flange")
    assert load_config_text("config_version = 1\n").export == Export()
    for text, path, what in (
        ('cell_frame = "my world"', "export.cell_frame", "frame name"),
        ('base_frame = "/base"', "export.base_frame", "frame name"),
        ('tip_frame = "${x}"', "export.tip_frame", "frame name"),
        ("cell_frame = 3", "export.cell_frame", "expected a string"),
        ('base_frame = "cell"', "export.base_frame", "already export.cell_frame"),
        ('parent_frame = "world"', "export.parent_frame", "unknown key"),
    ):
        with pytest.raises(ConfigError, match=re.escape(what)) as ei:
            load_config_text(f"config_version = 1\n[export]\n{text}\n")
        assert ei.value.path == path
    assert load_config_text('config_version = 1\n[export]\nbase_frame = "robot1/base_link"\n').export.base_frame \
        == "robot1/base_link"


# ---- URDF and xacro ---------------------------------------------------------------------


def test_urdf_is_a_complete_robot_whose_joint_is_cell_T_base(base_result, tmp_path):
    res, wire = base_result
    paths = write_exports(tmp_path, 7, wire, ROS_NAMES)
    robot = ET.parse(paths["urdf"]).getroot()  # a whole document: declaration, comments, one root
    assert robot.tag == "robot" and robot.get("name") == "cell_7"
    links = [link.get("name") for link in robot.findall("link")]
    assert links == ["world", "base_link"]
    (joint,) = robot.findall("joint")
    assert joint.get("type") == "fixed" and joint.get("name") == "cellcal_world_to_base_link"
    assert joint.find("parent").get("link") == "world" and joint.find("child").get("link") == "base_link"
    # Every joint's links are declared, and the tree has exactly one root.
    children = {j.find("child").get("link") for j in robot.findall("joint")}
    parents = {j.find("parent").get("link") for j in robot.findall("joint")}
    assert (parents | children) <= set(links) and len(set(links) - children) == 1
    T = urdf_matrix(joint.find("origin"))
    assert np.max(np.abs(T - res.cell_T_base)) < 1e-9
    assert np.array_equal(T[:3, 3], res.cell_T_base[:3, 3])  # repr floats: the translation exactly


def test_urdf_rpy_convention_at_gimbal_lock_and_half_turns(tmp_path):
    rng = np.random.default_rng(11)
    rotations = [Ry(math.pi / 2), Ry(-math.pi / 2) @ Rz(0.3), Rx(math.pi), Rz(math.pi) @ Rx(math.pi / 2)]
    rotations += [so3_exp(rng.normal(size=3) * 2.0) for _ in range(20)]
    for i, R in enumerate(rotations):
        T = make_transform(R, rng.normal(size=3))
        wire = result_to_wire_transform(T)
        robot = ET.parse(write_exports(tmp_path, i + 1, wire)["urdf"]).getroot()
        assert np.max(np.abs(urdf_matrix(robot.find("joint/origin")) - T)) < 1e-9


def result_to_wire_transform(T: np.ndarray) -> dict:
    from cellcal.daemon.bodies import transform_to_wire

    return {"kind": "base_frame", "transforms": {"cell_T_base": transform_to_wire("cell_T_base", T)}}


def expand_xacro_macro(doc: ET.Element, name: str, **params: str) -> list[ET.Element]:
    """A minimal xacro: the named macro's body with ${param} replaced, xacro:if applied."""
    ns = "{http://www.ros.org/wiki/xacro}"
    (macro,) = [m for m in doc.iter(f"{ns}macro") if m.get("name") == name]
    values = {}
    for p in macro.get("params").split():
        key, _, default = p.partition(":=")
        values[key] = params.get(key, default)

    def sub(text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], text)

    out = []
    for el in macro:
        if el.tag == f"{ns}if":
            if sub(el.get("value")) in ("true", "1", "True"):
                out += list(el)
            continue
        out.append(el)
    expanded = []
    for el in out:
        el = ET.fromstring(sub(ET.tostring(el, encoding="unicode")))
        expanded.append(el)
    return expanded


def test_xacro_macro_attaches_the_base_to_a_users_world(base_result, tmp_path):
    res, wire = base_result
    doc = ET.parse(write_exports(tmp_path, 7, wire, ROS_NAMES)["xacro"]).getroot()
    assert doc.tag == "robot"
    macros = {m.get("name"): m.get("params") for m in doc.iter("{http://www.ros.org/wiki/xacro}macro")}
    assert set(macros) == {"cellcal_base", "cellcal_target"}
    assert "parent:=world" in macros["cellcal_base"] and "child:=base_link" in macros["cellcal_base"]
    # <xacro:cellcal_base parent="my_world"/>: one joint, no link (the description has base_link).
    (joint,) = expand_xacro_macro(doc, "cellcal_base", parent="my_world")
    assert joint.tag == "joint" and joint.get("name") == "cellcal_my_world_to_base_link"
    assert joint.find("parent").get("link") == "my_world" and joint.find("child").get("link") == "base_link"
    assert np.max(np.abs(urdf_matrix(joint.find("origin")) - res.cell_T_base)) < 1e-9
    # The target is cellcal's own frame: its macro declares the link too, on the renamed flange.
    link, joint = expand_xacro_macro(doc, "cellcal_target")
    assert link.tag == "link" and link.get("name") == "smr" and joint.find("parent").get("link") == "tool0"
    assert np.max(np.abs(urdf_matrix(joint.find("origin")) - res.flange_T_target)) < 1e-9


# ---- ROS 2 ------------------------------------------------------------------------------


def test_static_transform_publisher_arguments_round_trip(base_result, tmp_path):
    res, wire = base_result
    paths = write_exports(tmp_path, 7, wire, ROS_NAMES)
    cmds = [shlex.split(ln.removesuffix(" &")) for ln in paths["ros2"].read_text().splitlines()
            if ln.startswith("ros2 run tf2_ros static_transform_publisher")]
    got = {parse_static_tf(c[4:])[:2]: parse_static_tf(c[4:])[2] for c in cmds}
    assert set(got) == {("world", "base_link"), ("tool0", "smr")}
    assert np.max(np.abs(got[("world", "base_link")] - res.cell_T_base)) < 1e-9
    assert np.max(np.abs(got[("tool0", "smr")] - res.flange_T_target)) < 1e-9
    # The function itself, on awkward rotations (half turns: the quaternion sign with qw >= 0).
    for R in (Rx(math.pi), Rz(math.pi) @ Ry(0.2), so3_exp([0.0, 3.1, 0.2])):
        T = make_transform(R, [0.1, -2.0, 3.0])
        parent, child, back = parse_static_tf(ros2_static_tf_args("a/b", "c", T))
        assert (parent, child) == ("a/b", "c") and np.max(np.abs(back - T)) < 1e-12


class _Recorded:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def _run_launch_file(path: Path) -> list[_Recorded]:
    """Import the launch file as `ros2 launch` does, with launch and launch_ros standing in
    (they are ROS packages, not on PyPI): the file must be valid Python, import only those
    and build one Node per transform."""
    launch = types.ModuleType("launch")
    launch.LaunchDescription = lambda actions: list(actions)
    actions = types.ModuleType("launch_ros.actions")
    actions.Node = _Recorded
    launch_ros = types.ModuleType("launch_ros")
    launch_ros.actions = actions
    saved = {k: sys.modules.get(k) for k in ("launch", "launch_ros", "launch_ros.actions")}
    sys.modules.update({"launch": launch, "launch_ros": launch_ros, "launch_ros.actions": actions})
    try:
        ns: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), ns)
        return ns["generate_launch_description"]()
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def test_launch_file_is_valid_python_publishing_the_same_transforms(base_result, tmp_path):
    res, wire = base_result
    path = write_exports(tmp_path, 7, wire, ROS_NAMES)["launch"]
    assert path.name == "result_7_static_tf.launch.py"
    tree = ast.parse(path.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"launch", "launch_ros.actions"}
    nodes = _run_launch_file(path)
    assert len(nodes) == 2
    got = {}
    for n in nodes:
        assert n.kwargs["package"] == "tf2_ros" and n.kwargs["executable"] == "static_transform_publisher"
        assert re.fullmatch(r"[A-Za-z0-9_]+", n.kwargs["name"])
        parent, child, T = parse_static_tf(n.kwargs["arguments"])
        got[(parent, child)] = T
    assert np.max(np.abs(got[("world", "base_link")] - res.cell_T_base)) < 1e-9
    # The same bytes for the same result (a file diff shows a real change only).
    assert ros2_launch_file(7, wire, ROS_NAMES) == path.read_text()


# ---- UR ---------------------------------------------------------------------------------


def test_ur_base_feature_pose_line_round_trips(base_result, tmp_path):
    res, wire = base_result
    text = write_exports(tmp_path, 7, wire, ROS_NAMES)["ur"].read_text()
    lines = dict(ln.split(" = ", 1) for ln in text.splitlines() if not ln.startswith("#"))
    # The base feature: the cell frame in the robot base, base_T_cell.
    base_T_cell = parse_ur_pose(lines["cellcal_world"])
    assert np.max(np.abs(base_T_cell @ res.cell_T_base - np.eye(4))) < 1e-9
    assert np.max(np.abs(parse_ur_pose(lines["cellcal_smr"]) - res.flange_T_target)) < 1e-9
    # Near and at a half turn the rotation vector still rebuilds the rotation.
    for R in (Rx(math.pi), so3_exp([0.0, 0.0, math.pi - 1e-9]), so3_exp([1e-12, 0.0, 0.0]), np.eye(3)):
        T = make_transform(R, [0.5, -0.25, 0.125])
        assert np.max(np.abs(parse_ur_pose(ur_pose(T)) - T)) < 1e-9


def test_ur_tcp_line_of_a_tool_point(tmp_path):
    base_T_flange, _, _ = pivot_scene(10, np.random.default_rng(6), noise_mm=0.01)
    wire = result_to_wire(calibrate_tool_point(base_T_flange))
    text = write_exports(tmp_path, 3, wire)["ur"].read_text()
    lines = dict(ln.split(" = ", 1) for ln in text.splitlines() if not ln.startswith("#"))
    tcp = parse_ur_pose(lines["cellcal_tip"])
    assert np.array_equal(tcp[:3, :3], np.eye(3))
    assert np.max(np.abs(tcp[:3, 3] - wire["points"]["flange_p_tip"]["position_m"])) < 1e-12
    assert "TCP" in text and "set_tcp(cellcal_tip)" in text


# ---- suspect ------------------------------------------------------------------------------


def test_suspect_is_in_every_file_and_a_reason_cannot_inject_code(base_result, tmp_path):
    _, wire = base_result
    bad = dict(wire, suspect=True, suspect_reason='drift 0.4 mm\nrm -rf / #"""\r\n<!-- x --->')
    paths = write_exports(tmp_path, 7, bad)
    assert json.loads(paths["json"].read_text())["suspect"] is True
    for key in ("urdf", "xacro", "ros2", "launch", "ur"):
        assert "SUSPECT: true" in paths[key].read_text(), key
    assert not any(ln.startswith("rm ") for p in paths.values() for ln in p.read_text().splitlines())
    assert subprocess.run(["sh", "-n", str(paths["ros2"])], capture_output=True).returncode == 0
    ast.parse(paths["launch"].read_text())
    ET.parse(paths["urdf"])
    ET.parse(paths["xacro"])
    clean = write_exports(tmp_path, 7, wire)
    assert json.loads(clean["json"].read_text())["suspect"] is False and "suspect: false" in clean["urdf"].read_text()


# ---- exports/active -----------------------------------------------------------------------


def _wire(i: int, base_result) -> dict:
    _, wire = base_result
    return dict(wire, result_id=str(i), pad="x" * (200_000 if i % 2 else 10))


def test_active_names_the_active_results_files_under_stable_names(base_result, tmp_path):
    for i in (1, 2):
        write_exports(tmp_path, i, _wire(i, base_result))
    (tmp_path / "result_2_report.html").write_text("<html></html>")  # any file beside them goes along
    link = update_active(tmp_path, 2)
    assert link == tmp_path / "active" and link.is_symlink() and active_result_id(tmp_path) == 2
    names = sorted(p.name for p in link.iterdir())
    assert names == ["result.json", "result.urdf", "result.xacro", "result_report.html", "result_static_tf.launch.py",
                     "result_static_tf.sh", "result_ur.script"]
    assert (link / "result.urdf").read_bytes() == (tmp_path / "result_2.urdf").read_bytes()
    assert os.access(link / "result_static_tf.sh", os.X_OK)
    target = os.readlink(link)
    assert update_active(tmp_path, 2) == link and os.readlink(link) == target  # nothing changed: no switch
    # Rollback to 1, then a rewrite of 1 (suspect): active follows each time.
    update_active(tmp_path, 1)
    assert json.loads((link / "result.json").read_text())["result_id"] == "1"
    write_exports(tmp_path, 1, dict(_wire(1, base_result), suspect=True))
    assert sync_active(tmp_path, lambda: 1) == link
    assert json.loads((link / "result.json").read_text())["suspect"] is True
    assert sync_active(tmp_path, lambda: None) is None and active_result_id(tmp_path) == 1
    # Superseded directories are kept a while for readers on their way into them; past the
    # grace only the current and the previous one stay.
    assert 2 <= len(list(tmp_path.glob(".active.*"))) <= ACTIVE_KEEP_MAX
    before = os.readlink(link)
    update_active(tmp_path, 2, grace_s=0.0)
    assert sorted(p.name for p in tmp_path.glob(".active.*")) == sorted([before, os.readlink(link)])
    with pytest.raises(Exception, match="no files of result 9"):
        update_active(tmp_path, 9)


_READER = """
import json, sys, time
from pathlib import Path
d = Path(sys.argv[1])
seen = set()
print("ready", flush=True)
deadline = time.monotonic() + 60
while not (d / "stop").exists() and time.monotonic() < deadline:
    doc = json.loads((d / "active" / "result.json").read_bytes())  # a torn or missing file fails here
    seen.add(doc["result_id"])
print(json.dumps(sorted(seen)), flush=True)
"""


def test_a_reader_of_active_never_sees_a_half_written_file(base_result, tmp_path):
    """Another process reads active/result.json as fast as it can while this one switches
    active between a 10-byte-padded and a 200 kB-padded result and rewrites them: every read
    parses, and both results were seen."""
    for i in (1, 2):
        write_exports(tmp_path, i, _wire(i, base_result))
    update_active(tmp_path, 1)
    proc = subprocess.Popen([sys.executable, "-c", _READER, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        for k in range(200):
            i = 1 + k % 2
            if k % 7 == 0:
                write_exports(tmp_path, i, _wire(i, base_result))
            update_active(tmp_path, i)
        (tmp_path / "stop").touch()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, err
    assert set(json.loads(out)) <= {"1", "2"} and json.loads(out)
    assert len(list(tmp_path.glob(".active.*"))) <= ACTIVE_KEEP_MAX  # bounded however fast the switches
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".cellcal-tmp")]


# ---- through the daemon -------------------------------------------------------------------


def test_daemon_switches_active_on_activation_rollback_and_restart(tmp_path):
    """Two calibrations of the simulated cell: exports/active follows the second, then a
    rollback (activate_result of the first) and a restart that finds the link gone; the
    [export] names reach the files, and each result's own files say whether it is active."""
    from cellcal.testing.harness import FAST_TIME_SCALE, inprocess_cell

    overrides = {"export": {"cell_frame": "world", "base_frame": "base_link"}}
    state = tmp_path / "state"
    with inprocess_cell(tmp_path, state_dir=state, n_stations=6, overrides=overrides, time_scale=FAST_TIME_SCALE) as cell:
        exports = Path(cell.cfg.service.state_dir) / "exports"
        ids = []
        for _ in range(2):
            run = cell.svc.start_run("base_frame")
            ids.append(int(cell.wait_result(run)["result_id"]))
        first, second = ids
        assert active_result_id(exports) == second
        doc = json.loads((exports / "active" / "result.json").read_text())
        assert doc["result_id"] == str(second) and doc["active"] is True
        assert json.loads((exports / f"result_{first}.json").read_text())["active"] is False
        robot = ET.parse(exports / "active" / "result.urdf").getroot()
        assert robot.find("joint").get("name") == "cellcal_world_to_base_link"

        assert cell.svc.activate_result(first, reason="rollback") == second
        assert active_result_id(exports) == first
        assert json.loads((exports / "active" / "result.json").read_text())["result_id"] == str(first)
        assert json.loads((exports / f"result_{second}.json").read_text())["active"] is False
        assert json.loads((exports / f"result_{first}.json").read_text())["active"] is True
    (exports / "active").unlink()
    with inprocess_cell(tmp_path, state_dir=state, n_stations=6, overrides=overrides, time_scale=FAST_TIME_SCALE):
        assert active_result_id(exports) == first


def test_base_frame_yaw_turns_the_exported_base_only(base_result, tmp_path):
    """ur_description: base_link is the controller's base turned 180 deg about z, so with
    base_frame = "base_link" and base_frame_yaw_deg = 180 the joint world -> base_link is
    cell_T_base Rz(pi); the UR file stays in the controller's own base."""
    res, wire = base_result
    cfg = load_config_text('config_version = 1\n[export]\ncell_frame = "world"\nbase_frame = "base_link"\n'
                           "base_frame_yaw_deg = 180.0\n")
    assert cfg.export.base_frame_yaw_rad == pytest.approx(math.pi)
    with pytest.raises(ConfigError, match=r"export.base_frame_yaw_deg: must be in \[-180, 180\]"):
        load_config_text("config_version = 1\n[export]\nbase_frame_yaw_deg = 270.0\n")
    paths = write_exports(tmp_path, 7, wire, cfg.export)
    joint = ET.parse(paths["urdf"]).getroot().find("joint")
    expected = res.cell_T_base @ make_transform(Rz(math.pi), [0, 0, 0])
    assert np.max(np.abs(urdf_matrix(joint.find("origin")) - expected)) < 1e-9
    cmds = [shlex.split(ln.removesuffix(" &"))[4:] for ln in paths["ros2"].read_text().splitlines()
            if ln.startswith("ros2 ")]
    got = {parse_static_tf(c)[:2]: parse_static_tf(c)[2] for c in cmds}
    assert np.max(np.abs(got[("world", "base_link")] - expected)) < 1e-9
    assert np.max(np.abs(got[("flange", "target")] - res.flange_T_target)) < 1e-9  # not the base: unchanged
    lines = dict(ln.split(" = ", 1) for ln in paths["ur"].read_text().splitlines() if not ln.startswith("#"))
    assert np.max(np.abs(parse_ur_pose(lines["cellcal_world"]) @ res.cell_T_base - np.eye(4))) < 1e-9
    # A transform whose parent is the base turns the other way: E_T_child = Rz(-yaw) B_T_child.
    from cellcal.daemon.bodies import transform_to_wire

    B_T_cam = make_transform(so3_exp([0.1, 0.2, 0.3]), [0.5, 0.1, 0.9])
    eth = {"kind": "hand_eye", "transforms": {"base_T_camera": transform_to_wire("base_T_camera", B_T_cam)},
           "points": {"base_p_pivot": {"frame": "base", "position_m": [0.1, 0.2, 0.3]}}}
    cmds = [shlex.split(ln.removesuffix(" &"))[4:] for ln in
            write_exports(tmp_path, 8, eth, cfg.export)["ros2"].read_text().splitlines() if ln.startswith("ros2 ")]
    got = {parse_static_tf(c)[:2]: parse_static_tf(c)[2] for c in cmds}
    assert np.max(np.abs(got[("base_link", "camera")] - make_transform(Rz(-math.pi), [0, 0, 0]) @ B_T_cam)) < 1e-9
    pivot = got[("base_link", "pivot")]
    assert np.max(np.abs(pivot[:3, :3] - np.eye(3))) < 1e-12 and np.allclose(pivot[:3, 3], [-0.1, -0.2, 0.3], atol=1e-12)
