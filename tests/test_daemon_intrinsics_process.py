"""An ``intrinsics`` run across processes, with ``kill -9`` in the middle of it (ADR 0030).

``cellcal sim --camera eye_to_hand`` serves the simulated robot, tracker and a camera fixed in
the cell looking at the board on the flange (a GigE Vision device on a loopback address of its
own); ``cellcal run`` captures the camera stations. The daemon is killed with SIGKILL twice
while it captures (after some stations were accepted, at a random moment: moving, settling,
grabbing, writing an image, committing), restarted on the same state directory each time, and
the run resumes and finishes. Afterwards:

* every station the store holds has its image, whole (the sha256 and size its row names), and
  every station any instance published as accepted is there once;
* the result agrees with the simulator's camera within its sigmas.
"""

from __future__ import annotations

import hashlib
import random
import time

import numpy as np
import pytest

from cellcal.daemon import protocol as P
from cellcal.daemon.store import Store
from cellcal.daemon.wire.client import Client
from cellcal.sim.camera_device import default_camera
from cellcal.sim.scenario import load_scenario
from cellcal.testing.harness import (
    FAST_SCENARIO,
    DaemonProcess,
    Recorder,
    SimProcess,
    audit_store,
    camera_section,
    daemon_config,
    free_camera_address,
    write_config,
)

pytestmark = pytest.mark.slow

N_VIEWS = 9
KILLS = 2


def _heartbeat(rec: Recorder, daemon: DaemonProcess, known: set[str]) -> str:
    """The boot id of a new daemon instance, from its first heartbeat."""
    _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT, 60.0, alive=daemon.alive, what="a heartbeat")
    while env["boot_id"] in known:
        _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_HEARTBEAT, 60.0, alive=daemon.alive, what="a heartbeat")
    return env["boot_id"]


def test_kill_9_during_a_camera_run_keeps_every_image_with_its_row(tmp_path):
    scenario = load_scenario(FAST_SCENARIO)
    sim = SimProcess(FAST_SCENARIO, tmp_path / "sim.log", "--camera", "eye_to_hand", "--camera-address",
                     free_camera_address())
    rng = random.Random(20261202)
    with sim:
        urls = sim.start(timeout_s=120.0)
        assert urls["camera"].startswith("gige://127.")
        cfg = daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=tmp_path,
                            overrides={"camera": camera_section(urls["camera"], "eye_to_hand", scenario, tmp_path,
                                                                n_views=N_VIEWS)})
        conf = write_config(tmp_path / "cellcal.toml", cfg)
        rec = Recorder(cfg["zmq"]["pub_endpoint"])
        daemon = DaemonProcess(conf, tmp_path / "daemon.log")
        accepted: set[tuple[str, int]] = set()
        try:
            daemon.start()
            boots = {_heartbeat(rec, daemon, set())}
            with Client(cfg["zmq"]["cmd_endpoint"], timeout_s=10.0, retries=2) as c:
                run_id = str(c.call("start_run", kind=P.KIND_INTRINSICS)["run_id"])
            for k in range(KILLS):
                # some stations accepted, then a random moment of the next one
                need = 2 + 2 * k
                _t, env = rec.wait_for(lambda t, b, need=need: t == P.TOPIC_STATION and b["run_id"] == run_id
                                       and b["accepted"] and b["accepted_count"] >= need, 120.0, alive=daemon.alive,
                                       what="accepted stations")
                time.sleep(rng.uniform(0.0, 0.8))
                rec.pump(0.0)
                accepted |= {(m[1]["body"]["run_id"], m[1]["body"]["index"]) for m in rec.messages
                             if m[0] == P.TOPIC_STATION and m[1]["body"]["accepted"]}
                daemon.kill9()
                daemon = DaemonProcess(conf, tmp_path / "daemon.log").start()
                boots.add(_heartbeat(rec, daemon, boots))
            _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b.get("run_id") == run_id, 240.0,
                                   alive=daemon.alive, what="the run's result")
            result = env["body"]
            accepted |= {(m[1]["body"]["run_id"], m[1]["body"]["index"]) for m in rec.messages
                         if m[0] == P.TOPIC_STATION and m[1]["body"]["accepted"]}
        finally:
            daemon.stop()
            rec.close()
    state = tmp_path / "state"
    audit = audit_store(state)
    assert audit["integrity"] == ["ok"] and audit["duplicates"] == []
    stored = {(str(r), i) for r, i in audit["stations"]}
    assert accepted <= stored  # nothing any instance published as accepted was lost
    with Store(state, read_only=True) as store:
        stations = store.stations(int(run_id))
    assert len(stations) >= N_VIEWS - 2
    for s in stations:  # never a row without its whole image
        assert s.camera is not None
        data = (state / s.camera["image"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s.camera["image_sha256"] and len(data) == s.camera["image_bytes"]
    assert result["gates"]["passed"], result["gates"]
    truth = default_camera(scenario, "eye_to_hand").camera.parameters
    ii = result["intrinsics"]
    z = (np.array(ii["parameters"]) - truth) / np.array(ii["sigmas"], dtype=float)
    assert np.all(np.abs(z) < 4.0), dict(zip(ii["parameter_names"], np.round(z, 2), strict=True))
    assert result["provenance"]["device_serials"]["camera"] == "SIMCAM-0001"
