"""Export files: each format round-trips to the same matrix, and writes are atomic.

The URDF is parsed with xml.etree and the ROS 2 command with shlex, and the matrices are
rebuilt here from first principles (elementary rotations, the quaternion formula), not with
the module's own inverse, so a convention slip in either direction shows.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from storetest_support import fill_filesystem, remount, small_tmpfs

from cellcal.daemon.bodies import result_to_wire
from cellcal.daemon.report.exports import (
    atomic_write_bytes,
    remove_stale_temporaries,
    ros2_static_tf_command,
    rpy_from_matrix,
    urdf_fixed_joint,
    write_exports,
    write_json_result,
)
from cellcal.daemon.store import Store, StoreFullError, StoreReadOnlyError
from cellcal.solver import calibrate_base_frame, calibrate_tool_point
from cellcal.solver.se3 import make_transform, matrix_from_quat, quat_from_matrix, so3_exp
from cellcal.solver.synthetic import base_frame_scene, pivot_scene

# ---- independent references ------------------------------------------------------------


def Rx(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def Ry(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def Rz(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def urdf_matrix(xyz: str, rpy: str) -> np.ndarray:
    """URDF origin -> parent_T_child: fixed-axis roll about X, then pitch about Y, then yaw about Z."""
    r, p, y = (float(v) for v in rpy.split())
    return make_transform(Rz(y) @ Ry(p) @ Rx(r), [float(v) for v in xyz.split()])


def quat_matrix(qx, qy, qz, qw) -> np.ndarray:
    n = math.sqrt(qx * qx + qy * qy + qz * qz + qw * qw)
    x, y, z, w = qx / n, qy / n, qz / n, qw / n
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def parse_ros2(cmd: str) -> tuple[str, str, np.ndarray, dict[str, float]]:
    argv = shlex.split(cmd)
    assert argv[:4] == ["ros2", "run", "tf2_ros", "static_transform_publisher"]
    rest = argv[4:]
    assert len(rest) % 2 == 0
    args = dict(zip(rest[::2], rest[1::2], strict=True))
    assert set(args) == {"--x", "--y", "--z", "--qx", "--qy", "--qz", "--qw", "--frame-id", "--child-frame-id"}
    num = {k: float(args[f"--{k}"]) for k in ("x", "y", "z", "qx", "qy", "qz", "qw")}
    T = make_transform(quat_matrix(num["qx"], num["qy"], num["qz"], num["qw"]), [num["x"], num["y"], num["z"]])
    return args["--frame-id"], args["--child-frame-id"], T, num


def rotations(rng, n=300):
    """Random rotations plus the awkward ones: at and near pitch = +-90 deg, and 180 deg turns,
    built via a quaternion like the solver's (whose rounding breaks the textbook formula)."""
    out = [so3_exp(rng.normal(size=3) * rng.uniform(0, 3)) for _ in range(n)]
    for sign in (1.0, -1.0):
        for k in range(0, 17):
            for _ in range(3):
                pitch = sign * (math.pi / 2 - 10.0**-k * rng.uniform(-1, 1))
                R = Rz(rng.uniform(-math.pi, math.pi)) @ Ry(pitch) @ Rx(rng.uniform(-math.pi, math.pi))
                out.append(matrix_from_quat(quat_from_matrix(R)))
        out.append(Ry(sign * math.pi / 2))
    out += [np.eye(3), Rx(math.pi), Ry(math.pi), Rz(math.pi), Rz(math.pi) @ Rx(math.pi / 2)]
    return out


# ---- roll, pitch, yaw ------------------------------------------------------------------


def test_rpy_convention_on_hand_checked_rotations():
    # yaw 90 deg about the parent's Z: the child's x axis points along the parent's y.
    r, p, y = rpy_from_matrix(Rz(math.pi / 2))
    assert (r, p) == (0.0, 0.0) and y == pytest.approx(math.pi / 2, abs=1e-15)
    # Fixed-axis order: roll first, about the parent X, then pitch about the parent Y.
    R = Ry(0.2) @ Rx(0.3)
    assert np.allclose(rpy_from_matrix(R), (0.3, 0.2, 0.0), atol=1e-15)
    assert not np.allclose(rpy_from_matrix(Rx(0.3) @ Ry(0.2)), (0.3, 0.2, 0.0), atol=1e-3)
    assert np.allclose(rpy_from_matrix(Rz(-1.0) @ Ry(-0.5) @ Rx(2.5)), (2.5, -0.5, -1.0), atol=1e-14)


def test_rpy_round_trip_everywhere_including_gimbal_lock():
    rng = np.random.default_rng(0)
    worst = 0.0
    for R in rotations(rng):
        r, p, y = rpy_from_matrix(R)
        assert -math.pi <= r <= math.pi and -math.pi <= y <= math.pi and -math.pi / 2 <= p <= math.pi / 2
        worst = max(worst, float(np.max(np.abs(Rz(y) @ Ry(p) @ Rx(r) - R))))
    # A textbook atan2(R21, R22) / atan2(R10, R00) extraction is off by ~1e-4 here.
    assert worst < 2e-15, worst


# ---- URDF ------------------------------------------------------------------------------


def test_urdf_joint_parses_and_rebuilds_the_matrix():
    rng = np.random.default_rng(1)
    for i, R in enumerate(rotations(rng, 60)):
        T = make_transform(R, rng.normal(size=3) * 10.0 ** rng.integers(-6, 2))
        joint = ET.fromstring(urdf_fixed_joint(f"j{i}", "cell", "base", T))
        assert joint.tag == "joint" and joint.get("type") == "fixed" and joint.get("name") == f"j{i}"
        assert joint.find("parent").get("link") == "cell" and joint.find("child").get("link") == "base"
        origin = joint.find("origin")
        rebuilt = urdf_matrix(origin.get("xyz"), origin.get("rpy"))
        assert np.array_equal(rebuilt[:3, 3], T[:3, 3])  # repr floats: translation exact
        assert np.max(np.abs(rebuilt - T)) < 2e-15


def test_urdf_escapes_names_and_refuses_bad_input():
    T = make_transform(Rz(0.1), [1.0, 2.0, 3.0])
    joint = ET.fromstring(urdf_fixed_joint('a&b"<j>', "cell&1", "base<2>", T))
    assert joint.get("name") == 'a&b"<j>' and joint.find("parent").get("link") == "cell&1"
    assert joint.find("child").get("link") == "base<2>"
    bad = T.copy()
    bad[0, 0] = 2.0
    with pytest.raises(ValueError, match="cell_T_base: rotation is not orthonormal"):
        urdf_fixed_joint("j", "cell", "base", bad)
    with pytest.raises(ValueError, match="without whitespace"):
        urdf_fixed_joint("j", "my cell", "base", T)


# ---- ROS 2 -----------------------------------------------------------------------------


def test_ros2_command_parses_and_rebuilds_the_matrix():
    rng = np.random.default_rng(2)
    for R in rotations(rng, 60):
        T = make_transform(R, rng.normal(size=3))
        parent, child, rebuilt, num = parse_ros2(ros2_static_tf_command("cell", "base", T))
        assert (parent, child) == ("cell", "base")
        assert num["qw"] >= 0.0
        assert np.array_equal(rebuilt[:3, 3], T[:3, 3])
        assert np.max(np.abs(rebuilt - T)) < 2e-15
    # Frame ids the shell would mangle are quoted and come back intact.
    cmd = ros2_static_tf_command("cell$HOME", "tool;rm", np.eye(4))
    assert parse_ros2(cmd)[:2] == ("cell$HOME", "tool;rm")


def test_ros2_quaternion_order_is_xyzw_on_the_command_line():
    # 90 deg about z: (w, x, y, z) = (c, 0, 0, s); ROS must get --qz s and --qw c.
    _, _, _, num = parse_ros2(ros2_static_tf_command("a", "b", make_transform(Rz(math.pi / 2), [0, 0, 0])))
    c = math.sqrt(0.5)
    assert num["qz"] == pytest.approx(c, abs=1e-15) and num["qw"] == pytest.approx(c, abs=1e-15)
    assert num["qx"] == 0.0 and num["qy"] == 0.0


# ---- files -----------------------------------------------------------------------------


def _no_temporaries(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.endswith(".cellcal-tmp")]


def test_write_json_result_replaces_atomically_and_refuses_nan(tmp_path):
    p = tmp_path / "result.json"
    write_json_result(p, {"v": 1, "x": 0.1})
    assert json.loads(p.read_text()) == {"v": 1, "x": 0.1}
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    inode = p.stat().st_ino
    write_json_result(p, {"v": 2})
    assert json.loads(p.read_text()) == {"v": 2} and p.stat().st_ino != inode  # a new file, renamed
    with pytest.raises(ValueError):
        write_json_result(p, {"v": 3, "bad": float("nan")})
    assert json.loads(p.read_text()) == {"v": 2}
    assert _no_temporaries(tmp_path)


def _base_frame_result(tmp_path):
    scene = base_frame_scene(12, np.random.default_rng(5), noise_mm=0.02, noise_deg=0.01)
    res = calibrate_base_frame(scene.base_T_flange, scene.measured)
    with Store(tmp_path / "state") as store:
        run = store.create_run("base_frame", {}, config_sha256="c" * 64, devices={})
        rid = store.add_result(run, "base_frame", result_to_wire(res), {}, activate=True)
        return rid, store.get_result(rid).to_export_dict(), res


def test_write_exports_writes_files_that_round_trip(tmp_path):
    rid, doc, res = _base_frame_result(tmp_path)
    out = tmp_path / "exports"
    paths = write_exports(out, rid, doc)
    assert set(paths) == {"json", "urdf", "xacro", "ros2", "launch", "ur"} and all(p.parent == out for p in paths.values())
    assert json.loads(paths["json"].read_text()) == doc
    expected = {("cell", "base"): res.cell_T_base, ("flange", "target"): res.flange_T_target}

    # URDF: a complete <robot> of the main tree (cell -> base); the target on the flange is
    # not joined to it by any chain the result holds, so it is in the xacro file only.
    robot = ET.fromstring(paths["urdf"].read_text())
    assert robot.tag == "robot" and robot.get("name") == "cellcal"
    assert sorted(link.get("name") for link in robot.findall("link")) == ["base", "cell"]
    (joint,) = robot.findall("joint")
    assert joint.get("name") == "cellcal_cell_to_base" and joint.get("type") == "fixed"
    o = joint.find("origin")
    assert np.max(np.abs(urdf_matrix(o.get("xyz"), o.get("rpy")) - res.cell_T_base)) < 2e-15

    # ROS 2: an executable sh script, syntactically valid, one publisher per transform.
    script = paths["ros2"]
    assert os.access(script, os.X_OK)
    assert subprocess.run(["sh", "-n", str(script)], capture_output=True).returncode == 0
    cmds = [ln.removesuffix(" &") for ln in script.read_text().splitlines() if ln.startswith("ros2 ")]
    assert len(cmds) == 2
    for cmd in cmds:
        parent, child, T, _ = parse_ros2(cmd)
        assert np.max(np.abs(T - expected[(parent, child)])) < 2e-15
    assert _no_temporaries(out)


def test_a_refused_result_is_exported_apart_and_says_so_in_every_first_line(tmp_path):
    """A result that failed its gates: its files under exports/GATES_FAILED_not_for_use/, none
    beside the active ones; every first line says GATES FAILED; the scripts refuse to run."""
    from cellcal.daemon.cli.results import export_paths
    from cellcal.daemon.report.exports import REFUSED_DIR, REFUSED_MARK

    _rid, doc, res = _base_frame_result(tmp_path)
    doc = {**doc, "active": False, "gates": {"passed": False, "failed": ["rms 2.1 mm > 0.5 mm"], "checks": [
        {"name": "rms_translation", "value": 2.1e-3, "limit": 0.5e-3, "unit": "m", "passed": False,
         "message": "rms translation 2.100 mm > 0.500 mm"}]}}
    out = tmp_path / "state" / "exports"
    paths = write_exports(out, 5, doc)
    assert {p.parent for p in paths.values()} == {out / REFUSED_DIR}
    assert not list(out.glob("result_5*"))  # nothing where a loadable export is looked for
    for key, path in paths.items():
        first = path.read_text().splitlines()[1 if key == "json" else 0]  # JSON: its first key, after "{"
        assert REFUSED_MARK in first and "rms_translation: rms translation 2.100 mm" in first, (key, first)
    assert list(json.loads(paths["json"].read_text()))[0] == "GATES_FAILED"
    ET.fromstring(paths["urdf"].read_text())  # still well-formed XML, for whoever inspects it
    assert not os.access(paths["ros2"], os.X_OK)
    run = subprocess.run(["sh", str(paths["ros2"])], capture_output=True, text=True, timeout=30)
    assert run.returncode == 1 and REFUSED_MARK in run.stderr  # exits before any publisher starts
    run = subprocess.run([sys.executable, str(paths["launch"])], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and REFUSED_MARK in run.stderr and "launch" not in run.stderr.split(REFUSED_MARK)[0]
    ur = paths["ur"].read_text().splitlines()
    assert ur[1].startswith("popup(") and ur[2] == "halt" and not any(ln.startswith("cellcal_") for ln in ur[:3])
    assert sorted(export_paths(tmp_path / "state", 5)) == sorted(paths.values())  # what cellcal show lists


def test_tool_point_exports_the_tip_as_a_translation(tmp_path):
    base_T_flange, _, _ = pivot_scene(10, np.random.default_rng(6), noise_mm=0.01)
    wire = result_to_wire(calibrate_tool_point(base_T_flange))
    paths = write_exports(tmp_path, 3, wire)
    robot = ET.fromstring(paths["urdf"].read_text())
    (tip,) = [j for j in robot.findall("joint") if j.find("child").get("link") == "tip"]
    assert tip.find("parent").get("link") == "flange"
    T = urdf_matrix(tip.find("origin").get("xyz"), tip.find("origin").get("rpy"))
    assert np.array_equal(T[:3, 3], np.array(wire["points"]["flange_p_tip"]["position_m"]))
    assert np.array_equal(T[:3, :3], np.eye(3))


_WRITER = """
import sys
from cellcal.daemon.report.exports import atomic_write_bytes
path, n = sys.argv[1], int(sys.argv[2])
small = b'{"v": "small"}\\n'
big = b'{"v": "big", "pad": "' + b'x' * 2_000_000 + b'"}\\n'
print("ready", flush=True)
i = 0
while n < 0 or i < n:
    atomic_write_bytes(path, big if i % 2 else small)
    i += 1
"""


def test_a_reader_never_sees_a_torn_file(tmp_path):
    """A writer process alternates a 15-byte and a 2 MB version as fast as it can while
    this process reads: every read must be one of the two complete versions."""
    p = tmp_path / "result.json"
    p.write_text('{"v": "small"}\n')
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(p), "150"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        seen = set()
        reads = 0
        while proc.poll() is None:
            seen.add(json.loads(p.read_bytes())["v"])  # a torn file fails to parse
            reads += 1
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()
    assert seen == {"small", "big"} and reads > 20


@pytest.mark.slow  # kills writer processes at random moments
def test_kill_9_mid_write_leaves_the_old_or_the_new_file(tmp_path):
    """SIGKILL a writer at random moments: the file is always a complete version (a
    temporary may be left behind; remove_stale_temporaries clears exactly those)."""
    rng = np.random.default_rng(7)
    p = tmp_path / "result.json"
    p.write_text('{"v": "small"}\n')
    (tmp_path / ".other.tmp").write_text("not ours")
    (tmp_path / ".result.json.k1ll3d.cellcal-tmp").write_text("left by an earlier crash")
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(p), "-1"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        assert json.loads(p.read_bytes())["v"] in {"small", "big"}
    removed = remove_stale_temporaries(tmp_path)
    assert tmp_path / ".result.json.k1ll3d.cellcal-tmp" in removed
    assert all(r.name.endswith(".cellcal-tmp") for r in removed)
    assert _no_temporaries(tmp_path) and (tmp_path / ".other.tmp").exists()


def test_full_disk_export_is_typed_and_keeps_the_old_file(tmp_path):
    """Real ENOSPC when a tmpfs can be mounted: an export is written, the file system
    filled, and a bigger export must raise StoreFullError naming the directory, leave the
    old file byte for byte and no temporary. Without mount rights: a child process with
    RLIMIT_FSIZE (and SIGXFSZ ignored) gets EFBIG on the same write path, which must surface
    as a StoreError with the same guarantees."""
    big = {"v": 2, "pad": "x" * 200_000}
    with small_tmpfs(tmp_path, 512) as mnt:
        if mnt is not None:
            p = mnt / "result.json"
            write_json_result(p, {"v": 1})
            old = p.read_bytes()
            fill_filesystem(mnt)
            with pytest.raises(StoreFullError, match=rf"export directory {mnt}: disk full"):
                write_json_result(p, big)
            assert p.read_bytes() == old and _no_temporaries(mnt)
            (mnt / "filler.bin").unlink()
            write_json_result(p, big)  # fine once there is room
            assert json.loads(p.read_text()) == big
            return
    p = tmp_path / "result.json"
    write_json_result(p, {"v": 1})
    old = p.read_bytes()
    code = (
        "import resource, signal, sys\n"
        "from cellcal.daemon.report.exports import write_json_result\n"
        "from cellcal.daemon.store import StoreError\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
        "try:\n"
        "    write_json_result(sys.argv[1], {'v': 2, 'pad': 'x' * 200_000})\n"
        "except StoreError as e:\n"
        "    print('StoreError', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60)
    assert r.stdout.startswith("StoreError") and str(tmp_path) in r.stdout, r.stderr
    assert p.read_bytes() == old and _no_temporaries(tmp_path)


def test_read_only_export_directory_is_typed_and_keeps_the_old_file(tmp_path):
    """Real EROFS on a tmpfs remounted read-only when mounting is allowed; else chmod 0555
    (binds when not root); else (root without mount rights) /sys, which refuses new files
    with EACCES or EROFS. Each must raise StoreReadOnlyError naming the directory and, where
    there was an old file, leave it unchanged."""
    with small_tmpfs(tmp_path, 1024) as mnt:
        d = mnt if mnt is not None else tmp_path / "out"
        d.mkdir(exist_ok=True)
        paths = write_exports(d, 1, {"transforms": {}})
        old = paths["json"].read_bytes()
        if mnt is not None:
            remount(mnt, "ro")
        else:
            os.chmod(d, 0o555)
        try:
            if os.access(d, os.W_OK):  # root without mount rights: chmod binds nothing
                with pytest.raises(StoreReadOnlyError, match="export directory /sys"):
                    write_json_result("/sys/cellcal-result.json", {"v": 2})
            else:
                with pytest.raises(StoreReadOnlyError, match=rf"export directory {d}: read-only"):
                    write_json_result(paths["json"], {"v": 2})
                with pytest.raises(StoreReadOnlyError):
                    write_exports(d, 1, {"transforms": {}})
                assert paths["json"].read_bytes() == old
        finally:
            if mnt is not None:
                remount(mnt, "rw")
            else:
                os.chmod(d, 0o755)
        assert _no_temporaries(d)


def test_concurrent_writes_from_threads_never_tear(tmp_path):
    """Two threads replacing the same file: each write is whole (unique temporaries)."""
    p = tmp_path / "r.json"
    errors = []

    def w(tag):
        try:
            for i in range(50):
                atomic_write_bytes(p, json.dumps({"tag": tag, "i": i}).encode())
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    ts = [threading.Thread(target=w, args=(t,)) for t in "ab"]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    assert not errors and json.loads(p.read_text())["i"] == 49 and _no_temporaries(tmp_path)
