"""The structure test runs for point targets (issue 25, item 2): its pose-linear features
are dependent for a 3-DoF measurement (a translation field already among them), and the
test now runs in the span they have instead of not at all (``structure_dof`` was (0, 0)).

On held-out arms with model error (``tests/_arms.py``), noise estimated, the same stations
measured as 6-DoF poses and as points: points are never silent (issue 25: ``model_error``
on 0 of 100 before; now every result warns ``model_error`` or ``model_error_untested``), and
noise alone warns points as rarely as poses (the design's 1 %).
"""

import numpy as np
import pytest
from _arms import trial

from cellcal.solver import calibrate_base_frame, calibrate_base_frame_points
from cellcal.solver.synthetic import base_frame_scene

pytestmark = pytest.mark.slow


def test_points_are_warned_like_poses():
    warned = {"poses": 0, "points": 0}
    flagged = {"poses": 0, "points": 0}
    dofs = []
    for k in range(40):
        t = trial("offset_wrist", 20, 6000 + k, "iso")
        rp = calibrate_base_frame(t.base_T_flange, t.cell_T_target, holdout=False)
        rq = calibrate_base_frame_points(t.base_T_flange, t.cell_T_target[:, :3, 3], holdout=False)
        warned["poses"] += any(w.code == "model_error" for w in rp.warnings)
        warned["points"] += any(w.code == "model_error" for w in rq.warnings)
        for key, r in (("poses", rp), ("points", rq)):
            flagged[key] += any(w.code in ("model_error", "model_error_untested") for w in r.warnings)
        dofs.append(rq.residual_tests.structure_dof)
    assert all(d[0] > 0 for d in dofs), dofs
    # Every result says the residuals are not noise, or that they cannot tell at a real arm's
    # size (and carries the robot term): none is silent. With 20 stations and the noise
    # estimated these arms' errors are *detected* on 20 of 40 as poses but only 4 of 40 as
    # points (half the observations, none of orientation); the rest say "untested". Declared
    # noise detects both (test_honest_uncertainty). Detection power for points with the
    # noise estimated is a known gap (ADR 0004).
    assert flagged == {"poses": 40, "points": 40}, (flagged, warned)
    assert warned["points"] >= 2 and warned["poses"] >= 15, warned


def test_noise_alone_rarely_warns_points():
    alarms = 0
    rng = np.random.default_rng(77)
    for _ in range(200):
        sc = base_frame_scene(20, rng, noise_mm=0.02)
        p = (sc.X @ sc.base_T_flange @ np.array([0.0, 0.03, 0.1, 1.0]))[:, :3] + rng.normal(scale=2e-5, size=(20, 3))
        r = calibrate_base_frame_points(sc.base_T_flange, p, holdout=False, robot_accuracy_m=0.0)
        alarms += any(w.code == "model_error" for w in r.warnings)
    assert alarms <= 5, alarms  # 1 % designed: P(6 or more of 200) = 1.6 %
