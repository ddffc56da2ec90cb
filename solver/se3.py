"""SO(3), SE(3) and quaternion helpers under cellcal's conventions.

Conventions (ADR 0001)
----------------------
* ``a_T_b`` is a 4x4 float64 homogeneous transform mapping coordinates in frame ``b`` to
  frame ``a``: ``p_a = a_T_b @ p_b``; adjacent names cancel in a product,
  ``cell_T_flange = cell_T_base @ base_T_flange``.
* Quaternions are arrays ``(w, x, y, z)``, Hamilton product, unit norm, and returned with
  ``w >= 0`` (the two signs name the same rotation; we pick one so values compare).
* Rotation vectors and twists are in radians; twists are ordered ``(rho, phi)``:
  translation part first (metres), rotation part second (radians), as in Sophus.
* ``se3_exp``/``se3_log`` use the group exponential, so ``T @ se3_exp(xi)`` perturbs ``T``
  on the right (in its child frame).

Every function here accepts a single transform; the solver's batch paths live in
``cellcal.solver._core`` and use workspace buffers instead.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "hat",
    "vee",
    "so3_exp",
    "so3_log",
    "rotation_angle",
    "quat_from_matrix",
    "matrix_from_quat",
    "quat_multiply",
    "quat_conjugate",
    "quat_left",
    "quat_right",
    "make_transform",
    "transform_from_xyz_quat",
    "xyz_quat_from_transform",
    "se3_inverse",
    "se3_exp",
    "se3_log",
    "se3_adjoint",
    "check_transform",
]

_PI = math.pi


def hat(v: np.ndarray) -> np.ndarray:
    """Skew-symmetric matrix ``[v]x`` of a 3-vector, so ``hat(a) @ b == cross(a, b)``."""
    x, y, z = float(v[0]), float(v[1]), float(v[2])
    return np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])


def vee(S: np.ndarray) -> np.ndarray:
    """Inverse of :func:`hat` (uses the antisymmetric part, so it tolerates noise)."""
    return 0.5 * np.array([S[2, 1] - S[1, 2], S[0, 2] - S[2, 0], S[1, 0] - S[0, 1]])


def so3_exp(omega: np.ndarray) -> np.ndarray:
    """Rotation matrix of a rotation vector (rad), exact near zero.

    Parameters
    ----------
    omega : array_like, shape (3,)
        Axis times angle, radians.

    Returns
    -------
    numpy.ndarray, shape (3, 3)
    """
    w = np.asarray(omega, dtype=float)
    theta2 = float(w @ w)
    K = hat(w)
    if theta2 < 1e-8:
        # Taylor terms to O(theta^4): error below 1e-17 for theta < 1e-4.
        a = 1.0 - theta2 / 6.0
        b = 0.5 - theta2 / 24.0
    else:
        theta = math.sqrt(theta2)
        a = math.sin(theta) / theta
        b = (1.0 - math.cos(theta)) / theta2
    return np.eye(3) + a * K + b * (K @ K)


def rotation_angle(R: np.ndarray) -> float:
    """Rotation angle in [0, pi] of a rotation matrix, accurate at 0 and at pi.

    ``arccos((tr - 1) / 2)`` loses half the digits near 0 and near pi; the atan2 of the
    antisymmetric and symmetric parts does not.
    """
    s = 0.5 * math.sqrt(
        (R[2, 1] - R[1, 2]) ** 2 + (R[0, 2] - R[2, 0]) ** 2 + (R[1, 0] - R[0, 1]) ** 2
    )
    c = 0.5 * (R[0, 0] + R[1, 1] + R[2, 2] - 1.0)
    return math.atan2(s, c)


def so3_log(R: np.ndarray) -> np.ndarray:
    """Rotation vector (rad) of a rotation matrix; angle in [0, pi], exact at 0 and at pi.

    At exactly pi both ``+axis*pi`` and ``-axis*pi`` are valid; the one returned has its
    largest-magnitude component positive.
    """
    R = np.asarray(R, dtype=float)
    theta = rotation_angle(R)
    v = vee(R)  # = sin(theta) * axis
    if theta < 1e-4:
        # theta / (2 sin theta) * (R - R^T) -> series 1 + theta^2/6
        return v * (1.0 + theta * theta / 6.0)
    if theta < _PI - 1e-3:
        return v * (theta / math.sin(theta))
    # Near pi sin(theta) -> 0: take the axis from the symmetric part,
    # (R + R^T)/2 = cos(theta) I + (1 - cos(theta)) a a^T.
    c = math.cos(theta)
    B = 0.5 * (R + R.T) - c * np.eye(3)
    B /= 1.0 - c
    k = int(np.argmax(np.diag(B)))
    axis = B[:, k] / math.sqrt(max(B[k, k], 1e-300))
    axis /= np.linalg.norm(axis)
    s = float(axis @ v)
    if abs(s) > 1e-14:
        axis = axis if s > 0 else -axis
    else:
        j = int(np.argmax(np.abs(axis)))
        axis = axis if axis[j] > 0 else -axis
    return axis * theta


def quat_from_matrix(R: np.ndarray) -> np.ndarray:
    """Unit quaternion ``(w, x, y, z)`` with ``w >= 0`` of a rotation matrix (Shepperd).

    Uses the largest of the four diagonal combinations, so it is accurate for every
    rotation including 180 degrees.
    """
    R = np.asarray(R, dtype=float)
    m00, m11, m22 = R[0, 0], R[1, 1], R[2, 2]
    tr = m00 + m11 + m22
    cand = (1.0 + tr, 1.0 + m00 - m11 - m22, 1.0 - m00 + m11 - m22, 1.0 - m00 - m11 + m22)
    k = max(range(4), key=cand.__getitem__)
    if k == 0:
        parts = (cand[0], R[2, 1] - R[1, 2], R[0, 2] - R[2, 0], R[1, 0] - R[0, 1])
    elif k == 1:
        parts = (R[2, 1] - R[1, 2], cand[1], R[0, 1] + R[1, 0], R[0, 2] + R[2, 0])
    elif k == 2:
        parts = (R[0, 2] - R[2, 0], R[0, 1] + R[1, 0], cand[2], R[1, 2] + R[2, 1])
    else:
        parts = (R[1, 0] - R[0, 1], R[0, 2] + R[2, 0], R[1, 2] + R[2, 1], cand[3])
    q = np.array(parts, dtype=float)
    q /= np.linalg.norm(q)
    if q[0] < 0.0:
        q = -q
    return q


def matrix_from_quat(q: np.ndarray) -> np.ndarray:
    """Rotation matrix of a quaternion ``(w, x, y, z)`` (normalised first).

    Raises
    ------
    ValueError
        If the quaternion has (near) zero norm or is not finite.
    """
    q = np.asarray(q, dtype=float)
    if q.shape != (4,) or not np.all(np.isfinite(q)):
        raise ValueError(f"quaternion must be 4 finite numbers (w, x, y, z), got {q!r}")
    n = float(np.linalg.norm(q))
    if n < 1e-12:
        raise ValueError("quaternion has zero norm")
    w, x, y, z = q / n
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product ``a ⊗ b`` (rotation ``b`` first, then ``a``)."""
    return quat_left(a) @ np.asarray(b, dtype=float)


def quat_conjugate(q: np.ndarray) -> np.ndarray:
    """Conjugate ``(w, -x, -y, -z)``: the inverse rotation of a unit quaternion."""
    q = np.asarray(q, dtype=float)
    return np.array([q[0], -q[1], -q[2], -q[3]])


def quat_left(q: np.ndarray) -> np.ndarray:
    """``L(q)`` with ``q ⊗ p == L(q) @ p``."""
    w, x, y, z = (float(c) for c in q)
    return np.array([[w, -x, -y, -z], [x, w, -z, y], [y, z, w, -x], [z, -y, x, w]])


def quat_right(q: np.ndarray) -> np.ndarray:
    """``R(q)`` with ``p ⊗ q == R(q) @ p``."""
    w, x, y, z = (float(c) for c in q)
    return np.array([[w, -x, -y, -z], [x, w, z, -y], [y, -z, w, x], [z, y, -x, w]])


def make_transform(R: np.ndarray, t: np.ndarray) -> np.ndarray:
    """4x4 transform from a rotation matrix (3, 3) and a translation (3,) in metres."""
    T = np.eye(4)
    T[:3, :3] = R
    T[:3, 3] = t
    return T


def transform_from_xyz_quat(xyz_m: np.ndarray, quat_wxyz: np.ndarray) -> np.ndarray:
    """4x4 transform from a translation (m) and a quaternion ``(w, x, y, z)``."""
    xyz = np.asarray(xyz_m, dtype=float)
    if xyz.shape != (3,) or not np.all(np.isfinite(xyz)):
        raise ValueError(f"translation must be 3 finite numbers, got {xyz_m!r}")
    return make_transform(matrix_from_quat(quat_wxyz), xyz)


def xyz_quat_from_transform(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Translation (3,) in metres and quaternion ``(w, x, y, z)``, ``w >= 0``, of ``T``."""
    T = np.asarray(T, dtype=float)
    return T[:3, 3].copy(), quat_from_matrix(T[:3, :3])


def se3_inverse(T: np.ndarray) -> np.ndarray:
    """Inverse of a rigid transform using ``R^T`` (exact for rigid motions)."""
    T = np.asarray(T, dtype=float)
    out = np.eye(4)
    Rt = T[:3, :3].T
    out[:3, :3] = Rt
    out[:3, 3] = -Rt @ T[:3, 3]
    return out


def _so3_left_jacobian(phi: np.ndarray) -> np.ndarray:
    theta2 = float(phi @ phi)
    K = hat(phi)
    if theta2 < 1e-8:
        a = 0.5 - theta2 / 24.0
        b = 1.0 / 6.0 - theta2 / 120.0
    else:
        theta = math.sqrt(theta2)
        a = (1.0 - math.cos(theta)) / theta2
        b = (theta - math.sin(theta)) / (theta2 * theta)
    return np.eye(3) + a * K + b * (K @ K)


def se3_exp(xi: np.ndarray) -> np.ndarray:
    """Group exponential of a twist ``xi = (rho, phi)`` (m, rad), shape (6,)."""
    xi = np.asarray(xi, dtype=float)
    rho, phi = xi[:3], xi[3:]
    return make_transform(so3_exp(phi), _so3_left_jacobian(phi) @ rho)


def se3_log(T: np.ndarray) -> np.ndarray:
    """Twist ``(rho, phi)`` (m, rad) with ``se3_exp(se3_log(T)) == T``."""
    T = np.asarray(T, dtype=float)
    phi = so3_log(T[:3, :3])
    rho = np.linalg.solve(_so3_left_jacobian(phi), T[:3, 3])
    return np.concatenate([rho, phi])


def se3_adjoint(T: np.ndarray) -> np.ndarray:
    """6x6 adjoint for twists ordered ``(rho, phi)``: ``T exp(xi) T^-1 = exp(Ad_T xi)``."""
    T = np.asarray(T, dtype=float)
    R, t = T[:3, :3], T[:3, 3]
    Ad = np.zeros((6, 6))
    Ad[:3, :3] = R
    Ad[3:, 3:] = R
    Ad[:3, 3:] = hat(t) @ R
    return Ad


def check_transform(T: np.ndarray, name: str = "transform", *, tol: float = 1e-6) -> np.ndarray:
    """Validate one rigid transform and return it as a float64 (4, 4) array.

    Raises
    ------
    ValueError
        Naming ``name`` and what is wrong: shape, non-finite values, a rotation that is not
        orthonormal with determinant +1 (within ``tol``), or a last row other than 0 0 0 1.
    """
    a = np.asarray(T, dtype=float)
    if a.shape != (4, 4):
        raise ValueError(f"{name}: expected shape (4, 4), got {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name}: contains NaN or inf")
    if np.max(np.abs(a[3] - (0.0, 0.0, 0.0, 1.0))) > 1e-9:
        raise ValueError(f"{name}: last row must be [0, 0, 0, 1], got {a[3].tolist()}")
    R = a[:3, :3]
    err = float(np.max(np.abs(R.T @ R - np.eye(3))))
    if err > tol or np.linalg.det(R) < 0:
        raise ValueError(
            f"{name}: rotation is not orthonormal with det +1 (max |R^T R - I| = {err:.3g})"
        )
    return a
