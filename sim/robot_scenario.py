"""The scenario's ``[robot]`` table: keys, defaults, validation.

``cellcal.sim.scenario`` hands the raw table over as ``scenario.robot: dict``;
:func:`parse_robot_table` turns it into a frozen :class:`RobotScenario` in SI units,
rejecting unknown keys and bad values with a :class:`~cellcal.sim.errors.ScenarioError`
(a ``ValueError``) naming the dotted path. ``docs/simulation-robot.md`` documents every key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellcal.drivers.kinematics import DHModel, dh_model, dh_model_from_table
from cellcal.sim.errors import ScenarioError

__all__ = [
    "RobotScenario",
    "CanScenario",
    "FaultSpec",
    "FAULT_KINDS",
    "OPTIONAL_RTDE_OUTPUTS",
    "parse_robot_table",
    "DEFAULT_INITIAL_Q_DEG",
]

DEFAULT_INITIAL_Q_DEG = (0.0, -90.0, 90.0, -90.0, -90.0, 0.0)

#: Fault kinds the simulated robot knows.
FAULT_KINDS = ("disconnect", "never_settles", "protective_stop", "silent_node", "tcp_change", "payload_change")
#: Default TCP of a ``tcp_change`` fault: a 20 mm tool along the flange's z axis.
DEFAULT_CHANGED_TCP = (0.0, 0.0, 0.02, 0.0, 0.0, 0.0)
#: Default payload of a ``payload_change`` fault (kg).
DEFAULT_CHANGED_PAYLOAD_KG = 1.5
#: RTDE outputs a scenario may declare missing (an older controller's software).
OPTIONAL_RTDE_OUTPUTS = ("tcp_offset", "payload")

_DEG = math.pi / 180.0


@dataclass(frozen=True)
class FaultSpec:
    """One scheduled fault.

    Attributes
    ----------
    kind : str
        ``disconnect`` (RTDE: connections dropped and refused; CAN: every drive silent),
        ``never_settles`` (a persistent oscillation of ``ringing_amplitude``),
        ``protective_stop`` (motion frozen, safety mode PROTECTIVE_STOP / CiA 402 quick
        stop, commands refused), ``silent_node`` (CAN: drive ``node`` stops heartbeat, PDO
        and SDO).
    start_s : float
        Simulated time the fault starts (s).
    duration_s : float
        How long it lasts (s); ``inf`` (the default) for the rest of the run.
    node : int
        CAN node id for ``silent_node`` (0 otherwise).
    tcp_offset : tuple of 6 floats or None
        ``tcp_change``: the controller's TCP ``x, y, z, rx, ry, rz`` (m, rad) while the
        fault lasts, as if changed on the pendant: the reported TCP pose follows it, and so
        does the RTDE ``tcp_offset`` output.
    payload_kg : float or None
        ``payload_change``: the payload mass the controller reports while the fault lasts.
    """

    kind: str
    start_s: float
    duration_s: float = math.inf
    node: int = 0
    tcp_offset: tuple[float, ...] | None = None
    payload_kg: float | None = None

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.start_s + self.duration_s


@dataclass(frozen=True)
class CanScenario:
    """``[robot.can]``: how the simulated CiA 402 drives count and talk, and which factory
    behaviours they show (``docs/simulation-robot.md`` documents every key)."""

    counts_per_rev: np.ndarray = field(default_factory=lambda: np.full(6, 2.0**20))
    gear_ratio: np.ndarray = field(default_factory=lambda: np.ones(6))
    sign: np.ndarray = field(default_factory=lambda: np.ones(6))
    offset_counts: np.ndarray = field(default_factory=lambda: np.zeros(6))
    #: 0x1017 at power-up; 0: heartbeats off (as many drives ship)
    heartbeat_ms: int = 100
    position_window_counts: int = 200
    position_window_time_ms: int = 20
    profile_velocity_deg_s: float = 60.0
    #: 0x6083 / 0x6084 at power-up (joint deg/s²); the move accelerates with the smaller
    profile_acceleration_deg_s2: float = 80.0
    profile_deceleration_deg_s2: float = 80.0
    #: set-point acknowledge this long after the new-set-point edge (wall ms)
    ack_delay_ms: float = 0.0
    #: units of 0x6081/0x606C (and 0x6083/0x6084 per second): counts_per_s or rpm (motor)
    velocity_units: str = "counts_per_s"
    #: publish 0x60A9 SI unit velocity (rpm drives only)
    announce_units: bool = True
    #: configurable (the driver may remap TPDO1) or fixed (mapping read-only, preset)
    pdo_mapping: str = "configurable"
    #: TPDO2-4 valid at power-up, event-driven (event timer 100 ms)
    extra_tpdos: bool = False
    #: switch_on_disabled or fault (undervoltage latched at power-up, cleared by fault reset)
    power_up_state: str = "switch_on_disabled"
    #: statusword bit 10 while not OPERATION ENABLED (many drives clear it)
    target_reached_when_disabled: bool = True
    #: homing attained (statusword bit 12 in homing mode); false: homing needed
    homed: bool = True
    vendor_id: int = 0
    product_code: int = 0x0402
    revision: int = 0x00010000
    #: serial number = serial_base + node id
    serial_base: int = 1000


@dataclass(frozen=True)
class RobotScenario:
    """Parsed ``[robot]`` table, SI units (see ``docs/simulation-robot.md``)."""

    model: DHModel = field(default_factory=lambda: dh_model("ur5e"))
    #: None: start where the world's flange is (the scenario's ``truth.base_T_flange``)
    initial_q_rad: np.ndarray | None = None
    max_joint_speed_rad_s: float = 60.0 * _DEG
    max_joint_accel_rad_s2: float = 80.0 * _DEG
    min_move_time_s: float = 0.2
    settle_time_constant_s: float = 0.25
    ringing_amplitude_rad: float = 0.02 * _DEG
    ringing_frequency_hz: float = 4.0
    encoder_noise_rad: float = 0.0
    velocity_noise_rad_s: float = 0.0
    joint_zero_offsets_rad: np.ndarray = field(default_factory=lambda: np.zeros(6))
    tcp_offset: np.ndarray = field(default_factory=lambda: np.zeros(6))
    payload_kg: float = 0.0
    #: RTDE outputs the simulated controller answers ``NOT_FOUND`` for (older software).
    rtde_missing_outputs: tuple[str, ...] = ()
    controller_version: tuple[int, int, int, int] = (5, 23, 0, 0)
    rtde_max_protocol: int = 2
    max_stream_rate_hz: float = 500.0
    clock_offset_s: float = 1000.0
    clock_skew_ppm: float = 0.0
    update_rate_hz: float = 250.0
    seed: int = 0
    can: CanScenario = field(default_factory=CanScenario)
    faults: tuple[FaultSpec, ...] = ()

    @property
    def true_model(self) -> DHModel:
        """The arm as it really is: the nominal model with the joint zero offsets."""
        return self.model.with_joint_offsets(self.joint_zero_offsets_rad, self.model.name + "-true")


# -- parsing ---------------------------------------------------------------------------------
def _num(v: Any, path: str, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ScenarioError(f"{path}: expected a finite number, got {v!r}")
    if positive and not v > 0:
        raise ScenarioError(f"{path}: must be > 0, got {v!r}")
    if nonneg and v < 0:
        raise ScenarioError(f"{path}: must be >= 0, got {v!r}")
    return float(v)


def _int(v: Any, path: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ScenarioError(f"{path}: expected an integer in [{lo}, {hi}], got {v!r}")
    return int(v)


def _vec(v: Any, path: str, n: int, scale: float = 1.0, *, positive: bool = False) -> np.ndarray:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v] * n
    if not isinstance(v, Sequence) or isinstance(v, str) or len(v) != n:
        raise ScenarioError(f"{path}: expected {n} numbers, got {v!r}")
    out = np.array([_num(x, f"{path}[{i}]", positive=positive) for i, x in enumerate(v)])
    return out * scale


def _check_keys(table: Mapping[str, Any], allowed: Sequence[str], path: str) -> None:
    if not isinstance(table, Mapping):
        raise ScenarioError(f"{path}: expected a table, got {type(table).__name__}")
    for key in table:
        if key not in allowed:
            raise ScenarioError(f"{path}.{key}: unknown key (allowed: {', '.join(sorted(allowed))})")


_SCALARS: dict[str, tuple[str, float, dict[str, bool]]] = {
    # key: (field, scale to SI, checks)
    "max_joint_speed_deg_s": ("max_joint_speed_rad_s", _DEG, {"positive": True}),
    "max_joint_accel_deg_s2": ("max_joint_accel_rad_s2", _DEG, {"positive": True}),
    "min_move_time_s": ("min_move_time_s", 1.0, {"positive": True}),
    "settle_time_constant_s": ("settle_time_constant_s", 1.0, {"positive": True}),
    "ringing_amplitude_deg": ("ringing_amplitude_rad", _DEG, {"nonneg": True}),
    "ringing_frequency_hz": ("ringing_frequency_hz", 1.0, {"positive": True}),
    "encoder_noise_deg": ("encoder_noise_rad", _DEG, {"nonneg": True}),
    "velocity_noise_deg_s": ("velocity_noise_rad_s", _DEG, {"nonneg": True}),
    "max_stream_rate_hz": ("max_stream_rate_hz", 1.0, {"positive": True}),
    "clock_offset_s": ("clock_offset_s", 1.0, {"nonneg": True}),
    "clock_skew_ppm": ("clock_skew_ppm", 1.0, {}),
    "update_rate_hz": ("update_rate_hz", 1.0, {"positive": True}),
    "payload_kg": ("payload_kg", 1.0, {"nonneg": True}),
}
_OTHER = (
    "model",
    "dh",
    "initial_q_deg",
    "joint_zero_offsets_deg",
    "tcp_offset",
    "rtde_missing_outputs",
    "controller_version",
    "rtde_max_protocol",
    "seed",
    "can",
    "faults",
)
_CAN_KEYS = (
    "counts_per_rev",
    "gear_ratio",
    "sign",
    "offset_counts",
    "heartbeat_ms",
    "position_window_counts",
    "position_window_time_ms",
    "profile_velocity_deg_s",
    "profile_acceleration_deg_s2",
    "profile_deceleration_deg_s2",
    "ack_delay_ms",
    "velocity_units",
    "announce_units",
    "pdo_mapping",
    "extra_tpdos",
    "power_up_state",
    "target_reached_when_disabled",
    "homed",
    "vendor_id",
    "product_code",
    "revision",
    "serial_base",
)
_CAN_CHOICES = {
    "velocity_units": ("counts_per_s", "rpm"),
    "pdo_mapping": ("configurable", "fixed"),
    "power_up_state": ("switch_on_disabled", "fault"),
}
_CAN_BOOLS = ("announce_units", "extra_tpdos", "target_reached_when_disabled", "homed")
_CAN_U32 = ("vendor_id", "product_code", "revision", "serial_base")
_FAULT_KEYS = ("kind", "start_s", "duration_s", "node", "tcp_offset", "payload_kg")


def _parse_can(t: Mapping[str, Any], path: str) -> CanScenario:
    _check_keys(t, _CAN_KEYS, path)
    kw: dict[str, Any] = {}
    if "counts_per_rev" in t:
        kw["counts_per_rev"] = _vec(t["counts_per_rev"], f"{path}.counts_per_rev", 6, positive=True)
    if "gear_ratio" in t:
        kw["gear_ratio"] = _vec(t["gear_ratio"], f"{path}.gear_ratio", 6, positive=True)
    if "sign" in t:
        s = _vec(t["sign"], f"{path}.sign", 6)
        if not np.all(np.isin(s, (-1.0, 1.0))):
            raise ScenarioError(f"{path}.sign: each must be 1 or -1")
        kw["sign"] = s
    if "offset_counts" in t:
        kw["offset_counts"] = _vec(t["offset_counts"], f"{path}.offset_counts", 6)
    if "heartbeat_ms" in t:
        kw["heartbeat_ms"] = _int(t["heartbeat_ms"], f"{path}.heartbeat_ms", 0, 65535)
    if "position_window_counts" in t:
        kw["position_window_counts"] = _int(
            t["position_window_counts"], f"{path}.position_window_counts", 0, 2**32 - 1
        )
    if "position_window_time_ms" in t:
        kw["position_window_time_ms"] = _int(
            t["position_window_time_ms"], f"{path}.position_window_time_ms", 0, 65535
        )
    for key in ("profile_velocity_deg_s", "profile_acceleration_deg_s2", "profile_deceleration_deg_s2"):
        if key in t:
            kw[key] = _num(t[key], f"{path}.{key}", positive=True)
    if "ack_delay_ms" in t:
        kw["ack_delay_ms"] = _num(t["ack_delay_ms"], f"{path}.ack_delay_ms", nonneg=True)
    for key, choices in _CAN_CHOICES.items():
        if key in t:
            if t[key] not in choices:
                raise ScenarioError(f"{path}.{key}: expected one of {', '.join(choices)}, got {t[key]!r}")
            kw[key] = t[key]
    for key in _CAN_BOOLS:
        if key in t:
            if not isinstance(t[key], bool):
                raise ScenarioError(f"{path}.{key}: expected true or false, got {t[key]!r}")
            kw[key] = t[key]
    for key in _CAN_U32:
        if key in t:
            kw[key] = _int(t[key], f"{path}.{key}", 0, 2**32 - 1)
    return CanScenario(**kw)


def _parse_faults(v: Any, path: str) -> tuple[FaultSpec, ...]:
    if not isinstance(v, Sequence) or isinstance(v, str):
        raise ScenarioError(f"{path}: expected an array of tables ([[robot.faults]])")
    out = []
    for i, t in enumerate(v):
        p = f"{path}[{i}]"
        _check_keys(t, _FAULT_KEYS, p)
        kind = t.get("kind")
        if kind not in FAULT_KINDS:
            raise ScenarioError(f"{p}.kind: expected one of {', '.join(FAULT_KINDS)}, got {kind!r}")
        if "start_s" not in t:
            raise ScenarioError(f"{p}.start_s: required")
        at = _num(t["start_s"], f"{p}.start_s", nonneg=True)
        dur = _num(t["duration_s"], f"{p}.duration_s", positive=True) if "duration_s" in t else math.inf
        node = 0
        if kind == "silent_node":
            if "node" not in t:
                raise ScenarioError(f"{p}.node: required for silent_node")
            node = _int(t["node"], f"{p}.node", 1, 127)
        elif "node" in t:
            raise ScenarioError(f"{p}.node: only for kind = \"silent_node\"")
        tcp = payload = None
        if kind == "tcp_change":
            tcp = tuple(float(x) for x in _vec(t.get("tcp_offset", DEFAULT_CHANGED_TCP), f"{p}.tcp_offset", 6))
        elif "tcp_offset" in t:
            raise ScenarioError(f"{p}.tcp_offset: only for kind = \"tcp_change\"")
        if kind == "payload_change":
            payload = _num(t.get("payload_kg", DEFAULT_CHANGED_PAYLOAD_KG), f"{p}.payload_kg", nonneg=True)
        elif "payload_kg" in t:
            raise ScenarioError(f"{p}.payload_kg: only for kind = \"payload_change\"")
        out.append(FaultSpec(kind, at, dur, node, tcp, payload))
    return tuple(out)


def parse_robot_table(table: Mapping[str, Any] | None, path: str = "robot") -> RobotScenario:
    """Validate the raw ``[robot]`` table and return a :class:`RobotScenario`.

    Raises
    ------
    ValueError
        Naming the dotted path (``robot.can.heartbeat_ms``, ``robot.faults[1].kind``) of the
        first unknown key or bad value.
    """
    table = {} if table is None else table
    _check_keys(table, (*_SCALARS, *_OTHER), path)
    kw: dict[str, Any] = {}
    for key, (fname, scale, checks) in _SCALARS.items():
        if key in table:
            kw[fname] = _num(table[key], f"{path}.{key}", **checks) * scale
    if "model" in table:
        if not isinstance(table["model"], str):
            raise ScenarioError(f"{path}.model: expected a model name")
        try:
            kw["model"] = dh_model(table["model"])
        except ValueError as exc:
            raise ScenarioError(f"{path}.model: {exc}") from None
    if "dh" in table:
        if "model" in table:
            raise ScenarioError(f"{path}.dh: give either model or dh, not both")
        kw["model"] = dh_model_from_table(table["dh"], f"{path}.dh")
        if kw["model"].n_joints != 6:
            raise ScenarioError(f"{path}.dh: the simulated robot has 6 joints")
    if "initial_q_deg" in table:
        kw["initial_q_rad"] = _vec(table["initial_q_deg"], f"{path}.initial_q_deg", 6, _DEG)
    if "joint_zero_offsets_deg" in table:
        kw["joint_zero_offsets_rad"] = _vec(
            table["joint_zero_offsets_deg"], f"{path}.joint_zero_offsets_deg", 6, _DEG
        )
    if "tcp_offset" in table:
        kw["tcp_offset"] = _vec(table["tcp_offset"], f"{path}.tcp_offset", 6)
    if "rtde_missing_outputs" in table:
        names = table["rtde_missing_outputs"]
        if (not isinstance(names, Sequence) or isinstance(names, str)
                or any(n not in OPTIONAL_RTDE_OUTPUTS for n in names)):
            raise ScenarioError(f"{path}.rtde_missing_outputs: expected a list of {', '.join(OPTIONAL_RTDE_OUTPUTS)}")
        kw["rtde_missing_outputs"] = tuple(names)
    if "controller_version" in table:
        v = table["controller_version"]
        parts = v.split(".") if isinstance(v, str) else []
        if len(parts) != 4 or not all(p.isdigit() for p in parts):
            raise ScenarioError(f"{path}.controller_version: expected \"major.minor.bugfix.build\"")
        kw["controller_version"] = tuple(int(p) for p in parts)
    if "rtde_max_protocol" in table:
        kw["rtde_max_protocol"] = _int(table["rtde_max_protocol"], f"{path}.rtde_max_protocol", 1, 2)
    if "seed" in table:
        kw["seed"] = _int(table["seed"], f"{path}.seed", 0, 2**63 - 1)
    if "can" in table:
        kw["can"] = _parse_can(table["can"], f"{path}.can")
    if "faults" in table:
        kw["faults"] = _parse_faults(table["faults"], f"{path}.faults")
    return RobotScenario(**kw)
