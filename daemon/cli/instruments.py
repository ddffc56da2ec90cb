"""The measuring instruments a simulated cell can have, and the ``[tracker]`` keys each needs.

``cellcal demo --instrument``, the test harness (``harness.inprocess_cell(instrument=...)``)
and the benchmarks put one of the simulated instruments of ``cellcal sim --instrument`` in
the cell. This module is the one place that says, per instrument, which simulator serves it
(:func:`start_simulated`) and what the daemon's ``[tracker]`` section must add for it
(:data:`TRACKER_KEYS`, TOML keys in the file's units, merged over a configuration with
``config.load_config(path, overrides=...)``):

``cellcal``
    The cellcal tracker protocol 1.0 (``docs/protocols/tracker.md``): a 6-DoF pose target,
    nothing to add (``measure`` stays what the file says).
``emscon``
    A Leica emScon laser tracker, TPI over loopback TCP (``docs/protocols/emscon.md``): it
    measures a reflector's position, so ``measure = "point"``.
``geocom``
    A Leica total station, GeoCOM on a pty (its serial line) or loopback TCP
    (``docs/protocols/geocom.md``): ``measure = "point"``; checksums on every line, because
    a serial line garbles bytes (the demo scenario has a garbage burst) and a garbled digit
    of an angle or a distance parses as a valid, wrong value without them; and settle
    thresholds for the std the driver reports, which is the instrument's a-priori one
    (about 1 mm plus 1.5 ppm: GeoCOM's simple measurement reports none), not the tracker
    defaults of 0.05 mm. Its points fix the base frame to a few millimetres, so its
    ``[solve]`` gates (:data:`SOLVE_KEYS`) and ``[drift]`` thresholds (:data:`DRIFT_KEYS`)
    are set to what such an instrument delivers. The simulated total station measures with
    that noise too (:data:`SIM_NOISE`): a total station that measured like a laser tracker
    would let the a-priori figures it declares weight the fit wrongly (the daemon weights
    each point by its beam covariance) and hide what its real noise does to a result.

Everything runs on 127.0.0.1 or a pty.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from cellcal.daemon import protocol as P

if TYPE_CHECKING:  # the simulator is loaded only when an instrument is started
    from cellcal.sim.link import LinkServer
    from cellcal.sim.scenario import TrackerConfig
    from cellcal.sim.world import World

__all__ = ["INSTRUMENTS", "TRACKER_KEYS", "SOLVE_KEYS", "DRIFT_KEYS", "SIM_NOISE", "BeamNoise", "simulator_class",
           "start_simulated",
           "config_overrides"]

#: ``--instrument`` names, in the order ``cellcal sim`` lists them.
INSTRUMENTS: tuple[str, ...] = ("cellcal", "emscon", "geocom")

#: Per instrument: ``[tracker]`` keys (TOML names and units) the daemon needs for it.
TRACKER_KEYS: dict[str, P.JsonObject] = {
    "cellcal": {},
    "emscon": {"measure": "point"},
    "geocom": {
        "measure": "point",
        "options": {"checksum": True},
        # The driver's a-priori std of one measurement at the cell's 3 m: about 1.0 mm along
        # the line of sight, 15 um across it. A station's two measurements (one EDM
        # measurement each) then differ by sqrt(2) x 1 mm 1-sigma along the line of sight:
        # they must agree within 5 mm (3.5 sigma; a prism that moved, or a second prism, is
        # centimetres off).
        "settle": {"max_std_mm": 2.0, "agree_mm": 5.0},
    },
}


#: Per instrument: ``[solve]`` keys its measurements need. A total station's 1 mm along the
#: line of sight leaves the point base frame about 3.5 mm 1-sigma at the base origin from
#: the demo cell's 6 stations (a laser tracker: hundredths of a mm), so the default 1 mm
#: sigma gate would refuse every result; 10 mm still refuses an undetermined one. A cell
#: that needs better measures with a laser tracker, or more stations. The daemon weights each
#: point by its beam covariance (1 mm along the line of sight, 15 um across), so the fit
#: leaves its residuals along the line of sight, about the instrument's 1 mm: the RMS gate is
#: 3 mm (three times the noise; a wrong reflector or a unit slip is far beyond it).
SOLVE_KEYS: dict[str, P.JsonObject] = {
    "cellcal": {},
    "emscon": {},
    "geocom": {"max_sigma_mm_at_task_points": 10.0, "max_rms_mm": 3.0},
}


#: Per instrument: ``[drift]`` keys. A drift check compares a few stations' measurements with
#: the model: with a total station each carries its ~1 mm along the line of sight and the
#: base frame's few millimetres, so the laser tracker's tenths of a millimetre would warn on
#: every check.
DRIFT_KEYS: dict[str, P.JsonObject] = {
    "cellcal": {},
    "emscon": {},
    "geocom": {"warn_mm": 4.0, "fail_mm": 8.0, "cusum_k_mm": 4.0, "cusum_h_mm": 8.0},
}

@dataclass(frozen=True)
class BeamNoise:
    """A simulated instrument's noise of one measurement in beam coordinates (m, m per metre
    of range), and how long its samples stay correlated (s)."""

    radial_m: float
    radial_per_m: float
    transverse_m: float
    transverse_per_m: float
    correlation_s: float


#: Per instrument: the simulated instrument's noise in place of the scenario's (None: the
#: scenario's). A total station with a prism: 1 mm + 1.5 ppm along the line of sight, 1 arc
#: second across it (the GeoCOM driver's a-priori figures), one EDM measurement one
#: independent sample.
SIM_NOISE: dict[str, BeamNoise | None] = {
    "cellcal": None,
    "emscon": None,
    "geocom": BeamNoise(radial_m=1.0e-3, radial_per_m=1.5e-6, transverse_m=0.0, transverse_per_m=4.848e-6,
                        correlation_s=10.0),
}


def _check(instrument: str) -> None:
    if instrument not in INSTRUMENTS:
        raise ValueError(f"instrument must be one of {', '.join(INSTRUMENTS)}, got {instrument!r}")


def simulator_class(instrument: str) -> type[LinkServer]:
    """The simulated instrument's server class (``cellcal.sim.cli.INSTRUMENTS``)."""
    _check(instrument)
    # The simulator, loaded lazily: only the demo, `cellcal sim` and the tests serve instruments.
    from cellcal.sim.cli import INSTRUMENTS as SIMULATORS
    from cellcal.sim.link import LinkServer

    module, name = SIMULATORS[instrument]
    cls = getattr(importlib.import_module(module), name)
    if not (isinstance(cls, type) and issubclass(cls, LinkServer)):
        raise TypeError(f"{module}:{name} is no LinkServer")
    return cls


def start_simulated(instrument: str, world: World, tracker_config: TrackerConfig, *, seed: int = 0,
                    transport: str | None = None, port: int = 0) -> LinkServer:
    """Serve ``instrument`` from ``world`` (started; ``close()`` it); its ``url`` is what the
    daemon's ``tracker.url`` names.

    Parameters
    ----------
    instrument : {"cellcal", "emscon", "geocom"}
    world : cellcal.sim.world.World
    tracker_config : cellcal.sim.scenario.TrackerConfig
        The scenario's ``[tracker]`` (noise, faults).
    seed : int
    transport : {"pty", "tcp"}, optional
        Default: the instrument's first (a pty; emScon is served on TCP only).
    port : int
        TCP port (0: any free one), loopback.

    Raises
    ------
    ValueError
        An unknown instrument, or a transport it is not served on.
    """
    cls = simulator_class(instrument)
    transport = transport or cls.TRANSPORTS[0]
    if transport not in cls.TRANSPORTS:
        raise ValueError(f"the simulated {instrument} instrument is served on {', '.join(cls.TRANSPORTS)} only, "
                         f"not {transport}")
    noise = SIM_NOISE[instrument]
    if noise is not None:
        tracker_config = dataclasses.replace(
            tracker_config, noise_m=np.zeros(3), radial_noise_m=noise.radial_m, radial_noise_per_m=noise.radial_per_m,
            transverse_noise_m=noise.transverse_m, transverse_noise_per_m=noise.transverse_per_m,
            noise_correlation_s=noise.correlation_s)
    return cls(world, tracker_config, transport=transport, seed=seed, port=port).start()


def config_overrides(instrument: str) -> dict[str, P.JsonObject]:
    """``{"tracker": TRACKER_KEYS[instrument], "solve": SOLVE_KEYS[instrument], "drift":
    DRIFT_KEYS[instrument]}`` (the
    sections that have keys; empty for ``cellcal``): merge it over a configuration's TOML
    keys."""
    _check(instrument)
    out: dict[str, P.JsonObject] = {}
    for section, table in (("tracker", TRACKER_KEYS), ("solve", SOLVE_KEYS), ("drift", DRIFT_KEYS)):
        if table[instrument]:
            out[section] = _copy(table[instrument])
    return out


def _copy(d: P.JsonObject) -> P.JsonObject:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in d.items()}
