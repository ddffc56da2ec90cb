"""Result files for other tools: JSON, a URDF, a xacro macro, ROS 2 static TF, a UR pose line.

For result ``<id>`` the directory (``<state_dir>/exports``) holds:

``result_<id>.json``
    The result as published (``get_result``), provenance, ``active`` and ``suspect`` included.
``result_<id>.urdf``
    A complete URDF: ``<robot>`` with a link per frame and a fixed joint per transform of the
    result's main tree (the tree holding ``cell_T_base``, or the hand-eye / tool estimate).
``result_<id>.xacro``
    One macro per transform (``cellcal_base``, ``cellcal_target`` ...) whose ``parent`` link is
    a parameter: ``<xacro:cellcal_base parent="world"/>`` attaches the base to a user's world.
``result_<id>_static_tf.sh``, ``result_<id>_static_tf.launch.py``
    ROS 2 ``static_transform_publisher`` command lines, and a Python launch file starting the
    same publishers.
``result_<id>_ur.script``
    URScript pose lines ``p[x, y, z, rx, ry, rz]`` (m, rotation vector in rad): a base
    feature (the cell frame in the robot's base, ``base_T_cell``), a TCP ...
``active``
    A symlink to a directory holding the active result's files under stable names
    (``result.json``, ``result.urdf`` ...), switched atomically (:func:`update_active`).
``GATES_FAILED_not_for_use/``
    The files of a result that failed its acceptance gates (:data:`REFUSED_DIR`), never beside
    the others: nothing that reads ``exports/result_<id>.urdf`` or ``exports/active/`` finds a
    refused result, and the path itself says it. Each text file's first line says
    ``GATES FAILED: not for use`` with the failed gates; the ROS 2 script and launch file exit
    before they publish, and the UR script stops (``halt``) before it defines a pose; the JSON's
    first key is ``GATES_FAILED``. A refused result cannot be activated, so nothing moves them.

A result with no transform and no point (a camera's intrinsics) has only its JSON and its
kind's own files: no frame file.

Frame names in the URDF, xacro, ROS 2 and UR files come from ``[export]``
(:class:`cellcal.daemon.config.Export`): ``cell_frame = "world"`` names the cell frame
``world`` there; the JSON keeps cellcal's names. When a result's state changes (it becomes
active, inactive or suspect) the daemon writes its files again, so ``suspect`` and ``active``
in them are always the store's. ``docs/exports.md`` is the user's guide.

Every file is written atomically ("a result file is always either the old one or the new
one"): the bytes go to a temporary file in the same directory, which is fsynced, renamed over
the target with ``os.replace`` (atomic on POSIX within one file system), and then the
directory is fsynced so the rename itself survives a power cut. A reader, or a process that
dies half-way, sees the complete old file or the complete new one, never a torn mixture; a
failed write leaves no temporary file behind.

Conventions at this edge (ADR 0001):

* A transform ``parent_T_child`` maps child coordinates to parent coordinates, which is
  what a URDF joint ``<origin>`` and a ROS ``static_transform_publisher`` both mean (the
  child frame's pose in the parent frame).
* URDF ``rpy`` is roll-pitch-yaw about the *fixed* parent axes, X then Y then Z:
  ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``, radians; ``xyz`` in metres.
* The ROS 2 command uses the named arguments of Humble and newer, in the order
  ``--x --y --z --qx --qy --qz --qw --frame-id --child-frame-id``; its quaternion has
  ``qw >= 0`` (ROS orders it x, y, z, w; cellcal's own order is w, x, y, z).
* A UR pose ``p[x, y, z, rx, ry, rz]`` is metres and a rotation vector (axis times angle,
  radians), the child frame's pose in the parent frame.
* Numbers are written with Python's ``repr`` (the shortest string that parses back to the
  same float64), so nothing is lost to formatting.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shlex
import shutil
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from cellcal.daemon import runs
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.config import Export
from cellcal.daemon.gates import gates_passed
from cellcal.daemon.report.reading import as_map
from cellcal.daemon.report.refused import REFUSED_DIR, REFUSED_MARK, mark_refused, refused_text
from cellcal.daemon.store import StoreError, StoreFullError, StoreReadOnlyError
from cellcal.solver.se3 import check_transform, se3_inverse, so3_log, xyz_quat_from_transform

if TYPE_CHECKING:
    # The stubs' name for a comment's tag (the Comment factory itself), for _comment's type.
    from xml.etree.ElementTree import _ElementCallable

__all__ = [
    "atomic_write_bytes",
    "remove_stale_temporaries",
    "write_json_result",
    "rpy_from_matrix",
    "matrix_from_rpy",
    "urdf_fixed_joint",
    "urdf_robot",
    "xacro_macros",
    "ros2_static_tf_args",
    "ros2_static_tf_command",
    "ros2_launch_file",
    "ur_pose",
    "ur_script",
    "frame_names",
    "export_file_names",
    "REFUSED_DIR",
    "REFUSED_MARK",
    "write_exports",
    "update_active",
    "sync_active",
    "active_result_id",
    "ACTIVE_NAME",
    "ExportNames",
]

#: What names the frames in the exported files: the ``[export]`` section, a mapping of
#: cellcal's frame names to exported ones (``{"cell": "world"}``), or None (cellcal's own).
ExportNames: TypeAlias = Export | Mapping[str, str] | None


# --------------------------------------------------------------------------------------
# Atomic files

# Distinctive, so clean-up after a crash never touches another tool's temporary files.
_TMP_SUFFIX = ".cellcal-tmp"


def _export_error(exc: OSError, path: Path, action: str) -> StoreError:
    where = f"export directory {path.parent}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(
            f"{where}: disk full while {action} {path.name} ({exc}); the previous file is unchanged",
            state_dir=path.parent,
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StoreReadOnlyError(
            f"{where}: read-only while {action} {path.name} ({exc}); the previous file is unchanged",
            state_dir=path.parent,
        )
    return StoreError(f"{where}: {action} {path.name} failed ({exc})", state_dir=path.parent)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some file systems cannot fsync a directory; the rename is as durable as they allow.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644) -> Path:
    """Replace ``path`` with ``data`` so readers see the old or the new file, never a torn one.

    Parameters
    ----------
    path : str or path-like
        Target file; its directory must exist.
    data : bytes
    mode : int, optional
        Permission bits of the new file (``mkstemp`` would leave 0600).

    Returns
    -------
    pathlib.Path

    Raises
    ------
    StoreFullError, StoreReadOnlyError, StoreError
        Naming the directory; the previous file (if any) is unchanged and no temporary file
        is left behind.
    """
    path = Path(path)
    directory = path.parent
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
        tmp = None
        _fsync_directory(directory)  # and the new name is on disk too
    except OSError as exc:
        raise _export_error(exc, path, "writing") from exc
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def remove_stale_temporaries(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete temporary files a killed writer left in ``directory``; return their paths.

    ``kill -9`` between ``mkstemp`` and ``os.replace`` leaves a ``.<name>.<random>.cellcal-tmp``
    file (the target itself is intact); only files with cellcal's suffix are touched. Call this
    at start-up, before any writer runs: a temporary file of a writer still running would be
    deleted too.
    """
    removed = []
    for p in Path(directory).glob(f".*{_TMP_SUFFIX}"):
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        removed.append(p)
    return removed


def write_json_result(path: str | os.PathLike[str], result_dict: Mapping[str, object]) -> Path:
    """Write a result (the wire dict, ideally with provenance) as JSON, atomically.

    NaN and infinity are refused (``ValueError``): they are not JSON and a client would
    fail on them later instead of here.
    """
    text = json.dumps(result_dict, indent=2, allow_nan=False) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


# --------------------------------------------------------------------------------------
# Roll, pitch, yaw


def matrix_from_rpy(roll: float, pitch: float, yaw: float) -> npt.NDArray[np.float64]:
    """Rotation ``Rz(yaw) @ Ry(pitch) @ Rx(roll)`` (URDF fixed-axis rpy, radians), shape (3, 3)."""
    cr, sr = math.cos(roll), math.sin(roll)
    cp, sp = math.cos(pitch), math.sin(pitch)
    cy, sy = math.cos(yaw), math.sin(yaw)
    return np.array(
        [
            [cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
            [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
            [-sp, cp * sr, cp * cr],
        ]
    )


def rpy_from_matrix(R: npt.NDArray[np.float64]) -> tuple[float, float, float]:
    """URDF ``(roll, pitch, yaw)`` of a rotation matrix, accurate at and near gimbal lock.

    The textbook ``roll = atan2(R21, R22)``, ``yaw = atan2(R10, R00)`` takes roll and yaw
    from entries scaled by ``cos(pitch)``: near pitch = +-90 deg both are rounding noise and
    their errors do not cancel, so the rebuilt matrix is wrong by far more than rounding.
    Instead yaw comes first, then ``Rz(-yaw) @ R = Ry(pitch) @ Rx(roll)`` gives roll from
    its middle row (``[0, cos r, -sin r]``, unscaled) and pitch from its first column. Near
    the lock yaw may be any value, but roll and pitch are computed *for that yaw*, so
    ``matrix_from_rpy(*rpy_from_matrix(R))`` reproduces ``R`` to rounding everywhere.

    Parameters
    ----------
    R : numpy.ndarray, shape (3, 3)
        A rotation matrix.

    Returns
    -------
    tuple of float
        ``roll`` and ``yaw`` in (-pi, pi], ``pitch`` in [-pi/2, pi/2], radians.
    """
    R = np.asarray(R, dtype=float)
    yaw = math.atan2(R[1, 0], R[0, 0])
    cy, sy = math.cos(yaw), math.sin(yaw)
    # Rows of Rz(-yaw) @ R that we need.
    cp = cy * R[0, 0] + sy * R[1, 0]  # = hypot(R00, R10) = cos(pitch) >= 0
    cr = -sy * R[0, 1] + cy * R[1, 1]
    msr = -sy * R[0, 2] + cy * R[1, 2]  # = -sin(roll)
    pitch = math.atan2(-R[2, 0], cp)
    roll = math.atan2(-msr, cr)
    return roll, pitch, yaw


# --------------------------------------------------------------------------------------
# Frames


def _num(v: float) -> str:
    return repr(float(v))


def _frame(name: object, what: str) -> str:
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"{what} must be a non-empty frame name without whitespace, got {name!r}")
    return name


#: cellcal's frame names (ADR 0001) and the ``[export]`` key that renames each.
_RENAMED = {
    "cell": "cell_frame", "base": "base_frame", "flange": "flange_frame", "target": "target_frame",
    "camera": "camera_frame", "tip": "tip_frame", "pivot": "pivot_frame",
}

#: The estimate whose tree the URDF describes, by preference: a result carries one of these.
_PRIMARY = ("cell_T_base", "flange_T_camera", "base_T_camera", "flange_p_tip")


def frame_names(export: ExportNames = None) -> dict[str, str]:
    """cellcal frame name -> exported name, from an ``[export]`` section (``None``: identity).

    Parameters
    ----------
    export : cellcal.daemon.config.Export, mapping or None
        The ``[export]`` configuration, or a mapping of cellcal names (``"cell"``) to
        exported names (``"world"``). Frames not named keep their own names.
    """
    names = {k: k for k in _RENAMED}
    if export is None:
        return names
    if isinstance(export, Mapping):
        names.update({str(k): _frame(v, f"export name of {k!r}") for k, v in export.items()})
        return names
    for ours, attr in _RENAMED.items():
        names[ours] = _frame(getattr(export, attr), f"export.{attr}")
    return names


def robot_name(export: ExportNames) -> str:
    """The URDF ``<robot name>``: ``[export] robot_name`` (``"cellcal"`` without a section)."""
    name = export.robot_name if isinstance(export, Export) else None
    return name or "cellcal"


def _base_yaw(export: ExportNames) -> float:
    if not isinstance(export, Export):
        return 0.0
    return float(export.base_frame_yaw_rad)


def _as_export(export: ExportNames) -> Export:
    """``export`` as an ``[export]`` section, for a run kind's own files
    (``RunKind.write_exports``): itself, or a section with the frame names a mapping gives
    and the defaults otherwise (cellcal's names, robot ``cellcal``, no yaw: what
    :func:`frame_names`, :func:`robot_name` and :func:`_base_yaw` read from a mapping)."""
    if isinstance(export, Export):
        return export
    n = frame_names(export)
    return Export(cell_frame=n["cell"], base_frame=n["base"], flange_frame=n["flange"], target_frame=n["target"],
                  camera_frame=n["camera"], tip_frame=n["tip"], pivot_frame=n["pivot"])


@dataclass(frozen=True, eq=False)  # compared by identity: they hold arrays
class _Item:
    """One exported transform: ``name`` as on the wire, frames as exported.

    ``T`` is ``parent_T_child`` between the exported frames (the base turned by
    ``[export] base_frame_yaw_deg``); ``T_ours`` between cellcal's (the controller's base).
    """

    name: str
    ours: tuple[str, str]  # cellcal's (parent, child)
    parent: str
    child: str
    T: npt.NDArray[np.float64]
    point: bool
    T_ours: npt.NDArray[np.float64]


def _exportable(result_dict: Mapping[str, object], names: Mapping[str, str], yaw: float = 0.0) -> list[_Item]:
    """Every transform and point of a wire result, frames renamed, the base turned by ``yaw``.

    ``yaw`` (radians) is the exported base frame E about the controller base B's z axis,
    ``B_T_E = Rz(yaw)``: ``parent_T_E = parent_T_B Rz(yaw)`` and ``E_T_child = Rz(-yaw) B_T_child``.
    """
    B_T_E = np.eye(4)
    c, s_ = math.cos(yaw), math.sin(yaw)
    B_T_E[:2, :2] = [[c, -s_], [s_, c]]
    E_T_B = B_T_E.T.copy()

    def turned(parent: str, child: str, T: npt.NDArray[np.float64], point: bool) -> npt.NDArray[np.float64]:
        if yaw == 0.0:
            return T
        if parent == "base":
            if point:  # a point keeps its frame's orientation: only its coordinates turn
                out = np.eye(4)
                out[:3, 3] = E_T_B[:3, :3] @ T[:3, 3]
                return out
            T = E_T_B @ T
        if child == "base":
            T = T @ B_T_E
        return T

    out: list[_Item] = []
    for name, wire in as_map(result_dict.get("transforms"), "transforms").items():
        w = as_map(wire, f"transforms.{name}")
        parent = _name_in(w, "parent_frame") or name.partition("_T_")[0]
        child = _name_in(w, "child_frame") or name.partition("_T_")[2]
        T = transform_from_wire(dict(w))  # a plain dict, the type transform_from_wire takes
        out.append(_Item(name, (parent, child), names.get(parent, parent), names.get(child, child),
                         turned(parent, child, T, False), False, T))
    # A point a_p_b (e.g. the tool tip) becomes a frame b with a's orientation.
    for name, point in as_map(result_dict.get("points"), "points").items():
        parent, sep, child = name.partition("_p_")
        if not sep:
            continue
        p = as_map(point, f"points.{name}")
        parent = _name_in(p, "frame") or parent
        T = np.eye(4)
        T[:3, 3] = np.asarray(p["position_m"], dtype=float)
        out.append(_Item(name, (parent, child), names.get(parent, parent), names.get(child, child),
                         turned(parent, child, T, True), True, T))
    return out


def _name_in(wire: Mapping[str, object], key: str) -> str:
    """A frame name a wire transform or point gives (``""``: none, the caller's default)."""
    v = wire.get(key)
    return v if isinstance(v, str) else ""


def _main_tree(items: list[_Item]) -> list[_Item]:
    """The items connected to the result's main estimate: one tree, as a URDF must be.

    A base-frame result also estimates the target on the flange (``flange_T_target``); the
    flange hangs off the base through the robot's own chain, which the result does not
    hold, so a URDF with both would have two roots. That one is in the xacro file instead.
    """
    if not items:
        return []
    by_name = {it.name: it for it in items}
    primary = next((by_name[n] for n in _PRIMARY if n in by_name), items[0])
    frames = {primary.parent, primary.child}
    tree = [primary]
    grown = True
    while grown:
        grown = False
        for it in items:
            if it not in tree and (it.parent in frames or it.child in frames) and it.child not in {t.child for t in tree}:
                tree.append(it)
                frames |= {it.parent, it.child}
                grown = True
    roots = {t.parent for t in tree} - {t.child for t in tree}
    return tree if len(roots) == 1 else [primary]


def _suspect_text(result_dict: Mapping[str, object]) -> str:
    if result_dict.get("suspect"):
        reason = result_dict.get("suspect_reason") or "no reason recorded"
        return f"SUSPECT: true ({reason}): re-check the cell before relying on it"
    return "suspect: false"


def _header(result_id: int, result_dict: Mapping[str, object]) -> str:
    """One line, for a comment in any of the formats: control characters (a newline in a
    suspect reason would end a shell or Python comment and start code) become spaces."""
    kind = result_dict.get("kind", "calibration")
    active = "active" if result_dict.get("active") else "not active"
    text = f"cellcal result {result_id} ({kind}, {active}; {_suspect_text(result_dict)})"
    return re.sub(r"[\x00-\x1f\x7f]+", " ", text)


# --------------------------------------------------------------------------------------
# URDF and xacro


def _comment(text: str) -> ET.Element[_ElementCallable]:
    # "--" may not appear inside an XML comment ("---" too: every dash before a dash is spaced).
    return ET.Comment(" " + re.sub(r"-(?=-)", "- ", text) + " ")


def _origin(T: npt.NDArray[np.float64]) -> dict[str, str]:
    roll, pitch, yaw = rpy_from_matrix(T[:3, :3])
    return {"xyz": " ".join(_num(v) for v in T[:3, 3]), "rpy": " ".join(_num(v) for v in (roll, pitch, yaw))}


def _joint_element(name: str, parent: str, child: str, T: npt.NDArray[np.float64]) -> ET.Element:
    joint = ET.Element("joint", {"name": name, "type": "fixed"})
    ET.SubElement(joint, "parent", {"link": parent})
    ET.SubElement(joint, "child", {"link": child})
    ET.SubElement(joint, "origin", _origin(T))
    return joint


def urdf_fixed_joint(name: str, parent: str, child: str, T: npt.NDArray[np.float64]) -> str:
    """A URDF ``<joint type="fixed">`` placing ``child`` at ``T = parent_T_child``.

    Parameters
    ----------
    name : str
        Joint name.
    parent, child : str
        Link names.
    T : numpy.ndarray, shape (4, 4)
        ``parent_T_child``, metres.

    Returns
    -------
    str
        The element, indented, with ``<origin xyz="x y z" rpy="roll pitch yaw"/>`` (metres,
        radians, fixed-axis rpy: ``R = Rz(yaw) Ry(pitch) Rx(roll)``).

    Raises
    ------
    ValueError
        ``T`` is not a rigid transform, or a name is empty.
    """
    T = check_transform(T, f"{parent}_T_{child}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"joint name must be a non-empty string, got {name!r}")
    joint = _joint_element(name, _frame(parent, "parent link"), _frame(child, "child link"), T)
    ET.indent(joint, space="  ")
    return ET.tostring(joint, encoding="unicode")


def _joint_name(parent: str, child: str) -> str:
    return f"cellcal_{parent}_to_{child}".replace("/", "_")


def _xml(root: ET.Element, comments: list[str]) -> bytes:
    ET.indent(root, space="  ")
    head = "".join(ET.tostring(_comment(c), encoding="unicode") + "\n" for c in comments)
    return ('<?xml version="1.0"?>\n' + head + ET.tostring(root, encoding="unicode") + "\n").encode()


def urdf_robot(result_id: int, result_dict: Mapping[str, object], export: ExportNames = None) -> str:
    """A complete URDF of the result's main tree: ``<robot>``, one link per frame, fixed joints.

    Parameters
    ----------
    result_id : int
    result_dict : mapping
        The wire result (``transforms``, optionally ``points``, ``kind``, ``suspect``).
    export : cellcal.daemon.config.Export, mapping or None
        Frame names (:func:`frame_names`) and ``robot_name``.

    Returns
    -------
    str
        The document. The joint ``cellcal_<parent>_to_<child>`` has ``<origin>`` =
        ``parent_T_child`` (metres; fixed-axis rpy in radians). Estimates outside the main
        tree (the target on the flange of a base-frame result) are named in a comment and
        are in the xacro file.
    """
    items = _exportable(result_dict, frame_names(export), _base_yaw(export))
    tree = _main_tree(items)
    robot = ET.Element("robot", {"name": robot_name(export)})
    links: list[str] = []
    for it in tree:
        for f in (it.parent, it.child):
            if f not in links:
                links.append(f)
    for f in links:
        ET.SubElement(robot, "link", {"name": f})
    for it in tree:
        robot.append(_comment(f"{it.name}: {it.child} in {it.parent}" + (" (a point: translation only)" if it.point else "")))
        robot.append(_joint_element(_joint_name(it.parent, it.child), it.parent, it.child, it.T))
    others = [it.name for it in items if it not in tree]
    comments = [
        _header(result_id, result_dict),
        "parent_T_child: the child frame's pose in the parent frame; xyz in metres; rpy in radians about fixed axes, "
        "R = Rz(yaw) Ry(pitch) Rx(roll).",
    ]
    if others:
        comments.append(f"Not in this tree (no robot chain joins them to it): {', '.join(others)}; "
                        f"see result_{result_id}.xacro.")
    return _xml(robot, comments).decode()


#: Children a user's robot description already has: the macro attaches them, it does not declare them.
_DESCRIBED = ("base", "flange")


def xacro_macros(result_id: int, result_dict: Mapping[str, object], export: ExportNames = None) -> str:
    """A xacro file with one macro per estimate, the parent link a parameter.

    ``<xacro:cellcal_base parent="world"/>`` puts the fixed joint ``world -> base`` (the
    calibrated ``cell_T_base``) into the including description. Each macro
    ``cellcal_<child>`` (cellcal's name of the child frame) takes

    ``parent``
        The link to attach to (default: the exported name of cellcal's parent frame).
    ``child``
        The child link (default: its exported name).
    ``add_child_link``
        Declare ``<link name="${child}"/>`` too: ``false`` for the base and flange (the
        robot description has them), ``true`` for cellcal's own frames (target, tip, camera).
    """
    items = _exportable(result_dict, frame_names(export), _base_yaw(export))
    root = ET.Element("robot", {"xmlns:xacro": "http://www.ros.org/wiki/xacro"})
    first = None
    for it in items:
        macro_name = f"cellcal_{it.ours[1]}".replace("/", "_")
        declare = "false" if it.ours[1] in _DESCRIBED else "true"
        root.append(_comment(f"{it.name}: {it.ours[1]} in {it.ours[0]}; use <xacro:{macro_name} parent=\"...\"/>"))
        macro = ET.SubElement(root, "xacro:macro", {
            "name": macro_name, "params": f"parent:={it.parent} child:={it.child} add_child_link:={declare}"})
        cond = ET.SubElement(macro, "xacro:if", {"value": "${add_child_link}"})
        ET.SubElement(cond, "link", {"name": "${child}"})
        macro.append(_joint_element("cellcal_${parent}_to_${child}", "${parent}", "${child}", it.T))
        first = first or macro_name
    usage = (f'Use: <xacro:include filename="result_{result_id}.xacro"/> then <xacro:{first} parent="world"/>'
             if first else "This result has no transform to export.")
    return _xml(root, [_header(result_id, result_dict), usage]).decode()


# --------------------------------------------------------------------------------------
# ROS 2


def ros2_static_tf_args(parent: str, child: str, T: npt.NDArray[np.float64]) -> list[str]:
    """The arguments of ``static_transform_publisher`` publishing ``parent_T_child``.

    ``--x --y --z --qx --qy --qz --qw --frame-id --child-frame-id`` (ROS 2 Humble and newer),
    metres, quaternion in ROS's x, y, z, w order with ``qw >= 0``.
    """
    T = check_transform(T, f"{parent}_T_{child}")
    parent, child = _frame(parent, "frame id"), _frame(child, "child frame id")
    t, q = xyz_quat_from_transform(T)
    args: list[str] = []
    for flag, v in zip(("--x", "--y", "--z"), t, strict=True):
        args += [flag, _num(v)]
    # Our quaternions are (w, x, y, z); ROS orders them x, y, z, w: name each, never a tuple.
    for flag, v in zip(("--qx", "--qy", "--qz", "--qw"), (q[1], q[2], q[3], q[0]), strict=True):
        args += [flag, _num(v)]
    return args + ["--frame-id", parent, "--child-frame-id", child]


def ros2_static_tf_command(parent: str, child: str, T: npt.NDArray[np.float64]) -> str:
    """The ``ros2 run tf2_ros static_transform_publisher`` line publishing ``parent_T_child``.

    Parameters
    ----------
    parent, child : str
        ``--frame-id`` and ``--child-frame-id``.
    T : numpy.ndarray, shape (4, 4)
        ``parent_T_child``, metres.

    Returns
    -------
    str
        One shell-quoted command line (:func:`ros2_static_tf_args`).
    """
    return shlex.join(["ros2", "run", "tf2_ros", "static_transform_publisher", *ros2_static_tf_args(parent, child, T)])


def _ros2_script(result_id: int, result_dict: Mapping[str, object], items: list[_Item]) -> str:
    lines = [
        "#!/bin/sh",
        f"# {_header(result_id, result_dict)}: ROS 2 Humble or newer static transforms.",
        "# Each publisher runs in the background; stop them all with Ctrl-C.",
        "# Older ROS 2 (Foxy, Galactic) take the positional form: x y z qx qy qz qw frame_id child_frame_id.",
    ]
    for it in items:
        lines.append(f"# {it.name}: {it.child} in {it.parent}")
        lines.append(ros2_static_tf_command(it.parent, it.child, it.T) + " &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def ros2_launch_file(result_id: int, result_dict: Mapping[str, object], export: ExportNames = None) -> str:
    """A ROS 2 Python launch file starting one ``static_transform_publisher`` per estimate.

    The same arguments as the ``_static_tf.sh`` script (:func:`ros2_static_tf_args`), as
    ``launch_ros.actions.Node`` actions: ``ros2 launch ./result_<id>_static_tf.launch.py``.
    """
    items = _exportable(result_dict, frame_names(export), _base_yaw(export))
    nodes = []
    for it in items:
        node_name = re.sub(r"[^A-Za-z0-9_]", "_", _joint_name(it.parent, it.child))
        a = ros2_static_tf_args(it.parent, it.child, it.T)
        # One flag and its value per line: x y z qx qy qz qw, then the frame ids.
        args = "\n".join(f"                {a[i]!r}, {a[i + 1]!r}," for i in range(0, len(a), 2))
        nodes.append(
            f"        # {it.name}: {it.child} in {it.parent}\n"
            "        Node(\n"
            '            package="tf2_ros",\n'
            '            executable="static_transform_publisher",\n'
            f"            name={node_name!r},\n"
            "            arguments=[\n"
            f"{args}\n"
            "            ],\n"
            "        ),\n"
        )
    return (
        f"# {_header(result_id, result_dict)}\n"
        '"""ROS 2 static transforms of a cellcal result: ros2 launch <this file>.\n\n'
        "Translations in metres; quaternions in ROS's x, y, z, w order.\n"
        '"""\n\n'
        "from launch import LaunchDescription\n"
        "from launch_ros.actions import Node\n\n\n"
        "def generate_launch_description():\n"
        "    return LaunchDescription([\n"
        + "".join(nodes)
        + "    ])\n"
    )


# --------------------------------------------------------------------------------------
# Universal Robots


def ur_pose(T: npt.NDArray[np.float64]) -> str:
    """``p[x, y, z, rx, ry, rz]`` of ``parent_T_child``: metres and a rotation vector in radians.

    Parameters
    ----------
    T : numpy.ndarray, shape (4, 4)

    Returns
    -------
    str
        A URScript pose literal (the child's pose in the parent frame).
    """
    T = check_transform(T, "pose")
    rv = so3_log(T[:3, :3])
    return "p[" + ", ".join(_num(v) for v in (*T[:3, 3], *rv)) + "]"


def _identifier(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


def ur_script(result_id: int, result_dict: Mapping[str, object], export: ExportNames = None) -> str:
    """URScript pose lines for a UR controller, each with what it is and where it goes.

    * ``cell_T_base`` gives a **base feature**: the cell frame in the robot base,
      ``base_T_cell = inverse(cell_T_base)``; on the pendant a feature defined by this pose
      (Installation > Features) lets a program taught in cell coordinates run.
    * Any other estimate whose parent is the base (``base_T_camera``, ``base_p_pivot``) is a
      base feature as it is.
    * An estimate whose parent is the flange (``flange_p_tip``, ``flange_T_target``) is a TCP
      (``set_tcp``, or the TCP tab), in the tool flange frame.

    The poses are in the controller's own frames: ``[export] base_frame_yaw_deg`` (a ROS
    description's base link) does not apply here.
    """
    names = frame_names(export)
    items = _exportable(result_dict, names)
    lines = [
        f"# {_header(result_id, result_dict)}",
        "# p[x, y, z, rx, ry, rz]: metres and a rotation vector (axis times angle) in radians.",
    ]
    for it in items:
        parent, child = it.ours
        if (parent, child) == ("cell", "base"):
            lines += [f"# base feature: {it.parent} (cell) in the robot base {it.child}, base_T_cell = inverse(cell_T_base)",
                      f"cellcal_{_identifier(it.parent)} = {ur_pose(se3_inverse(it.T_ours))}"]
        elif parent == "base":
            lines += [f"# base feature: {it.name} ({it.child} in the robot base)",
                      f"cellcal_{_identifier(it.child)} = {ur_pose(it.T_ours)}"]
        elif parent == "flange":
            lines += [f"# TCP: {it.name} ({it.child} in the tool flange); set_tcp(cellcal_{_identifier(it.child)})",
                      f"cellcal_{_identifier(it.child)} = {ur_pose(it.T_ours)}"]
        else:
            lines.append(f"# {it.name}: not a UR base feature or TCP (parent frame {parent!r})")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------
# Files


def export_file_names(result_id: int) -> dict[str, str]:
    """File name of each export of a result, by key (the keys :func:`write_exports` returns)."""
    r = f"result_{int(result_id)}"
    return {
        "json": f"{r}.json",
        "urdf": f"{r}.urdf",
        "xacro": f"{r}.xacro",
        "ros2": f"{r}_static_tf.sh",
        "launch": f"{r}_static_tf.launch.py",
        "ur": f"{r}_ur.script",
    }


def write_exports(directory: str | os.PathLike[str], result_id: int, result_dict: Mapping[str, object],
                  export: ExportNames = None) -> dict[str, Path]:
    """Write the export files of one result, each atomically (the module docstring lists them).

    Parameters
    ----------
    directory : str or path-like
        Created if missing.
    result_id : int
    result_dict : dict
        Wire form: ``transforms`` (name -> wire transform) and optionally ``points``; the
        daemon passes the published result body (``active``, ``suspect``, provenance).
    export : cellcal.daemon.config.Export, mapping or None
        Frame names in the URDF, xacro, ROS 2 and UR files (:func:`frame_names`).

    Returns
    -------
    dict
        ``{"json", "urdf", "xacro", "ros2", "launch", "ur"}`` -> Path (only ``"json"`` for a
        result with no transform and no point, such as a camera's intrinsics) and the kind's
        own files; in ``directory / REFUSED_DIR`` for a result that failed its gates (module
        docstring).
    """
    directory = Path(directory)
    if isinstance(result_id, bool) or not isinstance(result_id, (int, np.integer)):
        raise ValueError(f"result_id must be an integer, got {result_id!r}")
    result_id = int(result_id)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _export_error(exc, directory / f"result_{result_id}", "creating the directory for") from exc
    refused = not gates_passed(result_dict)
    if refused:
        directory = directory / REFUSED_DIR
        try:
            directory.mkdir(exist_ok=True)
        except OSError as exc:
            raise _export_error(exc, directory / f"result_{result_id}", "creating the directory for") from exc
    items = _exportable(result_dict, frame_names(export), _base_yaw(export))
    files = export_file_names(result_id)
    # A result with no frame (a camera's intrinsics) has nothing for a frame file to say:
    # no empty URDF or UR script that a tool could load as if it held a calibration.
    texts = {
        "urdf": urdf_robot(result_id, result_dict, export),
        "xacro": xacro_macros(result_id, result_dict, export),
        "ros2": _ros2_script(result_id, result_dict, items),
        "launch": ros2_launch_file(result_id, result_dict, export),
        "ur": ur_script(result_id, result_dict, export),
    } if items else {}
    if refused:
        texts = {k: mark_refused(k, t, result_dict) for k, t in texts.items()}
    doc = {"GATES_FAILED": refused_text(result_dict), **result_dict} if refused else result_dict
    out = {"json": write_json_result(directory / files["json"], doc)}
    for key, text in texts.items():
        # A refused result's script is not made executable: it is not for running.
        mode = 0o755 if key == "ros2" and not refused else 0o644
        out[key] = atomic_write_bytes(directory / files[key], text.encode(), mode=mode)
    # The kind's own files (a kinematics result's parameters, arm URDF, UR calibration YAML).
    out.update(runs.for_body(result_dict).write_exports(directory, result_id, result_dict, _as_export(export)))
    return out


# --------------------------------------------------------------------------------------
# The active result

#: The symlink in the export directory that names the active result's files.
ACTIVE_NAME = "active"
_ACTIVE_DIR = ".active."  # + "<id>.<random>": the directories ``active`` points to
_ACTIVE_LOCK = threading.Lock()
#: Seconds a superseded ``active`` directory is kept for readers still on their way into it ...
ACTIVE_GRACE_S = 5.0
#: ... and at most this many directories in all (switches faster than the grace).
ACTIVE_KEEP_MAX = 16


def _result_files(directory: Path, result_id: int) -> dict[str, Path]:
    """Stable name -> file, for every file of the result (ours and any written beside them).

    ``result_7.json`` -> ``result.json``, ``result_7_static_tf.sh`` -> ``result_static_tf.sh``:
    any file named ``result_<id>.*`` or ``result_<id>_*`` (the HTML report too) goes along.
    """
    prefix = f"result_{result_id}"
    out = {}
    for p in sorted(directory.iterdir()):
        rest = p.name[len(prefix):]
        if p.name.startswith(prefix) and rest[:1] in (".", "_") and p.is_file() and not p.is_symlink():
            out["result" + rest] = p
    return out


def _active_target(directory: Path) -> Path | None:
    link = directory / ACTIVE_NAME
    try:
        return directory / os.readlink(link)
    except OSError:
        return None


def active_result_id(directory: str | os.PathLike[str]) -> int | None:
    """The id of the result ``<directory>/active`` names, or None (no such link)."""
    target = _active_target(Path(directory))
    if target is None or not target.is_dir():
        return None
    m = re.fullmatch(re.escape(_ACTIVE_DIR) + r"(\d+)\..*", target.name)
    return int(m.group(1)) if m else None


def _same_files(target: Path | None, files: Mapping[str, Path]) -> bool:
    if target is None or not target.is_dir():
        return False
    try:
        have = sorted(p.name for p in target.iterdir())
        return have == sorted(files) and all(
            os.path.samestat((target / n).stat(), f.stat()) for n, f in files.items())
    except OSError:
        return False


def update_active(directory: str | os.PathLike[str], result_id: int, *, grace_s: float = ACTIVE_GRACE_S) -> Path:
    """Point ``<directory>/active`` at the files of ``result_id``, atomically.

    A new hidden directory ``.active.<id>.<random>`` gets the result's files under stable
    names (hard links to the files, which are never changed in place, only replaced; a copy
    where the file system has no hard links), and is fsynced; then a symlink to it is
    renamed over ``active``. A reader opening ``active/result.urdf`` gets the previous
    result's complete file or the new one's, never a mixture of two results' files: the
    previous directory is kept, and older ones for ``grace_s`` after they were superseded
    (a reader may still be on its way into them; at most :data:`ACTIVE_KEEP_MAX` in all).
    Nothing is done when ``active`` already names exactly these files.

    Returns
    -------
    pathlib.Path
        ``<directory>/active``.

    Raises
    ------
    StoreError
        Naming the directory; ``active`` is unchanged.
    """
    directory = Path(directory)
    result_id = int(result_id)
    link = directory / ACTIVE_NAME
    with _ACTIVE_LOCK:
        files = _result_files(directory, result_id)
        if not files:
            raise StoreError(f"export directory {directory}: no files of result {result_id} to make active",
                             state_dir=directory)
        previous = _active_target(directory)
        if _same_files(previous, files):
            return link
        new: Path | None = None
        tmp_link: str | None = None
        try:
            new = Path(tempfile.mkdtemp(dir=directory, prefix=f"{_ACTIVE_DIR}{result_id}."))
            os.chmod(new, 0o755)
            for name, src in files.items():
                try:
                    os.link(src, new / name)
                except OSError as exc:
                    if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP):
                        raise
                    atomic_write_bytes(new / name, src.read_bytes(), mode=src.stat().st_mode & 0o777)
            _fsync_directory(new)
            tmp_link = os.path.join(directory, f".{ACTIVE_NAME}.{os.getpid()}.{threading.get_ident()}{_TMP_SUFFIX}")
            if os.path.lexists(tmp_link):
                os.unlink(tmp_link)
            os.symlink(new.name, tmp_link)
            if link.is_dir() and not link.is_symlink():
                shutil.rmtree(link)  # a plain directory left by hand: replaced by the symlink
            os.replace(tmp_link, link)
            tmp_link = None
            _fsync_directory(directory)
        except OSError as exc:
            if new is not None:
                _remove_tree(new)
            raise _export_error(exc, link, "switching") from exc
        finally:
            if tmp_link is not None and os.path.lexists(tmp_link):
                os.unlink(tmp_link)
        _prune_active(directory, {new.name, previous.name if previous is not None else ""}, grace_s)
    return link


def _prune_active(directory: Path, keep: set[str], grace_s: float) -> None:
    """Remove the ``active`` directories neither current nor previous that were superseded
    (the next one made) over ``grace_s`` ago, and all but the newest :data:`ACTIVE_KEEP_MAX`:
    a reader descheduled between resolving ``active`` and opening a file in it finds it."""
    dirs = [p for p in directory.glob(f"{_ACTIVE_DIR}*") if p.is_dir() and not p.is_symlink()]
    dirs.sort(key=lambda p: p.stat().st_mtime)
    now = time.time()  # file times are wall-clock times
    for k, old in enumerate(dirs[:-1]):
        superseded_s = now - dirs[k + 1].stat().st_mtime
        if old.name not in keep and (superseded_s >= grace_s or len(dirs) - k > ACTIVE_KEEP_MAX):
            _remove_tree(old)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def sync_active(directory: str | os.PathLike[str], active_id: Callable[[], int | None]) -> Path | None:
    """:func:`update_active` for the result ``active_id()`` names, asked under a lock.

    Two threads changing the active result (an activation while a run stores its result)
    each ask which result is active *inside* the lock, so the last switch always names the
    result that is active then. ``None`` (no active result): ``active`` is left alone.
    """
    with _SYNC_LOCK:
        rid = active_id()
        if rid is None:
            return None
        return update_active(directory, rid)


_SYNC_LOCK = threading.Lock()
