"""A camera hand-eye result's files for ROS tools: static transforms, URDF, xacro, easy_handeye
and MoveIt Calibration (issue 27 item 6; ``docs/exports.md``).

:func:`hand_eye_export_texts` is pure: the setup, the transforms and their covariances as plain
arrays or nested lists (what a stored result body holds), an id and whether the result failed
its gates in, ``{file name: text}`` out. ``cellcal solve DIR --setup eye_in_hand|eye_to_hand
--export DIR`` writes them (``cellcal.daemon.cli.solve_camera``); a daemon run kind can call
it on a stored body's ``transforms`` and ``uncertainty.covariance``.

The files, for the *camera* transform (``flange_T_camera`` eye-in-hand, ``base_T_camera``
eye-to-hand) and the *target* transform (``base_T_target``, ``flange_T_target``):

``<prefix>_static_tf.launch.py``
    A ROS 2 Python launch file: one ``tf2_ros static_transform_publisher`` per transform, the
    named arguments of Humble and newer (``cellcal.daemon.report.exports.ros2_static_tf_args``).
``<prefix>.urdf``
    A URDF ``<robot>`` with the camera's fixed joint (parent: the flange or the base) and its
    two links; the target transform is named in a comment (it joins another tree: a URDF has
    one root) and is in the xacro file.
``<prefix>.xacro``
    Macros ``cellcal_camera`` and ``cellcal_calibration_target``, each with its ``parent``
    link a parameter, for a user's robot description.
``<prefix>_easy_handeye.yaml``
    easy_handeye2's calibration file: ``parameters`` (``calibration_type`` ``eye_in_hand`` or
    ``eye_on_base``, the four frames) and ``transform`` (``translation`` x, y, z; ``rotation``
    x, y, z, w): the camera (easy_handeye's *tracking base*) in the effector (eye-in-hand) or
    the robot base (eye-on-base); the board is its *tracking marker*.
``<prefix>_moveit_calibration.launch.py``
    What MoveIt Calibration's hand-eye plugin saves under ROS 2: a launch file with the camera's
    ``static_transform_publisher``, its docstrings naming the setup and the frames.
``<prefix>_moveit_calibration.launch``
    Its ROS 1 form: a roslaunch XML ``<node pkg="tf2_ros" type="static_transform_publisher"
    args="x y z qx qy qz qw frame child"/>`` with the URDF ``xyz``/``rpy`` in a comment.

``prefix`` is ``result_<id>_hand_eye`` (``hand_eye`` without an id: an offline solve). Every
file states each transform's 1-sigma (translation mm, rotation deg per axis of the child frame:
the right perturbation of ADR 0004) in a comment. Conventions are the generic exports'
(``cellcal.daemon.report.exports``): ``parent_T_child`` is the child's pose in the parent, metres,
fixed-axis rpy, quaternions with ``w >= 0`` written in ROS's x, y, z, w order, numbers by
``repr`` (they parse back to the same float64). Frame names are cellcal's unless ``frames``
renames them (an ``[export]`` section or a mapping, as for the generic exports).

A refused result (``refused`` not None) gets the generic exports' marks
(``cellcal.daemon.report.refused``): every file's first line says ``GATES FAILED: not for use``
with the reasons; the Python launch files raise ``SystemExit`` before they describe a node, the
ROS 1 launch file's node sits in ``<group if="false">`` (never started), and the YAML's first
key is ``GATES_FAILED`` (easy_handeye's loader refuses a key it does not know).
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from cellcal.daemon.report.exports import ExportNames, frame_names, ros2_static_tf_args, rpy_from_matrix
from cellcal.daemon.report.refused import REFUSED_MARK
from cellcal.solver.se3 import check_transform, xyz_quat_from_transform

__all__ = ["HAND_EYE_SETUPS", "TRANSFORM_NAMES", "hand_eye_export_texts", "hand_eye_file_names"]

#: The setups and their transforms: (camera transform, target transform).
TRANSFORM_NAMES = {"eye_in_hand": ("flange_T_camera", "base_T_target"),
                   "eye_to_hand": ("base_T_camera", "flange_T_target")}
HAND_EYE_SETUPS = tuple(TRANSFORM_NAMES)
#: Run kinds (issue 27: ``hand_eye``, ``eye_to_hand``) taken for the setup they calibrate, so a
#: stored body's ``kind`` can be passed as it is.
_ALIASES = {"hand_eye": "eye_in_hand"}

_KEYS = ("launch", "urdf", "xacro", "easy_handeye", "moveit_launch_py", "moveit_launch")


def hand_eye_file_names(result_id: int | None) -> dict[str, str]:
    """Export key -> file name (module docstring) for result ``result_id`` (None: offline)."""
    prefix = "hand_eye" if result_id is None else f"result_{int(result_id)}_hand_eye"
    return {"launch": f"{prefix}_static_tf.launch.py", "urdf": f"{prefix}.urdf", "xacro": f"{prefix}.xacro",
            "easy_handeye": f"{prefix}_easy_handeye.yaml",
            "moveit_launch_py": f"{prefix}_moveit_calibration.launch.py",
            "moveit_launch": f"{prefix}_moveit_calibration.launch"}


def _num(v: float) -> str:
    return repr(float(v))


def _one_line(text: str) -> str:
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)


def _xml_comment(text: str) -> str:
    # "--" may not appear inside an XML comment: every dash before a dash is spaced.
    return "<!-- " + re.sub(r"-(?=-)", "- ", _one_line(text)) + " -->"


class _T:
    """One transform as exported: cellcal's name, exported frames, value, 1-sigma text."""

    def __init__(self, name: str, parent: str, child: str, T: npt.NDArray[np.float64],
                 cov: npt.NDArray[np.float64] | None) -> None:
        self.name, self.parent, self.child, self.T = name, parent, child, T
        if cov is None:
            self.sigma = "1 sigma: not given"
        else:
            d = np.sqrt(np.clip(np.diag(cov), 0.0, None))
            self.sigma = ("1 sigma: translation " + " ".join(f"{v * 1e3:.3g}" for v in d[:3]) + " mm, rotation "
                          + " ".join(f"{math.degrees(v):.3g}" for v in d[3:]) + f" deg (x y z of {self.child})")

    @property
    def xyz_q(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Translation (3,) m and quaternion (w, x, y, z), w >= 0."""
        return xyz_quat_from_transform(self.T)

    def describe(self) -> str:
        return f"{self.name}: {self.child} in {self.parent}; {self.sigma}"


def _array(value: object, key: str, shape: tuple[int, int], what: str) -> npt.NDArray[np.float64]:
    """An array of ``shape`` from an array, nested or flat lists, or the wire's object holding
    them under ``key`` (a transform's ``{"matrix": [16]}``, a covariance's ``{"values": [36]}``)."""
    if isinstance(value, Mapping):
        value = value.get(key)
    try:
        a = np.array(value, dtype=float)
        return a.reshape(shape)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be {shape[0]}x{shape[1]} numbers, got {value!r:.80}") from None


def _inputs(setup: str, transforms: Mapping[str, object], covariances: Mapping[str, object] | None,
            frames: ExportNames) -> tuple[_T, _T]:
    names = frame_names(frames)
    out = []
    for name in TRANSFORM_NAMES[setup]:
        if name not in transforms:
            raise ValueError(f"a {setup} result has {name}; transforms give {sorted(transforms)}")
        T = check_transform(_array(transforms[name], "matrix", (4, 4), name), name)
        cov = None
        if covariances is not None and covariances.get(name) is not None:
            cov = _array(covariances[name], "values", (6, 6), f"{name}'s covariance")
            if not np.all(np.isfinite(cov)):
                raise ValueError(f"{name}'s covariance is not finite")
        parent, child = name.split("_T_")
        out.append(_T(name, names[parent], names[child], T, cov))
    return out[0], out[1]


def _header(setup: str, result_id: int | None, why: str | None) -> list[str]:
    """The comment lines every file starts with (the first the refused mark, if refused)."""
    what = "offline solve" if result_id is None else f"result {int(result_id)}"
    lines = [f"{REFUSED_MARK} ({why})" if why else REFUSED_MARK] if why is not None else []
    lines.append(f"cellcal {setup} hand-eye calibration ({what}), refined on the image")
    return [_one_line(x) for x in lines]


def _ros2_launch(setup: str, items: tuple[_T, ...], head: list[str], refused: bool) -> str:
    nodes = []
    for it in items:
        a = ros2_static_tf_args(it.parent, it.child, it.T)
        node = re.sub(r"[^A-Za-z0-9_]", "_", f"cellcal_{it.parent}_to_{it.child}")
        args = "\n".join(f"                {a[i]!r}, {a[i + 1]!r}," for i in range(0, len(a), 2))
        nodes.append(f"        # {_one_line(it.describe())}\n"
                     "        Node(\n"
                     '            package="tf2_ros",\n'
                     '            executable="static_transform_publisher",\n'
                     f"            name={node!r},\n"
                     "            arguments=[\n"
                     f"{args}\n"
                     "            ],\n"
                     "        ),\n")
    stop = f"raise SystemExit({head[0]!r})\n" if refused else ""
    return ("".join(f"# {h}\n" for h in head) + stop
            + f'"""ROS 2 static transforms of a cellcal {setup} calibration: ros2 launch <this file>.\n\n'
            "Translations in metres; quaternions in ROS's x, y, z, w order.\n"
            '"""\n\n'
            "from launch import LaunchDescription\n"
            "from launch_ros.actions import Node\n\n\n"
            "def generate_launch_description():\n"
            "    return LaunchDescription([\n" + "".join(nodes) + "    ])\n")


def _origin(T: npt.NDArray[np.float64]) -> dict[str, str]:
    return {"xyz": " ".join(_num(v) for v in T[:3, 3]), "rpy": " ".join(_num(v) for v in rpy_from_matrix(T[:3, :3]))}


def _joint(parent_el: ET.Element, name: str, parent: str, child: str, T: npt.NDArray[np.float64]) -> None:
    j = ET.SubElement(parent_el, "joint", {"name": name, "type": "fixed"})
    ET.SubElement(j, "parent", {"link": parent})
    ET.SubElement(j, "child", {"link": child})
    ET.SubElement(j, "origin", _origin(T))


def _xml_text(root: ET.Element, comments: list[str], refused: bool) -> str:
    ET.indent(root, space="  ")
    head = "".join(_xml_comment(c) + "\n" for c in comments)
    # A refused file's first line is its mark: no XML declaration (it must come first if present).
    decl = "" if refused else '<?xml version="1.0"?>\n'
    return decl + head + ET.tostring(root, encoding="unicode") + "\n"


_CONVENTION = ("parent_T_child: the child frame's pose in the parent frame; xyz in metres; rpy in radians about "
               "fixed axes, R = Rz(yaw) Ry(pitch) Rx(roll).")


def _urdf(cam: _T, tgt: _T, head: list[str], refused: bool, xacro_name: str) -> str:
    robot = ET.Element("robot", {"name": "cellcal_hand_eye"})
    ET.SubElement(robot, "link", {"name": cam.parent})
    ET.SubElement(robot, "link", {"name": cam.child})
    robot.append(ET.Comment(" " + re.sub(r"-(?=-)", "- ", _one_line(cam.describe())) + " "))
    _joint(robot, f"cellcal_{cam.parent}_to_{cam.child}", cam.parent, cam.child, cam.T)
    notes = [*head, _CONVENTION, f"Not in this tree (a URDF has one root): {tgt.describe()}; see {xacro_name}."]
    return _xml_text(robot, notes, refused)


def _xacro(cam: _T, tgt: _T, head: list[str], refused: bool, file_name: str) -> str:
    root = ET.Element("robot", {"xmlns:xacro": "http://www.ros.org/wiki/xacro"})
    for macro_name, it in (("cellcal_camera", cam), ("cellcal_calibration_target", tgt)):
        root.append(ET.Comment(" " + re.sub(r"-(?=-)", "- ", _one_line(it.describe())) + " "))
        m = ET.SubElement(root, "xacro:macro", {"name": macro_name,
                                                "params": f"parent:={it.parent} child:={it.child} add_child_link:=true"})
        cond = ET.SubElement(m, "xacro:if", {"value": "${add_child_link}"})
        ET.SubElement(cond, "link", {"name": "${child}"})
        _joint(m, "cellcal_${parent}_to_${child}", "${parent}", "${child}", it.T)
    usage = f'Use: <xacro:include filename="{file_name}"/> then <xacro:cellcal_camera parent="{cam.parent}"/>'
    return _xml_text(root, [*head, _CONVENTION, usage], refused)


def _yaml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _easy_handeye(setup: str, cam: _T, tgt: _T, head: list[str], why: str | None, base: str, flange: str) -> str:
    t, q = cam.xyz_q
    lines = [f"# {h}" for h in head]
    if why is not None:  # the first key, right under the mark
        lines.insert(1, f"GATES_FAILED: {_yaml_str(head[0])}")
    lines += [f"# easy_handeye2's calibration file: the camera (tracking_base_frame) in the "
              f"{'effector' if setup == 'eye_in_hand' else 'robot base'}; the board is the tracking marker.",
              f"# {_one_line(cam.describe())}", f"# {_one_line(tgt.describe())}"]
    lines += ["parameters:", "  name: cellcal",
              f"  calibration_type: {'eye_in_hand' if setup == 'eye_in_hand' else 'eye_on_base'}",
              f"  robot_base_frame: {_yaml_str(base)}", f"  robot_effector_frame: {_yaml_str(flange)}",
              f"  tracking_base_frame: {_yaml_str(cam.child)}", f"  tracking_marker_frame: {_yaml_str(tgt.child)}",
              "  freehand_robot_movement: false", '  move_group_namespace: "/"', "  move_group: manipulator",
              "transform:", "  translation:", *(f"    {k}: {_num(v)}" for k, v in zip("xyz", t, strict=True)),
              "  rotation:", *(f"    {k}: {_num(v)}" for k, v in zip("xyzw", (q[1], q[2], q[3], q[0]), strict=True))]
    return "\n".join(lines) + "\n"


def _moveit_py(setup: str, cam: _T, head: list[str], refused: bool) -> str:
    a = ros2_static_tf_args(cam.parent, cam.child, cam.T)
    # MoveIt Calibration's order: the frame ids first, then x y z qx qy qz qw.
    ordered = a[-4:] + a[:-4]
    args = "\n".join(f"                {v!r}," for v in ordered)
    label = "EYE-IN-HAND" if setup == "eye_in_hand" else "EYE-TO-HAND"
    stop = f"raise SystemExit({head[0]!r})\n" if refused else ""
    return ("".join(f"# {h}\n" for h in head) + stop
            + '""" Static transform publisher acquired via MoveIt 2 hand-eye calibration (format), computed by cellcal """\n'
            f'""" {label}: {cam.parent} -> {cam.child} """\n'
            f"# {_one_line(cam.describe())}\n"
            "from launch import LaunchDescription\n"
            "from launch_ros.actions import Node\n\n\n"
            "def generate_launch_description() -> LaunchDescription:\n"
            "    nodes = [\n"
            "        Node(\n"
            '            package="tf2_ros",\n'
            '            executable="static_transform_publisher",\n'
            '            output="log",\n'
            "            arguments=[\n"
            f"{args}\n"
            "            ],\n"
            "        ),\n"
            "    ]\n"
            "    return LaunchDescription(nodes)\n")


def _moveit_launch(cam: _T, head: list[str], refused: bool) -> str:
    t, q = cam.xyz_q
    o = _origin(cam.T)
    root = ET.Element("launch")
    root.append(ET.Comment(" The rpy below is the URDF's: radians about fixed axes X then Y then Z. "))
    root.append(ET.Comment(f' xyz="{o["xyz"]}" rpy="{o["rpy"]}" '))
    root.append(ET.Comment(" " + re.sub(r"-(?=-)", "- ", _one_line(cam.describe())) + " "))
    holder = ET.SubElement(root, "group", {"if": "false"}) if refused else root
    args = " ".join([*(_num(v) for v in t), *(_num(v) for v in (q[1], q[2], q[3], q[0])), cam.parent, cam.child])
    name = re.sub(r"[^A-Za-z0-9_]", "_", f"{cam.child}_broadcaster")
    ET.SubElement(holder, "node", {"pkg": "tf2_ros", "type": "static_transform_publisher", "name": name, "args": args})
    return _xml_text(root, head, refused)


def hand_eye_export_texts(setup: str, transforms: Mapping[str, object],
                          covariances: Mapping[str, object] | None, result_id: int | None,
                          refused: str | None, *, frames: ExportNames = None) -> dict[str, str]:
    """The export files of a camera hand-eye result (module docstring).

    Parameters
    ----------
    setup : {"eye_in_hand", "eye_to_hand"}
        Or the run kind ``"hand_eye"`` (eye-in-hand: the same transforms).
    transforms : mapping of str to array_like, shape (4, 4)
        ``flange_T_camera`` and ``base_T_target`` (eye-in-hand) or ``base_T_camera`` and
        ``flange_T_target`` (eye-to-hand), metres: arrays, nested or flat (row-major) lists,
        or the wire's transform objects (a stored body's ``transforms`` as it is: each
        ``{"matrix": [16 numbers], ...}``). Other names are ignored.
    covariances : mapping of str to array_like, shape (6, 6), or None
        Each transform's covariance, right perturbation ``(rho, phi)`` (ADR 0004), in the same
        forms (a body's ``uncertainty["covariance"]`` as it is: ``{"shape", "values"}``): only
        its diagonal is used (the 1-sigma comments). A name without one says "not given".
    result_id : int or None
        The stored result's id (in the file names and headers); None for an offline solve.
    refused : str or None
        None: the result passed its gates (or has none: offline). Otherwise the reasons in one
        line (``"; ".join(cellcal.daemon.gates.gates_failed(body))``; ``""`` for none given):
        every file is marked and disarmed (module docstring).
    frames : cellcal.daemon.config.Export, mapping or None
        Exported frame names (``cellcal.daemon.report.exports.frame_names``).

    Returns
    -------
    dict of str to str
        File name (:func:`hand_eye_file_names`) -> its text.

    Raises
    ------
    ValueError
        An unknown setup, a transform missing or not rigid, a non-finite covariance, or a
        frame name with whitespace.
    """
    setup = _ALIASES.get(setup, setup)
    if setup not in TRANSFORM_NAMES:
        raise ValueError(f"setup must be one of {', '.join(HAND_EYE_SETUPS)}, got {setup!r}")
    cam, tgt = _inputs(setup, transforms, covariances, frames)
    names = frame_names(frames)
    why = None if refused is None else _one_line(str(refused)).strip()
    head = _header(setup, result_id, why)
    files = hand_eye_file_names(result_id)
    is_refused = why is not None
    texts = {
        "launch": _ros2_launch(setup, (cam, tgt), head, is_refused),
        "urdf": _urdf(cam, tgt, head, is_refused, files["xacro"]),
        "xacro": _xacro(cam, tgt, head, is_refused, files["xacro"]),
        "easy_handeye": _easy_handeye(setup, cam, tgt, head, why, names["base"], names["flange"]),
        "moveit_launch_py": _moveit_py(setup, cam, head, is_refused),
        "moveit_launch": _moveit_launch(cam, head, is_refused),
    }
    assert tuple(texts) == _KEYS
    return {files[k]: texts[k] for k in _KEYS}
