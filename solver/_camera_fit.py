"""The camera hand-eye fit's pieces (ADR 0027): PnP, the refinement rounds with variance
components, the residual tests, the closures, the held-out folds and the bootstrap.

Internal to :mod:`cellcal.solver.hand_eye_camera`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cellcal.solver import _camera_chain as _chain
from cellcal.solver import _stats
from cellcal.solver.camera_model import project, undistort
from cellcal.solver.camera_results import Bootstrap
from cellcal.solver.intrinsics import _fit_poses, _homography, _pose_from_homography
from cellcal.solver.se3 import se3_inverse
from cellcal.solver.uncertainty import sigma_figures
from cellcal.solver.validation import HoldoutClosure

MIN_VIEWS = 3
_HOLDOUT_FOLDS = 5
#: Variance-component rounds (noise estimate, robot prior factor) at most.
_VCE_ROUNDS = 8
_VCE_TOL = 0.01
#: Directions of the structure basis with less than this sine of principal angle to the
#: model's span are the model's own (absorbed).
_MIN_SINE = 0.01
_MIN_STRUCTURE_DOF = 10



def _pnp(k: np.ndarray, obj: np.ndarray, img: np.ndarray, view: np.ndarray, nv: int, start: np.ndarray | None = None):
    """Each view's pose alone under intrinsics ``k``: homography on the undistorted corners,
    then Gauss-Newton on the image. Returns poses (nv, 4, 4) and their covariance per unit
    corner variance (nv, 6, 6)."""
    if start is None:
        xy, ok = undistort(k, img)
        starts = np.searchsorted(view, np.arange(nv))
        ends = np.append(starts[1:], view.shape[0])
        poses = np.empty((nv, 4, 4))
        for j, (a, b) in enumerate(zip(starts, ends, strict=True)):
            m = ok[a:b]
            if m.sum() < 4:
                m = np.ones(b - a, bool)
            H = _homography(obj[a:b][m, :2], np.where(np.isfinite(xy[a:b][m]), xy[a:b][m], 0.0))
            poses[j] = _pose_from_homography(np.eye(3), H)
    else:
        poses = start.copy()
    poses = _fit_poses(k, obj, img, view, poses)
    pr = project(k, poses[view], obj, jacobians=True)
    assert pr.J_uv_pose is not None
    Jp = pr.J_uv_pose
    info = np.add.reduceat(np.swapaxes(Jp, 1, 2) @ Jp, np.searchsorted(view, np.arange(nv)), axis=0)
    with np.errstate(all="ignore"):
        try:
            cov = np.linalg.inv(info)
        except np.linalg.LinAlgError:
            cov = np.full((nv, 6, 6), np.inf)
    return poses, cov


# -- the fit ---------------------------------------------------------------------------------------


@dataclass
class _Fit:
    prob: _chain.ChainProblem
    state: _chain.ChainState
    iterations: int
    converged: bool
    stop: str
    Sinv: np.ndarray
    Cd: np.ndarray
    pieces: tuple
    robot_factor: np.ndarray  # (2,): translation, rotation


@dataclass
class _Redundancy:
    image: float
    robot: np.ndarray  # (2,) translation rows, rotation rows
    chi_image: float
    chi_robot: np.ndarray  # (2,)
    n_k_prior: int


def _problem(setup, obj, img, view, G, sigma, prior_sd, free, k_prior, huber, twist=None) -> _chain.ChainProblem:
    return _chain.ChainProblem(setup, obj, img, view, G, sigma, prior_sd, free, k_prior=k_prior, twist=twist,
                               huber=huber)


def _redundancies(prob: _chain.ChainProblem, state: _chain.ChainState, Sinv, Cd, pieces) -> _Redundancy:
    """Image and robot (translation, rotation) redundancy numbers and whitened chi-squares
    (Foerstner: a group's expected weighted residual energy is its redundancy)."""
    r, w, U, V, W, S, Vinv = pieces
    info = 1.0 / prob.prior_sd**2
    td = np.einsum("nii->ni", Cd) * info
    tr_d = np.array([float(td[:, :3].sum()), float(td[:, 3:].sum())])
    tr_k = 0.0
    n_kp = 0
    if prob.k_prior is not None:
        fk = prob.free[_chain.SL_K]
        C = Sinv[_chain.SL_K, _chain.SL_K]
        tr_k = float(np.trace(C @ (prob.k_prior[1] * np.outer(fk, fk))))
        n_kp = int(fk.sum())
    p_tot = int(prob.free.sum()) + 6 * prob.n_views
    n = r.shape[0]
    r_img = 2 * n - (p_tot - float(tr_d.sum()) - tr_k)
    r_rob = 3 * prob.n_views - tr_d
    chi_img = float(np.sum(w[:, None] * r * r)) / prob.sigma_px**2
    if prob.huber is not None:
        # the corner noise from the corners inside the Huber threshold, for the truncation of
        # a 2-D Gaussian's squared length there (outliers must not set the scale)
        s2 = np.sum(r * r, axis=1) / prob.sigma_px**2
        k2 = prob.huber**2
        inside = s2 <= k2
        m_k = 2.0 - (k2 + 2.0) * math.exp(-0.5 * k2)  # E[chi2_2 ; chi2_2 <= k^2]
        chi_img = float(np.sum(s2[inside])) * 2.0 / m_k
    q = (state.d / prob.prior_sd) ** 2
    chi_rob = np.array([float(q[:, :3].sum()), float(q[:, 3:].sum())])
    return _Redundancy(r_img, r_rob, chi_img, chi_rob, n_kp)


def _fit(setup, obj, img, view, G, state, sigma, declared: bool, prior_sd0, free, k_prior, huber, max_iter,
         robot_factor0: np.ndarray | None) -> _Fit:
    """Refine, estimating the corner noise (unless declared) and, given ``robot_factor0``
    (translation, rotation), the factors on the robot prior's variance (never below 1)
    until all settle (variance-component estimation)."""
    vce = robot_factor0 is not None
    factor = np.ones(2) if robot_factor0 is None else np.maximum(np.asarray(robot_factor0, float), 1.0)
    it_total = 0
    conv, stop = False, _chain.STOP_ITERATIONS
    for _round in range(_VCE_ROUNDS * (2 if vce else 1)):
        sd = prior_sd0 * np.repeat(np.sqrt(factor), 3)
        prob = _problem(setup, obj, img, view, G, sigma, sd, free, k_prior, huber)
        state, it, conv, stop = _chain.refine_chain(prob, state, max_iter)
        it_total += it
        Sinv, Cd, pieces = prob.covariance(state)
        if not conv:
            break
        red = _redundancies(prob, state, Sinv, Cd, pieces)
        changed = False
        if not declared and red.image > 0:
            f = red.chi_image / red.image
            if abs(f - 1.0) > _VCE_TOL:
                sigma *= math.sqrt(f)
                changed = True
        if vce:
            for c in range(2):
                if red.robot[c] >= 0.5:
                    f = max(1.0, factor[c] * red.chi_robot[c] / red.robot[c])
                    if abs(f / factor[c] - 1.0) > 0.02:
                        factor[c] = f
                        changed = True
        if not changed:
            break
    return _Fit(prob, state, it_total, conv, stop, Sinv, Cd, pieces, factor)


def _implied_corrections(setup: str, X, Z, G, O) -> np.ndarray:
    """(N, 6) the corrections that would make the chain reproduce each view's own PnP pose."""
    if setup == _chain.EYE_IN_HAND:
        D = _chain.inverse_batch(G) @ Z @ _chain.inverse_batch(X @ O)  # D = G^-1 Z O^-1 X^-1
    else:
        D = _chain.inverse_batch(G) @ X @ O @ se3_inverse(Z)
    return np.concatenate([D[:, :3, 3], _chain.log_batch(D)[:, 3:]], axis=1)


def _consistency_test(fit: _Fit, red: _Redundancy, O: np.ndarray, obj, img, view) -> tuple[float, float, tuple[int, int]]:
    """Nested F test of the chain against every view's pose fitted alone: do the views agree
    with one rigid chain within the corner noise? ``(F, p, (q, dof))``."""
    prob = fit.prob
    e = img - _project(fit.state.k, O[view], obj)
    ssr_p = float(np.sum(e * e))
    dof_p = 2 * img.shape[0] - 6 * prob.n_views
    ssr_c = prob.sigma_px**2 * (red.chi_image + float(red.chi_robot.sum()))
    q = 6 * prob.n_views + red.n_k_prior - int(prob.free.sum())
    if q <= 0 or dof_p <= 0 or ssr_p <= 0:
        return math.nan, math.nan, (0, 0)
    F = max(ssr_c - ssr_p, 0.0) / q / (ssr_p / dof_p)
    return F, _stats.f_sf(F, q, dof_p), (q, dof_p)


def _structure_basis(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(n, 2, 20): cubic monomials of the normalised image coordinates, one set per axis."""
    w, h = size
    a = (img[:, 0] - 0.5 * (w - 1)) / (0.5 * w)
    b = (img[:, 1] - 0.5 * (h - 1)) / (0.5 * h)
    mons = np.stack([np.ones_like(a), a, b, a * a, a * b, b * b, a**3, a * a * b, a * b * b, b**3], axis=1)
    Z = np.zeros((img.shape[0], 2, 20))
    Z[:, 0, :10] = mons
    Z[:, 1, 10:] = mons
    return Z


def _structure_test(fit: _Fit, size: tuple[int, int]) -> tuple[float, float, tuple[int, int], float]:
    """F test of the image residuals' part in a smooth image field (ADR 0027); returns
    ``(F, p, (p1, nu - p1), rms_px)`` (NaN when it cannot run)."""
    prob, st = fit.prob, fit.state
    r, w, U, V, W, S, Vinv = fit.pieces
    _r, Jg, Jd = prob.jacobians(st)
    sq = (np.sqrt(w) / prob.sigma_px)[:, None, None]
    Jg, Jd = Jg * sq, Jd * sq
    rw = (r * sq[:, :, 0])
    Zb = _structure_basis(prob.img, size) * sq
    q = Zb.shape[2]
    Zf = Zb.reshape(-1, q)
    ZZ = Zf.T @ Zf
    try:
        L = np.linalg.cholesky(ZZ + 1e-12 * np.trace(ZZ) / q * np.eye(q))
    except np.linalg.LinAlgError:
        return math.nan, math.nan, (0, 0), math.nan
    Li = np.linalg.inv(L)
    Zo = Zb @ Li.T  # orthonormal columns over the image rows
    Ag = Jg.reshape(-1, Jg.shape[2]).T @ Zo.reshape(-1, q)
    Ad = np.add.reduceat(np.swapaxes(Jd, 1, 2) @ Zo, prob.starts, axis=0)
    fixed = ~prob.free
    Ag[fixed] = 0.0
    WVi = W @ Vinv
    yg = np.linalg.solve(S, Ag - np.einsum("nij,njq->iq", WVi, Ad))
    yg[fixed] = 0.0
    yd = Vinv @ (Ad - np.swapaxes(W, 1, 2) @ yg[None])
    M = np.eye(q) - (Ag.T @ yg + np.einsum("niq,nir->qr", Ad, yd))
    lam, E = np.linalg.eigh(0.5 * (M + M.T))
    keep = lam > _MIN_SINE**2
    p1 = int(keep.sum())
    n_obs = 2 * prob.img.shape[0] + (int(prob.free[_chain.SL_K].sum()) if prob.k_prior is not None else 0)
    nu = n_obs - int(prob.free.sum())
    if p1 == 0 or nu - p1 < _MIN_STRUCTURE_DOF:
        return math.nan, math.nan, (0, 0), math.nan
    b = Zo.reshape(-1, q).T @ rw.reshape(-1)
    Ek = E[:, keep]
    qz = float(np.sum((Ek.T @ b) ** 2 / lam[keep]))
    ssr = float(np.sum(rw * rw)) + float(np.sum((st.d / prob.prior_sd) ** 2))
    if prob.k_prior is not None:
        e = st.k - prob.k_prior[0]
        ssr += float(e @ prob.k_prior[1] @ e)
    rest = max(ssr - qz, 1e-300)
    F = (qz / p1) / (rest / (nu - p1))
    p = _stats.f_sf(F, p1, nu - p1)
    rms = prob.sigma_px * math.sqrt(qz / prob.img.shape[0])
    return F, p, (p1, nu - p1), rms


def _closures(setup: str, X, Z, G, O) -> tuple[np.ndarray, np.ndarray]:
    """Per view static-target closure in the base frame: translation (m) and angle (rad)."""
    if setup == _chain.EYE_IN_HAND:
        A = G @ X @ O  # base_T_target seen by each view
        B = np.broadcast_to(Z, A.shape)
    else:
        A = X @ O  # the target in the base through the camera
        B = G @ Z  # ... and through the robot
    dt = np.linalg.norm(A[:, :3, 3] - B[:, :3, 3], axis=1)
    Rrel = np.swapaxes(B[:, :3, :3], 1, 2) @ A[:, :3, :3]
    cos = np.clip((np.trace(Rrel, axis1=1, axis2=2) - 1.0) * 0.5, -1.0, 1.0)
    return dt, np.arccos(cos)


def _percentile(x: np.ndarray, q: float) -> float:
    x = np.sort(x[np.isfinite(x)]) if np.any(np.isfinite(x)) else np.array([math.inf])
    return float(np.percentile(x, q)) if x.size else math.inf


def _subset(obj, img, view, ids: np.ndarray, nv: int):
    """Corners of views ``ids`` (in that order, repeats allowed) with views renumbered."""
    starts = np.searchsorted(view, np.arange(nv))
    ends = np.append(starts[1:], view.shape[0])
    sel = [np.arange(starts[i], ends[i]) for i in ids]
    idx = np.concatenate(sel)
    nview = np.concatenate([np.full(s.size, j, dtype=np.intp) for j, s in enumerate(sel)])
    return obj[idx], img[idx], nview




def _project(k, P, obj) -> np.ndarray:
    return project(k, P, obj).uv




def _refit(setup, obj, img, view, G, st: _chain.ChainState, prob: _chain.ChainProblem, ids: np.ndarray, nv: int,
           max_iter: int) -> _chain.ChainState | None:
    """The chain refitted on views ``ids`` (repeats allowed) from the full answer, at the
    full fit's noise and priors."""
    o, im, vw = _subset(obj, img, view, ids, nv)
    sub = _chain.ChainProblem(setup, o, im, vw, G[ids], prob.sigma_px, prob.prior_sd[ids], prob.free,
                              k_prior=prob.k_prior, huber=prob.huber)
    s0 = _chain.ChainState(st.X.copy(), st.Z.copy(), st.k.copy(), st.d[ids].copy())
    s, _it, conv, _stop = _chain.refine_chain(sub, s0, max_iter)
    return s if np.all(np.isfinite(s.X)) and np.all(np.isfinite(s.Z)) else None


def _holdout(setup, obj, img, view, G, st, prob, O_f, ct_in, max_iter):
    nv = prob.n_views
    k = min(_HOLDOUT_FOLDS, nv)
    hv = np.full(nv, np.nan)
    ht = np.full(nv, np.inf)
    hr = np.full(nv, np.inf)
    sq, cnt = 0.0, 0
    for f in range(k):
        out = np.arange(f, nv, k)
        keep = np.setdiff1d(np.arange(nv), out)
        s = _refit(setup, obj, img, view, G, st, prob, keep, nv, max_iter)
        if s is None:
            continue
        o, im, vw = _subset(obj, img, view, out, nv)
        Gout = G[out]
        tmp = _chain.ChainProblem(setup, o, im, vw, Gout, prob.sigma_px, prob.prior_sd[out], prob.free)
        e = im - _project(s.k, tmp.poses(_chain.ChainState(s.X, s.Z, s.k, np.zeros((out.size, 6))))[0][vw], o)
        e2 = np.sum(e * e, axis=1)
        hv[out] = np.sqrt(np.bincount(vw, weights=e2, minlength=out.size) / np.bincount(vw, minlength=out.size))
        sq += float(e2.sum())
        cnt += int(e2.size)
        O_out, _c = _pnp(s.k, o, im, vw, out.size, start=O_f[out])
        t, r = _closures(setup, s.X, s.Z, Gout, O_out)
        ht[out], hr[out] = t, r
    h_rms = math.sqrt(sq / cnt) if cnt else math.nan
    in_rms = float(np.sqrt(np.mean(ct_in**2)))
    fin = ht[np.isfinite(ht)]
    infl = float(np.sqrt(np.mean(fin**2))) / in_rms if fin.size and in_rms > 0 else math.inf
    closure = HoldoutClosure(
        method="k-fold refit", folds=k, translation_m=ht, rotation_rad=hr,
        p50_translation_m=_percentile(ht, 50), p90_translation_m=_percentile(ht, 90),
        max_translation_m=float(np.max(ht)), p50_rotation_rad=_percentile(hr, 50),
        p90_rotation_rad=_percentile(hr, 90), max_rotation_rad=float(np.max(hr)), inflation=infl)
    return closure, hv, h_rms


def _bootstrap(setup, obj, img, view, G, st, prob, O_f, n_boot, seed, names, covX, covZ, with_cv, max_iter):
    """Views resampled with replacement, the chain refitted from the full answer; with the
    cross-check, OpenCV's closed forms on each replicate's distinct views (paired)."""
    rng = np.random.default_rng(seed)
    nv = prob.n_views
    xs: list[np.ndarray] = []
    zs: list[np.ndarray] = []
    pairs: list[tuple[np.ndarray, dict[str, np.ndarray]]] = []
    cv = False
    if with_cv:
        from cellcal.solver import camera_checks

        cv = camera_checks.closed_forms_available()
    for _ in range(n_boot):
        ids = np.sort(rng.integers(0, nv, nv))
        if np.unique(ids).size < MIN_VIEWS:
            continue
        s = _refit(setup, obj, img, view, G, st, prob, ids, nv, min(max_iter, 20))
        if s is None:
            continue
        xi_x = _chain.log_batch(se3_inverse(st.X) @ s.X)
        xi_z = _chain.log_batch(se3_inverse(st.Z) @ s.Z)
        xs.append(xi_x)
        zs.append(xi_z)
        if cv:
            from cellcal.solver import camera_checks

            u = np.unique(ids)
            try:
                sols = camera_checks.opencv_closed_forms(setup, G[u], O_f[u])
            except Exception:  # noqa: BLE001 - a closed form failing on a replicate is a figure, not an error
                sols = {}
            pairs.append((s.X, sols))
    if not xs:
        return None, []
    Xs, Zs = np.array(xs), np.array(zs)
    cx = np.cov(Xs.T) if len(xs) > 1 else np.full((6, 6), np.nan)
    cz = np.cov(Zs.T) if len(zs) > 1 else np.full((6, 6), np.nan)
    bt, br = sigma_figures(cx)
    at, ar = sigma_figures(covX)
    boot = Bootstrap(n=len(xs), n_requested=n_boot, seed=seed, covariance={names[0]: cx, names[1]: cz},
                     sigma_ratio_translation=bt / at if at > 0 else math.inf,
                     sigma_ratio_rotation=br / ar if ar > 0 else math.inf, primary=Xs)
    return boot, pairs
