"""Prometheus ``/metrics`` of a running daemon, read by prometheus_client's text-format parser
and scraped by a real Prometheus server (Debian's ``prometheus``, started here on 127.0.0.1).

One simulated cell for the module (``inprocess_cell``: one calibration, one drift check). It shows:

* the exposition parses, and its values are the daemon's: the active result id and its
  sigmas (mm, deg) from the result body, the drift deviation and verdict from the drift body,
  the state, the device links, the station counts, the last run's status, one solve observed;
* a Prometheus server scraping 127.0.0.1 stores them (``up`` = 1, the result id queried back
  through its API), loads the sample alert rules of ``docs/plant/`` healthy and silent on a
  healthy cell, and every expression of the sample Grafana dashboard is valid PromQL that
  returns data from this cell.

``prometheus`` comes from ``make os-deps``; without it the test fails saying so (never skips).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import struct
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import wait_until

# prometheus-client is in the test extra (pip install -e '.[test]').
from prometheus_client.parser import text_string_to_metric_families

from cellcal.daemon import protocol as P
from cellcal.daemon.plant.views import sigmas
from cellcal.testing.harness import free_port, inprocess_cell

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "docs" / "plant" / "cellcal-alerts.yml"
DASHBOARD = ROOT / "docs" / "plant" / "cellcal-grafana-dashboard.json"


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    port = free_port()
    overrides = {"metrics": {"enabled": True, "listen": f"127.0.0.1:{port}"}}
    with inprocess_cell(tmp_path_factory.mktemp("cell"), n_stations=6, overrides=overrides) as c:
        run_id = c.svc.start_run("base_frame", reason="test")
        c.wait_result(run_id)
        c.svc.request_drift_check("test")
        c.wait_for(lambda t, b: t == P.TOPIC_DRIFT, 30.0, "a drift check")
        assert c.svc.wait_idle(20.0)
        c.metrics_port = port
        yield c


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_exposition_parses_and_carries_the_daemons_values(cell):
    m = scrape(cell.metrics_port)
    result = [b for b in cell.bodies(P.TOPIC_RESULT) if b.get("active")][-1]
    drift = cell.bodies(P.TOPIC_DRIFT)[-1]
    assert m[("cellcal_active_result_id", ())] == float(result["result_id"])
    for name in result["transforms"]:
        st, sr = sigmas(result, name)
        assert m[("cellcal_active_result_sigma_mm", (("estimate", name),))] == pytest.approx(st * 1e3)
        assert m[("cellcal_active_result_sigma_deg", (("estimate", name),))] == pytest.approx(math.degrees(sr))
    assert m[("cellcal_active_result_rms_mm", ())] == pytest.approx(result["rms_translation_m"] * 1e3)
    assert 0.0 <= m[("cellcal_active_result_age_seconds", ())] < 600.0
    assert m[("cellcal_active_result_suspect", ())] == 0.0
    assert m[("cellcal_drift_deviation_mm", ())] == pytest.approx(drift["deviation_translation_m"] * 1e3)
    assert m[("cellcal_drift_fail_mm", ())] == pytest.approx(drift["fail_translation_m"] * 1e3)
    assert m[("cellcal_drift_status", (("status", drift["status"]),))] == 1.0
    assert m[("cellcal_drift_checks_total", (("status", "ok"),))] >= 1.0
    assert m[("cellcal_state", (("state", "IDLE"),))] == 1.0 and m[("cellcal_state", (("state", "FAULT"),))] == 0.0
    assert m[("cellcal_device_connected", (("device", "robot"),))] == 1.0
    assert m[("cellcal_device_connected", (("device", "tracker"),))] == 1.0
    accepted = sum(1 for b in cell.bodies(P.TOPIC_STATION) if b["accepted"])
    assert m[("cellcal_stations_total", (("outcome", "accepted"),))] == accepted >= 6
    assert m[("cellcal_last_run_status", (("kind", "base_frame"), ("status", "done")))] == 1.0
    assert m[("cellcal_solve_seconds_count", ())] == 1.0 and m[("cellcal_solve_seconds_sum", ())] > 0.0
    assert m[("cellcal_results_total", ())] == 1.0


def find_prometheus() -> str:
    found = shutil.which("prometheus", path="/usr/bin:/usr/sbin:/bin:/usr/local/bin")
    if found is None:
        pytest.fail("prometheus is not installed: run `make os-deps` (as root it installs the OS packages the suite needs)")
    return found


def query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    reply = json.loads(urllib.request.urlopen(url, timeout=10).read())
    assert reply["status"] == "success", (promql, reply)
    return reply["data"]["result"]


def test_a_prometheus_server_scrapes_it_with_the_sample_rules_and_dashboard(cell, tmp_path):
    binary = find_prometheus()
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: cellcal
    static_configs:
      - targets: ["127.0.0.1:{cell.metrics_port}"]
""")
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                                stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    try:
        def ready() -> bool:
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2).status == 200
            except OSError:
                return False

        wait_until(ready, 60.0, f"prometheus ready ({log})", poll_s=0.1)
        result_id = [b for b in cell.bodies(P.TOPIC_RESULT) if b.get("active")][-1]["result_id"]
        got = wait_until(lambda: query(port, "cellcal_active_result_id"), 60.0, "a scraped cellcal_active_result_id",
                         poll_s=0.2)
        assert float(got[0]["value"][1]) == float(result_id)
        assert got[0]["metric"]["job"] == "cellcal" and got[0]["metric"]["instance"] == f"127.0.0.1:{cell.metrics_port}"
        assert float(query(port, 'up{job="cellcal"}')[0]["value"][1]) == 1.0
        # The sample rules: loaded, evaluated without error, none firing on this healthy cell.
        def rules() -> list[dict]:
            reply = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=10).read())
            found = [r for g in reply["data"]["groups"] for r in g["rules"]]
            return found if found and all(r.get("lastEvaluation", "").startswith("20") for r in found) else []

        loaded = wait_until(rules, 30.0, "the sample rules evaluated", poll_s=0.2)
        assert len(loaded) == 12 and all(r["health"] == "ok" for r in loaded), loaded
        assert [r["name"] for r in loaded if r["state"] != "inactive"] == []
        # The sample dashboard: every expression is valid PromQL with data from this cell.
        dash = json.loads(DASHBOARD.read_text())
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        assert len(exprs) >= 15
        for e in exprs:
            e = e.replace("$__rate_interval", "1m").replace('"$instance"', '".*"')
            if "cellcal_faults_total" in e:
                query(port, e)  # valid; empty on a cell that never had a fault (a series per fault kind seen)
                continue
            # (a rate needs two scrapes: waited for, as everything else)
            wait_until(lambda e=e: query(port, e), 20.0, f"data for the dashboard's {e!r}", poll_s=0.2)
        # Every cellcal metric the rules and the dashboard name is one the daemon serves.
        text = urllib.request.urlopen(f"http://127.0.0.1:{cell.metrics_port}/metrics", timeout=10).read().decode()
        served = set(re.findall(r"^(?:# HELP )?(cellcal_[a-z_]+)", text, re.M))  # samples, and families with none yet
        named = set(re.findall(r"\bcellcal_[a-z_]+", RULES.read_text() + DASHBOARD.read_text()))
        assert named <= served | {n + "_bucket" for n in served}, named - served
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a scraper killed mid-request does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def test_scrapers_that_go_away_mid_request_do_not_stop_the_next_scrape(cell):
    result_id = float([b for b in cell.bodies(P.TOPIC_RESULT) if b.get("active")][-1]["result_id"])
    port = cell.metrics_port
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    # A stalled scraper holds its connection open, sending nothing, for the whole test.
    stalled = _connect(port)
    try:
        s = _connect(port)  # half a request line, then gone
        s.sendall(b"GET /met")
        s.close()
        assert scrape(port)[("cellcal_active_result_id", ())] == result_id
        s = _connect(port)  # half a request line, then reset
        s.sendall(b"GET /metrics HT")
        _reset(s)
        assert scrape(port)[("cellcal_active_result_id", ())] == result_id
        s = _connect(port)  # the whole request, reset before reading the answer
        s.sendall(request)
        _reset(s)
        assert scrape(port)[("cellcal_active_result_id", ())] == result_id
        s = _connect(port)  # the first bytes of the answer read, then reset
        s.sendall(request)
        assert s.recv(16).startswith(b"HTTP/1.")
        _reset(s)
        m = scrape(port)
        assert m[("cellcal_active_result_id", ())] == result_id
        drift = cell.bodies(P.TOPIC_DRIFT)[-1]
        assert m[("cellcal_drift_deviation_mm", ())] == pytest.approx(drift["deviation_translation_m"] * 1e3)
    finally:
        stalled.close()
    assert scrape(port)[("cellcal_active_result_id", ())] == result_id
