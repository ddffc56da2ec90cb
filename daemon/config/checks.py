"""The configuration's checks beyond its types: bounds and relations between keys
(:func:`_validate`), the devices' URLs and options built by the drivers' own parsers
(:func:`check_devices`, :func:`check_tracker_url`, :func:`check_can_interface`), the ZeroMQ
security rules (``cellcal.daemon.config.security``), and :func:`preflight`, which
``cellcal run`` and ``cellcal check-config`` both call.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from urllib.parse import parse_qs, urlsplit

# The plant interfaces' sections (OPC UA, MQTT, Prometheus): cellcal.daemon.config.plant.
from cellcal.daemon.config import plant as _plant

# The camera's section (ADR 0030) is checked by its own module, hooked in once in _validate.
from cellcal.daemon.config.camera import validate_camera
from cellcal.daemon.config.errors import ConfigError
from cellcal.daemon.config.kinematics import validate_kinematics
from cellcal.daemon.config.schema import (
    _DEG,
    _MM,
    SUPPORTED_CONFIG_VERSIONS,
    Config,
    Export,
    Tracker,
    _near,
    _show,
)
from cellcal.daemon.config.security import check_security, load_server_key
from cellcal.drivers import connect_robot, connect_tracker
from cellcal.drivers.base import load_backend
from cellcal.drivers.geocom import serial_url
from cellcal.drivers.tracker import BACKENDS, backend_for_url
from cellcal.solver.points import MIN_POINT_STATIONS


def check_measure_kind(tracker: Tracker) -> None:
    """``[tracker] measure`` must be a kind the instrument the URL names can measure.

    The backend is the one ``cellcal.drivers.connect_tracker`` picks (the URL's protocol
    scheme, ``emscon://`` or ``geocom://``, else ``tracker.options.backend``, else the
    cellcal tracker protocol); its ``measure_kinds`` say what the instrument measures. An
    emScon tracker or a GeoCOM total station measures points (a reflector) only, so
    ``measure = "pose"`` with one is refused here, naming the key, not at the first station.
    A URL or backend that names nothing is left to :func:`check_devices` (``tracker.url``).

    Raises
    ------
    ConfigError
        Under ``tracker.measure``.
    """
    if not tracker.url:
        return
    name = backend_for_url(tracker.url) or tracker.options.get("backend") or "serial"
    if not isinstance(name, str):
        return
    try:
        cls = load_backend(BACKENDS, name, "tracker backend")
    except (ValueError, ImportError, AttributeError):
        return  # check_devices reports the URL or the option
    kinds = frozenset(getattr(cls, "measure_kinds", ()))
    if kinds and tracker.measure not in kinds:
        only = " and ".join(repr(k) for k in sorted(kinds))
        raise ConfigError("tracker.measure", f"{tracker.measure!r}, but the {name} instrument of tracker.url "
                                             f"{_show(tracker.url)} measures {only} only: set measure = "
                                             f"{sorted(kinds)[0]!r}")


def _check_zmq(cfg: Config) -> None:
    # What "local" means is the security rules' (the transport enforces the same); the check
    # needs no socket and no file.
    check_security(cfg.zmq)


def preflight(cfg: Config, *, devices: bool = True) -> None:
    """Everything ``cellcal run`` checks of a loaded configuration before it opens a store,
    a device or a socket; ``cellcal check-config`` runs exactly this, so the two agree.

    Beyond :func:`load_config`: the drivers are built from the device URLs and options
    (constructors do no I/O, so a bad URL or option is found without touching a device;
    each error names its own key, ``tracker.options.timeout_s``), and with CURVE the server
    key file is read (so run check-config as the daemon's user).

    Parameters
    ----------
    devices : bool
        Build the drivers (``cellcal check-config --no-devices`` skips it, e.g. for a
        config whose devices are set elsewhere; ``cellcal run`` never does).

    Raises
    ------
    ConfigError
        Naming the file (``cfg.source``) and the dotted key.
    """
    try:
        if devices:
            check_devices(cfg)
        if cfg.zmq.curve:
            load_server_key(cfg.zmq)
        # an enabled plant interface: its optional package installed, its files readable
        _plant.preflight_plant(cfg.opcua, cfg.mqtt, cfg.metrics)
    except ConfigError as exc:
        raise exc.with_file(cfg.source or None) from None


# A frame name ROS (tf2: no leading "/"), URDF and xacro all take as is: no spaces, quotes,
# "$" or "{" (xacro would expand them); "/" only between segments (robot1/base_link).
_FRAME_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*")


_EXPORT_FRAMES = ("cell_frame", "base_frame", "flange_frame", "target_frame", "camera_frame", "tip_frame", "pivot_frame")


def _validate_export(e: Export) -> None:
    for name in (*_EXPORT_FRAMES, "robot_name"):
        v = getattr(e, name)
        if not _FRAME_NAME.fullmatch(v) or len(v) > 128:
            raise ConfigError(f"export.{name}", f"expected a frame name (letters, digits, _ and / between "
                                                f"segments, at most 128 characters), got {_show(v)}")
    seen: dict[str, str] = {}
    for name in _EXPORT_FRAMES:
        v = getattr(e, name)
        if v in seen:
            raise ConfigError(f"export.{name}", f"{v!r} is already export.{seen[v]}: two frames cannot share a name")
        seen[v] = name


def _positive(path: str, v: float) -> None:
    if not v > 0:
        raise ConfigError(path, f"must be > 0, got {v!r}")


def _validate(c: Config) -> None:
    """Cross-field and range checks that the types alone do not express."""
    if c.config_version not in SUPPORTED_CONFIG_VERSIONS:
        raise ConfigError("config_version",
                          f"version {c.config_version} not supported (this build reads {SUPPORTED_CONFIG_VERSIONS})")
    for path, v in (
        ("robot.read_timeout_s", c.robot.read_timeout_s),
        ("robot.settle.max_flange_ang_speed_deg_s", c.robot.settle.max_flange_ang_speed_rad_s),
        ("robot.settle.max_sample_gap_s", c.robot.settle.max_sample_gap_s),
        ("robot.settle.max_joint_speed_deg_s", c.robot.settle.max_joint_speed_rad_s),
        ("robot.settle.max_flange_speed_mm_s", c.robot.settle.max_flange_speed_m_s),
        ("tracker.settle.max_std_mm", c.tracker.settle.max_std_translation_m),
        ("tracker.settle.agree_mm", c.tracker.settle.agree_translation_m),
        ("capture.station_timeout_s", c.capture.station_timeout_s),
        ("zmq.heartbeat_s", c.zmq.heartbeat_s),
        ("zmq.republish_s", c.zmq.republish_s),
        ("drift.interval_s", c.drift.interval_s),
        ("service.fault_retry_min_s", c.service.fault_retry_min_s),
    ):
        _positive(path, v)
    if c.robot.settle.dwell_s < 0:
        raise ConfigError("robot.settle.dwell_s", "must be >= 0")
    if not 0 < c.capture.move_speed <= 1:
        raise ConfigError("capture.move_speed", f"must be in (0, 1], got {c.capture.move_speed}")
    if not 0 <= c.tracker.average_s <= 60:
        raise ConfigError("tracker.average_s", f"must be in [0, 60], got {c.tracker.average_s}")
    if c.capture.sync_window_s < 0:
        raise ConfigError("capture.sync_window_s", "must be >= 0")
    if c.capture.max_attempts_per_station < 1:
        raise ConfigError("capture.max_attempts_per_station", "must be >= 1")
    if c.capture.max_consecutive_rejections < 1:
        raise ConfigError("capture.max_consecutive_rejections", "must be >= 1")
    if c.service.fault_retry_max_s < c.service.fault_retry_min_s:
        raise ConfigError("service.fault_retry_max_s", "must be >= fault_retry_min_s")
    # The consistency checks of every station: each bound keeps its check switched on.
    for path, v, lo, hi in (
        ("service.resume_within_s", c.service.resume_within_s, 0.0, 86400.0),
        ("robot.max_fk_error_mm", c.robot.max_fk_error_m / _MM, 1e-3, 100.0),
        ("robot.max_fk_error_deg", c.robot.max_fk_error_rad / _DEG, 1e-3, 10.0),
        ("tracker.max_range_mm", c.tracker.max_range_m / _MM, 1.0, 1e6),
        ("tracker.gross_error_mm", c.tracker.gross_error_m / _MM, 1e-3, 1000.0),
        ("tracker.gross_error_deg", c.tracker.gross_error_rad / _DEG, 1e-3, 45.0),
    ):
        if not lo <= v <= hi:
            raise ConfigError(path, f"must be in [{lo:g}, {hi:g}], got {v:g}")
    p = c.plan
    for name, vec in (("workspace_min_mm", p.workspace_min_m), ("workspace_max_mm", p.workspace_max_m)):
        if len(vec) != 3:
            raise ConfigError(f"plan.{name}", f"expected 3 numbers (x, y, z), got {len(vec)}")
    for name, vec in (("home_q_deg", p.home_q_rad), ("joint_min_deg", p.joint_min_rad), ("joint_max_deg", p.joint_max_rad)):
        if len(vec) != 6:
            raise ConfigError(f"plan.{name}", f"expected 6 numbers (one per joint), got {len(vec)}")
    if any(lo >= hi for lo, hi in zip(p.joint_min_rad, p.joint_max_rad, strict=True)):
        raise ConfigError("plan.joint_max_deg", "every joint's maximum must exceed its minimum")
    if any(not lo <= h <= hi for lo, h, hi in zip(p.joint_min_rad, p.home_q_rad, p.joint_max_rad, strict=True)):
        raise ConfigError("plan.home_q_deg", "the home configuration is outside the joint limits")
    if any(lo >= hi for lo, hi in zip(p.workspace_min_m, p.workspace_max_m, strict=True)):
        raise ConfigError("plan.workspace_max_mm", "every component must exceed workspace_min_mm")
    for name, vec in (("tracker_cell_xyz_mm", p.tracker_cell_xyz_m), ("target_axis", p.target_axis)):
        if len(vec) != 3:
            raise ConfigError(f"plan.{name}", f"expected 3 numbers (x, y, z), got {len(vec)}")
    if len(p.tracker_xyz_m) not in (0, 3):
        raise ConfigError("plan.tracker_xyz_mm", f"expected 3 numbers (x, y, z) or [] (unknown), got {len(p.tracker_xyz_m)}")
    if math.sqrt(sum(x * x for x in p.target_axis)) < 0.5:
        raise ConfigError("plan.target_axis", "must be a direction (a unit vector, e.g. [0, 0, 1])")
    if p.target_sigma_m > 0.0:
        if not c.solve.task_points_m:
            raise ConfigError("solve.task_points_mm", "[plan] target_sigma_mm needs at least one task point (cell frame)")
        if p.kind != "generated":
            raise ConfigError("plan.target_sigma_mm",
                              "needs a generated plan (kind = \"generated\"): the planner chooses the stations")
        if c.solve.kind != "base_frame":
            raise ConfigError("plan.target_sigma_mm", "applies to a base-frame calibration ([solve] kind = \"base_frame\") only")
    if p.kind == "generated" and p.n_stations < 3:
        raise ConfigError("plan.n_stations", f"at least 3 stations are needed, got {p.n_stations}")
    if p.kind == "explicit":
        if len(p.stations) < 3:
            raise ConfigError("plan.stations", f"an explicit plan needs at least 3 stations, got {len(p.stations)}")
        for i, st in enumerate(p.stations):
            where = f"plan.stations[{i}]"
            has_q = bool(st.q_rad)
            has_pose = bool(st.flange_xyz_m) or bool(st.flange_quat_wxyz)
            if has_q == has_pose:
                raise ConfigError(where, "give either q_deg or flange_xyz_mm + flange_quat_wxyz")
            if has_pose and (len(st.flange_xyz_m) != 3 or len(st.flange_quat_wxyz) != 4):
                raise ConfigError(where, "flange_xyz_mm needs 3 numbers and flange_quat_wxyz 4")
            if has_pose and abs(math.sqrt(sum(x * x for x in st.flange_quat_wxyz)) - 1) > 1e-3:
                raise ConfigError(f"{where}.flange_quat_wxyz", "quaternion must have unit norm")
    if c.tracker.measure == "point" and c.solve.kind == "base_frame":
        n, where = (p.n_stations, "plan.n_stations") if p.kind == "generated" else (len(p.stations), "plan.stations")
        if n < MIN_POINT_STATIONS:
            raise ConfigError(where, f"a point base-frame calibration ([tracker] measure = \"point\") needs at least "
                                     f"{MIN_POINT_STATIONS} stations (three points admit several exact fits), got {n}")
    e = c.solve.expected_cell_T_base_m_rad
    if e is not None and math.sqrt(sum(x * x for x in e[3:])) > math.pi * (1 + 1e-9):
        raise ConfigError("solve.expected_cell_T_base_mm_deg",
                          f"rx, ry, rz is a rotation vector in degrees with a length of at most 180, got "
                          f"{math.degrees(math.sqrt(sum(x * x for x in e[3:]))):g}")
    if c.solve.expected_tolerance_m_rad[1] > math.pi:
        raise ConfigError("solve.expected_tolerance_mm_deg", "the rotation tolerance must be at most 180 deg, got "
                                                            f"{math.degrees(c.solve.expected_tolerance_m_rad[1]):g}")
    d = c.drift
    if d.fail_translation_m < d.warn_translation_m:
        raise ConfigError("drift.fail_mm", "must be >= warn_mm")
    if d.fail_rotation_rad < d.warn_rotation_rad:
        raise ConfigError("drift.fail_deg", "must be >= warn_deg")
    if d.check_stations < 1:
        raise ConfigError("drift.check_stations", "must be >= 1")
    for i, cl in enumerate(c.zmq.clients):
        if len(cl.public_key) != 40:
            raise ConfigError(f"zmq.clients[{i}].public_key", "expected a 40-character Z85 CURVE public key")
    if c.zmq.curve and not c.zmq.server_secret_key_file:
        raise ConfigError("zmq.server_secret_key_file", "required when curve = true")
    for name in ("pub_endpoint", "cmd_endpoint"):
        ep = getattr(c.zmq, name)
        if not ep.startswith(("tcp://", "ipc://", "inproc://")):
            raise ConfigError(f"zmq.{name}", f"expected tcp://, ipc:// or inproc://, got {ep!r}")
    _validate_export(c.export)
    validate_kinematics(c.kinematics)
    _plant.validate_plant(c.opcua, c.mqtt, c.metrics, cell=c.service.name)  # URLs and security rules
    validate_camera(c.camera)  # [camera]: its URL by the driver's parser, its options, its keys (ADR 0030)


def check_devices(cfg: Config) -> None:
    """Build (but do not open) the configured drivers, so bad URLs or options are reported
    with their own dotted path. Constructors do no I/O, so this touches no device.

    The URL alone is tried first (an error is the URL's: ``robot.url``, including its query
    keys), then every option alone (an error is that option's: ``robot.options.timeout_s``),
    then all together (an error of the combination: ``robot.options``). A tracker URL is
    also checked the way pyserial will open it (:func:`check_tracker_url`), and a CiA 402
    robot's python-can interface against python-can's (:func:`check_can_interface`).
    """
    for section, url, options, connect in (
        ("robot", cfg.robot.url, cfg.robot.options, connect_robot),
        ("tracker", cfg.tracker.url, cfg.tracker.options, connect_tracker),
    ):
        if not url:
            raise ConfigError(f"{section}.url", "missing")
        if section == "tracker":
            check_tracker_url(url)
        _try_build(connect, url, {}, f"{section}.url")
        for k, v in options.items():
            _try_build(connect, url, {k: v}, f"{section}.options.{k}")
        _try_build(connect, url, options, f"{section}.options")
        if section == "robot":
            check_can_interface(url, options)


def check_can_interface(url: str, options: Mapping[str, object]) -> None:
    """A ``canopen://`` robot's python-can ``interface`` must be one python-can knows
    (``socketcan``, ``virtual``, ``slcan``, ...): a typo (``sockcan``) would otherwise pass
    here and fail at every reconnection. Named under ``robot.options.interface`` when the
    option gives it, else ``robot.url`` (its query)."""
    if not url.lower().startswith("canopen://"):
        return
    if "interface" in options:
        value, path = options["interface"], "robot.options.interface"
    else:
        query = parse_qs(urlsplit(url).query)
        if "interface" not in query:
            return  # the driver's default
        value, path = query["interface"][-1], "robot.url"
    try:
        # python-can is loaded only to check a CiA 402 robot's interface (the other cells never
        # need it), and a build without it lets the driver say so when it is built.
        from can.interfaces import VALID_INTERFACES
    except ImportError:  # python-can missing: the driver says so when it is built
        return
    if value not in VALID_INTERFACES:
        near = _near(str(value), {k: None for k in VALID_INTERFACES})
        hint = f"; did you mean {near!r}?" if near else ""
        raise ConfigError(path, f"unknown python-can interface {value!r}{hint} (python-can knows: "
                                f"{', '.join(sorted(VALID_INTERFACES))})")


def _try_build(connect: Callable[..., object], url: str, options: Mapping[str, object], path: str) -> None:
    try:
        driver = connect(url, **options)
    except TypeError as exc:
        raise ConfigError(path, f"not accepted by the driver: {exc}") from None
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise ConfigError(path, str(exc) or type(exc).__name__) from None
    close = getattr(driver, "close", None)
    if callable(close):
        close()  # never opened: a no-op, but leaves nothing behind


def check_tracker_url(url: str) -> None:
    """A tracker URL checked without opening it.

    * A protocol URL: ``emscon://host[:port]`` (a Leica emScon tracker over TCP; its host and
      port are the driver's to check, :func:`check_devices` builds it), or
      ``geocom://<device>[?baud=N]`` / ``geocom+<transport>://...`` (a Leica GeoCOM
      instrument), whose serial part is checked as below.
    * Otherwise what ``serial.serial_for_url`` will take: an absolute device path
      (``/dev/ttyUSB0``, a pty, ``/dev/serial/by-id/...``), or a pyserial URL whose scheme
      pyserial knows and, for ``socket://`` and ``rfc2217://``, a host and a port in 1..65535.

    Raises
    ------
    ConfigError
        Under ``tracker.url``.
    """
    named = backend_for_url(url)
    if named == "emscon":
        return
    if named == "geocom":
        try:
            port_url, _options = serial_url(url)
        except ValueError as exc:
            raise ConfigError("tracker.url", str(exc)) from None
        try:
            check_tracker_url(port_url)
        except ConfigError as exc:
            raise ConfigError("tracker.url", f"{exc.message} (the serial part of {_show(url)})") from None
        return
    if "://" not in url:
        if not url.startswith("/"):
            raise ConfigError("tracker.url", f"expected an absolute device path (/dev/ttyUSB0) or a URL "
                                             f"(socket://host:port), got {_show(url)}")
        return
    scheme = url.split("://", 1)[0].lower()
    try:
        # pyserial only when a tracker URL is checked: loading a configuration (and the drivers'
        # registry) never loads the serial stack.
        import serial

        serial.serial_for_url(url, do_not_open=True)
    except (ValueError, OSError) as exc:
        raise ConfigError("tracker.url", f"pyserial cannot open {_show(url)}: {exc} (cellcal's own protocol "
                                         "URLs: emscon://host[:port], geocom://<device>, geocom+socket://host:port)") from None
    except Exception as exc:  # noqa: BLE001 - a URL handler pyserial loads may raise anything
        raise ConfigError("tracker.url", f"pyserial cannot open {_show(url)}: {type(exc).__name__}: {exc}") from None
    if scheme in ("socket", "rfc2217"):
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None or not 0 < port < 65536:
            raise ConfigError("tracker.url", f"expected {scheme}://host:port with a port in 1..65535, got {_show(url)}")
