"""``[kinematics]``: the settings of a run of kind ``kinematics`` (``[solve] kind = "kinematics"``
or ``start_run kind=kinematics``), which identifies the arm's own DH geometry
(``cellcal.daemon.kinematics_run``; method in ``docs/kinematics.md`` and ADR 0016).

The section is a dataclass of the configuration schema (``cellcal.daemon.config`` builds it
like every other section: unknown keys, types and units there); :func:`validate_kinematics`
adds the bounds and the parameter names, each error under its dotted key.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TypeVar

from cellcal.daemon.config.errors import ConfigError

__all__ = ["Kinematics", "validate_kinematics", "PARAMETER_NAME"]

_MM = 1e-3

#: A parameter name of ``cellcal.solver.identify_kinematics`` (1-based DH rows).
PARAMETER_NAME = re.compile(r"joint[1-6]\.zero_offset|link[1-6]\.(a|d|alpha|beta)")


_T = TypeVar("_T")


def _k(default: _T, name: str, scale: float = 1.0, doc: str = "") -> _T:
    meta = {"key": name, "scale": scale, "doc": doc}
    if isinstance(default, list):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Kinematics:
    """``[kinematics]``: kinematic identification runs and the use of their result."""

    n_stations: int = _k(40, "n_stations", doc="identification (fit) stations planned")
    n_validation: int = _k(30, "n_validation", doc="held-out validation stations, never fitted")
    max_condition: float = _k(100.0, "max_condition",
                              doc="gate on the condition number of the column-normalised Jacobian")
    parameters: list[str] = _k([], "parameters", doc="names to identify; empty: every one the stations determine")
    max_holdout_rms_m: float = _k(0.3e-3, "max_holdout_rms_mm", _MM,
                                  doc="acceptance gate: held-out RMS position error after identification")
    use_identified: bool = _k(False, "use_identified",
                              doc="CiA 402 arms: later runs and drift checks compute FK with the identified model")
    seed: int = _k(0, "seed", doc="station planning seed")
    iso9283_cycles: int = _k(30, "iso9283_cycles",
                             doc="ISO 9283 pose test after identification: cycles of P1-P5 before and after "
                                 "(30: the standard's count; 0: no pose test; at least 2 otherwise)")
    iso9283_cube_centre_m: list[float] = _k([], "iso9283_cube_centre_mm", _MM,
                                     doc="centre of the ISO 9283 cube in the base frame (3 numbers); "
                                         "empty: the centre of the [plan] workspace box")
    iso9283_cube_side_m: float = _k(0.0, "iso9283_cube_side_mm", _MM,
                                    doc="side of the ISO 9283 cube; 0: the largest reachable one inside the "
                                        "[plan] workspace box")


#: (lo, hi, lo_open) in the TOML key's units.
_BOUNDS: dict[str, tuple[float, float, bool]] = {
    "n_stations": (10, 1000, False),
    "n_validation": (30, 1000, False),
    "max_condition": (1.0, 1e6, True),
    "max_holdout_rms_mm": (0.0, 5.0, True),
    "seed": (0, 2**63 - 1, False),
    "iso9283_cycles": (0, 1000, False),
    "iso9283_cube_side_mm": (0.0, 5000.0, False),
}


def validate_kinematics(k: Kinematics) -> None:
    """Bounds and parameter names of ``[kinematics]``.

    Raises
    ------
    cellcal.daemon.config.ConfigError
        Under ``kinematics.<key>`` (``kinematics.parameters[2]`` for a bad name).
    """
    values = {"n_stations": k.n_stations, "n_validation": k.n_validation, "max_condition": k.max_condition,
              "max_holdout_rms_mm": k.max_holdout_rms_m / _MM, "seed": k.seed,
              "iso9283_cycles": k.iso9283_cycles, "iso9283_cube_side_mm": k.iso9283_cube_side_m / _MM}
    for key, v in values.items():
        lo, hi, lo_open = _BOUNDS[key]
        if not ((lo < v) if lo_open else (lo <= v)) or not v <= hi or not math.isfinite(v):
            raise ConfigError(f"kinematics.{key}", f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v:g}")
    if k.iso9283_cycles == 1:
        raise ConfigError("kinematics.iso9283_cycles",
                          "must be 0 (no pose test) or at least 2 (repeatability needs two cycles), got 1")
    centre = k.iso9283_cube_centre_m
    if len(centre) not in (0, 3):
        raise ConfigError("kinematics.iso9283_cube_centre_mm",
                          f"expected 3 numbers (x, y, z in the base frame) or none, got {len(centre)}")
    for i, v in enumerate(centre):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or abs(v / _MM) > 1e5:
            raise ConfigError(f"kinematics.iso9283_cube_centre_mm[{i}]", f"must be a number in [-1e5, 1e5] mm, got {v!r}")
    seen: set[str] = set()
    for i, name in enumerate(k.parameters):
        if not isinstance(name, str) or not PARAMETER_NAME.fullmatch(name):
            raise ConfigError(f"kinematics.parameters[{i}]",
                              f"expected a parameter name (joint1..6.zero_offset, link1..6.a / d / alpha / beta), "
                              f"got {name!r}")
        if name in seen:
            raise ConfigError(f"kinematics.parameters[{i}]", f"{name!r} is named twice")
        seen.add(name)
