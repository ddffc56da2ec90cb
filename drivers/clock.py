"""Map a device clock to the host's ``time.monotonic_ns()``.

Two ways a device tells us its time, one model each, sharing one line fit:

* :class:`ExchangeClockModel` -- request/response exchanges (the tracker's PING/PONG): the
  four NTP timestamps ``t1`` host send, ``t2`` device receive, ``t3`` device send, ``t4``
  host receive. The round-trip delay ``(t4 - t1) - (t3 - t2)`` bounds how wrong one
  exchange can be (half of it, whatever the asymmetry), so the model keeps the
  lowest-delay exchanges of its window and fits a line through their midpoints.
* :class:`StreamClockModel` -- streamed packets stamped by the device (RTDE): only the host
  receive time is known, and the receive delay is never negative, so every point lies on
  one side of the true mapping; the model fits the envelope (the supporting line of the
  points' convex hull closest to all of them on average).

The mapping is a line ``device_s = d_ref + rate * (host_ns - h_ref) * 1e-9``, anchored at
the newest sample so that float64 keeps sub-nanosecond resolution whatever the absolute
clock values are.

**Clock steps.** A device clock that is set from outside (an NTP correction, an operator)
jumps; a line fitted across the jump is wrong on both sides for a whole window. Each new
sample is therefore compared with the current line first: a sample further from it than it
can be (exchanges: half its round-trip delay plus the model's :attr:`uncertainty_ns` plus
``step_threshold_s``; streams: *above* the envelope, which no delay can explain, by more
than ``step_threshold_s``) is held back, and the next sample decides: if it agrees with the
held one, the clock stepped (:attr:`steps` counts it, :attr:`last_step_s` is its size) and
the window restarts from the two; if it agrees with the line, the held sample was a bad
stamp and is dropped (:attr:`rejected`). A stream's clock stepping *back* looks like a
delay; it is taken for a step when every packet for ``step_confirm_s`` of device time lies
more than ``step_threshold_s`` below the envelope (a loaded host delivers some packet
promptly far more often than that).

Conventions
-----------
``skew`` is a dimensionless ratio: ``rate - 1``, where ``rate`` is device seconds per host
second (``5e-5`` = the device clock runs 50 ppm fast); ``skew_ppm`` is the same in ppm.
``offset_ns`` is host time minus device time, in nanoseconds, at the newest sample.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from cellcal.drivers.errors import DriverError

__all__ = ["ExchangeClockModel", "StreamClockModel", "ClockNotReady"]

_NS_PER_S = 1_000_000_000
_S_PER_NS = 1e-9


class ClockNotReady(DriverError, RuntimeError):
    """A mapping was asked of a model that has no sample yet (also a ``RuntimeError``)."""


class _LineClockModel:
    """Shared state and fit of both models: a window of (host, device) points and a line.

    Subclasses choose which points define the line (:meth:`_select_and_fit`).

    Parameters
    ----------
    window : int
        Newest samples kept.
    min_samples : int
        Samples needed before :attr:`ready`.
    min_skew_span_s : float
        Host-time span the points defining the line must cover before the rate is fitted;
        below it the rate is ``nominal_rate`` (a slope from a few milliseconds of jittery
        points is worse than assuming the nominal rate).
    nominal_rate : float
        Device seconds per host second assumed until the rate can be fitted.
    """

    def __init__(
        self,
        window: int,
        *,
        min_samples: int,
        min_skew_span_s: float,
        nominal_rate: float = 1.0,
        step_threshold_s: float = 1e-3,
    ) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2, got {window}")
        if not nominal_rate > 0:
            raise ValueError(f"nominal_rate must be > 0, got {nominal_rate}")
        if not step_threshold_s > 0:
            raise ValueError(f"step_threshold_s must be > 0, got {step_threshold_s}")
        self.step_threshold_s = float(step_threshold_s)
        #: clock steps detected (the window restarted after each)
        self.steps = 0
        #: size of the last step (device seconds, positive: the device clock jumped ahead)
        self.last_step_s = 0.0
        #: samples held back as a possible step and then dropped (they agreed with nothing)
        self.rejected = 0
        self._held: tuple[int, float, float, float] | None = None  # host_ns, dev_s, delay_ns, deviation_s
        self.window = int(window)
        self.min_samples = int(min_samples)
        self.min_skew_span_s = float(min_skew_span_s)
        self.nominal_rate = float(nominal_rate)
        self._host_ns: deque[int] = deque(maxlen=self.window)
        self._dev_s: deque[float] = deque(maxlen=self.window)
        self._delay_ns: deque[float] = deque(maxlen=self.window)
        self._dirty = False
        # fitted line and its quality
        self._h_ref = 0
        self._d_ref = 0.0
        self._rate = self.nominal_rate
        self._rate_fitted = False
        self._scatter_ns = 0.0
        self._delay_term_ns = 0.0

    # -- shared API ------------------------------------------------------------------------
    @property
    def n_samples(self) -> int:
        """Samples currently in the window."""
        return len(self._host_ns)

    @property
    def ready(self) -> bool:
        """True once ``min_samples`` samples are in the window."""
        return len(self._host_ns) >= self.min_samples

    @property
    def rate(self) -> float:
        """Device seconds per host second."""
        self._ensure_fit()
        return self._rate

    @property
    def skew(self) -> float:
        """Fractional rate error ``rate - 1`` (dimensionless; 5e-5 = 50 ppm fast)."""
        return self.rate - 1.0

    @property
    def skew_ppm(self) -> float:
        """:attr:`skew` in parts per million."""
        return self.skew * 1e6

    @property
    def rate_fitted(self) -> bool:
        """Whether :attr:`rate` was fitted (else it is ``nominal_rate``)."""
        self._ensure_fit()
        return self._rate_fitted

    @property
    def offset_ns(self) -> int:
        """Host time minus device time (ns) at the newest sample."""
        self._ensure_fit()
        return self._h_ref - round(self._d_ref * _NS_PER_S)

    @property
    def uncertainty_ns(self) -> float:
        """Bound on the mapping error near the window (ns); see the subclass for its terms.

        Extrapolating far beyond the window adds ``|rate error| * distance``, not included.
        """
        self._ensure_fit()
        return self._delay_term_ns + self._scatter_ns

    def to_host_ns(self, t_device_s: float) -> int:
        """Host ``monotonic_ns`` at which the device clock read ``t_device_s``."""
        self._ensure_fit()
        return self._h_ref + round((float(t_device_s) - self._d_ref) / self._rate * _NS_PER_S)

    def to_device_s(self, t_host_ns: int) -> float:
        """Device clock reading (s) at host ``monotonic_ns`` ``t_host_ns``."""
        self._ensure_fit()
        return self._d_ref + self._rate * ((int(t_host_ns) - self._h_ref) * _S_PER_NS)

    def reset(self) -> None:
        """Forget every sample (after the device rebooted or was replaced)."""
        self._held = None
        self._host_ns.clear()
        self._dev_s.clear()
        self._delay_ns.clear()
        self._rate = self.nominal_rate
        self._rate_fitted = False
        self._dirty = False

    @property
    def step_pending(self) -> bool:
        """A sample is held back as a possible clock step (the next one decides)."""
        return self._held is not None

    # -- internals ------------------------------------------------------------------------
    def _deviation_s(self, host_ns: int, dev_s: float) -> float | None:
        """How far ``dev_s`` is from the current line at ``host_ns`` (None: no line yet)."""
        if len(self._host_ns) < max(2, self.min_samples // 2) or not self.rate_fitted:
            return None  # without a fitted rate the line's extrapolation error has no bound
        return float(dev_s) - self.to_device_s(host_ns)

    def _limit_s(self, host_ns: int, bound_ns: float) -> float:
        """How far (device s) a good sample with its own error bound ``bound_ns`` can be from
        the line at ``host_ns``: its bound, the line's uncertainty, the slope's uncertainty
        (twice the uncertainty over the window's span, at least 100 ppm) times the distance
        from the window, and ``step_threshold_s``."""
        unc_s = self.uncertainty_ns * _S_PER_NS
        span_s = max((self._host_ns[-1] - self._host_ns[0]) * _S_PER_NS, 1e-3)
        slope_err = self._rate * (2.0 * unc_s / span_s + 1e-4)
        since_s = abs(host_ns - self._host_ns[-1]) * _S_PER_NS
        return (bound_ns * _S_PER_NS + unc_s) * self._rate + slope_err * since_s + self.step_threshold_s

    def _step_check(self, host_ns: int, dev_s: float, delay_ns: float, limit_s: float | None,
                    deviation: float | None) -> bool:
        """Whether to add the sample now (False: held back, or it confirmed a step and the
        window was restarted with it). ``limit_s``: how far from the line a good sample can
        be (None: any)."""
        held = self._held
        suspicious = deviation is not None and limit_s is not None and abs(deviation) > limit_s
        if held is not None:
            self._held = None
            h_host, h_dev, h_delay, h_dev_off = held
            if suspicious and deviation is not None and abs(deviation - h_dev_off) <= (limit_s or 0.0):
                # two samples agree with each other and not with the line: the clock stepped
                self.steps += 1
                self.last_step_s = 0.5 * (deviation + h_dev_off)
                self.reset()
                self._append(h_host, h_dev, h_delay)
                self._append(host_ns, dev_s, delay_ns)
                return False
            self.rejected += 1
        if suspicious:
            assert deviation is not None
            self._held = (int(host_ns), float(dev_s), float(delay_ns), deviation)
            return False
        return True

    def _append(self, host_ns: int, dev_s: float, delay_ns: float) -> None:
        if not math.isfinite(dev_s):
            raise ValueError(f"device time must be finite, got {dev_s!r}")
        self._host_ns.append(int(host_ns))
        self._dev_s.append(float(dev_s))
        self._delay_ns.append(float(delay_ns))
        self._dirty = True

    def _ensure_fit(self) -> None:
        if not self._host_ns:
            raise ClockNotReady("no clock sample yet")
        if self._dirty:
            self._refit()
            self._dirty = False

    def _refit(self) -> None:
        # Work relative to the newest sample so float64 keeps its resolution.
        h_ref = self._host_ns[-1]
        d_ref = self._dev_s[-1]
        x = np.fromiter((h - h_ref for h in self._host_ns), float, len(self._host_ns)) * _S_PER_NS
        y = np.fromiter(self._dev_s, float, len(self._dev_s)) - d_ref
        delay = np.fromiter(self._delay_ns, float, len(self._delay_ns))
        idx, intercept, rate, fitted = self._select_and_fit(x, y, delay)
        self._h_ref = h_ref
        self._d_ref = d_ref + intercept  # line value at x = 0 (host time h_ref)
        self._rate = rate
        self._rate_fitted = fitted
        resid_s = y[idx] - (intercept + rate * x[idx])
        self._scatter_ns = self._scatter(resid_s / rate * _NS_PER_S)
        self._delay_term_ns = self._delay_term(delay[idx])
        self._fit_x, self._fit_delay_ns = x[idx], delay[idx]

    def _fit_line(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, bool]:
        """Least-squares ``y = a + b x``; ``b`` is the nominal rate if ``x`` spans too little."""
        if x.size >= 2 and float(np.ptp(x)) >= self.min_skew_span_s:
            xm, ym = float(x.mean()), float(y.mean())
            dx = x - xm
            b = float(dx @ (y - ym)) / float(dx @ dx)
            if b > 0:
                return ym - b * xm, b, True
        b = self._rate if self._rate_fitted else self.nominal_rate
        return float(np.mean(y - b * x)), b, False

    # subclass hooks
    def _select_and_fit(self, x, y, delay):  # pragma: no cover - abstract
        raise NotImplementedError

    def _scatter(self, resid_ns: np.ndarray) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _delay_term(self, delay_ns: np.ndarray) -> float:  # pragma: no cover - abstract
        raise NotImplementedError


class ExchangeClockModel(_LineClockModel):
    """Device clock from request/response exchanges (NTP's four timestamps).

    Parameters
    ----------
    window : int
        Newest exchanges kept.
    keep_fraction : float
        Share of the window's exchanges, lowest round-trip delay first, that define the
        line (at least ``min(3, n)``). Delays are one-sided and heavy-tailed (a busy host,
        a UART FIFO), so the fastest exchanges are the truthful ones.
    min_samples, min_skew_span_s, nominal_rate
        See :class:`_LineClockModel`; the rate is fitted once the kept exchanges span
        ``min_skew_span_s`` (default 0.5 s) of host time.

    Notes
    -----
    Each exchange gives the point (host midpoint ``(t1 + t4) / 2``, device midpoint
    ``(t2 + t3) / 2``), which is wrong by at most half its round-trip delay whatever the
    path asymmetry. :attr:`uncertainty_ns` is therefore half the largest round-trip delay
    among the exchanges used, plus the largest residual of those exchanges from the line.
    """

    def __init__(
        self,
        window: int = 64,
        *,
        keep_fraction: float = 0.25,
        min_samples: int = 4,
        min_skew_span_s: float = 0.5,
        nominal_rate: float = 1.0,
        step_threshold_s: float = 1e-3,
    ) -> None:
        super().__init__(
            window, min_samples=min_samples, min_skew_span_s=min_skew_span_s,
            nominal_rate=nominal_rate, step_threshold_s=step_threshold_s,
        )
        if not 0 < keep_fraction <= 1:
            raise ValueError(f"keep_fraction must be in (0, 1], got {keep_fraction}")
        self.keep_fraction = float(keep_fraction)

    def add_exchange(
        self, t1_host_ns: int, t2_device_s: float, t3_device_s: float, t4_host_ns: int
    ) -> float:
        """Add one exchange; returns its round-trip delay in ns.

        Raises
        ------
        ValueError
            If the host or device stamps run backwards (``t4 < t1`` or ``t3 < t2``).
        """
        t1, t4 = int(t1_host_ns), int(t4_host_ns)
        t2, t3 = float(t2_device_s), float(t3_device_s)
        if t4 < t1 or not t3 >= t2:
            raise ValueError(f"exchange stamps run backwards: t1={t1} t2={t2} t3={t3} t4={t4}")
        rate = self._rate if self._rate_fitted else self.nominal_rate
        # Device processing time in host nanoseconds; a delay below zero means stamps that
        # cannot both be right, counted as zero delay rather than trusted more than others.
        delay_ns = max(0.0, (t4 - t1) - (t3 - t2) / rate * _NS_PER_S)
        # Midpoints: store the host midpoint in integer ns (rounding costs 0.5 ns).
        host, dev = (t1 + t4) // 2, 0.5 * (t2 + t3)
        deviation = self._deviation_s(host, dev)
        limit = None
        if deviation is not None:
            limit = self._limit_s(host, 0.5 * delay_ns)
        if self._step_check(host, dev, delay_ns, limit, deviation):
            self._append(host, dev, delay_ns)
        return delay_ns

    @property
    def rate_error_bound(self) -> float:
        """Bound on the fitted rate's error (dimensionless, device s per host s), ``inf``
        until the rate is fitted.

        Each point the line rests on is off by at most half its round-trip delay (Notes), so
        the least-squares slope through them is off by at most
        ``rate * sum(|x_i - mean(x)| * delay_i / 2) / sum((x_i - mean(x))^2)``: the points'
        own spread in time and their own delays, not the window's span (the kept exchanges
        may cluster in a part of it).
        """
        self._ensure_fit()
        if not self._rate_fitted or self._fit_x.size < 2:
            return math.inf
        dx = self._fit_x - float(self._fit_x.mean())
        den = float(dx @ dx)
        if den <= 0.0:
            return math.inf
        return self._rate * float(np.abs(dx) @ (0.5 * self._fit_delay_ns * _S_PER_NS)) / den

    @property
    def min_delay_ns(self) -> float:
        """Smallest round-trip delay in the window (ns)."""
        if not self._delay_ns:
            raise ClockNotReady("no clock sample yet")
        return min(self._delay_ns)

    def _select_and_fit(self, x, y, delay):
        n = x.size
        k = min(n, max(3, math.ceil(self.keep_fraction * n)))
        idx = np.argsort(delay, kind="stable")[:k]
        a, b, fitted = self._fit_line(x[idx], y[idx])
        return idx, a, b, fitted

    def _scatter(self, resid_ns):
        return float(np.max(np.abs(resid_ns))) if resid_ns.size else 0.0

    def _delay_term(self, delay_ns):
        return 0.5 * float(np.max(delay_ns))


class StreamClockModel(_LineClockModel):
    """Device clock from packets the device stamps and streams (RTDE ``timestamp``).

    Parameters
    ----------
    window : int
        Newest packets kept.
    latency_ns : int
        Known constant transport latency to subtract. A stream cannot observe its own
        minimum latency: without this, :meth:`to_host_ns` returns the host time at which a
        packet sent at that device time would have *arrived* with the smallest delay seen.
    min_samples, min_skew_span_s, nominal_rate
        See :class:`_LineClockModel` (defaults: 16 samples, 0.5 s).
    refit_every : int
        Refit at most once per this many new packets (a hull of a few hundred points per
        packet at 500 Hz would cost more than the robot driver's whole loop).

    Notes
    -----
    The receive delay is never negative, so with ``x`` host receive time and ``y`` device
    stamp every point lies on or below the true line. The fit is the edge of the upper
    convex hull above the points' mean host time: the line that touches the points from
    above with the smallest mean gap to them. :attr:`uncertainty_ns` is the 5th percentile
    of the gaps (how far the envelope may sit from the true minimum-delay line when only a
    few packets reach it), plus the residual of the hull points from the line (zero
    unless the rate could not be fitted).
    """

    def __init__(
        self,
        window: int = 512,
        *,
        latency_ns: int = 0,
        min_samples: int = 16,
        min_skew_span_s: float = 0.5,
        nominal_rate: float = 1.0,
        refit_every: int = 8,
        step_threshold_s: float = 1e-3,
        step_confirm_s: float = 1.0,
        back_step_threshold_s: float = 0.02,
    ) -> None:
        super().__init__(
            window, min_samples=min_samples, min_skew_span_s=min_skew_span_s,
            nominal_rate=nominal_rate, step_threshold_s=step_threshold_s,
        )
        self.latency_ns = int(latency_ns)
        self.refit_every = max(1, int(refit_every))
        self.step_confirm_s = float(step_confirm_s)
        self.back_step_threshold_s = float(back_step_threshold_s)
        self._since_fit = 0
        self._gap_term_ns = 0.0
        self._below_since: tuple[int, float] | None = None  # first packet of a run far below the envelope

    def add(self, t_device_s: float, t_recv_host_ns: int) -> None:
        """Add one packet: its device stamp (s) and the host time it was received."""
        host, dev = int(t_recv_host_ns) - self.latency_ns, float(t_device_s)
        deviation = self._deviation_s(host, dev) if self.ready else None
        if deviation is not None and deviation < -self.back_step_threshold_s:
            # far below the envelope: a delay, or the clock stepped back
            if self._below_since is None:
                self._below_since = (host, dev)
            elif dev - self._below_since[1] >= self.step_confirm_s:
                self.steps += 1
                self.last_step_s = deviation
                self.reset()
        else:
            self._below_since = None
        # above the envelope: no delay explains it (one-sided limit)
        limit = self._limit_s(host, 0.0) if deviation is not None and deviation > 0 else None
        if self._step_check(host, dev, 0.0, limit, deviation):
            self._append(host, dev, 0.0)
        self._since_fit += 1

    def _ensure_fit(self) -> None:
        # Throttle: a fit is reused for up to refit_every packets once the model is ready.
        if self._dirty and self.ready and self._since_fit < self.refit_every and self._fitted_once:
            return
        super()._ensure_fit()
        self._since_fit = 0
        self._fitted_once = True

    _fitted_once = False

    def reset(self) -> None:
        super().reset()
        self._fitted_once = False
        self._since_fit = 0
        self._below_since = None

    def _select_and_fit(self, x, y, delay):
        fitted = False
        if x.size >= 2 and float(x.max() - x.min()) >= self.min_skew_span_s:
            bridge = _hull_bridge(x, y, float(x.mean()), self._rate if self._rate_fitted else self.nominal_rate)
            if bridge is not None:
                a, b, idx = bridge
                fitted = True
        if not fitted:
            # Too short to fit the rate: the envelope with the known rate touches the
            # highest point of y - b x.
            b = self._rate if self._rate_fitted else self.nominal_rate
            k = int(np.argmax(y - b * x))
            a = float(y[k] - b * x[k])
            idx = np.array([k])
        gaps_ns = (a + b * x - y) / b * _NS_PER_S
        self._gap_term_ns = float(np.percentile(gaps_ns, 5)) if gaps_ns.size > 1 else 0.0
        return idx, a, b, fitted

    def _scatter(self, resid_ns):
        return float(np.max(np.abs(resid_ns))) if resid_ns.size else 0.0

    def _delay_term(self, delay_ns):
        return self._gap_term_ns


def _hull_bridge(x: np.ndarray, y: np.ndarray, xm: float, b0: float):
    """The edge of the upper convex hull of ``(x, y)`` above ``x = xm``: ``(a, b, idx)``.

    That edge is the line ``y = a + b x`` on or above every point with the lowest value at
    ``xm``: it minimises the convex, piecewise-linear ``F(b) = max_i(y_i - b x_i) + b xm``,
    whose slope is ``xm - x_k(b)`` (``k`` the maximising point). Bisection on ``b`` finds
    where that slope changes sign; each step is one vectorised pass, so a refit costs
    about 60 numpy calls whatever the window, where building the whole hull was a Python
    loop over every sample (milliseconds at 500 samples). Returns None if the bridge's
    slope is not positive (no usable rate).
    """
    def pick(b: float) -> int:
        return int(np.argmax(y - b * x))

    width = max(abs(b0) * 1e-2, 1e-6)
    lo, hi = b0 - width, b0 + width
    for _ in range(60):  # widen until the slope of F changes sign inside [lo, hi]
        if x[pick(lo)] >= xm:
            break
        lo -= width
        width *= 2.0
    for _ in range(60):
        if x[pick(hi)] <= xm:
            break
        hi += width
        width *= 2.0
    for _ in range(64):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if x[pick(mid)] >= xm:
            lo = mid
        else:
            hi = mid
    i_right, i_left = pick(lo), pick(hi)  # the two contact points (x >= xm, x <= xm)
    if x[i_right] == x[i_left]:
        b = 0.5 * (lo + hi)
        k = i_right
        return (float(y[k] - b * x[k]), float(b), np.array([k])) if b > 0 else None
    b = float((y[i_right] - y[i_left]) / (x[i_right] - x[i_left]))
    if not b > 0:
        return None
    return float(y[i_right] - b * x[i_right]), b, np.array([i_left, i_right])
