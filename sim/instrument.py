"""What a simulated measuring instrument measures, whatever protocol it speaks.

:class:`InstrumentModel` holds the physics every simulated tracker and total station shares:
where the target is (the :class:`~cellcal.sim.world.World`), the scenario's noise, and when
a measurement is refused or fails (warm-up, beam break, no target, out of range, target not
steady). The protocol devices -- the cellcal tracker (:mod:`cellcal.sim.tracker_sim`), emScon
TPI (:mod:`cellcal.sim.emscon_sim`) and GeoCOM (:mod:`cellcal.sim.geocom_sim`) -- only turn its
answers into their own packets and codes, so a more realistic model here reaches every
protocol at once.

Reasons are :class:`~cellcal.drivers.tracker_codec.NakCode` values: the cellcal protocol's
vocabulary, which each protocol device maps to its own status codes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.drivers.tracker_codec import NakCode
from cellcal.sim.scenario import FaultKind, TrackerConfig
from cellcal.sim.world import World
from cellcal.solver.se3 import so3_exp

__all__ = ["InstrumentModel", "Sample", "NEAR_RANGE_FRACTION"]

#: Fraction of the maximum range beyond which a measurement is flagged near the range limit.
NEAR_RANGE_FRACTION = 0.98


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
    """

    xyz_m: np.ndarray
    std_m: np.ndarray
    cell_T_target: np.ndarray | None
    std_rad: np.ndarray | None
    n: int
    near_range_limit: bool


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
        """The beam reaches the target (no beam break, a target present)."""
        return not (self.active(FaultKind.BEAM_BREAK, t_s) or self.active(FaultKind.NO_TARGET, t_s))

    def stable(self, t_s: float) -> bool:
        """The target is steady: the flange slower than the stability thresholds."""
        lin, ang = self.world.flange_speed()
        return (
            lin <= self.config.stable_speed_m_s
            and ang <= self.config.stable_speed_rad_s
            and not self.active(FaultKind.NOT_STABLE, t_s)
        )

    def distance_m(self, t_s: float) -> float:
        """True distance from the instrument (the cell origin) to the target."""
        return float(np.linalg.norm(self.world.cell_T_target(t_s)[:3, 3]))

    def refusal(self, t_s: float) -> NakCode | None:
        """Why a measurement cannot start at ``t_s``, or ``None`` when it can."""
        if not self.warmed_up(t_s):
            return NakCode.NOT_WARMED_UP
        if self.active(FaultKind.BEAM_BREAK, t_s):
            return NakCode.BEAM_BROKEN
        if self.active(FaultKind.NO_TARGET, t_s):
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
        if self.overlapping(FaultKind.BEAM_BREAK, start_s, end_s):
            return NakCode.BEAM_BROKEN
        if self.overlapping(FaultKind.NO_TARGET, start_s, end_s):
            return NakCode.NO_TARGET
        if unstable:
            return NakCode.NOT_STABLE
        return None

    def sample_count(self, average_s: float) -> int:
        """Raw samples an average over ``average_s`` device seconds takes (at least one)."""
        return max(1, round(average_s * self.config.sample_rate_hz))

    # -- measuring -------------------------------------------------------------------------
    def measure(self, t_s: float, n: int, *, pose: bool = False) -> Sample:
        """The average of ``n`` samples at ``t_s``: truth plus noise whose sigma shrinks as
        the square root of ``n`` (orientation noise about the target's own axes for a pose)."""
        c = self.config
        T = self.world.cell_T_target(t_s)
        root_n = math.sqrt(n)
        std_m = c.noise_m / root_n
        xyz = T[:3, 3] + self.rng.normal(0.0, 1.0, 3) * std_m
        near = bool(np.linalg.norm(T[:3, 3]) > NEAR_RANGE_FRACTION * c.max_range_m)
        T_meas = std_rad = None
        if pose:
            std_rad = c.noise_rad / root_n
            T_meas = T.copy()
            T_meas[:3, :3] = T[:3, :3] @ so3_exp(self.rng.normal(0.0, 1.0, 3) * std_rad)
            T_meas[:3, 3] = xyz
        return Sample(xyz, std_m, T_meas, std_rad, n, near)
