"""Motion and pairing signatures (issue 25, item 7; ADR 0004, "Capture signatures").

Stations along a smooth path of a held-out arm with model error (``tests/_arms.py``), the
noise estimated (a library caller's default), capture times and speeds given as the daemon
always has them:

* rows paired one station apart (measurement i logged with the robot pose of station i+1)
  raise ``"pairing_suspect"`` on every path, poses and points;
* a robot still moving when measured (the instrument 0.4 s late, flange speeds given) raises
  ``"motion_during_capture"`` with the lag in ms;
* neither fires on correctly paired stations at rest, in path order or shuffled.
"""

import numpy as np
import pytest
from _arms import ARMS, draw_errors, fk

from cellcal.solver import calibrate_base_frame, calibrate_base_frame_points

pytestmark = pytest.mark.slow

ARM = ARMS["spherical_wrist"]
X = np.eye(4)
X[:3, 3] = [2.0, 0.5, -0.3]
Y = np.eye(4)
Y[:3, 3] = [0.0, 0.0, 0.05]
PATHS = 20


def _path(n, rng):
    q0 = np.array([0.3, -1.0, 1.2, -0.5, 1.2, 0.3])
    q1 = q0 + rng.uniform(-0.8, 0.8, 6)
    s = np.linspace(0.0, 1.0, n)[:, None]
    return q0 + s * (q1 - q0) + 0.3 * np.sin(2 * np.pi * s * np.array([1, 2, 1.5, 3, 2.5, 1]))


def _case(case, k, points):
    rng = np.random.default_rng(4000 + k)
    n = 20
    err = draw_errors(rng)
    q = _path(n, rng)
    if case == "shuffled":
        q = q[rng.permutation(n)]
    t = 2.0 * np.arange(n)  # one station every 2 s
    G = fk(ARM, q)
    Mt = X @ fk(ARM, q, err) @ Y
    speed = np.zeros(n)
    if case == "shifted":
        Mt, G, t, speed = Mt[1:], G[:-1], t[:-1], speed[:-1]
    if case == "moving":
        dq = np.gradient(q, axis=0) / 2.0
        Mt = X @ fk(ARM, q - 0.4 * dq, err) @ Y  # measured 0.4 s before the pose the robot reports
        speed = np.linalg.norm(np.gradient(G[:, :3, 3], axis=0) / 2.0, axis=1)
    M = Mt.copy()
    M[:, :3, 3] += rng.normal(scale=2e-5, size=(len(M), 3))
    if points:
        return calibrate_base_frame_points(G, M[:, :3, 3], capture_time_s=t, capture_speed_m_s=speed, holdout=False)
    return calibrate_base_frame(G, M, capture_time_s=t, capture_speed_m_s=speed, holdout=False)


@pytest.mark.parametrize("points", [False, True], ids=["poses", "points"])
@pytest.mark.parametrize("case, pairing, motion", [("path", 0, 0), ("shuffled", 0, 0), ("shifted", PATHS, 0),
                                                   ("moving", 0, PATHS)])
def test_signatures(case, pairing, motion, points):
    codes = [[w.code for w in _case(case, k, points).warnings] for k in range(PATHS)]
    got_p = sum("pairing_suspect" in c for c in codes)
    got_m = sum("motion_during_capture" in c for c in codes)
    if pairing:
        assert got_p >= PATHS - 1, codes
    else:
        assert got_p == 0, codes
    if motion:
        assert got_m >= PATHS - 1, codes
    else:
        assert got_m <= 1, codes


def test_the_warnings_say_what_to_check():
    r = _case("shifted", 0, False)
    w = next(w for w in r.warnings if w.code == "pairing_suspect")
    assert "one station apart" in w.message and w.value < 0.5
    r = _case("moving", 0, False)
    w = next(w for w in r.warnings if w.code == "motion_during_capture")
    assert "moving" in w.message and 100.0 < w.value < 1000.0  # the 400 ms lag, roughly
