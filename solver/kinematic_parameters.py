"""The identifiable DH parameters by name (``a2``, ``zero_offset3``, ...) and the kinematic
Jacobian of the measured stations with respect to them, the base frame and the target
(ADR 0016): what :mod:`cellcal.solver.identify` fits and what the exports, the planner and the
ISO 9283 test read back by name."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from cellcal.solver.kinematics import N_JOINTS, DHParameters
from cellcal.solver.se3 import so3_log

__all__ = ["parameter_names", "kinematic_jacobian"]

# --------------------------------------------------------------------------- parameters
def _name(kind: str, row: int) -> str:
    return f"joint{row + 1}.zero_offset" if kind == "zero_offset" else f"link{row + 1}.{kind}"


def _parse(name: str) -> tuple[str, int]:
    try:
        head, kind = name.split(".", 1)
        if head.startswith("joint") and kind == "zero_offset":
            row = int(head[5:]) - 1
        elif head.startswith("link") and kind in ("a", "d", "alpha", "beta"):
            row = int(head[4:]) - 1
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"unknown kinematic parameter {name!r} (expected joint{{i}}.zero_offset or "
                         "link{i}.a / .d / .alpha / .beta, i = 1..6)") from None
    if not 0 <= row < N_JOINTS:
        raise ValueError(f"kinematic parameter {name!r}: row must be 1..{N_JOINTS}")
    return kind, row


def parameter_names(model: DHParameters) -> tuple[str, ...]:
    """Every parameter of ``model`` that identification considers, in preference order.

    Joint zeros, then ``a``, ``alpha``, ``beta`` (rows :meth:`DHParameters.parallel_rows`
    only), ``d`` of non-parallel rows, and last ``d`` of parallel rows (redundant along
    parallel axes: when two are dependent, the earlier in this order is kept).
    """
    par = set(model.parallel_rows())
    out = [_name("zero_offset", i) for i in range(N_JOINTS)]
    out += [_name("a", i) for i in range(N_JOINTS)]
    out += [_name("alpha", i) for i in range(N_JOINTS)]
    out += [_name("beta", i) for i in sorted(par)]
    out += [_name("d", i) for i in range(N_JOINTS) if i not in par]
    out += [_name("d", i) for i in sorted(par)]
    return tuple(out)


def _value(model: DHParameters, nominal: DHParameters, name: str) -> float:
    kind, row = _parse(name)
    if kind == "zero_offset":
        return float(model.theta[row] - nominal.theta[row])
    return float(getattr(model, kind)[row])


def _apply(nominal: DHParameters, names: Sequence[str], delta: np.ndarray, label: str) -> DHParameters:
    arrays = {k: np.array(getattr(nominal, k)) for k in ("a", "d", "alpha", "theta", "beta")}
    for n, v in zip(names, delta, strict=True):
        kind, row = _parse(n)
        arrays["theta" if kind == "zero_offset" else kind][row] += v
    return DHParameters(name=label, **arrays)


def _as_model(model: object) -> DHParameters:
    if isinstance(model, DHParameters):
        return model
    try:
        kw = {k: getattr(model, k) for k in ("a", "d", "alpha", "theta")}
    except AttributeError:
        raise ValueError("model: expected DHParameters or an object with DH arrays a, d, alpha, theta") from None
    return DHParameters(beta=getattr(model, "beta", np.zeros(N_JOINTS)), name=str(getattr(model, "name", "custom")),
                        **kw)


# --------------------------------------------------------------------------- Jacobian
def _param_twists(model: DHParameters, q: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """``base_T_flange`` (N, 4, 4) and each parameter's screw in the base frame (N, P, 6) as
    ``(v, w)``: d(base_T_flange) base_T_flange^-1 = [w]x, v for a unit change."""
    L = model.link_transforms(q)
    n = L.shape[0]
    prefix = np.empty((n, N_JOINTS + 1, 4, 4))
    prefix[:, 0] = np.eye(4)
    for i in range(N_JOINTS):
        prefix[:, i + 1] = prefix[:, i] @ L[:, i]
    th = q + model.theta
    tw = np.zeros((n, len(names), 6))
    for k, name in enumerate(names):
        kind, i = _parse(name)
        P0, P1 = prefix[:, i], prefix[:, i + 1]
        z0, o0 = P0[:, :3, 2], P0[:, :3, 3]
        o1 = P1[:, :3, 3]
        # x after the joint rotation, before the tilt: Rx keeps x, Ry would turn it.
        xa = np.cos(th[:, i])[:, None] * P0[:, :3, 0] + np.sin(th[:, i])[:, None] * P0[:, :3, 1]
        if kind == "zero_offset":
            w, v = z0, np.cross(o0, z0)
        elif kind == "d":
            w, v = np.zeros_like(z0), z0
        elif kind == "a":
            w, v = np.zeros_like(z0), xa
        elif kind == "alpha":
            w, v = xa, np.cross(o1, xa)
        else:  # beta: about y of the link frame (Ry keeps y)
            y1 = P1[:, :3, 1]
            w, v = y1, np.cross(o1, y1)
        tw[:, k, :3], tw[:, k, 3:] = v, w
    return prefix[:, N_JOINTS], tw


def kinematic_jacobian(model: DHParameters, q: ArrayLike, names: Sequence[str], cell_T_base: np.ndarray,
                       tool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Model prediction and its Jacobian (unwhitened, analytic).

    Parameters
    ----------
    model : DHParameters
        The arm at which to differentiate.
    q : array_like, shape (N, 6)
        Joint angles, rad.
    names : sequence of str
        Parameters to differentiate by (:func:`parameter_names`).
    cell_T_base : numpy.ndarray, shape (4, 4)
    tool : numpy.ndarray, shape (4, 4) or (3,)
        ``flange_T_target`` (pose measurements) or ``flange_p_target`` (points), m.

    Returns
    -------
    predicted : numpy.ndarray, shape (N, 4, 4) or (N, 3)
        Modelled ``cell_T_target`` or ``cell_p_target``.
    J : numpy.ndarray, shape (N, r, P + 6 + t)
        d(prediction) by (parameters, base twist ``(rho, phi)`` right, in the base frame,
        target twist right in the target frame or point shift in the flange frame); rows
        ``r`` are ``(dp, dphi)`` (6) or ``dp`` (3), cell frame.
    """
    q = np.asarray(q, dtype=np.float64)
    if q.ndim == 1:
        q = q[None, :]
    bTf, tw = _param_twists(model, q, names)
    Rcb, tcb = cell_T_base[:3, :3], cell_T_base[:3, 3]
    pose = np.shape(tool) == (4, 4)
    n, P = q.shape[0], len(names)
    if pose:
        cTf = np.einsum("ij,njk->nik", cell_T_base, bTf)
        pred = cTf @ tool
        x_b = bTf[:, :3, :3] @ tool[:3, 3] + bTf[:, :3, 3]
    else:
        x_b = bTf[:, :3, :3] @ tool + bTf[:, :3, 3]
        pred = x_b @ Rcb.T + tcb
    r = 6 if pose else 3
    J = np.zeros((n, r, P + 6 + (6 if pose else 3)))
    v, w = tw[..., :3], tw[..., 3:]
    dxb = v + np.cross(w, x_b[:, None, :])  # (N, P, 3)
    J[:, :3, :P] = np.einsum("ij,npj->nip", Rcb, dxb)
    # Base: right twist in the base frame (ADR 0001), cell_T_base exp(rho, phi):
    # dp = R_cb (rho + phi x x_b), dphi = R_cb phi.
    J[:, :3, P:P + 3] = Rcb
    xh = np.zeros((n, 3, 3))
    xh[:, 0, 1], xh[:, 0, 2], xh[:, 1, 2] = -x_b[:, 2], x_b[:, 1], -x_b[:, 0]
    xh[:, 1, 0], xh[:, 2, 0], xh[:, 2, 1] = x_b[:, 2], -x_b[:, 1], x_b[:, 0]
    J[:, :3, P + 3:P + 6] = -np.einsum("ij,njk->nik", Rcb, xh)  # phi x x = -[x]x phi
    if pose:
        J[:, 3:, :P] = np.einsum("ij,npj->nip", Rcb, w)
        J[:, 3:, P + 3:P + 6] = Rcb
        Rct = pred[:, :3, :3]
        J[:, :3, P + 6:P + 9] = Rct
        J[:, 3:, P + 9:P + 12] = Rct
    else:
        J[:, :3, P + 6:P + 9] = np.einsum("ij,njk->nik", Rcb, bTf[:, :3, :3])
    return pred, J


def _residuals(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    if pred.ndim == 2:
        return meas - pred
    out = np.empty((pred.shape[0], 6))
    out[:, :3] = meas[:, :3, 3] - pred[:, :3, 3]
    for k in range(pred.shape[0]):
        out[k, 3:] = so3_log(meas[k, :3, :3] @ pred[k, :3, :3].T)
    return out
