"""What the ZeroMQ endpoints may be and who may use them: the security rules, checked without
a socket (``cellcal check-config`` and ``cellcal run`` call :func:`check_security` on every
configuration; the server, ``cellcal.daemon.wire.zmq_server``, enforces the same at bind).

A TCP endpoint reachable from other hosts needs CURVE with an allow-list of client keys
(``[[zmq.clients]]``, each mapped to a role); loopback TCP is refused unless
``loopback_tcp_any_user`` says any local user may connect; ``ipc://`` endpoints are local
and admitted by peer uid/gid (``ipc_allowed_uids``, ``ipc_allowed_gids``). A leaf module of
the configuration: it imports the configuration's error and the protocol's roles, nothing of
the server, so the configuration's checks and the transport share one definition of "local"
(``cellcal.daemon.wire.security`` names the same for the transport's readers).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING

import zmq.auth
from zmq.utils import z85

from cellcal.daemon import protocol as P
from cellcal.daemon.config.errors import ConfigError
from cellcal.solver.errors import CellcalError

if TYPE_CHECKING:
    from cellcal.daemon.config.schema import Zmq

__all__ = ["SecurityError", "BindError", "is_local_endpoint", "endpoint_kind", "check_security", "load_server_key",
           "MAX_IPC_PATH_BYTES"]


class SecurityError(ConfigError):
    """The ``[zmq]`` section would expose the daemon: a network endpoint without CURVE, bad keys."""


class BindError(CellcalError, OSError):
    """An endpoint could not be bound (address in use, bad interface, unwritable ipc path)."""


def is_local_endpoint(endpoint: str) -> bool:
    """True for ``ipc://``, ``inproc://`` and ``tcp://`` on a loopback address: endpoints
    other *hosts* cannot reach.

    Interface names, ``*``, host names and every non-loopback address count as reachable
    from other hosts. Host-local is not yet "ours": which local users may connect to such an
    endpoint is :func:`check_security`'s business (ADR 0007).
    """
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: Longest ipc path the kernel takes (``sun_path`` is 108 bytes with its terminating NUL;
#: an abstract name spends one byte on its leading NUL instead).
MAX_IPC_PATH_BYTES = 107


def endpoint_kind(endpoint: str, key: str = "zmq.endpoint") -> str:
    """What an endpoint is, for the security rules, after checking its syntax (no I/O).

    Returns
    -------
    str
        ``"tcp-loopback"``, ``"tcp-network"``, ``"ipc"`` (a file), ``"ipc-abstract"``
        (``ipc://@name``: no file, so no permissions) or ``"inproc"``.

    Raises
    ------
    ConfigError
        Under ``key``: an unknown transport, a malformed ``tcp://host:port``, a relative,
        wildcard or too long ipc path.
    """
    if endpoint.startswith("inproc://") and len(endpoint) > len("inproc://"):
        return "inproc"
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://"):]
        if path.startswith("@"):
            if len(path) < 2 or len(path.encode("utf-8")) > MAX_IPC_PATH_BYTES:
                raise ConfigError(key, f"abstract ipc name must have 1..{MAX_IPC_PATH_BYTES - 1} bytes, got {endpoint!r}")
            return "ipc-abstract"
        if not path.startswith("/") or path.endswith("/") or "*" in path:
            raise ConfigError(key, f"ipc endpoint needs an absolute socket path (ipc:///run/cellcal/cmd.sock), got {endpoint!r}")
        if len(path.encode("utf-8")) > MAX_IPC_PATH_BYTES:
            raise ConfigError(key, f"ipc path longer than {MAX_IPC_PATH_BYTES} bytes (the kernel's limit): {endpoint!r}")
        return "ipc"
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not host or not (port == "*" or (port.isdigit() and len(port) <= 5 and int(port) <= 65535)):
            raise ConfigError(key, f"expected tcp://host:port (port 0..65535 or *), got {endpoint!r}")
        if host.startswith("[") != host.endswith("]") or ";" in host:
            raise ConfigError(key, f"expected tcp://host:port, got {endpoint!r}")
        return "tcp-loopback" if is_local_endpoint(endpoint) else "tcp-network"
    raise ConfigError(key, f"expected tcp://host:port, ipc:///path or ipc://@name, got {endpoint!r}")


def _null_role(cfg: Zmq) -> str:
    return getattr(cfg, "null_role", P.ROLE_OBSERVER)


def _max_uid() -> int:
    return 2**32 - 2  # (uid_t)-1 means "no user"


def check_security(cfg: Zmq) -> dict[str, tuple[str, str]]:
    """Validate the security of a ``[zmq]`` section (no I/O); return the CURVE allow-list.

    The rules (ADR 0007; ``docs/protocols/zeromq.md`` section 8), without CURVE:

    * a ``tcp://`` endpoint must be loopback, and even then is allowed only with
      ``loopback_tcp_any_user = true``: loopback TCP carries no peer credentials, so every
      local user (and every container sharing the network namespace) gets ``null_role``;
    * an ``ipc://`` endpoint, a file (mode ``ipc_socket_mode``) or abstract (``@name``, no
      file at all), gives ``null_role`` only to peers whose kernel-reported credentials
      (SO_PEERCRED) are the daemon's uid, root, a uid of ``ipc_allowed_uids``, or a member
      of the daemon's group or of ``ipc_allowed_gids``.

    Returns
    -------
    dict
        Z85 public key -> (role, name), for every ``[[zmq.clients]]`` entry.

    Raises
    ------
    SecurityError
        An endpoint or value that would expose the daemon, under its own dotted key.
    ConfigError
        A malformed endpoint, uid, gid or mode, under its own dotted key.
    """
    curve = bool(cfg.curve)
    any_user = bool(getattr(cfg, "loopback_tcp_any_user", False))
    for name in ("pub_endpoint", "cmd_endpoint"):
        ep = getattr(cfg, name)
        kind = endpoint_kind(ep, f"zmq.{name}")
        if curve:
            continue
        if kind == "tcp-network":
            raise SecurityError(
                f"zmq.{name}",
                f"{ep} is reachable from other hosts and zmq.curve is false; bind tcp://127.0.0.1 or "
                f"ipc://, or set curve = true with [[zmq.clients]] keys",
            )
        if kind == "tcp-loopback" and not any_user:
            raise SecurityError(
                f"zmq.{name}",
                f"{ep} without CURVE: loopback TCP has no peer credentials, so every local user could connect "
                f"as {_null_role(cfg)}; use ipc:// (peers are checked), or CURVE, or accept it explicitly with "
                f"zmq.loopback_tcp_any_user = true",
            )
    null_role = _null_role(cfg)
    if null_role not in P.ROLES:
        raise SecurityError("zmq.null_role", f"expected one of {', '.join(P.ROLES)}, got {null_role!r}")
    for key, maximum in (("ipc_allowed_uids", _max_uid()), ("ipc_allowed_gids", _max_uid())):
        for i, v in enumerate(getattr(cfg, key, ()) or ()):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= maximum:
                raise ConfigError(f"zmq.{key}[{i}]", f"expected an integer id in [0, {maximum}], got {v!r}")
    mode = getattr(cfg, "ipc_socket_mode", 0o660)
    if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o770 or mode & 0o600 != 0o600:
        raise SecurityError(
            "zmq.ipc_socket_mode",
            f"expected owner rw and no bits for others (0o600..0o770, e.g. 0o660), got {mode!r}"
            + (f" ({oct(mode)})" if isinstance(mode, int) and not isinstance(mode, bool) else ""),
        )
    allow: dict[str, tuple[str, str]] = {}
    for i, cl in enumerate(cfg.clients or ()):
        path = f"zmq.clients[{i}]"
        try:
            raw = z85.decode(cl.public_key.encode("ascii"))
        except (ValueError, UnicodeEncodeError):
            raw = b""
        if len(raw) != 32:
            raise SecurityError(f"{path}.public_key", "not a Z85 CURVE public key (40 characters)")
        if cl.role not in P.ROLES:
            raise SecurityError(f"{path}.role", f"expected one of {', '.join(P.ROLES)}, got {cl.role!r}")
        if cl.public_key in allow:
            raise SecurityError(f"{path}.public_key", f"duplicate key (also {allow[cl.public_key][1]!r})")
        allow[cl.public_key] = (cl.role, cl.name or cl.public_key[:8])
    if curve and not allow:
        raise SecurityError("zmq.clients", "curve = true but no [[zmq.clients]]: nobody could connect")
    if curve and not cfg.server_secret_key_file:
        raise SecurityError("zmq.server_secret_key_file", "required when curve = true")
    return allow


def load_server_key(cfg: Zmq) -> tuple[bytes, bytes]:
    """The daemon's CURVE key pair from ``[zmq] server_secret_key_file`` (reads the file).

    ``cellcal run`` and ``cellcal check-config`` both call it, so a missing or unreadable key
    file fails the check as it would fail the start (run check-config as the daemon's user).

    Raises
    ------
    SecurityError
        Under ``zmq.server_secret_key_file``: unreadable, not a certificate, no secret key.
    """
    path = cfg.server_secret_key_file
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise SecurityError("zmq.server_secret_key_file", f"cannot load {path}: {exc}") from None
    if not secret:
        raise SecurityError("zmq.server_secret_key_file", f"{path} holds no secret-key (use the .key_secret file)")
    if len(public) != 40 or len(secret) != 40:
        raise SecurityError("zmq.server_secret_key_file", f"{path}: keys must be 40 Z85 characters")
    return public, secret
