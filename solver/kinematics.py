"""A six-joint serial arm in standard Denavit-Hartenberg form: pure numpy, vectorised.

The solver needs an arm of its own for two things: test worlds whose robot carries a real
kinematic error (a truth arm that differs from the nominal one the calibration believes),
and, later, kinematic identification built on the same parameters. It imports nothing of
ours (the drivers' :mod:`cellcal.drivers.kinematics` serves the controllers and is not
touched by this module).

Convention (standard, distal DH), link ``i`` of the arm::

    T_i(q_i) = Rz(q_i + theta_i) @ Tz(d_i) @ Tx(a_i) @ Rx(alpha_i) @ Ry(beta_i)
    base_T_flange(q) = T_1(q_1) @ T_2(q_2) @ ... @ T_6(q_6)

``beta`` (zeros unless given) is Hayati's tilt about the link's y axis. Classical DH cannot
describe a small tilt between two *parallel* joint axes (UR joints 2-4) without a huge
``d``: the common normal jumps. A tilt about y after the twist keeps every parameter small
and continuous there, so kinematic identification (:mod:`cellcal.solver.identify`) adds
``beta`` on the rows whose twist is near 0 or pi (:meth:`DHParameters.parallel_rows`) and
keeps classical DH elsewhere. With ``beta = 0`` the transform is the classical one exactly.

Parameters are four arrays of shape (6,), in the layout of Universal Robots'
``KinematicsInfo`` (and of the ``[mounting]`` section of a UR ``calibration.conf``):
``theta`` (joint zero offsets, rad), ``a`` (link lengths along x, m), ``d`` (link offsets
along z, m) and ``alpha`` (link twists about x, rad). A UR controller's own calibration
stores per-robot corrections ``delta_theta``, ``delta_a``, ``delta_d``, ``delta_alpha`` of
the same shape: :meth:`DHParameters.with_errors` applies such a set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["DHParameters", "KinematicModel", "UR5E", "N_JOINTS", "PARALLEL_TWIST_TOL_RAD"]

#: Joints of the arms this module models.
N_JOINTS = 6
#: A row whose twist is within this of 0 or pi joins two (nearly) parallel joint axes.
PARALLEL_TWIST_TOL_RAD = 0.01


def _zeros6() -> np.ndarray:
    return np.zeros(N_JOINTS)


def _as6(value: ArrayLike, name: str) -> np.ndarray:
    a = np.array(value, dtype=np.float64).reshape(-1)
    if a.shape != (N_JOINTS,):
        raise ValueError(f"DH {name}: expected {N_JOINTS} values, got shape {np.shape(value)}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"DH {name}: contains NaN or inf")
    a.setflags(write=False)
    return a


@dataclass(frozen=True, kw_only=True)
class DHParameters:
    """Standard DH parameters of a six-joint arm (module docstring for the convention).

    Attributes
    ----------
    a : numpy.ndarray, shape (6,)
        Link lengths along the link's x axis, m.
    d : numpy.ndarray, shape (6,)
        Link offsets along the joint's z axis, m.
    alpha : numpy.ndarray, shape (6,)
        Link twists about x, rad.
    theta : numpy.ndarray, shape (6,)
        Joint zero offsets added to each joint angle, rad (zeros for a nominal UR model).
    beta : numpy.ndarray, shape (6,)
        Hayati tilts about each link's y axis, rad (default zeros: classical DH).
    name : str
        What the parameters describe (``"ur5e"``, ``"ur5e + errors"``).

    Raises
    ------
    ValueError
        An array of the wrong shape or with NaN/inf.
    """

    a: np.ndarray
    d: np.ndarray
    alpha: np.ndarray
    theta: np.ndarray
    beta: np.ndarray = field(default_factory=_zeros6)
    name: str = "custom"

    def __post_init__(self) -> None:
        for key in ("a", "d", "alpha", "theta", "beta"):
            object.__setattr__(self, key, _as6(getattr(self, key), key))

    def parallel_rows(self) -> tuple[int, ...]:
        """0-based rows 0..4 whose twist is within :data:`PARALLEL_TWIST_TOL_RAD` of 0 or pi:
        joint ``i+1``'s axis parallel to joint ``i+2``'s (rows 1 and 2 of a UR arm). The last
        row joins joint 6 to the flange, not to another joint, and is never listed."""
        s = np.abs(np.sin(self.alpha[: N_JOINTS - 1]))
        return tuple(int(i) for i in np.flatnonzero(s < math.sin(PARALLEL_TWIST_TOL_RAD)))

    @property
    def reach_m(self) -> float:
        """Upper bound of the distance from the base origin to the flange origin, m:
        ``sum |a| + sum |d|`` (every link stretched in one line; the true reach is less)."""
        return float(np.sum(np.abs(self.a)) + np.sum(np.abs(self.d)))

    def with_errors(
        self,
        *,
        delta_theta: ArrayLike | None = None,
        delta_a: ArrayLike | None = None,
        delta_d: ArrayLike | None = None,
        delta_alpha: ArrayLike | None = None,
        delta_beta: ArrayLike | None = None,
        name: str | None = None,
    ) -> DHParameters:
        """The same arm with per-parameter errors added (each (6,), rad or m; None: zeros).

        This is how a truth arm differs from its nominal model: a UR controller's factory
        calibration is exactly such a set of deltas.
        """
        def add(base: np.ndarray, delta: ArrayLike | None, key: str) -> np.ndarray:
            return base if delta is None else base + _as6(delta, key)

        return type(self)(
            a=add(self.a, delta_a, "delta_a"), d=add(self.d, delta_d, "delta_d"),
            alpha=add(self.alpha, delta_alpha, "delta_alpha"), theta=add(self.theta, delta_theta, "delta_theta"),
            beta=add(self.beta, delta_beta, "delta_beta"),
            name=name if name is not None else f"{self.name} + errors",
        )

    def link_transforms(self, q_rad: ArrayLike) -> np.ndarray:
        """Per-link transforms ``T_i(q_i)``, shape (N, 6, 4, 4), for joint angles (N, 6) or (6,).

        Raises
        ------
        ValueError
            ``q_rad`` not of shape (N, 6) or (6,), or not finite.
        """
        q = np.asarray(q_rad, dtype=np.float64)
        if q.ndim == 1:
            q = q[None, :]
        if q.ndim != 2 or q.shape[1] != N_JOINTS:
            raise ValueError(f"q_rad: expected shape (N, {N_JOINTS}) or ({N_JOINTS},), got {np.shape(q_rad)}")
        if not np.all(np.isfinite(q)):
            raise ValueError("q_rad: contains NaN or inf")
        th = q + self.theta
        ct, st = np.cos(th), np.sin(th)
        ca, sa = np.cos(self.alpha), np.sin(self.alpha)
        T = np.zeros(q.shape + (4, 4))
        T[..., 0, 0] = ct
        T[..., 0, 1] = -st * ca
        T[..., 0, 2] = st * sa
        T[..., 0, 3] = self.a * ct
        T[..., 1, 0] = st
        T[..., 1, 1] = ct * ca
        T[..., 1, 2] = -ct * sa
        T[..., 1, 3] = self.a * st
        T[..., 2, 1] = sa
        T[..., 2, 2] = ca
        T[..., 2, 3] = self.d
        T[..., 3, 3] = 1.0
        if np.any(self.beta != 0.0):
            # Right-multiply by Ry(beta): columns x and z turn about y, y and the origin stay.
            cb, sb = np.cos(self.beta), np.sin(self.beta)
            x, z = T[..., :3, 0].copy(), T[..., :3, 2].copy()
            T[..., :3, 0] = cb[:, None] * x - sb[:, None] * z
            T[..., :3, 2] = sb[:, None] * x + cb[:, None] * z
        return T

    def forward(self, q_rad: ArrayLike) -> np.ndarray:
        """Flange poses ``base_T_flange``, shape (N, 4, 4), for joint angles (N, 6) (or one
        (6,) vector, still returned as (1, 4, 4)), radians; metres out."""
        L = self.link_transforms(q_rad)
        out = L[:, 0].copy()
        for i in range(1, N_JOINTS):
            out = out @ L[:, i]
        return out


@dataclass(frozen=True, kw_only=True)
class KinematicModel(DHParameters):
    """:class:`DHParameters` whose :meth:`forward` keeps the shape of its input.

    ``forward(q)`` is ``(4, 4) base_T_flange`` for one joint vector ``(6,)`` and
    ``(N, 4, 4)`` for ``(N, 6)``. This is the model kinematic identification returns
    (``result.model``); :class:`DHParameters` keeps its ``(1, 4, 4)`` for one vector, which
    its existing callers index.
    """

    @classmethod
    def from_dh(cls, params: DHParameters, *, name: str | None = None) -> KinematicModel:
        """The same arm as a :class:`KinematicModel`."""
        return cls(a=params.a, d=params.d, alpha=params.alpha, theta=params.theta, beta=params.beta,
                   name=params.name if name is None else name)

    def forward(self, q_rad: ArrayLike) -> np.ndarray:
        """``base_T_flange``: (4, 4) for joints (6,), (N, 4, 4) for (N, 6); rad in, m out."""
        T = super().forward(q_rad)
        return T[0] if np.ndim(q_rad) == 1 else T


#: Universal Robots UR5e nominal parameters, as UR publishes them ("DH parameters for
#: calculations of kinematics and dynamics"; the same numbers as the drivers' model).
UR5E = DHParameters(
    a=np.array([0.0, -0.425, -0.3922, 0.0, 0.0, 0.0]),
    d=np.array([0.1625, 0.0, 0.0, 0.1333, 0.0997, 0.0996]),
    alpha=np.array([0.5 * math.pi, 0.0, 0.0, 0.5 * math.pi, -0.5 * math.pi, 0.0]),
    theta=np.zeros(6),
    name="ur5e",
)
