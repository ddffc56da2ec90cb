"""What every device-kind base (robot, tracker) shares: lifecycle, deadlines, backend registry.

The convention (ADR 0008), as python-can's ``BusABC`` and ``can/interfaces`` have it:

* **One abstract base per device kind** (:class:`~cellcal.drivers.robot.RobotDriver`,
  :class:`~cellcal.drivers.tracker.TrackerDriver`), both :class:`DeviceDriver`. Its public
  methods own timeouts, validation and logging; a backend implements ``_..._internal``
  hooks only.
* **Deadlines**: a public method turns its ``timeout_s`` into one absolute deadline,
  ``time.monotonic()`` seconds (a float; :func:`deadline_after`), and hands that to every
  hook that may wait. Hooks never see relative timeouts or nanoseconds; what remains is
  :func:`remaining_s`. (Sample *stamps* stay ``time.monotonic_ns()`` integers: they are
  data, not deadlines.)
* **Lifecycle**: constructors do no I/O; ``open()`` connects and returns the driver itself,
  so ``with connect_robot(url).open() as robot:`` and ``with connect_robot(url) as robot:``
  both work; ``close()`` is idempotent and never raises.
* **Backends by name**: each kind keeps a ``BACKENDS`` dict, name -> ``"module:Class"``,
  and :func:`load_backend` imports the module only when that backend is asked for (a cell
  on RTDE never imports ``canopen``). The robot's backend name is its URL's scheme
  (``rtde://``, ``canopen://``); the tracker's is the ``backend=`` option (default
  ``"serial"``), because a tracker URL is pyserial's and its scheme names the transport
  (``socket://``, ``spy://``), not the protocol. Each backend class names itself in
  :attr:`DeviceDriver.backend`.
* **Construction from a URL**: :meth:`DeviceDriver.from_url` on every base; the
  ``connect_<kind>(url, **options)`` functions look the backend up and call it.
"""

from __future__ import annotations

import abc
import importlib
import time
from collections.abc import Mapping
from typing import Any, ClassVar, Self

__all__ = ["DeviceDriver", "deadline_after", "remaining_s", "load_backend"]


def deadline_after(timeout_s: float) -> float:
    """The absolute deadline ``timeout_s`` seconds from now, on ``time.monotonic()``."""
    return time.monotonic() + float(timeout_s)


def remaining_s(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic()`` seconds); <= 0 once passed."""
    return deadline - time.monotonic()


def load_backend(backends: Mapping[str, str | type[Any]], name: str, what: str) -> type[Any]:
    """The backend class registered as ``name``, importing its module on first use.

    Parameters
    ----------
    backends : mapping
        The kind's registry, name -> ``"module:Class"`` (or the class itself, for a backend
        that is imported anyway).
    name : str
        Backend name (a robot URL's scheme, the tracker's ``backend=``).
    what : str
        What ``name`` is, for the message (``"robot URL scheme"``, ``"tracker backend"``).

    Raises
    ------
    ValueError
        ``name`` is not registered (the message lists the known names).
    """
    spec = backends.get(name)
    if spec is None:
        raise ValueError(f"{what} {name!r} unknown; known: {', '.join(sorted(backends))}")
    if isinstance(spec, type):  # registered already imported
        return spec
    module, _, cls = spec.partition(":")
    return getattr(importlib.import_module(module), cls)


class DeviceDriver(abc.ABC):
    """Base of every device-kind base: the lifecycle and construction every driver shares.

    A driver is built without I/O (:meth:`from_url` or its constructor), then :meth:`open`
    (or ``with``), used, and :meth:`close`.
    """

    #: The name the backend is registered under in its kind's ``BACKENDS``.
    backend: ClassVar[str] = ""

    @classmethod
    @abc.abstractmethod
    def from_url(cls, url: Any, /, **options: Any) -> Self:
        """A driver for ``url`` with ``options``, not connected (no I/O).

        Raises
        ------
        ValueError
            A malformed URL or an unknown or malformed option, named.
        """

    @abc.abstractmethod
    def open(self) -> Self:
        """Connect and configure the device (idempotent); returns the driver itself."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the device (idempotent, never raises)."""

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()
