"""The configuration's checks beyond its types: bounds and relations between keys
(:func:`_validate`), the devices' URLs and options built by the drivers' own parsers
(:func:`check_devices`, :func:`check_tracker_url`, :func:`check_can_interface`), the ZeroMQ
security rules (``cellcal.daemon.config.security``), and :func:`preflight`, which
``cellcal run`` and ``cellcal check-config`` both call.
"""

from __future__ import annotations

import importlib
import inspect
import ipaddress
import math
import re
from collections.abc import Callable, Mapping
from types import ModuleType
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit, urlunsplit

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
from cellcal.drivers import connect_robot
from cellcal.drivers.base import load_backend
from cellcal.drivers.geocom import serial_url
from cellcal.drivers.robot import parse_robot_url
from cellcal.drivers.tracker import BACKENDS, backend_for_url, connect_configured_tracker
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
        ("tracker.consensus_error_mm", c.tracker.consensus_error_m / _MM, 1e-3, 1000.0),
        ("tracker.consensus_error_deg", c.tracker.consensus_error_rad / _DEG, 1e-3, 45.0),
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


def _connect_robot(url: str, options: Mapping[str, object]) -> object:
    return connect_robot(url, **options)


def check_devices(cfg: Config) -> None:
    """Build (but do not open) the configured drivers, so bad URLs or options are reported
    with their own dotted path. Constructors do no I/O, so this touches no device.

    The URL alone is tried first (an error is the URL's: ``robot.url``, including its query
    keys), then every option alone (an error is that option's: ``robot.options.timeout_s``),
    then all together (an error of the combination: ``robot.options``). A tracker URL is
    also checked the way pyserial will open it (:func:`check_tracker_url`) and its options'
    types against the backend's (:func:`check_tracker_options`); a robot URL is split by the
    drivers' own parser and its host checked (:func:`check_robot_url`), and a CiA 402 robot's
    python-can interface checked against python-can's (:func:`check_can_interface`).
    """
    for section, url, options, connect in (
        ("robot", cfg.robot.url, cfg.robot.options, _connect_robot),
        ("tracker", cfg.tracker.url, cfg.tracker.options, connect_configured_tracker),
    ):
        if not url:
            raise ConfigError(f"{section}.url", "missing")
        if section == "tracker":
            check_tracker_url(url)
        else:
            check_robot_url(url)
        _try_build(connect, url, {}, f"{section}.url")
        for k, v in options.items():
            _try_build(connect, url, {k: v}, f"{section}.options.{k}")
        _try_build(connect, url, options, f"{section}.options")
        if section == "robot":
            check_can_interface(url, options)
        else:
            check_tracker_options(url, options)


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


def _try_build(connect: Callable[[str, Mapping[str, object]], object], url: str, options: Mapping[str, object],
               path: str) -> None:
    try:
        driver = connect(url, options)
    except TypeError as exc:
        raise ConfigError(path, f"not accepted by the driver: {exc}") from None
    except (ValueError, OverflowError, ArithmeticError) as exc:
        raise ConfigError(path, str(exc) or type(exc).__name__) from None
    close = getattr(driver, "close", None)
    if callable(close):
        close()  # never opened: a no-op, but leaves nothing behind


# --- device URLs, checked by the parsers the drivers use, without opening anything ---------------

# A host as a socket will resolve it: an RFC 1123 name (letters, digits, "-", "_" inside a label),
# or an address. Anything else (a NUL, a space, an unclosed "[") would fail at the first
# connection, every reconnection, as a traceback or a retry loop, never as a message naming the key.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def _check_text(path: str, url: str) -> None:
    bad = _CONTROL.search(url)
    if bad:
        raise ConfigError(path, f"{_show(url)} holds a control character or a space ({bad.group()!r} at offset "
                                f"{bad.start()}): a URL or a device path has none")


def check_host(host: str, path: str, url: str) -> None:
    """``host`` (of ``url``) as a socket will take it: an IPv4 or IPv6 address, or a DNS name of
    labels (letters, digits, ``-``, ``_``) at most 253 characters long.

    Raises
    ------
    ConfigError
        Under ``path``.
    """
    if not host:
        raise ConfigError(path, f"no host in {_show(url)}")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigError(path, f"{host!r} (in {_show(url)}) is not an IPv6 address") from None
        return
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if all(lb.isdigit() for lb in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ConfigError(path, f"{host!r} (in {_show(url)}) is not an IPv4 address") from None
        return
    if len(host) > 253 or not all(_LABEL.fullmatch(lb) for lb in labels):
        raise ConfigError(path, f"{host!r} (in {_show(url)}) is not a host name (letters, digits, '-' and '_' "
                                "between dots) nor an address")


def _host_port(target: str, path: str, url: str) -> tuple[str, int | None]:
    """``host[:port]``, ``[v6][:port]`` or a bare IPv6 address, the way the RTDE driver splits
    its target; the port (None: the default) must be 1..65535."""
    port_text: str | None = None
    if target.startswith("["):
        host, sep, rest = target[1:].partition("]")
        if not sep:
            raise ConfigError(path, f"{_show(url)}: '[' without its ']' (an IPv6 address is written [::1]:30004)")
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(path, f"{_show(url)}: expected :port after ']', got {rest!r}")
            port_text = rest[1:]
        if ":" not in host:
            raise ConfigError(path, f"{_show(url)}: brackets hold an IPv6 address, got {host!r}")
    elif target.count(":") == 1:
        host, port_text = target.split(":")
    else:
        host = target
    check_host(host, path, url)
    if port_text is None:
        return host, None
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(path, f"{_show(url)}: the port must be 1..65535, got {port_text!r}")
    return host, int(port_text)


def check_robot_url(url: str) -> None:
    """A robot URL split by the drivers' own parser (:func:`cellcal.drivers.robot.parse_robot_url`),
    then its target checked the way the backend will use it, without connecting: an RTDE
    controller's ``host[:port]`` (:func:`check_host`; ``[v6]:port`` for IPv6), a CAN channel
    without control characters. Query keys and options are the driver's to check
    (:func:`check_devices` builds it).

    Raises
    ------
    ConfigError
        Under ``robot.url``.
    """
    _check_text("robot.url", url)
    try:
        u = parse_robot_url(url)
    except ValueError as exc:
        raise ConfigError("robot.url", str(exc)) from None
    if u.scheme == "rtde":
        _host_port(u.target, "robot.url", url)


#: pyserial URL schemes whose handler's parser does more than parse (see check_tracker_url).
_ACTING_HANDLERS = ("spy", "hwgrep")


def _pyserial_handler(scheme: str) -> ModuleType | None:
    """The handler module pyserial loads for ``scheme://`` (its own ``serial.urlhandler``)."""
    try:
        return importlib.import_module(f"serial.urlhandler.protocol_{scheme}")
    except ImportError:
        return None


#: The query options of the pyserial handlers whose parser is called here (their from_url).
_HANDLER_OPTIONS = {"socket": ("logging",), "loop": ("logging",),
                    "rfc2217": ("logging", "ign_set_control", "poll_modem", "timeout")}


def _check_query(scheme: str, query: str, levels: Mapping[str, object], url: str) -> str:
    """A pyserial handler's options by name, and ``logging=<level>`` against the handler's own
    level table; returns the query without ``logging``. (The handler's parser calls
    ``logging.basicConfig()`` for it, which no library may do in the daemon; it raises
    ``KeyError`` for an unknown level, and the loop handler's message for an unknown option
    is itself a ``KeyError``.)"""
    kept = []
    for option, value in parse_qsl(query, keep_blank_values=True):
        if option not in _HANDLER_OPTIONS[scheme]:
            raise ConfigError("tracker.url", f"{_show(url)}: unknown option {option!r} (pyserial's {scheme}:// "
                                             f"takes {', '.join(_HANDLER_OPTIONS[scheme])})")
        if option == "logging":
            if value not in levels:
                raise ConfigError("tracker.url", f"{_show(url)}: logging={value!r}; pyserial's levels: "
                                                 f"{', '.join(sorted(levels))}")
        else:
            kept.append((option, value))
    return urlencode(kept)


def check_tracker_url(url: str) -> None:
    """A tracker URL checked without opening it, by the parsers the driver will use.

    * A protocol URL: ``emscon://host[:port]`` (a Leica emScon tracker over TCP; its host is
      checked here, its port and the rest by the driver, which :func:`check_devices` builds), or
      ``geocom://<device>[?baud=N]`` / ``geocom+<transport>://...`` (a Leica GeoCOM
      instrument), whose serial part is checked as below.
    * An absolute device path (``/dev/ttyUSB0``, a pty, ``/dev/serial/by-id/...``).
    * A pyserial URL whose scheme pyserial knows, checked by that scheme's own handler where
      its parser only parses: ``socket://host:port`` and ``rfc2217://host:port`` (a host,
      :func:`check_host`, and a port in 1..65535; their options), ``loop://`` (its options),
      ``alt://<port>?class=...`` (the class pyserial would use); and by the handler's rules
      where its parser would act (``spy://`` would open its ``file=``, ``hwgrep://`` would
      list and open ports): ``spy://<port>`` and ``alt://<port>`` need a port, itself checked
      as a tracker URL; ``hwgrep://<pattern>`` a pattern that compiles and valid options.

    Raises
    ------
    ConfigError
        Under ``tracker.url``.
    """
    _check_text("tracker.url", url)
    named = backend_for_url(url)
    if named == "emscon":
        try:
            host = urlsplit(url).hostname
        except ValueError as exc:
            raise ConfigError("tracker.url", f"{_show(url)}: {exc}") from None
        if host:
            check_host(host, "tracker.url", url)
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

        if scheme in _ACTING_HANDLERS:
            # Their parsers act when the port is named (spy opens its file= for writing, hwgrep
            # lists the ports and with skip_busy opens each): only the scheme is looked up here.
            if _pyserial_handler(scheme) is None:
                raise ValueError(f"invalid URL, protocol {scheme!r} not known")
        else:
            serial.serial_for_url(url, do_not_open=True)
    except (ValueError, OSError) as exc:
        raise ConfigError("tracker.url", f"pyserial cannot open {_show(url)}: {exc} (cellcal's own protocol "
                                         "URLs: emscon://host[:port], geocom://<device>, geocom+socket://host:port)") from None
    except Exception as exc:  # noqa: BLE001 - a URL handler pyserial loads may raise anything
        raise ConfigError("tracker.url", f"pyserial cannot open {_show(url)}: {type(exc).__name__}: {exc}") from None
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "socket://[::1": an unclosed IPv6 bracket
        raise ConfigError("tracker.url", f"{_show(url)}: {exc}") from None
    handler = _pyserial_handler(scheme)
    if scheme in ("socket", "rfc2217", "loop") and handler is not None:
        levels = getattr(handler, "LOGGER_LEVELS", None)
        if levels is None and scheme == "rfc2217":
            levels = getattr(importlib.import_module("serial.rfc2217"), "LOGGER_LEVELS", {})
        query = _check_query(scheme, parts.query, levels or {}, url)
        if scheme in ("socket", "rfc2217"):
            if not parts.hostname:
                raise ConfigError("tracker.url", f"expected {scheme}://host:port with a port in 1..65535, got {_show(url)}")
            check_host(parts.hostname, "tracker.url", url)
            try:
                port = parts.port
            except ValueError:
                port = None
            if port is None or not 0 < port < 65536:
                raise ConfigError("tracker.url", f"expected {scheme}://host:port with a port in 1..65535, got {_show(url)}")
        try:
            # the handler's own parser, on an instance that names no port (so nothing is opened)
            handler.Serial(None).from_url(urlunsplit(parts._replace(query=query)))
        except Exception as exc:  # noqa: BLE001 - SerialException, or whatever the handler raises
            raise ConfigError("tracker.url", f"{_show(url)}: {exc}") from None
    elif scheme == "alt" and handler is not None:
        try:
            inner, _cls = handler.serial_class_for_url(url)  # the handler's own parser: pure
        except Exception as exc:  # noqa: BLE001 - SerialException, ValueError for an unknown class
            raise ConfigError("tracker.url", f"{_show(url)}: {exc}") from None
        _check_inner_port(inner, url)
    elif scheme == "spy":
        for option, _value in parse_qsl(parts.query, keep_blank_values=True):
            if option not in ("file", "color", "raw", "all"):
                raise ConfigError("tracker.url", f"{_show(url)}: unknown spy option {option!r} (pyserial's: file, "
                                                 "color, raw, all)")
        _check_inner_port(parts.netloc + parts.path, url)  # what spy opens (its handler's rule)
    elif scheme == "hwgrep":
        _check_hwgrep(url)


def _check_inner_port(inner: str, url: str) -> None:
    """The port a wrapping pyserial URL (``spy://``, ``alt://``) opens: itself a tracker URL."""
    if not inner:
        raise ConfigError("tracker.url", f"{_show(url)} names no port to open (spy:///dev/ttyUSB0, "
                                         "spy://socket://host:port)")
    try:
        check_tracker_url(inner)
    except ConfigError as exc:
        raise ConfigError("tracker.url", f"{exc.message} (the port inside {_show(url)})") from None


def _check_hwgrep(url: str) -> None:
    # pyserial's hwgrep parser lists (and with skip_busy opens) the serial ports: its grammar,
    # checked here without that. "hwgrep://<regexp>[&n=N][&skip_busy]"; n must be >= 2 there.
    pattern, *options = url[len("hwgrep://"):].split("&")
    if not pattern:
        raise ConfigError("tracker.url", f"{_show(url)}: hwgrep:// needs a pattern (hwgrep://FTDI)")
    try:
        re.compile(pattern, re.I)
    except re.error as exc:
        raise ConfigError("tracker.url", f"{_show(url)}: the pattern does not compile: {exc}") from None
    for opt in options:
        name, _, value = opt.partition("=")
        if name == "n":
            if not (value.isascii() and value.isdigit() and int(value) >= 2):
                raise ConfigError("tracker.url", f"{_show(url)}: n={value!r}; pyserial's hwgrep takes an integer n >= 2")
        elif name != "skip_busy":
            raise ConfigError("tracker.url", f"{_show(url)}: unknown hwgrep option {name!r} (pyserial's: n, skip_busy)")


def _annotation_types(cls: type) -> dict[str, str]:
    """Keyword parameter -> annotation (as written) of a driver's constructors, its own first."""
    out: dict[str, str] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for name, param in inspect.signature(init).parameters.items():
            if param.kind is param.KEYWORD_ONLY and name not in out and isinstance(param.annotation, str):
                out[name] = param.annotation
    return out


def check_tracker_options(url: str, options: Mapping[str, object]) -> None:
    """Each tracker option of the type its backend's constructors declare (``auto_reconnect:
    bool`` takes ``true``/``false``, not ``"maybe"``, which ``bool()`` would read as true; ``int``
    no float or bool; ``float`` a number), and a ``baudrate`` pyserial takes, above 0.

    Raises
    ------
    ConfigError
        Under ``tracker.options.<key>``.
    """
    name = options.get("backend") or backend_for_url(url) or "serial"
    if not isinstance(name, str):
        return
    try:
        cls = load_backend(BACKENDS, name, "tracker backend")
    except (ValueError, ImportError, AttributeError):
        return  # check_devices has reported it
    declared = _annotation_types(cls)
    for key, value in options.items():
        want = declared.get(key)
        path = f"tracker.options.{key}"
        if want == "bool" and not isinstance(value, bool):
            raise ConfigError(path, f"expected true or false, got {_show(value)}")
        if want == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(path, f"expected an integer, got {_show(value)}")
        if want == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(path, f"expected a number, got {_show(value)}")
    if "baudrate" in options:
        b = options["baudrate"]
        if isinstance(b, bool) or not isinstance(b, int) or b <= 0:
            raise ConfigError("tracker.options.baudrate", f"expected a line speed above 0 (9600, 115200), got {_show(b)}")
        if "://" in url and backend_for_url(url) is None:
            # pyserial only for a tracker with a baudrate (see check_tracker_url)
            import serial

            try:
                serial.serial_for_url(url, do_not_open=True, baudrate=b)  # pyserial's own check of it
            except (ValueError, OSError) as exc:
                raise ConfigError("tracker.options.baudrate", f"pyserial refuses {b}: {exc}") from None
