"""A Python client of the daemon's ZeroMQ interface (the reference client for the protocol).

Commands (:meth:`Client.call`) go over a DEALER socket with a timeout on every attempt and
Lazy-Pirate retries (zguide ch. 4): when no reply comes in time the socket is closed and
reopened and the request is sent again with the *same* id and the same ZeroMQ routing id,
so the daemon's dedup answers a retry of a command that already ran with the stored reply
instead of running it twice.

Subscriptions (:meth:`Client.subscribe`) follow the zguide Clone pattern: subscribe to the
whole ``cellcal/v1/`` prefix first, then ask for ``get_snapshot``, deliver the snapshot,
then the live messages with ``seq`` above the snapshot's. A ``seq`` jump is a gap (counted,
reported to ``on_gap``) and a new ``boot_id`` a daemon restart (``on_restart``); both are
repaired with a fresh snapshot, so what the caller sees always converges to the daemon's
latest message per topic. Silence longer than ``silence_timeout_s`` reopens the SUB socket;
silence is nothing arriving while ``recv`` listens, so messages that queued while the caller
was busy are delivered, not dropped by a reconnect.

Neither :class:`Client` nor :class:`Subscription` is thread-safe: use each from one thread.

Example
-------
>>> with Client("tcp://127.0.0.1:5561", "tcp://127.0.0.1:5560") as c:   # doctest: +SKIP
...     c.call("to_base", point_m=[1.0, 0.5, 0.2])
...     sub = c.subscribe()
...     for topic, env in sub:
...         print(topic, env["seq"], env["body"])
"""

from __future__ import annotations

import collections
import logging
import math
import os
import secrets
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Literal, cast, overload

import zmq
import zmq.auth
from zmq.utils.monitor import recv_monitor_message

from cellcal.daemon import protocol as P
from cellcal.solver.errors import CellcalError

__all__ = ["Client", "Subscription", "ClientError", "CommandFailed", "ClientTimeout",
           "load_public_key", "load_keypair"]

_BIG = {"max_array": 1 << 24, "max_map": 1 << 20}  # replies and envelopes can be large (residuals)
_SNAPSHOT_BACKOFF_S = (0.2, 5.0)
_HANDSHAKE_WAIT_S = 0.5
_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_BUFFER_MAX = 100_000


def _ms(seconds: float) -> int:
    """A poll timeout in whole milliseconds (pyzmq's type), rounded up so a short wait is
    never a zero-timeout poll."""
    return max(0, math.ceil(seconds * 1000.0))


class ClientError(CellcalError):
    """Root of the client's errors."""


class CommandFailed(ClientError):
    """The daemon answered ``ok: false``.

    Attributes
    ----------
    code : str
        The protocol error code (``E_FORBIDDEN``, ...).
    message : str
        The daemon's explanation.
    reply : dict
        The whole reply.
    """

    def __init__(self, code: str, message: str, reply: dict[str, object] | None = None) -> None:
        self.code = code
        self.message = message
        self.reply: dict[str, object] = reply or {}
        super().__init__(f"{code}: {message}")


class ClientTimeout(ClientError, TimeoutError):
    """No reply after every attempt (daemon down, unreachable, or our CURVE key refused)."""


def load_public_key(value: str | bytes | os.PathLike) -> bytes:
    """A Z85 public key: the 40-character key itself or a certificate file holding it."""
    if isinstance(value, bytes):
        value = value.decode("ascii")
    value = os.fspath(value)
    if len(value) == 40 and not os.path.exists(value):
        return value.encode("ascii")
    public, _secret = zmq.auth.load_certificate(value)
    return public


def load_keypair(path: str | os.PathLike) -> tuple[bytes, bytes]:
    """(public, secret) Z85 keys from a secret certificate file (``NAME.key_secret``)."""
    public, secret = zmq.auth.load_certificate(path)
    if not secret:
        raise ValueError(f"{os.fspath(path)} holds no secret-key (use the .key_secret file)")
    return public, secret


class Client:
    """Commands and subscriptions to one daemon. The constructor does no I/O.

    Parameters
    ----------
    cmd_endpoint : str
        The daemon's ROUTER endpoint (``[zmq] cmd_endpoint``).
    pub_endpoint : str, optional
        The daemon's PUB endpoint; needed for :meth:`subscribe`.
    curve_server_key : str or bytes, optional
        The daemon's Z85 public key; with ``curve_keypair``, enables CURVE.
    curve_keypair : (public, secret), optional
        This client's Z85 key pair (its public key must be in the daemon's allow-list).
    timeout_s : float
        Wait for a reply this long per attempt.
    retries : int
        Re-sends after the first attempt times out (at most ``1 + retries`` attempts).
    context : zmq.Context, optional
        Default: a private context, terminated by :meth:`close`.
    sub_rcvhwm : int
        Receive high-water mark of subscriptions (messages); beyond it ZeroMQ drops and the
        subscription sees a gap.
    max_msg_bytes : int
        Largest message accepted from the daemon.
    """

    def __init__(
        self,
        cmd_endpoint: str,
        pub_endpoint: str | None = None,
        *,
        curve_server_key: str | bytes | None = None,
        curve_keypair: tuple[str | bytes, str | bytes] | None = None,
        timeout_s: float = 2.0,
        retries: int = 3,
        context: zmq.Context | None = None,
        sub_rcvhwm: int = 1000,
        max_msg_bytes: int = 64 << 20,
        log: logging.Logger | None = None,
    ) -> None:
        if (curve_server_key is None) != (curve_keypair is None):
            raise ValueError("CURVE needs both curve_server_key and curve_keypair")
        if timeout_s <= 0 or retries < 0:
            raise ValueError(f"timeout_s must be > 0 and retries >= 0, got {timeout_s}, {retries}")
        self.cmd_endpoint = cmd_endpoint
        self.pub_endpoint = pub_endpoint
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.sub_rcvhwm = int(sub_rcvhwm)
        self.max_msg_bytes = int(max_msg_bytes)
        self._curve = None
        if curve_server_key is not None and curve_keypair is not None:
            def enc(k: str | bytes) -> bytes:
                return k.encode("ascii") if isinstance(k, str) else bytes(k)

            self._curve = (enc(curve_server_key), enc(curve_keypair[0]), enc(curve_keypair[1]))
        self._given_context = context
        self._ctx: zmq.Context | None = None
        self._cmd: zmq.Socket | None = None
        # Stable across Lazy-Pirate reconnects so the daemon's dedup recognises a retry.
        # A routing id must not start with a zero byte (reserved by ZeroMQ).
        self.routing_id = b"cc" + secrets.token_bytes(10)
        self._subs: list[Subscription] = []
        self._closed = False
        self._log = log or logging.getLogger("cellcal.daemon.wire.client")

    # --- sockets -----------------------------------------------------------------------------

    def _context(self) -> zmq.Context:
        if self._closed:
            raise ClientError("client is closed")
        if self._ctx is None:
            self._ctx = self._given_context or zmq.Context()
        return self._ctx

    def _socket(self, kind: int) -> zmq.Socket:
        s = self._context().socket(kind)
        s.linger = 0
        s.maxmsgsize = self.max_msg_bytes
        if self._curve is not None:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = self._curve
        return s

    def _cmd_socket(self) -> zmq.Socket:
        if self._cmd is None:
            s = self._socket(zmq.DEALER)
            s.routing_id = self.routing_id
            s.connect(self.cmd_endpoint)
            self._cmd = s
        return self._cmd

    def _close_cmd(self) -> None:
        if self._cmd is not None:
            self._cmd.close(linger=0)
            self._cmd = None

    # --- commands ----------------------------------------------------------------------------

    def request(
        self,
        cmd: str,
        args: Mapping[str, object] | None = None,
        *,
        request_id: str | int | None = None,
        timeout_s: float | None = None,
        retries: int | None = None,
    ) -> dict[str, object]:
        """Send one request and return the whole reply ``{id, ok, result | error}``.

        Raises
        ------
        ClientTimeout
            No reply after ``1 + retries`` attempts of ``timeout_s`` each.
        """
        rid = uuid.uuid4().hex if request_id is None else request_id
        payload = P.pack({"id": rid, "cmd": cmd, "args": dict(args or {})})
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        attempts = 1 + (self.retries if retries is None else int(retries))
        for attempt in range(1, attempts + 1):
            sock = self._cmd_socket()
            deadline = time.monotonic() + timeout
            try:
                sock.send(payload, flags=zmq.NOBLOCK)
            except zmq.Again:
                pass  # no route yet; counts as an attempt that got no reply
            else:
                reply = self._await_reply(sock, rid, deadline)
                if reply is not None:
                    return reply
            self._log.debug("no reply to %s id=%r in %.1f s (attempt %d of %d)", cmd, rid, timeout, attempt, attempts)
            # Lazy Pirate: a socket that got no answer may be wedged (a refused CURVE
            # handshake, a dead peer); start again on a fresh one.
            self._close_cmd()
            if attempt < attempts:
                time.sleep(min(0.05 * attempt, 0.5))  # do not hammer a daemon that is restarting
        raise ClientTimeout(f"no reply to {cmd} from {self.cmd_endpoint} after {attempts} attempt(s) of {timeout:g} s")

    def _await_reply(self, sock: zmq.Socket, rid: str | int, deadline: float) -> dict[str, object] | None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not sock.poll(_ms(remaining), zmq.POLLIN):
                return None
            data = sock.recv(flags=zmq.NOBLOCK)
            try:
                reply = P.unpack(data, **_BIG)
            except ValueError as exc:
                self._log.warning("undecodable reply from %s: %s", self.cmd_endpoint, exc)
                continue
            if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
                continue
            got = reply.get("id")
            if got is None and reply["ok"] is False:
                return reply  # the daemon could not read our request at all: tell the caller
            if type(got) is type(rid) and got == rid:
                return reply
            # else: a late reply to an earlier request that timed out; drop it

    # The result of each command is typed as the protocol promises it (``protocol.RESULT_TYPES``;
    # the daemon's tests hold its replies to it with ``protocol.check_result``); a command this
    # client does not know returns what the daemon sent.
    @overload
    def call(self, cmd: Literal["get_status"], /, **args: object) -> P.StatusResult: ...
    @overload
    def call(self, cmd: Literal["get_snapshot"], /, **args: object) -> P.SnapshotResult: ...
    @overload
    def call(self, cmd: Literal["get_result"], /, **args: object) -> P.ResultBody: ...
    @overload
    def call(self, cmd: Literal["list_results"], /, **args: object) -> P.ListResultsResult: ...
    @overload
    def call(self, cmd: Literal["to_base"], /, **args: object) -> P.ToBasePointResult | P.ToBasePoseResult: ...
    @overload
    def call(self, cmd: Literal["start_run"], /, **args: object) -> P.StartRunResult: ...
    @overload
    def call(self, cmd: Literal["abort"], /, **args: object) -> P.AbortResult: ...
    @overload
    def call(self, cmd: Literal["run_drift_check"], /, **args: object) -> P.DriftCheckResult: ...
    @overload
    def call(self, cmd: Literal["activate_result"], /, **args: object) -> P.ActivateResult: ...
    @overload
    def call(self, cmd: str, /, **args: object) -> object: ...

    def call(self, cmd: str, /, **args: object) -> object:
        """Run ``cmd`` with keyword ``args``; return its ``result``.

        Raises
        ------
        CommandFailed
            The daemon answered with an error (``.code``, ``.message``).
        ClientTimeout
            No reply after every attempt.
        """
        reply = self.request(cmd, args)
        if reply["ok"]:
            return reply.get("result")
        error = reply.get("error")
        err: dict[str, object] = error if isinstance(error, dict) else {}
        raise CommandFailed(str(err.get("code", "?")), str(err.get("message", "")), reply)

    # --- subscriptions -----------------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] | None = None,
        *,
        on_gap: Callable[[int, int], None] | None = None,
        on_restart: Callable[[str | None, str], None] | None = None,
        silence_timeout_s: float = 5.0,
    ) -> Subscription:
        """Follow the daemon's topics with snapshot catch-up; see :class:`Subscription`."""
        if self.pub_endpoint is None:
            raise ClientError("subscribe() needs pub_endpoint")
        sub = Subscription(self, topics, on_gap=on_gap, on_restart=on_restart, silence_timeout_s=silence_timeout_s)
        self._subs.append(sub)
        return sub

    # --- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close every socket (linger 0) and the private context. Idempotent."""
        if self._closed:
            return
        for sub in self._subs:
            sub.close()
        self._close_cmd()
        self._closed = True
        if self._ctx is not None and self._given_context is None:
            self._ctx.term()
        self._ctx = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Subscription:
    """Live messages of the daemon with snapshot catch-up, gap and restart detection.

    Created by :meth:`Client.subscribe`. :meth:`recv` returns ``(topic, envelope)`` or
    ``None`` on timeout; iterating yields messages until :meth:`close`. Each topic's
    messages arrive in ``seq`` order, and a message is never delivered twice.

    Attributes
    ----------
    gaps : int
        Seq jumps seen in the live stream (messages ZeroMQ dropped, or missed while
        joining); each was repaired by a snapshot.
    restarts : int
        Changes of ``boot_id`` (the daemon restarted).
    snapshots : int
        Snapshots applied.
    reconnects : int
        SUB sockets reopened after ``silence_timeout_s`` without a message.
    bad_messages : int
        Messages that were not a well-formed v1 envelope (dropped).
    handshake_failures : int
        Refused ZeroMQ handshakes seen while connecting (a CURVE key the daemon does not
        allow, or the wrong server key).
    boot_id, last_seq
        Where the stream stands.
    """

    def __init__(
        self,
        client: Client,
        topics: Iterable[str] | None,
        *,
        on_gap: Callable[[int, int], None] | None,
        on_restart: Callable[[str | None, str], None] | None,
        silence_timeout_s: float,
    ) -> None:
        wanted = frozenset(topics) if topics is not None else frozenset(P.TOPICS)
        unknown = wanted - set(P.TOPICS)
        if unknown:
            raise ValueError(f"unknown topic(s) {sorted(unknown)} (known: {', '.join(P.TOPICS)})")
        self.topics = wanted
        self._client = client
        self._on_gap = on_gap
        self._on_restart = on_restart
        self.silence_timeout_s = float(silence_timeout_s)
        self.gaps = self.restarts = self.snapshots = self.reconnects = self.bad_messages = 0
        self.handshake_failures = 0
        self.boot_id: str | None = None
        self.last_seq: int | None = None
        self._delivered: dict[str, int] = {}
        self._pending: collections.deque[tuple[str, P.Envelope]] = collections.deque()
        self._buffer: collections.deque[tuple[str, P.Envelope]] = collections.deque(maxlen=_BUFFER_MAX)
        self._need_snapshot = True
        self._next_snapshot = 0.0
        self._backoff = _SNAPSHOT_BACKOFF_S[0]
        self._sock: zmq.Socket | None = None
        self._closed = False
        self._open()

    def _open(self) -> None:
        s = self._client._socket(zmq.SUB)
        s.rcvhwm = self._client.sub_rcvhwm
        monitor = s.get_monitor_socket(_HANDSHAKE_EVENTS)
        try:
            assert self._client.pub_endpoint is not None  # subscribe() refuses a client without one
            s.connect(self._client.pub_endpoint)
            # The whole prefix, whatever the caller wants: seq is global, so only the full
            # stream shows gaps. Unwanted topics are filtered here, after the seq check.
            s.setsockopt(zmq.SUBSCRIBE, P.TOPIC_PREFIX.encode())
            self._await_handshake(monitor)
        finally:
            s.disable_monitor()
            monitor.close(linger=0)
        self._sock = s
        self._last_live = time.monotonic()

    def _await_handshake(self, monitor: zmq.Socket) -> None:
        # A message published between the snapshot and the moment our subscription reaches
        # the daemon is missed (and repaired only when the next message shows the gap), so
        # wait until the connection is up before the first snapshot: the window shrinks from
        # a connection set-up to one subscription message. It also tells a refused key.
        deadline = time.monotonic() + min(_HANDSHAKE_WAIT_S, self._client.timeout_s)
        while (remaining := deadline - time.monotonic()) > 0 and monitor.poll(_ms(remaining)):
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                return
            self.handshake_failures += 1
            if self.handshake_failures == 1:
                self._client._log.warning(
                    "%s refused the handshake (%s): wrong server key, or our key is not allowed",
                    self._client.pub_endpoint, "authentication" if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH else "protocol")

    def _reconnect(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
        self.reconnects += 1
        self._open()
        self._due_snapshot()

    def _due_snapshot(self) -> None:
        self._need_snapshot = True
        self._next_snapshot = 0.0

    # --- receiving ---------------------------------------------------------------------------

    def recv(self, timeout_s: float | None = None) -> tuple[str, P.Envelope] | None:
        """The next ``(topic, envelope)``, or ``None`` if none came within ``timeout_s``.

        When a snapshot is due it is fetched first, which may take up to the client's
        ``timeout_s`` beyond this one if the daemon does not answer.
        """
        if self._closed:
            raise ClientError("subscription is closed")
        timeout = self._client.timeout_s if timeout_s is None else float(timeout_s)
        deadline = time.monotonic() + timeout
        while True:
            if self._pending:
                return self._pending.popleft()
            now = time.monotonic()
            if self._need_snapshot and now >= self._next_snapshot:
                self._snapshot(deadline)
                continue
            if now - self._last_live > self.silence_timeout_s:
                # Silence is nothing arriving while we listen: what queued while the caller
                # was away says the link is alive (and a reconnect would throw it away).
                if not self._drain(0):
                    self._reconnect()
                continue
            if now >= deadline:
                return None
            wake = min(deadline, self._last_live + self.silence_timeout_s)
            if self._need_snapshot:
                wake = min(wake, self._next_snapshot)
            self._drain(_ms(max(0.0, wake - now)))

    def _drain(self, timeout_ms: int) -> bool:
        """Wait up to ``timeout_ms`` for the socket, then take what is there (at most
        1000 messages, then deliver); whether anything came."""
        assert self._sock is not None
        if not self._sock.poll(timeout_ms, zmq.POLLIN):
            return False
        for _ in range(1000):
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            self._on_live(frames)
        return True

    def __iter__(self) -> Iterator[tuple[str, P.Envelope]]:
        while not self._closed:
            msg = self.recv(1.0)
            if msg is not None:
                yield msg

    def _on_live(self, frames: list[bytes]) -> None:
        self._last_live = time.monotonic()
        try:
            if len(frames) != 2:
                raise ValueError(f"{len(frames)} frames")
            topic = frames[0].decode("ascii")
            env = P.unpack(frames[1], **_BIG)
            problem = P.check_envelope(env)
            if problem:
                raise ValueError(problem)
        except (ValueError, UnicodeDecodeError) as exc:
            self.bad_messages += 1
            self._client._log.warning("dropped a malformed message from %s: %s", self._client.pub_endpoint, exc)
            return
        # check_envelope has just checked every field of it, and that its body is a map.
        self._on_envelope(topic, cast(P.Envelope, env))

    def _on_envelope(self, topic: str, env: P.Envelope) -> None:
        seq, boot = env["seq"], env["boot_id"]
        if self._need_snapshot and time.monotonic() >= self._next_snapshot:
            self._buffer.append((topic, env))  # a snapshot is about to be taken: sort it out then
            return
        if boot != self.boot_id:
            if self.boot_id is not None:
                self._restart(boot)
                self._buffer.append((topic, env))
                return
            self.boot_id = boot  # never synced (the snapshot failed): follow the live stream
        if self.last_seq is not None:
            if seq <= self.last_seq:
                return  # covered by the snapshot, or a duplicate
            if seq > self.last_seq + 1 and not self._need_snapshot:
                self.gaps += 1
                self._client._log.info("seq gap: expected %d, got %d; taking a snapshot", self.last_seq + 1, seq)
                if self._on_gap is not None:
                    self._on_gap(self.last_seq + 1, seq)
                self._due_snapshot()
                self._buffer.append((topic, env))
                return
            # (a jump while backing off from a failed snapshot: keep following the stream)
        self.last_seq = seq
        self._deliver(topic, env)

    def _restart(self, boot: str) -> None:
        old = self.boot_id
        self.boot_id = boot
        self.last_seq = None
        self._delivered.clear()
        self.restarts += 1
        self._client._log.info("daemon restarted (boot_id %s -> %s); taking a snapshot", old, boot)
        if self._on_restart is not None:
            self._on_restart(old, boot)
        self._due_snapshot()

    def _deliver(self, topic: str, env: P.Envelope) -> None:
        if env["seq"] <= self._delivered.get(topic, 0):
            return
        self._delivered[topic] = env["seq"]
        if topic in self.topics:
            self._pending.append((topic, env))

    def _snapshot(self, deadline: float) -> None:
        timeout = max(0.2, min(self._client.timeout_s, deadline - time.monotonic()))
        try:
            reply = self._client.request("get_snapshot", {}, timeout_s=timeout, retries=0)
            if not reply["ok"]:
                error = reply.get("error")
                err: dict[str, object] = error if isinstance(error, dict) else {}
                raise CommandFailed(str(err.get("code", "?")), str(err.get("message", "")), reply)
            snap = reply["result"]
            if not (isinstance(snap, dict) and isinstance(snap.get("seq"), int) and isinstance(snap.get("boot_id"), str)
                    and isinstance(snap.get("messages"), dict)):
                raise ClientError(f"malformed snapshot: {str(snap)[:200]}")
        except ClientTimeout:
            # Keep following the live stream meanwhile; try again after a back-off.
            self._next_snapshot = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, _SNAPSHOT_BACKOFF_S[1])
            self._replay_buffer()
            return
        boot, seq = snap["boot_id"], snap["seq"]
        if boot != self.boot_id:
            if self.boot_id is not None:
                self._restart(boot)
            self.boot_id = boot
            self.last_seq = None
            self._delivered.clear()
        messages = [(t, e) for t, e in snap["messages"].items()
                    if t in P.TOPICS and P.check_envelope(e) is None and e["boot_id"] == boot and e["seq"] <= seq]
        for topic, env in sorted(messages, key=lambda te: te[1]["seq"]):
            self._deliver(topic, env)
        self.last_seq = max(self.last_seq or 0, seq)
        self._need_snapshot = False
        self._backoff = _SNAPSHOT_BACKOFF_S[0]
        self.snapshots += 1
        self._replay_buffer()

    def _replay_buffer(self) -> None:
        held = list(self._buffer)
        self._buffer.clear()
        for topic, env in held:
            self._on_envelope(topic, env)

    def stale_s(self) -> float:
        """Seconds since the last live message (heartbeats come every ``heartbeat_s``)."""
        return time.monotonic() - self._last_live

    def close(self) -> None:
        """Close the SUB socket. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
