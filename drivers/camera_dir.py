"""Recorded frames replayed as a camera (``dir://<folder>``), and the writer of such folders.

The folder format is ``docs/protocols/camera-dir.md``: PNG images, ``frames.csv`` (one row
per frame, in order: the image's file name and what the camera said about it: ids, device
timestamp and tick frequency, mid-exposure on the device and host clocks, exposure, gain)
and an optional ``camera.toml`` (``[camera]`` vendor, model, serial, firmware). PNG is
decoded with OpenCV (8-bit grey: ``Mono8``, 16-bit grey: ``Mono16``, 8-bit colour: ``RGB8``).

:func:`write_recording` writes frames grabbed from any camera as such a folder (images
first, then ``frames.csv`` through a temporary file, fsync and rename, so a folder with a
``frames.csv`` is always complete), and :class:`DirCameraDriver` replays it: every
:meth:`~cellcal.drivers.camera.CameraDriver.grab` returns the next frame with its recorded
metadata (``after_ns`` does not apply: the stamps are history). The settings cannot change;
the getters return the next frame's.
"""

from __future__ import annotations

import csv
import io
import math
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

from cellcal.drivers.camera import (
    CameraDriver,
    CameraInfo,
    CameraUrl,
    FeatureUnavailableError,
    Frame,
    RawFrame,
    TriggerMode,
)
from cellcal.drivers.errors import DriverError, DriverInitError
from cellcal.drivers.robot import OptionSpec, merge_options, opt_bool, opt_float

__all__ = ["DirCameraDriver", "RecordingExhausted", "write_recording", "FRAMES_FILE", "CAMERA_FILE", "COLUMNS"]

FRAMES_FILE = "frames.csv"
CAMERA_FILE = "camera.toml"
#: ``frames.csv`` columns in the order written; only ``image`` is required on reading.
COLUMNS = ("image", "frame_id", "pixel_format", "device_timestamp", "tick_frequency_hz", "t_device_s",
           "t_host_ns", "t_host_uncertainty_ns", "t_received_ns", "exposure_s", "gain_db")
_CAMERA_KEYS = ("vendor", "model", "serial", "firmware", "user_name")
#: Pixel formats a PNG of each kind may carry.
_GREY8 = ("Mono8", "BayerGR8", "BayerRG8", "BayerGB8", "BayerBG8")
_GREY16 = ("Mono16", "Mono10", "Mono12")

OPTIONS: dict[str, OptionSpec] = {
    "timeout_s": OptionSpec(opt_float(positive=True), 1.0, "deadline of one grab (s)"),
    "loop": OptionSpec(opt_bool, False, "start again from the first frame after the last"),
}


class RecordingExhausted(DriverError):
    """Every frame of the recording was replayed (and ``loop`` is off)."""


@dataclass(frozen=True)
class _Row:
    line: int
    image: Path
    frame_id: int
    pixel_format: str
    device_timestamp: int
    tick_frequency_hz: float
    t_device_s: float
    t_host_ns: int
    t_host_uncertainty_ns: float
    t_received_ns: int
    exposure_s: float | None
    gain_db: float | None


def _cell(row: Mapping[str, str], key: str) -> str:
    return (row.get(key) or "").strip()


def _num(row: Mapping[str, str], key: str, where: str, *, integer: bool = False, default: Any = None,
         allow_inf: bool = False) -> Any:
    text = _cell(row, key)
    if not text:
        return default
    try:
        value: Any = int(text) if integer else float(text)
    except ValueError:
        raise DriverInitError(f"{where}: {key} {text!r} is not {'an integer' if integer else 'a number'}") from None
    if not integer and not math.isfinite(value) and not (allow_inf and value == math.inf):
        raise DriverInitError(f"{where}: {key} {text!r} is not finite")
    return value


def _read_rows(folder: Path) -> list[_Row]:
    path = folder / FRAMES_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DriverInitError(f"dir://{folder}: cannot read {FRAMES_FILE}: {exc}") from exc
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or "image" not in reader.fieldnames:
        raise DriverInitError(f"{path}: the header needs an 'image' column")
    unknown = [c for c in reader.fieldnames if c not in COLUMNS]
    if unknown:
        raise DriverInitError(f"{path}: unknown column {unknown[0]!r} (known: {', '.join(COLUMNS)})")
    rows = []
    for n, row in enumerate(reader, start=1):
        where = f"{path} row {n}"
        name = _cell(row, "image")
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise DriverInitError(f"{where}: image {name!r} must be a file name in the folder")
        image = folder / name
        if not image.is_file():
            raise DriverInitError(f"{where}: image {name!r} does not exist")
        exposure = _num(row, "exposure_s", where)
        if exposure is not None and not exposure > 0:
            raise DriverInitError(f"{where}: exposure_s {exposure} must be > 0")
        tick_hz = _num(row, "tick_frequency_hz", where, default=0.0)
        if tick_hz < 0:
            raise DriverInitError(f"{where}: tick_frequency_hz {tick_hz} must be >= 0")
        unc = _num(row, "t_host_uncertainty_ns", where, allow_inf=True)
        if unc is not None and not unc >= 0:
            raise DriverInitError(f"{where}: t_host_uncertainty_ns {unc} must be >= 0")
        t_host = _num(row, "t_host_ns", where, integer=True)
        rows.append(_Row(
            line=n, image=image, frame_id=_num(row, "frame_id", where, integer=True, default=n),
            pixel_format=_cell(row, "pixel_format"),
            device_timestamp=_num(row, "device_timestamp", where, integer=True, default=0),
            tick_frequency_hz=tick_hz, t_device_s=_num(row, "t_device_s", where, default=math.nan),
            t_host_ns=0 if t_host is None else t_host,
            t_host_uncertainty_ns=(math.inf if t_host is None else 0.0) if unc is None else unc,
            t_received_ns=_num(row, "t_received_ns", where, integer=True, default=0),
            exposure_s=exposure, gain_db=_num(row, "gain_db", where),
        ))
    if not rows:
        raise DriverInitError(f"{path}: no frames")
    return rows


def _read_camera(folder: Path) -> dict[str, str]:
    path = folder / CAMERA_FILE
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DriverInitError(f"{path}: {exc}") from exc
    table = data.get("camera", {})
    extra = [k for k in data if k != "camera"] + [k for k in table if k not in _CAMERA_KEYS]
    if extra:
        raise DriverInitError(f"{path}: unknown key {extra[0]!r} (known: camera.{', camera.'.join(_CAMERA_KEYS)})")
    bad = [k for k, v in table.items() if not isinstance(v, str)]
    if bad:
        raise DriverInitError(f"{path}: camera.{bad[0]} must be a string")
    return dict(table)


def _decode(row: _Row) -> tuple[np.ndarray, str]:
    import cv2  # imported here: a cell without a camera never loads OpenCV

    img = cv2.imread(str(row.image), cv2.IMREAD_UNCHANGED)
    if img is None:
        raise DriverError(f"{row.image}: not an image OpenCV can read")
    allowed: tuple[str, ...]
    if img.ndim == 2 and img.dtype == np.uint8:
        allowed, default = _GREY8, "Mono8"
    elif img.ndim == 2 and img.dtype == np.uint16:
        allowed, default = _GREY16, "Mono16"
    elif img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8:
        img = img[:, :, ::-1]  # OpenCV's BGR back to the PNG's RGB
        allowed, default = ("RGB8",), "RGB8"
    else:
        raise DriverError(f"{row.image}: {img.dtype} image of shape {img.shape} is none of 8/16-bit grey, 8-bit RGB")
    fmt = row.pixel_format or default
    if fmt not in allowed:
        raise DriverError(f"{row.image}: pixel_format {fmt!r} does not fit a {img.dtype} "
                          f"{'grey' if img.ndim == 2 else 'colour'} PNG ({', '.join(allowed)})")
    return np.ascontiguousarray(img), fmt


class DirCameraDriver(CameraDriver):
    """A recording played back as a camera (``dir://<folder>[?loop=true]``)."""

    backend = "dir"
    live = False

    def __init__(self, folder: str | os.PathLike[str], **options: Any) -> None:
        opts = merge_options(OPTIONS, {}, options, f"dir://{folder}")
        super().__init__(timeout_s=opts["timeout_s"])
        self.folder = Path(folder)
        self.loop = bool(opts["loop"])
        self._rows: list[_Row] = []
        self._next = 0

    @classmethod
    def _from_url_internal(cls, url: CameraUrl, options: Mapping[str, Any]) -> Self:
        return cls(url.path, **merge_options(OPTIONS, url.query, options, f"dir://{url.path}"))

    def __repr__(self) -> str:
        return f"DirCameraDriver({str(self.folder)!r})"

    @property
    def n_frames(self) -> int:
        return len(self._rows)

    def _open_internal(self, deadline: float) -> CameraInfo:
        if not self.folder.is_dir():
            raise DriverInitError(f"dir://{self.folder}: not a folder")
        self._rows = _read_rows(self.folder)
        cam = _read_camera(self.folder)
        self._next = 0
        return CameraInfo(vendor=cam.get("vendor", ""), model=cam.get("model", ""), serial=cam.get("serial", ""),
                          firmware=cam.get("firmware", ""), user_name=cam.get("user_name", ""),
                          address=str(self.folder), backend=self.backend)

    def _close_internal(self) -> None:
        self._rows = []

    def _peek(self) -> _Row:
        return self._rows[self._next % len(self._rows)]

    def _fixed(self, what: str) -> FeatureUnavailableError:
        return FeatureUnavailableError(f"{self}: a recording's {what} cannot be changed")

    def _get_exposure_internal(self, deadline: float) -> float:
        exp = self._peek().exposure_s
        if exp is None:
            raise FeatureUnavailableError(f"{self}: the recording has no exposure_s")
        return exp

    def _set_exposure_internal(self, exposure_s: float, deadline: float) -> float:
        raise self._fixed("exposure")

    def _get_gain_internal(self, deadline: float) -> float:
        gain = self._peek().gain_db
        if gain is None:
            raise FeatureUnavailableError(f"{self}: the recording has no gain_db")
        return gain

    def _set_gain_internal(self, gain_db: float, deadline: float) -> float:
        raise self._fixed("gain")

    def _get_pixel_format_internal(self, deadline: float) -> str:
        return _decode(self._peek())[1]

    def _set_pixel_format_internal(self, name: str, deadline: float) -> None:
        if name != self._get_pixel_format_internal(deadline):
            raise self._fixed("pixel format")

    def _set_trigger_internal(self, mode: str, deadline: float) -> None:
        if mode not in TriggerMode.ALL:  # pragma: no cover - the base checks
            raise ValueError(mode)
        # A replay gives one frame per grab whatever the mode.

    def _trigger_internal(self, deadline: float) -> None:
        return None

    def _start_internal(self, deadline: float) -> None:
        return None

    def _stop_internal(self, deadline: float) -> None:
        return None

    def _grab_internal(self, deadline: float) -> RawFrame:
        if self._next >= len(self._rows) and not self.loop:
            raise RecordingExhausted(f"{self}: all {len(self._rows)} frames replayed")
        row = self._peek()
        self._next += 1
        image, fmt = _decode(row)
        t_device = row.t_device_s
        if math.isnan(t_device) and row.tick_frequency_hz > 0:
            t_device = row.device_timestamp / row.tick_frequency_hz
        return RawFrame(
            image=image, pixel_format=fmt, frame_id=row.frame_id, device_timestamp=row.device_timestamp,
            tick_frequency_hz=row.tick_frequency_hz, t_device_s=t_device, t_host_ns=row.t_host_ns,
            t_host_uncertainty_ns=row.t_host_uncertainty_ns, t_received_ns=row.t_received_ns,
            exposure_s=row.exposure_s, gain_db=row.gain_db,
        )


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if math.isnan(value) else ("inf" if math.isinf(value) else repr(value))
    return str(value)


def write_recording(folder: str | os.PathLike[str], frames: Iterable[Frame], info: CameraInfo | None = None) -> int:
    """Write ``frames`` (and the camera's identity) as a ``dir://`` folder; returns the count.

    Images are ``000001.png``, ``000002.png``, ... (lossless PNG). ``frames.csv`` is written
    last, through a temporary file, fsync and rename: a folder that has it is complete.

    Raises
    ------
    ValueError
        The folder already holds a recording, or a frame's image is none of the PNG kinds.
    """
    import cv2

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if (out / FRAMES_FILE).exists():
        raise ValueError(f"{out} already holds a recording ({FRAMES_FILE})")
    lines = io.StringIO()
    writer = csv.writer(lines, lineterminator="\n")
    writer.writerow(COLUMNS)
    n = 0
    for n, f in enumerate(frames, start=1):
        name = f"{n:06d}.png"
        img = f.image
        if img.ndim == 3:
            if img.shape[2] != 3 or img.dtype != np.uint8:
                raise ValueError(f"frame {n}: a colour image must be (H, W, 3) uint8")
            img = img[:, :, ::-1] if f.pixel_format == "RGB8" else img  # OpenCV writes BGR
        elif img.dtype not in (np.uint8, np.uint16):
            raise ValueError(f"frame {n}: {img.dtype} images are not recorded")
        if not cv2.imwrite(str(out / name), np.ascontiguousarray(img)):
            raise ValueError(f"frame {n}: OpenCV could not write {out / name}")
        writer.writerow([
            name, f.frame_id, f.pixel_format, f.device_timestamp, _fmt(f.tick_frequency_hz), _fmt(f.t_device_s),
            f.t_host_ns, _fmt(f.t_host_uncertainty_ns), f.t_received_ns, _fmt(f.exposure_s), _fmt(f.gain_db),
        ])
    if info is not None:
        toml = "".join(f'{k} = "{getattr(info, k)}"\n' for k in _CAMERA_KEYS
                       if getattr(info, k) and '"' not in getattr(info, k) and "\\" not in getattr(info, k))
        (out / CAMERA_FILE).write_text("[camera]\n" + toml, encoding="utf-8")
    tmp = out / (FRAMES_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(lines.getvalue())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / FRAMES_FILE)
    dir_fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return n
