"""The first real run an integrator makes succeeds honestly (issue 24 item 4).

``cellcal init --robot ur`` (and ``cia402``: the same ``[solve]``) writes the solve settings an
integrator starts from. On the realistic simulated cell (the demo's arm with about 0.25 mm of
kinematic error, a tracker with 0.02 mm of noise), a base-frame run with exactly those settings
gives an **active** result whose error against the hidden truth lies inside its own reported
uncertainty; the result warns ``model_error``, and ``cellcal show`` and the HTML report
recommend a kinematics run naming a command that exists. The strict gate stays one key away:
``allow_model_error = false`` refuses the same cell's result.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.report.advice import recommendations
from cellcal.testing.harness import FAST_TIME_SCALE, K_SIGMA, deviation_sigmas, inprocess_cell, transform_and_cov

pytestmark = pytest.mark.slow

#: chi-square 99.9 % point, 6 degrees of freedom (the pose's NEES).
CHI2_6_999 = 22.458
CELLCAL = [sys.executable, "-m", "cellcal.daemon.cli"]


def _init_solve(robot: str) -> dict:
    r = subprocess.run([*CELLCAL, "init", "--robot", robot], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return tomllib.loads(r.stdout)["solve"]


def test_the_init_configurations_calibrate_the_realistic_cell_honestly(tmp_path):
    solve = _init_solve("ur")
    assert _init_solve("cia402") == solve  # one solve policy for both robots
    assert solve["allow_model_error"] is True
    with inprocess_cell(tmp_path, scenario="realistic", n_stations=12, overrides={"solve": solve},
                        time_scale=FAST_TIME_SCALE) as cell:
        body = cell.wait_result(cell.svc.start_run(P.KIND_BASE_FRAME), 240)
        assert body["active"] and body["gates"]["passed"], body["gates"]
        X, C = transform_and_cov(body)
        xi, sig = deviation_sigmas(cell.world.cell_T_base(), np.zeros((6, 6)), X, C)
        nees = float(xi @ np.linalg.solve(C, xi))
        assert nees <= CHI2_6_999 and sig.max() <= K_SIGMA, (nees, sig, xi)
        assert "model_error" in {w["code"] for w in body["warnings"]}, body["warnings"]
        advice = recommendations(body)
        assert advice and "cellcal ctl start_run kind=kinematics" in advice[0], advice
        state = Path(cell.svc.cfg.service.state_dir)
        rid = body["result_id"]
        show = subprocess.run([*CELLCAL, "show", rid, "--state-dir", str(state)], capture_output=True, text=True,
                              timeout=60)
        assert show.returncode == 0 and "recommendation" in show.stdout and "kind=kinematics" in show.stdout, show
        report = (state / "exports" / f"result_{rid}_report.html").read_text()
        assert "Recommendation" in report and "kind=kinematics" in report

        # The strict gate: the same cell refused when model error is not allowed.
    strict = {**solve, "allow_model_error": False}
    with inprocess_cell(tmp_path / "strict", scenario="realistic", n_stations=12, overrides={"solve": strict},
                        time_scale=FAST_TIME_SCALE) as cell:
        run_id = cell.svc.start_run(P.KIND_BASE_FRAME)
        with pytest.raises(Exception, match="model_error") as exc:
            cell.wait_result(run_id, 240)
        assert "allow_model_error = false" in str(exc.value)
