"""Rendered hand-eye dataset folders for the offline tests (``cellcal solve DIR --setup ...``).

A scene of ``tests/_hand_eye_views.py`` (the camera-chain tests' generator: the true transforms
``X_EIH``/``Z_EIH``, ``X_ETH``/``Y_ETH``, robot poses with the repeatability's noise) is
rendered by the simulated camera (``cellcal.sim.camera``: shot and read noise, lens blur) and
written as the folder format of ``cellcal.daemon.cli.dataset`` by its own writer: the PNGs,
``target.toml`` (the tests' 10 x 7 ChArUco board of 25 mm squares) and ``stations.csv`` with
each view's *measured* flange pose. The truth stays with the caller: :class:`RenderedDataset`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _camera_views import SIZE, TARGET, TRUE
from _hand_eye_views import scene

from cellcal.daemon.cli.dataset import write_dataset
from cellcal.drivers.detect import import_cv2
from cellcal.sim.camera import CameraConfig, SimCamera
from cellcal.sim.world import World
from cellcal.solver.camera_model import CameraModel

#: ``target.toml`` of the tests' board (``_camera_views.TARGET``).
TARGET_TOML = """# The tests' ChArUco board (tests/_camera_views.py TARGET)
[target]
type = "charuco"
squares_x = 10
squares_y = 7
square_mm = 25.0
marker_mm = 18.0
dictionary = "DICT_5X5_100"
"""


@dataclass
class RenderedDataset:
    """A dataset folder and what made it."""

    folder: Path
    setup: str
    truth: dict  # transform name -> (4, 4), metres
    base_T_flange: np.ndarray  # (N, 4, 4) the poses written to stations.csv
    params: np.ndarray  # the true intrinsics (9,)


def render_dataset(folder: Path, setup: str, n: int, seed: int) -> RenderedDataset:
    """Render ``n`` views of ``setup`` into ``folder`` (module docstring)."""
    cv2 = import_cv2()
    sc = scene(setup, n, np.random.default_rng(seed), robot_sd=(1e-5, 1.5e-5), min_corners=54)
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4))  # base = cell
    cam = CameraModel.from_parameters(TRUE, SIZE)
    if setup == "eye_in_hand":
        cfg = CameraConfig(camera=cam, target=TARGET, mounting=setup, flange_T_camera=sc.X, cell_T_target=sc.Z)
    else:
        cfg = CameraConfig(camera=cam, target=TARGET, mounting=setup, cell_T_camera=sc.X, flange_T_target=sc.Z)
    sim = SimCamera(world, cfg, seed=seed)
    rows = []
    for i, (G_true, G) in enumerate(zip(sc.G_true, sc.G, strict=True)):
        world.set_flange(G_true)
        ok, png = cv2.imencode(".png", sim.frame().image)
        assert ok
        rows.append((f"view_{i:02d}.png", png.tobytes(), G))
    write_dataset(folder, TARGET_TOML, rows, comments=[f"rendered {setup} dataset, seed {seed}"])
    return RenderedDataset(folder, setup, sc.truth, sc.G.copy(), np.asarray(TRUE, float))
