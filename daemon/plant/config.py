"""``[opcua]``, ``[mqtt]`` and ``[metrics]``, as the interfaces read them: the sections are
defined with the configuration schema they belong to (``cellcal.daemon.config.plant``: the
schema builds them, so it must not import the interfaces), named here beside the interfaces
that use them."""

from __future__ import annotations

from cellcal.daemon.config.plant import (  # noqa: F401 - re-exported
    BOUNDS,
    CHOICES,
    LIST_OF,
    OPCUA_SECURITY,
    PACKAGES,
    STR_LISTS,
    Metrics,
    Mqtt,
    OpcUa,
    OpcUaCertificate,
    OpcUaUser,
    is_loopback_host,
    mqtt_broker,
    opcua_host_port,
    parse_listen,
    preflight_plant,
    read_secret,
    trusted_files,
    validate_plant,
)

__all__ = [
    "OpcUa", "OpcUaUser", "OpcUaCertificate", "Mqtt", "Metrics", "LIST_OF", "STR_LISTS", "CHOICES", "BOUNDS",
    "validate_plant", "preflight_plant", "is_loopback_host", "parse_listen", "mqtt_broker", "opcua_host_port",
    "OPCUA_SECURITY", "PACKAGES", "read_secret", "trusted_files",
]
