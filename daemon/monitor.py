"""The robot monitor: every robot sample read in a thread, and the settle detector fed with it.

:class:`RobotMonitor` follows the driver's sample stream while a job uses it (and sleeps when
idle), keeps a short history, checks every sample's reported TCP offset and payload against
the job's (``consistency.Session``), and answers the capture engine's waits: at rest for the
dwell, quiet, a rest window that covers a measurement window, a sample after an instant.
:func:`rest_spread` says whether a window's samples are one pose.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Sequence
from typing import cast

import numpy as np

from cellcal.daemon import protocol as P
from cellcal.daemon.config import RobotSettle
from cellcal.daemon.consistency import DeviceFault, RejectReason, Session, StationRejected
from cellcal.drivers.errors import DriverError, DriverTimeoutError, ProtocolError
from cellcal.drivers.robot import RobotDriver, RobotState
from cellcal.drivers.settle import SettleConfig, SettleDetector, SettleStatus

log = logging.getLogger(__name__)

#: Joint readings of a robot at rest differ by encoder noise (the simulator's: about 1 urad;
#: a UR's encoders: about 20 urad); a rest window's samples may span this much more than the
#: joint speed limit allows.
_Q_NOISE_RAD = 1e-4


def settle_config(cfg_settle: RobotSettle) -> SettleConfig:
    """The driver-side settle thresholds from the daemon's ``[robot.settle]`` (SI)."""
    return SettleConfig(
        max_joint_speed_rad_s=cfg_settle.max_joint_speed_rad_s,
        max_flange_speed_m_s=cfg_settle.max_flange_speed_m_s,
        max_flange_ang_speed_rad_s=cfg_settle.max_flange_ang_speed_rad_s,
        dwell_s=cfg_settle.dwell_s,
        require_target_reached=cfg_settle.require_target_reached,
        max_sample_gap_s=cfg_settle.max_sample_gap_s,
    )


#: Longest single wait of the robot monitor for the driver's next sample (s): how late
#: ``close()`` may be when the stream has stalled; a live stream wakes it every sample.
_MONITOR_WAIT_S = 0.25
#: The robot monitor follows the samples for this long after its last use (s), then sleeps
#: until it is used again (an idle daemon reads no samples). Far longer than any pause
#: within a station (the tracker's two halves); a station that straddled a sleep anyway is
#: refused (its rest window restarted), never accepted on samples the monitor did not see.
MONITOR_LINGER_S = 30.0


class RobotMonitor:
    """Reads every robot sample in a thread, keeps the recent ones and the settle status.

    Parameters
    ----------
    robot : RobotDriver
        An open driver.
    settle : SettleConfig
        Thresholds.
    history_s : float
        How much sample history to keep (covers an averaging window plus margins).
    session : Session, optional
        Checks every sample's reported TCP offset and payload (:meth:`Session.check_settings`).
    linger_s : float
        Samples are followed only while the monitor is in use: from any call of its methods
        until ``linger_s`` after the last one (:data:`MONITOR_LINGER_S`). Then it sleeps,
        forgets its rest window and history, and reads nothing until the next call; the
        driver's link errors are reported from that call on.
    in_use : bool
        True (default): a job is about to use the monitor, which follows the samples from its
        start (for ``linger_s`` if no call comes). False: opened with nobody to use it (the
        idle loop's connection), so it starts asleep, as if it had lingered, until the first call.

    Notes
    -----
    Per sample the monitor does only what settle detection needs: the detector's update
    and the history. It waits on the driver's condition for the next sample (drivers with
    ``wait_for_sample_after``) instead of polling.
    """

    def __init__(self, robot: RobotDriver, settle: SettleConfig, *, history_s: float = 30.0,
                 session: Session | None = None, linger_s: float = MONITOR_LINGER_S,
                 in_use: bool = True) -> None:
        self.robot = robot
        self.session = session if session is not None else Session()
        self.detector = SettleDetector(settle)
        self.history_ns = int(history_s * 1e9)
        self._samples: collections.deque[RobotState] = collections.deque()
        self._status: SettleStatus | None = None
        self._latest: RobotState | None = None
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seq = -1
        if not (math.isfinite(linger_s) and linger_s > 0):
            raise ValueError(f"linger_s must be a finite number > 0, got {linger_s!r}")
        self.linger_s = float(linger_s)
        # A job's new monitor is about to be used; the idle loop's is not: following 500 Hz
        # for the linger after the daemon's start-up connection was most of an idle daemon's CPU.
        self._wanted_until = time.monotonic() + self.linger_s if in_use else -math.inf
        self._wake = threading.Event()
        self._asleep = False
        #: times the monitor went to sleep for want of use (tests, diagnostics)
        self.sleeps = 0

    @property
    def following(self) -> bool:
        """True while the monitor reads every sample (False while it sleeps for want of use)."""
        return not self._asleep

    def _want(self) -> None:
        """Called by every public method: keep (or start) following the samples."""
        self._wanted_until = time.monotonic() + self.linger_s
        self._asleep = False
        self._wake.set()

    def _wait_cond(self, remaining: float) -> None:
        # caller holds self._cond; a caller still waiting is still a user
        self._wanted_until = time.monotonic() + self.linger_s
        self._cond.wait(min(remaining, 0.05))

    def start(self) -> RobotMonitor:
        self._thread = threading.Thread(target=self._loop, name="cellcal-robot-monitor", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _loop(self) -> None:
        # Drivers that can block until their next sample (RTDE: wait_for_sample_after) are
        # waited on; others are read again after a short sleep (a CiA 402 drive's own read
        # already waits for its SYNC).
        wait_next = getattr(self.robot, "wait_for_sample_after", None)
        self._wake.set()
        while not self._stop.is_set():
            if time.monotonic() >= self._wanted_until:
                self._sleep_until_wanted()
                continue
            try:
                st = self.robot.read_state()
            except (DriverError, ValueError) as exc:  # the link or the controller failed
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            fresh = st.seq != self._last_seq
            if fresh:
                self._take(st)
            if wait_next is None:
                if not fresh:
                    time.sleep(0.002)  # no new sample yet
                continue
            try:
                # Sleeps on the driver's condition until the sample after this one, so an
                # idle connected daemon wakes once per sample, never in between; the bound
                # keeps close() prompt when the stream stalls. A lost link or a stall is
                # reported by read_state on the next turn (it also reports a drop that
                # healed in between), not here.
                wait_next(st.seq, _MONITOR_WAIT_S)
            except DriverError:
                pass

    def _sleep_until_wanted(self) -> None:
        """Forget the window and the history, then sleep until a method is called."""
        self._wake.clear()
        if time.monotonic() < self._wanted_until:  # used in between: stay awake
            self._wake.set()
            return
        with self._cond:
            self.detector.reset()
            self._samples.clear()
            self._status, self._latest = None, None
            self.sleeps += 1
            self._asleep = True
        log.debug("robot monitor: unused for %.3g s, not following the samples", self.linger_s)
        self._wake.wait()
        self._asleep = False

    def _take(self, st: RobotState) -> None:
        """One new sample: the session's checks, the settle detector, the history."""
        self._last_seq = st.seq
        self.session.check_settings(st)
        with self._cond:
            status = self.detector.update(st)
            self._samples.append(st)
            horizon = st.t_host_ns - self.history_ns
            while self._samples and self._samples[0].t_host_ns < horizon:
                self._samples.popleft()
            self._status, self._latest = status, st
            self._cond.notify_all()

    def _check(self) -> None:
        changed = self.session.changed
        if changed is not None:
            raise DeviceFault(P.DEVICE_ROBOT, changed, ends_job=True)
        if self._error is not None:
            raise DeviceFault(P.DEVICE_ROBOT, self._error)

    def restart_window(self) -> None:
        """Forget the current rest window (after commanding a move)."""
        self._want()
        with self._cond:
            self.detector.reset()
            self._status = None

    def status(self) -> tuple[RobotState | None, SettleStatus | None]:
        """``(latest state, its settle status)``."""
        self._want()
        with self._cond:
            self._check()
            return self._latest, self._status

    def _latest_with_status(self) -> RobotState:
        # A status is only ever set together with the sample it judged (``_take``), and both
        # are cleared together (``_sleep_until_wanted``): with a status there is a sample.
        return cast(RobotState, self._latest)

    def wait_settled(self, timeout_s: float, abort: threading.Event | None = None) -> tuple[RobotState, SettleStatus]:
        """Block until the robot is settled; ``StationRejected(NOT_SETTLED)`` after the timeout."""
        self._want()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._check()
                if self._status is not None and self._status.settled:
                    return self._latest_with_status(), self._status
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (abort is not None and abort.is_set()):
                    reason = self._status.reason if self._status is not None else "no samples"
                    raise StationRejected(
                        RejectReason.NOT_SETTLED,
                        f"robot not settled within {timeout_s:.3g} s ({reason or 'still in dwell'})",
                        {"last_reason": reason, "timeout_s": timeout_s},
                    )
                self._wait_cond(remaining)

    def wait_quiet(
        self, timeout_s: float, abort: threading.Event | None = None, min_quiet_s: float = 0.0
    ) -> tuple[RobotState, SettleStatus]:
        """Block until the robot has been quiet for ``min_quiet_s`` (the dwell may still run)."""
        self._want()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._check()
                if self._status is not None and self._status.n_samples > 0 and self._status.quiet_s >= min_quiet_s:
                    return self._latest_with_status(), self._status
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (abort is not None and abort.is_set()):
                    reason = self._status.reason if self._status is not None else "no samples"
                    raise StationRejected(
                        RejectReason.NOT_SETTLED,
                        f"robot not at rest within {timeout_s:.3g} s ({reason})",
                        {"last_reason": reason, "timeout_s": timeout_s},
                    )
                self._wait_cond(remaining)

    def wait_window_settled(self, window_start_ns: int, timeout_s: float,
                            abort: threading.Event | None = None) -> SettleStatus | None:
        """Wait until the rest window that began at ``window_start_ns`` has lasted the dwell.

        Returns its status, or None as soon as that window ended (the robot moved).
        ``abort`` set: ``StationRejected(NOT_SETTLED)`` at once.
        """
        self._want()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                self._check()
                st = self._status
                if st is None or st.n_samples == 0 or st.window_start_ns != window_start_ns:
                    return None
                if st.settled:
                    return st
                if abort is not None and abort.is_set():
                    raise StationRejected(RejectReason.NOT_SETTLED, "station aborted", {"aborted": True})
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._wait_cond(remaining)

    def wait_sample_after(self, t_host_ns: int, timeout_s: float, stamped_by: P.DeviceName = P.DEVICE_TRACKER) -> None:
        """Block until a sample stamped after ``t_host_ns`` has been seen.

        Raises ``DeviceFault`` naming the robot when its samples stopped, and naming
        ``stamped_by`` (the tracker, or the camera for a frame's exposure) when the robot
        streams on but ``t_host_ns`` (that device's stamp) stays ahead of every sample: then
        the stamp is what is wrong.
        """
        self._want()
        deadline = time.monotonic() + timeout_s
        what, window = (("camera frame", "camera frame's exposure") if stamped_by == P.DEVICE_CAMERA
                        else ("tracker measurement", "tracker window"))
        with self._cond:
            while self._latest is None or self._latest.t_host_ns <= t_host_ns:
                self._check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    latest = self._latest
                    if latest is not None and time.monotonic_ns() - latest.t_recv_host_ns < 1_000_000_000:
                        ahead = (t_host_ns - latest.t_host_ns) * 1e-9
                        raise DeviceFault(stamped_by, ProtocolError(
                            f"{what} stamped {ahead:.3f} s after the newest robot sample while the "
                            f"robot streams: the {stamped_by}'s timestamp is ahead of the host clock"))
                    raise DeviceFault(P.DEVICE_ROBOT, DriverTimeoutError(f"no robot sample after the {window}"))
                self._wait_cond(remaining)

    def samples_between(self, t0_ns: int, t1_ns: int) -> list[RobotState]:
        self._want()
        with self._cond:
            return [s for s in self._samples if t0_ns <= s.t_host_ns <= t1_ns]


def rest_spread(samples: Sequence[RobotState], settle: RobotSettle) -> tuple[float, float]:
    """``(range, allowed)``, rad: the largest range of one joint over robot samples that are
    to be averaged as one pose at rest, and the most rest allows: the joint speed limit
    (``[robot.settle] max_joint_speed_deg_s``) over the samples' span on the controller's
    clock plus the dwell, plus encoder noise (``_Q_NOISE_RAD``)."""
    if len(samples) < 2:
        return 0.0, _Q_NOISE_RAD
    qs = np.array([s.q_rad for s in samples], dtype=float)
    span_s = float(max(s.t_device_s for s in samples) - min(s.t_device_s for s in samples))
    allowed = float(settle.max_joint_speed_rad_s) * (span_s + float(settle.dwell_s)) + _Q_NOISE_RAD
    return float(np.max(np.ptp(qs, axis=0))), allowed
