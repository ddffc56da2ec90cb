"""Result files for other tools: JSON, a URDF fixed-joint snippet, a ROS 2 static-TF command.

Every file is written atomically (DESIGN.md section 7: "a result file is always either the
old one or the new one"): the bytes go to a temporary file in the same directory, which is
fsynced, renamed over the target with ``os.replace`` (atomic on POSIX within one file
system), and then the directory is fsynced so the rename itself survives a power cut. A
reader, or a process that dies half-way, sees the complete old file or the complete new
one, never a torn mixture; a failed write leaves no temporary file behind.

Conventions at this edge (ADR 0001):

* A transform ``parent_T_child`` maps child coordinates to parent coordinates, which is
  what a URDF joint ``<origin>`` and a ROS ``static_transform_publisher`` both mean (the
  child frame's pose in the parent frame).
* URDF ``rpy`` is roll-pitch-yaw about the *fixed* parent axes, X then Y then Z:
  ``R = Rz(yaw) @ Ry(pitch) @ Rx(roll)``, radians; ``xyz`` in metres.
* The ROS 2 command uses the named arguments of Humble and newer
  (``--x --y --z --qx --qy --qz --qw --frame-id --child-frame-id``); its quaternion has
  ``qw >= 0``.
* Numbers are written with Python's ``repr`` (the shortest string that parses back to the
  same float64), so nothing is lost to formatting.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shlex
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np

from cellcal.daemon.report import transform_from_wire
from cellcal.daemon.store import StoreError, StoreFullError, StoreReadOnlyError
from cellcal.solver.se3 import check_transform, xyz_quat_from_transform

__all__ = [
    "atomic_write_bytes",
    "remove_stale_temporaries",
    "write_json_result",
    "rpy_from_matrix",
    "matrix_from_rpy",
    "urdf_fixed_joint",
    "ros2_static_tf_command",
    "write_exports",
]


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
    file (the target itself is intact); only files with cellcal's suffix are touched. Call this at start-up, before any writer runs: a
    temporary file of a writer still running would be deleted too.
    """
    removed = []
    for p in Path(directory).glob(f".*{_TMP_SUFFIX}"):
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        removed.append(p)
    return removed


def write_json_result(path: str | os.PathLike[str], result_dict: dict[str, Any]) -> Path:
    """Write a result (the wire dict, ideally with provenance) as JSON, atomically.

    NaN and infinity are refused (``ValueError``): they are not JSON and a client would
    fail on them later instead of here.
    """
    text = json.dumps(result_dict, indent=2, allow_nan=False) + "\n"
    return atomic_write_bytes(path, text.encode("utf-8"))


# --------------------------------------------------------------------------------------
# Roll, pitch, yaw


def matrix_from_rpy(roll: float, pitch: float, yaw: float) -> np.ndarray:
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


def rpy_from_matrix(R: np.ndarray) -> tuple[float, float, float]:
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
# Snippets


def _num(v: float) -> str:
    return repr(float(v))


def _frame(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name or any(c.isspace() for c in name):
        raise ValueError(f"{what} must be a non-empty frame name without whitespace, got {name!r}")
    return name


def urdf_fixed_joint(name: str, parent: str, child: str, T: np.ndarray) -> str:
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
    parent, child = _frame(parent, "parent link"), _frame(child, "child link")
    roll, pitch, yaw = rpy_from_matrix(T[:3, :3])
    joint = ET.Element("joint", {"name": name, "type": "fixed"})
    ET.SubElement(joint, "parent", {"link": parent})
    ET.SubElement(joint, "child", {"link": child})
    ET.SubElement(
        joint,
        "origin",
        {"xyz": " ".join(_num(v) for v in T[:3, 3]), "rpy": " ".join(_num(v) for v in (roll, pitch, yaw))},
    )
    ET.indent(joint, space="  ")
    return ET.tostring(joint, encoding="unicode")


def ros2_static_tf_command(parent: str, child: str, T: np.ndarray) -> str:
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
        One shell-quoted command line (Humble+ named arguments; metres; quaternion with
        ``qw >= 0``).
    """
    T = check_transform(T, f"{parent}_T_{child}")
    parent, child = _frame(parent, "frame id"), _frame(child, "child frame id")
    t, q = xyz_quat_from_transform(T)
    args = ["ros2", "run", "tf2_ros", "static_transform_publisher"]
    for flag, v in zip(("--x", "--y", "--z"), t):
        args += [flag, _num(v)]
    # Our quaternions are (w, x, y, z); ROS orders them x, y, z, w: name each, never a tuple.
    for flag, v in zip(("--qx", "--qy", "--qz", "--qw"), (q[1], q[2], q[3], q[0])):
        args += [flag, _num(v)]
    args += ["--frame-id", parent, "--child-frame-id", child]
    return shlex.join(args)


def _comment(text: str) -> str:
    # "--" may not appear inside an XML comment.
    return "<!-- " + text.replace("--", "- -") + " -->"


def _exportable(result_dict: dict[str, Any]) -> list[tuple[str, str, np.ndarray]]:
    """``(parent, child, parent_T_child)`` for every transform and point in a wire result."""
    out: list[tuple[str, str, np.ndarray]] = []
    for name, wire in (result_dict.get("transforms") or {}).items():
        parent = wire.get("parent_frame") or name.partition("_T_")[0]
        child = wire.get("child_frame") or name.partition("_T_")[2]
        out.append((parent, child, transform_from_wire(wire)))
    # A point a_p_b (e.g. the tool tip) becomes a frame b with a's orientation.
    for name, point in (result_dict.get("points") or {}).items():
        parent, sep, child = name.partition("_p_")
        if not sep:
            continue
        T = np.eye(4)
        T[:3, 3] = np.asarray(point["position_m"], dtype=float)
        out.append((point.get("frame") or parent, child, T))
    return out


def write_exports(directory: str | os.PathLike[str], result_id: int, result_dict: dict[str, Any]) -> dict[str, Path]:
    """Write the three export files of one result, each atomically.

    Files (in ``directory``, created if missing):

    ``result_<id>.json``
        ``result_dict`` as is (pass ``ResultRecord.to_export_dict()`` to include provenance).
    ``result_<id>.urdf``
        One ``<joint type="fixed">`` per transform (``cellcal_<parent>_to_<child>``) and per
        point ``a_p_b`` (translation only), as a fragment to paste inside ``<robot>``.
    ``result_<id>_static_tf.sh``
        An executable ``/bin/sh`` script starting one ``static_transform_publisher`` per
        transform in the background, then waiting.

    Parameters
    ----------
    directory : str or path-like
    result_id : int
    result_dict : dict
        Wire form: ``transforms`` (name -> wire transform) and optionally ``points``.

    Returns
    -------
    dict
        ``{"json": Path, "urdf": Path, "ros2": Path}``.
    """
    directory = Path(directory)
    if isinstance(result_id, bool) or not isinstance(result_id, (int, np.integer)):
        raise ValueError(f"result_id must be an integer, got {result_id!r}")
    result_id = int(result_id)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _export_error(exc, directory / f"result_{result_id}", "creating the directory for") from exc
    items = _exportable(result_dict)
    kind = result_dict.get("kind", "calibration")
    header = (
        f"cellcal result {result_id} ({kind}). parent_T_child: the child frame's pose in the parent frame; "
        "xyz in metres; rpy in radians about fixed axes, R = Rz(yaw) Ry(pitch) Rx(roll)."
    )
    urdf = [_comment(header), _comment("Paste inside your <robot>; links must exist there.")]
    urdf += [urdf_fixed_joint(f"cellcal_{p}_to_{c}", p, c, T) for p, c, T in items]
    sh = [
        "#!/bin/sh",
        f"# cellcal result {result_id} ({kind}): ROS 2 Humble or newer static transforms.",
        "# Each publisher runs in the background; stop them all with Ctrl-C.",
        *(ros2_static_tf_command(p, c, T) + " &" for p, c, T in items),
        "wait",
    ]
    paths = {
        "json": write_json_result(directory / f"result_{result_id}.json", result_dict),
        "urdf": atomic_write_bytes(directory / f"result_{result_id}.urdf", ("\n".join(urdf) + "\n").encode()),
        "ros2": atomic_write_bytes(
            directory / f"result_{result_id}_static_tf.sh", ("\n".join(sh) + "\n").encode(), mode=0o755
        ),
    }
    return paths
