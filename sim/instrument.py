"""What a simulated measuring instrument measures, whatever protocol it speaks.

:class:`InstrumentModel` holds the physics every simulated tracker and total station shares:
where the target is (the :class:`~cellcal.sim.world.World`), the scenario's noise, and when
a measurement is refused or fails (warm-up, beam break, re-acquisition, no target, out of
range, target not steady). The protocol devices -- the cellcal tracker
(:mod:`cellcal.sim.tracker_sim`), emScon TPI (:mod:`cellcal.sim.emscon_sim`) and GeoCOM
(:mod:`cellcal.sim.geocom_sim`) -- only turn its answers into their own packets and codes,
so a more realistic model here reaches every protocol at once.

The error model (``docs/simulation.md``, magnitudes in ADR 0015):

* **noise in beam coordinates** (:class:`TrackerNoiseModel`): along the beam from the
  instrument's position (radial) and across it (transverse), each a constant plus a term
  per metre of range, as ISO 10360-10 MPE statements are written; plus the scenario's
  per-cell-axis ``noise_mm`` if given. One raw sample has that covariance; an average over
  ``n`` samples has it divided by the number of *independent* samples (``noise_correlation_ms``:
  turbulence makes neighbouring samples alike), so a longer average trades time for noise
  up to that limit;
* a **rotation** std for 6-DoF probes (``noise_deg``), about the target's axes;
* **outliers**: with ``outlier_probability`` a measurement carries a gross error its
  reported std knows nothing of;
* a **refraction scale error**: the air warms at ``air_temperature_k_per_h`` after the
  weather compensation was set, the range reads short by ``refraction_ppm_per_k`` ppm/K;
* **beam breaks** (scheduled, or random at ``beam_breaks_per_h``) after which the tracker
  needs ``reacquire_s`` to find the target again.

The reported standard deviations are those of the noise actually drawn (the covariance of
the average), so a measurement's std is consistent with what the instrument does; outliers
and the refraction error are, as on a real instrument, not in it.

Reasons are :class:`~cellcal.drivers.tracker_codec.NakCode` values: the cellcal protocol's
vocabulary, which each protocol device maps to its own status codes.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from cellcal.drivers.tracker_codec import NakCode
from cellcal.sim.scenario import FaultKind, TrackerConfig
from cellcal.sim.world import World
from cellcal.solver.se3 import so3_exp

__all__ = ["InstrumentModel", "Sample", "NEAR_RANGE_FRACTION", "TrackerNoiseModel", "MPE_COVERAGE_FACTOR"]

#: An MPE statement read as an expanded uncertainty with this coverage factor (k = 2, about
#: 95 % for a normal error): 1-sigma = MPE / 2.
MPE_COVERAGE_FACTOR = 2.0

#: Fraction of the maximum range beyond which a measurement is flagged near the range limit.
NEAR_RANGE_FRACTION = 0.98


@dataclass(frozen=True, kw_only=True)
class TrackerNoiseModel:
    """1-sigma noise of a laser tracker in beam coordinates (the simulator's draw).

    The same parameters, method names and conventions as the solver's tracker noise model
    (``cellcal.solver.TrackerNoiseModel``), so the simulator can be switched to it: where the
    instrument is, the radial (along the beam) and transverse (across it, each of the two
    directions) 1-sigma as a constant (m) plus a term per metre of range (m/m), and a rotation
    std for 6-DoF probes. Unlike a fit's model, zero everywhere is allowed (an exact
    simulated instrument).

    Attributes
    ----------
    cell_p_instrument : numpy.ndarray, shape (3,)
        The instrument's centre in the cell frame, m.
    radial_std_m, radial_std_per_m, transverse_std_m, transverse_std_per_m : float
    rotation_std_rad : float or None
    """

    cell_p_instrument: np.ndarray = field(default_factory=lambda: np.zeros(3))
    radial_std_m: float = 0.0
    radial_std_per_m: float = 0.0
    transverse_std_m: float = 0.0
    transverse_std_per_m: float = 0.0
    rotation_std_rad: float | None = None

    def __post_init__(self) -> None:
        c = np.array(self.cell_p_instrument, dtype=float).reshape(-1)
        if c.shape != (3,) or not np.all(np.isfinite(c)):
            raise ValueError(f"cell_p_instrument: expected 3 finite numbers, got {self.cell_p_instrument!r}")
        object.__setattr__(self, "cell_p_instrument", c)
        for key in ("radial_std_m", "radial_std_per_m", "transverse_std_m", "transverse_std_per_m"):
            v = float(getattr(self, key))
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{key}: must be a non-negative finite number, got {v!r}")
            object.__setattr__(self, key, v)

    @classmethod
    def from_mpe(cls, cell_p_instrument: ArrayLike, *, radial_mpe: tuple[float, float],
                 transverse_mpe: tuple[float, float], rotation_mpe_rad: float | None = None,
                 coverage_factor: float = MPE_COVERAGE_FACTOR) -> TrackerNoiseModel:
        """From MPE statements ``+-(A + B d)``: ``(A, B)`` in m and m/m, each divided by
        ``coverage_factor`` (an MPE read as an expanded uncertainty, k = 2 by default)."""
        k = float(coverage_factor)
        return cls(cell_p_instrument=np.asarray(cell_p_instrument, dtype=float),
                   radial_std_m=radial_mpe[0] / k, radial_std_per_m=radial_mpe[1] / k,
                   transverse_std_m=transverse_mpe[0] / k, transverse_std_per_m=transverse_mpe[1] / k,
                   rotation_std_rad=None if rotation_mpe_rad is None else rotation_mpe_rad / k)

    def stds(self, cell_p: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """``(radial, transverse)`` 1-sigma (m), each (N,), at target positions (N, 3)."""
        p = np.atleast_2d(np.asarray(cell_p, dtype=float))
        d = np.linalg.norm(p - self.cell_p_instrument, axis=1)
        return self.radial_std_m + self.radial_std_per_m * d, self.transverse_std_m + self.transverse_std_per_m * d

    def point_covariance(self, cell_p: ArrayLike) -> np.ndarray:
        """Covariances (N, 3, 3), cell frame, m^2: ``sr^2 u u^T + st^2 (I - u u^T)``, ``u`` the
        beam direction (a target at the instrument's centre: isotropic ``st^2 I``)."""
        p = np.atleast_2d(np.asarray(cell_p, dtype=float))
        v = p - self.cell_p_instrument
        d = np.linalg.norm(v, axis=1)
        u = np.where(d[:, None] > 0, v / np.where(d > 0, d, 1.0)[:, None], 0.0)
        sr, st = self.stds(p)
        uu = u[:, :, None] * u[:, None, :]
        return (sr**2)[:, None, None] * uu + (st**2)[:, None, None] * (np.eye(3) - uu)

    def pose_covariance(self, cell_T_target: ArrayLike) -> np.ndarray:
        """Covariances (N, 6, 6) of poses (N, 4, 4): the point part, then
        ``rotation_std_rad^2 I`` (the solver's convention: dphi about the cell axes)."""
        T = np.asarray(cell_T_target, dtype=float).reshape(-1, 4, 4)
        out = np.zeros((T.shape[0], 6, 6))
        out[:, :3, :3] = self.point_covariance(T[:, :3, 3])
        out[:, 3:, 3:] = (self.rotation_std_rad or 0.0) ** 2 * np.eye(3)
        return out

    def sample(self, rng: np.random.Generator, cell_p: ArrayLike) -> np.ndarray:
        """Noise draws (N, 3) for points measured at ``cell_p``."""
        C = self.point_covariance(cell_p)
        return np.stack([_draw(rng, c) for c in C])


def _draw(rng: np.random.Generator, cov: np.ndarray) -> np.ndarray:
    """One draw of N(0, cov) for a positive semi-definite (3, 3) covariance (zeros allowed)."""
    w, V = np.linalg.eigh(cov)
    return V @ (np.sqrt(np.clip(w, 0.0, None)) * rng.normal(0.0, 1.0, 3))


@dataclass(frozen=True)
class Sample:
    """One averaged measurement of the target, in the instrument (= cell) frame.

    Attributes
    ----------
    xyz_m : numpy.ndarray, shape (3,)
        Measured position, metres (truth plus noise).
    std_m : numpy.ndarray, shape (3,)
        Standard uncertainty of that average along x, y, z, metres.
    cell_T_target : numpy.ndarray, shape (4, 4), or None
        Measured pose (orientation noise applied) for a pose measurement.
    std_rad : numpy.ndarray, shape (3,), or None
        Orientation standard uncertainty about the target's axes (pose only).
    n : int
        Raw samples averaged.
    near_range_limit : bool
    cov_m2 : numpy.ndarray, shape (3, 3)
        Full covariance of the averaged position (cell frame, m^2); ``std_m`` is the root
        of its diagonal.
    outlier : bool
        The measurement carries a gross error (not in its std; the truth, for tests).
    """

    xyz_m: np.ndarray
    std_m: np.ndarray
    cell_T_target: np.ndarray | None
    std_rad: np.ndarray | None
    n: int
    near_range_limit: bool
    cov_m2: np.ndarray | None = None
    outlier: bool = False


class InstrumentModel:
    """Truth, noise and refusals of one simulated instrument.

    Parameters
    ----------
    world : World
    config : TrackerConfig
        Noise, sample rate, limits, warm-up and the fault schedule (simulated seconds).
    seed : int
        Seeds the noise generator.
    """

    def __init__(self, world: World, config: TrackerConfig, *, seed: int = 0) -> None:
        self.world = world
        self.config = config
        self.rng = np.random.default_rng(seed)
        # separate streams, so switching outliers or random breaks on leaves the noise draws alone
        self._outlier_rng = np.random.default_rng([seed, 1])
        self._break_rng = np.random.default_rng([seed, 2])
        self._breaks: list[tuple[float, float]] = []  # random beam breaks, sim seconds
        self._break_starts: list[float] = []  # their starts, for bisection
        self._breaks_until = 0.0
        # Value faults of the instrument model (frozen_position, fixed_reflector,
        # wrong_reflector): the position a fault holds, and the target's moves counted
        # (a station is a rest between two moves; every second one sees the wrong reflector).
        self._held: dict[FaultKind, np.ndarray] = {}
        self._moves = 0
        self._last_true: np.ndarray | None = None
        self._last_xyz: np.ndarray | None = None

    @property
    def noise_model(self) -> TrackerNoiseModel:
        """The beam-coordinate part of the noise of one raw sample."""
        c = self.config
        return TrackerNoiseModel(cell_p_instrument=c.cell_p_instrument, radial_std_m=c.radial_noise_m,
                                 radial_std_per_m=c.radial_noise_per_m, transverse_std_m=c.transverse_noise_m,
                                 transverse_std_per_m=c.transverse_noise_per_m,
                                 rotation_std_rad=float(np.max(c.noise_rad)) or None)

    # -- beam breaks: scheduled, random, and the re-acquisition after each ---------------------
    def _random_breaks(self, t0_s: float, t1_s: float) -> list[tuple[float, float]]:
        """The random breaks that overlap ``[t0_s, t1_s]``, drawn up to ``t1_s`` on demand.

        They are drawn one after another, so they are sorted and do not overlap: a bisection
        finds the ones near ``t1_s`` (a sim that runs for days keeps thousands of them).
        """
        rate = self.config.beam_breaks_per_h / 3600.0
        if rate <= 0:
            return []
        while self._breaks_until <= t1_s:
            start = self._breaks_until + float(self._break_rng.exponential(1.0 / rate))
            self._breaks.append((start, start + self.config.beam_break_s))
            self._break_starts.append(start)
            self._breaks_until = start + self.config.beam_break_s
        j = bisect.bisect_right(self._break_starts, t1_s)
        i = j
        while i > 0 and self._breaks[i - 1][1] > t0_s:
            i -= 1
        return self._breaks[i:j]

    def _break_windows(self, t0_s: float, t1_s: float) -> list[tuple[float, float]]:
        scheduled = [(f.start_s, f.end_s) for f in self.config.faults if f.kind is FaultKind.BEAM_BREAK]
        return scheduled + self._random_breaks(t0_s, t1_s)

    def beam_broken(self, t0_s: float, t1_s: float | None = None) -> bool:
        """The beam is interrupted at ``t0_s`` (or at any time in ``[t0_s, t1_s]``)."""
        t1 = t0_s if t1_s is None else t1_s
        return any(a <= t1 and t0_s < b for a, b in self._break_windows(t0_s, t1))

    def reacquiring(self, t0_s: float, t1_s: float | None = None) -> bool:
        """The beam is back but the tracker is still searching for the target."""
        r = self.config.reacquire_s
        if r <= 0:
            return False
        t1 = t0_s if t1_s is None else t1_s
        return any(b <= t1 and t0_s < b + r for _a, b in self._break_windows(t0_s - r, t1))

    # -- conditions at simulated time t_s --------------------------------------------------
    def active(self, kind: FaultKind, t_s: float) -> bool:
        """Whether a scheduled fault of ``kind`` is active at ``t_s``."""
        return any(f.kind is kind and f.active(t_s) for f in self.config.faults)

    def overlapping(self, kind: FaultKind, t0_s: float, t1_s: float) -> bool:
        """Whether a scheduled fault of ``kind`` is active at any time in ``[t0_s, t1_s]``."""
        return any(f.kind is kind and f.overlaps(t0_s, t1_s) for f in self.config.faults)

    def warmed_up(self, t_s: float) -> bool:
        return t_s >= self.config.warmup_s

    def target_locked(self, t_s: float) -> bool:
        """The beam reaches the target (no beam break, not re-acquiring, a target present)."""
        return not (self.beam_broken(t_s) or self.reacquiring(t_s) or self.active(FaultKind.NO_TARGET, t_s))

    def stable(self, t_s: float) -> bool:
        """The target is steady: the flange slower than the stability thresholds."""
        lin, ang = self.world.flange_speed()
        return (
            lin <= self.config.stable_speed_m_s
            and ang <= self.config.stable_speed_rad_s
            and not self.active(FaultKind.NOT_STABLE, t_s)
        )

    def distance_m(self, t_s: float) -> float:
        """True distance from the instrument (``instrument_xyz_m``, the cell origin by
        default) to the target."""
        return float(np.linalg.norm(self.world.cell_T_target(t_s)[:3, 3] - self.config.cell_p_instrument))

    def refusal(self, t_s: float) -> NakCode | None:
        """Why a measurement cannot start at ``t_s``, or ``None`` when it can."""
        if not self.warmed_up(t_s):
            return NakCode.NOT_WARMED_UP
        if self.beam_broken(t_s):
            return NakCode.BEAM_BROKEN
        if self.active(FaultKind.NO_TARGET, t_s) or self.reacquiring(t_s):
            return NakCode.NO_TARGET
        if not self.config.min_range_m <= self.distance_m(t_s) <= self.config.max_range_m:
            return NakCode.OUT_OF_RANGE
        if not self.stable(t_s):
            return NakCode.NOT_STABLE
        return None

    def failure(self, start_s: float, end_s: float, unstable: bool) -> NakCode | None:
        """Why a measurement window ``[start_s, end_s]`` yields no result, or ``None``.

        ``unstable`` says whether the target was seen moving during the window.
        """
        if self.beam_broken(start_s, end_s):
            return NakCode.BEAM_BROKEN
        if self.overlapping(FaultKind.NO_TARGET, start_s, end_s) or self.reacquiring(start_s, end_s):
            return NakCode.NO_TARGET
        if unstable:
            return NakCode.NOT_STABLE
        return None

    def sample_count(self, average_s: float) -> int:
        """Raw samples an average over ``average_s`` device seconds takes (at least one)."""
        return max(1, round(average_s * self.config.sample_rate_hz))

    def independent_samples(self, n: int) -> float:
        """How many of ``n`` raw samples are independent (``noise_correlation_ms``)."""
        c = self.config
        if c.noise_correlation_s <= 0:
            return float(n)
        return max(1.0, min(float(n), n / c.sample_rate_hz / c.noise_correlation_s))

    def refraction_scale(self, t_s: float) -> float:
        """The range's scale error at ``t_s`` (dimensionless; 0: none)."""
        c = self.config
        return -c.refraction_ppm_per_k * 1e-6 * c.air_temperature_k_per_h * max(t_s, 0.0) / 3600.0

    def covariance(self, cell_p: np.ndarray, n: int) -> np.ndarray:
        """Covariance (3, 3) of an average of ``n`` samples at ``cell_p``, cell frame, m^2."""
        c = self.config
        cov = np.diag(c.noise_m**2)
        if c.has_beam_noise:
            cov = cov + self.noise_model.point_covariance(cell_p)[0]
        return cov / self.independent_samples(n)

    # -- measuring -------------------------------------------------------------------------
    #: The target moving farther than this between two measurements is a new station.
    STATION_MOVE_M = 2e-3

    def _value_faults(self, t_s: float, p_true: np.ndarray, xyz: np.ndarray,
                      std_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A measured position (and its std) as the active value faults make it (legal on
        every wire, wrong in substance: only the consumer's checks can tell)."""
        if self._last_true is None or float(np.linalg.norm(p_true - self._last_true)) > self.STATION_MOVE_M:
            self._moves += 1
        self._last_true = p_true.copy()
        for f in self.config.faults:
            if not f.active(t_s):
                self._held.pop(f.kind, None)
        if self.active(FaultKind.FIXED_REFLECTOR, t_s):
            # Stuck on one reflector, where the target was at the first measurement in the
            # fault: the noise is the instrument's own, so no value repeats.
            fixed = self._held.setdefault(FaultKind.FIXED_REFLECTOR, p_true.copy())
            xyz = xyz - p_true + fixed
        for f in self.config.faults:
            if f.kind is FaultKind.WRONG_REFLECTOR and f.active(t_s) and self._moves % f.every == 0:
                xyz = xyz + np.array([f.offset_mm * 1e-3, 0.0, 0.0])
        if self.active(FaultKind.FROZEN_POSITION, t_s):
            # The position of the last measurement before the fault (or the first in it) bit
            # for bit, while the reported std keeps changing (a firmware that re-sends its
            # last coordinate with a fresh quality figure).
            held = self._held.setdefault(FaultKind.FROZEN_POSITION,
                                         xyz.copy() if self._last_xyz is None else self._last_xyz.copy())
            xyz = held.copy()
            std_m = std_m * (1.0 + 0.2 * self.rng.random(3))
        self._last_xyz = xyz.copy()
        return xyz, std_m

    def measure(self, t_s: float, n: int, *, pose: bool = False) -> Sample:
        """The average of ``n`` samples at ``t_s``: truth with the refraction scale error,
        plus noise of the covariance :meth:`covariance` (orientation noise about the
        target's own axes for a pose), and now and then an outlier."""
        c = self.config
        T = self.world.cell_T_target(t_s)
        p_true = T[:3, 3]
        cov = self.covariance(p_true, n)
        p = c.cell_p_instrument + (1.0 + self.refraction_scale(t_s)) * (p_true - c.cell_p_instrument)
        if np.any(c.noise_m) and not c.has_beam_noise:
            # the per-axis draw of earlier versions, kept so existing scenarios replay identically
            xyz = p + self.rng.normal(0.0, 1.0, 3) * np.sqrt(np.diag(cov))
        else:
            xyz = p + _draw(self.rng, cov)
        outlier = c.outlier_probability > 0 and bool(self._outlier_rng.random() < c.outlier_probability)
        if outlier:
            xyz = xyz + self._outlier_rng.normal(0.0, c.outlier_m, 3)
        std_m = np.sqrt(np.diag(cov))
        xyz, std_m = self._value_faults(t_s, p_true, xyz, std_m)
        near = bool(np.linalg.norm(p_true - c.cell_p_instrument) > NEAR_RANGE_FRACTION * c.max_range_m)
        T_meas = std_rad = None
        if pose:
            std_rad = c.noise_rad / math.sqrt(self.independent_samples(n))
            T_meas = T.copy()
            T_meas[:3, :3] = T[:3, :3] @ so3_exp(self.rng.normal(0.0, 1.0, 3) * std_rad)
            T_meas[:3, 3] = xyz
        return Sample(xyz, std_m, T_meas, std_rad, n, near, cov, outlier)
