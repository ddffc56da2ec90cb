"""GigE Vision camera backend: GVCP control, GVSP stream, GenICam features (``gige://``).

Our own client on our own codec (:mod:`cellcal.drivers.gige_codec`, ADR 0020), proven
against Aravis's fake camera (``tests/test_gige_aravis.py``). ``docs/protocols/gige.md``
is the reference for what is implemented; in short:

* **Opened by address only**: ``gige://127.0.0.1`` sends to that address and nowhere else.
  There is no discovery (a broadcast by design of the standard) anywhere in this module.
* **Control channel**: one UDP socket connected to the device's GVCP port (the kernel then
  drops datagrams from any other source). :meth:`open` takes control privilege (CCP),
  writes the heartbeat timeout, and a heartbeat thread reads CCP every third of it (the
  read keeps the session alive and shows whether control was lost); :meth:`close` releases
  control.
* **Stream**: a UDP socket bound to the host address the kernel routes to the device (a
  loopback address for a device on loopback; never ``0.0.0.0``), written into the device's
  stream-channel destination registers. A receiver thread reassembles leader, payload and
  trailer packets; a frame missing any packet, or whose size disagrees with its leader, is
  counted in :attr:`GigeCameraDriver.frames_incomplete` and dropped, never returned.
* **Clock**: the device timestamp (ticks at the bootstrap tick frequency) is mapped to host
  ``time.monotonic_ns()`` by latching it (timestamp control register) inside a GVCP round
  trip: an NTP-like exchange (:class:`~cellcal.drivers.clock.ExchangeClockModel`) repeated on
  every heartbeat. A device whose latch does not move (Aravis's fake camera) falls back to
  the stream: leader timestamps against their arrival (lower envelope,
  :class:`~cellcal.drivers.clock.StreamClockModel`), which reads late by the device's
  exposure-to-leader delay; the frame's ``t_host_uncertainty_ns`` says which bound applies.
"""

from __future__ import annotations

import collections
import ipaddress
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Self

from cellcal.drivers import gige_codec as gc
from cellcal.drivers.base import remaining_s
from cellcal.drivers.camera import (
    CameraDeviceError,
    CameraDriver,
    CameraInfo,
    CameraTimeoutError,
    CameraUrl,
    FeatureUnavailableError,
    RawFrame,
    TriggerMode,
)
from cellcal.drivers.clock import ClockNotReady, ExchangeClockModel, StreamClockModel
from cellcal.drivers.errors import DeviceGoneError, DriverInitError
from cellcal.drivers.genicam import (
    FeatureAccessError,
    FeatureNotFoundError,
    GenicamError,
    NodeMap,
    parse_xml_url,
    xml_from_bytes,
)
from cellcal.drivers.gige_link import CompleteFrame, FrameAssembler, GvcpClient, GvcpPort, image_from_payload
from cellcal.drivers.robot import OptionSpec, merge_options, opt_bool, opt_float, opt_int

__all__ = ["GigeCameraDriver", "OPTIONS"]

log = logging.getLogger(__name__)

_NS_PER_S = 1_000_000_000
#: How long the receiver thread blocks in one recv (it re-checks its stop flag between).
_RECV_POLL_S = 0.1
#: Stream socket receive buffer asked for (the kernel may cap it at net.core.rmem_max).
_RCVBUF_BYTES = 8 * 1024 * 1024


def _opt_choice(*choices: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = str(v).strip().lower()
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return s

    return parse


#: ``gige://`` options (URL query keys or keyword options; keyword wins).
OPTIONS: dict[str, OptionSpec] = {
    "timeout_s": OptionSpec(opt_float(positive=True), 1.0, "deadline of one request (s)"),
    "ack_timeout_s": OptionSpec(opt_float(1e-3, 10.0), 0.2, "wait for one GVCP acknowledge before repeating (s)"),
    "retries": OptionSpec(opt_int(0, 10), 3, "times a GVCP command is repeated after no acknowledge"),
    "heartbeat_timeout_s": OptionSpec(opt_float(0.5, 60.0), 3.0, "heartbeat timeout written to the device (s)"),
    "exclusive": OptionSpec(opt_bool, False, "take exclusive (not only control) privilege"),
    "packet_size": OptionSpec(opt_int(0, 65500), 0, "GVSP packet size to write (bytes, with IP/UDP); 0 keeps the device's"),
    "clock": OptionSpec(_opt_choice("auto", "latch", "stream"), "auto", "how the device clock is mapped"),
    "clock_sync_s": OptionSpec(opt_float(0.02, 10.0), 0.25, "interval of the timestamp-latch exchanges (s)"),
    "max_drift_ppm": OptionSpec(opt_float(0.0, 1e4), 100.0,
                                "bound on the device clock's rate error while it is not yet fitted (ppm)"),
    "timestamp_marks": OptionSpec(_opt_choice("exposure_start", "exposure_end"), "exposure_start",
                                  "what instant the leader's timestamp marks"),
    "queue_frames": OptionSpec(opt_int(1, 64), 4, "complete frames kept for grab (oldest dropped)"),
    "chunks": OptionSpec(opt_bool, True, "ask for the exposure and gain of each frame as chunk data, if the device has them"),
    "stream_port": OptionSpec(opt_int(0, 65535), 0, "host UDP port for the stream (0: any free one)"),
}


def _unit_scale(unit: str) -> float:
    """Seconds per unit of an exposure feature (SFNC: microseconds where no unit is given)."""
    return {"s": 1.0, "ms": 1e-3, "ns": 1e-9}.get(unit.strip().lower(), 1e-6)


# -- the driver ------------------------------------------------------------------------------


class GigeCameraDriver(CameraDriver):
    """A GigE Vision camera at an IPv4 address (``gige://<ipv4>[:port]``).

    Parameters
    ----------
    host : str
        The device's IPv4 address (never resolved, never broadcast to).
    port : int
        Its GVCP port (3956; Aravis's fake camera and ours serve there).
    **options
        :data:`OPTIONS`.

    Attributes
    ----------
    frames_completed, frames_incomplete, frames_overwritten : int
        Frames reassembled; given up for a missing packet or a size that disagrees with the
        leader; dropped unread because :attr:`queue_frames` newer ones were waiting.
    nodes : NodeMap
        The device's GenICam node map (after :meth:`open`).
    clock : ExchangeClockModel or StreamClockModel
        The device-to-host clock model in use; :attr:`clock_source` says which.
    """

    backend = "gige"

    def __init__(self, host: str, port: int = gc.GVCP_PORT, **options: Any) -> None:
        opts = merge_options(OPTIONS, {}, options, f"gige://{host}:{port}")
        super().__init__(timeout_s=opts["timeout_s"])
        self.host, self.port = str(ipaddress.IPv4Address(host)), int(port)
        self.options = opts
        self.queue_frames = int(opts["queue_frames"])
        self.nodes: NodeMap | None = None
        self.clock: ExchangeClockModel | StreamClockModel = ExchangeClockModel()
        self.clock_source = ""
        self.tick_frequency_hz = 0.0
        self.frames_completed = self.frames_incomplete = self.frames_overwritten = 0
        self.bad_packets = 0
        self._client: GvcpClient | None = None
        self._port_access: GvcpPort | None = None
        self._stream: socket.socket | None = None
        self._frames: collections.deque[CompleteFrame] = collections.deque(maxlen=self.queue_frames)
        self._frames_cv = threading.Condition()
        self._clock_lock = threading.Lock()
        self._stop_threads = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tick_epoch = 0
        self._last_sync_ns = 0
        self._sync_hosts: collections.deque[int] = collections.deque(maxlen=32)
        self._gone = ""
        self._have_control = False
        self._exposure_s: float | None = None
        self._gain_db: float | None = None
        self._exposure_feature = ""
        self._chunk_features: tuple[str, ...] = ()

    @classmethod
    def _from_url_internal(cls, url: CameraUrl, options: Mapping[str, Any]) -> Self:
        merged = dict(merge_options(OPTIONS, url.query, options, f"gige://{url.host}:{url.port}"))
        return cls(url.host, url.port, **merged)

    def __repr__(self) -> str:
        return f"GigeCameraDriver('{self.host}:{self.port}')"

    # -- lifecycle ---------------------------------------------------------------------------
    def _open_internal(self, deadline: float) -> CameraInfo:
        client = GvcpClient(self.host, self.port, ack_timeout_s=self.options["ack_timeout_s"],
                            retries=self.options["retries"])
        try:
            client.open()
        except PermissionError as exc:
            # EACCES from the UDP connect (nothing is sent): the address is a broadcast one of a
            # local network (a subnet's .255, loopback's 127.255.255.255), which the URL check
            # cannot know and the kernel refuses to a socket without SO_BROADCAST (never set here)
            raise DriverInitError(f"{self}: {self.host} is a broadcast address of a local network, not one "
                                  "camera's (a camera is opened by its own address, never by broadcast)") from exc
        except OSError as exc:
            raise DriverInitError(f"{self}: cannot open a socket to {self.host}: {exc}") from exc
        self._client, self._gone, self._have_control = client, "", False
        try:
            info = self._take_control_and_describe(client, deadline)
        except BaseException as exc:
            if self._have_control:
                self._release(client)
            client.close()
            self._client = None
            if isinstance(exc, DriverInitError) or not isinstance(exc, Exception):
                raise
            raise DriverInitError(f"{self}: cannot open: {exc}") from exc
        self._stop_threads.clear()
        beat = threading.Thread(target=self._heartbeat_loop, name=f"gige-heartbeat-{self.host}", daemon=True)
        self._threads = [beat]
        beat.start()
        return info

    def _take_control_and_describe(self, client: GvcpClient, deadline: float) -> CameraInfo:
        try:
            ccp = client.read_reg(gc.Reg.CCP, deadline)
        except CameraTimeoutError as exc:
            raise DriverInitError(f"{self}: no GVCP answer from {self.host}:{self.port}") from exc
        want = gc.CCP_CONTROL | (gc.CCP_EXCLUSIVE if self.options["exclusive"] else 0)
        try:
            client.write_reg(gc.Reg.CCP, want, deadline)
        except CameraDeviceError as exc:
            raise DriverInitError(f"{self}: control refused ({exc.code}): another application "
                                  f"controls the camera (CCP was 0x{ccp:X})") from exc
        self._have_control = True
        hb_ms = round(self.options["heartbeat_timeout_s"] * 1000)
        client.write_reg(gc.Reg.HEARTBEAT_TIMEOUT, hb_ms, deadline)
        strings = client.read_mem(gc.Reg.MANUFACTURER_NAME, gc.Reg.USER_DEFINED_NAME + 16 - gc.Reg.MANUFACTURER_NAME,
                                  deadline)

        def s(reg: int) -> str:
            off = reg - gc.Reg.MANUFACTURER_NAME
            return gc.decode_string(strings[off:off + gc.STRING_LENGTHS[reg]])

        info = CameraInfo(
            vendor=s(gc.Reg.MANUFACTURER_NAME), model=s(gc.Reg.MODEL_NAME), serial=s(gc.Reg.SERIAL_NUMBER),
            firmware=s(gc.Reg.DEVICE_VERSION), user_name=s(gc.Reg.USER_DEFINED_NAME),
            address=f"{self.host}:{self.port}", backend=self.backend,
        )
        self._load_nodes(client, deadline)
        hi, lo = client.read_regs((gc.Reg.TIMESTAMP_FREQ_HIGH, gc.Reg.TIMESTAMP_FREQ_LOW), deadline)
        self.tick_frequency_hz = float((hi << 32) | lo)
        if not self.tick_frequency_hz > 0:
            raise DriverInitError(f"{self}: the device reports no timestamp tick frequency")
        self._setup_clock(client, deadline)
        self._find_exposure()
        self._refresh_applied(deadline)
        return info

    def _load_nodes(self, client: GvcpClient, deadline: float) -> None:
        url_text = gc.decode_string(client.read_mem(gc.Reg.FIRST_URL, 512, deadline))
        url = parse_xml_url(url_text)
        if url.scheme != "local":
            raise DriverInitError(f"{self}: GenICam XML URL {url_text!r}: only Local: (device memory) is fetched")
        raw = client.read_mem(url.address, url.length, deadline)
        xml = xml_from_bytes(raw, zipped=url.zipped)
        self._port_access = GvcpPort(client)
        self.nodes = NodeMap(xml, self._port_access)
        log.debug("%s: GenICam %s (%d bytes%s)", self, url.filename, len(xml), ", zipped" if url.zipped else "")

    def _close_internal(self) -> None:
        client = self._client
        if client is not None and not self._gone:
            try:
                self._stop_acquisition(time.monotonic() + self.timeout_s)
            except Exception:  # noqa: BLE001 - best effort: the device may be gone
                log.debug("%s: stopping acquisition on close failed", self, exc_info=True)
        self._stop_threads.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self._threads = []
        self._close_stream()
        if client is not None:
            if not self._gone and self._have_control:
                self._release(client)
            client.close()
        self._client = None

    def _release(self, client: GvcpClient) -> None:
        try:
            client.write_reg(gc.Reg.CCP, 0, time.monotonic() + self.timeout_s)
        except Exception:  # noqa: BLE001 - the heartbeat timeout releases it anyway
            log.debug("%s: releasing control failed", self, exc_info=True)

    # -- clock -------------------------------------------------------------------------------
    def _latch(self, client: GvcpClient, deadline: float) -> tuple[int, int, int]:
        """``(t_sent_ns, ticks, t_acked_ns)``: the timestamp latched inside one round trip."""
        t1, t4 = client.write_reg(gc.Reg.TIMESTAMP_CONTROL, gc.TIMESTAMP_LATCH, deadline)
        hi, lo = client.read_regs((gc.Reg.TIMESTAMP_VALUE_HIGH, gc.Reg.TIMESTAMP_VALUE_LOW), deadline)
        return t1, (hi << 32) | lo, t4

    def _dev_s(self, ticks: int) -> float:
        return (ticks - self._tick_epoch) / self.tick_frequency_hz

    def _setup_clock(self, client: GvcpClient, deadline: float) -> None:
        mode = self.options["clock"]
        latch_ok = False
        if mode in ("auto", "latch"):
            try:
                a = self._latch(client, deadline)
                time.sleep(0.005)
                b = self._latch(client, deadline)
                dev_s = (b[1] - a[1]) / self.tick_frequency_hz
                # Each latch happened between its write's send and acknowledge, so the device
                # time between them lies between these host spans (widened by 10 % for a
                # clock's rate): a latch that does not move, or moves otherwise, fails.
                shortest_s = (b[0] - a[2]) / _NS_PER_S
                longest_s = (b[2] - a[0]) / _NS_PER_S
                latch_ok = a[1] > 0 and 0.9 * shortest_s <= dev_s <= 1.1 * longest_s and dev_s > 0
            except CameraDeviceError:
                latch_ok = False
            if mode == "latch" and not latch_ok:
                raise DriverInitError(f"{self}: clock=latch, but the device's timestamp latch does not move")
        if latch_ok:
            # Half of a 32-exchange window (8 s at the default interval) defines the line:
            # the lowest-delay ones, spread over the window, so the rate is fitted within a
            # second or two and follows the device's drift.
            self.clock, self.clock_source = ExchangeClockModel(window=32, keep_fraction=0.5), "latch"
            first = self._latch(client, deadline)
            self._tick_epoch = first[1]
            self.clock.add_exchange(first[0], 0.0, 0.0, first[2])
            self._last_sync_ns = first[2]
            self._sync_hosts = collections.deque([first[2]], maxlen=self.clock.window)
            for _ in range(3):
                self._clock_sample(client, deadline)
        else:
            self.clock, self.clock_source = StreamClockModel(min_samples=4), "stream"
            self._tick_epoch = 0  # set by the first leader
        log.info("%s: device clock %.6g Hz mapped by %s", self, self.tick_frequency_hz, self.clock_source)

    def _clock_sample(self, client: GvcpClient, deadline: float) -> None:
        t1, ticks, t4 = self._latch(client, deadline)
        with self._clock_lock:
            d = self._dev_s(ticks)
            try:
                self.clock.add_exchange(t1, d, d, t4)  # type: ignore[union-attr]
                self._last_sync_ns = t4
                self._sync_hosts.append(t4)
            except ValueError:
                log.debug("%s: latch sample ran backwards, dropped", self)

    @property
    def clock_rate_bound(self) -> float:
        """Bound on the model's rate error (dimensionless). Until the rate is fitted the
        model runs at the nominal rate, off by at most ``max_drift_ppm`` (the device's
        specified drift). Then it is what the exchanges the line rests on can leave of it
        (:attr:`ExchangeClockModel.rate_error_bound`: their delays and their spread in time),
        whatever the device's drift. Times the distance from the last exchange, it is what
        extrapolating the line can add to the model's own bound. (The fitted drift plus
        ``max_drift_ppm``, taken when smaller, held only for a device inside its
        specification: on a loaded host a 200 ppm clock was fitted at 17 ppm, 183 ppm off,
        with 117 ppm claimed. Capping at ``max_drift_ppm`` alone failed the same way.)"""
        cap = self.options["max_drift_ppm"] * 1e-6
        clock = self.clock
        if not isinstance(clock, ExchangeClockModel) or not clock.rate_fitted:
            return cap
        return clock.rate_error_bound

    # -- heartbeat ---------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        beat_s = max(0.05, self.options["heartbeat_timeout_s"] / 3.0)
        latch = self.clock_source == "latch"
        sync_s = self.options["clock_sync_s"]
        next_beat = time.monotonic()
        next_sync = next_beat if latch else math.inf
        failures = 0
        while not self._stop_threads.wait(max(0.0, min(next_beat, next_sync) - time.monotonic())):
            client = self._client
            if client is None:
                return
            now = time.monotonic()
            try:
                # Any command from the controller keeps the session; a CCP read also tells
                # whether control was taken away, so it is the heartbeat whatever else runs.
                if now >= next_beat:
                    next_beat = now + beat_s
                    ccp = client.read_reg(gc.Reg.CCP, now + beat_s)
                    if not ccp & gc.CCP_CONTROL:
                        self._gone = f"control privilege lost (CCP 0x{ccp:X})"
                        log.warning("%s: %s", self, self._gone)
                        self._wake()
                        return
                if latch and now >= next_sync:
                    next_sync = now + sync_s
                    self._clock_sample(client, now + beat_s)
                failures = 0
            except (CameraTimeoutError, CameraDeviceError) as exc:
                failures += 1
                log.warning("%s: heartbeat failed (%s)", self, exc)
                if failures >= 3:
                    self._gone = f"no heartbeat answer {failures} times"
                    self._wake()
                    return
            except DeviceGoneError as exc:
                self._gone = str(exc)
                self._wake()
                return
            except Exception as exc:  # noqa: BLE001 - a bug must not leave grab() waiting for ever
                log.exception("%s: heartbeat thread failed", self)
                self._gone = f"heartbeat thread failed: {exc!r}"
                self._wake()
                return

    def _wake(self) -> None:
        with self._frames_cv:
            self._frames_cv.notify_all()

    # -- node-map helpers --------------------------------------------------------------------
    def _nm(self, deadline: float) -> NodeMap:
        if self._gone:
            raise DeviceGoneError(f"{self}: {self._gone}")
        assert self.nodes is not None and self._port_access is not None
        self._port_access.deadline = deadline
        return self.nodes

    def _find_exposure(self) -> None:
        nm = self.nodes
        assert nm is not None
        for name in ("ExposureTime", "ExposureTimeAbs"):
            if name in nm and nm.kind(name) in ("Float", "Integer"):
                self._exposure_feature = name
                return
        self._exposure_feature = ""

    def _exposure_scale(self) -> float:
        assert self.nodes is not None
        return _unit_scale(self.nodes.unit(self._exposure_feature))

    def _refresh_applied(self, deadline: float) -> None:
        nm = self._nm(deadline)
        self._exposure_s = self._get_exposure_internal(deadline) if self._exposure_feature else None
        self._gain_db = float(nm.get("Gain")) if "Gain" in nm else None

    def _feature_call(self, fn: Callable[[], Any], name: str) -> Any:
        try:
            return fn()
        except FeatureNotFoundError:
            raise FeatureUnavailableError(f"{self}: the camera has no feature {name!r}") from None
        except (FeatureAccessError, GenicamError) as exc:
            raise FeatureUnavailableError(f"{self}: {exc}") from exc

    # -- settings hooks ----------------------------------------------------------------------
    def _get_exposure_internal(self, deadline: float) -> float:
        if not self._exposure_feature:
            raise FeatureUnavailableError(f"{self}: the camera has neither ExposureTime nor ExposureTimeAbs")
        nm = self._nm(deadline)
        return float(nm.get(self._exposure_feature)) * self._exposure_scale()

    def _set_exposure_internal(self, exposure_s: float, deadline: float) -> float:
        if not self._exposure_feature:
            raise FeatureUnavailableError(f"{self}: the camera has neither ExposureTime nor ExposureTimeAbs")
        nm = self._nm(deadline)
        if "ExposureAuto" in nm:
            self._feature_call(lambda: nm.set("ExposureAuto", "Off"), "ExposureAuto")
        value = exposure_s / self._exposure_scale()
        if nm.kind(self._exposure_feature) == "Integer":
            value = round(value)
        nm.set(self._exposure_feature, value)
        self._exposure_s = self._get_exposure_internal(deadline)
        return self._exposure_s

    def _get_gain_internal(self, deadline: float) -> float:
        nm = self._nm(deadline)
        return float(self._feature_call(lambda: nm.get("Gain"), "Gain"))

    def _set_gain_internal(self, gain_db: float, deadline: float) -> float:
        nm = self._nm(deadline)
        if "Gain" not in nm:
            raise FeatureUnavailableError(f"{self}: the camera has no feature 'Gain' (dB); "
                                          "set a raw gain by name with set_feature()")
        if "GainAuto" in nm:
            self._feature_call(lambda: nm.set("GainAuto", "Off"), "GainAuto")
        nm.set("Gain", gain_db)
        self._gain_db = float(nm.get("Gain"))
        return self._gain_db

    def _get_pixel_format_internal(self, deadline: float) -> str:
        nm = self._nm(deadline)
        return str(self._feature_call(lambda: nm.get("PixelFormat"), "PixelFormat"))

    def _set_pixel_format_internal(self, name: str, deadline: float) -> None:
        nm = self._nm(deadline)
        if gc.PIXEL_FORMATS.get(name) is None:
            raise ValueError(f"{self}: pixel format {name!r} is not one this driver turns into an image "
                             f"({', '.join(gc.PIXEL_FORMATS)})")
        self._feature_call(lambda: nm.set("PixelFormat", name), "PixelFormat")

    def _set_trigger_internal(self, mode: str, deadline: float) -> None:
        nm = self._nm(deadline)
        if "TriggerSelector" in nm and nm.get("TriggerSelector") != "FrameStart":
            self._feature_call(lambda: nm.set("TriggerSelector", "FrameStart"), "TriggerSelector")
        if mode == TriggerMode.SOFTWARE:
            self._feature_call(lambda: nm.set("TriggerSource", "Software"), "TriggerSource")
            self._feature_call(lambda: nm.set("TriggerMode", "On"), "TriggerMode")
        else:
            self._feature_call(lambda: nm.set("TriggerMode", "Off"), "TriggerMode")

    def _trigger_internal(self, deadline: float) -> None:
        nm = self._nm(deadline)
        self._feature_call(lambda: nm.execute("TriggerSoftware"), "TriggerSoftware")

    def _get_feature_internal(self, name: str, deadline: float) -> Any:
        return self._nm(deadline).get(name)

    def _set_feature_internal(self, name: str, value: Any, deadline: float) -> None:
        nm = self._nm(deadline)
        nm.set(name, value)
        if name in (self._exposure_feature, "Gain", "ExposureAuto", "GainAuto"):
            self._refresh_applied(deadline)

    def _execute_internal(self, name: str, deadline: float) -> None:
        self._nm(deadline).execute(name)

    def _grab_budget_s(self) -> float:
        # an exposure and, free-running, up to a frame period before it starts
        exp = self._exposure_s or 0.0
        return 2.0 * exp

    # -- acquisition -------------------------------------------------------------------------
    def _start_internal(self, deadline: float) -> None:
        client = self._client
        assert client is not None
        nm = self._nm(deadline)
        self._open_stream(client.local_ip)
        assert self._stream is not None
        host_ip, host_port = self._stream.getsockname()
        if self.options["packet_size"]:
            scps = client.read_reg(gc.Reg.SCPS0, deadline)
            scps = (scps & ~gc.SCPS_SIZE_MASK & ~gc.SCPS_FIRE_TEST) | self.options["packet_size"]
            client.write_reg(gc.Reg.SCPS0, scps, deadline)
        client.write_reg(gc.Reg.SCDA0, int(ipaddress.IPv4Address(host_ip)), deadline)
        client.write_reg(gc.Reg.SCP0, host_port, deadline)
        if "AcquisitionMode" in nm:
            self._feature_call(lambda: nm.set("AcquisitionMode", "Continuous"), "AcquisitionMode")
        self._chunk_features = self._enable_chunks(nm) if self.options["chunks"] else ()
        self._refresh_applied(deadline)
        with self._frames_cv:
            self._frames.clear()
        self._feature_call(lambda: nm.execute("AcquisitionStart"), "AcquisitionStart")
        log.debug("%s: streaming to %s:%d", self, host_ip, host_port)

    def _enable_chunks(self, nm: NodeMap) -> tuple[str, ...]:
        """Turn on the exposure and gain chunks (SFNC ChunkModeActive / ChunkSelector /
        ChunkEnable) where the device has them; the chunk features then read per frame."""
        wanted = [(entry, f"Chunk{entry}") for entry in ("ExposureTime", "Gain")]
        if not all(n in nm for n in ("ChunkModeActive", "ChunkSelector", "ChunkEnable")):
            return ()
        entries = nm.enum_entries("ChunkSelector")
        have = [(e, f) for e, f in wanted if e in entries and f in nm]
        if not have:
            return ()
        try:
            nm.set("ChunkModeActive", True)
            for entry, _ in have:
                nm.set("ChunkSelector", entry)
                nm.set("ChunkEnable", True)
        except (GenicamError, CameraDeviceError, ValueError) as exc:
            log.info("%s: chunk data not enabled (%s); exposure and gain are the registers'", self, exc)
            return ()
        return tuple(f for _, f in have)

    def _stop_internal(self, deadline: float) -> None:
        self._stop_acquisition(deadline)

    def _stop_acquisition(self, deadline: float) -> None:
        if self._stream is None:
            return
        nm = self._nm(deadline)
        client = self._client
        try:
            self._feature_call(lambda: nm.execute("AcquisitionStop"), "AcquisitionStop")
        finally:
            if client is not None:
                client.write_reg(gc.Reg.SCP0, 0, deadline)  # port 0: the channel sends nothing
            self._close_stream()

    def _open_stream(self, local_ip: str) -> None:
        if self._stream is not None:
            return
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF_BYTES)
        except OSError:
            pass
        sock.bind((local_ip, self.options["stream_port"]))
        sock.settimeout(_RECV_POLL_S)
        self._stream = sock
        stop = threading.Event()
        self._stream_stop = stop
        t = threading.Thread(target=self._receive_loop, args=(sock, stop), name=f"gige-stream-{self.host}", daemon=True)
        self._stream_thread = t
        t.start()

    def _close_stream(self) -> None:
        sock, self._stream = self._stream, None
        if sock is None:
            return
        self._stream_stop.set()
        self._stream_thread.join(timeout=2.0)
        sock.close()

    def _receive_loop(self, sock: socket.socket, stop: threading.Event) -> None:
        asm = FrameAssembler(self._on_complete)
        done0, torn0 = self.frames_completed, self.frames_incomplete  # the counters run across streams
        buf = bytearray(65536)
        view = memoryview(buf)
        while not stop.is_set():
            try:
                n, src = sock.recvfrom_into(buf)
            except TimeoutError:
                asm.expire(time.monotonic_ns())
                self.frames_incomplete = torn0 + asm.incomplete + asm.unsupported
                continue
            except OSError as exc:
                if not stop.is_set():
                    log.warning("%s: stream socket failed: %s", self, exc)
                    self._gone = f"stream socket failed: {exc}"
                    self._wake()
                return
            t_ns = time.monotonic_ns()
            if src[0] != self.host:
                self.bad_packets += 1
                continue
            try:
                pkt = gc.decode_gvsp(view[:n])
            except gc.GigeProtocolError:
                self.bad_packets += 1
                continue
            try:
                if isinstance(pkt, gc.GvspLeader) and self.clock_source == "stream":
                    self._stream_clock_sample(pkt, t_ns)
                asm.feed(pkt, t_ns)
            except Exception as exc:  # noqa: BLE001 - a bug must not leave grab() waiting for ever
                log.exception("%s: stream receiver failed", self)
                self._gone = f"stream receiver failed: {exc!r}"
                self._wake()
                return
            self.frames_incomplete = torn0 + asm.incomplete + asm.unsupported
            self.frames_completed = done0 + asm.completed

    def _stream_clock_sample(self, leader: gc.GvspLeader, t_ns: int) -> None:
        with self._clock_lock:
            if self._tick_epoch == 0:
                self._tick_epoch = leader.timestamp
            # A leader cannot leave before its exposure has ended: map that instant to the
            # arrival, so the envelope's delay is readout and transfer only.
            sent = self._dev_s(leader.timestamp)
            if self.options["timestamp_marks"] == "exposure_start":
                sent += self._exposure_s or 0.0
            self.clock.add(sent, t_ns)  # type: ignore[union-attr]

    def _discard_queued_internal(self) -> None:
        with self._frames_cv:
            self._frames.clear()

    def _on_complete(self, done: CompleteFrame) -> None:
        with self._frames_cv:
            if len(self._frames) == self._frames.maxlen:
                self.frames_overwritten += 1
            self._frames.append(done)
            self._frames_cv.notify_all()

    def _grab_internal(self, deadline: float) -> RawFrame:
        with self._frames_cv:
            while not self._frames:
                if self._gone:
                    raise DeviceGoneError(f"{self}: {self._gone}")
                left = remaining_s(deadline)
                if left <= 0:
                    raise CameraTimeoutError(
                        f"{self}: no complete frame in time ({self.frames_completed} complete, "
                        f"{self.frames_incomplete} incomplete, {self.bad_packets} bad packets so far)")
                self._frames_cv.wait(left)
            done = self._frames.popleft()
        image, name = image_from_payload(done.leader, done.data)
        exposure, gain = self._exposure_s, self._gain_db
        if done.chunks and self.nodes is not None:
            exposure, gain = self._from_chunks(done.chunks, exposure, gain)
        ts = done.leader.timestamp
        start_dev = self._dev_s(ts)
        half = 0.5 * (exposure or 0.0)
        mid_dev = start_dev + half if self.options["timestamp_marks"] == "exposure_start" else start_dev - half
        with self._clock_lock:
            try:
                t_host = self.clock.to_host_ns(mid_dev)
                unc = self.clock.uncertainty_ns
                if self.clock_source == "latch":
                    unc += abs(t_host - self._last_sync_ns) * self.clock_rate_bound
            except ClockNotReady:
                t_host, unc = done.t_leader_ns, math.inf
        return RawFrame(
            image=image, pixel_format=name, frame_id=done.leader.block_id, device_timestamp=ts,
            tick_frequency_hz=self.tick_frequency_hz,
            t_device_s=ts / self.tick_frequency_hz + (mid_dev - start_dev),
            t_host_ns=int(t_host), t_host_uncertainty_ns=float(unc), t_received_ns=done.t_done_ns,
            exposure_s=exposure, gain_db=gain,
        )

    def _from_chunks(self, chunks: Mapping[int, bytes], exposure: float | None,
                     gain: float | None) -> tuple[float | None, float | None]:
        """The exposure (s) and gain (dB) a frame's chunk data says were applied to it."""
        assert self.nodes is not None
        with self.nodes.chunk_data(chunks):
            try:
                if "ChunkExposureTime" in self._chunk_features:
                    exposure = float(self.nodes.get("ChunkExposureTime")) * _unit_scale(
                        self.nodes.unit("ChunkExposureTime"))
                if "ChunkGain" in self._chunk_features:
                    gain = float(self.nodes.get("ChunkGain"))
            except GenicamError as exc:
                log.debug("%s: chunk data unreadable (%s); the registers' values stand", self, exc)
        return exposure, gain
