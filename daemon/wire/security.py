"""The ZeroMQ security rules, as the transport reads them: defined with the configuration they
judge (``cellcal.daemon.config.security``: ``cellcal check-config`` and ``cellcal run`` check
them without a socket, the server enforces the same at bind), named here for readers of the
wire (``cellcal.daemon.wire.zmq_server`` and older importers)."""

from __future__ import annotations

from cellcal.daemon.config.security import (  # noqa: F401 - re-exported
    MAX_IPC_PATH_BYTES,
    BindError,
    SecurityError,
    _null_role,
    check_security,
    endpoint_kind,
    is_local_endpoint,
    load_server_key,
)

__all__ = ["SecurityError", "BindError", "is_local_endpoint", "endpoint_kind", "check_security", "load_server_key",
           "MAX_IPC_PATH_BYTES"]
