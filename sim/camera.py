"""The simulated camera: what a real camera would see of the calibration target in the cell.

Rendering
---------
Each output pixel looks along one ray: the pixel grid (``supersample`` x ``supersample``
sub-pixels) is undistorted once per camera (:func:`cellcal.solver.camera_model.undistort`
on every :data:`RAY_STEP`-th sub-pixel, the rest interpolated bilinearly between them: the
undistortion is smooth at that scale, so the rays differ from an exact undistortion of every
sub-pixel by less than 1e-4 px, three orders below a detector's corner noise, for an eighth
of the work), and every frame intersects those rays with the target's plane at the target's true pose
(:class:`TargetRenderer`). The hit points index a reflectance texture of the printed board
(OpenCV's own ChArUco image, or a chessboard, on a white plate one square wider all round)
through ``cv2.remap``, from the level of a texture pyramid whose texels match the footprint
of a sub-pixel (no aliasing of the square edges when the board is small in the image); the
sub-pixels are then box-averaged. So distortion, perspective and pixel integration are those
of the model the detector and the solver assume, and nothing of it is a Python loop.

Photometry (EMVA 1288's linear camera model)
--------------------------------------------
Mean electrons per pixel ``mu_e = reflectance * white_e_per_s * exposure + dark_e_per_s *
exposure``; the image is blurred (a Gaussian of ``blur_sigma_px`` for the lens, plus the
defocus of a thin lens: a disk of diameter ``f^2 / (N (d_f - f)) |d - d_f| / d`` on the sensor
at the target's distance ``d``, taken as a Gaussian of a quarter of it); then shot noise
(Poisson), clipped at the full well, plus read noise (Gaussian, electrons), times the system
gain ``K = (2^adc_bits - 1 - black_level) / full_well`` (DN per electron at 0 dB) and the
analogue gain, plus the black level, rounded and clipped to the ADC's range. Mono8 keeps the
ADC's top 8 bits; Mono16 puts its ``adc_bits`` at the top of 16 (a 12-bit camera's Mono16
steps by 16).

Time
----
A frame is requested at an instant of the world's clock (``t_request_ns``: the host's
``time.monotonic_ns()`` when the world runs on ``time.monotonic``, its default); exposure
starts ``trigger_delay_s`` later, in simulated time, and lasts ``exposure_s`` of it. With a
global shutter every row integrates over that interval; with a rolling shutter row ``r``
starts ``r * line_time_s`` after row 0. The camera renders the target at the robot's true
flange pose *during* the exposure (:meth:`World.base_T_flange_at`): sub-frames over the
interval, as many as the target's image moves half-pixels (motion blur), and per band of
rows at the band's time (rolling shutter). The frame's stamp is the camera's own clock at
mid-exposure (the centre row's for a rolling shutter): an oscillator like the tracker's,
``clock_offset_s + (1 + clock_drift_ppm 1e-6) * wall seconds`` since the world started.

Auto-exposure, when on, moves the exposure after every frame toward the one that would put
the frame's mean at ``auto_exposure_level`` of full scale, by ``1 - exp(-dt / tau)`` in the
logarithm (``dt`` the time since the previous frame): it settles over a few time constants,
and :attr:`CameraFrame.exposure_settled` says when the last correction was below 3 %.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from cellcal.sim.world import World
from cellcal.solver.camera_model import CameraModel
from cellcal.solver.se3 import check_transform, se3_inverse
from cellcal.solver.target import CalibrationTarget

__all__ = [
    "CameraConfig",
    "CameraFrame",
    "SimCamera",
    "TargetRenderer",
    "MOUNTINGS",
    "PIXEL_FORMATS",
    "SHUTTERS",
]

MOUNTINGS = ("eye_in_hand", "eye_to_hand")
PIXEL_FORMATS = ("Mono8", "Mono16")
SHUTTERS = ("global", "rolling")

#: Image motion (px) over an exposure below which one render stands for the whole exposure.
_BLUR_STEP_PX = 0.5
#: Image motion (px) across a rolling shutter's readout per band of rows.
_BAND_STEP_PX = 0.25
_MAX_SUBFRAMES = 24
_MAX_BANDS = 48
#: Auto-exposure counts as settled when its last correction was below this ratio.
_AE_SETTLED = math.log(1.03)


@dataclass(frozen=True, kw_only=True, eq=False)
class CameraConfig:
    """A simulated camera: optics, sensor, timing and where it and its target are.

    Attributes (units in the names; the scenario keys are in ``docs/simulation.md``)
    ----------
    camera : CameraModel
        True intrinsics and image size.
    target : CalibrationTarget
        The board the camera sees.
    mounting : {"eye_in_hand", "eye_to_hand"}
    flange_T_camera, cell_T_target : (4, 4) arrays or None
        Eye-in-hand: the camera on the flange, the board fixed in the cell.
    cell_T_camera, flange_T_target : (4, 4) arrays or None
        Eye-to-hand: the camera fixed in the cell, the board on the flange.
    pixel_format : {"Mono8", "Mono16"}
    adc_bits : int
        ADC resolution (8 to 16).
    pixel_size_m : float
        Pixel pitch (the defocus needs the focal length in metres: ``fx * pixel_size_m``).
    full_well_e, read_noise_e, dark_current_e_per_s : float
        Saturation capacity and temporal dark noise (electrons), dark current.
    white_e_per_s : float
        Electrons per pixel per second from a surface of reflectance 1 (the illumination
        and the quantum efficiency together).
    black_level_dn : float
        Offset added by the ADC, in ADC units.
    gain_db : float
        Analogue gain over the system gain.
    exposure_s, exposure_min_s, exposure_max_s : float
    auto_exposure : bool
    auto_exposure_level : float
        Target mean level, fraction of full scale.
    auto_exposure_time_constant_s : float
    blur_sigma_px : float
        The lens's point spread in focus (Gaussian sigma).
    f_number : float
    focus_distance_m : float or None
        None: everything in focus (no defocus blur).
    shutter : {"global", "rolling"}
    line_time_s : float
        Rolling shutter: delay between the starts of two consecutive rows.
    trigger_delay_s : float
        From the request to the start of the exposure.
    readout_s : float
        From the end of the exposure to the frame being ready.
    clock_offset_s, clock_drift_ppm : float
        The camera's clock: ``offset + (1 + drift) * wall seconds``.
    supersample : int
        Sub-pixels per pixel side in the render.
    black_reflectance, white_reflectance, background_reflectance : float
        The print's black and white, and the cell behind the board.
    vendor, model, serial : str
        What the device reports.
    """

    camera: CameraModel
    target: CalibrationTarget
    mounting: str
    flange_T_camera: np.ndarray | None = None
    cell_T_target: np.ndarray | None = None
    cell_T_camera: np.ndarray | None = None
    flange_T_target: np.ndarray | None = None
    pixel_format: str = "Mono8"
    adc_bits: int = 12
    pixel_size_m: float = 3.45e-6
    full_well_e: float = 10500.0
    read_noise_e: float = 2.5
    dark_current_e_per_s: float = 5.0
    white_e_per_s: float = 6.0e5
    black_level_dn: float = 16.0
    gain_db: float = 0.0
    exposure_s: float = 0.01
    exposure_min_s: float = 2e-5
    exposure_max_s: float = 1.0
    auto_exposure: bool = False
    auto_exposure_level: float = 0.45
    auto_exposure_time_constant_s: float = 0.15
    blur_sigma_px: float = 0.7
    f_number: float = 4.0
    focus_distance_m: float | None = None
    shutter: str = "global"
    line_time_s: float = 1.5e-5
    trigger_delay_s: float = 2e-5
    readout_s: float = 0.01
    clock_offset_s: float = 2000.0
    clock_drift_ppm: float = 0.0
    supersample: int = 2
    black_reflectance: float = 0.04
    white_reflectance: float = 0.85
    background_reflectance: float = 0.15
    vendor: str = "cellcal"
    model: str = "CELLCAL-SIM-C1"
    serial: str = "SIMCAM-0001"

    def __post_init__(self) -> None:
        if self.mounting not in MOUNTINGS:
            raise ValueError(f"mounting must be one of {MOUNTINGS}, got {self.mounting!r}")
        need = ("flange_T_camera", "cell_T_target") if self.mounting == "eye_in_hand" else \
            ("cell_T_camera", "flange_T_target")
        for name in need:
            T = getattr(self, name)
            if T is None:
                raise ValueError(f"{self.mounting} needs {name}")
            object.__setattr__(self, name, check_transform(T, name).copy())
        if self.pixel_format not in PIXEL_FORMATS:
            raise ValueError(f"pixel_format must be one of {PIXEL_FORMATS}, got {self.pixel_format!r}")
        if self.shutter not in SHUTTERS:
            raise ValueError(f"shutter must be one of {SHUTTERS}, got {self.shutter!r}")
        if not 8 <= int(self.adc_bits) <= 16:
            raise ValueError(f"adc_bits must be 8 to 16, got {self.adc_bits!r}")
        if not 0 < self.exposure_min_s <= self.exposure_s <= self.exposure_max_s:
            raise ValueError("exposure must satisfy 0 < exposure_min_s <= exposure_s <= exposure_max_s")
        if not 1 <= int(self.supersample) <= 4:
            raise ValueError(f"supersample must be 1 to 4, got {self.supersample!r}")
        if not 0 <= self.black_reflectance < self.white_reflectance <= 1:
            raise ValueError("reflectances must satisfy 0 <= black < white <= 1")

    @property
    def max_dn(self) -> int:
        """Largest ADC value."""
        return (1 << int(self.adc_bits)) - 1

    @property
    def system_gain_dn_per_e(self) -> float:
        """DN (ADC units) per electron at 0 dB: the full well just reaches the ADC's top."""
        return (self.max_dn - self.black_level_dn) / self.full_well_e


@dataclass(frozen=True, kw_only=True, eq=False)
class CameraFrame:
    """One simulated frame, as a frame source hands it to a device model.

    Attributes
    ----------
    image : numpy.ndarray, shape (height, width)
        uint8 (Mono8) or uint16 (Mono16).
    pixel_format : str
    frame_id : int
        Counts from 1.
    exposure_s, gain_db : float
        Applied to this frame.
    t_mid_device_ns : int
        The camera's clock at mid-exposure (of the centre row, for a rolling shutter).
    line_time_s : float
        Row ``r``'s mid-exposure is ``t_mid + (r - (height - 1) / 2) * line_time_s``
        (0 for a global shutter).
    t_request_clock_ns, t_ready_clock_ns : int
        World clock (host ``monotonic_ns`` by default) of the request and of the frame
        being read out (a device should not send it earlier).
    t_mid_s : float
        Simulated time of mid-exposure (truth, for tests).
    camera_T_target : numpy.ndarray, shape (4, 4)
        True pose of the board at mid-exposure (truth, for tests).
    exposure_settled : bool
        Auto-exposure off, or its last correction below 3 %.
    saturated_fraction : float
        Share of pixels at the ADC's top.
    """

    image: np.ndarray
    pixel_format: str
    frame_id: int
    exposure_s: float
    gain_db: float
    t_mid_device_ns: int
    line_time_s: float
    t_request_clock_ns: int
    t_ready_clock_ns: int
    t_mid_s: float
    camera_T_target: np.ndarray
    exposure_settled: bool
    saturated_fraction: float


def _board_texture(target: CalibrationTarget, texels_per_square: int, black: float, white: float) -> np.ndarray:
    """Reflectance texture (float32) of the print on its plate: one white square all round."""
    sx, sy, n = target.squares_x, target.squares_y, texels_per_square
    if target.kind == "charuco":
        from cellcal.drivers.detect import import_cv2

        cv2 = import_cv2()
        dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, str(target.dictionary)))
        board = cv2.aruco.CharucoBoard((sx, sy), target.square_m, target.marker_m, dictionary)
        board.setLegacyPattern(bool(target.legacy_pattern))
        print_ = board.generateImage((sx * n, sy * n), marginSize=0, borderBits=1).astype(np.float32) / 255.0
    else:
        cols = np.arange(sx * n) // n
        rows = np.arange(sy * n) // n
        print_ = ((rows[:, None] + cols[None, :]) % 2 == 1).astype(np.float32)
    tex = np.ones(((sy + 2) * n, (sx + 2) * n), dtype=np.float32)
    tex[n:-n, n:-n] = print_
    return black + (white - black) * tex


_RAYS: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
_RAYS_LOCK = threading.Lock()
_RAYS_KEEP = 4


#: Every how many sub-pixels (in each direction) the ray map is undistorted exactly; those
#: between are interpolated (module docstring; ``tests/test_sim_camera_rays.py`` measures
#: the difference from an exact map).
RAY_STEP = 4
#: The largest difference (pixels) an interpolated ray may have from an exact one; where the
#: coarse samples' curvature could exceed it the sub-pixels are undistorted exactly.
RAY_TOL_PX = 1e-4


def _axis_weights(n: int, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coarse sample indices along an axis of ``n`` sub-pixels (every ``step``-th and the
    last), and for each of the ``n`` the coarse interval it falls in and its linear weight."""
    coarse = np.arange(0, n, step)
    if coarse[-1] != n - 1:
        coarse = np.append(coarse, n - 1)
    fine = np.arange(n)
    j = np.clip(np.searchsorted(coarse, fine, side="right") - 1, 0, max(len(coarse) - 2, 0))
    if len(coarse) == 1:
        return coarse, j, np.zeros(n)
    t = (fine - coarse[j]) / (coarse[j + 1] - coarse[j])
    return coarse, j, t


def _coarse_cells_to_refine(xc_px: np.ndarray, yc_px: np.ndarray, ok_c: np.ndarray) -> np.ndarray:
    """Coarse cells (between samples ``[a, a + 1] x [b, b + 1]``, shape ``(nv - 1, nu - 1)``
    but padded to ``(nv, nu)``) whose interpolated rays may be off by more than
    :data:`RAY_TOL_PX`: a second difference (pixels) around a corner over eight times it,
    or a corner whose undistortion did not converge."""
    nv, nu = ok_c.shape
    est = np.zeros((nv, nu))
    for c in (xc_px, yc_px):
        if nu >= 3:
            d = np.abs(c[:, 2:] - 2.0 * c[:, 1:-1] + c[:, :-2])
            est += np.pad(d, ((0, 0), (1, 1)), mode="edge")
        if nv >= 3:
            d = np.abs(c[2:, :] - 2.0 * c[1:-1, :] + c[:-2, :])
            est += np.pad(d, ((1, 1), (0, 0)), mode="edge")
    node_bad = (est / 8.0 > RAY_TOL_PX) | ~ok_c | ~np.isfinite(est)
    # a cell is refined when any of its four corners is
    cell = node_bad.copy()
    cell[:, :-1] |= node_bad[:, 1:]
    cell[:-1, :] |= cell[1:, :]
    return cell


def _rays(camera: CameraModel, ss: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Undistorted normalised coordinates of every sub-pixel centre (pixel ``i`` covers
    ``[i - 0.5, i + 0.5]``) and where the undistortion converged, kept (read-only) for the
    last few cameras: a second camera of the same model costs nothing. The undistortion runs
    on every :data:`RAY_STEP`-th sub-pixel (and the last row and column); the others are
    interpolated bilinearly, valid where the four around them converged."""
    key = (camera.parameters.tobytes(), camera.image_size, int(ss))
    with _RAYS_LOCK:
        hit = _RAYS.get(key)
    if hit is not None:
        return hit
    w, h = camera.image_size
    us = (np.arange(w * ss) + 0.5) / ss - 0.5
    vs = (np.arange(h * ss) + 0.5) / ss - 0.5
    cu, ju, tu = _axis_weights(len(us), RAY_STEP)
    cv, jv, tv = _axis_weights(len(vs), RAY_STEP)
    xy, ok_c = camera.undistort(np.stack(np.meshgrid(us[cu], vs[cv]), axis=-1))
    xc = np.where(ok_c, xy[..., 0], 0.0)
    yc = np.where(ok_c, xy[..., 1], 0.0)
    ju1 = np.minimum(ju + 1, len(cu) - 1)
    jv1 = np.minimum(jv + 1, len(cv) - 1)
    tu_, tv_ = tu[None, :], tv[:, None]

    def lerp(c: np.ndarray) -> np.ndarray:
        # along u on the coarse rows (a quarter of the work), then whole rows along v
        a = c[:, ju] * (1.0 - tu_) + c[:, ju1] * tu_
        return a[jv] * (1.0 - tv_) + a[jv1] * tv_

    ok_u = ok_c[:, ju] & ok_c[:, ju1]
    ok = ok_u[jv] & ok_u[jv1]
    x, y = np.where(ok, lerp(xc), 0.0), np.where(ok, lerp(yc), 0.0)
    # Where the interpolation could be off by more than RAY_TOL_PX (a strong lens; near a
    # fold, where some coarse sample did not converge) those sub-pixels are undistorted
    # exactly instead: the bilinear error is at most an eighth of the second difference.
    bad = _coarse_cells_to_refine(xc * camera.parameters[0], yc * camera.parameters[1], ok_c)
    if bad.mean() > 0.5:  # a wide-angle lens: the whole map exactly (cheaper than masks)
        xy, ok = camera.undistort(np.stack(np.meshgrid(us, vs), axis=-1))
        x, y = np.where(ok, xy[..., 0], 0.0), np.where(ok, xy[..., 1], 0.0)
    elif bad.any():
        fine = bad[jv][:, ju]
        uu, vv = np.meshgrid(us, vs)
        exact, ok_e = camera.undistort(np.stack([uu[fine], vv[fine]], axis=-1))
        x[fine] = np.where(ok_e, exact[:, 0], 0.0)
        y[fine] = np.where(ok_e, exact[:, 1], 0.0)
        ok[fine] = ok_e
    out = (x, y, ok)
    for a in out:
        a.setflags(write=False)
    with _RAYS_LOCK:
        if len(_RAYS) >= _RAYS_KEEP:
            _RAYS.pop(next(iter(_RAYS)))
        _RAYS[key] = out
    return out


class TargetRenderer:
    """Renders a target's reflectance as a camera sees it (module docstring, "Rendering").

    Parameters
    ----------
    camera : CameraModel
    target : CalibrationTarget
    supersample : int
        Sub-pixels per pixel side.
    texels_per_square : int
        Resolution of the finest texture level.
    black, white, background : float
        Reflectances of the print and of what lies beyond the plate.
    """

    def __init__(self, camera: CameraModel, target: CalibrationTarget, *, supersample: int = 2,
                 texels_per_square: int = 96, black: float = 0.04, white: float = 0.85,
                 background: float = 0.15) -> None:
        from cellcal.drivers.detect import import_cv2

        self.cv2 = cv2 = import_cv2()
        self.camera = camera
        self.target = target
        self.ss = int(supersample)
        self.background = float(background)
        tex = _board_texture(target, int(texels_per_square), float(black), float(white))
        self.levels = [tex]
        while min(self.levels[-1].shape) > 16:
            self.levels.append(cv2.pyrDown(self.levels[-1]))
        self.texels_per_m = texels_per_square / target.square_m
        self.origin_m = target.square_m  # the plate's corner is one square before the print's
        self._x, self._y, self._ok = _rays(camera, self.ss)

    def _level(self, camera_T_target: np.ndarray) -> int:
        """Pyramid level whose texels match a sub-pixel's footprint at the board's centre."""
        c = np.array([*(0.5 * np.asarray(self.target.size_m)), 0.0])
        R, t = camera_T_target[:3, :3], camera_T_target[:3, 3]
        depth = float((R @ c + t)[2])
        f = float(self.camera.camera_matrix[0, 0]) * self.ss
        cos_tilt = max(abs(float(R[2, 2])), 0.05)
        footprint = self.texels_per_m * max(depth, 1e-6) / f / math.sqrt(cos_tilt)
        if footprint <= 1.0:
            return 0
        return int(min(len(self.levels) - 1, max(0, round(math.log2(footprint)))))

    def render(self, camera_T_target: np.ndarray, rows: tuple[int, int] | None = None) -> np.ndarray:
        """Reflectance (float32) of output rows ``[r0, r1)`` (all by default), box-averaged
        over the sub-pixels."""
        w, h = self.camera.image_size
        r0, r1 = (0, h) if rows is None else rows
        s = self.ss
        sl = slice(r0 * s, r1 * s)
        x, y, ok = self._x[sl], self._y[sl], self._ok[sl]
        T = se3_inverse(np.asarray(camera_T_target, dtype=float))  # target_T_camera
        R, o = T[:3, :3], T[:3, 3]
        if o[2] >= 0.0:
            # The camera is behind the board's plane (z points away from a viewer of the print).
            return np.full((r1 - r0, w), self.background, dtype=np.float32)
        # Each expression in place, in the order it reads (the same roundings as the plain
        # expressions): five full-size temporaries fewer on a (2h, 2w) sub-pixel grid.
        tmp = np.empty_like(x)

        def plane(a: float, b: float, c: float) -> np.ndarray:  # a x + b y + c
            out = np.multiply(x, a)
            out += np.multiply(y, b, out=tmp)
            out += c
            return out

        dx, dy, dz = plane(R[0, 0], R[0, 1], R[0, 2]), plane(R[1, 0], R[1, 1], R[1, 2]), plane(R[2, 0], R[2, 1], R[2, 2])
        with np.errstate(divide="ignore", invalid="ignore"):
            sray = np.divide(-o[2], dz, out=dz)
        hit = np.isfinite(sray)
        hit &= sray > 0
        hit &= ok
        miss = np.logical_not(hit, out=hit)
        level = self._level(camera_T_target)
        scale = self.texels_per_m / (1 << level)

        def texel(d: np.ndarray, o_i: float) -> np.ndarray:
            # cv2.pyrDown centres texel j of a level on texel 2j of the one below: x_L = x_0 / 2^L
            m = np.multiply(sray, d, out=d)
            m += o_i
            m += self.origin_m
            m *= scale
            m -= 0.5
            out = m.astype(np.float32)
            np.copyto(out, np.float32(-1e6), where=miss)
            return out

        mx, my = texel(dx, o[0]), texel(dy, o[1])
        cv2 = self.cv2
        img = cv2.remap(self.levels[level], mx, my, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                        borderValue=self.background)
        if s > 1:
            img = cv2.resize(img, (w, r1 - r0), interpolation=cv2.INTER_AREA)
        return img


@dataclass
class _AutoExposure:
    exposure_s: float
    last_t_s: float | None = None
    settled: bool = True


class SimCamera:
    """A rendered camera in the simulated cell, and the frame source of a device model.

    ``frame(t_request_ns)`` is the whole interface a device model (the simulated GigE Vision
    device) needs: it returns a :class:`CameraFrame` holding the image, the exposure and gain
    applied, and the camera clock's reading at mid-exposure. Settings a device exposes as
    features are plain methods: :meth:`set_exposure_s`, :meth:`set_gain_db`,
    :meth:`set_auto_exposure`, :meth:`set_pixel_format`. Thread-safe (one frame at a time).

    Parameters
    ----------
    world : World
        The cell's truth: base pose, and the robot's flange over time.
    config : CameraConfig
    seed : int
        Seeds the sensor noise.
    """

    def __init__(self, world: World, config: CameraConfig, *, seed: int = 0) -> None:
        self.world = world
        self.config = config
        self.renderer = TargetRenderer(
            config.camera, config.target, supersample=config.supersample, black=config.black_reflectance,
            white=config.white_reflectance, background=config.background_reflectance)
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self._ae = _AutoExposure(config.exposure_s)
        self._gain_db = float(config.gain_db)
        self._auto = bool(config.auto_exposure)
        self._pixel_format = config.pixel_format
        self._frame_id = 0
        #: The ``stuck_image`` fault (:meth:`stick`): the last image, resent bit for bit.
        self._stuck = False
        self._last_image: np.ndarray | None = None
        c = config.target.size_m
        self._outline = np.array([[0, 0, 0], [c[0], 0, 0], [c[0], c[1], 0], [0, c[1], 0]], dtype=float)

    # -- settings -------------------------------------------------------------------------
    @property
    def width(self) -> int:
        return self.config.camera.width

    @property
    def height(self) -> int:
        return self.config.camera.height

    @property
    def exposure_s(self) -> float:
        return self._ae.exposure_s

    @property
    def gain_db(self) -> float:
        return self._gain_db

    @property
    def pixel_format(self) -> str:
        return self._pixel_format

    @property
    def auto_exposure(self) -> bool:
        return self._auto

    def set_exposure_s(self, exposure_s: float) -> float:
        """Set the exposure (clipped to the camera's limits); returns the value applied."""
        c = self.config
        with self._lock:
            self._ae.exposure_s = float(np.clip(float(exposure_s), c.exposure_min_s, c.exposure_max_s))
            return self._ae.exposure_s

    def set_gain_db(self, gain_db: float) -> float:
        """Set the analogue gain (0 to 24 dB); returns the value applied."""
        with self._lock:
            self._gain_db = float(np.clip(float(gain_db), 0.0, 24.0))
            return self._gain_db

    def set_auto_exposure(self, on: bool) -> None:
        with self._lock:
            self._auto = bool(on)
            self._ae.settled = not on
            self._ae.last_t_s = None

    def set_pixel_format(self, pixel_format: str) -> None:
        if pixel_format not in PIXEL_FORMATS:
            raise ValueError(f"pixel format must be one of {PIXEL_FORMATS}, got {pixel_format!r}")
        with self._lock:
            self._pixel_format = pixel_format

    # -- truth and time ---------------------------------------------------------------------
    def camera_T_target(self, t_s: float) -> np.ndarray:
        """True pose of the board in the camera frame at simulated time ``t_s``."""
        c, w = self.config, self.world
        cell_T_flange = w.cell_T_base(t_s) @ w.base_T_flange_at(t_s)
        if c.mounting == "eye_in_hand":
            assert c.flange_T_camera is not None and c.cell_T_target is not None
            return se3_inverse(cell_T_flange @ c.flange_T_camera) @ c.cell_T_target
        assert c.cell_T_camera is not None and c.flange_T_target is not None
        return se3_inverse(c.cell_T_camera) @ cell_T_flange @ c.flange_T_target

    def device_ns(self, t_s: float) -> int:
        """The camera clock (ns) at simulated time ``t_s``: a wall-rate oscillator with its
        own offset and drift (module docstring, "Time")."""
        c = self.config
        wall = self.world.wall_s(t_s)
        return int(round((c.clock_offset_s + (1.0 + c.clock_drift_ppm * 1e-6) * wall) * 1e9))

    # -- frames -----------------------------------------------------------------------------
    def stick(self, on: bool = True) -> None:
        """The ``stuck_image`` fault: every frame from now on carries the last image sent,
        bit for bit, with fresh timestamps and frame ids (a device whose buffer is no longer
        refreshed); ``on=False`` heals it."""
        with self._lock:
            self._stuck = bool(on)

    def frame(self, t_request_ns: int | None = None) -> CameraFrame:
        """Expose, read out and return one frame (module docstring, "Time").

        Parameters
        ----------
        t_request_ns : int, optional
            World-clock instant of the trigger, ns (host ``time.monotonic_ns()`` for a world
            on ``time.monotonic``); now if omitted.
        """
        w, c = self.world, self.config
        with self._lock:
            if t_request_ns is None:
                t_req_s = w.now_s()
                t_request_ns = int(round(w.clock_s_at(t_req_s) * 1e9))
            else:
                t_req_s = w.sim_s_at(t_request_ns * 1e-9)
            exposure = self._ae.exposure_s
            gain_db = self._gain_db
            pixel_format = self._pixel_format
            t0 = t_req_s + c.trigger_delay_s
            h = self.height
            line = c.line_time_s if c.shutter == "rolling" else 0.0
            refl = self._integrate(t0, exposure, line)
            img, mean_level, saturated = self._sensor(refl, t0 + 0.5 * exposure, exposure, gain_db, pixel_format)
            if self._stuck and self._last_image is not None and self._last_image.shape == img.shape:
                img = self._last_image.copy()  # a stale buffer: the old image, fresh stamps and frame id
            else:
                self._last_image = img.copy()
            settled = self._update_exposure(t0, mean_level)
            self._frame_id += 1
            t_mid = t0 + 0.5 * exposure + 0.5 * (h - 1) * line
            t_ready = t0 + exposure + (h - 1) * line + c.readout_s
            return CameraFrame(
                image=img, pixel_format=pixel_format, frame_id=self._frame_id, exposure_s=exposure,
                gain_db=gain_db, t_mid_device_ns=self.device_ns(t_mid), line_time_s=line,
                t_request_clock_ns=int(t_request_ns), t_ready_clock_ns=int(round(w.clock_s_at(t_ready) * 1e9)),
                t_mid_s=t_mid, camera_T_target=self.camera_T_target(t_mid), exposure_settled=settled,
                saturated_fraction=saturated)

    def _image_motion_px(self, ta: float, tb: float) -> float:
        """Largest motion (px) of the board's outline in the image between two instants."""
        cam = self.config.camera
        a = cam.project(self.camera_T_target(ta), self._outline).uv
        b = cam.project(self.camera_T_target(tb), self._outline).uv
        d = np.linalg.norm(a - b, axis=-1)
        d = d[np.isfinite(d)]
        return float(d.max()) if d.size else 0.0

    def _integrate(self, t0: float, exposure: float, line: float) -> np.ndarray:
        """Reflectance averaged over each row's exposure (motion blur, rolling shutter)."""
        h = self.height
        n_sub = int(np.clip(math.ceil(self._image_motion_px(t0, t0 + exposure) / _BLUR_STEP_PX), 1, _MAX_SUBFRAMES))
        n_band = 1
        if line > 0:
            ro = self._image_motion_px(t0, t0 + (h - 1) * line)
            n_band = int(np.clip(math.ceil(ro / _BAND_STEP_PX), 1, min(_MAX_BANDS, h)))
        edges = np.linspace(0, h, n_band + 1).round().astype(int)
        out = np.empty((h, self.width), dtype=np.float32)
        for b in range(n_band):
            r0, r1 = int(edges[b]), int(edges[b + 1])
            t_row = t0 + 0.5 * (r0 + r1 - 1) * line
            acc = None
            for k in range(n_sub):
                t = t_row + (k + 0.5) / n_sub * exposure
                img = self.renderer.render(self.camera_T_target(t), (r0, r1))
                acc = img if acc is None else acc + img
            assert acc is not None
            out[r0:r1] = acc / n_sub
        return out

    def _defocus_sigma_px(self, t_s: float) -> float:
        c = self.config
        if c.focus_distance_m is None:
            return 0.0
        T = self.camera_T_target(t_s)
        centre = np.array([*(0.5 * np.asarray(c.target.size_m)), 0.0])
        d = float((T[:3, :3] @ centre + T[:3, 3])[2])
        f = float(c.camera.camera_matrix[0, 0]) * c.pixel_size_m
        df = c.focus_distance_m
        if d <= f or df <= f:
            return 0.0
        coc_m = f * f / (c.f_number * (df - f)) * abs(d - df) / d
        return 0.25 * coc_m / c.pixel_size_m

    def _sensor(self, refl: np.ndarray, t_mid: float, exposure: float, gain_db: float,
                pixel_format: str) -> tuple[np.ndarray, float, float]:
        c = self.config
        cv2 = self.renderer.cv2
        sigma = math.hypot(c.blur_sigma_px, self._defocus_sigma_px(t_mid))
        if sigma > 0.05:
            refl = cv2.GaussianBlur(refl, (0, 0), sigma)
        mu_e = refl.astype(np.float64) * (c.white_e_per_s * exposure) + c.dark_current_e_per_s * exposure
        e = np.minimum(self._rng.poisson(mu_e).astype(np.float64), c.full_well_e)
        if c.read_noise_e > 0:
            e += self._rng.normal(0.0, c.read_noise_e, e.shape)
        k = c.system_gain_dn_per_e * 10.0 ** (gain_db / 20.0)
        dn = np.clip(np.rint(e * k + c.black_level_dn), 0, c.max_dn)
        saturated = float(np.mean(dn >= c.max_dn))
        level = float(dn.mean()) / c.max_dn
        bits = int(c.adc_bits)
        if pixel_format == "Mono8":
            img = (dn.astype(np.uint32) >> (bits - 8)).astype(np.uint8)
        else:
            img = (dn.astype(np.uint32) << (16 - bits)).astype(np.uint16)
        return img, level, saturated

    def _update_exposure(self, t0: float, level: float) -> bool:
        c, ae = self.config, self._ae
        if not self._auto:
            return True
        want = ae.exposure_s * c.auto_exposure_level / max(level, 1e-4)
        want = float(np.clip(want, c.exposure_min_s, c.exposure_max_s))
        # the first frame after switching on counts as one frame time since the last
        dt = ae.exposure_s + c.readout_s if ae.last_t_s is None else max(t0 - ae.last_t_s, 0.0)
        alpha = 1.0 - math.exp(-dt / c.auto_exposure_time_constant_s)
        step = alpha * math.log(want / ae.exposure_s)
        was_settled = abs(math.log(want / ae.exposure_s)) < _AE_SETTLED
        ae.exposure_s = float(np.clip(ae.exposure_s * math.exp(step), c.exposure_min_s, c.exposure_max_s))
        ae.last_t_s = t0
        ae.settled = was_settled
        return was_settled

    def info(self) -> dict[str, Any]:
        """Identity and geometry a device model reports."""
        c = self.config
        return {"vendor": c.vendor, "model": c.model, "serial": c.serial, "width": self.width,
                "height": self.height, "pixel_formats": list(PIXEL_FORMATS)}

