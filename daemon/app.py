"""The daemon assembled: store + service + ZeroMQ server, built and torn down in one place.

:class:`App` is what ``cellcal run``, ``cellcal demo``, the in-process test cell
(``cellcal.testing.harness``) and the benchmarks run. Construction does no I/O; entering
it (``with App(cfg) as app:``, or :meth:`App.open`) opens the store, starts the service's
worker (which resumes unfinished runs), binds the ZeroMQ sockets and, with
``supervise=True``, runs the supervising loop (:meth:`Service.serve`) in a thread; leaving
it undoes exactly what was done, in reverse order, also when a step failed half way
(``contextlib.ExitStack``):

1. the supervising loop is asked to stop and joined;
2. the service stops its worker after the current transaction and closes the devices;
3. the ZeroMQ server closes its sockets (after the service, so the worker's last
   messages still go out);
4. the store is closed;
5. the state directory's lock file (``Service.lock``, taken first: one daemon per state
   directory) is released.

Without pyzmq installed (a build without the transport) the app runs without the server.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cellcal.daemon import plant
from cellcal.daemon.config import Config
from cellcal.daemon.sdnotify import Notifier
from cellcal.daemon.service import Listener, Service
from cellcal.daemon.store import Store

try:
    from cellcal.daemon import zmq_glue
except ImportError:  # the ZeroMQ transport (pyzmq) is not installed in this build
    zmq_glue = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from cellcal.daemon.wire.zmq_server import ZmqServer

log = logging.getLogger(__name__)

__all__ = ["App"]


class App:
    """The daemon's parts, wired; a context manager that starts and stops them.

    Parameters
    ----------
    cfg : Config
        Loaded configuration.
    notifier : object, optional
        systemd notifier (``cellcal.daemon.sdnotify.Notifier``).
    listeners : iterable of callable(topic, body), optional
        Added to the service before it starts, so they see every event (the demo's
        progress lines, the tests' recorders).
    zmq : bool
        Build the ZeroMQ server (default; skipped when pyzmq is not installed).
    validate_bodies : bool
        The server checks every published body against the protocol (tests).
    supervise : bool
        Run :meth:`Service.serve` in a thread while the app is open (the demo, tests,
        benchmarks). ``cellcal run`` calls ``app.service.serve()`` on its main thread instead.
    shutdown_timeout_s : float
        How long closing waits for the worker's current step.

    Attributes
    ----------
    store : Store
    service : Service
    server : ZmqServer or None
    plant : cellcal.daemon.plant.Plant or None
        The enabled plant interfaces (None when no section enables one).
    """

    def __init__(self, cfg: Config, *, notifier: Notifier | None = None, listeners: Iterable[Listener] = (),
                 zmq: bool = True, validate_bodies: bool = False, supervise: bool = False,
                 shutdown_timeout_s: float = 30.0) -> None:
        self.cfg = cfg
        self.store = Store(cfg.service.state_dir)
        self.service = Service(cfg, store=self.store, notifier=notifier)
        for fn in listeners:
            self.service.add_listener(fn)
        self.server: ZmqServer | None = None
        if zmq:
            if zmq_glue is None:
                log.warning("pyzmq is not installed: running without the ZeroMQ interface")
            else:
                self.server = zmq_glue.attach(self.service, cfg, validate_bodies=validate_bodies)
        # Plant interfaces (OPC UA, MQTT, Prometheus; cellcal.daemon.plant): built only when a
        # section enables one, fed by a listener; each one's failure stays its own.
        self.plant = plant.attach(self.service, cfg, publish=self.server.publish if self.server is not None else None)
        self._supervise = supervise
        self._shutdown_timeout_s = shutdown_timeout_s
        self._stack = contextlib.ExitStack()
        self._loop: threading.Thread | None = None

    def open(self) -> App:
        """Start everything (see the module docstring); on failure undo what was started and raise."""
        with contextlib.ExitStack() as stack:
            # One daemon per state directory, decided before the store is touched.
            self.service.lock.acquire()
            stack.callback(self.service.lock.release)
            self.store.open()
            stack.callback(self.store.close)
            if self.server is not None:
                stack.callback(self.server.stop)  # after the service's shutdown (LIFO): its last words go out
            if self.plant is not None:
                stack.callback(self.plant.stop)  # likewise: the plant interfaces see the service's last events
            self.service.start()
            stack.callback(self.service.shutdown, self._shutdown_timeout_s)
            if self.server is not None:
                self.server.start()
            if self.plant is not None:
                self.plant.start()  # never raises: an interface that cannot start is a published fault
            if self._supervise:
                self._loop = threading.Thread(target=self.service.serve, name="cellcal-supervisor", daemon=True)
                self._loop.start()
                stack.callback(self._stop_loop)
            self._stack = stack.pop_all()
        return self

    def _stop_loop(self) -> None:
        self.service.request_stop()
        if self._loop is not None:
            self._loop.join(timeout=10.0)
            if self._loop.is_alive():
                log.warning("the supervising loop did not stop within 10 s")

    def close(self) -> None:
        """Stop everything that :meth:`open` started, in reverse order (idempotent)."""
        self._stack.close()

    def __enter__(self) -> App:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
