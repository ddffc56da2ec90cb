"""Tell systemd how the service is doing: ``sd_notify(3)`` with the standard library only.

The protocol is one ``AF_UNIX`` datagram per notification, sent to the socket named by
``$NOTIFY_SOCKET``, holding newline-separated ``KEY=VALUE`` assignments. A name starting
with ``@`` is a Linux abstract-namespace socket (the ``@`` stands for a leading NUL byte).
systemd identifies the sender by the kernel-supplied credentials; with
``NotifyAccess=main`` (``systemd/cellcal.service``) only the daemon's main process counts.

What the daemon sends, and when
-------------------------------
``READY=1`` (:meth:`Notifier.ready`)
    Once the config is valid, the store is open and replayed, and the sockets are bound:
    with ``Type=notify`` the unit is "started" only from then on.
``STATUS=...`` (:meth:`Notifier.status`)
    One human-readable line (state, active result, device faults), shown by
    ``systemctl status cellcal``.
``WATCHDOG=1`` (:meth:`Notifier.watchdog`)
    **Only from the supervising loop, and only after it made real progress** (a state
    machine tick that ran, devices polled, a transaction committed). A timer thread that
    pings unconditionally would keep a wedged daemon alive and defeat ``WatchdogSec=``.
    Send it at least every half of :func:`watchdog_interval_s`.
``STOPPING=1`` (:meth:`Notifier.stopping`)
    First thing on SIGTERM, before finishing the current transaction.
``RELOADING=1`` (:meth:`Notifier.reloading`)
    Optional: when re-reading the config in place; send ``READY=1`` again when done.

Failure policy
--------------
Notifications are advisory for the daemon: systemd may be restarting, the socket may have
vanished, its queue may be full. No method raises on a send failure; each logs at debug
level and returns ``False``. With ``$NOTIFY_SOCKET`` unset (run by hand, in tests) every
method is a no-op that returns ``False``. The only exceptions are ``ValueError`` for a
malformed field passed to :meth:`Notifier.notify`: that is the caller's bug.

Examples
--------
>>> notifier = Notifier()          # no I/O here
>>> notifier.ready()               # doctest: +SKIP
True
>>> notifier.status("IDLE, result 42 active")   # doctest: +SKIP
True
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Mapping

__all__ = ["Notifier", "watchdog_interval_s", "NOTIFY_SOCKET_ENV", "DEFAULT_SEND_TIMEOUT_S"]

_log = logging.getLogger(__name__)

NOTIFY_SOCKET_ENV = "NOTIFY_SOCKET"
_WATCHDOG_USEC_ENV = "WATCHDOG_USEC"
_WATCHDOG_PID_ENV = "WATCHDOG_PID"

# A datagram to a receiver whose queue is full blocks the sender. systemd drains its
# notification socket promptly, so waiting longer than this means it is wedged or gone;
# the supervising loop must not hang on it.
DEFAULT_SEND_TIMEOUT_S = 0.5

_US_PER_S = 1_000_000
# sd_notify field names: what systemd itself sends and accepts (upper case, digits, '_').
_FIELD_NAME = re.compile(r"[A-Z][A-Z0-9_]*\Z")


def watchdog_interval_s(
    environ: Mapping[str, str] | None = None, pid: int | None = None
) -> float | None:
    """Watchdog timeout systemd enforces on this process, in seconds, or ``None``.

    Same rules as ``sd_watchdog_enabled(3)``: ``$WATCHDOG_USEC`` is the timeout
    (``WatchdogSec=``) in microseconds; if ``$WATCHDOG_PID`` is set, the watchdog is meant
    for that process only (a child that inherited the environment must not ping).

    Parameters
    ----------
    environ : Mapping[str, str], optional
        Environment to read; ``os.environ`` by default.
    pid : int, optional
        Process id to compare with ``$WATCHDOG_PID``; ``os.getpid()`` by default.

    Returns
    -------
    float or None
        The timeout in seconds (send ``WATCHDOG=1`` at least every half of it), or ``None``
        when no watchdog applies to this process: variable unset, not a positive integer,
        or ``$WATCHDOG_PID`` names another process.
    """
    env = os.environ if environ is None else environ
    raw_usec = env.get(_WATCHDOG_USEC_ENV)
    if raw_usec is None:
        return None
    raw_pid = env.get(_WATCHDOG_PID_ENV)
    if raw_pid is not None:
        own_pid = os.getpid() if pid is None else pid
        try:
            watchdog_pid = int(raw_pid, 10)
        except ValueError:
            _log.debug("ignoring watchdog: %s=%r is not a pid", _WATCHDOG_PID_ENV, raw_pid)
            return None
        if watchdog_pid <= 0:
            _log.debug("ignoring watchdog: %s=%r is not a pid", _WATCHDOG_PID_ENV, raw_pid)
            return None
        if watchdog_pid != own_pid:
            return None
    try:
        usec = int(raw_usec, 10)
    except ValueError:
        _log.debug("ignoring watchdog: %s=%r is not an integer", _WATCHDOG_USEC_ENV, raw_usec)
        return None
    if usec <= 0:
        _log.debug("ignoring watchdog: %s=%r is not positive", _WATCHDOG_USEC_ENV, raw_usec)
        return None
    return usec / _US_PER_S


def _socket_address(name: str) -> str | None:
    """Map a ``$NOTIFY_SOCKET`` value to an ``AF_UNIX`` address, or ``None`` if unusable."""
    if name.startswith("/"):
        return name
    if name.startswith("@") and len(name) > 1:
        # Abstract namespace: Python takes a str starting with NUL for it.
        return "\0" + name[1:]
    # Anything else (relative paths, newer systemd's vsock: addresses) is not ours to guess.
    return None


class Notifier:
    """sd_notify client bound to one notification socket.

    The constructor only records the socket name; the datagram socket is created on the
    first send and reused (guarded by a lock, so any thread may send).

    Parameters
    ----------
    notify_socket : str, optional
        Socket name in ``$NOTIFY_SOCKET`` syntax (a path, or ``@name`` for the abstract
        namespace). By default read from ``$NOTIFY_SOCKET`` at construction; empty or unset
        makes every method a no-op returning ``False``.
    send_timeout_s : float
        Longest a send may block on a full receive queue before it counts as failed.

    Attributes
    ----------
    notify_socket : str or None
        The socket name used, ``None`` when disabled.
    """

    def __init__(
        self, notify_socket: str | None = None, *, send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S
    ) -> None:
        if notify_socket is None:
            notify_socket = os.environ.get(NOTIFY_SOCKET_ENV)
        if not (send_timeout_s > 0.0):
            raise ValueError(f"send_timeout_s must be > 0, got {send_timeout_s!r}")
        self.notify_socket: str | None = notify_socket or None
        self._address = None if self.notify_socket is None else _socket_address(self.notify_socket)
        self._send_timeout_s = float(send_timeout_s)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """Whether a usable notification socket is configured (says nothing of it being up)."""
        return self._address is not None

    # -- the messages the daemon sends -----------------------------------------------------

    def ready(self) -> bool:
        """Send ``READY=1``: start-up finished, the service is serving.

        Returns
        -------
        bool
            ``True`` if the datagram was sent, ``False`` if disabled or the send failed.
        """
        return self.notify(READY=1)

    def status(self, text: str) -> bool:
        """Send ``STATUS=<text>``, the line ``systemctl status`` shows.

        Line breaks (e.g. from an exception message) are replaced with spaces: a newline
        would start a new assignment in the datagram.

        Parameters
        ----------
        text : str
            Free text, one line.

        Returns
        -------
        bool
            ``True`` if sent.
        """
        return self.notify(STATUS=" ".join(str(text).splitlines()))

    def watchdog(self) -> bool:
        """Send ``WATCHDOG=1``, resetting systemd's watchdog timer.

        Call it only from the supervising loop after real progress (see the module
        docstring), at least every half of :func:`watchdog_interval_s`.

        Returns
        -------
        bool
            ``True`` if sent.
        """
        return self.notify(WATCHDOG=1)

    def stopping(self) -> bool:
        """Send ``STOPPING=1``: shutdown has begun (``systemctl`` shows "deactivating").

        Returns
        -------
        bool
            ``True`` if sent.
        """
        return self.notify(STOPPING=1)

    def reloading(self) -> bool:
        """Send ``RELOADING=1`` with ``MONOTONIC_USEC``: an in-place reload has begun.

        ``MONOTONIC_USEC`` (``CLOCK_MONOTONIC``, which is what ``time.monotonic_ns`` reads
        on Linux) is required by ``Type=notify-reload`` in newer systemd and ignored by
        older ones. Send :meth:`ready` when the reload is done.

        Returns
        -------
        bool
            ``True`` if sent.
        """
        return self.notify(RELOADING=1, MONOTONIC_USEC=time.monotonic_ns() // 1000)

    def extend_timeout(self, seconds: float) -> bool:
        """Send ``EXTEND_TIMEOUT_USEC``: ask for ``seconds`` more before a start/stop timeout.

        For a start-up that legitimately takes long (replaying a large store) or a stop
        that waits on a slow transaction; systemd's ``TimeoutStartSec=``/``TimeoutStopSec=``
        are extended to at least ``seconds`` from now.

        Parameters
        ----------
        seconds : float
            Extra time, > 0.

        Returns
        -------
        bool
            ``True`` if sent.
        """
        if not (seconds > 0.0):
            raise ValueError(f"seconds must be > 0, got {seconds!r}")
        return self.notify(EXTEND_TIMEOUT_USEC=int(seconds * _US_PER_S))

    def watchdog_interval_s(self) -> float | None:
        """Watchdog timeout for this process in seconds; see :func:`watchdog_interval_s`."""
        return watchdog_interval_s()

    # -- generic ---------------------------------------------------------------------------

    def notify(self, **fields: object) -> bool:
        """Send one datagram with ``KEY=value`` lines, in the order given.

        Parameters
        ----------
        **fields
            Field names as systemd spells them (``READY``, ``STATUS``, ``ERRNO``, ...);
            values are converted with ``str`` (``True`` and ``False`` become ``1``/``0``).

        Returns
        -------
        bool
            ``True`` if the datagram was sent; ``False`` when disabled or the send failed
            (logged at debug level, never raised).

        Raises
        ------
        ValueError
            No field, a name that is not upper-case ``[A-Z0-9_]``, or a value containing a
            newline or NUL (it would inject or truncate assignments).
        """
        if not fields:
            raise ValueError("notify() needs at least one field")
        lines = []
        for name, value in fields.items():
            if not _FIELD_NAME.match(name):
                raise ValueError(f"sd_notify field name {name!r} must match [A-Z][A-Z0-9_]*")
            text = str(int(value)) if isinstance(value, bool) else str(value)
            if "\n" in text or "\0" in text:
                raise ValueError(f"sd_notify field {name}: value must be one line without NUL")
            lines.append(f"{name}={text}")
        return self._send("\n".join(lines).encode("utf-8"))

    def close(self) -> None:
        """Close the datagram socket (a later send opens a new one)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __enter__(self) -> Notifier:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Notifier(notify_socket={self.notify_socket!r})"

    # -- internals -------------------------------------------------------------------------

    def _send(self, payload: bytes) -> bool:
        if self._address is None:
            if self.notify_socket is not None:
                _log.debug(
                    "sd_notify disabled: unsupported %s=%r", NOTIFY_SOCKET_ENV, self.notify_socket
                )
            return False
        with self._lock:
            try:
                if self._sock is None:
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                    sock.settimeout(self._send_timeout_s)
                    self._sock = sock
                # sendto on every call rather than connect once: if systemd re-creates its
                # socket (daemon-reexec), the next notification reaches the new one.
                sent = self._sock.sendto(payload, self._address)
            except OSError as exc:  # ENOENT, ECONNREFUSED, timeout (full queue), EPERM, ...
                _log.debug("sd_notify to %s failed: %s", self.notify_socket, exc)
                return False
        if sent != len(payload):  # datagrams are all-or-nothing; defensive only
            _log.debug("sd_notify to %s: short send %d/%d", self.notify_socket, sent, len(payload))
            return False
        return True
