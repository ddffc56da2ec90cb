"""The scenario's ``[robot]`` table: keys, defaults, validation.

``cellcal.sim.scenario`` hands the raw table over as ``scenario.robot: dict``;
:func:`parse_robot_table` turns it into a frozen :class:`RobotScenario` in SI units,
rejecting unknown keys and bad values with a :class:`~cellcal.sim.errors.ScenarioError`
(a ``ValueError``) naming the dotted path. ``docs/simulation-robot.md`` documents every key.

The arm's error model has three layers (ADR 0015 gives the magnitudes and their sources):

* the **nominal** model (``model`` / ``dh``): the data sheet;
* the **factory** calibration (``[robot.factory]``): DH deltas the controller believes,
  served in ``KinematicsInfo`` on the primary interface and used for ``actual_TCP_pose``;
* the **true** arm = factory + hidden residual errors (``[robot.residual]``: joint zeros,
  link a/d, twists, the parallel-axis tilts of joints 3 and 4), plus the physics the
  controller does not see: joint compliance under the payload's gravity torque
  (``[robot.compliance]``), backlash (``backlash_deg``) and warm-up drift
  (``[robot.thermal]``).

Everything is off (zero) unless a scenario turns it on; random deltas (``*_std_*`` keys) are
drawn from the table's own ``seed``.
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
    "NODE_FAULT_KINDS",
    "DEFAULT_OFF_TARGET_DEG",
    "DEFAULT_DRIVE_FAULT_CODE",
    "OPTIONAL_RTDE_OUTPUTS",
    "parse_robot_table",
    "DEFAULT_INITIAL_Q_DEG",
    "DHDeltas",
    "Compliance",
    "Thermal",
    "ROBOT_MODES_AT_START",
    "ALUMINIUM_EXPANSION_PER_K",
    "STANDARD_GRAVITY_M_S2",
]

DEFAULT_INITIAL_Q_DEG = (0.0, -90.0, 90.0, -90.0, -90.0, 0.0)

#: Fault kinds the simulated robot knows.
FAULT_KINDS = ("disconnect", "never_settles", "protective_stop", "silent_node", "tcp_change", "payload_change",
               "local_control", "interfaces_down", "off_target", "drive_fault", "frozen_joint", "garbled_can_line")
#: CAN fault kinds about one drive: they need ``node``.
NODE_FAULT_KINDS = ("silent_node", "off_target", "drive_fault", "frozen_joint")
#: Default of an ``off_target`` fault: the drive stops this far from its target (deg).
DEFAULT_OFF_TARGET_DEG = 0.2
#: Default error code (0x603F and the EMCY) of a ``drive_fault``: CiA 402 following error.
DEFAULT_DRIVE_FAULT_CODE = 0x8611
#: Default TCP of a ``tcp_change`` fault: a 20 mm tool along the flange's z axis.
DEFAULT_CHANGED_TCP = (0.0, 0.0, 0.02, 0.0, 0.0, 0.0)
#: Default payload of a ``payload_change`` fault (kg).
DEFAULT_CHANGED_PAYLOAD_KG = 1.5
#: RTDE outputs a scenario may declare missing (an older controller's software).
OPTIONAL_RTDE_OUTPUTS = ("tcp_offset", "payload")

_DEG = math.pi / 180.0
_MM = 1e-3
#: Linear expansion coefficient of aluminium alloys near room temperature (1/K): 23e-6
#: (engineering handbooks give 22-24e-6 for the alloys arm tubes and castings are made of).
ALUMINIUM_EXPANSION_PER_K = 23e-6
STANDARD_GRAVITY_M_S2 = 9.80665
#: ``initial_robot_mode`` values: what the dashboard (and RTDE ``robot_mode``) say at start.
ROBOT_MODES_AT_START = ("running", "idle", "power_off")


@dataclass(frozen=True)
class DHDeltas:
    """Deltas added to a DH model, SI (rad, m), each (6,); ``beta_rad`` only on the true arm."""

    theta_rad: np.ndarray = field(default_factory=lambda: np.zeros(6))
    a_m: np.ndarray = field(default_factory=lambda: np.zeros(6))
    d_m: np.ndarray = field(default_factory=lambda: np.zeros(6))
    alpha_rad: np.ndarray = field(default_factory=lambda: np.zeros(6))
    beta_rad: np.ndarray = field(default_factory=lambda: np.zeros(6))

    @property
    def any(self) -> bool:
        return bool(any(np.any(getattr(self, k)) for k in ("theta_rad", "a_m", "d_m", "alpha_rad", "beta_rad")))

    def apply(self, model: DHModel, name: str | None = None) -> DHModel:
        return model.with_deltas(theta_rad=self.theta_rad, a_m=self.a_m, d_m=self.d_m, alpha_rad=self.alpha_rad,
                                 beta_rad=self.beta_rad, name=name)


@dataclass(frozen=True)
class Compliance:
    """``[robot.compliance]``: joints that yield under the payload's gravity torque.

    ``stiffness_nm_per_rad`` (6,): 0 for a rigid joint. The payload (``payload_kg`` at
    ``payload_com_m`` in the flange frame) hangs in ``gravity_m_s2`` (base frame); joint
    ``i`` turns by ``tau_i / k_i``, ``tau_i`` the gravity torque about its axis.
    """

    stiffness_nm_per_rad: np.ndarray = field(default_factory=lambda: np.zeros(6))
    payload_kg: float = 0.0
    payload_com_m: np.ndarray = field(default_factory=lambda: np.zeros(3))
    gravity_m_s2: np.ndarray = field(default_factory=lambda: np.array([0.0, 0.0, -STANDARD_GRAVITY_M_S2]))

    @property
    def active(self) -> bool:
        return self.payload_kg > 0 and bool(np.any(self.stiffness_nm_per_rad > 0))

    @property
    def compliance_rad_per_nm(self) -> np.ndarray:
        k = self.stiffness_nm_per_rad
        return np.where(k > 0, 1.0 / np.where(k > 0, k, 1.0), 0.0)


@dataclass(frozen=True)
class Thermal:
    """``[robot.thermal]``: warm-up. The arm's temperature rise above the calibration
    temperature follows ``rise(t) = final - (final - initial) exp(-t / tau)`` (simulated
    seconds since the world started); every link length scales by ``1 + expansion * rise``
    and each joint zero drifts by ``zero_drift * rise``."""

    initial_rise_k: float = 0.0
    final_rise_k: float = 0.0
    time_constant_s: float = 1800.0
    expansion_per_k: float = ALUMINIUM_EXPANSION_PER_K
    zero_drift_rad_per_k: np.ndarray = field(default_factory=lambda: np.zeros(6))

    @property
    def active(self) -> bool:
        return bool(self.initial_rise_k or self.final_rise_k)

    def rise_k(self, t_s: float) -> float:
        """Temperature rise (K) at simulated time ``t_s``."""
        return self.final_rise_k - (self.final_rise_k - self.initial_rise_k) * math.exp(-max(t_s, 0.0) / self.time_constant_s)


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
        and SDO), ``off_target`` (CAN: drive ``node`` stops ``offset_rad`` from its targets
        and still reports target reached), ``drive_fault`` (CAN: drive ``node`` shows FAULT
        in its statusword, 0x603F = ``error_code``, while the fault lasts, then carries on),
        ``frozen_joint`` (CAN: drive ``node``'s actual position stays where it was when the
        fault began), ``garbled_can_line`` (CAN through the SLCAN bridge: damaged lines sent
        to every host once, at the start) and the others in ``docs/simulation-robot.md``.
    start_s : float
        Simulated time the fault starts (s).
    duration_s : float
        How long it lasts (s); ``inf`` (the default) for the rest of the run.
    node : int
        CAN node id for the kinds of :data:`NODE_FAULT_KINDS` (0 otherwise).
    tcp_offset : tuple of 6 floats or None
        ``tcp_change``: the controller's TCP ``x, y, z, rx, ry, rz`` (m, rad) while the
        fault lasts, as if changed on the pendant: the reported TCP pose follows it, and so
        does the RTDE ``tcp_offset`` output.
    payload_kg : float or None
        ``payload_change``: the payload mass the controller reports while the fault lasts.
    offset_rad : float or None
        ``off_target``: how far (joint rad, signed) the drive stops from its targets.
    error_code : int or None
        ``drive_fault``: the error code the drive reports (0x603F, EMCY).
    """

    kind: str
    start_s: float
    duration_s: float = math.inf
    node: int = 0
    tcp_offset: tuple[float, ...] | None = None
    payload_kg: float | None = None
    offset_rad: float | None = None
    error_code: int | None = None

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
    #: the controller clock's rate drifts this many ppm per (wall) hour
    clock_skew_drift_ppm_per_h: float = 0.0
    #: mean of an exponential delay between a data package's sample and its sending (wall ms)
    latency_jitter_ms: float = 0.0
    #: accepted so older scenario files load; unused (the arm is evaluated when a device
    #: reads it, and a protective stop is applied at its time)
    update_rate_hz: float = 250.0
    seed: int = 0
    can: CanScenario = field(default_factory=CanScenario)
    faults: tuple[FaultSpec, ...] = ()
    #: ``[robot.factory]``: what the controller believes (KinematicsInfo, actual_TCP_pose)
    factory: DHDeltas = field(default_factory=DHDeltas)
    #: ``[robot.residual]``: the true arm's hidden errors on top of the factory calibration
    residual: DHDeltas = field(default_factory=DHDeltas)
    compliance: Compliance = field(default_factory=Compliance)
    backlash_rad: np.ndarray = field(default_factory=lambda: np.zeros(6))
    thermal: Thermal = field(default_factory=Thermal)
    #: dashboard ``get serial number``
    serial_number: str = "20235500001"
    #: dashboard ``is in remote control``
    remote_control: bool = True
    #: ``running``, ``idle`` (powered, brakes on) or ``power_off``
    initial_robot_mode: str = "running"

    @property
    def factory_model(self) -> DHModel:
        """The controller's model: the nominal one with the factory deltas (plain DH)."""
        return self.factory.apply(self.model, self.model.name)

    @property
    def true_model(self) -> DHModel:
        """The arm as it really is, cold and rigid: factory + residual deltas + the joint zero
        offsets (compliance, backlash and warm-up are applied by the simulated robot)."""
        m = self.residual.apply(self.factory_model, self.model.name + "-true")
        return m.with_joint_offsets(self.joint_zero_offsets_rad)


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
    "clock_skew_drift_ppm_per_h": ("clock_skew_drift_ppm_per_h", 1.0, {}),
    "latency_jitter_ms": ("latency_jitter_ms", 1.0, {"nonneg": True}),
}
_OTHER = (
    "factory",
    "residual",
    "compliance",
    "backlash_deg",
    "thermal",
    "serial_number",
    "remote_control",
    "initial_robot_mode",
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
_FAULT_KEYS = ("kind", "start_s", "duration_s", "node", "tcp_offset", "payload_kg", "offset_deg", "error_code")


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
        if kind in NODE_FAULT_KINDS:
            if "node" not in t:
                raise ScenarioError(f"{p}.node: required for {kind}")
            node = _int(t["node"], f"{p}.node", 1, 127)
        elif "node" in t:
            raise ScenarioError(f"{p}.node: only for kind = {' / '.join(NODE_FAULT_KINDS)}")
        offset = code = None
        if kind == "off_target":
            offset = _num(t.get("offset_deg", DEFAULT_OFF_TARGET_DEG), f"{p}.offset_deg") * _DEG
            if offset == 0 or abs(offset) > math.pi:
                raise ScenarioError(f"{p}.offset_deg: must be non-zero and within 180 deg")
        elif "offset_deg" in t:
            raise ScenarioError(f"{p}.offset_deg: only for kind = \"off_target\"")
        if kind == "drive_fault":
            code = _int(t.get("error_code", DEFAULT_DRIVE_FAULT_CODE), f"{p}.error_code", 1, 0xFFFF)
        elif "error_code" in t:
            raise ScenarioError(f"{p}.error_code: only for kind = \"drive_fault\"")
        tcp = payload = None
        if kind == "tcp_change":
            tcp = tuple(float(x) for x in _vec(t.get("tcp_offset", DEFAULT_CHANGED_TCP), f"{p}.tcp_offset", 6))
        elif "tcp_offset" in t:
            raise ScenarioError(f"{p}.tcp_offset: only for kind = \"tcp_change\"")
        if kind == "payload_change":
            payload = _num(t.get("payload_kg", DEFAULT_CHANGED_PAYLOAD_KG), f"{p}.payload_kg", nonneg=True)
        elif "payload_kg" in t:
            raise ScenarioError(f"{p}.payload_kg: only for kind = \"payload_change\"")
        out.append(FaultSpec(kind, at, dur, node, tcp, payload, offset, code))
    return tuple(out)


_DELTA_KEYS = ("theta_delta_deg", "a_delta_mm", "d_delta_mm", "alpha_delta_deg",
               "theta_std_deg", "a_std_mm", "d_std_mm", "alpha_std_deg", "seed")
_TILT_KEYS = ("parallel_tilt_deg", "parallel_tilt_std_deg")


def _parse_deltas(t: Any, path: str, *, tilts: bool) -> DHDeltas:
    _check_keys(t, (*_DELTA_KEYS, *(_TILT_KEYS if tilts else ())), path)
    seed = _int(t["seed"], f"{path}.seed", 0, 2**63 - 1) if "seed" in t else 0
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, unit, scale in (("theta", "deg", _DEG), ("a", "mm", _MM), ("d", "mm", _MM), ("alpha", "deg", _DEG)):
        v = _vec(t[f"{name}_delta_{unit}"], f"{path}.{name}_delta_{unit}", 6, scale) if f"{name}_delta_{unit}" in t \
            else np.zeros(6)
        key = f"{name}_std_{unit}"
        # drawn whether or not the key is given, so adding one std key does not change the others' draws
        draw = rng.standard_normal(6)
        if key in t:
            v = v + draw * _num(t[key], f"{path}.{key}", nonneg=True) * scale
        out[f"{name}_{'rad' if unit == 'deg' else 'm'}"] = v
    beta = np.zeros(6)
    if tilts:
        if "parallel_tilt_deg" in t:
            beta[1:3] = _vec(t["parallel_tilt_deg"], f"{path}.parallel_tilt_deg", 2, _DEG)
        draw = rng.standard_normal(2)
        if "parallel_tilt_std_deg" in t:
            beta[1:3] += draw * _num(t["parallel_tilt_std_deg"], f"{path}.parallel_tilt_std_deg", nonneg=True) * _DEG
    return DHDeltas(out["theta_rad"], out["a_m"], out["d_m"], out["alpha_rad"], beta)


def _parse_compliance(t: Any, path: str) -> Compliance:
    _check_keys(t, ("stiffness_nm_per_rad", "payload_kg", "payload_com_mm", "gravity_m_s2"), path)
    kw: dict[str, Any] = {}
    if "stiffness_nm_per_rad" in t:
        k = _vec(t["stiffness_nm_per_rad"], f"{path}.stiffness_nm_per_rad", 6)
        if np.any(k < 0):
            raise ScenarioError(f"{path}.stiffness_nm_per_rad: must be >= 0 (0: a rigid joint)")
        kw["stiffness_nm_per_rad"] = k
    if "payload_kg" in t:
        kw["payload_kg"] = _num(t["payload_kg"], f"{path}.payload_kg", nonneg=True)
    if "payload_com_mm" in t:
        kw["payload_com_m"] = _vec(t["payload_com_mm"], f"{path}.payload_com_mm", 3, _MM)
    if "gravity_m_s2" in t:
        kw["gravity_m_s2"] = _vec(t["gravity_m_s2"], f"{path}.gravity_m_s2", 3)
    return Compliance(**kw)


def _parse_thermal(t: Any, path: str) -> Thermal:
    _check_keys(t, ("initial_rise_k", "final_rise_k", "time_constant_s", "expansion_per_k", "zero_drift_deg_per_k"), path)
    kw: dict[str, Any] = {}
    for key in ("initial_rise_k", "final_rise_k"):
        if key in t:
            kw[key] = _num(t[key], f"{path}.{key}")
    if "time_constant_s" in t:
        kw["time_constant_s"] = _num(t["time_constant_s"], f"{path}.time_constant_s", positive=True)
    if "expansion_per_k" in t:
        kw["expansion_per_k"] = _num(t["expansion_per_k"], f"{path}.expansion_per_k")
        if abs(kw["expansion_per_k"]) > 1e-3:
            raise ScenarioError(f"{path}.expansion_per_k: {kw['expansion_per_k']!r} per kelvin is not a material")
    if "zero_drift_deg_per_k" in t:
        kw["zero_drift_rad_per_k"] = _vec(t["zero_drift_deg_per_k"], f"{path}.zero_drift_deg_per_k", 6, _DEG)
    return Thermal(**kw)


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
    if "factory" in table:
        kw["factory"] = _parse_deltas(table["factory"], f"{path}.factory", tilts=False)
    if "residual" in table:
        kw["residual"] = _parse_deltas(table["residual"], f"{path}.residual", tilts=True)
    if "compliance" in table:
        kw["compliance"] = _parse_compliance(table["compliance"], f"{path}.compliance")
    if "backlash_deg" in table:
        b = _vec(table["backlash_deg"], f"{path}.backlash_deg", 6, _DEG)
        if np.any(b < 0):
            raise ScenarioError(f"{path}.backlash_deg: must be >= 0")
        kw["backlash_rad"] = b
    if "thermal" in table:
        kw["thermal"] = _parse_thermal(table["thermal"], f"{path}.thermal")
    if "serial_number" in table:
        sn = table["serial_number"]
        if not (isinstance(sn, str) and sn.isascii() and sn.isdigit() and 1 <= len(sn) <= 32):
            raise ScenarioError(f"{path}.serial_number: expected 1-32 digits as a string, got {sn!r}")
        kw["serial_number"] = sn
    if "remote_control" in table:
        if not isinstance(table["remote_control"], bool):
            raise ScenarioError(f"{path}.remote_control: expected true or false")
        kw["remote_control"] = table["remote_control"]
    if "initial_robot_mode" in table:
        if table["initial_robot_mode"] not in ROBOT_MODES_AT_START:
            raise ScenarioError(f"{path}.initial_robot_mode: expected one of {', '.join(ROBOT_MODES_AT_START)}, "
                                f"got {table['initial_robot_mode']!r}")
        kw["initial_robot_mode"] = table["initial_robot_mode"]
    return RobotScenario(**kw)
