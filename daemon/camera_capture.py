"""A camera station: the robot at rest, a settled frame exposed while it rests, the target found.

:class:`CameraCapture` holds the open camera (``cellcal.drivers.camera``), the target's
detector (``cellcal.drivers.detect``) and the ``[camera]`` settings; the capture engine
hands it a station (``CaptureEngine.capture_camera``). A station is accepted only when

1. the robot is at rest (the settle detector of the robot monitor, as for every station);
2. the exposure has settled: with ``[camera] auto_exposure`` the frames are grabbed until two
   in a row report exposures within ``[camera.capture] exposure_settled_pct`` of each other
   (``exposure_not_settled`` after ``max_exposure_frames``); without it the first frame is
   taken. A frame is one whose exposure began after the call (the driver skips frames exposed
   earlier; a software trigger is fired after it);
3. the robot rested through the whole exposure: the rest window that held when the frame was
   asked for still holds after a robot sample later than the exposure's end (host time, the
   frame's mid-exposure mapped by the driver's clock model, widened by its uncertainty and
   ``[capture] sync_window_s``), and the samples of the exposure are one pose
   (``moved_during_exposure`` otherwise);
4. the robot state at mid-exposure, interpolated between the monitor's two samples around it
   (joints linearly, the flange pose linearly in translation and along the geodesic in
   rotation), agrees with forward kinematics of its joints (``fk_mismatch``), the pose is
   new (``duplicate_pose``), and the image is not one the camera sent at another pose, bit
   for bit (``camera_image_repeated``: a stale buffer resent with fresh stamps);
5. the target is seen: corners found (``no_target_in_view``), at least
   ``[camera.capture] min_corners`` of them (``too_few_corners``), and its edges sharp
   (:func:`edge_blur_px` at most ``max_blur_px``, ``image_blurred``).

The station's record (``StationRecord``) has the interpolated robot state, no tracker
measurement, and ``camera``: the frame's stamps (device ticks, mid-exposure device and host
time with its bound, arrival), exposure and gain, the detection (corner ids and sub-pixel
image points, the markers' ids), the blur figure, the interpolation used, the target file's
sha256 and the camera's identity; the PNG of the frame travels with it (``image_png``) to
the store, which writes it beside the database before the row commits (ADR 0030).

Link failures are the camera's :class:`~cellcal.daemon.consistency.DeviceFault`
(``protocol.DEVICE_CAMERA``): the service rides them out and reopens the camera as it does
the robot and the tracker.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellcal.daemon import protocol as P
from cellcal.daemon.capture import CaptureEngine, json_object
from cellcal.daemon.config import Camera, Config
from cellcal.daemon.consistency import DeviceFault, RejectReason, StationRejected, refuse_repeated
from cellcal.daemon.monitor import rest_spread
from cellcal.daemon.store import StationRecord
from cellcal.drivers.camera import CameraDriver, CameraInfo, FeatureUnavailableError, Frame, TriggerMode
from cellcal.drivers.detect import Detection, TargetDetector, import_cv2
from cellcal.drivers.errors import DriverError
from cellcal.drivers.robot import RobotState
from cellcal.solver.intrinsics import MIN_VIEW_CORNERS
from cellcal.solver.se3 import make_transform, rotation_angle, so3_exp, so3_log
from cellcal.solver.target import CalibrationTarget

log = logging.getLogger(__name__)

__all__ = ["CameraCapture", "MovingFrame", "camera_identity", "edge_blur_px", "encode_png", "interpolate_state", "SHARP_EDGE_PX"]

#: :func:`edge_blur_px` of a perfectly sharp edge: the central difference spreads a step over
#: two pixels, which reads as a sigma of about this much.
SHARP_EDGE_PX = 0.8
#: Corners :func:`edge_blur_px` looks at, at most (spread over the detection).
_BLUR_CORNERS = 40
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def camera_identity(info: CameraInfo) -> P.JsonObject:
    """What a result's provenance and the heartbeat record of an open camera."""
    return {"vendor": info.vendor, "model": info.model, "serial": info.serial, "firmware": info.firmware,
            "user_name": info.user_name, "address": info.address, "backend": info.backend}


def encode_png(image: npt.NDArray[np.float64], pixel_format: str) -> bytes:
    """Lossless PNG of a frame's image: 8-bit grey (Mono8 and Bayer mosaics), 16-bit grey
    (Mono10/12/16) or 8-bit RGB (stored in RGB order, as ``dir://`` recordings are:
    ``docs/protocols/camera-dir.md``)."""
    cv2 = import_cv2()
    img = np.asarray(image)
    if img.ndim == 3:
        if img.shape[2] != 3 or img.dtype != np.uint8:
            raise ValueError(f"a colour image must be (H, W, 3) uint8, got {img.dtype} {img.shape}")
        img = img[:, :, ::-1] if pixel_format == "RGB8" else img  # OpenCV writes BGR
    elif img.ndim != 2 or img.dtype not in (np.uint8, np.uint16):
        raise ValueError(f"{img.dtype} image of shape {img.shape} is none of 8/16-bit grey, 8-bit RGB")
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(img))
    if not ok:
        raise ValueError("OpenCV could not encode the frame as PNG")
    return bytes(buf.tobytes())


def edge_blur_px(image: npt.NDArray[np.float64], detection: Detection) -> float:
    """How blurred the target's edges are: the median over the corners (up to 40, spread over
    the detection) of ``contrast / (sqrt(2 pi) * steepest gradient)`` in a patch around each
    corner, the sigma of a Gaussian-blurred step with that contrast and slope (px).

    About :data:`SHARP_EDGE_PX` for a perfectly sharp edge (the central difference spreads a
    step over two pixels); it grows with defocus and motion blur. NaN without corners.
    """
    pts = detection.image_points_px
    if pts.shape[0] == 0:
        return math.nan
    a = np.asarray(image, dtype=np.float32)
    if a.ndim == 3:
        a = a.mean(axis=2)
    h, w = a.shape
    if pts.shape[0] >= 2:
        d = np.linalg.norm(pts[:, None, :] - pts[None, :, :], axis=2)
        np.fill_diagonal(d, np.inf)
        spacing = float(np.min(d))
    else:
        spacing = 24.0
    half = int(np.clip(round(spacing / 3.0), 3, 12))
    pick = np.unique(np.linspace(0, pts.shape[0] - 1, min(_BLUR_CORNERS, pts.shape[0])).round().astype(int))
    sigmas = []
    for u, v in pts[pick]:
        c, r = int(round(float(u))), int(round(float(v)))
        r0, r1, c0, c1 = max(r - half, 0), min(r + half + 1, h), max(c - half, 0), min(c + half + 1, w)
        if r1 - r0 < 3 or c1 - c0 < 3:
            continue
        patch = a[r0:r1, c0:c1]
        gy, gx = np.gradient(patch)
        g = float(np.percentile(np.hypot(gx, gy), 95))
        contrast = float(np.percentile(patch, 98) - np.percentile(patch, 2))
        if g > 0 and contrast > 0:
            sigmas.append(contrast / (_SQRT_2PI * g))
    return float(np.median(sigmas)) if sigmas else math.nan


def interpolate_state(samples: list[RobotState], t_ns: int
                      ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float, P.JsonObject]:
    """The robot at host time ``t_ns`` from its samples around it: ``(q_rad, base_T_flange,
    t_device_s, how)``. Joints and the device time linearly, the flange's translation
    linearly and its rotation along the geodesic between the two samples that bracket
    ``t_ns``; the nearest sample if none brackets it (``how["method"]`` says which).

    Raises
    ------
    ValueError
        No samples.
    """
    if not samples:
        raise ValueError("no robot samples to interpolate")
    ordered = sorted(samples, key=lambda s: s.t_host_ns)
    before = [s for s in ordered if s.t_host_ns <= t_ns]
    after = [s for s in ordered if s.t_host_ns > t_ns]
    if not before or not after:
        s = before[-1] if before else after[0]
        how: P.JsonObject = {"method": "nearest sample", "t_before_ns": int(s.t_host_ns), "t_after_ns": int(s.t_host_ns),
                             "offset_ns": int(t_ns - s.t_host_ns)}
        return np.array(s.q_rad, dtype=float), np.array(s.base_T_flange, dtype=float), float(s.t_device_s), how
    a, b = before[-1], after[0]
    span = b.t_host_ns - a.t_host_ns
    f = (t_ns - a.t_host_ns) / span if span > 0 else 0.0
    q = (1.0 - f) * np.asarray(a.q_rad, float) + f * np.asarray(b.q_rad, float)
    Ra, Rb = np.asarray(a.base_T_flange, float)[:3, :3], np.asarray(b.base_T_flange, float)[:3, :3]
    R = Ra @ so3_exp(f * so3_log(Ra.T @ Rb))
    p = (1.0 - f) * np.asarray(a.base_T_flange, float)[:3, 3] + f * np.asarray(b.base_T_flange, float)[:3, 3]
    t_dev = (1.0 - f) * float(a.t_device_s) + f * float(b.t_device_s)
    how = {"method": "linear in joints and translation, geodesic in rotation", "t_before_ns": int(a.t_host_ns),
           "t_after_ns": int(b.t_host_ns), "fraction": float(f)}
    return q, make_transform(R, p), t_dev, how


#: The flange velocity of a moving frame is the difference of the poses this far either side
#: of its mid-exposure (a few of the robot's samples at 500 Hz), host ns.
_VELOCITY_HALF_SPAN_NS = 5_000_000


@dataclass(frozen=True, eq=False)
class MovingFrame:
    """A frame taken while the robot moved (:meth:`CameraCapture.moving_frames`).

    Attributes
    ----------
    ids : numpy.ndarray of intp, shape (M,)
        The target's corner ids found.
    image_points_px : numpy.ndarray, shape (M, 2)
        Their sub-pixel positions, px.
    base_T_flange : numpy.ndarray, shape (4, 4)
        The flange at the frame's mid-exposure, base frame, m.
    flange_velocity : numpy.ndarray, shape (6,)
        The flange origin's velocity (m/s) then its angular velocity (rad/s), base frame,
        per second of host time.
    t_host_ns : int
        Mid-exposure, host ``time.monotonic_ns()``.
    exposure_s : float
    """

    ids: npt.NDArray[np.intp]
    image_points_px: npt.NDArray[np.float64]
    base_T_flange: npt.NDArray[np.float64]
    flange_velocity: npt.NDArray[np.float64]
    t_host_ns: int
    exposure_s: float


class CameraCapture:
    """The open camera and its stations (module docstring).

    Parameters
    ----------
    camera : CameraDriver
        Open.
    cfg : Config
        ``[camera]`` (settings, target, capture limits), ``[robot.settle]``, ``[capture]``.

    Raises
    ------
    DriverError, ValueError
        A setting the camera refuses (applied here: exposure, gain, pixel format, trigger).
    OpenCVUnavailable
        No OpenCV for the detector.
    """

    def __init__(self, camera: CameraDriver, cfg: Config) -> None:
        if cfg.camera is None or cfg.camera.target is None:
            raise ValueError("a camera capture needs a [camera] section with its target_file read")
        self.camera = camera
        self.cfg = cfg
        self.settings: Camera = cfg.camera
        self.target: CalibrationTarget = cfg.camera.target
        self.detector = TargetDetector(self.target)
        self.info = camera.info()
        self.identity = camera_identity(self.info)
        self._apply_settings()

    def _apply_settings(self) -> None:
        s, cam = self.settings, self.camera
        if s.pixel_format is not None and cam.get_pixel_format() != s.pixel_format:
            if cam.acquiring:
                cam.stop()
            cam.set_pixel_format(s.pixel_format)
        if s.exposure_ms is not None:
            cam.set_exposure_s(s.exposure_ms * 1e-3)
        if s.gain_db is not None:
            cam.set_gain_db(s.gain_db)
        try:
            cam.set_trigger_mode(s.trigger)
        except FeatureUnavailableError:
            if s.trigger != cam.trigger_mode:
                raise
            # a recording (dir://) has no trigger to set: its frames come one per grab anyway

    # ---- frames -------------------------------------------------------------------------------
    def _grab(self) -> Frame:
        try:
            return self.camera.grab(self.settings.capture.grab_timeout_s)
        except DriverError as exc:  # a timeout, a lost link, control lost: the camera's fault
            raise DeviceFault(P.DEVICE_CAMERA, exc) from exc

    def settled_frame(self) -> tuple[Frame, int]:
        """The first frame whose exposure has settled (module docstring, 2) and how many
        frames that took. Raises ``StationRejected(EXPOSURE_NOT_SETTLED)``."""
        c = self.settings.capture
        frame = self._grab()
        if not self.settings.auto_exposure:
            return frame, 1
        prev = self._exposure_of(frame)
        for n in range(2, c.max_exposure_frames + 1):
            frame = self._grab()
            now = self._exposure_of(frame)
            if prev > 0 and abs(now / prev - 1.0) * 100.0 <= c.exposure_settled_pct:
                return frame, n
            prev = now
        raise StationRejected(RejectReason.EXPOSURE_NOT_SETTLED,
                              f"the camera's auto-exposure did not settle within {c.max_exposure_frames} frames "
                              f"(last {prev * 1e3:.3f} ms; [camera.capture] exposure_settled_pct "
                              f"{c.exposure_settled_pct:g})", {"frames": c.max_exposure_frames, "exposure_s": prev})

    def _exposure_of(self, frame: Frame) -> float:
        if frame.exposure_s is not None:
            return float(frame.exposure_s)
        try:  # a camera that does not stamp its frames with the exposure: ask it
            return float(self.camera.get_exposure_s())
        except DriverError as exc:
            raise DeviceFault(P.DEVICE_CAMERA, exc) from exc

    def detect(self, frame: Frame) -> Detection:
        """The target's corners in a frame."""
        return self.detector.detect(frame.image)

    # ---- a station ----------------------------------------------------------------------------
    def station(self, engine: CaptureEngine, plan_index: int, accepted_poses: list[npt.NDArray[np.float64]],
                abort: threading.Event | None = None) -> StationRecord:
        """Capture one camera station (module docstring); raises ``StationRejected`` or
        ``DeviceFault``."""
        cfg, monitor = self.cfg, engine.monitor
        engine.phase = "settling"
        _state, status = monitor.wait_settled(cfg.capture.station_timeout_s, abort)
        window_start = status.window_start_ns
        engine.phase = "measuring"
        if abort is None:
            frame, n_frames = self.settled_frame()
        else:
            frame, n_frames = engine.abortable(self.settled_frame, (), abort, "measurement")
        try:
            return self._judge(engine, frame, n_frames, window_start, plan_index, accepted_poses, abort)
        finally:
            self._wind_down(engine)

    def _wind_down(self, engine: CaptureEngine) -> None:
        """After a station's or a sweep's frames: the engine settling again, a free-running
        camera stopped (free-running between stations would only load the link and a simulator)."""
        engine.phase = "settling"
        if self.settings.trigger == TriggerMode.OFF and self.camera.acquiring:
            try:
                self.camera.stop()
            except DriverError as exc:
                log.debug("stopping the camera's acquisition: %s", exc)

    def moving_frames(self, engine: CaptureEngine, base_T_flange: npt.NDArray[np.float64], speed: float,
                      abort: threading.Event) -> list[MovingFrame]:
        """The frames the camera takes while the robot moves to ``base_T_flange`` at ``speed``
        (the dynamic check of a camera hand-eye run, ``cellcal.daemon.runs.camera_dynamic``):
        grabbed one after another until the move has ended, each with the target's corners
        (frames with fewer than the solver's minimum are left out) and the robot at the
        frame's mid-exposure (host time): the flange pose interpolated as for a station, and
        its velocity from the poses :data:`_VELOCITY_HALF_SPAN_NS` either side. Raises as
        :meth:`CaptureEngine.sweep_to` and :meth:`station` do."""
        frames: list[Frame] = []

        def grab() -> None:
            frames.append(self._grab())

        try:
            engine.sweep_to(base_T_flange, speed, abort, grab)
        finally:
            self._wind_down(engine)
        if not frames:
            return []
        half = [round(0.5 * (f.exposure_s or 0.0) * 1e9) for f in frames]
        last = max(f.t_host_ns + h for f, h in zip(frames, half, strict=True)) + _VELOCITY_HALF_SPAN_NS
        first = min(f.t_host_ns - h for f, h in zip(frames, half, strict=True)) - _VELOCITY_HALF_SPAN_NS
        tol_ns = _gap_ns(self.cfg)
        engine.monitor.wait_sample_after(last + tol_ns, 2.0 + self.cfg.capture.sync_window_s,
                                         stamped_by=P.DEVICE_CAMERA)
        samples = engine.monitor.samples_between(first - tol_ns, last + tol_ns)
        if len(samples) < 2:
            return []
        out: list[MovingFrame] = []
        span_s = 2.0 * _VELOCITY_HALF_SPAN_NS * 1e-9
        for f in frames:
            det = self.detect(f)
            if det.ids.shape[0] < MIN_VIEW_CORNERS:
                continue
            _q, T, _t, _how = interpolate_state(samples, f.t_host_ns)
            _qa, Ta, _ta, _ha = interpolate_state(samples, f.t_host_ns - _VELOCITY_HALF_SPAN_NS)
            _qb, Tb, _tb, _hb = interpolate_state(samples, f.t_host_ns + _VELOCITY_HALF_SPAN_NS)
            v = (Tb[:3, 3] - Ta[:3, 3]) / span_s
            w = T[:3, :3] @ so3_log(Ta[:3, :3].T @ Tb[:3, :3]) / span_s  # base frame
            out.append(MovingFrame(ids=np.asarray(det.ids, dtype=np.intp),
                                   image_points_px=np.asarray(det.image_points_px, dtype=float), base_T_flange=T,
                                   flange_velocity=np.concatenate([v, w]), t_host_ns=int(f.t_host_ns),
                                   exposure_s=float(f.exposure_s or 0.0)))
        return out

    def _judge(self, engine: CaptureEngine, frame: Frame, n_frames: int, window_start: int, plan_index: int,
               accepted_poses: list[npt.NDArray[np.float64]], abort: threading.Event | None) -> StationRecord:
        cfg, monitor = self.cfg, engine.monitor
        half_ns = round(0.5 * (frame.exposure_s or 0.0) * 1e9)
        t0, t1 = frame.t_host_ns - half_ns, frame.t_host_ns + half_ns
        tol_ns = int(cfg.capture.sync_window_s * 1e9 + frame.t_host_uncertainty_ns) if math.isfinite(
            frame.t_host_uncertainty_ns) else int(cfg.capture.sync_window_s * 1e9)
        ahead_ns = t1 - time.monotonic_ns()
        if ahead_ns > tol_ns:
            raise DeviceFault(P.DEVICE_CAMERA, DriverError(
                f"the frame's exposure ends {ahead_ns * 1e-9:.3f} s in the future of the host clock (tolerance "
                f"{tol_ns * 1e-9:.3f} s): the camera's timestamps or their clock mapping are wrong"))
        monitor.wait_sample_after(t1 + tol_ns, 2.0 + cfg.capture.sync_window_s, stamped_by=P.DEVICE_CAMERA)
        st_now = monitor.wait_window_settled(window_start, cfg.robot.settle.dwell_s + 2.0, abort)
        _latest, st_latest = monitor.status()
        st = st_now if st_now is not None else st_latest
        figures: dict[str, object] = {
            "robot_quiet_s": st.quiet_s if st else 0.0,
            "robot_max_joint_speed_rad_s": st.max_joint_speed_rad_s if st else None,
            "robot_max_flange_speed_m_s": st.max_flange_speed_m_s if st else None,
            "robot_max_flange_ang_speed_rad_s": st.max_flange_ang_speed_rad_s if st else None,
            "exposure_s": frame.exposure_s, "gain_db": frame.gain_db, "exposure_frames": n_frames,
            "frame_t_host_uncertainty_s": frame.t_host_uncertainty_ns * 1e-9
            if math.isfinite(frame.t_host_uncertainty_ns) else None,
        }
        if st is None or st.window_start_ns != window_start or st.window_start_ns > t0 + tol_ns:
            figures.update(robot_window_start_ns=st.window_start_ns if st else 0, exposure_start_ns=t0)
            raise StationRejected(RejectReason.MOVED_DURING_EXPOSURE,
                                  "the robot did not rest through the frame's exposure", figures)
        samples = monitor.samples_between(max(t0 - tol_ns, window_start), t1 + tol_ns)
        q_range, q_allowed = rest_spread(samples, cfg.robot.settle)
        if q_range > q_allowed:
            figures.update(robot_q_range_rad=q_range, robot_q_allowed_rad=q_allowed, robot_samples=len(samples))
            raise StationRejected(RejectReason.MOVED_DURING_EXPOSURE,
                                  f"the robot samples of the exposure span {math.degrees(q_range):.4f} deg of a joint, "
                                  f"more than {math.degrees(q_allowed):.4f} deg at rest", figures)
        around = monitor.samples_between(frame.t_host_ns - tol_ns - _gap_ns(cfg), frame.t_host_ns + tol_ns + _gap_ns(cfg))
        if not around:
            raise StationRejected(RejectReason.NOT_SETTLED, "no robot sample around the frame's mid-exposure", figures)
        q, G, t_dev, how = interpolate_state(around, frame.t_host_ns)
        engine.check_fk(q, G, figures)
        c = cfg.capture
        for j, Ga in enumerate(accepted_poses):
            dt = float(np.linalg.norm(Ga[:3, 3] - G[:3, 3]))
            dr = rotation_angle(Ga[:3, :3].T @ G[:3, :3])
            if dt < c.min_pose_change_m and dr < c.min_pose_change_rad:
                figures.update(duplicate_of=j, distance_m=dt, angle_rad=dr)
                raise StationRejected(RejectReason.DUPLICATE_POSE, f"same pose as accepted station {j}", figures)
        det = self.detect(frame)
        figures["n_corners"] = det.n_corners
        cc = self.settings.capture
        if not det.found:
            raise StationRejected(RejectReason.NO_TARGET, f"no corner of the target ({self.target.describe()}) found "
                                                          "in the frame", figures)
        if det.n_corners < cc.min_corners:
            raise StationRejected(RejectReason.TOO_FEW_CORNERS,
                                  f"{det.n_corners} corners of the target found, at least {cc.min_corners} needed "
                                  "([camera.capture] min_corners)", figures)
        # The image is not one the camera sent at another pose, bit for bit (a stale buffer resent
        # with fresh stamps). Judged on views of the target only: two views of it from poses the
        # pose-change minimum apart differ even without sensor noise; an empty view may not.
        key = hashlib.blake2b(np.ascontiguousarray(frame.image).tobytes(), digest_size=16).digest()
        refuse_repeated(engine.session.repeated_image(key, G, c.min_pose_change_m, c.min_pose_change_rad),
                        RejectReason.IMAGE_REPEATED, "the camera sent, to the last bit, the image it sent",
                        "its image is stuck (whatever its timestamps say)", figures)
        blur = edge_blur_px(frame.image, det)
        figures["blur_px"] = blur
        if not math.isfinite(blur) or blur > cc.max_blur_px:
            raise StationRejected(RejectReason.BLURRED,
                                  f"the target's edges are blurred by {blur:.2f} px (sigma), more than "
                                  f"{cc.max_blur_px:g} px ([camera.capture] max_blur_px): focus, or light", figures)
        png = encode_png(frame.image, frame.pixel_format)
        return StationRecord(
            plan_index=plan_index, base_T_flange=G, q_rad=q, cell_T_target=None, cell_p_target=None,
            tracker_std_translation_m=0.0, tracker_std_rotation_rad=None, sample_count=0,
            robot_t_device_s=t_dev, robot_t_host_ns=int(frame.t_host_ns), tracker_t_device_s=0.0, tracker_t_host_ns=0,
            settle=json_object(figures),
            raw={"robot_samples": len(samples), "robot_window_ns": [int(samples[0].t_host_ns), int(samples[-1].t_host_ns)]
                 if samples else []},
            accepted_host_ns=time.monotonic_ns(),
            camera=self._record(frame, det, blur, n_frames, how),
            image_png=png,
        )

    def _record(self, frame: Frame, det: Detection, blur: float, n_frames: int, how: P.JsonObject) -> P.JsonObject:
        """The station's ``camera`` (module docstring); the store adds the image's path and hash."""
        return {
            "image_size": [frame.width, frame.height], "pixel_format": frame.pixel_format,
            "frame": {
                "frame_id": int(frame.frame_id), "device_timestamp": int(frame.device_timestamp),
                "tick_frequency_hz": float(frame.tick_frequency_hz), "t_device_s": _finite(frame.t_device_s),
                "t_host_ns": int(frame.t_host_ns), "t_host_uncertainty_ns": _finite(frame.t_host_uncertainty_ns),
                "t_received_ns": int(frame.t_received_ns), "exposure_s": _finite(frame.exposure_s),
                "gain_db": _finite(frame.gain_db), "frames_until_settled": int(n_frames),
            },
            "detection": {
                "target_kind": det.kind, "ids": [int(i) for i in det.ids],
                "image_points_px": [[float(u), float(v)] for u, v in det.image_points_px],
                "marker_ids": [int(i) for i in det.marker_ids], "n_corners": int(det.n_corners),
            },
            "blur_px": _finite(blur),
            "robot_at_mid_exposure": how,
            "target_sha256": self.settings.target_sha256,
            "device": self.identity,
        }


def _gap_ns(cfg: Config) -> int:
    """How far from mid-exposure a robot sample may be to bracket it (the monitor's gap)."""
    return int(max(cfg.robot.settle.max_sample_gap_s, 0.05) * 1e9)


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(float(v)) else float(v)

