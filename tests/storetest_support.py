"""Helpers for the store and export tests, and the child process of the crash test.

As a script: ``python storetest_support.py add STATE_DIR RUN_ID START PLAN_LEN`` opens the
store, prints ``ready``, then for each plan index from START prints ``begin i``, adds the
station and prints ``done i`` only after ``add_station`` returned (``dup i`` if the store
says it was already committed), and ``finished`` at the end. The parent kills it with
SIGKILL at a random moment and checks the store against what was printed.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from cellcal.daemon.store import DuplicateStation, StationRecord, Store
from cellcal.solver.se3 import make_transform, so3_exp


def make_station(plan_index: int, *, raw_bytes: int = 0) -> StationRecord:
    """A deterministic station for ``plan_index`` (same bits every call, in every process).

    ``raw_bytes`` pads the raw samples so a test can fill a small file system quickly.
    """
    rng = np.random.default_rng(1000 + plan_index)
    G = make_transform(so3_exp(rng.normal(size=3)), rng.normal(size=3))
    M = make_transform(so3_exp(rng.normal(size=3)), rng.normal(size=3) * 2.0)
    samples = rng.normal(size=(5, 7)).tolist()
    raw = {"tracker_samples": samples, "robot_q_window": rng.normal(size=(3, 6)).tolist()}
    if raw_bytes:
        raw["padding"] = "x" * raw_bytes
    return StationRecord(
        plan_index=plan_index,
        base_T_flange=G,
        q_rad=rng.uniform(-math.pi, math.pi, 6),
        cell_T_target=M,
        cell_p_target=M[:3, 3].copy(),
        tracker_std_translation_m=float(rng.uniform(1e-6, 1e-4)),
        tracker_std_rotation_rad=float(rng.uniform(1e-6, 1e-4)),
        sample_count=int(rng.integers(5, 50)),
        robot_t_device_s=float(rng.uniform(0, 1e5)),
        robot_t_host_ns=int(rng.integers(0, 2**62)),
        tracker_t_device_s=float(rng.uniform(0, 1e5)),
        tracker_t_host_ns=int(rng.integers(0, 2**62)),
        settle={"dwell_s": 0.5, "max_qd_rad_s": float(rng.uniform(0, 1e-3)), "tcp_speed_m_s": 1e-5},
        raw=raw,
        accepted_host_ns=int(rng.integers(0, 2**62)),
    )


def same_station(a: StationRecord, b: StationRecord) -> bool:
    """True when every field is bit-for-bit equal (arrays compared as bytes, floats by bits)."""
    for name in StationRecord.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                return False
        elif isinstance(x, float) or isinstance(y, float):
            if type(x) is not type(y) or np.float64(x).tobytes() != np.float64(y).tobytes():
                return False
        elif isinstance(x, dict) or isinstance(y, dict):
            # repr-based JSON text tells -0.0 from 0.0 and every float64 from its neighbours;
            # numpy values in the original become the plain numbers the store gives back.
            if _canonical(x) != _canonical(y):
                return False
        elif x != y or type(x) is not type(y):
            return False
    return True


def _canonical(obj: object) -> str:
    def default(o: object) -> object:
        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(type(o).__name__)

    return json.dumps(obj, sort_keys=True, default=default)


# ---- a small real file system ------------------------------------------------------


def _mount(*args: str) -> bool:
    if shutil.which("mount") is None:
        return False
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    return r.returncode == 0


@contextmanager
def small_tmpfs(base: Path, size_kib: int):
    """Mount a ``size_kib`` tmpfs under ``base`` and yield its path, or yield None if this
    process may not mount (not root, or a container without CAP_SYS_ADMIN)."""
    mnt = base / "smallfs"
    mnt.mkdir()
    if not _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(mnt)):
        yield None
        return
    try:
        yield mnt
    finally:
        # Lazy: a test that failed with a file still open must not leave the mount behind.
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def remount(mnt: Path, options: str) -> None:
    """``mount -o remount,<options>`` (e.g. ``ro``, ``rw``, ``size=4m``); raises on failure."""
    if not _mount("-o", f"remount,{options}", str(mnt)):
        raise RuntimeError(f"remount,{options} of {mnt} failed")


def fill_filesystem(directory: Path) -> Path:
    """Write a file until the file system under ``directory`` has no space left."""
    filler = directory / "filler.bin"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for size in (65536, 4096, 512, 1):  # big blocks first, then the last crumbs
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


# ---- the crash-test child ----------------------------------------------------------


def _child_add(state_dir: str, run_id: int, start: int, plan_len: int) -> None:
    store = Store(state_dir).open()
    print("ready", flush=True)
    for i in range(start, plan_len):
        print(f"begin {i}", flush=True)
        try:
            store.add_station(run_id, make_station(i))
        except DuplicateStation:
            print(f"dup {i}", flush=True)
        else:
            print(f"done {i}", flush=True)
    store.close()
    print("finished", flush=True)


def _child_open(state_dir: str) -> None:
    # Killed while creating and migrating a fresh database.
    with Store(state_dir) as store:
        store.create_run("base_frame", {"n": 1}, config_sha256="0" * 64, devices={})
    print("finished", flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "add":
        _child_add(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "open":
        _child_open(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {cmd!r}")
