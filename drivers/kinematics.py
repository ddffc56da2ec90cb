"""Serial-arm kinematics: standard DH forward kinematics, Jacobian, numerical IK, joint scaling.

Conventions
-----------
* Standard (distal) Denavit-Hartenberg: link ``i`` is
  ``T_i(q_i) = Rz(q_i + theta_offset_i) @ Tz(d_i) @ Tx(a_i) @ Rx(alpha_i)`` and
  ``base_T_flange = T_1 @ T_2 @ ... @ T_n``. Lengths in metres, angles in radians.
  An optional Hayati tilt ``beta_i`` appends ``Ry(beta_i)`` to link ``i``: the classical
  DH form cannot tilt a joint axis towards the next parallel one (UR joints 2-4), and a
  real arm's are never exactly parallel (the simulator's true arm uses it; a UR
  controller's own table, ``KinematicsInfo``, is plain DH).
* The Universal Robots e-series parameter sets below are the ones UR publishes
  ("DH parameters for calculations of kinematics and dynamics"): the *data-sheet* model.
  A real UR controller computes its ``actual_TCP_pose`` with its *factory calibration*,
  a DH table of its own per arm that it reports on the primary interface
  (``KinematicsInfo``, :mod:`cellcal.drivers.ur_primary`); :func:`dh_model_from_ur_table`
  builds the model from it, and FK of the reported joints with that model gives the
  flange pose the controller reports (the data-sheet model is off by millimetres).
  :func:`kinematics_digest` names a table unambiguously (provenance).
* Jacobians are geometric, in the base frame, rows ``(v, w)``: linear velocity of the flange
  origin (m/s) first, angular velocity (rad/s) second.

Joint counts (CiA 402 drives) map to joint radians with :class:`JointScaling`.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellcal.solver.errors import CellcalError
from cellcal.solver.se3 import so3_log

__all__ = [
    "DHModel",
    "UR_MODELS",
    "dh_model",
    "dh_model_from_table",
    "JointScaling",
    "UnreachablePose",
    "dh_model_from_ur_table",
    "kinematics_digest",
]

_HALF_PI = 0.5 * math.pi


class UnreachablePose(CellcalError, ValueError):
    """Inverse kinematics found no joint vector reaching the pose (outside the workspace).

    Also a ``ValueError``: the pose asked for is a bad argument, not a device failure.
    """


@dataclass(frozen=True)
class DHModel:
    """Standard DH parameters of an n-joint serial arm.

    Parameters
    ----------
    name : str
        Model name (``"ur5e"``, or ``"custom"`` for user parameters).
    d_m, a_m, alpha_rad, theta_offset_rad : array_like, shape (n,)
        Link offset along z (m), link length along x (m), link twist about x (rad) and the
        joint zero offset added to each joint angle (rad).
    beta_rad : array_like, shape (n,), optional
        Hayati tilt of each link about its own y axis after the twist (rad); zeros (plain
        DH) by default.
    """

    name: str
    d_m: np.ndarray
    a_m: np.ndarray
    alpha_rad: np.ndarray
    theta_offset_rad: np.ndarray = field(default=None)  # type: ignore[arg-type]  # None: zeros (__post_init__)
    beta_rad: np.ndarray = field(default=None)  # type: ignore[arg-type]  # None: zeros (__post_init__)

    def __post_init__(self) -> None:
        arrays = {}
        for key in ("d_m", "a_m", "alpha_rad", "theta_offset_rad", "beta_rad"):
            value = getattr(self, key)
            if value is None:
                value = np.zeros(len(self.d_m))
            arr = np.array(value, dtype=float).reshape(-1)
            arr.setflags(write=False)
            arrays[key] = arr
        n = len(arrays["d_m"])
        for key, arr in arrays.items():
            if len(arr) != n or n == 0:
                raise ValueError(f"DH {key}: expected {n} values, got {len(arr)}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"DH {key}: contains NaN or inf")
            object.__setattr__(self, key, arr)
        # Per-link constants of the closed-form flange speed, as Python floats: it runs for
        # every robot sample (500 Hz on RTDE), where numpy's per-call overhead on 3-vectors
        # costs more than the arithmetic.
        consts = tuple(zip(*(arrays[k].tolist() for k in ("theta_offset_rad", "a_m", "d_m")),
                           np.cos(arrays["alpha_rad"]).tolist(), np.sin(arrays["alpha_rad"]).tolist(),
                           np.cos(arrays["beta_rad"]).tolist(), np.sin(arrays["beta_rad"]).tolist(), strict=True))
        object.__setattr__(self, "_speed_consts", consts)

    @property
    def n_joints(self) -> int:
        """Number of joints."""
        return len(self.d_m)

    def with_joint_offsets(self, offsets_rad: Sequence[float] | np.ndarray, name: str | None = None) -> DHModel:
        """The same arm with ``offsets_rad`` (n,) added to each joint's zero offset."""
        off = np.asarray(offsets_rad, dtype=float).reshape(-1)
        if off.shape != (self.n_joints,):
            raise ValueError(f"joint offsets: expected {self.n_joints} values, got {off.shape}")
        return DHModel(
            name or self.name, self.d_m, self.a_m, self.alpha_rad, self.theta_offset_rad + off, self.beta_rad
        )

    def with_deltas(
        self,
        *,
        theta_rad: Any = None,
        a_m: Any = None,
        d_m: Any = None,
        alpha_rad: Any = None,
        beta_rad: Any = None,
        name: str | None = None,
    ) -> DHModel:
        """The same arm with each given (n,) delta added to its parameter (m, rad)."""
        def plus(base: np.ndarray, delta: Any, key: str) -> np.ndarray:
            if delta is None:
                return base
            arr = np.asarray(delta, dtype=float).reshape(-1)
            if arr.shape != base.shape:
                raise ValueError(f"{key} delta: expected {base.shape[0]} values, got {arr.shape}")
            return base + arr

        return DHModel(
            name or self.name,
            plus(self.d_m, d_m, "d_m"),
            plus(self.a_m, a_m, "a_m"),
            plus(self.alpha_rad, alpha_rad, "alpha_rad"),
            plus(self.theta_offset_rad, theta_rad, "theta_rad"),
            plus(self.beta_rad, beta_rad, "beta_rad"),
        )

    def scaled_lengths(self, factor: float, name: str | None = None) -> DHModel:
        """The same arm with every length (``a``, ``d``) times ``factor`` (thermal expansion)."""
        f = float(factor)
        return DHModel(name or self.name, self.d_m * f, self.a_m * f, self.alpha_rad, self.theta_offset_rad,
                       self.beta_rad)

    @property
    def is_plain_dh(self) -> bool:
        """True without Hayati tilts: the model a UR ``KinematicsInfo`` table can hold."""
        return not np.any(self.beta_rad)

    def ur_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(theta, a, d, alpha)`` (n,) each, m and rad: the layout of UR's ``KinematicsInfo``.

        Raises
        ------
        ValueError
            A model with Hayati tilts (a DH table cannot hold them).
        """
        if not self.is_plain_dh:
            raise ValueError(f"{self.name}: a model with Hayati tilts has no plain DH table")
        return (self.theta_offset_rad.copy(), self.a_m.copy(), self.d_m.copy(), self.alpha_rad.copy())

    def _check_q(self, q_rad: Any) -> np.ndarray:
        q = np.asarray(q_rad, dtype=float).reshape(-1)
        if q.shape != (self.n_joints,):
            raise ValueError(f"q_rad: expected shape ({self.n_joints},), got {np.shape(q_rad)}")
        if not np.all(np.isfinite(q)):
            raise ValueError("q_rad: contains NaN or inf")
        return q

    def link_transforms(self, q_rad: Any) -> np.ndarray:
        """Per-link transforms ``T_i`` (n, 4, 4) so that ``base_T_flange = T_1 @ ... @ T_n``."""
        q = self._check_q(q_rad) + self.theta_offset_rad
        ct, st = np.cos(q), np.sin(q)
        ca, sa = np.cos(self.alpha_rad), np.sin(self.alpha_rad)
        T = np.zeros((self.n_joints, 4, 4))
        T[:, 0, 0] = ct
        T[:, 0, 1] = -st * ca
        T[:, 0, 2] = st * sa
        T[:, 0, 3] = self.a_m * ct
        T[:, 1, 0] = st
        T[:, 1, 1] = ct * ca
        T[:, 1, 2] = -ct * sa
        T[:, 1, 3] = self.a_m * st
        T[:, 2, 1] = sa
        T[:, 2, 2] = ca
        T[:, 2, 3] = self.d_m
        T[:, 3, 3] = 1.0
        if np.any(self.beta_rad):
            # Hayati: T_i @ Ry(beta_i) (only the rotation columns change)
            cb, sb = np.cos(self.beta_rad), np.sin(self.beta_rad)
            R = T[:, :3, :3].copy()
            T[:, :3, 0] = R[:, :, 0] * cb[:, None] - R[:, :, 2] * sb[:, None]
            T[:, :3, 2] = R[:, :, 0] * sb[:, None] + R[:, :, 2] * cb[:, None]
        return T

    def forward(self, q_rad: Any) -> np.ndarray:
        """Flange pose ``base_T_flange`` (4, 4) for joint angles ``q_rad`` (n,) in radians."""
        out = np.eye(4)
        for Ti in self.link_transforms(q_rad):
            out = out @ Ti
        return out

    def jacobian(self, q_rad: Any) -> np.ndarray:
        """Geometric Jacobian (6, n) in the base frame, rows ``(v_m_s, w_rad_s)`` per rad/s."""
        return self._jacobian_of(self._frames(q_rad))

    def _frames(self, q_rad: Any) -> np.ndarray:
        """The base, each joint's frame and the flange (n + 1, 4, 4), chained as :meth:`forward`
        chains them (so ``_frames(q)[-1]`` is ``forward(q)`` bit for bit)."""
        links = self.link_transforms(q_rad)
        frames = np.empty((self.n_joints + 1, 4, 4))
        frames[0] = np.eye(4)
        for i, Ti in enumerate(links):
            frames[i + 1] = frames[i] @ Ti
        return frames

    def _jacobian_of(self, frames: np.ndarray) -> np.ndarray:
        """:meth:`jacobian` from the chained frames of :meth:`_frames`."""
        z = frames[:-1, :3, 2]  # (n, 3) joint axes
        r = frames[-1][:3, 3] - frames[:-1, :3, 3]  # (n, 3) joint origin -> flange
        J = np.empty((6, self.n_joints))
        # z x r written out: numpy's cross costs ~40 us per call for 3-vectors, and the
        # simulated robot evaluates this at its world-update rate
        J[0] = z[:, 1] * r[:, 2] - z[:, 2] * r[:, 1]
        J[1] = z[:, 2] * r[:, 0] - z[:, 0] * r[:, 2]
        J[2] = z[:, 0] * r[:, 1] - z[:, 1] * r[:, 0]
        J[3:] = z.T
        return J

    def flange_speed(self, q_rad: Any, qd_rad_s: Any) -> tuple[float, float]:
        """Flange speeds ``(linear m/s, angular rad/s)`` in the base frame, ``|J(q) qd|``.

        Closed form in one pass down the chain, without forming ``J``: with ``z_i`` and
        ``p_i`` the axis and origin of joint ``i`` and ``p_n`` the flange origin,
        ``w = sum_i qd_i z_i`` and ``v = sum_i qd_i z_i x (p_n - p_i) = w x p_n - sum_i
        qd_i (z_i x p_i)``. Equal to ``jacobian(q) @ qd`` to rounding (tested); about ten
        times cheaper, which matters because every robot sample pays it.

        Parameters
        ----------
        q_rad, qd_rad_s : array_like, shape (n,)
            Joint angles (rad) and joint speeds (rad/s).

        Returns
        -------
        (float, float)
            NaN where ``qd_rad_s`` holds a NaN (settle detection then rejects the sample).

        Raises
        ------
        ValueError
            Wrong shapes, or joint angles that are not finite.
        """
        q = self._check_q(q_rad).tolist()
        qd_arr = np.asarray(qd_rad_s, dtype=float).reshape(-1)
        if qd_arr.shape != (self.n_joints,):
            raise ValueError(f"qd_rad_s: expected shape ({self.n_joints},), got {np.shape(qd_rad_s)}")
        return self._flange_speed_floats(q, qd_arr.tolist())

    def _flange_speed_floats(self, q: Sequence[float], qd: Sequence[float]) -> tuple[float, float]:
        """:meth:`flange_speed` of n finite joint angles and n speeds given as Python floats,
        unchecked (a driver whose decoder has checked them already calls this)."""
        # frame of joint i (rotation columns x, y, z and origin p); joint 1's is the base
        r00, r01, r02 = 1.0, 0.0, 0.0
        r10, r11, r12 = 0.0, 1.0, 0.0
        r20, r21, r22 = 0.0, 0.0, 1.0
        px = py = pz = 0.0
        wx = wy = wz = 0.0  # sum qd_i z_i
        sx = sy = sz = 0.0  # sum qd_i z_i x p_i
        consts = self._speed_consts  # type: ignore[attr-defined]
        if len(q) != len(consts) or len(qd) != len(consts):
            raise ValueError(f"flange speed: expected {len(consts)} joint angles and speeds, got {len(q)} and {len(qd)}")
        for qi, qdi, (off, a, d, ca, sa, cb, sb) in zip(q, qd, consts, strict=True):
            # joint i's axis is the z column of its frame
            wx += qdi * r02
            wy += qdi * r12
            wz += qdi * r22
            sx += qdi * (r12 * pz - r22 * py)
            sy += qdi * (r22 * px - r02 * pz)
            sz += qdi * (r02 * py - r12 * px)
            th = qi + off
            c, s = math.cos(th), math.sin(th)
            # origin of the next frame: p + R (a c, a s, d)
            ac, as_ = a * c, a * s
            px += r00 * ac + r01 * as_ + r02 * d
            py += r10 * ac + r11 * as_ + r12 * d
            pz += r20 * ac + r21 * as_ + r22 * d
            # link rotation Rz(th) Rx(alpha) Ry(beta), columns (l0, l1, l2)
            l00, l10, l20 = c * cb - s * sa * sb, s * cb + c * sa * sb, -ca * sb
            l01, l11, l21 = -s * ca, c * ca, sa
            l02, l12, l22 = c * sb + s * sa * cb, s * sb - c * sa * cb, ca * cb
            r00, r01, r02 = (r00 * l00 + r01 * l10 + r02 * l20, r00 * l01 + r01 * l11 + r02 * l21,
                             r00 * l02 + r01 * l12 + r02 * l22)
            r10, r11, r12 = (r10 * l00 + r11 * l10 + r12 * l20, r10 * l01 + r11 * l11 + r12 * l21,
                             r10 * l02 + r11 * l12 + r12 * l22)
            r20, r21, r22 = (r20 * l00 + r21 * l10 + r22 * l20, r20 * l01 + r21 * l11 + r22 * l21,
                             r20 * l02 + r21 * l12 + r22 * l22)
        vx = wy * pz - wz * py - sx
        vy = wz * px - wx * pz - sy
        vz = wx * py - wy * px - sz
        return math.sqrt(vx * vx + vy * vy + vz * vz), math.sqrt(wx * wx + wy * wy + wz * wz)

    def inverse(
        self,
        base_T_flange: np.ndarray,
        q_seed_rad: Any,
        *,
        tol_m: float = 1e-9,
        tol_rad: float = 1e-9,
        max_iter: int = 200,
    ) -> np.ndarray:
        """Joint angles (n,) reaching ``base_T_flange``, found from ``q_seed_rad``.

        Damped least squares on the pose error ``(p* - p, log(R* R^T))`` in the base frame.
        The solution returned is the one the iteration reaches from the seed, i.e. normally
        the branch nearest the seed (no jumps between elbow/wrist configurations).

        Raises
        ------
        UnreachablePose
            If the iteration does not converge (pose outside the workspace or at a
            singularity the damping cannot cross).
        """
        target = np.asarray(base_T_flange, dtype=float)
        q = self._check_q(q_seed_rad).copy()
        reach = float(np.sum(np.abs(self.a_m)) + np.sum(np.abs(self.d_m)))
        if float(np.linalg.norm(target[:3, 3])) > reach:
            raise UnreachablePose(
                f"{self.name}: target {np.linalg.norm(target[:3, 3]):.3f} m from the base, "
                f"beyond the {reach:.3f} m the links can span"
            )
        lam2 = 1e-6
        err_norm = math.inf
        history: list[float] = []
        for it in range(max_iter):
            frames = self._frames(q)
            T = frames[-1]
            e = np.concatenate([target[:3, 3] - T[:3, 3], so3_log(target[:3, :3] @ T[:3, :3].T)])
            if np.linalg.norm(e[:3]) < tol_m and np.linalg.norm(e[3:]) < tol_rad:
                return _wrap_near(q, self._check_q(q_seed_rad))
            J = self._jacobian_of(frames)
            new_norm = float(np.linalg.norm(e))
            history.append(new_norm)
            # A reachable pose converges quadratically (within about 30 iterations here); an
            # error that fell by less than 0.1 % over the last 20 is a local minimum of a pose
            # the links cannot reach from this seed: say so now, not after max_iter.
            if it >= _STALL_FROM and new_norm > _STALL_RATIO * history[it - _STALL_WINDOW]:
                raise UnreachablePose(
                    f"{self.name}: inverse kinematics stalled at pose error {new_norm:.3g} "
                    f"(iteration {it + 1}; the pose is out of reach from this seed)"
                )
            # Levenberg-Marquardt style damping: shrink when improving, grow when not.
            lam2 = max(lam2 * 0.3, 1e-12) if new_norm < err_norm else min(lam2 * 10.0, 1.0)
            err_norm = new_norm
            step = J.T @ np.linalg.solve(J @ J.T + lam2 * np.eye(6), e)
            n = float(np.linalg.norm(step))
            if n > 0.5:  # bound the step so the linearisation stays meaningful
                step *= 0.5 / n
            q = q + step
        raise UnreachablePose(
            f"{self.name}: inverse kinematics did not converge (pose error {err_norm:.3g})"
        )


#: inverse kinematics gives up after ``_STALL_FROM`` iterations once its error fell by less
#: than ``1 - _STALL_RATIO`` over the last ``_STALL_WINDOW`` (measured on seeded UR5e poses:
#: every reachable one converged within 31 iterations; unreachable ones then stop after a
#: median 49 instead of ``max_iter``)
_STALL_FROM, _STALL_WINDOW, _STALL_RATIO = 40, 20, 0.999


def _wrap_near(q: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Each angle of ``q`` shifted by multiples of 2 pi to lie within pi of ``ref``."""
    return ref + (q - ref + math.pi) % (2.0 * math.pi) - math.pi


def _ur(name: str, d: Sequence[float], a: Sequence[float]) -> DHModel:
    return DHModel(name, np.asarray(d), np.asarray(a), np.array([_HALF_PI, 0.0, 0.0, _HALF_PI, -_HALF_PI, 0.0]))


#: Universal Robots e-series nominal DH parameters (metres, radians).
UR_MODELS: Mapping[str, DHModel] = {
    "ur3e": _ur("ur3e", (0.15185, 0, 0, 0.13105, 0.08535, 0.0921), (0, -0.24355, -0.2132, 0, 0, 0)),
    "ur5e": _ur("ur5e", (0.1625, 0, 0, 0.1333, 0.0997, 0.0996), (0, -0.425, -0.3922, 0, 0, 0)),
    "ur10e": _ur(
        "ur10e", (0.1807, 0, 0, 0.17415, 0.11985, 0.11655), (0, -0.6127, -0.57155, 0, 0, 0)
    ),
}


def dh_model(name: str) -> DHModel:
    """The named nominal model (``ur3e``, ``ur5e``, ``ur10e``; case-insensitive)."""
    try:
        return UR_MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown robot model {name!r}; known: {', '.join(sorted(UR_MODELS))} "
            "(or give user DH parameters)"
        ) from None


def dh_model_from_ur_table(theta_rad: Any, a_m: Any, d_m: Any, alpha_rad: Any, name: str = "ur-factory") -> DHModel:
    """The model of a UR controller's own DH table (``KinematicsInfo``: the factory calibration).

    Parameters
    ----------
    theta_rad, a_m, d_m, alpha_rad : array_like, shape (6,)
        UR's order and meaning: joint zero offsets (rad), link lengths and offsets (m),
        link twists (rad).
    name : str
        The model's name (the driver uses the nominal model's, e.g. ``"ur5e"``).

    Raises
    ------
    ValueError
        Wrong lengths, or values that are not finite.
    """
    return DHModel(name, np.asarray(d_m, dtype=float), np.asarray(a_m, dtype=float),
                   np.asarray(alpha_rad, dtype=float), np.asarray(theta_rad, dtype=float))


def kinematics_digest(model: DHModel) -> str:
    """``"sha256:<hex>"`` of a model's table: a plain DH model's as UR's ``KinematicsInfo``
    orders it (theta, a, d, alpha; big-endian float64); a model with Hayati tilts (an
    identified arm) the same with its tilts (beta) after them. The same table always gives
    the same digest, and any change of a parameter gives another (result provenance, and
    which identified model a run's poses came from)."""
    n = model.n_joints
    arrays = [model.theta_offset_rad, model.a_m, model.d_m, model.alpha_rad]
    if not model.is_plain_dh:
        arrays.append(model.beta_rad)
    data = struct.pack(f">{len(arrays) * n}d", *np.concatenate(arrays))
    return "sha256:" + hashlib.sha256(data).hexdigest()


_DH_KEYS = {"d_m", "a_m", "alpha_rad", "alpha_deg", "theta_offset_rad", "theta_offset_deg"}


def dh_model_from_table(table: Mapping[str, Any], path: str = "dh") -> DHModel:
    """A user DH model from a config table.

    Keys: ``d_m``, ``a_m`` (lists, metres), ``alpha_rad`` or ``alpha_deg``, and optionally
    ``theta_offset_rad`` or ``theta_offset_deg`` (lists of the same length).

    Raises
    ------
    ValueError
        Naming the dotted path of an unknown, missing or malformed key.
    """
    unknown = set(table) - _DH_KEYS
    if unknown:
        raise ValueError(f"{path}.{sorted(unknown)[0]}: unknown key (allowed: {sorted(_DH_KEYS)})")
    for key in ("d_m", "a_m"):
        if key not in table:
            raise ValueError(f"{path}.{key}: required")
    if ("alpha_rad" in table) == ("alpha_deg" in table):
        raise ValueError(f"{path}.alpha_rad: give exactly one of alpha_rad / alpha_deg")
    if "theta_offset_rad" in table and "theta_offset_deg" in table:
        raise ValueError(f"{path}.theta_offset_rad: give at most one of theta_offset_rad/_deg")

    def arr(key: str, scale: float = 1.0) -> np.ndarray:
        try:
            return np.asarray(table[key], dtype=float).reshape(-1) * scale
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}.{key}: expected a list of numbers ({exc})") from None

    alpha = arr("alpha_rad") if "alpha_rad" in table else arr("alpha_deg", math.pi / 180)
    if "theta_offset_rad" in table:
        theta = arr("theta_offset_rad")
    elif "theta_offset_deg" in table:
        theta = arr("theta_offset_deg", math.pi / 180)
    else:
        theta = None
    try:
        return DHModel("custom", arr("d_m"), arr("a_m"), alpha, theta)  # type: ignore[arg-type]  # None: zeros
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


@dataclass(frozen=True)
class JointScaling:
    """Drive position counts to joint radians, per joint.

    ``q_rad = sign * 2 pi * (counts - offset_counts) / (counts_per_rev * gear_ratio)``

    Parameters
    ----------
    counts_per_rev : array_like, shape (n,)
        Encoder counts per motor revolution (> 0).
    gear_ratio : array_like, shape (n,)
        Motor revolutions per joint revolution (> 0; 1 for a direct drive or an encoder on
        the output side).
    sign : array_like, shape (n,)
        +1 or -1: the drive's positive direction relative to the kinematic joint axis.
    offset_counts : array_like, shape (n,)
        Count value at the kinematic zero of the joint.
    """

    counts_per_rev: np.ndarray
    gear_ratio: np.ndarray
    sign: np.ndarray
    offset_counts: np.ndarray

    def __post_init__(self) -> None:
        n = len(np.atleast_1d(self.counts_per_rev))
        for key in ("counts_per_rev", "gear_ratio", "sign", "offset_counts"):
            arr = np.array(getattr(self, key), dtype=float).reshape(-1)
            if arr.shape != (n,):
                raise ValueError(f"joint scaling {key}: expected {n} values, got {arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"joint scaling {key}: contains NaN or inf")
            arr.setflags(write=False)
            object.__setattr__(self, key, arr)
        if np.any(self.counts_per_rev <= 0) or np.any(self.gear_ratio <= 0):
            raise ValueError("joint scaling: counts_per_rev and gear_ratio must be > 0")
        if not np.all(np.isin(self.sign, (-1.0, 1.0))):
            raise ValueError(f"joint scaling sign: each must be +1 or -1, got {self.sign}")

    @classmethod
    def uniform(
        cls,
        n: int,
        counts_per_rev: float,
        gear_ratio: float = 1.0,
        sign: float = 1.0,
        offset_counts: float = 0.0,
    ) -> JointScaling:
        """The same scaling on ``n`` joints."""
        return cls(*(np.full(n, float(v)) for v in (counts_per_rev, gear_ratio, sign, offset_counts)))

    @property
    def rad_per_count(self) -> np.ndarray:
        """Joint radians per count (n,), signed."""
        return self.sign * 2.0 * math.pi / (self.counts_per_rev * self.gear_ratio)

    def to_rad(self, counts: Any) -> np.ndarray:
        """Joint angles (n,) in radians from position counts (n,)."""
        c = np.asarray(counts, dtype=float)
        return (c - self.offset_counts) * self.rad_per_count

    def to_counts(self, q_rad: Any) -> np.ndarray:
        """Nearest integer position counts (n,) for joint angles (n,) in radians."""
        q = np.asarray(q_rad, dtype=float)
        return np.rint(q / self.rad_per_count + self.offset_counts).astype(np.int64)
