"""Plant interfaces beside ZeroMQ: an OPC UA server, an MQTT publisher, Prometheus ``/metrics``.

One cellcal runs per cell; a plant of 50-500 cells reads them through the engines it already
runs (an OPC UA aggregation server or PLC, an MQTT broker, a Prometheus server). Each
interface is an optional extra (``cellcal[opcua]``, ``cellcal[mqtt]``, ``cellcal[metrics]``),
off unless its section says ``enabled = true`` (``cellcal.daemon.plant.config``), and a
plugin of the daemon: the daemon never names one. ``docs/integration.md`` says which one
serves which client, their address space and topics, and the security choices.

What the daemon gives them (the whole interface)
------------------------------------------------
A :class:`DaemonPort`, built once by the daemon's assembly (:func:`attach`, called by
``cellcal.daemon.app.App``), plus the daemon's events:

``events``
    ``on_event(topic, body)`` is registered with ``Service.add_listener``: every body the
    ZeroMQ server publishes (``cellcal/v1/heartbeat``, ``state``, ``station``, ``result``,
    ``drift``, ``fault``; ``cellcal.daemon.bodies`` builds them), on the thread that emits it.
    Adapters never block it: each hands the body to its own thread or loop (bounded), or
    updates a counter.
``status()``
    ``Service.status``: the heartbeat body plus ``queued_jobs``, ``last_drift``, ``cusum_m``.
``handler``
    The ZeroMQ server's command handler (``protocol.Handler``): ``handle(cmd, args,
    caller)`` with ``args`` validated by ``protocol.validate_args`` and the caller's role
    checked by ``protocol.role_allows`` against ``protocol.COMMANDS[cmd].role`` *before*
    the call, exactly as the ZeroMQ server does (:func:`call_command`). The OPC UA methods
    ``StartRun`` and ``RunDriftCheck`` are ``start_run`` and ``run_drift_check``; the
    adapters read the active result with ``get_result``.
``last_run()``
    The newest run: ``{"run_id", "kind", "status", "reason"}`` or None (the metrics' last
    run status; the store's ``list_runs(limit=1)``).
``publish_fault(body)``
    Puts a ``protocol.FaultBody`` on the daemon's own fault topic (ZeroMQ): how an
    interface that failed says so (:meth:`Plant.fault`).
``cell``, ``boot_id``, ``version``, ``motion_mode``
    ``[service] name``, the boot id of this start, the cellcal version, ``[capture] motion_mode``.

Failures stay where they happen (ADR 0024-0026): an interface that cannot start, a broker
that is down, a client that stalls is logged and published as a fault (``code
E_UNAVAILABLE``, ``device`` None, ``interface`` naming it, raised then cleared), and never
stops a run, the service or another interface.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypedDict, cast

from cellcal.daemon import protocol as P
from cellcal.daemon.config import Config
from cellcal.daemon.service import Service, cellcal_version
from cellcal.daemon.zmq_glue import DaemonHandler
from cellcal.drivers.base import load_backend

log = logging.getLogger(__name__)

__all__ = ["DaemonPort", "RunSummary", "Adapter", "FaultFn", "Plant", "attach", "enabled_interfaces", "call_command",
           "PLANT_CALLER", "interface_fault", "ADAPTERS"]

#: Interface name -> ``"module:Class"`` of its adapter, imported only when the configuration
#: enables it (each needs its optional package: asyncua, paho-mqtt, prometheus-client).
ADAPTERS: dict[str, str] = {
    "opcua": "cellcal.daemon.plant.opcua:OpcUaServer",
    "mqtt": "cellcal.daemon.plant.mqtt:MqttPublisher",
    "metrics": "cellcal.daemon.plant.metrics:MetricsExporter",
}

#: Who the adapters are when they read for themselves (``get_result`` at start).
PLANT_CALLER = P.Caller(key_id="plant", role=P.ROLE_OBSERVER, name="plant")


class RunSummary(TypedDict):
    run_id: str
    kind: str
    status: str       # capturing, solving, done, failed, aborted
    reason: str


@dataclass(frozen=True)
class DaemonPort:
    """What an interface may use of the daemon (the module docstring says what each is)."""

    cell: str
    boot_id: str
    version: str
    motion_mode: str
    status: Callable[[], Mapping[str, object]]
    handler: P.Handler
    last_run: Callable[[], RunSummary | None]
    publish_fault: Callable[[P.FaultBody], None]


class Adapter(Protocol):
    """One interface: built with no I/O, started and stopped by :class:`Plant`."""

    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def on_event(self, topic: str, body: Mapping[str, object]) -> None: ...


class FaultFn(Protocol):
    """How an adapter raises (``active``) or clears its interface's fault: :meth:`Plant.fault`."""

    def __call__(self, interface: str, message: str, *, active: bool, retry_in_s: float | None = None) -> None: ...


def call_command(port: DaemonPort, cmd: str, args: Mapping[str, object], caller: P.Caller) -> object:
    """Run ``cmd`` for ``caller`` through the same checks as the ZeroMQ command socket.

    The role first (``E_FORBIDDEN``, nothing runs), then the arguments (``E_BAD_REQUEST``),
    then the handler; every operator command is logged with the caller.

    Raises
    ------
    protocol.CommandError
        With the protocol's error code.
    """
    spec = P.COMMANDS.get(cmd)
    if spec is None:
        raise P.CommandError(P.E_BAD_REQUEST, f"unknown command {cmd!r}")
    if not P.role_allows(caller.role, spec.role):
        log.warning("cmd %s key=%s role=%s name=%s -> E_FORBIDDEN", cmd, caller.key_id, caller.role, caller.name)
        raise P.CommandError(P.E_FORBIDDEN, f"{cmd} needs role {spec.role}; {caller.name} has {caller.role or 'no role'}")
    valid = P.validate_args(cmd, dict(args))
    try:
        result = port.handler.handle(cmd, valid, caller)
    except P.CommandError as exc:
        log.info("cmd %s key=%s name=%s -> %s", cmd, caller.key_id, caller.name, exc.code)
        raise
    if spec.role == P.ROLE_OPERATOR:
        log.info("cmd %s key=%s role=%s name=%s -> ok", cmd, caller.key_id, caller.role, caller.name)
    return result


def interface_fault(interface: str, message: str, *, state: str, active: bool,
                    retry_in_s: float | None = None) -> P.FaultBody:
    """The fault body of a plant interface: ``E_UNAVAILABLE``, no device, the daemon's
    current ``state`` (the service itself is not in FAULT), ``interface`` named."""
    # (STATES are the StateName values; E_UNAVAILABLE is an ErrorCode value)
    st = cast(P.StateName, state if state in P.STATES else P.STATE_IDLE)
    body = P.FaultBody(code=cast(P.ErrorCode, P.E_UNAVAILABLE), device=None, message=f"{interface}: {message}", state=st,
                       active=active, retry_in_s=None if retry_in_s is None else float(retry_in_s))
    out: dict[str, object] = dict(body)
    out.update(type="PlantInterface", interface=interface)
    return cast(P.FaultBody, out)  # the FaultBody's fields, and two more after them


def enabled_interfaces(cfg: Config) -> list[str]:
    """Names of the interfaces the configuration enables, in start order."""
    return [name for name in ("metrics", "mqtt", "opcua") if getattr(getattr(cfg, name, None), "enabled", False)]


class Plant:
    """The configured interfaces of one daemon: built (no I/O), started, fed events, stopped.

    Each adapter's start, events and stop are isolated: an exception is logged and published
    as that interface's fault, and the others go on.

    Attributes
    ----------
    adapters : list
        The enabled interfaces that could be built, in start order.
    faults : dict
        The latest fault body (raised or cleared) of each interface that had one.
    """

    def __init__(self, port: DaemonPort, cfg: Config) -> None:
        self.port = port
        self.adapters: list[Adapter] = []
        self._faults: dict[str, bool] = {}
        self.faults: dict[str, P.FaultBody] = {}
        self._lock = threading.Lock()
        for name in enabled_interfaces(cfg):
            try:
                self.adapters.append(_build(name, port, cfg, self.fault))
            except ImportError as exc:  # preflight says so before `cellcal run`; a harness may not
                log.error("%s interface not available: %s", name, exc)
                self.fault(name, f"not available: {exc}", active=True)

    def adapter(self, name: str) -> Adapter | None:
        """The adapter called ``name`` (tests, benchmarks), or None."""
        return next((a for a in self.adapters if a.name == name), None)

    def fault(self, interface: str, message: str, *, active: bool, retry_in_s: float | None = None) -> None:
        """Raise (``active``) or clear an interface's fault: logged, published on the daemon's
        fault topic and given to the other interfaces, once per change."""
        with self._lock:
            # One message per outage and one when it ends: not one per retry, no clearing of
            # a fault never raised.
            if self._faults.get(interface, False) == active:
                return
            self._faults[interface] = active
        (log.warning if active else log.info)("plant interface %s: %s%s", interface, "" if active else "cleared: ", message)
        try:
            state = str(self.port.status().get("state", P.STATE_IDLE))
        except Exception:  # noqa: BLE001 - the fault must go out even if the status cannot be read
            state = P.STATE_IDLE
        body = interface_fault(interface, message, state=state, active=active, retry_in_s=retry_in_s)
        self.faults[interface] = body
        try:
            self.port.publish_fault(body)
        except Exception:  # noqa: BLE001
            log.exception("plant: publishing the %s fault failed", interface)
        for a in self.adapters:
            if a.name != interface:
                self._deliver(a, P.TOPIC_FAULT, body)

    def on_event(self, topic: str, body: Mapping[str, object]) -> None:
        """The service's listener: every adapter gets the event (none may block)."""
        for a in self.adapters:
            self._deliver(a, topic, body)

    @staticmethod
    def _deliver(a: Adapter, topic: str, body: Mapping[str, object]) -> None:
        try:
            a.on_event(topic, body)
        except Exception:  # noqa: BLE001 - an interface must not break the daemon's emit
            log.exception("plant interface %s: event %s failed", a.name, topic)

    def start(self) -> None:
        """Start every adapter; one that fails stays down (fault raised), the others start."""
        for a in self.adapters:
            try:
                a.start()
            except Exception as exc:  # noqa: BLE001 - isolated by design
                log.exception("plant interface %s failed to start", a.name)
                self.fault(a.name, f"failed to start: {type(exc).__name__}: {exc}", active=True)

    def stop(self) -> None:
        """Stop every adapter, last started first (idempotent, never raises)."""
        for a in reversed(self.adapters):
            try:
                a.stop()
            except Exception:  # noqa: BLE001
                log.exception("plant interface %s failed to stop cleanly", a.name)


def _build(name: str, port: DaemonPort, cfg: Config, fault: FaultFn) -> Adapter:
    # Imported only when configured: each needs its optional package (an ImportError then).
    try:
        # Each adapter takes its own section ([opcua], [mqtt], [metrics]), the port and fault.
        make: Callable[[object, DaemonPort, FaultFn], Adapter] = load_backend(ADAPTERS, name, "plant interface")
    except ValueError:
        raise ValueError(f"no plant interface {name!r}") from None
    return make(getattr(cfg, name), port, fault)


def attach(svc: Service, cfg: Config, *, publish: Callable[[str, Mapping[str, object]], None] | None) -> Plant | None:
    """The configured interfaces of the daemon ``svc`` (not started), its listener added.

    ``publish``: the ZeroMQ server's ``publish(topic, body)`` (interface faults go out on
    it), or None. Returns None when no interface is enabled.
    """
    if not enabled_interfaces(cfg):
        return None

    def last_run() -> RunSummary | None:
        runs = svc.store.list_runs(limit=1)
        if not runs:
            return None
        r = runs[0]
        return RunSummary(run_id=str(r.id), kind=str(r.kind), status=str(getattr(r.status, "value", r.status)),
                          reason=str(r.status_reason or ""))

    def publish_fault(body: P.FaultBody) -> None:
        if publish is not None:
            publish(P.TOPIC_FAULT, body)

    port = DaemonPort(cell=cfg.service.name, boot_id=svc.boot_id, version=cellcal_version(),
                      motion_mode=cfg.capture.motion_mode, status=svc.status, handler=DaemonHandler(svc),
                      last_run=last_run, publish_fault=publish_fault)
    plant = Plant(port, cfg)
    svc.add_listener(plant.on_event)
    return plant
