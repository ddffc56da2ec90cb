"""The daemon's ZeroMQ transport: PUB for topics, ROUTER for commands, CURVE for who may do what.

The wire format is :mod:`cellcal.daemon.protocol`; this module moves it.

Threads
-------
ZeroMQ sockets are not thread-safe, so ONE I/O thread owns the PUB and ROUTER sockets.
Other threads reach it through a queue and a wake-up pipe the I/O thread polls alongside
the ROUTER: :meth:`ZmqServer.publish` is safe from any thread and never blocks. Commands
are validated and authorised on the I/O thread, then run by ONE command thread that calls
``handler.handle`` (so a slow handler delays other commands but never publishing or
snapshots, and the daemon never sees two commands at once). ``get_snapshot`` is answered by
the I/O thread itself from the latest message of every topic, so its ``seq`` is exactly
the last message that left before the reply.

Per-peer state
--------------
Clients come and go (a ``cellcal ctl`` per command, a PLC that reconnects for every read), so
nothing kept per peer may grow with the number of peers ever seen. What is kept, each
bounded by a count (:meth:`ZmqServer.peer_state` reports them): the stored replies that make
a Lazy-Pirate retry safe, only for commands that change state (the operator's: a retried
read is simply answered again), at most ``dedup_entries`` (1024) and ``dedup_bytes`` (1 MiB),
least recent out; the requests in flight (at most ``max_queued_commands``); the ipc peers'
group memberships and the refusal-log stamps (at most 1000 each, then cleared); the
internal-error log stamps (at most 256). libzmq frees a peer's pipes when it disconnects, once
the socket processes its commands: the I/O thread polls the PUB socket too (it never has
input) so that it does at once, not only when it next publishes. No socket monitor runs in
the server.

Back-pressure
-------------
PUB drops messages for a subscriber whose queue holds ``[zmq] sndhwm`` messages (ZeroMQ's
PUB never blocks); that subscriber sees a ``seq`` gap and re-snapshots. The ROUTER drops a
reply to a client that does not read its replies, refuses commands with ``E_BUSY`` when
``max_queued_commands`` wait for the handler, and ZeroMQ drops (and disconnects) any
message above ``[zmq] max_msg_bytes``.

Security
--------
With ``[zmq] curve = true`` both sockets are CURVE servers; a ZAP handler
(``zmq.auth.thread.ThreadAuthenticator``) admits only the public keys listed in
``[[zmq.clients]]``, each with a role; other keys fail the handshake and reach nothing.
Without CURVE, "local" means the daemon's own user and group, never "this host"
(:func:`check_security`, ADR 0007):

* ``ipc://`` endpoints (a socket file, made ``ipc_socket_mode``, 0660 by default, in a
  directory made 0750 if missing; or abstract, ``ipc://@name``, which has no file and no
  permissions at all): the same ZAP handler admits a peer only if the credentials the
  kernel reports for its connection (SO_PEERCRED, which libzmq puts in the ZAP address) are
  the daemon's uid, root, a listed uid, or a member of the daemon's group or a listed group;
  the ROUTER checks them again on every request. Admitted peers get ``[zmq] null_role``.
* loopback ``tcp://`` carries no credentials: it is refused unless ``[zmq]
  loopback_tcp_any_user = true`` says that every local user may have ``null_role``.
* any other ``tcp://`` endpoint is refused (:class:`SecurityError`).
"""

from __future__ import annotations

import collections
import logging
import math
import os
import pwd
import queue
import threading
import time
from collections.abc import Iterable, Mapping
from typing import cast

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from cellcal.daemon import protocol as P
from cellcal.daemon.config.schema import Zmq
from cellcal.daemon.config.security import (
    MAX_IPC_PATH_BYTES,
    BindError,
    SecurityError,
    _null_role,
    check_security,
    endpoint_kind,
    is_local_endpoint,
    load_server_key,
)
from cellcal.solver.errors import CellcalError

__all__ = [
    "ZmqServer", "SecurityError", "BindError", "is_local_endpoint", "endpoint_kind", "check_security",
    "load_server_key", "ZAP_DOMAIN", "MAX_IPC_PATH_BYTES",
]

ZAP_DOMAIN = "cellcal"
STOP_TIMEOUT_S = 5.0
_ROUTER_BATCH = 512          # messages per poll round, so publishing is never starved
_BAD_LOG_EVERY_S = 10.0      # malformed requests: one summary warning per period at most
_REFUSED_KEY_LOG_EVERY_S = 60.0
_INTERNAL_LOG_EVERY_S = 10.0   # E_INTERNAL: one traceback per (command, exception type) per period


class _PeerPolicy:
    """Who, by kernel-reported credentials (SO_PEERCRED, through libzmq), is a local peer.

    The daemon's own uid, root (which can bypass any local check anyway), the uids listed,
    and members of the daemon's group or of the listed groups: the peer's primary group as
    the kernel reports it, or its membership in the group database (``getgrouplist``, cached
    for a minute). Runs on the ZAP thread and the I/O thread; the cache is a plain dict
    whose entries are replaced whole, so no lock is needed.
    """

    _CACHE_S = 60.0

    def __init__(self, uids: Iterable[int], gids: Iterable[int], log: logging.Logger) -> None:
        self.uids = frozenset({os.geteuid(), 0, *uids})
        self.gids = frozenset({os.getegid(), *gids})
        self._log = log
        self._groups: dict[int, tuple[float, frozenset[int]]] = {}
        self._last_refusal: dict[int, float] = {}

    @staticmethod
    def parse(address: str) -> tuple[int, int, int] | None:
        """``(uid, gid, pid)`` from libzmq's ipc peer address (``...:uid:gid:pid``), or ``None``."""
        parts = address.rsplit(":", 3)
        if len(parts) != 4 or not all(p.isdigit() for p in parts[1:]):
            return None
        return int(parts[1]), int(parts[2]), int(parts[3])

    def _member_of(self, uid: int, gid: int) -> frozenset[int]:
        now = time.monotonic()
        hit = self._groups.get(uid)
        if hit is not None and now - hit[0] < self._CACHE_S:
            return hit[1] | {gid}
        try:
            groups = frozenset(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
        except (KeyError, OSError):  # a uid without a name (a container's): its gid only
            groups = frozenset()
        if len(self._groups) > 1000:
            self._groups.clear()
        self._groups[uid] = (now, groups)
        return groups | {gid}

    def allows(self, uid: int, gid: int) -> bool:
        return uid in self.uids or gid in self.gids or bool(self._member_of(uid, gid) & self.gids)

    def check(self, address: str, what: str) -> tuple[bool, str]:
        """(allowed, user id for the logs) for a peer address; refusals logged once a minute per uid."""
        cred = self.parse(address)
        if cred is None:
            self._refused(-1, f"{what}: no peer credentials in {address!r} (libzmq without SO_PEERCRED?); "
                              "refused: use CURVE")
            return False, "unknown"
        uid, gid, pid = cred
        if self.allows(uid, gid):
            return True, f"uid:{uid}"
        self._refused(uid, f"{what}: refused local peer uid {uid} gid {gid} (pid {pid}): not the daemon's user "
                           "or group, nor in zmq.ipc_allowed_uids/gids")
        return False, f"uid:{uid}"

    def _refused(self, uid: int, message: str) -> None:
        now = time.monotonic()
        if now - self._last_refusal.get(uid, -math.inf) > _REFUSED_KEY_LOG_EVERY_S:
            if len(self._last_refusal) > 1000:
                self._last_refusal.clear()
            self._last_refusal[uid] = now
            self._log.warning("%s", message)


class _Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread, with NULL-mechanism connections (ipc without CURVE) judged by the
    peer's credentials; CURVE goes to the allow-list callback as before."""

    def __init__(self, context: zmq.Context, policy: _PeerPolicy | None, log: logging.Logger) -> None:
        super().__init__(context, log=log)
        self._policy = policy

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        if len(msg) >= 6 and msg[5] == b"NULL":
            request_id, address = msg[1], msg[3].decode("utf-8", "replace")
            try:
                ok, user = self._policy.check(address, "ipc") if self._policy else (False, "unknown")
            except Exception:  # never let the ZAP thread die
                self.log.exception("ZAP peer check failed; refusing")
                ok, user = False, ""
            if ok:
                self._send_zap_reply(request_id, b"200", b"OK", user)
            else:
                self._send_zap_reply(request_id, b"400", b"not a local peer of the daemon")
            return
        await super().handle_zap_message(msg)


class _AllowList:
    """ZAP credentials provider: admits exactly the configured keys (runs on the auth thread)."""

    def __init__(self, allow: Mapping[str, tuple[str, str]], log: logging.Logger) -> None:
        self._allow = dict(allow)
        self._log = log
        self._last_refusal: dict[bytes, float] = {}

    def callback(self, domain: str, key: bytes) -> bool:
        try:
            ok = key.decode("ascii") in self._allow
            if not ok:
                # A refused client reconnects every few hundred ms: say it once a minute.
                now = time.monotonic()
                if now - self._last_refusal.get(key, -1e9) > _REFUSED_KEY_LOG_EVERY_S:
                    if len(self._last_refusal) > 1000:
                        self._last_refusal.clear()
                    self._last_refusal[key] = now
                    self._log.warning("refused CURVE key %s (not in [[zmq.clients]])", key[:8].decode("ascii", "replace"))
            return ok
        except Exception:  # never let the ZAP thread die: without it libzmq would admit any key
            self._log.exception("ZAP callback failed; refusing")
            return False


class _ReplyCache:
    """Replies by (key, routing id, request id), bounded in entries and bytes, least recent out."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._d: collections.OrderedDict[tuple, bytes] = collections.OrderedDict()
        self._bytes = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes

    def get(self, key: tuple) -> bytes | None:
        reply = self._d.get(key)
        if reply is not None:
            self._d.move_to_end(key)
        return reply

    def put(self, key: tuple, reply: bytes) -> None:
        if key in self._d:
            self._bytes -= len(self._d.pop(key))
        self._d[key] = reply
        self._bytes += len(reply)
        while self._d and (len(self._d) > self.max_entries or self._bytes > self.max_bytes):
            _k, old = self._d.popitem(last=False)
            self._bytes -= len(old)

    def __len__(self) -> int:
        return len(self._d)

    @property
    def nbytes(self) -> int:
        """Bytes of the replies held."""
        return self._bytes


class ZmqServer:
    """PUB + ROUTER endpoints of the daemon. The constructor does no I/O; :meth:`start` binds.

    Parameters
    ----------
    config_zmq : cellcal.daemon.config.Zmq
        The ``[zmq]`` section (endpoints, ``sndhwm``, ``max_msg_bytes``, ``republish_s``,
        ``curve``, ``server_secret_key_file``, ``clients``; ``null_role`` if present).
        Endpoints may use port ``*`` (tests); :attr:`pub_endpoint` tells the bound one.
    handler : protocol.Handler or None
        Runs commands (see :class:`cellcal.daemon.protocol.Handler`). ``None``: every
        command but ``get_snapshot`` gets ``E_UNAVAILABLE`` (the daemon is not ready yet).
    context : zmq.Context, optional
        Default: a private context, terminated by :meth:`stop`. A context can host one
        CURVE authenticator only (ZAP binds a fixed inproc address).
    log : logging.Logger, optional
        Default ``cellcal.daemon.zmq``; commands go to its child ``audit``.
    boot_id : str, optional
        Default: random (:func:`protocol.new_boot_id`).
    republish_topics : iterable of str
        Topics whose latest message is republished with ``retained: true`` every
        ``republish_s`` (default: the result topic, which carries the active result).
    validate_bodies : bool
        Check every published body against its TypedDict (:func:`protocol.check_body`)
        and raise ``ValueError`` at the publisher; for tests of the daemon.
    """

    def __init__(
        self,
        config_zmq: Zmq,
        handler: P.Handler | None,
        *,
        context: zmq.Context | None = None,
        log: logging.Logger | None = None,
        boot_id: str | None = None,
        republish_topics: Iterable[str] = (P.TOPIC_RESULT,),
        validate_bodies: bool = False,
        dedup_entries: int = 1024,
        dedup_bytes: int = 1 << 20,
        max_queued_commands: int = 64,
    ) -> None:
        self._allow = check_security(config_zmq)
        self._cfg = config_zmq
        self._curve = bool(config_zmq.curve)
        self._handler = handler
        self._null_caller = P.Caller("null", _null_role(config_zmq), "anonymous")
        self._kinds = {name: endpoint_kind(getattr(config_zmq, name), f"zmq.{name}") for name in ("pub_endpoint", "cmd_endpoint")}
        self._log = log or logging.getLogger("cellcal.daemon.zmq")
        # Without CURVE, an ipc peer is admitted (ZAP) and given null_role only for its
        # kernel-reported credentials; the ROUTER checks them again on every request.
        self._peers: _PeerPolicy | None = None
        if not self._curve and any(k.startswith("ipc") for k in self._kinds.values()):
            self._peers = _PeerPolicy(getattr(config_zmq, "ipc_allowed_uids", ()) or (),
                                      getattr(config_zmq, "ipc_allowed_gids", ()) or (), self._log)
        self._cmd_checks_peer = self._peers is not None and self._kinds["cmd_endpoint"].startswith("ipc")
        self.boot_id = boot_id or P.new_boot_id()
        self._audit = logging.getLogger(self._log.name + ".audit")
        self._given_context = context
        self._republish_topics = tuple(republish_topics)
        for t in self._republish_topics:
            if t not in P.TOPICS:
                raise ValueError(f"republish_topics: unknown topic {t!r}")
        self._validate_bodies = validate_bodies
        self._max_queued = max_queued_commands

        self._lock = threading.Lock()  # state changes and the wake pipe's lifetime
        self._state = "new"
        self._outbox: collections.deque[tuple] = collections.deque()
        self._wake_r: int | None = None
        self._wake_w: int | None = None
        self._ctx: zmq.Context | None = None
        self._auth: ThreadAuthenticator | None = None
        self._allow_list: _AllowList | None = None
        self._io: threading.Thread | None = None
        self._worker: threading.Thread | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._pub_ep = config_zmq.pub_endpoint
        self._cmd_ep = config_zmq.cmd_endpoint

        # I/O-thread state.
        self._seq = 0
        self._latest: dict[str, tuple[int, int, bytes, bytes]] = {}  # topic -> seq, ts_ns, body, envelope
        self._inflight: dict[tuple, list[tuple[bytes, ...]]] = {}
        self._queued = 0
        self._replies = _ReplyCache(dedup_entries, dedup_bytes)
        self._bad_since_log = 0
        self._bad_last_log = -math.inf  # the first malformed request is reported at once
        self._stats: collections.Counter[str] = collections.Counter()
        self._internal_logged: dict[tuple[str, str], tuple[float, int]] = {}  # command thread only

    # --- properties --------------------------------------------------------------------------

    @property
    def pub_endpoint(self) -> str:
        """The bound PUB endpoint (the resolved port after :meth:`start`)."""
        return self._pub_ep

    @property
    def cmd_endpoint(self) -> str:
        """The bound ROUTER endpoint (the resolved port after :meth:`start`)."""
        return self._cmd_ep

    @property
    def seq(self) -> int:
        """Seq of the last message published (0 before the first)."""
        return self._seq

    @property
    def running(self) -> bool:
        return self._state == "running"

    def stats(self) -> dict[str, int]:
        """Counters: published, requests, bad_requests, forbidden, busy, dedup_hits, replies, ..."""
        return dict(self._stats)

    def peer_state(self) -> dict[str, int]:
        """How many entries each store kept about peers holds now (module docstring, "Per-peer
        state"): ``stored_replies``, ``stored_reply_bytes``, ``inflight``, ``queued``,
        ``peer_groups``, ``peer_refusals``, ``key_refusals``, ``internal_errors_logged``.
        Read from any thread (the sizes of containers the I/O thread owns: a snapshot)."""
        peers, allow = self._peers, self._allow_list
        return {
            "stored_replies": len(self._replies), "stored_reply_bytes": self._replies.nbytes,
            "inflight": len(self._inflight), "queued": self._queued,
            "peer_groups": len(peers._groups) if peers is not None else 0,
            "peer_refusals": len(peers._last_refusal) if peers is not None else 0,
            "key_refusals": len(allow._last_refusal) if allow is not None else 0,
            "internal_errors_logged": len(self._internal_logged),
        }

    def latest(self, topic: str) -> P.Envelope | None:
        """The latest envelope published on ``topic`` (decoded), or ``None``."""
        item = self._latest.get(topic)
        # The bytes are the envelope _send_pub packed (pack_envelope): an Envelope.
        return cast(P.Envelope, P.unpack(item[3], max_array=1 << 24, max_map=1 << 20)) if item else None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> ZmqServer:
        """Load keys, start the authenticator, bind both sockets, start the threads.

        Raises
        ------
        SecurityError
            The server key file is missing or holds no secret key.
        BindError
            An endpoint cannot be bound.
        """
        with self._lock:
            if self._state != "new":
                raise RuntimeError(f"ZmqServer.start(): already {self._state}")
            self._state = "starting"
        try:
            keys = load_server_key(self._cfg) if self._curve else None
            if keys is not None:
                self._warn_key_mode()
            self._ctx = self._given_context or zmq.Context()
            if self._curve or self._peers is not None:
                self._auth = _Authenticator(self._ctx, self._peers, logging.getLogger(self._log.name + ".zap"))
                self._auth.start()
                if self._curve:
                    self._allow_list = _AllowList(self._allow, self._log)
                    self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=self._allow_list)
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            self._wake_r, self._wake_w = r, w
            self._io = threading.Thread(target=self._run_io, args=(keys,), name="cellcal-zmq-io", daemon=True)
            self._io.start()
            self._ready.wait()
            if self._start_error is not None:
                raise self._start_error
            self._worker = threading.Thread(target=self._run_worker, name="cellcal-zmq-cmd", daemon=True)
            self._worker.start()
        except BaseException:
            self._teardown()
            with self._lock:
                self._state = "stopped"
            raise
        with self._lock:
            self._state = "running"
        self._log.info("zmq: PUB %s, ROUTER %s, %s, boot_id %s", self._pub_ep, self._cmd_ep,
                       f"CURVE with {len(self._allow)} client key(s)" if self._curve
                       else f"no CURVE (every client is {self._null_caller.role})", self.boot_id)
        return self

    def stop(self) -> None:
        """Close both sockets (linger 0), stop the threads and the authenticator. Idempotent."""
        with self._lock:
            if self._state in ("stopped", "new"):
                self._state = "stopped"
                return
            self._state = "stopping"
        self._post(("stop",))
        if self._io is not None:
            self._io.join(STOP_TIMEOUT_S)
            if self._io.is_alive():
                self._log.error("zmq I/O thread did not stop within %.0f s", STOP_TIMEOUT_S)
        self._jobs.put(None)
        # (stop() may come from a command handler, i.e. the command thread itself.)
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(STOP_TIMEOUT_S)
            if self._worker.is_alive():
                self._log.warning("a command handler is still running after %.0f s; not waiting", STOP_TIMEOUT_S)
        self._teardown()
        with self._lock:
            self._state = "stopped"

    def _teardown(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        with self._lock:
            for fd in (self._wake_r, self._wake_w):
                if fd is not None:
                    os.close(fd)
            self._wake_r = self._wake_w = None
        if self._ctx is not None and self._given_context is None:
            if self._io is None or not self._io.is_alive():
                self._ctx.term()
        self._ctx = None

    def __enter__(self) -> ZmqServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _warn_key_mode(self) -> None:
        path = self._cfg.server_secret_key_file
        try:
            if os.stat(path).st_mode & 0o077:
                self._log.warning("%s is readable by group or others; chmod 600 it", path)
        except OSError:
            pass

    # --- the API for the daemon (any thread) -------------------------------------------------

    def publish(self, topic: str, body: Mapping[str, object], *, retained: bool = False) -> None:
        """Queue one message for the PUB socket; never blocks. Safe from any thread.

        The envelope (seq, boot_id, ts_ns) is added here and on the I/O thread; ``ts_ns`` is
        the time of this call. On the result topic the body's ``retained`` is set to
        ``retained``; on other topics it is added only when true.

        Raises
        ------
        ValueError
            Unknown topic (or, with ``validate_bodies``, a body that does not conform).
        TypeError
            A body that msgpack cannot encode.
        """
        if topic not in P.TOPICS:
            raise ValueError(f"unknown topic {topic!r} (known: {', '.join(P.TOPICS)})")
        if not isinstance(body, Mapping):
            raise TypeError(f"body must be a mapping, got {type(body).__name__}")
        body = dict(body)
        if topic == P.TOPIC_RESULT or retained:
            body["retained"] = bool(retained)
        if self._validate_bodies:
            problems = P.check_body(topic, P.unpack(P.pack(body), max_array=1 << 24, max_map=1 << 20))
            if problems:
                raise ValueError(f"{topic} body does not conform: " + "; ".join(problems[:5]))
        packed = P.pack(body)  # here, so a bad body fails in the caller's thread
        self._post(("pub", topic, time.time_ns(), packed))

    def republish_retained(self, topic: str) -> None:
        """Publish the latest body of ``topic`` again with ``retained: true`` (new seq, ts_ns)."""
        if topic not in P.TOPICS:
            raise ValueError(f"unknown topic {topic!r}")
        self._post(("republish", topic))

    # --- plumbing ----------------------------------------------------------------------------

    def _post(self, item: tuple) -> None:
        if self._state in ("stopped", "stopping") and item[0] != "stop":
            return  # shutting down: the daemon's last messages have nowhere to go
        self._outbox.append(item)
        with self._lock:
            if self._wake_w is not None:
                try:
                    os.write(self._wake_w, b"\x01")
                except BlockingIOError:
                    pass  # the pipe is full, so a wake-up is already pending

    def _run_io(self, keys: tuple[bytes, bytes] | None) -> None:
        ctx = self._ctx
        assert ctx is not None
        pub = router = None
        try:
            pub = ctx.socket(zmq.PUB)
            router = ctx.socket(zmq.ROUTER)
            for s, name in ((pub, "pub_endpoint"), (router, "cmd_endpoint")):
                s.linger = 0
                if keys is not None:
                    s.curve_server = True
                    s.curve_publickey, s.curve_secretkey = keys
                    s.zap_domain = ZAP_DOMAIN.encode()
                elif self._kinds[name].startswith("ipc"):
                    s.zap_domain = ZAP_DOMAIN.encode()  # NULL mechanism: ZAP judges the peer's credentials
            pub.sndhwm = int(self._cfg.sndhwm)
            router.maxmsgsize = int(self._cfg.max_msg_bytes)
            # A client that reconnects with the same routing id (Lazy Pirate) takes over the
            # old route, so the reply to its retry reaches it.
            router.router_handover = 1
            for sock, ep in ((pub, self._cfg.pub_endpoint), (router, self._cfg.cmd_endpoint)):
                _prepare_ipc_dir(ep, self._log)
                try:
                    sock.bind(ep)
                except zmq.ZMQError as exc:
                    raise BindError(f"cannot bind {ep}: {exc}") from None
                _set_ipc_mode(ep, int(getattr(self._cfg, "ipc_socket_mode", 0o660)))
            self._pub_ep = pub.last_endpoint.decode()
            self._cmd_ep = router.last_endpoint.decode()
        except BaseException as exc:
            self._start_error = exc if isinstance(exc, (BindError, CellcalError)) else BindError(str(exc))
            for s in (pub, router):
                if s is not None:
                    s.close(linger=0)
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop(pub, router)
        except Exception:
            self._log.exception("zmq I/O thread failed")
        finally:
            pub.close(linger=0)
            router.close(linger=0)

    def _loop(self, pub: zmq.Socket, router: zmq.Socket) -> None:
        poller = zmq.Poller()
        wake_r = self._wake_r
        assert wake_r is not None  # start() made the pipe before this thread
        poller.register(router, zmq.POLLIN)
        poller.register(wake_r, zmq.POLLIN)
        # The PUB never has input, but polling it makes libzmq process its commands as they
        # come: a subscriber that connected and left is detached (its pipe and buffers freed)
        # at once, not at the next publish. Without it every subscriber between two heartbeats
        # stayed allocated: a churn of short-lived subscribers grew the daemon by megabytes
        # (bench/zmq_churn_bench.py).
        poller.register(pub, zmq.POLLIN)
        period = float(self._cfg.republish_s)
        next_republish = time.monotonic() + period
        # Messages published before start() were queued without a wake-up byte.
        if self._drain_outbox(pub, router):
            return
        while True:
            timeout_ms = max(0.0, next_republish - time.monotonic()) * 1000.0
            events = dict(poller.poll(int(math.ceil(timeout_ms))))
            if wake_r in events:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            if self._drain_outbox(pub, router):
                return
            if router in events:
                self._serve(router)
            now = time.monotonic()
            if now >= next_republish:
                for topic in self._republish_topics:
                    self._republish(pub, topic)
                next_republish = max(next_republish + period, now)

    def _drain_outbox(self, pub: zmq.Socket, router: zmq.Socket) -> bool:
        while self._outbox:
            item = self._outbox.popleft()
            kind = item[0]
            if kind == "pub":
                _, topic, ts_ns, packed = item
                self._send_pub(pub, topic, ts_ns, packed)
            elif kind == "reply":
                _, key, reply, outcome = item
                self._queued -= 1
                self._stats["commands"] += 1
                if outcome == P.E_INTERNAL:
                    self._stats["internal_errors"] += 1
                if key[-1]:  # a command that changes state: its retries get this reply
                    self._replies.put(key, reply)
                for prefix in self._inflight.pop(key, ()):
                    self._send_reply(router, prefix, reply)
            elif kind == "republish":
                self._republish(pub, item[1])
            elif kind == "stop":
                return True
        return False

    def _send_pub(self, pub: zmq.Socket, topic: str, ts_ns: int, packed: bytes) -> None:
        self._seq += 1
        env = P.pack_envelope(self._seq, self.boot_id, ts_ns, packed)
        self._latest[topic] = (self._seq, ts_ns, packed, env)
        try:
            pub.send_multipart([topic.encode("ascii"), env], flags=zmq.NOBLOCK)
        except zmq.Again:  # PUB drops rather than blocks; belt and braces
            pass
        self._stats["published"] += 1

    def _republish(self, pub: zmq.Socket, topic: str) -> None:
        item = self._latest.get(topic)
        if item is None:
            return
        # The bytes are a body publish() packed from a mapping: a map again.
        body = cast(dict[str, object], P.unpack(item[2], max_array=1 << 24, max_map=1 << 20))
        body["retained"] = True
        self._send_pub(pub, topic, time.time_ns(), P.pack(body))
        self._stats["republished"] += 1

    @staticmethod
    def _send_reply(router: zmq.Socket, prefix: tuple[bytes, ...], reply: bytes) -> None:
        try:
            router.send_multipart([*prefix, reply], flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the client's queue is full (it does not read): its loss, not ours

    def _caller(self, frame: zmq.Frame) -> tuple[P.Caller, str]:
        if not self._curve:
            if not self._cmd_checks_peer:
                return self._null_caller, "null"
            # Defence in depth behind ZAP: the kernel's credentials of this very connection.
            try:
                address = str(frame.get("Peer-Address"))
            except zmq.ZMQError:
                address = ""
            assert self._peers is not None
            ok, user = self._peers.check(address, "ipc request")
            return P.Caller(user, self._null_caller.role if ok else "", user), user
        try:
            key = str(frame.get("User-Id"))
        except zmq.ZMQError:
            key = ""
        role, name = self._allow.get(key, ("", "unknown"))
        # An empty role (a key ZAP did not vouch for) passes no role check: defence in depth.
        return P.Caller(key[:8] or "unknown", role, name), key

    def _serve(self, router: zmq.Socket) -> None:
        for _ in range(_ROUTER_BATCH):
            try:
                frames = router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._stats["requests"] += 1
            try:
                self._on_request(router, frames)
            except Exception:  # a bug here must cost one request, never the I/O thread
                self._log.exception("zmq: failed to handle a request")
                self._stats["internal_errors"] += 1

    def _on_request(self, router: zmq.Socket, frames: list[zmq.Frame]) -> None:
        identity = frames[0].bytes
        prefix: tuple[bytes, ...]
        if len(frames) >= 3 and len(frames[1]) == 0:  # REQ client: [id, "", payload]
            prefix, payload = (identity, b""), frames[2:]
        else:  # DEALER client: [id, payload]
            prefix, payload = (identity,), frames[1:]
        caller, key = self._caller(frames[-1])
        if len(payload) != 1:
            self._bad(router, prefix, None, f"expected one payload frame, got {len(payload)}", caller)
            return
        try:
            req = P.parse_request(payload[0].bytes)
        except P.BadRequest as exc:
            self._bad(router, prefix, exc.request_id, exc.message, caller)
            return
        spec = P.COMMANDS[req.cmd]
        if not P.role_allows(caller.role, spec.role):
            self._stats["forbidden"] += 1
            msg = f"{req.cmd} needs role {spec.role}; key {caller.key_id} has {caller.role or 'no role'}"
            self._audit.warning("cmd %s id=%r key=%s role=%s name=%s -> E_FORBIDDEN",
                                req.cmd, req.id, caller.key_id, caller.role, caller.name)
            self._send_reply(router, prefix, P.pack_error(req.id, P.E_FORBIDDEN, msg))
            return
        try:
            args = P.validate_args(req.cmd, req.args)
        except P.CommandError as exc:
            self._bad(router, prefix, req.id, exc.message, caller)
            return
        if req.cmd == "get_snapshot":
            self._send_reply(router, prefix, self._snapshot_reply(req.id))
            self._audit.debug("cmd get_snapshot id=%r key=%s -> ok (seq %d)", req.id, caller.key_id, self._seq)
            return
        # A retried read is answered afresh; only a command that changes state (the operator's)
        # must not run twice, so only its reply is stored (the "Per-peer state" bound).
        dedup_key = (key, identity, type(req.id).__name__, req.id, spec.role == P.ROLE_OPERATOR)
        cached = self._replies.get(dedup_key)
        if cached is not None:
            self._stats["dedup_hits"] += 1
            self._audit.info("cmd %s id=%r key=%s role=%s name=%s -> repeat, stored reply",
                             req.cmd, req.id, caller.key_id, caller.role, caller.name)
            self._send_reply(router, prefix, cached)
            return
        if dedup_key in self._inflight:  # a retry while the first attempt still runs
            self._stats["dedup_hits"] += 1
            if prefix not in self._inflight[dedup_key]:
                self._inflight[dedup_key].append(prefix)
            return
        if self._handler is None:
            self._send_reply(router, prefix, P.pack_error(req.id, P.E_UNAVAILABLE, "the daemon is starting; retry"))
            return
        if self._queued >= self._max_queued:
            self._stats["busy"] += 1
            self._send_reply(router, prefix, P.pack_error(
                req.id, P.E_BUSY, f"{self._queued} commands are waiting for the daemon; retry later"))
            return
        self._inflight[dedup_key] = [prefix]
        self._queued += 1
        self._jobs.put((dedup_key, req.id, req.cmd, args, caller, time.monotonic()))

    def _bad(self, router: zmq.Socket, prefix: tuple[bytes, ...], rid: str | int | None, message: str,
             caller: P.Caller) -> None:
        self._stats["bad_requests"] += 1
        self._send_reply(router, prefix, P.pack_error(rid, P.E_BAD_REQUEST, message))
        # Garbage is logged in summary: a flood of it must not become a flood of log lines.
        self._audit.debug("bad request id=%r key=%s: %s", rid, caller.key_id, message)
        self._bad_since_log += 1
        now = time.monotonic()
        if now - self._bad_last_log >= _BAD_LOG_EVERY_S:
            if math.isinf(self._bad_last_log):
                self._audit.warning("malformed request from key %s: %s (further ones: one summary per %.0f s)",
                                    caller.key_id, message, _BAD_LOG_EVERY_S)
            else:
                self._audit.warning("%d malformed request(s) in the last %.0f s; latest from key %s: %s",
                                    self._bad_since_log, now - self._bad_last_log, caller.key_id, message)
            self._bad_since_log = 0
            self._bad_last_log = now

    def _snapshot_reply(self, rid: str | int) -> bytes:
        messages = P.packed_map([(t, item[3]) for t, item in self._latest.items()])
        result = P.packed_map([("seq", P.pack(self._seq)), ("boot_id", P.pack(self.boot_id)), ("messages", messages)])
        return P.packed_map([("id", P.pack(rid)), ("ok", P.pack(True)), ("result", result)])

    # --- the command thread ------------------------------------------------------------------

    def _run_worker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            dedup_key, rid, cmd, args, caller, t0 = job
            try:
                result = self._handler.handle(cmd, args, caller)  # type: ignore[union-attr]
                bad = P.find_non_finite(result)
                if bad:
                    raise ValueError(f"{cmd} produced a non-finite number at {bad}")
                reply = P.pack_ok(rid, result)
                outcome = "ok"
            except P.CommandError as exc:
                reply = P.pack_error(rid, exc.code, exc.message)
                outcome = exc.code
            except Exception as exc:
                self._internal_error(cmd, rid, caller, exc)
                reply = P.pack_error(rid, P.E_INTERNAL, f"{cmd} failed inside the daemon ({type(exc).__name__}); see its log")
                outcome = P.E_INTERNAL
            level = logging.INFO if P.COMMANDS[cmd].role == P.ROLE_OPERATOR or outcome != "ok" else logging.DEBUG
            self._audit.log(level, "cmd %s id=%r key=%s role=%s name=%s -> %s (%.1f ms)", cmd, rid,
                            caller.key_id, caller.role, caller.name, outcome, (time.monotonic() - t0) * 1e3)
            self._post(("reply", dedup_key, reply, outcome))


    def _internal_error(self, cmd: str, rid: str | int, caller: P.Caller, exc: BaseException) -> None:
        # A bug a client can trigger at will must not become a flood of tracebacks: the full
        # traceback once per period for each (command, exception type), then a count.
        key = (cmd, type(exc).__name__)
        now = time.monotonic()
        last, suppressed = self._internal_logged.get(key, (-math.inf, 0))
        if now - last >= _INTERNAL_LOG_EVERY_S:
            if len(self._internal_logged) > 256:
                self._internal_logged.clear()
            self._internal_logged[key] = (now, 0)
            more = f" ({suppressed} more like it since the last report)" if suppressed else ""
            self._log.error("command %s id=%r from key %s failed%s", cmd, rid, caller.key_id, more,
                            exc_info=(type(exc), exc, exc.__traceback__))
        else:
            self._internal_logged[key] = (last, suppressed + 1)


def _prepare_ipc_dir(endpoint: str, log: logging.Logger) -> None:
    # ipc sockets live in the runtime directory; systemd creates it (RuntimeDirectory=), the
    # demo and tests may not have: then it is made 0750. Abstract sockets (ipc://@name) have
    # no directory.
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        d = os.path.dirname(endpoint[len("ipc://"):])
        if d:
            try:
                os.makedirs(d, mode=0o750, exist_ok=True)
                st = os.stat(d)
            except OSError as exc:
                raise BindError(f"cannot prepare the directory of {endpoint}: {exc}") from None
            if st.st_mode & 0o002 and not st.st_mode & 0o1000:
                # Anyone could replace the socket file there and impersonate the daemon.
                log.warning("%s is writable by every user (and not sticky): clients of %s cannot trust "
                            "the socket they reach; use the runtime directory", d, endpoint)


def _set_ipc_mode(endpoint: str, mode: int) -> None:
    # The socket file is what a local user connects to: the kernel checks write permission
    # on it. bind() made it by the umask; set the configured mode (default 0660).
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        path = endpoint[len("ipc://"):]
        try:
            os.chmod(path, mode)
        except OSError as exc:
            raise BindError(f"cannot set mode {oct(mode)} on {path}: {exc}") from None
