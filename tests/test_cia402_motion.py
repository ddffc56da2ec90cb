"""A CiA 402 move judged on the drives' actual positions (``cellcal.drivers.cia402_motion``),
sample by sample and without a bus: bit 10 alone never completes a move; a drive that claims
its target outside its window, a joint that stays put, and a FAULT in any statusword are
typed faults naming the node and joint."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.drivers.cia402_motion import (
    FALLBACK_WINDOW_RAD,
    FALLBACK_WINDOW_TIME_S,
    JointNotMoving,
    MoveVerificationError,
    MoveWatch,
    PositionWindow,
    TargetMismatch,
    resolve_window,
)
from cellcal.drivers.cia402_units import plan_sync_move
from cellcal.drivers.errors import DeviceError

NODES = (11, 12)
WINDOW = PositionWindow(100, 0.02, "drive")
OE, OE_REACHED, FAULT = 0x0237, 0x0637, 0x0208  # operation enabled (+ target reached), FAULT
MS = 1_000_000
ACK = 1_000 * MS


def watch(target=(10_000, 20_000), start=(0, 0), plan_s: float | None = 1.0, **kw) -> MoveWatch:
    plan = None
    if plan_s is not None:  # a symmetric triangle of plan_s seconds for the larger joint
        dq = np.array(target, float) - np.array(start, float)
        a = 4.0 * float(np.max(np.abs(dq))) / plan_s**2
        plan = plan_sync_move(dq, np.full(2, 1e12), np.full(2, a), np.full(2, a))
        assert plan.duration_s == pytest.approx(plan_s)
    kw.setdefault("mismatch_s", 0.2)
    kw.setdefault("stall_timeout_s", 0.5)
    return MoveWatch(nodes=NODES, target_counts=target, start_counts=start, windows=(WINDOW, WINDOW), plan=plan,
                     acked_ns=ACK, deg_per_count=(1e-4, 1e-4), **kw)


def feed(w: MoveWatch, t_ms: float, counts, sws=(OE, OE), commanded=(True, True)) -> bool:
    return w.update(ACK + round(t_ms * MS), counts, sws, commanded)


def test_complete_needs_the_window_for_its_time_and_bit_10():
    w = watch()
    assert not feed(w, 500, (5_000, 10_000))
    assert not feed(w, 1000, (10_050, 19_960), (OE_REACHED, OE_REACHED))  # inside, but not for 20 ms
    assert not feed(w, 1010, (10_000, 20_000), (OE_REACHED, OE))  # held 10 ms; joint 2 not reached
    assert feed(w, 1020, (9_990, 20_010), (OE_REACHED, OE_REACHED))
    assert w.complete_ns == ACK + 1020 * MS and w.error is None and w.fault is None
    assert not feed(w, 1030, (9_990, 20_101), (OE_REACHED, OE))  # leaves the window: not reached now
    r = w.report()
    assert r["complete"] and r["error_counts"] == [-10, 101] and r["held"] == [True, False]


def test_samples_from_before_the_acknowledge_never_count():
    w = watch()
    assert not w.update(ACK - 5 * MS, (10_000, 20_000), (OE_REACHED, OE_REACHED), (True, True))
    assert not w.update(ACK, (10_000, 20_000), (OE_REACHED, OE_REACHED), (True, True))
    assert w.complete_ns == 0


def test_target_reached_outside_the_window_is_a_mismatch_after_its_bound():
    w = watch()
    feed(w, 500, (5_000, 10_000))
    for t in range(1000, 1301, 10):  # joint 2 stops 3 windows short and claims its target
        assert not feed(w, t, (10_000, 19_700), (OE_REACHED, OE_REACHED))
        if w.error:
            break
    err = w.error
    assert isinstance(err, TargetMismatch) and isinstance(err, DeviceError) and err.code == "TARGET_MISMATCH"
    assert (err.node_id, err.joint, err.error_counts, err.window_counts) == (12, 2, 300, 100)
    assert "node 12 (joint 2)" in str(err) and "0.03 deg" in str(err)
    assert not feed(w, 2000, (10_000, 20_000), (OE_REACHED, OE_REACHED))  # latched: never completes now


def test_a_brief_disagreement_at_the_window_edge_is_not_a_mismatch():
    w = watch()
    feed(w, 500, (5_000, 10_000))
    for t in range(1000, 1400, 10):
        edge = 19_899 if (t // 10) % 5 == 0 else 19_950  # outside for one sample in five
        feed(w, t, (10_000, edge), (OE_REACHED, OE_REACHED))
    assert w.error is None


def test_a_joint_that_never_moves_is_named():
    w = watch()
    for t in range(0, 2001, 10):  # joint 2's position stays at its start; the drive says "moving"
        feed(w, t, (min(10_000, 10 * t), 0))
        if w.error:
            break
    err = w.error
    assert isinstance(err, JointNotMoving) and isinstance(err, MoveVerificationError)
    assert (err.node_id, err.joint, err.code) == (12, 2, "JOINT_NOT_MOVING")
    # not before the stall timeout, and not before a profile twice as slow would have moved it
    assert 0.5 <= (w.samples - 1) * 0.01 <= 1.2


def test_a_frozen_joint_whose_drive_claims_its_target_is_not_moving_rather_than_a_mismatch():
    w = watch(plan_s=0.1)
    for t in range(0, 1001, 10):
        feed(w, t, (10_000, 0), (OE_REACHED, OE_REACHED))
        if w.error:
            break
    assert isinstance(w.error, JointNotMoving) and w.error.node_id == 12


def test_a_joint_stuck_halfway_is_named_and_a_slow_one_is_not():
    stuck, slow = watch(), watch()
    assert slow.plan is not None
    for t in range(0, 3001, 10):
        s = t / 1000
        feed(stuck, t, (min(10_000, 10 * t), min(8_000, 20 * t)))
        # a drive running its profile at 0.55 of the planned rate: slow, but moving (PLAN_STRETCH is 2)
        p = slow.plan.progress(0.55 * s)
        sw = (OE_REACHED, OE_REACHED) if p == 1.0 else (OE, OE)
        feed(slow, t, (10_000 * p, 20_000 * p), sw)
    assert isinstance(stuck.error, JointNotMoving) and stuck.error.joint == 2
    assert slow.error is None and slow.complete_ns


def test_a_fault_in_any_statusword_is_latched():
    w = watch()
    feed(w, 100, (1_000, 2_000))
    w.note_statusword(11, FAULT, ACK + 150 * MS)  # one frame, never part of a published sample
    assert w.fault is not None and (w.fault.node_id, w.fault.joint, w.fault.statusword) == (11, 1, FAULT)
    assert not feed(w, 1100, (10_000, 20_000), (OE_REACHED, OE_REACHED))
    assert not feed(w, 1200, (10_000, 20_000), (OE_REACHED, OE_REACHED))
    assert w.report()["fault"] == {"node": 11, "joint": 1, "statusword": FAULT}
    w2 = watch()
    feed(w2, 100, (1_000, 2_000), (OE, 0x023F))  # FAULT REACTION ACTIVE in a sample
    assert w2.fault is not None and w2.fault.node_id == 12


def test_only_commanded_joints_decide():
    w = watch()
    feed(w, 1000, (10_000, 5), (OE_REACHED, OE), (True, False))
    assert feed(w, 1030, (10_000, 5), (OE_REACHED, OE), (True, False))
    assert not feed(w, 1040, (10_000, 5), (OE_REACHED, OE), (False, False))


def test_windows_from_the_drive_the_configuration_or_the_fallback():
    assert resolve_window(200, 20, configured_counts=-1, configured_time_ms=-1, counts_per_rad=1e5) == \
        PositionWindow(200, 0.02, "drive")
    # 0x6067 = 0xFFFFFFFF: the window function is off; missing 0x6068
    assert resolve_window(0xFFFFFFFF, None, configured_counts=50, configured_time_ms=5, counts_per_rad=1e5) == \
        PositionWindow(50, 0.005, "configured")
    fb = resolve_window(None, None, configured_counts=-1, configured_time_ms=-1, counts_per_rad=-2**20 / (2 * math.pi))
    assert fb == PositionWindow(math.floor(FALLBACK_WINDOW_RAD * 2**20 / (2 * math.pi)), FALLBACK_WINDOW_TIME_S,
                                "fallback")
    assert resolve_window(None, 10, configured_counts=-1, configured_time_ms=-1, counts_per_rad=1.0).source == \
        "fallback/drive"
    assert resolve_window(None, None, configured_counts=-1, configured_time_ms=-1, counts_per_rad=1.0).counts == 1


@given(st.floats(1e-3, 10.0), st.floats(0.01, 10.0), st.floats(0.01, 10.0), st.floats(0.01, 10.0))
def test_the_plan_progress_runs_from_0_to_1_without_going_back(dq, v, a, d):
    plan = plan_sync_move(np.array([dq, -dq / 3]), np.full(2, v), np.full(2, a), np.full(2, d))
    ts = np.linspace(-0.1, plan.duration_s * 1.1, 200)
    s = np.array([plan.progress(float(t)) for t in ts])
    assert s[0] == 0.0 and s[-1] == 1.0 and np.all(np.diff(s) >= -1e-12) and np.all((s >= 0) & (s <= 1))
    # the peak rate of the normalised profile is the plan's: joint 1's speed over its distance
    rate = np.max(np.diff(s) / np.diff(ts))
    assert rate == pytest.approx(plan.speed_rad_s[0] / dq, rel=0.02)


def test_a_halted_move_is_not_reached_and_not_judged():
    w = watch()
    feed(w, 300, (3_000, 6_000))
    w.stop(ACK + 310 * MS)
    for t in range(320, 2000, 10):  # halted short; the drive reports its halt as reached
        assert not feed(w, t, (3_100, 6_200), (OE_REACHED, OE_REACHED))
    assert w.error is None and w.report()["stopped"] and not w.report()["complete"]
