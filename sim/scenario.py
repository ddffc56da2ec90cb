"""Simulated cell scenarios: the hidden truth and the imperfections, read from TOML.

A scenario file (documented key by key in ``docs/simulation.md``) is loaded with
``tomllib`` into frozen dataclasses. Every key is checked: unknown keys, wrong types and
bad values raise :class:`ScenarioError` naming the dotted path (``tracker.faults[2].kind``).
The ``[robot]`` table belongs to the simulated robot and is kept raw (``Scenario.robot``)
for its own loader to validate.

Units are in the key names; inside, everything is SI (m, rad, s) and transforms are 4x4
``a_T_b`` arrays, built with :func:`cellcal.solver.se3.transform_from_xyz_quat`.
"""

from __future__ import annotations

import enum
import math
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cellcal.sim.camera import MOUNTINGS, PIXEL_FORMATS, SHUTTERS, CameraConfig
from cellcal.sim.errors import ScenarioError
from cellcal.sim.world import DriftEvent, World
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.errors import TargetFileError
from cellcal.solver.se3 import make_transform, so3_exp, transform_from_xyz_quat
from cellcal.solver.target import CalibrationTarget, parse_target, target_from_toml

__all__ = [
    "ScenarioError",
    "FaultKind",
    "FaultConfig",
    "TrackerConfig",
    "TruthConfig",
    "DriftConfig",
    "CameraConfig",
    "Scenario",
    "load_scenario",
    "parse_scenario",
]

#: Largest |norm - 1| accepted for a quaternion written in a scenario.
_QUAT_NORM_TOL = 1e-6
_MM_TO_M = 1e-3

#: Flange rest pose used when the scenario gives none: 0.4 m out, 0.4 m up, facing down.
DEFAULT_BASE_T_FLANGE_XYZ_M = (0.4, 0.0, 0.4)
DEFAULT_BASE_T_FLANGE_QUAT_WXYZ = (0.0, 1.0, 0.0, 0.0)


class FaultKind(str, enum.Enum):
    """Faults the simulated tracker can be scheduled to show."""

    BEAM_BREAK = "beam_break"  # beam interrupted: MEAS -> NAK BEAM_BROKEN
    NO_TARGET = "no_target"  # no target in the beam: MEAS -> NAK NO_TARGET
    NOT_STABLE = "not_stable"  # target unsteady: MEAS -> NAK NOT_STABLE
    DISCONNECT = "disconnect"  # link down: silence on a pty, connection closed on TCP
    GARBAGE = "garbage"  # random bytes before replies, some replies corrupted
    TRICKLE = "trickle"  # replies sent one byte at a time
    FROZEN = "frozen"  # measurements repeat the last one bit for bit, freshly stamped
    WILD_VALUE = "wild_value"  # measurements report x = value_mm (legal on the wire, absurd)
    FUTURE_TIMESTAMP = "future_timestamp"  # measurements stamped offset_s ahead of the device clock
    # Value faults of the shared instrument model (every protocol), issue 24:
    FROZEN_POSITION = "frozen_position"  # the position repeats bit for bit; std and stamps fresh
    FIXED_REFLECTOR = "fixed_reflector"  # the instrument stays on one point (with its noise)
    WRONG_REFLECTOR = "wrong_reflector"  # every second station measures a reflector offset_mm away
    WILD_ANGLE = "wild_angle"  # GeoCOM: the Hz angle reported value_rad beyond the measured one


# kind -> extra keys it accepts, with defaults
_FAULT_EXTRA: dict[FaultKind, dict[str, Any]] = {
    FaultKind.BEAM_BREAK: {},
    FaultKind.NO_TARGET: {},
    FaultKind.NOT_STABLE: {},
    FaultKind.DISCONNECT: {},
    FaultKind.GARBAGE: {"burst_bytes": 32, "corrupt_probability": 0.5},
    FaultKind.TRICKLE: {"byte_interval_ms": 5.0},
    FaultKind.FROZEN: {},
    FaultKind.WILD_VALUE: {"value_mm": 999_999_999.0},
    FaultKind.FUTURE_TIMESTAMP: {"offset_s": 30.0},
    FaultKind.FROZEN_POSITION: {},
    FaultKind.FIXED_REFLECTOR: {},
    FaultKind.WRONG_REFLECTOR: {"offset_mm": 25.0, "every": 2},
    FaultKind.WILD_ANGLE: {"value_rad": 100.0},
}


@dataclass(frozen=True)
class FaultConfig:
    """One scheduled fault, active for simulated time ``[start_s, start_s + duration_s)``.

    ``burst_bytes`` and ``corrupt_probability`` apply to ``garbage``; ``byte_interval_ms``
    (device milliseconds between bytes) to ``trickle``; ``value_mm`` (the x coordinate
    reported) to ``wild_value``; ``offset_s`` (device seconds ahead) to ``future_timestamp``;
    ``offset_mm`` (the wrong reflector's distance from the right one, along cell +x) and
    ``every`` (every how many stations see it) to ``wrong_reflector``; ``value_rad`` (added to the Hz angle) to ``wild_angle``.
    """

    kind: FaultKind
    start_s: float
    duration_s: float
    burst_bytes: int = 32
    corrupt_probability: float = 0.5
    byte_interval_ms: float = 5.0
    value_mm: float = 999_999_999.0
    offset_s: float = 30.0
    offset_mm: float = 25.0
    every: int = 2
    value_rad: float = 100.0

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s

    def active(self, t_s: float) -> bool:
        """Whether the fault is active at simulated time ``t_s``."""
        return self.start_s <= t_s < self.end_s

    def overlaps(self, t0_s: float, t1_s: float) -> bool:
        """Whether the fault is active at any time in ``[t0_s, t1_s]``."""
        return self.start_s <= t1_s and t0_s < self.end_s


@dataclass(frozen=True)
class TrackerConfig:
    """The simulated tracker: its noise, clock, limits, identity and fault schedule.

    Attributes
    ----------
    noise_m : numpy.ndarray, shape (3,)
        1-sigma noise of one sample along cell x, y, z, metres (scenario ``noise_mm``).
    noise_rad : numpy.ndarray, shape (3,)
        1-sigma orientation noise of one sample about the target's x, y, z axes, radians
        (scenario ``noise_deg``).
    sample_rate_hz : float
        Raw samples per device second; an average over ``T`` s uses
        ``max(1, round(T * rate))`` samples, dividing the noise by their square root.
    clock_offset_s, clock_skew_ppm : float
        Device clock: ``offset + (1 + skew) * (wall seconds since start)``.
    latency_ms : float
        Device processing time before each reply, device milliseconds.
    warmup_s : float
        Simulated seconds after start during which MEAS is refused (NOT_WARMED_UP).
    min_range_m, max_range_m : float
        Target distances outside which MEAS is refused (OUT_OF_RANGE).
    stable_speed_m_s, stable_speed_rad_s : float
        Flange speeds (from the world) above which the target is not stable.
    model, serial, firmware : str
        What HELLO reports.
    faults : tuple of FaultConfig
    cell_p_instrument : numpy.ndarray, shape (3,)
        The tracker head in the cell frame (m); the beam runs from here to the target.
    radial_noise_m, radial_noise_per_m, transverse_noise_m, transverse_noise_per_m : float
        1-sigma noise of one raw sample in beam coordinates: along the beam and across it
        (each of the two transverse directions), constant (m) plus per metre of range
        (m/m), as ISO 10360-10 MPE statements are written (ADR 0015 for the reading).
    noise_correlation_s : float
        Samples closer than this are not independent (air turbulence): an average over
        ``T`` s has ``max(1, min(n, T / noise_correlation_s))`` independent samples.
    outlier_probability, outlier_m : float
        Chance that a measurement carries a gross error (1-sigma ``outlier_m`` per axis)
        its reported std knows nothing of.
    air_temperature_k_per_h, refraction_ppm_per_k : float
        The air warms at this rate after the tracker's weather compensation was set; the
        range then reads short by ``refraction_ppm_per_k`` ppm per kelvin.
    reacquire_s : float
        Simulated seconds after a beam break during which the tracker searches for the
        target (NO_TARGET).
    beam_breaks_per_h, beam_break_s : float
        Random beam breaks (seeded Poisson arrivals, simulated hours) and their length.
    latency_jitter_ms : float
        Mean of an exponential extra delay before each reply (device ms).
    timestamp_at : str
        Where a measurement's stamp ``t_us`` falls in its averaging window: ``start``,
        ``middle`` (the protocol's definition) or ``end`` (a firmware that stamps late).
    clock_skew_drift_ppm_per_h : float
        The device clock's rate drifts this many ppm per hour (wall).
    clock_step_at_s, clock_step_s : float
        At simulated time ``clock_step_at_s`` the device clock jumps by ``clock_step_s``
        (an NTP correction); ``clock_step_s = 0``: no step.
    """

    noise_m: np.ndarray
    noise_rad: np.ndarray
    sample_rate_hz: float = 1000.0
    clock_offset_s: float = 1000.0
    clock_skew_ppm: float = 0.0
    latency_ms: float = 1.0
    warmup_s: float = 0.0
    min_range_m: float = 0.5
    max_range_m: float = 40.0
    stable_speed_m_s: float = 1e-4
    stable_speed_rad_s: float = 1e-3
    model: str = "CELLCAL-SIM-T1"
    serial: str = "SIM-0001"
    firmware: str = "1.0.0"
    faults: tuple[FaultConfig, ...] = ()
    cell_p_instrument: np.ndarray = field(default_factory=lambda: np.zeros(3))
    radial_noise_m: float = 0.0
    radial_noise_per_m: float = 0.0
    transverse_noise_m: float = 0.0
    transverse_noise_per_m: float = 0.0
    noise_correlation_s: float = 0.0
    outlier_probability: float = 0.0
    outlier_m: float = 1e-3
    air_temperature_k_per_h: float = 0.0
    refraction_ppm_per_k: float = 0.93
    reacquire_s: float = 0.0
    beam_breaks_per_h: float = 0.0
    beam_break_s: float = 1.0
    latency_jitter_ms: float = 0.0
    timestamp_at: str = "middle"
    clock_skew_drift_ppm_per_h: float = 0.0
    clock_step_at_s: float = 0.0
    clock_step_s: float = 0.0

    @property
    def has_beam_noise(self) -> bool:
        return bool(self.radial_noise_m or self.radial_noise_per_m or self.transverse_noise_m
                    or self.transverse_noise_per_m)

    def active_faults(self, t_s: float) -> list[FaultConfig]:
        """Faults active at simulated time ``t_s``."""
        return [f for f in self.faults if f.active(t_s)]


@dataclass(frozen=True)
class TruthConfig:
    """The hidden truth: transforms (4, 4), metres."""

    cell_T_base: np.ndarray
    flange_T_target: np.ndarray
    base_T_flange: np.ndarray


@dataclass(frozen=True)
class DriftConfig:
    """A rigid shift of the base at simulated time ``at_s``: ``cell_T_base <- delta @ cell_T_base``."""

    at_s: float
    cell_delta: np.ndarray  # (4, 4), expressed in the cell frame

    def to_event(self) -> DriftEvent:
        return DriftEvent(self.at_s, self.cell_delta)


@dataclass(frozen=True)
class Scenario:
    """A whole simulated cell.

    Attributes
    ----------
    name : str
    seed : int
        Seeds every random generator of the simulation (noise, garbage).
    time_scale : float
        Simulated seconds per wall second (``[time] scale``).
    truth : TruthConfig
    tracker : TrackerConfig
    drift : tuple of DriftConfig
    robot : dict
        The raw ``[robot]`` table (and its sub-tables), validated by the robot simulator.
    camera : CameraConfig or None
        The simulated camera (``[camera]``), if the cell has one.
    source : str
        Where the scenario came from (a path or ``"<string>"``).
    """

    name: str
    seed: int
    time_scale: float
    truth: TruthConfig
    tracker: TrackerConfig
    drift: tuple[DriftConfig, ...] = ()
    robot: dict = field(default_factory=dict)
    camera: CameraConfig | None = None
    source: str = "<string>"

    def make_world(self, clock: Callable[[], float] = time.monotonic) -> World:
        """A fresh :class:`~cellcal.sim.world.World` holding this scenario's truth."""
        return World(
            cell_T_base=self.truth.cell_T_base,
            flange_T_target=self.truth.flange_T_target,
            base_T_flange=self.truth.base_T_flange,
            time_scale=self.time_scale,
            drift_events=[d.to_event() for d in self.drift],
            clock=clock,
        )


# -- loading --------------------------------------------------------------------------------


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario TOML file.

    Raises
    ------
    ScenarioError
        If the file is not valid TOML or any key is missing, unknown or invalid.
    OSError
        If the file cannot be read.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise ScenarioError(f"{path}: not valid TOML: {exc}") from exc
    return parse_scenario(data, source=str(path))


def parse_scenario(data: Mapping[str, Any] | str, *, source: str = "<string>") -> Scenario:
    """Validate a parsed scenario (a mapping, or TOML text) into a :class:`Scenario`."""
    if isinstance(data, str):
        try:
            data = tomllib.loads(data)
        except tomllib.TOMLDecodeError as exc:
            raise ScenarioError(f"{source}: not valid TOML: {exc}") from exc
    top = _Table(data, "")
    name = top.take("name", _string, default=Path(source).stem)
    top.take("description", _string, default="")
    seed = top.take("seed", _int_range(0, 2**63 - 1), default=0)
    robot = top.take("robot", _raw_table, default={})

    t = top.table("time")
    scale = t.take("scale", _positive)
    t.finish()

    tr = top.table("truth")
    truth = TruthConfig(
        cell_T_base=_pose(tr, "cell_T_base"),
        flange_T_target=_pose(tr, "flange_T_target"),
        base_T_flange=_pose(
            tr, "base_T_flange", DEFAULT_BASE_T_FLANGE_XYZ_M, DEFAULT_BASE_T_FLANGE_QUAT_WXYZ
        ),
    )
    tr.finish()

    tracker = _tracker(top.table("tracker"))
    drift = tuple(_drift(d) for d in top.array_of_tables("drift"))
    camera = _camera(top.table("camera"), source) if "camera" in top.data else None
    top.finish()
    return Scenario(
        name=name, seed=seed, time_scale=scale, truth=truth, tracker=tracker,
        drift=drift, robot=robot, camera=camera, source=source,
    )


#: [camera] key -> (CameraConfig field, unit scale, converter); the converters are below.
_CAMERA_SCALARS = (
    ("adc_bits", "adc_bits", None, "int"),
    ("pixel_size_um", "pixel_size_m", 1e-6, "positive"),
    ("full_well_e", "full_well_e", 1.0, "positive"),
    ("read_noise_e", "read_noise_e", 1.0, "nonneg"),
    ("dark_current_e_per_s", "dark_current_e_per_s", 1.0, "nonneg"),
    ("white_e_per_ms", "white_e_per_s", 1e3, "positive"),
    ("black_level_dn", "black_level_dn", 1.0, "nonneg"),
    ("gain_db", "gain_db", 1.0, "gain"),
    ("exposure_us", "exposure_s", 1e-6, "positive"),
    ("exposure_min_us", "exposure_min_s", 1e-6, "positive"),
    ("exposure_max_us", "exposure_max_s", 1e-6, "positive"),
    ("auto_exposure_level", "auto_exposure_level", 1.0, "fraction"),
    ("auto_exposure_time_constant_ms", "auto_exposure_time_constant_s", 1e-3, "positive"),
    ("blur_sigma_px", "blur_sigma_px", 1.0, "nonneg"),
    ("f_number", "f_number", 1.0, "positive"),
    ("focus_distance_m", "focus_distance_m", 1.0, "positive"),
    ("line_time_us", "line_time_s", 1e-6, "positive"),
    ("trigger_delay_us", "trigger_delay_s", 1e-6, "nonneg"),
    ("readout_ms", "readout_s", 1e-3, "nonneg"),
    ("clock_offset_s", "clock_offset_s", 1.0, "nonneg"),
    ("clock_drift_ppm", "clock_drift_ppm", 1.0, "ppm"),
    ("supersample", "supersample", None, "supersample"),
    ("black_reflectance", "black_reflectance", 1.0, "fraction"),
    ("white_reflectance", "white_reflectance", 1.0, "fraction"),
    ("background_reflectance", "background_reflectance", 1.0, "fraction"),
)

#: mounting -> the two poses it needs (the camera's, the target's)
_MOUNT_POSES = {"eye_in_hand": ("flange_T_camera", "cell_T_target"),
                "eye_to_hand": ("cell_T_camera", "flange_T_target")}


def _camera(t: _Table, source: str) -> CameraConfig:
    convs: dict[str, Callable[[Any], Any]] = {
        "int": _int_range(8, 16), "positive": _positive, "nonneg": _nonneg, "gain": _float_range(0.0, 24.0),
        "fraction": _float_range(0.0, 1.0), "ppm": _float_range(-1000.0, 1000.0), "supersample": _int_range(1, 4),
    }
    mounting = t.take("mounting", _choice(MOUNTINGS))
    size = (t.take("width_px", _int_range(16, 16384)), t.take("height_px", _int_range(16, 16384)))
    K = np.array([[t.take("fx_px", _positive), 0.0, t.take("cx_px", _number)],
                  [0.0, t.take("fy_px", _positive), t.take("cy_px", _number)], [0.0, 0.0, 1.0]])
    dist = t.take("dist_coeffs", lambda v: _vec(5, v), default=np.zeros(5))
    camera = CameraModel(K, dist, size)
    target = _camera_target(t, source)
    poses: dict[str, Any] = {}
    for name in _MOUNT_POSES[mounting]:
        poses[name] = _pose(t, name)
    other = _MOUNT_POSES["eye_to_hand" if mounting == "eye_in_hand" else "eye_in_hand"]
    for name in other:
        for suffix in ("_xyz_m", "_quat_wxyz"):
            if name + suffix in t.data:
                raise ScenarioError(f"{t.path}.{name}{suffix}: not a key of mounting {mounting!r} "
                                    f"(it takes {' and '.join(_MOUNT_POSES[mounting])})")
    kw: dict[str, Any] = {}
    for key, fname, scale, conv in _CAMERA_SCALARS:
        if key in t.data:
            v = t.take(key, convs[conv])
            kw[fname] = v if scale is None else v * scale
    kw["pixel_format"] = t.take("pixel_format", _choice(PIXEL_FORMATS), default="Mono8")
    kw["shutter"] = t.take("shutter", _choice(SHUTTERS), default="global")
    kw["auto_exposure"] = t.take("auto_exposure", _bool, default=False)
    for key in ("vendor", "model", "serial"):
        if key in t.data:
            kw[key] = t.take(key, _wire_text)
    t.finish()
    try:
        return CameraConfig(camera=camera, target=target, mounting=mounting, **poses, **kw)
    except ValueError as exc:
        raise ScenarioError(f"{t.path}: {exc}") from None


def _camera_target(t: _Table, source: str) -> CalibrationTarget:
    """The board: ``target_file`` (relative to the scenario's folder) or an inline ``[camera.target]``."""
    has_file, has_table = "target_file" in t.data, "target" in t.data
    if has_file == has_table:
        raise ScenarioError(f"{t.path}.target_file: give either target_file or a [{t.path}.target] table")
    if has_table:
        raw = t.take("target", _raw_table)
        try:
            return parse_target(raw, source=f"{source} [{t.path}.target]")
        except TargetFileError as exc:
            raise ScenarioError(f"{t.path}.{exc}") from None
    rel = Path(t.take("target_file", _string))
    path = rel if rel.is_absolute() or source.startswith("<") else Path(source).parent / rel
    try:
        return target_from_toml(path.read_bytes(), source=str(path))
    except OSError as exc:
        raise ScenarioError(f"{t.path}.target_file: cannot read {path}: {exc}") from None
    except TargetFileError as exc:
        raise ScenarioError(f"{t.path}.target_file ({path}): {exc}") from None


#: ``timestamp_at`` values.
TIMESTAMP_POSITIONS = ("start", "middle", "end")
_BEAM_KEYS = ("radial_noise_um", "radial_noise_um_per_m", "transverse_noise_um", "transverse_noise_um_per_m")


def _tracker(t: _Table) -> TrackerConfig:
    beam = any(k in t.data for k in _BEAM_KEYS)
    # with beam-coordinate noise the cell-axis noise is optional (default none)
    noise_m = t.take("noise_mm", _vec3_nonneg, default=np.zeros(3) if beam else _REQUIRED) * _MM_TO_M
    noise_rad = np.radians(t.take("noise_deg", _vec3_nonneg))
    defaults = TrackerConfig(noise_m=noise_m, noise_rad=noise_rad)
    kw: dict[str, Any] = {}
    for key, field_name, scale in (("radial_noise_um", "radial_noise_m", 1e-6),
                                   ("radial_noise_um_per_m", "radial_noise_per_m", 1e-6),
                                   ("transverse_noise_um", "transverse_noise_m", 1e-6),
                                   ("transverse_noise_um_per_m", "transverse_noise_per_m", 1e-6),
                                   ("noise_correlation_ms", "noise_correlation_s", 1e-3),
                                   ("outlier_mm", "outlier_m", 1e-3),
                                   ("reacquire_s", "reacquire_s", 1.0),
                                   ("beam_breaks_per_h", "beam_breaks_per_h", 1.0),
                                   ("latency_jitter_ms", "latency_jitter_ms", 1.0),
                                   ("clock_step_at_s", "clock_step_at_s", 1.0)):
        kw[field_name] = t.take(key, _nonneg, default=getattr(defaults, field_name) / scale) * scale
    kw["beam_break_s"] = t.take("beam_break_s", _positive, default=defaults.beam_break_s)
    kw["outlier_probability"] = t.take("outlier_probability", _float_range(0.0, 1.0), default=0.0)
    kw["air_temperature_k_per_h"] = t.take("air_temperature_k_per_h", _float_range(-100.0, 100.0), default=0.0)
    kw["refraction_ppm_per_k"] = t.take("refraction_ppm_per_k", _float_range(-100.0, 100.0),
                                        default=defaults.refraction_ppm_per_k)
    kw["clock_skew_drift_ppm_per_h"] = t.take("clock_skew_drift_ppm_per_h", _float_range(-1e5, 1e5), default=0.0)
    kw["clock_step_s"] = t.take("clock_step_s", _float_range(-1e6, 1e6), default=0.0)
    kw["timestamp_at"] = t.take("timestamp_at", _choice(TIMESTAMP_POSITIONS), default="middle")
    kw["cell_p_instrument"] = t.take("instrument_xyz_m", _vec3, default=np.zeros(3))
    for key, conv in (
        ("sample_rate_hz", _positive),
        ("clock_offset_s", _nonneg),
        ("clock_skew_ppm", _float_range(-1000.0, 1000.0)),
        ("latency_ms", _nonneg),
        ("warmup_s", _nonneg),
        ("min_range_m", _nonneg),
        ("max_range_m", _positive),
        ("stable_speed_m_s", _positive),
        ("stable_speed_rad_s", _positive),
        ("model", _wire_text),
        ("serial", _wire_text),
        ("firmware", _wire_text),
    ):
        kw[key] = t.take(key, conv, default=getattr(defaults, key))
    if kw["min_range_m"] >= kw["max_range_m"]:
        raise ScenarioError(f"{t.path}.min_range_m: must be below max_range_m")
    faults = tuple(_fault(f) for f in t.array_of_tables("faults"))
    t.finish()
    return TrackerConfig(noise_m=noise_m, noise_rad=noise_rad, faults=faults, **kw)


def _fault(t: _Table) -> FaultConfig:
    kind = t.take("kind", _enum(FaultKind))
    kw: dict[str, Any] = {
        "kind": kind,
        "start_s": t.take("start_s", _nonneg),
        "duration_s": t.take("duration_s", _positive),
    }
    extra = _FAULT_EXTRA[kind]
    convs = {
        "burst_bytes": _int_range(0, 4096),
        "corrupt_probability": _float_range(0.0, 1.0),
        "byte_interval_ms": _positive,
        "value_mm": _float_range(-999_999_999.0, 999_999_999.0),
        "offset_s": _float_range(-1e6, 1e6),
        "offset_mm": _float_range(-1e5, 1e5),
        "every": _int_range(2, 1000),
        "value_rad": _float_range(-1e6, 1e6),
    }
    for key, default in extra.items():
        kw[key] = t.take(key, convs[key], default=default)
    t.finish(hint=f"keys for kind {kind.value!r}: kind, start_s, duration_s"
             + "".join(f", {k}" for k in extra))
    return FaultConfig(**kw)


def _drift(t: _Table) -> DriftConfig:
    at_s = t.take("at_s", _nonneg)
    xyz = t.take("delta_xyz_m", _vec3, default=np.zeros(3))
    rotvec = np.radians(t.take("delta_rotvec_deg", _vec3, default=np.zeros(3)))
    t.finish()
    return DriftConfig(at_s=at_s, cell_delta=make_transform(so3_exp(rotvec), xyz))


def _pose(t: _Table, name: str, default_xyz=None, default_quat=None) -> np.ndarray:
    req = default_xyz is None
    xyz = t.take(f"{name}_xyz_m", _vec3, default=None if req else np.array(default_xyz))
    quat = t.take(f"{name}_quat_wxyz", _quat, default=None if req else np.array(default_quat))
    return transform_from_xyz_quat(xyz, quat)


# -- a tiny checked reader --------------------------------------------------------------------

_REQUIRED = object()


class _Table:
    """One TOML table being read: ``take`` keys, then ``finish`` rejects any left over."""

    def __init__(self, data: Any, path: str) -> None:
        if not isinstance(data, Mapping):
            raise ScenarioError(f"{path or '<top>'}: expected a table, got {type(data).__name__}")
        self.data = dict(data)
        self.path = path
        self._seen: set[str] = set()

    def _dotted(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def take(self, key: str, conv: Callable[[Any], Any], *, default: Any = _REQUIRED) -> Any:
        self._seen.add(key)
        if key not in self.data:
            if default is _REQUIRED or default is None:
                raise ScenarioError(f"{self._dotted(key)}: required key missing")
            return default
        try:
            return conv(self.data[key])
        except (TypeError, ValueError) as exc:
            raise ScenarioError(f"{self._dotted(key)}: {exc}") from None

    def table(self, key: str) -> _Table:
        self._seen.add(key)
        if key not in self.data:
            raise ScenarioError(f"{self._dotted(key)}: required table missing")
        return _Table(self.data[key], self._dotted(key))

    def array_of_tables(self, key: str) -> list[_Table]:
        self._seen.add(key)
        items = self.data.get(key, [])
        if not isinstance(items, list):
            raise ScenarioError(f"{self._dotted(key)}: expected an array of tables ([[{self._dotted(key)}]])")
        return [_Table(item, f"{self._dotted(key)}[{i}]") for i, item in enumerate(items)]

    def finish(self, hint: str = "") -> None:
        unknown = sorted(set(self.data) - self._seen)
        if unknown:
            extra = f" ({hint})" if hint else ""
            raise ScenarioError(f"{self._dotted(unknown[0])}: unknown key{extra}")


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number, got {v!r}")
    x = float(v)
    if not math.isfinite(x):
        raise ValueError(f"expected a finite number, got {v!r}")
    return x


def _positive(v: Any) -> float:
    x = _number(v)
    if not x > 0:
        raise ValueError(f"must be > 0, got {v!r}")
    return x


def _nonneg(v: Any) -> float:
    x = _number(v)
    if x < 0:
        raise ValueError(f"must be >= 0, got {v!r}")
    return x


def _float_range(lo: float, hi: float) -> Callable[[Any], float]:
    def conv(v: Any) -> float:
        x = _number(v)
        if not lo <= x <= hi:
            raise ValueError(f"must be in [{lo}, {hi}], got {v!r}")
        return x

    return conv


def _int_range(lo: int, hi: int) -> Callable[[Any], int]:
    def conv(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an integer, got {v!r}")
        if not lo <= v <= hi:
            raise ValueError(f"must be in [{lo}, {hi}], got {v!r}")
        return v

    return conv


def _string(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {v!r}")
    return v


def _wire_text(v: Any) -> str:
    s = _string(v)
    if not (1 <= len(s) <= 32 and s.isascii() and s.isprintable() and s == s.strip()
            and not set(s) & set("$*,")):
        raise ValueError(f"must be 1-32 printable ASCII characters without '$', '*', ',': {v!r}")
    return s


def _vec(n: int, v: Any) -> np.ndarray:
    if not isinstance(v, list) or len(v) != n:
        raise ValueError(f"expected a list of {n} numbers, got {v!r}")
    return np.array([_number(x) for x in v])


def _vec3(v: Any) -> np.ndarray:
    return _vec(3, v)


def _vec3_nonneg(v: Any) -> np.ndarray:
    """A scalar (same for every axis) or a 3-list, each >= 0."""
    a = np.full(3, _number(v)) if not isinstance(v, list) else _vec(3, v)
    if np.any(a < 0):
        raise ValueError(f"must be >= 0, got {v!r}")
    return a


def _quat(v: Any) -> np.ndarray:
    q = _vec(4, v)
    n = float(np.linalg.norm(q))
    if abs(n - 1.0) > _QUAT_NORM_TOL:
        raise ValueError(f"quaternion (w, x, y, z) must have unit norm, got norm {n:.9g}")
    return q / n


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _choice(choices: tuple[str, ...]) -> Callable[[Any], str]:
    def conv(v: Any) -> str:
        if v not in choices:
            raise ValueError(f"must be one of {', '.join(repr(c) for c in choices)}, got {v!r}")
        return str(v)

    return conv


def _enum(cls: type[enum.Enum]) -> Callable[[Any], Any]:
    def conv(v: Any):
        try:
            return cls(v)
        except ValueError:
            names = ", ".join(repr(m.value) for m in cls)
            raise ValueError(f"must be one of {names}, got {v!r}") from None

    return conv


def _raw_table(v: Any) -> dict:
    if not isinstance(v, Mapping):
        raise ValueError(f"expected a table, got {type(v).__name__}")
    return dict(v)
