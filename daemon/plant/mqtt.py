"""The daemon's events on an MQTT broker (paho-mqtt, ADR 0025): one cell's topics for a plant's dashboards.

Topics (``<prefix>`` is ``[mqtt] topic_prefix``, ``cellcal`` by default; ``<cell>`` is
``[mqtt] cell`` or ``[service] name``); every payload is the JSON of the body the ZeroMQ
server publishes on the matching ``cellcal/v1/`` topic (``cellcal.daemon.bodies``)::

    <prefix>/<cell>/state          retained, QoS 1   every state change; "offline" as last will
    <prefix>/<cell>/result/active  retained, QoS 1   the active calibration (republished when it changes)
    <prefix>/<cell>/drift          retained, QoS 1   every drift check (heartbeat or requested)
    <prefix>/<cell>/result         QoS 1             every result published (not retained)
    <prefix>/<cell>/fault          QoS 1             faults raised and cleared (devices, interfaces)
    <prefix>/<cell>/station        QoS 0             every capture attempt
    <prefix>/<cell>/heartbeat      QoS 0             1 Hz ([mqtt] heartbeat = true)

``state`` carries the ``StateBody`` with ``online: true`` added; the last will (and the
goodbye of a clean stop) is ``{"state": "offline", "online": false, "cell", "boot_id",
"reason"}``, retained, so a dashboard sees a dead daemon as offline, not as its last state.

Delivery
--------
One thread (``cellcal-mqtt``) owns the connection; events reach it through a bounded queue
(``[mqtt] max_queued``; the oldest is dropped beyond it), so the service's emit never waits
for the network. Each connection is a fresh paho client whose own network thread runs only
while it is connected; it never reconnects by itself: this thread does, with a doubling
backoff (``reconnect_min_s`` .. ``reconnect_max_s``). A fresh client per connection means
no message queued inside paho survives a disconnect to arrive *after* a newer one, so on
every connection the latest payload of each retained topic is published (unless a newer
event for it is queued) and then the queued events in order: a broker that restarted without
persistence has every retained topic back, and the retained value is always the newest.
QoS 1 events the broker had not acknowledged when the connection dropped are queued again
(at least once). A broker that is down is a fault of the ``mqtt`` interface (raised once,
cleared on reconnection); it never stops a run.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from cellcal.daemon import protocol as P
from cellcal.daemon.devices import Backoff
from cellcal.daemon.plant import PLANT_CALLER, DaemonPort, FaultFn, call_command
from cellcal.daemon.plant.config import Mqtt, mqtt_broker, read_secret
from cellcal.daemon.plant.views import to_json

if TYPE_CHECKING:
    from paho.mqtt.client import Client, ConnectFlags, DisconnectFlags, MQTTMessageInfo
    from paho.mqtt.properties import Properties
    from paho.mqtt.reasoncodes import ReasonCode

log = logging.getLogger(__name__)

__all__ = ["MqttPublisher", "topics_of", "offline_payload"]

#: cellcal/v1/<topic> -> (sub-topic, QoS, retained)
_ROUTES: dict[str, tuple[str, int, bool]] = {
    P.TOPIC_STATE: ("state", 1, True),
    P.TOPIC_DRIFT: ("drift", 1, True),
    P.TOPIC_RESULT: ("result", 1, False),
    P.TOPIC_FAULT: ("fault", 1, False),
    P.TOPIC_STATION: ("station", 0, False),
    P.TOPIC_HEARTBEAT: ("heartbeat", 0, False),
}
_ACTIVE = "result/active"
_CONNACK_TIMEOUT_S = 10.0
_GOODBYE_TIMEOUT_S = 2.0


def topics_of(prefix: str, cell: str) -> dict[str, str]:
    """Sub-topic -> full topic for one cell (``state`` -> ``cellcal/cell-7/state``)."""
    return {sub: f"{prefix}/{cell}/{sub}" for sub in (*(r[0] for r in _ROUTES.values()), _ACTIVE)}


def offline_payload(cell: str, boot_id: str, reason: str) -> bytes:
    """The ``state`` payload of a daemon that is gone (last will, clean stop)."""
    return to_json({"state": "offline", "online": False, "cell": cell, "boot_id": boot_id, "reason": reason})


class _Item:
    __slots__ = ("topic", "payload", "qos", "retain")

    def __init__(self, topic: str, payload: bytes, qos: int, retain: bool) -> None:
        self.topic, self.payload, self.qos, self.retain = topic, payload, qos, retain


class MqttPublisher:
    """``[mqtt]``: publishes the daemon's events to a broker (module docstring).

    Parameters
    ----------
    cfg : Mqtt
        The ``[mqtt]`` section.
    port : DaemonPort
        The daemon (``cellcal.daemon.plant``).
    fault : callable(interface, message, *, active, retry_in_s=None)
        ``Plant.fault``.
    """

    name = "mqtt"

    def __init__(self, cfg: Mqtt, port: DaemonPort, fault: FaultFn) -> None:
        import paho.mqtt.client  # noqa: F401 - fail at build time (the Plant reports it), not in the thread

        self.cfg = cfg
        self.port = port
        self._fault = fault
        self.tls, self.host, self.port_number = mqtt_broker(cfg)
        self.cell = cfg.cell or port.cell
        self.topics = topics_of(cfg.topic_prefix, self.cell)
        self.client_id = cfg.client_id or f"cellcal-{self.cell}"
        self._password = read_secret(cfg.password_file, "mqtt.password_file") if cfg.password_file else None
        self._cond = threading.Condition()
        self._queue: collections.deque[_Item] = collections.deque()
        self._bodies: collections.deque[tuple[str, Mapping[str, object]]] = collections.deque()
        self._retained: dict[str, bytes] = {}   # full topic -> the newest payload
        self._last_active: bytes | None = None  # result/active as last published (without "retained")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Client | None = None
        self._lost = threading.Event()
        self.stats = {"published": 0, "dropped": 0, "connections": 0, "requeued": 0, "encode_errors": 0}

    # ---- the daemon's side (any thread, never blocks) -------------------------------------------
    def on_event(self, topic: str, body: Mapping[str, object]) -> None:
        if topic not in _ROUTES or (topic == P.TOPIC_HEARTBEAT and not self.cfg.heartbeat):
            return
        with self._cond:
            self._bodies.append((topic, body))
            if len(self._bodies) > self.cfg.max_queued:
                self._bodies.popleft()
                self.stats["dropped"] += 1
            self._cond.notify()

    def start(self) -> None:
        if self._thread is not None:
            return
        hb = self.port.status()
        self._retained[self.topics["state"]] = to_json(dict(self._state_body(hb)))
        try:
            result = call_command(self.port, "get_result", {}, PLANT_CALLER)
        except P.CommandError:
            result = None  # no active calibration yet
        if isinstance(result, Mapping):  # the active result's body
            self._set_active(result)
        self._thread = threading.Thread(target=self._run, name="cellcal-mqtt", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=_GOODBYE_TIMEOUT_S + 5.0)
            if self._thread.is_alive():
                log.warning("mqtt: the publisher thread did not stop in time")
            self._thread = None

    # ---- payloads --------------------------------------------------------------------------------
    def _state_body(self, hb: Mapping[str, object]) -> dict[str, object]:
        """A state body for the start (the service emits one only on a change)."""
        # The heartbeat's state and run id (a StateName, a str or None: protocol.HeartbeatBody)
        # and [capture] motion_mode (a MotionMode: the configuration's choices).
        body: dict[str, object] = dict(P.StateBody(
            state=cast(P.StateName, hb["state"]), previous=None, reason="online",
            run_id=cast("str | None", hb.get("run_id")), kind=None, motion_mode=cast(P.MotionMode, self.port.motion_mode)))
        body["detail"] = "online"
        body["online"] = True
        return body

    def _set_active(self, body: Mapping[str, object]) -> bool:
        """Keep ``body`` as result/active; False when it says nothing new (the periodic
        retained republish of the same result)."""
        if not body.get("active", False):
            return False
        same = dict(body)
        same.pop("retained", None)
        key = to_json(same)
        if key == self._last_active:
            return False
        self._last_active = key
        self._retained[self.topics[_ACTIVE]] = key
        return True

    def _items_of(self, topic: str, body: Mapping[str, object]) -> list[_Item]:
        """The MQTT messages of one event (encoded here, on the publisher's thread)."""
        sub, qos, retain = _ROUTES[topic]
        out: list[_Item] = []
        if topic == P.TOPIC_RESULT:
            if self._set_active(body):
                out.append(_Item(self.topics[_ACTIVE], self._retained[self.topics[_ACTIVE]], 1, True))
            if body.get("retained"):
                return out  # a republish is no new result
        if topic == P.TOPIC_STATE:
            body = {**body, "online": True}
        payload = to_json(body)
        full = self.topics[sub]
        if retain:
            self._retained[full] = payload
        out.append(_Item(full, payload, qos, retain))
        return out

    def _take_bodies(self) -> None:
        """Encode what the daemon emitted into the send queue (the oldest drop beyond the bound)."""
        with self._cond:
            bodies = list(self._bodies)
            self._bodies.clear()
        for topic, body in bodies:
            try:
                items = self._items_of(topic, body)
            except (TypeError, ValueError) as exc:
                self.stats["encode_errors"] += 1
                log.error("mqtt: %s body not encodable as JSON (%s); not published", topic, exc)
                continue
            for it in items:
                if it.qos == 0 and not self._connected():
                    continue  # QoS 0 is "now or never"
                self._queue.append(it)
        while len(self._queue) > self.cfg.max_queued:
            self._queue.popleft()
            self.stats["dropped"] += 1

    # ---- the connection (the publisher's thread only) ---------------------------------------------
    def _connected(self) -> bool:
        c = self._client
        return c is not None and not self._lost.is_set() and c.is_connected()

    def _new_client(self) -> Client:
        import paho.mqtt.client as mqtt  # the optional extra cellcal[mqtt]: only when [mqtt] is enabled

        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=True,
                        protocol=mqtt.MQTTv311, reconnect_on_failure=False)
        c.will_set(self.topics["state"], offline_payload(self.cell, self.port.boot_id,
                                                         "connection to the broker lost (last will)"),
                   qos=1, retain=True)
        if self.cfg.username:
            c.username_pw_set(self.cfg.username, self._password)
        if self.tls:
            c.tls_set(ca_certs=self.cfg.tls_ca_file or None, certfile=self.cfg.tls_cert_file or None,
                      keyfile=self.cfg.tls_key_file or None)
        c.max_queued_messages_set(self.cfg.max_queued)
        return c

    def _connect(self) -> tuple[Client | None, str | None]:
        """A connected client, or (None, why not)."""
        connack: dict[str, ReasonCode] = {}
        got = threading.Event()

        def on_connect(client: Client, userdata: object, flags: ConnectFlags, reason: ReasonCode,
                       properties: Properties | None) -> None:
            connack["reason"] = reason
            got.set()

        def on_disconnect(client: Client, userdata: object, flags: DisconnectFlags, reason: ReasonCode,
                          properties: Properties | None) -> None:
            connack.setdefault("reason", reason)
            self._lost.set()
            got.set()
            with self._cond:
                self._cond.notify()

        c = self._new_client()
        c.on_connect = on_connect
        c.on_disconnect = on_disconnect
        self._lost.clear()
        try:
            c.connect(self.host, self.port_number, keepalive=int(max(1, round(self.cfg.keepalive_s))))
        except (OSError, ValueError) as exc:
            return None, f"broker {self.host}:{self.port_number} unreachable: {exc}"
        c.loop_start()
        deadline = time.monotonic() + _CONNACK_TIMEOUT_S
        while not got.wait(0.1):  # in steps: a stop must not wait for a broker that does not answer
            if self._stop.is_set() or time.monotonic() > deadline:
                self._drop(c)
                return None, f"broker {self.host}:{self.port_number}: no CONNACK within {_CONNACK_TIMEOUT_S:g} s"
        reason = connack.get("reason")
        if reason is None or getattr(reason, "is_failure", True) or self._lost.is_set():
            self._drop(c)
            return None, f"broker {self.host}:{self.port_number} refused the connection: {reason}"
        return c, None

    @staticmethod
    def _drop(c: Client) -> None:
        try:
            c.disconnect()
        except Exception:  # noqa: BLE001 - already gone
            pass
        c.loop_stop()

    def _run(self) -> None:
        backoff = Backoff(self.cfg.reconnect_min_s, self.cfg.reconnect_max_s)
        while not self._stop.is_set():
            self._take_bodies()  # encode what came in meanwhile (coalesced into the retained cache)
            client, why = self._connect()
            if client is None:
                delay = backoff.next_delay()
                self._fault(self.name, f"{why}; retrying in {delay:.1f} s", active=True, retry_in_s=delay)
                self._wait(delay)
                continue
            backoff.reset()
            self.stats["connections"] += 1
            self._client = client
            log.info("mqtt: connected to %s:%d as %s", self.host, self.port_number, self.client_id)
            self._fault(self.name, f"connected to broker {self.host}:{self.port_number}", active=False)
            inflight = self._serve(client)
            self._client = None
            if self._stop.is_set():
                self._goodbye(client)
                return
            self._drop(client)
            unacked = [it for info, it in inflight if not info.is_published() and not it.retain and it.qos > 0]
            self._queue.extendleft(reversed(unacked))
            self.stats["requeued"] += len(unacked)
            delay = backoff.next_delay()
            self._fault(self.name, f"connection to broker {self.host}:{self.port_number} lost; retrying in "
                                   f"{delay:.1f} s", active=True, retry_in_s=delay)
            self._wait(delay)

    def _wait(self, delay: float) -> None:
        self._stop.wait(delay)

    def _serve(self, client: Client) -> list[tuple[MQTTMessageInfo, _Item]]:
        """Publish on one connection until it drops or the publisher stops; returns the QoS 1
        messages not yet acknowledged when it ended."""
        inflight: list[tuple[MQTTMessageInfo, _Item]] = []
        queued_retained = {it.topic for it in self._queue if it.retain}
        # The newest payload of every retained topic the queue does not bring anyway: a broker
        # that restarted without persistence gets them back.
        first = [_Item(t, p, 1, True) for t, p in self._retained.items() if t not in queued_retained]
        self._queue.extendleft(reversed(first))
        while not self._stop.is_set() and not self._lost.is_set():
            while self._queue and not self._lost.is_set():
                it = self._queue.popleft()
                info = client.publish(it.topic, it.payload, qos=it.qos, retain=it.retain)
                self.stats["published"] += 1
                if it.qos > 0:
                    inflight.append((info, it))
            inflight = [(i, it) for i, it in inflight if not i.is_published()]
            with self._cond:
                if not self._bodies and not self._stop.is_set() and not self._lost.is_set():
                    self._cond.wait(1.0)
            self._take_bodies()
        return inflight

    def _goodbye(self, client: Client) -> None:
        """A clean stop: the queue, then ``state`` offline (retained: the will is not sent on a
        clean disconnect), then disconnect."""
        try:
            self._take_bodies()
            while self._queue:
                it = self._queue.popleft()
                client.publish(it.topic, it.payload, qos=it.qos, retain=it.retain)
            info = client.publish(self.topics["state"], offline_payload(self.cell, self.port.boot_id, "daemon stopped"),
                                  qos=1, retain=True)
            deadline = time.monotonic() + _GOODBYE_TIMEOUT_S
            while not info.is_published() and time.monotonic() < deadline and client.is_connected():
                info.wait_for_publish(0.1)
        except (RuntimeError, ValueError, OSError) as exc:
            log.warning("mqtt: goodbye not published: %s", exc)
        finally:
            self._drop(client)
