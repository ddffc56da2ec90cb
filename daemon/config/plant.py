"""``[opcua]``, ``[mqtt]`` and ``[metrics]``: the plant interfaces' configuration sections.

The sections are dataclasses of the configuration schema, defined here beside it (the
interfaces, ``cellcal.daemon.plant``, read them as ``cellcal.daemon.plant.config``):
``cellcal.daemon.config`` builds them like every other section (unknown keys, types, units, each error under its dotted key)
from the tables this module hands it (:data:`LIST_OF`, :data:`STR_LISTS`, :data:`CHOICES`,
:data:`BOUNDS`). :func:`validate_plant` adds what the types do not say (URLs, the security
rules); :func:`preflight_plant` what needs the file system or the installed packages, so a
missing optional package is a ``check-config`` error naming the package, never a failure at
start. Every one is off by default (``enabled = false``).

Security rules (ADR 0024, 0025, 0026; ``docs/integration.md``):

* ``[opcua]``: ``security`` lists the endpoint's message security modes (Basic256Sha256
  ``sign_and_encrypt`` by default, ``sign``, ``none``). ``none`` is refused unless the
  endpoint's host is a loopback address *and* ``allow_none_on_loopback = true``; any other
  mode needs the server's ``certificate_file`` and ``private_key_file``. Clients come in as
  ``[[opcua.users]]`` (name, role, ``password_file``), ``[[opcua.certificates]]`` (a client
  certificate file and its role) or, with ``anonymous = true``, anonymously with the
  ``observer`` role (reads, no methods). At least one way in must be configured. The trust
  list of client application certificates is the ``[[opcua.certificates]]`` files plus every
  ``*.der`` / ``*.pem`` file of ``trusted_certificates_dir`` (trusted, no role of their own:
  the session's user still has to be one of the above); it needs a secure mode.
* ``[mqtt]``: ``mqtts://`` is TLS (``tls_ca_file`` or the system's trust store, optional client
  ``tls_cert_file`` / ``tls_key_file``); a ``username`` with ``password_file`` over plain
  ``mqtt://`` is refused unless the broker is on loopback (the password would cross the
  network in clear).
* ``[metrics]``: ``listen`` is ``host:port``; a host that is not loopback needs
  ``allow_non_loopback = true`` (the operator chose that address, knowingly).
"""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from cellcal.daemon.config.errors import ConfigError

__all__ = [
    "OpcUa", "OpcUaUser", "OpcUaCertificate", "Mqtt", "Metrics", "LIST_OF", "STR_LISTS", "CHOICES", "BOUNDS",
    "validate_plant", "preflight_plant", "is_loopback_host", "parse_listen", "mqtt_broker", "opcua_host_port",
    "OPCUA_SECURITY", "PACKAGES", "read_secret", "trusted_files", "TRUSTED_SUFFIXES",
]

#: Message security modes of the OPC UA endpoint (Basic256Sha256 for both secure ones).
OPCUA_SECURITY = ("sign_and_encrypt", "sign", "none")
_ROLES = ("observer", "operator")
#: The optional package each interface needs (import name, distribution, extra).
PACKAGES: dict[str, tuple[str, str, str]] = {
    "opcua": ("asyncua", "asyncua", "opcua"),
    "mqtt": ("paho.mqtt.client", "paho-mqtt", "mqtt"),
    "metrics": ("prometheus_client", "prometheus-client", "metrics"),
}


_T = TypeVar("_T")


def _k(default: _T, name: str, scale: float = 1.0, doc: str = "") -> _T:
    meta = {"key": name, "scale": scale, "doc": doc}
    if isinstance(default, list):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class OpcUaUser:
    """One ``[[opcua.users]]`` entry: a user name, its role and the file holding its password."""

    name: str = _k("", "name")
    role: str = _k("observer", "role", doc="observer or operator")
    password_file: str = _k("", "password_file", doc="a file holding the password (first line), mode 0600")


@dataclass(frozen=True)
class OpcUaCertificate:
    """One ``[[opcua.certificates]]`` entry: a client certificate (X.509 user token) and its role."""

    name: str = _k("", "name")
    role: str = _k("observer", "role", doc="observer or operator")
    file: str = _k("", "file", doc="the client's certificate, PEM or DER")


@dataclass(frozen=True)
class OpcUa:
    """``[opcua]``: the OPC UA server (``cellcal.daemon.plant.opcua``, ADR 0024)."""

    enabled: bool = _k(False, "enabled")
    endpoint: str = _k("opc.tcp://127.0.0.1:4840", "endpoint", doc="opc.tcp://host:port the server binds")
    namespace_uri: str = _k("urn:cellcal", "namespace_uri", doc="the namespace of the Cellcal object's nodes")
    security: list[str] = _k(["sign_and_encrypt"], "security",
                        doc="message security modes offered: sign_and_encrypt, sign, none (Basic256Sha256)")
    allow_none_on_loopback: bool = _k(False, "allow_none_on_loopback",
                                      doc="accept security none (only with a loopback endpoint)")
    certificate_file: str = _k("", "certificate_file", doc="the server's application certificate (PEM or DER)")
    private_key_file: str = _k("", "private_key_file", doc="its private key (PEM)")
    anonymous: bool = _k(False, "anonymous", doc="anonymous sessions, role observer (read, no methods)")
    users: list[OpcUaUser] = _k([], "users", doc="[[opcua.users]] tables")
    certificates: list[OpcUaCertificate] = _k([], "certificates", doc="[[opcua.certificates]] tables")
    trusted_certificates_dir: str = _k("", "trusted_certificates_dir",
                                       doc="a directory of client application certificates (*.der, *.pem) trusted "
                                           "on a secure channel without a role of their own")
    update_s: float = _k(0.5, "update_s", doc="heartbeat values (state, devices) at most this often")


@dataclass(frozen=True)
class Mqtt:
    """``[mqtt]``: publishing to a broker (``cellcal.daemon.plant.mqtt``, ADR 0025)."""

    enabled: bool = _k(False, "enabled")
    url: str = _k("mqtt://127.0.0.1:1883", "url", doc="mqtt://host[:port] or mqtts://host[:port] (TLS)")
    cell: str = _k("", "cell", doc="topic segment of this cell (cellcal/<cell>/...); empty: [service] name")
    topic_prefix: str = _k("cellcal", "topic_prefix")
    client_id: str = _k("", "client_id", doc="empty: cellcal-<cell>")
    username: str = _k("", "username")
    password_file: str = _k("", "password_file", doc="a file holding the password (first line)")
    tls_ca_file: str = _k("", "tls_ca_file", doc="CA bundle for mqtts:// (empty: the system's)")
    tls_cert_file: str = _k("", "tls_cert_file", doc="client certificate for mqtts:// (optional)")
    tls_key_file: str = _k("", "tls_key_file")
    keepalive_s: float = _k(30.0, "keepalive_s", doc="MQTT keep-alive; the broker sends the last will after 1.5x")
    reconnect_min_s: float = _k(0.5, "reconnect_min_s", doc="first reconnection delay")
    reconnect_max_s: float = _k(30.0, "reconnect_max_s", doc="backoff ceiling")
    max_queued: int = _k(1000, "max_queued", doc="events kept while the broker is away (the retained topics never drop)")
    heartbeat: bool = _k(True, "heartbeat", doc="also publish the heartbeat (QoS 0, not retained)")


@dataclass(frozen=True)
class Metrics:
    """``[metrics]``: Prometheus ``/metrics`` (``cellcal.daemon.plant.metrics``, ADR 0026)."""

    enabled: bool = _k(False, "enabled")
    listen: str = _k("127.0.0.1:9108", "listen", doc="host:port of /metrics")
    allow_non_loopback: bool = _k(False, "allow_non_loopback", doc="listen on an address other hosts reach")


#: Element types of list fields that hold tables (merged into the configuration's own table).
LIST_OF: dict[tuple[type, str], type] = {(OpcUa, "users"): OpcUaUser, (OpcUa, "certificates"): OpcUaCertificate}
#: List fields of strings.
STR_LISTS: set[tuple[type, str]] = {(OpcUa, "security")}
CHOICES: dict[tuple[type, str], tuple[str, ...]] = {
    (OpcUaUser, "role"): _ROLES,
    (OpcUaCertificate, "role"): _ROLES,
}
#: (lo, hi, lo_open) in the TOML key's units, by dotted key.
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "opcua.update_s": (0.01, 60.0, False),
    "mqtt.keepalive_s": (1.0, 3600.0, False),
    "mqtt.reconnect_min_s": (0.01, 600.0, False),
    "mqtt.reconnect_max_s": (0.01, 3600.0, False),
    "mqtt.max_queued": (1, 1_000_000, False),
}

_TOPIC_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


def _error(path: str, message: str) -> ConfigError:
    return ConfigError(path, message)


def is_loopback_host(host: str | None) -> bool:
    """True for ``localhost`` and loopback address literals (``127.0.0.0/8``, ``::1``);
    host names and every other address count as reachable from elsewhere."""
    if not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_port(url: str, path: str, schemes: dict[str, int]) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        raise _error(path, f"expected {' or '.join(s + '://host:port' for s in schemes)}, got {url!r}")
    try:
        port = parts.port
    except ValueError:
        raise _error(path, f"expected {scheme}://host[:port] with a port in 1..65535, got {url!r}") from None
    if not parts.hostname:
        raise _error(path, f"expected {scheme}://host[:port], got {url!r}")
    port = schemes[scheme] if port is None else port
    if not 0 < port < 65536:
        raise _error(path, f"port must be in 1..65535, got {port}")
    if parts.username or parts.password:
        raise _error(path, "no credentials in the URL: use username and password_file")
    return scheme, parts.hostname, port


def opcua_host_port(o: OpcUa) -> tuple[str, int]:
    """Host and port of ``[opcua] endpoint``."""
    _s, host, port = _host_port(o.endpoint, "opcua.endpoint", {"opc.tcp": 4840})
    return host, port


def mqtt_broker(m: Mqtt) -> tuple[bool, str, int]:
    """``(tls, host, port)`` of ``[mqtt] url`` (ports default to 1883, and 8883 for TLS)."""
    scheme, host, port = _host_port(m.url, "mqtt.url", {"mqtt": 1883, "mqtts": 8883})
    return scheme == "mqtts", host, port


def parse_listen(text: str, path: str = "metrics.listen") -> tuple[str, int]:
    """``host:port`` (``[::1]:9108`` for IPv6) as ``(host, port)``."""
    host, sep, port_s = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_s.isdigit() or not 0 < int(port_s) < 65536:
        raise _error(path, f"expected host:port with a port in 1..65535, got {text!r}")
    return host, int(port_s)


def validate_plant(opcua: OpcUa, mqtt: Mqtt, metrics: Metrics, *, cell: str) -> None:
    """Checks of the three sections that need no file and no package (``load_config``);
    ``cell`` is ``[service] name`` (the MQTT topic level when ``[mqtt] cell`` is empty).

    Raises
    ------
    cellcal.daemon.config.ConfigError
        Under the dotted key (``opcua.security``, ``mqtt.cell``, ``opcua.users[1].name``).
    """
    _validate_opcua(opcua)
    _validate_mqtt(mqtt)
    if mqtt.enabled and not mqtt.cell and not _TOPIC_SEGMENT.fullmatch(cell):
        raise _error("mqtt.cell", f"empty, and [service] name {cell!r} is no topic level (1..64 of [A-Za-z0-9._-]): "
                                  "set mqtt.cell")
    host, _port = parse_listen(metrics.listen)
    if metrics.enabled and not is_loopback_host(host) and not metrics.allow_non_loopback:
        raise _error("metrics.listen", f"{host} is reachable from other hosts: listen on 127.0.0.1, or set "
                                       "allow_non_loopback = true to serve the metrics there knowingly")
    if not math.isfinite(mqtt.reconnect_max_s) or mqtt.reconnect_max_s < mqtt.reconnect_min_s:
        raise _error("mqtt.reconnect_max_s", "must be >= reconnect_min_s")


def _validate_opcua(o: OpcUa) -> None:
    host, _port = opcua_host_port(o)
    if not o.namespace_uri or len(o.namespace_uri) > 256:
        raise _error("opcua.namespace_uri", "expected a URI of 1..256 characters")
    if not o.security:
        raise _error("opcua.security", f"expected at least one of {', '.join(OPCUA_SECURITY)}")
    for i, mode in enumerate(o.security):
        if mode not in OPCUA_SECURITY:
            raise _error(f"opcua.security[{i}]", f"expected one of {', '.join(OPCUA_SECURITY)}, got {mode!r}")
    if len(set(o.security)) != len(o.security):
        raise _error("opcua.security", "a mode is listed twice")
    if "none" in o.security:
        if not is_loopback_host(host):
            raise _error("opcua.security", f"security none on {host}, which other hosts reach: anyone on the network "
                                           "could read and (with a password sent in clear) call methods; use "
                                           "sign_and_encrypt, or bind 127.0.0.1")
        if not o.allow_none_on_loopback:
            raise _error("opcua.security", "security none needs allow_none_on_loopback = true (every local user can "
                                           "then connect without encryption)")
    secure = [m for m in o.security if m != "none"]
    if secure and o.enabled:
        for key in ("certificate_file", "private_key_file"):
            if not getattr(o, key):
                raise _error(f"opcua.{key}", f"required for security {secure[0]}")
    names: set[str] = set()
    tables: tuple[tuple[str, Sequence[OpcUaUser | OpcUaCertificate], str], ...] = (
        ("users", o.users, "password_file"), ("certificates", o.certificates, "file"))
    for table, entries, what in tables:
        for i, e in enumerate(entries):
            path = f"opcua.{table}[{i}]"
            if not _NAME.fullmatch(e.name):
                raise _error(f"{path}.name", f"expected 1..64 of [A-Za-z0-9._@-], got {e.name!r}")
            if e.name in names:
                raise _error(f"{path}.name", f"{e.name!r} is named twice in [[opcua.users]] / [[opcua.certificates]]")
            names.add(e.name)
            if not getattr(e, what):
                raise _error(f"{path}.{what}", "missing")
    if o.enabled and not (o.anonymous or o.users or o.certificates):
        raise _error("opcua", "nobody could connect: configure [[opcua.users]], [[opcua.certificates]] or anonymous = true")
    if o.certificates and not secure:
        raise _error("opcua.certificates", "certificate users need a secure mode (sign or sign_and_encrypt) to prove "
                                           "the certificate")
    if o.trusted_certificates_dir and not secure:
        raise _error("opcua.trusted_certificates_dir", "trusted application certificates need a secure mode (sign or "
                                                       "sign_and_encrypt): without one no certificate is proven")


def _validate_mqtt(m: Mqtt) -> None:
    tls, host, _port = mqtt_broker(m)
    if m.cell and not _TOPIC_SEGMENT.fullmatch(m.cell):
        raise _error("mqtt.cell", f"expected 1..64 of [A-Za-z0-9._-] (one topic level, no wildcards), got {m.cell!r}")
    for i, seg in enumerate(m.topic_prefix.split("/")):
        if not _TOPIC_SEGMENT.fullmatch(seg):
            raise _error("mqtt.topic_prefix", f"level {i} {seg!r}: expected 1..64 of [A-Za-z0-9._-] per level")
    if m.client_id and not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", m.client_id):
        raise _error("mqtt.client_id", f"expected 1..64 of [A-Za-z0-9._-], got {m.client_id!r}")
    if bool(m.username) != bool(m.password_file):
        raise _error("mqtt.password_file" if m.username else "mqtt.username", "username and password_file go together")
    if m.username and not tls and not is_loopback_host(host):
        raise _error("mqtt.url", f"a password would cross the network to {host} in clear: use mqtts://")
    if not tls and (m.tls_ca_file or m.tls_cert_file or m.tls_key_file):
        raise _error("mqtt.url", "tls_* files are given but the URL is mqtt:// (use mqtts:// for TLS)")
    if bool(m.tls_cert_file) != bool(m.tls_key_file):
        raise _error("mqtt.tls_key_file" if m.tls_cert_file else "mqtt.tls_cert_file",
                     "tls_cert_file and tls_key_file go together")


def read_secret(path: str, key: str) -> str:
    """The first line of a secret file (a password), or ConfigError under ``key``."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.readline(4097).rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(key, f"cannot read {path}: {exc}") from None
    if not text:
        raise _error(key, f"{path} is empty")
    return text


def _package(name: str) -> None:
    module, dist, extra = PACKAGES[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module set to None
        found = False
    if not found:
        raise _error(f"{name}.enabled", f"needs the Python package {dist}, which is not installed: "
                                        f"pip install 'cellcal[{extra}]' (or pip install {dist})")


#: The file names ``trusted_certificates_dir`` reads (the certificate encodings asyncua loads).
TRUSTED_SUFFIXES = (".der", ".pem")


def trusted_files(path: str) -> list[Path]:
    """The certificate files of ``[opcua] trusted_certificates_dir`` (``*.der``, ``*.pem``, any case), sorted."""
    return sorted(p for p in Path(path).iterdir() if p.suffix.lower() in TRUSTED_SUFFIXES and p.is_file())


def _trusted_dir(path: str) -> None:
    key = "opcua.trusted_certificates_dir"
    if not Path(path).is_dir():
        raise _error(key, f"no such directory: {path}")
    try:
        files = trusted_files(path)
    except OSError as exc:
        raise _error(key, f"cannot read {path}: {exc}") from None
    for f in files:
        try:
            f.read_bytes()
        except OSError as exc:
            raise _error(key, f"cannot read {f}: {exc}") from None


def preflight_plant(opcua: OpcUa, mqtt: Mqtt, metrics: Metrics) -> None:
    """What ``cellcal run`` and ``check-config`` check of an enabled interface beyond
    :func:`validate_plant`: its package is installed, its key, certificate and password
    files can be read (run it as the daemon's user).

    Raises
    ------
    cellcal.daemon.config.ConfigError
        ``opcua.enabled`` naming the missing package, or the key of an unreadable file.
    """
    if opcua.enabled:
        _package("opcua")
        for key in ("certificate_file", "private_key_file"):
            p = getattr(opcua, key)
            if p and not Path(p).is_file():
                raise _error(f"opcua.{key}", f"no such file: {p}")
        for i, u in enumerate(opcua.users):
            read_secret(u.password_file, f"opcua.users[{i}].password_file")
        for i, c in enumerate(opcua.certificates):
            if not Path(c.file).is_file():
                raise _error(f"opcua.certificates[{i}].file", f"no such file: {c.file}")
        if opcua.trusted_certificates_dir:
            _trusted_dir(opcua.trusted_certificates_dir)
    if mqtt.enabled:
        _package("mqtt")
        if mqtt.password_file:
            read_secret(mqtt.password_file, "mqtt.password_file")
        for key in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
            p = getattr(mqtt, key)
            if p and not Path(p).is_file():
                raise _error(f"mqtt.{key}", f"no such file: {p}")
    if metrics.enabled:
        _package("metrics")
