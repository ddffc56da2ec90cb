"""The simulated cell without servers or threads: stations taken on a clock the caller moves.

:class:`OfflineCell` holds the same :class:`~cellcal.sim.world.World`,
:class:`~cellcal.sim.robot_sim.SimRobot` and :class:`~cellcal.sim.instrument.InstrumentModel`
that ``cellcal sim`` serves, but on a clock of its own: :meth:`OfflineCell.station` commands a
joint move, lets simulated time pass until the arm has settled, and returns what the
controller reports, what the tracker measures and what is true, in microseconds of CPU. The
benchmarks use it for Monte Carlo over hidden errors, the tests to switch one error source
on at a time. Nothing here replaces the wire: the end-to-end tests and ``cellcal demo`` go
through the drivers and the daemon.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.sim.instrument import InstrumentModel, Sample
from cellcal.sim.robot_sim import SimRobot
from cellcal.sim.scenario import Scenario
from cellcal.solver.se3 import make_transform, se3_inverse, so3_exp

__all__ = ["OfflineCell", "OfflineStation", "arm_trial_scenario", "ARM_TRIAL_MASK"]

#: The residual DH parameters :func:`arm_trial_scenario` draws; joint 1/6 zeros and d1/d6
#: stay 0 (they are the base and tool frames, which any calibration absorbs).
ARM_TRIAL_MASK = {"theta_delta_deg": (0, 1, 1, 1, 1, 0), "a_delta_mm": (0, 1, 1, 0, 0, 0),
                  "d_delta_mm": (0, 0, 0, 1, 1, 0), "alpha_delta_deg": (1, 0, 0, 1, 1, 0)}
_NOISE_OFF = {"radial_noise_um": 0.0, "radial_noise_um_per_m": 0.0, "transverse_noise_um": 0.0,
              "transverse_noise_um_per_m": 0.0, "noise_deg": 0.0, "outlier_probability": 0.0}


def arm_trial_scenario(base: Mapping[str, Any], rng: np.random.Generator, *, noise: bool = True) -> dict[str, Any]:
    """A scenario (its TOML as a dict) with another arm of the same kind: a Monte Carlo trial.

    Each residual DH parameter of :data:`ARM_TRIAL_MASK` is drawn Gaussian, its 1-sigma the
    RMS of ``base``'s non-zero values of that kind (the demo's magnitudes, ADR 0015), and so
    are the two parallel-axis tilts; every other error source stays as ``base`` has it
    (factory table, sag, backlash, warm-up, the beam-coordinate tracker with outliers),
    except tracker faults, beam breaks and base drift, which a trial leaves out.
    ``noise=False``: the same arm with every random noise off (the tracker's and the
    encoders'), for the structured part of the residual. The same ``rng`` state gives the
    same arm either way.
    """
    d = copy.deepcopy(dict(base))
    res = d["robot"]["residual"]

    def rms(values: Any) -> float:
        nz = [float(v) for v in values if v]
        return math.sqrt(sum(v * v for v in nz) / len(nz)) if nz else 0.0

    for key, mask in ARM_TRIAL_MASK.items():
        sigma = rms(res[key])
        res[key] = [float(m * sigma * rng.standard_normal()) for m in mask]
    sigma_tilt = rms(res["parallel_tilt_deg"])
    res["parallel_tilt_deg"] = [float(sigma_tilt * rng.standard_normal()) for _ in range(2)]
    d["tracker"].pop("faults", None)
    d["tracker"]["beam_breaks_per_h"] = 0.0
    d.pop("drift", None)
    if not noise:
        d["tracker"].update(_NOISE_OFF)
        d["robot"]["encoder_noise_deg"] = 0.0
    return d


@dataclass(frozen=True)
class OfflineStation:
    """One settled station.

    Attributes
    ----------
    q_rad : (6,) array
        The joints the controller reports (noise included).
    base_T_flange : (4, 4) array
        The flange the controller reports (its factory FK, TCP offset removed).
    cell_T_target : (4, 4) array
        The tracker's measurement.
    sample : Sample
        The whole measurement (std, covariance, outlier flag).
    true_base_T_flange : (4, 4) array
        Where the flange really is.
    true_cell_T_target : (4, 4) array
        Where the target really is.
    t_s : float
        Simulated time of the measurement.
    """

    q_rad: np.ndarray
    base_T_flange: np.ndarray
    cell_T_target: np.ndarray
    sample: Sample
    true_base_T_flange: np.ndarray
    true_cell_T_target: np.ndarray
    t_s: float


class OfflineCell:
    """A scenario's cell on a clock the caller advances (see the module docstring).

    Parameters
    ----------
    scenario : Scenario
    settle_s : float
        Simulated seconds waited after each move's end (ringing decays meanwhile).
    start_s : float
        Simulated time at which the cell starts (e.g. after a warm-up).
    """

    def __init__(self, scenario: Scenario, *, settle_s: float = 3.0, start_s: float = 0.0) -> None:
        self.scenario = scenario
        self.settle_s = float(settle_s)
        self._wall = 0.0
        self.world = scenario.make_world(clock=lambda: self._wall)
        self.advance(start_s)
        self.robot = SimRobot(self.world, scenario.robot)
        self.instrument = InstrumentModel(self.world, scenario.tracker, seed=scenario.seed)
        tcp = self.robot.scenario.tcp_offset
        self._tcp_T_flange = se3_inverse(make_transform(so3_exp(tcp[3:]), tcp[:3]))

    def now_s(self) -> float:
        return self.world.now_s()

    def advance(self, sim_s: float) -> None:
        """Let ``sim_s`` simulated seconds pass."""
        self._wall += max(float(sim_s), 0.0) / self.scenario.time_scale

    def move(self, q_rad: Any, speed_rad_s: float | None = None) -> float:
        """Command a joint move and wait until it has ended and settled; returns its duration."""
        T = self.robot.command_joints(np.asarray(q_rad, dtype=float), speed_rad_s)
        self.advance(T + self.settle_s)
        return T

    def station(self, q_rad: Any, average_s: float = 0.2, *, speed_rad_s: float | None = None) -> OfflineStation:
        """Move to ``q_rad`` (controller joints), settle, read the robot and measure a pose."""
        self.move(q_rad, speed_rad_s)
        return self.measure(average_s)

    def measure(self, average_s: float = 0.2) -> OfflineStation:
        """Read the robot and measure a pose where the arm is now."""
        t = self.now_s()
        s = self.robot.sample(t)
        from cellcal.drivers.ur_rtde import pose_to_transform

        G = pose_to_transform(s.tcp_pose) @ self._tcp_T_flange
        n = self.instrument.sample_count(average_s)
        m = self.instrument.measure(t, n, pose=True)
        assert m.cell_T_target is not None
        return OfflineStation(q_rad=s.q_rad.copy(), base_T_flange=G, cell_T_target=m.cell_T_target, sample=m,
                              true_base_T_flange=self.world.base_T_flange(),
                              true_cell_T_target=self.world.cell_T_target(t), t_s=t)
