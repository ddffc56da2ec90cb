"""Daemon configuration: TOML (``tomllib``) into frozen dataclasses.

Rules:

* Unknown keys are rejected; every error is a :class:`ConfigError` naming the dotted path
  (``capture.sync_window_s``) and what was expected.
* Keys carry their unit in the name (``_mm``, ``_deg``, ``_s``, ``_mm_s``, ``_deg_s``); values
  are converted to SI on load, and the dataclass fields carry the SI unit in *their* name
  (``settle.max_flange_speed_mm_s`` -> ``RobotSettle.max_flange_speed_m_s``).
* ``config_version`` is required and must be a version this build understands.
* Device options (``[robot.options]``, ``[tracker.options]``) are passed to the drivers'
  ``connect_*`` functions; :func:`check_devices` builds the drivers (constructors do no I/O)
  so a misspelt option is reported at load time with its dotted path.

Every key, its default, unit and bounds: ``docs/configuration.md`` (a test keeps it complete);
the example files in ``config/`` are complete configurations. Bounds (``_BOUNDS``) keep a value
from switching a gate off. ``load_config`` makes every check that needs no file or device,
the ``[zmq]`` security rules included; :func:`preflight` adds the drivers and the key file.
``cellcal run`` and ``cellcal check-config`` both call exactly these two.
"""

from __future__ import annotations

from cellcal.daemon.config.camera import Camera, CameraCapture, CameraIntrinsics, CameraPlan
from cellcal.daemon.config.checks import (
    check_can_interface,
    check_devices,
    check_measure_kind,
    check_tracker_url,
    preflight,
)
from cellcal.daemon.config.errors import ConfigError
from cellcal.daemon.config.kinematics import Kinematics
from cellcal.daemon.config.load import CONFIG_ENV, DEFAULT_CONFIG_PATH, as_toml_dict, find_config, load_config, load_config_text
from cellcal.daemon.config.schema import (
    _BOUNDS,
    SUPPORTED_CONFIG_VERSIONS,
    Capture,
    Config,
    Drift,
    Export,
    Plan,
    PlanStation,
    Robot,
    RobotSettle,
    Service,
    Solve,
    Tracker,
    TrackerSettle,
    Zmq,
    ZmqClient,
)

__all__ = [
    "ConfigError", "Config", "load_config", "load_config_text", "check_devices", "check_tracker_url",
    "check_can_interface", "check_measure_kind", "preflight", "SUPPORTED_CONFIG_VERSIONS", "DEFAULT_CONFIG_PATH",
    "CONFIG_ENV", "find_config", "as_toml_dict", "Service", "RobotSettle", "Robot", "TrackerSettle", "Tracker",
    "Capture", "PlanStation", "Plan", "Solve", "Drift", "ZmqClient", "Zmq", "Export", "Kinematics", "_BOUNDS",
    "Camera", "CameraCapture", "CameraPlan", "CameraIntrinsics",
]
