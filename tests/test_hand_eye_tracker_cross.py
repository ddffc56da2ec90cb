"""The eye-in-hand tracker check takes the cross-covariance of ``cell_T_base`` and the flange
point from the base-frame result's joint covariance on the wire (issue 27, item 3): the
block between the two estimates, found by the joint's order, for a pose and a point result;
none when the wire does not carry the joint."""

import numpy as np
from _report_kinds import _body

from cellcal.daemon.runs.hand_eye_tracker import _cross
from cellcal.solver import calibrate_base_frame, calibrate_base_frame_points, synthetic


def _block(body, a, b):
    u = body["uncertainty"]
    return _cross(u["joint"], u["covariance"], a, b)


def test_the_cross_block_is_the_joint_covariances_between_base_and_flange_point():
    s = synthetic.base_frame_scene(12, np.random.default_rng(3), noise_mm=0.05, noise_deg=0.01)
    pose = calibrate_base_frame(s.base_T_flange, s.measured)
    points = calibrate_base_frame_points(s.base_T_flange, s.measured[:, :3, 3])
    for r, name in ((pose, "flange_T_target"), (points, "flange_p_target")):
        body = _body("base_frame", r)
        order = body["uncertainty"]["joint"]["order"]
        sizes = [body["uncertainty"]["covariance"][k]["shape"][0] for k in order]
        start = dict(zip(order, np.cumsum([0, *sizes[:-1]]), strict=True))
        B = _block(body, "cell_T_base", name)
        i, j = start["cell_T_base"], start[name]
        assert B is not None and B.shape == (6, 3)
        np.testing.assert_allclose(B, np.asarray(r.covariance)[i:i + 6, j:j + 3], rtol=0, atol=1e-30)
        assert np.abs(B).max() > 0.0  # one fit: the two estimates do correlate
        u = body["uncertainty"]
        assert _cross({}, u["covariance"], "cell_T_base", name) is None
        bad = dict(u["joint"], values=u["joint"]["values"][:-1])
        assert _cross(bad, u["covariance"], "cell_T_base", name) is None
        unknown = dict(u["joint"], values=[None] * len(u["joint"]["values"]))  # NaN goes out as nil
        assert _cross(unknown, u["covariance"], "cell_T_base", name) is None
