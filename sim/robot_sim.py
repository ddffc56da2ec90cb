"""The simulated robot: a kinematic arm that moves the true flange in the shared world.

Model
-----
* The *controller* works in encoder coordinates ``q_ctrl`` (what it reports, without
  noise). A move is a quintic (minimum-jerk when starting from rest) from the current
  position and velocity to the target, with duration
  ``max(min_move_time_s, 1.875 |dq|max / v, sqrt(5.77 |dq|max / a))`` (the peak speed and
  acceleration of a minimum-jerk profile).
* On arrival the arm *rings*: each joint gets
  ``A_j exp(-s / tau) sin(2 pi f s)``, ``s`` the time since arrival, ``A_j`` the scenario
  amplitude scaled by that joint's share of the move. The ``never_settles`` fault adds a
  persistent oscillation of the same amplitude on every joint.
* The controller believes its *factory* model (``[robot.factory]``): the reported TCP pose
  is that model's FK of the *reported* joints times the controller's TCP offset, and it is
  the table the primary interface serves.
* The *physical* arm (what the world's flange follows):

  1. **backlash**: each joint's output trails its motor by up to half the play
     (``backlash_deg``): a play operator ``out = clip(out_prev, m - b/2, m + b/2)`` on the
     motor's smooth path ``m`` (exact for the monotonic moves from rest the planner makes;
     a move started mid-motion forgets the play's history inside that move), ringing added;
  2. the joint zero offsets and the hidden residual DH errors (``[robot.residual]``) on top
     of the factory model, including the Hayati tilts of joints 3 and 4;
  3. **warm-up** (``[robot.thermal]``): link lengths times ``1 + alpha rise(t)``, joint
     zeros plus ``drift rise(t)``;
  4. **compliance** (``[robot.compliance]``): joint ``i`` turns by ``tau_i / k_i``, the
     payload's gravity torque about its axis at the current pose.

* Reported joints carry Gaussian encoder noise (``encoder_noise_deg``), reported speeds
  ``velocity_noise_deg_s``.

Everything is a function of simulated time (``world.now_s()``), so a sample taken at any
moment is exact. The world asks the robot for the true flange whenever a device reads it
(:meth:`World.set_flange_source`), so the simulated tracker sees the arm where it is at that
instant; a small thread sleeps until the next protective stop begins or ends, so a scheduled
stop freezes the arm on time with nobody polling it.

The controller's state as the dashboard server reports it (robot mode, remote control) is
here too: :meth:`SimRobot.power_on`, :meth:`SimRobot.brake_release`,
:meth:`SimRobot.set_remote_control`, and the ``local_control`` fault.

:func:`start_sim_robot` serves the arm as a UR controller (RTDE, URScript, dashboard,
primary interface) or as CiA 402 drives (on an in-process bus, optionally bridged to other
processes as a loopback SLCAN adapter).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from cellcal.drivers.kinematics import DHModel, UnreachablePose
from cellcal.sim.errors import SimRefused
from cellcal.sim.robot_scenario import (
    DEFAULT_INITIAL_Q_DEG,
    FaultSpec,
    RobotScenario,
    parse_robot_table,
)
from cellcal.sim.world import World
from cellcal.solver.se3 import make_transform, so3_exp, so3_log

__all__ = ["SimRobot", "SimSample", "SimRefused", "SimRobotHandle", "start_sim_robot"]

log = logging.getLogger(__name__)

#: The robot's thread wakes this long (wall s) after a protective stop's edge, so the world
#: clock is past it, and at least this often otherwise (a fault added behind its back).
_EDGE_AFTER_S, _IDLE_WAKE_S = 5e-4, 1.0

# UR codes the simulated controller reports (names mirror cellcal.drivers.ur_rtde)
UR_ROBOT_MODE_POWER_OFF = 3
UR_ROBOT_MODE_IDLE = 5
UR_ROBOT_MODE_RUNNING = 7
#: dashboard ``robotmode`` name -> RTDE ``robot_mode`` code
UR_ROBOT_MODE_CODES = {"POWER_OFF": UR_ROBOT_MODE_POWER_OFF, "IDLE": UR_ROBOT_MODE_IDLE,
                       "RUNNING": UR_ROBOT_MODE_RUNNING}
UR_SAFETY_NORMAL = 1
UR_SAFETY_PROTECTIVE_STOP = 3
UR_RUNTIME_STOPPED = 1
UR_RUNTIME_PLAYING = 2


class JointSample(NamedTuple):
    """The joint part of a :class:`SimSample` (see :meth:`SimRobot.joints`)."""

    t_sim_s: float
    q_rad: np.ndarray
    qd_rad_s: np.ndarray
    q_ctrl_rad: np.ndarray
    qd_ctrl_rad_s: np.ndarray
    segment: _Segment


@dataclass(frozen=True)
class SimSample:
    """What the simulated controller knows at one instant.

    Attributes
    ----------
    t_sim_s : float
        World time (s).
    timestamp_s : float
        Controller clock (s): ``(clock_offset_s + t_sim_s / time_scale) * (1 + skew)``.
    q_rad, qd_rad_s : (6,) arrays
        Reported joints (with encoder noise) and speeds (with velocity noise).
    q_ctrl_rad : (6,) array
        Noise-free controller joints (what the drives' position really is, in encoder
        coordinates).
    target_q_rad : (6,) array
        Current commanded target.
    tcp_pose : (6,) array
        Reported ``actual_TCP_pose`` ``(x, y, z, rx, ry, rz)`` (m, rad).
    moving : bool
        A trajectory segment is in progress.
    protective_stop : bool
        The protective-stop fault is active.
    tcp_offset : (6,) array
        The TCP the controller applies (RTDE ``tcp_offset``): the scenario's, or a
        ``tcp_change`` fault's while it lasts.
    payload_kg : float
        The payload the controller reports (RTDE ``payload``).
    """

    t_sim_s: float
    timestamp_s: float
    q_rad: np.ndarray
    qd_rad_s: np.ndarray
    q_ctrl_rad: np.ndarray
    qd_ctrl_rad_s: np.ndarray
    target_q_rad: np.ndarray
    tcp_pose: np.ndarray
    moving: bool
    protective_stop: bool
    tcp_offset: np.ndarray = field(default_factory=lambda: np.zeros(6))
    payload_kg: float = 0.0
    robot_mode_code: int = UR_ROBOT_MODE_RUNNING

    @property
    def robot_mode(self) -> int:
        return self.robot_mode_code

    @property
    def safety_mode(self) -> int:
        return UR_SAFETY_PROTECTIVE_STOP if self.protective_stop else UR_SAFETY_NORMAL

    @property
    def runtime_state(self) -> int:
        return UR_RUNTIME_PLAYING if self.moving else UR_RUNTIME_STOPPED


class _Segment:
    """Quintic from (q0, v0, acc 0) at t0 to (q1, 0, 0) at t0 + T, then ringing.

    ``out0`` is where the joints' outputs (the load side of the backlash) are at ``t0``;
    ``half_play`` the backlash half-widths (rad).
    """

    def __init__(self, t0: float, q0: np.ndarray, v0: np.ndarray, q1: np.ndarray, T: float,
                 ring_amp: np.ndarray, out0: np.ndarray | None = None, half_play: np.ndarray | None = None) -> None:
        self.t0, self.T = t0, max(T, 1e-9)
        h = q1 - q0
        vT = v0 * self.T
        self.c = np.stack([q0, vT, np.zeros_like(q0), 10 * h - 6 * vT, -15 * h + 8 * vT, 6 * h - 3 * vT])
        self.q1 = q1.copy()
        self.ring_amp = ring_amp
        self.half_play = np.zeros_like(q0) if half_play is None else half_play
        self.out0 = (q0.copy() if out0 is None else np.asarray(out0, dtype=float).copy())

    @property
    def t_end(self) -> float:
        return self.t0 + self.T

    def smooth(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """The motor path without ringing: position and speed."""
        s = (t - self.t0) / self.T
        if s >= 1.0:
            return self.q1, np.zeros_like(self.q1)
        s = max(s, 0.0)
        c = self.c
        q = c[0] + s * (c[1] + s * (c[2] + s * (c[3] + s * (c[4] + s * c[5]))))
        dq = (c[1] + s * (2 * c[2] + s * (3 * c[3] + s * (4 * c[4] + s * 5 * c[5])))) / self.T
        return q, dq

    def ring(self, t: float, tau: float, f_hz: float) -> tuple[np.ndarray, np.ndarray]:
        r = t - self.t_end
        if r < 0:
            return np.zeros_like(self.q1), np.zeros_like(self.q1)
        w = 2 * math.pi * f_hz
        e = math.exp(-r / tau)
        return self.ring_amp * e * math.sin(w * r), self.ring_amp * e * (w * math.cos(w * r) - math.sin(w * r) / tau)

    def positions(self, ts: np.ndarray, tau: float, f_hz: float) -> np.ndarray:
        """:meth:`eval`'s positions (k, 6) at the times ``ts`` (k,), in one pass: the CiA 402
        drives ask for a track at 1 ms steps on every SYNC."""
        s = np.maximum((ts - self.t0) / self.T, 0.0)[:, None]
        c = self.c
        q = c[0] + s * (c[1] + s * (c[2] + s * (c[3] + s * (c[4] + s * c[5]))))
        q = np.where(s >= 1.0, self.q1, q)
        r = ts - self.t_end
        after = r >= 0
        if np.any(after) and np.any(self.ring_amp):
            rr = np.where(after, r, 0.0)
            ring = np.where(after, np.exp(-rr / tau) * np.sin(2 * math.pi * f_hz * rr), 0.0)
            q = q + ring[:, None] * self.ring_amp
        return q

    def eval(self, t: float, tau: float, f_hz: float) -> tuple[np.ndarray, np.ndarray]:
        q, dq = self.smooth(t)
        r, dr = self.ring(t, tau, f_hz)
        return q + r, dq + dr

    def output(self, t: float, tau: float, f_hz: float) -> tuple[np.ndarray, np.ndarray]:
        """The joints' load side: the motor path through the backlash, ringing added."""
        m, dm = self.smooth(t)
        out = np.clip(self.out0, m - self.half_play, m + self.half_play)
        # the output moves with the motor only while the play is taken up
        dout = np.where(np.abs(out - m) >= self.half_play - 1e-15, dm, 0.0) if np.any(self.half_play) else dm
        r, dr = self.ring(t, tau, f_hz)
        return out + r, dout + dr


class SimRobot:
    """A simulated 6-joint arm moving the world's true flange.

    Parameters
    ----------
    world : World
        Shared truth; the robot writes ``base_T_flange`` and flange speeds into it.
    scenario : RobotScenario or dict
        The parsed ``[robot]`` table (a raw dict is parsed with
        :func:`~cellcal.sim.robot_scenario.parse_robot_table`).
    """

    def __init__(self, world: World, scenario: RobotScenario | dict[str, Any] | None = None) -> None:
        if not isinstance(scenario, RobotScenario):
            scenario = parse_robot_table(scenario)
        self.world = world
        self.scenario = scenario
        #: the data-sheet model (``model`` / ``dh``)
        self.nominal_model = scenario.model
        #: the controller's model: its factory calibration (KinematicsInfo, actual_TCP_pose)
        self.model = scenario.factory_model
        #: the true arm, cold and rigid (warm-up and compliance: :meth:`true_model_at`)
        self.true_model = scenario.true_model
        self.flange_T_tcp = make_transform(so3_exp(scenario.tcp_offset[3:]), scenario.tcp_offset[:3])
        self._half_play = 0.5 * scenario.backlash_rad
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(scenario.seed)
        q0 = self._initial_joints(world, scenario)
        self._seg = _Segment(world.now_s(), q0, np.zeros(6), q0, 1e-9, np.zeros(6), half_play=self._half_play)
        self._flange_memo: tuple[tuple[object, ...], tuple[np.ndarray, float, float]] | None = None
        self._faults: list[FaultSpec] = list(scenario.faults)
        self._pstop_was_active = False
        self._power = scenario.initial_robot_mode.upper()  # POWER_OFF, IDLE or RUNNING
        self._remote = scenario.remote_control
        self._stop_evt = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self.moves = 0
        world.set_flange_source(self.true_flange)
        world.set_flange_trajectory(self.flange_at)

    def _initial_joints(self, world: World, sc: RobotScenario) -> np.ndarray:
        """The scenario's initial joints, or else joints putting the true flange where the
        world has it (so starting the robot does not move the flange): inverse kinematics
        from a few seeds, keeping the posture closest to the default home posture."""
        home = np.deg2rad(DEFAULT_INITIAL_Q_DEG)
        if sc.initial_q_rad is not None:
            return sc.initial_q_rad.copy()
        target = world.base_T_flange()
        best, best_cost = None, math.inf
        for base_deg in (0.0, 180.0, 90.0, -90.0):
            seed = home + np.deg2rad([base_deg, 0, 0, 0, 0, 0])
            try:
                q = self.true_model.inverse(target, seed)
            except UnreachablePose:
                continue
            d = (q - home + math.pi) % (2 * math.pi) - math.pi
            cost = float(np.linalg.norm(d[1:5]))  # posture: ignore base and wrist roll
            if cost < best_cost:
                best, best_cost = q, cost
        if best is None:
            log.warning("sim robot: world flange unreachable; starting at the home posture")
            return home
        return (best + math.pi) % (2 * math.pi) - math.pi  # each joint in [-180, 180) deg

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> SimRobot:
        """Start ticking the controller (idempotent): a scheduled protective stop then freezes
        the arm at its time even while no device reads the arm."""
        if self._thread is None:
            self._stop_evt.clear()
            self._thread = threading.Thread(target=self._run, name="sim-robot", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the controller's ticking thread (idempotent)."""
        self._stop_evt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def __enter__(self) -> SimRobot:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        # Asleep until the next protective stop begins or ends (or a fault is injected): a
        # stop freezes the arm at its time, and nothing else needs this thread.
        while not self._stop_evt.is_set():
            t = self.world.now_s()
            self._apply_stop(t)
            with self._lock:
                edges = [e for f in self._faults if f.kind == "protective_stop"
                         for e in (f.start_s, f.start_s + f.duration_s) if e > t]
            wait_s = self.world.wall_s(min(edges) - t) + _EDGE_AFTER_S if edges else _IDLE_WAKE_S
            self._wake.wait(min(wait_s, _IDLE_WAKE_S))
            self._wake.clear()

    # -- faults ----------------------------------------------------------------------------
    def inject(self, kind: str, duration_s: float = math.inf, node: int = 0, *,
               tcp_offset: Any = None, payload_kg: float | None = None, offset_deg: float | None = None,
               error_code: int | None = None) -> None:
        """Start a fault now (simulated time) for ``duration_s``.

        ``tcp_offset`` (6 numbers, m and rad) is the TCP of a ``tcp_change`` fault,
        ``payload_kg`` the payload of a ``payload_change`` fault, ``offset_deg`` how far an
        ``off_target`` drive stops from its targets, ``error_code`` what a ``drive_fault``
        reports (defaults: a 20 mm tool, 1.5 kg, 0.2 deg, 0x8611).
        """
        from cellcal.sim.robot_scenario import (
            DEFAULT_CHANGED_PAYLOAD_KG,
            DEFAULT_CHANGED_TCP,
            DEFAULT_DRIVE_FAULT_CODE,
            DEFAULT_OFF_TARGET_DEG,
            FAULT_KINDS,
            NODE_FAULT_KINDS,
        )

        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        if kind in NODE_FAULT_KINDS and not 1 <= node <= 127:
            raise ValueError(f"fault {kind!r} needs the node id of a drive (1..127), got {node!r}")
        offset = math.radians(DEFAULT_OFF_TARGET_DEG if offset_deg is None else offset_deg) \
            if kind == "off_target" else None
        code = int(DEFAULT_DRIVE_FAULT_CODE if error_code is None else error_code) if kind == "drive_fault" else None
        tcp = payload = None
        if kind == "tcp_change":
            tcp = tuple(float(x) for x in np.asarray(DEFAULT_CHANGED_TCP if tcp_offset is None else tcp_offset,
                                                       dtype=float).reshape(6))
        if kind == "payload_change":
            payload = float(DEFAULT_CHANGED_PAYLOAD_KG if payload_kg is None else payload_kg)
        with self._lock:
            self._faults.append(FaultSpec(kind, self.world.now_s(), duration_s, node, tcp, payload, offset, code))
        self._wake.set()  # a stop injected now freezes the arm now

    def _fault_value(self, kind: str, t_s: float, node: int | None = None) -> FaultSpec | None:
        """The newest active fault of ``kind`` (for ``node``, if given) at ``t_s`` (None if
        there is none)."""
        with self._lock:
            active = [f for f in self._faults
                      if f.kind == kind and f.active(t_s) and (node is None or f.node == node)]
        return active[-1] if active else None

    def active_fault(self, kind: str, t_s: float | None = None, node: int | None = None) -> FaultSpec | None:
        """The newest active fault of ``kind`` (for ``node``) at ``t_s`` (default now), with its
        parameters; ``None`` if there is none."""
        return self._fault_value(kind, self.world.now_s() if t_s is None else t_s, node)

    def faults_started(self, kind: str, t_s: float | None = None) -> list[FaultSpec]:
        """Every fault of ``kind`` that has started by ``t_s`` (default now), in order."""
        t = self.world.now_s() if t_s is None else t_s
        with self._lock:
            return [f for f in self._faults if f.kind == kind and f.start_s <= t]

    def tcp_at(self, t_s: float) -> tuple[np.ndarray, np.ndarray]:
        """``(tcp_offset (6,), flange_T_tcp (4, 4))`` the controller applies at ``t_s``."""
        f = self._fault_value("tcp_change", t_s)
        if f is None or f.tcp_offset is None:
            return self.scenario.tcp_offset, self.flange_T_tcp
        tcp = np.array(f.tcp_offset, dtype=float)
        return tcp, make_transform(so3_exp(tcp[3:]), tcp[:3])

    def payload_at(self, t_s: float) -> float:
        """The payload mass (kg) the controller reports at ``t_s``."""
        f = self._fault_value("payload_change", t_s)
        return self.scenario.payload_kg if f is None or f.payload_kg is None else float(f.payload_kg)

    def clear(self, kind: str) -> None:
        """End every active fault of ``kind`` now (e.g. an operator unlocks a protective stop)."""
        now = self.world.now_s()
        with self._lock:
            self._faults = [
                f if f.kind != kind or not f.active(now)
                else dataclasses.replace(f, duration_s=max(now - f.start_s, 1e-9))
                for f in self._faults
            ]

    def fault_active(self, kind: str, t_s: float | None = None, node: int | None = None) -> bool:
        """Is a fault of ``kind`` (for ``node``, if given) active at ``t_s`` (default now)?"""
        t = self.world.now_s() if t_s is None else t_s
        with self._lock:
            return any(
                f.kind == kind and f.active(t) and (node is None or f.node == node)
                for f in self._faults
            )

    # -- state -----------------------------------------------------------------------------
    def _apply_stop(self, t: float) -> None:
        """A protective stop that began by time ``t`` freezes the arm where it is (a
        category-2 stop; the sim makes it instantaneous). The robot's thread calls this at
        its update rate, so a scheduled stop freezes the arm on time even when nothing reads it."""
        pstop = self.fault_active("protective_stop", t)
        with self._lock:
            if pstop and not self._pstop_was_active:
                sc = self.scenario
                q, _ = self._seg.eval(t, sc.settle_time_constant_s, sc.ringing_frequency_hz)
                self._seg = self._new_segment(t, q, np.zeros(6), q, 1e-9, np.zeros(6))
            self._pstop_was_active = pstop

    def _ctrl(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """Noise-free controller joints and speeds at time ``t``; applies a pending stop."""
        sc = self.scenario
        self._apply_stop(t)
        with self._lock:
            q, qd = self._seg.eval(t, sc.settle_time_constant_s, sc.ringing_frequency_hz)
        if self.fault_active("never_settles", t):
            w = 2 * math.pi * sc.ringing_frequency_hz
            amp = max(sc.ringing_amplitude_rad, math.radians(0.01))
            q = q + amp * math.sin(w * t)
            qd = qd + amp * w * math.cos(w * t)
        return q, qd

    def ctrl_track(self, ts: np.ndarray) -> np.ndarray:
        """Noise-free controller joints (k, 6) at world times ``ts`` (k,) under the current
        segment, without side effects (the CiA 402 drives check their position window on it
        between two evaluations, as a drive's firmware does at its control rate)."""
        sc = self.scenario
        ts = np.asarray(ts, dtype=float)
        with self._lock:
            seg = self._seg
        q = seg.positions(ts, sc.settle_time_constant_s, sc.ringing_frequency_hz)
        with self._lock:
            spans = [(f.start_s, f.start_s + f.duration_s) for f in self._faults if f.kind == "never_settles"]
        ns = np.zeros(ts.shape, dtype=bool)
        for a, b in spans:
            ns |= (ts >= a) & (ts < b)
        if np.any(ns):
            w = 2 * math.pi * sc.ringing_frequency_hz
            amp = max(sc.ringing_amplitude_rad, math.radians(0.01))
            q = q + (ns * amp * np.sin(w * ts))[:, None]
        return q

    def _new_segment(self, t: float, q0: np.ndarray, v0: np.ndarray, q1: np.ndarray, T: float,
                     ring_amp: np.ndarray) -> _Segment:
        # caller holds self._lock: the outputs continue from where the old segment has them
        out0 = np.clip(self._seg.out0, self._seg.smooth(t)[0] - self._half_play, self._seg.smooth(t)[0] + self._half_play)
        return _Segment(t, q0, v0, q1, T, ring_amp, out0=out0, half_play=self._half_play)

    # -- the physical arm --------------------------------------------------------------------
    def true_model_at(self, t_s: float) -> DHModel:
        """The true arm's kinematics at simulated time ``t_s``: warm-up applied (rigid)."""
        th = self.scenario.thermal
        if not th.active:
            return self.true_model
        rise = th.rise_k(t_s)
        return self.true_model.scaled_lengths(1.0 + th.expansion_per_k * rise).with_joint_offsets(
            th.zero_drift_rad_per_k * rise)

    def sag_rad(self, model: DHModel, q_rad: np.ndarray, payload_kg: float | None = None) -> np.ndarray:
        """Joint deflections (6,) under the payload's gravity torque at joints ``q_rad``
        (``payload_kg`` default: the scenario's compliance payload)."""
        c = self.scenario.compliance
        m = c.payload_kg if payload_kg is None else float(payload_kg)
        if m <= 0 or not np.any(c.stiffness_nm_per_rad > 0):
            return np.zeros(6)
        links = model.link_transforms(q_rad)
        frames = np.empty((7, 4, 4))
        frames[0] = np.eye(4)
        for i, Ti in enumerate(links):
            frames[i + 1] = frames[i] @ Ti
        p_com = frames[6][:3, :3] @ c.payload_com_m + frames[6][:3, 3]
        force = m * c.gravity_m_s2
        # tau_i = z_i . ((p_com - o_i) x F) for the six joints at once: every read of the true
        # flange evaluates this, and six np.cross calls cost several times one.
        lever = p_com - frames[:6, :3, 3]
        torque = np.cross(lever, force)
        tau = np.einsum("ij,ij->i", frames[:6, :3, 2], torque)
        return c.compliance_rad_per_nm * tau

    def physical_joints(self, t_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The true arm's joint angles and speeds at ``t_s`` (load side of the backlash,
        before the compliance, which :meth:`true_flange` adds), in the controller's
        joint coordinates."""
        sc = self.scenario
        with self._lock:
            seg = self._seg
        q, qd = seg.output(t_s, sc.settle_time_constant_s, sc.ringing_frequency_hz)
        if self.fault_active("never_settles", t_s):
            w = 2 * math.pi * sc.ringing_frequency_hz
            amp = max(sc.ringing_amplitude_rad, math.radians(0.01))
            q = q + amp * math.sin(w * t_s)
            qd = qd + amp * w * math.cos(w * t_s)
        return q, qd

    def true_flange(self, t_s: float) -> tuple[np.ndarray, float, float]:
        """``(base_T_flange (4, 4), linear m/s, angular rad/s)`` of the true arm at ``t_s``."""
        self._ctrl(t_s)  # applies a pending protective stop (freezes the segment)
        q, qd = self.physical_joints(t_s)
        th = self.scenario.thermal
        # An arm at rest gives the same joints (once the ringing is below half an ulp) and the
        # same kinematics (unless it warms up) read after read: the world's readers then
        # reuse the last answer instead of a forward kinematics and a sag model each time.
        key = (q.tobytes(), qd.tobytes(), id(self.true_model), th.rise_k(t_s) if th.active else 0.0)
        if self._flange_memo is not None and self._flange_memo[0] == key:
            T, lin, ang = self._flange_memo[1]
            return T.copy(), lin, ang
        model = self.true_model_at(t_s)
        q = q + self.sag_rad(model, q)
        lin, ang = model.flange_speed(q, qd) if np.any(qd) else (0.0, 0.0)
        T = model.forward(q)
        self._flange_memo = (key, (T.copy(), lin, ang))
        return T, lin, ang

    def flange_at(self, t_s: float) -> np.ndarray:
        """True ``base_T_flange`` (4, 4) at simulated time ``t_s`` under the current motion,
        without side effects (a simulated camera samples it over an exposure)."""
        q, _ = self.physical_joints(t_s)
        model = self.true_model_at(t_s)
        return model.forward(q + self.sag_rad(model, q))

    # -- the controller's state (dashboard) ----------------------------------------------------
    def robot_mode_name(self) -> str:
        """Dashboard ``robotmode``: ``POWER_OFF``, ``IDLE`` (powered, brakes on) or ``RUNNING``."""
        with self._lock:
            return self._power

    def safety_status(self, t_s: float | None = None) -> str:
        """Dashboard ``safetystatus``: ``PROTECTIVE_STOP`` during the fault, else ``NORMAL``."""
        return "PROTECTIVE_STOP" if self.fault_active("protective_stop", t_s) else "NORMAL"

    def remote_control(self, t_s: float | None = None) -> bool:
        """Dashboard ``is in remote control``: the scenario's setting, false during a
        ``local_control`` fault."""
        with self._lock:
            remote = self._remote
        return remote and not self.fault_active("local_control", t_s)

    def set_remote_control(self, on: bool) -> None:
        """Switch the simulated pendant between remote and local control."""
        with self._lock:
            self._remote = bool(on)

    def power_on(self) -> str:
        """Dashboard ``power on``: POWER_OFF -> IDLE; returns the answer line."""
        with self._lock:
            if self._power == "POWER_OFF":
                self._power = "IDLE"
        return "Powering on"

    def power_off(self) -> str:
        with self._lock:
            self._power = "POWER_OFF"
        return "Powering off"

    def brake_release(self) -> str:
        """Dashboard ``brake release``: IDLE -> RUNNING (refused while powered off)."""
        with self._lock:
            if self._power == "POWER_OFF":
                return "Brake release failed: robot is powered off"
            self._power = "RUNNING"
        return "Brake releasing"

    def script_refusal(self, t_s: float | None = None) -> str | None:
        """Why the controller would refuse a program now (None: it runs it), as a UR does:
        not in remote control, not running, in a protective stop."""
        if not self.remote_control(t_s):
            return "the robot is in local control: programs from the network are refused (switch to remote control)"
        mode = self.robot_mode_name()
        if mode != "RUNNING":
            return f"robot mode {mode}: power on and release the brakes first"
        if self.fault_active("protective_stop", t_s):
            return "protective stop active"
        return None

    def joints(self, t_s: float | None = None) -> JointSample:
        """The reported joints and speeds now (or at world time ``t_s``), with noise.

        What :meth:`sample` reports of the joints, drawn the same way from the same noise
        stream, without the TCP pose: the drives' simulator reads joints at its SYNC rate
        and has no use for forward kinematics.
        """
        sc = self.scenario
        t = self.world.now_s() if t_s is None else t_s
        q, qd = self._ctrl(t)
        with self._lock:
            noise_q = self._rng.normal(0.0, sc.encoder_noise_rad, 6) if sc.encoder_noise_rad else 0.0
            noise_qd = self._rng.normal(0.0, sc.velocity_noise_rad_s, 6) if sc.velocity_noise_rad_s else 0.0
            seg = self._seg
        # Speeds per second of the controller's clock, which runs on wall time (see
        # controller_time): at a time scale s the joints move s times faster per wall second.
        return JointSample(t, q + noise_q, qd * self.world.time_scale + noise_qd, q, qd, seg)

    def sample(self, t_s: float | None = None) -> SimSample:
        """The controller's view now (or at world time ``t_s``), with noise."""
        t, q_rep, qd_rep, q, qd, seg = self.joints(t_s)
        tcp_offset, flange_T_tcp = self.tcp_at(t)
        T_tcp = self.model.forward(q_rep) @ flange_T_tcp
        pose = np.concatenate([T_tcp[:3, 3], so3_log(T_tcp[:3, :3])])
        return SimSample(
            robot_mode_code=UR_ROBOT_MODE_CODES[self.robot_mode_name()],
            t_sim_s=t,
            timestamp_s=self.controller_time(t),
            q_rad=q_rep,
            qd_rad_s=qd_rep,
            q_ctrl_rad=q,
            qd_ctrl_rad_s=qd,
            target_q_rad=seg.q1.copy(),
            tcp_pose=pose,
            moving=t < seg.t_end,
            protective_stop=self.fault_active("protective_stop", t),
            tcp_offset=tcp_offset,
            payload_kg=self.payload_at(t),
        )

    def controller_time(self, t_sim_s: float) -> float:
        """The controller clock at world time ``t_sim_s`` (offset and skew applied).

        Like the simulated tracker's, the controller's oscillator runs on wall time: at a
        time scale above 1 the physics runs faster, but a clock is still a clock, so the
        drivers' clock mapping and every host-time window (settle dwell, the tracker's
        averaging window) stay real.
        """
        sc = self.scenario
        wall = self.world.wall_s(t_sim_s)
        drift = sc.clock_skew_drift_ppm_per_h * 1e-6 / 3600.0
        return (sc.clock_offset_s + wall) * (1.0 + sc.clock_skew_ppm * 1e-6) + 0.5 * drift * wall * wall

    # -- commands --------------------------------------------------------------------------
    def command_joints(
        self,
        q_target_rad: np.ndarray,
        max_speed_rad_s: float | None = None,
        max_accel_rad_s2: float | None = None,
    ) -> float:
        """Start a joint move to ``q_target_rad`` (6,); returns its duration (simulated s).

        Raises
        ------
        SimRefused
            During a protective stop.
        """
        sc = self.scenario
        q1 = np.asarray(q_target_rad, dtype=float).reshape(6)
        if not np.all(np.isfinite(q1)):
            raise SimRefused("target contains NaN or inf")
        t = self.world.now_s()
        if self.fault_active("protective_stop", t):
            raise SimRefused("protective stop active")
        v = min(max_speed_rad_s or sc.max_joint_speed_rad_s, sc.max_joint_speed_rad_s)
        a = min(max_accel_rad_s2 or sc.max_joint_accel_rad_s2, sc.max_joint_accel_rad_s2)
        q0, v0 = self._ctrl(t)
        h = float(np.max(np.abs(q1 - q0)))
        T = max(sc.min_move_time_s, 1.875 * h / v, math.sqrt(5.774 * h / a))
        share = (q1 - q0) / h if h > 0 else np.zeros(6)
        with self._lock:
            self._seg = self._new_segment(t, q0, v0, q1, T, sc.ringing_amplitude_rad * share)
            self.moves += 1
        log.debug("sim robot: move %.3g rad in %.3g s", h, T)
        return T

    def command_pose(
        self, base_T_tcp: np.ndarray, max_tcp_speed_m_s: float | None = None, max_tcp_accel_m_s2: float | None = None
    ) -> float:
        """Move the TCP to ``base_T_tcp`` (controller's IK from the current joints).

        The path is a joint-space quintic, not a straight line (a documented simplification).
        """
        target_flange = np.asarray(base_T_tcp, dtype=float) @ np.linalg.inv(self.flange_T_tcp)
        t = self.world.now_s()
        q0, _ = self._ctrl(t)
        try:
            q1 = self.model.inverse(target_flange, q0)
        except UnreachablePose as exc:
            raise SimRefused(str(exc)) from exc
        v_j = None
        if max_tcp_speed_m_s:
            dist = float(np.linalg.norm(target_flange[:3, 3] - self.model.forward(q0)[:3, 3]))
            h = float(np.max(np.abs(q1 - q0)))
            if dist > 0 and h > 0:
                v_j = h * max_tcp_speed_m_s / dist
        return self.command_joints(q1, v_j)

    def stop(self, decel_rad_s2: float | None = None) -> None:
        """Decelerate to rest from the current motion."""
        sc = self.scenario
        a = decel_rad_s2 or sc.max_joint_accel_rad_s2
        t = self.world.now_s()
        q0, v0 = self._ctrl(t)
        q1 = q0 + v0 * np.abs(v0) / (2 * a)
        T = max(float(np.max(np.abs(v0))) / a * 1.875, 1e-3)
        with self._lock:
            self._seg = self._new_segment(t, q0, v0, q1, T, np.zeros(6))


# -- serving ---------------------------------------------------------------------------------
class SimRobotHandle:
    """A running simulated robot and the server(s) exposing it.

    Attributes
    ----------
    url : str
        What :func:`cellcal.drivers.connect_robot` should open.
    dashboard_port, primary_port : int or None
        The UR controller's dashboard server and primary interface (RTDE transport; None
        otherwise).
    robot : SimRobot
        The motion model (inject faults with ``robot.inject(kind)``).
    server : object
        The RTDE server or the CiA 402 drive set.
    """

    def __init__(self, url: str, robot: SimRobot, server: Any) -> None:
        self.url = url
        self.robot = robot
        self.server = server
        self.dashboard_port: int | None = getattr(server, "dashboard_port", None) or None
        self.primary_port: int | None = getattr(server, "primary_port", None) or None
        self._closed = False

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.server.close()
        self.robot.close()

    def __enter__(self) -> SimRobotHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_sim_robot(
    world: World,
    robot_table: dict[str, Any] | RobotScenario | None,
    *,
    transport: str = "rtde",
    host: str = "127.0.0.1",
    rtde_port: int = 0,
    urscript_port: int = 0,
    can_channel: str = "cellcal-sim",
    can_interface: str = "virtual",
    can_bridge: str | None = None,
    can_bridge_port: int = 0,
    dashboard_port: int | None = 0,
    primary_port: int | None = 0,
    realtime_port: int | None = None,
) -> SimRobotHandle:
    """Start the simulated robot and serve it.

    Parameters
    ----------
    world : World
        Shared truth.
    robot_table : dict
        The scenario's raw ``[robot]`` table (``scenario.robot``).
    transport : {"rtde", "canopen"}
        RTDE server (+ URScript port) on ``host``, or six CiA 402 drives on a python-can
        bus.
    rtde_port, urscript_port : int
        TCP ports (0: the OS picks free ones).
    dashboard_port, primary_port, realtime_port : int or None
        RTDE transport: the dashboard server and the primary interface (0: free ports,
        the default; None: not served) and a realtime script port (None by default).
    can_channel, can_interface : str
        python-can channel and interface of the drives' bus (``virtual``: in this process).
    can_bridge : {None, "tcp", "pty"}
        Also serve that bus to other processes as an SLCAN adapter on
        ``socket://127.0.0.1:PORT`` (``tcp``) or a pty (:mod:`cellcal.sim.slcan_bridge`);
        ``handle.url`` then opens it with python-can's ``slcan`` interface.
    can_bridge_port : int
        TCP port of the bridge (0: a free one).

    Returns
    -------
    SimRobotHandle
        ``handle.url`` e.g. ``rtde://127.0.0.1:40123?urscript_port=40124``,
        ``canopen://cellcal-sim?interface=virtual&nodes=1-6&model=ur5e&...`` or, bridged,
        ``canopen://socket://127.0.0.1:40125?interface=slcan&...``.
    """
    scenario = robot_table if isinstance(robot_table, RobotScenario) else parse_robot_table(robot_table)
    robot = SimRobot(world, scenario).start()
    try:
        if transport == "rtde":
            from cellcal.sim.rtde_server import RtdeServer

            server: Any = RtdeServer(robot, host=host, port=rtde_port, urscript_port=urscript_port,
                                     dashboard_port=dashboard_port, primary_port=primary_port,
                                     realtime_port=realtime_port)
            server.start()
            url = server.url
        elif transport == "canopen":
            from cellcal.sim.canopen_sim import CanopenSimDrives

            server = CanopenSimDrives(robot, channel=can_channel, interface=can_interface,
                                      bridge=can_bridge, bridge_port=can_bridge_port)
            server.start()
            url = server.url
        else:
            raise ValueError(f"transport must be 'rtde' or 'canopen', got {transport!r}")
    except BaseException:
        robot.close()
        raise
    return SimRobotHandle(url, robot, server)
