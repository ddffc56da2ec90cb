"""SO(3)/SE(3)/quaternion helpers: conventions, and exactness at 0 and at pi."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cellcal.solver.se3 import (
    check_transform,
    make_transform,
    matrix_from_quat,
    quat_from_matrix,
    quat_left,
    quat_multiply,
    quat_right,
    rotation_angle,
    se3_adjoint,
    se3_exp,
    se3_inverse,
    se3_log,
    so3_exp,
    so3_log,
)

vec3 = st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=3).map(np.array)


def test_so3_exp_log_at_zero_and_tiny_angles():
    assert np.array_equal(so3_exp(np.zeros(3)), np.eye(3))
    assert np.allclose(so3_log(np.eye(3)), 0.0, atol=0.0)
    w = np.array([1e-9, -2e-9, 3e-9])
    assert np.allclose(so3_log(so3_exp(w)), w, rtol=1e-12, atol=1e-24)


@pytest.mark.parametrize("axis", [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, -2, 3)])
@pytest.mark.parametrize("delta", [0.0, 1e-10, 1e-6, 1e-3])
def test_so3_log_at_and_near_pi(axis, delta):
    a = np.array(axis, float) / np.linalg.norm(axis)
    R = so3_exp(a * (math.pi - delta))
    w = so3_log(R)
    assert abs(np.linalg.norm(w) - (math.pi - delta)) < 1e-9
    # Same rotation back (at exactly pi the sign of the axis is a free choice).
    assert np.allclose(so3_exp(w), R, atol=1e-12)


@given(vec3)
def test_so3_round_trip(w):
    w = w * 3.0  # angles up to ~5 rad wrap into [0, pi]
    R = so3_exp(w)
    assert np.allclose(so3_exp(so3_log(R)), R, atol=1e-12)
    assert abs(np.linalg.det(R) - 1) < 1e-12


@given(vec3)
def test_quaternion_round_trip_and_sign(w):
    R = so3_exp(w * 3.1)
    q = quat_from_matrix(R)
    assert q[0] >= 0 and abs(np.linalg.norm(q) - 1) < 1e-14
    assert np.allclose(matrix_from_quat(q), R, atol=1e-13)


def test_quaternion_of_180_degree_rotations():
    for axis in np.eye(3):
        R = so3_exp(axis * math.pi)
        q = quat_from_matrix(R)
        assert abs(q[0]) < 1e-15
        assert np.allclose(np.abs(q[1:]), np.abs(axis))


def test_quaternion_product_matches_matrix_product_and_L_R():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=4), rng.normal(size=4)
    a /= np.linalg.norm(a)
    b /= np.linalg.norm(b)
    ab = quat_multiply(a, b)
    assert np.allclose(matrix_from_quat(ab), matrix_from_quat(a) @ matrix_from_quat(b))
    assert np.allclose(quat_left(a) @ b, quat_right(b) @ a)


def test_se3_exp_log_inverse_and_adjoint():
    rng = np.random.default_rng(1)
    for _ in range(20):
        xi = rng.normal(size=6)
        T = se3_exp(xi)
        assert np.allclose(se3_exp(se3_log(T)), T, atol=1e-12)
        assert np.allclose(T @ se3_inverse(T), np.eye(4), atol=1e-12)
        eta = rng.normal(size=6) * 1e-3
        # T exp(eta) T^-1 == exp(Ad_T eta)
        assert np.allclose(T @ se3_exp(eta) @ se3_inverse(T), se3_exp(se3_adjoint(T) @ eta), atol=1e-12)


def test_rotation_angle_is_accurate_near_zero():
    R = so3_exp(np.array([0.0, 0.0, 1e-10]))
    assert abs(rotation_angle(R) - 1e-10) < 1e-20


@pytest.mark.parametrize(
    "T, msg",
    [
        (np.eye(3), "shape"),
        (np.full((4, 4), np.nan), "NaN"),
        (make_transform(np.eye(3) * 1.1, np.zeros(3)), "orthonormal"),
        (make_transform(np.diag([1.0, 1.0, -1.0]), np.zeros(3)), "det"),
        (np.vstack([np.eye(4)[:3], [0, 0, 1, 1]]), "last row"),
    ],
)
def test_check_transform_names_the_problem(T, msg):
    with pytest.raises(ValueError, match=msg):
        check_transform(T, "pose")
