"""The simulated controller against an independent RTDE client: the ``ur-rtde`` package.

``rtde_receive.RTDEReceiveInterface`` connects only to port 30004 and holds the GIL while it
waits, so our server runs in a separate process on 127.0.0.1:30004. ur-rtde asks for ~60
output fields (with a trailing comma in the list) and crashes on a NOT_FOUND answer, so this
also proves the server answers every field a real client asks for.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest
from conftest import wait_until

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

rtde_receive = pytest.importorskip("rtde_receive")

PORT = 30004


def _serve(conn) -> None:
    """Child process: the sim controller on 30004, recording every published package."""
    from cellcal.drivers.kinematics import dh_model
    from cellcal.sim.robot_sim import SimRobot
    from cellcal.sim.rtde_server import RtdeServer
    from cellcal.sim.world import World

    home = dh_model("ur5e").forward(np.deg2rad([0.0, -90.0, 90.0, -90.0, -90.0, 0.0]))
    world = World(cell_T_base=np.eye(4), flange_T_target=np.eye(4), base_T_flange=home)
    robot = SimRobot(world, {"encoder_noise_deg": 0.001, "seed": 7}).start()
    published: dict[float, tuple[tuple[float, ...], tuple[float, ...]]] = {}
    fields_asked: list[list[str]] = []

    def record(values: dict) -> None:
        if not fields_asked or fields_asked[-1] != list(values):
            fields_asked.append(list(values))
        published[float(values["timestamp"])] = (
            tuple(float(x) for x in values["actual_q"]),
            tuple(float(x) for x in values["actual_TCP_pose"]),
        )

    try:
        srv = RtdeServer(robot, host="127.0.0.1", port=PORT, urscript_port=None, on_publish=record).start()
    except OSError as exc:
        conn.send(("error", f"cannot bind 127.0.0.1:{PORT}: {exc}"))
        robot.close()
        return
    conn.send(("ready", None))
    try:
        while conn.poll(120.0):  # the parent's next command (or the end)
            cmd = conn.recv()
            if cmd == "dump":
                conn.send((dict(published), fields_asked[-1] if fields_asked else []))
            elif cmd == "freeze":
                frozen = robot.sample()
                robot.sample = lambda t_s=None, frozen=frozen: frozen  # publish this one sample from now on
                time.sleep(0.05)
                conn.send((frozen.timestamp_s, tuple(map(float, frozen.q_rad)), tuple(map(float, frozen.tcp_pose))))
            elif cmd == "stop":
                break
    finally:
        srv.close()
        robot.close()


@pytest.fixture
def server():
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(child,), daemon=True)
    proc.start()
    try:
        # a fresh interpreter importing numpy and cellcal: tens of seconds on a loaded machine
        assert parent.poll(60.0), "server process did not start"
        status, detail = parent.recv()
        if status != "ready":
            pytest.fail(detail)
        # make sure it serves before handing the port to a client that blocks with the GIL
        from cellcal.drivers import connect_robot

        with connect_robot(f"rtde://127.0.0.1:{PORT}", connect_timeout_s=10.0) as ours:
            ours.read_state()
        yield parent
    finally:
        try:
            parent.send("stop")
        except OSError:
            pass
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


def test_ur_rtde_reads_what_the_simulator_published(server):
    r = rtde_receive.RTDEReceiveInterface("127.0.0.1")
    try:
        assert r.isConnected()
        wait_until(lambda: r.getTimestamp() > 0, 10.0, "ur-rtde's first package")
        reads = []

        def live():
            reads.append((r.getTimestamp(), tuple(r.getActualQ()), tuple(r.getActualTCPPose())))
            return len(reads) >= 25 and len({q for _, q, _ in reads}) > 1

        wait_until(live, 10.0, "25 reads spanning more than one package")
        assert r.getRobotMode() == 7  # RUNNING
        assert r.getSafetyMode() == 1  # NORMAL
        server.send("dump")
        assert server.poll(30.0)
        published, fields = server.recv()
        all_q = {q for q, _ in published.values()}
        all_pose = {p for _, p in published.values()}
        for ts, q, pose in reads:
            assert ts in published, f"timestamp {ts} was never published"
            assert q in all_q and pose in all_pose  # bit-exact doubles
        assert len({q for _, q, _ in reads}) > 1  # encoder noise: really a live stream
        # ur-rtde asked for many fields (trailing comma dropped) and got every one
        assert {"timestamp", "actual_q", "actual_TCP_pose", "payload_inertia"} <= set(fields)
        assert "" not in fields and len(fields) > 50

        # now hold one sample: all three getters must return exactly that sample
        server.send("freeze")
        assert server.poll(30.0)
        ts, q, pose = server.recv()
        wait_until(lambda: r.getTimestamp() == ts, 10.0, "the held sample at ur-rtde")
        assert tuple(r.getActualQ()) == q
        assert tuple(r.getActualTCPPose()) == pose
    finally:
        r.disconnect()
