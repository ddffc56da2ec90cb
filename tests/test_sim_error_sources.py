"""Each error source of the realistic simulator, switched on alone, changes what it should and
nothing else (robot: factory calibration, residual DH errors, parallel-axis tilt, compliance,
backlash, warm-up; tracker: beam-coordinate noise, averaging, outliers, refraction,
re-acquisition, random beam breaks).

The cell runs offline (``cellcal.sim.offline.OfflineCell``: the simulator's own world, arm
and instrument on a clock the test moves), so every figure is exact or a seeded Monte Carlo
with its band stated where it is used.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.tracker_codec import NakCode
from cellcal.sim.instrument import InstrumentModel, TrackerNoiseModel
from cellcal.sim.offline import OfflineCell
from cellcal.sim.robot_scenario import ALUMINIUM_EXPANSION_PER_K, parse_robot_table
from cellcal.sim.scenario import parse_scenario

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

Q0 = np.deg2rad([10.0, -80.0, 100.0, -110.0, -90.0, 20.0])
UR5E = dh_model("ur5e")


def scenario(robot: dict | None = None, tracker: str = "noise_mm = 0.0\nnoise_deg = 0.0\n", seed: int = 3):
    text = f"""
seed = {seed}
[time]
scale = 1.0
[truth]
cell_T_base_xyz_m = [2.5, -0.8, 0.1]
cell_T_base_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
flange_T_target_xyz_m = [0.0, 0.0, 0.05]
flange_T_target_quat_wxyz = [1.0, 0.0, 0.0, 0.0]
[tracker]
{tracker}
"""
    d = parse_scenario(text)
    table = {"ringing_amplitude_deg": 0.0, "initial_q_deg": list(np.degrees(Q0)), **(robot or {})}
    return parse_scenario({**_as_dict(text), "robot": table}) if table else d


def _as_dict(text: str) -> dict:
    import tomllib

    return tomllib.loads(text)


def settled(robot: dict, q=Q0, *, start_s: float = 0.0):
    cell = OfflineCell(scenario(robot), start_s=start_s)
    return cell, cell.station(q)


# ---- robot --------------------------------------------------------------------------------------

def test_everything_off_the_arm_is_exact():
    _, s = settled({})
    np.testing.assert_allclose(s.base_T_flange, s.true_base_T_flange, atol=1e-12)
    np.testing.assert_allclose(s.base_T_flange, UR5E.forward(Q0), atol=1e-12)


def test_factory_calibration_alone_moves_the_reported_pose_and_the_arm_together():
    factory = {"theta_delta_deg": [0, 0.1, -0.15, 0.08, 0, 0], "a_delta_mm": [0, 1.0, -0.7, 0, 0, 0]}
    _, s = settled({"factory": factory})
    # the controller believes its factory table and is right: tracker and controller agree
    np.testing.assert_allclose(s.base_T_flange, s.true_base_T_flange, atol=1e-12)
    off = np.linalg.norm(s.base_T_flange[:3, 3] - UR5E.forward(Q0)[:3, 3])
    assert 1e-3 < off < 1e-2  # millimetres from the data sheet


@pytest.mark.parametrize("residual, key", [
    ({"theta_delta_deg": [0, 0.02, 0, 0, 0, 0]}, "theta_rad"),
    ({"a_delta_mm": [0, 0.3, 0, 0, 0, 0]}, "a_m"),
    ({"d_delta_mm": [0, 0, 0, 0.2, 0, 0]}, "d_m"),
    ({"alpha_delta_deg": [0, 0, 0, 0.02, 0, 0]}, "alpha_rad"),
    ({"parallel_tilt_deg": [0.02, 0.0]}, "beta_rad"),
])
def test_one_residual_error_moves_the_true_arm_by_exactly_that_parameter(residual, key):
    _, s = settled({"residual": residual})
    delta = parse_robot_table({"residual": residual}).residual
    expected = UR5E.with_deltas(**{key: getattr(delta, key)}).forward(Q0)
    np.testing.assert_allclose(s.true_base_T_flange, expected, atol=1e-12)
    np.testing.assert_allclose(s.base_T_flange, UR5E.forward(Q0), atol=1e-12)  # the controller knows nothing
    assert np.linalg.norm(s.true_base_T_flange[:3, 3] - s.base_T_flange[:3, 3]) > 1e-5


def test_parallel_tilt_moves_the_flange_out_of_the_arm_plane():
    # joints 2-4 parallel: without the tilt the arm moves in a plane; the tilt of joint 3
    # towards joint 2 (about the link's y axis) takes the flange out of it
    _, flat = settled({})
    _, tilted = settled({"residual": {"parallel_tilt_deg": [0.05, 0.0]}})
    d = tilted.true_base_T_flange[:3, 3] - flat.true_base_T_flange[:3, 3]
    assert np.linalg.norm(d) > 1e-4


def test_compliance_alone_sags_the_arm_in_proportion_to_the_payload():
    k = [5e4, 5e4, 3e4, 1e4, 1e4, 1e4]
    sags = []
    for kg in (0.0, 1.0, 2.0):
        cell, s = settled({"compliance": {"stiffness_nm_per_rad": k, "payload_kg": kg, "payload_com_mm": [0, 0, 50]}})
        np.testing.assert_allclose(s.base_T_flange, UR5E.forward(Q0), atol=1e-12)  # encoders see nothing
        sags.append(s.true_base_T_flange[:3, 3] - s.base_T_flange[:3, 3])
        if kg:
            dq = cell.robot.sag_rad(UR5E, Q0)
            np.testing.assert_allclose(s.true_base_T_flange, UR5E.forward(Q0 + dq), atol=1e-12)
    assert np.linalg.norm(sags[0]) == 0.0
    assert 2e-5 < np.linalg.norm(sags[1]) < 5e-4
    np.testing.assert_allclose(sags[2], 2.0 * sags[1], rtol=1e-3)  # linear in the payload
    assert sags[1][2] < 0  # down, with gravity


def test_backlash_alone_settles_on_the_side_the_joint_came_from():
    b_deg = 0.01
    robot = {"backlash_deg": [b_deg] * 6}
    target = Q0.copy()
    results = {}
    for side, sign in (("from below", -1.0), ("from above", 1.0)):
        cell = OfflineCell(scenario(robot))
        cell.move(target + sign * np.deg2rad(3.0) * np.array([0, 1, 0, 0, 0, 0]))
        s = cell.station(target)
        q_out, _ = cell.robot.physical_joints(cell.now_s())
        results[side] = (s, q_out)
        np.testing.assert_allclose(s.q_rad, target, atol=1e-12)  # the encoder says: at the target
    # joint 2 trails its motor by half the play, on the side it came from; the others did not move
    half = math.radians(b_deg) / 2
    assert results["from below"][1][1] == pytest.approx(target[1] - half, abs=1e-12)
    assert results["from above"][1][1] == pytest.approx(target[1] + half, abs=1e-12)
    np.testing.assert_allclose(results["from below"][1][[0, 2, 3, 4, 5]], target[[0, 2, 3, 4, 5]], atol=1e-12)
    gap = results["from above"][0].true_base_T_flange[:3, 3] - results["from below"][0].true_base_T_flange[:3, 3]
    q_hi, q_lo = target.copy(), target.copy()
    q_hi[1] += half
    q_lo[1] -= half
    np.testing.assert_allclose(gap, UR5E.forward(q_hi)[:3, 3] - UR5E.forward(q_lo)[:3, 3], atol=1e-12)
    assert np.linalg.norm(gap) > 5e-5  # ~0.1 mm at this reach


def test_backlash_play_is_taken_up_before_the_output_moves():
    cell = OfflineCell(scenario({"backlash_deg": [0.0, 0.02, 0, 0, 0, 0]}))
    cell.move(Q0 - np.deg2rad([0, 1, 0, 0, 0, 0]))  # moving down: the output trails half the play above
    q_before, _ = cell.robot.physical_joints(cell.now_s())
    assert q_before[1] == pytest.approx(Q0[1] - math.radians(1.0) + math.radians(0.01), abs=1e-12)
    cell.robot.command_joints(Q0 - np.deg2rad([0, 0.995, 0, 0, 0, 0]))  # turn back by less than the play
    cell.advance(5.0)
    q_after, _ = cell.robot.physical_joints(cell.now_s())
    assert q_after[1] == pytest.approx(q_before[1], abs=1e-15)  # inside the play: the load stays put


def test_warm_up_alone_stretches_the_links_and_drifts_the_zeros_on_its_curve():
    th = {"initial_rise_k": 2.0, "final_rise_k": 8.0, "time_constant_s": 600.0, "zero_drift_deg_per_k": [0, 0.001, 0, 0, 0, 0]}
    for t in (0.0, 600.0, 6000.0):
        cell, s = settled({"thermal": th}, start_s=t)
        rise = 8.0 - 6.0 * math.exp(-cell.now_s() / 600.0)
        model = UR5E.scaled_lengths(1 + ALUMINIUM_EXPANSION_PER_K * rise).with_joint_offsets(
            np.deg2rad([0, 0.001 * rise, 0, 0, 0, 0]))
        np.testing.assert_allclose(s.true_base_T_flange, model.forward(Q0), atol=1e-12)
        np.testing.assert_allclose(s.base_T_flange, UR5E.forward(Q0), atol=1e-12)
    # an hour later the arm is longer by alpha * (rise change) of its reach
    early, late = settled({"thermal": th})[1], settled({"thermal": th}, start_s=3600.0)[1]
    grow = np.linalg.norm(late.true_base_T_flange[:3, 3]) - np.linalg.norm(early.true_base_T_flange[:3, 3])
    assert grow > 0


def test_reported_joints_carry_encoder_noise_only_when_asked():
    _, s = settled({"encoder_noise_deg": 0.0})
    np.testing.assert_allclose(s.q_rad, Q0, atol=1e-15)


# ---- tracker --------------------------------------------------------------------------------------

BEAM = ("radial_noise_um = 5.0\nradial_noise_um_per_m = 0.0\ntransverse_noise_um = 20.0\n"
        "transverse_noise_um_per_m = 0.0\nnoise_deg = 0.0\n")


def _instrument(tracker: str, seed: int = 5):
    sc = scenario({}, tracker=tracker, seed=seed)
    cell = OfflineCell(sc)
    cell.station(Q0)
    return cell, InstrumentModel(cell.world, sc.tracker, seed=seed)


def test_beam_noise_is_anisotropic_along_the_beam_and_its_std_is_reported():
    cell, inst = _instrument(BEAM)
    t = cell.now_s()
    p = cell.world.cell_T_target(t)[:3, 3]
    u = p / np.linalg.norm(p)
    d = np.array([inst.measure(t, 1).xyz_m - p for _ in range(4000)])
    radial = d @ u
    transverse = d - np.outer(radial, u)
    # 4000 draws: a sample std within 5 % of the truth (its relative sd is 1.1 %)
    assert np.std(radial) == pytest.approx(5e-6, rel=0.05)
    assert np.sqrt(np.mean(np.sum(transverse**2, axis=1)) / 2) == pytest.approx(20e-6, rel=0.05)
    m = inst.measure(t, 1)
    expect = TrackerNoiseModel(radial_std_m=5e-6, transverse_std_m=20e-6).point_covariance(p)[0]
    np.testing.assert_allclose(m.cov_m2, expect, rtol=1e-12)
    np.testing.assert_allclose(m.std_m, np.sqrt(np.diag(expect)), rtol=1e-12)
    np.testing.assert_allclose(np.std(d, axis=0), m.std_m, rtol=0.06)  # what it reports is what it does


def test_noise_grows_with_range_per_metre():
    noise = TrackerNoiseModel(radial_std_m=10e-6, radial_std_per_m=0.3e-6, transverse_std_m=15e-6,
                              transverse_std_per_m=6e-6)
    r, t = noise.stds([[3.0, 0, 0], [10.0, 0, 0]])
    np.testing.assert_allclose(r, [10.9e-6, 13e-6])
    np.testing.assert_allclose(t, [33e-6, 75e-6])
    m = TrackerNoiseModel.from_mpe([0, 0, 0], radial_mpe=(10e-6, 0.3e-6), transverse_mpe=(15e-6, 6e-6))
    assert m.radial_std_m == pytest.approx(5e-6) and m.transverse_std_per_m == pytest.approx(3e-6)  # k = 2


def test_averaging_trades_time_for_noise_up_to_the_correlation_time():
    cell, inst = _instrument(BEAM + "noise_correlation_ms = 50.0\n")
    p = cell.world.cell_T_target(cell.now_s())[:3, 3]
    std = {T: inst.measure(cell.now_s(), inst.sample_count(T)).std_m for T in (0.001, 0.05, 0.2, 0.8)}
    np.testing.assert_allclose(std[0.001], std[0.05])  # within one correlation time: no gain
    np.testing.assert_allclose(std[0.2], std[0.05] / 2.0, rtol=1e-12)  # 4 independent samples
    np.testing.assert_allclose(std[0.8], std[0.05] / 4.0, rtol=1e-12)
    assert np.all(np.isfinite(p))


def test_outliers_are_occasional_gross_and_not_in_the_reported_std():
    cell, inst = _instrument(BEAM + "outlier_probability = 0.05\noutlier_mm = 1.0\n")
    t = cell.now_s()
    p = cell.world.cell_T_target(t)[:3, 3]
    ms = [inst.measure(t, 1) for _ in range(2000)]
    flagged = [m for m in ms if m.outlier]
    # binomial(2000, 0.05): 100 +- 10; 4 sigma band
    assert 60 <= len(flagged) <= 140
    assert all(np.all(m.std_m == ms[0].std_m) for m in ms)
    big = np.median([np.linalg.norm(m.xyz_m - p) for m in flagged])
    small = np.median([np.linalg.norm(m.xyz_m - p) for m in ms if not m.outlier])
    assert big > 20 * small


def test_refraction_scales_the_range_only_and_grows_with_the_air_temperature():
    cell, inst = _instrument("noise_mm = 0.0\nnoise_deg = 0.0\nair_temperature_k_per_h = 2.0\nrefraction_ppm_per_k = 1.0\n")
    cell.advance(1800.0)  # half an hour: the air is 1 K warmer
    t = cell.now_s()
    p = cell.world.cell_T_target(t)[:3, 3]
    m = inst.measure(t, 1)
    assert inst.refraction_scale(t) == pytest.approx(-1e-6 * 2.0 * t / 3600.0)
    np.testing.assert_allclose(m.xyz_m, p * (1 + inst.refraction_scale(t)), atol=1e-15)
    assert np.linalg.norm(m.xyz_m) < np.linalg.norm(p)  # warmer air: the range reads short
    np.testing.assert_allclose(m.xyz_m / np.linalg.norm(m.xyz_m), p / np.linalg.norm(p), atol=1e-15)


def test_a_beam_break_needs_reacquisition_before_measuring_again():
    tracker = ("noise_mm = 0.0\nnoise_deg = 0.0\nreacquire_s = 3.0\n"
               "[[tracker.faults]]\nkind = \"beam_break\"\nstart_s = 100.0\nduration_s = 2.0\n")
    _, inst = _instrument(tracker)
    assert inst.refusal(99.0) is None
    assert inst.refusal(101.0) is NakCode.BEAM_BROKEN and not inst.target_locked(101.0)
    assert inst.refusal(103.0) is NakCode.NO_TARGET and not inst.target_locked(103.0)  # searching
    assert inst.refusal(105.1) is None and inst.target_locked(105.1)
    assert inst.failure(95.0, 104.0, False) is NakCode.BEAM_BROKEN
    assert inst.failure(102.5, 104.0, False) is NakCode.NO_TARGET


def test_random_beam_breaks_come_at_their_rate():
    _, inst = _instrument("noise_mm = 0.0\nnoise_deg = 0.0\nbeam_breaks_per_h = 20.0\nbeam_break_s = 1.0\n")
    hours = 50
    broken = sum(inst.beam_broken(float(t)) for t in np.arange(0.0, hours * 3600.0, 0.5))
    # 1000 breaks of 1 s (Poisson, sd ~32) sampled every 0.5 s: ~2000 samples broken
    assert 1700 <= broken <= 2300
    assert inst.refusal(inst._breaks[0][0] + 0.5) is NakCode.BEAM_BROKEN


def test_pose_orientation_noise_is_the_probe_rotation_std():
    cell, inst = _instrument("noise_mm = 0.0\nnoise_deg = 0.01\n")
    t = cell.now_s()
    R = cell.world.cell_T_target(t)[:3, :3]
    from cellcal.solver.se3 import so3_log

    phis = np.array([so3_log(R.T @ inst.measure(t, 1, pose=True).cell_T_target[:3, :3]) for _ in range(3000)])
    np.testing.assert_allclose(np.std(phis, axis=0), math.radians(0.01), rtol=0.06)
    assert inst.measure(t, 1, pose=True).std_rad == pytest.approx([math.radians(0.01)] * 3)


def test_the_sim_noise_model_matches_the_solver_one_when_the_solver_has_it():
    solver = pytest.importorskip("cellcal.solver")
    if not hasattr(solver, "TrackerNoiseModel"):
        pytest.skip("cellcal.solver.TrackerNoiseModel not in this tree yet")
    kw = dict(cell_p_instrument=np.array([0.1, 0.2, 0.3]), radial_std_m=5e-6, radial_std_per_m=0.15e-6,
              transverse_std_m=7.5e-6, transverse_std_per_m=3e-6, rotation_std_rad=1e-4)
    p = np.array([[2.5, -0.8, 0.4], [1.0, 3.0, 0.2]])
    np.testing.assert_allclose(TrackerNoiseModel(**kw).point_covariance(p), solver.TrackerNoiseModel(**kw).point_covariance(p),
                               rtol=1e-12)


# ---- value faults of the instrument model (issue 24) -------------------------------------------

def _faulted(kind: str, extra: str = ""):
    tracker = (f"noise_mm = 0.01\nnoise_deg = 0.001\n[[tracker.faults]]\nkind = \"{kind}\"\nstart_s = 0.0\n"
               f"duration_s = 1e9\n{extra}")
    return _instrument(tracker)


def _stations(cell, inst, n: int):
    """Two averaging halves at each of ``n`` poses, as the daemon takes a station."""
    out = []
    for i in range(n):
        cell.move(Q0 + np.deg2rad([5.0 * (i + 1), 3.0, -4.0, 2.0, 6.0, -5.0]) * (1 if i % 2 else -1))
        t = cell.now_s()  # the world reads the arm where it is now (its flange source)
        out.append((cell.world.cell_T_target(t)[:3, 3], inst.measure(t, 50), inst.measure(t, 50)))
    return out


def test_frozen_position_repeats_the_position_bit_for_bit_while_the_std_changes():
    cell, inst = _faulted("frozen_position")
    st = _stations(cell, inst, 3)
    xyz = {m.xyz_m.tobytes() for _p, a, b in st for m in (a, b)}
    assert len(xyz) == 1  # one position, at three poses
    assert len({m.std_m.tobytes() for _p, a, b in st for m in (a, b)}) == 6  # a fresh std every time


def test_a_fixed_reflector_stays_on_one_point_with_its_noise():
    cell, inst = _faulted("fixed_reflector")
    st = _stations(cell, inst, 3)
    first = st[0][0]
    for _p_true, a, b in st:
        for m in (a, b):
            assert np.linalg.norm(m.xyz_m - first) < 0.1e-3  # stuck on the first point
    assert np.linalg.norm(st[2][0] - first) > 10e-3  # while the target moved away
    assert len({m.xyz_m.tobytes() for _p, a, b in st for m in (a, b)}) == 6  # never repeated


def test_a_wrong_reflector_is_measured_on_every_second_station_both_halves_alike():
    cell, inst = _faulted("wrong_reflector", "offset_mm = 25.0\n")
    st = _stations(cell, inst, 4)
    for i, (p_true, a, b) in enumerate(st):
        for m in (a, b):
            off = m.xyz_m - p_true
            want = np.array([25e-3, 0.0, 0.0]) if i % 2 else np.zeros(3)
            assert np.linalg.norm(off - want) < 0.1e-3, (i, off)
