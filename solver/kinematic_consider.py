"""Consider (Schmidt) covariance of a kinematic identification (ADR 0016, amendment).

A parameter the identification does not estimate is fixed at its nominal value, but the arm
does not have the nominal value: its true error goes into the parameters and frames that
are estimated. Where a joint never moves (or barely moves) the estimated members of the
rigid group that joint leaves take *all* of it, with no residual to show it; the sigmas
of the noise alone (``(J^T W J)^-1``) then say "known to a few micrometres" of a value that
is off by the whole error of its fixed neighbours.

**Which fixed parameters are considered.** Those that the estimated parameters and the
frames do not absorb *exactly on any station set*: on a generic set of stations (every
joint moving) a fixed parameter whose whitened, column-normalised Jacobian column lies in
the span of the frames' and the estimated parameters' columns (orthogonal part below
``rank_tol`` of its norm) is a reparametrisation, not an error (joint 1's zero offset in
the base frame, row 6 in the target, the ``d`` of parallel rows in ``link4.d``): whatever
its true value, the identified arm predicts exactly as the true one, and the reported
values are defined with it at nominal (``docs/kinematics.md``). Every other fixed
parameter (not excited by these stations, weakly determined, or left out by the caller's
``parameters=``) is considered.

**Prior.** A 1-sigma per considered parameter: :data:`DEFAULT_PARAMETER_PRIOR` by kind (a
declared manufacturing tolerance of a serial arm relative to its nominal model:
0.5 mm for ``a`` and ``d``, 0.1 deg for zero offsets, twists and tilts), overridable
by kind or by name (``identify_kinematics(parameter_prior=...)``); 0 means "known
exactly" and removes the parameter from the consideration.

**Covariance.** Linearised at the answer, with ``J`` the whitened (and robust-weighted)
Jacobian of the estimated parameters and frames and ``J_c`` that of the considered ones,
the estimate's error is ``S dc + n`` with the sensitivity ``S = (J^T J)^-1 J^T J_c``, the
considered parameters' true errors ``dc ~ N(0, P_c)`` and the noise part ``n``. So the
estimated block becomes ``C + S P_c S^T``; the joint covariance of the errors of
(estimated and frames, considered) is ``[[C + S P_c S^T, -S P_c], [-P_c S^T, P_c]]``
(the considered value reported, its nominal, is off by ``-dc``), which is what a
prediction at other joints needs: at the stations ``J S`` cancels ``J_c`` (the fit absorbed
the error), elsewhere it does not.

**Which joints to name.** For the parameters fixed for lack of excitation, a joint is
named when spreading its angles over its whole range (the other joints as measured)
raises the part of one of their columns orthogonal to the estimated ones by
:data:`EXCITE_GAIN` or more: the joint whose motion would determine it.

Pure numpy on matrices the identification passes in: no Jacobian of its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

__all__ = [
    "DEFAULT_PARAMETER_PRIOR",
    "PRIOR_KINDS",
    "EXCITE_GAIN",
    "resolve_prior",
    "unabsorbed",
    "sensitivity",
    "consider_blocks",
    "orthogonal_fractions",
]

#: Parameter kinds a prior can be declared for (``joint{i}.zero_offset``, ``link{i}.a`` ...).
PRIOR_KINDS = ("zero_offset", "a", "d", "alpha", "beta")

#: Default 1-sigma of a parameter identification does not estimate, SI, by kind: a
#: manufacturing tolerance of a serial arm's geometry relative to its nominal model (factory
#: table or data sheet), conservative for both simulated worlds of the tests (0.2-0.3 mm and
#: 0.03-0.06 deg behind a factory table in ``config/demo-scenario.toml``; 0.1-0.5 mm and
#: 0.01-0.05 deg for the independently perturbed arms of ``tests/test_identify_consider.py``).
#: An arm with no factory calibration, compared with its data sheet, may need more: declare it.
DEFAULT_PARAMETER_PRIOR: Mapping[str, float] = MappingProxyType({
    "zero_offset": math.radians(0.1),
    "a": 0.5e-3,
    "d": 0.5e-3,
    "alpha": math.radians(0.1),
    "beta": math.radians(0.1),
})

#: Gain of a weak column's orthogonal part that names a joint as the one whose motion is
#: missing: unrelated joints change it by 0.98-1.25, a still joint's spread by 1e4 and more,
#: joint 5 moving +-0.3 rad instead of its full range (one twist weak for points) by 5.
EXCITE_GAIN = 3.0


def resolve_prior(prior: Mapping[str, float] | None, names: Sequence[str], kind_of: Mapping[str, str]) -> dict[str, float]:
    """1-sigma prior of every parameter in ``names``: by name, else by kind, else the default.

    Parameters
    ----------
    prior : mapping of str to float, or None
        Keys are kinds (:data:`PRIOR_KINDS`) or parameter names; values 1-sigma, m or rad,
        finite and >= 0.
    names : sequence of str
        Every parameter of the model's parameterisation.
    kind_of : mapping of str to str
        The kind of each name.

    Raises
    ------
    ValueError
        A key that is neither a kind nor a parameter of this model, or a bad value.
    """
    given = dict(prior or {})
    for key, val in given.items():
        if key not in PRIOR_KINDS and key not in names:
            raise ValueError(f"parameter_prior[{key!r}]: neither a kind {PRIOR_KINDS} nor a parameter of this model")
        if not (isinstance(val, (int, float)) and math.isfinite(val) and val >= 0):
            raise ValueError(f"parameter_prior[{key!r}]: expected a finite 1-sigma >= 0 (m or rad), got {val!r}")
    out = {}
    for n in names:
        kind = kind_of[n]
        out[n] = float(given.get(n, given.get(kind, DEFAULT_PARAMETER_PRIOR[kind])))
    return out


def _normalised(J: np.ndarray) -> np.ndarray:
    nrm = np.linalg.norm(J, axis=0)
    return J / np.where(nrm > 0, nrm, 1.0)


def _orthogonal_part(kept: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``cols`` minus their projection on the span of ``kept`` (both column-normalised)."""
    if kept.shape[1] == 0:
        return cols
    Q, R = np.linalg.qr(kept)
    # Drop directions of ``kept`` that are themselves dependent (they span nothing new).
    good = np.abs(np.diag(R)) > 1e-12 * max(1.0, float(np.abs(np.diag(R)).max()))
    Q = Q[:, good]
    return cols - Q @ (Q.T @ cols)


def unabsorbed(J_kept: np.ndarray, J_fixed: np.ndarray, tol: float) -> np.ndarray:
    """Which fixed columns the kept ones do not absorb exactly (module docstring).

    Parameters
    ----------
    J_kept : numpy.ndarray, shape (m, k)
        Whitened Jacobian of the frames and the estimated parameters on a generic station set.
    J_fixed : numpy.ndarray, shape (m, f)
        The same for the fixed parameters.
    tol : float
        Orthogonal fraction (of the column's norm) below which a column is absorbed.

    Returns
    -------
    numpy.ndarray of bool, shape (f,)
    """
    return np.asarray(orthogonal_fractions(J_kept, J_fixed) > tol)


def sensitivity(Jw: np.ndarray, Jcw: np.ndarray) -> np.ndarray:
    """``S = (J^T J)^+ J^T J_c`` (k, m): how the estimate moves per unit error of each
    considered parameter (column-scaled for the pseudo-inverse, as the covariance is)."""
    nrm = np.linalg.norm(Jw, axis=0)
    D = np.where(nrm > 0, nrm, 1.0)
    Js = Jw / D
    Hinv_s = np.linalg.pinv(Js.T @ Js)
    return np.asarray((Hinv_s @ (Js.T @ Jcw)) / D[:, None])


def consider_blocks(S: np.ndarray, prior_sigma: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(S P_c S^T, -S P_c, P_c)``: what the considered priors add to the estimated block,
    the cross block and the considered block of the joint covariance (module docstring)."""
    Pc = np.diag(np.asarray(prior_sigma, dtype=float) ** 2)
    SP = S @ Pc
    return SP @ S.T, -SP, Pc


def orthogonal_fractions(J_kept: np.ndarray, J_fixed: np.ndarray) -> np.ndarray:
    """Norm of each fixed column's part orthogonal to the kept ones (both column-normalised):
    0 for a column the kept ones absorb, up to 1 for one they do not touch."""
    if J_fixed.shape[1] == 0:
        return np.zeros(0)
    return np.asarray(np.linalg.norm(_orthogonal_part(_normalised(J_kept), _normalised(J_fixed)), axis=0))
