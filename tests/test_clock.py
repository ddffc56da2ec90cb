"""Clock mapping: recover a simulated offset and skew under random one-sided delays.

Stated tolerances (what the models promise on these delay statistics):

* exchanges (PING/PONG, 64-sample window, one-way delays 50 us + Exp(150 us) each way,
  2 ms device processing, one exchange every 0.5 s on average, so the window spans about
  30 s): skew within 5 ppm, mapping error within 40 us and within the model's own
  ``uncertainty_ns``;
* streams (500 Hz, delay 100 us + Exp(300 us), a 2048-packet window spanning 4 s): skew
  within 5 ppm, mapping error within 20 us of the minimum-latency line, and within
  ``uncertainty_ns`` + 10 us. (The envelope's slope error scales as 1 / window span: a
  1 s window gives about 4 ppm rms, which is 4 us across the window.)
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellcal.drivers.clock import ClockNotReady, ExchangeClockModel, StreamClockModel

H0 = 7_000_000_000_000  # host monotonic_ns at the start: ~2 hours after boot


class DeviceClock:
    """Truth: device seconds as a function of host nanoseconds."""

    def __init__(self, offset_s: float, skew: float) -> None:
        self.offset_s, self.skew = offset_s, skew

    def dev(self, h_ns: float) -> float:
        return self.offset_s + (1.0 + self.skew) * (h_ns - H0) * 1e-9

    def host(self, d_s: float) -> float:
        return H0 + (d_s - self.offset_s) / (1.0 + self.skew) * 1e9


def run_exchanges(model, truth, rng, n, period_s=0.1, start_ns=H0):
    h = start_ns
    for _ in range(n):
        h += int(period_s * 1e9 * (0.5 + rng.random()))
        up = 50_000 + rng.exponential(150_000)
        proc = 2_000_000
        down = 50_000 + rng.exponential(150_000)
        t1 = h
        t2 = truth.dev(t1 + up)
        t3 = truth.dev(t1 + up + proc)
        t4 = int(t1 + up + proc + down)
        model.add_exchange(t1, t2, t3, t4)
    return h


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("offset_s, skew_ppm", [(12345.678, 80.0), (0.001, -35.0), (3.0e6, 0.0)])
def test_exchange_recovers_offset_and_skew(seed, offset_s, skew_ppm):
    rng = np.random.default_rng(seed)
    truth = DeviceClock(offset_s, skew_ppm * 1e-6)
    model = ExchangeClockModel(window=64)
    h_end = run_exchanges(model, truth, rng, 200, period_s=0.5)
    assert model.ready and model.n_samples == 64 and model.rate_fitted
    assert abs(model.skew_ppm - skew_ppm) < 5.0
    assert abs(model.skew - skew_ppm * 1e-6) < 5e-6  # skew is a ratio, skew_ppm the same in ppm
    for back_s in (0.0, 1.0, 3.0):
        h = h_end - int(back_s * 1e9)
        err_ns = model.to_host_ns(truth.dev(h)) - h
        assert abs(err_ns) < 40_000
        assert abs(err_ns) <= model.uncertainty_ns
    # offset: host minus device at the newest sample
    d_new = model.to_device_s(model._h_ref)
    assert model.offset_ns == pytest.approx(truth.host(d_new) - d_new * 1e9, abs=40_000)


def test_exchange_rejects_outliers_by_delay():
    # Every other exchange is delayed by 30 ms on one path only (a busy host): averaging
    # all midpoints would be off by ~7 ms, keeping the fastest quarter is not.
    rng = np.random.default_rng(3)
    truth = DeviceClock(100.0, 20e-6)
    model = ExchangeClockModel(window=100)
    h = H0
    for i in range(100):
        h += 100_000_000
        up = 50_000 + (30_000_000 if i % 2 else 0) + rng.exponential(20_000)
        down = 50_000 + rng.exponential(20_000)
        t2 = truth.dev(h + up)
        model.add_exchange(h, t2, t2 + 1e-3, int(h + up + 1_000_000 + down))
    err = model.to_host_ns(truth.dev(h)) - h
    assert abs(err) < 100_000
    assert model.min_delay_ns < 200_000


def test_exchange_short_burst_assumes_nominal_rate():
    truth = DeviceClock(50.0, 100e-6)
    model = ExchangeClockModel()
    rng = np.random.default_rng(0)
    run_exchanges(model, truth, rng, 8, period_s=0.002)  # 16 ms: too short for a slope
    assert model.ready and not model.rate_fitted and model.skew == 0.0
    # offset still good to well under a millisecond
    h = H0 + 10_000_000
    assert abs(model.to_host_ns(truth.dev(h)) - h) < 400_000


def test_exchange_handles_a_scaled_device_clock():
    # A device whose clock runs 10x the host (a simulator at time scale 10): the rate fit
    # takes over once the window spans enough time.
    truth = DeviceClock(5.0, 9.0)
    model = ExchangeClockModel(nominal_rate=1.0)
    run_exchanges(model, truth, np.random.default_rng(1), 100)
    assert model.rate == pytest.approx(10.0, rel=1e-4)


def test_mapping_roundtrip_and_not_ready():
    model = ExchangeClockModel()
    assert not model.ready and model.n_samples == 0
    with pytest.raises(ClockNotReady):
        model.to_host_ns(1.0)
    with pytest.raises(ClockNotReady):
        _ = model.offset_ns
    run_exchanges(model, DeviceClock(10.0, 30e-6), np.random.default_rng(2), 30)
    for d in (9.5, 10.0, 12.25, 1000.0):
        assert model.to_device_s(model.to_host_ns(d)) == pytest.approx(d, abs=2e-9)


def test_exchange_rejects_backwards_stamps():
    model = ExchangeClockModel()
    with pytest.raises(ValueError):
        model.add_exchange(100, 1.0, 1.1, 99)
    with pytest.raises(ValueError):
        model.add_exchange(100, 1.1, 1.0, 200)
    with pytest.raises(ValueError):
        model.add_exchange(100, float("nan"), float("nan"), 200)
    assert model.n_samples == 0


def test_reset_forgets():
    model = ExchangeClockModel()
    run_exchanges(model, DeviceClock(10.0, 0.0), np.random.default_rng(2), 10)
    model.reset()
    assert model.n_samples == 0 and not model.ready


# -- streams ------------------------------------------------------------------------------------


def run_stream(model, truth, rng, n, rate_hz=500.0, min_delay_ns=100_000):
    h = H0
    for i in range(n):
        h = H0 + int(i / rate_hz * 1e9)
        model.add(truth.dev(h), int(h + min_delay_ns + rng.exponential(300_000)))
    return h


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("offset_s, skew_ppm", [(0.0, 50.0), (86400.0, -120.0)])
def test_stream_recovers_offset_and_skew(seed, offset_s, skew_ppm):
    rng = np.random.default_rng(seed)
    truth = DeviceClock(offset_s, skew_ppm * 1e-6)
    model = StreamClockModel(window=2048, latency_ns=100_000)
    h_end = run_stream(model, truth, rng, 4000)
    assert model.ready and model.rate_fitted
    assert abs(model.skew_ppm - skew_ppm) < 5.0
    for back_s in (0.0, 0.5):
        h = h_end - int(back_s * 1e9)
        err = model.to_host_ns(truth.dev(h)) - h  # the known latency is subtracted
        assert abs(err) < 20_000
        assert abs(err) <= model.uncertainty_ns + 10_000


def test_stream_without_known_latency_maps_to_earliest_arrival():
    truth = DeviceClock(1.0, 0.0)
    model = StreamClockModel()
    h_end = run_stream(model, truth, np.random.default_rng(9), 1000, min_delay_ns=400_000)
    err = model.to_host_ns(truth.dev(h_end)) - h_end
    assert 380_000 < err < 420_000  # the unobservable constant latency stays in


def test_stream_refit_is_throttled_but_tracks():
    truth = DeviceClock(3.0, 10e-6)
    model = StreamClockModel(refit_every=64)
    rng = np.random.default_rng(4)
    h_end = run_stream(model, truth, rng, 3000)
    assert abs(model.to_host_ns(truth.dev(h_end)) - h_end - 100_000) < 30_000


@settings(max_examples=40, deadline=None)
@given(
    offset_s=st.floats(0.0, 1e6),
    skew_ppm=st.floats(-200.0, 200.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_exchange_uncertainty_is_honest(offset_s, skew_ppm, seed):
    truth = DeviceClock(offset_s, skew_ppm * 1e-6)
    model = ExchangeClockModel()
    h_end = run_exchanges(model, truth, np.random.default_rng(seed), 80)
    err = model.to_host_ns(truth.dev(h_end)) - h_end
    assert abs(err) <= model.uncertainty_ns


def latch_exchanges(model, truth, rng, n, period_s, heavy):
    """GigE Vision timestamp-latch exchanges: one device stamp somewhere inside each round
    trip (t2 = t3), the delays each way heavy-tailed when ``heavy`` (a loaded host: a thread
    not scheduled for milliseconds on either leg)."""
    h = H0
    spans = []
    for _ in range(n):
        h += int(period_s * 1e9 * (0.5 + rng.random()))
        up, down = (30_000 + rng.exponential(60_000, 2)).tolist()
        if heavy and rng.random() < 0.4:
            up += rng.pareto(1.2) * 400_000
        if heavy and rng.random() < 0.4:
            down += rng.pareto(1.2) * 400_000
        t1 = h
        d = truth.dev(t1 + up)
        t4 = int(t1 + up + down)
        model.add_exchange(t1, d, d, t4)
        spans.append(t4 - t1)
    return spans


@settings(max_examples=60, deadline=None)
@given(
    skew_ppm=st.floats(-300.0, 300.0),
    n=st.integers(6, 40),
    heavy=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_exchange_rate_error_bound_holds_for_latch_exchanges(skew_ppm, n, heavy, seed):
    """The fitted rate lies within ``rate_error_bound`` of the truth, whatever the delays do:
    each point is off by at most half its own round trip, and the bound is the least-squares
    slope's worst case over those (the GigE driver's ``clock_rate_bound`` rests on it)."""
    truth = DeviceClock(5000.0, skew_ppm * 1e-6)
    model = ExchangeClockModel(window=32, keep_fraction=0.5)
    latch_exchanges(model, truth, np.random.default_rng(seed), n, period_s=0.12, heavy=heavy)
    if not model.rate_fitted:
        assert model.rate_error_bound == float("inf")
        return
    assert abs(model.rate - (1.0 + skew_ppm * 1e-6)) <= model.rate_error_bound * (1 + 1e-9) + 1e-15


def test_the_rate_bound_follows_the_exchanges_the_line_rests_on_not_the_window_span():
    """The fastest exchanges cluster at the window's two ends in one run and in its first
    half in another: the second has the same window span but a slope resting on half of it,
    and its bound is the wider."""
    truth = DeviceClock(0.0, 150e-6)

    def run(fast_at):
        model = ExchangeClockModel(window=32, keep_fraction=0.25)
        for i in range(32):
            t1 = H0 + i * 100_000_000
            rtt = 20_000 if fast_at(i) else 2_000_000
            d = truth.dev(t1 + rtt // 2)
            model.add_exchange(t1, d, d, t1 + rtt)
        return model

    ends = run(lambda i: i < 4 or i >= 28)
    first_half = run(lambda i: 4 <= i < 12)
    assert ends.rate_fitted and first_half.rate_fitted
    assert first_half.rate_error_bound > 2.0 * ends.rate_error_bound
    for m in (ends, first_half):
        assert abs(m.rate - 1.00015) <= m.rate_error_bound
