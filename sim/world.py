"""The shared world state of the simulated cell.

One ``World`` holds the hidden truth that every simulated device reads: where the robot base
sits in the cell (with drift events applied at their simulated time), the target on the
flange, and the robot's *true* flange pose, which the simulated robot gives whenever it is
read (its source, registered with :meth:`World.set_flange_source`) and the simulated tracker
reads when it measures. Devices never see each other, only the world,
so the tracker observes exactly what the robot did.

Time is simulated seconds: ``now_s() = (clock() - t0) * time_scale``. A scale above 1 runs
the cell faster than the wall clock so CI stays quick; every code path stays the real one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from cellcal.solver.se3 import check_transform

__all__ = ["World", "DriftEvent"]


class DriftEvent:
    """A rigid change of ``cell_T_base`` at simulated time ``at_s``.

    ``cell_T_base`` becomes ``cell_delta @ cell_T_base`` from ``at_s`` on (the delta is
    expressed in the cell frame: a base that slid 1 mm along cell x has a delta of
    translation (0.001, 0, 0)).
    """

    __slots__ = ("at_s", "cell_delta")

    def __init__(self, at_s: float, cell_delta: np.ndarray) -> None:
        self.at_s = float(at_s)
        self.cell_delta = check_transform(cell_delta, "drift event delta").copy()


class World:
    """Thread-safe shared truth of one simulated cell.

    Parameters
    ----------
    cell_T_base : (4, 4) array
        True base pose in the cell at time 0.
    flange_T_target : (4, 4) array
        True target offset on the flange.
    base_T_flange : (4, 4) array
        Initial true flange pose (the robot at rest before anything moves it).
    time_scale : float
        Simulated seconds per wall second (> 0).
    drift_events : sequence of DriftEvent
        Applied in time order once ``now_s()`` passes their ``at_s``.
    clock : callable returning seconds
        Monotonic wall clock; ``time.monotonic`` unless a test injects another.
    """

    def __init__(
        self,
        *,
        cell_T_base: np.ndarray,
        flange_T_target: np.ndarray,
        base_T_flange: np.ndarray | None = None,
        time_scale: float = 1.0,
        drift_events: Sequence[DriftEvent] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale!r}")
        self._lock = threading.Lock()
        self._cell_T_base0 = check_transform(cell_T_base, "cell_T_base").copy()
        self._flange_T_target = check_transform(flange_T_target, "flange_T_target").copy()
        self._base_T_flange = (
            np.eye(4) if base_T_flange is None else check_transform(base_T_flange).copy()
        )
        self._lin_speed_m_s = 0.0
        self._ang_speed_rad_s = 0.0
        self._flange_at: Callable[[float], np.ndarray] | None = None
        self._flange_source: Callable[[float], tuple[np.ndarray, float, float]] | None = None
        self._drift = sorted(drift_events, key=lambda e: e.at_s)
        self.time_scale = float(time_scale)
        self._clock = clock
        self._t0 = clock()

    # -- time --------------------------------------------------------------------------
    def now_s(self) -> float:
        """Simulated seconds since the world was created."""
        return (self._clock() - self._t0) * self.time_scale

    def wall_s(self, sim_s: float) -> float:
        """Wall-clock seconds that ``sim_s`` simulated seconds take."""
        return sim_s / self.time_scale

    def sim_s_at(self, clock_s: float) -> float:
        """Simulated seconds at the world clock's reading ``clock_s`` (``time.monotonic()``
        seconds unless a test injected another clock): how a device that is told of a
        host-clock instant (a camera's trigger) places it in the world."""
        return (clock_s - self._t0) * self.time_scale

    def clock_s_at(self, sim_s: float) -> float:
        """The world clock's reading at simulated time ``sim_s`` (inverse of :meth:`sim_s_at`)."""
        return self._t0 + sim_s / self.time_scale

    def sleep(self, sim_s: float) -> None:
        """Sleep for ``sim_s`` simulated seconds."""
        if sim_s > 0:
            time.sleep(sim_s / self.time_scale)

    # -- the robot gives, everyone reads ----------------------------------------------
    def set_flange(
        self, base_T_flange: np.ndarray, lin_speed_m_s: float = 0.0, ang_speed_rad_s: float = 0.0
    ) -> None:
        """Set the true flange pose and its current speeds (written by the robot sim)."""
        with self._lock:
            self._base_T_flange[...] = base_T_flange
            self._lin_speed_m_s = float(lin_speed_m_s)
            self._ang_speed_rad_s = float(ang_speed_rad_s)

    def set_flange_source(
        self, source: Callable[[float], tuple[np.ndarray, float, float]] | None
    ) -> None:
        """Register the robot as the flange's source: ``source(t_s) -> (base_T_flange (4, 4),
        linear m/s, angular rad/s)`` at simulated time ``t_s``.

        With a source, :meth:`base_T_flange` and :meth:`flange_speed` ask it at the moment
        they are read, so a reader sees the arm where it is then, and nobody computes the arm
        when nobody looks (a world-update thread at a fixed rate cost a realistic arm's
        forward kinematics and sag model 250 times a wall second, whether read or not).
        ``None`` goes back to the pose last written (:meth:`set_flange`).
        """
        with self._lock:
            self._flange_source = source

    def _live_flange(self) -> tuple[np.ndarray, float, float] | None:
        with self._lock:
            fn = self._flange_source
        if fn is None:
            return None
        T, lin, ang = fn(self.now_s())
        return np.array(T, dtype=float), float(lin), float(ang)

    def base_T_flange(self) -> np.ndarray:
        """True flange pose in the base frame now (a copy)."""
        live = self._live_flange()
        if live is not None:
            return live[0]
        with self._lock:
            return self._base_T_flange.copy()

    def set_flange_trajectory(self, flange_at: Callable[[float], np.ndarray] | None) -> None:
        """Register the robot's true flange pose as a function of simulated time.

        The robot is read at the instant of reading (:meth:`set_flange_source`); a camera exposing
        for a few milliseconds while the arm moves needs the pose at any instant of the
        exposure, which only the robot's motion model knows.
        """
        with self._lock:
            self._flange_at = flange_at

    def base_T_flange_at(self, t_s: float) -> np.ndarray:
        """True flange pose at simulated time ``t_s``: the robot's trajectory when one is
        registered (:meth:`set_flange_trajectory`), else the pose last written."""
        with self._lock:
            fn = self._flange_at
        if fn is None:
            return self.base_T_flange()
        return np.array(fn(float(t_s)), dtype=float)

    def flange_speed(self) -> tuple[float, float]:
        """True flange speeds ``(linear m/s, angular rad/s)`` in simulated time, now."""
        live = self._live_flange()
        if live is not None:
            return live[1], live[2]
        with self._lock:
            return self._lin_speed_m_s, self._ang_speed_rad_s

    # -- truth --------------------------------------------------------------------------
    def cell_T_base(self, t_s: float | None = None) -> np.ndarray:
        """True base pose at simulated time ``t_s`` (now if omitted), drift applied."""
        t = self.now_s() if t_s is None else t_s
        T = self._cell_T_base0.copy()
        for ev in self._drift:
            if ev.at_s <= t:
                T = ev.cell_delta @ T
        return T

    def flange_T_target(self) -> np.ndarray:
        """True target offset on the flange (a copy)."""
        return self._flange_T_target.copy()

    def cell_T_target(self, t_s: float | None = None) -> np.ndarray:
        """True target pose in the cell now: ``cell_T_base @ base_T_flange @ flange_T_target``."""
        return self.cell_T_base(t_s) @ self.base_T_flange() @ self._flange_T_target
