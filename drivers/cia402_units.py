"""CiA 402 drive units and synchronised profile-position moves, without I/O.

A CiA 402 drive counts position in *position units* (0x6064, 0x607A), velocity in
*velocity units* (0x6081 profile velocity, 0x606C velocity actual value) and acceleration in
*acceleration units* (0x6083 profile acceleration, 0x6084 profile deceleration). With the
factor group absent all three are increments: counts, counts/s, counts/s². Many drives
ship otherwise: motor rpm for velocity (announced by 0x60A9 *SI unit velocity*), rpm/s for
acceleration, or a factor group (0x6093 position factor, 0x6094 velocity encoder factor,
0x6097 acceleration factor). A driver that writes counts/s into a drive that reads rpm
commands ``counts_per_rev / 60`` times the speed it meant, so the units are resolved once
at open (:func:`resolve_joint_units`), checked against the configured limits
(:func:`check_joint_limits`), and every move is planned in radians and converted with them.

Moves are **synchronised trapezoids** (:func:`plan_sync_move`): every joint of a move
follows the same normalised profile ``s(t)`` from 0 to 1, joint ``j`` at
``q0_j + dq_j s(t)``, so all joints accelerate, cruise, decelerate and arrive together.
The profile's peak rate, acceleration and deceleration are the largest every joint's limits
allow: ``V = min_j v_j / |dq_j|``, ``A = min_j a_j / |dq_j|``, ``D = min_j d_j / |dq_j|``,
and a joint's profile velocity, acceleration and deceleration are ``|dq_j|`` times those.
:func:`to_drive_units` rounds them *down* to whole drive units (never above a limit), at
least 1 (a drive may refuse 0).

Joint speed is never above the configured limit: the plan's peak joint speed is at most
``v_j`` by construction, the rounding is downwards, and the conversion uses the resolved
units. ``docs/protocols/robot.md`` section 3.4 describes the URL keys.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "VELOCITY_UNITS",
    "ACCEL_UNITS",
    "SI_UNIT_RPM",
    "JointUnits",
    "JointLimits",
    "SyncMove",
    "DriveUnitObjects",
    "decode_si_velocity",
    "parse_unit_tokens",
    "resolve_joint_units",
    "check_joint_limits",
    "plan_sync_move",
    "to_drive_units",
]

#: ``velocity_units`` values: ``auto`` reads the drive (0x60A9, else the factor group 0x6094,
#: else counts/s); ``counts_per_s`` position units per second; ``rpm`` motor revolutions per
#: minute (``counts_per_rev`` position units per revolution).
VELOCITY_UNITS = ("auto", "counts_per_s", "rpm")
#: ``accel_units`` values: ``auto`` (0x6097 if the drive has it, else the velocity unit per
#: second), ``counts_per_s2``, ``rpm_per_s``.
ACCEL_UNITS = ("auto", "counts_per_s2", "rpm_per_s")

#: Bytes 2..1 of a CiA 402 / ETG.6010 SI unit (0x60A9) meaning revolutions per minute; byte 3
#: is a signed power-of-ten prefix (0xFD: 0.001 rpm).
SI_UNIT_RPM = 0xB447
_U32_MAX = 2**32 - 1
#: Below this many drive units at full speed, rounding to whole units is coarse (warned).
COARSE_UNITS = 100


def decode_si_velocity(value: int) -> float | None:
    """The velocity unit 0x60A9 announces, in motor rpm (``None`` if not an rpm unit).

    ``0x00B44700`` is 1 rpm, ``0xFDB44700`` 0.001 rpm (prefix byte -3).
    """
    value = int(value) & 0xFFFFFFFF
    if (value >> 8) & 0xFFFF != SI_UNIT_RPM:
        return None
    prefix = (value >> 24) & 0xFF
    if prefix >= 0x80:
        prefix -= 0x100
    if not -9 <= prefix <= 9:
        return None
    return 10.0 ** prefix


def parse_unit_tokens(allowed: Sequence[str], n: int):
    """Parser for one unit name for every joint, or ``n`` comma-separated ones."""

    def parse(v: Any) -> tuple[str, ...]:
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",") if p.strip()]
        elif isinstance(v, Sequence):
            parts = [str(p) for p in v]
        else:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        if len(parts) == 1:
            parts = parts * n
        if len(parts) != n:
            raise ValueError(f"expected 1 or {n} unit names, got {len(parts)}")
        for p in parts:
            if p not in allowed:
                raise ValueError(f"{p!r}: expected one of {', '.join(allowed)}")
        return tuple(parts)

    return parse


@dataclass(frozen=True)
class DriveUnitObjects:
    """What a drive says about its units (each ``None`` when the drive lacks the object).

    Attributes
    ----------
    si_velocity : int or None
        0x60A9 SI unit velocity (raw 32 bit).
    position_factor : (num, div) or None
        0x6093: increments per position unit.
    velocity_encoder_factor : (num, div) or None
        0x6094: increments per second per velocity unit.
    acceleration_factor : (num, div) or None
        0x6097: increments per second² per acceleration unit.
    encoder_resolution : (increments, motor revolutions) or None
        0x608F.
    """

    si_velocity: int | None = None
    position_factor: tuple[int, int] | None = None
    velocity_encoder_factor: tuple[int, int] | None = None
    acceleration_factor: tuple[int, int] | None = None
    encoder_resolution: tuple[int, int] | None = None


@dataclass(frozen=True)
class JointUnits:
    """How one drive's position, velocity and acceleration units map to its joint.

    Attributes
    ----------
    counts_per_rad : float
        Position units per joint radian (``counts_per_rev * gear_ratio / 2 pi``).
    velocity_unit_counts_s : float
        Position units per second in one velocity unit (0x6081, 0x606C).
    accel_unit_counts_s2 : float
        Position units per second² in one acceleration unit (0x6083, 0x6084).
    velocity_source, accel_source : str
        Where the unit came from, for the log (``"rpm (0x60A9 = 0x00B44700)"``, ...).
    """

    counts_per_rad: float
    velocity_unit_counts_s: float
    accel_unit_counts_s2: float
    velocity_source: str
    accel_source: str

    @property
    def rad_s_per_velocity_unit(self) -> float:
        """Joint speed of one velocity unit (rad/s)."""
        return self.velocity_unit_counts_s / self.counts_per_rad

    @property
    def rad_s2_per_accel_unit(self) -> float:
        """Joint acceleration of one acceleration unit (rad/s²)."""
        return self.accel_unit_counts_s2 / self.counts_per_rad


def _ratio(pair: tuple[int, int] | None, what: str) -> float | None:
    if pair is None:
        return None
    num, div = pair
    if num <= 0 or div <= 0:
        raise ValueError(f"{what} is {num}/{div}: not a usable factor")
    return num / div


def resolve_joint_units(
    *,
    counts_per_rev: float,
    gear_ratio: float,
    velocity_units: str = "auto",
    velocity_factor: float = 1.0,
    accel_units: str = "auto",
    accel_factor: float = 1.0,
    drive: DriveUnitObjects | None = None,
) -> JointUnits:
    """The units one drive uses, from the configuration and what the drive reports.

    Parameters
    ----------
    counts_per_rev : float
        Position units (0x6064) per motor revolution.
    gear_ratio : float
        Motor revolutions per joint revolution.
    velocity_units, accel_units : str
        One of :data:`VELOCITY_UNITS` / :data:`ACCEL_UNITS`.
    velocity_factor, accel_factor : float
        Multiplier of a configured unit (``velocity_units=rpm&velocity_factor=0.1``: 0x6081
        in 0.1 rpm); only with an explicit unit.
    drive : DriveUnitObjects
        The drive's unit objects.

    Raises
    ------
    ValueError
        The configuration contradicts the drive (e.g. ``velocity_units=counts_per_s`` on a
        drive whose 0x60A9 says rpm, ``counts_per_rev`` unlike 0x608F / 0x6093), or the
        drive's unit cannot be understood and none is configured.
    """
    d = drive or DriveUnitObjects()
    if not (counts_per_rev > 0 and gear_ratio > 0 and velocity_factor > 0 and accel_factor > 0):
        raise ValueError("counts_per_rev, gear_ratio and the unit factors must be > 0")
    if velocity_units == "auto" and velocity_factor != 1.0:
        raise ValueError("velocity_factor needs an explicit velocity_units")
    if accel_units == "auto" and accel_factor != 1.0:
        raise ValueError("accel_factor needs an explicit accel_units")
    counts_per_rad = counts_per_rev * gear_ratio / (2 * math.pi)
    f_pos = _ratio(d.position_factor, "0x6093 position factor") or 1.0
    # position units against the drive's own encoder resolution, when it tells
    if d.encoder_resolution is not None:
        inc_per_rev = _ratio(d.encoder_resolution, "0x608F position encoder resolution")
        assert inc_per_rev is not None
        units_per_rev = inc_per_rev / f_pos
        if not math.isclose(units_per_rev, counts_per_rev, rel_tol=1e-6):
            raise ValueError(
                f"counts_per_rev={counts_per_rev:g} but the drive counts {units_per_rev:g} position "
                f"units per motor revolution (0x608F / 0x6093)"
            )
    rpm_counts_s = counts_per_rev / 60.0
    si_rpm = decode_si_velocity(d.si_velocity) if d.si_velocity is not None else None
    si_text = f"0x60A9 = 0x{d.si_velocity:08X}" if d.si_velocity is not None else ""

    # velocity
    if velocity_units == "auto":
        if d.si_velocity is not None:
            if si_rpm is None:
                raise ValueError(f"the drive's velocity unit ({si_text}) is not one this driver "
                                 "knows; set velocity_units (and velocity_factor)")
            v_unit, v_src = si_rpm * rpm_counts_s, f"{si_rpm:g} rpm ({si_text})"
        elif d.velocity_encoder_factor is not None:
            f_v = _ratio(d.velocity_encoder_factor, "0x6094 velocity encoder factor")
            assert f_v is not None
            v_unit, v_src = f_v / f_pos, f"factor group (0x6094 = {d.velocity_encoder_factor[0]}/{d.velocity_encoder_factor[1]})"
        else:
            v_unit, v_src = 1.0, "counts/s (no 0x60A9 or factor group)"
    elif velocity_units == "rpm":
        v_unit, v_src = velocity_factor * rpm_counts_s, f"{velocity_factor:g} rpm (configured)"
        if d.si_velocity is not None and (si_rpm is None or not math.isclose(si_rpm, velocity_factor)):
            raise ValueError(f"velocity_units=rpm, velocity_factor={velocity_factor:g} but the drive "
                             f"reports {si_text}")
    elif velocity_units == "counts_per_s":
        v_unit, v_src = velocity_factor, f"{velocity_factor:g} counts/s (configured)"
        if si_rpm is not None:
            raise ValueError(f"velocity_units=counts_per_s but the drive reports {si_text} "
                             f"({si_rpm:g} rpm)")
    else:
        raise ValueError(f"velocity_units {velocity_units!r}: expected one of {', '.join(VELOCITY_UNITS)}")

    # acceleration
    if accel_units == "auto":
        if d.acceleration_factor is not None:
            f_a = _ratio(d.acceleration_factor, "0x6097 acceleration factor")
            assert f_a is not None
            a_unit, a_src = f_a / f_pos, f"factor group (0x6097 = {d.acceleration_factor[0]}/{d.acceleration_factor[1]})"
        else:
            a_unit, a_src = v_unit, f"velocity unit per second ({v_src.split(' (')[0]}/s)"
    elif accel_units == "rpm_per_s":
        a_unit, a_src = accel_factor * rpm_counts_s, f"{accel_factor:g} rpm/s (configured)"
    elif accel_units == "counts_per_s2":
        a_unit, a_src = accel_factor, f"{accel_factor:g} counts/s² (configured)"
    else:
        raise ValueError(f"accel_units {accel_units!r}: expected one of {', '.join(ACCEL_UNITS)}")
    return JointUnits(counts_per_rad, v_unit, a_unit, v_src, a_src)


@dataclass(frozen=True)
class JointLimits:
    """Per-joint motion limits in SI after every check (what moves are planned with).

    Attributes
    ----------
    speed_rad_s, accel_rad_s2, decel_rad_s2 : numpy.ndarray, shape (n,)
        The configured limits, lowered where the drive's own maxima (0x607F, 0x60C5,
        0x60C6) are lower.
    notes : tuple of str
        What lowered a limit, or why rounding is coarse (for the log).
    """

    speed_rad_s: np.ndarray
    accel_rad_s2: np.ndarray
    decel_rad_s2: np.ndarray
    notes: tuple[str, ...] = ()


def check_joint_limits(
    units: Sequence[JointUnits],
    speed_rad_s: np.ndarray,
    accel_rad_s2: np.ndarray,
    decel_rad_s2: np.ndarray,
    *,
    drive_max_velocity: Sequence[int | None] | None = None,
    drive_max_accel: Sequence[int | None] | None = None,
    drive_max_decel: Sequence[int | None] | None = None,
    names: Sequence[str] | None = None,
) -> JointLimits:
    """Validate the configured limits against each drive's units and maxima.

    Raises
    ------
    ValueError
        A limit below one drive unit (the drive cannot be commanded that slowly: the unit is
        too coarse for the configuration) or beyond the 32-bit object range, naming the joint.
    """
    n = len(units)
    names = list(names) if names is not None else [f"joint {j + 1}" for j in range(n)]
    v = np.array(speed_rad_s, dtype=float).copy()
    a = np.array(accel_rad_s2, dtype=float).copy()
    dcl = np.array(decel_rad_s2, dtype=float).copy()
    notes: list[str] = []
    maxima = (drive_max_velocity or [None] * n, drive_max_accel or [None] * n, drive_max_decel or [None] * n)
    for j, u in enumerate(units):
        for arr, per_unit, obj, what, maxv in (
            (v, u.rad_s_per_velocity_unit, "0x607F max profile velocity", "speed", maxima[0][j]),
            (a, u.rad_s2_per_accel_unit, "0x60C5 max acceleration", "acceleration", maxima[1][j]),
            (dcl, u.rad_s2_per_accel_unit, "0x60C6 max deceleration", "deceleration", maxima[2][j]),
        ):
            if maxv is not None and maxv > 0 and maxv * per_unit < arr[j]:
                notes.append(f"{names[j]}: {obj} = {maxv} units ({maxv * per_unit:.4g} SI) limits the "
                             f"configured {what} {arr[j]:.4g}")
                arr[j] = maxv * per_unit
            in_units = arr[j] / per_unit
            if in_units < 1.0:
                raise ValueError(
                    f"{names[j]}: the configured {what} {arr[j]:.4g} is {in_units:.3g} drive units; one unit is "
                    f"{per_unit:.4g} (SI) -- the unit is too coarse (check velocity_units/accel_units, "
                    f"counts_per_rev, gear_ratio)"
                )
            if in_units > _U32_MAX:
                raise ValueError(f"{names[j]}: the configured {what} is {in_units:.4g} drive units, beyond "
                                 "the 32-bit object range (check the units)")
            if in_units < COARSE_UNITS:
                notes.append(f"{names[j]}: full {what} is only {in_units:.0f} drive units; values are rounded "
                             "down to whole units, so joints may arrive up to "
                             f"{100.0 / max(in_units, 1.0):.0f} % apart")
    return JointLimits(v, a, dcl, tuple(notes))


@dataclass(frozen=True)
class SyncMove:
    """A synchronised trapezoidal move (every joint shares the phase durations).

    Attributes
    ----------
    duration_s, t_accel_s, t_cruise_s, t_decel_s : float
        Total time and the three phases (s).
    speed_rad_s, accel_rad_s2, decel_rad_s2 : numpy.ndarray, shape (n,)
        Each joint's peak speed, acceleration and deceleration (non-negative; 0 for a joint
        that does not move).
    """

    duration_s: float
    t_accel_s: float
    t_cruise_s: float
    t_decel_s: float
    speed_rad_s: np.ndarray
    accel_rad_s2: np.ndarray
    decel_rad_s2: np.ndarray

    def progress(self, t_s: float) -> float:
        """The normalised profile ``s(t)`` in [0, 1]: the fraction of its distance every
        joint has covered ``t_s`` seconds after the start (0 before, 1 after the end)."""
        if self.duration_s <= 0 or t_s >= self.duration_s:
            return 1.0
        if t_s <= 0:
            return 0.0
        ta, tc, td = self.t_accel_s, self.t_cruise_s, self.t_decel_s
        peak = 1.0 / (0.5 * ta + tc + 0.5 * td)  # the area under the rate profile is 1
        if t_s < ta:
            return 0.5 * peak / ta * t_s * t_s
        if t_s < ta + tc:
            return peak * (0.5 * ta + (t_s - ta))
        left = self.duration_s - t_s  # in the deceleration: mirror of the remaining distance
        return 1.0 - 0.5 * peak / td * left * left if td > 0 else 1.0


def plan_sync_move(
    dq_rad: np.ndarray, speed_rad_s: np.ndarray, accel_rad_s2: np.ndarray, decel_rad_s2: np.ndarray
) -> SyncMove:
    """Plan a move of ``dq_rad`` (n,) so every joint arrives together.

    Every limit is a positive (n,) array (or a scalar). A joint's peak speed,
    acceleration and deceleration never exceed its limits.
    """
    h = np.abs(np.asarray(dq_rad, dtype=float).reshape(-1))
    n = h.size
    v_lim = np.broadcast_to(np.asarray(speed_rad_s, dtype=float), (n,))
    a_lim = np.broadcast_to(np.asarray(accel_rad_s2, dtype=float), (n,))
    d_lim = np.broadcast_to(np.asarray(decel_rad_s2, dtype=float), (n,))
    if not (np.all(np.isfinite(h)) and np.all(v_lim > 0) and np.all(a_lim > 0) and np.all(d_lim > 0)):
        raise ValueError("plan_sync_move: finite distances and positive limits required")
    moving = h > 1e-12  # below a picoradian a joint does not move (and 1/h would overflow)
    zeros = np.zeros(n)
    if not np.any(moving):
        return SyncMove(0.0, 0.0, 0.0, 0.0, zeros, zeros.copy(), zeros.copy())
    hm = h[moving]
    # limits of the normalised profile s(t): 0 -> 1
    V = float(np.min(v_lim[moving] / hm))
    A = float(np.min(a_lim[moving] / hm))
    D = float(np.min(d_lim[moving] / hm))
    v_peak = min(V, math.sqrt(2.0 * A * D / (A + D)))  # triangle when the cruise would be < 0
    t_a, t_d = v_peak / A, v_peak / D
    cruise = max(0.0, (1.0 - v_peak * v_peak / (2 * A) - v_peak * v_peak / (2 * D)) / v_peak)
    return SyncMove(t_a + cruise + t_d, t_a, cruise, t_d, h * v_peak, h * A, h * D)


def to_drive_units(move: SyncMove, units: Sequence[JointUnits]) -> list[tuple[int, int, int]]:
    """Profile velocity, acceleration and deceleration per joint in drive units (0x6081,
    0x6083, 0x6084): rounded down, at least 1, at most 2**32 - 1."""
    out = []
    for j, u in enumerate(units):
        vals = []
        for x, per in ((move.speed_rad_s[j], u.rad_s_per_velocity_unit),
                       (move.accel_rad_s2[j], u.rad_s2_per_accel_unit),
                       (move.decel_rad_s2[j], u.rad_s2_per_accel_unit)):
            # a hair below the exact quotient so an exact limit never rounds up through float error
            k = math.floor(x / per * (1.0 - 1e-12))
            vals.append(int(min(max(k, 1), _U32_MAX)))
        out.append((vals[0], vals[1], vals[2]))
    return out

