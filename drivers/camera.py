"""Cameras: the device abstraction every camera backend implements, and ``connect_camera``.

``connect_camera(url, **options)`` picks a backend by the URL's scheme from :data:`BACKENDS`
(imported lazily, as the robot's and tracker's are, ADR 0008):

* ``gige://<ipv4>[:port][?key=value&...]``: a GigE Vision camera opened **by its address**
  (never by a discovery broadcast), :mod:`cellcal.drivers.gige`, ``docs/protocols/gige.md``;
* ``dir://<folder>``: recorded frames replayed with their metadata,
  :mod:`cellcal.drivers.camera_dir`, ``docs/protocols/camera-dir.md``.

:func:`parse_camera_url` is the one URL parser; ``check-config`` calls it too.

The public methods of :class:`CameraDriver` own deadlines, argument validation, locking and
logging; a backend implements the ``_..._internal`` hooks, each given one absolute deadline
(``time.monotonic()`` seconds). Units are SI at this API: exposure in seconds, gain in dB
(the GenICam features' microseconds are converted by the backend).

**Time of a frame.** :attr:`Frame.t_host_ns` is the host ``time.monotonic_ns()`` of the
*middle of the exposure*, mapped from the device's own timestamp through a clock model
(:mod:`cellcal.drivers.clock`), not the time the frame arrived: a frame arrives an exposure,
a readout and a transfer later, and that delay is what turns into millimetres when the robot
moves (seed 001, section 06).
"""

from __future__ import annotations

import abc
import ipaddress
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self
from urllib.parse import parse_qsl, unquote

import numpy as np

from cellcal.drivers.base import DeviceDriver, deadline_after, load_backend
from cellcal.drivers.errors import DeviceError, DriverError, DriverTimeoutError

__all__ = [
    "BACKENDS",
    "CameraDriver",
    "CameraInfo",
    "CameraUrl",
    "Frame",
    "RawFrame",
    "TriggerMode",
    "CameraTimeoutError",
    "CameraDeviceError",
    "FeatureUnavailableError",
    "connect_camera",
    "parse_camera_url",
]

log = logging.getLogger(__name__)

#: URL scheme -> ``"module:Class"``, imported on first use.
BACKENDS: dict[str, str] = {
    "gige": "cellcal.drivers.gige:GigeCameraDriver",
    "dir": "cellcal.drivers.camera_dir:DirCameraDriver",
}

#: Longest exposure the API accepts (s): longer is a configuration mistake, not a camera.
MAX_EXPOSURE_S = 60.0


class CameraTimeoutError(DriverTimeoutError):
    """No (complete) frame or no answer before the deadline; also a ``TimeoutError``."""


class CameraDeviceError(DeviceError):
    """The camera refused a request; ``code`` is its status by name (GVCP ``ACCESS_DENIED``...)."""


class FeatureUnavailableError(DriverError):
    """The camera has no feature for what was asked (no dB gain, no software trigger), or
    the backend cannot change it (a recording); the message names the feature."""


class TriggerMode:
    """Trigger modes by name: free-running, or one frame per :meth:`CameraDriver.trigger`."""

    OFF = "off"
    SOFTWARE = "software"
    ALL = (OFF, SOFTWARE)


@dataclass(frozen=True)
class CameraUrl:
    """A parsed camera URL.

    ``host``/``port`` for ``gige`` (``port`` 3956 unless given), ``path`` for ``dir``;
    ``query`` holds the ``key=value`` options, percent-decoded.
    """

    scheme: str
    host: str = ""
    port: int = 0
    path: str = ""
    query: Mapping[str, str] = field(default_factory=dict)


def parse_camera_url(url: str) -> CameraUrl:
    """Split and check a camera URL; the one parser the driver and ``check-config`` share.

    Raises
    ------
    ValueError
        Naming the part that is wrong: the scheme (unknown: the known ones are listed), the
        host (``gige`` takes an IPv4 address only, never a name that would need resolving,
        never ``0.0.0.0`` or a broadcast address), the port, the path, or a query key given
        twice.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"camera URL {url!r}: expected scheme://target[?key=value&...]")
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in BACKENDS:
        raise ValueError(f"camera URL {url!r}: scheme {scheme!r} unknown; known: {', '.join(sorted(BACKENDS))}")
    target, _, qs = rest.partition("?")
    query: dict[str, str] = {}
    for key, value in parse_qsl(qs, keep_blank_values=True):
        if key in query:
            raise ValueError(f"camera URL {url!r}: query key {key!r} given twice")
        query[key] = value
    if scheme == "dir":
        path = unquote(target)
        if not path:
            raise ValueError(f"camera URL {url!r}: path: missing folder")
        return CameraUrl(scheme, path=path, query=query)
    from cellcal.drivers.gige_codec import GVCP_PORT

    host, sep, port_s = unquote(target).rstrip("/").partition(":")
    if not host:
        raise ValueError(f"camera URL {url!r}: host: missing IPv4 address")
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise ValueError(f"camera URL {url!r}: host {host!r} is not an IPv4 address "
                         "(a GigE Vision camera is opened by its address)") from None
    if addr.is_unspecified or addr == ipaddress.IPv4Address("255.255.255.255") or addr.is_multicast:
        raise ValueError(f"camera URL {url!r}: host {host} is not one device's address")
    port = GVCP_PORT
    if sep:
        try:
            port = int(port_s)
        except ValueError:
            raise ValueError(f"camera URL {url!r}: port {port_s!r} is not a number") from None
        if not 1 <= port <= 65535:
            raise ValueError(f"camera URL {url!r}: port {port} outside 1..65535")
    return CameraUrl(scheme, host=str(addr), port=port, query=query)


@dataclass(frozen=True)
class CameraInfo:
    """What a camera says it is.

    Attributes
    ----------
    vendor, model, serial, firmware : str
        As the device reports them (GigE Vision bootstrap strings; a recording's metadata).
    user_name : str
        The device's user-defined name, if any.
    address : str
        Where it was opened (``"127.0.0.1:3956"``, a folder).
    backend : str
        The backend name (the URL scheme).
    """

    vendor: str
    model: str
    serial: str
    firmware: str
    user_name: str = ""
    address: str = ""
    backend: str = ""


@dataclass(frozen=True, eq=False)
class RawFrame:
    """What a backend hands the base: the image and the device's own account of it.

    ``t_device_s`` is mid-exposure on the device clock (s); ``t_host_ns`` the same instant
    mapped to the host, with ``t_host_uncertainty_ns`` its bound.
    """

    image: np.ndarray
    pixel_format: str
    frame_id: int
    device_timestamp: int
    tick_frequency_hz: float
    t_device_s: float
    t_host_ns: int
    t_host_uncertainty_ns: float
    t_received_ns: int
    exposure_s: float | None
    gain_db: float | None


@dataclass(frozen=True, eq=False)
class Frame:
    """One complete camera frame.

    Attributes
    ----------
    image : numpy.ndarray, shape (H, W) uint8 or uint16, or (H, W, 3) uint8
        Pixel rows top to bottom (read-only). Bayer formats stay (H, W) mosaics; RGB8/BGR8
        are (H, W, 3) in the wire's channel order.
    pixel_format : str
        GenICam PFNC name (``"Mono8"``, ``"Mono16"``, ``"BayerRG8"``, ``"RGB8"``...).
    frame_id : int
        The device's block id (GigE Vision: 1..65535 wrapping, or 64-bit extended ids);
        a recording's stored id.
    device_timestamp : int
        The device's timestamp of the frame, in ticks (the GVSP leader's).
    tick_frequency_hz : float
        Ticks per second of ``device_timestamp``.
    t_device_s : float
        Mid-exposure on the device clock, seconds.
    t_host_ns : int
        Mid-exposure on the host's ``time.monotonic_ns()``, through the clock model.
    t_host_uncertainty_ns : float
        The clock model's bound on ``t_host_ns``.
    t_received_ns : int
        Host ``time.monotonic_ns()`` at which the frame's last packet arrived (for a
        recording: as recorded).
    exposure_s : float or None
        Exposure actually applied (s), as the device reports it; None if it does not.
    gain_db : float or None
        Gain actually applied (dB); None if the device has no gain in dB.
    """

    image: np.ndarray
    pixel_format: str
    frame_id: int
    device_timestamp: int
    tick_frequency_hz: float
    t_device_s: float
    t_host_ns: int
    t_host_uncertainty_ns: float
    t_received_ns: int
    exposure_s: float | None
    gain_db: float | None

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def t_exposure_start_ns(self) -> int:
        """Host time the exposure began (mid-exposure less half the exposure)."""
        half = 0.0 if self.exposure_s is None else 0.5 * self.exposure_s
        return self.t_host_ns - round(half * 1e9)


class CameraDriver(DeviceDriver):
    """A camera. Construct without I/O (:func:`connect_camera`), :meth:`open`, use, :meth:`close`.

    Parameters
    ----------
    timeout_s : float
        Default deadline of a request (a feature read or write) and the margin a
        :meth:`grab` adds to the exposure.
    """

    #: Whether frames come from a device now (False: a recording, whose stamps are history
    #: and whose settings cannot change).
    live: ClassVar[bool] = True

    def __init__(self, *, timeout_s: float = 1.0) -> None:
        if not (isinstance(timeout_s, int | float) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._lock = threading.RLock()
        self._open = False
        self._info: CameraInfo | None = None
        self._trigger = TriggerMode.OFF
        self._acquiring = False

    # -- construction and lifecycle ----------------------------------------------------------
    @classmethod
    def from_url(cls, url: str | CameraUrl, /, **options: Any) -> Self:
        """A driver of this backend for ``url``, not connected (no I/O).

        Raises
        ------
        ValueError
            A malformed URL, a URL of another backend's scheme, an unknown or bad option.
        """
        parsed = url if isinstance(url, CameraUrl) else parse_camera_url(url)
        if cls.backend and parsed.scheme != cls.backend:
            raise ValueError(f"{cls.__name__} serves {cls.backend}:// URLs, not {parsed.scheme}://")
        return cls._from_url_internal(parsed, options)

    def open(self) -> Self:
        """Connect, identify the device and read its settings (idempotent); returns self.

        Raises
        ------
        DriverInitError
            The device does not answer, refuses control, or cannot be described.
        """
        with self._lock:
            if self._open:
                return self
            self._info = self._open_internal(deadline_after(self._open_budget_s()))
            self._open = True
            log.info("%s: opened %s %s (serial %s, firmware %s)", self, self._info.vendor,
                     self._info.model, self._info.serial, self._info.firmware)
            return self

    def close(self) -> None:
        """Stop acquisition and release the device (idempotent, never raises)."""
        with self._lock:
            was_open, self._open, self._acquiring = self._open, False, False
            if was_open:
                try:
                    self._close_internal()
                except Exception:  # noqa: BLE001 - close must not raise; say what happened
                    log.warning("%s: error while closing", self, exc_info=True)

    @property
    def is_open(self) -> bool:
        return self._open

    def info(self) -> CameraInfo:
        """Vendor, model, serial and firmware as the device reported them on :meth:`open`."""
        self._require_open()
        assert self._info is not None
        return self._info

    # -- settings -----------------------------------------------------------------------------
    def get_exposure_s(self, *, timeout_s: float | None = None) -> float:
        """The exposure the device applies now (s)."""
        with self._lock:
            self._require_open()
            return float(self._get_exposure_internal(self._deadline(timeout_s)))

    def set_exposure_s(self, exposure_s: float, *, timeout_s: float | None = None) -> float:
        """Ask for ``exposure_s`` seconds; returns what the device applied (it may quantise)."""
        x = _positive("exposure_s", exposure_s, MAX_EXPOSURE_S)
        with self._lock:
            self._require_open()
            applied = float(self._set_exposure_internal(x, self._deadline(timeout_s)))
            log.debug("%s: exposure %.6g s asked, %.6g s applied", self, x, applied)
            return applied

    def get_gain_db(self, *, timeout_s: float | None = None) -> float:
        """The gain the device applies now (dB)."""
        with self._lock:
            self._require_open()
            return float(self._get_gain_internal(self._deadline(timeout_s)))

    def set_gain_db(self, gain_db: float, *, timeout_s: float | None = None) -> float:
        """Ask for ``gain_db``; returns what the device applied."""
        if isinstance(gain_db, bool) or not isinstance(gain_db, int | float) or not math.isfinite(gain_db):
            raise ValueError(f"gain_db must be a finite number, got {gain_db!r}")
        with self._lock:
            self._require_open()
            applied = float(self._set_gain_internal(float(gain_db), self._deadline(timeout_s)))
            log.debug("%s: gain %.4g dB asked, %.4g dB applied", self, gain_db, applied)
            return applied

    def get_pixel_format(self, *, timeout_s: float | None = None) -> str:
        with self._lock:
            self._require_open()
            return str(self._get_pixel_format_internal(self._deadline(timeout_s)))

    def set_pixel_format(self, name: str, *, timeout_s: float | None = None) -> None:
        """Select a PFNC pixel format by name (``"Mono8"``, ``"Mono16"``...), while not acquiring."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"pixel format must be a name, got {name!r}")
        with self._lock:
            self._require_open()
            if self._acquiring:
                raise ValueError(f"{self}: stop acquisition before changing the pixel format")
            self._set_pixel_format_internal(name, self._deadline(timeout_s))

    @property
    def trigger_mode(self) -> str:
        return self._trigger

    def set_trigger_mode(self, mode: str, *, timeout_s: float | None = None) -> None:
        """``"off"`` (free-running) or ``"software"`` (one frame per :meth:`trigger`)."""
        if mode not in TriggerMode.ALL:
            raise ValueError(f"trigger mode must be one of {', '.join(TriggerMode.ALL)}, got {mode!r}")
        with self._lock:
            self._require_open()
            self._set_trigger_internal(mode, self._deadline(timeout_s))
            self._trigger = mode

    def trigger(self, *, timeout_s: float | None = None) -> None:
        """Fire one software trigger (trigger mode ``"software"``, acquiring)."""
        with self._lock:
            self._require_open()
            if self._trigger != TriggerMode.SOFTWARE:
                raise ValueError(f"{self}: trigger() needs trigger mode 'software', not {self._trigger!r}")
            self._ensure_acquiring(self._deadline(timeout_s))
            self._trigger_internal(self._deadline(timeout_s))

    # -- generic feature access ----------------------------------------------------------------
    def get_feature(self, name: str, *, timeout_s: float | None = None) -> Any:
        """Any feature of the device by its GenICam name (for what the typed methods lack)."""
        with self._lock:
            self._require_open()
            return self._get_feature_internal(str(name), self._deadline(timeout_s))

    def set_feature(self, name: str, value: Any, *, timeout_s: float | None = None) -> None:
        with self._lock:
            self._require_open()
            self._set_feature_internal(str(name), value, self._deadline(timeout_s))

    def execute(self, name: str, *, timeout_s: float | None = None) -> None:
        """Run a GenICam command feature."""
        with self._lock:
            self._require_open()
            self._execute_internal(str(name), self._deadline(timeout_s))

    # -- acquisition ---------------------------------------------------------------------------
    @property
    def acquiring(self) -> bool:
        return self._acquiring

    def start(self, *, timeout_s: float | None = None) -> None:
        """Start acquisition (idempotent); :meth:`grab` starts it too."""
        with self._lock:
            self._require_open()
            self._ensure_acquiring(self._deadline(timeout_s))

    def stop(self, *, timeout_s: float | None = None) -> None:
        """Stop acquisition (idempotent); frames not yet grabbed are dropped."""
        with self._lock:
            self._require_open()
            if self._acquiring:
                self._acquiring = False
                self._stop_internal(self._deadline(timeout_s))

    def grab(self, timeout_s: float | None = None, *, after_ns: int | None = None) -> Frame:
        """The next complete frame whose exposure began at or after ``after_ns``.

        Parameters
        ----------
        timeout_s : float, optional
            Deadline; defaults to the driver's ``timeout_s`` plus the current exposure.
        after_ns : int, optional
            Host ``time.monotonic_ns()``: frames exposed (begun) earlier are skipped. For a
            live camera it defaults to the time of the call, so a frame exposed before the
            robot settled is never returned; pass an earlier time to accept a queued one.
            A recording ignores it and replays in order.

        In trigger mode ``"software"`` the frames still queued are dropped, a trigger is fired
        and its frame returned (``after_ns`` does not apply: the trigger was sent after the
        call). Incomplete frames are never returned (the backend counts and drops them).

        Raises
        ------
        CameraTimeoutError
            No such frame before the deadline (also a ``TimeoutError``).
        """
        t_call = time.monotonic_ns()
        if after_ns is None:
            after_ns = t_call
        with self._lock:
            self._require_open()
            deadline = self._deadline(timeout_s, extra_s=self._grab_budget_s())
            self._ensure_acquiring(deadline)
            triggered = self._trigger == TriggerMode.SOFTWARE
            if triggered:
                # the frame of this trigger is the next one: drop any left from earlier ones
                self._discard_queued_internal()
                self._trigger_internal(deadline)
            while True:
                raw = self._grab_internal(deadline)
                began_ns = raw.t_host_ns - round(0.5 * (raw.exposure_s or 0.0) * 1e9)
                if self.live and not triggered and began_ns < after_ns - raw.t_host_uncertainty_ns:
                    log.debug("%s: frame %d exposed before %d, skipped", self, raw.frame_id, after_ns)
                    continue
                image = raw.image
                image.flags.writeable = False
                return Frame(
                    image=image, pixel_format=raw.pixel_format, frame_id=raw.frame_id,
                    device_timestamp=raw.device_timestamp, tick_frequency_hz=raw.tick_frequency_hz,
                    t_device_s=raw.t_device_s, t_host_ns=raw.t_host_ns,
                    t_host_uncertainty_ns=raw.t_host_uncertainty_ns, t_received_ns=raw.t_received_ns,
                    exposure_s=raw.exposure_s, gain_db=raw.gain_db,
                )

    # -- backend hooks (every deadline absolute, time.monotonic() seconds) -------------------------
    @classmethod
    def _from_url_internal(cls, url: CameraUrl, options: Mapping[str, Any]) -> Self:
        raise NotImplementedError(f"{cls.__name__} cannot be built from a URL")

    @abc.abstractmethod
    def _open_internal(self, deadline: float) -> CameraInfo:
        """Connect, take control, describe the device; return its identity."""

    @abc.abstractmethod
    def _close_internal(self) -> None:
        """Stop streaming, release control, close sockets."""

    @abc.abstractmethod
    def _get_exposure_internal(self, deadline: float) -> float: ...

    @abc.abstractmethod
    def _set_exposure_internal(self, exposure_s: float, deadline: float) -> float: ...

    @abc.abstractmethod
    def _get_gain_internal(self, deadline: float) -> float: ...

    @abc.abstractmethod
    def _set_gain_internal(self, gain_db: float, deadline: float) -> float: ...

    @abc.abstractmethod
    def _get_pixel_format_internal(self, deadline: float) -> str: ...

    @abc.abstractmethod
    def _set_pixel_format_internal(self, name: str, deadline: float) -> None: ...

    @abc.abstractmethod
    def _set_trigger_internal(self, mode: str, deadline: float) -> None: ...

    @abc.abstractmethod
    def _trigger_internal(self, deadline: float) -> None: ...

    @abc.abstractmethod
    def _start_internal(self, deadline: float) -> None: ...

    @abc.abstractmethod
    def _stop_internal(self, deadline: float) -> None: ...

    @abc.abstractmethod
    def _grab_internal(self, deadline: float) -> RawFrame:
        """The next complete frame (raise :class:`CameraTimeoutError` at the deadline)."""

    def _discard_queued_internal(self) -> None:
        """Drop complete frames not yet grabbed (before a software trigger)."""

    def _get_feature_internal(self, name: str, deadline: float) -> Any:
        raise FeatureUnavailableError(f"{self}: no feature access by name ({name!r})")

    def _set_feature_internal(self, name: str, value: Any, deadline: float) -> None:
        raise FeatureUnavailableError(f"{self}: no feature access by name ({name!r})")

    def _execute_internal(self, name: str, deadline: float) -> None:
        raise FeatureUnavailableError(f"{self}: no feature access by name ({name!r})")

    def _open_budget_s(self) -> float:
        """Seconds :meth:`open` allows (a backend reading a large XML adds to it)."""
        return self.timeout_s * 10

    def _grab_budget_s(self) -> float:
        """Seconds a grab may take beyond ``timeout_s`` (the exposure and a frame period)."""
        return 0.0

    # -- internals -----------------------------------------------------------------------------
    def _require_open(self) -> None:
        if not self._open:
            raise DriverError(f"{self}: not open (call open() or use it as a context manager)")

    def _deadline(self, timeout_s: float | None, extra_s: float = 0.0) -> float:
        t = self.timeout_s if timeout_s is None else float(timeout_s)
        if not t > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        return deadline_after(t + extra_s)

    def _ensure_acquiring(self, deadline: float) -> None:
        if not self._acquiring:
            self._start_internal(deadline)
            self._acquiring = True


def _positive(what: str, value: Any, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    if not 0 < value <= hi:
        raise ValueError(f"{what} must be in (0, {hi}], got {value!r}")
    return float(value)


def connect_camera(url: str, **options: Any) -> CameraDriver:
    """A camera driver for ``url``, not yet connected (no I/O until ``open()``/``with``).

    Parameters
    ----------
    url : str
        ``gige://<ipv4>[:port][?key=value...]`` or ``dir://<folder>``.
    **options
        Backend options (they win over the URL's query keys); unknown ones are rejected by
        name.

    Examples
    --------
    >>> with connect_camera("gige://127.0.0.1") as cam:  # doctest: +SKIP
    ...     frame = cam.grab(timeout_s=2.0)
    """
    parsed = parse_camera_url(url)
    cls: type[CameraDriver] = load_backend(BACKENDS, parsed.scheme, "camera URL scheme")
    return cls.from_url(parsed, **options)
