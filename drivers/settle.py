"""Robot settle detection, shared by every robot backend.

A robot is *settled* when, for every sample of a window at least ``dwell_s`` long:

* ``max|qd|`` is at most ``max_joint_speed_rad_s``,
* the flange linear speed is at most ``max_flange_speed_m_s`` and its angular speed at most
  ``max_flange_ang_speed_rad_s``,
* the backend's *target reached* flag is set where it has one (CiA 402 statusword bit 10,
  which the drive derives from its position window 0x6067/0x6068; ``None`` for drives the
  driver does not command, whose rest is then judged from the motion alone),
* the robot is in a mode where it holds position (``RUNNING`` or ``IDLE``), and
* no two consecutive samples are further apart than ``max_sample_gap_s`` (a gap in the
  stream restarts the window: what happened in it is unknown).

Why a ringing robot is never declared settled early: a damped oscillation of frequency
``f`` and amplitude ``A`` has peak joint speed ``2 pi f A`` once per half period. Its speed
crosses zero at every extreme, but a window only survives if *every* sample in it is
quiet, and a dwell longer than half the ringing period always contains a peak. So the
window cannot complete until the peak speed itself is below the threshold, i.e. until the
remaining amplitude is at most ``max_joint_speed_rad_s / (2 pi f)``: the thresholds bound
the pose error of a capture, they do not just sample a lucky instant.

Config keys carry their units (``max_joint_speed_deg_s``, ``max_flange_speed_mm_s``,
...); :meth:`SettleConfig.from_table` converts them to SI once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cellcal.drivers.robot import RobotState

__all__ = ["SettleConfig", "SettleStatus", "SettleDetector"]


@dataclass(frozen=True)
class SettleConfig:
    """Settle thresholds, SI units.

    Parameters
    ----------
    max_joint_speed_rad_s : float
        Largest joint speed allowed during the dwell (rad/s).
    max_flange_speed_m_s : float
        Largest flange linear speed allowed (m/s).
    max_flange_ang_speed_rad_s : float
        Largest flange angular speed allowed (rad/s).
    dwell_s : float
        How long every condition must hold (s). Choose it longer than half the period of
        the slowest ringing expected.
    require_target_reached : bool
        Also require the backend's target-reached flag (ignored by backends without one).
    max_sample_gap_s : float
        A gap between samples longer than this restarts the window (s).
    """

    max_joint_speed_rad_s: float = math.radians(0.05)
    max_flange_speed_m_s: float = 0.5e-3
    max_flange_ang_speed_rad_s: float = math.radians(0.05)
    dwell_s: float = 0.5
    require_target_reached: bool = True
    max_sample_gap_s: float = 0.25

    def __post_init__(self) -> None:
        for key in (
            "max_joint_speed_rad_s",
            "max_flange_speed_m_s",
            "max_flange_ang_speed_rad_s",
            "dwell_s",
            "max_sample_gap_s",
        ):
            v = getattr(self, key)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"settle.{key}: must be a finite number > 0, got {v!r}")

    _KEYS = {
        "max_joint_speed_deg_s": ("max_joint_speed_rad_s", math.pi / 180.0),
        "max_flange_speed_mm_s": ("max_flange_speed_m_s", 1e-3),
        "max_flange_ang_speed_deg_s": ("max_flange_ang_speed_rad_s", math.pi / 180.0),
        "dwell_s": ("dwell_s", 1.0),
        "max_sample_gap_s": ("max_sample_gap_s", 1.0),
    }

    @classmethod
    def from_table(cls, table: Mapping[str, Any], path: str = "settle") -> SettleConfig:
        """Build from a config table with unit-suffixed keys.

        Keys: ``max_joint_speed_deg_s``, ``max_flange_speed_mm_s``,
        ``max_flange_ang_speed_deg_s``, ``dwell_s``, ``max_sample_gap_s``,
        ``require_target_reached``. Missing keys keep their defaults.

        Raises
        ------
        ValueError
            Naming the dotted path of an unknown key or a bad value.
        """
        kwargs: dict[str, Any] = {}
        for key, value in table.items():
            if key == "require_target_reached":
                if not isinstance(value, bool):
                    raise ValueError(f"{path}.{key}: expected true or false, got {value!r}")
                kwargs["require_target_reached"] = value
                continue
            if key not in cls._KEYS:
                allowed = sorted([*cls._KEYS, "require_target_reached"])
                raise ValueError(f"{path}.{key}: unknown key (allowed: {', '.join(allowed)})")
            field_name, scale = cls._KEYS[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{path}.{key}: expected a number, got {value!r}")
            kwargs[field_name] = float(value) * scale
        try:
            return cls(**kwargs)
        except ValueError as exc:
            raise ValueError(str(exc).replace("settle.", f"{path}.", 1)) from None


@dataclass(frozen=True)
class SettleStatus:
    """Result of feeding one sample to a :class:`SettleDetector`.

    Attributes
    ----------
    settled : bool
        The quiet window is at least ``dwell_s`` long.
    window_start_ns, window_end_ns : int
        Host ``monotonic_ns`` of the first and latest sample of the current quiet window
        (both 0 when the latest sample was not quiet).
    quiet_s : float
        Length of the current quiet window (s).
    max_joint_speed_rad_s, max_flange_speed_m_s, max_flange_ang_speed_rad_s : float
        Largest values seen inside the quiet window (the settle figures a capture records).
    n_samples : int
        Samples in the quiet window.
    reason : str
        Why the latest sample was not quiet (empty when it was).
    """

    settled: bool
    window_start_ns: int
    window_end_ns: int
    quiet_s: float
    max_joint_speed_rad_s: float
    max_flange_speed_m_s: float
    max_flange_ang_speed_rad_s: float
    n_samples: int
    reason: str = ""


class SettleDetector:
    """Incremental settle detection over a stream of :class:`~cellcal.drivers.robot.RobotState`.

    Feed every sample in order with :meth:`update`; the host stamps ``t_host_ns`` define
    the window. Not thread-safe: one detector per consumer.
    """

    def __init__(self, config: SettleConfig | None = None) -> None:
        self.config = config or SettleConfig()
        self.reset()

    def reset(self) -> None:
        """Forget the current window (e.g. after commanding a new move)."""
        self._start_ns = 0
        self._last_ns: int | None = None
        self._n = 0
        self._max_qd = 0.0
        self._max_lin = 0.0
        self._max_ang = 0.0

    def _quiet_reason(self, state: RobotState) -> tuple[str, float]:
        from cellcal.drivers.robot import RobotMode  # local: robot imports this module

        c = self.config
        qd = float(np.max(np.abs(state.qd_rad_s))) if len(state.qd_rad_s) else 0.0
        if state.mode not in (RobotMode.RUNNING, RobotMode.IDLE):
            return f"mode {state.mode.name}", qd
        if not qd <= c.max_joint_speed_rad_s:  # 'not <=' also rejects NaN
            return f"joint speed {math.degrees(qd):.4g} deg/s", qd
        if not state.flange_speed_m_s <= c.max_flange_speed_m_s:
            return f"flange speed {state.flange_speed_m_s * 1e3:.4g} mm/s", qd
        if not state.flange_ang_speed_rad_s <= c.max_flange_ang_speed_rad_s:
            return f"flange angular speed {math.degrees(state.flange_ang_speed_rad_s):.4g} deg/s", qd
        if c.require_target_reached and state.target_reached is False:
            return "target not reached", qd
        return "", qd

    def update(self, state: RobotState) -> SettleStatus:
        """Add one sample (later than the previous one) and return the settle status."""
        t = int(state.t_host_ns)
        reason, qd = self._quiet_reason(state)
        gap = (
            self._last_ns is not None
            and (t - self._last_ns) * 1e-9 > self.config.max_sample_gap_s
        )
        self._last_ns = t
        if reason:
            self.reset()
            self._last_ns = t
            return SettleStatus(False, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, reason)
        if gap:  # nothing is known about the hole: a new window starts at this sample
            self.reset()
            self._last_ns = t
        if self._n == 0:
            self._start_ns = t
        self._n += 1
        self._max_qd = max(self._max_qd, qd)
        self._max_lin = max(self._max_lin, state.flange_speed_m_s)
        self._max_ang = max(self._max_ang, state.flange_ang_speed_rad_s)
        quiet_s = (t - self._start_ns) * 1e-9
        return SettleStatus(
            quiet_s >= self.config.dwell_s,
            self._start_ns,
            t,
            quiet_s,
            self._max_qd,
            self._max_lin,
            self._max_ang,
            self._n,
        )
