"""CiA 402 units and synchronised moves (``cellcal.drivers.cia402_units``), and the TPDO
layout finder: pure functions, checked against hand computations and with hypothesis."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers.canopen402 import TpdoConfig, find_tpdo_layout
from cellcal.drivers.cia402_units import (
    DriveUnitObjects,
    check_joint_limits,
    decode_si_velocity,
    parse_unit_tokens,
    plan_sync_move,
    resolve_joint_units,
    to_drive_units,
)


def test_si_velocity_decoding():
    assert decode_si_velocity(0x00B44700) == 1.0
    assert decode_si_velocity(0xFDB44700) == pytest.approx(1e-3)
    assert decode_si_velocity(0xFFB44700) == pytest.approx(0.1)
    assert decode_si_velocity(0x00010300) is None  # m/s: not rpm


def test_resolve_units_counts_rpm_and_factor_group():
    u = resolve_joint_units(counts_per_rev=4096, gear_ratio=100)
    assert u.velocity_unit_counts_s == 1.0 and u.accel_unit_counts_s2 == 1.0
    assert u.rad_s_per_velocity_unit == pytest.approx(2 * math.pi / (4096 * 100))
    rpm = resolve_joint_units(counts_per_rev=4096, gear_ratio=100, drive=DriveUnitObjects(si_velocity=0x00B44700))
    assert rpm.velocity_unit_counts_s == pytest.approx(4096 / 60)
    assert rpm.rad_s_per_velocity_unit == pytest.approx(2 * math.pi / 60 / 100)  # 1 motor rpm at the joint
    assert rpm.accel_unit_counts_s2 == pytest.approx(4096 / 60)  # rpm/s
    milli = resolve_joint_units(counts_per_rev=4096, gear_ratio=1, velocity_units="rpm", velocity_factor=0.001)
    assert milli.velocity_unit_counts_s == pytest.approx(4096 / 60 * 1e-3)
    fg = resolve_joint_units(counts_per_rev=1000, gear_ratio=1, drive=DriveUnitObjects(
        position_factor=(10, 1), velocity_encoder_factor=(50, 1), acceleration_factor=(200, 1)))
    assert fg.velocity_unit_counts_s == pytest.approx(5.0) and fg.accel_unit_counts_s2 == pytest.approx(20.0)
    accel = resolve_joint_units(counts_per_rev=6000, gear_ratio=1, accel_units="rpm_per_s", accel_factor=10)
    assert accel.accel_unit_counts_s2 == pytest.approx(1000.0)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"velocity_units": "counts_per_s", "drive": DriveUnitObjects(si_velocity=0x00B44700)}, "reports 0x60A9"),
        ({"velocity_units": "rpm", "velocity_factor": 0.1, "drive": DriveUnitObjects(si_velocity=0x00B44700)},
         "velocity_factor=0.1"),
        ({"drive": DriveUnitObjects(si_velocity=0x00010300)}, "set velocity_units"),
        ({"drive": DriveUnitObjects(encoder_resolution=(8192, 1))}, "counts_per_rev=4096 but the drive counts 8192"),
        ({"velocity_factor": 2.0}, "needs an explicit velocity_units"),
    ],
)
def test_resolve_units_refuses_contradictions(kw, match):
    with pytest.raises(ValueError, match=match):
        resolve_joint_units(counts_per_rev=4096, gear_ratio=1, **kw)


def test_unit_tokens_one_or_six():
    p = parse_unit_tokens(("auto", "rpm"), 6)
    assert p("rpm") == ("rpm",) * 6
    assert p("auto,auto,rpm,auto,auto,auto")[2] == "rpm"
    with pytest.raises(ValueError, match="expected 1 or 6"):
        p("rpm,auto")
    with pytest.raises(ValueError, match="'rps'"):
        p("rps")


def test_limits_checked_against_units_and_drive_maxima():
    rpm = resolve_joint_units(counts_per_rev=4096, gear_ratio=1, velocity_units="rpm")
    with pytest.raises(ValueError, match="joint 2: the configured speed .* too coarse"):
        check_joint_limits([rpm, rpm], np.array([1.0, 0.05]), np.ones(2), np.ones(2))
    counts = resolve_joint_units(counts_per_rev=4096, gear_ratio=1)
    lim = check_joint_limits([counts, counts], np.ones(2), np.ones(2), np.ones(2), drive_max_velocity=[None, 100])
    assert lim.speed_rad_s[0] == 1.0 and lim.speed_rad_s[1] == pytest.approx(100 * 2 * math.pi / 4096)
    assert any("0x607F" in n for n in lim.notes)
    coarse = check_joint_limits([rpm], np.array([1.0]), np.array([10.0]), np.array([10.0]))
    assert any("rounded down" in n for n in coarse.notes)  # 1 rad/s is only 9.5 rpm


def test_plan_by_hand():
    # one joint: 1 rad at 1 rad/s, 2 rad/s², 1 rad/s²: t_acc 0.5, t_dec 1, cruise 1 - 0.25 - 0.5 = 0.25 rad
    p = plan_sync_move(np.array([1.0]), 1.0, 2.0, 1.0)
    assert p.t_accel_s == pytest.approx(0.5) and p.t_decel_s == pytest.approx(1.0)
    assert p.t_cruise_s == pytest.approx(0.25) and p.duration_s == pytest.approx(1.75)
    # triangle: 0.1 rad at 2 rad/s²
    t = plan_sync_move(np.array([0.1, -0.05]), 10.0, 2.0, 2.0)
    assert t.t_cruise_s == 0.0 and t.duration_s == pytest.approx(2 * math.sqrt(0.1 / 2.0))
    np.testing.assert_allclose(t.speed_rad_s / t.speed_rad_s[0], [1.0, 0.5])
    assert plan_sync_move(np.zeros(6), 1.0, 1.0, 1.0).duration_s == 0.0


def _profile_end(dist: float, v: float, a: float, d: float) -> float:
    """When a single drive's trapezoid with these parameters ends (the drive's own arithmetic)."""
    peak = min(v, math.sqrt(2 * a * d * dist / (a + d)))
    return peak / a + peak / d + max(0.0, dist - peak**2 / (2 * a) - peak**2 / (2 * d)) / peak


moves = st.lists(st.floats(-3.0, 3.0, allow_nan=False), min_size=6, max_size=6)
lims = st.lists(st.floats(0.05, 5.0), min_size=6, max_size=6)


@given(moves, lims, lims, lims)
def test_plan_never_exceeds_a_limit_and_every_joint_arrives_together(dq, v, a, d):
    dq, v, a, d = (np.array(x) for x in (dq, v, a, d))
    p = plan_sync_move(dq, v, a, d)
    assert np.all(p.speed_rad_s <= v * (1 + 1e-9))
    assert np.all(p.accel_rad_s2 <= a * (1 + 1e-9)) and np.all(p.decel_rad_s2 <= d * (1 + 1e-9))
    for j in np.flatnonzero(np.abs(dq) > 1e-6):
        end = _profile_end(abs(dq[j]), p.speed_rad_s[j], p.accel_rad_s2[j], p.decel_rad_s2[j])
        assert end == pytest.approx(p.duration_s, rel=1e-6)


@given(moves, st.floats(0.1, 5.0), st.sampled_from([1.0, 101.0]), st.booleans())
def test_rounding_to_drive_units_stays_under_the_limit(dq, vmax, gear, rpm):
    u = resolve_joint_units(counts_per_rev=131072, gear_ratio=gear, velocity_units="rpm" if rpm else "counts_per_s")
    lim = check_joint_limits([u] * 6, np.full(6, vmax), np.full(6, 2.0), np.full(6, 2.0)) if (
        vmax / u.rad_s_per_velocity_unit >= 1) else None
    if lim is None:
        return
    p = plan_sync_move(np.array(dq), lim.speed_rad_s, lim.accel_rad_s2, lim.decel_rad_s2)
    for (vu, au, du) in to_drive_units(p, [u] * 6):
        assert vu * u.rad_s_per_velocity_unit <= vmax * (1 + 1e-12)
        assert au >= 1 and du >= 1


def _cfg(number, cob, ttype, *entries):
    return TpdoConfig(number, cob, ttype, tuple(entries))


def test_tpdo_layout_finder():
    a = find_tpdo_layout([_cfg(1, 0x181, 1, 0x60410010, 0x60610008), _cfg(2, 0x281, 1, 0x60640020, 0x606C0020)])
    assert a is not None and [(u.number, u.fields) for u in a] == [
        (1, (("statusword", 0, 2, False),)), (2, (("position", 0, 4, True), ("velocity", 4, 4, True)))]
    assert a[1].decode(bytes.fromhex("feffffff10000000")) == {"position": -2, "velocity": 16}
    # a disabled TPDO, an RTR-only one and a 16-bit "position" are not used
    assert find_tpdo_layout([_cfg(1, 0x80000181, 1, 0x60640020, 0x60410010)]) is None
    assert find_tpdo_layout([_cfg(1, 0x181, 253, 0x60640020, 0x60410010)]) is None
    assert find_tpdo_layout([_cfg(1, 0x181, 1, 0x60640010, 0x60410010)]) is None
    # a synchronous TPDO is preferred over an event-driven one carrying the same objects
    b = find_tpdo_layout([_cfg(1, 0x181, 255, 0x60640020, 0x60410010), _cfg(3, 0x381, 2, 0x60410010, 0x60640020)])
    assert b is not None and [u.number for u in b] == [3] and b[0].synchronous
    assert b[0].decode(b"\x01") is None  # a short frame
