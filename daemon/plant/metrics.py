"""Prometheus ``/metrics`` of one daemon (prometheus_client, ADR 0026).

Served on ``[metrics] listen`` (``127.0.0.1:9108`` by default) by prometheus_client's own
HTTP server in its thread, from a registry of this daemon's (never the process-wide default
one, so two daemons in one process, as in the tests, keep theirs apart). Two kinds of metric:

Counted from the events, as they happen (``on_event``: a counter increment, no I/O)
    ``cellcal_stations_total{outcome}`` (accepted, rejected), ``cellcal_faults_total{device,
    code}`` (raised faults; ``device`` "none" for the daemon and its interfaces),
    ``cellcal_drift_checks_total{status}``, ``cellcal_results_total`` (results published),
    ``cellcal_solve_seconds`` (histogram: time in SOLVING per run, from the state events).
Read at each scrape (a collector calling ``status()`` and reading the last result and drift
seen; a scrape costs the daemon one status read)
    ``cellcal_info{cell, version, boot_id}`` = 1, ``cellcal_state{state}`` (1 for the current
    one), ``cellcal_uptime_seconds``, ``cellcal_device_connected{device}``,
    ``cellcal_queued_jobs``, ``cellcal_active_result_id``, ``cellcal_active_result_age_seconds``
    (since it was created), ``cellcal_active_result_suspect``,
    ``cellcal_active_result_sigma_mm{estimate}`` / ``_sigma_deg{estimate}`` (1-sigma, root of the
    covariance trace), ``cellcal_active_result_rms_mm`` / ``_rms_deg``,
    ``cellcal_drift_deviation_mm`` / ``_deg``, ``cellcal_drift_warn_mm`` / ``_fail_mm`` (the
    thresholds, for alert rules), ``cellcal_drift_status{status}``, ``cellcal_drift_cusum_mm``,
    ``cellcal_drift_cusum_alarm``, ``cellcal_drift_last_check_timestamp_seconds``,
    ``cellcal_last_run_id``, ``cellcal_last_run_status{status}``, ``cellcal_run_stations_accepted``.

Lengths and angles are in mm and degrees with the unit in the name, as on every edge of cellcal
(the drift thresholds a person configures are in mm and deg too); times in seconds.
A sample alert rule file and a Grafana dashboard: ``docs/plant/``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from cellcal.daemon import protocol as P
from cellcal.daemon.plant import PLANT_CALLER, DaemonPort, FaultFn, call_command
from cellcal.daemon.plant.config import Metrics, parse_listen
from cellcal.daemon.plant.views import as_float, as_int, as_map, sigmas

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.core import Metric

log = logging.getLogger(__name__)

__all__ = ["MetricsExporter", "RUN_STATUSES", "SOLVE_BUCKETS_S"]

RUN_STATUSES = ("capturing", "solving", "done", "failed", "aborted")
#: Solve durations: a base frame solves in milliseconds, a kinematic identification in tens of seconds.
SOLVE_BUCKETS_S = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)


class MetricsExporter:
    """``[metrics]``: the daemon's Prometheus metrics (module docstring).

    Parameters
    ----------
    cfg : Metrics
        The ``[metrics]`` section.
    port : DaemonPort
    fault : callable(interface, message, *, active, retry_in_s=None)
    """

    name = "metrics"

    def __init__(self, cfg: Metrics, port: DaemonPort, fault: FaultFn) -> None:
        # prometheus-client is the optional extra cellcal[metrics]: loaded when [metrics] is enabled.
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.cfg = cfg
        self.port = port
        self._fault = fault
        self.host, self.port_number = parse_listen(cfg.listen)
        self.registry = CollectorRegistry(auto_describe=True)
        self._stations = Counter("cellcal_stations", "capture attempts by outcome", ["outcome"], registry=self.registry)
        self._faults = Counter("cellcal_faults", "faults raised", ["device", "code"], registry=self.registry)
        self._drifts = Counter("cellcal_drift_checks", "drift checks by verdict", ["status"], registry=self.registry)
        self._results = Counter("cellcal_results", "calibration results published", registry=self.registry)
        self._solve = Histogram("cellcal_solve_seconds", "time a run spent solving", buckets=SOLVE_BUCKETS_S,
                                registry=self.registry)
        for outcome in ("accepted", "rejected"):
            self._stations.labels(outcome)
        for status in P.DRIFT_STATUSES:
            self._drifts.labels(status)
        self._lock = threading.Lock()
        self._active: Mapping[str, object] | None = None
        self._drift: Mapping[str, object] | None = None
        self._drift_wall_s: float | None = None
        self._solving_since: float | None = None
        self._accepted = 0
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.registry.register(_Snapshot(self))

    # ---- events (any thread; a counter or an assignment, never I/O) ------------------------------
    def on_event(self, topic: str, body: Mapping[str, object]) -> None:
        if topic == P.TOPIC_STATION:
            self._stations.labels("accepted" if body.get("accepted") else "rejected").inc()
            with self._lock:
                self._accepted = as_int(body.get("accepted_count", 0))
        elif topic == P.TOPIC_FAULT:
            if body.get("active"):
                self._faults.labels(str(body.get("device") or "none"), str(body.get("code", ""))).inc()
        elif topic == P.TOPIC_DRIFT:
            self._drifts.labels(str(body.get("status", ""))).inc()
            with self._lock:
                self._drift, self._drift_wall_s = body, time.time()
        elif topic == P.TOPIC_RESULT:
            if not body.get("retained"):
                self._results.inc()
            if body.get("active"):
                with self._lock:
                    self._active = body
        elif topic == P.TOPIC_STATE:
            self._on_state(body)

    def _on_state(self, body: Mapping[str, object]) -> None:
        state, previous = body.get("state"), body.get("previous")
        now = time.monotonic()
        with self._lock:
            if state == P.STATE_SOLVING and previous != P.STATE_SOLVING:
                self._solving_since = now
            elif previous == P.STATE_SOLVING and state != P.STATE_SOLVING and self._solving_since is not None:
                self._solve.observe(now - self._solving_since)
                self._solving_since = None
            if state == P.STATE_CAPTURING and previous not in (P.STATE_CAPTURING, P.STATE_FAULT):
                self._accepted = 0

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        from prometheus_client import start_http_server  # the optional extra (see __init__)

        try:
            active = call_command(self.port, "get_result", {}, PLANT_CALLER)
        except P.CommandError:
            active = None
        self._active = active if isinstance(active, Mapping) else None  # the active result's body
        last = (self.port.status() or {}).get("last_drift")
        if last and isinstance(last, Mapping):
            self._drift = last
        self._server, self._thread = start_http_server(self.port_number, addr=self.host, registry=self.registry)
        log.info("metrics: /metrics on http://%s:%d", self.host, self.port_number)

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port_number}/metrics"


def _finite(v: object) -> float | None:
    try:
        f = as_float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class _Snapshot:
    """The scrape-time metrics (a prometheus_client collector)."""

    def __init__(self, owner: MetricsExporter) -> None:
        self.owner = owner

    def describe(self) -> list[Metric]:
        return []  # unchecked: the families depend on what the daemon has (no result yet, ...)

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # the optional extra (see MetricsExporter)

        o = self.owner
        st: Mapping[str, object]
        try:
            st = o.port.status()
        except Exception as exc:  # noqa: BLE001 - a scrape must answer; the error is its finding
            log.warning("metrics: status not readable: %s", exc)
            st = {}
        with o._lock:
            active, drift, drift_wall, accepted = o._active, o._drift, o._drift_wall_s, o._accepted

        def gauge(name: str, doc: str, value: float | None, labels: Mapping[str, str] | None = None) -> Metric:
            g = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None)
            if value is not None:
                g.add_metric(list(labels.values()) if labels else [], value)
            return g

        yield gauge("cellcal_info", "the daemon", 1.0, {"cell": o.port.cell, "version": o.port.version,
                                                       "boot_id": o.port.boot_id})
        if st:
            g = GaugeMetricFamily("cellcal_state", "1 for the daemon's current state", labels=["state"])
            for s in P.STATES:
                g.add_metric([s], 1.0 if st.get("state") == s else 0.0)
            yield g
            yield gauge("cellcal_uptime_seconds", "since the daemon started", _finite(st.get("uptime_s")))
            g = GaugeMetricFamily("cellcal_device_connected", "1 while the device's link is up", labels=["device"])
            listed = as_map(st.get("devices"))
            for dev in P.DEVICES:
                if dev == P.DEVICE_CAMERA and dev not in listed:
                    continue  # a cell without a camera has none to report (ADR 0030)
                g.add_metric([dev], 1.0 if as_map(listed.get(dev)).get("connected") else 0.0)
            yield g
            yield gauge("cellcal_queued_jobs", "runs and checks waiting", _finite(st.get("queued_jobs")))
            yield gauge("cellcal_drift_cusum_mm", "CUSUM of the drift checks of the active result",
                        _finite(as_float(st.get("cusum_m") or 0.0) * 1e3))
        yield from self._active_metrics(active)
        yield from self._drift_metrics(drift, drift_wall)
        yield gauge("cellcal_run_stations_accepted", "stations accepted in the current or last run", float(accepted))
        try:
            run = o.port.last_run()
        except Exception as exc:  # noqa: BLE001
            log.warning("metrics: last run not readable: %s", exc)
            run = None
        if run is not None:
            yield gauge("cellcal_last_run_id", "the newest run", _finite(run["run_id"]))
            g = GaugeMetricFamily("cellcal_last_run_status", "1 for the newest run's status", labels=["status", "kind"])
            for s in RUN_STATUSES:
                g.add_metric([s, run["kind"]], 1.0 if run["status"] == s else 0.0)
            yield g

    @staticmethod
    def _active_metrics(active: Mapping[str, object] | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # the optional extra (see MetricsExporter)

        if active is None:
            return
        yield GaugeMetricFamily("cellcal_active_result_id", "the active calibration's id",
                                value=_finite(active.get("result_id")) or 0.0)
        created = active.get("created_ns") or 0
        if created:
            yield GaugeMetricFamily("cellcal_active_result_age_seconds", "since the active result was created",
                                    value=max(0.0, time.time() - as_float(created) * 1e-9))
        yield GaugeMetricFamily("cellcal_active_result_suspect", "1 if a drift check failed it",
                                value=1.0 if active.get("suspect") else 0.0)
        rms_t, rms_r = _finite(active.get("rms_translation_m")), _finite(active.get("rms_rotation_rad"))
        if rms_t is not None:
            yield GaugeMetricFamily("cellcal_active_result_rms_mm", "closure RMS, translation", value=rms_t * 1e3)
        if rms_r is not None:
            yield GaugeMetricFamily("cellcal_active_result_rms_deg", "closure RMS, rotation", value=math.degrees(rms_r))
        names = [*as_map(active.get("transforms")), *as_map(active.get("points"))]
        g_t = GaugeMetricFamily("cellcal_active_result_sigma_mm", "1-sigma translation (root of the covariance trace)",
                                labels=["estimate"])
        g_r = GaugeMetricFamily("cellcal_active_result_sigma_deg", "1-sigma rotation (root of the covariance trace)",
                                labels=["estimate"])
        for name in names:
            st, sr = sigmas(active, name)
            if st is not None:
                g_t.add_metric([name], st * 1e3)
            if sr is not None:
                g_r.add_metric([name], math.degrees(sr))
        yield g_t
        yield g_r

    @staticmethod
    def _drift_metrics(drift: Mapping[str, object] | None, wall_s: float | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily  # the optional extra (see MetricsExporter)

        if drift is None:
            return
        t, r = _finite(drift.get("deviation_translation_m")), _finite(drift.get("deviation_rotation_rad"))
        if t is not None:
            yield GaugeMetricFamily("cellcal_drift_deviation_mm", "worst deviation of the last drift check", value=t * 1e3)
        if r is not None:
            yield GaugeMetricFamily("cellcal_drift_deviation_deg", "worst rotation deviation of the last drift check",
                                    value=math.degrees(r))
        for key, name in (("warn_translation_m", "cellcal_drift_warn_mm"), ("fail_translation_m", "cellcal_drift_fail_mm")):
            v = _finite(drift.get(key))
            if v is not None:
                yield GaugeMetricFamily(name, f"drift threshold ({key})", value=v * 1e3)
        g = GaugeMetricFamily("cellcal_drift_status", "1 for the last drift check's verdict", labels=["status"])
        for s in P.DRIFT_STATUSES:
            g.add_metric([s], 1.0 if drift.get("status") == s else 0.0)
        yield g
        alarm = as_map(drift.get("cusum")).get("alarm")
        yield GaugeMetricFamily("cellcal_drift_cusum_alarm", "1 when the CUSUM passed its alarm level",
                                value=1.0 if alarm else 0.0)
        if wall_s is not None:
            yield GaugeMetricFamily("cellcal_drift_last_check_timestamp_seconds", "when the last check was published "
                                    "(wall clock, Unix seconds)", value=wall_s)
