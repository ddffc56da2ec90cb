"""The child of the camera-station kill test (``tests/test_camera_store.py``).

``python _camera_store_child.py STATE_DIR RUN_ID START COUNT`` adds camera stations START,
START + 1, ... (each with an image of its own, 64-256 kB) to the run, printing ``done i``
after ``add_station`` returned (``dup i`` when the store already had it), until it is killed.
"""

from __future__ import annotations

import sys

import numpy as np
from storetest_support import make_station

from cellcal.daemon.store import DuplicateStation, Store
from cellcal.daemon.store.records import StationRecord


def camera_station(i: int) -> StationRecord:
    """Station ``i`` with a deterministic image of its own (the same bytes in every process)."""
    rng = np.random.default_rng(5000 + i)
    image = rng.integers(0, 256, int(rng.integers(64, 257)) * 1024, dtype=np.uint8).tobytes()
    st = make_station(i)
    camera = {"image_size": [64, 48], "detection": {"ids": [1, 2, 3], "image_points_px": [[1.0, 2.0]] * 3}}
    return StationRecord(**{k: getattr(st, k) for k in ("plan_index", "base_T_flange", "q_rad", "cell_T_target",
                                                         "cell_p_target", "tracker_std_translation_m",
                                                         "tracker_std_rotation_rad", "sample_count", "robot_t_device_s",
                                                         "robot_t_host_ns", "tracker_t_device_s", "tracker_t_host_ns",
                                                         "settle", "raw", "accepted_host_ns")},
                         camera=camera, image_png=image)


def main() -> None:
    state, run, start, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with Store(state) as store:
        print("ready", flush=True)
        for i in range(start, start + count):
            try:
                store.add_station(run, camera_station(i))
                print(f"done {i}", flush=True)
            except DuplicateStation:
                print(f"dup {i}", flush=True)


if __name__ == "__main__":
    main()
