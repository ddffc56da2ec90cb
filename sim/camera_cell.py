"""A simulated camera in a running cell: where it is served and the daemon's ``[camera]`` for it.

What the in-process test cell (``cellcal.testing``) and ``cellcal demo --camera`` share, so
both start the same camera the same way:

* :func:`camera_addresses`: loopback addresses for this process's cameras (GVCP's port 3956
  is fixed, so cameras side by side need addresses of their own);
* :func:`start_camera`: the scenario's camera (its ``[camera]``, else
  ``camera_device.default_camera`` of a mounting) served on the first free one;
* :func:`camera_section`: the daemon's ``[camera]`` table (TOML keys) for it: the device's
  URL, the board's target file, the view pose and pivot the simulator's truth puts the
  board at (what an integrator measures roughly with a ruler).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path

import numpy as np

from cellcal.sim.camera_device import DEFAULT_TARGET_FILE, SimCameraDevice, default_camera, start_sim_camera
from cellcal.sim.scenario import Scenario
from cellcal.sim.world import World
from cellcal.solver.se3 import se3_inverse, xyz_quat_from_transform

__all__ = ["camera_addresses", "start_camera", "camera_section", "TARGET_FILE"]

#: The default board's target file (``config/charuco-7x5.toml``, installed as ``cellcal.examples``):
#: what the default simulated camera sees.
TARGET_FILE = Path(str(resources.files("cellcal.examples").joinpath(DEFAULT_TARGET_FILE)))


def camera_addresses() -> Iterator[str]:
    """Loopback addresses for simulated cameras of this process: ``127.<80 + worker>.<pid
    derived>.<n>`` (pytest-xdist's worker number; another session's tests on the machine take
    other pids), each tried in turn by :func:`start_camera` until one binds."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    third = (os.getpid() // 7) % 200 + 20
    for last in range(2, 255):
        yield f"127.{80 + n % 100}.{third}.{last}"


def start_camera(world: World, scenario: Scenario, mounting: str, *, seed: int | None = None) -> SimCameraDevice:
    """The scenario's camera (its ``[camera]``, else a default one of ``mounting``) served on
    the first free address of :func:`camera_addresses`.

    Raises
    ------
    OSError
        Every address is taken.
    """
    config = scenario.camera if scenario.camera is not None else default_camera(scenario, mounting)
    last: OSError | None = None
    for address in camera_addresses():
        try:
            return start_sim_camera(world, config, address, seed=scenario.seed if seed is None else seed)
        except OSError as exc:  # taken by another camera: the next address
            last = exc
    raise OSError(f"no free loopback address for a simulated camera ({last})")


def _flat_toml(table: str, values: Mapping[str, object]) -> str:
    # A target table holds scalars only: a JSON string is a valid TOML basic string, and
    # TOML's booleans are JSON's.
    lines = [f"[{table}]"]
    for k, v in values.items():
        lines.append(f"{k} = {json.dumps(v) if isinstance(v, (str, bool)) else repr(v)}")
    return "\n".join(lines) + "\n"


def camera_section(url: str, mounting: str, scenario: Scenario, workdir: Path, *, n_views: int = 12) -> dict:
    """The daemon's ``[camera]`` (TOML keys) for the scenario's simulated camera at ``url``.

    The target file is the scenario camera's (its board written to ``workdir/target.toml``
    when it is not from a file; the default camera's is :data:`TARGET_FILE`); the plan's view
    pose is the robot's initial flange pose (where the simulated cell shows the board) and its
    pivot the board's centre as the truth puts it (on the flange, or where the camera on the
    flange sees it): what an integrator measures roughly with a ruler.
    """
    cam = scenario.camera if scenario.camera is not None else default_camera(scenario, mounting)
    source = Path(cam.target.source)
    if scenario.camera is None:
        target_file = TARGET_FILE  # the default camera's board
    elif cam.target.sha256 is not None and source.is_file():
        target_file = source
    else:
        target_file = Path(workdir) / "target.toml"
        table = {k: v for k, v in cam.target.to_dict().items() if k != "sha256" and v is not None}
        target_file.write_text(_flat_toml("target", table))
    truth = scenario.truth
    centre = np.array([*(0.5 * np.asarray(cam.target.size_m)), 0.0, 1.0])
    if cam.mounting == "eye_in_hand":
        assert cam.cell_T_target is not None
        pivot = (se3_inverse(truth.cell_T_base @ truth.base_T_flange) @ cam.cell_T_target @ centre)[:3]
    else:
        assert cam.flange_T_target is not None
        pivot = (cam.flange_T_target @ centre)[:3]
    xyz, q = xyz_quat_from_transform(truth.base_T_flange)
    return {
        "url": url, "target_file": str(target_file), "mounting": cam.mounting,
        "options": {"timeout_s": 2.0},
        "plan": {"n_views": int(n_views), "view_flange_xyz_mm": [float(v) * 1e3 for v in xyz],
                 "view_flange_quat_wxyz": [float(v) for v in q], "pivot_mm": [float(v) * 1e3 for v in pivot]},
    }
