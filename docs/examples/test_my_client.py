"""An integrator's own test: a ZeroMQ client of cellcal against a simulated cell.

Run with ``pytest test_my_client.py`` wherever cellcal is installed (docs/testing.md).
"""

import numpy as np
import pytest


@pytest.mark.cellcal(scenario="exact", mode="process")
def test_my_client_maps_a_cell_point_into_the_robot_base(sim_cell, daemon, cellcal_client):
    run_id = cellcal_client.call("start_run", kind="base_frame")["run_id"]
    result = daemon.wait_result(run_id, timeout_s=300)
    X = np.array(result["transforms"]["cell_T_base"]["matrix"]).reshape(4, 4)
    assert np.allclose(X[:3, 3], sim_cell.cell_T_base[:3, 3], atol=1e-3)  # the truth the simulator hides
    p_cell = np.array([2.0, -0.5, 0.3])
    reply = cellcal_client.call("to_base", point_m=p_cell.tolist())
    p_base = np.linalg.inv(sim_cell.cell_T_base) @ np.append(p_cell, 1.0)
    assert reply["frame"] == "base" and np.allclose(reply["point_m"], p_base[:3], atol=1e-3)
