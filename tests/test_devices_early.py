"""The daemon's devices from its start: connected while idle (retried with backoff), the
heartbeat telling the truth, provenance complete on the first run, one daemon per state
directory, one log line in words per station, result and drift check; and
``cellcal check-config``: unknown URL schemes and python-can interfaces refused by key,
``--probe`` opening each device.

Real sockets on loopback, ptys, python-can's virtual bus and ``cellcal`` subprocesses.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cellcal.daemon import protocol as P
from cellcal.testing.harness import (
    CELLCAL,
    DaemonProcess,
    daemon_config,
    free_port,
    inprocess_cell,
    write_config,
)

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

WAIT_S = 60.0


def _until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout_s} s")
        time.sleep(0.01)


def _cellcal(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    return subprocess.run([*CELLCAL, *args], capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)


# --- devices early, provenance, logs ------------------------------------------------------------


@pytest.mark.parametrize("robot_transport", ["rtde", "canopen"])
def test_devices_open_at_start_and_the_first_run_has_full_provenance(tmp_path: Path, robot_transport: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="cellcal.daemon.service")
    overrides = {"drift": {"enabled": True, "interval_s": 3600.0}}
    with inprocess_cell(tmp_path, n_stations=6, robot_transport=robot_transport, overrides=overrides) as cell:
        # No run asked for: the daemon connects by itself, and the heartbeat says so.
        def connected() -> bool:
            devs = cell.svc.heartbeat()["devices"]
            return all(devs[d]["connected"] for d in (P.DEVICE_ROBOT, P.DEVICE_TRACKER))

        _until(connected, WAIT_S, "both devices connected while idle")
        hb = cell.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT and b["devices"]["robot"]["connected"]
                           and b["devices"]["tracker"]["connected"], WAIT_S, "a heartbeat with both devices up")
        assert hb["devices"]["robot"]["identity"] and hb["devices"]["tracker"]["identity"]
        run_id = cell.svc.start_run()
        run = cell.svc.store.get_run(run_id)
        robot = run.devices[P.DEVICE_ROBOT]
        assert robot["serial"] and robot["serial"] != robot["driver"] and "Driver" not in robot["serial"]
        assert run.devices[P.DEVICE_TRACKER]["serial"]
        if robot_transport == "rtde":
            assert robot["serial"] == cell.robot.robot.scenario.serial_number
        else:
            assert all(s.isdigit() for s in robot["serial"].split(","))
        body = cell.wait_result(run_id, timeout_s=WAIT_S)
        prov = body["provenance"]
        assert prov["device_serials"]["robot"] == robot["serial"], prov
        cell.svc.wait_idle(WAIT_S)
        cell.svc.request_drift_check()
        cell.wait_for(lambda t, b: t == P.TOPIC_DRIFT, WAIT_S, "the drift check")
        cell.svc.wait_idle(WAIT_S)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    stations = [ln for ln in lines if ln.startswith(f"run {run_id}: station ") and " accepted " in ln]
    assert len(stations) == 6, lines
    results = [ln for ln in lines if ln.startswith("result ") and "cell_T_base = (" in ln]
    assert len(results) == 1 and "gates passed" in results[0] and "exports in " in results[0]
    assert "report " in results[0] and results[0].count("report.html") == 1
    assert any(ln.startswith("drift check 1 of result ") and "within the warning limit" in ln for ln in lines), lines


def test_idle_retries_with_backoff_and_the_heartbeat_shows_the_tracker_down(tmp_path: Path) -> None:
    # A "tracker" that accepts and hangs up at once: every open fails; count the attempts.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    attempts: list[float] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            attempts.append(time.monotonic())
            conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        overrides = {"tracker": {"url": f"socket://127.0.0.1:{port}", "options": {"timeout_s": 0.3}},
                     "service": {"fault_retry_min_s": 0.1, "fault_retry_max_s": 0.4}}
        with inprocess_cell(tmp_path, n_stations=4, overrides=overrides) as cell:
            _until(lambda: len(attempts) >= 3, WAIT_S, "three connection attempts to the tracker")
            hb = cell.svc.heartbeat()
            assert hb["devices"]["robot"]["connected"] is True
            assert hb["devices"]["tracker"]["connected"] is False
            assert cell.svc.state.value == P.STATE_IDLE  # devices down while idle: not a FAULT
            gaps = [b - a for a, b in zip(attempts, attempts[1:], strict=False)]
            assert gaps[-1] >= gaps[0] * 0.9  # backing off, never faster
    finally:
        stop.set()
        t.join(5)
        listener.close()


def test_a_second_daemon_on_the_same_state_directory_is_refused(tmp_path: Path) -> None:
    from cellcal.daemon.app import App
    from cellcal.daemon.service import StateDirLocked

    with inprocess_cell(tmp_path, n_stations=4) as cell:
        lock = Path(cell.cfg.service.state_dir) / "cellcal.lock"
        assert lock.read_text().strip() == str(os.getpid())
        with pytest.raises(StateDirLocked, match=f"pid {os.getpid()}"):
            App(cell.cfg, zmq=False).open()
        conf = write_config(tmp_path / "second.toml", daemon_config(
            robot_url=cell.robot.url, tracker_url=cell.tracker.url, workdir=tmp_path, n_stations=4))
        r = _cellcal("run", "--config", str(conf))
        assert r.returncode == 1, r.stderr
        assert "in use by another cellcal daemon" in r.stderr and f"pid {os.getpid()}" in r.stderr
        assert "Traceback" not in r.stderr
    # The first one stopped: the lock is free again (the file may stay).
    App(cell.cfg, zmq=False).open().close()


def test_cellcal_run_finds_its_configuration_like_ctl(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CELLCAL_CONFIG"}
    env["CELLCAL_CONFIG"] = str(tmp_path / "missing.toml")
    r = subprocess.run([*CELLCAL, "run"], capture_output=True, text=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "missing.toml" in r.stderr and "Traceback" not in r.stderr


def test_the_daemon_log_has_the_same_lines(tmp_path: Path) -> None:
    """`cellcal run` (what the journal records: stderr) logs the station and result lines."""
    from cellcal.daemon.wire.client import Client

    with inprocess_cell(tmp_path / "sims", n_stations=4, zmq=False) as sims:
        conf = write_config(tmp_path / "c.toml", daemon_config(
            robot_url=sims.robot.url, tracker_url=sims.tracker.url, workdir=tmp_path / "d", n_stations=4))
        # The in-process daemon holds the sims' devices too; stop it so `cellcal run` has them.
        sims.app.close()
        daemon = DaemonProcess(conf, tmp_path / "daemon.log").start()
        try:
            from cellcal.daemon.config import load_config

            ep = load_config(conf).zmq.cmd_endpoint
            with Client(ep, timeout_s=5.0, retries=5) as c:
                run_id = c.call("start_run", kind=P.KIND_BASE_FRAME)["run_id"]
                _until(lambda: "cell_T_base = (" in daemon.log_tail(200), WAIT_S, "the result line in the log")
        finally:
            daemon.terminate()
        log = daemon.log_tail(400)
        assert f"run {run_id}: station 4/4 accepted" in log, log
        assert "INFO cellcal.daemon.service: result 1 (base_frame" in log, log


# --- check-config ---------------------------------------------------------------------------------


def _config(tmp_path: Path, **sections: dict) -> Path:
    d = daemon_config(robot_url="rtde://127.0.0.1:1", tracker_url=f"socket://127.0.0.1:{free_port()}",
                      workdir=tmp_path, overrides=sections)
    return write_config(tmp_path / "c.toml", d)


@pytest.mark.parametrize("sections, key, needles", [
    ({"tracker": {"url": "sokket://127.0.0.1:5000"}}, "tracker.url", ["sokket"]),
    ({"robot": {"url": "rtdee://127.0.0.1:30004"}}, "robot.url", ["rtdee"]),
    ({"robot": {"url": "canopen://vcan0?interface=sockcan&nodes=1-6"}}, "robot.url", ["sockcan", "socketcan"]),
    ({"robot": {"url": "canopen://vcan0?nodes=1-6", "options": {"interface": "sockcan"}}},
     "robot.options.interface", ["sockcan", "socketcan"]),
])
def test_check_config_refuses_unknown_schemes_and_interfaces(tmp_path: Path, sections: dict, key: str,
                                                             needles: list[str]) -> None:
    r = _cellcal("check-config", str(_config(tmp_path, **sections)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert key in r.stderr and all(n in r.stderr for n in needles), r.stderr
    assert "Traceback" not in r.stderr


def test_check_config_accepts_a_known_can_interface(tmp_path: Path) -> None:
    r = _cellcal("check-config", "--quiet", str(_config(tmp_path, robot={"url": "canopen://x?interface=virtual&nodes=1-6"})))
    assert r.returncode == 0, r.stderr


def test_check_config_probe_reports_each_device(tmp_path: Path) -> None:
    with inprocess_cell(tmp_path / "sims", n_stations=4, zmq=False) as sims:
        sims.app.close()  # the probe opens the devices itself
        good = write_config(tmp_path / "good.toml", daemon_config(
            robot_url=sims.robot.url, tracker_url=sims.tracker.url, workdir=tmp_path / "d"))
        r = _cellcal("check-config", "--probe", str(good))
        assert r.returncode == 0, r.stdout + r.stderr
        robot, tracker = r.stdout.splitlines()
        assert robot.startswith("robot: ok: UrRtdeDriver") and f"serial {sims.robot.robot.scenario.serial_number}" in robot
        assert "sample: q = [" in robot and " mm" in robot
        assert robot.endswith("can be commanded (dashboard: robotmode RUNNING, safetystatus NORMAL, is in remote "
                              "control: true)"), robot
        assert tracker.startswith("tracker: ok: ") and "serial " in tracker and "sample: pose at (" in tracker
        # A robot the daemon could not command is not ok: the pendant in local control, or a
        # dashboard server that does not answer (moves are refused either way).
        sims.robot.robot.set_remote_control(False)
        r = _cellcal("check-config", "--probe", str(good))
        assert r.returncode == 1, r.stdout + r.stderr
        robot = r.stdout.splitlines()[0]
        assert robot.startswith("robot: FAILED: rtde://") and "CANNOT BE COMMANDED" in robot, robot
        assert "is in remote control: false" in robot and "sample: q = [" in robot, robot
        sims.robot.robot.set_remote_control(True)
        url = re.sub(r"dashboard_port=\d+", f"dashboard_port={free_port()}", sims.robot.url)
        assert url != sims.robot.url
        cut = write_config(tmp_path / "cut.toml", daemon_config(robot_url=url, tracker_url=sims.tracker.url,
                                                                   workdir=tmp_path / "d"))
        r = _cellcal("check-config", "--probe", str(cut))
        assert r.returncode == 1 and "CANNOT BE COMMANDED: moves are refused" in r.stdout, r.stdout + r.stderr
        assert "dashboard server" in r.stdout.splitlines()[0] and r.stdout.splitlines()[1].startswith("tracker: ok")
        dead = write_config(tmp_path / "dead.toml", daemon_config(
            robot_url=sims.robot.url, tracker_url=f"socket://127.0.0.1:{free_port()}", workdir=tmp_path / "d",
            overrides={"tracker": {"options": {"timeout_s": 0.5}}}))
        r = _cellcal("check-config", "--probe", str(dead))
        assert r.returncode == 1, r.stdout + r.stderr
        assert r.stdout.splitlines()[0].startswith("robot: ok")
        assert r.stdout.splitlines()[1].startswith("tracker: FAILED: socket://127.0.0.1:")
        assert "Traceback" not in r.stderr

