"""The simulated UR controller against ur-rtde's ``RTDEControlInterface`` (an independent client).

At connect the control interface asks the dashboard server (29999) for ``PolyscopeVersion``,
``get serial number`` and ``is in remote control`` (it skips the remote-control question for
the host names ``localhost`` and ``127.0.0.1``, so the simulator is served on 127.0.0.2,
still loopback), sets up RTDE (30004) with its input registers, then uploads its control
script to port 30003 and waits 5 s for it to run. The simulator's URScript subset refuses
that script with a text message, so the client ends with "Failed to start control script":
it got past its dashboard check. Out of remote control it stops at the check instead.

ur-rtde's ports are fixed and it holds the GIL while it waits, so the simulator and the
client each run in a process of their own; every wait has a deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

import numpy as np
import pytest

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

pytest.importorskip("rtde_control")

HOST = "127.0.0.2"
PORTS = {"port": 30004, "urscript_port": 30002, "dashboard_port": 29999, "primary_port": 30001, "realtime_port": 30003}


def _serve(remote: bool, conn) -> None:
    from cellcal.drivers.kinematics import dh_model
    from cellcal.sim.robot_sim import SimRobot
    from cellcal.sim.rtde_server import RtdeServer
    from cellcal.sim.world import World

    home = dh_model("ur5e").forward(np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0]))
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=home)
    robot = SimRobot(world, {"remote_control": remote, "serial_number": "20235500077"}).start()
    texts: list[str] = []
    try:
        srv = RtdeServer(robot, host=HOST, **PORTS)
        original = srv.send_text
        srv.send_text = lambda message, *a, **k: (texts.append(message), original(message, *a, **k))  # type: ignore[method-assign]
        srv.start()
    except OSError as exc:
        conn.send(("error", f"cannot bind {HOST}: {exc}"))
        robot.close()
        return
    conn.send(("ready", None))
    try:
        if conn.poll(60.0):
            conn.recv()
        conn.send((list(srv.dashboard.commands), list(texts), srv.scripts_run))
    finally:
        srv.close()
        robot.close()


def _client(conn) -> None:
    import rtde_control

    try:
        c = rtde_control.RTDEControlInterface(HOST)
    except Exception as exc:  # noqa: BLE001 - the peer's error is the result
        conn.send(str(exc))
        return
    c.disconnect()
    conn.send("connected")


def _run(remote: bool) -> tuple[str, list[str], list[str], int]:
    ctx = mp.get_context("spawn")
    srv_end, srv_child = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(remote, srv_child), daemon=True)
    server.start()
    client = None
    try:
        assert srv_end.poll(30.0), "simulator process did not start"
        status, detail = srv_end.recv()
        if status != "ready":
            pytest.fail(detail)
        cli_end, cli_child = ctx.Pipe()
        client = ctx.Process(target=_client, args=(cli_child,), daemon=True)
        client.start()
        assert cli_end.poll(40.0), "RTDEControlInterface neither connected nor failed within 40 s"
        outcome = cli_end.recv()
        srv_end.send("report")
        assert srv_end.poll(10.0), "simulator did not report"
        commands, texts, scripts_run = srv_end.recv()
        return outcome, commands, texts, scripts_run
    finally:
        for p in (client, server):
            if p is not None:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.2 is loopback on Linux")
def test_control_interface_gets_past_its_dashboard_check():
    outcome, commands, texts, scripts_run = _run(remote=True)
    # it asked what a real controller is asked at connect ...
    assert {"PolyscopeVersion", "get serial number", "is in remote control"} <= set(commands)
    # ... went on to RTDE and its script upload, which the simulator refused, saying why
    assert "Failed to start control script" in outcome, outcome
    assert scripts_run == 0 and any("script rejected" in t and "one movej" in t for t in texts), texts


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="127.0.0.2 is loopback on Linux")
def test_control_interface_is_stopped_by_local_control():
    outcome, commands, _texts, _scripts = _run(remote=False)
    assert "Please enable remote control" in outcome, outcome
    assert commands[-1] == "is in remote control"
