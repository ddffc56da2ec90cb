"""What the plant interfaces show of the wire bodies, computed once: pure functions, no I/O.

* :func:`frame_mm_deg`: a wire transform as the OPC UA 3D frame the Robotics companion
  specification uses: cartesian coordinates in mm and the orientation as angles A, B, C in
  degrees, ``R = Rz(C) @ Ry(B) @ Rx(A)`` (A about x, B about y, C about z; intrinsic
  z-y'-x'', the same as fixed-axis x-y-z roll-pitch-yaw: ``exports.rpy_from_matrix``).
* :func:`sigmas`: the 1-sigma (root of the covariance trace) of one estimate of a result,
  translation in m and rotation in rad, from ``uncertainty.covariance[name]`` (ADR 0004's
  right perturbation: rho then phi).
* :func:`to_json`: a body as the JSON bytes MQTT carries (the same values the ZeroMQ body
  carries in msgpack; a non-finite number is refused, as on ZeroMQ).
* :func:`as_map`, :func:`as_float`, :func:`as_int`: a value read from a body, narrowed (a
  body is a ``Mapping[str, object]``: the adapters read what the daemon emits, never trust it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import SupportsFloat, SupportsIndex, SupportsInt

import numpy as np

from cellcal.daemon.report.exports import rpy_from_matrix

__all__ = ["frame_mm_deg", "sigmas", "point_mm", "to_json", "FrameMmDeg", "as_map", "as_float", "as_int"]

FrameMmDeg = tuple[float, float, float, float, float, float]


def as_map(v: object) -> Mapping[str, object]:
    """``v`` if it is a map (a body's table), else an empty one: what ``v or {}`` reads of a
    table that is missing or ``None``."""
    return v if isinstance(v, Mapping) else {}


def as_float(v: object) -> float:
    """``float(v)`` of a value read from a body (``TypeError`` for what ``float()`` refuses)."""
    if isinstance(v, (SupportsFloat, SupportsIndex, str, bytes)):
        return float(v)
    raise TypeError(f"expected a number, got {type(v).__name__}")


def as_int(v: object) -> int:
    """``int(v)`` of a value read from a body (``TypeError`` for what ``int()`` refuses)."""
    if isinstance(v, (SupportsInt, SupportsIndex, str, bytes)):
        return int(v)
    raise TypeError(f"expected an integer, got {type(v).__name__}")


def frame_mm_deg(transform: Mapping[str, object]) -> FrameMmDeg:
    """``(x, y, z)`` mm and ``(A, B, C)`` deg of a wire transform (its ``matrix`` is authoritative).

    Parameters
    ----------
    transform : mapping
        ``{"matrix": [16 floats, row-major, metres], ...}`` (``protocol.Transform``).

    Returns
    -------
    tuple of 6 float
        ``x_mm, y_mm, z_mm, a_deg, b_deg, c_deg`` with ``R = Rz(C) Ry(B) Rx(A)``.
    """
    T = np.asarray(transform["matrix"], dtype=float).reshape(4, 4)
    a, b, c = rpy_from_matrix(T[:3, :3])
    x, y, z = (float(v) * 1e3 for v in T[:3, 3])
    return x, y, z, math.degrees(a), math.degrees(b), math.degrees(c)


def point_mm(point: Mapping[str, object]) -> tuple[float, float, float]:
    """A wire point (``{"frame", "position_m"}``) in mm."""
    position = point["position_m"]
    if not isinstance(position, Iterable):
        raise TypeError(f"position_m: expected an array, got {type(position).__name__}")
    x, y, z = (as_float(v) * 1e3 for v in position)
    return x, y, z


def sigmas(result: Mapping[str, object], name: str) -> tuple[float | None, float | None]:
    """1-sigma translation (m) and rotation (rad) of the estimate ``name`` of a result body.

    ``None`` where the result carries no such covariance, or a value in it was not computed;
    the rotation is ``None`` for a point (a 3x3 covariance).
    """
    cov = as_map(as_map(as_map(result.get("uncertainty")).get("covariance")).get(name))
    if not cov:
        return None, None
    shape, values = cov.get("shape") or [], cov.get("values") or []
    if not isinstance(shape, (list, tuple)) or not isinstance(values, (list, tuple)):
        return None, None
    if len(shape) != 2 or shape[0] != shape[1] or shape[0] not in (3, 6) or len(values) != shape[0] ** 2:
        return None, None
    n: int = shape[0]

    def trace_root(lo: int) -> float | None:
        diag = [values[i * n + i] for i in range(lo, lo + 3)]
        finite = [float(d) for d in diag if isinstance(d, (SupportsFloat, SupportsIndex)) and math.isfinite(d)]
        if len(finite) < len(diag):
            return None
        return math.sqrt(max(sum(finite), 0.0))

    return trace_root(0), (trace_root(3) if n == 6 else None)


def _default(obj: object) -> object:
    if hasattr(obj, "tolist"):  # numpy arrays and scalars: their exact values
        return obj.tolist()
    raise TypeError(f"cannot encode {type(obj).__name__} as JSON")


def to_json(body: Mapping[str, object]) -> bytes:
    """Compact UTF-8 JSON of ``body``.

    Raises
    ------
    ValueError
        A NaN or infinity in the body (JSON has none; the ZeroMQ server refuses them too).
    """
    return json.dumps(body, separators=(",", ":"), allow_nan=False, default=_default).encode("utf-8")
