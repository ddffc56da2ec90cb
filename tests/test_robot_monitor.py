"""The daemon's robot monitor over the simulated RTDE controller: it wakes per sample, never polls."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import wait_until

from cellcal.daemon.capture import DeviceFault, RobotMonitor
from cellcal.drivers import connect_robot
from cellcal.drivers.kinematics import dh_model
from cellcal.drivers.settle import SettleConfig
from cellcal.sim.robot_sim import start_sim_robot
from cellcal.sim.world import World

Q_HOME = np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0])


@pytest.fixture
def sim():
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4),
                  base_T_flange=dh_model("ur5e").forward(Q_HOME), time_scale=10.0)
    handle = start_sim_robot(world, {"encoder_noise_deg": 0.0005, "ringing_amplitude_deg": 0.0})
    yield handle
    handle.close()


class _CountingReads:
    """Counts the monitor's ``read_state`` calls on the real driver (a spy, not a stand-in)."""

    def __init__(self, robot) -> None:
        self.n = 0
        self._lock = threading.Lock()
        self._read = robot.read_state
        robot.read_state = self

    def __call__(self, *a, **k):
        with self._lock:
            self.n += 1
        return self._read(*a, **k)


def test_monitor_reads_once_per_sample_between_slow_samples(sim):
    # At 10 Hz a sample comes every 100 ms: a monitor that polled every 2 ms would read the
    # driver ~50 times per sample; one that waits on the driver's condition reads about once
    # per sample (the count does not depend on how busy the machine is).
    with connect_robot(sim.url, frequency_hz=10.0, timeout_s=2.0) as robot:
        reads = _CountingReads(robot)
        monitor = RobotMonitor(robot, SettleConfig(dwell_s=0.2)).start()
        try:
            seq0 = wait_until(lambda: (monitor.status()[0] or None) and monitor.status()[0].seq, 10.0, "a sample")
            n0 = reads.n
            wait_until(lambda: monitor.status()[0].seq >= seq0 + 15, 30.0, "15 more samples")
            seq1, n1 = monitor.status()[0].seq, reads.n
        finally:
            monitor.close()
    samples = seq1 - seq0
    assert samples >= 15
    # one read per sample, plus a spare for each 0.25 s bound that might expire on a stall
    assert n1 - n0 <= 2 * samples + 3, f"{n1 - n0} reads for {samples} samples: the monitor polls"


def test_monitor_settles_and_reports_a_closed_link(sim):
    with connect_robot(sim.url, frequency_hz=250.0, timeout_s=1.0) as robot:
        monitor = RobotMonitor(robot, SettleConfig(dwell_s=0.1)).start()
        try:
            state, status = monitor.wait_settled(20.0)
            assert status.settled and status.n_samples >= 2
            np.testing.assert_allclose(state.q_rad, Q_HOME, atol=1e-3)
            # a settled UR at rest: the flange speeds the driver computed are tiny and finite
            assert 0.0 <= status.max_flange_speed_m_s <= SettleConfig().max_flange_speed_m_s
            sim.close()  # the controller goes away: the monitor's next read fails, typed
            with pytest.raises(DeviceFault):
                wait_until(lambda: monitor.status() and False, 20.0, "the monitor to report the lost link")
        finally:
            monitor.close()


def test_an_unused_monitor_sleeps_and_wakes_when_used(sim):
    # An idle daemon must not read its robot's samples: after linger_s without a call the
    # monitor stops reading (the driver keeps streaming), and the next call resumes it with
    # a fresh rest window.
    with connect_robot(sim.url, frequency_hz=100.0, timeout_s=2.0) as robot:
        reads = _CountingReads(robot)
        monitor = RobotMonitor(robot, SettleConfig(dwell_s=0.1), linger_s=0.3).start()
        try:
            monitor.wait_settled(20.0)
            wait_until(lambda: not monitor.following, 20.0, "the unused monitor to sleep")
            assert monitor.sleeps == 1
            assert monitor.status() == (None, None)  # asleep, it forgot its window (and the call wakes it)
            assert monitor.following
            wait_until(lambda: monitor.sleeps == 2 and not monitor.following, 20.0, "the monitor to sleep again")
            n_asleep = reads.n
            seq = robot.wait_for_sample_after(0, 2.0).seq
            for _ in range(20):  # the driver streams on: 20 samples the monitor must not read
                seq = robot.wait_for_sample_after(seq, 2.0).seq
            assert reads.n == n_asleep
            state, status = monitor.wait_settled(20.0)  # used again: it follows the samples
            assert status.settled and state.seq > seq
            assert reads.n > n_asleep
        finally:
            monitor.close()


def test_a_monitor_opened_for_nobody_starts_asleep(sim):
    # The idle loop's connection (in_use=False) has no job to follow the samples for: the
    # monitor reads none until its first call, which starts a fresh rest window.
    with connect_robot(sim.url, frequency_hz=100.0, timeout_s=2.0) as robot:
        reads = _CountingReads(robot)
        monitor = RobotMonitor(robot, SettleConfig(dwell_s=0.1), in_use=False).start()
        try:
            wait_until(lambda: monitor.sleeps == 1, 20.0, "the monitor to go to sleep at its start")
            seq = robot.wait_for_sample_after(0, 2.0).seq
            for _ in range(20):  # the driver streams: 20 samples the monitor must not read
                seq = robot.wait_for_sample_after(seq, 2.0).seq
            assert reads.n == 0
            assert not monitor.following
            state, status = monitor.wait_settled(20.0)  # a job uses it: it follows
            assert status.settled and state.seq > seq
            assert reads.n > 0 and monitor.following
        finally:
            monitor.close()
